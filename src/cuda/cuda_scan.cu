/* CUMSUM along one dim of x viewed as [outer, n, inner]. A long line is scanned by one warp,
 * 32 elements at a time with the running total carried between them; a short line by one
 * thread. x is converted to the sum's dtype first; integers sum in 64 bits (wrapping), floats
 * in f32. */
#include "cuda_device.cuh"

/* v as a float of dtype dt holds it. */
static __device__ __forceinline__ float kcu_as_dtype(float v, int dt) {
  if (dt == KILN_F16) return __half2float(__float2half_rn(v));
  if (dt == KILN_BF16) return __bfloat162float(__float2bfloat16_rn(v));
  return v;
}

/* Every lane of a warp walks the same line and chunks, so the shuffles see full warps. */
__global__ void kcu_cumsum_kernel(const void *x, int dx, void *out, int dout, int64_t lines,
                                  int64_t n, int64_t inner, int lanes) {
  kcu_begin_early();
  int64_t gid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / lanes;
  int lane = (int)(threadIdx.x % lanes);
  int64_t groups = (int64_t)gridDim.x * blockDim.x / lanes;
  int integer = kcu_is_int(dout);
  for (int64_t line = gid; line < lines; line += groups) {
    int64_t base = (line / inner) * n * inner + line % inner;
    long long itotal = 0;
    float ftotal = 0.0f;
    for (int64_t j0 = 0; j0 < n; j0 += lanes) {
      int64_t j = j0 + lane, at = base + j * inner;
      int valid = j < n;
      if (integer) {
        long long v = valid ? kcu_ldi(x, dx, at) : 0;
        for (int s = 1; s < lanes; s <<= 1) {
          long long t = __shfl_up_sync(0xffffffffu, v, s);
          if (lane >= s) v = (long long)((unsigned long long)v + (unsigned long long)t);
        }
        v = (long long)((unsigned long long)v + (unsigned long long)itotal);
        if (valid) kcu_sti(out, dout, at, v);
        itotal = lanes > 1 ? __shfl_sync(0xffffffffu, v, lanes - 1) : v;
      } else {
        float v = valid ? kcu_as_dtype(kcu_ld(x, dx, at), dout) : 0.0f;
        for (int s = 1; s < lanes; s <<= 1) {
          float t = __shfl_up_sync(0xffffffffu, v, s);
          if (lane >= s) v += t;
        }
        v += ftotal;
        if (valid) kcu_st(out, dout, at, v);
        ftotal = lanes > 1 ? __shfl_sync(0xffffffffu, v, lanes - 1) : v;
      }
    }
  }
}

cudaError_t kcu_cumsum(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *out, int32_t dim) {
  if (out->numel == 0) return cudaSuccess;
  int64_t outer = 1, inner = 1, n = x->dims[dim];
  for (int d = 0; d < dim; d++) outer *= x->dims[d];
  for (int d = dim + 1; d < x->rank; d++) inner *= x->dims[d];
  int lanes = n >= 64 ? 32 : 1;
  kcu_launch_early(kcu_cumsum_kernel, kcu_grid(outer * inner * lanes, 1), KCU_BLOCK, 0, s,
      x->data, x->dtype, out->data, out->dtype, outer * inner, n, inner, lanes);
  return cudaGetLastError();
}
