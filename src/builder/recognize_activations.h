/* Activations written out as pointwise ops, the way many models write them (GPT-2's
 * 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), BERT-era erf GELU, x * sigmoid(x)),
 * become the one op they compute, so a GEMM before them takes it into its epilogue. */
#ifndef KILN_RECOGNIZE_ACTIVATIONS_H
#define KILN_RECOGNIZE_ACTIVATIONS_H

#include "builder/graph.h"

/* Each region of float pointwise ops (and float casts) that reads one tensor x and otherwise
 * only one-element constants, with one output of x's dims and dtype and nothing else read
 * outside it, is evaluated in double on probe values of x over [-100, 100]. Where it equals
 * erf GELU, tanh GELU, SiLU or sigmoid within the precision of its dtype (the closest one of
 * them), it becomes that op (epilogue fusion then takes it into a GEMM before it, also across
 * a reshape that unflattens the GEMM's rows). */
kiln_status kiln_recognize_activations(kiln_graph *g, kiln_error *err);

#endif
