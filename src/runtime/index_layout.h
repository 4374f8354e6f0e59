/* Where advanced indexing (KILN_OP_INDEX) puts each dim: the index inputs broadcast together
 * to B, which takes the place of the indexed dims when they are adjacent and otherwise leads
 * the output. One computation shared by shape inference, the engines' checks and kernels. */
#ifndef KILN_INDEX_LAYOUT_H
#define KILN_INDEX_LAYOUT_H

#include "kiln/kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kiln_index_fault {
  KILN_INDEX_FINE = 0,
  KILN_INDEX_BAD_MASK,     /* the mask names dims x lacks, or not one dim per index input */
  KILN_INDEX_NO_BROADCAST, /* an index input does not broadcast with those before it */
  KILN_INDEX_TOO_RANKED    /* the output would exceed KILN_MAX_RANK */
} kiln_index_fault;

typedef struct kiln_index_layout {
  uint32_t n_idx;                         /* index inputs, inputs 1..n_idx of the op */
  int32_t x_dim[KILN_MAX_OP_INPUTS];      /* the dim of x index input 1+k picks along */
  int32_t b_rank, b_at;                   /* B's rank and the output dim where it starts */
  int64_t b_dims[KILN_MAX_RANK];
  int32_t rank;                           /* the output's */
  int64_t dims[KILN_MAX_RANK];
  int32_t walks[KILN_MAX_RANK];           /* per output dim: the dim of x it walks, -1 in B */
} kiln_index_layout;

/* Fills out for x indexed along the set bits of mask by idx[0..n_idx-1]; on a fault, *where
 * is the offending index input (1-based, as an op input) or 0. */
kiln_index_fault kiln_index_layout_of(const kiln_tensor_desc *x,
                                      const kiln_tensor_desc *const *idx, uint32_t n_idx,
                                      int64_t mask, kiln_index_layout *out, uint32_t *where);

#ifdef __cplusplus
}
#endif

#endif
