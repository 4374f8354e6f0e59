/* LINEAR and MATMUL through cuBLASLt. Row-major C[M,N] = A[M,K] B[K,N] is computed as the
 * column-major C^T = B^T A^T, so no operand is ever transposed in memory. Bias, ReLU and
 * tanh-GELU run in cuBLASLt's epilogue; erf-GELU, which no epilogue computes, runs after.
 * A LINEAR of a few rows goes to the GEMV kernel, which fuses all of them. */
#include "cuda_gemm.h"

#include "cuda_choice_cache.h"

#include "runtime/linear_inputs.h"

#include <math.h>
#include <string.h>

int kcu_test_gemv_choice = -1;
int kcu_test_gemv_spread = -1;

/* g->gemv for the GEMV kernel at the spread of sizes init did not time. */
static int kcu_gemv_untimed(void) {
  return 1 + (kcu_test_gemv_spread >= 0 ? kcu_test_gemv_spread : KCU_GEMV_DEFAULT_SPREAD);
}

static cudaDataType kcu_cuda_type(kiln_dtype dt) {
  return dt == KILN_F16 ? CUDA_R_16F : dt == KILN_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* Largest power of two (<= 256) dividing the byte offset: what cuBLASLt may assume. */
static uint32_t kcu_align_of(uint64_t bytes) {
  uint32_t a = 256;
  while (a > 1 && bytes % a) a >>= 1;
  return a;
}

uint32_t kcu_gemm_align(const kiln_tensor_desc *t, uint64_t batch_stride_bytes) {
  /* Caller buffers are bound only when 256-byte aligned, engine buffers are cudaMalloc'd. */
  uint32_t a = t && (t->storage == KILN_STORE_ARENA || t->storage == KILN_STORE_WEIGHT)
                   ? kcu_align_of(t->offset)
                   : 256;
  if (batch_stride_bytes) {
    uint32_t b = kcu_align_of(batch_stride_bytes);
    if (b < a) a = b;
  }
  return a;
}

static int64_t kcu_numel(const kiln_tensor_desc *t, int32_t first, int32_t last) {
  int64_t n = 1;
  for (int32_t d = first; d < last; d++) n *= t->dims[d];
  return n;
}

#define KCU_LT(call)                                                                       \
  do {                                                                                     \
    cublasStatus_t st_ = (call);                                                           \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                    \
      return kiln_fail(err, st_ == CUBLAS_STATUS_ALLOC_FAILED ? KILN_ERR_OUT_OF_MEMORY     \
                                                              : KILN_ERR_INTERNAL,         \
                       "op %u (%.16s): cuBLASLt call failed with status %d while "         \
                       "preparing the matmul; report this with the program",              \
                       op_index, kiln_op_name(op->kind), (int)st_);                        \
    }                                                                                      \
  } while (0)

static kiln_status kcu_layout_create(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t rows,
                                     uint64_t cols, int64_t ld, int64_t batch, int64_t stride,
                                     const kiln_op *op, uint32_t op_index, kiln_error *err) {
  KCU_LT(cublasLtMatrixLayoutCreate(l, t, rows, cols, ld));
  if (batch > 1) {
    int32_t count = (int32_t)batch;
    KCU_LT(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                            sizeof count));
    KCU_LT(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                            &stride, sizeof stride));
  }
  return KILN_OK;
}

/* Asks the heuristic for sh's candidates into g (no allocation by the engine; host only). */
static cublasStatus_t kcu_gemm_query(kcu_gemm *g, cublasLtHandle_t lt, const kcu_gemm_shape *sh,
                                     size_t workspace_size) {
  uint64_t ws = workspace_size;
  uint32_t al_a = sh->align_w, al_b = sh->align_x, al_d = sh->align_d;
  cublasLtMatmulHeuristicResult_t results[KCU_GEMM_CANDIDATES];
  int found = 0;
  g->n_candidates = 0;
  cublasStatus_t ps = cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (ps == CUBLAS_STATUS_SUCCESS) ps = cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
  if (ps == CUBLAS_STATUS_SUCCESS) ps = cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
  if (ps == CUBLAS_STATUS_SUCCESS) ps = cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d);
  if (ps == CUBLAS_STATUS_SUCCESS) ps = cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d);
  if (ps == CUBLAS_STATUS_SUCCESS) {
    memset(results, 0, sizeof results);
    ps = cublasLtMatmulAlgoGetHeuristic(lt, g->desc, g->a, g->b, g->d, g->d, g->pref,
                                        KCU_GEMM_CANDIDATES, results, &found);
  }
  for (int i = 0; ps == CUBLAS_STATUS_SUCCESS && i < found; i++)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) g->candidates[g->n_candidates++] = results[i].algo;
  if (g->n_candidates > 0) g->algo = g->candidates[0];
  return ps;
}

