/* RMSNorm recognition (see fuse_rms_norm.h). */
#include "builder/fuse_rms_norm.h"
#include "runtime/shape.h"

#include <stdlib.h>
#include <string.h>

/* The one live op reading t when nothing else (no output binding either) reads it, or NULL. */
static kiln_op *only_reader(kiln_graph *g, uint32_t t, const uint32_t *uses, const int32_t *reader) {
  if (uses[t] != 1 || reader[t] < 0 || g->dead[reader[t]]) return NULL;
  return &g->ops[reader[t]];
}

/* The other input of binary op when one of its inputs is t, else -1. */
static int64_t other_input(const kiln_op *op, uint32_t t) {
  if (op->n_inputs != 2) return -1;
  if (op->inputs[0] == t) return op->inputs[1];
  return op->inputs[1] == t ? (int64_t)op->inputs[0] : -1;
}

/* A one-element f32 constant's value into *v. */
static int scalar_f32(const kiln_graph *g, int64_t t, float *v) {
  const kiln_gtensor *x;
  if (t < 0) return 0;
  x = &g->tensors[t];
  if (x->node != KILN_NODE_CONSTANT || x->desc.dtype != KILN_F32 || x->desc.nbytes != 4) return 0;
  memcpy(v, x->data, 4);
  return 1;
}

/* Tries the pattern around MEAN op m; on a match rewrites the graph. */
static void fuse_one(kiln_graph *g, uint32_t m, const uint32_t *uses, const int32_t *reader) {
  const kiln_op *mean = &g->ops[m];
  kiln_op *pow, *add, *rsq, *mul, *last, *next, rms;
  int32_t p, cast = -1;
  uint32_t c, x;
  float eps;
  int64_t w = -1;
  const kiln_tensor_desc *cd;
  p = kiln_graph_producer(g, mean->inputs[0], uses, 1);
  if (p < 0) return;
  pow = &g->ops[p];
  c = pow->inputs[0];
  cd = &g->tensors[c].desc;
  if (pow->kind != KILN_OP_POW || pow->fattr[0] != 2.0 || cd->dtype != KILN_F32 ||
      cd->rank < 1 || mean->iattr[0] != ((int64_t)1 << (cd->rank - 1)) || mean->iattr[1] != 1)
    return;
  if (!(add = only_reader(g, mean->output, uses, reader)) || add->kind != KILN_OP_ADD ||
      add->fattr[0] != 1.0 || !scalar_f32(g, other_input(add, mean->output), &eps))
    return;
  if (!(rsq = only_reader(g, add->output, uses, reader)) || rsq->kind != KILN_OP_RSQRT) return;
  if (!(mul = only_reader(g, rsq->output, uses, reader)) || mul->kind != KILN_OP_MUL ||
      other_input(mul, rsq->output) != (int64_t)c || mul->inputs[0] == mul->inputs[1])
    return;
  x = c;
  if (g->tensors[c].node == KILN_NODE_OP && g->ops[g->tensors[c].producer].kind == KILN_OP_CAST &&
      !g->dead[g->tensors[c].producer]) {
    cast = g->tensors[c].producer;
    x = g->ops[cast].inputs[0];
  }
  last = mul;
  if (x != c && (next = only_reader(g, last->output, uses, reader)) &&
      next->kind == KILN_OP_CAST && next->iattr[0] == (int64_t)g->tensors[x].desc.dtype)
    last = next;
  if (g->tensors[last->output].desc.dtype != g->tensors[x].desc.dtype ||
      !kiln_same_dims(&g->tensors[last->output].desc, cd))
    return; /* RMS_NORM writes x's dtype */
  if ((next = only_reader(g, last->output, uses, reader)) && next->kind == KILN_OP_MUL &&
      (w = other_input(next, last->output)) >= 0 && next->inputs[0] != next->inputs[1]) {
    const kiln_tensor_desc *wd = &g->tensors[w].desc;
    if (wd->rank == 1 && wd->dims[0] == cd->dims[cd->rank - 1] &&
        wd->dtype == g->tensors[x].desc.dtype)
      last = next;
    else
      w = -1;
  } else {
    w = -1;
  }
  memset(&rms, 0, sizeof rms);
  rms.kind = KILN_OP_RMS_NORM;
  rms.inputs[0] = x;
  rms.n_inputs = 1;
  if (w >= 0) rms.inputs[rms.n_inputs++] = (uint32_t)w;
  rms.n_iattr = 2;
  rms.iattr[0] = 1;
  rms.iattr[1] = w >= 0;
  rms.fattr[0] = eps;
  rms.output = last->output;
  /* the members die; the last one's place holds the norm, where every input exists */
  g->dead[p] = g->dead[m] = 1;
  if (cast >= 0 && uses[c] == 2) g->dead[cast] = 1; /* else another op still reads it */
  for (kiln_op *o = add; o != last; o = &g->ops[reader[o->output]]) g->dead[o - g->ops] = 1;
  *last = rms;
}

kiln_status kiln_fuse_rms_norms(kiln_graph *g, kiln_error *err) {
  uint32_t *uses;
  int32_t *reader;
  kiln_status s = kiln_graph_readers(g, "RMS norms", &uses, &reader, err);
  if (s != KILN_OK) return s;
  for (uint32_t i = 0; i < g->n_ops; i++)
    if (!g->dead[i] && g->ops[i].kind == KILN_OP_MEAN) fuse_one(g, i, uses, reader);
  free(uses);
  free(reader);
  return KILN_OK;
}
