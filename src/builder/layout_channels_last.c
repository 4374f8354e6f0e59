/* The channels-last layout pass (see layout_channels_last.h). */
#include "builder/layout_channels_last.h"

#include "runtime/alloc.h"
#include "runtime/vision_shape.h"
#include "runtime/shape.h"

#include <stdlib.h>
#include <string.h>

static const int64_t to_nhwc[4] = {0, 2, 3, 1}, to_nchw[4] = {0, 3, 1, 2};

static int is_unary(kiln_op_kind k) {
  return (k >= KILN_OP_RELU && k <= KILN_OP_CAST && k != KILN_OP_POW) ||
         (k >= KILN_OP_ABS && k <= KILN_OP_HARDSIGMOID);
}

static int is_binary(kiln_op_kind k) {
  return k == KILN_OP_ADD || k == KILN_OP_SUB || k == KILN_OP_MUL || k == KILN_OP_DIV ||
         k == KILN_OP_MINIMUM || k == KILN_OP_MAXIMUM;
}

/* The slot of a pooling or resize op's channels_last attribute, or -1. */
static int layout_slot(kiln_op_kind k) {
  switch (k) {
  case KILN_OP_MAX_POOL2D: return 5;
  case KILN_OP_AVG_POOL2D: return 6;
  case KILN_OP_ADAPTIVE_AVG_POOL2D:
  case KILN_OP_UPSAMPLE_NEAREST2D: return 1;
  case KILN_OP_UPSAMPLE_BILINEAR2D: return 2;
  default: return -1;
  }
}

/* 1 for a 2-d CONV still in NCHW, the region's seeds. */
static int is_seed(const kiln_op *op, const kiln_graph *g) {
  uint32_t slot = kiln_conv_epilogue_slot(op->kind);
  return op->kind == KILN_OP_CONV && g->tensors[op->inputs[0]].desc.rank == 4 &&
         (op->n_iattr <= slot || op->iattr[slot] == 0);
}

/* 1 when op, reading a region tensor, can run on NHWC tensors as they are. */
static int can_join(const kiln_op *op, const kiln_graph *g) {
  const kiln_tensor_desc *out = &g->tensors[op->output].desc;
  int slot = layout_slot(op->kind);
  if (out->rank != 4) return 0;
  if (is_unary(op->kind)) return op->n_inputs == 1;
  if (is_binary(op->kind))
    return kiln_same_dims(&g->tensors[op->inputs[0]].desc, out) &&
           kiln_same_dims(&g->tensors[op->inputs[1]].desc, out);
  return slot >= 0 && op->n_iattr == (uint32_t)slot && g->tensors[op->inputs[0]].desc.rank == 4;
}

/* The inputs of a region op held in its layout: all but a convolution's bias. */
static int is_activation_input(const kiln_op *op, uint32_t k) {
  if (op->kind != KILN_OP_CONV) return 1;
  uint32_t slot = kiln_conv_epilogue_slot(op->kind) + 2; /* the residual flag */
  return k == 0 || k == 1 || (k == op->n_inputs - 1 && slot < op->n_iattr && op->iattr[slot]);
}

static void nhwc_desc(kiln_tensor_desc *d) {
  int64_t c = d->dims[1];
  d->dims[1] = d->dims[2], d->dims[2] = d->dims[3], d->dims[3] = c;
}

/* A constant [a, b, c, d] as [a, c, d, b], or -1 when out of memory. */
static int32_t permuted_constant(kiln_graph *g, uint32_t t) {
  kiln_tensor_desc desc = g->tensors[t].desc;
  size_t es = kiln_dtype_size(desc.dtype);
  int64_t a = desc.dims[0], b = desc.dims[1], hw = desc.dims[2] * desc.dims[3];
  uint8_t *bytes = kiln_malloc(desc.nbytes ? (size_t)desc.nbytes : 1);
  int32_t id;
  if (!bytes) return -1;
  for (int64_t i = 0; i < a; i++)
    for (int64_t j = 0; j < b; j++)
      for (int64_t k = 0; k < hw; k++)
        memcpy(bytes + ((i * hw + k) * b + j) * es, g->tensors[t].data + ((i * b + j) * hw + k) * es,
               es);
  nhwc_desc(&desc);
  if ((id = kiln_graph_add_tensor(g, KILN_NODE_CONSTANT, &desc)) < 0) {
    free(bytes);
    return -1;
  }
  g->tensors[id].data = g->tensors[id].owned = bytes;
  return id;
}

static kiln_op permute_op(uint32_t in, uint32_t out, const int64_t *perm) {
  kiln_op op;
  memset(&op, 0, sizeof op);
  op.kind = KILN_OP_PERMUTE;
  op.n_inputs = 1;
  op.inputs[0] = in;
  op.output = out;
  op.n_iattr = 4;
  memcpy(op.iattr, perm, sizeof to_nhwc);
  return op;
}

typedef struct layout_state {
  uint8_t *region;  /* per op */
  uint8_t *nhwc;    /* per tensor: holds NHWC once the pass is done */
  int32_t *in_map;  /* per tensor: its NHWC copy for region readers, or -1 */
  int32_t *out_map; /* per tensor: its NCHW copy for readers outside, or -1 */
  kiln_op *ops;     /* the rewritten op list */
  uint8_t *dead;
  uint32_t n_ops, cap;
} layout_state;

static int emit(layout_state *st, const kiln_op *op, uint8_t dead) {
  if (st->n_ops >= st->cap) return -1;
  st->ops[st->n_ops] = *op;
  st->dead[st->n_ops++] = dead;
  return 0;
}

/* The NHWC tensor a region op reads for t: t itself, a permuted constant, or a permute of it
 * emitted now. -1 when out of memory. */