kiln_status kcu_gemm_init_shape(kcu_gemm *g, cublasLtHandle_t lt, const kcu_gemm_shape *sh,
                                const kiln_plan *plan, uint32_t op_index, size_t workspace_size,
                                kiln_error *err) {
  const kiln_op *op = &plan->ops[op_index];
  cudaDataType t_in = kcu_cuda_type(sh->in_dtype), t_out = kcu_cuda_type(sh->out_dtype);
  cublasComputeType_t ct = (sh->in_dtype == KILN_F32 && sh->allow_tf32)
                               ? CUBLAS_COMPUTE_32F_FAST_TF32
                               : CUBLAS_COMPUTE_32F;
  cublasOperation_t trans_a = sh->w_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtEpilogue_t epi = sh->epilogue;
  KCU_LT(cublasLtMatmulDescCreate(&g->desc, ct, CUDA_R_32F));
  KCU_LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  KCU_LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                        sizeof trans_a));
  int64_t M = sh->M, N = sh->N, K = sh->K;
  kiln_status st;
  if (sh->w_trans)
    st = kcu_layout_create(&g->a, t_in, (uint64_t)K, (uint64_t)N, K, sh->batch, sh->w_stride, op, op_index, err);
  else
    st = kcu_layout_create(&g->a, t_in, (uint64_t)N, (uint64_t)K, N, sh->batch, sh->w_stride, op, op_index, err);
  if (st == KILN_OK)
    st = kcu_layout_create(&g->b, t_in, (uint64_t)K, (uint64_t)M, sh->ld_x, sh->batch, sh->x_stride, op, op_index, err);
  if (st == KILN_OK)
    st = kcu_layout_create(&g->d, t_out, (uint64_t)N, (uint64_t)M, sh->ld_d, sh->batch, sh->d_stride, op, op_index, err);
  if (st != KILN_OK) return st;

  KCU_LT(cublasLtMatmulPreferenceCreate(&g->pref));
  g->set = *sh;
  cublasStatus_t ps = kcu_gemm_query(g, lt, sh, workspace_size);
  if (ps != CUBLAS_STATUS_SUCCESS || g->n_candidates == 0)
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "op %u (%.16s): cuBLASLt has no usable algorithm for %.8s %lldx%lldx%lld "
                     "(status %d); run this program on the CPU reference engine",
                     op_index, kiln_op_name(op->kind), kiln_dtype_name(sh->in_dtype),
                     (long long)M, (long long)N, (long long)K, (int)ps);
  g->algo = g->candidates[0];
  const int64_t key[] = {'G', sh->in_dtype, sh->out_dtype, sh->w_trans, sh->allow_tf32,
                         sh->epilogue, sh->M, sh->N, sh->K, sh->batch, sh->ld_x, sh->ld_d,
                         sh->x_stride, sh->w_stride, sh->d_stride, sh->align_x, sh->align_w,
                         sh->align_d, (int64_t)workspace_size, g->n_candidates};
  _Static_assert(sizeof key <= sizeof g->key, "the key fits its field");
  memcpy(g->key, key, sizeof key);
  return KILN_OK;
}

/* g's sizes, batch walk and epilogue flags for plan op `op_index` at the plan's dims, and the
 * cuBLASLt shape sh they give; touches no descriptor. */
