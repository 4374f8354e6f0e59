/* Graphs with a dynamic sequence s in 1..max, shared by the CPU fusion test and the GPU op test:
 * groups the builder fuses at every size (rotary embeddings of heads permuted to [1, H, s, D],
 * RMSNorm's pieces around a reduction, a broadcast against an [s, D] table), and groups whose
 * loads follow s (a permute putting s inside the heads, the last row, a cat along s), which it
 * must leave unfused or cut. */
#ifndef KILN_TEST_DYNAMIC_GROUPS_H
#define KILN_TEST_DYNAMIC_GROUPS_H

#include "cpu/half.h"
#include "kiln/kiln.h"

#include <stdio.h>
#include <string.h>

#define DG(...) ((const int64_t[]){__VA_ARGS__})
#define DG_T(...) ((const int32_t[]){__VA_ARGS__})
#define DG_S ((kiln_sym_size){1, 1, 0})
#define DG_NO ((kiln_sym_size){0, 0, 0})

/* Records one graph in dtype dt with its sequence bound max into b; 0 on a refusal. */
typedef int (*dyn_graph_fn)(kiln_builder *b, kiln_dtype dt, int64_t max);

static inline int32_t dg_check(int32_t id, const kiln_error *err, const char *what) {
  if (id < 0) fprintf(stderr, "%s: %s\n", what, err->message);
  return id;
}

static inline int32_t dg_in(kiln_builder *b, const char *name, kiln_dtype dt, int32_t rank,
                            const int64_t *dims, const kiln_sym_size *sym) {
  kiln_error err = {KILN_OK, ""};
  return dg_check(kiln_builder_add_input_sym(b, name, dt, rank, dims, sym, &err), &err, name);
}

static inline int32_t dg_op(kiln_builder *b, kiln_op_kind kind, const int32_t *inputs, uint32_t n,
                            const int64_t *iattr, const kiln_sym_size *sym, uint32_t n_iattr,
                            const double *fattr, uint32_t n_fattr) {
  kiln_error err = {KILN_OK, ""};
  return dg_check(kiln_builder_add_op_sym(b, kind, inputs, n, iattr, sym, n_iattr, fattr, n_fattr,
                                          &err),
                  &err, kiln_op_name(kind));
}

static inline int32_t dg_unary(kiln_builder *b, kiln_op_kind kind, int32_t x) {
  return dg_op(b, kind, &x, 1, NULL, NULL, 0, NULL, 0);
}

static inline int32_t dg_binary(kiln_builder *b, kiln_op_kind kind, int32_t x, int32_t y) {
  return dg_op(b, kind, DG_T(x, y), 2, NULL, NULL, 0, NULL, 0);
}

static inline int dg_out(kiln_builder *b, int32_t t, const char *name) {
  kiln_error err = {KILN_OK, ""};
  kiln_status s = t < 0 ? KILN_ERR_INVALID_ARGUMENT : kiln_builder_mark_output(b, t, name, &err);
  if (t >= 0 && s) fprintf(stderr, "mark %s: %s\n", name, err.message);
  return s == KILN_OK;
}

static inline int32_t dg_scalar(kiln_builder *b, kiln_dtype dt, float v) {
  kiln_error err = {KILN_OK, ""};
  uint16_t h = dt == KILN_F16 ? kiln_f32_to_f16(v) : kiln_f32_to_bf16(v);
  return dg_check(kiln_builder_add_constant(b, dt, 0, NULL, dt == KILN_F32 ? (const void *)&v : &h,
                                            kiln_dtype_size(dt), &err),
                  &err, "scalar");
}

/* transformers' rotary embedding of x [1, s, H*8]: heads split [1, s, H, 8] and permuted to
 * [1, H, s, 8], then q * cos + cat(-q[..., 4:], q[..., :4]) * sin with cos, sin [s, 8]. */
static inline int32_t dg_rotary(kiln_builder *b, int32_t x, int64_t heads, int64_t max,
                                int32_t cos, int32_t sin) {
  int32_t h = dg_op(b, KILN_OP_RESHAPE, &x, 1, DG(1, max, heads, 8),
                    (kiln_sym_size[]){DG_NO, DG_S, DG_NO, DG_NO}, 4, NULL, 0);
  int32_t q = dg_op(b, KILN_OP_PERMUTE, &h, 1, DG(0, 2, 1, 3), NULL, 4, NULL, 0);
  int32_t hi = dg_op(b, KILN_OP_SLICE, &q, 1, DG(3, 4, 8, 1), NULL, 4, NULL, 0);
  int32_t lo = dg_op(b, KILN_OP_SLICE, &q, 1, DG(3, 0, 4, 1), NULL, 4, NULL, 0);
  int32_t rot = dg_op(b, KILN_OP_CAT, DG_T(dg_unary(b, KILN_OP_NEG, hi), lo), 2, DG(3), NULL, 1,
                      NULL, 0);
  return dg_binary(b, KILN_OP_ADD, dg_binary(b, KILN_OP_MUL, q, cos),
                   dg_binary(b, KILN_OP_MUL, rot, sin));
}

/* Groups valid at every size: the rotary embeddings of q (4 heads) and k (2 heads) -> [1, H, s,
 * 8]; z * rsqrt(mean(x^2) + eps) * w over x, z [1, s, 16] (the norm of another tensor: pieces,
 * not an RMS_NORM); silu(z * t) + x with t an [s, 16] table; x * keep + pos * t with keep a
 * bool [1, s, 16] and pos an i64 [s, 1] cast to dt (integer loads). */
