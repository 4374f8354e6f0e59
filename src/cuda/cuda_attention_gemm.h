/* SDPA on the tensor cores: S = Q K^T and O = P V as strided-batched cuBLASLt matmuls around a
 * row softmax kernel, through a score buffer the engine allocates at init. Shapes it cannot
 * take (K or V broadcast over part of the batch, mixed dtypes, a score buffer over
 * KCU_ATTN_SCRATCH_MAX) stay on the fused kernel. */
#ifndef KILN_CUDA_ATTENTION_GEMM_H
#define KILN_CUDA_ATTENTION_GEMM_H

#include "cuda_gemm.h"

#define KCU_ATTN_SCRATCH_MAX ((uint64_t)1 << 30)

typedef struct kcu_attn_gemm {
  int active; /* 0: the op runs on the fused kernel */
  kcu_gemm scores, values;
  uint64_t scratch_bytes; /* f32 scores [batch, L, S]; P is written over them */
  int64_t S;
  kiln_dtype p_dtype;
} kcu_attn_gemm;

/* Decides the path for SDPA op `op_index` and, on the tensor cores, builds both matmuls. A
 * shape or algorithm cuBLASLt lacks leaves `active` 0 and returns KILN_OK. */
kiln_status kcu_attn_gemm_init(kcu_attn_gemm *a, cublasLtHandle_t lt, const kiln_plan *plan,
                               uint32_t op_index, int allow_tf32, size_t workspace_size,
                               kiln_error *err);
cudaError_t kcu_attn_gemm_run(const kcu_attn_gemm *a, cublasLtHandle_t lt, cudaStream_t s,
                              const kcu_tensor *in, const kcu_tensor *mask, const kcu_tensor *out,
                              int causal, float scale, void *scratch, void *workspace,
                              size_t workspace_size);
/* Times both matmuls' candidates on the engine's buffers and keeps the fastest (init; cold as
 * for kcu_gemm_tune). */
void kcu_attn_gemm_tune(kcu_attn_gemm *a, cublasLtHandle_t lt, cudaStream_t s,
                        const kcu_tensor *in, const kcu_tensor *out, void *scratch,
                        void *workspace, size_t workspace_size, const kcu_cold *cold);
void kcu_attn_gemm_release(kcu_attn_gemm *a);

#endif
