/* Packed-head attention (see fuse_attention.h). */
#include "builder/fuse_attention.h"

#include <stdlib.h>

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

static void fuse_one(kiln_graph *g, uint32_t i, const uint32_t *uses, const int32_t *reader) {
  static const int64_t split[5] = {2, 0, 3, 1, 4}, merge[4] = {0, 2, 1, 3};
  kiln_op s = g->ops[i];
  int32_t sel[3], perm, back;
  uint32_t qkv = 0;
  if (s.n_inputs < 3 || (s.n_iattr > 2 && s.iattr[2] != 0)) return;
  for (uint32_t k = 0; k < 3; k++) {
    const kiln_op *op;
    if ((sel[k] = producer(g, s.inputs[k], KILN_OP_SELECT, 1, uses)) < 0) return;
    op = &g->ops[sel[k]];
    if (op->iattr[0] != 0 || (op->iattr[1] != (int64_t)k && op->iattr[1] != (int64_t)k - 3) ||
        (k > 0 && op->inputs[0] != g->ops[sel[0]].inputs[0]))
      return;
  }
  perm = producer(g, g->ops[sel[0]].inputs[0], KILN_OP_PERMUTE, 3, uses);
  if (perm < 0 || !is_perm(&g->ops[perm], split, 5)) return;
  qkv = g->ops[perm].inputs[0];
  {
    const kiln_tensor_desc *x = &g->tensors[qkv].desc;
    if ((x->dtype != KILN_F16 && x->dtype != KILN_BF16) || (x->dims[4] != 64 && x->dims[4] != 128))
      return; /* heads the tensor-core kernel does not take keep the matmul path's layout */
  }
  back = reader[s.output];
  if (uses[s.output] != 1 || back < 0 || g->dead[back] || g->ops[back].kind != KILN_OP_PERMUTE ||
      !is_perm(&g->ops[back], merge, 4))
    return;
  s.inputs[0] = qkv;
  s.inputs[1] = s.n_inputs == 4 ? s.inputs[3] : 0;
  s.inputs[2] = s.inputs[3] = 0;
  s.n_inputs = s.n_inputs == 4 ? 2 : 1;
  s.n_iattr = 3;
  s.iattr[2] = 1;
  s.output = g->ops[back].output;
  for (uint32_t k = 0; k < 3; k++) g->dead[sel[k]] = 1;
  g->dead[perm] = g->dead[i] = 1;
  g->ops[back] = s;
}

kiln_status kiln_fuse_attention(kiln_graph *g, kiln_error *err) {
  uint32_t *uses;
  int32_t *reader;
  kiln_status st = kiln_graph_readers(g, "attention", &uses, &reader, err);
  if (st != KILN_OK) return st;
  for (uint32_t i = 0; i < g->n_ops; i++)
    if (!g->dead[i] && g->ops[i].kind == KILN_OP_SDPA) fuse_one(g, i, uses, reader);
  free(uses);
  free(reader);
  return KILN_OK;
}
