/* Common subexpression elimination (see merge_common.h). */
#include "builder/merge_common.h"

#include "runtime/alloc.h"
#include "runtime/shape.h"

#include <stdlib.h>
#include <string.h>

/* Constants up to this many bytes (positions, scalars, masks) are compared by their bytes. */
#define KILN_MERGE_CONSTANT_MAX 4096u

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

static uint64_t op_hash(const kiln_op *op) {
  uint64_t h = mix((uint64_t)op->kind, op->n_inputs);
  for (uint32_t k = 0; k < op->n_inputs; k++) h = mix(h, op->inputs[k]);
  h = mix(h, op->n_iattr);
  for (uint32_t k = 0; k < op->n_iattr; k++) {
    h = mix(h, (uint64_t)op->iattr[k]);
    h = mix(h, op->iattr_sym[k].symbol);
  }
  for (uint32_t k = 0; k < KILN_MAX_FATTR; k++) {
    uint64_t bits;
    memcpy(&bits, &op->fattr[k], sizeof bits);
    h = mix(h, bits);
  }
  return h;
}

static uint64_t constant_hash(const kiln_gtensor *t) {
  uint64_t h = mix((uint64_t)t->desc.dtype, (uint64_t)t->desc.rank);
  for (int32_t d = 0; d < t->desc.rank; d++) h = mix(h, (uint64_t)t->desc.dims[d]);
  for (uint64_t k = 0; k < t->desc.nbytes; k++) h = mix(h, t->data[k]);
  return h;
}

static int same_constant(const kiln_gtensor *a, const kiln_gtensor *b) {
  return kiln_same_desc(&a->desc, &b->desc) && a->desc.nbytes == b->desc.nbytes &&
         !memcmp(a->data, b->data, (size_t)a->desc.nbytes);
}

/* Whether ops a and b compute the same tensor from the same tensors. */
static int same_op(const kiln_graph *g, const kiln_op *a, const kiln_op *b) {
  if (a->kind != b->kind || a->n_inputs != b->n_inputs || a->n_iattr != b->n_iattr ||
      memcmp(a->inputs, b->inputs, sizeof a->inputs[0] * a->n_inputs) ||
      memcmp(a->iattr, b->iattr, sizeof a->iattr[0] * a->n_iattr) ||
      memcmp(a->fattr, b->fattr, sizeof a->fattr))
    return 0;
  for (uint32_t k = 0; k < a->n_iattr; k++) {
    const kiln_sym_size *x = &a->iattr_sym[k], *y = &b->iattr_sym[k];
    if (x->symbol != y->symbol || (x->symbol && (x->coeff != y->coeff || x->offset != y->offset)))
      return 0;
  }
  return kiln_same_desc(&g->tensors[a->output].desc, &g->tensors[b->output].desc);
}

kiln_status kiln_merge_common_ops(kiln_graph *g, kiln_error *err) {
  size_t slots = 16;
  while (slots < 2 * (size_t)g->n_ops || slots < 2 * (size_t)g->n_tensors) slots *= 2;
  uint32_t *table = kiln_calloc(slots, sizeof *table); /* 1 + constant, then 1 + op; 0 empty */
  uint32_t *replace = kiln_malloc(sizeof *replace * (g->n_tensors ? g->n_tensors : 1));
  uint8_t *from_state = kiln_malloc(g->n_tensors ? g->n_tensors : 1);
  if (!table || !replace || !from_state) {
    free(table), free(replace), free(from_state);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder: out of memory merging repeated ops among %u; free memory and retry",
                     (unsigned)g->n_ops);
  }
  kiln_graph_mark_state_derived(g, from_state);
  for (uint32_t t = 0; t < g->n_tensors; t++) {
    const kiln_gtensor *c = &g->tensors[t];
    replace[t] = t;
    if (c->node != KILN_NODE_CONSTANT || c->desc.nbytes > KILN_MERGE_CONSTANT_MAX || !c->data)
      continue;
    size_t at = (size_t)constant_hash(c) & (slots - 1);
    for (; table[at]; at = (at + 1) & (slots - 1))
      if (same_constant(&g->tensors[table[at] - 1], c)) break;
    if (table[at]) replace[t] = table[at] - 1;
    else table[at] = t + 1;
  }
  memset(table, 0, slots * sizeof *table);
  for (uint32_t i = 0; i < g->n_ops; i++) {
    kiln_op *op = &g->ops[i];
    if (g->dead[i]) continue;
    for (uint32_t k = 0; k < op->n_inputs; k++) op->inputs[k] = replace[op->inputs[k]];
    if (from_state[op->output] || op->kind == KILN_OP_INDEX_COPY) continue;
    size_t at = (size_t)op_hash(op) & (slots - 1);
    for (; table[at]; at = (at + 1) & (slots - 1))
      if (same_op(g, &g->ops[table[at] - 1], op)) break;
    if (!table[at]) {
      table[at] = i + 1;
    } else if (!kiln_graph_is_output(g, (int32_t)op->output)) {
      replace[op->output] = g->ops[table[at] - 1].output;
      g->dead[i] = 1;
    }
  }
  free(table), free(replace), free(from_state);
  return KILN_OK;
}
