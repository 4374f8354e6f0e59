/* Dynamic sizes: each plan size that follows a bounded symbol, evaluated for one set of symbol
 * values, and the values a call's input shapes give. Shared by the plan reader, the builder and
 * the engine front end; nothing here allocates. */
#ifndef KILN_SYMBOLIC_H
#define KILN_SYMBOLIC_H

#include "runtime/shape.h"
#include "kiln/kiln.h"

/* The size s gives at values (one per plan symbol), or fixed when s is static. Values lie
 * within the bounds the plan reader checked, so nothing overflows. */
static inline int64_t kiln_sym_eval(const kiln_sym_size *s, int64_t fixed, const int64_t *values) {
  return s->symbol ? s->coeff * values[s->symbol - 1] + s->offset : fixed;
}

/* 1 for the attributes that hold sizes a symbol may set: reshape and expand targets, slice start
 * and end, select index. Other ops' attributes (dims, kernel sizes) stay static. */
static inline int kiln_attr_may_follow_symbol(kiln_op_kind kind, uint32_t slot) {
  return kind == KILN_OP_RESHAPE || kind == KILN_OP_EXPAND ||
         (kind == KILN_OP_SLICE && (slot == 1 || slot == 2)) || (kind == KILN_OP_SELECT && slot == 1);
}

/* 1 when a plan tensor or op has a size that follows a symbol. */
int kiln_tensor_is_dynamic(const kiln_tensor_desc *t);

/* Every tensor's dims and every op's attributes at values, into tensors and ops (copies of the
 * plan's arrays the caller made once): inputs from their expressions, each op's output by shape
 * inference in order (a FUSED op's from its own expressions). With check, each output must also
 * equal its own expressions (an engine never trusts them) and each FUSED program must read
 * inside its inputs at these sizes; site gives a refusal's stage, status and remedy. */
kiln_status kiln_plan_shapes_at(const kiln_plan *plan, const int64_t *values, int check,
                                const kiln_op_site *site, kiln_tensor_desc *tensors, kiln_op *ops,
                                kiln_error *err);

/* The symbol values a call's inputs give (in binding order, names for messages), each within
 * its bounds and equal wherever it appears; refusals name the input, the dim, the value and the
 * bound. An input of the wrong rank is skipped: the view check refuses it after. */
kiln_status kiln_plan_bind_symbols(const kiln_plan *plan, const char *const *names,
                                   const kiln_tensor_view *inputs, int64_t *values,
                                   kiln_error *err);

#endif
