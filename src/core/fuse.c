/* Epilogue fusion: an activation right after a GEMM runs inside the GEMM's epilogue. */
#include "core/fuse.h"

#include "core/alloc.h"

#include <stdlib.h>

/* The LINEAR activation an op becomes, or KILN_ACT_NONE when it cannot fuse. */
static kiln_activation epilogue_of(const kiln_op *op) {
  if (op->kind == KILN_OP_RELU) return KILN_ACT_RELU;
  if (op->kind == KILN_OP_GELU) return op->iattr[0] ? KILN_ACT_GELU_TANH : KILN_ACT_GELU_ERF;
  return KILN_ACT_NONE;
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
    const kiln_gtensor *x = &g->tensors[act->inputs[0]];
    kiln_op *lin;
    if (g->dead[i] || kind == KILN_ACT_NONE || x->node != KILN_NODE_OP ||
        uses[act->inputs[0]] != 1)
      continue;
    lin = &g->ops[x->producer];
    if (lin->kind != KILN_OP_LINEAR || lin->iattr[0] != KILN_ACT_NONE) continue;
    uses[act->inputs[0]] = 0;
    lin->iattr[0] = kind;
    lin->n_iattr = 1;
    lin->output = act->output;
    g->tensors[act->output].producer = x->producer;
    g->dead[i] = 1;
  }
  free(uses);
  return KILN_OK;
}
