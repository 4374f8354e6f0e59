/* MAX_POOL2D, AVG_POOL2D and ADAPTIVE_AVG_POOL2D over a batch of [H,W,C] images (NCHW as
 * C = 1): one thread per output element, or per 16-byte vector of channels in channels_last,
 * sums in f32; a global average (1x1 adaptive) as a reduction over each image. */
#include "cuda_device.cuh"

#include <string.h>

enum { KCU_POOL_MAX = 0, KCU_POOL_AVG = 1, KCU_POOL_ADAPTIVE = 2 };

/* One pooling op's geometry, by value: channels in cvec vectors of vec elements each. */
typedef struct kcu_pool_geom {
  int64_t batch, cvec, h, w, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  int64_t divisor; /* AVG_POOL2D's override, 0 for none */
  int kind, count_include_pad, vec;
} kcu_pool_geom;

__global__ void kcu_pool_kernel(kcu_pool_geom g, const void *x, void *out, int dt, int64_t n) {
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
    float acc[8], v[8] = {0};
    if (g.kind == KCU_POOL_MAX) {
#pragma unroll
      for (int k = 0; k < 8; k++) acc[k] = -INFINITY;
      for (int64_t kh = 0; kh < g.kh; kh++) {
        int64_t ih = oh * g.sh - g.ph + kh * g.dh;
        if (ih < 0 || ih >= g.h) continue;
        for (int64_t kw = 0; kw < g.kw; kw++) {
          int64_t iw = ow * g.sw - g.pw + kw * g.dw;
          if (iw < 0 || iw >= g.w) continue;
          kcu_ldv(x, dt, image + (ih * g.w + iw) * C, V, v);
#pragma unroll
          for (int k = 0; k < 8; k++)
            if (v[k] > acc[k] || v[k] != v[k]) acc[k] = v[k]; /* a NaN stays: nothing beats it */
        }
      }
    } else {
      int64_t h0, h1, w0, w1, divisor;
      if (g.kind == KCU_POOL_ADAPTIVE) {
        h0 = oh * g.h / g.oh, h1 = ((oh + 1) * g.h + g.oh - 1) / g.oh;
        w0 = ow * g.w / g.ow, w1 = ((ow + 1) * g.w + g.ow - 1) / g.ow;
        divisor = (h1 - h0) * (w1 - w0);
      } else {
        h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
        h1 = min(h0 + g.kh, g.h + g.ph), w1 = min(w0 + g.kw, g.w + g.pw);
        int64_t padded = (h1 - h0) * (w1 - w0);
        h0 = max(h0, (int64_t)0), w0 = max(w0, (int64_t)0);
        h1 = min(h1, g.h), w1 = min(w1, g.w);
        divisor = g.divisor ? g.divisor : g.count_include_pad ? padded : (h1 - h0) * (w1 - w0);
      }
#pragma unroll
      for (int k = 0; k < 8; k++) acc[k] = 0.0f;
      for (int64_t ih = h0; ih < h1; ih++)
        for (int64_t iw = w0; iw < w1; iw++) {
          kcu_ldv(x, dt, image + (ih * g.w + iw) * C, V, v);
#pragma unroll
          for (int k = 0; k < 8; k++) acc[k] += v[k];
        }
      const int empty = h0 >= h1 || w0 >= w1;
#pragma unroll
      for (int k = 0; k < 8; k++) acc[k] = empty ? 0.0f : acc[k] / (float)divisor;
    }
    kcu_stv(out, dt, ((b * g.oh + oh) * g.ow + ow) * C + c, V, acc);
  }
}

/* Global average of NCHW planes: one warp per plane of n contiguous elements. */
__global__ void kcu_global_avg_planes(const void *x, void *out, int dt, int64_t planes,
                                      int64_t n) {
  kcu_begin_early();
  const int64_t warps = (int64_t)gridDim.x * blockDim.x / 32;
  const int lane = threadIdx.x & 31;
  for (int64_t p = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; p < planes; p += warps) {
    float sum = 0.0f;
    for (int64_t j = lane; j < n; j += 32) sum += kcu_ld(x, dt, p * n + j);
    sum = kcu_warp_sum(sum);
    if (lane == 0) kcu_st(out, dt, p, sum / (float)n);
  }
}

#define KCU_GAP_SLICES 8 /* positions of one image summed side by side, then added up */

/* Global average of [N,H,W,C] images: a block is 32 channel vectors of vec elements
 * (threadIdx.x) by KCU_GAP_SLICES position slices (threadIdx.y), which meet in shared memory. */
