/* Constant attention masks folded into the SDPA's causal flag (see fold_attention_mask.h). */
#include "builder/fold_attention_mask.h"

#include "cpu/half.h"
#include "runtime/sdpa_layout.h"

#include <math.h>

typedef enum mask_value { MASK_KEEP, MASK_REMOVE, MASK_OTHER } mask_value;

/* Element e of a constant mask of dtype dt as keep, remove, or neither. */
static mask_value mask_at(const uint8_t *data, kiln_dtype dt, uint64_t e) {
  float x;
  switch (dt) {
  case KILN_BOOL: return data[e] ? MASK_KEEP : MASK_REMOVE;
  case KILN_F32: memcpy(&x, data + 4 * e, 4); break;
  case KILN_F16: {
    uint16_t h;
    memcpy(&h, data + 2 * e, 2);
    if (h == 0xfbffu) return MASK_REMOVE; /* -65504, the lowest f16 */
    x = kiln_f16_to_f32(h);
    break;
  }
  case KILN_BF16: {
    uint16_t h;
    memcpy(&h, data + 2 * e, 2);
    x = kiln_bf16_to_f32(h);
    break;
  }
  default: return MASK_OTHER;
  }
  if (x == 0.0f) return MASK_KEEP;
  if (x == -INFINITY || x == -3.40282347e38f || x == -3.38953139e38f) return MASK_REMOVE;
  return MASK_OTHER;
}

/* What the constant mask m says of the scores [..., L, S]: 0 nothing (it keeps every key), 1
 * exactly the causal mask (key j of row i kept when j <= i), -1 more. */
static int mask_pattern(const kiln_gtensor *m, int64_t L, int64_t S) {
  const kiln_tensor_desc *d = &m->desc;
  if (d->rank < 2 || !m->data) return -1;
  int64_t rows = d->dims[d->rank - 2], cols = d->dims[d->rank - 1];
  if ((rows != L && rows != 1) || (cols != S && cols != 1)) return -1;
  uint64_t count = d->nbytes / kiln_dtype_size(d->dtype);
  int keeps_all = 1, is_causal = 1;
  for (uint64_t e = 0; e < count && (keeps_all || is_causal); e++) {
    int64_t j = (int64_t)(e % (uint64_t)cols), i = (int64_t)(e / (uint64_t)cols % (uint64_t)rows);
    mask_value v = mask_at(m->data, d->dtype, e);
    if (v == MASK_OTHER) return -1;
    keeps_all &= v == MASK_KEEP;
    /* a row or column broadcast stands for every i or j: causal only if it holds at each */
    for (int64_t ii = rows == 1 ? 0 : i; ii < (rows == 1 ? L : i + 1) && is_causal; ii++)
      for (int64_t jj = cols == 1 ? 0 : j; jj < (cols == 1 ? S : j + 1) && is_causal; jj++)
        is_causal = v == (jj <= ii ? MASK_KEEP : MASK_REMOVE);
  }
  return keeps_all ? 0 : is_causal ? 1 : -1;
}

kiln_status kiln_fold_attention_masks(kiln_graph *g, int dynamic, kiln_error *err) {
  (void)err;
  for (uint32_t i = 0; i < g->n_ops; i++) {
    kiln_op *op = &g->ops[i];
    if (g->dead[i] || op->kind != KILN_OP_SDPA || op->n_iattr < 2 || op->iattr[1] != 1 ||
        op->iattr[0] != 0)
      continue;
    int packed = kiln_sdpa_layout(op) == 1;
    uint32_t mi = packed ? 1u : 3u;
    if (op->n_inputs != mi + 1) continue;
    /* an expanded mask: the SDPA broadcasts it itself */
    for (int32_t p = g->tensors[op->inputs[mi]].producer;
         g->tensors[op->inputs[mi]].node == KILN_NODE_OP && p >= 0 && !g->dead[p] &&
         g->ops[p].kind == KILN_OP_EXPAND && !kiln_op_follows_symbol(&g->ops[p]);
         p = g->tensors[op->inputs[mi]].producer)
      op->inputs[mi] = g->ops[p].inputs[0];
    const kiln_gtensor *m = &g->tensors[op->inputs[mi]];
    if (dynamic || m->node != KILN_NODE_CONSTANT) continue;
    const kiln_tensor_desc *q = &g->tensors[op->inputs[0]].desc;
    const kiln_tensor_desc *k = &g->tensors[op->inputs[packed ? 0 : 1]].desc;
    /* packed: qkv [B, L, 3, H, E], L = S; else q [..., L, E], k [..., S, E] */
    int64_t L = packed ? q->dims[1] : q->dims[q->rank - 2];
    int64_t S = packed ? L : k->dims[k->rank - 2];
    int pattern = mask_pattern(m, L, S);
    if (pattern < 0) continue;
    if (pattern == 1) op->iattr[0] = 1;
    op->iattr[1] = 0;
    op->inputs[mi] = 0;
    op->n_inputs = mi;
  }
  return KILN_OK;
}
