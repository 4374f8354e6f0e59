/* SUM, MEAN and AMAX over a set of dims: one warp per output element when the reduction is
 * long, one thread per output otherwise. Floats accumulate in f32, integers in 64 bits.
 * ARGMAX along one dim the same way, keeping the first largest and ranking NaN highest. */
#include "cuda_device.cuh"

typedef struct kcu_reduce_geom {
  int32_t nk, nr;
  int64_t kdims[KILN_MAX_RANK], kstr[KILN_MAX_RANK];
  int64_t rdims[KILN_MAX_RANK], rstr[KILN_MAX_RANK];
  int64_t rcount;
  int trailing; /* reduced dims are the trailing ones: their offsets are contiguous */
} kcu_reduce_geom;

static __device__ __forceinline__ int64_t kcu_decompose(int64_t i, int n, const int64_t *dims,
                                                        const int64_t *str) {
  int64_t off = 0;
  for (int d = n - 1; d >= 0; d--) {
    off += (i % dims[d]) * str[d];
    i /= dims[d];
  }
  return off;
}

static __device__ __forceinline__ float kcu_fold(int op, float acc, float v) {
  return op == KILN_OP_AMAX ? ((v > acc || v != v) ? v : acc) : acc + v;
}

/* Each group of `lanes` threads (1 or 32) reduces one output element. */
__global__ void kcu_reduce_kernel(kcu_reduce_geom g, int op, const void *x, int dx, void *out,
                                  int dout, int64_t n_out, int lanes) {
  kcu_begin_early();
  int64_t gid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / lanes;
  int lane = (int)(threadIdx.x % lanes);
  int64_t groups = (int64_t)gridDim.x * blockDim.x / lanes;
  for (int64_t o = gid; o < n_out; o += groups) {
    int64_t base = kcu_decompose(o, g.nk, g.kdims, g.kstr);
    if (kcu_is_int(dout)) {
      long long acc = op == KILN_OP_AMAX ? LLONG_MIN : 0;
      for (int64_t r = lane; r < g.rcount; r += lanes) {
        int64_t off = base + (g.trailing ? r : kcu_decompose(r, g.nr, g.rdims, g.rstr));
        long long v = kcu_ldi(x, dx, off);
        acc = op == KILN_OP_AMAX ? (v > acc ? v : acc) : acc + v;
      }
      for (int s = lanes / 2; s > 0; s >>= 1) {
        long long t = __shfl_xor_sync(0xffffffffu, acc, s);
        acc = op == KILN_OP_AMAX ? (t > acc ? t : acc) : acc + t;
      }
      if (lane == 0) kcu_sti(out, dout, o, acc);
    } else {
      float acc = op == KILN_OP_AMAX ? -INFINITY : 0.0f;
      for (int64_t r = lane; r < g.rcount; r += lanes) {
        int64_t off = base + (g.trailing ? r : kcu_decompose(r, g.nr, g.rdims, g.rstr));
        acc = kcu_fold(op, acc, kcu_ld(x, dx, off));
      }
      for (int s = lanes / 2; s > 0; s >>= 1)
        acc = kcu_fold(op, acc, __shfl_xor_sync(0xffffffffu, acc, s));
      if (op == KILN_OP_MEAN) acc /= (float)g.rcount;
      if (lane == 0) kcu_st(out, dout, o, acc);
    }
  }
}

/* One block of KCU_REDUCE_THREADS per output element: for few outputs over long reductions
 * (a mean of a whole tensor), where a warp each would leave the device idle. */
#define KCU_REDUCE_THREADS 1024
__global__ void kcu_reduce_block(kcu_reduce_geom g, int op, const void *x, int dx, void *out,
                                 int dout) {
  kcu_begin_early();
  __shared__ long long iscratch[32];
  __shared__ float fscratch[32];
  int64_t o = blockIdx.x;
  int64_t base = kcu_decompose(o, g.nk, g.kdims, g.kstr);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (kcu_is_int(dout)) {
    long long acc = op == KILN_OP_AMAX ? LLONG_MIN : 0;
    for (int64_t r = threadIdx.x; r < g.rcount; r += blockDim.x) {
      long long v = kcu_ldi(x, dx, base + (g.trailing ? r : kcu_decompose(r, g.nr, g.rdims, g.rstr)));
      acc = op == KILN_OP_AMAX ? (v > acc ? v : acc) : acc + v;
    }
    for (int s = 16; s > 0; s >>= 1) {
      long long t = __shfl_xor_sync(0xffffffffu, acc, s);
      acc = op == KILN_OP_AMAX ? (t > acc ? t : acc) : acc + t;
    }
    if (lane == 0) iscratch[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < (int)(blockDim.x >> 5); w++)
        acc = op == KILN_OP_AMAX ? (iscratch[w] > acc ? iscratch[w] : acc) : acc + iscratch[w];
      kcu_sti(out, dout, o, acc);
    }
    return;
  }
  float acc = op == KILN_OP_AMAX ? -INFINITY : 0.0f;
  for (int64_t r = threadIdx.x; r < g.rcount; r += blockDim.x)
    acc = kcu_fold(op, acc, kcu_ld(x, dx, base + (g.trailing ? r : kcu_decompose(r, g.nr, g.rdims, g.rstr))));
  for (int s = 16; s > 0; s >>= 1) acc = kcu_fold(op, acc, __shfl_xor_sync(0xffffffffu, acc, s));
  if (lane == 0) fscratch[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) acc = kcu_fold(op, acc, fscratch[w]);
    if (op == KILN_OP_MEAN) acc /= (float)g.rcount;
    kcu_st(out, dout, o, acc);
  }
}

