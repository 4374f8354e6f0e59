/* The pointwise steps an op carries: KILN_OP_POINTWISE's whole chain, or the steps fused before
 * and after a LAYER_NORM or RMS_NORM. Which ops a step may be, one check shared by the plan
 * parser and the engines, and the text `kiln inspect` prints for a step. */
#ifndef KILN_POINTWISE_STEPS_H
#define KILN_POINTWISE_STEPS_H

#include "kiln/kiln.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A norm's attributes, its own three and its fused steps, stay within eight slots as before
 * ops had twelve, so its steps always fit an engine's chain of KILN_PW_MAX_STEPS. */
#define KILN_NORM_MAX_IATTR 8u

/* What is wrong with an op's steps, found by kiln_pointwise_check. */
typedef enum kiln_pw_fault {
  KILN_PW_FINE = 0,
  KILN_PW_BAD_STEP,     /* not a step op, unknown flag bits, or a flag the op does not take */
  KILN_PW_BAD_INPUT,    /* a binary step's slot outside the operands, or a unary step's not 0 */
  KILN_PW_SECOND_POW,   /* one exponent is stored */
  KILN_PW_UNUSED_INPUT, /* an operand that no step reads */
  KILN_PW_BAD_FATTR,    /* the exponent set without a POW step, or POINTWISE's fattr1 set */
  KILN_PW_BAD_SPLIT     /* a norm's count of steps before it exceeds its steps, or no steps */
} kiln_pw_fault;

/* The steps of one op, and where its operands start among its inputs. */
typedef struct kiln_pw_span {
  const int64_t *steps;
  uint32_t n_steps;
  uint32_t n_before;      /* norms: steps applied to x before normalizing; the rest after */
  uint32_t first_operand; /* binary steps read inputs first_operand..n_inputs-1 */
  double exponent;        /* of the one POW step */
} kiln_pw_span;

/* 1 for ADD, SUB, MUL, DIV, MINIMUM, MAXIMUM: the steps that read an extra input. */
static inline int kiln_pw_is_binary(kiln_op_kind kind) {
  return kind == KILN_OP_ADD || kind == KILN_OP_SUB || kind == KILN_OP_MUL || kind == KILN_OP_DIV ||
         kind == KILN_OP_MINIMUM || kind == KILN_OP_MAXIMUM;
}

/* 1 when kind may be a step (the float unary ops and the six binary ones). */
int kiln_pw_step_kind_ok(kiln_op_kind kind);

/* Fills span with op's steps: 1 for POINTWISE and for a norm with fused steps (n_iattr > 2:
 * iattr2 = steps before the norm, iattr3.. the steps), 0 for every other op. A norm's operands
 * start after x, weight and bias. */
int kiln_pw_span_of(const kiln_op *op, kiln_pw_span *span);

/* Checks the steps of a POINTWISE op or a norm (a plain norm passes when its fattr1 is 0)
 * against its input count; on a fault *where is the step at fault (an index into the span),
 * or the input for KILN_PW_UNUSED_INPUT. */
kiln_pw_fault kiln_pointwise_check(const kiln_op *op, uint32_t *where);

/* Writes a step as text into buf: "mul(in1)", "rsub(in2)" (operand - chain), "gelu_tanh",
 * "pow(2)"; returns buf. */
const char *kiln_pointwise_step_str(int64_t step, double exponent, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif
