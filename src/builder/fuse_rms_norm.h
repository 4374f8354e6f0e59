/* RMSNorm written out, as transformers writes it: one RMS_NORM op. */
#ifndef KILN_FUSE_RMS_NORM_H
#define KILN_FUSE_RMS_NORM_H

#include "builder/graph.h"

/* x32 * rsqrt(mean(x32^2, last dim, keepdim) + eps), x32 = x or cast(x, f32), optionally cast
 * back to x's dtype and then multiplied by a weight of the last dim (either side), each value
 * read by nothing else, becomes RMS_NORM(x, weight?) with that eps, computed in f32 with one
 * rounding (the written-out form rounds once more, before the weight, when it casts back). */
kiln_status kiln_fuse_rms_norms(kiln_graph *g, kiln_error *err);

#endif
