/* BATCH_NORM the builder could not fold into a convolution: a per-channel affine over dim 1,
 * y = x * scale + shift with scale = weight / sqrt(var + eps), shift = bias - mean * scale, in
 * f32, one thread per element. */
#include "cuda_device.cuh"

__global__ void kcu_batch_norm_kernel(const void *x, const void *mean, const void *var,
                                      const void *weight, const void *bias, void *out, int dt,
                                      int64_t n, int64_t channels, int64_t inner, float eps) {
  kcu_begin_early();
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t c = (i / inner) % channels;
    float scale = 1.0f / sqrtf(kcu_ld(var, dt, c) + eps);
    if (weight) scale *= kcu_ld(weight, dt, c);
    float shift = (bias ? kcu_ld(bias, dt, c) : 0.0f) - kcu_ld(mean, dt, c) * scale;
    kcu_st(out, dt, i, kcu_ld(x, dt, i) * scale + shift);
  }
}

extern "C" cudaError_t kcu_batch_norm(cudaStream_t s, const kiln_op *op, const kcu_tensor *in,
                                      const kcu_tensor *out) {
  const kcu_tensor *x = &in[0];
  int has_weight = (int)(op->iattr[0] & 1), has_bias = (int)((op->iattr[0] >> 1) & 1);
  int64_t inner = 1;
  if (out->numel == 0) return cudaSuccess;
  for (int d = 2; d < x->rank; d++) inner *= x->dims[d];
  kcu_launch_early(kcu_batch_norm_kernel, kcu_grid(out->numel, 1), KCU_BLOCK, 0, s,
      x->data, in[1].data, in[2].data, has_weight ? in[3].data : NULL,
      has_bias ? in[3 + has_weight].data : NULL, out->data, x->dtype, out->numel, x->dims[1],
      inner, (float)op->fattr[0]);
  return cudaGetLastError();
}
