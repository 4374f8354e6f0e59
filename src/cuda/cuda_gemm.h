/* GEMM-family ops (LINEAR, MATMUL) through cuBLASLt: descriptors and the algorithm are
 * chosen once at init; a launch only sets pointers and enqueues the matmul. A LINEAR of a few
 * rows runs on the engine's own GEMV kernel instead (cuda_gemv.cu). */
#ifndef KILN_CUDA_GEMM_H
#define KILN_CUDA_GEMM_H

#include "cuda_ops.h"

#include <cublasLt.h>

#define KCU_GEMM_CANDIDATES 8

typedef struct kcu_gemm {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d; /* cuBLASLt's column-major view: D[m,n] = A[m,k] B[k,n] */
  cublasLtMatmulAlgo_t algo;
  cublasLtMatmulAlgo_t candidates[KCU_GEMM_CANDIDATES]; /* heuristic's picks, best first */
  int n_candidates;
  kiln_activation post; /* an activation no cuBLASLt epilogue computes exactly (erf GELU) */
  int has_bias;
  int residual;         /* LINEAR adding its last input: cuBLASLt's C with beta 1 */
  int gemv_ok;          /* LINEAR of at most KCU_GEMV_MAX_ROWS rows: the GEMV kernel may run it */
  int gemv;             /* it does (with `act`): faster than cuBLASLt when timed at init */
  kiln_activation act;
  int64_t M, N, K;       /* N: output columns (the weight's rows, or half of them for SwiGLU) */
  int swiglu;            /* LINEAR with KILN_ACT_SWIGLU: cuBLASLt writes [M,2N] to glu_scratch, */
  uint64_t glu_bytes;    /* then kcu_swiglu combines it; the engine sizes and sets the buffer */
  void *glu_scratch;
  /* Batches that strided cuBLASLt cannot express (partial broadcast) run one call each. */
  int64_t calls;
  int32_t nb;
  int64_t bdims[KILN_MAX_RANK], a_st[KILN_MAX_RANK], b_st[KILN_MAX_RANK];
  int64_t a_mat, b_mat, d_mat; /* bytes per matrix of each operand */
  int64_t key[28]; /* what decides the algorithm (kcu_gemm_tune's key in the choice cache) */
} kcu_gemm;

/* One strided-batched matmul in row-major terms: D[M,N] = X[M,K] W, W stored [N,K] (w_trans)
 * or [K,N]. Leading dims and batch strides count elements of each operand (stride 0
 * broadcasts); alignments are what cuBLASLt may assume of each operand's addresses. */
typedef struct kcu_gemm_shape {
  kiln_dtype in_dtype, out_dtype;
  int w_trans;
  int allow_tf32;
  cublasLtEpilogue_t epilogue;
  int64_t M, N, K, batch;
  int64_t ld_x, ld_d;
  int64_t x_stride, w_stride, d_stride;
  uint32_t align_x, align_w, align_d;
} kcu_gemm_shape;

/* Address alignment cuBLASLt may assume of tensor t (NULL: an engine buffer), given the byte
 * stride between its batch matrices (0 if none). */
uint32_t kcu_gemm_align(const kiln_tensor_desc *t, uint64_t batch_stride_bytes);
/* Builds descriptors for one matmul of plan op `op_index` and picks the algorithm candidates;
 * run it with kcu_gemm_run (X is in[0], W is in[1]). */
kiln_status kcu_gemm_init_shape(kcu_gemm *g, cublasLtHandle_t lt, const kcu_gemm_shape *sh,
                                const kiln_plan *plan, uint32_t op_index, size_t workspace_size,
                                kiln_error *err);
/* Builds the descriptors for plan op `op` (LINEAR or MATMUL) and picks the algorithm. */
kiln_status kcu_gemm_init(kcu_gemm *g, cublasLtHandle_t lt, const kiln_plan *plan,
                          uint32_t op_index, int allow_tf32, size_t workspace_size,
                          kiln_error *err);
cudaError_t kcu_gemm_run(const kcu_gemm *g, cublasLtHandle_t lt, cudaStream_t s,
                         const kcu_tensor *in, uint32_t n_in, const kcu_tensor *out,
                         void *workspace, size_t workspace_size);
/* Times each candidate algorithm, and the GEMV kernel where it may run, on the engine's own
 * buffers and keeps the fastest (init); a GEMM the process timed before keeps that choice
 * (cuda_choice_cache.h). Returns which of the three (nothing to choose, measured, reused). */
enum { KCU_CHOICE_NONE, KCU_CHOICE_MEASURED, KCU_CHOICE_REUSED };
int kcu_gemm_tune(kcu_gemm *g, cublasLtHandle_t lt, cudaStream_t s, const kcu_tensor *in,
                  uint32_t n_in, const kcu_tensor *out, void *workspace, size_t workspace_size);
void kcu_gemm_release(kcu_gemm *g);

/* Tests set this to make the GEMV choice without timing: 0 never, 1 always where it may run;
 * -1 (the default) times both. */
extern int kcu_test_gemv_choice;

#endif
