/* Checks at init that every op's inputs, output and attributes agree, so no kernel can index
 * past a tensor on the device: a device fault poisons the whole process's CUDA context,
 * while a refusal here is an ordinary error that loses nothing. */
#include "cuda_check.h"

#include "runtime/fused_program.h"
#include "runtime/linear_inputs.h"
#include "runtime/pointwise_steps.h"
#include "runtime/sdpa_layout.h"
#include "runtime/shape.h"
#include "cuda_conv.h"
#include "cuda_ops.h"

#include <string.h>

#define KCU_BAD(...) kiln_fail(err, KILN_ERR_INVALID_PROGRAM, __VA_ARGS__)

static int kcu_index(kiln_dtype dt) { return dt == KILN_I32 || dt == KILN_I64; }

static int64_t kcu_count(const kiln_tensor_desc *t) {
  int64_t n = 1;
  for (int d = 0; d < t->rank; d++) n *= t->dims[d];
  return n;
}

/* 1 when t broadcasts (right-aligned) to the shape of `to`. */
static int kcu_broadcasts(const kiln_tensor_desc *t, const kiln_tensor_desc *to) {
  if (t->rank > to->rank) return 0;
  for (int d = 0; d < t->rank; d++) {
    int64_t a = t->dims[d], b = to->dims[d + to->rank - t->rank];
    if (a != b && a != 1) return 0;
  }
  return 1;
}

static int kcu_same_dims(const kiln_tensor_desc *a, const kiln_tensor_desc *b) {
  if (a->rank != b->rank) return 0;
  for (int d = 0; d < a->rank; d++)
    if (a->dims[d] != b->dims[d]) return 0;
  return 1;
}

static kiln_status kcu_check_gemm(const kiln_plan *p, const kiln_op *op, uint32_t i,
                                  kiln_error *err) {
  const kiln_tensor_desc *x = &p->tensors[op->inputs[0]], *w = &p->tensors[op->inputs[1]];
  const kiln_tensor_desc *out = &p->tensors[op->output];
  const char *name = kiln_op_name(op->kind);
  int same_dtypes = 1;
  for (uint32_t k = 0; k < op->n_inputs; k++) same_dtypes &= p->tensors[op->inputs[k]].dtype == out->dtype;
  if (!kiln_dtype_is_float(out->dtype) || !same_dtypes)
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "op %u (%.16s): the CUDA engine multiplies f32, f16 or bf16 operands of one "
                     "dtype; cast the operands to the output dtype before export", i, name);
  if (x->rank < 1 || w->rank < 1 || x->dims[x->rank - 1] == 0)
    return KCU_BAD("op %u (%.16s): operands need at least one dim and K > 0; re-export the "
                   "program", i, name);
  if (op->kind == KILN_OP_LINEAR) {
    int64_t n_out = op->n_iattr > 0 && op->iattr[0] == KILN_ACT_SWIGLU ? w->dims[0] / 2 : w->dims[0];
    if (w->rank != 2 || w->dims[1] != x->dims[x->rank - 1] || out->rank != x->rank ||
        out->dims[out->rank - 1] != n_out || kcu_count(out) != kcu_count(x) / w->dims[1] * n_out ||
        (n_out != w->dims[0] && (w->dims[0] % 2 != 0 || op->n_inputs != 2)))
      return KCU_BAD("op %u (linear): weight, input and output shapes disagree; re-export the "
                     "program", i);
    if (kiln_linear_has_bias(op)) {
      const kiln_tensor_desc *b = &p->tensors[op->inputs[2]];
      if (kcu_count(b) != w->dims[0])
        return KCU_BAD("op %u (linear): bias has %lld elements, the weight %lld rows; re-export "
                       "the program", i, (long long)kcu_count(b), (long long)w->dims[0]);
    }
    if (op->n_iattr > 1 && op->iattr[1] != 0 &&
        (!kiln_linear_has_residual(op) || op->iattr[0] != KILN_ACT_NONE || op->n_inputs < 3 ||
         !kcu_same_dims(&p->tensors[op->inputs[op->n_inputs - 1]], out)))
      return KCU_BAD("op %u (linear): the residual flag %lld needs a last input of the output's "
                     "shape and no activation; re-export the program", i, (long long)op->iattr[1]);
    if (op->n_inputs > 3 && !kiln_linear_has_residual(op))
      return KCU_BAD("op %u (linear): 4 inputs without the residual flag; re-export the program",
                     i);
    if (op->n_iattr > 0 && (op->iattr[0] < 0 || op->iattr[0] > KILN_ACT_SWIGLU))
      return KCU_BAD("op %u (linear): activation %lld is not a kiln_activation; re-export the "
                     "program", i, (long long)op->iattr[0]);
    return KILN_OK;
  }
  int64_t K = x->dims[x->rank - 1], Kw = w->rank == 1 ? w->dims[0] : w->dims[w->rank - 2];
  int64_t M = x->rank == 1 ? 1 : x->dims[x->rank - 2], N = w->rank == 1 ? 1 : w->dims[w->rank - 1];
  int64_t xb = x->rank > 2 ? kcu_count(x) / (M * K != 0 ? M * K : 1) : 1;
  int64_t wb = w->rank > 2 ? kcu_count(w) / (K * N != 0 ? K * N : 1) : 1;
  int64_t ob = M * N != 0 ? kcu_count(out) / (M * N) : 0;
  int ok = K == Kw && kcu_count(out) == ob * M * N && (xb == 1 || xb == ob || ob % xb == 0) &&
           (wb == 1 || wb == ob || ob % wb == 0);
  int32_t out_batch_rank = out->rank - (x->rank == 1 ? 0 : 1) - (w->rank == 1 ? 0 : 1);
  for (int d = 0; ok && x->rank > 2 && d < x->rank - 2; d++) {
    int od = d + out_batch_rank - (x->rank - 2);
    ok = od >= 0 && (x->dims[d] == 1 || x->dims[d] == out->dims[od]);
  }
  for (int d = 0; ok && w->rank > 2 && d < w->rank - 2; d++) {
    int od = d + out_batch_rank - (w->rank - 2);
    ok = od >= 0 && (w->dims[d] == 1 || w->dims[d] == out->dims[od]);
  }
  if (!ok || out_batch_rank < 0 || ob > 0x7fffffffLL)
    return KCU_BAD("op %u (matmul): operand shapes do not multiply to the output shape; "
                   "re-export the program", i);
  return KILN_OK;
}

