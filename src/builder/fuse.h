/* Epilogue fusion: work a GEMM can do on its output before storing it. */
#ifndef KILN_FUSE_H
#define KILN_FUSE_H

#include "builder/graph.h"

/* A RELU or GELU whose input is a LINEAR output read by nothing else becomes the LINEAR's
 * activation (iattr0 = KILN_ACT_RELU, GELU_ERF or GELU_TANH). Then an ADD (alpha 1) of a
 * LINEAR output without activation, read by nothing else, and a tensor of the same shape and
 * dtype becomes that LINEAR with the tensor as its residual (iattr1 = 1), in the add's place.
 * Last, kiln_fuse_conv_epilogues does the same for convolutions. */
kiln_status kiln_fuse_epilogues(kiln_graph *g, kiln_error *err);

#endif
