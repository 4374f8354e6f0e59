/* Convolution epilogue fusion (see fuse_conv.h). */
#include "builder/fuse_conv.h"

#include "runtime/alloc.h"
#include "runtime/vision_shape.h"
#include "runtime/shape.h"

#include <stdlib.h>

/* The convolution's optional attribute at `offset` past its epilogue slot (0 layout, 1
 * activation, 2 residual), absent = 0. */
static int64_t epilogue_attr(const kiln_op *conv, uint32_t offset) {
  uint32_t slot = kiln_conv_epilogue_slot(conv->kind) + offset;
  return slot < conv->n_iattr ? conv->iattr[slot] : 0;
}

/* Sets that attribute, writing the absent ones before it as 0. */
static void set_epilogue_attr(kiln_op *conv, uint32_t offset, int64_t value) {
  uint32_t slot = kiln_conv_epilogue_slot(conv->kind) + offset;
  while (conv->n_iattr <= slot) conv->iattr[conv->n_iattr++] = 0;
  conv->iattr[slot] = value;
}

/* The convolution writing t when t has exactly one reader, or -1. */
static int32_t sole_conv(const kiln_graph *g, uint32_t t, const uint32_t *uses) {
  int32_t p = kiln_graph_producer(g, t, uses, 1);
  return p >= 0 && kiln_is_conv_op(g->ops[p].kind) ? p : -1;
}

static void fuse_residuals(kiln_graph *g, uint32_t *uses) {
  for (uint32_t i = 0; i < g->n_ops; i++) {
    const kiln_op *add = &g->ops[i];
    if (g->dead[i] || add->kind != KILN_OP_ADD || add->fattr[0] != 1.0) continue;
    for (uint32_t side = 0; side < 2; side++) {
      uint32_t y = add->inputs[side], r = add->inputs[1 - side];
      int32_t p = sole_conv(g, y, uses);
      if (p < 0 || y == r) continue;
      kiln_op conv = g->ops[p];
      const kiln_tensor_desc *t = &g->tensors[y].desc;
      if (epilogue_attr(&conv, 1) != KILN_ACT_NONE || epilogue_attr(&conv, 2) != 0 ||
          conv.n_inputs >= KILN_MAX_OP_INPUTS || !kiln_same_desc(&g->tensors[r].desc, t) ||
          !kiln_same_desc(t, &g->tensors[add->output].desc))
        continue;
      /* In the add's place, where r has been computed; its own inputs were before it. */
      g->dead[p] = 1;
      uses[y] = 0;
      conv.inputs[conv.n_inputs++] = r;
      set_epilogue_attr(&conv, 2, 1);
      conv.output = add->output;
      g->ops[i] = conv;
      break;
    }
  }
}

static void fuse_relus(kiln_graph *g, uint32_t *uses) {
  for (uint32_t i = 0; i < g->n_ops; i++) {
    const kiln_op *relu = &g->ops[i];
    int32_t p;
    if (g->dead[i] || relu->kind != KILN_OP_RELU || (p = sole_conv(g, relu->inputs[0], uses)) < 0)
      continue;
    kiln_op *conv = &g->ops[p];
    if (epilogue_attr(conv, 1) != KILN_ACT_NONE ||
        !kiln_same_desc(&g->tensors[relu->inputs[0]].desc, &g->tensors[relu->output].desc))
      continue;
    uses[relu->inputs[0]] = 0;
    set_epilogue_attr(conv, 1, KILN_ACT_RELU);
    conv->output = relu->output;
    g->tensors[relu->output].producer = p;
    g->dead[i] = 1;
  }
}

kiln_status kiln_fuse_conv_epilogues(kiln_graph *g, kiln_error *err) {
  uint32_t *uses = kiln_malloc(sizeof *uses * (g->n_tensors ? g->n_tensors : 1));
  if (!uses)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder: out of memory for %u tensors while fusing convolution epilogues; "
                     "free memory and retry",
                     (unsigned)g->n_tensors);
  kiln_graph_count_uses(g, uses);
  fuse_residuals(g, uses); /* first: the ReLU of a ResNet block reads the add */
  fuse_relus(g, uses);
  free(uses);
  return KILN_OK;
}