static void kcu_gemm_geometry(kcu_gemm *g, const kiln_plan *plan, uint32_t op_index,
                              int allow_tf32, kcu_gemm_shape *sh) {
  const kiln_op *op = &plan->ops[op_index];
  const kiln_tensor_desc *x = &plan->tensors[op->inputs[0]];
  const kiln_tensor_desc *w = &plan->tensors[op->inputs[1]];
  const kiln_tensor_desc *out = &plan->tensors[op->output];
  g->calls = 1;
  g->nb = 0;
  size_t es = kiln_dtype_size(out->dtype);
  memset(sh, 0, sizeof *sh);
  sh->in_dtype = sh->out_dtype = out->dtype;
  sh->allow_tf32 = allow_tf32;
  sh->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  sh->batch = 1;
  int64_t M, N, K;
  if (op->kind == KILN_OP_LINEAR) {
    K = x->dims[x->rank - 1];
    N = w->dims[0];
    M = kcu_numel(x, 0, x->rank - 1);
    sh->w_trans = 1;
    kiln_activation act = (kiln_activation)(op->n_iattr > 0 ? op->iattr[0] : 0);
    g->has_bias = kiln_linear_has_bias(op);
    g->residual = kiln_linear_has_residual(op);
    g->swiglu = act == KILN_ACT_SWIGLU;
    g->M = M;
    g->N = g->swiglu ? N / 2 : N;
    g->K = K;
    g->scratch_bytes = g->swiglu ? (uint64_t)M * (uint64_t)N * es : 0;
    /* Rows of a pitch tensor cores cannot write: the GEMM runs over N rounded up to 16 bytes
     * into the scratch (an aligned N too, or cuBLASLt keeps its slow kernels), reading weight
     * and bias rows past their ends: both must be weights, whose device copy has zeroed slack
     * after it (over_read bytes at most), and the extra columns are never copied out. */
    int64_t per16 = 16 / (int64_t)es;
    const kiln_tensor_desc *bias = g->has_bias ? &plan->tensors[op->inputs[2]] : NULL;
    g->w_fixed = w->storage == KILN_STORE_WEIGHT;
    int in_weights =
        g->w_fixed && (!bias || bias->storage == KILN_STORE_WEIGHT);
    g->ld_pad = !g->swiglu && !g->residual && in_weights && N % per16
                    ? (N + per16 - 1) / per16 * per16
                    : 0;
    g->over_read = g->ld_pad ? (uint64_t)(g->ld_pad - N) * (uint64_t)K * es : 0;
    if (g->ld_pad) g->scratch_bytes = (uint64_t)M * (uint64_t)g->ld_pad * es;
    /* A few rows: reading the weight once is all the work; the GEMV kernel does it with the
     * bias, every activation (erf GELU included) and the residual in its epilogue. */
    g->gemv_ok = kcu_test_gemv_choice != 0 && kcu_gemv_fits(M, K, out->dtype) &&
                 kcu_gemm_align(x, 0) >= 16 && kcu_gemm_align(w, 0) >= 16;
    g->act = act;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    g->post = KILN_ACT_NONE;
    if (act == KILN_ACT_RELU) epi = CUBLASLT_EPILOGUE_RELU;
    else if (act == KILN_ACT_GELU_TANH) epi = CUBLASLT_EPILOGUE_GELU;
    else if (act == KILN_ACT_GELU_ERF) g->post = KILN_ACT_GELU_ERF;
    if (g->has_bias)
      epi = epi == CUBLASLT_EPILOGUE_RELU   ? CUBLASLT_EPILOGUE_RELU_BIAS
            : epi == CUBLASLT_EPILOGUE_GELU ? CUBLASLT_EPILOGUE_GELU_BIAS
                                            : CUBLASLT_EPILOGUE_BIAS;
    sh->epilogue = epi;
  } else {
    int a1 = x->rank == 1, b1 = w->rank == 1;
    K = x->dims[x->rank - 1];
    M = a1 ? 1 : x->dims[x->rank - 2];
    N = b1 ? 1 : w->dims[w->rank - 1];
    int32_t out_batch_rank = out->rank - (a1 ? 0 : 1) - (b1 ? 0 : 1);
    int64_t batch = kcu_numel(out, 0, out_batch_rank);
    int64_t xb = a1 ? 1 : kcu_numel(x, 0, x->rank - 2), wb = b1 ? 1 : kcu_numel(w, 0, w->rank - 2);
    if ((xb == 1 || xb == batch) && (wb == 1 || wb == batch)) {
      sh->batch = batch;
      sh->w_stride = wb == 1 ? 0 : K * N;
      sh->x_stride = xb == 1 ? 0 : M * K;
      sh->d_stride = M * N;
    } else {
      /* Partial broadcast: one call per output batch, operand offsets by broadcast strides. */
      g->calls = batch;
      g->nb = out_batch_rank;
      for (int d = 0; d < g->nb; d++) {
        int xd = d - (g->nb - (x->rank - 2)), wd = d - (g->nb - (w->rank - 2));
        g->bdims[d] = out->dims[d];
        g->b_st[d] = (xd < 0 || x->dims[xd] == 1) ? 0 : kcu_numel(x, xd + 1, x->rank - 2);
        g->a_st[d] = (wd < 0 || w->dims[wd] == 1) ? 0 : kcu_numel(w, wd + 1, w->rank - 2);
      }
    }
    g->a_mat = (int64_t)es * K * N;
    g->b_mat = (int64_t)es * M * K;
    g->d_mat = (int64_t)es * M * N;
  }
  sh->M = M;
  sh->N = g->ld_pad ? g->ld_pad : N;
  sh->K = K;
  sh->ld_x = K;
  sh->ld_d = sh->N;
  sh->align_w = kcu_gemm_align(w, (uint64_t)(g->calls > 1 ? g->a_mat : sh->w_stride * (int64_t)es));
  sh->align_x = kcu_gemm_align(x, (uint64_t)(g->calls > 1 ? g->b_mat : sh->x_stride * (int64_t)es));
  sh->align_d = g->ld_pad ? 256 /* the scratch, cudaMalloc'd */
                          : kcu_gemm_align(out, (uint64_t)(g->calls > 1 || sh->batch > 1
                                                               ? (int64_t)es * M * N
                                                               : 0));
  if (g->residual) { /* C, the residual, shares D's layout and alignment */
    uint32_t align_c = kcu_gemm_align(&plan->tensors[op->inputs[op->n_inputs - 1]], 0);
    if (align_c < sh->align_d) sh->align_d = align_c;
  }
}

