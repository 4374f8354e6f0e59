/* Helpers shared inside libkiln: overflow-checked arithmetic and little-endian access. */
#ifndef KILN_INTERNAL_H
#define KILN_INTERNAL_H

#include <stdint.h>
#include <string.h>

/* Every arena offset is a multiple of this (what a GPU kernel wants for vector loads). */
#define KILN_ARENA_ALIGN 256u

/* Return 0 and write the result, or return -1 on overflow. */
static inline int kiln_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
  return __builtin_add_overflow(a, b, out) ? -1 : 0;
}
static inline int kiln_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
  return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

static inline uint32_t kiln_rd_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t kiln_rd_u64(const uint8_t *p) {
  return (uint64_t)kiln_rd_u32(p) | (uint64_t)kiln_rd_u32(p + 4) << 32;
}
static inline void kiln_wr_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void kiln_wr_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

#endif
