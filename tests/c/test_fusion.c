/* The builder's fusion passes and views: pointwise chains, steps fused into norms, residual
 * GEMM epilogues, and views placed inside their input's arena block. Which ops each pass fuses
 * and which it leaves alone, what the plan records, that a fused plan computes what the
 * unfused one does on the CPU engine (f32 bit for bit; f16 rounded once instead of per op),
 * and that malformed fused ops are refused by the plan parser and by the CPU engine's init. */
#include "builder/graph.h"
#include "builder/merge_linears.h"
#include "check.h"
#include "dynamic_groups.h"
#include "runtime/alloc.h"
#include "runtime/linear_inputs.h"
#include "runtime/pointwise_steps.h"
#include "test_cpu_harness.h"

#include "kiln/kiln.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define D(...) ((const int64_t[]){__VA_ARGS__})
#define T(...) ((const int32_t[]){__VA_ARGS__})
#define MAX_OUTS 12
#define MAX_INS 12

/* Records one graph in dtype dt into b and marks its outputs. */
typedef void (*graph_fn)(kiln_builder *b, kiln_dtype dt);

static int32_t in(kiln_builder *b, const char *name, kiln_dtype dt, int32_t rank,
                  const int64_t *dims) {
  kiln_error err = {KILN_OK, ""};
  int32_t id = kiln_builder_add_input(b, name, dt, rank, dims, &err);
  if (id < 0) fprintf(stderr, "add_input: %s\n", err.message);
  CHECK(id >= 0);
  return id;
}

static int32_t op(kiln_builder *b, kiln_op_kind kind, const int32_t *inputs, uint32_t n,
                  int64_t iattr0, uint32_t n_iattr, const double *fattr, uint32_t n_fattr) {
  kiln_error err = {KILN_OK, ""};
  int32_t id = kiln_builder_add_op(b, kind, inputs, n, &iattr0, n_iattr, fattr, n_fattr, &err);
  if (id < 0) fprintf(stderr, "add_op: %s\n", err.message);
  CHECK(id >= 0);
  return id;
}

static int32_t unary(kiln_builder *b, kiln_op_kind kind, int32_t x) {
  return op(b, kind, T(x), 1, 0, 0, NULL, 0);
}

static int32_t binary(kiln_builder *b, kiln_op_kind kind, int32_t x, int32_t y) {
  return op(b, kind, T(x, y), 2, 0, 0, NULL, 0);
}

static void out(kiln_builder *b, int32_t t, const char *name) {
  kiln_error err = {KILN_OK, ""};
  kiln_status s = kiln_builder_mark_output(b, t, name, &err);
  if (s) fprintf(stderr, "mark_output: %s\n", err.message);
  CHECK(s == KILN_OK);
}

/* ---------------------------------------------------------------- the graphs */

/* Ops that compute the same thing twice: two linears of one weight and their softmaxes (the
 * second pair merges into the first, the softmax because its input merged), a third linear of
 * a second constant with the weight's bytes (merges too), a softmax over another dim (kept),
 * and two equal softmaxes that are both outputs (kept). */
static void g_common(kiln_builder *b, kiln_dtype dt) {
  kiln_error err = {KILN_OK, ""};
  float wdata[30];
  for (int i = 0; i < 30; i++) wdata[i] = (float)(i % 7) / 6.0f - 0.5f;
  int32_t x = in(b, "x", dt, 2, D(4, 6));
  int32_t w = kiln_builder_add_constant(b, KILN_F32, 2, D(5, 6), wdata, sizeof wdata, &err);
  CHECK(w >= 0);
  int32_t l1 = binary(b, KILN_OP_LINEAR, x, w), l2 = binary(b, KILN_OP_LINEAR, x, w);
  int32_t s1 = op(b, KILN_OP_SOFTMAX, T(l1), 1, 1, 1, NULL, 0);
  int32_t s2 = op(b, KILN_OP_SOFTMAX, T(l2), 1, 1, 1, NULL, 0);
  out(b, binary(b, KILN_OP_SUB, s1, op(b, KILN_OP_SOFTMAX, T(l1), 1, 0, 1, NULL, 0)), "d");
  out(b, binary(b, KILN_OP_MUL, s2, l2), "m");
  int32_t same_bytes =
      kiln_builder_add_constant(b, KILN_F32, 2, D(5, 6), wdata, sizeof wdata, &err);
  out(b, binary(b, KILN_OP_MUL, binary(b, KILN_OP_LINEAR, x, same_bytes), s1), "c");
  out(b, op(b, KILN_OP_SOFTMAX, T(x), 1, 1, 1, NULL, 0), "o1");
  out(b, op(b, KILN_OP_SOFTMAX, T(x), 1, 1, 1, NULL, 0), "o2");
}

/* A f32 [4,2] state with non-zero initial values. */
static int32_t small_cache(kiln_builder *b) {
  kiln_error err = {KILN_OK, ""};
  float initial[8];
  for (int i = 0; i < 8; i++) initial[i] = 0.25f * (float)i - 0.5f;
  int32_t cache = kiln_builder_add_state(b, KILN_F32, 2, D(4, 2), initial, sizeof initial, &err);
  CHECK(cache >= 0);
  return cache;
}

/* Writes v [1,2] into slot 1 of small_cache's state, in place (the write is its last reader). */
static void write_slot(kiln_builder *b, int32_t cache, int32_t v) {
  kiln_error err = {KILN_OK, ""};
  int64_t slot = 1;
  int32_t index = kiln_builder_add_constant(b, KILN_I64, 1, D(1), &slot, sizeof slot, &err);
  CHECK(index >= 0);
  int32_t written = op(b, KILN_OP_INDEX_COPY, T(cache, index, v), 3, 0, 1, NULL, 0);
  CHECK(kiln_builder_write_state(b, cache, written, &err) == KILN_OK);
}

/* Copies: of an op's output read by another op (goes), as an output (stays), and of a view of
 * a state before its write (stays: it holds the bytes the in-place write replaces). */
static void g_copies(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 2, D(4, 2)), v = in(b, "v", KILN_F32, 2, D(1, 2));
  int32_t y = unary(b, KILN_OP_EXP, x);
  out(b, op(b, KILN_OP_SOFTMAX, T(unary(b, KILN_OP_COPY, y)), 1, 1, 1, NULL, 0), "a");
  out(b, unary(b, KILN_OP_COPY, y), "b");
  int32_t cache = small_cache(b);
  int32_t before = unary(b, KILN_OP_COPY, op(b, KILN_OP_RESHAPE, T(cache), 1, 8, 1, NULL, 0));
  write_slot(b, cache, v);
  out(b, op(b, KILN_OP_SOFTMAX, T(before), 1, 0, 1, NULL, 0), "c");
}

/* Two equal reshapes of a state, one before and one after the INDEX_COPY that writes it: a
 * reshape is a view of the state's buffer, so merging the second into the first would let
 * its readers see the written bytes. */
static void g_common_state(kiln_builder *b, kiln_dtype dt) {
  (void)dt;
  int32_t cache = small_cache(b);
  int32_t v = in(b, "v", KILN_F32, 2, D(1, 2));
  int32_t before = op(b, KILN_OP_RESHAPE, T(cache), 1, 8, 1, NULL, 0);
  write_slot(b, cache, v);
  int32_t after = op(b, KILN_OP_RESHAPE, T(cache), 1, 8, 1, NULL, 0);
  out(b, unary(b, KILN_OP_EXP, before), "a");
  out(b, unary(b, KILN_OP_NEG, after), "b");
}

/* x * y[4] + z, then GELU (tanh): one chain of three steps over two extra inputs. */
static void g_mul_add_gelu(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 3, D(2, 3, 4)), y = in(b, "y", dt, 1, D(4));
  int32_t z = in(b, "z", dt, 3, D(2, 3, 4));
  int32_t a = binary(b, KILN_OP_MUL, x, y);
  out(b, op(b, KILN_OP_GELU, T(binary(b, KILN_OP_ADD, a, z)), 1, 1, 1, NULL, 0), "out");
}

/* exp(z / (y - x)): the chain value is the right operand of SUB and DIV. */
static void g_reversed(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 3, D(2, 3, 4)), y = in(b, "y", dt, 1, D(4));
  int32_t z = in(b, "z", dt, 2, D(3, 1));
  int32_t a = binary(b, KILN_OP_SUB, y, x);
  out(b, unary(b, KILN_OP_EXP, binary(b, KILN_OP_DIV, z, a)), "out");
}

/* relu(x) is an output too, so only exp and neg fuse. */
static void g_multi_use(kiln_builder *b, kiln_dtype dt) {
  int32_t a = unary(b, KILN_OP_RELU, in(b, "x", dt, 2, D(3, 5)));
  out(b, a, "a");
  out(b, unary(b, KILN_OP_NEG, unary(b, KILN_OP_EXP, a)), "c");
}

/* relu(x[4]) + w[3,4] would enlarge the chain of relu; the add starts its own chain from w.
 * p[3,1] + q[1,4] has no operand of the output's shape, so its sigmoid stays alone. */
static void g_enlarging(kiln_builder *b, kiln_dtype dt) {
  int32_t a = unary(b, KILN_OP_RELU, in(b, "x", dt, 1, D(4)));
  int32_t w = in(b, "w", dt, 2, D(3, 4));
  out(b, unary(b, KILN_OP_TANH, binary(b, KILN_OP_ADD, a, w)), "c");
  int32_t p = in(b, "p", dt, 2, D(3, 1)), q = in(b, "q", dt, 2, D(1, 4));
  out(b, unary(b, KILN_OP_SIGMOID, binary(b, KILN_OP_ADD, p, q)), "d");
}

/* Integer arithmetic never fuses. */
static void g_integer(kiln_builder *b, kiln_dtype dt) {
  (void)dt;
  int32_t x = in(b, "x", KILN_I32, 1, D(6));
  out(b, binary(b, KILN_OP_SUB, binary(b, KILN_OP_ADD, binary(b, KILN_OP_MUL, x, x), x), x), "y");
}

/* Ten unary ops: eight steps in one POINTWISE op, two in the next. */
static void g_long(kiln_builder *b, kiln_dtype dt) {
  static const kiln_op_kind kinds[10] = {KILN_OP_NEG,  KILN_OP_TANH, KILN_OP_SIGMOID, KILN_OP_RELU,
                                         KILN_OP_SILU, KILN_OP_EXP,  KILN_OP_NEG,     KILN_OP_TANH,
                                         KILN_OP_SIGMOID, KILN_OP_SILU};
  int32_t v = in(b, "x", dt, 2, D(4, 4));
  for (int i = 0; i < 10; i++) v = unary(b, kinds[i], v);
  out(b, v, "y");
}

/* pow(x, 2) + y, then pow(., 0.5) and neg: a second POW starts a second chain. */
static void g_two_pows(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 2, D(2, 8)), y = in(b, "y", dt, 2, D(2, 8));
  int32_t a = op(b, KILN_OP_POW, T(x), 1, 0, 0, (const double[]){2.0}, 1);
  int32_t c = op(b, KILN_OP_POW, T(binary(b, KILN_OP_ADD, a, y)), 1, 0, 0,
                 (const double[]){0.5}, 1);
  out(b, unary(b, KILN_OP_NEG, c), "y_out");
}

/* A rank-0 constant of dt holding v. */
static int32_t scalar(kiln_builder *b, kiln_dtype dt, float v) {
  kiln_error err = {KILN_OK, ""};
  uint16_t h = dt == KILN_F16 ? kiln_f32_to_f16(v) : kiln_f32_to_bf16(v);
  int32_t id = kiln_builder_add_constant(b, dt, 0, NULL, dt == KILN_F32 ? (const void *)&v : &h,
                                         kiln_dtype_size(dt), &err);
  CHECK(id >= 0);
  return id;
}

/* A constant of dt and dims whose values, multiples of 1/64 in [-0.5, 0.5), follow seed. */
static int32_t constant(kiln_builder *b, kiln_dtype dt, int32_t rank, const int64_t *dims,
                        uint32_t seed) {
  kiln_error err = {KILN_OK, ""};
  int64_t n = 1;
  for (int32_t d = 0; d < rank; d++) n *= dims[d];
  void *data = calloc((size_t)n, kiln_dtype_size(dt));
  CHECK(data != NULL);
  for (int64_t i = 0; data && i < n; i++) /* multiples of 1/64 in [-0.5, 0.5) */
    fill_value(data, dt, i, (double)((seed * 37u + (uint32_t)i * 29u) % 64u) / 64.0 - 0.5);
  int32_t id = kiln_builder_add_constant(b, dt, rank, dims, data,
                                         (size_t)n * kiln_dtype_size(dt), &err);
  if (id < 0) fprintf(stderr, "add_constant: %s\n", err.message);
  CHECK(id >= 0);
  free(data);
  return id;
}

/* log(|hardswish(erf(sin(clamp(x, -0.5, 0.75))))|), clamp as the lowering writes it, and
 * hardsigmoid(maximum(y, cos(x))): the new steps, MAXIMUM with the chain on its right. */
static void g_new_steps(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 3, D(2, 3, 4)), y = in(b, "y", dt, 1, D(4));
  int32_t v = binary(b, KILN_OP_MAXIMUM, x, scalar(b, dt, -0.5f));
  v = binary(b, KILN_OP_MINIMUM, v, scalar(b, dt, 0.75f));
  v = unary(b, KILN_OP_ERF, unary(b, KILN_OP_SIN, v));
  out(b, unary(b, KILN_OP_LOG, unary(b, KILN_OP_ABS, unary(b, KILN_OP_HARDSWISH, v))), "a");
  v = binary(b, KILN_OP_MAXIMUM, y, unary(b, KILN_OP_COS, x));
  out(b, unary(b, KILN_OP_HARDSIGMOID, v), "b");
}

/* x + 2 * y keeps its alpha: it stays an ADD, and its relu stays alone. */
static void g_alpha(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 1, D(8)), y = in(b, "y", dt, 1, D(8));
  int32_t a = op(b, KILN_OP_ADD, T(x, y), 2, 0, 0, (const double[]){2.0}, 1);
  out(b, unary(b, KILN_OP_RELU, a), "out");
}

/* A GEMM keeps its activation: linear+relu then mul alone; linear+gelu then mul+add fused. */
static void g_linear(kiln_builder *b, kiln_dtype dt) {
  kiln_error err = {KILN_OK, ""};
  float wdata[12];
  for (int i = 0; i < 12; i++) wdata[i] = (float)(i % 5) / 4.0f - 0.5f;
  int32_t x = in(b, "x", dt, 2, D(2, 3)), y = in(b, "y", dt, 1, D(4));
  int32_t z = in(b, "z", dt, 2, D(2, 4));
  int32_t w = kiln_builder_add_constant(b, KILN_F32, 2, D(4, 3), wdata, sizeof wdata, &err);
  /* another weight: two linears of one weight would merge into one */
  for (int i = 0; i < 12; i++) wdata[i] = (float)(i % 3) / 2.0f - 0.25f;
  int32_t w2 = kiln_builder_add_constant(b, KILN_F32, 2, D(4, 3), wdata, sizeof wdata, &err);
  CHECK(w >= 0 && w2 >= 0);
  int32_t r = unary(b, KILN_OP_RELU, binary(b, KILN_OP_LINEAR, x, w));
  out(b, binary(b, KILN_OP_MUL, r, y), "m");
  int32_t g = unary(b, KILN_OP_GELU, binary(b, KILN_OP_LINEAR, x, w2));
  out(b, binary(b, KILN_OP_ADD, binary(b, KILN_OP_MUL, g, y), z), "k");
}

/* Every step kind with square roots of positive values: sqrt, rsqrt, div, sub, gelu (erf). */
static void g_all_steps(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 2, D(3, 7)), y = in(b, "y", dt, 2, D(3, 1));
  int32_t v = unary(b, KILN_OP_SQRT, x);
  v = binary(b, KILN_OP_DIV, v, y);
  v = unary(b, KILN_OP_RSQRT, v);
  v = binary(b, KILN_OP_SUB, v, y);
  v = unary(b, KILN_OP_GELU, v);
  v = binary(b, KILN_OP_MUL, x, v);
  out(b, unary(b, KILN_OP_SIGMOID, v), "out");
}

/* Eight binary steps on eight distinct operands: seven fit next to x, the eighth stays alone. */
static void g_many_operands(kiln_builder *b, kiln_dtype dt) {
  static const char *const names[8] = {"e1", "e2", "e3", "e4", "e5", "e6", "e7", "e8"};
  int32_t v = in(b, "x", dt, 2, D(2, 8));
  for (int i = 0; i < 8; i++) {
    int32_t e = in(b, names[i], dt, 1, D(8));
    v = i % 2 ? binary(b, KILN_OP_MUL, e, v) : binary(b, KILN_OP_ADD, v, e);
  }
  out(b, v, "y");
}

/* relu(x) * exp(y), then neg: the first chain takes the mul, so exp(y), whose only reader is
 * now inside that chain, must not grow into it. */
static void g_shared_reader(kiln_builder *b, kiln_dtype dt) {
  int32_t a = unary(b, KILN_OP_RELU, in(b, "x", dt, 1, D(8)));
  int32_t e = unary(b, KILN_OP_EXP, in(b, "y", dt, 1, D(8)));
  out(b, unary(b, KILN_OP_NEG, binary(b, KILN_OP_MUL, a, e)), "out");
}


/* A norm over the last dim: LAYER_NORM with weight and bias, or RMS_NORM with neither. */
static int32_t norm(kiln_builder *b, kiln_op_kind kind, const int32_t *inputs, uint32_t n,
                    int64_t flags) {
  kiln_error err = {KILN_OK, ""};
  int32_t id = kiln_builder_add_op(b, kind, inputs, n, (const int64_t[]){1, flags}, 2,
                                   (const double[]){1e-5}, 1, &err);
  if (id < 0) fprintf(stderr, "add_op: %s\n", err.message);
  CHECK(id >= 0);
  return id;
}

/* layer_norm(x + r, w, b), then gelu and * s[3,1]: the add fuses before the norm, the chain
 * that pointwise fusion made of gelu and mul after it. */
static void g_norm_both(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 3, D(2, 3, 8)), r = in(b, "r", dt, 3, D(2, 3, 8));
  int32_t w = in(b, "w", dt, 1, D(8)), bias = in(b, "b", dt, 1, D(8));
  int32_t s = in(b, "s", dt, 2, D(3, 1));
  int32_t n = norm(b, KILN_OP_LAYER_NORM, T(binary(b, KILN_OP_ADD, x, r), w, bias), 3, 3);
  out(b, binary(b, KILN_OP_MUL, unary(b, KILN_OP_GELU, n), s), "y");
}

/* rms_norm((x - m) * a) then x3 and neg: a two-step chain before, a pow chain after, the
 * exponent in fattr1; the norm takes the later chain's place, after the exp that feeds it. */
static void g_norm_rms_pow(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 2, D(4, 16)), m = in(b, "m", dt, 1, D(16));
  int32_t a = in(b, "a", dt, 2, D(4, 1)), z = in(b, "z", dt, 2, D(4, 16));
  int32_t n = norm(b, KILN_OP_RMS_NORM, T(binary(b, KILN_OP_MUL, binary(b, KILN_OP_SUB, x, m), a)),
                   1, 0);
  int32_t p = op(b, KILN_OP_POW, T(n), 1, 0, 0, (const double[]){3.0}, 1);
  int32_t late = unary(b, KILN_OP_EXP, z);
  out(b, unary(b, KILN_OP_NEG, binary(b, KILN_OP_ADD, p, late)), "y");
}

/* What stays apart: a norm read twice (an output too) keeps its readers; x + r that is an
 * output stays an op; z - norm reads the norm as the operand, not as x; a pow on both sides
 * keeps the second; norm * norm reads it as an operand too; six steps after a norm do not fit
 * in five. */
static void g_norm_apart(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 2, D(3, 8)), r = in(b, "r", dt, 2, D(3, 8));
  int32_t z = in(b, "z", dt, 2, D(3, 8));
  int32_t h = binary(b, KILN_OP_ADD, x, r);
  int32_t n1 = norm(b, KILN_OP_RMS_NORM, T(h), 1, 0);
  out(b, h, "h");
  out(b, n1, "n1");
  out(b, unary(b, KILN_OP_RELU, n1), "relu_n1");
  out(b, binary(b, KILN_OP_SUB, z, norm(b, KILN_OP_RMS_NORM, T(z), 1, 0)), "z_minus");
  int32_t pw = op(b, KILN_OP_POW, T(x), 1, 0, 0, (const double[]){2.0}, 1);
  int32_t n3 = norm(b, KILN_OP_RMS_NORM, T(pw), 1, 0);
  out(b, op(b, KILN_OP_POW, T(n3), 1, 0, 0, (const double[]){0.5}, 1), "pows");
  int32_t sq = norm(b, KILN_OP_RMS_NORM, T(in(b, "s", dt, 2, D(3, 8))), 1, 0); /* z's would merge */
  out(b, binary(b, KILN_OP_MUL, sq, sq), "squared");
  int32_t v = norm(b, KILN_OP_RMS_NORM, T(r), 1, 0);
  static const kiln_op_kind six[6] = {KILN_OP_NEG, KILN_OP_TANH, KILN_OP_SIGMOID,
                                      KILN_OP_RELU, KILN_OP_SILU, KILN_OP_EXP};
  for (int i = 0; i < 6; i++) v = unary(b, six[i], v);
  out(b, v, "six");
}


/* linear(x, w, bias) + r, and r2 + linear(x, w) with r2 computed after the linear; a linear
 * with an activation, a linear whose output is also read elsewhere and a linear plus a
 * broadcast row keep their adds. */
