/* Softmax, log-softmax, layer norm and RMS norm; statistics in f32, one block per row when
 * the reduced dim is contiguous, one thread per column otherwise. */
#include "cuda_device.cuh"

__global__ void kcu_softmax_rows(const void *x, int dx, void *out, int dout, int64_t n, int log) {
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
    kcu_softmax_rows<<<(unsigned)outer, kcu_row_threads(n), 0, s>>>(x->data, x->dtype, out->data,
                                                                   out->dtype, n, log);
  } else {
    kcu_softmax_cols<<<kcu_grid(outer * inner, 1), KCU_BLOCK, 0, s>>>(
        x->data, x->dtype, out->data, out->dtype, outer, n, inner, log);
  }
  return cudaGetLastError();
}

__global__ void kcu_norm_rows(const void *x, int dx, const void *w, int dw, const void *b, int db,
                              void *out, int dout, int64_t n, float eps, int rms) {
  __shared__ float scratch[32];
  int64_t base = (int64_t)blockIdx.x * n;
  float mean = 0.0f;
  if (!rms) {
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += kcu_ld(x, dx, base + j);
    mean = kcu_block_reduce(sum, 0, scratch) / (float)n;
  }
  float sq = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float v = kcu_ld(x, dx, base + j) - mean;
    sq += v * v;
  }
  float rstd = rsqrtf(kcu_block_reduce(sq, 0, scratch) / (float)n + eps);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float v = (kcu_ld(x, dx, base + j) - mean) * rstd;
    if (w) v *= kcu_ld(w, dw, j);
    if (b) v += kcu_ld(b, db, j);
    kcu_st(out, dout, base + j, v);
  }
}

cudaError_t kcu_norm(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *weight,
                     const kcu_tensor *bias, const kcu_tensor *out, int32_t ndims, float eps,
                     int rms) {
  if (out->numel == 0) return cudaSuccess;
  int64_t n = 1;
  for (int d = x->rank - ndims; d < x->rank; d++) n *= x->dims[d];
  int64_t rows = n ? x->numel / n : 0;
  if (rows == 0) return cudaSuccess;
  kcu_norm_rows<<<(unsigned)rows, kcu_row_threads(n), 0, s>>>(
      x->data, x->dtype, weight ? weight->data : NULL, weight ? weight->dtype : 0,
      bias ? bias->data : NULL, bias ? bias->dtype : 0, out->data, out->dtype, n, eps, rms);
  return cudaGetLastError();
}
