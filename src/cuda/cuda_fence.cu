/* A kernel that ends the early-launch chain: it waits for the kernels ahead of it and lets the
 * next kernel start only once it has ended. The engine puts it before a library kernel that
 * reads, before it waits, what the kernel just ahead of it wrote (cuda_backend.c: a cuDNN fused
 * convolution's residual). */
#include "cuda_device.cuh"

__global__ void kcu_fence_kernel(void) { kcu_wait_early(); }

cudaError_t kcu_fence(cudaStream_t s) {
  kcu_launch_early(kcu_fence_kernel, 1, 32, 0, s);
  return cudaGetLastError();
}
