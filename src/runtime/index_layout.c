/* The output layout of advanced indexing (see index_layout.h). */
#include "runtime/index_layout.h"

#include <string.h>

kiln_index_fault kiln_index_layout_of(const kiln_tensor_desc *x,
                                      const kiln_tensor_desc *const *idx, uint32_t n_idx,
                                      int64_t mask, kiln_index_layout *out, uint32_t *where) {
  uint32_t bits = 0;
  int32_t first = -1, last = -1;
  memset(out, 0, sizeof *out);
  *where = 0;
  if (x->rank < 1 || x->rank > KILN_MAX_RANK || mask <= 0 || (mask >> x->rank) != 0 ||
      n_idx < 1 || n_idx >= KILN_MAX_OP_INPUTS)
    return KILN_INDEX_BAD_MASK;
  for (int32_t d = 0; d < x->rank; d++) {
    if (!((mask >> d) & 1)) continue;
    if (bits < n_idx) out->x_dim[bits] = d;
    bits++;
    last = d;
    if (first < 0) first = d;
  }
  if (bits != n_idx) return KILN_INDEX_BAD_MASK;
  out->n_idx = n_idx;
  /* Right-aligned broadcasting of every index shape into B. */
  for (uint32_t k = 0; k < n_idx; k++) {
    const kiln_tensor_desc *t = idx[k];
    int32_t r = out->b_rank > t->rank ? out->b_rank : t->rank;
    int64_t merged[KILN_MAX_RANK];
    if (t->rank < 0 || t->rank > KILN_MAX_RANK) {
      *where = k + 1;
      return KILN_INDEX_NO_BROADCAST;
    }
    for (int32_t j = 0; j < r; j++) {
      int64_t a = j < out->b_rank ? out->b_dims[out->b_rank - 1 - j] : 1;
      int64_t b = j < t->rank ? t->dims[t->rank - 1 - j] : 1;
      if (a != b && a != 1 && b != 1) {
        *where = k + 1;
        return KILN_INDEX_NO_BROADCAST;
      }
      merged[r - 1 - j] = a == 1 ? b : a;
    }
    out->b_rank = r;
    memcpy(out->b_dims, merged, sizeof merged[0] * (size_t)r);
  }
  out->rank = out->b_rank + x->rank - (int32_t)n_idx;
  if (out->rank > KILN_MAX_RANK) return KILN_INDEX_TOO_RANKED;
  int adjacent = last - first + 1 == (int32_t)n_idx;
  int32_t o = 0;
  out->b_at = adjacent ? -1 : 0;
  if (!adjacent)
    for (int32_t j = 0; j < out->b_rank; j++) out->walks[o] = -1, out->dims[o++] = out->b_dims[j];
  for (int32_t d = 0; d < x->rank; d++) {
    if (adjacent && d == first) {
      out->b_at = o;
      for (int32_t j = 0; j < out->b_rank; j++) out->walks[o] = -1, out->dims[o++] = out->b_dims[j];
    }
    if (!((mask >> d) & 1)) out->walks[o] = d, out->dims[o++] = x->dims[d];
  }
  return KILN_INDEX_FINE;
}