kiln_status kcu_gemm_init(kcu_gemm *g, cublasLtHandle_t lt, const kiln_plan *plan,
                          uint32_t op_index, int allow_tf32, size_t workspace_size,
                          kiln_error *err) {
  kcu_gemm_shape sh;
  memset(g, 0, sizeof *g);
  kcu_gemm_geometry(g, plan, op_index, allow_tf32, &sh);
  /* cuBLASLt is set up too, and kcu_gemm_tune keeps whichever is faster on this GPU. */
  g->gemv = g->gemv_ok ? kcu_gemv_untimed() : 0;
  g->allow_tf32 = allow_tf32;
  g->workspace_size = workspace_size;
  kiln_status st = kcu_gemm_init_shape(g, lt, &sh, plan, op_index, workspace_size, err);
  if (st != KILN_OK && g->gemv_ok && st != KILN_ERR_OUT_OF_MEMORY) {
    /* cuBLASLt cannot take the shape: the GEMV kernel alone. */
    kcu_gemm only = *g;
    kcu_gemm_release(g);
    if (err) err->status = KILN_OK, err->message[0] = '\0';
    g->gemv_ok = 1;
    g->gemv = kcu_gemv_untimed();
    g->act = only.act;
    g->has_bias = only.has_bias;
    g->residual = only.residual;
    g->calls = 1;
    g->M = only.M, g->N = only.N, g->K = only.K;
    g->swiglu = only.swiglu; /* the GEMV combines gate and up itself: no scratch */
    g->allow_tf32 = allow_tf32;
    g->workspace_size = workspace_size;
    return KILN_OK;
  }
  return st;
}

/* Sets one existing layout to rows x cols with leading dim ld and batch count and stride. */
static cublasStatus_t kcu_layout_set(cublasLtMatrixLayout_t l, uint64_t rows, uint64_t cols,
                                     int64_t ld, int64_t batch, int64_t stride) {
  int32_t count = (int32_t)batch;
  cublasStatus_t st = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
  return st;
}

