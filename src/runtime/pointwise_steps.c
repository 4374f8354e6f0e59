/* Pointwise steps of POINTWISE and fused norm ops: validation and display. */
#include "runtime/pointwise_steps.h"

#include <stdint.h>
#include <stdio.h>

#define KNOWN_BITS                                                                        \
  ((int64_t)KILN_PW_KIND_MASK | ((int64_t)KILN_PW_INPUT_MASK << KILN_PW_INPUT_SHIFT) |    \
   KILN_PW_REVERSED | KILN_PW_GELU_TANH)

int kiln_pw_step_kind_ok(kiln_op_kind kind) {
  switch (kind) {
  case KILN_OP_ADD:
  case KILN_OP_SUB:
  case KILN_OP_MUL:
  case KILN_OP_DIV:
  case KILN_OP_RELU:
  case KILN_OP_GELU:
  case KILN_OP_SILU:
  case KILN_OP_SIGMOID:
  case KILN_OP_TANH:
  case KILN_OP_EXP:
  case KILN_OP_SQRT:
  case KILN_OP_RSQRT:
  case KILN_OP_NEG:
  case KILN_OP_POW:
  case KILN_OP_MINIMUM:
  case KILN_OP_MAXIMUM:
  case KILN_OP_ABS:
  case KILN_OP_LOG:
  case KILN_OP_COS:
  case KILN_OP_SIN:
  case KILN_OP_ERF:
  case KILN_OP_HARDSWISH:
  case KILN_OP_HARDSIGMOID: return 1;
  default: return 0;
  }
}

/* 1 when the step's op and flags go together (the input slot is checked separately). */
static int step_ok(int64_t step) {
  kiln_op_kind kind = KILN_PW_STEP_KIND(step);
  if ((step & ~KNOWN_BITS) != 0 || !kiln_pw_step_kind_ok(kind)) return 0;
  if ((step & KILN_PW_REVERSED) && !kiln_pw_is_binary(kind)) return 0;
  return !(step & KILN_PW_GELU_TANH) || kind == KILN_OP_GELU;
}

int kiln_pw_span_of(const kiln_op *op, kiln_pw_span *span) {
  int64_t flags;
  if (op->kind == KILN_OP_POINTWISE) {
    span->steps = op->iattr;
    span->n_steps = op->n_iattr < KILN_MAX_IATTR ? op->n_iattr : KILN_MAX_IATTR;
    span->n_before = 0;
    span->first_operand = 1;
    span->exponent = op->fattr[0];
    return 1;
  }
  if ((op->kind != KILN_OP_LAYER_NORM && op->kind != KILN_OP_RMS_NORM) || op->n_iattr <= 2)
    return 0;
  flags = op->iattr[1];
  span->steps = op->iattr + 3;
  span->n_steps = (op->n_iattr < KILN_NORM_MAX_IATTR ? op->n_iattr : KILN_NORM_MAX_IATTR) - 3;
  span->n_before = op->iattr[2] >= 0 && op->iattr[2] <= KILN_NORM_MAX_IATTR ? (uint32_t)op->iattr[2]
                                                                             : UINT32_MAX;
  span->first_operand = 1u + (uint32_t)(flags & 1) + (uint32_t)((flags >> 1) & 1);
  span->exponent = op->fattr[1];
  return 1;
}

kiln_pw_fault kiln_pointwise_check(const kiln_op *op, uint32_t *where) {
  uint32_t read = 0; /* bit k: some step reads input k */
  int pows = 0;
  kiln_pw_span span;
  *where = 0;
  if (!kiln_pw_span_of(op, &span)) /* a plain norm keeps fattr1 for a step's exponent */
    return op->fattr[1] != 0.0 ? KILN_PW_BAD_FATTR : KILN_PW_FINE;
  if (span.n_steps == 0 || span.n_before > span.n_steps) return KILN_PW_BAD_SPLIT;
  for (uint32_t s = 0; s < span.n_steps; s++) {
    int64_t step = span.steps[s];
    kiln_op_kind kind = KILN_PW_STEP_KIND(step);
    uint32_t slot = KILN_PW_STEP_INPUT(step);
    *where = s;
    if (!step_ok(step)) return KILN_PW_BAD_STEP;
    if (kiln_pw_is_binary(kind) ? slot < span.first_operand || slot >= op->n_inputs : slot != 0)
      return KILN_PW_BAD_INPUT;
    if (kind == KILN_OP_POW && pows++) return KILN_PW_SECOND_POW;
    read |= 1u << slot;
  }
  for (uint32_t k = span.first_operand; k < op->n_inputs; k++) {
    *where = k;
    if (!((read >> k) & 1u)) return KILN_PW_UNUSED_INPUT;
  }
  *where = 0;
  if (!pows && span.exponent != 0.0) return KILN_PW_BAD_FATTR;
  if (op->kind == KILN_OP_POINTWISE && op->fattr[1] != 0.0) return KILN_PW_BAD_FATTR;
  return KILN_PW_FINE;
}

const char *kiln_pointwise_step_str(int64_t step, double exponent, char *buf, size_t size) {
  kiln_op_kind kind = KILN_PW_STEP_KIND(step);
  const char *name = kiln_op_name(kind);
  if (size == 0) return buf;
  if (kiln_pw_is_binary(kind))
    snprintf(buf, size, "%s%s(in%u)", step & KILN_PW_REVERSED ? "r" : "", name,
             (unsigned)KILN_PW_STEP_INPUT(step));
  else if (kind == KILN_OP_GELU)
    snprintf(buf, size, "%s", step & KILN_PW_GELU_TANH ? "gelu_tanh" : "gelu_erf");
  else if (kind == KILN_OP_POW)
    snprintf(buf, size, "pow(%g)", exponent);
  else
    snprintf(buf, size, "%s", name);
  return buf;
}
