/* GEMM-family ops (LINEAR, MATMUL) through cuBLASLt: descriptors and the algorithm are
 * chosen at init (and for a dynamic plan set again per call size, kcu_gemm_reshape); a launch only sets pointers and enqueues the matmul. A LINEAR of a few
 * rows runs on the engine's own GEMV kernel instead (cuda_gemv.cu). */
#ifndef KILN_CUDA_GEMM_H
#define KILN_CUDA_GEMM_H

#include "cuda_ops.h"

#include <cublasLt.h>

#define KCU_GEMM_CANDIDATES 8

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

typedef struct kcu_gemm {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d; /* cuBLASLt's column-major view: D[m,n] = A[m,k] B[k,n] */
  cublasLtMatmulAlgo_t algo;
  cublasLtMatmulAlgo_t candidates[KCU_GEMM_CANDIDATES]; /* heuristic's picks, best first */
  int n_candidates;
  kiln_activation post; /* an activation no cuBLASLt epilogue computes exactly (erf GELU) */
  int has_bias;
  int residual;         /* LINEAR adding its last input: cuBLASLt's C with beta 1 */
  int gemv_ok;          /* LINEAR of a few rows (kcu_gemv_fits): the GEMV kernel may run it */
  int gemv;             /* 0: cuBLASLt; else it does, at spread gemv - 1 (the fastest when
                         * timed at init, or KCU_GEMV_DEFAULT_SPREAD) */
  int w_fixed;          /* the weight is one (no kernel writes it): the GEMV launches early */
  kiln_activation act;
  int64_t M, N, K;       /* N: output columns (the weight's rows, or half of them for SwiGLU) */
  /* Two LINEARs write through the engine's scratch (it sizes and sets the buffer): SwiGLU,
   * whose [M,2N] of gate and up kcu_swiglu then combines, and one whose output rows are not
   * 16-byte aligned (N of 50257, a vocabulary), which cuBLASLt's tensor-core kernels do not
   * write: it computes ld_pad columns (N rounded up), the first N copied out to [M,N] after. */
  int swiglu;
  int64_t ld_pad;         /* the scratch's row pitch in elements, or 0: cuBLASLt writes out */
  uint64_t over_read;     /* bytes read past the weight's (and bias's) end: the engine's slack */
  uint64_t scratch_bytes;
  void *scratch;
  /* Batches that strided cuBLASLt cannot express (partial broadcast) run one call each. */
  int64_t calls;
  int32_t nb;
  int64_t bdims[KILN_MAX_RANK], a_st[KILN_MAX_RANK], b_st[KILN_MAX_RANK];
  int64_t a_mat, b_mat, d_mat; /* bytes per matrix of each operand */
  int64_t key[28]; /* what decides the algorithm (kcu_gemm_tune's key in the choice cache) */
  /* Sizes the descriptors hold now, and for a dynamic op the ones init timed (kept with their
   * algorithm and GEMV choice). */
  cublasLtMatmulPreference_t pref;
  int allow_tf32;
  size_t workspace_size;
  struct kcu_gemm_shape set, tuned;
  cublasLtMatmulAlgo_t tuned_algo;
  int tuned_gemv, has_tuned;
} kcu_gemm;


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
/* norm (NULL: none): the GEMV kernel normalizes its input row first, in[0] being the norm's
 * input (kcu_gemv); refused where cuBLASLt runs the op. */
cudaError_t kcu_gemm_run(const kcu_gemm *g, cublasLtHandle_t lt, cudaStream_t s,
                         const kcu_tensor *in, uint32_t n_in, const kcu_tensor *out,
                         void *workspace, size_t workspace_size, const kcu_gemv_norm *norm);
/* A region init reads through before each timed run (kcu_read_through), so that the run reads
 * its weights from device memory as a call does: the blob's weights, bytes from
 * kcu_cold_bytes (0: the weights fit in the L2 cache, and runs are timed on it warm). */
typedef struct kcu_cold {
  const void *data;
  size_t bytes;
} kcu_cold;
/* Times each candidate algorithm, and the GEMV kernel at each spread where it may run, on the
 * engine's own buffers and keeps the fastest (init): each the fastest of 5 runs, each run after
 * the cold region (NULL: none) is read through and behind a kernel that lets it launch early
 * (kcu_hold), as the kernel ahead of it in a call does. A GEMM the process timed before keeps
 * that choice (cuda_choice_cache.h). Returns which of the three (nothing to choose, measured, reused). */
enum { KCU_CHOICE_NONE, KCU_CHOICE_MEASURED, KCU_CHOICE_REUSED };
int kcu_gemm_tune(kcu_gemm *g, cublasLtHandle_t lt, cudaStream_t s, const kcu_tensor *in,
                  uint32_t n_in, const kcu_tensor *out, void *workspace, size_t workspace_size,
                  const kcu_cold *cold);
/* Remembers the sizes, algorithm and GEMV choice kcu_gemm_tune settled on (init). */
void kcu_gemm_keep_tuned(kcu_gemm *g);
/* A dynamic op at this call's sizes (plan: the call's tensors): its layouts set in place and,
 * for sizes init did not time, the heuristic asked again into g's own candidate slots. Host
 * only and allocating nothing of the engine's; run before an eager run or a capture, never
 * between replays. cudaErrorNotSupported when cuBLASLt has no algorithm for the sizes. */
cudaError_t kcu_gemm_reshape(kcu_gemm *g, cublasLtHandle_t lt, const kiln_plan *plan,
                             uint32_t op_index);
void kcu_gemm_release(kcu_gemm *g);

/* Tests set this to make the GEMV choice without timing: 0 never, 1 always where it may run;
 * -1 (the default) times both. With 1, kcu_test_gemv_spread (when 0 or more) is the spread. */
extern int kcu_test_gemv_choice;
extern int kcu_test_gemv_spread;

#endif
