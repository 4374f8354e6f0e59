/* LINEAR for a few rows (batch-1 decoding, small MLPs): the weight is read once, so the
 * kernel is bound by memory bandwidth, not math. A block's warps own `cols` output columns,
 * each column's weight row split along K into 8 / cols slices (split-K inside the block, so
 * a narrow layer still has enough warps in flight to saturate memory; how many warps a launch
 * aims at, its spread, init times per shape, see cuda_ops.h): the lanes stream their
 * slice in 16-byte loads, several issued before any is used, and reduce by warp shuffles; the
 * slices meet in shared memory, and the block applies bias and activation (erf GELU included,
 * which no cuBLASLt epilogue computes), then adds the residual, before the one store. SwiGLU
 * (w = [gate; up], 2N rows) pairs gate and up columns in one block and stores silu(gate) * up.
 * One input row, or f32 (up to 8), multiplies on the CUDA cores in f32. Two to sixteen rows
 * of f16 or bf16 multiply on the tensor cores: a warp's column is a tile of 16 weight rows,
 * each lane loading 16 bytes of two of them and the same 16 bytes of K of one input row, which
 * are the operands of two mma.sync m16n8k16 as they stand (K taken in an order of the lanes'
 * own, the same for weight and input), so each weight byte is loaded once and each input vector
 * serves 16 weight rows; up to 8 rows, a lane's loads run a trip ahead of its multiplies. A
 * layer too narrow for its launch to reach the warps its spread aims at with tiles of 16 takes
 * tiles of 8 up to 8 rows (kcu_gemv_tile): the weight tile is then the mma's n, the input rows
 * its m, each lane loading one weight row's 16 bytes. A
 * weight no kernel writes is read by a kernel launched early (cuda_early_launch.c):
 * its first loads go out while the kernel ahead of it still runs (measured in a decode step: no
 * faster, within the runs' spread, than loading after the wait).
 *
 * The one-row kernel of f16 or bf16 may also compute the norm (RMS or layer norm) whose only
 * readers are GEMVs: each block reduces the row itself (a few KB, from L2) and writes it
 * normalized, rounded to the dtype as the norm's own store rounds it, into shared memory, where
 * its lanes then read their input vectors; a decode step then has no norm kernel ahead of its
 * GEMVs. Only where every block of the launch is resident at once (kcu_gemv_norm_one_wave):
 * with more, the blocks of each later wave normalize the row again, and a 2048-wide SwiGLU GEMV
 * (several waves) ended 1.3 us later than the norm kernel and it had. It may instead compute the
 * norm of its own output row in its last block (kcu_gemv_norm_after), for a norm that its
 * readers cannot. */
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

/* The epilogue of a block: the slices' partial sums in part[warp][row][m] (row of the warp's
 * column, `rows` of them: 1 or a tile of 16; m below ms) summed, bias, activation or SwiGLU's
 * pairing, the residual, and the store of the block's outputs, one per thread in turn. */
static __device__ __forceinline__ void kcu_gemv_epilogue(int dt, const float *part, int rows,
                                                         int ms, const void *bias,
                                                         const void *res, void *y, int M,
                                                         int64_t N, int act, int cols) {
  int glu = act == KILN_ACT_SWIGLU, outs = glu ? cols / 2 : cols, slices = KCU_GEMV_WARPS / cols;
  int per_block = outs * rows, stride = rows * ms;
  for (int i = threadIdx.x; i < per_block * M; i += blockDim.x) {
    int m = i / per_block, o = i % per_block, col = o / rows, r = o % rows;
    int64_t n = (int64_t)blockIdx.x * per_block + o;
    if (n >= N) continue;
    float v = 0.0f, up = 0.0f;
    for (int k = 0; k < slices; k++) v += part[(k * cols + col) * stride + r * ms + m];
    for (int k = 0; glu && k < slices; k++)
      up += part[(k * cols + col + outs) * stride + r * ms + m];
    v = glu ? kcu_unop(KILN_OP_SILU, v, 0.0f) * up
            : kcu_gemv_act(act, v + (bias ? kcu_ld(bias, dt, n) : 0.0f));
    if (res) v += kcu_ld(res, dt, (int64_t)m * N + n);
    kcu_st(y, dt, (int64_t)m * N + n, v);
  }
}

