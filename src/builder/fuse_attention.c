/* Packed-head attention (see fuse_attention.h). */
#include "builder/fuse_attention.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/shape.h"
#include "runtime/sdpa_layout.h"

/* The live op writing t when it is of `kind` and `readers` reads of t are all there are, or
 * -1. */
static int32_t producer(const kiln_graph *g, uint32_t t, kiln_op_kind kind, uint32_t readers,
                        const uint32_t *uses) {
  int32_t p = kiln_graph_producer(g, t, uses, readers);
  return p >= 0 && g->ops[p].kind == kind ? p : -1;
}

static int is_perm(const kiln_op *op, const int64_t *perm, uint32_t n) {
  if (op->n_iattr != n) return 0;
  for (uint32_t d = 0; d < n; d++)
    if (op->iattr[d] != perm[d]) return 0;
  return 1;
}

static const int64_t merge[4] = {0, 2, 1, 3};

/* qkv [B,L,3,H,E] permuted (2,0,3,1,4) and its slices selected as q, k and v: the ops that go
 * into dead (4) and qkv, or -1. */
static int32_t selected_heads(const kiln_graph *g, const kiln_op *s, const uint32_t *uses,
                              int32_t *dead) {
  static const int64_t split[5] = {2, 0, 3, 1, 4};
  for (uint32_t k = 0; k < 3; k++) {
    const kiln_op *op;
    if ((dead[k] = producer(g, s->inputs[k], KILN_OP_SELECT, 1, uses)) < 0) return -1;
    op = &g->ops[dead[k]];
    if (op->iattr[0] != 0 || (op->iattr[1] != (int64_t)k && op->iattr[1] != (int64_t)k - 3) ||
        (k > 0 && op->inputs[0] != g->ops[dead[0]].inputs[0]))
      return -1;
  }
  dead[3] = producer(g, g->ops[dead[0]].inputs[0], KILN_OP_PERMUTE, 3, uses);
  if (dead[3] < 0 || !is_perm(&g->ops[dead[3]], split, 5)) return -1;
  return (int32_t)g->ops[dead[3]].inputs[0];
}

/* x [B,L,3*H*E] sliced along its last dim into q, k and v in that order, each reshaped to
 * [B,L,H,E] and permuted (0,2,1,3) (GPT-2's split of its fused projection): x is qkv
 * [B,L,3,H,E] already. A reshape of x to that shape takes q's slice's place (the other ops go
 * into dead, 8); returns the reshape's output, or -1. */
static int32_t sliced_heads(kiln_graph *g, const kiln_op *s, const uint32_t *uses,
                            int32_t *dead) {
  int32_t x = -1, sl[3];
  int64_t width = 0;
  for (uint32_t k = 0; k < 3; k++) {
    int32_t pm = producer(g, s->inputs[k], KILN_OP_PERMUTE, 1, uses), rs, sc;
    if (pm < 0 || !is_perm(&g->ops[pm], merge, 4) ||
        (rs = producer(g, g->ops[pm].inputs[0], KILN_OP_RESHAPE, 1, uses)) < 0 ||
        (sc = producer(g, g->ops[rs].inputs[0], KILN_OP_SLICE, 1, uses)) < 0)
      return -1;
    const kiln_op *op = &g->ops[sc];
    const kiln_tensor_desc *in = &g->tensors[op->inputs[0]].desc;
    const kiln_tensor_desc *h = &g->tensors[g->ops[rs].output].desc;
    width = h->dims[2] * h->dims[3];
    if (in->rank != 3 || op->iattr[0] != 2 || op->iattr[3] != 1 || op->iattr_sym[1].symbol ||
        op->iattr_sym[2].symbol || op->iattr[1] != (int64_t)k * width ||
        op->iattr[2] != (int64_t)(k + 1) * width || in->dims[2] != 3 * width ||
        h->dims[0] != in->dims[0] || h->dims[1] != in->dims[1] ||
        (k > 0 && op->inputs[0] != (uint32_t)x))
      return -1;
    x = (int32_t)op->inputs[0];
    sl[k] = sc;
    dead[2 * k] = pm, dead[2 * k + 1] = rs;
  }
  dead[6] = sl[1], dead[7] = sl[2];
  const kiln_op *rs = &g->ops[dead[1]];
  kiln_tensor_desc d = g->tensors[x].desc;
  const kiln_tensor_desc *h = &g->tensors[rs->output].desc;
  if ((d.dtype != KILN_F16 && d.dtype != KILN_BF16) || (h->dims[3] != 64 && h->dims[3] != 128))
    return -1; /* checked here too: nothing is added for a shape left as it is */
  kiln_op re = *rs;
  d.rank = 5;
  d.dims[2] = 3, d.dims[3] = h->dims[2], d.dims[4] = h->dims[3];
  memset(&d.sym[2], 0, 3 * sizeof d.sym[0]);
  re.inputs[0] = (uint32_t)x;
  re.n_iattr = 5;
  for (int32_t j = 0; j < 5; j++) re.iattr[j] = d.dims[j];
  memset(&re.iattr_sym[2], 0, 3 * sizeof re.iattr_sym[0]);
  int32_t qkv = kiln_graph_add_tensor(g, KILN_NODE_OP, &d);
  if (qkv < 0) return -1;
  re.output = (uint32_t)qkv;
  g->ops[sl[0]] = re;
  g->tensors[qkv].producer = sl[0];
  return qkv;
}