static void g_residual(kiln_builder *b, kiln_dtype dt) {
  kiln_error err = {KILN_OK, ""};
  float wdata[24], bdata[4];
  for (int i = 0; i < 24; i++) wdata[i] = (float)(i % 7) / 8.0f - 0.375f;
  for (int i = 0; i < 4; i++) bdata[i] = (float)i / 4.0f;
  int32_t x = in(b, "x", dt, 2, D(3, 6)), r = in(b, "r", dt, 2, D(3, 4));
  int32_t w = kiln_builder_add_constant(b, KILN_F32, 2, D(4, 6), wdata, sizeof wdata, &err);
  int32_t bias = kiln_builder_add_constant(b, KILN_F32, 1, D(4), bdata, sizeof bdata, &err);
  /* more weights: linears of one weight and input would merge into one */
  for (int i = 0; i < 24; i++) wdata[i] = (float)(i % 5) / 8.0f - 0.25f;
  int32_t w2 = kiln_builder_add_constant(b, KILN_F32, 2, D(4, 6), wdata, sizeof wdata, &err);
  for (int i = 0; i < 24; i++) wdata[i] = (float)(i % 3) / 4.0f - 0.125f;
  int32_t w3 = kiln_builder_add_constant(b, KILN_F32, 2, D(4, 6), wdata, sizeof wdata, &err);
  CHECK(w >= 0 && bias >= 0 && w2 >= 0 && w3 >= 0);
  out(b, binary(b, KILN_OP_ADD, op(b, KILN_OP_LINEAR, T(x, w, bias), 3, 0, 1, NULL, 0), r), "a");
  int32_t y = binary(b, KILN_OP_LINEAR, x, w);
  int32_t r2 = unary(b, KILN_OP_TANH, r);
  out(b, binary(b, KILN_OP_ADD, r2, y), "b");
  int32_t g = op(b, KILN_OP_LINEAR, T(x, w), 2, KILN_ACT_RELU, 1, NULL, 0);
  out(b, binary(b, KILN_OP_ADD, g, r), "c");
  int32_t twice = binary(b, KILN_OP_LINEAR, x, w2);
  out(b, twice, "d");
  out(b, binary(b, KILN_OP_ADD, twice, r), "e");
  int32_t row = in(b, "row", dt, 1, D(4)); /* broadcast: not a residual */
  out(b, binary(b, KILN_OP_ADD, binary(b, KILN_OP_LINEAR, x, w3), row), "f");
}


/* neg(x) for x[3,2,4], then select(0, 2) and reshape to [8] (views inside neg's block) and
 * relu; a slice of dim 1 (after a dim of 3) is no view and copies, then exp. */
static void g_views(kiln_builder *b, kiln_dtype dt) {
  kiln_error err = {KILN_OK, ""};
  int32_t a = unary(b, KILN_OP_NEG, in(b, "x", dt, 3, D(3, 2, 4)));
  int32_t sel = kiln_builder_add_op(b, KILN_OP_SELECT, T(a), 1, D(0, 2), 2, NULL, 0, &err);
  int32_t flat = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(sel), 1, D(8), 1, NULL, 0, &err);
  int32_t sl = kiln_builder_add_op(b, KILN_OP_SLICE, T(a), 1, D(1, 1, 2, 1), 4, NULL, 0, &err);
  CHECK(sel >= 0 && flat >= 0 && sl >= 0);
  out(b, unary(b, KILN_OP_RELU, flat), "relu");
  out(b, unary(b, KILN_OP_EXP, sl), "exp");
}


/* Multi-head attention as exported: x [2,5,384] reshaped to qkv [2,5,3,2,64], permuted
 * (2,0,3,1,4), q, k, v selected, SDPA, permuted (0,2,1,3) back and reshaped to [2,5,128].
 * With `mask`, a bool mask [5,5]; with `peek` 1 or 2, k or the attention result is also an
 * output, and with `swap`, q and k are the second and first slices: then nothing fuses. */
static void mha(kiln_builder *b, kiln_dtype dt, int mask, int peek, int swap) {
  kiln_error err = {KILN_OK, ""};
  int32_t x = in(b, "x", dt, 3, D(2, 5, 384)), m = mask ? in(b, "m", KILN_BOOL, 2, D(5, 5)) : -1;
  int32_t qkv = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(x), 1, D(2, 5, 3, 2, 64), 5, NULL, 0, &err);
  int32_t p = kiln_builder_add_op(b, KILN_OP_PERMUTE, T(qkv), 1, D(2, 0, 3, 1, 4), 5, NULL, 0, &err);
  int32_t part[3];
  for (int k = 0; k < 3; k++)
    part[k] = kiln_builder_add_op(b, KILN_OP_SELECT, T(p), 1, D(0, swap && k < 2 ? 1 - k : k), 2,
                                  NULL, 0, &err);
  int32_t a = mask ? kiln_builder_add_op(b, KILN_OP_SDPA, T(part[0], part[1], part[2], m), 4,
                                         D(0, 1), 2, NULL, 0, &err)
                   : kiln_builder_add_op(b, KILN_OP_SDPA, T(part[0], part[1], part[2]), 3,
                                         D(1, 0), 2, NULL, 0, &err);
  int32_t back = kiln_builder_add_op(b, KILN_OP_PERMUTE, T(a), 1, D(0, 2, 1, 3), 4, NULL, 0, &err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(back), 1, D(2, 5, 128), 3, NULL, 0, &err);
  if (y < 0) fprintf(stderr, "mha: %s\n", err.message);
  CHECK(y >= 0);
  out(b, y, "y");
  if (peek == 1) out(b, part[1], "k");
  if (peek == 2) out(b, a, "attention");
}
/* GPT-2's attention: x [2,5,384] sliced along its last dim into q, k and v (order `order`: 0
 * q k v, 1 k q v), each reshaped to [2,5,2,64] and permuted (0,2,1,3); causal SDPA; a reshape
 * to the shape it has, permuted back, reshaped to [2,5,128]. */
static void sliced_mha(kiln_builder *b, kiln_dtype dt, int order) {
  kiln_error err = {KILN_OK, ""};
  int32_t x = in(b, "x", dt, 3, D(2, 5, 384)), part[3];
  for (int k = 0; k < 3; k++) {
    int64_t at = order && k < 2 ? 1 - k : k;
    int32_t sl = kiln_builder_add_op(b, KILN_OP_SLICE, T(x), 1, D(2, 128 * at, 128 * at + 128, 1),
                                     4, NULL, 0, &err);
    int32_t h = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(sl), 1, D(2, 5, 2, 64), 4, NULL, 0, &err);
    part[k] = kiln_builder_add_op(b, KILN_OP_PERMUTE, T(h), 1, D(0, 2, 1, 3), 4, NULL, 0, &err);
  }
  int32_t a = kiln_builder_add_op(b, KILN_OP_SDPA, T(part[0], part[1], part[2]), 3, D(1, 0), 2,
                                  NULL, 0, &err);
  int32_t same = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(a), 1, D(2, 2, 5, 64), 4, NULL, 0, &err);
  int32_t back =
      kiln_builder_add_op(b, KILN_OP_PERMUTE, T(same), 1, D(0, 2, 1, 3), 4, NULL, 0, &err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(back), 1, D(2, 5, 128), 3, NULL, 0, &err);
  if (y < 0) fprintf(stderr, "sliced_mha: %s\n", err.message);
  CHECK(y >= 0);
  out(b, y, "y");
}
static void g_sliced_mha(kiln_builder *b, kiln_dtype dt) { sliced_mha(b, dt, 0); }
static void g_sliced_mha_swapped(kiln_builder *b, kiln_dtype dt) { sliced_mha(b, dt, 1); }

/* A linear on rows flattened to 2-D, as GPT-2's: x [1,3,6] reshaped to [3,6], linear to
 * [3,4], reshaped to [1,3,4], plus r [1,3,4]; and the same with the 2-D result also read. */
static void g_residual_flat(kiln_builder *b, kiln_dtype dt) {
  kiln_error err = {KILN_OK, ""};
  float wdata[24];
  for (int i = 0; i < 24; i++) wdata[i] = (float)(i % 7) / 8.0f - 0.375f;
  int32_t x = in(b, "x", dt, 3, D(1, 3, 6)), r = in(b, "r", dt, 3, D(1, 3, 4));
  int32_t w = kiln_builder_add_constant(b, KILN_F32, 2, D(4, 6), wdata, sizeof wdata, &err);
  for (int i = 0; i < 24; i++) wdata[i] = (float)(i % 5) / 8.0f - 0.25f;
  int32_t w2 = kiln_builder_add_constant(b, KILN_F32, 2, D(4, 6), wdata, sizeof wdata, &err);
  int32_t flat = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(x), 1, D(3, 6), 2, NULL, 0, &err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(binary(b, KILN_OP_LINEAR, flat, w)), 1,
                                  D(1, 3, 4), 3, NULL, 0, &err);
  int32_t y2d = binary(b, KILN_OP_LINEAR, flat, w2);
  int32_t y2 = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(y2d), 1, D(1, 3, 4), 3, NULL, 0, &err);
  CHECK(w >= 0 && w2 >= 0 && y >= 0 && y2 >= 0);
  out(b, binary(b, KILN_OP_ADD, y, r), "a");
  out(b, binary(b, KILN_OP_ADD, r, y2), "b");
  out(b, y2d, "c");
}

/* As g_residual_flat's "a", with the clone torch.export leaves between the reshape and the add
 * (a dropout in eval mode). */
static void g_residual_clone(kiln_builder *b, kiln_dtype dt) {
  kiln_error err = {KILN_OK, ""};
  int32_t x = in(b, "x", dt, 3, D(1, 3, 6)), r = in(b, "r", dt, 3, D(1, 3, 4));
  int32_t flat = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(x), 1, D(3, 6), 2, NULL, 0, &err);
  int32_t z = binary(b, KILN_OP_LINEAR, flat, constant(b, dt, 2, D(4, 6), 3));
  int32_t y = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(z), 1, D(1, 3, 4), 3, NULL, 0, &err);
  CHECK(y >= 0);
  out(b, binary(b, KILN_OP_ADD, unary(b, KILN_OP_COPY, y), r), "a");
}

/* Rotary frequencies as transformers computes them: inv_freq [1,6,1] @ positions [1,1,3] (an
 * outer product), then cos; and a matmul with an inner dim of 2, which stays one. */
static void g_outer(kiln_builder *b, kiln_dtype dt) {
  int32_t f = in(b, "f", dt, 3, D(1, 6, 1)), p = in(b, "p", dt, 3, D(1, 1, 3));
  out(b, unary(b, KILN_OP_COS, binary(b, KILN_OP_MATMUL, f, p)), "cos");
  int32_t a = in(b, "a", dt, 3, D(1, 6, 2)), c = in(b, "c", dt, 3, D(1, 2, 3));
  out(b, binary(b, KILN_OP_MATMUL, a, c), "mm");
}

static void g_mha_causal(kiln_builder *b, kiln_dtype dt) { mha(b, dt, 0, 0, 0); }
static void g_mha_mask(kiln_builder *b, kiln_dtype dt) { mha(b, dt, 1, 0, 0); }
static void g_mha_peek(kiln_builder *b, kiln_dtype dt) { mha(b, dt, 0, 1, 0); }
static void g_mha_swapped(kiln_builder *b, kiln_dtype dt) { mha(b, dt, 0, 0, 1); }
static void g_mha_peek_out(kiln_builder *b, kiln_dtype dt) { mha(b, dt, 0, 2, 0); }

/* Grouped-query attention as transformers writes it: q [1,4,6,8] and k, v [1,2,6,8], each of
 * k and v viewed as [1,2,1,6,8], expanded to [1,2,2,6,8], copied and viewed as [1,4,6,8]
 * (repeat_kv), then causal SDPA. `variant` 1: the expanded k is an output too; 2: k is tiled
 * ([1,1,2,6,8] expanded over dim 1: head h reads h % 2), which is not GQA; 3: a float mask;
 * 4: k comes as [1,2,2,6,8] and its expand changes nothing: four real heads, not a repeat;
 * 5: v has one head repeated 4 times, k two repeated twice: k and v would differ in heads. */
static int32_t repeat_heads(kiln_builder *b, int32_t t, int tile) {
  kiln_error err = {KILN_OK, ""};
  int32_t u = tile == 2 ? t /* already [1,2,2,6,8]: the expand changes nothing */
              : kiln_builder_add_op(b, KILN_OP_RESHAPE, T(t), 1,
                                    tile == 1   ? D(1, 1, 2, 6, 8)
                                    : tile == 3 ? D(1, 1, 1, 6, 8)
                                                : D(1, 2, 1, 6, 8),
                                    5, NULL, 0, &err);
  int32_t e = kiln_builder_add_op(b, KILN_OP_EXPAND, T(u), 1,
                                  tile == 3 ? D(1, 1, 4, 6, 8) : D(1, 2, 2, 6, 8), 5, NULL, 0, &err);
  int32_t c = kiln_builder_add_op(b, KILN_OP_COPY, T(e), 1, NULL, 0, NULL, 0, &err);
  int32_t r = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(c), 1, D(1, 4, 6, 8), 4, NULL, 0, &err);
  if (r < 0) fprintf(stderr, "repeat_heads: %s\n", err.message);
  CHECK(r >= 0);
  return r;
}
static void gqa(kiln_builder *b, kiln_dtype dt, int variant) {
  kiln_error err = {KILN_OK, ""};
  int32_t q = in(b, "q", dt, 4, D(1, 4, 6, 8));
  int32_t k = variant == 4 ? in(b, "k", dt, 5, D(1, 2, 2, 6, 8)) : in(b, "k", dt, 4, D(1, 2, 6, 8));
  int32_t v = variant == 5 ? in(b, "v", dt, 4, D(1, 1, 6, 8)) : in(b, "v", dt, 4, D(1, 2, 6, 8));
  int32_t m = variant == 3 ? in(b, "m", dt, 4, D(1, 1, 6, 6)) : -1;
  int32_t kr = repeat_heads(b, k, variant == 2 ? 1 : variant == 4 ? 2 : 0);
  int32_t vr = repeat_heads(b, v, variant == 5 ? 3 : 0);
  int32_t a = m >= 0 ? kiln_builder_add_op(b, KILN_OP_SDPA, T(q, kr, vr, m), 4, D(0, 1), 2, NULL,
                                           0, &err)
                     : kiln_builder_add_op(b, KILN_OP_SDPA, T(q, kr, vr), 3, D(1, 0), 2, NULL, 0,
                                           &err);
  if (a < 0) fprintf(stderr, "gqa: %s\n", err.message);
  CHECK(a >= 0);
  out(b, a, "y");
  if (variant == 1) out(b, kr, "k_repeated");
}
/* Attention as Llama-family models write it: q [1,6,256] viewed as [1,6,4,64], permuted
 * (0,2,1,3) and scaled (a stand-in for the rotary embedding, so q is no head of a packed
 * projection); k and v [1,2,6,64] repeated to 4 heads; causal SDPA (or a bool mask [6,6] with
 * `mask`), the result permuted (0,2,1,3) and viewed as [1,6,256]. */
static void llama_attention(kiln_builder *b, kiln_dtype dt, int mask) {
  kiln_error err = {KILN_OK, ""};
  int32_t x = in(b, "x", dt, 3, D(1, 6, 256)), s = in(b, "s", dt, 4, D(1, 1, 1, 64));
  int32_t kv[2] = {in(b, "k", dt, 4, D(1, 2, 6, 64)), in(b, "v", dt, 4, D(1, 2, 6, 64))};
  int32_t m = mask ? in(b, "m", KILN_BOOL, 2, D(6, 6)) : -1;
  int32_t h = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(x), 1, D(1, 6, 4, 64), 4, NULL, 0, &err);
  int32_t q = binary(b, KILN_OP_MUL,
                     kiln_builder_add_op(b, KILN_OP_PERMUTE, T(h), 1, D(0, 2, 1, 3), 4, NULL, 0, &err),
                     s);
  for (int k = 0; k < 2; k++) {
    int32_t u = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(kv[k]), 1, D(1, 2, 1, 6, 64), 5, NULL, 0,
                                    &err);
    int32_t e = kiln_builder_add_op(b, KILN_OP_EXPAND, T(u), 1, D(1, 2, 2, 6, 64), 5, NULL, 0, &err);
    int32_t c = kiln_builder_add_op(b, KILN_OP_COPY, T(e), 1, NULL, 0, NULL, 0, &err);
    kv[k] = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(c), 1, D(1, 4, 6, 64), 4, NULL, 0, &err);
  }
  int32_t a = mask ? kiln_builder_add_op(b, KILN_OP_SDPA, T(q, kv[0], kv[1], m), 4, D(0, 1), 2,
                                         NULL, 0, &err)
                   : kiln_builder_add_op(b, KILN_OP_SDPA, T(q, kv[0], kv[1]), 3, D(1, 0), 2, NULL,
                                         0, &err);
  int32_t back = kiln_builder_add_op(b, KILN_OP_PERMUTE, T(a), 1, D(0, 2, 1, 3), 4, NULL, 0, &err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(back), 1, D(1, 6, 256), 3, NULL, 0, &err);
  if (y < 0) fprintf(stderr, "llama_attention: %s\n", err.message);
  CHECK(y >= 0);
  out(b, y, "y");
}
static void g_llama_attention(kiln_builder *b, kiln_dtype dt) { llama_attention(b, dt, 0); }
static void g_llama_attention_mask(kiln_builder *b, kiln_dtype dt) { llama_attention(b, dt, 1); }

static void g_gqa(kiln_builder *b, kiln_dtype dt) { gqa(b, dt, 0); }
static void g_gqa_peek(kiln_builder *b, kiln_dtype dt) { gqa(b, dt, 1); }
static void g_gqa_tiled(kiln_builder *b, kiln_dtype dt) { gqa(b, dt, 2); }
static void g_gqa_mask(kiln_builder *b, kiln_dtype dt) { gqa(b, dt, 3); }
static void g_gqa_noop(kiln_builder *b, kiln_dtype dt) { gqa(b, dt, 4); }
static void g_gqa_uneven(kiln_builder *b, kiln_dtype dt) { gqa(b, dt, 5); }

/* A gated MLP: down(silu(gate(x)) * up(x)), x [3,16], hidden 12; `variant` 1: the product
 * is up * silu(gate); 2: the up projection has a bias; 3: gate's output is read again;
 * 4: up reads another input; 5: sigmoid in place of silu. */
static void swiglu(kiln_builder *b, kiln_dtype dt, int variant) {
  int32_t x = in(b, "x", dt, 2, D(3, 16)), x2 = variant == 4 ? in(b, "x2", dt, 2, D(3, 16)) : x;
  int32_t wg = constant(b, dt, 2, D(12, 16), 11), wu = constant(b, dt, 2, D(12, 16), 12);
  int32_t wd = constant(b, dt, 2, D(16, 12), 13), bu = constant(b, dt, 1, D(12), 14);
  int32_t gate = op(b, KILN_OP_LINEAR, T(x, wg), 2, 0, 0, NULL, 0);
  int32_t up = variant == 2 ? op(b, KILN_OP_LINEAR, T(x2, wu, bu), 3, 0, 0, NULL, 0)
                            : op(b, KILN_OP_LINEAR, T(x2, wu), 2, 0, 0, NULL, 0);
  int32_t act = unary(b, variant == 5 ? KILN_OP_SIGMOID : KILN_OP_SILU, gate);
  int32_t h = variant == 1 ? binary(b, KILN_OP_MUL, up, act) : binary(b, KILN_OP_MUL, act, up);
  out(b, op(b, KILN_OP_LINEAR, T(h, wd), 2, 0, 0, NULL, 0), "y");
  if (variant == 3) out(b, gate, "gate");
}
static void g_swiglu(kiln_builder *b, kiln_dtype dt) { swiglu(b, dt, 0); }
static void g_swiglu_swapped(kiln_builder *b, kiln_dtype dt) { swiglu(b, dt, 1); }
static void g_swiglu_bias(kiln_builder *b, kiln_dtype dt) { swiglu(b, dt, 2); }
static void g_swiglu_peek(kiln_builder *b, kiln_dtype dt) { swiglu(b, dt, 3); }
static void g_swiglu_two_inputs(kiln_builder *b, kiln_dtype dt) { swiglu(b, dt, 4); }
static void g_swiglu_sigmoid(kiln_builder *b, kiln_dtype dt) { swiglu(b, dt, 5); }

/* SDPA of q [1,2,3,8] over k, v [1,2,5,8] with a constant mask, as a model of static shapes
 * builds its causal mask: the bool tril [1,1,3,5] (case 0), the same as f32 0 / -inf (1) and as
 * f16 0 / -65504 (2, dt f16 only), every key kept by a bool [1,1,1,5] (3), the tril as f32 0 /
 * -FLT_MAX (4); masks that stay: one that also removes key 0 of row 2 (5), an additive 0.5 (6),
 * the tril in head 0 and all kept in head 1 of a [1,2,3,5] (7). */
static int mask_case;
static void g_const_mask(kiln_builder *b, kiln_dtype dt) {
  kiln_error err = {KILN_OK, ""};
  int32_t q = in(b, "q", dt, 4, D(1, 2, 3, 8)), k = in(b, "k", dt, 4, D(1, 2, 5, 8));
  int32_t v = in(b, "v", dt, 4, D(1, 2, 5, 8)), m = -1;
  uint8_t keep[30];
  float add[30];
  uint16_t half[30];
  for (int e = 0; e < 30; e++) {
    int i = e / 5 % 3, j = e % 5;
    keep[e] = mask_case == 3 || (mask_case == 7 && e >= 15) || j <= i;
    if (mask_case == 5 && i == 2 && j == 0) keep[e] = 0;
    add[e] = keep[e] ? (mask_case == 6 && j == 1 ? 0.5f : 0.0f)
                     : mask_case == 4 ? -3.40282347e38f : -INFINITY;
    half[e] = keep[e] ? 0x0000u : 0xfbffu;
  }
  if (mask_case == 1 || mask_case == 4 || mask_case == 6)
    m = kiln_builder_add_constant(b, KILN_F32, 4, D(1, 1, 3, 5), add, 15 * sizeof(float), &err);
  else if (mask_case == 2)
    m = kiln_builder_add_constant(b, KILN_F16, 4, D(1, 1, 3, 5), half, 15 * 2, &err);
  else if (mask_case == 3)
    m = kiln_builder_add_constant(b, KILN_BOOL, 4, D(1, 1, 1, 5), keep, 5, &err);
  else if (mask_case == 7)
    m = kiln_builder_add_constant(b, KILN_BOOL, 4, D(1, 2, 3, 5), keep, 30, &err);
  else
    m = kiln_builder_add_constant(b, KILN_BOOL, 4, D(1, 1, 3, 5), keep, 15, &err);
  int32_t a = kiln_builder_add_op(b, KILN_OP_SDPA, T(q, k, v, m), 4, D(0, 1), 2, NULL, 0, &err);
  if (a < 0) fprintf(stderr, "g_const_mask: %s\n", err.message);
  CHECK(m >= 0 && a >= 0);
  out(b, a, "y");
}

