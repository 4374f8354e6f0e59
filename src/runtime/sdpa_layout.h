/* The layout of an SDPA op's operands, iattr2 (kiln.h): 0 q, k, v [..., L, E] -> [..., L, Ev];
 * 1 packed heads, one qkv [B,L,3,H,E] -> [B,L,H,E]; 2 heads last, q [B,H,L,E] ->
 * [B,L,H,Ev]. */
#ifndef KILN_SDPA_LAYOUT_H
#define KILN_SDPA_LAYOUT_H

#include "kiln/kiln.h"

/* The op's layout as written (0 when it has no iattr2): the plan reader refuses any other than
 * 0, 1 and 2, so the engines may switch on it. */
static inline int64_t kiln_sdpa_layout(const kiln_op *op) {
  return op->n_iattr > 2 ? op->iattr[2] : 0;
}

#endif
