/* Device helpers shared by the kernels: loads and stores by dtype (f16/bf16 compute in f32),
 * index decomposition for broadcasting, launch sizing and block reductions. */
#ifndef KILN_CUDA_DEVICE_CUH
#define KILN_CUDA_DEVICE_CUH

#include "cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#define KCU_BLOCK 256

static __device__ __forceinline__ float kcu_ld(const void *p, int dt, int64_t i) {
  switch (dt) {
  case KILN_F32: return ((const float *)p)[i];
  case KILN_F16: return __half2float(((const __half *)p)[i]);
  case KILN_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  case KILN_I64: return (float)((const long long *)p)[i];
  case KILN_I32: return (float)((const int *)p)[i];
  default: return ((const unsigned char *)p)[i] ? 1.0f : 0.0f;
  }
}

static __device__ __forceinline__ long long kcu_ldi(const void *p, int dt, int64_t i) {
  switch (dt) {
  case KILN_I64: return ((const long long *)p)[i];
  case KILN_I32: return ((const int *)p)[i];
  case KILN_BOOL: return ((const unsigned char *)p)[i] ? 1 : 0;
  default: return (long long)kcu_ld(p, dt, i);
  }
}

static __device__ __forceinline__ void kcu_st(void *p, int dt, int64_t i, float v) {
  switch (dt) {
  case KILN_F32: ((float *)p)[i] = v; break;
  case KILN_F16: ((__half *)p)[i] = __float2half_rn(v); break;
  case KILN_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
  case KILN_I64: ((long long *)p)[i] = (long long)v; break;
  case KILN_I32: ((int *)p)[i] = (int)v; break;
  default: ((unsigned char *)p)[i] = v != 0.0f; break;
  }
}

static __device__ __forceinline__ void kcu_sti(void *p, int dt, int64_t i, long long v) {
  switch (dt) {
  case KILN_I64: ((long long *)p)[i] = v; break;
  case KILN_I32: ((int *)p)[i] = (int)v; break;
  case KILN_BOOL: ((unsigned char *)p)[i] = v != 0; break;
  default: kcu_st(p, dt, i, (float)v); break;
  }
}

static __device__ __forceinline__ int kcu_is_int(int dt) {
  return dt == KILN_I64 || dt == KILN_I32 || dt == KILN_BOOL;
}

/* Up to three operands broadcast against one output shape, passed by value. */
typedef struct kcu_bcast {
  int32_t rank;
  int64_t dims[KILN_MAX_RANK];
  int64_t st[3][KILN_MAX_RANK];
} kcu_bcast;

/* The broadcast of n (<= 3) operands against out's shape (host; cuda_elementwise.cu). */
kcu_bcast kcu_make_bcast(const kcu_tensor *out, const kcu_tensor *const *ops, int n);

static __device__ __forceinline__ void kcu_offsets(const kcu_bcast *g, int64_t i, int n,
                                                   int64_t *off) {
  for (int k = 0; k < n; k++) off[k] = 0;
  for (int d = g->rank - 1; d >= 0; d--) {
    int64_t c = i % g->dims[d];
    i /= g->dims[d];
    for (int k = 0; k < n; k++) off[k] += c * g->st[k][d];
  }
}

/* Early launch (cuda_early_launch.c). A kernel launched early begins with kcu_begin_early:
 * it waits there until the kernels ahead of it have ended and their writes are visible (at once
 * for a kernel launched as usual), then lets the kernel after it launch early. Before the wait
 * it may read only what no kernel writes (weights) and write nothing. */
static __device__ __forceinline__ void kcu_begin_early(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The wait alone: the kernel after this one launches only once this one has ended. For a kernel
 * whose successor may be a library's that reads its inputs before it waits (cuDNN's fused
 * convolutions so read their residual: on the H200 a residual written by a kernel that let the
 * convolution launch early was read stale). */
