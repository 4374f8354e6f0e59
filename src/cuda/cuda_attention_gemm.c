/* SDPA on the tensor cores. Per batch matrix (strided batches, K and V either per batch or
 * shared by all): S = Q K^T in f32 (cuBLASLt, K transposed by the op, not in memory), then a
 * row kernel applies scale, causal and mask and a stable softmax, writing P in the input
 * dtype over the scores, then O = P V (cuBLASLt) straight into the output. */
#include "cuda_attention_gemm.h"

#include "runtime/internal.h"

#include <string.h>

static int64_t kcu_lead_count(const kiln_tensor_desc *t) {
  int64_t n = 1;
  for (int d = 0; d < t->rank - 2; d++) n *= t->dims[d];
  return n;
}

kiln_status kcu_attn_gemm_init(kcu_attn_gemm *a, cublasLtHandle_t lt, const kiln_plan *plan,
                               uint32_t op_index, int allow_tf32, size_t workspace_size,
                               kiln_error *err) {
  const kiln_op *op = &plan->ops[op_index];
  const kiln_tensor_desc *q = &plan->tensors[op->inputs[0]], *k = &plan->tensors[op->inputs[1]];
  const kiln_tensor_desc *v = &plan->tensors[op->inputs[2]], *out = &plan->tensors[op->output];
  memset(a, 0, sizeof *a);
  kiln_dtype dt = out->dtype;
  int64_t L = q->dims[q->rank - 2], E = q->dims[q->rank - 1];
  int64_t S = k->dims[k->rank - 2], Ev = v->dims[v->rank - 1];
  int64_t batch = kcu_lead_count(out), kb = kcu_lead_count(k), vb = kcu_lead_count(v);
  if (q->dtype != dt || k->dtype != dt || v->dtype != dt) return KILN_OK;
  if (batch < 1 || L < 1 || S < 1 || E < 1 || Ev < 1) return KILN_OK;
  /* Grouped-query heads: the g query heads of one k,v head lie one after another, so they are
   * one matrix of g*L rows against that head's k and v, batch per k,v head. */
  int r = q->rank;
  if (r >= 3 && k->rank == r && v->rank == r && k->dims[r - 3] != q->dims[r - 3] &&
      k->dims[r - 3] > 1 && kb == vb && batch % kb == 0) {
    L *= batch / kb;
    batch = kb;
  }
  /* Strided batches express "one per batch" or "one for all", not broadcast over some dims. */
  if ((kb != 1 && kb != batch) || (vb != 1 && vb != batch)) return KILN_OK;
  uint64_t rows, bytes;
  if (kiln_mul_u64((uint64_t)batch, (uint64_t)L, &rows) || rows > INT32_MAX ||
      kiln_mul_u64(rows, (uint64_t)S, &bytes) || kiln_mul_u64(bytes, sizeof(float), &bytes) ||
      bytes > KCU_ATTN_SCRATCH_MAX)
    return KILN_OK;
  int64_t es = (int64_t)kiln_dtype_size(dt), per_f32 = (int64_t)sizeof(float) / es;
  uint64_t score_mat = (uint64_t)(L * S) * sizeof(float);
  int per_batch = batch > 1;

  kcu_gemm_shape qk;
  memset(&qk, 0, sizeof qk);
  qk.in_dtype = dt;
  qk.out_dtype = KILN_F32;
  qk.w_trans = 1;
  qk.allow_tf32 = allow_tf32;
  qk.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  qk.M = L, qk.N = S, qk.K = E, qk.batch = batch;
  qk.ld_x = E, qk.ld_d = S;
  qk.x_stride = L * E, qk.w_stride = kb == 1 ? 0 : S * E, qk.d_stride = L * S;
  qk.align_x = kcu_gemm_align(q, per_batch ? (uint64_t)(L * E * es) : 0);
  qk.align_w = kcu_gemm_align(k, (uint64_t)(qk.w_stride * es));
  qk.align_d = kcu_gemm_align(NULL, per_batch ? score_mat : 0);

  kcu_gemm_shape pv = qk;
  pv.out_dtype = dt;
  pv.w_trans = 0;
  pv.M = L, pv.N = Ev, pv.K = S;
  pv.ld_x = S * per_f32, pv.ld_d = Ev; /* P rows keep the f32 score rows' byte stride */
  pv.x_stride = L * S * per_f32, pv.w_stride = vb == 1 ? 0 : S * Ev, pv.d_stride = L * Ev;
  pv.align_x = qk.align_d;
  pv.align_w = kcu_gemm_align(v, (uint64_t)(pv.w_stride * es));
  pv.align_d = kcu_gemm_align(out, per_batch ? (uint64_t)(L * Ev * es) : 0);

  a->scores.calls = a->values.calls = 1;
  kiln_error attempt;
  kiln_status st = kcu_gemm_init_shape(&a->scores, lt, &qk, plan, op_index, workspace_size, &attempt);
  if (st == KILN_OK)
    st = kcu_gemm_init_shape(&a->values, lt, &pv, plan, op_index, workspace_size, &attempt);
  if (st != KILN_OK) {
    kcu_attn_gemm_release(a);
    if (st != KILN_ERR_OUT_OF_MEMORY) return KILN_OK; /* no algorithm: the fused kernel */
    *err = attempt;
    return st;
  }
  a->active = 1;
  a->scratch_bytes = bytes;
  a->S = S;
  a->p_dtype = dt;
  return KILN_OK;
}

cudaError_t kcu_attn_gemm_run(const kcu_attn_gemm *a, cublasLtHandle_t lt, cudaStream_t s,
                              const kcu_tensor *in, const kcu_tensor *mask, const kcu_tensor *out,
                              int causal, float scale, void *scratch, void *workspace,
                              size_t workspace_size) {
  kcu_tensor scores;
  memset(&scores, 0, sizeof scores);
  scores.data = scratch;
  scores.dtype = KILN_F32;
  kcu_tensor qk[2] = {in[0], in[1]};
  cudaError_t rc =
      kcu_gemm_run(&a->scores, lt, s, qk, 2, &scores, workspace, workspace_size, NULL);
  if (rc == cudaSuccess)
    rc = kcu_attention_softmax(s, (float *)scratch, a->p_dtype, mask, out, a->S, causal, scale);
  scores.dtype = a->p_dtype;
  kcu_tensor pv[2] = {scores, in[2]};
  if (rc == cudaSuccess)
    rc = kcu_gemm_run(&a->values, lt, s, pv, 2, out, workspace, workspace_size, NULL);
  return rc;
}

void kcu_attn_gemm_tune(kcu_attn_gemm *a, cublasLtHandle_t lt, cudaStream_t s,
                        const kcu_tensor *in, const kcu_tensor *out, void *scratch,
                        void *workspace, size_t workspace_size, const kcu_cold *cold) {
  kcu_tensor scores;
  memset(&scores, 0, sizeof scores);
  scores.data = scratch;
  scores.dtype = KILN_F32;
  kcu_tensor qk[2] = {in[0], in[1]};
  kcu_gemm_tune(&a->scores, lt, s, qk, 2, &scores, workspace, workspace_size, cold);
  scores.dtype = a->p_dtype;
  kcu_tensor pv[2] = {scores, in[2]};
  kcu_gemm_tune(&a->values, lt, s, pv, 2, out, workspace, workspace_size, cold);
}

void kcu_attn_gemm_release(kcu_attn_gemm *a) {
  kcu_gemm_release(&a->scores);
  kcu_gemm_release(&a->values);
  memset(a, 0, sizeof *a);
}
