/* Softmax, log-softmax, layer norm and RMS norm; statistics in f32, one block per row when
 * the reduced dim is contiguous, one thread per column otherwise. */
#include "cuda_chain.cuh"

__global__ void kcu_softmax_rows(const void *x, int dx, void *out, int dout, int64_t n, int log) {
  kcu_begin_early();
  __shared__ float scratch[32];
  int64_t row = blockIdx.x;
  int64_t base = row * n;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, kcu_ld(x, dx, base + j));
  m = kcu_block_reduce(m, 1, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += expf(kcu_ld(x, dx, base + j) - m);
  sum = kcu_block_reduce(sum, 0, scratch);
  float lse = m + logf(sum), inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float v = kcu_ld(x, dx, base + j);
    kcu_st(out, dout, base + j, log ? v - lse : expf(v - m) * inv);
  }
}

__global__ void kcu_softmax_cols(const void *x, int dx, void *out, int dout, int64_t outer,
                                 int64_t n, int64_t inner, int log) {
  kcu_begin_early();
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < outer * inner; c += stride) {
    int64_t base = (c / inner) * n * inner + c % inner;
    float m = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < n; j++) m = fmaxf(m, kcu_ld(x, dx, base + j * inner));
    for (int64_t j = 0; j < n; j++) sum += expf(kcu_ld(x, dx, base + j * inner) - m);
    float lse = m + logf(sum), inv = 1.0f / sum;
    for (int64_t j = 0; j < n; j++) {
      float v = kcu_ld(x, dx, base + j * inner);
      kcu_st(out, dout, base + j * inner, log ? v - lse : expf(v - m) * inv);
    }
  }
}

static unsigned kcu_row_threads(int64_t n) {
  unsigned t = 32;
  while (t < 1024 && (int64_t)t * 4 < n) t *= 2;
  return t;
}

cudaError_t kcu_softmax(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *out, int32_t dim,
                        int log) {
  if (out->numel == 0) return cudaSuccess;
  int64_t outer = 1, inner = 1, n = x->dims[dim];
  for (int d = 0; d < dim; d++) outer *= x->dims[d];
  for (int d = dim + 1; d < x->rank; d++) inner *= x->dims[d];
  if (inner == 1 && outer <= 0x7fffffffLL) {
    kcu_launch_early(kcu_softmax_rows, (unsigned)outer, kcu_row_threads(n), 0, s, x->data,
                     x->dtype, out->data, out->dtype, n, log);
  } else {
    kcu_launch_early(kcu_softmax_cols, kcu_grid(outer * inner, 1), KCU_BLOCK, 0, s,
        x->data, x->dtype, out->data, out->dtype, outer, n, inner, log);
  }
  return cudaGetLastError();
}

/* x at element e through the steps fused before the norm. */
static __device__ __forceinline__ float kcu_norm_in(const kcu_chain *c, int before, int64_t e) {
  float v = kcu_ld(c->in[0], c->dtype, e);
  return before ? kcu_chain_apply(c, 0, before, v, e) : v;
}

/* One block per row of n elements; the steps before the norm are recomputed on each of the
 * row's three reads (from L2 after the first), the steps after it run once before the store. */
__global__ void kcu_norm_rows(kcu_chain c, int before, const void *w, const void *b, void *out,
                              int64_t n, float eps, int rms) {
  __shared__ float scratch[32];
  kcu_begin_early();
  int64_t base = (int64_t)blockIdx.x * n;
  float mean = 0.0f;
  if (!rms) {
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += kcu_norm_in(&c, before, base + j);
    mean = kcu_block_reduce(sum, 0, scratch) / (float)n;
  }
  float sq = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float v = kcu_norm_in(&c, before, base + j) - mean;
    sq += v * v;
  }
  float rstd = rsqrtf(kcu_block_reduce(sq, 0, scratch) / (float)n + eps);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float v = (kcu_norm_in(&c, before, base + j) - mean) * rstd;
    if (w) v *= kcu_ld(w, c.dtype, j);
    if (b) v += kcu_ld(b, c.dtype, j);
    kcu_st(out, c.dtype, base + j, kcu_chain_apply(&c, before, c.n_steps, v, base + j));
  }
}

