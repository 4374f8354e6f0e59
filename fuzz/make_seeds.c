/* Writes valid blobs from the current builder into a directory, so the fuzzers start from
 * plans in today's format: make_seeds DIR. */
#include "kiln/kiln.h"

#include <stdio.h>

/* 1 when blob's plan holds an op of kind. */
static int holds(const void *blob, size_t size, kiln_op_kind kind, kiln_error *err) {
  kiln_blob_view view;
  kiln_plan plan;
  int found = 0;
  if (kiln_blob_parse(blob, size, &view, err) != KILN_OK ||
      kiln_plan_parse(view.plan, view.plan_size, view.weights_size, &plan, err) != KILN_OK)
    return 0;
  for (uint32_t i = 0; i < plan.n_ops; i++) found |= plan.ops[i].kind == kind;
  kiln_plan_release(&plan);
  return found;
}

/* Builds b and writes its blob to dir/name; with `needs` (not KILN_OP_COUNT), the plan must
 * hold an op of that kind, or the seed no longer reaches what it is for. */
static int save_holding(const char *dir, const char *name, kiln_builder *b, kiln_op_kind needs,
                        kiln_error *err) {
  kiln_build_options opts;
  kiln_build_options_default(&opts);
  void *blob = NULL;
  size_t size = 0;
  if (kiln_builder_build(b, &opts, &blob, &size, err) != KILN_OK) return -1;
  if (needs != KILN_OP_COUNT && !holds(blob, size, needs, err)) {
    snprintf(err->message, sizeof err->message, "%.64s: the plan holds no %.16s op", name,
             kiln_op_name(needs));
    kiln_free(blob);
    return -1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(blob, 1, size, f) == size;
  if (f && fclose(f) != 0) ok = 0;
  kiln_free(blob);
  if (!ok) snprintf(err->message, sizeof err->message, "cannot write %.200s", path);
  return ok ? 0 : -1;
}

static int save(const char *dir, const char *name, kiln_builder *b, kiln_error *err) {
  return save_holding(dir, name, b, KILN_OP_COUNT, err);
}

/* x[2,4] -> linear(w[8,4], bias[8]) + relu -> softmax -> two outputs. */
static int linear_seed(const char *dir, kiln_error *err) {
  kiln_builder *b = kiln_builder_create();
  if (!b) return -1;
  int64_t xd[2] = {2, 4}, wd[2] = {8, 4}, bd[1] = {8}, relu[1] = {KILN_ACT_RELU}, dim[1] = {1};
  float w[32] = {0.5f, -1.0f, 2.0f}, bias[8] = {1.0f};
  int32_t in[3];
  in[0] = kiln_builder_add_input(b, "x", KILN_F32, 2, xd, err);
  in[1] = kiln_builder_add_constant(b, KILN_F32, 2, wd, w, sizeof w, err);
  in[2] = kiln_builder_add_constant(b, KILN_F32, 1, bd, bias, sizeof bias, err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_LINEAR, in, 3, relu, 1, NULL, 0, err);
  int32_t s = kiln_builder_add_op(b, KILN_OP_SOFTMAX, &y, 1, dim, 1, NULL, 0, err);
  int rc = y < 0 || s < 0 || kiln_builder_mark_output(b, s, "probs", err) != KILN_OK ||
                   kiln_builder_mark_output(b, y, "hidden", err) != KILN_OK ||
                   save(dir, "linear.blob", b, err) != 0
               ? -1
               : 0;
  kiln_builder_destroy(b);
  return rc;
}

/* a[2,3] + b[3] broadcast, then matmul with c[3,2] and a cast to f16. */
static int elementwise_seed(const char *dir, kiln_error *err) {
  kiln_builder *b = kiln_builder_create();
  if (!b) return -1;
  int64_t ad[2] = {2, 3}, bd[1] = {3}, cd[2] = {3, 2}, to_f16[1] = {KILN_F16};
  double alpha[1] = {1.0};
  float c[6] = {1, 2, 3, 4, 5, 6};
  int32_t t[2], m[2];
  t[0] = kiln_builder_add_input(b, "a", KILN_F32, 2, ad, err);
  t[1] = kiln_builder_add_input(b, "b", KILN_F32, 1, bd, err);
  m[0] = kiln_builder_add_op(b, KILN_OP_ADD, t, 2, NULL, 0, alpha, 1, err);
  m[1] = kiln_builder_add_constant(b, KILN_F32, 2, cd, c, sizeof c, err);
  int32_t mm = kiln_builder_add_op(b, KILN_OP_MATMUL, m, 2, NULL, 0, NULL, 0, err);
  int32_t h = kiln_builder_add_op(b, KILN_OP_CAST, &mm, 1, to_f16, 1, NULL, 0, err);
  int rc = h < 0 || kiln_builder_mark_output(b, h, "out", err) != KILN_OK ||
                   save(dir, "elementwise.blob", b, err) != 0
               ? -1
               : 0;
  kiln_builder_destroy(b);
  return rc;
}

/* One op of each family the executing fuzzer should start from: norms, attention, gathers,
 * layout, reductions, selection, comparisons, boolean ops, min/max and casts, over x[2,4],
 * ids[3] (i64) and keep[2,4] (bool). */
static int layers_seed(const char *dir, kiln_error *err) {
  kiln_builder *b = kiln_builder_create();
  if (!b) return -1;
  static const float table[16] = {1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3, -4, 0.5f, 0.25f, 2, 4};
  static const float gamma[4] = {1, 0.5f, 2, 1};
  int64_t xd[2] = {2, 4}, idd[1] = {3}, td[2] = {4, 4}, gd[1] = {4}, q4[4] = {1, 1, 2, 4};
  int64_t norm[2] = {1, 1}, perm[2] = {1, 0}, cat1[1] = {1}, slice[4] = {1, 1, 8, 2};
  int64_t sel[2] = {0, 1}, red[2] = {1, 0}, ex[2] = {2, 4}, gelu[1] = {1}, sdpa[2] = {1, 0};
  int64_t pick[1] = {1}, to_bf16[1] = {KILN_BF16}, dim0[1] = {0};
  double eps[1] = {1e-5};
  int32_t x = kiln_builder_add_input(b, "x", KILN_F32, 2, xd, err);
  int32_t ids = kiln_builder_add_input(b, "ids", KILN_I64, 1, idd, err);
  int32_t keep = kiln_builder_add_input(b, "keep", KILN_BOOL, 2, xd, err);
  int32_t tw = kiln_builder_add_constant(b, KILN_F32, 2, td, table, sizeof table, err);
  int32_t g = kiln_builder_add_constant(b, KILN_F32, 1, gd, gamma, sizeof gamma, err);
  int32_t n = kiln_builder_add_op(b, KILN_OP_RMS_NORM, (int32_t[]){x, g}, 2, norm, 2, eps, 1, err);
  int32_t h = kiln_builder_add_op(b, KILN_OP_GELU, &n, 1, gelu, 1, NULL, 0, err);
  int32_t q = kiln_builder_add_op(b, KILN_OP_RESHAPE, &h, 1, q4, 4, NULL, 0, err);
  int32_t a = kiln_builder_add_op(b, KILN_OP_SDPA, (int32_t[]){q, q, q}, 3, sdpa, 2, NULL, 0, err);
  int32_t e = kiln_builder_add_op(b, KILN_OP_EMBEDDING, (int32_t[]){tw, ids}, 2, NULL, 0, NULL, 0, err);
  int32_t t = kiln_builder_add_op(b, KILN_OP_PERMUTE, &e, 1, perm, 2, NULL, 0, err);
  int32_t c = kiln_builder_add_op(b, KILN_OP_CAT, (int32_t[]){x, h}, 2, cat1, 1, NULL, 0, err);
  int32_t sl = kiln_builder_add_op(b, KILN_OP_SLICE, &c, 1, slice, 4, NULL, 0, err);
  int32_t w = kiln_builder_add_op(b, KILN_OP_WHERE, (int32_t[]){keep, x, sl}, 3, NULL, 0, NULL, 0, err);
  int32_t s1 = kiln_builder_add_op(b, KILN_OP_SELECT, &w, 1, sel, 2, NULL, 0, err);
  int32_t m = kiln_builder_add_op(b, KILN_OP_AMAX, &w, 1, red, 2, NULL, 0, err);
  int32_t xp = kiln_builder_add_op(b, KILN_OP_EXPAND, &s1, 1, ex, 2, NULL, 0, err);
  int32_t ix = kiln_builder_add_op(b, KILN_OP_INDEX_SELECT, (int32_t[]){xp, ids}, 2, dim0, 1, NULL, 0, err);
  int32_t sm = kiln_builder_add_op(b, KILN_OP_LOG_SOFTMAX, &ix, 1, pick, 1, NULL, 0, err);
  int32_t cs = kiln_builder_add_op(b, KILN_OP_CAST, &sm, 1, to_bf16, 1, NULL, 0, err);
  int64_t le[1] = {KILN_CMP_LE}, xor_op[1] = {KILN_BOOL_XOR}, not_op[1] = {KILN_BOOL_NOT};
  int32_t cmp = kiln_builder_add_op(b, KILN_OP_COMPARE, (int32_t[]){x, sl}, 2, le, 1, NULL, 0, err);
  int32_t lg = kiln_builder_add_op(b, KILN_OP_LOGICAL, (int32_t[]){cmp, keep}, 2, xor_op, 1, NULL, 0, err);
  int32_t bw = kiln_builder_add_op(b, KILN_OP_BITWISE, &lg, 1, not_op, 1, NULL, 0, err);
  int32_t ab = kiln_builder_add_op(b, KILN_OP_ABS, &sl, 1, NULL, 0, NULL, 0, err);
  int32_t lo = kiln_builder_add_op(b, KILN_OP_LOG, &ab, 1, NULL, 0, NULL, 0, err);
  int32_t mx = kiln_builder_add_op(b, KILN_OP_MAXIMUM, (int32_t[]){lo, x}, 2, NULL, 0, NULL, 0, err);
  int32_t mn = kiln_builder_add_op(b, KILN_OP_MINIMUM, (int32_t[]){mx, h}, 2, NULL, 0, NULL, 0, err);
  int rc = a < 0 || t < 0 || m < 0 || cs < 0 || bw < 0 || mn < 0 ||
                   kiln_builder_mark_output(b, bw, "mask", err) != KILN_OK ||
                   kiln_builder_mark_output(b, mn, "clamped", err) != KILN_OK ||
                   kiln_builder_mark_output(b, a, "attn", err) != KILN_OK ||
                   kiln_builder_mark_output(b, t, "rows", err) != KILN_OK ||
                   kiln_builder_mark_output(b, m, "peak", err) != KILN_OK ||
                   kiln_builder_mark_output(b, cs, "probs", err) != KILN_OK ||
                   save(dir, "layers.blob", b, err) != 0
               ? -1
               : 0;
  kiln_builder_destroy(b);
  return rc;
}

/* The index, scan, grouped-attention, SwiGLU and vision kinds (one vision op channels_last), so
 * the executing fuzzer starts from valid plans of each. */
static int later_kinds_seed(const char *dir, kiln_error *err) {
  kiln_builder *b = kiln_builder_create();
  if (!b) return -1;
  static const float w[3 * 2 * 3 * 3] = {1, -1, 0.5f, 2, 0, 1, -0.5f, 1, 1, 0, 2, -1, 1, 1, 0.25f,
                                         -2, 1, 0, 1, 0.5f, -1, 0, 1, 2, 1, -1, 0, 0.5f, 1, -2,
                                         1, 0, 1, 2, -1, 0.5f, 1, 1, 0, -1, 2, 1, 0, 0.5f, 1,
                                         -1, 1, 0, 2, 1, -0.5f, 1, 0, 1};
  static const float stats[2] = {0.5f, 2.0f}, gate_up[8 * 4] = {1, 0, 0, 1, 0, 1, 1, 0,
                                                                 1, 1, 0, 0, 0, 0, 1, 1,
                                                                 0.5f, 1, -1, 0, 1, 0, 0.5f, 1,
                                                                 -1, 1, 1, 0, 0, 2, 0, 1};
  static const int64_t rows[2] = {1, 0}, cols[4] = {2, 0, 1, 1};
  int64_t img[4] = {1, 2, 6, 6}, wd[4] = {3, 2, 3, 3}, cd[1] = {2}, rd[2] = {2, 1}, gd[2] = {2, 2};
  int64_t md[2] = {2, 3}, q[4] = {1, 4, 3, 4}, kv[4] = {1, 2, 3, 4}, sw[2] = {8, 4}, xd[2] = {3, 4};
  int64_t conv[5] = {KILN_PAIR(1, 1), KILN_PAIR(1, 1), KILN_PAIR(1, 1), 1, 0}, bn[1] = {0};
  int64_t pool[5] = {KILN_PAIR(3, 3), KILN_PAIR(2, 2), KILN_PAIR(1, 1), KILN_PAIR(1, 1), 0};
  int64_t up[2] = {KILN_PAIR(6, 6), 0}, near[1] = {KILN_PAIR(6, 6)}, ad[1] = {KILN_PAIR(2, 2)};
  int64_t avg[6] = {KILN_PAIR(2, 2), KILN_PAIR(2, 2), KILN_PAIR(0, 0), 0, 1, 0};
  int64_t last[3] = {KILN_PAIR(12, 4), 1, 1}; /* bilinear, align_corners, channels_last */
  int64_t tr[6] = {KILN_PAIR(2, 2), KILN_PAIR(1, 1), KILN_PAIR(1, 1), 1, 0, KILN_PAIR(0, 0)};
  int64_t scan[2] = {1, KILN_I64}, dim1[1] = {1}, both[1] = {3}, arg[2] = {1, 0};
  int64_t sdpa[2] = {1, 0}, swiglu[1] = {KILN_ACT_SWIGLU};
  double eps[1] = {1e-5};
  int32_t x = kiln_builder_add_input(b, "image", KILN_F32, 4, img, err);
  int32_t keep = kiln_builder_add_input(b, "keep", KILN_BOOL, 2, md, err);
  int32_t m = kiln_builder_add_input(b, "m", KILN_F32, 2, md, err);
  int32_t qx = kiln_builder_add_input(b, "q", KILN_F32, 4, q, err);
  int32_t kx = kiln_builder_add_input(b, "kv", KILN_F32, 4, kv, err);
  int32_t h = kiln_builder_add_input(b, "h", KILN_F32, 2, xd, err);
  int32_t tw = kiln_builder_add_constant(b, KILN_F32, 4, wd, w, sizeof w, err);
  int32_t ts = kiln_builder_add_constant(b, KILN_F32, 1, cd, stats, sizeof stats, err);
  int32_t tr_ = kiln_builder_add_constant(b, KILN_I64, 2, rd, rows, sizeof rows, err);
  int32_t tc = kiln_builder_add_constant(b, KILN_I64, 2, gd, cols, sizeof cols, err);
  int32_t tg = kiln_builder_add_constant(b, KILN_F32, 2, sw, gate_up, sizeof gate_up, err);
  int32_t bn_ = kiln_builder_add_op(b, KILN_OP_BATCH_NORM, (int32_t[]){x, ts, ts}, 3, bn, 1, eps, 1, err);
  int32_t c1 = kiln_builder_add_op(b, KILN_OP_CONV, (int32_t[]){bn_, tw}, 2, conv, 5, NULL, 0, err);
  int32_t p1 = kiln_builder_add_op(b, KILN_OP_MAX_POOL2D, &c1, 1, pool, 5, NULL, 0, err);
  int32_t u1 = kiln_builder_add_op(b, KILN_OP_UPSAMPLE_BILINEAR2D, &p1, 1, up, 2, NULL, 0, err);
  int32_t u2 = kiln_builder_add_op(b, KILN_OP_UPSAMPLE_NEAREST2D, &u1, 1, near, 1, NULL, 0, err);
  int32_t a1 = kiln_builder_add_op(b, KILN_OP_AVG_POOL2D, &u2, 1, avg, 6, NULL, 0, err);
  int32_t a2 = kiln_builder_add_op(b, KILN_OP_ADAPTIVE_AVG_POOL2D, &a1, 1, ad, 1, NULL, 0, err);
  int32_t nl = kiln_builder_add_op(b, KILN_OP_UPSAMPLE_BILINEAR2D, &x, 1, last, 3, NULL, 0, err);
  int32_t t1 = kiln_builder_add_op(b, KILN_OP_CONV_TRANSPOSE, (int32_t[]){a1, tw}, 2, tr, 6, NULL, 0, err);
  int32_t cs = kiln_builder_add_op(b, KILN_OP_CUMSUM, &keep, 1, scan, 2, NULL, 0, err);
  int32_t ga = kiln_builder_add_op(b, KILN_OP_GATHER, (int32_t[]){m, tc}, 2, dim1, 1, NULL, 0, err);
  int32_t ix = kiln_builder_add_op(b, KILN_OP_INDEX, (int32_t[]){m, tr_, tc}, 3, both, 1, NULL, 0, err);
  int32_t am = kiln_builder_add_op(b, KILN_OP_ARGMAX, &ga, 1, arg, 2, NULL, 0, err);
  int32_t at = kiln_builder_add_op(b, KILN_OP_SDPA, (int32_t[]){qx, kx, kx}, 3, sdpa, 2, NULL, 0, err);
  int32_t sg = kiln_builder_add_op(b, KILN_OP_LINEAR, (int32_t[]){h, tg}, 2, swiglu, 1, NULL, 0, err);
  int rc = a2 < 0 || nl < 0 || t1 < 0 || cs < 0 || ix < 0 || am < 0 || at < 0 || sg < 0 ||
                   kiln_builder_mark_output(b, a2, "pooled", err) != KILN_OK ||
                   kiln_builder_mark_output(b, nl, "resized_last", err) != KILN_OK ||
                   kiln_builder_mark_output(b, t1, "widened", err) != KILN_OK ||
                   kiln_builder_mark_output(b, cs, "positions", err) != KILN_OK ||
                   kiln_builder_mark_output(b, ix, "picked", err) != KILN_OK ||
                   kiln_builder_mark_output(b, am, "best", err) != KILN_OK ||
                   kiln_builder_mark_output(b, at, "grouped", err) != KILN_OK ||
                   kiln_builder_mark_output(b, sg, "swiglu", err) != KILN_OK ||
                   save(dir, "later_kinds.blob", b, err) != 0
               ? -1
               : 0;
  kiln_builder_destroy(b);
  return rc;
}

/* The rotary embedding as transformers writes it, which the builder fuses into one FUSED op:
 * q = permute(reshape(x[1,4,16], [1,4,2,8])), q * cos + cat(-q[..., 4:], q[..., :4]) * sin,
 * in f16 so its program rounds. */
static int fused_group_seed(const char *dir, kiln_error *err) {
  kiln_builder *b = kiln_builder_create();
  if (!b) return -1;
  int64_t xd[3] = {1, 4, 16}, td[2] = {4, 8}, split[4] = {1, 4, 2, 8}, perm[4] = {0, 2, 1, 3};
  int64_t hi[4] = {3, 4, 8, 1}, lo[4] = {3, 0, 4, 1}, cat3[1] = {3};
  int32_t x = kiln_builder_add_input(b, "x", KILN_F16, 3, xd, err);
  int32_t c = kiln_builder_add_input(b, "cos", KILN_F16, 2, td, err);
  int32_t s = kiln_builder_add_input(b, "sin", KILN_F16, 2, td, err);
  int32_t h = kiln_builder_add_op(b, KILN_OP_RESHAPE, &x, 1, split, 4, NULL, 0, err);
  int32_t q = kiln_builder_add_op(b, KILN_OP_PERMUTE, &h, 1, perm, 4, NULL, 0, err);
  int32_t a = kiln_builder_add_op(b, KILN_OP_SLICE, &q, 1, hi, 4, NULL, 0, err);
  int32_t z = kiln_builder_add_op(b, KILN_OP_SLICE, &q, 1, lo, 4, NULL, 0, err);
  int32_t n = kiln_builder_add_op(b, KILN_OP_NEG, &a, 1, NULL, 0, NULL, 0, err);
  int32_t r = kiln_builder_add_op(b, KILN_OP_CAT, (int32_t[]){n, z}, 2, cat3, 1, NULL, 0, err);
  int32_t m1 = kiln_builder_add_op(b, KILN_OP_MUL, (int32_t[]){q, c}, 2, NULL, 0, NULL, 0, err);
  int32_t m2 = kiln_builder_add_op(b, KILN_OP_MUL, (int32_t[]){r, s}, 2, NULL, 0, NULL, 0, err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_ADD, (int32_t[]){m1, m2}, 2, NULL, 0, NULL, 0, err);
  int rc = y < 0 || kiln_builder_mark_output(b, y, "q", err) != KILN_OK ||
                   save(dir, "fused_group.blob", b, err) != 0
               ? -1
               : 0;
  kiln_builder_destroy(b);
  return rc;
}

/* x[s,4] with s in 1..6 -> linear -> reshape [2s,4] -> slice rows 1..2s: a dynamic plan, so the
 * fuzzers reach the symbol section and the per-call shapes. */
static int dynamic_seed(const char *dir, kiln_error *err) {
  kiln_builder *b = kiln_builder_create();
  if (!b) return -1;
  int64_t xd[2] = {6, 4}, wd[2] = {8, 4}, rd[2] = {12, 4}, sl[4] = {0, 1, 12, 1};
  float w[32] = {0.5f, -1.0f, 2.0f};
  kiln_sym_size s = {1, 1, 0}, none = {0, 0, 0}, two_s = {1, 2, 0};
  kiln_sym_size xs[2] = {s, none}, rs[2] = {two_s, none}, ss[4] = {none, none, two_s, none};
  int32_t in[2];
  int rc = kiln_builder_add_symbol(b, "s", 1, 6, err) == 1 ? 0 : -1;
  in[0] = kiln_builder_add_input_sym(b, "x", KILN_F32, 2, xd, xs, err);
  in[1] = kiln_builder_add_constant(b, KILN_F32, 2, wd, w, sizeof w, err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_LINEAR, in, 2, NULL, 0, NULL, 0, err);
  int32_t r = kiln_builder_add_op_sym(b, KILN_OP_RESHAPE, &y, 1, rd, rs, 2, NULL, 0, err);
  int32_t t = kiln_builder_add_op_sym(b, KILN_OP_SLICE, &r, 1, sl, ss, 4, NULL, 0, err);
  if (rc || t < 0 || kiln_builder_mark_output(b, t, "rows", err) != KILN_OK ||
      save(dir, "dynamic.blob", b, err) != 0)
    rc = -1;
  kiln_builder_destroy(b);
  return rc;
}

/* The rotary embedding of fused_group_seed at a dynamic sequence s in 1..6: x[1,s,16] split
 * into heads [1,s,2,8], permuted to [1,2,s,8], with cos and sin [s,8]: one FUSED op in a dynamic
 * plan, its output following s, so the fuzzers reach the per-call check of its program. */
static int dynamic_fused_seed(const char *dir, kiln_error *err) {
  kiln_builder *b = kiln_builder_create();
  if (!b) return -1;
  int64_t xd[3] = {1, 6, 16}, td[2] = {6, 8}, split[4] = {1, 6, 2, 8}, perm[4] = {0, 2, 1, 3};
  int64_t hi[4] = {3, 4, 8, 1}, lo[4] = {3, 0, 4, 1}, cat3[1] = {3};
  kiln_sym_size s = {1, 1, 0}, none = {0, 0, 0};
  kiln_sym_size xs[3] = {none, s, none}, ts[2] = {s, none}, hs[4] = {none, s, none, none};
  int rc = kiln_builder_add_symbol(b, "s", 1, 6, err) == 1 ? 0 : -1;
  int32_t x = kiln_builder_add_input_sym(b, "x", KILN_F16, 3, xd, xs, err);
  int32_t c = kiln_builder_add_input_sym(b, "cos", KILN_F16, 2, td, ts, err);
  int32_t n = kiln_builder_add_input_sym(b, "sin", KILN_F16, 2, td, ts, err);
  int32_t h = kiln_builder_add_op_sym(b, KILN_OP_RESHAPE, &x, 1, split, hs, 4, NULL, 0, err);
  int32_t q = kiln_builder_add_op(b, KILN_OP_PERMUTE, &h, 1, perm, 4, NULL, 0, err);
  int32_t a = kiln_builder_add_op(b, KILN_OP_SLICE, &q, 1, hi, 4, NULL, 0, err);
  int32_t z = kiln_builder_add_op(b, KILN_OP_SLICE, &q, 1, lo, 4, NULL, 0, err);
  int32_t g = kiln_builder_add_op(b, KILN_OP_NEG, &a, 1, NULL, 0, NULL, 0, err);
  int32_t r = kiln_builder_add_op(b, KILN_OP_CAT, (int32_t[]){g, z}, 2, cat3, 1, NULL, 0, err);
  int32_t m1 = kiln_builder_add_op(b, KILN_OP_MUL, (int32_t[]){q, c}, 2, NULL, 0, NULL, 0, err);
  int32_t m2 = kiln_builder_add_op(b, KILN_OP_MUL, (int32_t[]){r, n}, 2, NULL, 0, NULL, 0, err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_ADD, (int32_t[]){m1, m2}, 2, NULL, 0, NULL, 0, err);
  if (rc || y < 0 || kiln_builder_mark_output(b, y, "q", err) != KILN_OK ||
      save_holding(dir, "dynamic_fused.blob", b, KILN_OP_FUSED, err) != 0)
    rc = -1;
  kiln_builder_destroy(b);
  return rc;
}

/* A KV-cache step: a state written in place at a position input, then read. */
static int state_seed(const char *dir, kiln_error *err) {
  kiln_builder *b = kiln_builder_create();
  if (!b) return -1;
  int64_t pd[1] = {1}, rd[2] = {1, 4}, cd[2] = {6, 4}, dim0[1] = {0};
  float cache[24] = {0};
  int32_t pos = kiln_builder_add_input(b, "position", KILN_I64, 1, pd, err);
  int32_t row = kiln_builder_add_input(b, "row", KILN_F32, 2, rd, err);
  int32_t st = kiln_builder_add_state(b, KILN_F32, 2, cd, cache, sizeof cache, err);
  int32_t w = kiln_builder_add_op(b, KILN_OP_INDEX_COPY, (int32_t[]){st, pos, row}, 3, dim0, 1, NULL, 0, err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_RELU, &w, 1, NULL, 0, NULL, 0, err);
  int rc = y < 0 || kiln_builder_write_state(b, st, w, err) != KILN_OK ||
                   kiln_builder_mark_output(b, y, "cache", err) != KILN_OK ||
                   save(dir, "state.blob", b, err) != 0
               ? -1
               : 0;
  kiln_builder_destroy(b);
  return rc;
}

int main(int argc, char **argv) {
  kiln_error err = {KILN_OK, ""};
  if (argc != 2) {
    fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  if (linear_seed(argv[1], &err) != 0 || elementwise_seed(argv[1], &err) != 0 ||
      layers_seed(argv[1], &err) != 0 || later_kinds_seed(argv[1], &err) != 0 ||
      fused_group_seed(argv[1], &err) != 0 || dynamic_seed(argv[1], &err) != 0 ||
      dynamic_fused_seed(argv[1], &err) != 0 || state_seed(argv[1], &err) != 0) {
    fprintf(stderr, "make_seeds: %s\n", err.message);
    return 1;
  }
  return 0;
}