/* Brings the norm's weight and bias vectors this thread will read into L1 (they are weights:
 * before the wait, holding no registers). */
static __device__ __forceinline__ void kcu_gemv_norm_prefetch(const kcu_gemv_norm *nrm,
                                                              int64_t chunks) {
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    if (nrm->w) asm volatile("prefetch.global.L1 [%0];" ::"l"((const uint4 *)nrm->w + c));
    if (nrm->b) asm volatile("prefetch.global.L1 [%0];" ::"l"((const uint4 *)nrm->b + c));
  }
}

/* Vector c of a row the norm reads: x through the read-only path, or (fresh) a row other blocks
 * of this kernel wrote, from L2. */
static __device__ __forceinline__ uint4 kcu_gemv_norm_ld(const uint4 *xv, int64_t c, int fresh) {
  return fresh ? __ldcg(xv + c) : __ldg(xv + c);
}

/* A row normalized into sx (chunks 16-byte vectors; shared or global memory), by the whole
 * block: x read for its sum (a layer norm), its squares about the mean and its values. */
static __device__ __forceinline__ void kcu_gemv_norm_row(int dt, const uint4 *xv, int64_t chunks,
                                                         int64_t K, const kcu_gemv_norm *nrm,
                                                         uint4 *sx, int fresh) {
  __shared__ float scratch[32];
  float mean = 0.0f, sq = 0.0f;
  if (!nrm->rms) {
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float f[8];
      kcu_unpack16(kcu_gemv_norm_ld(xv, c, fresh), dt, f);
#pragma unroll
      for (int t = 0; t < 8; t++) sum += f[t];
    }
    mean = kcu_block_reduce(sum, 0, scratch) / (float)K;
  }
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    float f[8];
    kcu_unpack16(kcu_gemv_norm_ld(xv, c, fresh), dt, f);
#pragma unroll
    for (int t = 0; t < 8; t++) sq += (f[t] - mean) * (f[t] - mean);
  }
  const float rstd = rsqrtf(kcu_block_reduce(sq, 0, scratch) / (float)K + nrm->eps);
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    float f[8], wf[8], bf[8];
    kcu_unpack16(kcu_gemv_norm_ld(xv, c, fresh), dt, f);
    if (nrm->w) kcu_unpack16(__ldg((const uint4 *)nrm->w + c), dt, wf);
    if (nrm->b) kcu_unpack16(__ldg((const uint4 *)nrm->b + c), dt, bf);
#pragma unroll
    for (int t = 0; t < 8; t++) {
      float v = (f[t] - mean) * rstd;
      if (nrm->w) v *= wf[t];
      if (nrm->b) v += bf[t];
      f[t] = v;
    }
    kcu_st16(sx, dt, c, f); /* rounded to the dtype, as the norm's own store rounds it */
  }
  __syncthreads();
}

/* The norm of the output row (nrm->out set): each block, its stores done, counts itself in
 * nrm->arrivals; the last to arrive reads the whole row back from L2, writes it normalized to
 * nrm->out and sets the count back to 0 for the next launch. */
