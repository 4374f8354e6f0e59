/* Greedy best-fit memory planning, largest tensor first. */
#include "builder/memplan.h"

#include "runtime/alloc.h"
#include "runtime/internal.h"

#include <stdlib.h>

/* Sort context: qsort has no user pointer, so orders are sorted as (key, index) pairs. */
typedef struct sort_item {
  uint64_t key;
  uint32_t tie, index;
} sort_item;

static int by_key_desc(const void *pa, const void *pb) {
  const sort_item *a = pa, *b = pb;
  if (a->key != b->key) return a->key > b->key ? -1 : 1;
  if (a->tie != b->tie) return a->tie < b->tie ? -1 : 1;
  return a->index < b->index ? -1 : a->index > b->index;
}

static int by_key_asc(const void *pa, const void *pb) { return by_key_desc(pb, pa); }

static int live_together(const kiln_mem_block *a, const kiln_mem_block *b) {
  return a->first <= b->last && b->first <= a->last;
}

/* Best-fit offset for block b among the placed blocks live at the same time, listed in `near`
 * by offset; 0 with *offset set, or -1 when the arena would exceed 2^64 bytes. */
static int best_offset(const kiln_mem_block *blocks, const kiln_mem_block *b, const sort_item *near,
                       uint32_t n_near, uint64_t align, uint64_t *offset) {
  uint64_t end = 0, best = UINT64_MAX, best_gap = UINT64_MAX;
  for (uint32_t k = 0; k < n_near; k++) {
    const kiln_mem_block *p = &blocks[near[k].index];
    uint64_t start, p_end;
    if (kiln_add_u64(end, align - 1, &start)) return -1;
    start &= ~(align - 1);
    if (p->offset >= start && p->offset - start >= b->size && p->offset - start < best_gap) {
      best_gap = p->offset - start;
      best = start;
    }
    p_end = p->offset + p->size; /* checked when p was placed */
    if (p_end > end) end = p_end;
  }
  if (best == UINT64_MAX) {
    if (kiln_add_u64(end, align - 1, &best)) return -1;
    best &= ~(align - 1);
  }
  *offset = best;
  return 0;
}

kiln_status kiln_memplan(kiln_mem_block *blocks, uint32_t n, uint64_t align, uint64_t *arena_size,
                         kiln_error *err) {
  sort_item *order = kiln_calloc(n, sizeof *order), *near = kiln_calloc(n, sizeof *near);
  uint64_t arena = 0;
  uint32_t n_placed = 0;
  kiln_status s = KILN_OK;
  if (!order || !near) {
    s = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                  "builder: out of memory planning %u arena tensors; free memory and retry",
                  (unsigned)n);
    goto done;
  }
  for (uint32_t i = 0; i < n; i++) order[i] = (sort_item){blocks[i].size, blocks[i].first, i};
  qsort(order, n, sizeof *order, by_key_desc);
  /* order[0..n_placed) are placed; each new block looks only at those live with it. */
  for (uint32_t i = 0; i < n; i++) {
    kiln_mem_block *b = &blocks[order[i].index];
    uint32_t n_near = 0;
    uint64_t end;
    b->offset = 0;
    if (b->size == 0) continue;
    for (uint32_t k = 0; k < n_placed; k++) {
      const kiln_mem_block *p = &blocks[order[k].index];
      if (p->size && live_together(p, b))
        near[n_near++] = (sort_item){p->offset, 0, order[k].index};
    }
    qsort(near, n_near, sizeof *near, by_key_asc);
    if (best_offset(blocks, b, near, n_near, align, &b->offset) ||
        kiln_add_u64(b->offset, b->size, &end)) {
      s = kiln_fail(err, KILN_ERR_UNSUPPORTED,
                    "builder: the arena for %u tensors exceeds 2^64 bytes; split the graph",
                    (unsigned)n);
      goto done;
    }
    if (end > arena) arena = end;
    n_placed = i + 1;
  }
  *arena_size = arena;
done:
  free(order);
  free(near);
  return s;
}