#define KCU_NORM_VECS 2      /* 16-byte vectors of the row each thread holds */
#define KCU_NORM_THREADS 512 /* the most threads a row takes */
#define KCU_NORM_MANY_ROWS 512 /* rows enough to fill the GPU with blocks of several vectors */

/* One step on one value: called, not inlined, so that the op math is in the kernel once rather
 * than at each of the sixteen elements a thread holds, before and after the norm (inlined, it
 * made the kernel several hundred KB of machine code, most of the library's). */
static __device__ __noinline__ float kcu_norm_step(int kind, int binary, int reversed,
                                                   float param, float v, float y) {
  return kcu_step_math(kind, binary, reversed, param, v, y);
}

/* Steps [from, to) on the elements v of 16-byte vector vi, every operand of x's shape. */
static __device__ __forceinline__ void kcu_norm_steps(const kcu_chain *c, int from, int to,
                                                      float *v, int64_t vi) {
  for (int s = from; s < to; s++) {
    float y[8] = {0};
    int kind = c->kind[s], slot = c->slot[s], rev = c->reversed[s];
    float param = c->param[s];
    if (slot) kcu_ld16(c->in[slot], c->dtype, vi, y);
#pragma unroll
    for (int t = 0; t < 8; t++) v[t] = kcu_norm_step(kind, slot != 0, rev, param, v[t], y[t]);
  }
}

/* One block per row with the row in registers: each thread issues its loads of up to
 * KCU_NORM_VECS 16-byte vectors together (a thread that loads and converts one vector at a time
 * waits a memory round trip per vector) and the weight's before the reductions; the mean and
 * variance come from the registers (two block reductions), and each vector is written once.
 * At most 64 registers, four blocks of 256 threads a multiprocessor. Rows of n = per * nv
 * elements, nv <= blockDim.x *
 * KCU_NORM_VECS, blockDim.x <= KCU_NORM_THREADS; x, out, weight, bias and the steps' operands
 * 16-byte aligned, the operands of x's shape. */
__global__ void __launch_bounds__(KCU_NORM_THREADS, 2)
    kcu_norm_rows_vec(kcu_chain c, int before, const void *w, const void *b, void *out,
                      int64_t n, float eps, int rms) {
  __shared__ float scratch[32];
  kcu_begin_early();
  const int per = c.dtype == KILN_F32 ? 4 : 8;
  const int64_t nv = n / per, row_v = (int64_t)blockIdx.x * nv;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 raw[KCU_NORM_VECS], wraw[KCU_NORM_VECS];
#pragma unroll
  for (int k = 0; k < KCU_NORM_VECS; k++) {
    int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
    raw[k] = j < nv ? ((const uint4 *)c.in[0])[row_v + j] : zero;
  }
#pragma unroll
  for (int k = 0; k < KCU_NORM_VECS; k++) {
    int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
    wraw[k] = w && j < nv ? ((const uint4 *)w)[j] : zero;
  }
  float v[KCU_NORM_VECS][8];
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < KCU_NORM_VECS; k++) {
    int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
    kcu_unpack16(raw[k], c.dtype, v[k]);
    if (j >= nv) continue;
    kcu_norm_steps(&c, 0, before, v[k], row_v + j);
#pragma unroll
    for (int t = 0; t < 8; t++) sum += t < per ? v[k][t] : 0.0f;
  }
  float mean = rms ? 0.0f : kcu_block_reduce(sum, 0, scratch) / (float)n;
  float sq = 0.0f;