static kiln_status kcu_check_layout(const kiln_plan *p, const kiln_op *op, uint32_t i,
                                    kiln_error *err) {
  const kiln_tensor_desc *x = &p->tensors[op->inputs[0]], *out = &p->tensors[op->output];
  const char *name = kiln_op_name(op->kind);
  if (x->dtype != out->dtype)
    return KCU_BAD("op %u (%.16s): input is %.8s, output %.8s; re-export the program", i, name,
                   kiln_dtype_name(x->dtype), kiln_dtype_name(out->dtype));
  int ok = 1;
  switch (op->kind) {
  case KILN_OP_PERMUTE: {
    uint32_t seen = 0;
    ok = (int32_t)op->n_iattr == x->rank && out->rank == x->rank;
    for (int d = 0; ok && d < x->rank; d++) {
      int64_t s = op->iattr[d];
      ok = s >= 0 && s < x->rank && !(seen & (1u << s)) && out->dims[d] == x->dims[s];
      if (ok) seen |= 1u << s;
    }
    break;
  }
  case KILN_OP_EXPAND: ok = kcu_broadcasts(x, out); break;
  case KILN_OP_SLICE: {
    int64_t dim = op->iattr[0], start = op->iattr[1], step = op->iattr[3];
    ok = op->n_iattr >= 4 && dim >= 0 && dim < x->rank && out->rank == x->rank && step > 0 &&
         start >= 0;
    for (int d = 0; ok && d < x->rank; d++)
      ok = d == dim ? (out->dims[d] == 0 || start + (out->dims[d] - 1) * step < x->dims[d])
                    : out->dims[d] == x->dims[d];
    break;
  }
  case KILN_OP_SELECT: {
    int64_t dim = op->iattr[0], index = op->iattr[1];
    ok = op->n_iattr >= 2 && dim >= 0 && dim < x->rank && out->rank == x->rank - 1;
    if (ok && index < 0) index += x->dims[dim];
    ok = ok && index >= 0 && index < x->dims[dim];
    for (int d = 0, e = 0; ok && d < x->rank; d++)
      if (d != dim) ok = out->dims[e++] == x->dims[d];
    break;
  }
  case KILN_OP_CAT: {
    int64_t dim = op->iattr[0], total = 0;
    ok = op->n_iattr >= 1 && dim >= 0 && dim < out->rank;
    for (uint32_t k = 0; ok && k < op->n_inputs; k++) {
      const kiln_tensor_desc *t = &p->tensors[op->inputs[k]];
      ok = t->rank == out->rank && t->dtype == out->dtype;
      for (int d = 0; ok && d < out->rank; d++) ok = d == dim || t->dims[d] == out->dims[d];
      if (ok) total += t->dims[dim];
    }
    ok = ok && total == out->dims[dim];
    break;
  }
  default: ok = x->nbytes == out->nbytes; break; /* COPY, RESHAPE */
  }
  if (!ok)
    return KCU_BAD("op %u (%.16s): attributes or shapes do not fit the input (tensor %u); "
                   "re-export the program", i, name, op->inputs[0]);
  return KILN_OK;
}

