/* Sibling linears joined into one GEMM (see merge_linears.h). */
#include "builder/merge_linears.h"

#include "runtime/alloc.h"
#include "runtime/linear_inputs.h"
#include "runtime/pointwise_steps.h"
#include "runtime/shape.h"
#include "runtime/view.h"

#include <stdlib.h>
#include <string.h>

#define MAX_VIEW_DEPTH 4 /* free views followed from an output to the op that takes its slice */

/* A linear that may join others: its op and its input. */
typedef struct sibling {
  uint32_t op, x;
  int taken; /* grouped already */
} sibling;

static kiln_activation activation(const kiln_op *op) {
  return op->n_iattr > 0 ? (kiln_activation)op->iattr[0] : KILN_ACT_NONE;
}

/* 1 when op i is a LINEAR that could share a GEMM (shape inference made its weight [N,K] and
 * its bias [N]): the weight and any bias constants, an activation other than SwiGLU (whose
 * weight stacks gate over up), no residual, an output that is neither an output binding nor a
 * state's value. */
static int candidate(const kiln_graph *g, uint32_t i) {
  const kiln_op *op = &g->ops[i];
  if (g->dead[i] || op->kind != KILN_OP_LINEAR || kiln_linear_has_residual(op) ||
      activation(op) == KILN_ACT_SWIGLU || kiln_graph_is_output(g, (int32_t)op->output))
    return 0;
  return g->tensors[op->inputs[1]].node == KILN_NODE_CONSTANT &&
         (!kiln_linear_has_bias(op) || g->tensors[op->inputs[2]].node == KILN_NODE_CONSTANT);
}

/* 1 when linears a and b of one input may be one GEMM: weights of one dtype, one activation,
 * and a bias on both (of one dtype) or on neither. */
static int compatible(const kiln_graph *g, const kiln_op *a, const kiln_op *b) {
  int bias_a = kiln_linear_has_bias(a), bias_b = kiln_linear_has_bias(b);
  if (g->tensors[a->inputs[1]].desc.dtype != g->tensors[b->inputs[1]].desc.dtype ||
      activation(a) != activation(b) || bias_a != bias_b)
    return 0;
  return !bias_a || g->tensors[a->inputs[2]].desc.dtype == g->tensors[b->inputs[2]].desc.dtype;
}

/* 1 when op is of a kind kiln_fuse_groups takes into a group: float pointwise ops, casts
 * between floats and views, every input and the output floats. */
static int groupable(const kiln_graph *g, const kiln_op *op) {
  if (!kiln_dtype_is_float(g->tensors[op->output].desc.dtype)) return 0;
  for (uint32_t k = 0; k < op->n_inputs; k++)
    if (!kiln_dtype_is_float(g->tensors[op->inputs[k]].desc.dtype)) return 0;
  switch (op->kind) {
  case KILN_OP_POINTWISE:
  case KILN_OP_CAST:
  case KILN_OP_COPY:
  case KILN_OP_PERMUTE:
  case KILN_OP_EXPAND:
  case KILN_OP_SELECT:
  case KILN_OP_RESHAPE:
  case KILN_OP_CAT: return 1;
  case KILN_OP_SLICE: return op->iattr[3] >= 1;
  default: return kiln_pw_step_kind_ok(op->kind);
  }
}

/* A reshape whose index map the group composes with a slice of the last dim: it keeps every dim
 * but the last and splits the last (a head split). */
static int splits_last_dim(const kiln_tensor_desc *in, const kiln_tensor_desc *out) {
  if (out->rank < in->rank) return 0;
  for (int32_t d = 0; d + 1 < in->rank; d++)
    if (out->dims[d] != in->dims[d]) return 0;
  return 1;
}

/* 1 when a slice written to tensor t would be taken into the group of an op doing work: t is
 * read once, by a groupable op that moves bytes (a permute of the heads, the rotary
 * embedding's arithmetic), or by a view that moves none whose output passes the same test. */
static int absorbed(const kiln_graph *g, uint32_t t, const uint32_t *uses, const int32_t *reader,
                    int depth) {
  const kiln_op *op;
  uint64_t at;
  if (uses[t] != 1 || reader[t] < 0) return 0; /* one op reads t, and no output binding */
  op = &g->ops[reader[t]];
  if (!groupable(g, op)) return 0;
  if (!kiln_op_is_view(op, &g->tensors[t].desc, &at)) return 1;
  if (op->kind == KILN_OP_RESHAPE &&
      !splits_last_dim(&g->tensors[t].desc, &g->tensors[op->output].desc))
    return 0;
  return depth < MAX_VIEW_DEPTH && absorbed(g, op->output, uses, reader, depth + 1);
}

