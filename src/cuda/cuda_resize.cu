/* UPSAMPLE_NEAREST2D and UPSAMPLE_BILINEAR2D over a batch of [H,W,C] images (NCHW as C = 1):
 * one thread per output element, or per 16-byte vector of channels in channels_last. Source
 * indices and weights use the CPU engine's f32 operations in its order, each rounded (the _rn
 * intrinsics keep nvcc from contracting them into FMAs), so the same pixels are chosen. */
#include "cuda_device.cuh"

/* One resize op's geometry, by value: channels in cvec vectors of vec elements each. */
typedef struct kcu_resize_geom {
  int64_t batch, cvec, h, w, oh, ow;
  float ratio_h, ratio_w; /* source units per output unit, as the CPU engine computes them */
  int bilinear, align_corners, vec;
} kcu_resize_geom;

static __device__ __forceinline__ int64_t kcu_nearest(int64_t dst, int64_t in, int64_t out,
                                                      float ratio) {
  if (out == in) return dst;
  if (out == 2 * in) return dst >> 1;
  int64_t src = (int64_t)floorf(__fmul_rn((float)dst, ratio));
  return src < in - 1 ? src : in - 1;
}

/* The two taps of one output coordinate and the second one's weight. */
typedef struct kcu_tap {
  int64_t i0, i1;
  float lambda;
} kcu_tap;

static __device__ __forceinline__ kcu_tap kcu_linear(int64_t dst, int64_t in, float ratio,
                                                     int align_corners) {
  kcu_tap t;
  float real;
  if (align_corners) {
    real = __fmul_rn(ratio, (float)dst);
  } else {
    real = __fsub_rn(__fmul_rn(ratio, __fadd_rn((float)dst, 0.5f)), 0.5f);
    if (real < 0.0f) real = 0.0f;
  }
  t.i0 = (int64_t)floorf(real);
  if (t.i0 > in - 1) t.i0 = in - 1;
  t.lambda = __fsub_rn(real, (float)t.i0);
  t.lambda = t.lambda < 0.0f ? 0.0f : t.lambda > 1.0f ? 1.0f : t.lambda;
  t.i1 = t.i0 + (t.i0 < in - 1 ? 1 : 0);
  return t;
}

/* (1 - l) * a + l * b, rounded after each step as the CPU engine computes it. */
static __device__ __forceinline__ float kcu_lerp(float a, float b, float l) {
  return __fadd_rn(__fmul_rn(__fsub_rn(1.0f, l), a), __fmul_rn(l, b));
}

__global__ void kcu_resize_kernel(kcu_resize_geom g, const void *x, void *out, int dt, int64_t n) {
  kcu_begin_early();
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int V = g.vec;
  const int64_t C = g.cvec * V;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t c = (i % g.cvec) * V, pos = i / g.cvec;
    int64_t ow = pos % g.ow;
    pos /= g.ow;
    int64_t oh = pos % g.oh, b = pos / g.oh;
    const int64_t image = b * g.h * g.w * C + c;
    float r[8] = {0};
    if (!g.bilinear) {
      int64_t ih = kcu_nearest(oh, g.h, g.oh, g.ratio_h), iw = kcu_nearest(ow, g.w, g.ow, g.ratio_w);
      kcu_ldv(x, dt, image + (ih * g.w + iw) * C, V, r);
    } else {
      kcu_tap th = kcu_linear(oh, g.h, g.ratio_h, g.align_corners);
      kcu_tap tw = kcu_linear(ow, g.w, g.ratio_w, g.align_corners);
      float v00[8] = {0}, v01[8] = {0}, v10[8] = {0}, v11[8] = {0};
      kcu_ldv(x, dt, image + (th.i0 * g.w + tw.i0) * C, V, v00);
      kcu_ldv(x, dt, image + (th.i0 * g.w + tw.i1) * C, V, v01);
      kcu_ldv(x, dt, image + (th.i1 * g.w + tw.i0) * C, V, v10);
      kcu_ldv(x, dt, image + (th.i1 * g.w + tw.i1) * C, V, v11);
#pragma unroll
      for (int k = 0; k < 8; k++)
        r[k] = kcu_lerp(kcu_lerp(v00[k], v01[k], tw.lambda), kcu_lerp(v10[k], v11[k], tw.lambda),
                        th.lambda);
    }
    kcu_stv(out, dt, ((b * g.oh + oh) * g.ow + ow) * C + c, V, r);
  }
}

/* Source units per output unit as the CPU engine computes them: (in-1)/(out-1) with aligned
 * corners, else 1/scale when the op was given a scale factor, else in/out. */
static float kcu_ratio(int64_t in, int64_t out, double scale, int align_corners) {
  if (align_corners) return out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
  return scale > 0.0 ? (float)(1.0 / scale) : (float)in / (float)out;
}

extern "C" cudaError_t kcu_resize(cudaStream_t s, const kiln_op *op, const kiln_planes *d,
                                  const kcu_tensor *x, const kcu_tensor *out) {
  if (out->numel == 0) return cudaSuccess;
  int vec = x->dtype == KILN_F32 ? 4 : 8;
  if (d->channels % vec || ((uintptr_t)x->data | (uintptr_t)out->data) % 16) vec = 1;
  kcu_resize_geom g;
  g.batch = d->batch, g.cvec = d->channels / vec, g.vec = vec;
  g.h = d->h, g.w = d->w, g.oh = d->oh, g.ow = d->ow;
  g.bilinear = op->kind == KILN_OP_UPSAMPLE_BILINEAR2D;
  g.align_corners = g.bilinear && op->iattr[1] != 0;
  g.ratio_h = kcu_ratio(d->h, d->oh, op->fattr[0], g.align_corners);
  g.ratio_w = kcu_ratio(d->w, d->ow, op->fattr[1], g.align_corners);
  int64_t n = g.batch * g.oh * g.ow * g.cvec;
  kcu_launch_early(kcu_resize_kernel, kcu_grid(n, 1), KCU_BLOCK, 0, s, g, x->data, out->data,
                   x->dtype, n);
  return cudaGetLastError();
}