/* Packed heads: qkv [B,L,3,H,E] -> [B,L,H,E], a mask broadcast to [B,H,L,L]. */
static kiln_status kcu_check_packed_attention(const kiln_plan *p, const kiln_op *op, uint32_t i,
                                              kiln_error *err) {
  const kiln_tensor_desc *x = &p->tensors[op->inputs[0]], *out = &p->tensors[op->output];
  int has_mask = op->n_iattr > 1 && op->iattr[1] != 0;
  int ok = op->iattr[2] == 1 && op->n_inputs == 1u + (uint32_t)has_mask && x->rank == 5 &&
           x->dims[2] == 3 && out->rank == 4 && out->dims[0] == x->dims[0] &&
           out->dims[1] == x->dims[1] && out->dims[2] == x->dims[3] &&
           out->dims[3] == x->dims[4] && kiln_dtype_is_float(x->dtype) && out->dtype == x->dtype &&
           x->dims[0] * x->dims[3] * ((x->dims[1] + 7) / 8) <= 0x7fffffffLL;
  if (ok && has_mask) {
    const kiln_tensor_desc *m = &p->tensors[op->inputs[1]];
    kiln_tensor_desc scores = *out;
    scores.dims[1] = x->dims[3];
    scores.dims[2] = scores.dims[3] = x->dims[1];
    ok = (m->dtype == KILN_BOOL || kiln_dtype_is_float(m->dtype)) && kcu_broadcasts(m, &scores);
  }
  if (!ok)
    return KCU_BAD("op %u (sdpa): packed qkv, mask and output shapes disagree; re-export the "
                   "program", i);
  if (x->dims[4] > KCU_ATTN_MAX_HEAD)
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "op %u (sdpa): head dim %lld exceeds the fused kernel's %d; run this "
                     "program on the CPU reference engine", i, (long long)x->dims[4],
                     KCU_ATTN_MAX_HEAD);
  return KILN_OK;
}

/* 1 when t's dim aligned with out's dim -3 is a head count neither 1 nor out's: GQA. */
static int kcu_grouped_heads(const kiln_tensor_desc *t, const kiln_tensor_desc *out) {
  if (t->rank < 3 || out->rank < 3) return 0;
  int64_t h = t->dims[t->rank - 3];
  return h != 1 && h != out->dims[out->rank - 3];
}

