/* Hand-written FUSED programs shared by the CPU and GPU op tests, in the word layout kiln.h
 * gives: the rotary embedding of a packed projection, a pointwise mix of every code, and
 * programs of any rank for the CUDA kernel's run paths (boxes, selects, broadcasts, offsets). */
#ifndef KILN_TEST_FUSED_PROGRAMS_H
#define KILN_TEST_FUSED_PROGRAMS_H

#include "kiln/kiln.h"

#include <string.h>

static inline int64_t fx_double(double d) {
  int64_t w;
  memcpy(&w, &d, sizeof w);
  return w;
}

/* Writes one rank-4 map into m (14 words): slot, offset, strides, box [lo, hi). */
static inline void fx_map4(int64_t *m, int64_t slot, int64_t offset, const int64_t *stride,
                           const int64_t *lo, const int64_t *hi) {
  m[0] = slot;
  m[1] = offset;
  for (int d = 0; d < 4; d++) m[2 + d] = stride[d], m[6 + d] = lo[d], m[10 + d] = hi[d];
}

/* out[b,h,s,d] = x[b,s,h,d] * cos[s,d] + rotate_half(x)[b,h,s,d] * sin[s,d] with x the packed
 * [B, S, H*D] projection (inputs x, cos, sin): five maps, twelve instructions; rounds the
 * rotated product to dt as the unfused mul would (not for f32). Returns the instruction count. */
static inline uint32_t fx_rotary(int64_t *maps, int64_t *code, int64_t B, int64_t H, int64_t S,
                                 int64_t D, kiln_dtype dt) {
  const int64_t st[4] = {S * H * D, D, H * D, 1}, table[4] = {0, 0, D, 1};
  const int64_t zero[4] = {0, 0, 0, 0}, all[4] = {B, H, S, D};
  const int64_t half_hi[4] = {B, H, S, D / 2}, half_lo[4] = {0, 0, 0, D / 2};
  uint32_t n = 0;
  fx_map4(maps, 0, 0, st, zero, all);
  fx_map4(maps + 14, 1, 0, table, zero, all);
  fx_map4(maps + 28, 0, D / 2, st, zero, half_hi);   /* -x[..., d + D/2] for d < D/2 */
  fx_map4(maps + 42, 0, -(D / 2), st, half_lo, all); /* x[..., d - D/2] for d >= D/2 */
  fx_map4(maps + 56, 2, 0, table, zero, all);
#define FX(c, dst, a, b, arg, imm) (code[2 * n] = KILN_FX_INSTR(c, dst, a, b, arg), code[2 * n++ + 1] = (imm))
  FX(KILN_FX_LOAD, 0, 0, 0, 0, 0);
  FX(KILN_FX_LOAD, 1, 0, 0, 1, 0);
  FX(KILN_FX_BINARY, 0, 0, 1, KILN_OP_MUL, 0);
  if (dt != KILN_F32) FX(KILN_FX_ROUND, 0, 0, 0, dt, 0);
  FX(KILN_FX_LOAD, 1, 0, 0, 2, 0);
  FX(KILN_FX_UNARY, 1, 1, 0, KILN_OP_NEG, 0);
  FX(KILN_FX_LOAD, 2, 0, 0, 3, 0);
  FX(KILN_FX_SELECT, 1, 1, 2, 3, D / 2);
  FX(KILN_FX_LOAD, 2, 0, 0, 4, 0);
  FX(KILN_FX_BINARY, 1, 1, 2, KILN_OP_MUL, 0);
  if (dt != KILN_F32) FX(KILN_FX_ROUND, 1, 1, 0, dt, 0);
  FX(KILN_FX_BINARY, 0, 0, 1, KILN_OP_ADD, fx_double(1.0));
  FX(KILN_FX_STORE, 0, 0, 0, 0, 0);
  return n;
}

/* Over out [N, C] of x [N, C] and y [C] (inputs x, y; two maps): gelu_tanh, pow, sub with
 * alpha, div, minimum, maximum, sigmoid, a bf16 rounding and a select on the column. */