static int32_t nhwc_input(kiln_graph *g, layout_state *st, uint32_t t) {
  if (st->nhwc[t]) return (int32_t)t;
  if (st->in_map[t] >= 0) return st->in_map[t];
  int32_t id;
  if (g->tensors[t].node == KILN_NODE_CONSTANT) {
    id = permuted_constant(g, t);
  } else {
    kiln_tensor_desc desc = g->tensors[t].desc;
    nhwc_desc(&desc);
    id = kiln_graph_add_tensor(g, KILN_NODE_OP, &desc);
    if (id >= 0) {
      kiln_op p = permute_op(t, (uint32_t)id, to_nhwc);
      if (emit(st, &p, 0)) return -1;
    }
  }
  if (id >= 0) st->in_map[t] = id;
  return id;
}

/* The NCHW tensor an op outside the region reads for region tensor t, emitted at first need. */
static int32_t nchw_output(kiln_graph *g, layout_state *st, uint32_t t) {
  if (st->out_map[t] >= 0) return st->out_map[t];
  kiln_tensor_desc desc = g->tensors[t].desc; /* still NCHW: descs change at the end */
  int32_t id = kiln_graph_add_tensor(g, KILN_NODE_OP, &desc);
  if (id < 0) return -1;
  kiln_op p = permute_op(t, (uint32_t)id, to_nchw);
  if (emit(st, &p, 0)) return -1;
  st->out_map[t] = id;
  return id;
}

static int rewrite(kiln_graph *g, layout_state *st) {
  uint32_t n_ops = g->n_ops;
  for (uint32_t i = 0; i < n_ops; i++) {
    kiln_op op = g->ops[i];
    if (g->dead[i]) {
      if (emit(st, &op, 1)) return -1;
      continue;
    }
    for (uint32_t k = 0; k < op.n_inputs; k++) {
      uint32_t t = op.inputs[k];
      int32_t id = (int32_t)t;
      if (st->region[i] && is_activation_input(&op, k))
        id = nhwc_input(g, st, t);
      else if (!st->region[i] && st->nhwc[t])
        id = nchw_output(g, st, t);
      if (id < 0) return -1;
      op.inputs[k] = (uint32_t)id;
    }
    if (st->region[i]) {
      if (op.kind == KILN_OP_CONV) {
        uint32_t slot = kiln_conv_epilogue_slot(op.kind);
        while (op.n_iattr <= slot) op.iattr[op.n_iattr++] = 0;
        op.iattr[slot] = 1;
      } else if (layout_slot(op.kind) >= 0) {
        op.iattr[op.n_iattr++] = 1;
      }
      st->nhwc[op.output] = 1;
    }
    if (emit(st, &op, 0)) return -1;
  }
  for (uint32_t b = 0; b < g->n_outputs; b++) {
    uint32_t t = (uint32_t)g->outputs[b].tensor;
    int32_t id = st->nhwc[t] ? nchw_output(g, st, t) : (int32_t)t;
    if (id < 0) return -1;
    g->outputs[b].tensor = id;
  }
  return 0;
}

kiln_status kiln_layout_channels_last(kiln_graph *g, kiln_error *err) {
  layout_state st;
  int any = 0, failed;
  memset(&st, 0, sizeof st);
  for (uint32_t i = 0; i < g->n_ops; i++) any |= !g->dead[i] && is_seed(&g->ops[i], g);
  if (!any) return KILN_OK;
  /* Each tensor adds at most one permute in and one out, plus the outputs' back-permutes. */
  uint32_t tensors = g->n_tensors, most = g->n_ops + 2 * tensors + g->n_outputs;
  uint32_t all = tensors + most; /* the tensors the rewrite may add, too */
  st.region = kiln_malloc(g->n_ops);
  st.nhwc = kiln_malloc(all);
  st.in_map = kiln_malloc(sizeof *st.in_map * all);
  st.out_map = kiln_malloc(sizeof *st.out_map * all);
  st.ops = kiln_malloc(sizeof *st.ops * most);
  st.dead = kiln_malloc(most);
  st.cap = most;
  failed = !st.region || !st.nhwc || !st.in_map || !st.out_map || !st.ops || !st.dead;
  if (!failed) {
    memset(st.nhwc, 0, all); /* first: region tensors, produced by a region op */
    for (uint32_t t = 0; t < all; t++) st.in_map[t] = st.out_map[t] = -1;
    for (uint32_t i = 0; i < g->n_ops; i++) {
      const kiln_op *op = &g->ops[i];
      int reads = 0;
      for (uint32_t k = 0; k < op->n_inputs; k++) reads |= st.nhwc[op->inputs[k]];
      st.region[i] = !g->dead[i] && (is_seed(op, g) || (reads && can_join(op, g)));
      if (st.region[i]) st.nhwc[op->output] = 1;
    }
    memset(st.nhwc, 0, all); /* then: tensors already rewritten */
  }
  failed = failed || rewrite(g, &st);
  if (!failed) {
    for (uint32_t t = 0; t < tensors; t++)
      if (st.nhwc[t]) nhwc_desc(&g->tensors[t].desc);
    free(g->ops);
    free(g->dead);
    g->ops = st.ops, g->dead = st.dead, g->n_ops = g->cap_ops = st.n_ops;
    st.ops = NULL, st.dead = NULL;
    for (uint32_t i = 0; i < g->n_ops; i++)
      if (!g->dead[i]) g->tensors[g->ops[i].output].producer = (int32_t)i;
  }
  free(st.region), free(st.nhwc), free(st.in_map), free(st.out_map), free(st.ops), free(st.dead);
  if (failed)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder: out of memory for %u ops while laying out convolutions "
                     "channels-last; free memory and retry",
                     (unsigned)g->n_ops);
  return KILN_OK;
}
