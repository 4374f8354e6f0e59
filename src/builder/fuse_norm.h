/* Norm fusion: pointwise work before and after a LAYER_NORM or RMS_NORM runs inside it. */
#ifndef KILN_FUSE_NORM_H
#define KILN_FUSE_NORM_H

#include "builder/graph.h"

/* For each norm without fused steps: a pointwise op (lone, or a POINTWISE chain) whose result
 * only the norm reads becomes steps before the norm (a residual add before a post-norm), and a
 * pointwise op that is the only reader of the norm's result and reads it as x becomes steps
 * after it (an activation or a modulation). The norm moves to the later op's place, so every
 * operand is computed before it runs. At most KILN_MAX_IATTR - 3 steps, one POW and
 * KILN_MAX_OP_INPUTS inputs in all; what does not fit stays a separate op. Runs after
 * kiln_fuse_pointwise. */
kiln_status kiln_fuse_norms(kiln_graph *g, kiln_error *err);

#endif