/* A padding mask as transformers builds it for an encoder: am i64 [2,5] cast to bool, gathered
 * as am[arange(2)[:,None,None,None], arange(5)] into [2,1,1,5], ANDed with a constant all-true
 * [1,1,3,1] into [2,1,3,5], the mask of SDPA over q [2,2,3,8], k, v [2,2,5,8]. `ident_case` 1:
 * the key indices reversed (a real gather); 2: one false in the constant (a real AND); 3: OR
 * with an all-false constant (nothing either). */
static int ident_case;
static void g_padding_mask(kiln_builder *b, kiln_dtype dt) {
  kiln_error err = {KILN_OK, ""};
  int32_t q = in(b, "q", dt, 4, D(2, 2, 3, 8)), k = in(b, "k", dt, 4, D(2, 2, 5, 8));
  int32_t v = in(b, "v", dt, 4, D(2, 2, 5, 8)), am = in(b, "am", KILN_I64, 2, D(2, 5));
  int64_t rows[2] = {0, 1}, keys[5];
  uint8_t fill[3];
  for (int j = 0; j < 5; j++) keys[j] = ident_case == 1 ? 4 - j : j;
  for (int i = 0; i < 3; i++) fill[i] = ident_case == 3 ? 0 : !(ident_case == 2 && i == 1);
  int32_t r = kiln_builder_add_constant(b, KILN_I64, 4, D(2, 1, 1, 1), rows, sizeof rows, &err);
  int32_t c = kiln_builder_add_constant(b, KILN_I64, 4, D(1, 1, 1, 5), keys, sizeof keys, &err);
  int32_t f = kiln_builder_add_constant(b, KILN_BOOL, 4, D(1, 1, 3, 1), fill, sizeof fill, &err);
  int32_t keep = op(b, KILN_OP_CAST, T(am), 1, KILN_BOOL, 1, NULL, 0);
  int32_t pad = op(b, KILN_OP_INDEX, T(keep, r, c), 3, 3, 1, NULL, 0);
  int32_t m = op(b, KILN_OP_BITWISE, T(f, pad), 2, ident_case == 3 ? KILN_BOOL_OR : KILN_BOOL_AND,
                 1, NULL, 0);
  int32_t a = kiln_builder_add_op(b, KILN_OP_SDPA, T(q, k, v, m), 4, D(0, 1), 2, NULL, 0, &err);
  if (a < 0) fprintf(stderr, "g_padding_mask: %s\n", err.message);
  CHECK(r >= 0 && c >= 0 && f >= 0 && a >= 0);
  out(b, a, "y");
}

/* x through one ADD, SUB or MUL with a constant, then cast to f32 (an f32 x negated), so the
 * result is no output itself; by int_case: folded, 0 zeros + x, 1 x + 3 * zeros, 2 x - zeros,
 * 3 ones * x, 4 x + zeros [2, 3, 4] (x expanded); kept, 5 zeros + 2 * x, 6 zeros - x,
 * 7 x + [0, 0, 0, 1], 8 x + 0 in f32 (-0 + 0 is +0). */
static int int_case;

static void g_int_identities(kiln_builder *b, kiln_dtype dt) {
  (void)dt;
  kiln_error err = {KILN_OK, ""};
  kiln_dtype xt = int_case == 8 ? KILN_F32 : KILN_I64;
  int32_t x = in(b, "x", xt, 2, D(3, 4));
  int64_t zeros[24] = {0}, ones[4] = {1, 1, 1, 1}, last[4] = {0, 0, 0, 1};
  float fzeros[4] = {0};
  int32_t c;
  if (int_case == 8)
    c = kiln_builder_add_constant(b, KILN_F32, 1, D(4), fzeros, sizeof fzeros, &err);
  else if (int_case == 4)
    c = kiln_builder_add_constant(b, KILN_I64, 3, D(2, 3, 4), zeros, sizeof zeros, &err);
  else
    c = kiln_builder_add_constant(b, KILN_I64, 1, D(4),
                                  int_case == 3 ? ones : int_case == 7 ? last : zeros,
                                  4 * sizeof(int64_t), &err);
  CHECK(c >= 0);
  int32_t y;
  switch (int_case) {
  case 0: y = op(b, KILN_OP_ADD, T(c, x), 2, 0, 0, (const double[]){1.0}, 1); break;
  case 1: y = op(b, KILN_OP_ADD, T(x, c), 2, 0, 0, (const double[]){3.0}, 1); break;
  case 2: y = op(b, KILN_OP_SUB, T(x, c), 2, 0, 0, (const double[]){1.0}, 1); break;
  case 3: y = binary(b, KILN_OP_MUL, c, x); break;
  case 5: y = op(b, KILN_OP_ADD, T(c, x), 2, 0, 0, (const double[]){2.0}, 1); break;
  case 6: y = op(b, KILN_OP_SUB, T(c, x), 2, 0, 0, (const double[]){1.0}, 1); break;
  default: y = op(b, KILN_OP_ADD, T(x, c), 2, 0, 0, (const double[]){1.0}, 1); break;
  }
  out(b, int_case == 8 ? unary(b, KILN_OP_NEG, y) : op(b, KILN_OP_CAST, T(y), 1, KILN_F32, 1, NULL, 0),
      "y");
}

/* ---------------------------------------------------------------- building and running */

typedef struct built {
  void *blob;
  size_t size;
  kiln_blob_view view;
  kiln_plan plan;
} built;

static int build(graph_fn make, kiln_dtype dt, int fuse, built *x) {
  kiln_builder *b = kiln_builder_create();
  kiln_build_options opts;
  kiln_error err = {KILN_OK, ""};
  int ok;
  memset(x, 0, sizeof *x);
  CHECK(b != NULL);
  if (!b) return 0;
  make(b, dt);
  kiln_build_options_default(&opts);
  opts.fuse = fuse;
  ok = kiln_builder_build(b, &opts, &x->blob, &x->size, &err) == KILN_OK &&
       kiln_blob_parse(x->blob, x->size, &x->view, &err) == KILN_OK &&
       kiln_plan_parse(x->view.plan, x->view.plan_size, x->view.weights_size, &x->plan, &err) ==
           KILN_OK;
  if (!ok) fprintf(stderr, "build: %s\n", err.message);
  CHECK(ok);
  kiln_builder_destroy(b);
  return ok;
}

static void release(built *x) {
  kiln_plan_release(&x->plan);
  kiln_free(x->blob);
  memset(x, 0, sizeof *x);
}

static const kiln_op *plan_op(const built *x, uint32_t i) { return &x->plan.ops[i]; }

/* Input values: multiples of 1/64 in [lo, hi), exact in f16 and bf16 alike. */
static double input_value(uint32_t binding, int64_t i, double lo, double hi) {
  uint32_t state = binding * 7919u + (uint32_t)i * 104729u + 17u;
  double r = (next_random(&state) + 1.0) / 2.0;
  return floor((lo + r * (hi - lo)) * 64.0) / 64.0;
}

/* Runs a blob on the CPU engine, a dynamic plan's symbol at `seq` (0: inputs at their bounds);
 * outs[k] receives output k (malloc'd, at its bound shape). Returns the count. */
static uint32_t run_cpu_at(const built *x, double lo, double hi, void **outs, int64_t seq) {
  kiln_engine_options opts;
  kiln_engine *e = NULL;
  kiln_error err = {KILN_OK, ""};
  kiln_tensor_view iv[MAX_INS], ov[MAX_OUTS];
  void *ins[MAX_INS] = {0};
  uint32_t n_in = 0, n_out = 0;
  kiln_engine_options_default(&opts);
  opts.device = KILN_DEVICE_CPU;
  if (kiln_engine_load(x->blob, x->size, &opts, &e, &err) != KILN_OK) {
    fprintf(stderr, "load: %s\n", err.message);
    CHECK(0);
    return 0;
  }
  const kiln_metadata *md = kiln_engine_metadata(e);
  CHECK(md->n_bindings <= MAX_INS);
  for (uint32_t i = 0; i < md->n_bindings && i < MAX_INS; i++) {
    const kiln_binding *bd = &md->bindings[i];
    kiln_tensor_view *v = bd->kind == KILN_IO_INPUT ? &iv[n_in] : &ov[n_out];
    int64_t n = 1, stride = 1;
    for (int32_t d = 0; d < bd->rank; d++) n *= bd->shape[d];
    memset(v, 0, sizeof *v);
    v->dtype = bd->dtype;
    v->rank = bd->rank;
    v->nbytes = (size_t)n * kiln_dtype_size(bd->dtype);
    for (int32_t d = bd->rank - 1; d >= 0; d--) {
      const kiln_sym_size *sym =
          bd->kind == KILN_IO_INPUT ? &x->plan.tensors[x->plan.inputs[n_in]].sym[d] : NULL;
      v->sizes[d] = seq > 0 && sym && sym->symbol ? sym->coeff * seq + sym->offset : bd->shape[d];
      v->strides[d] = stride;
      stride *= v->sizes[d];
    }
    if (bd->kind == KILN_IO_INPUT) v->nbytes = (size_t)(n = stride) * kiln_dtype_size(bd->dtype);
    v->data = calloc(1, v->nbytes ? v->nbytes : 1);
    if (bd->kind == KILN_IO_OUTPUT) {
      outs[n_out++] = v->data;
      continue;
    }
    for (int64_t k = 0; k < n; k++) {
      double value = input_value(n_in, k, lo, hi);
      if (bd->dtype == KILN_I32) ((int32_t *)v->data)[k] = (int32_t)(value * 8.0);
      else if (bd->dtype == KILN_BOOL) ((uint8_t *)v->data)[k] = value > lo + (hi - lo) / 4;
      else fill_value(v->data, bd->dtype, k, value);
    }
    ins[n_in++] = v->data;
  }
  if (kiln_engine_execute(e, iv, n_in, ov, n_out, &err) != KILN_OK) {
    fprintf(stderr, "execute: %s\n", err.message);
    CHECK(0);
  }
  for (uint32_t i = 0; i < n_in; i++) free(ins[i]);
  kiln_engine_destroy(e);
  return n_out;
}

static uint32_t run_cpu(const built *x, double lo, double hi, void **outs) {
  return run_cpu_at(x, lo, hi, outs, 0);
}

static void free_outs(void **outs, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) free(outs[i]);
}

/* The fused and the unfused plan of one graph give the same bytes on the CPU engine. */
static void check_same_as_unfused(graph_fn make, kiln_dtype dt, double lo, double hi) {
  built fused, plain;
  void *a[MAX_OUTS], *b[MAX_OUTS];
  memset(&plain, 0, sizeof plain);
  if (build(make, dt, 1, &fused) && build(make, dt, 0, &plain)) {
    uint32_t n = run_cpu(&fused, lo, hi, a), m = run_cpu(&plain, lo, hi, b);
    CHECK(n == m && n == plain.plan.n_outputs);
    for (uint32_t k = 0; k < n && k < m; k++) {
      const kiln_tensor_desc *t = &plain.plan.tensors[plain.plan.outputs[k]];
      int same = memcmp(a[k], b[k], (size_t)t->nbytes) == 0;
      if (!same) fprintf(stderr, "output %u of the fused plan differs\n", (unsigned)k);
      CHECK(same);
    }
    free_outs(a, n);
    free_outs(b, m);
    for (uint32_t i = 0; i < plain.plan.n_ops; i++)
      CHECK(plan_op(&plain, i)->kind != KILN_OP_POINTWISE);
  }
  release(&fused);
  release(&plain);
}

/* ---------------------------------------------------------------- what fuses */

static void test_chain_fuses(void) {
  built x;
  char text[32];
  if (build(g_mul_add_gelu, KILN_F32, 1, &x)) {
    const kiln_op *p = plan_op(&x, 0);
    CHECK(x.plan.n_ops == 1 && p->kind == KILN_OP_POINTWISE);
    CHECK(p->n_inputs == 3 && p->inputs[0] == 0 && p->inputs[1] == 1 && p->inputs[2] == 2);
    CHECK(p->n_iattr == 3);
    CHECK(p->iattr[0] == KILN_PW_STEP(KILN_OP_MUL, 1, 0));
    CHECK(p->iattr[1] == KILN_PW_STEP(KILN_OP_ADD, 2, 0));
    CHECK(p->iattr[2] == KILN_PW_STEP(KILN_OP_GELU, 0, KILN_PW_GELU_TANH));
    CHECK(p->fattr[0] == 0.0 && p->fattr[1] == 0.0);
    CHECK(p->output == x.plan.outputs[0]);
    CHECK_STR(kiln_pointwise_step_str(p->iattr[0], 0.0, text, sizeof text), "mul(in1)");
    CHECK_STR(kiln_pointwise_step_str(p->iattr[2], 0.0, text, sizeof text), "gelu_tanh");
    CHECK_STR(kiln_op_name(KILN_OP_POINTWISE), "pointwise");
  }
  release(&x);
  check_same_as_unfused(g_mul_add_gelu, KILN_F32, -2.0, 2.0);

  if (build(g_reversed, KILN_F32, 1, &x)) {
    const kiln_op *p = plan_op(&x, 0);
    CHECK(x.plan.n_ops == 1 && p->kind == KILN_OP_POINTWISE && p->n_iattr == 3);
    CHECK(p->inputs[0] == 0 && p->inputs[1] == 1 && p->inputs[2] == 2);
    CHECK(p->iattr[0] == KILN_PW_STEP(KILN_OP_SUB, 1, KILN_PW_REVERSED));
    CHECK(p->iattr[1] == KILN_PW_STEP(KILN_OP_DIV, 2, KILN_PW_REVERSED));
    CHECK(p->iattr[2] == KILN_PW_STEP(KILN_OP_EXP, 0, 0));
    CHECK_STR(kiln_pointwise_step_str(p->iattr[0], 0.0, text, sizeof text), "rsub(in1)");
    CHECK_STR(kiln_pointwise_step_str(p->iattr[1], 0.0, text, sizeof text), "rdiv(in2)");
  }
  release(&x);
  check_same_as_unfused(g_reversed, KILN_F32, -2.0, 2.0);

  if (build(g_all_steps, KILN_F32, 1, &x)) {
    const kiln_op *p = plan_op(&x, 0);
    CHECK(x.plan.n_ops == 1 && p->kind == KILN_OP_POINTWISE && p->n_iattr == 7);
    /* y feeds two steps through one input slot; x is both the chain's start and an operand */
    CHECK(p->n_inputs == 3 && p->inputs[1] == 1 && p->inputs[2] == 0);
    CHECK(p->iattr[4] == KILN_PW_STEP(KILN_OP_GELU, 0, 0));
    CHECK(p->iattr[5] == KILN_PW_STEP(KILN_OP_MUL, 2, 0));
    CHECK_STR(kiln_pointwise_step_str(p->iattr[4], 0.0, text, sizeof text), "gelu_erf");
  }
  release(&x);
  check_same_as_unfused(g_all_steps, KILN_F32, 0.25, 2.0);

  if (build(g_new_steps, KILN_F32, 1, &x)) {
    const kiln_op *p = plan_op(&x, 0), *q = plan_op(&x, 1);
    CHECK(x.plan.n_ops == 2 && p->kind == KILN_OP_POINTWISE && q->kind == KILN_OP_POINTWISE);
    CHECK(p->n_inputs == 3 && p->n_iattr == 7);
    CHECK(p->iattr[0] == KILN_PW_STEP(KILN_OP_MAXIMUM, 1, 0));
    CHECK(p->iattr[1] == KILN_PW_STEP(KILN_OP_MINIMUM, 2, 0));
    CHECK(p->iattr[6] == KILN_PW_STEP(KILN_OP_LOG, 0, 0));
    CHECK(q->n_inputs == 2 && q->n_iattr == 3);
    CHECK(q->iattr[1] == KILN_PW_STEP(KILN_OP_MAXIMUM, 1, KILN_PW_REVERSED));
    CHECK_STR(kiln_pointwise_step_str(q->iattr[1], 0.0, text, sizeof text), "rmaximum(in1)");
  }
  release(&x);
  check_same_as_unfused(g_new_steps, KILN_F32, -2.0, 2.0);
}

static void test_chain_boundaries(void) {
  built x;
  char text[32];
  if (build(g_multi_use, KILN_F32, 1, &x)) {
    CHECK(x.plan.n_ops == 2 && plan_op(&x, 0)->kind == KILN_OP_RELU);
    CHECK(plan_op(&x, 1)->kind == KILN_OP_POINTWISE && plan_op(&x, 1)->n_iattr == 2);
    CHECK(plan_op(&x, 1)->inputs[0] == plan_op(&x, 0)->output);
  }
  release(&x);
  check_same_as_unfused(g_multi_use, KILN_F32, -2.0, 2.0);

  if (build(g_enlarging, KILN_F32, 1, &x)) {
    /* a group broadcasts its operands: each output is one FUSED op */
    CHECK(x.plan.n_ops == 2);
    CHECK(plan_op(&x, 0)->kind == KILN_OP_FUSED && plan_op(&x, 0)->n_inputs == 2);
    CHECK(plan_op(&x, 1)->kind == KILN_OP_FUSED && plan_op(&x, 1)->n_inputs == 2);
  }
  release(&x);
  check_same_as_unfused(g_enlarging, KILN_F32, -2.0, 2.0);

  if (build(g_integer, KILN_F32, 1, &x)) {
    CHECK(x.plan.n_ops == 3 && plan_op(&x, 0)->kind == KILN_OP_MUL);
    CHECK(plan_op(&x, 1)->kind == KILN_OP_ADD && plan_op(&x, 2)->kind == KILN_OP_SUB);
  }
  release(&x);

  if (build(g_long, KILN_F32, 1, &x)) {
    /* the two chains it splits into are one group */
    CHECK(x.plan.n_ops == 1 && plan_op(&x, 0)->kind == KILN_OP_FUSED);
  }
  release(&x);
  check_same_as_unfused(g_long, KILN_F32, -2.0, 2.0);

  if (build(g_two_pows, KILN_F32, 1, &x)) {
    CHECK(x.plan.n_ops == 1 && plan_op(&x, 0)->kind == KILN_OP_FUSED);
    CHECK_STR(kiln_pointwise_step_str(KILN_PW_STEP(KILN_OP_POW, 0, 0), 0.5, text, sizeof text),
              "pow(0.5)");
  }
  release(&x);
  check_same_as_unfused(g_two_pows, KILN_F32, 0.25, 2.0);

  if (build(g_many_operands, KILN_F32, 1, &x)) {
    const kiln_op *p = plan_op(&x, 0);
    CHECK(x.plan.n_ops == 2 && p->kind == KILN_OP_POINTWISE);
    CHECK(p->n_inputs == 8 && p->n_iattr == 7);
    CHECK(p->iattr[1] == KILN_PW_STEP(KILN_OP_MUL, 2, 0)); /* mul is exact in either order */
    CHECK(plan_op(&x, 1)->kind == KILN_OP_MUL);
  }
  release(&x);
  check_same_as_unfused(g_many_operands, KILN_F32, -2.0, 2.0);

  if (build(g_shared_reader, KILN_F32, 1, &x)) {
    /* exp(y), read only inside the group, joins it */
    CHECK(x.plan.n_ops == 1 && plan_op(&x, 0)->kind == KILN_OP_FUSED);
    CHECK(plan_op(&x, 0)->n_inputs == 2);
  }
  release(&x);
  check_same_as_unfused(g_shared_reader, KILN_F32, -2.0, 2.0);

  if (build(g_alpha, KILN_F32, 1, &x)) {
    /* a chain keeps only alpha 1; a group's ADD carries its alpha */
    CHECK(x.plan.n_ops == 1 && plan_op(&x, 0)->kind == KILN_OP_FUSED);
  }
  release(&x);
  check_same_as_unfused(g_alpha, KILN_F32, -2.0, 2.0);

  if (build(g_linear, KILN_F32, 1, &x)) {
    CHECK(x.plan.n_ops == 4);
    CHECK(plan_op(&x, 0)->kind == KILN_OP_LINEAR && plan_op(&x, 0)->iattr[0] == KILN_ACT_RELU);
    CHECK(plan_op(&x, 1)->kind == KILN_OP_MUL);
    CHECK(plan_op(&x, 2)->kind == KILN_OP_LINEAR &&
          plan_op(&x, 2)->iattr[0] == KILN_ACT_GELU_ERF);
    CHECK(plan_op(&x, 3)->kind == KILN_OP_POINTWISE && plan_op(&x, 3)->n_iattr == 2);
  }
  release(&x);
  check_same_as_unfused(g_linear, KILN_F32, -2.0, 2.0);
}

/* In f16 the unfused plan rounds every intermediate to f16 and the fused one only the result:
 * the fused result is exactly the f32 chain's result rounded once, and within 4 f16 ulps
 * (4 * 2^-10 relative to max(1, |value|)) of the unfused one. */
