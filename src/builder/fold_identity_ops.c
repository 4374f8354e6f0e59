/* INDEX, AND/OR and integer ADD/SUB/MUL ops that give their input back (see
 * fold_identity_ops.h). */
#include "builder/fold_identity_ops.h"

#include <string.h>

#define KILN_IDENTITY_MAX_ELEMS ((uint64_t)1 << 20) /* the most a gather is checked over */

static uint64_t numel(const kiln_tensor_desc *d) { return d->nbytes / kiln_dtype_size(d->dtype); }

/* Element e of the constant integer (I32 or I64) tensor t. */
static int64_t int_at(const kiln_gtensor *t, uint64_t e) {
  if (t->desc.dtype == KILN_I32) {
    int32_t v;
    memcpy(&v, t->data + 4 * e, 4);
    return v;
  }
  int64_t v;
  memcpy(&v, t->data + 8 * e, 8);
  return v;
}

/* Element at multi-index b (of rank rb, right-aligned) of the constant integer tensor t,
 * broadcasting its dims of size 1. */
static int64_t index_at(const kiln_gtensor *t, const int64_t *b, int32_t rb) {
  const kiln_tensor_desc *d = &t->desc;
  int64_t off = 0;
  for (int32_t k = 0; k < d->rank; k++) {
    int64_t i = b[rb - d->rank + k];
    off = off * d->dims[k] + (d->dims[k] == 1 ? 0 : i);
  }
  return int_at(t, (uint64_t)off);
}

/* Whether INDEX op gathers every element of its input in order: its indexed dims adjacent, its
 * indices constant, and the source of each output element at the output's own linear place. */
static int index_is_identity(const kiln_graph *g, const kiln_op *op) {
  const kiln_tensor_desc *x = &g->tensors[op->inputs[0]].desc, *out = &g->tensors[op->output].desc;
  if (numel(x) != numel(out) || numel(out) > KILN_IDENTITY_MAX_ELEMS)
    return 0;
  int32_t first = -1, last = -1, n_idx = 0;
  for (int32_t d = 0; d < x->rank; d++)
    if (op->iattr[0] >> d & 1) {
      if (first < 0) first = d;
      else if (d != last + 1) return 0; /* not adjacent: the broadcast dims lead the output */
      last = d, n_idx++;
    }
  if (first < 0 || (uint32_t)n_idx + 1 != op->n_inputs) return 0;
  int32_t rb = out->rank - (x->rank - n_idx); /* the broadcast index dims in the output */
  if (rb < 0 || rb > KILN_MAX_RANK) return 0;
  for (uint32_t k = 1; k < op->n_inputs; k++) {
    const kiln_gtensor *t = &g->tensors[op->inputs[k]];
    if (t->node != KILN_NODE_CONSTANT || !t->data || t->desc.rank > rb ||
        (t->desc.dtype != KILN_I32 && t->desc.dtype != KILN_I64))
      return 0;
  }
  int64_t o[KILN_MAX_RANK] = {0};
  for (uint64_t e = 0, n = numel(out); e < n; e++) {
    int64_t src = 0; /* the source's linear offset */
    for (int32_t d = 0; d < x->rank; d++) {
      int64_t i;
      if (d < first) i = o[d];
      else if (d > last) i = o[d - (x->rank - out->rank)];
      else {
        i = index_at(&g->tensors[op->inputs[1 + d - first]], o + first, rb);
        if (i < 0) i += x->dims[d];
      }
      if (i < 0 || i >= x->dims[d]) return 0;
      src = src * x->dims[d] + i;
    }
    if ((uint64_t)src != e) return 0;
    for (int32_t d = out->rank; d-- > 0;) {
      if (++o[d] < out->dims[d]) break;
      o[d] = 0;
    }
  }
  return 1;
}

