/* Build pass: batch norm in eval mode folded into the convolution before it. */
#ifndef KILN_FOLD_BATCH_NORM_H
#define KILN_FOLD_BATCH_NORM_H

#include "builder/graph.h"

/* A BATCH_NORM of constants whose input is a CONV of constants read by nothing else becomes
 * that CONV with weight w*scale and bias (b - mean)*scale + beta per output channel, scale =
 * gamma / sqrt(var + eps); the rest stay BATCH_NORM (a per-channel affine). */
kiln_status kiln_fold_batch_norm(kiln_graph *g, kiln_error *err);

#endif
