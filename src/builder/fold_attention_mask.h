/* Attention masks read at build: expanded ones, and constants of the program. */
#ifndef KILN_FOLD_ATTENTION_MASK_H
#define KILN_FOLD_ATTENTION_MASK_H

#include "builder/graph.h"

/* An SDPA whose mask is an EXPAND reads the EXPAND's input (the SDPA broadcasts its mask). In a
 * static plan (`dynamic` 0), an SDPA whose mask is a constant (a model with static shapes builds
 * its causal mask from positions alone, and export folds it) loses the mask where the mask adds
 * nothing the SDPA cannot say itself: a mask that keeps every key the SDPA scores goes, and one
 * that keeps exactly keys j <= i of query row i (over every batch and head) becomes causal = 1. A
 * bool mask keeps where true; an additive float one keeps where 0 and removes where -inf or the
 * dtype's lowest value (whose weight underflows to 0 in every row with a key kept, as every row of
 * those two patterns has). Any other mask stays, read by the kernel as before. So the kernels skip
 * the masked tiles instead of reading the mask for every score. */
kiln_status kiln_fold_attention_masks(kiln_graph *g, int dynamic, kiln_error *err);

#endif
