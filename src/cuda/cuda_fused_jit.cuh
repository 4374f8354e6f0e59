/* Device helpers of the FUSED kernels the library compiles at load (cuda_fused_jit.c): only NVRTC
 * compiles this text, after cuda_op_math.cuh and the definitions the generator writes ahead of
 * it (the KILN_* names, the index type kfx_i). No header is included: NVRTC has none built in, so
 * f16 and bf16 convert by the same PTX instructions cuda_fp16.h's and cuda_bf16.h's round-to-
 * nearest conversions use. Each helper does for one run of V elements what the interpreting
 * kernel (cuda_fused_group.cu) does, with the dtypes, strides and boxes as constants. */
#ifndef KILN_CUDA_FUSED_JIT_CUH
#define KILN_CUDA_FUSED_JIT_CUH

struct kfx_io {
  const void *in[KILN_MAX_OP_INPUTS];
  void *out;
};

static __device__ __forceinline__ float kfx_f16_to_f32(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
static __device__ __forceinline__ unsigned short kfx_f32_to_f16(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
static __device__ __forceinline__ float kfx_bf16_to_f32(unsigned short h) {
  return __uint_as_float((unsigned)h << 16);
}
static __device__ __forceinline__ unsigned short kfx_f32_to_bf16(float f) {
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

/* v rounded to dtype DT and back: what an unfused op's store and reload would give. */
template <int DT> static __device__ __forceinline__ float kfx_round(float v) {
  return DT == KILN_F16 ? kfx_f16_to_f32(kfx_f32_to_f16(v)) : kfx_bf16_to_f32(kfx_f32_to_bf16(v));
}

/* An element as a float: an integer or bool input converts as a cast to f32 does. */
template <int DT> static __device__ __forceinline__ float kfx_ld1(const void *p, long long i) {
  if (DT == KILN_F32) return ((const float *)p)[i];
  if (DT == KILN_I64) return (float)((const long long *)p)[i];
  if (DT == KILN_I32) return (float)((const int *)p)[i];
  if (DT == KILN_BOOL) return ((const unsigned char *)p)[i] ? 1.0f : 0.0f;
  unsigned short h = ((const unsigned short *)p)[i];
  return DT == KILN_F16 ? kfx_f16_to_f32(h) : kfx_bf16_to_f32(h);
}

/* Two halves of a 32-bit word as floats. */
template <int DT> static __device__ __forceinline__ void kfx_pair(unsigned w, float *v) {
  v[0] = DT == KILN_F16 ? kfx_f16_to_f32((unsigned short)w) : kfx_bf16_to_f32((unsigned short)w);
  v[1] = DT == KILN_F16 ? kfx_f16_to_f32((unsigned short)(w >> 16))
                        : kfx_bf16_to_f32((unsigned short)(w >> 16));
}

/* A run of V elements loads as 16-byte vectors: V = 8 of f16 or bf16, V a multiple of 4 of f32
 * (an integer or bool input loads element by element). */
template <int V, int DT> struct kfx_vec {
  enum { ok = DT == KILN_F32 ? V % 4 == 0 : (DT == KILN_F16 || DT == KILN_BF16) && V == 8 };
};

/* v[k] = element at + k * s of src for every k of the run (every address inside the box). */
template <int V, int DT>
static __device__ __forceinline__ void kfx_gather(const void *src, kfx_i at, kfx_i s, float *v) {
  if (s == 0) { /* broadcast along the innermost dim: one load */
    float x = kfx_ld1<DT>(src, (long long)at);
#pragma unroll
    for (int k = 0; k < V; k++) v[k] = x;
    return;
  }
  const char *addr = (const char *)src + (long long)at * (DT == KILN_F32 ? 4 : 2);
  if (kfx_vec<V, DT>::ok && s == 1 && ((unsigned long long)addr & 15u) == 0) {
#pragma unroll
    for (int q = 0; q < (DT == KILN_F32 ? V / 4 : 1); q++) {
      uint4 raw = ((const uint4 *)addr)[q];
      if (DT == KILN_F32) {
        v[4 * q] = __uint_as_float(raw.x), v[4 * q + 1] = __uint_as_float(raw.y);
        v[4 * q + 2] = __uint_as_float(raw.z), v[4 * q + 3] = __uint_as_float(raw.w);
      } else {
        kfx_pair<DT>(raw.x, v), kfx_pair<DT>(raw.y, v + 2);
        kfx_pair<DT>(raw.z, v + 4), kfx_pair<DT>(raw.w, v + 6);
      }
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < V; k++) v[k] = kfx_ld1<DT>(src, (long long)(kfx_i)(at + (kfx_i)k * s));
}

/* A LOAD whose box covers the innermost dim: zero outside the outer box (inside: the generator's
 * test of the outer coordinates), else the run gathered from at + c0 * s. */
template <int V, int DT>
static __device__ __forceinline__ void kfx_load_inner(const void *src, bool inside, kfx_i at,
                                                      kfx_i c0, kfx_i s, float *v) {
#pragma unroll
  for (int k = 0; k < V; k++) v[k] = 0.0f;
  if (inside) kfx_gather<V, DT>(src, (kfx_i)(at + c0 * s), s, v);
}

/* A LOAD whose box cuts the innermost dim to [lo, hi): only the run's elements inside load. */
template <int V, int DT>
static __device__ __forceinline__ void kfx_load_cut(const void *src, bool inside, kfx_i at,
                                                    kfx_i c0, kfx_i s, kfx_i lo, kfx_i hi,
                                                    float *v) {
#pragma unroll
  for (int k = 0; k < V; k++) v[k] = 0.0f;
  if (!inside) return;
  kfx_i first = c0 > lo ? c0 : lo, last = c0 + V < hi ? c0 + V : hi;
  if (first >= last) return;
  at += first * s;
  if (first == c0 && last == c0 + V) {
    kfx_gather<V, DT>(src, at, s, v);
    return;
  }
#pragma unroll
  for (int k = 0; k < V; k++)
    if (c0 + k >= first && c0 + k < last)
      v[k] = kfx_ld1<DT>(src, (long long)(kfx_i)(at + (c0 + k - first) * s));
}

/* The run's V values to out from element i0, as one 16-byte vector where aligned. */
template <int V, int DT>
static __device__ __forceinline__ void kfx_store(void *out, long long i0, const float *v) {
  if ((DT == KILN_F32 ? V == 4 : V == 8) && ((unsigned long long)out & 15u) == 0) {
    uint4 raw;
    if (DT == KILN_F32) {
      raw.x = __float_as_uint(v[0]), raw.y = __float_as_uint(v[1 % V]);
      raw.z = __float_as_uint(v[2 % V]), raw.w = __float_as_uint(v[3 % V]);
    } else {
      unsigned w[4];
#pragma unroll
      for (int q = 0; q < 4; q++) {
        unsigned short lo = DT == KILN_F16 ? kfx_f32_to_f16(v[(2 * q) % V])
                                           : kfx_f32_to_bf16(v[(2 * q) % V]);
        unsigned short hi = DT == KILN_F16 ? kfx_f32_to_f16(v[(2 * q + 1) % V])
                                           : kfx_f32_to_bf16(v[(2 * q + 1) % V]);
        w[q] = (unsigned)lo | (unsigned)hi << 16;
      }
      raw.x = w[0], raw.y = w[1], raw.z = w[2], raw.w = w[3];
    }
    ((uint4 *)out)[i0 / V] = raw;
    return;
  }
#pragma unroll
  for (int k = 0; k < V; k++) {
    if (DT == KILN_F32)
      ((float *)out)[i0 + k] = v[k];
    else
      ((unsigned short *)out)[i0 + k] =
          DT == KILN_F16 ? kfx_f32_to_f16(v[k]) : kfx_f32_to_bf16(v[k]);
  }
}

/* Early launch (cuda_early_launch.c): wait for the kernels ahead, then let the next one launch. */
static __device__ __forceinline__ void kfx_begin_early(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#endif
