/* Ops that compute nothing new from their input, as exported models write them around masks. */
#ifndef KILN_FOLD_IDENTITY_OPS_H
#define KILN_FOLD_IDENTITY_OPS_H

#include "builder/graph.h"

/* An INDEX whose constant indices pick every element of x in order (transformers builds its
 * padding mask as mask[batch_idx, kv_idx] over aranges, which export folds) becomes the
 * RESHAPE it is; a BITWISE or LOGICAL AND with a constant that is all true, or OR with one
 * all false, and an integer ADD or SUB of a constant all zero or MUL by one all one (a decode
 * step's cache position plus a zero arange), become their other operand, expanded to the
 * result's shape where it is smaller (an EXPAND an attention mask needs no more:
 * kiln_fold_attention_masks). Static plans only
 * (`dynamic` 0: in a dynamic one a tensor's dims at the bounds need not be its dims at a call);
 * a gather over more than 2^20 elements is left as it is. */
kiln_status kiln_fold_identity_ops(kiln_graph *g, int dynamic, kiln_error *err);

#endif
