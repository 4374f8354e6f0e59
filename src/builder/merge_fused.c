/* Sibling FUSED groups joined into one (see merge_fused.h). */
#include "builder/merge_fused.h"

#include "runtime/alloc.h"
#include "runtime/fused_program.h"
#include "runtime/shape.h"

#include <stdlib.h>
#include <string.h>

/* A FUSED op's program: its words (a constant of the graph) and their layout. */
typedef struct program {
  const int64_t *w;
  int64_t n_words, n_maps, n_instrs;
  int32_t rank;
} program;

static int program_of(const kiln_graph *g, const kiln_op *op, program *p) {
  const kiln_gtensor *c = &g->tensors[op->iattr[0]];
  p->w = (const int64_t *)(const void *)c->data;
  p->n_words = op->iattr[1];
  p->rank = g->tensors[op->output].desc.rank;
  if (!p->w || p->n_words < 2) return 0;
  p->n_maps = p->w[0];
  p->n_instrs = p->w[1];
  return p->n_maps >= 0 && p->n_instrs >= 0 &&
         (uint64_t)p->n_words == kiln_fx_words((uint32_t)p->n_maps, (uint32_t)p->n_instrs, p->rank);
}

/* Map m's words: slot, offset, stride[rank], lo[rank], hi[rank]. */
static const int64_t *map_of(const program *p, int64_t m) {
  return p->w + 2 + m * (2 + 3 * (int64_t)p->rank);
}

/* 1 when b is a's program continued along dim d past a's extent ext_a (see merge_fused.h). A
 * SELECT along d (a cat's parts) comes with loads boxed along d, which this refuses. */
static int continues(const program *a, const program *b, int32_t d, int64_t ext_a,
                     int64_t ext_b) {
  const int32_t r = a->rank;
  if (a->n_words != b->n_words || a->n_maps != b->n_maps || a->n_instrs != b->n_instrs)
    return 0;
  for (int64_t m = 0; m < a->n_maps; m++) {
    const int64_t *x = map_of(a, m), *y = map_of(b, m);
    const int64_t *stride = x + 2, *lo_x = x + 2 + r, *hi_x = x + 2 + 2 * r;
    const int64_t *lo_y = y + 2 + r, *hi_y = y + 2 + 2 * r;
    if (x[0] != y[0] || y[1] != x[1] + ext_a * stride[d]) return 0;
    for (int32_t k = 0; k < r; k++) {
      if (y[2 + k] != stride[k]) return 0;
      if (k == d ? lo_x[k] != 0 || lo_y[k] != 0 || hi_x[k] != ext_a || hi_y[k] != ext_b
                 : lo_x[k] != lo_y[k] || hi_x[k] != hi_y[k])
        return 0;
    }
  }
  const int64_t *ia = map_of(a, a->n_maps), *ib = map_of(b, b->n_maps);
  for (int64_t i = 0; i < 2 * a->n_instrs; i++)
    if (ia[i] != ib[i]) return 0;
  return 1;
}

/* The dim along which op b continues op a (see merge_fused.h), or -1. */
static int32_t joins_along(const kiln_graph *g, uint32_t ia, uint32_t ib) {
  const kiln_op *a = &g->ops[ia], *b = &g->ops[ib];
  const kiln_tensor_desc *ya = &g->tensors[a->output].desc, *yb = &g->tensors[b->output].desc;
  program pa, pb;
  if (a->n_inputs != b->n_inputs ||
      memcmp(a->inputs, b->inputs, sizeof *a->inputs * a->n_inputs) ||
      ya->dtype != yb->dtype || ya->rank != yb->rank || !program_of(g, a, &pa) ||
      !program_of(g, b, &pb))
    return -1;
  for (int32_t d = 0; d < ya->rank; d++) {
    int other_dims_equal = 1;
    for (int32_t k = 0; k < ya->rank; k++)
      if (k != d) other_dims_equal &= ya->dims[k] == yb->dims[k];
    if (other_dims_equal && continues(&pa, &pb, d, ya->dims[d], yb->dims[d])) return d;
    if (ya->dims[d] != 1 || yb->dims[d] != 1) break; /* a later d would not slice to a view */
  }
  return -1;
}

/* 1 when FUSED op i may join another: its output is no binding or state value, and it reads
 * nothing a state's write may change. */
static int candidate(const kiln_graph *g, uint32_t i, const uint8_t *from_state) {
  const kiln_op *op = &g->ops[i];
  if (g->dead[i] || op->kind != KILN_OP_FUSED || kiln_graph_is_output(g, (int32_t)op->output))
    return 0;
  for (uint32_t k = 0; k < op->n_inputs; k++)
    if (from_state[op->inputs[k]]) return 0;
  return 1;
}

/* The joined op of a and b along d (its program a copy of a's with d's boxes widened) and the
 * two SLICEs writing their former outputs, into out[0..3). */
