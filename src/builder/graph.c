/* The builder's graph: growth, copying, use counts and dead-code removal. */
#include "builder/graph.h"

#include "runtime/alloc.h"

#include <stdlib.h>
#include <string.h>

/* Grows *items to hold one more element of `size` bytes; 0 on success. */
static int reserve(void **items, uint32_t *cap, uint32_t count, size_t size) {
  uint32_t want;
  void *p;
  if (count < *cap) return 0;
  if (count >= UINT32_MAX / 2) return -1;
  want = *cap ? *cap * 2 : 16;
  if (!(p = kiln_realloc(*items, (size_t)want * size))) return -1;
  *items = p;
  *cap = want;
  return 0;
}

int32_t kiln_graph_add_tensor(kiln_graph *g, kiln_node node, const kiln_tensor_desc *desc) {
  kiln_gtensor *t;
  if (g->n_tensors >= INT32_MAX ||
      reserve((void **)&g->tensors, &g->cap_tensors, g->n_tensors, sizeof *g->tensors))
    return -1;
  t = &g->tensors[g->n_tensors];
  memset(t, 0, sizeof *t);
  t->desc = *desc;
  t->node = node;
  t->producer = -1;
  t->transpose_of = -1;
  t->state = -1;
  return (int32_t)g->n_tensors++;
}

int32_t kiln_graph_add_op(kiln_graph *g, const kiln_op *op, const kiln_tensor_desc *out) {
  uint32_t cap = g->cap_ops;
  int32_t t;
  if (g->n_ops >= INT32_MAX || reserve((void **)&g->ops, &cap, g->n_ops, sizeof *g->ops))
    return -1;
  if (cap != g->cap_ops) {
    uint8_t *dead = kiln_realloc(g->dead, cap);
    if (!dead) return -1;
    g->dead = dead;
    g->cap_ops = cap;
  }
  if ((t = kiln_graph_add_tensor(g, KILN_NODE_OP, out)) < 0) return -1;
  g->tensors[t].producer = (int32_t)g->n_ops;
  g->ops[g->n_ops] = *op;
  g->ops[g->n_ops].output = (uint32_t)t;
  g->dead[g->n_ops] = 0;
  return (int32_t)g->n_ops++;
}

int kiln_graph_insert_ops(kiln_graph *g, const uint32_t *at, const kiln_op *ops, uint32_t n) {
  uint32_t total = g->n_ops + n, k = 0, j = 0;
  kiln_op *new_ops;
  uint8_t *new_dead;
  int32_t *moved;
  if (n == 0) return 0;
  if (total < n || total >= INT32_MAX) return -1;
  for (uint32_t m = 0; m < n; m++)
    if (at[m] > g->n_ops || (m > 0 && at[m] < at[m - 1])) return -1;
  new_ops = kiln_malloc(sizeof *new_ops * total);
  new_dead = kiln_malloc(total);
  moved = kiln_malloc(sizeof *moved * (g->n_ops ? g->n_ops : 1));
  if (!new_ops || !new_dead || !moved) {
    free(new_ops);
    free(new_dead);
    free(moved);
    return -1;
  }
  for (uint32_t i = 0; i <= g->n_ops; i++) {
    for (; k < n && at[k] == i; k++, j++) {
      new_ops[j] = ops[k];
      new_dead[j] = 0;
    }
    if (i == g->n_ops) break;
    new_ops[j] = g->ops[i];
    new_dead[j] = g->dead[i];
    moved[i] = (int32_t)j++;
  }
  for (uint32_t t = 0; t < g->n_tensors; t++)
    if (g->tensors[t].node == KILN_NODE_OP && g->tensors[t].producer >= 0)
      g->tensors[t].producer = moved[g->tensors[t].producer];
  for (uint32_t m = 0; m < n; m++) g->tensors[ops[m].output].producer = (int32_t)(at[m] + m);
  free(moved);
  free(g->ops);
  free(g->dead);
  g->ops = new_ops;
  g->dead = new_dead;
  g->n_ops = g->cap_ops = total;
  return 0;
}

int kiln_graph_clone(const kiln_graph *src, kiln_graph *dst) {
  memset(dst, 0, sizeof *dst);
  dst->tensors = kiln_malloc(sizeof *dst->tensors * (src->n_tensors ? src->n_tensors : 1));
  dst->ops = kiln_malloc(sizeof *dst->ops * (src->n_ops ? src->n_ops : 1));
  dst->dead = kiln_malloc(src->n_ops ? src->n_ops : 1);
  if (!dst->tensors || !dst->ops || !dst->dead) {
    kiln_graph_release(dst);
    return -1;
  }
  memcpy(dst->tensors, src->tensors, sizeof *dst->tensors * src->n_tensors);
  for (uint32_t i = 0; i < src->n_tensors; i++) dst->tensors[i].owned = NULL;
  memcpy(dst->ops, src->ops, sizeof *dst->ops * src->n_ops);
  memcpy(dst->dead, src->dead, src->n_ops);
  dst->n_tensors = dst->cap_tensors = src->n_tensors;
  dst->n_ops = dst->cap_ops = src->n_ops;
  memcpy(dst->inputs, src->inputs, sizeof dst->inputs);
  dst->n_inputs = src->n_inputs;
  memcpy(dst->outputs, src->outputs, sizeof dst->outputs);
  dst->n_outputs = src->n_outputs;
  memcpy(dst->states, src->states, sizeof dst->states);
  dst->n_states = src->n_states;
  return 0;
}

void kiln_graph_release(kiln_graph *g) {
  for (uint32_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].owned);
  free(g->tensors);
  free(g->ops);
  free(g->dead);
  memset(g, 0, sizeof *g);
}