/* 1 when the slice of linear i's columns costs no copy of its own. In a dynamic graph the
 * stride of a dim before another that follows a symbol follows it too, and a group whose loads
 * change with the sizes is not kept: one dim of the rows may exceed 1, whose stride is N. */
static int pays(const kiln_graph *g, uint32_t i, int dynamic, const uint32_t *uses,
                const int32_t *reader) {
  const kiln_tensor_desc *x = &g->tensors[g->ops[i].inputs[0]].desc;
  int64_t rows = 1;
  int32_t wide = 0;
  for (int32_t d = 0; d + 1 < x->rank; d++) rows *= x->dims[d], wide += x->dims[d] > 1;
  return rows == 1 || ((!dynamic || wide <= 1) && absorbed(g, g->ops[i].output, uses, reader, 0));
}

static int by_input(const void *pa, const void *pb) {
  const sibling *a = pa, *b = pb;
  if (a->x != b->x) return a->x < b->x ? -1 : 1;
  return a->op < b->op ? -1 : a->op > b->op;
}

/* Bytes of the constants `which` (1 weight, 2 bias) of the linears ops[0..n) one after another
 * in a new constant of rows `rows`; its id, or -1 out of memory. */
static int32_t stack(kiln_graph *g, const uint32_t *ops, uint32_t n, uint32_t which, int64_t rows) {
  kiln_tensor_desc desc = g->tensors[g->ops[ops[0]].inputs[which]].desc;
  uint8_t *bytes;
  uint64_t at = 0;
  int32_t id;
  desc.dims[0] = rows;
  if (kiln_shape_nbytes(desc.dtype, desc.rank, desc.dims, &desc.nbytes) || desc.nbytes > SIZE_MAX ||
      !(bytes = kiln_malloc((size_t)desc.nbytes)))
    return -1;
  for (uint32_t k = 0; k < n; k++) {
    const kiln_gtensor *c = &g->tensors[g->ops[ops[k]].inputs[which]];
    memcpy(bytes + at, c->data, (size_t)c->desc.nbytes);
    at += c->desc.nbytes;
  }
  if ((id = kiln_graph_add_tensor(g, KILN_NODE_CONSTANT, &desc)) < 0) {
    free(bytes);
    return -1;
  }
  g->tensors[id].data = g->tensors[id].owned = bytes;
  return id;
}

/* The joined LINEAR of ops[0..n) (in op order) and a SLICE per former output, into out[0..n]. */
static kiln_status join(kiln_graph *g, const uint32_t *ops, uint32_t n, kiln_op *out,
                        kiln_error *err) {
  const kiln_op *first = &g->ops[ops[0]];
  kiln_tensor_desc y = g->tensors[first->output].desc;
  int64_t rows = 0, at = 0;
  int32_t w, b = -1, m;
  for (uint32_t k = 0; k < n; k++) rows += g->tensors[g->ops[ops[k]].inputs[1]].desc.dims[0];
  y.dims[y.rank - 1] = rows;
  memset(y.sym, 0, sizeof y.sym);
  if ((w = stack(g, ops, n, 1, rows)) < 0 ||
      (kiln_linear_has_bias(first) && (b = stack(g, ops, n, 2, rows)) < 0) ||
      kiln_shape_nbytes(y.dtype, y.rank, y.dims, &y.nbytes) ||
      (m = kiln_graph_add_tensor(g, KILN_NODE_OP, &y)) < 0)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder op %u (linear): out of memory joining %u sibling linears' weights; "
                     "free memory and retry",
                     (unsigned)ops[0], (unsigned)n);
  out[0] = g->ops[ops[0]];
  out[0].inputs[1] = (uint32_t)w;
  if (b >= 0) out[0].inputs[2] = (uint32_t)b;
  out[0].output = (uint32_t)m;
  for (uint32_t k = 0; k < n; k++) {
    kiln_op *s = &out[k + 1];
    int64_t cols = g->tensors[g->ops[ops[k]].inputs[1]].desc.dims[0];
    memset(s, 0, sizeof *s);
    s->kind = KILN_OP_SLICE;
    s->n_inputs = 1;
    s->inputs[0] = (uint32_t)m;
    s->output = g->ops[ops[k]].output;
    s->n_iattr = 4;
    s->iattr[0] = y.rank - 1;
    s->iattr[1] = at;
    s->iattr[2] = at + cols;
    s->iattr[3] = 1;
    at += cols;
  }
  return KILN_OK;
}

/* Groups the siblings of one input, sib[0..n) in op order: each ungrouped one with every later
 * compatible one. Writes the members of each group of two or more, first to last, into
 * members, each group preceded by its count; returns the words written. */
