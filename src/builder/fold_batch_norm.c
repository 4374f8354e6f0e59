/* Batch norm folded into a preceding convolution's weight and bias, in double, rounded once. */
#include "builder/fold_batch_norm.h"

#include "runtime/alloc.h"
#include "cpu/half.h"

#include <math.h>
#include <stdlib.h>

static double load(const kiln_gtensor *t, int64_t i) {
  switch (t->desc.dtype) {
  case KILN_F16: return kiln_f16_to_f32(((const uint16_t *)t->data)[i]);
  case KILN_BF16: return kiln_bf16_to_f32(((const uint16_t *)t->data)[i]);
  default: return ((const float *)t->data)[i];
  }
}

static void store(uint8_t *bytes, kiln_dtype dtype, int64_t i, double v) {
  switch (dtype) {
  case KILN_F16: ((uint16_t *)bytes)[i] = kiln_f32_to_f16((float)v); break;
  case KILN_BF16: ((uint16_t *)bytes)[i] = kiln_f32_to_bf16((float)v); break;
  default: ((float *)bytes)[i] = (float)v; break;
  }
}

static int all_constant(const kiln_graph *g, const kiln_op *op, uint32_t from) {
  for (uint32_t k = from; k < op->n_inputs; k++)
    if (g->tensors[op->inputs[k]].node != KILN_NODE_CONSTANT) return 0;
  return 1;
}

/* A new constant of desc holding bytes (which it then owns), or -1. */
static int32_t add_owned_constant(kiln_graph *g, const kiln_tensor_desc *desc, uint8_t *bytes) {
  int32_t id = kiln_graph_add_tensor(g, KILN_NODE_CONSTANT, desc);
  if (id >= 0) g->tensors[id].data = g->tensors[id].owned = bytes;
  return id;
}

/* Rewrites CONV conv_index (its weight and bias are new constants: pointers into g->tensors are
 * taken after they are added, which may move the array) to compute BATCH_NORM bn_index too, and drops the norm. */
static kiln_status fold_one(kiln_graph *g, uint32_t conv_index, uint32_t bn_index,
                            kiln_error *err) {
  kiln_op *conv = &g->ops[conv_index];
  const kiln_op *bn = &g->ops[bn_index];
  uint32_t w_id = conv->inputs[1];
  kiln_tensor_desc wdesc = g->tensors[w_id].desc, bdesc;
  int has_gamma = (int)(bn->iattr[0] & 1), has_beta = (int)((bn->iattr[0] >> 1) & 1);
  int64_t outs = wdesc.dims[0], count = (int64_t)(wdesc.nbytes / kiln_dtype_size(wdesc.dtype));
  int64_t per_out = outs ? count / outs : 0;
  bdesc = wdesc;
  bdesc.rank = 1;
  bdesc.dims[0] = outs;
  for (int32_t d = 1; d < KILN_MAX_RANK; d++) bdesc.dims[d] = 0;
  bdesc.nbytes = (uint64_t)outs * kiln_dtype_size(wdesc.dtype);
  uint8_t *wbytes = kiln_malloc(wdesc.nbytes ? (size_t)wdesc.nbytes : 1);
  uint8_t *bbytes = kiln_malloc(bdesc.nbytes ? (size_t)bdesc.nbytes : 1);
  int32_t wnew = -1, bnew = -1;
  if (wbytes && bbytes && (wnew = add_owned_constant(g, &wdesc, wbytes)) >= 0) wbytes = NULL;
  if (wnew >= 0 && bbytes && (bnew = add_owned_constant(g, &bdesc, bbytes)) >= 0) bbytes = NULL;
  free(wbytes);
  free(bbytes);
  if (wnew < 0 || bnew < 0)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder op %u (batch_norm): out of memory folding it into the convolution "
                     "before it; free memory and retry",
                     (unsigned)bn_index);
  const kiln_gtensor *w = &g->tensors[w_id];
  const kiln_gtensor *bias = conv->n_inputs > 2 ? &g->tensors[conv->inputs[2]] : NULL;
  const kiln_gtensor *mean = &g->tensors[bn->inputs[1]], *var = &g->tensors[bn->inputs[2]];
  const kiln_gtensor *gamma = has_gamma ? &g->tensors[bn->inputs[3]] : NULL;
  const kiln_gtensor *beta = has_beta ? &g->tensors[bn->inputs[3 + has_gamma]] : NULL;
  uint8_t *wout = g->tensors[wnew].owned, *bout = g->tensors[bnew].owned;
  for (int64_t o = 0; o < outs; o++) {
    double scale = 1.0 / sqrt(load(var, o) + bn->fattr[0]);
    if (gamma) scale *= load(gamma, o);
    for (int64_t k = 0; k < per_out; k++)
      store(wout, wdesc.dtype, o * per_out + k, load(w, o * per_out + k) * scale);
    double shifted = ((bias ? load(bias, o) : 0.0) - load(mean, o)) * scale;
    store(bout, wdesc.dtype, o, shifted + (beta ? load(beta, o) : 0.0));
  }
  conv->inputs[1] = (uint32_t)wnew;
  conv->inputs[2] = (uint32_t)bnew;
  conv->n_inputs = 3;
  conv->iattr[4] = 1;
  conv->output = bn->output;
  g->tensors[bn->output].producer = (int32_t)conv_index;
  g->dead[bn_index] = 1;
  return KILN_OK;
}

/* 1 for an NCHW CONV with no fused epilogue: the norm's channel dim 1 is then its output
 * channel, and nothing stands between the sums and the norm. */
static int folds_into(const kiln_op *conv) {
  for (uint32_t k = 5; k < conv->n_iattr; k++)
    if (conv->iattr[k] != 0) return 0;
  return conv->kind == KILN_OP_CONV;
}

kiln_status kiln_fold_batch_norm(kiln_graph *g, kiln_error *err) {
  uint32_t *uses;
  kiln_status s = KILN_OK;
  if (!(uses = kiln_malloc(sizeof *uses * (g->n_tensors ? g->n_tensors : 1))))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder: out of memory for %u tensors while folding batch norms; free "
                     "memory and retry",
                     (unsigned)g->n_tensors);
  kiln_graph_count_uses(g, uses);
  for (uint32_t i = 0; s == KILN_OK && i < g->n_ops; i++) {
    const kiln_op *bn = &g->ops[i];
    if (g->dead[i] || bn->kind != KILN_OP_BATCH_NORM || !all_constant(g, bn, 1)) continue;
    int32_t conv = kiln_graph_producer(g, bn->inputs[0], uses, 1);
    if (conv < 0 || !folds_into(&g->ops[conv]) || !all_constant(g, &g->ops[conv], 1))
      continue;
    s = fold_one(g, (uint32_t)conv, i, err);
  }
  free(uses);
  return s;
}
