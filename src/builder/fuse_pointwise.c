/* Pointwise-chain fusion: a run of single-use pointwise ops becomes one POINTWISE op. */
#include "builder/fuse_pointwise.h"

#include "runtime/pointwise_steps.h"
#include "runtime/shape.h"

#include <stdlib.h>
#include <string.h>

/* The POINTWISE op a chain grows into. */
typedef struct chain {
  kiln_op op;
  int has_pow;
} chain;

/* Appends op, which reads the chain's current value, as the chain's next step; 0 (chain
 * unchanged) when it cannot be one. */
static int add_step(const kiln_graph *g, const kiln_op *op, uint32_t value, chain *c) {
  const kiln_tensor_desc *v = &g->tensors[value].desc, *out = &g->tensors[op->output].desc;
  kiln_op_kind kind = op->kind;
  uint32_t slot = 1, other;
  int reversed;
  if (!kiln_pw_step_kind_ok(kind) || !kiln_dtype_is_float(v->dtype) || out->dtype != v->dtype ||
      !kiln_same_dims(out, v) || c->op.n_iattr >= KILN_PW_MAX_STEPS)
    return 0;
  if (!kiln_pw_is_binary(kind)) {
    if (kind == KILN_OP_POW && c->has_pow) return 0;
    if (kind == KILN_OP_POW) c->has_pow = 1, c->op.fattr[0] = op->fattr[0];
    c->op.iattr[c->op.n_iattr++] =
        KILN_PW_STEP(kind, 0, kind == KILN_OP_GELU && op->iattr[0] ? KILN_PW_GELU_TANH : 0);
    return 1;
  }
  if ((kind == KILN_OP_ADD || kind == KILN_OP_SUB) && op->fattr[0] != 1.0) return 0;
  reversed = op->inputs[0] != value;
  other = op->inputs[reversed ? 0 : 1];
  while (slot < c->op.n_inputs && c->op.inputs[slot] != other) slot++;
  if (slot == KILN_MAX_OP_INPUTS) return 0;
  if (slot == c->op.n_inputs) c->op.inputs[c->op.n_inputs++] = other;
  /* a + b and a * b are exact in either order; the others record it (minimum and maximum
   * pick a of two equal values, which for 0 and -0 shows). */
  reversed = reversed && kind != KILN_OP_ADD && kind != KILN_OP_MUL;
  c->op.iattr[c->op.n_iattr++] = KILN_PW_STEP(kind, slot, reversed ? KILN_PW_REVERSED : 0);
  return 1;
}

/* The chain's main input when op starts one: its operand of the output's shape, or -1. */
static int64_t chain_input(const kiln_graph *g, const kiln_op *op) {
  const kiln_tensor_desc *out = &g->tensors[op->output].desc;
  if (!kiln_pw_step_kind_ok(op->kind)) return -1;
  for (uint32_t k = 0; k < (kiln_pw_is_binary(op->kind) ? 2u : 1u); k++)
    if (kiln_same_dims(&g->tensors[op->inputs[k]].desc, out)) return op->inputs[k];
  return -1;
}

int kiln_pointwise_of(const kiln_graph *g, const kiln_op *op, kiln_op *out) {
  int64_t x;
  chain c;
  if (op->kind == KILN_OP_POINTWISE) {
    *out = *op;
    return 1;
  }
  if ((x = chain_input(g, op)) < 0) return 0;
  memset(&c, 0, sizeof c);
  c.op.kind = KILN_OP_POINTWISE;
  c.op.n_inputs = 1;
  c.op.inputs[0] = (uint32_t)x;
  c.op.output = op->output;
  if (!add_step(g, op, (uint32_t)x, &c)) return 0;
  *out = c.op;
  return 1;
}

/* Grows a chain from op `first`; when it reaches two steps, its last op becomes the POINTWISE
 * op and the others die. uses counts output bindings too, so a value read once by a live op
 * is read by nothing else. */
static void fuse_from(kiln_graph *g, uint32_t first, const uint32_t *uses,
                      const int32_t *reader) {
  uint32_t members[KILN_PW_MAX_STEPS], n_members = 1, value;
  int64_t x = chain_input(g, &g->ops[first]);
  chain c;
  if (x < 0) return;
  memset(&c, 0, sizeof c);
  c.op.kind = KILN_OP_POINTWISE;
  c.op.n_inputs = 1;
  c.op.inputs[0] = (uint32_t)x;
  if (!add_step(g, &g->ops[first], (uint32_t)x, &c)) return;
  members[0] = first;
  value = g->ops[first].output;
  while (uses[value] == 1 && reader[value] >= 0 && !g->dead[reader[value]] &&
         add_step(g, &g->ops[reader[value]], value, &c)) {
    members[n_members++] = (uint32_t)reader[value];
    value = g->ops[reader[value]].output;
  }
  if (n_members < 2) return;
  for (uint32_t i = 0; i + 1 < n_members; i++) g->dead[members[i]] = 1;
  c.op.output = value;
  g->ops[members[n_members - 1]] = c.op;
}

kiln_status kiln_fuse_pointwise(kiln_graph *g, kiln_error *err) {
  uint32_t *uses;
  int32_t *reader;
  kiln_status s = kiln_graph_readers(g, "pointwise chains", &uses, &reader, err);
  if (s != KILN_OK) return s;
  for (uint32_t i = 0; i < g->n_ops; i++)
    if (!g->dead[i]) fuse_from(g, i, uses, reader);
  free(uses);
  free(reader);
  return KILN_OK;
}