static inline uint32_t fx_mix(int64_t *maps, int64_t *code, int64_t N, int64_t C) {
  const int64_t m[2][8] = {{0, 0, C, 1, 0, 0, N, C}, {1, 0, 0, 1, 0, 0, N, C}};
  uint32_t n = 0;
  memcpy(maps, m, sizeof m);
  FX(KILN_FX_LOAD, 0, 0, 0, 0, 0);
  FX(KILN_FX_LOAD, 1, 0, 0, 1, 0);
  FX(KILN_FX_UNARY, 2, 0, 0, KILN_OP_GELU, 0);
  code[2 * (n - 1)] |= KILN_FX_GELU_TANH;
  FX(KILN_FX_UNARY, 3, 1, 0, KILN_OP_POW, fx_double(2.0));
  FX(KILN_FX_BINARY, 2, 2, 3, KILN_OP_SUB, fx_double(0.5));
  FX(KILN_FX_BINARY, 3, 0, 3, KILN_OP_DIV, 0);
  FX(KILN_FX_BINARY, 4, 2, 3, KILN_OP_MINIMUM, 0);
  FX(KILN_FX_BINARY, 5, 2, 3, KILN_OP_MAXIMUM, 0);
  FX(KILN_FX_UNARY, 5, 5, 0, KILN_OP_SIGMOID, 0);
  FX(KILN_FX_ROUND, 5, 5, 0, KILN_BF16, 0);
  FX(KILN_FX_SELECT, 0, 4, 5, 1, C / 3);
  FX(KILN_FX_STORE, 0, 0, 0, 0, 0);
#undef FX
  return n;
}

/* Writes one map of rank r into m (2 + 3r words): slot, offset, strides, box [lo, hi). */
static inline void fx_map(int64_t *m, int32_t r, int64_t slot, int64_t offset,
                          const int64_t *stride, const int64_t *lo, const int64_t *hi) {
  m[0] = slot;
  m[1] = offset;
  for (int32_t d = 0; d < r; d++)
    m[2 + d] = stride[d], m[2 + r + d] = lo[d], m[2 + 2 * r + d] = hi[d];
}

/* Over out of rank r (<= 8) and dims, with inputs x [numel + 8] (flat), y [dims[r-1]] and
 * z [dims[0]] (seven maps): x * rotate_half-style select of x shifted by +-h on boxes that
 * split the innermost dim, plus x read at the odd offset 1, minus half the sigmoid of a select
 * on an outer dim between z broadcast over every dim but 0 (boxed on dim 0) and y broadcast
 * over every outer dim, plus x boxed off the innermost dim's ends, rounded to bf16. Returns
 * the instruction count. */
static inline uint32_t fx_runs(int64_t *maps, int64_t *code, int32_t r, const int64_t *dims) {
  int64_t st[8], zero[8], all[8], lo[8], hi[8], bias[8], row[8], n = dims[r - 1], h = n / 2;
  int32_t w = 2 + 3 * r, sel = r >= 3 ? 1 : 0;
  int64_t s = 1;
  uint32_t c = 0;
  for (int32_t d = r - 1; d >= 0; s *= dims[d], d--) {
    st[d] = s, zero[d] = 0, all[d] = dims[d], lo[d] = 0, hi[d] = dims[d];
    bias[d] = d == r - 1, row[d] = d == 0;
  }
  fx_map(maps, r, 0, 0, st, zero, all);
  fx_map(maps + w, r, 0, 1, st, zero, all); /* odd element offset: no aligned vector */
  hi[r - 1] = h;
  fx_map(maps + 2 * w, r, 0, h, st, zero, hi); /* x[..., d + h] for d < h */
  lo[r - 1] = h;
  fx_map(maps + 3 * w, r, 0, -h, st, lo, all); /* x[..., d - h] for d >= h */
  fx_map(maps + 4 * w, r, 1, 0, bias, zero, all);
  for (int32_t d = 0; d < r; d++) lo[d] = d == 0 && dims[0] > 1 ? 1 : 0;
  fx_map(maps + 5 * w, r, 2, 0, row, lo, all);
  for (int32_t d = 0; d < r; d++) lo[d] = 0, hi[d] = dims[d];
  lo[r - 1] = n > 2, hi[r - 1] = n > 2 ? n - 1 : n;
  fx_map(maps + 6 * w, r, 0, 0, st, lo, hi); /* zero on the innermost dim's first and last */
#define FXR(op, dst, a, b, arg, imm) (code[2 * c] = KILN_FX_INSTR(op, dst, a, b, arg), code[2 * c++ + 1] = (imm))
  FXR(KILN_FX_LOAD, 0, 0, 0, 0, 0);
  FXR(KILN_FX_LOAD, 1, 0, 0, 2, 0);
  FXR(KILN_FX_LOAD, 2, 0, 0, 3, 0);
  FXR(KILN_FX_SELECT, 1, 1, 2, (uint32_t)(r - 1), h);
  FXR(KILN_FX_BINARY, 0, 0, 1, KILN_OP_MUL, 0);
  FXR(KILN_FX_LOAD, 2, 0, 0, 1, 0);
  FXR(KILN_FX_BINARY, 0, 0, 2, KILN_OP_ADD, fx_double(1.0));
  FXR(KILN_FX_LOAD, 3, 0, 0, 4, 0);
  FXR(KILN_FX_LOAD, 4, 0, 0, 5, 0);
  FXR(KILN_FX_SELECT, 3, 4, 3, (uint32_t)sel, dims[sel] / 2);
  FXR(KILN_FX_UNARY, 3, 3, 0, KILN_OP_SIGMOID, 0);
  FXR(KILN_FX_BINARY, 0, 0, 3, KILN_OP_SUB, fx_double(0.5));
  FXR(KILN_FX_LOAD, 2, 0, 0, 6, 0);
  FXR(KILN_FX_BINARY, 0, 0, 2, KILN_OP_ADD, fx_double(1.0));
  FXR(KILN_FX_ROUND, 0, 0, 0, KILN_BF16, 0);
  FXR(KILN_FX_STORE, 0, 0, 0, 0, 0);
  return c;
}

