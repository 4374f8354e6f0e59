/* Gathers by index: embedding rows and index_select along a dim. An index outside its range
 * cannot stop a kernel, so it writes zeros and raises the engine's fault flag, which the
 * engine reads after the run and reports. */
#include "cuda_device.cuh"

#define KCU_DEFINE_GATHER(name, type)                                                      \
  __global__ void name(const type *x, const void *idx, int didx, type *out, int64_t outer, \
                       int64_t n_idx, int64_t inner, int64_t src_dim, int *fault) {       \
    int64_t n = outer * n_idx * inner;                                                    \
    int64_t stride = (int64_t)gridDim.x * blockDim.x;                                     \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) { \
      int64_t c = i % inner, j = (i / inner) % n_idx, o = i / (inner * n_idx);           \
      long long k = kcu_ldi(idx, didx, j);                                                \
      if (k < 0 || k >= src_dim) {                                                        \
        *fault = 1;                                                                       \
        out[i] = (type)0;                                                                 \
      } else {                                                                            \
        out[i] = x[(o * src_dim + k) * inner + c];                                        \
      }                                                                                   \
    }                                                                                     \
  }

KCU_DEFINE_GATHER(kcu_gather1, unsigned char)
KCU_DEFINE_GATHER(kcu_gather2, unsigned short)
KCU_DEFINE_GATHER(kcu_gather4, unsigned int)
KCU_DEFINE_GATHER(kcu_gather8, unsigned long long)

/* out[o, j, c] = x[o, idx[j], c] with x viewed as [outer, src_dim, inner]. */
static cudaError_t kcu_gather(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *idx,
                              const kcu_tensor *out, int64_t outer, int64_t src_dim,
                              int64_t inner, int *fault) {
  int64_t n_idx = idx->numel;
  int64_t n = outer * n_idx * inner;
  if (n == 0) return cudaSuccess;
  unsigned grid = kcu_grid(n, 4);
  switch (kiln_dtype_size(x->dtype)) {
  case 1: kcu_gather1<<<grid, KCU_BLOCK, 0, s>>>((const unsigned char *)x->data, idx->data, idx->dtype, (unsigned char *)out->data, outer, n_idx, inner, src_dim, fault); break;
  case 2: kcu_gather2<<<grid, KCU_BLOCK, 0, s>>>((const unsigned short *)x->data, idx->data, idx->dtype, (unsigned short *)out->data, outer, n_idx, inner, src_dim, fault); break;
  case 4: kcu_gather4<<<grid, KCU_BLOCK, 0, s>>>((const unsigned int *)x->data, idx->data, idx->dtype, (unsigned int *)out->data, outer, n_idx, inner, src_dim, fault); break;
  default: kcu_gather8<<<grid, KCU_BLOCK, 0, s>>>((const unsigned long long *)x->data, idx->data, idx->dtype, (unsigned long long *)out->data, outer, n_idx, inner, src_dim, fault); break;
  }
  return cudaGetLastError();
}

cudaError_t kcu_embedding(cudaStream_t s, const kcu_tensor *weight, const kcu_tensor *idx,
                          const kcu_tensor *out, int *fault) {
  return kcu_gather(s, weight, idx, out, 1, weight->dims[0], weight->dims[1], fault);
}

cudaError_t kcu_index_select(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *idx,
                             const kcu_tensor *out, int32_t dim, int *fault) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; d++) outer *= x->dims[d];
  for (int d = dim + 1; d < x->rank; d++) inner *= x->dims[d];
  return kcu_gather(s, x, idx, out, outer, x->dims[dim], inner, fault);
}