static int kcu_shape_same(const kcu_gemm_shape *a, const kcu_gemm_shape *b) {
  return a->in_dtype == b->in_dtype && a->out_dtype == b->out_dtype && a->w_trans == b->w_trans &&
         a->allow_tf32 == b->allow_tf32 && a->epilogue == b->epilogue && a->M == b->M &&
         a->N == b->N && a->K == b->K && a->batch == b->batch && a->ld_x == b->ld_x &&
         a->ld_d == b->ld_d && a->x_stride == b->x_stride && a->w_stride == b->w_stride &&
         a->d_stride == b->d_stride && a->align_x == b->align_x && a->align_w == b->align_w &&
         a->align_d == b->align_d;
}

void kcu_gemm_keep_tuned(kcu_gemm *g) {
  g->tuned = g->set;
  g->tuned_algo = g->algo;
  g->tuned_gemv = g->gemv;
  g->has_tuned = 1;
}

cudaError_t kcu_gemm_reshape(kcu_gemm *g, cublasLtHandle_t lt, const kiln_plan *plan,
                             uint32_t op_index) {
  kcu_gemm_shape sh;
  uint64_t scratch_bytes = g->scratch_bytes;
  kcu_gemm_geometry(g, plan, op_index, g->allow_tf32, &sh);
  g->scratch_bytes = scratch_bytes; /* the scratch was sized for the bounds */
  if (!g->desc) { /* the GEMV kernel alone (at init's spread): it takes every row count up to
                   * the bound's */
    g->calls = 1;
    return kcu_gemv_fits(g->M, g->K, sh.in_dtype) ? cudaSuccess : cudaErrorNotSupported;
  }
  int tuned = g->has_tuned && kcu_shape_same(&sh, &g->tuned);
  /* Untimed sizes: the GEMV kernel wherever it may run (a few rows), else the heuristic's first. */
  g->gemv = tuned ? g->tuned_gemv : g->gemv_ok ? kcu_gemv_untimed() : 0;
  if (kcu_shape_same(&sh, &g->set)) return cudaSuccess;
  cublasStatus_t st;
  if (sh.w_trans)
    st = kcu_layout_set(g->a, (uint64_t)sh.K, (uint64_t)sh.N, sh.K, sh.batch, sh.w_stride);
  else
    st = kcu_layout_set(g->a, (uint64_t)sh.N, (uint64_t)sh.K, sh.N, sh.batch, sh.w_stride);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = kcu_layout_set(g->b, (uint64_t)sh.K, (uint64_t)sh.M, sh.ld_x, sh.batch, sh.x_stride);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = kcu_layout_set(g->d, (uint64_t)sh.N, (uint64_t)sh.M, sh.ld_d, sh.batch, sh.d_stride);
  if (st == CUBLAS_STATUS_SUCCESS && tuned) {
    g->algo = g->tuned_algo; /* the algorithm init timed at these very sizes */
  } else if (st == CUBLAS_STATUS_SUCCESS) {
    st = kcu_gemm_query(g, lt, &sh, g->workspace_size);
    if (st == CUBLAS_STATUS_SUCCESS && g->n_candidates == 0) st = CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    memset(&g->set, 0, sizeof g->set); /* the layouts are set again next time */
    return g->gemv ? cudaSuccess : cudaErrorNotSupported;
  }
  g->set = sh;
  return cudaSuccess;
}

static cudaError_t kcu_gemm_run_matmul(const kcu_gemm *g, cublasLtHandle_t lt, cudaStream_t s,
                                       const kcu_tensor *in, uint32_t n_in,
                                       const kcu_tensor *out, void *workspace,
                                       size_t workspace_size);

