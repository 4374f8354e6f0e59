/* Epilogue fusion: an activation right after a GEMM runs inside the GEMM's epilogue, and so
 * does a residual added to a GEMM's result, also across the reshape that unflattens a GEMM run
 * on 2-D rows (GPT-2's); convolutions likewise (fuse_conv.c). */
#include "builder/fuse.h"

#include "runtime/alloc.h"
#include "builder/fuse_conv.h"
#include "runtime/shape.h"

#include <stdlib.h>
#include <string.h>

/* The LINEAR activation an op becomes, or KILN_ACT_NONE when it cannot fuse. */
static kiln_activation epilogue_of(const kiln_op *op) {
  if (op->kind == KILN_OP_RELU) return KILN_ACT_RELU;
  if (op->kind == KILN_OP_GELU) return op->iattr[0] ? KILN_ACT_GELU_TANH : KILN_ACT_GELU_ERF;
  return KILN_ACT_NONE;
}

/* y = reshape(linear(x)) with the last dim kept, each read once (a linear run on rows
 * flattened to 2-D, as GPT-2's are): the reshape moves to x (y's leading dims and x's own last),
 * so the LINEAR writes y itself and can take a residual of y's shape. The two ops swap slots, so
 * each still comes after what it reads. Returns the LINEAR's new index, or -1; uses has room
 * for one more tensor. */
static int32_t hoist_reshape(kiln_graph *g, uint32_t y, uint32_t *uses) {
  int32_t r = kiln_graph_producer(g, y, uses, 1), p;
  if (r < 0 || g->ops[r].kind != KILN_OP_RESHAPE) return -1;
  uint32_t z = g->ops[r].inputs[0];
  if ((p = kiln_graph_producer(g, z, uses, 1)) < 0 || g->ops[p].kind != KILN_OP_LINEAR ||
      g->ops[p].iattr[0] != KILN_ACT_NONE || g->ops[p].n_iattr > 1)
    return -1;
  kiln_op re = g->ops[r], lin = g->ops[p];
  kiln_tensor_desc d = g->tensors[lin.inputs[0]].desc;
  const kiln_tensor_desc *yd = &g->tensors[y].desc, *zd = &g->tensors[z].desc;
  int32_t rank = yd->rank;
  if (rank < 1 || yd->dims[rank - 1] != zd->dims[zd->rank - 1] ||
      re.iattr_sym[rank - 1].symbol || d.sym[d.rank - 1].symbol)
    return -1;
  int64_t k = d.dims[d.rank - 1];
  d.rank = rank;
  d.nbytes = kiln_dtype_size(d.dtype);
  for (int32_t j = 0; j < KILN_MAX_RANK; j++) { /* dims past the rank are 0, as the plan wants */
    d.dims[j] = j + 1 < rank ? yd->dims[j] : j + 1 == rank ? k : 0;
    memset(&d.sym[j], 0, sizeof d.sym[j]);
    if (j + 1 < rank) d.sym[j] = yd->sym[j];
    if (j < rank) d.nbytes *= (uint64_t)d.dims[j];
  }
  int32_t xr = kiln_graph_add_tensor(g, KILN_NODE_OP, &d);
  if (xr < 0) return -1;
  re.inputs[0] = lin.inputs[0];
  re.output = (uint32_t)xr;
  re.iattr[rank - 1] = k;
  lin.inputs[0] = (uint32_t)xr;
  lin.output = y;
  g->ops[p] = re;
  g->ops[r] = lin;
  g->tensors[xr].producer = p;
  g->tensors[y].producer = r;
  uses[xr] = 1;
  uses[z] = 0;
  return r;
}

/* y = linear(x) read only by y + r (alpha 1), r of y's shape and dtype: the LINEAR takes r as
 * its residual and moves to the add's place, where r has been computed. */
static void fuse_residuals(kiln_graph *g, uint32_t *uses) {
  for (uint32_t i = 0; i < g->n_ops; i++) {
    const kiln_op *add = &g->ops[i];
    if (g->dead[i] || add->kind != KILN_OP_ADD || add->fattr[0] != 1.0) continue;
    for (uint32_t side = 0; side < 2; side++) {
      uint32_t y = add->inputs[side], r = add->inputs[1 - side];
      int32_t p = kiln_graph_producer(g, y, uses, 1);
      if (p >= 0 && y != r && g->ops[p].kind == KILN_OP_RESHAPE &&
          kiln_same_desc(&g->tensors[r].desc, &g->tensors[y].desc))
        p = hoist_reshape(g, y, uses);
      add = &g->ops[i];
      if (p < 0 || y == r) continue;
      kiln_op lin = g->ops[p];
      const kiln_tensor_desc *t = &g->tensors[y].desc;
      if (lin.kind != KILN_OP_LINEAR || lin.iattr[0] != KILN_ACT_NONE || lin.n_iattr > 1 ||
          !kiln_same_desc(&g->tensors[r].desc, t) ||
          !kiln_same_desc(t, &g->tensors[add->output].desc))
        continue;
      g->dead[p] = 1;
      uses[y] = 0;
      lin.inputs[lin.n_inputs++] = r;
      lin.iattr[1] = 1;
      lin.n_iattr = 2;
      lin.output = add->output;
      g->ops[i] = lin;
      break;
    }
  }
}

kiln_status kiln_fuse_epilogues(kiln_graph *g, kiln_error *err) {
  /* room for the tensor each fusion through a reshape adds */
  uint32_t *uses = kiln_calloc((size_t)g->n_tensors + g->n_ops + 1, sizeof *uses);
  if (!uses)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder: out of memory for %u tensors while fusing epilogues; free memory "
                     "and retry",
                     (unsigned)g->n_tensors);
  kiln_graph_count_uses(g, uses);
  for (uint32_t i = 0; i < g->n_ops; i++) {
    const kiln_op *act = &g->ops[i];
    kiln_activation kind = epilogue_of(act);
    int32_t p;
    kiln_op *lin;
    if (g->dead[i] || kind == KILN_ACT_NONE ||
        (p = kiln_graph_producer(g, act->inputs[0], uses, 1)) < 0)
      continue;
    if (g->ops[p].kind == KILN_OP_RESHAPE && (p = hoist_reshape(g, act->inputs[0], uses)) < 0)
      continue;
    act = &g->ops[i];
    lin = &g->ops[p];
    if (lin->kind != KILN_OP_LINEAR || lin->iattr[0] != KILN_ACT_NONE) continue;
    uses[act->inputs[0]] = 0;
    lin->iattr[0] = kind;
    lin->n_iattr = 1;
    lin->output = act->output;
    g->tensors[act->output].producer = p;
    g->dead[i] = 1;
  }
  fuse_residuals(g, uses);
  free(uses);
  return kiln_fuse_conv_epilogues(g, err);
}