static __device__ __forceinline__ void kcu_wait_early(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Launches kernel k early where the device allows, as k<<<grid, block, smem, s>>>(args...)
 * would launch it otherwise; every kernel of the engine is launched so, and begins with
 * kcu_begin_early or kcu_wait_early. */
template <typename... P, typename... A>
static cudaError_t kcu_launch_early(void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                                    cudaStream_t s, A... args) {
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t c = kcu_launch_config(grid, block, smem, s, 1, &attr);
  return cudaLaunchKernelEx(&c, k, args...);
}

#include "cuda_op_math.cuh"

/* c[16x8] += a[16x16] b[16x8] on the tensor cores (mma.sync m16n8k16), f32 accumulators; bf16
 * is a compile-time constant. A lane (g = lane / 4, t = lane % 4) holds a[g][2t..2t+1],
 * a[g+8][2t..], a[g][2t+8..], a[g+8][2t+8..]; b[2t..2t+1][g], b[2t+8..2t+9][g]; c[g][2t..2t+1],
 * c[g+8][2t..2t+1]. */
static __device__ __forceinline__ void kcu_mma(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1, const int bf16) {
  if (bf16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Unpacks 16 bytes of dtype dt held in a register into 4 (f32) or 8 floats. */
static __device__ __forceinline__ void kcu_unpack16(uint4 raw, int dt, float *f) {
  unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 4; k++) {
    if (dt == KILN_F32) {
      f[k] = __uint_as_float(w[k]);
    } else if (dt == KILN_F16) {
      float2 t = __half22float2(*(const __half2 *)&w[k]);
      f[2 * k] = t.x;
      f[2 * k + 1] = t.y;
    } else {
      float2 t = __bfloat1622float2(*(const __nv_bfloat162 *)&w[k]);
      f[2 * k] = t.x;
      f[2 * k + 1] = t.y;
    }
  }
}

/* Loads up to 8 floats from 16 bytes of dtype dt (vector v of p). */
static __device__ __forceinline__ int kcu_ld16(const void *p, int dt, int64_t v, float *f) {
  kcu_unpack16(((const uint4 *)p)[v], dt, f);
  return dt == KILN_F32 ? 4 : 8;
}

static __device__ __forceinline__ void kcu_st16(void *p, int dt, int64_t v, const float *f) {
  uint4 raw;
  if (dt == KILN_F32) {
    raw.x = __float_as_uint(f[0]); raw.y = __float_as_uint(f[1]);
    raw.z = __float_as_uint(f[2]); raw.w = __float_as_uint(f[3]);
  } else {
    unsigned w[4];
    for (int k = 0; k < 4; k++) {
      if (dt == KILN_F16) {
        __half2 h = __floats2half2_rn(f[2 * k], f[2 * k + 1]);
        w[k] = *(unsigned *)&h;
      } else {
        __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
        w[k] = *(unsigned *)&h;
      }
    }
    raw.x = w[0]; raw.y = w[1]; raw.z = w[2]; raw.w = w[3];
  }
  ((uint4 *)p)[v] = raw;
}

/* v elements at element e of a tensor of dtype dt: one scalar (v = 1), or the 16-byte vector
 * e / v (v = 4 for f32, 8 for f16 and bf16). */
static __device__ __forceinline__ void kcu_ldv(const void *p, int dt, int64_t e, int v, float *f) {
  if (v == 1) f[0] = kcu_ld(p, dt, e);
  else kcu_ld16(p, dt, e / v, f);
}

static __device__ __forceinline__ void kcu_stv(void *p, int dt, int64_t e, int v, const float *f) {
  if (v == 1) kcu_st(p, dt, e, f[0]);
  else kcu_st16(p, dt, e / v, f);
}

static inline unsigned kcu_grid(int64_t n, int per_thread) {
  int64_t blocks = (n + (int64_t)KCU_BLOCK * per_thread - 1) / ((int64_t)KCU_BLOCK * per_thread);
  if (blocks < 1) blocks = 1;
  return blocks > 65535LL * 16 ? 65535u * 16 : (unsigned)blocks;
}

static __device__ __forceinline__ float kcu_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
static __device__ __forceinline__ float kcu_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Block-wide sum or max for blockDim.x a multiple of 32 (<= 1024); every thread gets it. */
static __device__ __forceinline__ float kcu_block_reduce(float v, int is_max, float *scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = is_max ? kcu_warp_max(v) : kcu_warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : (is_max ? -INFINITY : 0.0f);
  v = is_max ? kcu_warp_max(v) : kcu_warp_sum(v);
  return v;
}

/* Element offsets of an SDPA's operands for flattened batch index b. */
static __device__ __forceinline__ void kcu_attn_offsets(const kcu_attn_geometry *g, int64_t b,
                                                        int64_t *qo, int64_t *ko, int64_t *vo,
                                                        int64_t *mo, int64_t *oo) {
  /* 32-bit division: a batch index and every batch dim are under 2^31 (grid limits), and a
   * 64-bit division costs a kernel tens of instructions more */
  uint32_t rest = (uint32_t)b;
  *qo = *ko = *vo = *mo = *oo = 0;
  for (int d = g->nb - 1; d >= 0; d--) {
    int64_t c = rest % (uint32_t)g->bdims[d];
    rest /= (uint32_t)g->bdims[d];
    *qo += c * g->qb[d];
    *ko += c / g->kv_group[d] * g->kb[d];
    *vo += c / g->kv_group[d] * g->vb[d];
    *mo += c * g->mb[d];
    *oo += c * g->ob[d];
  }
}

#endif
