/* Convolution epilogue fusion: the residual add and ReLU of a ResNet block run inside the
 * convolution (CONV's iattr6/7, CONV_TRANSPOSE's iattr7/8). */
#ifndef KILN_FUSE_CONV_H
#define KILN_FUSE_CONV_H

#include "builder/graph.h"

/* An ADD (alpha 1) of a CONV or CONV_TRANSPOSE output read by nothing else, without residual
 * or activation, and a tensor of the same shape and dtype becomes that convolution with the
 * tensor as its residual, in the add's place. Then a RELU of a convolution output read by
 * nothing else, without activation, becomes its activation. */
kiln_status kiln_fuse_conv_epilogues(kiln_graph *g, kiln_error *err);

#endif