void kiln_graph_count_uses(const kiln_graph *g, uint32_t *uses) {
  memset(uses, 0, sizeof *uses * g->n_tensors);
  for (uint32_t i = 0; i < g->n_ops; i++) {
    if (g->dead[i]) continue;
    for (uint32_t k = 0; k < g->ops[i].n_inputs; k++) uses[g->ops[i].inputs[k]]++;
  }
  for (uint32_t i = 0; i < g->n_outputs; i++) uses[g->outputs[i].tensor]++;
  for (uint32_t i = 0; i < g->n_states; i++)
    if (g->states[i].value != g->states[i].tensor) uses[g->states[i].value]++;
}

int kiln_graph_is_output(const kiln_graph *g, int32_t t) {
  for (uint32_t i = 0; i < g->n_outputs; i++)
    if (g->outputs[i].tensor == t) return 1;
  for (uint32_t i = 0; i < g->n_states; i++)
    if (g->states[i].value == t && g->states[i].tensor != t) return 1;
  return 0;
}

int kiln_op_follows_symbol(const kiln_op *op) {
  for (uint32_t k = 0; k < op->n_iattr; k++)
    if (op->iattr_sym[k].symbol) return 1;
  return 0;
}

void kiln_graph_mark_state_derived(const kiln_graph *g, uint8_t *from_state) {
  for (uint32_t t = 0; t < g->n_tensors; t++) from_state[t] = g->tensors[t].node == KILN_NODE_STATE;
  for (uint32_t i = 0; i < g->n_ops; i++) {
    const kiln_op *op = &g->ops[i];
    /* the kinds the memory plan may place on their input's bytes (runtime/view.h); any other
     * op writes bytes of its own, which no state write changes */
    int view = op->kind == KILN_OP_RESHAPE || op->kind == KILN_OP_COPY ||
               op->kind == KILN_OP_PERMUTE || op->kind == KILN_OP_SELECT ||
               op->kind == KILN_OP_SLICE;
    if (!g->dead[i] && view && op->n_inputs > 0) from_state[op->output] |= from_state[op->inputs[0]];
  }
}

/* needed[t] = 1 for each tensor an output binding, a live state's write or a live op needing it
 * reaches, by one backward sweep over the live ops. */
static void mark_needed(const kiln_graph *g, const uint8_t *live_state, uint8_t *needed) {
  memset(needed, 0, g->n_tensors);
  for (uint32_t i = 0; i < g->n_outputs; i++) needed[g->outputs[i].tensor] = 1;
  for (uint32_t i = 0; i < g->n_states; i++)
    if (live_state[i]) needed[g->states[i].value] = 1;
  for (uint32_t i = g->n_ops; i-- > 0;) {
    const kiln_op *op = &g->ops[i];
    if (g->dead[i] || !needed[op->output]) continue;
    for (uint32_t k = 0; k < op->n_inputs; k++) needed[op->inputs[k]] = 1;
  }
}

kiln_status kiln_graph_remove_dead(kiln_graph *g, kiln_error *err) {
  uint8_t *needed = kiln_calloc(g->n_tensors ? g->n_tensors : 1, 1);
  uint8_t live_state[KILN_MAX_BINDINGS] = {0};
  if (!needed)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder: out of memory for %u tensors during dead-code removal; free memory "
                     "and retry",
                     (unsigned)g->n_tensors);
  /* A state lives when what the outputs need reads it, or what a live state's write needs:
   * grown to a fixed point from none, so a state only its own next value reads (a counter
   * nothing else uses) stays dead and its write is dropped. */
  for (int grew = 1; grew;) {
    grew = 0;
    mark_needed(g, live_state, needed);
    for (uint32_t i = 0; i < g->n_states; i++)
      if (!live_state[i] && needed[g->states[i].tensor]) live_state[i] = 1, grew = 1;
  }
  for (uint32_t i = 0; i < g->n_states; i++)
    if (!live_state[i]) g->states[i].value = g->states[i].tensor;
  for (uint32_t i = 0; i < g->n_ops; i++)
    if (!needed[g->ops[i].output]) g->dead[i] = 1;
  free(needed);
  return KILN_OK;
}

kiln_status kiln_graph_readers(const kiln_graph *g, const char *pass, uint32_t **uses,
                               int32_t **reader, kiln_error *err) {
  size_t n = g->n_tensors ? g->n_tensors : 1;
  *uses = kiln_malloc(sizeof **uses * n);
  *reader = kiln_malloc(sizeof **reader * n);
  if (!*uses || !*reader) {
    free(*uses);
    free(*reader);
    *uses = NULL;
    *reader = NULL;
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder: out of memory for %u tensors while fusing %.20s; free memory and "
                     "retry",
                     (unsigned)g->n_tensors, pass);
  }
  kiln_graph_count_uses(g, *uses);
  for (uint32_t t = 0; t < g->n_tensors; t++) (*reader)[t] = -1;
  for (uint32_t i = 0; i < g->n_ops; i++)
    for (uint32_t k = 0; !g->dead[i] && k < g->ops[i].n_inputs; k++)
      (*reader)[g->ops[i].inputs[k]] = (int32_t)i;
  return KILN_OK;
}

int32_t kiln_graph_producer(const kiln_graph *g, uint32_t t, const uint32_t *uses,
                            uint32_t readers) {
  const kiln_gtensor *x = &g->tensors[t];
  if (x->node != KILN_NODE_OP || uses[t] != readers || g->dead[x->producer]) return -1;
  return x->producer;
}