static void test_f16(void) {
  built fused, plain, wide;
  void *a[MAX_OUTS], *b[MAX_OUTS], *c[MAX_OUTS];
  memset(&plain, 0, sizeof plain);
  memset(&wide, 0, sizeof wide);
  if (build(g_mul_add_gelu, KILN_F16, 1, &fused) && build(g_mul_add_gelu, KILN_F16, 0, &plain) &&
      build(g_mul_add_gelu, KILN_F32, 1, &wide)) {
    CHECK(fused.plan.n_ops == 1 && plain.plan.n_ops == 3);
    uint32_t n = run_cpu(&fused, -2.0, 2.0, a), m = run_cpu(&plain, -2.0, 2.0, b);
    uint32_t w = run_cpu(&wide, -2.0, 2.0, c);
    CHECK(n == 1 && m == 1 && w == 1);
    if (n == 1 && m == 1 && w == 1) {
      int exact = 1, close = 1, differ = 0;
      for (int64_t i = 0; i < 24; i++) {
        uint16_t got = ((const uint16_t *)a[0])[i], ref = ((const uint16_t *)b[0])[i];
        double g = kiln_f16_to_f32(got), r = kiln_f16_to_f32(ref);
        exact &= got == kiln_f32_to_f16(((const float *)c[0])[i]);
        close &= fabs(g - r) <= 4.0 / 1024.0 * fmax(1.0, fabs(r));
        differ |= got != ref;
      }
      CHECK(exact);
      CHECK(close);
      CHECK(differ); /* the inputs do reach a case where rounding once matters */
    }
    free_outs(a, n);
    free_outs(b, m);
    free_outs(c, w);
  }
  release(&fused);
  release(&plain);
  release(&wide);
}

/* fuse = 0 leaves every op alone; an out-of-memory during the pass is a clean refusal. */
static void test_fuse_off_and_oom(void) {
  built x;
  int saw_pass = 0, n;
  if (build(g_long, KILN_F32, 0, &x)) CHECK(x.plan.n_ops == 10);
  release(&x);
  for (n = 1; n < 500; n++) {
    kiln_builder *b = kiln_builder_create();
    kiln_error err = {KILN_OK, ""};
    void *blob = NULL;
    size_t size = 0;
    kiln_status s;
    if (!b) break;
    g_mul_add_gelu(b, KILN_F32);
    kiln_test_fail_allocations = n;
    s = kiln_builder_build(b, NULL, &blob, &size, &err);
    kiln_builder_destroy(b);
    kiln_free(blob);
    if (kiln_test_fail_allocations > 0) { /* the n-th allocation never came */
      CHECK(s == KILN_OK);
      break;
    }
    if (s == KILN_OK) continue;
    CHECK(s == KILN_ERR_OUT_OF_MEMORY);
    if (strstr(err.message, "while fusing pointwise chains")) {
      CHECK_STR(err.message, "builder: out of memory for 6 tensors while fusing pointwise "
                             "chains; free memory and retry");
      saw_pass = 1;
    }
  }
  kiln_test_fail_allocations = 0;
  CHECK(n < 500);
  CHECK(saw_pass);
}

/* ---------------------------------------------------------------- malformed plans */

/* x[2,3,4], y[4], z[2,3,4] and unused inputs u[5], v[3,2,3,4], h (f16 [4]), fused into
 * x * y + z, gelu_tanh. */
static void g_refusal_base(kiln_builder *b, kiln_dtype dt) {
  in(b, "u", dt, 1, D(5));
  in(b, "v", dt, 4, D(3, 2, 3, 4));
  in(b, "h", KILN_F16, 1, D(4));
  g_mul_add_gelu(b, dt);
}

/* Rewrites op 0 (of kind `kind`) of make's fused plan with edit, re-serializes the plan and
 * checks the parser's status and exact message. */
static void expect_refused_in(graph_fn make, kiln_op_kind kind, void (*edit)(kiln_op *op),
                              const char *msg) {
  built x;
  void *bytes = NULL;
  size_t size = 0;
  kiln_error err = {KILN_OK, ""};
  if (!build(make, KILN_F32, 1, &x)) return;
  CHECK(x.plan.n_ops == 1 && x.plan.ops[0].kind == kind);
  edit(&x.plan.ops[0]);
  if (kiln_plan_serialize(&x.plan, &bytes, &size, &err) == KILN_OK) {
    kiln_plan back;
    kiln_status s = kiln_plan_parse(bytes, size, x.view.weights_size, &back, &err);
    CHECK(s == KILN_ERR_INVALID_PROGRAM);
    CHECK_STR(err.message, msg);
    if (s == KILN_OK) kiln_plan_release(&back);
  }
  free(bytes);
  release(&x);
}

static void expect_refused(void (*edit)(kiln_op *op), const char *msg) {
  expect_refused_in(g_refusal_base, KILN_OP_POINTWISE, edit, msg);
}

static void edit_nothing(kiln_op *op) { (void)op; }
static void edit_softmax_step(kiln_op *op) { op->iattr[2] = KILN_PW_STEP(KILN_OP_SOFTMAX, 0, 0); }
static void edit_tanh_flag_on_mul(kiln_op *op) { op->iattr[0] |= KILN_PW_GELU_TANH; }
static void edit_reversed_relu(kiln_op *op) {
  op->iattr[2] = KILN_PW_STEP(KILN_OP_RELU, 0, KILN_PW_REVERSED);
}
static void edit_unknown_bit(kiln_op *op) { op->iattr[1] |= (int64_t)1 << 40; }
static void edit_input_past_end(kiln_op *op) { op->iattr[1] = KILN_PW_STEP(KILN_OP_ADD, 5, 0); }
static void edit_binary_reads_x(kiln_op *op) { op->iattr[0] = KILN_PW_STEP(KILN_OP_MUL, 0, 0); }
static void edit_unary_with_input(kiln_op *op) {
  op->iattr[2] = KILN_PW_STEP(KILN_OP_EXP, 1, 0);
}
static void edit_two_pows(kiln_op *op) {
  op->iattr[2] = KILN_PW_STEP(KILN_OP_POW, 0, 0);
  op->iattr[3] = KILN_PW_STEP(KILN_OP_POW, 0, 0);
  op->n_iattr = 4;
  op->fattr[0] = 2.0;
}
static void edit_unused_input(kiln_op *op) { op->iattr[1] = KILN_PW_STEP(KILN_OP_ADD, 1, 0); }
static void edit_fattr_without_pow(kiln_op *op) { op->fattr[0] = 3.0; }
static void edit_fattr1(kiln_op *op) {
  op->iattr[2] = KILN_PW_STEP(KILN_OP_POW, 0, 0);
  op->fattr[0] = 2.0;
  op->fattr[1] = 1.0;
}
static void edit_no_steps(kiln_op *op) {
  memset(op->iattr, 0, sizeof op->iattr);
  op->n_iattr = 0;
}
static void edit_operand_u(kiln_op *op) { op->inputs[1] = 0; }   /* u[5] */
static void edit_operand_v(kiln_op *op) { op->inputs[2] = 1; }   /* v[3,2,3,4] */
static void edit_operand_f16(kiln_op *op) { op->inputs[1] = 2; } /* h, f16 */

static void test_plan_refusals(void) {
  built x;
  /* The base plan parses, so each refusal below is the edit's doing. */
  if (build(g_refusal_base, KILN_F32, 1, &x)) {
    const kiln_op *p = plan_op(&x, 0);
    CHECK(p->inputs[0] == 3 && p->inputs[1] == 4 && p->inputs[2] == 5);
  }
  release(&x);
  {
    built y;
    void *bytes = NULL;
    size_t size = 0;
    kiln_error err = {KILN_OK, ""};
    kiln_plan back;
    if (build(g_refusal_base, KILN_F32, 1, &y)) {
      edit_nothing(&y.plan.ops[0]);
      CHECK(kiln_plan_serialize(&y.plan, &bytes, &size, &err) == KILN_OK);
      CHECK(kiln_plan_parse(bytes, size, y.view.weights_size, &back, &err) == KILN_OK);
      kiln_plan_release(&back);
    }
    free(bytes);
    release(&y);
  }
  expect_refused(edit_softmax_step,
                 "plan op 0 (pointwise): step 2 is 17, not a float unary, add, sub, mul or div "
                 "step with its own flags; re-export the program");
  expect_refused(edit_tanh_flag_on_mul,
                 "plan op 0 (pointwise): step 0 is 131332, not a float unary, add, sub, mul or "
                 "div step with its own flags; re-export the program");
  expect_refused(edit_reversed_relu,
                 "plan op 0 (pointwise): step 2 is 65542, not a float unary, add, sub, mul or "
                 "div step with its own flags; re-export the program");
  expect_refused(edit_unknown_bit,
                 "plan op 0 (pointwise): step 1 is 1099511628290, not a float unary, add, sub, "
                 "mul or div step with its own flags; re-export the program");
  expect_refused(edit_input_past_end,
                 "plan op 0 (pointwise): step 1 reads input 5 but binary steps read inputs 1..2 "
                 "and unary steps 0; re-export the program");
  expect_refused(edit_binary_reads_x,
                 "plan op 0 (pointwise): step 0 reads input 0 but binary steps read inputs 1..2 "
                 "and unary steps 0; re-export the program");
  expect_refused(edit_unary_with_input,
                 "plan op 0 (pointwise): step 2 reads input 1 but binary steps read inputs 1..2 "
                 "and unary steps 0; re-export the program");
  expect_refused(edit_two_pows,
                 "plan op 0 (pointwise): step 3 is a second pow but the op holds one exponent; "
                 "re-export the program");
  expect_refused(edit_unused_input,
                 "plan op 0 (pointwise): input 2 is read by no step; re-export the program");
  expect_refused(edit_fattr_without_pow,
                 "plan op 0 (pointwise): fattr 3, 0: the pow exponent is set without a pow step, "
                 "or a pointwise op's fattr1 is not 0; re-export the program");
  expect_refused(edit_fattr1,
                 "plan op 0 (pointwise): fattr 2, 1: the pow exponent is set without a pow step, "
                 "or a pointwise op's fattr1 is not 0; re-export the program");
  expect_refused(edit_no_steps,
                 "plan op 0 (pointwise): takes 1 to 8 integer attributes but has 0; re-export "
                 "the program");
  expect_refused(edit_operand_u,
                 "plan op 0 (pointwise): input 1 [5] does not broadcast to input 0 [2,3,4] "
                 "without enlarging it; re-export the program");
  expect_refused(edit_operand_v,
                 "plan op 0 (pointwise): input 2 [3,2,3,4] does not broadcast to input 0 "
                 "[2,3,4] without enlarging it; re-export the program");
  expect_refused(edit_operand_f16,
                 "plan op 0 (pointwise): input 1 is f16 but input 0 is f32; cast them to one "
                 "dtype first; re-export the program");
}

/* ---------------------------------------------------------------- the CPU engine's own check */

/* Hand-made plans that skip the parser: the CPU engine's init still refuses a bad op. */
static void test_cpu_init_refusals(void) {
  static const char attrs[] = "plan op 0 (pointwise): attributes %lld, %lld, %lld, %lld do not "
                              "fit its %u inputs of rank 2; re-export the program";
  for (int mode = 0; mode < 5; mode++) {
    graph *g = g_new();
    kiln_error err = {KILN_OK, ""};
    char want[256];
    uint32_t x = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, D(3, 4));
    uint32_t y = g_tensor(g, KILN_STORE_INPUT, mode == 4 ? KILN_F16 : KILN_F32, 1,
                          D(mode == 3 ? 3 : 4));
    uint32_t o = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, D(3, 4));
    int64_t steps[2] = {KILN_PW_STEP(KILN_OP_MUL, 1, 0), KILN_PW_STEP(KILN_OP_TANH, 0, 0)};
    if (mode == 1) steps[1] = KILN_PW_STEP(KILN_OP_CAST, 0, 0);
    if (mode == 2) steps[0] = KILN_PW_STEP(KILN_OP_MUL, 9, 0);
    kiln_op *p = g_op(g, KILN_OP_POINTWISE, 2, (const uint32_t[]){x, y}, o, 2, steps, 0.0);
    kiln_engine *e = g_engine(g);
    kiln_status s = kiln_cpu_backend.init(e, &err);
    snprintf(want, sizeof want, attrs, (long long)p->iattr[0], (long long)p->iattr[1], 0LL, 0LL,
             2u);
    if (mode == 0) {
      CHECK(s == KILN_OK);
    } else if (mode == 4) {
      CHECK(s == KILN_ERR_INVALID_PROGRAM);
      CHECK_STR(err.message, "plan op 0 (pointwise): input 1 has dtype f16, which this op does "
                             "not take with output dtype f32; re-export the program");
    } else {
      CHECK(s == KILN_ERR_INVALID_PROGRAM);
      CHECK_STR(err.message, want);
    }
    if (s == KILN_OK && mode == 0) {
      float xs[12], ys[4], os[12];
      void *ins[2] = {xs, ys}, *outs[1] = {os};
      for (int i = 0; i < 12; i++) xs[i] = (float)i / 8.0f - 0.5f;
      for (int i = 0; i < 4; i++) ys[i] = (float)(i + 1);
      CHECK(g_execute(e, g, ins, outs, &err) == KILN_OK);
      for (int i = 0; i < 12; i++) CHECK(os[i] == tanhf(xs[i] * ys[i % 4]));
    }
    if (s == KILN_OK) kiln_cpu_backend.destroy(e);
    free(e);
    free(g);
  }
}


/* ---------------------------------------------------------------- norm fusion */

static const kiln_op *find_op(const built *x, kiln_op_kind kind, uint32_t nth) {
  for (uint32_t i = 0; i < x->plan.n_ops; i++)
    if (x->plan.ops[i].kind == kind && nth-- == 0) return &x->plan.ops[i];
  return NULL;
}

static void test_norm_fuses(void) {
  built x;
  if (build(g_norm_both, KILN_F32, 1, &x)) {
    const kiln_op *p = plan_op(&x, 0);
    CHECK(x.plan.n_ops == 1 && p->kind == KILN_OP_LAYER_NORM);
    /* x, w, b, then the operands r and s */
    CHECK(p->n_inputs == 5 && p->inputs[0] == 0 && p->inputs[1] == 2 && p->inputs[2] == 3);
    CHECK(p->inputs[3] == 1 && p->inputs[4] == 4);
    CHECK(p->n_iattr == 6 && p->iattr[0] == 1 && p->iattr[1] == 3 && p->iattr[2] == 1);
    CHECK(p->iattr[3] == KILN_PW_STEP(KILN_OP_ADD, 3, 0));
    CHECK(p->iattr[4] == KILN_PW_STEP(KILN_OP_GELU, 0, 0));
    CHECK(p->iattr[5] == KILN_PW_STEP(KILN_OP_MUL, 4, 0));
    CHECK(p->fattr[1] == 0.0 && p->output == x.plan.outputs[0]);
  }
  release(&x);
  check_same_as_unfused(g_norm_both, KILN_F32, -2.0, 2.0);

  if (build(g_norm_rms_pow, KILN_F32, 1, &x)) {
    const kiln_op *p = find_op(&x, KILN_OP_RMS_NORM, 0);
    CHECK(x.plan.n_ops == 2 && plan_op(&x, 0)->kind == KILN_OP_EXP && p == plan_op(&x, 1));
    if (p) {
      CHECK(p->n_inputs == 4 && p->inputs[0] == 0 && p->inputs[1] == 1 && p->inputs[2] == 2);
      CHECK(p->inputs[3] == plan_op(&x, 0)->output);
      CHECK(p->n_iattr == 8 && p->iattr[2] == 2);
      CHECK(p->iattr[3] == KILN_PW_STEP(KILN_OP_SUB, 1, 0));
      CHECK(p->iattr[4] == KILN_PW_STEP(KILN_OP_MUL, 2, 0));
      CHECK(p->iattr[5] == KILN_PW_STEP(KILN_OP_POW, 0, 0));
      CHECK(p->iattr[6] == KILN_PW_STEP(KILN_OP_ADD, 3, 0));
      CHECK(p->iattr[7] == KILN_PW_STEP(KILN_OP_NEG, 0, 0));
      CHECK(p->fattr[0] == 1e-5 && p->fattr[1] == 3.0);
    }
  }
  release(&x);
  check_same_as_unfused(g_norm_rms_pow, KILN_F32, 0.25, 2.0);

  if (build(g_norm_apart, KILN_F32, 1, &x)) {
    const kiln_op *n1 = find_op(&x, KILN_OP_RMS_NORM, 0), *n2 = find_op(&x, KILN_OP_RMS_NORM, 1);
    const kiln_op *n3 = find_op(&x, KILN_OP_RMS_NORM, 2), *n5 = find_op(&x, KILN_OP_RMS_NORM, 3);
    const kiln_op *n4 = find_op(&x, KILN_OP_RMS_NORM, 4);
    CHECK(n1 && n2 && n3 && n4 && n5 && !find_op(&x, KILN_OP_RMS_NORM, 5));
    CHECK(n5 && n5->n_iattr == 2 && find_op(&x, KILN_OP_MUL, 0));
    CHECK(find_op(&x, KILN_OP_ADD, 0) && find_op(&x, KILN_OP_RELU, 0));
    CHECK(find_op(&x, KILN_OP_SUB, 0) && find_op(&x, KILN_OP_POW, 0));
    if (n1 && n2 && n3 && n4) {
      CHECK(n1->n_iattr == 2 && n2->n_iattr == 2);
      /* the pow before the third norm fuses; the pow after it stays */
      CHECK(n3->n_iattr == 4 && n3->iattr[2] == 1 && n3->fattr[1] == 2.0);
      CHECK(find_op(&x, KILN_OP_POW, 0)->fattr[0] == 0.5);
      /* six steps after the fourth: pointwise fusion made one chain of six, too long to join */
      CHECK(n4->n_iattr == 2 && find_op(&x, KILN_OP_POINTWISE, 0));
    }
  }
  release(&x);
  check_same_as_unfused(g_norm_apart, KILN_F32, 0.25, 2.0);
}

/* A fused norm plan edited by hand is refused with the step at fault named. */
static void expect_norm_refused(void (*edit)(kiln_op *op), const char *msg) {
  expect_refused_in(g_norm_both, KILN_OP_LAYER_NORM, edit, msg);
}

static void edit_norm_split(kiln_op *op) { op->iattr[2] = 4; }
static void edit_norm_reads_weight(kiln_op *op) { op->iattr[3] = KILN_PW_STEP(KILN_OP_ADD, 1, 0); }
static void edit_norm_exponent(kiln_op *op) { op->fattr[1] = 2.0; }
static void edit_norm_operand(kiln_op *op) { op->inputs[4] = 2; } /* w[8] for s[3,1]: fits */
static void edit_norm_no_steps(kiln_op *op) {
  op->n_iattr = 3;
  op->iattr[3] = op->iattr[4] = op->iattr[5] = 0;
}
static void edit_plain_norm_exponent(kiln_op *op) {
  op->n_iattr = 2;
  op->iattr[2] = op->iattr[3] = op->iattr[4] = op->iattr[5] = 0;
  op->n_inputs = 3;
  op->inputs[3] = op->inputs[4] = 0;
  op->fattr[1] = 2.0;
}
static void edit_norm_flags(kiln_op *op) { op->iattr[1] = 1; } /* b becomes an operand */

static void test_norm_refusals(void) {
  expect_norm_refused(edit_norm_split,
                      "plan op 0 (layer_norm): 4 steps before the norm but it carries 3 steps "
                      "(at least 1); re-export the program");
  expect_norm_refused(edit_norm_no_steps,
                      "plan op 0 (layer_norm): 1 steps before the norm but it carries 0 steps "
                      "(at least 1); re-export the program");
  expect_norm_refused(edit_norm_reads_weight,
                      "plan op 0 (layer_norm): step 0 reads input 1 but binary steps read inputs "
                      "3..4 and unary steps 0; re-export the program");
  expect_norm_refused(edit_norm_exponent,
                      "plan op 0 (layer_norm): fattr 1e-05, 2: the pow exponent is set without a "
                      "pow step, or a pointwise op's fattr1 is not 0; re-export the program");
  expect_norm_refused(edit_plain_norm_exponent,
                      "plan op 0 (layer_norm): fattr 1e-05, 2: the pow exponent is set without a "
                      "pow step, or a pointwise op's fattr1 is not 0; re-export the program");
  expect_norm_refused(edit_norm_flags,
                      "plan op 0 (layer_norm): input 2 is read by no step; re-export the program");
  {
    /* w[8] as the mul's operand broadcasts: the plan stays valid */
    built x;
    void *bytes = NULL;
    size_t size = 0;
    kiln_error err = {KILN_OK, ""};
    kiln_plan back;
    if (build(g_norm_both, KILN_F32, 1, &x)) {
      edit_norm_operand(&x.plan.ops[0]);
      CHECK(kiln_plan_serialize(&x.plan, &bytes, &size, &err) == KILN_OK);
      CHECK(kiln_plan_parse(bytes, size, x.view.weights_size, &back, &err) == KILN_OK);
      kiln_plan_release(&back);
    }
    free(bytes);
    release(&x);
  }
}


/* ---------------------------------------------------------------- residual epilogues */

static uint32_t count_ops(const built *x, kiln_op_kind kind) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < x->plan.n_ops; i++) n += plan_op(x, i)->kind == kind;
  return n;
}

static void test_common_ops_merge(void) {
  built x;
  if (build(g_common, KILN_F32, 1, &x)) {
    /* one linear; softmaxes: s1, the one over dim 0, and both outputs */
    CHECK(count_ops(&x, KILN_OP_LINEAR) == 1 && count_ops(&x, KILN_OP_SOFTMAX) == 4);
  }
  release(&x);
  if (build(g_common, KILN_F32, 0, &x)) /* the unfused plan is the graph as recorded */
    CHECK(count_ops(&x, KILN_OP_LINEAR) == 3 && count_ops(&x, KILN_OP_SOFTMAX) == 5);
  release(&x);
  check_same_as_unfused(g_common, KILN_F32, -2.0, 2.0);
  if (build(g_common_state, KILN_F32, 1, &x)) CHECK(count_ops(&x, KILN_OP_RESHAPE) == 2);
  release(&x);
  check_same_as_unfused(g_common_state, KILN_F32, -2.0, 2.0);
}

static void test_copies_drop(void) {
  built x;
  if (build(g_copies, KILN_F32, 1, &x)) CHECK(count_ops(&x, KILN_OP_COPY) == 2);
  release(&x);
  if (build(g_copies, KILN_F32, 0, &x)) CHECK(count_ops(&x, KILN_OP_COPY) == 3);
  release(&x);
  check_same_as_unfused(g_copies, KILN_F32, -2.0, 2.0);
}

