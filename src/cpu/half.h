/* IEEE half (f16) and bfloat16 <-> f32 conversion on bit patterns: round to nearest even,
 * NaN stays NaN (quieted), infinities and subnormals exact. */
#ifndef KILN_CPU_HALF_H
#define KILN_CPU_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t kiln_f32_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return x;
}

static inline float kiln_bits_f32(uint32_t x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

static inline float kiln_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1fu) return kiln_bits_f32(sign | 0x7f800000u | man << 13);
  if (exp != 0) return kiln_bits_f32(sign | (exp + 112u) << 23 | man << 13);
  if (man == 0) return kiln_bits_f32(sign);
  /* Subnormal: shift the leading one into the implicit bit, lowering the exponent. */
  uint32_t e = 113;
  while (!(man & 0x400u)) {
    man <<= 1;
    e--;
  }
  return kiln_bits_f32(sign | e << 23 | (man & 0x3ffu) << 13);
}

static inline uint16_t kiln_f32_to_f16(float f) {
  uint32_t x = kiln_f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to infinity */
  if (a < 0x38800000u) {                                   /* below 2^-14: subnormal or zero */
    if (a <= 0x33000000u) return (uint16_t)sign;           /* <= 2^-25 (a tie) rounds to zero */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - (a >> 23); /* value in units of 2^-24 is m >> shift */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t r = a - 0x38000000u; /* rebias the exponent from 127 to 15 */
  uint32_t q = r >> 13, rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++; /* a carry into the exponent is right */
  return (uint16_t)(sign | q);
}

static inline float kiln_bf16_to_f32(uint16_t b) { return kiln_bits_f32((uint32_t)b << 16); }

static inline uint16_t kiln_f32_to_bf16(float f) {
  uint32_t x = kiln_f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#endif
