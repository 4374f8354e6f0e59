/* LINEAR for a few rows (batch-1 decoding, small MLPs): the weight is read once, so the
 * kernel is bound by memory bandwidth, not math. A block's warps own `cols` output columns,
 * each column's weight row split along K into 8 / cols slices (split-K inside the block, so
 * a narrow layer still has enough warps in flight to saturate memory; how many warps a launch
 * aims at, its spread, init times per shape, see cuda_ops.h): the lanes stream their
 * slice in 16-byte loads, several issued before any is used, multiply them with every input
 * row in f32 and reduce by warp shuffles; the slices meet in shared memory, and one warp per
 * column applies bias and activation (erf GELU included, which no cuBLASLt epilogue
 * computes), then adds the residual, before the one store. SwiGLU (w = [gate; up], 2N rows)
 * pairs a gate and an up column in one block and stores silu(gate) * up. A weight no kernel
 * writes is read by a kernel launched early (cuda_early_launch.c): its first loads go out while
 * the kernel ahead of it still runs (measured in a decode step: no faster, within the runs'
 * spread, than loading after the wait). */
#include "cuda_device.cuh"

#define KCU_GEMV_WARPS 8
#define KCU_GEMV_UNROLL 4 /* 16-byte weight loads in flight per lane */

static __device__ __forceinline__ float kcu_gemv_act(int act, float v) {
  switch (act) {
  case KILN_ACT_RELU: return kcu_unop(KILN_OP_RELU, v, 0.0f);
  case KILN_ACT_GELU_ERF: return kcu_unop(KILN_OP_GELU, v, 0.0f);
  case KILN_ACT_GELU_TANH: return kcu_unop(KILN_OP_GELU, v, 1.0f);
  default: return v;
  }
}

/* One trip's weight vectors for a lane whose first is at c (zeros past c_end). */
static __device__ __forceinline__ void kcu_gemv_load(uint4 *wv, const uint4 *wrow, int64_t c,
                                                     int64_t c_end) {
#pragma unroll
  for (int u = 0; u < KCU_GEMV_UNROLL; u++, c += 32)
    wv[u] = c < c_end ? __ldg(wrow + c) : make_uint4(0, 0, 0, 0);
}

/* dt and rows (the most input rows the kernel takes: 1 or KCU_GEMV_MAX_ROWS) are compile-time
 * constants at each call below, so the dtype branches fold away and a one-row kernel keeps one
 * accumulator: fewer registers, more warps resident, more weight bytes in flight. */