cudaError_t kcu_gemm_run(const kcu_gemm *g, cublasLtHandle_t lt, cudaStream_t s,
                         const kcu_tensor *in, uint32_t n_in, const kcu_tensor *out,
                         void *workspace, size_t workspace_size, const kcu_gemv_norm *norm) {
  if (g->gemv)
    return kcu_gemv(s, in[0].data, in[1].data, g->has_bias ? in[2].data : NULL,
                    g->residual ? in[n_in - 1].data : NULL, out->data, out->dtype, g->M, g->N,
                    g->K, g->act, g->w_fixed, g->gemv - 1, norm);
  if (norm) return cudaErrorInvalidValue; /* only the GEMV kernel computes a norm */
  cudaError_t rc;
  if (g->swiglu || g->ld_pad) { /* into the scratch, then combined or copied into out */
    kcu_tensor t = *out;
    t.data = g->scratch;
    rc = g->scratch ? kcu_gemm_run_matmul(g, lt, s, in, n_in, &t, workspace, workspace_size)
                    : cudaErrorInvalidValue;
    if (rc == cudaSuccess && g->swiglu)
      return kcu_swiglu(s, t.data, out->data, out->dtype, g->M, g->N);
    /* the first N columns of each row, by the engine's strided copy */
    kcu_copy_geom rows;
    memset(&rows, 0, sizeof rows);
    rows.rank = 2;
    rows.dims[0] = g->M, rows.dims[1] = g->N;
    rows.src_strides[0] = g->ld_pad, rows.src_strides[1] = 1;
    rows.dst_strides[0] = g->N, rows.dst_strides[1] = 1;
    if (rc == cudaSuccess)
      rc = kcu_strided_copy(s, t.data, out->data, kiln_dtype_size(out->dtype), &rows);
  } else {
    rc = kcu_gemm_run_matmul(g, lt, s, in, n_in, out, workspace, workspace_size);
  }
  if (rc == cudaSuccess && g->post != KILN_ACT_NONE) rc = kcu_activation(s, g->post, out);
  return rc;
}

/* The cuBLASLt calls of g, its bias pointer set. */
static cudaError_t kcu_gemm_run_matmul(const kcu_gemm *g, cublasLtHandle_t lt, cudaStream_t s,
                                       const kcu_tensor *in, uint32_t n_in,
                                       const kcu_tensor *out, void *workspace,
                                       size_t workspace_size) {
  const float alpha = 1.0f, beta = g->residual ? 1.0f : 0.0f;
  if (g->has_bias) {
    const void *bias = in[2].data;
    if (cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                       sizeof bias) != CUBLAS_STATUS_SUCCESS)
      return cudaErrorInvalidValue;
  }
  for (int64_t c = 0; c < g->calls; c++) {
    const char *a = (const char *)in[1].data, *b = (const char *)in[0].data;
    char *d = (char *)out->data + c * g->d_mat;
    int64_t rem = c;
    for (int dd = g->nb - 1; dd >= 0 && g->calls > 1; dd--) {
      int64_t idx = rem % g->bdims[dd];
      rem /= g->bdims[dd];
      a += idx * g->a_st[dd] * g->a_mat;
      b += idx * g->b_st[dd] * g->b_mat;
    }
    const void *c_in = g->residual ? in[n_in - 1].data : d;
    cublasStatus_t st = cublasLtMatmul(lt, g->desc, &alpha, a, g->a, b, g->b, &beta, c_in, g->d,
                                       d, g->d, &g->algo, workspace, workspace_size, s);
    if (st != CUBLAS_STATUS_SUCCESS) return cudaErrorLaunchFailure;
  }
  return cudaSuccess;
}

/* Milliseconds of the fastest of `reps` runs after one untimed run, each after the cold
 * region is read through (so its weights come from device memory, as in a call of a model the
 * L2 cache cannot hold), each timed with a hold of KCU_HOLD_NS ahead of it (the kernel ahead of
 * it in a call; the same for every candidate); INFINITY when a run fails. */