cudaError_t kcu_reduce(cudaStream_t s, kiln_op_kind kind, const kcu_tensor *x,
                       const kcu_tensor *out, uint32_t mask) {
  if (out->numel == 0) return cudaSuccess;
  kcu_reduce_geom g;
  memset(&g, 0, sizeof g);
  int64_t str[KILN_MAX_RANK];
  kcu_strides(x, str);
  g.rcount = 1;
  int first_reduced = x->rank;
  for (int d = 0; d < x->rank; d++) {
    if (mask & (1u << d)) {
      g.rdims[g.nr] = x->dims[d];
      g.rstr[g.nr++] = str[d];
      g.rcount *= x->dims[d];
      if (first_reduced == x->rank) first_reduced = d;
    } else {
      g.kdims[g.nk] = x->dims[d];
      g.kstr[g.nk++] = str[d];
    }
  }
  g.trailing = g.nr == x->rank - first_reduced;
  if (out->numel <= 4096 && g.rcount >= 8192) {
    kcu_launch_early(kcu_reduce_block, (unsigned)out->numel, KCU_REDUCE_THREADS, 0, s, g, kind,
                     x->data, x->dtype, out->data, out->dtype);
    return cudaGetLastError();
  }
  int lanes = g.rcount >= 32 ? 32 : 1;
  kcu_launch_early(kcu_reduce_kernel, kcu_grid(out->numel * lanes, 1), KCU_BLOCK, 0, s,
      g, kind, x->data, x->dtype, out->data, out->dtype, out->numel, lanes);
  return cudaGetLastError();
}

/* 1 when (v, j) replaces (best, at) as the argmax so far: larger, or equal and earlier; a NaN
 * beats every number and the earliest NaN wins. */
static __device__ __forceinline__ int kcu_argmax_takes(float v, long long j, float best,
                                                       long long at) {
  if (v != v) return best == best || j < at;
  if (best != best) return 0;
  return v > best || (v == best && j < at);
}

static __device__ __forceinline__ int kcu_argmax_takes_int(long long v, long long j,
                                                           long long best, long long at) {
  return v > best || (v == best && j < at);
}

/* x viewed as [outer, n, inner]; each group of `lanes` threads (1 or 32) finds one output. */
__global__ void kcu_argmax_kernel(const void *x, int dx, long long *out, int64_t n_out,
                                  int64_t n, int64_t inner, int lanes) {
  kcu_begin_early();
  int64_t gid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / lanes;
  int lane = (int)(threadIdx.x % lanes);
  int64_t groups = (int64_t)gridDim.x * blockDim.x / lanes;
  int integer = kcu_is_int(dx);
  for (int64_t o = gid; o < n_out; o += groups) {
    int64_t base = (o / inner) * n * inner + o % inner;
    long long at = LLONG_MAX;
    if (integer) {
      long long best = LLONG_MIN;
      for (int64_t j = lane; j < n; j += lanes) {
        long long v = kcu_ldi(x, dx, base + j * inner);
        if (kcu_argmax_takes_int(v, j, best, at)) best = v, at = j;
      }
      for (int s = lanes / 2; s > 0; s >>= 1) {
        long long v = __shfl_xor_sync(0xffffffffu, best, s), j = __shfl_xor_sync(0xffffffffu, at, s);
        if (kcu_argmax_takes_int(v, j, best, at)) best = v, at = j;
      }
    } else {
      float best = -INFINITY;
      for (int64_t j = lane; j < n; j += lanes) {
        float v = kcu_ld(x, dx, base + j * inner);
        if (kcu_argmax_takes(v, j, best, at)) best = v, at = j;
      }
      for (int s = lanes / 2; s > 0; s >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, best, s);
        long long j = __shfl_xor_sync(0xffffffffu, at, s);
        if (kcu_argmax_takes(v, j, best, at)) best = v, at = j;
      }
    }
    if (lane == 0) out[o] = at;
  }
}

