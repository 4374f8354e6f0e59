/* Sibling linears as one GEMM: attention's q, k and v projections (and any other linears of one
 * input) read their input once, in one launch. */
#ifndef KILN_MERGE_LINEARS_H
#define KILN_MERGE_LINEARS_H

#include "builder/graph.h"

/* LINEARs of one input tensor with constant weights [N_i, K] of one dtype, the same activation,
 * no residual, and a constant bias on all or none (of one dtype) become one LINEAR over the
 * weights (and biases) stacked along N, each former output a SLICE of its columns, in the first
 * one's place. A linear joins only where its slice costs no copy of its own: the slice is a view
 * (every dim before the last is 1: a decode step), or, when `groups` says kiln_fuse_groups runs
 * next, every reader of the output (through views that move no bytes) is an op doing work that
 * the group takes, which then reads the columns in place. An output binding or a state's value
 * never joins. Each output element is the same dot product as before: same bytes. */
kiln_status kiln_merge_linears(kiln_graph *g, int groups, kiln_error *err);

#endif