__global__ void kcu_global_avg_channels(const void *x, void *out, int dt, int64_t batch,
                                        int64_t cvec, int vec, int64_t positions) {
  kcu_begin_early();
  __shared__ float part[KCU_GAP_SLICES][32][8];
  const int64_t C = cvec * vec, chunks = (cvec + 31) / 32;
  for (int64_t blk = blockIdx.x; blk < batch * chunks; blk += gridDim.x) {
    int64_t b = blk / chunks, cv = (blk % chunks) * 32 + threadIdx.x;
    float acc[8] = {0}, v[8] = {0};
    if (cv < cvec)
      for (int64_t q = threadIdx.y; q < positions; q += KCU_GAP_SLICES) {
        kcu_ldv(x, dt, (b * positions + q) * C + cv * vec, vec, v);
#pragma unroll
        for (int k = 0; k < 8; k++) acc[k] += v[k];
      }
#pragma unroll
    for (int k = 0; k < 8; k++) part[threadIdx.y][threadIdx.x][k] = acc[k];
    __syncthreads();
    if (threadIdx.y == 0 && cv < cvec) {
      for (int sl = 1; sl < KCU_GAP_SLICES; sl++)
#pragma unroll
        for (int k = 0; k < 8; k++) acc[k] += part[sl][threadIdx.x][k];
#pragma unroll
      for (int k = 0; k < 8; k++) acc[k] /= (float)positions;
      kcu_stv(out, dt, b * C + cv * vec, vec, acc);
    }
    __syncthreads();
  }
}

/* Elements per 16-byte vector of the dtype when the channels and both addresses allow it,
 * else 1 (NCHW always: C = 1). */
static int kcu_channel_vector(const kiln_planes *d, const kcu_tensor *x, const kcu_tensor *out) {
  int per = x->dtype == KILN_F32 ? 4 : 8;
  if (d->channels % per || ((uintptr_t)x->data | (uintptr_t)out->data) % 16) return 1;
  return per;
}

static cudaError_t kcu_global_avg(cudaStream_t s, const kiln_planes *d, int vec,
                                  const kcu_tensor *x, const kcu_tensor *out) {
  if (d->channels == 1) {
    kcu_launch_early(kcu_global_avg_planes, kcu_grid(d->batch * 32, 1), KCU_BLOCK, 0, s,
        x->data, out->data, x->dtype, d->batch, d->h * d->w);
  } else {
    int64_t cvec = d->channels / vec, blocks = d->batch * ((cvec + 31) / 32);
    dim3 threads(32, KCU_GAP_SLICES);
    kcu_launch_early(kcu_global_avg_channels,
                     (unsigned)(blocks < 65535 * 16 ? blocks : 65535 * 16), threads, 0, s,
                     x->data, out->data, x->dtype, d->batch, cvec, vec, d->h * d->w);
  }
  return cudaGetLastError();
}

extern "C" cudaError_t kcu_pool(cudaStream_t s, const kiln_op *op, const kiln_window *win,
                                const kiln_planes *d, const kcu_tensor *x, const kcu_tensor *out) {
  if (out->numel == 0) return cudaSuccess;
  int vec = kcu_channel_vector(d, x, out);
  if (op->kind == KILN_OP_ADAPTIVE_AVG_POOL2D && d->oh == 1 && d->ow == 1)
    return kcu_global_avg(s, d, vec, x, out);
  kcu_pool_geom g;
  memset(&g, 0, sizeof g);
  g.batch = d->batch, g.cvec = d->channels / vec, g.vec = vec;
  g.h = d->h, g.w = d->w, g.oh = d->oh, g.ow = d->ow;
  g.kh = win->kernel.h, g.kw = win->kernel.w, g.sh = win->stride.h, g.sw = win->stride.w;
  g.ph = win->padding.h, g.pw = win->padding.w, g.dh = win->dilation.h, g.dw = win->dilation.w;
  g.divisor = win->divisor, g.count_include_pad = win->count_include_pad;
  g.kind = op->kind == KILN_OP_MAX_POOL2D   ? KCU_POOL_MAX
           : op->kind == KILN_OP_AVG_POOL2D ? KCU_POOL_AVG
                                            : KCU_POOL_ADAPTIVE;
  int64_t n = g.batch * g.oh * g.ow * g.cvec;
  kcu_launch_early(kcu_pool_kernel, kcu_grid(n, 1), KCU_BLOCK, 0, s, g, x->data, out->data,
                   x->dtype, n);
  return cudaGetLastError();
}