static kiln_status kcu_check_attention(const kiln_plan *p, const kiln_op *op, uint32_t i,
                                       kiln_error *err) {
  int64_t layout = kiln_sdpa_layout(op);
  if (layout == 1) return kcu_check_packed_attention(p, op, i, err);
  if (op->n_inputs < 3) return KCU_BAD("op %u (sdpa): %u inputs, needs 3; re-export the program", i, op->n_inputs);
  const kiln_tensor_desc *q = &p->tensors[op->inputs[0]], *k = &p->tensors[op->inputs[1]],
                         *v = &p->tensors[op->inputs[2]], *out = &p->tensors[op->output];
  kiln_tensor_desc heads; /* heads last: the [B,H,L,Ev] result the kernels see */
  if (layout != 0 && (layout != 2 || q->rank != 4 || out->rank != 4))
    return KCU_BAD("op %u (sdpa): layout %lld with q of rank %d; re-export the program", i,
                   (long long)layout, (int)q->rank);
  if (layout == 2) {
    heads = *out;
    heads.dims[1] = out->dims[2], heads.dims[2] = out->dims[1];
    out = &heads;
  }
  if (!kiln_dtype_is_float(q->dtype) || !kiln_dtype_is_float(k->dtype) ||
      !kiln_dtype_is_float(v->dtype) || !kiln_dtype_is_float(out->dtype))
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "op %u (sdpa): the CUDA engine runs attention on float tensors only; cast "
                     "q, k and v before export", i);
  int ok = q->rank >= 2 && k->rank >= 2 && v->rank >= 2 && out->rank == q->rank &&
           q->rank - 2 <= 6 && k->rank <= q->rank && v->rank <= q->rank;
  if (ok) {
    int r = q->rank;
    ok = k->dims[k->rank - 1] == q->dims[r - 1] && v->dims[v->rank - 2] == k->dims[k->rank - 2] &&
         out->dims[r - 2] == q->dims[r - 2] && out->dims[r - 1] == v->dims[v->rank - 1];
    for (int d = 0; ok && d < r - 2; d++) ok = out->dims[d] == q->dims[d];
    for (int d = 0; ok && d < k->rank - 2; d++) {
      int64_t kd = k->dims[d], od = out->dims[d + (r - k->rank)];
      ok = kd == 1 || kiln_sdpa_kv_group(r, d + (r - k->rank), od, kd) > 0;
    }
    for (int d = 0; ok && d < v->rank - 2; d++) {
      int64_t vd = v->dims[d], od = out->dims[d + (r - v->rank)];
      ok = vd == 1 || kiln_sdpa_kv_group(r, d + (r - v->rank), od, vd) > 0;
    }
    /* grouped heads (dim -3): the kernels take the group off k, so v has k's rank and heads */
    if (ok && (kcu_grouped_heads(k, out) || kcu_grouped_heads(v, out)))
      ok = k->rank == r && v->rank == r && k->dims[r - 3] == v->dims[r - 3];
    int64_t batch = 1;
    for (int d = 0; d < r - 2; d++) batch *= out->dims[d];
    ok = ok && batch * ((q->dims[r - 2] + 7) / 8) <= 0x7fffffffLL;
  }
  if (ok && op->n_iattr > 1 && op->iattr[1]) {
    if (op->n_inputs < 4) ok = 0;
    else {
      const kiln_tensor_desc *m = &p->tensors[op->inputs[3]];
      kiln_tensor_desc full = *out;
      full.dims[full.rank - 1] = k->dims[k->rank - 2];
      ok = (m->dtype == KILN_BOOL || kiln_dtype_is_float(m->dtype)) && kcu_broadcasts(m, &full);
    }
  }
  if (!ok)
    return KCU_BAD("op %u (sdpa): q, k, v, mask and output shapes disagree; re-export the "
                   "program", i);
  if (q->dims[q->rank - 1] > KCU_ATTN_MAX_HEAD || v->dims[v->rank - 1] > KCU_ATTN_MAX_HEAD)
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "op %u (sdpa): head dims %lld and %lld exceed the fused kernel's %d; run "
                     "this program on the CPU reference engine", i,
                     (long long)q->dims[q->rank - 1], (long long)v->dims[v->rank - 1],
                     KCU_ATTN_MAX_HEAD);
  return KILN_OK;
}

/* Batch norm, pooling and resize: the geometry recomputed from the inputs and attributes must
 * give the output, so no window or source index the kernels compute can leave a tensor. */
