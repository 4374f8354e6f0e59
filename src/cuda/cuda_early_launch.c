/* Early launch (CUDA's programmatic dependent launch, compute capability 9.0 and up): a kernel
 * launched early may be scheduled while the kernel before it on the stream still runs, so its
 * blocks are resident (and a GEMV's first weight loads in flight) when that kernel ends, instead
 * of a launch and a memory round trip after it. The device side is kcu_begin_early in
 * cuda_device.cuh: it waits for the kernels ahead to end, then lets the next kernel launch. */
#include "cuda_ops.h"

#include <stdatomic.h>
#include <string.h>

#define KCU_EARLY_DEVICES 64

int kcu_early_launch_ok(void) {
  /* per device: 0 not asked yet, 1 no, 2 yes */
  static _Atomic int known[KCU_EARLY_DEVICES];
  int d = 0, major = 0;
  if (cudaGetDevice(&d) != cudaSuccess || d < 0 || d >= KCU_EARLY_DEVICES) {
    cudaGetLastError();
    return 0;
  }
  int k = atomic_load(&known[d]);
  if (k == 0) {
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess)
      cudaGetLastError();
    k = major >= 9 ? 2 : 1;
    atomic_store(&known[d], k);
  }
  return k == 2;
}

cudaLaunchConfig_t kcu_launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                     int early, cudaLaunchAttribute *attr) {
  cudaLaunchConfig_t c;
  memset(&c, 0, sizeof c);
  c.gridDim = grid;
  c.blockDim = block;
  c.dynamicSmemBytes = smem;
  c.stream = s;
  if (early && kcu_early_launch_ok()) {
    memset(attr, 0, sizeof *attr);
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
    c.attrs = attr;
    c.numAttrs = 1;
  }
  return c;
}
