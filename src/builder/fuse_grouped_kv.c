/* Grouped-query attention without the repeated k and v (see fuse_grouped_kv.h). */
#include "builder/fuse_grouped_kv.h"

#include "runtime/shape.h"
#include "runtime/sdpa_layout.h"

#include <stdlib.h>

#define MAX_VIEWS 8

/* The repeat feeding one SDPA operand: the EXPAND op, the views after it (views[0] writes
 * the operand), and the heads before the repeat. */
typedef struct repeat_match {
  int32_t expand, views[MAX_VIEWS];
  uint32_t n_views;
  int64_t kv_heads;
} repeat_match;

/* Whether tensor t, read once by the SDPA, is a repeat_kv of a [..., Hkv, S, E] tensor:
 * views (RESHAPE, COPY) back to one EXPAND of [..., Hkv, 1, S, E] along the 1, each op's
 * output read once. Views keep row-major order, so t[..., h, s, e] = x[..., h / n, 0, s, e]. */
static int match_repeat(const kiln_graph *g, uint32_t t, const uint32_t *uses, repeat_match *m) {
  const kiln_tensor_desc *k = &g->tensors[t].desc;
  int32_t r = k->rank, p;
  uint32_t cur = t;
  m->n_views = 0;
  if (r < 3) return 0;
  while ((p = kiln_graph_producer(g, cur, uses, 1)) >= 0 &&
         (g->ops[p].kind == KILN_OP_RESHAPE || g->ops[p].kind == KILN_OP_COPY)) {
    if (m->n_views == MAX_VIEWS) return 0;
    m->views[m->n_views++] = p;
    cur = g->ops[p].inputs[0];
  }
  if (m->n_views == 0 || p < 0 || g->ops[p].kind != KILN_OP_EXPAND) return 0;
  const kiln_tensor_desc *e = &g->tensors[cur].desc, *x = &g->tensors[g->ops[p].inputs[0]].desc;
  if (e->rank != r + 1 || x->rank != r + 1 || x->dims[r - 2] != 1 || e->dims[r - 2] < 2) return 0;
  for (int32_t d = 0; d <= r; d++)
    if (d != r - 2 && x->dims[d] != e->dims[d]) return 0;
  for (int32_t d = 0; d < r - 3; d++)
    if (e->dims[d] != k->dims[d]) return 0;
  if (e->dims[r - 3] * e->dims[r - 2] != k->dims[r - 3] || e->dims[r - 1] != k->dims[r - 2] ||
      e->dims[r] != k->dims[r - 1])
    return 0;
  m->expand = p;
  m->kv_heads = e->dims[r - 3];
  return 1;
}

/* The view writing operand t becomes a view of the expand's input with Hkv heads; the expand
 * and the other views are gone. */
static void drop_repeat(kiln_graph *g, uint32_t t, const repeat_match *m) {
  kiln_tensor_desc *k = &g->tensors[t].desc;
  kiln_op *view = &g->ops[m->views[0]];
  k->dims[k->rank - 3] = m->kv_heads;
  kiln_shape_nbytes(k->dtype, k->rank, k->dims, &k->nbytes);
  view->kind = KILN_OP_RESHAPE;
  view->inputs[0] = g->ops[m->expand].inputs[0];
  view->n_inputs = 1;
  view->n_iattr = (uint32_t)k->rank;
  for (int32_t d = 0; d < k->rank; d++) view->iattr[d] = k->dims[d];
  g->dead[m->expand] = 1;
  for (uint32_t i = 1; i < m->n_views; i++) g->dead[m->views[i]] = 1;
}

kiln_status kiln_fuse_grouped_kv(kiln_graph *g, kiln_error *err) {
  uint32_t *uses;
  int32_t *reader;
  kiln_status st = kiln_graph_readers(g, "grouped kv", &uses, &reader, err);
  if (st != KILN_OK) return st;
  for (uint32_t i = 0; i < g->n_ops; i++) {
    const kiln_op *s = &g->ops[i];
    repeat_match mk, mv;
    if (g->dead[i] || s->kind != KILN_OP_SDPA || s->n_inputs < 3 ||
        kiln_sdpa_layout(s) != 0 || s->inputs[1] == s->inputs[2])
      continue;
    if (!match_repeat(g, s->inputs[1], uses, &mk) || !match_repeat(g, s->inputs[2], uses, &mv) ||
        mk.kv_heads != mv.kv_heads)
      continue;
    drop_repeat(g, s->inputs[1], &mk);
    drop_repeat(g, s->inputs[2], &mv);
  }
  free(uses);
  free(reader);
  return KILN_OK;
}
