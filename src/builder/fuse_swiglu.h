/* SwiGLU as one GEMM: the gate and up projections of a gated MLP share one weight. */
#ifndef KILN_FUSE_SWIGLU_H
#define KILN_FUSE_SWIGLU_H

#include "builder/graph.h"

/* silu(LINEAR(x, w_gate)) * LINEAR(x, w_up), both LINEARs without bias, activation or
 * residual, their weights constants of one shape, each intermediate read once: one LINEAR of
 * x and the constant [w_gate; w_up] with KILN_ACT_SWIGLU in the MUL's place. */
kiln_status kiln_fuse_swiglu(kiln_graph *g, kiln_error *err);

#endif