static kiln_status kcu_check_vision(const kiln_plan *p, const kiln_op *op, uint32_t i,
                                    kiln_error *err) {
  const kiln_tensor_desc *in[KILN_MAX_OP_INPUTS], *out = &p->tensors[op->output];
  kiln_tensor_desc want;
  char why[160];
  for (uint32_t k = 0; k < op->n_inputs; k++) in[k] = &p->tensors[op->inputs[k]];
  if (kiln_vision_infer(op, in, &want, why, sizeof why))
    return KCU_BAD("op %u (%.20s): %.159s; re-export the program", i, kiln_op_name(op->kind), why);
  if (want.dtype != out->dtype || !kcu_same_dims(&want, out))
    return KCU_BAD("op %u (%.20s): the output's dtype or shape is not what the input and the "
                   "attributes give; re-export the program", i, kiln_op_name(op->kind));
  return KILN_OK;
}

/* CUMSUM, GATHER, INDEX and ARGMAX: shapes as shape inference gives them, so no index
 * arithmetic in their kernels can leave a tensor. */
static kiln_status kcu_check_index_scan(const kiln_plan *p, const kiln_op *op, uint32_t i,
                                        kiln_error *err) {
  const kiln_tensor_desc *x = &p->tensors[op->inputs[0]], *out = &p->tensors[op->output];
  const char *name = kiln_op_name(op->kind);
  int64_t dim = op->n_iattr > 0 ? op->iattr[0] : -1;
  int ok = 1;
  switch (op->kind) {
  case KILN_OP_CUMSUM:
    ok = op->n_iattr == 2 && dim >= 0 && dim < x->rank && op->iattr[1] == (int64_t)out->dtype &&
         out->dtype != KILN_BOOL && kcu_same_dims(x, out);
    break;
  case KILN_OP_ARGMAX: {
    int64_t keep = op->n_iattr > 1 ? op->iattr[1] : -1;
    ok = dim >= 0 && dim < x->rank && (keep == 0 || keep == 1) && x->dims[dim] > 0 &&
         x->dtype != KILN_BOOL && out->dtype == KILN_I64 &&
         out->rank == x->rank - (keep ? 0 : 1);
    for (int d = 0, o = 0; ok && d < x->rank; d++) {
      if (d == dim && !keep) continue;
      ok = out->dims[o++] == (d == dim ? 1 : x->dims[d]);
    }
    break;
  }
  case KILN_OP_GATHER: {
    const kiln_tensor_desc *idx = &p->tensors[op->inputs[1]];
    ok = dim >= 0 && dim < x->rank && kcu_index(idx->dtype) && x->dtype == out->dtype &&
         idx->rank == x->rank && kcu_same_dims(idx, out);
    for (int d = 0; ok && d < x->rank; d++) ok = d == dim || idx->dims[d] <= x->dims[d];
    break;
  }
  default: { /* INDEX */
    const kiln_tensor_desc *idx[KILN_MAX_OP_INPUTS];
    kiln_index_layout lay;
    uint32_t where;
    for (uint32_t k = 1; k < op->n_inputs; k++) {
      idx[k - 1] = &p->tensors[op->inputs[k]];
      ok = ok && kcu_index(idx[k - 1]->dtype);
    }
    ok = ok && x->dtype == out->dtype && op->n_iattr == 1 &&
         kiln_index_layout_of(x, idx, op->n_inputs - 1, op->iattr[0], &lay, &where) ==
             KILN_INDEX_FINE &&
         out->rank == lay.rank;
    for (int d = 0; ok && d < out->rank; d++) ok = out->dims[d] == lay.dims[d];
    break;
  }
  }
  if (!ok)
    return KCU_BAD("op %u (%.16s): dim, dtypes, indices or output shape do not fit the input; "
                   "re-export the program", i, name);
  return KILN_OK;
}

