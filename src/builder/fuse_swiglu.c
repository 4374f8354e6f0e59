/* Gate and up projections fused (see fuse_swiglu.h). */
#include "builder/fuse_swiglu.h"

#include "runtime/alloc.h"
#include "runtime/shape.h"

#include <stdlib.h>
#include <string.h>

/* The op writing t, read once, when it is a LINEAR of x and a constant weight with nothing
 * else fused; -1 otherwise. */
static int32_t plain_linear(const kiln_graph *g, uint32_t t, const uint32_t *uses) {
  int32_t p = kiln_graph_producer(g, t, uses, 1);
  if (p < 0) return -1;
  const kiln_op *op = &g->ops[p];
  if (op->kind != KILN_OP_LINEAR || op->n_inputs != 2 ||
      (op->n_iattr > 0 && op->iattr[0] != KILN_ACT_NONE) || (op->n_iattr > 1 && op->iattr[1]))
    return -1;
  return g->tensors[op->inputs[1]].node == KILN_NODE_CONSTANT ? p : -1;
}

/* The gate and up LINEARs of MUL op i, with silu(gate) on side `side`; 0 when not SwiGLU. */
static int match(const kiln_graph *g, uint32_t i, uint32_t side, const uint32_t *uses,
                 int32_t *silu, int32_t *gate, int32_t *up) {
  const kiln_op *mul = &g->ops[i];
  *silu = kiln_graph_producer(g, mul->inputs[side], uses, 1);
  if (*silu < 0 || g->ops[*silu].kind != KILN_OP_SILU) return 0;
  *gate = plain_linear(g, g->ops[*silu].inputs[0], uses);
  *up = plain_linear(g, mul->inputs[1 - side], uses);
  if (*gate < 0 || *up < 0 || *gate == *up) return 0;
  const kiln_op *a = &g->ops[*gate], *b = &g->ops[*up];
  return a->inputs[0] == b->inputs[0] &&
         kiln_same_desc(&g->tensors[a->inputs[1]].desc, &g->tensors[b->inputs[1]].desc) &&
         kiln_same_desc(&g->tensors[a->output].desc, &g->tensors[mul->output].desc) &&
         kiln_same_desc(&g->tensors[b->output].desc, &g->tensors[mul->output].desc);
}

/* MUL op i becomes the LINEAR over [w_gate; w_up]. */
static kiln_status fuse_one(kiln_graph *g, uint32_t i, int32_t silu, int32_t gate, int32_t up,
                            kiln_error *err) {
  uint32_t wg = g->ops[gate].inputs[1], wu = g->ops[up].inputs[1];
  kiln_tensor_desc desc = g->tensors[wg].desc;
  size_t half = (size_t)desc.nbytes;
  uint8_t *bytes = kiln_malloc(half > 0 ? 2 * half : 1);
  int32_t w;
  desc.dims[0] *= 2;
  if (!bytes || kiln_shape_nbytes(desc.dtype, desc.rank, desc.dims, &desc.nbytes) ||
      (w = kiln_graph_add_tensor(g, KILN_NODE_CONSTANT, &desc)) < 0) {
    free(bytes);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder op %u (mul): out of memory joining the gate and up weights; free "
                     "memory and retry",
                     (unsigned)i);
  }
  memcpy(bytes, g->tensors[wg].data, half);
  memcpy(bytes + half, g->tensors[wu].data, half);
  g->tensors[w].data = g->tensors[w].owned = bytes;
  kiln_op lin = g->ops[up];
  lin.inputs[1] = (uint32_t)w;
  lin.n_iattr = 1;
  lin.iattr[0] = KILN_ACT_SWIGLU;
  lin.iattr[1] = 0;
  lin.output = g->ops[i].output;
  g->ops[i] = lin;
  g->dead[silu] = g->dead[gate] = g->dead[up] = 1;
  return KILN_OK;
}

kiln_status kiln_fuse_swiglu(kiln_graph *g, kiln_error *err) {
  uint32_t *uses;
  int32_t *reader;
  kiln_status st = kiln_graph_readers(g, "swiglu", &uses, &reader, err);
  if (st != KILN_OK) return st;
  for (uint32_t i = 0; i < g->n_ops && st == KILN_OK; i++) {
    int32_t silu, gate, up;
    if (g->dead[i] || g->ops[i].kind != KILN_OP_MUL) continue;
    for (uint32_t side = 0; side < 2; side++)
      if (match(g, i, side, uses, &silu, &gate, &up)) {
        st = fuse_one(g, i, silu, gate, up, err);
        break;
      }
  }
  free(uses);
  free(reader);
  return st;
}
