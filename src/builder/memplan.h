/* Memory planning: places the arena tensors of a plan by liveness into one arena. */
#ifndef KILN_MEMPLAN_H
#define KILN_MEMPLAN_H

#include "kiln/kiln.h"
#include "runtime/internal.h"

/* One tensor to place: its size and the op steps [first, last] during which it is live. */
typedef struct kiln_mem_block {
  uint64_t size;
  uint32_t first, last;
  uint64_t offset; /* written by kiln_memplan */
} kiln_mem_block;

/* Gives each block an offset aligned to `align` (a power of two) such that two blocks
 * whose live ranges intersect never share a byte, placing the largest first, each into
 * the smallest gap that fits (best fit); writes the arena size. */
kiln_status kiln_memplan(kiln_mem_block *blocks, uint32_t n, uint64_t align, uint64_t *arena_size,
                         kiln_error *err);

#endif
