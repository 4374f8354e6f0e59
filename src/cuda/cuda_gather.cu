/* Gathers by index: embedding rows, index_select along a dim, gather, and advanced indexing.
 * An index outside its range cannot stop a kernel, so it writes zeros and raises the engine's
 * fault flag, which the engine reads after the run and reports. */
#include "cuda_device.cuh"

#define KCU_DEFINE_GATHER(name, type)                                                      \
  __global__ void name(const type *x, const void *idx, int didx, type *out, int64_t outer, \
                       int64_t n_idx, int64_t inner, int64_t src_dim, int *fault) {       \
    kcu_begin_early();                                                                    \
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
  case 1: kcu_launch_early(kcu_gather1, grid, KCU_BLOCK, 0, s, (const unsigned char *)x->data, idx->data, idx->dtype, (unsigned char *)out->data, outer, n_idx, inner, src_dim, fault); break;
  case 2: kcu_launch_early(kcu_gather2, grid, KCU_BLOCK, 0, s, (const unsigned short *)x->data, idx->data, idx->dtype, (unsigned short *)out->data, outer, n_idx, inner, src_dim, fault); break;
  case 4: kcu_launch_early(kcu_gather4, grid, KCU_BLOCK, 0, s, (const unsigned int *)x->data, idx->data, idx->dtype, (unsigned int *)out->data, outer, n_idx, inner, src_dim, fault); break;
  default: kcu_launch_early(kcu_gather8, grid, KCU_BLOCK, 0, s, (const unsigned long long *)x->data, idx->data, idx->dtype, (unsigned long long *)out->data, outer, n_idx, inner, src_dim, fault); break;
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

/* Copies one element of `size` bytes (1, 2, 4 or 8), or writes zeros when from < 0. */
static __device__ __forceinline__ void kcu_move(const void *x, void *out, int64_t to,
                                                int64_t from, size_t size) {
  switch (size) {
  case 1: ((unsigned char *)out)[to] = from < 0 ? 0 : ((const unsigned char *)x)[from]; break;
  case 2: ((unsigned short *)out)[to] = from < 0 ? 0 : ((const unsigned short *)x)[from]; break;
  case 4: ((unsigned int *)out)[to] = from < 0 ? 0 : ((const unsigned int *)x)[from]; break;
  default:
    ((unsigned long long *)out)[to] = from < 0 ? 0 : ((const unsigned long long *)x)[from];
    break;
  }
}

/* GATHER: out (idx's shape) walks x's strides, the coordinate along dim read from idx. */
typedef struct kcu_gather_geom {
  int32_t rank, dim;
  int64_t dims[KILN_MAX_RANK];
  int64_t xstr[KILN_MAX_RANK];
  int64_t size; /* x's extent along dim */
} kcu_gather_geom;

__global__ void kcu_gather_dim_kernel(kcu_gather_geom g, const void *x, const void *idx,
                                      int didx, void *out, size_t elem, int64_t n, int *fault) {
  kcu_begin_early();
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t rest = i, from = 0;
    for (int d = g.rank - 1; d >= 0; d--) {
      int64_t c = rest % g.dims[d];
      rest /= g.dims[d];
      if (d != g.dim) from += c * g.xstr[d];
    }
    long long k = kcu_ldi(idx, didx, i);
    if (k < 0 || k >= g.size) {
      *fault = 1;
      from = -1;
    } else {
      from += k * g.xstr[g.dim];
    }
    kcu_move(x, out, i, from, elem);
  }
}

cudaError_t kcu_gather_dim(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *idx,
                           const kcu_tensor *out, int32_t dim, int *fault) {
  if (out->numel == 0) return cudaSuccess;
  kcu_gather_geom g;
  memset(&g, 0, sizeof g);
  g.rank = idx->rank;
  g.dim = dim;
  g.size = x->dims[dim];
  for (int d = 0; d < idx->rank; d++) g.dims[d] = idx->dims[d];
  kcu_strides(x, g.xstr);
  kcu_launch_early(kcu_gather_dim_kernel, kcu_grid(out->numel, 4), KCU_BLOCK, 0, s,
      g, x->data, idx->data, idx->dtype, out->data, kiln_dtype_size(x->dtype), out->numel, fault);
  return cudaGetLastError();
}

/* INDEX: per output dim, how far one step moves in x (0 inside B) and in each index input (its
 * broadcast stride inside B, 0 outside); then each index input adds its picked coordinate. */
#define KCU_MAX_INDICES (KILN_MAX_OP_INPUTS - 1)
typedef struct kcu_index_geom {
  int32_t rank, n_idx;
  int64_t dims[KILN_MAX_RANK];
  int64_t xstep[KILN_MAX_RANK];
  int64_t istep[KCU_MAX_INDICES][KILN_MAX_RANK];
  int64_t size[KCU_MAX_INDICES];   /* x's extent along the dim index k picks */
  int64_t stride[KCU_MAX_INDICES]; /* x's stride along that dim */
  const void *idx[KCU_MAX_INDICES];
  int dtype[KCU_MAX_INDICES];
} kcu_index_geom;

__global__ void kcu_index_kernel(kcu_index_geom g, const void *x, void *out, size_t elem,
                                 int64_t n, int *fault) {
  kcu_begin_early();
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t rest = i, from = 0, at[KCU_MAX_INDICES];
    for (int k = 0; k < g.n_idx; k++) at[k] = 0;
    for (int d = g.rank - 1; d >= 0; d--) {
      int64_t c = rest % g.dims[d];
      rest /= g.dims[d];
      from += c * g.xstep[d];
      for (int k = 0; k < g.n_idx; k++) at[k] += c * g.istep[k][d];
    }
    for (int k = 0; k < g.n_idx && from >= 0; k++) {
      long long v = kcu_ldi(g.idx[k], g.dtype[k], at[k]);
      if (v < 0) v += g.size[k];
      if (v < 0 || v >= g.size[k]) {
        *fault = 1;
        from = -1;
      } else {
        from += v * g.stride[k];
      }
    }
    kcu_move(x, out, i, from, elem);
  }
}

cudaError_t kcu_advanced_index(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *idx,
                               const kcu_tensor *out, const kiln_index_layout *lay, int *fault) {
  if (out->numel == 0) return cudaSuccess;
  kcu_index_geom g;
  int64_t xstr[KILN_MAX_RANK], bstr[KILN_MAX_RANK];
  memset(&g, 0, sizeof g);
  g.rank = lay->rank;
  g.n_idx = (int32_t)lay->n_idx;
  kcu_strides(x, xstr);
  for (int d = 0; d < lay->rank; d++) {
    g.dims[d] = lay->dims[d];
    g.xstep[d] = lay->walks[d] >= 0 ? xstr[lay->walks[d]] : 0;
  }
  for (int k = 0; k < g.n_idx; k++) {
    kcu_broadcast_strides(&idx[k], lay->b_rank, lay->b_dims, bstr);
    for (int j = 0; j < lay->b_rank; j++) g.istep[k][lay->b_at + j] = bstr[j];
    g.size[k] = x->dims[lay->x_dim[k]];
    g.stride[k] = xstr[lay->x_dim[k]];
    g.idx[k] = idx[k].data;
    g.dtype[k] = idx[k].dtype;
  }
  kcu_launch_early(kcu_index_kernel, kcu_grid(out->numel, 4), KCU_BLOCK, 0, s,
      g, x->data, out->data, kiln_dtype_size(x->dtype), out->numel, fault);
  return cudaGetLastError();
}
