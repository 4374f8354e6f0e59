/* Constant folding and GEMM recognition on the builder's graph. */
#include "builder/fold.h"

#include "runtime/alloc.h"
#include "runtime/shape.h"

#include <stdlib.h>
#include <string.h>

/* Writes src (shape dims, rank) permuted by perm into dst, element by element. */
static void permute_bytes(const uint8_t *src, uint8_t *dst, size_t elem, int32_t rank,
                          const int64_t *dims, const int64_t *perm, uint64_t count) {
  int64_t in_stride[KILN_MAX_RANK], out_dims[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
  int64_t stride = 1;
  for (int32_t d = rank; d-- > 0;) in_stride[d] = stride, stride *= dims[d];
  for (int32_t d = 0; d < rank; d++) out_dims[d] = dims[perm[d]];
  for (uint64_t n = 0; n < count; n++) {
    int64_t from = 0;
    for (int32_t d = 0; d < rank; d++) from += idx[d] * in_stride[perm[d]];
    memcpy(dst + n * elem, src + (uint64_t)from * elem, elem);
    for (int32_t d = rank; d-- > 0;) {
      if (++idx[d] < out_dims[d]) break;
      idx[d] = 0;
    }
  }
}

/* Writes into *bytes a new buffer of t's bytes permuted by perm (the result's shape is out). */
static kiln_status permuted_copy(const kiln_graph *g, int32_t t, const int64_t *perm,
                                 const kiln_tensor_desc *out, uint8_t **bytes, kiln_error *err) {
  size_t elem = kiln_dtype_size(out->dtype);
  if (!(*bytes = kiln_malloc((size_t)out->nbytes)))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder: out of memory folding a %llu-byte constant; free memory and retry",
                     (unsigned long long)out->nbytes);
  permute_bytes(g->tensors[t].data, *bytes, elem, g->tensors[t].desc.rank,
                g->tensors[t].desc.dims, perm, out->nbytes / elem);
  return KILN_OK;
}

/* Turns op i's output into a constant holding data and drops the op. */
static void become_constant(kiln_graph *g, uint32_t i, const uint8_t *data, uint8_t *owned) {
  kiln_gtensor *t = &g->tensors[g->ops[i].output];
  t->node = KILN_NODE_CONSTANT;
  t->producer = -1;
  t->data = data;
  t->owned = owned;
  g->dead[i] = 1;
}

kiln_status kiln_fold_constants(kiln_graph *g, kiln_error *err) {
  static const int64_t swap[2] = {1, 0};
  for (uint32_t i = 0; i < g->n_ops; i++) {
    kiln_op *op = &g->ops[i];
    int32_t src = (int32_t)op->inputs[0], out = (int32_t)op->output;
    if (g->dead[i] || (op->kind != KILN_OP_RESHAPE && op->kind != KILN_OP_PERMUTE) ||
        g->tensors[src].node != KILN_NODE_CONSTANT || kiln_graph_is_output(g, out))
      continue;
    if (op->kind == KILN_OP_RESHAPE) {
      become_constant(g, i, g->tensors[src].data, NULL);
      continue;
    }
    uint8_t *bytes;
    kiln_status s = permuted_copy(g, src, op->iattr, &g->tensors[out].desc, &bytes, err);
    if (s) return s;
    become_constant(g, i, bytes, bytes);
    if (g->tensors[out].desc.rank == 2 && memcmp(op->iattr, swap, sizeof swap) == 0)
      g->tensors[out].transpose_of = src;
  }
  return KILN_OK;
}

/* MATMUL a @ b with b a 2-D constant [K,N] becomes LINEAR a, w[N,K]. */
static kiln_status matmul_to_linear(kiln_graph *g, uint32_t i, kiln_error *err) {
  static const int64_t swap[2] = {1, 0};
  kiln_op *op = &g->ops[i];
  int32_t b = (int32_t)op->inputs[1], w = g->tensors[b].transpose_of;
  if (w < 0) {
    kiln_tensor_desc desc = g->tensors[b].desc;
    uint8_t *bytes;
    kiln_status s;
    desc.dims[0] = g->tensors[b].desc.dims[1];
    desc.dims[1] = g->tensors[b].desc.dims[0];
    if ((s = permuted_copy(g, b, swap, &desc, &bytes, err))) return s;
    if ((w = kiln_graph_add_tensor(g, KILN_NODE_CONSTANT, &desc)) < 0) {
      free(bytes);
      return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                       "builder op %u (matmul): out of memory adding its transposed weight; free "
                       "memory and retry",
                       (unsigned)i);
    }
    g->tensors[w].data = g->tensors[w].owned = bytes;
  }
  op->kind = KILN_OP_LINEAR;
  op->inputs[1] = (uint32_t)w;
  op->n_iattr = 0;
  memset(op->iattr, 0, sizeof op->iattr);
  return KILN_OK;
}

/* ADD op i = LINEAR output + 1-D constant [N]: the constant becomes the LINEAR's bias. */
static void fold_bias(kiln_graph *g, uint32_t i, uint32_t *uses) {
  const kiln_op *add = &g->ops[i];
  if (add->fattr[0] != 1.0) return;
  for (uint32_t side = 0; side < 2; side++) {
    const kiln_gtensor *lin_out = &g->tensors[add->inputs[side]];
    const kiln_gtensor *bias = &g->tensors[add->inputs[1 - side]];
    kiln_op *lin;
    if (lin_out->node != KILN_NODE_OP || uses[add->inputs[side]] != 1) continue;
    lin = &g->ops[lin_out->producer];
    if (lin->kind != KILN_OP_LINEAR || lin->n_inputs != 2 || lin->iattr[0] != KILN_ACT_NONE ||
        bias->node != KILN_NODE_CONSTANT || bias->desc.rank != 1 ||
        bias->desc.dims[0] != lin_out->desc.dims[lin_out->desc.rank - 1])
      continue;
    uses[add->inputs[side]] = 0;
    lin->inputs[2] = add->inputs[1 - side];
    lin->n_inputs = 3;
    lin->output = add->output;
    g->tensors[add->output].producer = lin_out->producer;
    g->dead[i] = 1;
    return;
  }
}