/* silu(x + y) * y over two inputs of out's shape (rank r <= 8, two maps), rounded to dt after
 * the add and the silu as the unfused ops would (not for f32). Returns the instruction count. */
static inline uint32_t fx_chain(int64_t *maps, int64_t *code, int32_t r, const int64_t *dims,
                                kiln_dtype dt) {
  int64_t st[8], zero[8], s = 1;
  uint32_t c = 0;
  for (int32_t d = r - 1; d >= 0; s *= dims[d], d--) st[d] = s, zero[d] = 0;
  fx_map(maps, r, 0, 0, st, zero, dims);
  fx_map(maps + 2 + 3 * r, r, 1, 0, st, zero, dims);
  FXR(KILN_FX_LOAD, 0, 0, 0, 0, 0);
  FXR(KILN_FX_LOAD, 1, 0, 0, 1, 0);
  FXR(KILN_FX_BINARY, 0, 0, 1, KILN_OP_ADD, fx_double(1.0));
  if (dt != KILN_F32) FXR(KILN_FX_ROUND, 0, 0, 0, dt, 0);
  FXR(KILN_FX_UNARY, 0, 0, 0, KILN_OP_SILU, 0);
  if (dt != KILN_F32) FXR(KILN_FX_ROUND, 0, 0, 0, dt, 0);
  FXR(KILN_FX_BINARY, 0, 0, 1, KILN_OP_MUL, 0);
  FXR(KILN_FX_STORE, 0, 0, 0, 0, 0);
  return c;
}

/* A squeeze-excite gate x * hardsigmoid(s) over x [N, C, H, W] (channels_last: [N, H, W, C])
 * with s [N, C] broadcast over the spatial dims (two maps), the gate rounded to dt as the
 * unfused hardsigmoid would (not for f32). Returns the instruction count. */
static inline uint32_t fx_gate(int64_t *maps, int64_t *code, int channels_last, int64_t N,
                               int64_t C, int64_t H, int64_t W, kiln_dtype dt) {
  const int64_t zero[4] = {0, 0, 0, 0};
  const int64_t nchw[4] = {N, C, H, W}, nhwc[4] = {N, H, W, C};
  const int64_t x_nchw[4] = {C * H * W, H * W, W, 1}, s_nchw[4] = {C, 1, 0, 0};
  const int64_t x_nhwc[4] = {H * W * C, W * C, C, 1}, s_nhwc[4] = {C, 0, 0, 1};
  uint32_t c = 0;
  fx_map4(maps, 0, 0, channels_last ? x_nhwc : x_nchw, zero, channels_last ? nhwc : nchw);
  fx_map4(maps + 14, 1, 0, channels_last ? s_nhwc : s_nchw, zero, channels_last ? nhwc : nchw);
  FXR(KILN_FX_LOAD, 0, 0, 0, 0, 0);
  FXR(KILN_FX_LOAD, 1, 0, 0, 1, 0);
  FXR(KILN_FX_UNARY, 1, 1, 0, KILN_OP_HARDSIGMOID, 0);
  if (dt != KILN_F32) FXR(KILN_FX_ROUND, 1, 1, 0, dt, 0);
  FXR(KILN_FX_BINARY, 0, 0, 1, KILN_OP_MUL, 0);
  FXR(KILN_FX_STORE, 0, 0, 0, 0, 0);
#undef FXR
  return c;
}

#endif
