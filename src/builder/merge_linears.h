/* Sibling linears as one GEMM: attention's q, k and v projections (and any other linears of one
 * input) read their input once, in one launch. */
#ifndef KILN_MERGE_LINEARS_H
#define KILN_MERGE_LINEARS_H

#include "builder/graph.h"

/* LINEARs of one input tensor with constant weights [N_i, K] of one dtype, the same activation,
 * no residual, and a constant bias on all or none (of one dtype) become one LINEAR over the
 * weights (and biases) stacked along N, each former output a SLICE of its columns, in the first
 * one's place. A linear joins only where its slice costs no copy of its own: the slice is a view
 * (every dim before the last is 1: a decode step), or the output is read once, through views
 * that move no bytes, by an op doing work that kiln_fuse_groups, run next, takes into a group
 * that reads the columns in place. In a `dynamic` graph such a group holds at every size only
 * where its loads' strides do not follow a symbol, so there at most one dim before the last may
 * exceed 1. An output binding or a state's value never joins. Each output element is the same
 * dot product as before: same bytes. */
kiln_status kiln_merge_linears(kiln_graph *g, int dynamic, kiln_error *err);

#endif