static void test_residual_fuses(void) {
  built x;
  if (build(g_residual, KILN_F32, 1, &x)) {
    const kiln_op *a = find_op(&x, KILN_OP_LINEAR, 0), *b = find_op(&x, KILN_OP_LINEAR, 1);
    const kiln_op *c = find_op(&x, KILN_OP_LINEAR, 2), *d = find_op(&x, KILN_OP_LINEAR, 3);
    CHECK(a && b && c && d && find_op(&x, KILN_OP_LINEAR, 4) && !find_op(&x, KILN_OP_LINEAR, 5));
    if (a && b && c && d) {
      /* x, w, bias, r with iattr1 1; then x, w, tanh(r) in the add's place, after the tanh */
      CHECK(a->n_inputs == 4 && a->n_iattr == 2 && a->iattr[1] == 1 && a->inputs[3] == 1);
      CHECK(a->output == x.plan.outputs[0]);
      CHECK(b->n_inputs == 3 && b->iattr[1] == 1 && b->inputs[2] == find_op(&x, KILN_OP_TANH, 0)->output);
      CHECK(b > find_op(&x, KILN_OP_TANH, 0) && b->output == x.plan.outputs[1]);
      CHECK(c->iattr[0] == KILN_ACT_RELU && c->n_inputs == 2);
      CHECK(d->n_inputs == 2 && d->output == x.plan.outputs[3]);
    }
    CHECK(find_op(&x, KILN_OP_ADD, 2) && !find_op(&x, KILN_OP_ADD, 3));
  }
  release(&x);
  check_same_as_unfused(g_residual, KILN_F32, -2.0, 2.0);
}


/* ---------------------------------------------------------------- views in the arena */

static void test_views(void) {
  built x;
  void *outs[MAX_OUTS];
  if (!build(g_views, KILN_F32, 0, &x)) return; /* fused, the slice joins exp's group */
  const kiln_op *neg = find_op(&x, KILN_OP_NEG, 0), *sel = find_op(&x, KILN_OP_SELECT, 0);
  const kiln_op *flat = find_op(&x, KILN_OP_RESHAPE, 0), *sl = find_op(&x, KILN_OP_SLICE, 0);
  CHECK(neg && sel && flat && sl);
  if (neg && sel && flat && sl) {
    const kiln_tensor_desc *t = x.plan.tensors;
    uint64_t base = t[neg->output].offset;
    /* select(0, 2) starts 2 * 2 * 4 floats in; the reshape of it starts where it does */
    CHECK(t[sel->output].storage == KILN_STORE_ARENA && t[sel->output].offset == base + 64);
    CHECK(t[flat->output].offset == base + 64);
    /* the slice has a block of its own, clear of neg's 96 bytes */
    CHECK(t[sl->output].offset >= base + 96 || t[sl->output].offset + 48 <= base);
  }
  uint32_t n = run_cpu(&x, -2.0, 2.0, outs);
  CHECK(n == 2);
  for (int64_t j = 0; n == 2 && j < 8; j++) {
    float v = (float)input_value(0, 16 + j, -2.0, 2.0);
    CHECK(((float *)outs[0])[j] == (-v > 0.0f ? -v : 0.0f));
  }
  for (int64_t i = 0; n == 2 && i < 3; i++)
    for (int64_t j = 0; j < 4; j++)
      CHECK(((float *)outs[1])[i * 4 + j] == expf(-(float)input_value(0, i * 8 + 4 + j, -2.0, 2.0)));
  free_outs(outs, n);
  release(&x);
}


/* ---------------------------------------------------------------- packed-head attention */

static void test_packed_attention(void) {
  built x;
  if (build(g_mha_causal, KILN_F16, 1, &x)) {
    const kiln_op *a = find_op(&x, KILN_OP_SDPA, 0);
    CHECK(a && !find_op(&x, KILN_OP_PERMUTE, 0) && !find_op(&x, KILN_OP_SELECT, 0));
    if (a) {
      CHECK(a->n_inputs == 1 && a->n_iattr == 3 && a->iattr[0] == 1 && a->iattr[2] == 1);
      CHECK(x.plan.tensors[a->inputs[0]].rank == 5 && x.plan.tensors[a->output].rank == 4);
    }
  }
  release(&x);
  /* f16 values multiples of 1/64 and exact copies: the packed plan gives the same bytes */
  check_same_as_unfused(g_mha_causal, KILN_F16, -2.0, 2.0);
  if (build(g_mha_mask, KILN_BF16, 1, &x)) {
    const kiln_op *a = find_op(&x, KILN_OP_SDPA, 0);
    CHECK(a && a->n_inputs == 2 && a->iattr[1] == 1 && a->iattr[2] == 1);
    CHECK(a && x.plan.tensors[a->inputs[1]].dtype == KILN_BOOL);
  }
  release(&x);
  check_same_as_unfused(g_mha_mask, KILN_BF16, -2.0, 2.0);
  check_same_as_unfused(g_mha_swapped, KILN_F16, -2.0, 2.0);
  /* k read elsewhere, q and k swapped: the split stays, the merge is the SDPA's (heads last);
   * the result read elsewhere, f32 heads (the matmul path's): both copies stay */
  static const graph_fn apart[4] = {g_mha_peek, g_mha_swapped, g_mha_causal, g_mha_peek_out};
  for (int c = 0; c < 4; c++) {
    if (build(apart[c], c == 2 ? KILN_F32 : KILN_F16, 1, &x)) {
      const kiln_op *a = find_op(&x, KILN_OP_SDPA, 0);
      CHECK(a && a->n_inputs == 3);
      if (c < 2)
        CHECK(a && a->n_iattr == 3 && a->iattr[2] == 2 && !find_op(&x, KILN_OP_PERMUTE, 1) &&
              x.plan.tensors[a->output].dims[1] == 5 && x.plan.tensors[a->output].dims[2] == 2);
      else
        CHECK(a && (a->n_iattr < 3 || a->iattr[2] == 0) && find_op(&x, KILN_OP_PERMUTE, 1));
    }
    release(&x);
  }
  check_same_as_unfused(g_mha_peek, KILN_F16, -2.0, 2.0);
}

/* Heads last: an SDPA whose q, k and v come from elsewhere (a scaled q, grouped k and v) writes
 * [B,L,H,E] in its merge's place, with a bool mask too; the same bytes as the unfused plan on
 * the CPU engine. Not in f32, whose heads run on the matmul path. */
static void test_heads_last_attention(void) {
  built x;
  static const graph_fn fuses[2] = {g_llama_attention, g_llama_attention_mask};
  for (int t = 1; t < 3; t++) {
    kiln_dtype dt = t == 1 ? KILN_F16 : KILN_BF16;
    for (int c = 0; c < 2; c++) {
      if (build(fuses[c], dt, 1, &x)) {
        const kiln_op *a = find_op(&x, KILN_OP_SDPA, 0);
        CHECK(a && a->n_inputs == 3u + (uint32_t)c && a->n_iattr == 3 && a->iattr[2] == 2);
        CHECK(a && x.plan.tensors[a->inputs[1]].dims[1] == 2); /* grouped, not repeated */
        CHECK(a && x.plan.tensors[a->output].rank == 4 && x.plan.tensors[a->output].dims[1] == 6 &&
              x.plan.tensors[a->output].dims[2] == 4);
        CHECK(!find_op(&x, KILN_OP_PERMUTE, 0) && !find_op(&x, KILN_OP_EXPAND, 0));
      }
      release(&x);
      check_same_as_unfused(fuses[c], dt, -2.0, 2.0);
    }
  }
  if (build(g_llama_attention, KILN_F32, 1, &x)) {
    const kiln_op *a = find_op(&x, KILN_OP_SDPA, 0);
    CHECK(a && (a->n_iattr < 3 || a->iattr[2] == 0));
  }
  release(&x);
  check_same_as_unfused(g_llama_attention, KILN_F32, -2.0, 2.0);
}

/* GPT-2's slices of one projection are packed heads too: one SDPA reads x as [2,5,3,2,64] and
 * writes [2,5,2,64], with no slice, permute or copy left. Not when q and k come swapped (heads
 * last then), and not in f32 (the matmul path's heads). */
static void test_sliced_attention(void) {
  built x;
  for (int t = 1; t < 3; t++) {
    kiln_dtype dt = t == 1 ? KILN_F16 : KILN_BF16;
    if (build(g_sliced_mha, dt, 1, &x)) {
      const kiln_op *a = find_op(&x, KILN_OP_SDPA, 0);
      CHECK(a && a->n_inputs == 1 && a->n_iattr == 3 && a->iattr[0] == 1 && a->iattr[2] == 1);
      CHECK(a && x.plan.tensors[a->inputs[0]].rank == 5 &&
            x.plan.tensors[a->inputs[0]].dims[2] == 3);
      CHECK(!find_op(&x, KILN_OP_SLICE, 0) && !find_op(&x, KILN_OP_PERMUTE, 0) &&
            !find_op(&x, KILN_OP_FUSED, 0));
    }
    release(&x);
    check_same_as_unfused(g_sliced_mha, dt, -2.0, 2.0);
    check_same_as_unfused(g_sliced_mha_swapped, dt, -2.0, 2.0);
  }
  static const graph_fn apart[2] = {g_sliced_mha_swapped, g_sliced_mha};
  for (int c = 0; c < 2; c++) {
    if (build(apart[c], c == 1 ? KILN_F32 : KILN_F16, 1, &x)) {
      const kiln_op *a = find_op(&x, KILN_OP_SDPA, 0);
      CHECK(a && a->n_inputs == 3 && (c == 0 ? a->n_iattr == 3 && a->iattr[2] == 2
                                             : a->n_iattr < 3 || a->iattr[2] == 0));
    }
    release(&x);
  }
}

/* An outer product by MATMUL becomes a multiply, which joins cos in one group; a matmul with a
 * real inner dim stays. The same bytes as the unfused plan's in every float dtype. */
static void test_outer_product(void) {
  built x;
  if (build(g_outer, KILN_F32, 1, &x))
    CHECK(count_ops(&x, KILN_OP_MATMUL) == 1 && count_ops(&x, KILN_OP_FUSED) == 1 &&
          x.plan.n_ops == 2);
  release(&x);
  for (int t = 0; t < 3; t++)
    check_same_as_unfused(g_outer, t == 0 ? KILN_F32 : t == 1 ? KILN_F16 : KILN_BF16, -2.0, 2.0);
}

/* A linear whose rows were flattened to 2-D takes the residual of the reshaped result: the
 * reshape moves to its input. Not when its 2-D result is read elsewhere. */
static void test_residual_through_reshape(void) {
  built x;
  if (build(g_residual_flat, KILN_F32, 1, &x)) {
    const kiln_op *a = find_op(&x, KILN_OP_LINEAR, 0), *b = find_op(&x, KILN_OP_LINEAR, 1);
    CHECK(a && b && count_ops(&x, KILN_OP_ADD) == 1);
    if (a && b) {
      const kiln_op *fused = a->n_inputs == 3 ? a : b;
      CHECK(fused->n_inputs == 3 && fused->iattr[1] == 1 && fused->output == x.plan.outputs[0]);
      CHECK(x.plan.tensors[fused->inputs[0]].rank == 3 && x.plan.tensors[fused->output].rank == 3);
    }
  }
  release(&x);
  check_same_as_unfused(g_residual_flat, KILN_F32, -2.0, 2.0);
  if (build(g_residual_clone, KILN_F32, 1, &x)) {
    const kiln_op *a = find_op(&x, KILN_OP_LINEAR, 0);
    CHECK(a && a->n_inputs == 3 && a->iattr[1] == 1 && x.plan.n_ops == 1);
  }
  release(&x);
  check_same_as_unfused(g_residual_clone, KILN_F32, -2.0, 2.0);
}

/* ---------------------------------------------------------------- grouped-query attention */

static void test_grouped_kv(void) {
  built x;
  static const graph_fn fuses[2] = {g_gqa, g_gqa_mask};
  for (int c = 0; c < 2; c++) {
    if (build(fuses[c], KILN_F16, 1, &x)) {
      const kiln_op *a = find_op(&x, KILN_OP_SDPA, 0);
      CHECK(a && !find_op(&x, KILN_OP_EXPAND, 0));
      CHECK(a && x.plan.tensors[a->inputs[1]].dims[1] == 2 &&
            x.plan.tensors[a->inputs[2]].dims[1] == 2 && x.plan.tensors[a->output].dims[1] == 4);
    }
    release(&x);
  }
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = t == 0 ? KILN_F32 : t == 1 ? KILN_F16 : KILN_BF16;
    check_same_as_unfused(g_gqa, dt, -2.0, 2.0);
    check_same_as_unfused(g_gqa_mask, dt, -2.0, 2.0);
    check_same_as_unfused(g_gqa_peek, dt, -2.0, 2.0);
    check_same_as_unfused(g_gqa_tiled, dt, -2.0, 2.0);
    check_same_as_unfused(g_gqa_noop, dt, -2.0, 2.0);
    check_same_as_unfused(g_gqa_uneven, dt, -2.0, 2.0);
  }
  /* the repeated k read elsewhere, tiled rather than repeated per head, or not repeated: the
   * expands stay, except the one that changes nothing (an identity, folded away); k and v
   * repeated from different head counts stay too */
  static const graph_fn apart[4] = {g_gqa_peek, g_gqa_tiled, g_gqa_noop, g_gqa_uneven};
  for (int c = 0; c < 4; c++) {
    if (build(apart[c], KILN_F16, 1, &x)) {
      const kiln_op *a = find_op(&x, KILN_OP_SDPA, 0);
      CHECK(a && x.plan.tensors[a->inputs[1]].dims[1] == 4);
      CHECK(!!find_op(&x, KILN_OP_EXPAND, 0) &&
            (apart[c] == g_gqa_noop) == !find_op(&x, KILN_OP_EXPAND, 1));
    }
    release(&x);
  }
}

/* ---------------------------------------------------------------- constant attention masks */

/* A constant mask that says only "causal" or nothing goes (the SDPA causal where it was the
 * tril); any other stays. Fused and unfused plans (the mask kept) give the same bytes. */
static void test_constant_masks(void) {
  built x;
  for (mask_case = 0; mask_case < 8; mask_case++) {
    for (int t = 0; t < 3; t++) {
      kiln_dtype dt = t == 0 ? KILN_F32 : t == 1 ? KILN_F16 : KILN_BF16;
      if ((mask_case == 2 && dt != KILN_F16) ||
          ((mask_case == 1 || mask_case == 4 || mask_case == 6) && dt != KILN_F32))
        continue;
      int folds = mask_case <= 4;
      if (build(g_const_mask, dt, 1, &x)) {
        const kiln_op *a = find_op(&x, KILN_OP_SDPA, 0);
        CHECK(a && a->n_inputs == (folds ? 3u : 4u) && a->iattr[1] == !folds);
        CHECK(a && a->iattr[0] == (folds && mask_case != 3));
        if (a && a->n_inputs != (folds ? 3u : 4u))
          fprintf(stderr, "constant mask case %d %s: %u inputs\n", mask_case,
                  kiln_dtype_name(dt), (unsigned)a->n_inputs);
      }
      release(&x);
      check_same_as_unfused(g_const_mask, dt, -2.0, 2.0);
    }
  }
}

/* The gather that picks every element in order becomes a view, the AND with all-true (OR with
 * all-false) its other operand, and the SDPA reads the [2,1,1,5] mask itself: no INDEX, BITWISE
 * or EXPAND left. A real gather or a real AND stays. Fused and unfused plans give the same
 * bytes. */
static void test_identity_ops(void) {
  built x;
  for (ident_case = 0; ident_case < 4; ident_case++) {
    for (int t = 0; t < 3; t++) {
      kiln_dtype dt = t == 0 ? KILN_F32 : t == 1 ? KILN_F16 : KILN_BF16;
      if (build(g_padding_mask, dt, 1, &x)) {
        const kiln_op *a = find_op(&x, KILN_OP_SDPA, 0);
        CHECK(!find_op(&x, KILN_OP_INDEX, 0) == (ident_case != 1));
        CHECK(!find_op(&x, KILN_OP_BITWISE, 0) == (ident_case != 2));
        CHECK(!find_op(&x, KILN_OP_EXPAND, 0));
        CHECK(a && a->n_inputs == 4);
        if (a && ident_case != 2) {
          const kiln_tensor_desc *m = &x.plan.tensors[a->inputs[3]];
          CHECK(m->rank == 4 && m->dims[0] == 2 && m->dims[2] == 1 && m->dims[3] == 5);
        }
      }
      release(&x);
      check_same_as_unfused(g_padding_mask, dt, -2.0, 2.0);
    }
  }
}

/* An integer ADD or SUB of zeros or MUL by ones becomes a view of its operand (kept where it
 * computes something, or in a float type); fused and unfused plans give the same bytes. */
static void test_int_identities(void) {
  static const kiln_op_kind kinds[9] = {KILN_OP_ADD, KILN_OP_ADD, KILN_OP_SUB,
                                        KILN_OP_MUL, KILN_OP_ADD, KILN_OP_ADD,
                                        KILN_OP_SUB, KILN_OP_ADD, KILN_OP_ADD};
  built x;
  for (int_case = 0; int_case < 9; int_case++) {
    if (build(g_int_identities, KILN_F32, 1, &x)) {
      const kiln_op *pw = find_op(&x, KILN_OP_POINTWISE, 0); /* f32: the sum fused, as a step */
      int kept = find_op(&x, kinds[int_case], 0) != NULL || (pw && pw->n_iattr == 2);
      if (kept != (int_case >= 5))
        fprintf(stderr, "int identity case %d: kept %d\n", int_case, kept);
      CHECK(kept == (int_case >= 5));
      CHECK(find_op(&x, KILN_OP_EXPAND, 0) == NULL || int_case == 4);
    }
    release(&x);
    check_same_as_unfused(g_int_identities, KILN_F32, -100.0, 100.0);
  }
}

/* ---------------------------------------------------------------- SwiGLU */

static void test_swiglu(void) {
  built x;
  static const graph_fn fuses[2] = {g_swiglu, g_swiglu_swapped};
  for (int c = 0; c < 2; c++) {
    if (build(fuses[c], KILN_F16, 1, &x)) {
      const kiln_op *a = find_op(&x, KILN_OP_LINEAR, 0);
      CHECK(a && a->iattr[0] == KILN_ACT_SWIGLU && a->n_inputs == 2 &&
            x.plan.tensors[a->inputs[1]].dims[0] == 24 && x.plan.tensors[a->output].dims[1] == 12);
      CHECK(x.plan.n_ops == 2 && !find_op(&x, KILN_OP_SILU, 0) && !find_op(&x, KILN_OP_MUL, 0));
    }
    release(&x);
    /* f32: the fused product rounds gate and up to f32 as the two LINEARs did: same bits */
    check_same_as_unfused(fuses[c], KILN_F32, -2.0, 2.0);
  }
  static const graph_fn apart[4] = {g_swiglu_bias, g_swiglu_peek, g_swiglu_two_inputs,
                                    g_swiglu_sigmoid};
  for (int c = 0; c < 4; c++) {
    if (build(apart[c], KILN_F32, 1, &x)) {
      const kiln_op *a = find_op(&x, KILN_OP_LINEAR, 0);
      /* sigmoid gating is no SwiGLU, but its gate and up projections still share one GEMM */
      CHECK(a && a->iattr[0] != KILN_ACT_SWIGLU && !find_op(&x, KILN_OP_LINEAR, c == 3 ? 2 : 3));
      CHECK(find_op(&x, KILN_OP_LINEAR, c == 3 ? 1 : 2));
    }
    release(&x);
    check_same_as_unfused(apart[c], KILN_F32, -2.0, 2.0);
  }
}

/* ---------------------------------------------------------------- fused groups */

static int32_t op_n(kiln_builder *b, kiln_op_kind kind, const int32_t *inputs, uint32_t n,
                    const int64_t *iattr, uint32_t n_iattr) {
  kiln_error err = {KILN_OK, ""};
  int32_t id = kiln_builder_add_op(b, kind, inputs, n, iattr, n_iattr, NULL, 0, &err);
  if (id < 0) fprintf(stderr, "add_op: %s\n", err.message);
  CHECK(id >= 0);
  return id;
}

static int64_t rot_seq = 4; /* the positions rotary() splits x into */

/* transformers' rotary embedding: heads split by reshape and permute, then
 * q * cos + cat(-q[..., 4:], q[..., :4]) * sin, for q (two heads) and k (one head). */
static int32_t rotary(kiln_builder *b, int32_t x, int64_t heads, int32_t cos, int32_t sin) {
  int32_t h = op_n(b, KILN_OP_RESHAPE, T(x), 1, D(1, rot_seq, heads, 8), 4);
  int32_t q = op_n(b, KILN_OP_PERMUTE, T(h), 1, D(0, 2, 1, 3), 4);
  int32_t hi = op_n(b, KILN_OP_SLICE, T(q), 1, D(3, 4, 8, 1), 4);
  int32_t lo = op_n(b, KILN_OP_SLICE, T(q), 1, D(3, 0, 4, 1), 4);
  int32_t rot = op_n(b, KILN_OP_CAT, T(unary(b, KILN_OP_NEG, hi), lo), 2, D(3), 1);
  return binary(b, KILN_OP_ADD, binary(b, KILN_OP_MUL, q, cos), binary(b, KILN_OP_MUL, rot, sin));
}

static void g_rotary(kiln_builder *b, kiln_dtype dt) {
  int32_t xq = in(b, "xq", dt, 3, D(1, 4, 16)), xk = in(b, "xk", dt, 3, D(1, 4, 8));
  int32_t cos = in(b, "cos", dt, 2, D(4, 8)), sin = in(b, "sin", dt, 2, D(4, 8));
  out(b, rotary(b, xq, 2, cos, sin), "q");
  out(b, rotary(b, xk, 1, cos, sin), "k");
}

/* The rotary tables computed in the graph from positions, cos(pos * inv) and sin(pos * inv),
 * and read by the q and the k embedding, by tables_case: 0 as a decode step has them (4
 * positions), 1 the sin table an output too, 2 at 1024 positions (8192 elements a table). */
static int tables_case;