static __device__ __forceinline__ void kcu_gemv_norm_after(int dt, const void *y, int64_t N,
                                                           const kcu_gemv_norm *nrm) {
  __shared__ int last;
  __threadfence(); /* this block's outputs reach L2 before its count does */
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(nrm->arrivals, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  kcu_gemv_norm_row(dt, (const uint4 *)y, N / 8, N, nrm, (uint4 *)nrm->out, 1);
  if (threadIdx.x == 0) *nrm->arrivals = 0;
}

/* One trip's input vectors of a one-row lane: from x in global memory, or with a norm from the
 * normalized row in shared memory. */
static __device__ __forceinline__ void kcu_gemv_load_x(int norm, uint4 *xs, const uint4 *xv,
                                                       const uint4 *sx, int64_t c, int64_t c_end) {
  if (!norm) {
    kcu_gemv_load(xs, xv, c, c_end);
    return;
  }
#pragma unroll
  for (int u = 0; u < KCU_GEMV_UNROLL; u++, c += 32)
    xs[u] = c < c_end ? sx[c] : make_uint4(0, 0, 0, 0);
}

/* dt, rows (the most input rows the kernel takes: 1 or KCU_GEMV_MAX_ROWS) and norm (1: the
 * one-row kernel normalizes its input, see the top) are compile-time constants at each call
 * below, so the dtype branches fold away and a one-row kernel keeps one accumulator: fewer
 * registers, more warps resident, more weight bytes in flight. */
static __device__ __forceinline__ void kcu_gemv_body(int dt, int rows, int norm, const void *x,
                                                     const void *w, const void *bias,
                                                     const void *res, void *y, int M, int64_t N,
                                                     int64_t K, int act, int cols,
                                                     const kcu_gemv_norm *nrm) {
  __shared__ float part[KCU_GEMV_WARPS][KCU_GEMV_MAX_ROWS];
  extern __shared__ uint4 kcu_gemv_sx[]; /* with a norm: the normalized input row */
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
  /* Launched early (w a weight): the first loads of the weight (and of the norm's) go out
   * before the kernel ahead ends; x is its output, read only after the wait. */
  if (n < N) kcu_gemv_load(wv, wrow, c_begin + lane, c_end);
  if (norm) kcu_gemv_norm_prefetch(nrm, chunks);
  kcu_begin_early();
  const uint4 *xv = (const uint4 *)x;
  if (norm) kcu_gemv_norm_row(dt, xv, chunks, K, nrm, kcu_gemv_sx, 0);
  if (rows == 1 && n < N) {
    uint4 xs[KCU_GEMV_UNROLL];
    kcu_gemv_load_x(norm, xs, xv, kcu_gemv_sx, c_begin + lane, c_end);
    for (int64_t c0 = c_begin + lane; c0 < c_end; c0 += 32 * KCU_GEMV_UNROLL) {
      uint4 next_w[KCU_GEMV_UNROLL], next_x[KCU_GEMV_UNROLL];
      kcu_gemv_load(next_w, wrow, c0 + 32 * KCU_GEMV_UNROLL, c_end);
      kcu_gemv_load_x(norm, next_x, xv, kcu_gemv_sx, c0 + 32 * KCU_GEMV_UNROLL, c_end);
#pragma unroll
      for (int u = 0; u < KCU_GEMV_UNROLL; u++) {
        float wf[8], xf[8];
        kcu_unpack16(wv[u], dt, wf);
        kcu_unpack16(xs[u], dt, xf);
#pragma unroll
        for (int t = 0; t < per; t++) acc[0] += wf[t] * xf[t];
        wv[u] = next_w[u], xs[u] = next_x[u];
      }
    }
  } else if (n < N) {
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
  kcu_gemv_epilogue(dt, &part[0][0], 1, KCU_GEMV_MAX_ROWS, bias, res, y, M, N, act, cols);
  if (rows == 1 && !norm && dt != KILN_F32 && nrm->out) kcu_gemv_norm_after(dt, y, N, nrm);
}

/* One trip's vectors of one row (of w or of x) of a tensor-core lane, at c0, c0 + 4, ...:
 * zeros past c_end, or all zeros for a row past the weight's or the input's (ok 0). */
static __device__ __forceinline__ void kcu_gemv_mma_load_row(uint4 *v, const uint4 *row, int ok,
                                                             int64_t c0, int64_t c_end) {
#pragma unroll
  for (int u = 0; u < KCU_GEMV_UNROLL; u++) {
    int64_t c = c0 + 4 * u;
    v[u] = ok && c < c_end ? __ldg(row + c) : make_uint4(0, 0, 0, 0);
  }
}

/* Where a tensor-core warp's work lies: its column's first weight row n0 (of `tile`), the row
 * of w that column starts at (SwiGLU's up rows lie N below the gate's), the 16-byte vectors of
 * a row, and its slice of them, [c_begin, c_end). */
typedef struct kcu_gemv_span {
  int64_t n0, row0, chunks, c_begin, c_end;
} kcu_gemv_span;
static __device__ __forceinline__ kcu_gemv_span kcu_gemv_mma_span(int tile, int64_t N, int64_t K,
                                                                 int act, int cols) {
  int warp = threadIdx.x >> 5, col = warp % cols, slice = warp / cols;
  int glu = act == KILN_ACT_SWIGLU, outs = glu ? cols / 2 : cols;
  kcu_gemv_span s;
  s.n0 = ((int64_t)blockIdx.x * outs + col % outs) * tile;
  s.row0 = (glu && col >= outs ? N : 0) + s.n0;
  s.chunks = K / 8;
  const int64_t span = (s.chunks + KCU_GEMV_WARPS / cols - 1) / (KCU_GEMV_WARPS / cols);
  s.c_begin = slice * span;
  s.c_end = s.c_begin + span < s.chunks ? s.c_begin + span : s.chunks;
  return s;
}

/* One weight vector's fragments against an input vector, summed into acc. */
static __device__ __forceinline__ void kcu_gemv_mma_step(float *acc, const uint32_t *a0,
                                                         const uint32_t *a1, uint4 x,
                                                         const int bf16) {
  kcu_mma(acc, a0, x.x, x.y, bf16);
  kcu_mma(acc, a1, x.z, x.w, bf16);
}

/* Two to 8 (nt = 1) or 16 (nt = 2) rows of f16 or bf16, a column of 16 weight rows a warp;
 * bf16 and nt are compile-time constants. Lane (g, t) of a column's slice loads, per 16-byte
 * vector c of K (c = t, t + 4, ... from the slice's start), weight rows g and g + 8 of the tile
 * and input rows g and g + 8 (zeros past M): as registers these are mma.sync's a and b
 * fragments for two k16 steps, with K permuted the same way for both, and the f32
 * accumulators end as acc[j][row][m] for rows g, g + 8 and m 8j + 2t, 8j + 2t + 1. */
static __device__ __forceinline__ void kcu_gemv_t16_body(const int bf16, const int nt,
                                                         const void *x, const void *w,
                                                         const void *bias, const void *res,
                                                         void *y, int M, int64_t N, int64_t K,
                                                         int act, int cols) {
  __shared__ float part[KCU_GEMV_WARPS * 16 * KCU_GEMV_MMA_MAX_ROWS];
  const int ms = 8 * nt; /* the m of part's rows */
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const kcu_gemv_span sp = kcu_gemv_mma_span(16, N, K, act, cols);
  const int64_t chunks = sp.chunks, c_begin = sp.c_begin, c_end = sp.c_end;
  int lo_ok = sp.n0 + g < N, hi_ok = sp.n0 + g + 8 < N;
  const uint4 *wlo = (const uint4 *)w + (sp.row0 + g) * chunks;
  const uint4 *whi = wlo + 8 * chunks;
  const uint4 *xv = (const uint4 *)x + (int64_t)g * chunks;
  float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
  uint4 lo[KCU_GEMV_UNROLL], hi[KCU_GEMV_UNROLL];
  kcu_gemv_mma_load_row(lo, wlo, lo_ok, c_begin + t, c_end);
  kcu_gemv_mma_load_row(hi, whi, hi_ok, c_begin + t, c_end);
  kcu_begin_early(); /* x is the kernel ahead's output: read only after the wait */
  if (nt == 1) {
    /* Up to 8 rows, the next trip's weight and input loads go out before this trip's
     * multiplies, so no load of a trip waits on the trip itself. For 16 rows that took 164
     * registers, one block a multiprocessor, and ran slower than the loop below. */
    uint4 xs[KCU_GEMV_UNROLL];
    kcu_gemv_mma_load_row(xs, xv, g < M, c_begin + t, c_end);
    for (int64_t c0 = c_begin + t; c0 - t < c_end; c0 += 4 * KCU_GEMV_UNROLL) {
      uint4 next_lo[KCU_GEMV_UNROLL], next_hi[KCU_GEMV_UNROLL], next_xs[KCU_GEMV_UNROLL];
      int64_t c1 = c0 + 4 * KCU_GEMV_UNROLL;
      kcu_gemv_mma_load_row(next_lo, wlo, lo_ok, c1, c_end);
      kcu_gemv_mma_load_row(next_hi, whi, hi_ok, c1, c_end);
      kcu_gemv_mma_load_row(next_xs, xv, g < M, c1, c_end);
#pragma unroll
      for (int u = 0; u < KCU_GEMV_UNROLL; u++) {
        /* rows g and g + 8 in the mma's two k halves */
        uint32_t a0[4] = {lo[u].x, hi[u].x, lo[u].y, hi[u].y};
        uint32_t a1[4] = {lo[u].z, hi[u].z, lo[u].w, hi[u].w};
        kcu_gemv_mma_step(acc[0], a0, a1, xs[u], bf16);
        xs[u] = next_xs[u], lo[u] = next_lo[u], hi[u] = next_hi[u];
      }
    }
  } else {
    for (int64_t c0 = c_begin + t; c0 - t < c_end; c0 += 4 * KCU_GEMV_UNROLL) {
      if (c0 != c_begin + t) {
        kcu_gemv_mma_load_row(lo, wlo, lo_ok, c0, c_end);
        kcu_gemv_mma_load_row(hi, whi, hi_ok, c0, c_end);
      }
#pragma unroll
      for (int u = 0; u < KCU_GEMV_UNROLL; u++) {
        uint32_t a0[4] = {lo[u].x, hi[u].x, lo[u].y, hi[u].y};
        uint32_t a1[4] = {lo[u].z, hi[u].z, lo[u].w, hi[u].w};
        int64_t c = c0 + 4 * u;
#pragma unroll
        for (int j = 0; j < nt; j++) {
          uint4 xj = g + 8 * j < M && c < c_end ? __ldg(xv + 8 * j * chunks + c)
                                                : make_uint4(0, 0, 0, 0);
          kcu_gemv_mma_step(acc[j], a0, a1, xj, bf16);
        }
      }
    }
  }
  /* The mma summed over the warp's K across its lanes: each lane holds whole sums. */
  float *mine = part + warp * 16 * ms;
#pragma unroll
  for (int j = 0; j < nt; j++) {
    mine[g * ms + 8 * j + 2 * t] = acc[j][0];
    mine[g * ms + 8 * j + 2 * t + 1] = acc[j][1];
    mine[(g + 8) * ms + 8 * j + 2 * t] = acc[j][2];
    mine[(g + 8) * ms + 8 * j + 2 * t + 1] = acc[j][3];
  }
  __syncthreads();
  kcu_gemv_epilogue(bf16 ? KILN_BF16 : KILN_F16, part, 16, ms, bias, res, y, M, N, act, cols);
}

/* Two to 8 rows of f16 or bf16, a column of 8 weight rows a warp (a narrow layer then has
 * twice the warps of tiles of 16 to spread over K): the roles swap, the weight tile is the
 * mma's n and the input rows its m (rows 8 to 15 zero). Lane (g, t) loads, per vector c as
 * above, weight row g and input row g; acc ends as out[m g][rows 2t, 2t + 1]. */
static __device__ __forceinline__ void kcu_gemv_t8_body(const int bf16, const void *x,
                                                        const void *w, const void *bias,
                                                        const void *res, void *y, int M,
                                                        int64_t N, int64_t K, int act,
                                                        int cols) {
  __shared__ float part[KCU_GEMV_WARPS * 8 * 8];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const kcu_gemv_span sp = kcu_gemv_mma_span(8, N, K, act, cols);
  const int64_t c_begin = sp.c_begin, c_end = sp.c_end;
  const int w_ok = sp.n0 + g < N, x_ok = g < M;
  const uint4 *wrow = (const uint4 *)w + (sp.row0 + g) * sp.chunks;
  const uint4 *xrow = (const uint4 *)x + (int64_t)g * sp.chunks;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  uint4 wv[KCU_GEMV_UNROLL], xs[KCU_GEMV_UNROLL];
  kcu_gemv_mma_load_row(wv, wrow, w_ok, c_begin + t, c_end);
  kcu_begin_early(); /* x is the kernel ahead's output: read only after the wait */
  kcu_gemv_mma_load_row(xs, xrow, x_ok, c_begin + t, c_end);
  for (int64_t c0 = c_begin + t; c0 - t < c_end; c0 += 4 * KCU_GEMV_UNROLL) {
    uint4 next_w[KCU_GEMV_UNROLL], next_x[KCU_GEMV_UNROLL];
    int64_t c1 = c0 + 4 * KCU_GEMV_UNROLL;
    kcu_gemv_mma_load_row(next_w, wrow, w_ok, c1, c_end);
    kcu_gemv_mma_load_row(next_x, xrow, x_ok, c1, c_end);
#pragma unroll
    for (int u = 0; u < KCU_GEMV_UNROLL; u++) {
      /* input row g in the mma's two k halves, rows g + 8 zero */
      uint32_t a0[4] = {xs[u].x, 0u, xs[u].y, 0u}, a1[4] = {xs[u].z, 0u, xs[u].w, 0u};
      kcu_gemv_mma_step(acc, a0, a1, wv[u], bf16);
      wv[u] = next_w[u], xs[u] = next_x[u];
    }
  }
  float *mine = part + warp * 8 * 8;
  mine[(2 * t) * 8 + g] = acc[0];
  mine[(2 * t + 1) * 8 + g] = acc[1];
  __syncthreads();
  kcu_gemv_epilogue(bf16 ? KILN_BF16 : KILN_F16, part, 8, 8, bias, res, y, M, N, act, cols);
}

#define KCU_GEMV_T8_KERNEL(name, bf16)                                                         \
  __global__ void __launch_bounds__(KCU_GEMV_WARPS * 32)                                       \
      name(const void *x, const void *w, const void *bias, const void *res, void *y, int M,    \
           int64_t N, int64_t K, int act, int cols, kcu_gemv_norm nrm) {                       \
    kcu_gemv_t8_body(bf16, x, w, bias, res, y, M, N, K, act, cols);                            \
  }
KCU_GEMV_T8_KERNEL(kcu_gemv_t8_f16, 0)
KCU_GEMV_T8_KERNEL(kcu_gemv_t8_bf16, 1)

#define KCU_GEMV_T16_KERNEL(name, bf16, nt)                                                    \
  __global__ void __launch_bounds__(KCU_GEMV_WARPS * 32)                                       \
      name(const void *x, const void *w, const void *bias, const void *res, void *y, int M,    \
           int64_t N, int64_t K, int act, int cols, kcu_gemv_norm nrm) {                       \
    kcu_gemv_t16_body(bf16, nt, x, w, bias, res, y, M, N, K, act, cols);                       \
  }
KCU_GEMV_T16_KERNEL(kcu_gemv_t16_m8_f16, 0, 1)
KCU_GEMV_T16_KERNEL(kcu_gemv_t16_m8_bf16, 1, 1)
KCU_GEMV_T16_KERNEL(kcu_gemv_t16_m16_f16, 0, 2)
KCU_GEMV_T16_KERNEL(kcu_gemv_t16_m16_bf16, 1, 2)

#define KCU_GEMV_KERNEL(name, dt, rows, norm)                                                  \
  __global__ void __launch_bounds__(KCU_GEMV_WARPS * 32)                                       \
      name(const void *x, const void *w, const void *bias, const void *res, void *y, int M,    \
           int64_t N, int64_t K, int act, int cols, kcu_gemv_norm nrm) {                       \
    kcu_gemv_body(dt, rows, norm, x, w, bias, res, y, M, N, K, act, cols, &nrm);               \
  }
KCU_GEMV_KERNEL(kcu_gemv_f32, KILN_F32, KCU_GEMV_MAX_ROWS, 0)
KCU_GEMV_KERNEL(kcu_gemv_f32_row, KILN_F32, 1, 0)
KCU_GEMV_KERNEL(kcu_gemv_f16_row, KILN_F16, 1, 0)
KCU_GEMV_KERNEL(kcu_gemv_bf16_row, KILN_BF16, 1, 0)
KCU_GEMV_KERNEL(kcu_gemv_f16_row_norm, KILN_F16, 1, 1)
KCU_GEMV_KERNEL(kcu_gemv_bf16_row_norm, KILN_BF16, 1, 1)

int kcu_gemv_tile(int64_t N, int64_t M, kiln_dtype dt, int spread) {
  if (!kcu_gemv_tensor_cores(M, dt)) return 1;
  /* tiles of 8 only where tiles of 16, K split the most ways, still give fewer warps than the
   * spread aims at: a tile of 8 loads half the weight bytes an input vector serves */
  int64_t most_warps = (N + 15) / 16 * KCU_GEMV_WARPS;
  return M <= 8 && most_warps < ((int64_t)KCU_GEMV_BASE_WARPS << spread) ? 8 : 16;
}

int kcu_gemv_columns(int64_t N, int64_t M, kiln_dtype dt, int spread) {
  int64_t target = (int64_t)KCU_GEMV_BASE_WARPS << spread;
  int tile = kcu_gemv_tile(N, M, dt, spread);
  int64_t units = (N + tile - 1) / tile;
  int cols = KCU_GEMV_WARPS;
  while (cols > 1 && units * (KCU_GEMV_WARPS / cols) < target) cols /= 2;
  return cols;
}

cudaError_t kcu_gemv(cudaStream_t s, const void *x, const void *w, const void *bias,
                     const void *residual, void *y, kiln_dtype dt, int64_t M, int64_t N,
                     int64_t K, kiln_activation act, int w_fixed, int spread,
                     const kcu_gemv_norm *norm) {
  if (N == 0) return cudaSuccess;
  if (spread < 0 || spread >= KCU_GEMV_SPREADS) return cudaErrorInvalidValue;
  /* a norm of the input row (the norm kernels), or of the output row (after: the row kernels) */
  const int after = norm && norm->out;
  if (norm && !kcu_gemv_norm_fits(M, after ? N : K, dt)) return cudaErrorInvalidValue;
  if (after && (N % 8 || !norm->arrivals)) return cudaErrorInvalidValue;
  int glu = act == KILN_ACT_SWIGLU, tile = kcu_gemv_tile(glu ? 2 * N : N, M, dt, spread);
  int cols = kcu_gemv_columns(glu ? 2 * N : N, M, dt, spread);
  if (glu && cols < 2) cols = 2; /* a gate and an up column per output */
  int64_t outs = (glu ? cols / 2 : cols) * tile;
  unsigned blocks = (unsigned)((N + outs - 1) / outs);
  void (*kernel)(const void *, const void *, const void *, const void *, void *, int, int64_t,
                 int64_t, int, int, kcu_gemv_norm) =
      norm && !after ? (dt == KILN_F16 ? kcu_gemv_f16_row_norm : kcu_gemv_bf16_row_norm)
      : tile == 8  ? (dt == KILN_F16 ? kcu_gemv_t8_f16 : kcu_gemv_t8_bf16)
      : tile == 16 ? (M <= 8 ? (dt == KILN_F16 ? kcu_gemv_t16_m8_f16 : kcu_gemv_t16_m8_bf16)
                             : (dt == KILN_F16 ? kcu_gemv_t16_m16_f16 : kcu_gemv_t16_m16_bf16))
      : M == 1     ? (dt == KILN_F32   ? kcu_gemv_f32_row
                      : dt == KILN_F16 ? kcu_gemv_f16_row
                                       : kcu_gemv_bf16_row)
                   : kcu_gemv_f32;
  const kcu_gemv_norm none = {NULL, NULL, 0.0f, 0, NULL, NULL};
  cudaLaunchAttribute attr;
  size_t smem = norm && !after ? (size_t)K * kiln_dtype_size(dt) : 0; /* the normalized row */
  cudaLaunchConfig_t c = kcu_launch_config(blocks, KCU_GEMV_WARPS * 32, smem, s, w_fixed, &attr);
  return cudaLaunchKernelEx(&c, kernel, x, w, bias, residual, y, (int)M, N, K, (int)act, cols,
                            norm ? *norm : none);
}

int kcu_gemv_norm_one_wave(int64_t N, int64_t K, kiln_dtype dt, kiln_activation act, int spread) {
  int glu = act == KILN_ACT_SWIGLU, cols = kcu_gemv_columns(glu ? 2 * N : N, 1, dt, spread);
  if (glu && cols < 2) cols = 2;
  int64_t blocks = (N + (glu ? cols / 2 : cols) - 1) / (glu ? cols / 2 : cols);
  int device = 0, sms = 0, per_sm = 0;
  int ok = kcu_gemv_norm_fits(1, K, dt) && cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
           cudaOccupancyMaxActiveBlocksPerMultiprocessor(
               &per_sm, dt == KILN_F16 ? kcu_gemv_f16_row_norm : kcu_gemv_bf16_row_norm,
               KCU_GEMV_WARPS * 32, (size_t)K * kiln_dtype_size(dt)) == cudaSuccess;
  cudaGetLastError();
  return ok && blocks <= (int64_t)per_sm * sms;
}