/* Heads the flash kernel takes: f16 or bf16, rank 4, E == Ev of 64 or 128. */
static int flash_heads(const kiln_graph *g, const kiln_op *s) {
  const kiln_tensor_desc *q = &g->tensors[s->inputs[0]].desc, *v = &g->tensors[s->inputs[2]].desc;
  return (q->dtype == KILN_F16 || q->dtype == KILN_BF16) && q->rank == 4 && v->rank == 4 &&
         (q->dims[3] == 64 || q->dims[3] == 128) && v->dims[3] == q->dims[3];
}

static void fuse_one(kiln_graph *g, uint32_t i, const uint32_t *uses, const int32_t *reader,
                     int heads_last) {
  kiln_op s = g->ops[i];
  int32_t dead[8], back, qkv, n_dead = 4;
  uint32_t out = s.output;
  int32_t same = -1; /* a reshape to the shape it has, between the SDPA and its permute */
  if (s.n_inputs < 3 || kiln_sdpa_layout(&s) != 0 || uses[out] != 1) return;
  back = reader[out];
  if (back >= 0 && !g->dead[back] && g->ops[back].kind == KILN_OP_RESHAPE &&
      kiln_same_desc(&g->tensors[g->ops[back].output].desc, &g->tensors[out].desc)) {
    same = back;
    out = g->ops[same].output;
    back = uses[out] == 1 ? reader[out] : -1;
  }
  if (back < 0 || g->dead[back] || g->ops[back].kind != KILN_OP_PERMUTE ||
      !is_perm(&g->ops[back], merge, 4))
    return;
  if ((qkv = selected_heads(g, &s, uses, dead)) >= 0) {
    const kiln_tensor_desc *x = &g->tensors[qkv].desc;
    if ((x->dtype != KILN_F16 && x->dtype != KILN_BF16) || (x->dims[4] != 64 && x->dims[4] != 128))
      return; /* heads the tensor-core kernel does not take keep the matmul path's layout */
  } else if ((qkv = sliced_heads(g, &s, uses, dead)) >= 0) {
    n_dead = 8;
  } else if (heads_last && flash_heads(g, &s)) {
    n_dead = 0;
  } else {
    return;
  }
  s.n_iattr = 3;
  s.output = g->ops[back].output;
  if (same >= 0) g->dead[same] = 1;
  g->dead[i] = 1;
  if (n_dead == 0) { /* heads last: q, k, v and the mask as they are */
    s.iattr[2] = 2;
    g->ops[back] = s;
    return;
  }
  s.inputs[0] = (uint32_t)qkv;
  s.inputs[1] = s.n_inputs == 4 ? s.inputs[3] : 0;
  s.inputs[2] = s.inputs[3] = 0;
  s.n_inputs = s.n_inputs == 4 ? 2 : 1;
  s.iattr[2] = 1;
  for (int32_t k = 0; k < n_dead; k++) g->dead[dead[k]] = 1;
  g->ops[back] = s;
}

kiln_status kiln_fuse_attention(kiln_graph *g, int heads_last, kiln_error *err) {
  uint32_t *uses;
  int32_t *reader;
  kiln_status st = kiln_graph_readers(g, "attention", &uses, &reader, err);
  if (st != KILN_OK) return st;
  for (uint32_t i = 0; i < g->n_ops; i++)
    if (!g->dead[i] && g->ops[i].kind == KILN_OP_SDPA) fuse_one(g, i, uses, reader, heads_last);
  free(uses);
  free(reader);
  return KILN_OK;
}
