/* The inputs of a LINEAR op: x, w, the bias when present, then the residual when iattr1 is 1. */
#ifndef KILN_LINEAR_INPUTS_H
#define KILN_LINEAR_INPUTS_H

#include "kiln/kiln.h"

/* 1 when op adds a residual (its last input, of the output's shape) to its result. */
static inline int kiln_linear_has_residual(const kiln_op *op) {
  return op->n_iattr > 1 && op->iattr[1] == 1;
}

/* 1 when input 2 is a bias. */
static inline int kiln_linear_has_bias(const kiln_op *op) {
  return op->n_inputs - (uint32_t)kiln_linear_has_residual(op) > 2;
}

#endif