#pragma unroll
  for (int k = 0; k < KCU_NORM_VECS; k++) {
    if (threadIdx.x + (int64_t)k * blockDim.x >= nv) continue;
#pragma unroll
    for (int t = 0; t < 8; t++) {
      float d = v[k][t] - mean;
      sq += t < per ? d * d : 0.0f;
    }
  }
  float rstd = rsqrtf(kcu_block_reduce(sq, 0, scratch) / (float)n + eps);
#pragma unroll
  for (int k = 0; k < KCU_NORM_VECS; k++) {
    int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
    if (j >= nv) continue;
    float wv[8], bv[8] = {0};
    kcu_unpack16(wraw[k], c.dtype, wv);
    if (b) kcu_ld16(b, c.dtype, j, bv);
#pragma unroll
    for (int t = 0; t < 8; t++) {
      float y = (v[k][t] - mean) * rstd;
      if (w) y *= wv[t];
      v[k][t] = b ? y + bv[t] : y;
    }
    kcu_norm_steps(&c, before, c.n_steps, v[k], row_v + j);
    kcu_st16(out, c.dtype, row_v + j, v[k]);
  }
}

/* Threads for kcu_norm_rows_vec on `rows` rows of n elements, or 0 when it cannot take them. */
static unsigned kcu_norm_vec_threads(const kcu_chain *c, const kcu_tensor *in, uint32_t n_in,
                                     uint32_t first_operand, const void *w, const void *b,
                                     const kcu_tensor *out, int64_t n, int64_t rows) {
  int per = c->dtype == KILN_F32 ? 4 : 8;
  int64_t nv = n / per;
  uintptr_t addr = (uintptr_t)in[0].data | (uintptr_t)out->data | (uintptr_t)w | (uintptr_t)b;
  for (uint32_t k = first_operand; k < n_in; k++) {
    if (!c->full[k]) return 0;
    addr |= (uintptr_t)in[k].data;
  }
  if (n % per != 0 || (addr & 15u) != 0 || nv > KCU_NORM_THREADS * KCU_NORM_VECS) return 0;
  int64_t t = (nv + KCU_NORM_VECS - 1) / KCU_NORM_VECS;
  /* Few rows: one vector a thread while the block allows it, for the shortest row latency.
   * Many: KCU_NORM_VECS a thread, so smaller blocks keep more rows in flight on each SM. */
  if (nv <= KCU_NORM_THREADS && rows < KCU_NORM_MANY_ROWS) t = nv;
  return (unsigned)((t + 31) / 32 * 32);
}

cudaError_t kcu_norm(cudaStream_t s, const kiln_op *op, const kcu_tensor *in,
                     const kcu_tensor *out) {
  const kcu_tensor *x = &in[0];
  int64_t flags = op->iattr[1], n = 1;
  uint32_t next = 1;
  const void *w = (flags & 1) ? in[next++].data : NULL;
  const void *b = (flags & 2) ? in[next++].data : NULL;
  kiln_pw_span span = {op->iattr, 0, 0, next, 0.0};
  kcu_chain c;
  if (out->numel == 0) return cudaSuccess;
  kiln_pw_span_of(op, &span);
  kcu_chain_init(&c, &span, in, op->n_inputs, x);
  for (int d = x->rank - (int)op->iattr[0]; d < x->rank; d++) n *= x->dims[d];
  int64_t rows = n ? x->numel / n : 0;
  if (rows == 0) return cudaSuccess;
  unsigned vec_threads =
      kcu_norm_vec_threads(&c, in, op->n_inputs, span.first_operand, w, b, out, n, rows);
  if (vec_threads)
    kcu_launch_early(kcu_norm_rows_vec, (unsigned)rows, vec_threads, 0, s,
        c, (int)span.n_before, w, b, out->data, n, (float)op->fattr[0],
        op->kind == KILN_OP_RMS_NORM);
  else
    kcu_launch_early(kcu_norm_rows, (unsigned)rows, kcu_row_threads(n), 0, s,
        c, (int)span.n_before, w, b, out->data, n, (float)op->fattr[0],
        op->kind == KILN_OP_RMS_NORM);
  return cudaGetLastError();
}
