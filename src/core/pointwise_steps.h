/* The steps of a KILN_OP_POINTWISE op: which ops a step may be, one check shared by the plan
 * parser and the engines, and the text `kiln inspect` prints for a step. */
#ifndef KILN_POINTWISE_STEPS_H
#define KILN_POINTWISE_STEPS_H

#include "kiln/kiln.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What is wrong with a POINTWISE op's steps, found by kiln_pointwise_check. */
typedef enum kiln_pw_fault {
  KILN_PW_FINE = 0,
  KILN_PW_BAD_STEP,     /* not a step op, unknown flag bits, or a flag the op does not take */
  KILN_PW_BAD_INPUT,    /* a binary step's slot outside 1..n_inputs-1, or a unary step's not 0 */
  KILN_PW_SECOND_POW,   /* fattr0 holds one exponent */
  KILN_PW_UNUSED_INPUT, /* an extra input that no step reads */
  KILN_PW_BAD_FATTR     /* fattr0 set without a POW step, or fattr1 set */
} kiln_pw_fault;

/* 1 for ADD, SUB, MUL, DIV: the steps that read an extra input. */
static inline int kiln_pw_is_binary(kiln_op_kind kind) {
  return kind == KILN_OP_ADD || kind == KILN_OP_SUB || kind == KILN_OP_MUL || kind == KILN_OP_DIV;
}

/* 1 when kind may be a step (the float unary ops and the four binary ones). */
int kiln_pw_step_kind_ok(kiln_op_kind kind);

/* Checks op's steps (iattr[0..n_iattr)) and fattr against its input count; on a fault *where
 * is the step at fault, or the input for KILN_PW_UNUSED_INPUT. */
kiln_pw_fault kiln_pointwise_check(const kiln_op *op, uint32_t *where);

/* Writes a step as text into buf: "mul(in1)", "rsub(in2)" (operand - chain), "gelu_tanh",
 * "pow(2)"; returns buf. */
const char *kiln_pointwise_step_str(int64_t step, double exponent, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif
