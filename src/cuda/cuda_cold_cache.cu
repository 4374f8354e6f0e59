/* Reading a region of device memory larger than the L2 cache, so that what a kernel reads next
 * comes from device memory, as a model's weights do in a call when the model outgrows the
 * cache. Init times GEMM candidates this way (cuda_gemm.c): timed back to back on a warm cache,
 * the algorithms that win are not the ones that win on weights read once a call. */
#include "cuda_device.cuh"

__global__ void kcu_read_through_kernel(const uint4 *p, int64_t n, unsigned *sink) {
  kcu_begin_early();
  unsigned acc = 0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (sink && acc == 0x9e3779b9u) *sink = acc; /* sink is NULL: the loads stay, no write */
}

size_t kcu_cold_bytes(size_t region) {
  int device = 0, l2 = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device) != cudaSuccess || l2 <= 0) {
    cudaGetLastError();
    return 0;
  }
  if (region <= (size_t)l2) return 0; /* it all fits: a call finds it in the cache as well */
  return region < 2 * (size_t)l2 ? region : 2 * (size_t)l2;
}

cudaError_t kcu_read_through(cudaStream_t s, const void *data, size_t bytes) {
  int64_t n = (int64_t)(bytes / 16);
  if (n == 0 || (uintptr_t)data % 16) return cudaSuccess;
  kcu_launch_early(kcu_read_through_kernel, kcu_grid(n, 4), KCU_BLOCK, 0, s, (const uint4 *)data,
                   n, (unsigned *)NULL);
  return cudaGetLastError();
}