static const uint32_t kcu_min_inputs[KILN_OP_COUNT] = {
    [KILN_OP_LINEAR] = 2, [KILN_OP_MATMUL] = 2, [KILN_OP_ADD] = 2, [KILN_OP_SUB] = 2,
    [KILN_OP_MUL] = 2, [KILN_OP_DIV] = 2, [KILN_OP_WHERE] = 3, [KILN_OP_SDPA] = 1,
    [KILN_OP_EMBEDDING] = 2, [KILN_OP_INDEX_SELECT] = 2, [KILN_OP_MINIMUM] = 2,
    [KILN_OP_MAXIMUM] = 2, [KILN_OP_COMPARE] = 2, [KILN_OP_GATHER] = 2, [KILN_OP_INDEX] = 2,
    [KILN_OP_INDEX_COPY] = 3};

/* COMPARE, LOGICAL, BITWISE: the operator, the input count it takes and the dtypes. */
static kiln_status kcu_check_logic(const kiln_plan *p, const kiln_op *op, uint32_t i,
                                   kiln_error *err) {
  const kiln_tensor_desc *x = &p->tensors[op->inputs[0]], *out = &p->tensors[op->output];
  const kiln_tensor_desc *y = &p->tensors[op->inputs[op->n_inputs - 1]];
  int64_t which = op->n_iattr > 0 ? op->iattr[0] : -1;
  int ok;
  if (op->kind == KILN_OP_COMPARE)
    ok = which >= KILN_CMP_EQ && which <= KILN_CMP_GE && op->n_inputs == 2 &&
         y->dtype == x->dtype && out->dtype == KILN_BOOL;
  else
    ok = which >= KILN_BOOL_AND && which <= KILN_BOOL_NOT &&
         op->n_inputs == (which == KILN_BOOL_NOT ? 1u : 2u) &&
         (op->kind == KILN_OP_LOGICAL ? out->dtype == KILN_BOOL
                                      : !kiln_dtype_is_float(out->dtype) &&
                                            x->dtype == out->dtype && y->dtype == out->dtype);
  for (uint32_t k = 0; ok && k < op->n_inputs; k++)
    ok = kcu_broadcasts(&p->tensors[op->inputs[k]], out);
  if (!ok)
    return KCU_BAD("op %u (%.16s): operator %lld, %u inputs, their dtypes or shapes do not fit "
                   "the output; re-export the program", i, kiln_op_name(op->kind),
                   (long long)which, op->n_inputs);
  return KILN_OK;
}

