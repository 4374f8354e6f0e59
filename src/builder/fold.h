/* Build passes that rewrite a graph around its constants. */
#ifndef KILN_FOLD_H
#define KILN_FOLD_H

#include "builder/graph.h"

/* PERMUTE and RESHAPE of a constant become constants (a transposed weight stays a weight). */
kiln_status kiln_fold_constants(kiln_graph *g, kiln_error *err);
/* MATMUL by a 2-D constant b[K,N] becomes LINEAR with the weight stored as [N,K], and an ADD
 * of a 1-D constant [N] to a LINEAR output read by nothing else becomes the LINEAR's bias. */
kiln_status kiln_recognize_gemm(kiln_graph *g, kiln_error *err);

/* A MATMUL whose inner dim is 1 (an outer product, as transformers' rotary embedding takes its
 * frequencies times the positions) becomes the broadcast MUL it is: one product per element,
 * the same bytes, and a pointwise op the fused groups take in. */
kiln_status kiln_outer_products_to_mul(kiln_graph *g, kiln_error *err);

/* A RESHAPE of a RESHAPE reads the first one's input; a RESHAPE, EXPAND or step-1 SLICE to its
 * input's own shape goes, its readers reading the input. What the fusions leave of a view chain
 * (grouped-query attention's reshape, expand, reshape without the expand) then costs nothing,
 * even on a tensor no view can alias (a state), and so does a mask expanded to the shape it
 * has (a launch of its own on a GPU otherwise). */
kiln_status kiln_fold_reshapes(kiln_graph *g, kiln_error *err);

/* A COPY (clone, alias) that is no output binding or state value, of a tensor no state's write
 * can change, goes; its readers read the source. */
kiln_status kiln_drop_copies(kiln_graph *g, kiln_error *err);

#endif