static kiln_status join(kiln_graph *g, uint32_t ia, uint32_t ib, int32_t d, kiln_op *out,
                        kiln_error *err) {
  const kiln_op *a = &g->ops[ia], *b = &g->ops[ib];
  kiln_tensor_desc y = g->tensors[a->output].desc, words = g->tensors[a->iattr[0]].desc;
  const int64_t ext_a = y.dims[d], ext_b = g->tensors[b->output].desc.dims[d];
  program p;
  int64_t *w = NULL;
  int32_t m = -1, c = -1;
  program_of(g, a, &p);
  y.dims[d] = ext_a + ext_b;
  memset(y.sym, 0, sizeof y.sym);
  if (!kiln_shape_nbytes(y.dtype, y.rank, y.dims, &y.nbytes) &&
      (w = kiln_malloc((size_t)words.nbytes)) &&
      (c = kiln_graph_add_tensor(g, KILN_NODE_CONSTANT, &words)) >= 0) {
    g->tensors[c].data = g->tensors[c].owned = (uint8_t *)w; /* the graph frees it from here */
    m = kiln_graph_add_tensor(g, KILN_NODE_OP, &y);
  }
  if (m < 0) {
    if (c < 0) free(w);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder op %u (fused): out of memory joining it with op %u; free memory "
                     "and retry",
                     (unsigned)ia, (unsigned)ib);
  }
  memcpy(w, p.w, (size_t)words.nbytes);
  for (int64_t k = 0; k < p.n_maps; k++) /* each map's box end along d: the joined extent */
    w[2 + k * (2 + 3 * (int64_t)p.rank) + 2 + 2 * p.rank + d] = y.dims[d];
  a = &g->ops[ia], b = &g->ops[ib]; /* the tensors moved, the ops did not */
  out[0] = *a;
  out[0].iattr[0] = c;
  out[0].output = (uint32_t)m;
  for (int k = 0; k < 2; k++) {
    kiln_op *s = &out[1 + k];
    memset(s, 0, sizeof *s);
    s->kind = KILN_OP_SLICE;
    s->n_inputs = 1;
    s->inputs[0] = (uint32_t)m;
    s->output = k ? b->output : a->output;
    s->n_iattr = 4;
    s->iattr[0] = d;
    s->iattr[1] = k ? ext_a : 0;
    s->iattr[2] = k ? ext_a + ext_b : ext_a;
    s->iattr[3] = 1;
  }
  return KILN_OK;
}

/* One round: each candidate joined with the first later one that continues it or that it
 * continues, in the earlier one's place; *joined: how many pairs. */
static kiln_status join_round(kiln_graph *g, uint32_t *joined, kiln_error *err) {
  const uint32_t n = g->n_ops ? g->n_ops : 1;
  uint8_t *from_state = kiln_malloc(g->n_tensors ? g->n_tensors : 1), *taken = kiln_malloc(n);
  uint32_t *pair = kiln_malloc(sizeof *pair * 2 * n), *at = kiln_malloc(sizeof *at * 3 * n);
  uint32_t *cand = kiln_malloc(sizeof *cand * n), n_cand = 0;
  int32_t *dim = kiln_malloc(sizeof *dim * n);
  kiln_op *ops = kiln_malloc(sizeof *ops * 3 * n);
  uint32_t n_pairs = 0;
  kiln_status st = KILN_OK;
  *joined = 0;
  if (!from_state || !pair || !cand || !dim || !taken || !ops || !at) {
    st = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                   "builder: out of memory for %u ops while joining sibling fused groups; free "
                   "memory and retry",
                   (unsigned)g->n_ops);
    goto done;
  }
  memset(taken, 0, n);
  kiln_graph_mark_state_derived(g, from_state);
  for (uint32_t i = 0; i < g->n_ops; i++)
    if (candidate(g, i, from_state)) cand[n_cand++] = i;
  for (uint32_t a = 0; a < n_cand; a++) {
    const uint32_t i = cand[a];
    if (taken[i]) continue;
    for (uint32_t b = a + 1; b < n_cand; b++) {
      const uint32_t j = cand[b];
      int32_t d = -1, first = 1; /* first: i's part comes first in the joined output */
      if (taken[j]) continue;
      if ((d = joins_along(g, i, j)) < 0 && (d = joins_along(g, j, i)) >= 0) first = 0;
      if (d < 0) continue;
      taken[i] = taken[j] = 1;
      pair[2 * n_pairs] = first ? i : j, pair[2 * n_pairs + 1] = first ? j : i;
      at[3 * n_pairs] = at[3 * n_pairs + 1] = at[3 * n_pairs + 2] = i;
      dim[n_pairs++] = d;
      break;
    }
  }
  for (uint32_t k = 0; k < n_pairs && st == KILN_OK; k++)
    st = join(g, pair[2 * k], pair[2 * k + 1], dim[k], ops + 3 * k, err);
  if (st != KILN_OK || n_pairs == 0) goto done;
  for (uint32_t k = 0; k < 2 * n_pairs; k++) g->dead[pair[k]] = 1;
  if (kiln_graph_insert_ops(g, at, ops, 3 * n_pairs)) {
    for (uint32_t k = 0; k < 2 * n_pairs; k++) g->dead[pair[k]] = 0;
    st = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                   "builder: out of memory inserting %u ops while joining sibling fused groups; "
                   "free memory and retry",
                   (unsigned)(3 * n_pairs));
  } else {
    *joined = n_pairs;
  }
done:
  free(from_state);
  free(pair);
  free(cand);
  free(dim);
  free(taken);
  free(ops);
  free(at);
  return st;
}

kiln_status kiln_merge_fused_siblings(kiln_graph *g, kiln_error *err) {
  uint32_t joined = 1;
  kiln_status st = KILN_OK;
  /* a joined op may join again (q's group with k's and v's joined before); each round leaves
   * fewer FUSED ops, so the rounds end */
  while (joined > 0 && st == KILN_OK) st = join_round(g, &joined, err);
  return st;
}
