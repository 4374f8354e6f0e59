/* A kernel that occupies one warp for a set time and lets the next kernel launch early, as the
 * engine's kernels do: init times each GEMM candidate right after it (cuda_gemm.c), so one that
 * launches early (the GEMV) is timed as it runs in a call, resident and reading its weight while
 * the kernel ahead still runs, and one that does not (cuBLASLt) pays the wait it pays there.
 * Timed alone, the GEMV lost to cuBLASLt on shapes where it is faster in the decode step. */
#include "cuda_device.cuh"

__global__ void kcu_hold_kernel(long long ns) {
  kcu_begin_early();
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while ((long long)(t - t0) < ns);
}

cudaError_t kcu_hold(cudaStream_t s, long long ns) {
  kcu_launch_early(kcu_hold_kernel, 1, 32, 0, s, ns);
  return cudaGetLastError();
}