static __device__ __forceinline__ void kcu_gemv_body(int dt, int rows, const void *x, const void *w,
                                                     const void *bias, const void *res, void *y,
                                                     int M, int64_t N, int64_t K, int act,
                                                     int cols) {
  __shared__ float part[KCU_GEMV_WARPS][KCU_GEMV_MAX_ROWS];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int col = warp % cols, slice = warp / cols, slices = KCU_GEMV_WARPS / cols;
  /* SwiGLU: the block's first half of columns reads gate rows, the second the matching up
   * rows (N below them), and each output column combines one of each. */
  int glu = act == KILN_ACT_SWIGLU, outs = glu ? cols / 2 : cols;
  int64_t n = (int64_t)blockIdx.x * outs + col % outs;
  int64_t row = glu && col >= outs ? N + n : n;
  const int per = dt == KILN_F32 ? 4 : 8;
  const int64_t chunks = K / per; /* 16-byte vectors per row */
  const int64_t span = (chunks + slices - 1) / slices;
  const int64_t c_begin = slice * span, c_end = c_begin + span < chunks ? c_begin + span : chunks;
  float acc[KCU_GEMV_MAX_ROWS];
#pragma unroll
  for (int m = 0; m < rows; m++) acc[m] = 0.0f;
  const uint4 *wrow = (const uint4 *)w + row * chunks;
  uint4 wv[KCU_GEMV_UNROLL];
  /* Launched early (w a weight): the first loads of the weight go out before the kernel ahead
   * ends; x is its output, read only after the wait. */
  if (n < N) kcu_gemv_load(wv, wrow, c_begin + lane, c_end);
  kcu_begin_early();
  if (n < N) {
    const uint4 *xv = (const uint4 *)x;
    for (int64_t c0 = c_begin + lane; c0 < c_end; c0 += 32 * KCU_GEMV_UNROLL) {
      if (c0 != c_begin + lane) kcu_gemv_load(wv, wrow, c0, c_end);
#pragma unroll
      for (int u = 0; u < KCU_GEMV_UNROLL; u++) {
        int64_t c = c0 + 32 * u;
        if (c < c_end) {
          float wf[8], xf[8];
          kcu_unpack16(wv[u], dt, wf);
#pragma unroll
          for (int m = 0; m < rows; m++) {
            if (m < M) {
              kcu_unpack16(__ldg(xv + m * chunks + c), dt, xf);
#pragma unroll
              for (int t = 0; t < per; t++) acc[m] += wf[t] * xf[t];
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < rows; m++) {
    float v = kcu_warp_sum(acc[m]);
    if (lane == 0) part[warp][m] = v;
  }
  __syncthreads();
  if (slice != 0 || col >= outs || n >= N) return;
  float b = bias ? kcu_ld(bias, dt, n) : 0.0f;
  if (lane < M) {
    float v = 0.0f, up = 0.0f;
    for (int k = 0; k < slices; k++) v += part[k * cols + col][lane];
    for (int k = 0; glu && k < slices; k++) up += part[k * cols + col + outs][lane];
    v = glu ? kcu_unop(KILN_OP_SILU, v, 0.0f) * up : kcu_gemv_act(act, v + b);
    if (res) v += kcu_ld(res, dt, (int64_t)lane * N + n);
    kcu_st(y, dt, (int64_t)lane * N + n, v);
  }
}

#define KCU_GEMV_KERNEL(name, dt, rows)                                                        \
  __global__ void __launch_bounds__(KCU_GEMV_WARPS * 32)                                       \
      name(const void *x, const void *w, const void *bias, const void *res, void *y, int M,    \
           int64_t N, int64_t K, int act, int cols) {                                          \
    kcu_gemv_body(dt, rows, x, w, bias, res, y, M, N, K, act, cols);                           \
  }
KCU_GEMV_KERNEL(kcu_gemv_f32, KILN_F32, KCU_GEMV_MAX_ROWS)
KCU_GEMV_KERNEL(kcu_gemv_f16, KILN_F16, KCU_GEMV_MAX_ROWS)
KCU_GEMV_KERNEL(kcu_gemv_bf16, KILN_BF16, KCU_GEMV_MAX_ROWS)
KCU_GEMV_KERNEL(kcu_gemv_f32_row, KILN_F32, 1)
KCU_GEMV_KERNEL(kcu_gemv_f16_row, KILN_F16, 1)
KCU_GEMV_KERNEL(kcu_gemv_bf16_row, KILN_BF16, 1)

int kcu_gemv_columns(int64_t N, int spread) {
  int64_t target = (int64_t)KCU_GEMV_BASE_WARPS << spread;
  int cols = KCU_GEMV_WARPS;
  while (cols > 1 && N * (KCU_GEMV_WARPS / cols) < target) cols /= 2;
  return cols;
}

cudaError_t kcu_gemv(cudaStream_t s, const void *x, const void *w, const void *bias,
                     const void *residual, void *y, kiln_dtype dt, int64_t M, int64_t N,
                     int64_t K, kiln_activation act, int w_fixed, int spread) {
  if (N == 0) return cudaSuccess;
  if (spread < 0 || spread >= KCU_GEMV_SPREADS) return cudaErrorInvalidValue;
  int glu = act == KILN_ACT_SWIGLU;
  int cols = kcu_gemv_columns(glu ? 2 * N : N, spread);
  if (glu && cols < 2) cols = 2; /* a gate and an up column per output */
  int outs = glu ? cols / 2 : cols;
  unsigned blocks = (unsigned)((N + outs - 1) / outs);
  void (*kernel)(const void *, const void *, const void *, const void *, void *, int, int64_t,
                 int64_t, int, int) =
      M == 1 ? (dt == KILN_F32 ? kcu_gemv_f32_row : dt == KILN_F16 ? kcu_gemv_f16_row
                                                                    : kcu_gemv_bf16_row)
             : (dt == KILN_F32 ? kcu_gemv_f32 : dt == KILN_F16 ? kcu_gemv_f16 : kcu_gemv_bf16);
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t c = kcu_launch_config(blocks, KCU_GEMV_WARPS * 32, 0, s, w_fixed, &attr);
  return cudaLaunchKernelEx(&c, kernel, x, w, bias, residual, y, (int)M, N, K, (int)act, cols);
}