kiln_status kiln_recognize_gemm(kiln_graph *g, kiln_error *err) {
  uint32_t *uses;
  for (uint32_t i = 0; i < g->n_ops; i++) {
    const kiln_op *op = &g->ops[i];
    const kiln_gtensor *b;
    kiln_status s;
    if (g->dead[i] || op->kind != KILN_OP_MATMUL) continue;
    b = &g->tensors[op->inputs[1]];
    if (b->node == KILN_NODE_CONSTANT && b->desc.rank == 2 && (s = matmul_to_linear(g, i, err)))
      return s;
  }
  if (!(uses = kiln_malloc(sizeof *uses * (g->n_tensors ? g->n_tensors : 1))))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder: out of memory for %u tensors while fusing biases; free memory and "
                     "retry",
                     (unsigned)g->n_tensors);
  kiln_graph_count_uses(g, uses);
  for (uint32_t i = 0; i < g->n_ops; i++)
    if (!g->dead[i] && g->ops[i].kind == KILN_OP_ADD) fold_bias(g, i, uses);
  free(uses);
  return KILN_OK;
}

kiln_status kiln_outer_products_to_mul(kiln_graph *g, kiln_error *err) {
  (void)err;
  for (uint32_t i = 0; i < g->n_ops; i++) {
    kiln_op *op = &g->ops[i];
    if (g->dead[i] || op->kind != KILN_OP_MATMUL) continue;
    const kiln_tensor_desc *a = &g->tensors[op->inputs[0]].desc;
    const kiln_tensor_desc *b = &g->tensors[op->inputs[1]].desc;
    if (a->rank >= 2 && b->rank >= 2 && a->dims[a->rank - 1] == 1 && b->dims[b->rank - 2] == 1 &&
        !a->sym[a->rank - 1].symbol && !b->sym[b->rank - 2].symbol)
      op->kind = KILN_OP_MUL; /* [..,M,1] * [..,1,N] broadcasts as the matmul's batch dims do */
  }
  return KILN_OK;
}

/* Op i goes: the live ops after it read src where they read its output. */
static void bypass(kiln_graph *g, uint32_t i, int32_t src) {
  uint32_t out = g->ops[i].output;
  for (uint32_t j = i + 1; j < g->n_ops; j++)
    for (uint32_t k = 0; !g->dead[j] && k < g->ops[j].n_inputs; k++)
      if (g->ops[j].inputs[k] == out) g->ops[j].inputs[k] = (uint32_t)src;
  g->dead[i] = 1;
}

/* 1 when op gives its input back unchanged whenever its output has the input's shape: an
 * expand or a slice can only be the identity then (a permute of equal dims could swap them).
 * Not when a size follows a symbol: output dims are known at the bounds only, here. */
static int identity_when_same_shape(const kiln_op *op) {
  if (op->kind == KILN_OP_RESHAPE) return 1;
  if (op->kind != KILN_OP_EXPAND && !(op->kind == KILN_OP_SLICE && op->iattr[3] == 1)) return 0;
  return !kiln_op_follows_symbol(op);
}

kiln_status kiln_fold_reshapes(kiln_graph *g, kiln_error *err) {
  (void)err;
  for (uint32_t i = 0; i < g->n_ops; i++) {
    kiln_op *op = &g->ops[i];
    if (g->dead[i] || !identity_when_same_shape(op)) continue;
    const kiln_gtensor *in = &g->tensors[op->inputs[0]];
    if (op->kind == KILN_OP_RESHAPE && in->node == KILN_NODE_OP && in->producer >= 0 &&
        !g->dead[in->producer] && g->ops[in->producer].kind == KILN_OP_RESHAPE)
      op->inputs[0] = g->ops[in->producer].inputs[0];
    int32_t src = (int32_t)op->inputs[0], out = (int32_t)op->output;
    /* an output binding or a state's written value must stay an op's output */
    if (!kiln_same_desc(&g->tensors[src].desc, &g->tensors[out].desc) ||
        kiln_graph_is_output(g, out))
      continue;
    bypass(g, i, src);
  }
  return KILN_OK;
}

kiln_status kiln_drop_copies(kiln_graph *g, kiln_error *err) {
  uint8_t *from_state = kiln_malloc(g->n_tensors ? g->n_tensors : 1);
  if (!from_state)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder: out of memory for %u tensors while dropping copies; free memory and "
                     "retry",
                     (unsigned)g->n_tensors);
  kiln_graph_mark_state_derived(g, from_state);
  for (uint32_t i = 0; i < g->n_ops; i++) {
    const kiln_op *op = &g->ops[i];
    int32_t src = (int32_t)op->inputs[0], out = (int32_t)op->output;
    if (g->dead[i] || op->kind != KILN_OP_COPY || from_state[src] || kiln_graph_is_output(g, out) ||
        !kiln_same_desc(&g->tensors[src].desc, &g->tensors[out].desc))
      continue;
    bypass(g, i, src);
  }
  free(from_state);
  return KILN_OK;
}
