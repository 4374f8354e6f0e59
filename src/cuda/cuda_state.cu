/* INDEX_COPY: slots of a tensor (a KV cache, in place) replaced at data-dependent positions.
 * Every block checks every position before it writes, so a position outside the tensor writes
 * nothing anywhere; the first one found is recorded for the engine's message. */
#include "cuda_device.cuh"

#define KCU_DEFINE_INDEX_COPY(name, type)                                                   \
  __global__ void name(const type *src, const void *idx, int didx, type *out, int64_t outer, \
                       int64_t n_idx, int64_t inner, int64_t len, int *fault,              \
                       long long *bad) {                                                  \
    kcu_begin_early();                                                                    \
    int found = 0;                                                                        \
    for (int64_t k = threadIdx.x; k < n_idx; k += blockDim.x) {                           \
      long long v = kcu_ldi(idx, didx, k);                                                \
      if (v < 0 || v >= len) {                                                            \
        found = 1;                                                                        \
        if (atomicCAS(fault, 0, 1) == 0) {                                                \
          bad[0] = v;                                                                     \
          bad[1] = len;                                                                   \
        }                                                                                 \
      }                                                                                   \
    }                                                                                     \
    if (__syncthreads_or(found)) return;                                                  \
    int64_t n = outer * n_idx * inner;                                                    \
    int64_t stride = (int64_t)gridDim.x * blockDim.x;                                     \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) { \
      int64_t c = i % inner, j = (i / inner) % n_idx, o = i / (inner * n_idx);           \
      out[(o * len + kcu_ldi(idx, didx, j)) * inner + c] = src[i];                         \
    }                                                                                     \
  }

KCU_DEFINE_INDEX_COPY(kcu_index_copy1, unsigned char)
KCU_DEFINE_INDEX_COPY(kcu_index_copy2, unsigned short)
KCU_DEFINE_INDEX_COPY(kcu_index_copy4, unsigned int)
KCU_DEFINE_INDEX_COPY(kcu_index_copy8, unsigned long long)

cudaError_t kcu_index_copy(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *idx,
                           const kcu_tensor *values, const kcu_tensor *out, int32_t dim,
                           int *fault, long long *bad) {
  int64_t outer = 1, inner = 1, n_idx = idx->numel, len = x->dims[dim];
  size_t bytes = (size_t)x->numel * kiln_dtype_size(x->dtype);
  for (int d = 0; d < dim; d++) outer *= x->dims[d];
  for (int d = dim + 1; d < x->rank; d++) inner *= x->dims[d];
  if (out->data != x->data && bytes) {
    cudaError_t rc = cudaMemcpyAsync(out->data, x->data, bytes, cudaMemcpyDeviceToDevice, s);
    if (rc != cudaSuccess) return rc;
  }
  int64_t n = outer * n_idx * inner;
  if (n == 0) return cudaSuccess;
  unsigned grid = kcu_grid(n, 4);
  switch (kiln_dtype_size(x->dtype)) {
  case 1: kcu_launch_early(kcu_index_copy1, grid, KCU_BLOCK, 0, s, (const unsigned char *)values->data, idx->data, idx->dtype, (unsigned char *)out->data, outer, n_idx, inner, len, fault, bad); break;
  case 2: kcu_launch_early(kcu_index_copy2, grid, KCU_BLOCK, 0, s, (const unsigned short *)values->data, idx->data, idx->dtype, (unsigned short *)out->data, outer, n_idx, inner, len, fault, bad); break;
  case 4: kcu_launch_early(kcu_index_copy4, grid, KCU_BLOCK, 0, s, (const unsigned int *)values->data, idx->data, idx->dtype, (unsigned int *)out->data, outer, n_idx, inner, len, fault, bad); break;
  default: kcu_launch_early(kcu_index_copy8, grid, KCU_BLOCK, 0, s, (const unsigned long long *)values->data, idx->data, idx->dtype, (unsigned long long *)out->data, outer, n_idx, inner, len, fault, bad); break;
  }
  return cudaGetLastError();
}