static float kcu_gemm_time(const kcu_gemm *g, cublasLtHandle_t lt, cudaStream_t s,
                           const kcu_tensor *in, uint32_t n_in, const kcu_tensor *out,
                           void *workspace, size_t workspace_size, const kcu_cold *cold,
                           cudaEvent_t start, cudaEvent_t stop, int reps) {
  float best = INFINITY;
  cudaError_t rc = kcu_gemm_run(g, lt, s, in, n_in, out, workspace, workspace_size, NULL);
  for (int rep = 0; rc == cudaSuccess && rep < reps; rep++) {
    float ms = INFINITY;
    if (cold && cold->bytes) rc = kcu_read_through(s, cold->data, cold->bytes);
    if (rc == cudaSuccess) rc = cudaEventRecord(start, s);
    if (rc == cudaSuccess) rc = kcu_hold(s, KCU_HOLD_NS);
    if (rc == cudaSuccess)
      rc = kcu_gemm_run(g, lt, s, in, n_in, out, workspace, workspace_size, NULL);
    if (rc == cudaSuccess) rc = cudaEventRecord(stop, s);
    if (rc == cudaSuccess) rc = cudaEventSynchronize(stop);
    if (rc == cudaSuccess) rc = cudaEventElapsedTime(&ms, start, stop);
    if (rc == cudaSuccess && ms < best) best = ms;
  }
  if (rc != cudaSuccess) best = INFINITY;
  cudaGetLastError();
  return best;
}

int kcu_gemm_tune(kcu_gemm *g, cublasLtHandle_t lt, cudaStream_t s, const kcu_tensor *in,
                  uint32_t n_in, const kcu_tensor *out, void *workspace, size_t workspace_size,
                  const kcu_cold *cold) {
  cudaEvent_t start = NULL, stop = NULL;
  int race_gemv = g->gemv_ok && g->n_candidates > 0 && kcu_test_gemv_choice < 0;
  if ((g->n_candidates < 2 && !race_gemv) || cudaEventCreate(&start) != cudaSuccess ||
      cudaEventCreate(&stop) != cudaSuccess) {
    if (start) cudaEventDestroy(start);
    cudaGetLastError();
    return KCU_CHOICE_NONE;
  }
  /* The rest of the key: what the engine set after the descriptors, and the device. */
  struct {
    cublasLtMatmulAlgo_t algo;
    int32_t gemv;
  } kept;
  int device = 0;
  cudaGetDevice(&device);
  g->key[20] = device, g->key[21] = g->gemv_ok, g->key[22] = g->calls, g->key[23] = g->swiglu;
  g->key[24] = g->act, g->key[25] = g->has_bias, g->key[26] = g->residual, g->key[27] = g->post;
  memset(&kept, 0, sizeof kept);
  if (kcu_choice_find(g->key, sizeof g->key, &kept, sizeof kept)) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    g->algo = kept.algo;
    g->gemv = race_gemv ? kept.gemv : g->gemv;
    return KCU_CHOICE_REUSED;
  }
  int gemv = g->gemv;
  float best = INFINITY;
  int best_index = 0;
  g->gemv = 0;
  for (int i = 0; i < g->n_candidates; i++) {
    g->algo = g->candidates[i];
    float ms = kcu_gemm_time(g, lt, s, in, n_in, out, workspace, workspace_size, cold, start,
                             stop, 5);
    if (ms < best) best = ms, best_index = i;
  }
  g->algo = g->candidates[best_index];
  if (race_gemv) { /* each spread of the GEMV kernel against cuBLASLt's best; a tie to the GEMV */
    int choice = 0;
    for (int spread = 0; spread < KCU_GEMV_SPREADS; spread++) {
      g->gemv = 1 + spread;
      float ms = kcu_gemm_time(g, lt, s, in, n_in, out, workspace, workspace_size, cold, start,
                               stop, 5);
      if (ms <= best) best = ms, choice = 1 + spread;
    }
    g->gemv = choice;
  } else {
    g->gemv = gemv;
  }
  kept.algo = g->algo;
  kept.gemv = g->gemv;
  if (best < INFINITY) kcu_choice_keep(g->key, sizeof g->key, &kept, sizeof kept);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return KCU_CHOICE_MEASURED;
}

void kcu_gemm_release(kcu_gemm *g) {
  if (g->pref) cublasLtMatmulPreferenceDestroy(g->pref);
  if (g->a) cublasLtMatrixLayoutDestroy(g->a);
  if (g->b) cublasLtMatrixLayoutDestroy(g->b);
  if (g->d) cublasLtMatrixLayoutDestroy(g->d);
  if (g->desc) cublasLtMatmulDescDestroy(g->desc);
  memset(g, 0, sizeof *g);
}