static void g_rotary_tables(kiln_builder *b, kiln_dtype dt) {
  rot_seq = tables_case == 2 ? 1024 : 4;
  int32_t xq = in(b, "xq", dt, 3, D(1, rot_seq, 16)), xk = in(b, "xk", dt, 3, D(1, rot_seq, 8));
  int32_t pos = in(b, "pos", dt, 2, D(rot_seq, 1)), inv = in(b, "inv", dt, 2, D(1, 8));
  int32_t angles = binary(b, KILN_OP_MUL, pos, inv);
  int32_t cos = unary(b, KILN_OP_COS, angles), sin = unary(b, KILN_OP_SIN, angles);
  out(b, rotary(b, xq, 2, cos, sin), "q");
  out(b, rotary(b, xk, 1, cos, sin), "k");
  if (tables_case == 1) out(b, sin, "sin");
  rot_seq = 4;
}

/* GPT-2's tanh GELU as written: 0.5 * x * (1 + tanh(0.79788456 * (x + 0.044715 * x^3))). */
static void g_gelu_tanh(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 2, D(3, 16));
  int32_t cube = op(b, KILN_OP_POW, T(x), 1, 0, 0, (const double[]){3.0}, 1);
  int32_t inner = binary(b, KILN_OP_ADD, x, binary(b, KILN_OP_MUL, scalar(b, dt, 0.044715f), cube));
  int32_t t = unary(b, KILN_OP_TANH, binary(b, KILN_OP_MUL, scalar(b, dt, 0.7978845608f), inner));
  int32_t half = binary(b, KILN_OP_MUL, scalar(b, dt, 0.5f), x);
  out(b, binary(b, KILN_OP_MUL, half, binary(b, KILN_OP_ADD, t, scalar(b, dt, 1.0f))), "y");
}

/* RMSNorm computed in f32 and cast back, as transformers writes it (the builder makes it one
 * RMS_NORM):
 * w * cast(x32 * rsqrt(mean(x32^2) + eps)), x32 = cast(x, f32). */
static void g_rms_cast(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 3, D(2, 3, 8)), w = in(b, "w", dt, 1, D(8));
  int32_t x32 = op(b, KILN_OP_CAST, T(x), 1, KILN_F32, 1, NULL, 0);
  int32_t sq = op(b, KILN_OP_POW, T(x32), 1, 0, 0, (const double[]){2.0}, 1);
  int32_t m = op_n(b, KILN_OP_MEAN, T(sq), 1, D(4, 1), 2);
  int32_t r = unary(b, KILN_OP_RSQRT, binary(b, KILN_OP_ADD, m, scalar(b, KILN_F32, 1e-6f)));
  int32_t y = op(b, KILN_OP_CAST, T(binary(b, KILN_OP_MUL, x32, r)), 1, dt, 1, NULL, 0);
  out(b, binary(b, KILN_OP_MUL, w, y), "y");
}

/* x * rsqrt(mean(x^2) + eps) in f32, nothing around it. */
static void g_rms_plain(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 2, D(3, 16));
  int32_t sq = op(b, KILN_OP_POW, T(x), 1, 0, 0, (const double[]){2.0}, 1);
  int32_t m = op_n(b, KILN_OP_MEAN, T(sq), 1, D(2, 1), 2);
  int32_t r = unary(b, KILN_OP_RSQRT, binary(b, KILN_OP_ADD, m, scalar(b, KILN_F32, 1e-5f)));
  out(b, binary(b, KILN_OP_MUL, r, x), "y");
}

/* The cast-wrapped RMSNorm with its f32 copy of x also an output, which must stay. */
static void g_rms_cast_kept(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 3, D(2, 3, 8));
  int32_t x32 = op(b, KILN_OP_CAST, T(x), 1, KILN_F32, 1, NULL, 0);
  int32_t sq = op(b, KILN_OP_POW, T(x32), 1, 0, 0, (const double[]){2.0}, 1);
  int32_t m = op_n(b, KILN_OP_MEAN, T(sq), 1, D(4, 1), 2);
  int32_t r = unary(b, KILN_OP_RSQRT, binary(b, KILN_OP_ADD, m, scalar(b, KILN_F32, 1e-6f)));
  out(b, op(b, KILN_OP_CAST, T(binary(b, KILN_OP_MUL, x32, r)), 1, dt, 1, NULL, 0), "y");
  out(b, x32, "wide");
}

/* rsqrt(mean(x^2) + eps) scaling another tensor z: no norm of x. */
static void g_rms_other(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 2, D(3, 16)), z = in(b, "z", dt, 2, D(3, 16));
  int32_t sq = op(b, KILN_OP_POW, T(x), 1, 0, 0, (const double[]){2.0}, 1);
  int32_t m = op_n(b, KILN_OP_MEAN, T(sq), 1, D(2, 1), 2);
  int32_t r = unary(b, KILN_OP_RSQRT, binary(b, KILN_OP_ADD, m, scalar(b, KILN_F32, 1e-5f)));
  out(b, binary(b, KILN_OP_MUL, r, z), "y");
  out(b, x, "x_too");
}

/* As g_rms_plain, with the squares also an output. */
static void g_rms_shared(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 2, D(3, 16));
  int32_t sq = op(b, KILN_OP_POW, T(x), 1, 0, 0, (const double[]){2.0}, 1);
  int32_t m = op_n(b, KILN_OP_MEAN, T(sq), 1, D(2, 1), 2);
  int32_t r = unary(b, KILN_OP_RSQRT, binary(b, KILN_OP_ADD, m, scalar(b, KILN_F32, 1e-5f)));
  out(b, binary(b, KILN_OP_MUL, r, x), "y");
  out(b, sq, "squares");
}

/* Broadcasts, permutes, reshapes and selects around pointwise ops: (x + expand(y)) split by a
 * reshape and permuted, times z; exp(x) merged by a reshape (read back through it, the merged
 * dims are no affine map of the output's, so exp is written by an op of its own, and what
 * follows is a plain chain); relu of a selected row times y. */
static void g_views_group(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 3, D(2, 3, 4)), y = in(b, "y", dt, 3, D(1, 1, 4));
  int32_t z = in(b, "z", dt, 4, D(2, 1, 1, 1)), q = in(b, "q", dt, 1, D(12));
  int32_t e = op_n(b, KILN_OP_EXPAND, T(y), 1, D(2, 3, 4), 3);
  int32_t s = op_n(b, KILN_OP_RESHAPE, T(binary(b, KILN_OP_ADD, x, e)), 1, D(2, 3, 2, 2), 4);
  int32_t p = op_n(b, KILN_OP_PERMUTE, T(s), 1, D(3, 0, 2, 1), 4);
  out(b, binary(b, KILN_OP_MUL, p, z), "a");
  int32_t flat = op_n(b, KILN_OP_RESHAPE, T(unary(b, KILN_OP_EXP, x)), 1, D(2, 12), 2);
  out(b, binary(b, KILN_OP_ADD, unary(b, KILN_OP_NEG, flat), q), "b");
  int32_t row = op_n(b, KILN_OP_SELECT, T(x), 1, D(1, 2), 2);
  out(b, binary(b, KILN_OP_MUL, unary(b, KILN_OP_RELU, row), y), "c");
}

/* Grouped-query attention's repeat of a computed k: (x + y) [2,3,8] split into 2 heads of 4,
 * permuted, unsqueezed and expanded to [2,2,2,3,4], a group output of more dims than the
 * split: the split's index map keeps the columns of every output dim. */
static void g_split_expand(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 3, D(2, 3, 8)), y = in(b, "y", dt, 3, D(2, 3, 8));
  int32_t s = op_n(b, KILN_OP_RESHAPE, T(binary(b, KILN_OP_ADD, x, y)), 1, D(2, 3, 2, 4), 4);
  int32_t p = op_n(b, KILN_OP_PERMUTE, T(s), 1, D(0, 2, 1, 3), 4);
  int32_t u = op_n(b, KILN_OP_RESHAPE, T(p), 1, D(2, 2, 1, 3, 4), 5);
  out(b, op_n(b, KILN_OP_EXPAND, T(u), 1, D(2, 2, 2, 3, 4), 5), "k");
}

/* The fused plan within one rounding of the unfused one (an RMS_NORM rounds once where the
 * written-out form rounds before its weight): 2 ulps of the dtype relative to max(1, |v|). */
static void check_close_to_unfused(graph_fn make, kiln_dtype dt, double lo, double hi) {
  built fused, plain;
  void *a[MAX_OUTS], *b[MAX_OUTS];
  double tol = dt == KILN_F32 ? 1e-6 : dt == KILN_F16 ? 2.0 / 1024 : 2.0 / 128;
  memset(&plain, 0, sizeof plain);
  if (build(make, dt, 1, &fused) && build(make, dt, 0, &plain)) {
    uint32_t n = run_cpu(&fused, lo, hi, a), m = run_cpu(&plain, lo, hi, b);
    CHECK(n == m && n == plain.plan.n_outputs);
    for (uint32_t k = 0; k < n && k < m; k++) {
      const kiln_tensor_desc *t = &plain.plan.tensors[plain.plan.outputs[k]];
      int64_t count = (int64_t)(t->nbytes / kiln_dtype_size(t->dtype)), bad = 0;
      for (int64_t i = 0; i < count; i++) {
        double u = dt == KILN_F32 ? ((const float *)a[k])[i]
                   : dt == KILN_F16 ? kiln_f16_to_f32(((const uint16_t *)a[k])[i])
                                    : kiln_bf16_to_f32(((const uint16_t *)a[k])[i]);
        double v = dt == KILN_F32 ? ((const float *)b[k])[i]
                   : dt == KILN_F16 ? kiln_f16_to_f32(((const uint16_t *)b[k])[i])
                                    : kiln_bf16_to_f32(((const uint16_t *)b[k])[i]);
        bad += !close_to(u, v, tol);
      }
      if (bad) fprintf(stderr, "output %u: %lld values beyond %g\n", (unsigned)k, (long long)bad, tol);
      CHECK(bad == 0);
    }
    free_outs(a, n);
    free_outs(b, m);
  }
  release(&fused);
  release(&plain);
}

static uint32_t count_kind(const built *x, kiln_op_kind kind) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < x->plan.n_ops; i++) n += x->plan.ops[i].kind == kind;
  return n;
}

static void test_groups_fuse(void) {
  static const kiln_dtype dts[3] = {KILN_F32, KILN_F16, KILN_BF16};
  built x;
  if (build(g_rotary, KILN_F32, 1, &x)) { /* each rotary embedding is one op */
    CHECK(x.plan.n_ops == 2 && count_kind(&x, KILN_OP_FUSED) == 2);
    CHECK(plan_op(&x, 0)->n_inputs == 3 && plan_op(&x, 1)->n_inputs == 3);
  }
  release(&x);
  if (build(g_gelu_tanh, KILN_F32, 1, &x)) CHECK(x.plan.n_ops == 1 && count_kind(&x, KILN_OP_FUSED) == 1);
  release(&x);
  /* small rotary tables both embeddings read are recomputed in each: no op of their own; one
   * that is an output too is still written; large ones are computed once */
  for (tables_case = 0; tables_case < 3; tables_case++) {
    if (build(g_rotary_tables, KILN_F32, 1, &x)) {
      static const uint32_t ops[3] = {2, 4, 5}; /* 1: sin and the angles it reads stay */
      if (x.plan.n_ops != ops[tables_case])
        fprintf(stderr, "rotary tables case %d: %u ops\n", tables_case, x.plan.n_ops);
      CHECK(x.plan.n_ops == ops[tables_case]);
    }
    release(&x);
    for (int k = 0; k < 3; k++) check_same_as_unfused(g_rotary_tables, dts[k], -2.0, 2.0);
  }
  for (int k = 0; k < 3; k++) { /* the written-out RMSNorm with its casts is one RMS_NORM */
    if (build(g_rms_cast, dts[k], 1, &x)) {
      const kiln_op *n = plan_op(&x, 0);
      CHECK(x.plan.n_ops == 1 && n->kind == KILN_OP_RMS_NORM && n->n_inputs == 2);
      CHECK(n->inputs[0] == 0 && n->inputs[1] == 1 && n->iattr[0] == 1 && n->iattr[1] == 1);
      CHECK(n->fattr[0] == (double)1e-6f);
    }
    release(&x);
    check_close_to_unfused(g_rms_cast, dts[k], -2.0, 2.0);
  }
  if (build(g_rms_plain, KILN_F32, 1, &x)) /* no casts, no weight: the norm alone */
    CHECK(x.plan.n_ops == 1 && plan_op(&x, 0)->kind == KILN_OP_RMS_NORM && plan_op(&x, 0)->n_inputs == 1);
  release(&x);
  check_close_to_unfused(g_rms_plain, KILN_F32, -2.0, 2.0);
  if (build(g_rms_cast_kept, KILN_F16, 1, &x)) { /* the norm reads x; the cast stays for "wide" */
    CHECK(find_op(&x, KILN_OP_RMS_NORM, 0) && find_op(&x, KILN_OP_CAST, 0));
    CHECK(find_op(&x, KILN_OP_RMS_NORM, 0)->inputs[0] == 0);
  }
  release(&x);
  check_close_to_unfused(g_rms_cast_kept, KILN_F16, -2.0, 2.0);
  if (build(g_rms_other, KILN_F32, 1, &x)) CHECK(!find_op(&x, KILN_OP_RMS_NORM, 0));
  release(&x);
  if (build(g_rms_shared, KILN_F32, 1, &x)) /* the squares are read twice: no norm */
    CHECK(!find_op(&x, KILN_OP_RMS_NORM, 0) && find_op(&x, KILN_OP_MEAN, 0));
  release(&x);
  if (build(g_split_expand, KILN_F32, 1, &x)) /* one group: add, split, permute, expand */
    CHECK(x.plan.n_ops == 1 && count_kind(&x, KILN_OP_FUSED) == 1);
  release(&x);
  if (build(g_views_group, KILN_F32, 1, &x)) {
    CHECK(count_kind(&x, KILN_OP_EXP) == 1 && count_kind(&x, KILN_OP_POINTWISE) == 1);
    CHECK(count_kind(&x, KILN_OP_FUSED) == 2 && x.plan.n_ops == 5);
    CHECK(!find_op(&x, KILN_OP_PERMUTE, 0) && !find_op(&x, KILN_OP_SELECT, 0));
  }
  release(&x);
  /* every rounding of the unfused plan is kept: the same bytes in every float dtype */
  for (int k = 0; k < 3; k++) {
    check_same_as_unfused(g_rotary, dts[k], -2.0, 2.0);
    check_same_as_unfused(g_gelu_tanh, dts[k], -3.0, 3.0);
    check_same_as_unfused(g_views_group, dts[k], -2.0, 2.0);
    check_same_as_unfused(g_split_expand, dts[k], -2.0, 2.0);
  }
}

/* Sets program word `word` (counted over the plan's words) of copy, a copy of x's blob, to v. */
static void set_word(uint8_t *copy, const built *x, uint32_t word, int64_t v) {
  size_t end =
      (size_t)((const uint8_t *)x->view.plan - (const uint8_t *)x->blob) + x->view.plan_size;
  for (int i = 0; i < 8; i++)
    copy[end - 8u * x->plan.n_words + 8u * word + (size_t)i] = (uint8_t)((uint64_t)v >> (8 * i));
}

/* A copy of blob x with program word `word` set to v. */
static void *with_word(const built *x, uint32_t word, int64_t v) {
  uint8_t *copy = malloc(x->size);
  if (!copy) return NULL;
  memcpy(copy, x->blob, x->size);
  set_word(copy, x, word, v);
  return copy;
}

static void expect_word_refused(const built *x, uint32_t word, int64_t v, const char *part) {
  kiln_engine_options opts;
  kiln_engine *e = NULL;
  kiln_error err = {KILN_OK, ""};
  void *bad = with_word(x, word, v);
  kiln_engine_options_default(&opts);
  opts.device = KILN_DEVICE_CPU;
  CHECK(bad && kiln_engine_load(bad, x->size, &opts, &e, &err) == KILN_ERR_INVALID_PROGRAM);
  if (!strstr(err.message, part)) fprintf(stderr, "word %u: got \"%s\"\n", word, err.message);
  CHECK(strstr(err.message, part) != NULL);
  if (e) kiln_engine_destroy(e);
  free(bad);
}

/* A program of a load and one store initializes on the CPU engine; with a second store, or a
 * store before its end, it is refused. */
static void test_one_store(void) {
  static const int64_t map[5] = {0, 0, 1, 0, 4};
  const int64_t ld = KILN_FX_INSTR(KILN_FX_LOAD, 0, 0, 0, 0), st = KILN_FX_INSTR(KILN_FX_STORE, 0, 0, 0, 0);
  for (int stores = 1; stores <= 2; stores++) {
    graph *g = g_new();
    kiln_error err = {KILN_OK, ""};
    uint32_t x = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, D(4));
    uint32_t y = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 1, D(4));
    g_fused(g, 1, (const uint32_t[]){x}, y, 1, 1, map, 1u + (uint32_t)stores,
            (const int64_t[]){ld, 0, st, 0, st, 0});
    kiln_engine *e = g_engine(g);
    kiln_status s = kiln_cpu_backend.init(e, &err);
    CHECK(stores == 1 ? s == KILN_OK : s == KILN_ERR_INVALID_PROGRAM);
    if (s == KILN_OK) kiln_cpu_backend.destroy(e);
    free(e);
    free(g);
  }
}

/* Every field of a program is checked: no malformed program loads. */
static void test_group_refusals(void) {
  built x;
  if (!build(g_gelu_tanh, KILN_F32, 1, &x)) return;
  const kiln_op *f = plan_op(&x, 0);
  const int64_t *w = x.plan.words + f->iattr[0];
  uint32_t at = (uint32_t)f->iattr[0], maps = (uint32_t)w[0], rank = 2;
  uint32_t first = at + 2 + maps * (2 + 3 * rank); /* the first instruction */
  uint32_t last = at + (uint32_t)f->iattr[1] - 2;  /* the store */
  CHECK(x.plan.n_ops == 1 && f->kind == KILN_OP_FUSED && maps >= 2);
  expect_word_refused(&x, at, maps + 1, "do not fill");
  expect_word_refused(&x, at + 1, 0, "do not fill");
  expect_word_refused(&x, at + 2, 7, "input slot");                 /* map 0 reads no input */
  expect_word_refused(&x, at + 3, 1, "reaches elements");           /* offset past the end */
  expect_word_refused(&x, at + 3, -1, "reaches elements");          /* and before the start */
  expect_word_refused(&x, at + 4, 17, "reaches elements");          /* a stride too long */
  expect_word_refused(&x, at + 4 + 2 * rank, 4, "box");     /* a box past the output */
  expect_word_refused(&x, at + 4 + rank + 1, 17, "box");    /* one that ends before it starts */
  expect_word_refused(&x, first, KILN_FX_INSTR(KILN_FX_LOAD, 0, 0, 0, 12), "malformed");  /* no map 12 */
  expect_word_refused(&x, first, KILN_FX_INSTR(KILN_FX_LOAD, 16, 0, 0, 0), "malformed");  /* no r16 */
  expect_word_refused(&x, first, KILN_FX_INSTR(KILN_FX_UNARY, 0, 5, 0, KILN_OP_NEG), "malformed");
  expect_word_refused(&x, first, KILN_FX_INSTR(9, 0, 0, 0, 0), "malformed");
  expect_word_refused(&x, first, w[2 + maps * (2 + 3 * rank)] | ((int64_t)1 << 50), "malformed");
  expect_word_refused(&x, first + 1, 1, "malformed");               /* a load takes no immediate */
  expect_word_refused(&x, last, KILN_FX_INSTR(KILN_FX_STORE, 0, 9, 0, 0), "malformed");
  expect_word_refused(&x, last, KILN_FX_INSTR(KILN_FX_UNARY, 0, 0, 0, KILN_OP_NEG), "store");
  expect_word_refused(&x, last, KILN_FX_INSTR(KILN_FX_BINARY, 0, 0, 0, KILN_OP_RELU), "malformed");
  expect_word_refused(&x, last, KILN_FX_INSTR(KILN_FX_ROUND, 0, 0, 0, KILN_F32), "malformed");
  expect_word_refused(&x, last, KILN_FX_INSTR(KILN_FX_SELECT, 0, 0, 0, 2), "malformed");
  expect_word_refused(&x, at + 2 + (2 + 3 * rank), 0, "read by no map"); /* map 1 reads input 0 */
  { /* the op's program must start where the words do: none may go unaccounted for */
    kiln_engine_options opts;
    kiln_engine *e = NULL;
    kiln_error err = {KILN_OK, ""};
    uint8_t *bad = malloc(x.size);
    size_t op0 = (size_t)((const uint8_t *)x.view.plan - (const uint8_t *)x.blob) + 32u +
                 96u * x.plan.n_tensors;
    kiln_engine_options_default(&opts);
    opts.device = KILN_DEVICE_CPU;
    CHECK(bad != NULL);
    if (bad) {
      memcpy(bad, x.blob, x.size);
      bad[op0 + 48] = 2; /* iattr0: the program at word 2 */
      CHECK(kiln_engine_load(bad, x.size, &opts, &e, &err) == KILN_ERR_INVALID_PROGRAM);
      CHECK(strstr(err.message, "does not follow") != NULL);
      bad[op0 + 48] = 0;
      bad[op0 + 56] -= 2; /* iattr1: two words short, leaving two over */
      CHECK(kiln_engine_load(bad, x.size, &opts, &e, &err) == KILN_ERR_INVALID_PROGRAM);
      CHECK(strstr(err.message, "program words but its fused ops") != NULL);
      free(bad);
    }
  }
  release(&x);
}

/* ---------------------------------------------------------------- fused groups, dynamic plans */

#define DYN_MAX 12