/* The thread's share of a contiguous row of floats of dtype DT read by 16-byte vectors (the
 * dtype a constant, so the unrolled loads issue together), its first `done` elements. */
template <int DT>
static __device__ __forceinline__ void kcu_argmax_vectors(const void *x, int64_t base, int64_t n,
                                                         float *bf, long long *at,
                                                         int64_t *done) {
  const int per = DT == KILN_F32 ? 4 : 8;
  int64_t nv = n / per, v0 = base / per;
#pragma unroll 4
  for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
    float f[8];
    kcu_ld16(x, DT, v0 + v, f);
#pragma unroll
    for (int t = 0; t < per; t++)
      if (kcu_argmax_takes(f[t], v * per + t, *bf, *at)) *bf = f[t], *at = v * per + t;
  }
  *done = nv * per;
}

/* One block per output, for few outputs over long rows (greedy decoding's argmax over the
 * vocabulary): each warp reduces its share, then the first warp the warps' winners. A
 * contiguous, 16-byte aligned row of floats is read by vectors. */
__global__ void __launch_bounds__(KCU_REDUCE_THREADS)
    kcu_argmax_block(const void *x, int dx, long long *out, int64_t n, int64_t inner) {
  __shared__ float best_f[KCU_REDUCE_THREADS / 32];
  __shared__ long long best_i[KCU_REDUCE_THREADS / 32], best_at[KCU_REDUCE_THREADS / 32];
  kcu_begin_early();
  int64_t o = blockIdx.x, base = (o / inner) * n * inner + o % inner, j0 = 0;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int integer = kcu_is_int(dx);
  long long at = LLONG_MAX, bi = LLONG_MIN;
  float bf = -INFINITY;
  int size = dx == KILN_F32 ? 4 : 2;
  if (inner == 1 && !integer && ((uintptr_t)x + (uint64_t)base * size) % 16 == 0) {
    if (dx == KILN_F32) kcu_argmax_vectors<KILN_F32>(x, base, n, &bf, &at, &j0);
    else if (dx == KILN_F16) kcu_argmax_vectors<KILN_F16>(x, base, n, &bf, &at, &j0);
    else kcu_argmax_vectors<KILN_BF16>(x, base, n, &bf, &at, &j0);
  }
  for (int64_t j = j0 + threadIdx.x; j < n; j += blockDim.x) {
    if (integer) {
      long long v = kcu_ldi(x, dx, base + j * inner);
      if (kcu_argmax_takes_int(v, j, bi, at)) bi = v, at = j;
    } else {
      float v = kcu_ld(x, dx, base + j * inner);
      if (kcu_argmax_takes(v, j, bf, at)) bf = v, at = j;
    }
  }
  for (int round = 0; round < 2; round++) {
    for (int sh = 16; sh > 0; sh >>= 1) {
      long long j = __shfl_xor_sync(0xffffffffu, at, sh);
      if (integer) {
        long long v = __shfl_xor_sync(0xffffffffu, bi, sh);
        if (kcu_argmax_takes_int(v, j, bi, at)) bi = v, at = j;
      } else {
        float v = __shfl_xor_sync(0xffffffffu, bf, sh);
        if (kcu_argmax_takes(v, j, bf, at)) bf = v, at = j;
      }
    }
    if (round == 1) break;
    if (lane == 0) best_f[warp] = bf, best_i[warp] = bi, best_at[warp] = at;
    __syncthreads();
    if (warp != 0) return;
    int have = lane < nw;
    bf = have ? best_f[lane] : -INFINITY;
    bi = have ? best_i[lane] : LLONG_MIN;
    at = have ? best_at[lane] : LLONG_MAX;
  }
  if (threadIdx.x == 0) out[o] = at;
}

cudaError_t kcu_argmax(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *out, int32_t dim) {
  if (out->numel == 0) return cudaSuccess;
  int64_t inner = 1, n = x->dims[dim];
  for (int d = dim + 1; d < x->rank; d++) inner *= x->dims[d];
  if (out->numel <= 4096 && n >= 4096) {
    kcu_launch_early(kcu_argmax_block, (unsigned)out->numel, KCU_REDUCE_THREADS, 0, s,
        x->data, x->dtype, (long long *)out->data, n, inner);
    return cudaGetLastError();
  }
  int lanes = n >= 32 ? 32 : 1;
  kcu_launch_early(kcu_argmax_kernel, kcu_grid(out->numel * lanes, 1), KCU_BLOCK, 0, s,
      x->data, x->dtype, (long long *)out->data, out->numel, n, inner, lanes);
  return cudaGetLastError();
}