static uint32_t form_groups(const kiln_graph *g, sibling *sib, uint32_t n, uint32_t *members) {
  uint32_t w = 0;
  for (uint32_t a = 0; a < n; a++) {
    uint32_t count = 1, head = w;
    if (sib[a].taken) continue;
    members[w + 1] = sib[a].op;
    for (uint32_t b = a + 1; b < n; b++)
      if (!sib[b].taken && compatible(g, &g->ops[sib[a].op], &g->ops[sib[b].op])) {
        sib[b].taken = 1;
        members[w + 1 + count++] = sib[b].op;
      }
    sib[a].taken = 1;
    if (count < 2) continue;
    members[head] = count;
    w += 1 + count;
  }
  return w;
}

/* A group of siblings: where its members start in the members array (after its count). */
typedef struct group {
  uint32_t first_op, word;
} group;

static int by_first_op(const void *pa, const void *pb) {
  const group *a = pa, *b = pb;
  return a->first_op < b->first_op ? -1 : a->first_op > b->first_op;
}

/* Every group joined in one insertion, each group's ops where its first linear was. */
static kiln_status join_all(kiln_graph *g, const uint32_t *members, uint32_t words,
                            kiln_error *err) {
  uint32_t n_groups = 0, n_new = 0, filled = 0;
  group *gs = NULL;
  kiln_op *ops = NULL;
  uint32_t *at = NULL;
  kiln_status st = KILN_OK;
  for (uint32_t w = 0; w < words; w += 1 + members[w]) n_groups++, n_new += 1 + members[w];
  if (n_groups == 0) return KILN_OK;
  gs = kiln_malloc(sizeof *gs * n_groups);
  ops = kiln_malloc(sizeof *ops * n_new);
  at = kiln_malloc(sizeof *at * n_new);
  if (!gs || !ops || !at) {
    st = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                   "builder: out of memory for %u ops while joining sibling linears; free memory "
                   "and retry",
                   (unsigned)n_new);
    goto done;
  }
  for (uint32_t w = 0, k = 0; w < words; w += 1 + members[w])
    gs[k++] = (group){members[w + 1], w + 1};
  qsort(gs, n_groups, sizeof *gs, by_first_op);
  for (uint32_t k = 0; k < n_groups && st == KILN_OK; k++) {
    uint32_t c = members[gs[k].word - 1];
    st = join(g, members + gs[k].word, c, ops + filled, err);
    for (uint32_t j = 0; j <= c; j++) at[filled + j] = gs[k].first_op;
    filled += c + 1;
  }
  if (st != KILN_OK) goto done;
  for (uint32_t w = 0; w < words; w += 1 + members[w])
    for (uint32_t j = 0; j < members[w]; j++) g->dead[members[w + 1 + j]] = 1;
  if (kiln_graph_insert_ops(g, at, ops, n_new)) {
    for (uint32_t w = 0; w < words; w += 1 + members[w])
      for (uint32_t j = 0; j < members[w]; j++) g->dead[members[w + 1 + j]] = 0;
    st = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                   "builder: out of memory inserting %u ops while joining sibling linears; free "
                   "memory and retry",
                   (unsigned)n_new);
  }
done:
  free(gs);
  free(ops);
  free(at);
  return st;
}

kiln_status kiln_merge_linears(kiln_graph *g, int dynamic, kiln_error *err) {
  uint32_t *uses = NULL, *members = NULL, n = 0, words = 0;
  int32_t *reader = NULL;
  sibling *sib = NULL;
  kiln_status st = kiln_graph_readers(g, "sibling linears", &uses, &reader, err);
  if (st != KILN_OK) return st;
  sib = kiln_malloc(sizeof *sib * (g->n_ops ? g->n_ops : 1));
  members = kiln_malloc(sizeof *members * 2 * (g->n_ops ? g->n_ops : 1));
  if (!sib || !members) {
    st = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                   "builder: out of memory for %u ops while joining sibling linears; free memory "
                   "and retry",
                   (unsigned)g->n_ops);
    goto done;
  }
  for (uint32_t i = 0; i < g->n_ops; i++)
    if (candidate(g, i) && pays(g, i, dynamic, uses, reader))
      sib[n++] = (sibling){i, g->ops[i].inputs[0], 0};
  qsort(sib, n, sizeof *sib, by_input);
  for (uint32_t a = 0, b; a < n; a = b) {
    for (b = a + 1; b < n && sib[b].x == sib[a].x;) b++;
    words += form_groups(g, sib + a, b - a, members + words);
  }
  st = join_all(g, members, words, err);
done:
  free(uses);
  free(reader);
  free(sib);
  free(members);
  return st;
}