static int build_dyn(dyn_graph_fn make, kiln_dtype dt, int fuse, built *x) {
  kiln_builder *b = kiln_builder_create();
  kiln_build_options opts;
  kiln_error err = {KILN_OK, ""};
  int ok;
  memset(x, 0, sizeof *x);
  if (!b) return 0;
  ok = make(b, dt, DYN_MAX);
  kiln_build_options_default(&opts);
  opts.fuse = fuse;
  ok = ok && kiln_builder_build(b, &opts, &x->blob, &x->size, &err) == KILN_OK &&
       kiln_blob_parse(x->blob, x->size, &x->view, &err) == KILN_OK &&
       kiln_plan_parse(x->view.plan, x->view.plan_size, x->view.weights_size, &x->plan, &err) ==
           KILN_OK;
  if (!ok) fprintf(stderr, "build: %s\n", err.message);
  CHECK(ok);
  kiln_builder_destroy(b);
  return ok;
}

static kiln_engine *load_cpu(const void *blob, size_t size) {
  kiln_engine_options opts;
  kiln_engine *e = NULL;
  kiln_error err = {KILN_OK, ""};
  kiln_engine_options_default(&opts);
  opts.device = KILN_DEVICE_CPU;
  if (kiln_engine_load(blob, size, &opts, &e, &err) != KILN_OK)
    fprintf(stderr, "load: %s\n", err.message);
  CHECK(e != NULL);
  return e;
}

/* Views of every binding of x's plan at sequence n over buffers of the bounds' size (inputs
 * filled by input_value, element by element); returns the input count, *n_out the outputs'. */
static uint32_t views_at(const built *x, int64_t n, double lo, double hi, kiln_tensor_view *iv,
                         kiln_tensor_view *ov, uint32_t *n_out) {
  uint32_t n_in = 0;
  *n_out = 0;
  for (uint32_t k = 0; k < x->plan.n_inputs + x->plan.n_outputs; k++) {
    int in = k < x->plan.n_inputs;
    const kiln_tensor_desc *t =
        &x->plan.tensors[in ? x->plan.inputs[k] : x->plan.outputs[k - x->plan.n_inputs]];
    kiln_tensor_view *v = in ? &iv[n_in++] : &ov[(*n_out)++];
    int64_t count = 1;
    memset(v, 0, sizeof *v);
    v->dtype = t->dtype;
    v->rank = t->rank;
    dyn_dims_at(t, n, v->sizes);
    for (int32_t d = t->rank - 1; d >= 0; d--) v->strides[d] = count, count *= v->sizes[d];
    v->nbytes = (size_t)count * kiln_dtype_size(t->dtype);
    v->data = calloc(1, t->nbytes ? (size_t)t->nbytes : 1);
    for (int64_t i = 0; in && i < count; i++)
      fill_value(v->data, t->dtype, i, input_value(k, i, lo, hi));
  }
  return n_in;
}

static void free_views(kiln_tensor_view *v, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) free(v[i].data);
}

/* The fused and unfused plans of one dynamic graph, each loaded once, give the same bytes at
 * every size of sizes (1, midway, the bound, then smaller again), allocating nothing. */
static void check_dyn_same_as_unfused(dyn_graph_fn make, kiln_dtype dt, const char *what) {
  static const int64_t sizes[] = {1, 6, DYN_MAX, 1, 5, 2, DYN_MAX - 1};
  built fused, plain;
  memset(&plain, 0, sizeof plain);
  if (build_dyn(make, dt, 1, &fused) && build_dyn(make, dt, 0, &plain)) {
    kiln_engine *ef = load_cpu(fused.blob, fused.size), *ep = load_cpu(plain.blob, plain.size);
    for (size_t k = 0; ef && ep && k < sizeof sizes / sizeof sizes[0]; k++) {
      kiln_tensor_view iv[MAX_INS], ov[MAX_OUTS], pv[MAX_OUTS];
      kiln_error err = {KILN_OK, ""};
      uint32_t n_out = 0, n_in = views_at(&fused, sizes[k], -2.0, 2.0, iv, ov, &n_out);
      for (uint32_t o = 0; o < n_out; o++) {
        pv[o] = ov[o];
        pv[o].data = calloc(1, fused.plan.tensors[fused.plan.outputs[o]].nbytes);
      }
      kiln_test_fail_allocations = 1; /* still 1 after: execute allocated nothing */
      CHECK(kiln_engine_execute(ef, iv, n_in, ov, n_out, &err) == KILN_OK);
      CHECK(kiln_test_fail_allocations == 1);
      kiln_test_fail_allocations = 0;
      if (err.status) fprintf(stderr, "%s at %lld: %s\n", what, (long long)sizes[k], err.message);
      CHECK(kiln_engine_execute(ep, iv, n_in, pv, n_out, &err) == KILN_OK);
      for (uint32_t o = 0; o < n_out; o++) {
        int same = memcmp(ov[o].data, pv[o].data, (size_t)ov[o].nbytes) == 0;
        if (!same)
          fprintf(stderr, "%s %.4s at %lld: output %u of the fused plan differs\n", what,
                  kiln_dtype_name(dt), (long long)sizes[k], (unsigned)o);
        CHECK(same);
      }
      free_views(iv, n_in);
      free_views(ov, n_out);
      free_views(pv, n_out);
    }
    kiln_engine_destroy(ef);
    kiln_engine_destroy(ep);
  }
  release(&fused);
  release(&plain);
}

/* Groups whose programs hold at every size are fused in a dynamic plan: each rotary embedding
 * is one op, the norm's pieces after the mean one, the table broadcast one; each FUSED output
 * follows the symbol as its root did; and they compute the unfused plan's bytes at every size. */
static void test_dynamic_groups_fuse(void) {
  static const kiln_dtype dts[3] = {KILN_F32, KILN_F16, KILN_BF16};
  built x;
  if (build_dyn(dyn_groups, KILN_F32, 1, &x)) {
    const kiln_tensor_desc *q = &x.plan.tensors[x.plan.outputs[0]];
    CHECK(count_kind(&x, KILN_OP_FUSED) == 5 && x.plan.n_ops == 7); /* with pow and mean */
    CHECK(!find_op(&x, KILN_OP_CAST, 0)); /* the casts of keep and pos load in their group */
    CHECK(find_op(&x, KILN_OP_POW, 0) && find_op(&x, KILN_OP_MEAN, 0));
    CHECK(q->rank == 4 && q->dims[2] == DYN_MAX && q->sym[2].symbol == 1 &&
          q->sym[2].coeff == 1 && q->sym[2].offset == 0 && !q->sym[1].symbol);
  }
  release(&x);
  for (int k = 0; k < 3; k++) check_dyn_same_as_unfused(dyn_groups, dts[k], "dynamic groups");
}

/* A group whose loads follow the symbol is cut where it does, or left unfused: the permute
 * stays with its relu, the last row's select and the cat along s stay ops of their own and
 * what reads them is fused; the result is the unfused plan's at every size. */
static void test_dynamic_groups_that_move(void) {
  static const kiln_dtype dts[3] = {KILN_F32, KILN_F16, KILN_BF16};
  built x;
  if (build_dyn(dyn_moving, KILN_F32, 1, &x)) {
    const kiln_op *f0 = find_op(&x, KILN_OP_FUSED, 0), *f1 = find_op(&x, KILN_OP_FUSED, 1);
    CHECK(count_kind(&x, KILN_OP_FUSED) == 2 && x.plan.n_ops == 6);
    CHECK(find_op(&x, KILN_OP_PERMUTE, 0) && find_op(&x, KILN_OP_RELU, 0));
    CHECK(find_op(&x, KILN_OP_SELECT, 0) && find_op(&x, KILN_OP_CAT, 0));
    CHECK(f0 && f1 && f0->n_inputs == 1 && f1->n_inputs == 1);
    CHECK(f0 && f1 && x.plan.tensors[f0->inputs[0]].storage == KILN_STORE_ARENA &&
          x.plan.tensors[f1->inputs[0]].storage == KILN_STORE_ARENA);
  }
  release(&x);
  for (int k = 0; k < 3; k++) check_dyn_same_as_unfused(dyn_moving, dts[k], "groups that move");
}

/* Every allocation of a dynamic build failing in turn: each refusal is out of memory, the one
 * for the shapes the groups are probed at among them, and nothing leaks (the sanitizer build). */
static void test_dynamic_fuse_oom(void) {
  int saw_probes = 0, n;
  for (n = 1; n < 2000; n++) {
    kiln_builder *b = kiln_builder_create();
    kiln_error err = {KILN_OK, ""};
    void *blob = NULL;
    size_t size = 0;
    kiln_status s;
    if (!b) break;
    CHECK(dyn_groups(b, KILN_F16, DYN_MAX));
    kiln_test_fail_allocations = n;
    s = kiln_builder_build(b, NULL, &blob, &size, &err);
    kiln_builder_destroy(b);
    kiln_free(blob);
    if (kiln_test_fail_allocations > 0) { /* the n-th allocation never came */
      CHECK(s == KILN_OK);
      break;
    }
    if (s == KILN_OK) continue;
    CHECK(s == KILN_ERR_OUT_OF_MEMORY);
    saw_probes |= strstr(err.message, "at other sizes while fusing groups") != NULL;
  }
  kiln_test_fail_allocations = 0;
  CHECK(n < 2000);
  CHECK(saw_probes);
}

/* relu(-x) over x [s, 16]: one FUSED op with one map (slot, offset, strides, box). */
static int dyn_one_map(kiln_builder *b, kiln_dtype dt, int64_t max) {
  kiln_error err = {KILN_OK, ""};
  if (kiln_builder_add_symbol(b, "seq", 1, max, &err) != 1) return 0;
  int32_t x = dg_in(b, "x", dt, 2, DG(max, 16), (kiln_sym_size[]){DG_S, DG_NO});
  return dg_out(b, dg_unary(b, KILN_OP_RELU, dg_unary(b, KILN_OP_NEG, x)), "y");
}

/* One execute of x's blob `blob` at sequence n on e; its status, err the message. */
static kiln_status run_dyn_at(kiln_engine *e, const built *x, int64_t n, kiln_error *err) {
  kiln_tensor_view iv[MAX_INS], ov[MAX_OUTS];
  uint32_t n_out = 0, n_in = views_at(x, n, -1.0, 1.0, iv, ov, &n_out);
  kiln_status s = kiln_engine_execute(e, iv, n_in, ov, n_out, err);
  free_views(iv, n_in);
  free_views(ov, n_out);
  return s;
}

/* A dynamic program must read inside its inputs at every size, not only at the bounds: one that
 * does only at the upper bound is refused at load (the lower bounds are checked there), and one
 * that does at both bounds but not between is refused by the first call at such a size, each
 * shape checked once when a call first meets it; the engine stays usable. */
static void test_dynamic_group_refusals(void) {
  built x;
  kiln_error err = {KILN_OK, ""};
  if (!build_dyn(dyn_one_map, KILN_F32, 1, &x)) return;
  const kiln_op *f = find_op(&x, KILN_OP_FUSED, 0);
  CHECK(f && x.plan.n_ops == 1 && x.plan.words[f->iattr[0]] == 1);
  if (!f) {
    release(&x);
    return;
  }
  uint32_t at = (uint32_t)f->iattr[0]; /* map 0: slot, offset, 2 strides, 2 box starts, 2 ends */
  CHECK(x.plan.words[at + 4] == 16 && x.plan.words[at + 8] == DYN_MAX);
  /* rows read backwards from the last: inside at the bound, past the end of a shorter x */
  uint8_t *bad = with_word(&x, at + 4, -16);
  if (bad) set_word(bad, &x, at + 3, 16 * (DYN_MAX - 1));
  {
    kiln_engine_options opts;
    kiln_engine *e = NULL;
    kiln_engine_options_default(&opts);
    opts.device = KILN_DEVICE_CPU;
    CHECK(bad && kiln_engine_load(bad, x.size, &opts, &e, &err) == KILN_ERR_INVALID_PROGRAM);
    CHECK_STR(err.message,
              "plan op 0 (fused): map 0 reaches elements 176..191 of input 0, which has 16 at "
              "these dynamic sizes; re-export the program");
    kiln_engine_destroy(e);
  }
  free(bad);
  /* every other row of the first six: inside x at sizes 1, 11 and 12, past its end between */
  bad = with_word(&x, at + 4, 32);
  if (bad) set_word(bad, &x, at + 8, 6);
  kiln_engine *e = bad ? load_cpu(bad, x.size) : NULL;
  if (e) {
    CHECK(run_dyn_at(e, &x, 1, &err) == KILN_OK && run_dyn_at(e, &x, DYN_MAX, &err) == KILN_OK);
    CHECK(run_dyn_at(e, &x, 2, &err) == KILN_ERR_INVALID_PROGRAM);
    CHECK_STR(err.message,
              "plan op 0 (fused): map 0 reaches elements 0..47 of input 0, which has 32 at these "
              "dynamic sizes; re-export the program");
    CHECK(run_dyn_at(e, &x, 10, &err) == KILN_ERR_INVALID_PROGRAM);
    CHECK(run_dyn_at(e, &x, 11, &err) == KILN_OK && run_dyn_at(e, &x, 1, &err) == KILN_OK);
    kiln_engine_destroy(e);
  }
  free(bad);
  release(&x);
}

/* ---------------------------------------------------------------- sibling linears */

/* Attention's projections of one input x, 16 wide: q (3 heads of 4) times 0.5, k (2 heads of 4)
 * negated, v (2 heads of 4) as is, each split into heads by reshape and permute (0, 2, 1, 3). x
 * is [1,1,16] (a decode step), [2,3,16] for the PREFILL variants, [1,s,16] (s in 1..4) for
 * DYNAMIC, [2,s,16] for DYNAMIC_BATCH, and the last row of [1,s,16] for LAST_TOKEN. The
 * variants after DYNAMIC each
 * keep a linear apart: q adds a residual, k reads another input, only q has a bias, only q has
 * a GELU, k's weight or v's bias is an input rather than a constant, v's output is an output
 * binding, or (prefill, where a slice is no view) v's output is read by a GEMM, flattened by a
 * reshape that a group's index map cannot take, read twice, or split into heads as an output:
 * each would need a copy of its own; so would DYNAMIC_BATCH's, as a group whose loads stride
 * over s (the batch's stride is s*28) is not kept in a dynamic plan.
 * (The builder refuses a weight whose dtype is not its input's: test_sibling_dtypes.) */
enum {
  QKV_DECODE, QKV_BIAS, QKV_GELU, QKV_PREFILL, QKV_PREFILL_BIAS, QKV_LAST_TOKEN, QKV_DYNAMIC,
  QKV_RESIDUAL_Q, QKV_OTHER_INPUT_K, QKV_BIAS_Q, QKV_GELU_Q, QKV_K_WEIGHT_IN, QKV_V_BIAS_IN,
  QKV_V_OUT, QKV_GEMM_READS_V, QKV_FLAT_V, QKV_V_TWICE, QKV_V_HEADS_OUT, QKV_DYNAMIC_BATCH,
  QKV_VARIANTS
};

static int qkv_prefill(int variant) {
  return variant == QKV_PREFILL || variant == QKV_PREFILL_BIAS || variant == QKV_GEMM_READS_V ||
         variant == QKV_FLAT_V || variant == QKV_V_TWICE || variant == QKV_V_HEADS_OUT;
}

/* t [b, s, h*4] as [b, h, s, 4]; the reshape's s follows symbol 1 when `dynamic`. */
static int32_t heads(kiln_builder *b, int32_t t, int64_t batch, int64_t seq, int64_t h,
                     int dynamic) {
  kiln_error err = {KILN_OK, ""};
  kiln_sym_size none = {0, 0, 0}, s = {dynamic ? 1u : 0u, 1, 0};
  int32_t r = kiln_builder_add_op_sym(b, KILN_OP_RESHAPE, &t, 1, D(batch, seq, h, 4),
                                      (kiln_sym_size[]){none, s, none, none}, 4, NULL, 0, &err);
  if (r < 0) fprintf(stderr, "add_op: %s\n", err.message);
  CHECK(r >= 0);
  return op_n(b, KILN_OP_PERMUTE, T(r), 1, D(0, 2, 1, 3), 4);
}

/* LINEAR(x, w [n,16], bias [n] when `bias`); `given` 1: w is an input, 2: the bias is. */
static int32_t projection(kiln_builder *b, kiln_dtype dt, int32_t x, int64_t n, int bias,
                          uint32_t seed, int given) {
  int32_t w = given == 1 ? in(b, "w", dt, 2, D(n, 16)) : constant(b, dt, 2, D(n, 16), seed);
  if (!bias) return op(b, KILN_OP_LINEAR, T(x, w), 2, 0, 0, NULL, 0);
  int32_t c = given == 2 ? in(b, "bias", dt, 1, D(n)) : constant(b, dt, 1, D(n), seed + 1);
  return op(b, KILN_OP_LINEAR, T(x, w, c), 3, 0, 0, NULL, 0);
}

static void qkv(kiln_builder *b, kiln_dtype dt, int variant) {
  kiln_error err = {KILN_OK, ""};
  int prefill = qkv_prefill(variant);
  int rows = variant == QKV_DYNAMIC || variant == QKV_DYNAMIC_BATCH; /* s follows the symbol */
  int dynamic = rows || variant == QKV_LAST_TOKEN;
  int all_bias = variant == QKV_BIAS || variant == QKV_PREFILL_BIAS || variant == QKV_V_BIAS_IN;
  int64_t batch = prefill || variant == QKV_DYNAMIC_BATCH ? 2 : 1;
  int64_t seq = prefill ? 3 : rows ? 4 : 1;
  int32_t x, q, k, v;
  if (dynamic) {
    kiln_sym_size none = {0, 0, 0}, s = {1, 1, 0}, last = {1, 1, -1};
    CHECK(kiln_builder_add_symbol(b, "s", 1, 4, &err) == 1);
    x = kiln_builder_add_input_sym(b, "x", dt, 3, D(batch, 4, 16),
                                   (kiln_sym_size[]){none, s, none}, &err);
    if (variant == QKV_LAST_TOKEN)
      x = kiln_builder_add_op_sym(b, KILN_OP_SLICE, &x, 1, D(1, 3, 4, 1),
                                  (kiln_sym_size[]){none, last, s, none}, 4, NULL, 0, &err);
    CHECK(x >= 0);
  } else {
    x = in(b, "x", dt, 3, D(batch, seq, 16));
  }
  q = projection(b, dt, x, 12, all_bias || variant == QKV_BIAS_Q, 21, 0);
  k = projection(b, dt, variant == QKV_OTHER_INPUT_K ? in(b, "x2", dt, 3, D(1, 1, 16)) : x, 8,
                 all_bias, 23, variant == QKV_K_WEIGHT_IN);
  v = projection(b, dt, x, 8, all_bias, 25, variant == QKV_V_BIAS_IN ? 2 : 0);
  if (variant == QKV_GELU || variant == QKV_GELU_Q) q = op(b, KILN_OP_GELU, T(q), 1, 0, 1, NULL, 0);
  if (variant == QKV_GELU) {
    k = op(b, KILN_OP_GELU, T(k), 1, 0, 1, NULL, 0);
    v = op(b, KILN_OP_GELU, T(v), 1, 0, 1, NULL, 0);
  }
  if (variant == QKV_RESIDUAL_Q) q = binary(b, KILN_OP_ADD, q, in(b, "r", dt, 3, D(1, 1, 12)));
  q = heads(b, q, batch, seq, 3, rows);
  out(b, binary(b, KILN_OP_MUL, q, scalar(b, dt, 0.5f)), "q");
  out(b, unary(b, KILN_OP_NEG, heads(b, k, batch, seq, 2, rows)), "k");
  if (variant == QKV_GEMM_READS_V)
    out(b, op(b, KILN_OP_LINEAR, T(v, constant(b, dt, 2, D(4, 8), 27)), 2, 0, 0, NULL, 0), "o");
  else if (variant == QKV_V_OUT)
    out(b, v, "v");
  else if (variant == QKV_V_HEADS_OUT)
    out(b, op_n(b, KILN_OP_RESHAPE, T(v), 1, D(batch, seq, 2, 4), 4), "v");
  else if (variant == QKV_FLAT_V)
    out(b, unary(b, KILN_OP_NEG, op_n(b, KILN_OP_RESHAPE, T(v), 1, D(batch * seq, 8), 2)), "v");
  else
    out(b, heads(b, v, batch, seq, 2, rows), "v");
  if (variant == QKV_V_TWICE) out(b, unary(b, KILN_OP_NEG, v), "vn");
}

static void g_qkv_decode(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_DECODE); }
static void g_qkv_bias(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_BIAS); }
static void g_qkv_gelu(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_GELU); }
static void g_qkv_prefill(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_PREFILL); }
static void g_qkv_prefill_bias(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_PREFILL_BIAS); }
static void g_qkv_last_token(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_LAST_TOKEN); }
static void g_qkv_residual_q(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_RESIDUAL_Q); }
static void g_qkv_other_input_k(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_OTHER_INPUT_K); }
static void g_qkv_bias_q(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_BIAS_Q); }
static void g_qkv_gelu_q(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_GELU_Q); }
static void g_qkv_k_weight_in(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_K_WEIGHT_IN); }
static void g_qkv_v_bias_in(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_V_BIAS_IN); }
static void g_qkv_v_out(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_V_OUT); }
static void g_qkv_flat_v(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_FLAT_V); }
static void g_qkv_v_twice(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_V_TWICE); }
static void g_qkv_gemm_reads_v(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_GEMM_READS_V); }
static void g_qkv_v_heads_out(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_V_HEADS_OUT); }
static void g_qkv_dynamic(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_DYNAMIC); }
static void g_qkv_dynamic_batch(kiln_builder *b, kiln_dtype dt) { qkv(b, dt, QKV_DYNAMIC_BATCH); }

static const graph_fn qkv_graphs[QKV_VARIANTS] = {
    g_qkv_decode,      g_qkv_bias,         g_qkv_gelu,          g_qkv_prefill,
    g_qkv_prefill_bias, g_qkv_last_token,  g_qkv_dynamic,       g_qkv_residual_q,
    g_qkv_other_input_k, g_qkv_bias_q,     g_qkv_gelu_q,        g_qkv_k_weight_in,
    g_qkv_v_bias_in,   g_qkv_v_out,        g_qkv_gemm_reads_v,  g_qkv_flat_v,
    g_qkv_v_twice,     g_qkv_v_heads_out,  g_qkv_dynamic_batch};

