/* The tail of a convolution that cuDNN did not fuse: per-channel bias, a residual of the
 * output's shape, then ReLU, applied in place to the convolution's result in f32. */
#include "cuda_device.cuh"

__global__ void kcu_conv_epilogue_kernel(void *out, const void *bias, const void *residual,
                                         int dt, int64_t n, int64_t channels, int64_t inner,
                                         int relu) {
  kcu_begin_early();
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = kcu_ld(out, dt, i);
    if (bias) v += kcu_ld(bias, dt, (i / inner) % channels);
    if (residual) v += kcu_ld(residual, dt, i);
    if (relu && v < 0.0f) v = 0.0f; /* NaN stays NaN, as in PyTorch */
    kcu_st(out, dt, i, v);
  }
}

cudaError_t kcu_conv_epilogue(cudaStream_t s, const kcu_tensor *out, const void *bias,
                              const void *residual, int64_t channels, int64_t inner, int relu) {
  if (out->numel == 0) return cudaSuccess;
  kcu_launch_early(kcu_conv_epilogue_kernel, kcu_grid(out->numel, 4), KCU_BLOCK, 0, s,
      out->data, bias, residual, (int)out->dtype, out->numel, channels, inner, relu);
  return cudaGetLastError();
}