/* Whether constant t is all `value` (nonzero bytes true) as a bool tensor. */
static int all_bool(const kiln_gtensor *t, int value) {
  if (t->node != KILN_NODE_CONSTANT || !t->data || t->desc.dtype != KILN_BOOL) return 0;
  for (uint64_t e = 0, n = numel(&t->desc); e < n; e++)
    if ((t->data[e] != 0) != value) return 0;
  return 1;
}

/* Whether constant t is all `value` as an integer tensor. */
static int all_int(const kiln_gtensor *t, int64_t value) {
  const kiln_tensor_desc *d = &t->desc;
  if (t->node != KILN_NODE_CONSTANT || !t->data || (d->dtype != KILN_I32 && d->dtype != KILN_I64))
    return 0;
  for (uint64_t e = 0, n = numel(d); e < n; e++)
    if (int_at(t, e) != value) return 0;
  return 1;
}

/* The operand op gives back, or -1: an AND with all-true or OR with all-false, of bools; an
 * ADD or SUB of an integer all-zero constant (ADD's first operand too, with alpha 1) or a MUL by
 * an integer all-one, where the result keeps the operand's dtype (not in a float type, where
 * x + 0 is not x: -0 + 0 is +0). Exported decoders add a zero arange to the cache position at
 * every decode step. */
static int32_t kept_operand(const kiln_graph *g, const kiln_op *op) {
  const kiln_tensor_desc *out = &g->tensors[op->output].desc;
  if (op->n_inputs != 2) return -1;
  for (int k = 0; k < 2; k++) {
    const kiln_gtensor *c = &g->tensors[op->inputs[k]];
    int keeps = 0;
    switch (op->kind) {
    case KILN_OP_BITWISE:
    case KILN_OP_LOGICAL:
      keeps = out->dtype == KILN_BOOL &&
              (op->iattr[0] == KILN_BOOL_AND || op->iattr[0] == KILN_BOOL_OR) &&
              all_bool(c, op->iattr[0] == KILN_BOOL_AND);
      break;
    case KILN_OP_ADD: keeps = (k == 1 || op->fattr[0] == 1.0) && all_int(c, 0); break;
    case KILN_OP_SUB: keeps = k == 1 && all_int(c, 0); break;
    case KILN_OP_MUL: keeps = all_int(c, 1); break;
    default: break;
    }
    if (keeps && g->tensors[op->inputs[1 - k]].desc.dtype == out->dtype)
      return (int32_t)op->inputs[1 - k];
  }
  return -1;
}

/* Op i becomes RESHAPE (same element count) or EXPAND of x to its own output's dims. */
static void become_view(kiln_graph *g, uint32_t i, int32_t x, kiln_op_kind kind) {
  kiln_op *op = &g->ops[i];
  const kiln_tensor_desc *out = &g->tensors[op->output].desc;
  op->kind = kind;
  memset(op->inputs, 0, sizeof op->inputs);
  op->inputs[0] = (uint32_t)x;
  op->n_inputs = 1;
  op->n_iattr = (uint32_t)out->rank;
  for (int32_t d = 0; d < out->rank; d++) op->iattr[d] = out->dims[d];
  memset(op->iattr_sym, 0, sizeof op->iattr_sym);
  memset(op->fattr, 0, sizeof op->fattr);
}

kiln_status kiln_fold_identity_ops(kiln_graph *g, int dynamic, kiln_error *err) {
  (void)err;
  if (dynamic) return KILN_OK;
  for (uint32_t i = 0; i < g->n_ops; i++) {
    const kiln_op *op = &g->ops[i];
    if (g->dead[i]) continue;
    if (op->kind == KILN_OP_INDEX && index_is_identity(g, op)) {
      become_view(g, i, (int32_t)op->inputs[0], KILN_OP_RESHAPE);
      continue;
    }
    int32_t x = kept_operand(g, op);
    if (x < 0) continue;
    become_view(g, i, x, numel(&g->tensors[x].desc) == numel(&g->tensors[op->output].desc)
                             ? KILN_OP_RESHAPE
                             : KILN_OP_EXPAND);
  }
  return KILN_OK;
}