/* The weight rows of the projections' GEMMs (the LINEARs of K 16) in plan order, at most 4;
 * returns how many there are. */
static uint32_t projection_rows(const built *x, int64_t *rows) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < x->plan.n_ops; i++) {
    const kiln_op *p = plan_op(x, i);
    if (p->kind == KILN_OP_LINEAR && x->plan.tensors[p->inputs[1]].dims[1] == 16 && n < 4)
      rows[n++] = x->plan.tensors[p->inputs[1]].dims[0];
  }
  return n;
}

/* 1 when every SLICE of a GEMM's output lies in the GEMM output's bytes, moving none. */
static int slices_are_views(const built *x) {
  for (uint32_t i = 0; i < x->plan.n_ops; i++) {
    const kiln_op *p = plan_op(x, i);
    const kiln_tensor_desc *from = &x->plan.tensors[p->inputs[0]];
    const kiln_tensor_desc *to = &x->plan.tensors[p->output];
    int of_gemm = 0;
    for (uint32_t j = 0; j < i; j++)
      of_gemm |= plan_op(x, j)->kind == KILN_OP_LINEAR && plan_op(x, j)->output == p->inputs[0];
    if (p->kind == KILN_OP_SLICE && of_gemm &&
        (from->storage != KILN_STORE_ARENA || to->storage != KILN_STORE_ARENA ||
         to->offset != from->offset + (uint64_t)p->iattr[1] * kiln_dtype_size(to->dtype)))
      return 0;
  }
  return 1;
}

/* Two gated MLPs of one row x: two SwiGLU GEMMs (each weight gate over up), which stay apart. */
static void g_two_swiglu(kiln_builder *b, kiln_dtype dt) {
  int32_t x = in(b, "x", dt, 3, D(1, 1, 16));
  for (uint32_t k = 0; k < 2; k++) {
    int32_t wg = constant(b, dt, 2, D(12, 16), 31 + k), wu = constant(b, dt, 2, D(12, 16), 33 + k);
    int32_t gate = op(b, KILN_OP_LINEAR, T(x, wg), 2, 0, 0, NULL, 0);
    int32_t up = op(b, KILN_OP_LINEAR, T(x, wu), 2, 0, 0, NULL, 0);
    int32_t h = binary(b, KILN_OP_MUL, unary(b, KILN_OP_SILU, gate), up);
    out(b, op(b, KILN_OP_LINEAR, T(h, constant(b, dt, 2, D(16, 12), 35 + k)), 2, 0, 0, NULL, 0),
        k ? "y1" : "y0");
  }
}

/* Activations written out after linears (each with a weight of its own): GPT-2's tanh GELU
 * after a flattening reshape ("a"), erf GELU ("b"), x * sigmoid(x) ("c"); quick GELU,
 * x * sigmoid(1.702 x), which is none of them ("d"); x * sigmoid(x) whose sigmoid is read
 * outside too ("e", "e_sig"); and an erf GELU op after a flattening reshape ("f"). */
static void g_activations(kiln_builder *b, kiln_dtype dt) {
  kiln_error err = {KILN_OK, ""};
  int32_t w[6];
  for (uint32_t k = 0; k < 6; k++) w[k] = constant(b, dt, 2, D(4, 6), 11 + k);
  int32_t x = in(b, "x", dt, 3, D(1, 3, 6));
  int32_t flat = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(x), 1, D(3, 6), 2, NULL, 0, &err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(binary(b, KILN_OP_LINEAR, flat, w[0])),
                                  1, D(1, 3, 4), 3, NULL, 0, &err);
  int32_t cube = op(b, KILN_OP_POW, T(y), 1, 0, 0, (const double[]){3.0}, 1);
  int32_t inner = binary(b, KILN_OP_ADD, y, binary(b, KILN_OP_MUL, cube, scalar(b, dt, 0.044715f)));
  int32_t t = unary(b, KILN_OP_TANH, binary(b, KILN_OP_MUL, inner, scalar(b, dt, 0.7978845608f)));
  int32_t half = binary(b, KILN_OP_MUL, y, scalar(b, dt, 0.5f));
  out(b, binary(b, KILN_OP_MUL, half, binary(b, KILN_OP_ADD, t, scalar(b, dt, 1.0f))), "a");
  int32_t v = binary(b, KILN_OP_LINEAR, x, w[1]);
  int32_t e = unary(b, KILN_OP_ERF, binary(b, KILN_OP_MUL, v, scalar(b, dt, 0.70710678f)));
  out(b, binary(b, KILN_OP_MUL, binary(b, KILN_OP_MUL, v, scalar(b, dt, 0.5f)),
                binary(b, KILN_OP_ADD, e, scalar(b, dt, 1.0f))),
      "b");
  int32_t s = binary(b, KILN_OP_LINEAR, x, w[2]);
  out(b, binary(b, KILN_OP_MUL, s, unary(b, KILN_OP_SIGMOID, s)), "c");
  int32_t q = binary(b, KILN_OP_LINEAR, x, w[3]);
  int32_t qs = unary(b, KILN_OP_SIGMOID, binary(b, KILN_OP_MUL, q, scalar(b, dt, 1.702f)));
  out(b, binary(b, KILN_OP_MUL, q, qs), "d");
  int32_t o = binary(b, KILN_OP_LINEAR, x, w[4]), os = unary(b, KILN_OP_SIGMOID, o);
  out(b, binary(b, KILN_OP_MUL, o, os), "e");
  out(b, os, "e_sig");
  int32_t flat2 = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(x), 1, D(3, 6), 2, NULL, 0, &err);
  int32_t f = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(binary(b, KILN_OP_LINEAR, flat2, w[5])),
                                  1, D(1, 3, 4), 3, NULL, 0, &err);
  out(b, op(b, KILN_OP_GELU, T(f), 1, 0, 1, NULL, 0), "f");
}

/* Written-out activations become the op they compute, and the GELUs go into their linears'
 * epilogues, across the reshape that unflattens the linear's rows (which moves to the linear's
 * input, where it folds into the flattening one); quick GELU and a region read midway stay
 * ops. */
static void test_activations_recognized(void) {
  static const kiln_dtype dts[3] = {KILN_F32, KILN_F16, KILN_BF16};
  for (int k = 0; k < 3; k++) {
    built x;
    if (build(g_activations, dts[k], 1, &x)) {
      uint32_t tanh_gelu = 0, erf_gelu = 0, plain = 0;
      for (uint32_t i = 0; i < x.plan.n_ops; i++) {
        const kiln_op *o = plan_op(&x, i);
        if (o->kind != KILN_OP_LINEAR) continue;
        tanh_gelu += o->iattr[0] == KILN_ACT_GELU_TANH && o->output == x.plan.outputs[0];
        erf_gelu += o->iattr[0] == KILN_ACT_GELU_ERF &&
                    (o->output == x.plan.outputs[1] || o->output == x.plan.outputs[6]);
        plain += o->iattr[0] == KILN_ACT_NONE;
      }
      CHECK(tanh_gelu == 1 && erf_gelu == 2 && plain == 3);
      /* x * sigmoid(x) is one SiLU op; quick GELU one pointwise chain, "e" its sigmoid and mul;
       * no reshape left, six linears */
      CHECK(count_ops(&x, KILN_OP_SILU) == 1 && count_ops(&x, KILN_OP_SIGMOID) == 1);
      CHECK(count_ops(&x, KILN_OP_RESHAPE) == 0 && count_ops(&x, KILN_OP_GELU) == 0);
      CHECK(count_ops(&x, KILN_OP_POINTWISE) == 1 && x.plan.n_ops == 10);
    }
    release(&x);
    check_close_to_unfused(g_activations, dts[k], -3.0, 3.0);
  }
}

/* q, k and v as three linears of one input, BERT's way, each split into heads for the SDPA and
 * merged back after. */
static void g_linears_mha(kiln_builder *b, kiln_dtype dt) {
  kiln_error err = {KILN_OK, ""};
  int32_t x = in(b, "x", dt, 3, D(2, 5, 128)), part[3];
  for (uint32_t k = 0; k < 3; k++) {
    int32_t p = binary(b, KILN_OP_LINEAR, x, constant(b, dt, 2, D(128, 128), 5 + k));
    int32_t h = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(p), 1, D(2, 5, 2, 64), 4, NULL, 0, &err);
    part[k] = kiln_builder_add_op(b, KILN_OP_PERMUTE, T(h), 1, D(0, 2, 1, 3), 4, NULL, 0, &err);
  }
  int32_t a = kiln_builder_add_op(b, KILN_OP_SDPA, T(part[0], part[1], part[2]), 3, D(0, 0), 2,
                                  NULL, 0, &err);
  int32_t back = kiln_builder_add_op(b, KILN_OP_PERMUTE, T(a), 1, D(0, 2, 1, 3), 4, NULL, 0, &err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(back), 1, D(2, 5, 128), 3, NULL, 0, &err);
  CHECK(y >= 0);
  out(b, y, "y");
}

/* Three linears of one input as q, k and v: joined into one GEMM, whose [B,L,3*H*E] result
 * the SDPA then reads as packed heads (no head split or merge left). */
static void test_joined_linears_pack_heads(void) {
  for (int t = 1; t < 3; t++) {
    kiln_dtype dt = t == 1 ? KILN_F16 : KILN_BF16;
    built x;
    if (build(g_linears_mha, dt, 1, &x)) {
      const kiln_op *a = find_op(&x, KILN_OP_SDPA, 0), *l = find_op(&x, KILN_OP_LINEAR, 0);
      CHECK(a && a->n_inputs == 1 && a->n_iattr == 3 && a->iattr[2] == 1);
      CHECK(l && count_ops(&x, KILN_OP_LINEAR) == 1 && x.plan.tensors[l->inputs[1]].dims[0] == 384);
      CHECK(count_ops(&x, KILN_OP_FUSED) == 0 && count_ops(&x, KILN_OP_PERMUTE) == 0 &&
            count_ops(&x, KILN_OP_SLICE) == 0);
    }
    release(&x);
    check_same_as_unfused(g_linears_mha, dt, -2.0, 2.0);
  }
}

static void test_sibling_linears_join(void) {
  /* per variant: the projections' GEMMs and their weight rows, in plan order */
  static const struct {
    uint32_t n;
    int64_t rows[3];
  } want[QKV_VARIANTS] = {
      {1, {28}}, {1, {28}}, {1, {28}}, {1, {28}}, {1, {28}}, {1, {28}}, {1, {28}},
      {2, {16, 12}}, {2, {20, 8}}, {2, {12, 16}}, {2, {12, 16}}, {2, {20, 8}}, {2, {20, 8}},
      {2, {20, 8}},  {2, {20, 8}}, {2, {20, 8}},  {2, {20, 8}},  {2, {20, 8}},  {3, {12, 8, 8}}};
  static const kiln_dtype dts[3] = {KILN_F32, KILN_F16, KILN_BF16};
  built x;
  if (build(g_two_swiglu, KILN_F32, 1, &x)) {
    const kiln_op *a = find_op(&x, KILN_OP_LINEAR, 0), *c = find_op(&x, KILN_OP_LINEAR, 2);
    CHECK(a && c && a->iattr[0] == KILN_ACT_SWIGLU && c->iattr[0] == KILN_ACT_SWIGLU);
    CHECK(count_kind(&x, KILN_OP_LINEAR) == 4 && count_kind(&x, KILN_OP_SLICE) == 0);
  }
  release(&x);
  check_same_as_unfused(g_two_swiglu, KILN_F32, -2.0, 2.0); /* SwiGLU rounds as its ops in f32 */
  for (int c = 0; c < QKV_VARIANTS; c++) {
    int64_t rows[4] = {0};
    if (build(qkv_graphs[c], KILN_F32, 1, &x)) {
      uint32_t n = projection_rows(&x, rows);
      int same = n == want[c].n;
      for (uint32_t k = 0; same && k < n; k++) same = rows[k] == want[c].rows[k];
      if (!same) fprintf(stderr, "qkv variant %d: %u GEMMs, rows %lld %lld %lld\n", c, n,
                         (long long)rows[0], (long long)rows[1], (long long)rows[2]);
      CHECK(same);
      /* the joined GEMM's slices cost nothing: views in a decode step, taken into the head
       * split groups in a prefill (no SLICE left) */
      CHECK(slices_are_views(&x));
      if (qkv_prefill(c) || c == QKV_DYNAMIC) CHECK(count_kind(&x, KILN_OP_SLICE) == 0);
      if (c == QKV_BIAS || c == QKV_PREFILL_BIAS) {
        const kiln_op *g = find_op(&x, KILN_OP_LINEAR, 0);
        CHECK(g && g->n_inputs == 3 && x.plan.tensors[g->inputs[2]].dims[0] == 28);
      }
      if (c == QKV_GELU) CHECK(find_op(&x, KILN_OP_LINEAR, 0)->iattr[0] == KILN_ACT_GELU_ERF);
      if (c == QKV_RESIDUAL_Q) {
        const kiln_op *r = find_op(&x, KILN_OP_LINEAR, 1);
        CHECK(r && kiln_linear_has_residual(r));
      }
    }
    release(&x);
    /* each output element is the dot product it was: the unjoined plan's bytes (a GELU or
     * residual epilogue rounds once where the unfused ops round twice: f16 and bf16 close) */
    for (int k = 0; k < 3; k++) {
      if (k > 0 && (c == QKV_GELU || c == QKV_GELU_Q || c == QKV_RESIDUAL_Q))
        check_close_to_unfused(qkv_graphs[c], dts[k], -2.0, 2.0);
      else
        check_same_as_unfused(qkv_graphs[c], dts[k], -2.0, 2.0);
    }
  }
}

/* Dynamic plans: the last row's projections join (one row: views), so do the rows of one
 * sequence (groups read the columns), two sequences' stay apart; every size runs as the unjoined
 * plan does. */
static void test_sibling_linears_dynamic(void) {
  static const graph_fn graphs[3] = {g_qkv_last_token, g_qkv_dynamic, g_qkv_dynamic_batch};
  for (int g = 0; g < 3; g++) {
    built joined, plain;
    memset(&plain, 0, sizeof plain);
    if (build(graphs[g], KILN_F32, 1, &joined) && build(graphs[g], KILN_F32, 0, &plain)) {
      CHECK(joined.plan.n_symbols == 1 && count_kind(&joined, KILN_OP_LINEAR) == (g == 2 ? 3u : 1u));
      for (int64_t n = 1; n <= 4; n++) {
        void *a[MAX_OUTS], *b[MAX_OUTS];
        uint32_t na = run_cpu_at(&joined, -2.0, 2.0, a, n);
        uint32_t nb = run_cpu_at(&plain, -2.0, 2.0, b, n);
        CHECK(na == 3 && nb == 3);
        for (uint32_t k = 0; k < na && k < nb; k++) {
          const kiln_tensor_desc *t = &plain.plan.tensors[plain.plan.outputs[k]];
          CHECK(memcmp(a[k], b[k], (size_t)t->nbytes) == 0);
        }
        free_outs(a, na);
        free_outs(b, nb);
      }
    }
    release(&joined);
    release(&plain);
  }
}

/* Every allocation of a build that joins q, k and v failing in turn: each build succeeds or
 * says out of memory, and each of the pass's own failure points is reached once at least. */
static void test_sibling_linears_oom(void) {
  static const char *const points[4] = {
      "while fusing sibling linears", "joining 3 sibling linears' weights",
      "ops while joining sibling linears", "inserting 4 ops while joining sibling linears"};
  int seen[4] = {0}, n;
  for (n = 1; n < 2000; n++) {
    kiln_builder *b = kiln_builder_create();
    kiln_error err = {KILN_OK, ""};
    void *blob = NULL;
    size_t size = 0;
    kiln_status s;
    if (!b) break;
    g_qkv_decode(b, KILN_F32);
    kiln_test_fail_allocations = n;
    s = kiln_builder_build(b, NULL, &blob, &size, &err);
    kiln_builder_destroy(b);
    kiln_free(blob);
    if (kiln_test_fail_allocations > 0) { /* the n-th allocation never came */
      CHECK(s == KILN_OK);
      break;
    }
    CHECK(s == KILN_OK || s == KILN_ERR_OUT_OF_MEMORY);
    for (int k = 0; k < 4; k++) seen[k] |= s != KILN_OK && strstr(err.message, points[k]) != NULL;
  }
  kiln_test_fail_allocations = 0;
  CHECK(n < 2000);
  for (int k = 0; k < 4; k++) {
    if (!seen[k]) fprintf(stderr, "never failed at: %s\n", points[k]);
    CHECK(seen[k]);
  }
}

/* A graph tensor's desc of dtype dt and shape dims, its bytes counted. */
static kiln_tensor_desc graph_desc(kiln_dtype dt, int32_t rank, const int64_t *dims) {
  kiln_tensor_desc d;
  memset(&d, 0, sizeof d);
  d.dtype = dt;
  d.rank = rank;
  d.nbytes = kiln_dtype_size(dt);
  for (int32_t i = 0; i < rank; i++) d.dims[i] = dims[i], d.nbytes *= (uint64_t)dims[i];
  return d;
}

/* On the pass itself, past the builder's checks: two linears of x [1,16] with biases, read by
 * NEGs, join when their weights and biases share a dtype and stay apart when the weights'
 * (variant 1) or the biases' (variant 2) dtypes differ. Joined, the slices write the old
 * outputs right after the joined GEMM, each tensor naming the op that now writes it. */
static void test_sibling_dtypes(void) {
  static const uint8_t zeros[16 * 16 * 4];
  for (int variant = 0; variant < 3; variant++) {
    kiln_graph g;
    kiln_error err = {KILN_OK, ""};
    kiln_tensor_desc xd = graph_desc(KILN_F16, 2, D(1, 16));
    int32_t x, lin[2];
    uint32_t live = 0;
    memset(&g, 0, sizeof g);
    x = kiln_graph_add_tensor(&g, KILN_NODE_INPUT, &xd);
    g.inputs[g.n_inputs++].tensor = x;
    for (int k = 0; k < 2; k++) {
      kiln_tensor_desc wd = graph_desc(variant == 1 && k ? KILN_F32 : KILN_F16, 2, D(8, 16));
      kiln_tensor_desc bd = graph_desc(variant == 2 && k ? KILN_F32 : KILN_F16, 1, D(8));
      kiln_tensor_desc yd = graph_desc(KILN_F16, 2, D(1, 8));
      int32_t w = kiln_graph_add_tensor(&g, KILN_NODE_CONSTANT, &wd);
      int32_t bias = kiln_graph_add_tensor(&g, KILN_NODE_CONSTANT, &bd);
      kiln_op o;
      memset(&o, 0, sizeof o);
      CHECK(w >= 0 && bias >= 0);
      g.tensors[w].data = g.tensors[bias].data = zeros;
      o.kind = KILN_OP_LINEAR;
      o.n_inputs = 3;
      o.inputs[0] = (uint32_t)x, o.inputs[1] = (uint32_t)w, o.inputs[2] = (uint32_t)bias;
      lin[k] = kiln_graph_add_op(&g, &o, &yd);
      CHECK(lin[k] >= 0);
    }
    for (int k = 0; k < 2; k++) {
      kiln_tensor_desc yd = graph_desc(KILN_F16, 2, D(1, 8));
      kiln_op o;
      memset(&o, 0, sizeof o);
      o.kind = KILN_OP_NEG;
      o.n_inputs = 1;
      o.inputs[0] = g.ops[lin[k]].output;
      int32_t neg = kiln_graph_add_op(&g, &o, &yd);
      CHECK(neg >= 0);
      g.outputs[g.n_outputs++].tensor = (int32_t)g.ops[neg].output;
    }
    CHECK(kiln_merge_linears(&g, 0, &err) == KILN_OK);
    for (uint32_t i = 0; i < g.n_ops; i++) live += !g.dead[i] && g.ops[i].kind == KILN_OP_LINEAR;
    CHECK(live == (variant == 0 ? 1u : 2u));
    if (variant == 0) {
      CHECK(g.n_ops == 7 && !g.dead[0] && g.ops[0].kind == KILN_OP_LINEAR);
      CHECK(g.tensors[g.ops[0].inputs[1]].desc.dims[0] == 16 &&
            g.tensors[g.ops[0].inputs[2]].desc.dims[0] == 16);
      for (uint32_t k = 1; k < 3; k++) {
        CHECK(g.ops[k].kind == KILN_OP_SLICE && g.ops[k].inputs[0] == g.ops[0].output);
        CHECK(g.tensors[g.ops[k].output].producer == (int32_t)k);
        CHECK(g.ops[k].iattr[1] == 8 * (int64_t)(k - 1) && g.ops[k].iattr[2] == 8 * (int64_t)k);
      }
      CHECK(g.tensors[g.ops[0].output].producer == 0 && g.dead[3] && g.dead[4]);
      CHECK(g.tensors[g.ops[5].output].producer == 5 && g.tensors[g.ops[6].output].producer == 6);
    }
    kiln_graph_release(&g);
  }
}

int main(void) {
  test_chain_fuses();
  test_chain_boundaries();
  test_f16();
  test_fuse_off_and_oom();
  test_plan_refusals();
  test_cpu_init_refusals();
  test_norm_fuses();
  test_norm_refusals();
  test_residual_fuses();
  test_common_ops_merge();
  test_copies_drop();
  test_views();
  test_packed_attention();
  test_heads_last_attention();
  test_sliced_attention();
  test_outer_product();
  test_residual_through_reshape();
  test_activations_recognized();
  test_joined_linears_pack_heads();
  test_grouped_kv();
  test_constant_masks();
  test_identity_ops();
  test_int_identities();
  test_swiglu();
  test_groups_fuse();
  test_group_refusals();
  test_one_store();
  test_dynamic_groups_fuse();
  test_dynamic_groups_that_move();
  test_dynamic_group_refusals();
  test_dynamic_fuse_oom();
  test_sibling_linears_join();
  test_sibling_linears_dynamic();
  test_sibling_dtypes();
  test_sibling_linears_oom();
  return check_report("test_fusion");
}