kiln_status kcu_check_op(const kiln_plan *p, uint32_t i, kiln_error *err) {
  const kiln_op *op = &p->ops[i];
  if ((unsigned)op->kind >= KILN_OP_COUNT)
    return KCU_BAD("op %u: kind %d is unknown to this engine; update Kiln", i, (int)op->kind);
  const char *name = kiln_op_name(op->kind);
  uint32_t need = kcu_min_inputs[op->kind] ? kcu_min_inputs[op->kind] : 1;
  if (op->n_inputs < need)
    return KCU_BAD("op %u (%.16s): %u inputs, needs %u; re-export the program", i, name,
                   op->n_inputs, need);
  const kiln_tensor_desc *x = &p->tensors[op->inputs[0]], *out = &p->tensors[op->output];
  switch (op->kind) {
  case KILN_OP_LINEAR:
  case KILN_OP_MATMUL: return kcu_check_gemm(p, op, i, err);
  case KILN_OP_COMPARE: case KILN_OP_LOGICAL: case KILN_OP_BITWISE:
    return kcu_check_logic(p, op, i, err);
  case KILN_OP_ADD: case KILN_OP_SUB: case KILN_OP_MUL: case KILN_OP_DIV: case KILN_OP_WHERE:
  case KILN_OP_MINIMUM: case KILN_OP_MAXIMUM:
    for (uint32_t k = 0; k < need; k++)
      if (!kcu_broadcasts(&p->tensors[op->inputs[k]], out))
        return KCU_BAD("op %u (%.16s): input %u (tensor %u) does not broadcast to the output; "
                       "re-export the program", i, name, k, op->inputs[k]);
    if (op->kind == KILN_OP_WHERE && x->dtype != KILN_BOOL)
      return KCU_BAD("op %u (where): the condition is %.8s, not bool; re-export the program", i,
                     kiln_dtype_name(x->dtype));
    return KILN_OK;
  case KILN_OP_SOFTMAX: case KILN_OP_LOG_SOFTMAX:
    if (op->n_iattr < 1 || op->iattr[0] < 0 || op->iattr[0] >= x->rank ||
        !kcu_same_dims(x, out) || kcu_count(out) / (x->dims[op->iattr[0]] ? x->dims[op->iattr[0]] : 1) > 0x7fffffffLL)
      return KCU_BAD("op %u (%.16s): dim or output shape does not fit the input; re-export "
                     "the program", i, name);
    return KILN_OK;
  case KILN_OP_LAYER_NORM: case KILN_OP_RMS_NORM: {
    int64_t nd = op->n_iattr > 0 ? op->iattr[0] : -1, n = 1;
    if (nd < 1 || nd > x->rank || !kcu_same_dims(x, out))
      return KCU_BAD("op %u (%.16s): normalized dims or output shape do not fit the input; "
                     "re-export the program", i, name);
    for (int d = x->rank - (int)nd; d < x->rank; d++) n *= x->dims[d];
    int64_t flags = op->n_iattr > 1 ? op->iattr[1] : 0;
    uint32_t next = 1;
    for (int bit = 0; bit < 2; bit++) {
      if (!(flags & (1 << bit))) continue;
      if (next >= op->n_inputs || kcu_count(&p->tensors[op->inputs[next]]) != n)
        return KCU_BAD("op %u (%.16s): weight or bias missing or not %lld elements; re-export "
                       "the program", i, name, (long long)n);
      next++;
    }
    uint32_t step;
    kiln_pw_span span;
    int fused = kiln_pw_span_of(op, &span), ok = kiln_pointwise_check(op, &step) == KILN_PW_FINE &&
                                                 (fused ? next <= op->n_inputs : next == op->n_inputs);
    for (uint32_t k = next; ok && k < op->n_inputs; k++)
      ok = p->tensors[op->inputs[k]].dtype == x->dtype && kcu_broadcasts(&p->tensors[op->inputs[k]], x);
    if (!ok)
      return KCU_BAD("op %u (%.16s): fused steps, operand dtypes or shapes do not fit the input; "
                     "re-export the program", i, name);
    if (n && kcu_count(x) / n > 0x7fffffffLL)
      return kiln_fail(err, KILN_ERR_UNSUPPORTED, "op %u (%.16s): more than 2^31 rows; split "
                       "the input before export", i, name);
    return KILN_OK;
  }
  case KILN_OP_SUM: case KILN_OP_MEAN: case KILN_OP_AMAX: {
    int64_t mask = op->n_iattr > 0 ? op->iattr[0] : 0, kept = 1;
    if (mask < 0 || mask >= (1LL << x->rank))
      return KCU_BAD("op %u (%.16s): dim mask %lld names dims past rank %d; re-export the "
                     "program", i, name, (long long)mask, (int)x->rank);
    for (int d = 0; d < x->rank; d++)
      if (!(mask & (1LL << d))) kept *= x->dims[d];
    if (kcu_count(out) != kept)
      return KCU_BAD("op %u (%.16s): output has %lld elements, the kept dims %lld; re-export "
                     "the program", i, name, (long long)kcu_count(out), (long long)kept);
    return KILN_OK;
  }
  case KILN_OP_PERMUTE: case KILN_OP_EXPAND: case KILN_OP_CAT: case KILN_OP_SLICE:
  case KILN_OP_SELECT: case KILN_OP_COPY: case KILN_OP_RESHAPE:
    return kcu_check_layout(p, op, i, err);
  case KILN_OP_EMBEDDING: {
    const kiln_tensor_desc *idx = &p->tensors[op->inputs[1]];
    if (x->rank != 2 || !kcu_index(idx->dtype) || x->dtype != out->dtype ||
        kcu_count(out) != kcu_count(idx) * x->dims[1])
      return KCU_BAD("op %u (embedding): weight must be 2-D, indices i32/i64, output "
                     "[indices..., dim]; re-export the program", i);
    return KILN_OK;
  }
  case KILN_OP_INDEX_SELECT: {
    const kiln_tensor_desc *idx = &p->tensors[op->inputs[1]];
    int64_t dim = op->n_iattr > 0 ? op->iattr[0] : -1;
    int ok = dim >= 0 && dim < x->rank && kcu_index(idx->dtype) && x->dtype == out->dtype &&
             out->rank == x->rank;
    for (int d = 0; ok && d < x->rank; d++)
      ok = out->dims[d] == (d == dim ? kcu_count(idx) : x->dims[d]);
    if (!ok)
      return KCU_BAD("op %u (index_select): dim, indices or output shape do not fit the input; "
                     "re-export the program", i);
    return KILN_OK;
  }
  case KILN_OP_INDEX_COPY: {
    const kiln_tensor_desc *idx = &p->tensors[op->inputs[1]], *v = &p->tensors[op->inputs[2]];
    int64_t dim = op->n_iattr > 0 ? op->iattr[0] : -1;
    int ok = op->n_inputs == 3 && dim >= 0 && dim < x->rank && idx->rank == 1 &&
             kcu_index(idx->dtype) && v->dtype == x->dtype && out->dtype == x->dtype &&
             kcu_same_dims(x, out) && v->rank == x->rank;
    for (int d = 0; ok && d < x->rank; d++)
      ok = v->dims[d] == (d == dim ? idx->dims[0] : x->dims[d]);
    if (!ok)
      return KCU_BAD("op %u (index_copy): dim, indices or values do not fit the input; "
                     "re-export the program", i);
    return KILN_OK;
  }
  case KILN_OP_SDPA: return kcu_check_attention(p, op, i, err);
  case KILN_OP_CONV: case KILN_OP_CONV_TRANSPOSE: return kcu_check_conv(p, op, i, err);
  case KILN_OP_BATCH_NORM: case KILN_OP_MAX_POOL2D: case KILN_OP_AVG_POOL2D:
  case KILN_OP_ADAPTIVE_AVG_POOL2D: case KILN_OP_UPSAMPLE_NEAREST2D:
  case KILN_OP_UPSAMPLE_BILINEAR2D:
    return kcu_check_vision(p, op, i, err);
  case KILN_OP_CUMSUM: case KILN_OP_ARGMAX: case KILN_OP_GATHER: case KILN_OP_INDEX:
    return kcu_check_index_scan(p, op, i, err);
  case KILN_OP_FUSED: {
    const kiln_tensor_desc *in[KILN_MAX_OP_INPUTS];
    kiln_fx_prog prog;
    for (uint32_t k = 0; k < op->n_inputs; k++) in[k] = &p->tensors[op->inputs[k]];
    return kiln_fx_decode_at(p->words, p->n_words, op, i, in, out, &prog, err); /* p's sizes */
  }
  case KILN_OP_POINTWISE: {
    uint32_t step;
    int ok = kiln_dtype_is_float(out->dtype) && kcu_same_dims(x, out) &&
             kiln_pointwise_check(op, &step) == KILN_PW_FINE;
    for (uint32_t k = 0; ok && k < op->n_inputs; k++)
      ok = p->tensors[op->inputs[k]].dtype == out->dtype &&
           kcu_broadcasts(&p->tensors[op->inputs[k]], out);
    if (!ok)
      return KCU_BAD("op %u (pointwise): steps, operand dtypes or shapes do not fit the output; "
                     "re-export the program", i);
    return KILN_OK;
  }
  default: /* unary and CAST */
    if (kcu_count(x) != kcu_count(out))
      return KCU_BAD("op %u (%.16s): input has %lld elements, output %lld; re-export the "
                     "program", i, name, (long long)kcu_count(x), (long long)kcu_count(out));
    if (op->kind != KILN_OP_CAST && op->kind != KILN_OP_NEG && op->kind != KILN_OP_RELU &&
        op->kind != KILN_OP_ABS &&
        (!kiln_dtype_is_float(x->dtype) || !kiln_dtype_is_float(out->dtype)))
      return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                       "op %u (%.16s): the CUDA engine computes it on float tensors only; cast "
                       "the input to f32 before export", i, name);
    return KILN_OK;
  }
}
