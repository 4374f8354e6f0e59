/* Hand-written FUSED programs shared by the CPU and GPU op tests, in the word layout kiln.h
 * gives: the rotary embedding of a packed projection and a pointwise mix of every code. */
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

#endif
