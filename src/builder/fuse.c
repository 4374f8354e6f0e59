/* Epilogue fusion: an activation right after a GEMM runs inside the GEMM's epilogue, and so
 * does a residual added to a GEMM's result; convolutions likewise (fuse_conv.c). */
#include "builder/fuse.h"

#include "runtime/alloc.h"
#include "builder/fuse_conv.h"
#include "runtime/shape.h"

#include <stdlib.h>

/* The LINEAR activation an op becomes, or KILN_ACT_NONE when it cannot fuse. */
static kiln_activation epilogue_of(const kiln_op *op) {
  if (op->kind == KILN_OP_RELU) return KILN_ACT_RELU;
  if (op->kind == KILN_OP_GELU) return op->iattr[0] ? KILN_ACT_GELU_TANH : KILN_ACT_GELU_ERF;
  return KILN_ACT_NONE;
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
  uint32_t *uses = kiln_malloc(sizeof *uses * (g->n_tensors ? g->n_tensors : 1));
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