static inline int dyn_groups(kiln_builder *b, kiln_dtype dt, int64_t max) {
  kiln_error err = {KILN_OK, ""};
  const kiln_sym_size seq3[3] = {DG_NO, DG_S, DG_NO}, seq2[2] = {DG_S, DG_NO};
  if (kiln_builder_add_symbol(b, "seq", 1, max, &err) != 1) return 0;
  int32_t xq = dg_in(b, "xq", dt, 3, DG(1, max, 32), seq3);
  int32_t xk = dg_in(b, "xk", dt, 3, DG(1, max, 16), seq3);
  int32_t cos = dg_in(b, "cos", dt, 2, DG(max, 8), seq2);
  int32_t sin = dg_in(b, "sin", dt, 2, DG(max, 8), seq2);
  int32_t x = dg_in(b, "x", dt, 3, DG(1, max, 16), seq3);
  int32_t z = dg_in(b, "z", dt, 3, DG(1, max, 16), seq3);
  int32_t w = dg_in(b, "w", dt, 1, DG(16), NULL), t = dg_in(b, "t", dt, 2, DG(max, 16), seq2);
  int32_t keep = dg_in(b, "keep", KILN_BOOL, 3, DG(1, max, 16), seq3);
  int32_t pos = dg_in(b, "pos", KILN_I64, 2, DG(max, 1), seq2);
  int32_t sq = dg_op(b, KILN_OP_POW, &x, 1, NULL, NULL, 0, (const double[]){2.0}, 1);
  int32_t m = dg_op(b, KILN_OP_MEAN, &sq, 1, DG(4, 1), NULL, 2, NULL, 0);
  int32_t r = dg_unary(b, KILN_OP_RSQRT, dg_binary(b, KILN_OP_ADD, m, dg_scalar(b, dt, 1e-5f)));
  int32_t y = dg_binary(b, KILN_OP_MUL, dg_binary(b, KILN_OP_MUL, z, r), w);
  int32_t zt = dg_binary(b, KILN_OP_MUL, z, t);
  int32_t u = dg_binary(b, KILN_OP_ADD, dg_unary(b, KILN_OP_SILU, zt), x);
  int ok = dg_out(b, dg_rotary(b, xq, 4, max, cos, sin), "q");
  ok &= dg_out(b, dg_rotary(b, xk, 2, max, cos, sin), "k");
  int32_t kf = dg_op(b, KILN_OP_CAST, &keep, 1, DG(dt), NULL, 1, NULL, 0);
  int32_t pf = dg_op(b, KILN_OP_CAST, &pos, 1, DG(dt), NULL, 1, NULL, 0);
  int32_t e = dg_binary(b, KILN_OP_ADD, dg_binary(b, KILN_OP_MUL, x, kf),
                        dg_binary(b, KILN_OP_MUL, pf, t));
  ok &= dg_out(b, y, "y");
  ok &= dg_out(b, u, "u");
  return ok & dg_out(b, e, "e");
}

/* Groups whose loads follow s: relu of x [1, 4, s, 8] permuted to [1, s, 4, 8] (its head stride
 * is 8s: left unfused); cat(-r, relu(r)) of y's last row r (at 16(s-1): the row is cut out, the
 * rest fused); -cat(y, v) along s, transposed (the second piece starts at row s: the cat is
 * cut out, the rest fused). */
static inline int dyn_moving(kiln_builder *b, kiln_dtype dt, int64_t max) {
  kiln_error err = {KILN_OK, ""};
  const kiln_sym_size seq2[2] = {DG_S, DG_NO};
  if (kiln_builder_add_symbol(b, "seq", 1, max, &err) != 1) return 0;
  int32_t x = dg_in(b, "x", dt, 4, DG(1, 4, max, 8), (kiln_sym_size[]){DG_NO, DG_NO, DG_S, DG_NO});
  int32_t y = dg_in(b, "y", dt, 2, DG(max, 16), seq2), v = dg_in(b, "v", dt, 2, DG(max, 16), seq2);
  int32_t p = dg_op(b, KILN_OP_PERMUTE, &x, 1, DG(0, 2, 1, 3), NULL, 4, NULL, 0);
  int32_t r = dg_op(b, KILN_OP_SELECT, &y, 1, DG(0, max - 1), (kiln_sym_size[]){DG_NO, {1, 1, -1}},
                    2, NULL, 0);
  int32_t c = dg_op(b, KILN_OP_CAT, DG_T(y, v), 2, DG(0), NULL, 1, NULL, 0);
  int32_t neg = dg_unary(b, KILN_OP_NEG, r), relu = dg_unary(b, KILN_OP_RELU, r);
  int32_t rr = dg_op(b, KILN_OP_CAT, DG_T(neg, relu), 2, DG(0), NULL, 1, NULL, 0);
  int32_t ct = dg_op(b, KILN_OP_PERMUTE, DG_T(dg_unary(b, KILN_OP_NEG, c)), 1, DG(1, 0), NULL, 2,
                     NULL, 0);
  int ok = dg_out(b, dg_unary(b, KILN_OP_RELU, p), "a");
  ok &= dg_out(b, rr, "b");
  return ok & dg_out(b, ct, "c");
}

/* The dims of plan tensor t at symbol value n (every symbol at n). */
static inline void dyn_dims_at(const kiln_tensor_desc *t, int64_t n, int64_t *dims) {
  for (int32_t d = 0; d < t->rank; d++)
    dims[d] = t->sym[d].symbol ? t->sym[d].coeff * n + t->sym[d].offset : t->dims[d];
}

#endif
