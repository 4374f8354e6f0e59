/* Common subexpression elimination: an op computing what an earlier op already computed goes. */
#ifndef KILN_MERGE_COMMON_H
#define KILN_MERGE_COMMON_H

#include "builder/graph.h"

/* An op with the kind, inputs, attributes (symbolic ones included) and output shape of an
 * earlier live op is dropped, and its readers read the earlier op's output: each layer of a
 * decoder computing the same cache positions and masks from the same inputs computes them once.
 * Small constants with equal dtype, shape and bytes count as one tensor (each use of a scalar or
 * a position table is its own constant in an exported graph).
 * Never merged: an op whose output is an output binding or a state's value, and an op
 * downstream of a state (its buffer is written in place during the run, so two reads of one
 * tensor id at different places may see different bytes). */
kiln_status kiln_merge_common_ops(kiln_graph *g, kiln_error *err);

#endif
