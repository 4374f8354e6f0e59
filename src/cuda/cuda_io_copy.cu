/* Copies that begin and end a run as kernels, not copy-engine nodes: the inputs from the pinned
 * ring (read through its device mapping) into the engine's buffers, and the outputs back with
 * the fault words, which the same kernel reads out and clears for the next run. Inside a CUDA
 * graph each switch between a copy node and a kernel costs several microseconds of latency
 * (H200: a graph with a host-to-device and a device-to-host node around three small kernels
 * took 20.3 us a replay at 8 KiB, 12.3 us with copy kernels, 8.8 us with the small kernels
 * alone), which a call on small host buffers, and the fault read-back of every call, paid. */
#include "cuda_device.cuh"

/* Waits without letting the next kernel launch early: the inputs it copies may be a fused
 * convolution's residual (kcu_wait_early). */
__global__ void kcu_io_copy_kernel(kcu_io_copies a) {
  kcu_wait_early();
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (int j = 0; j < a.n; j++) {
    const unsigned char *src = (const unsigned char *)a.src[j];
    unsigned char *dst = (unsigned char *)a.dst[j];
    size_t bytes = (size_t)a.bytes[j], head = 0;
    if ((((uintptr_t)src | (uintptr_t)dst) & 15u) == 0) {
      /* four 16-byte loads in flight a thread: the ring is read across the link */
      const uint4 *s = (const uint4 *)src;
      uint4 *d = (uint4 *)dst;
      size_t n16 = bytes / 16, i = tid;
      for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 v0 = s[i], v1 = s[i + stride], v2 = s[i + 2 * stride], v3 = s[i + 3 * stride];
        d[i] = v0;
        d[i + stride] = v1;
        d[i + 2 * stride] = v2;
        d[i + 3 * stride] = v3;
      }
      for (; i < n16; i += stride) d[i] = s[i];
      head = n16 * 16;
    }
    for (size_t i = head + tid; i < bytes; i += stride) dst[i] = src[i];
  }
  if (a.flags && blockIdx.x == 0)
    for (int w = threadIdx.x; w < a.flag_words; w += blockDim.x) {
      a.flags_out[w] = a.flags[w];
      a.flags[w] = 0;
    }
}

cudaError_t kcu_io_copy(cudaStream_t s, const kcu_io_copies *c) {
  if (c->n < 0 || c->n > KCU_IO_COPIES) return cudaErrorInvalidValue;
  size_t units = 0;
  for (int j = 0; j < c->n; j++) units += (size_t)c->bytes[j] / 16 + 1;
  if (units == 0 && !c->flags) return cudaSuccess;
  unsigned grid = kcu_grid((int64_t)units, 1);
  if (grid > KCU_IO_COPY_BLOCKS) grid = KCU_IO_COPY_BLOCKS;
  kcu_launch_early(kcu_io_copy_kernel, grid, KCU_BLOCK, 0, s, *c);
  return cudaGetLastError();
}
