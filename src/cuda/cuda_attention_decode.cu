/* SDPA for a few query rows over many keys (decoding: one new token against its KV cache).
 * A block takes one query row and a split of the keys, one key per thread: each thread reads
 * its key's whole row (16-byte loads) against the row of q in shared memory, each warp keeps
 * an online softmax over its keys and the weighted sum of their value rows, and the block's
 * warps merge at the end. Value rows of 16-byte vectors that tile a warp (head dims 32-256 in
 * f16 and bf16, 16-128 in f32) are read a vector per lane, several rows at once, so a warp's
 * 32 rows are a few round trips to memory rather than 32; other rows a lane per value dim.
 * Keys the mask removes are not scored, and value rows are read only by a warp with a live key
 * among its 32 (the lane-per-dim path skips each masked one), so a static cache costs about its
 * filled part. With several splits the block leaves its running max, sum and unnormalized row
 * in the scratch and a second kernel merges the splits, so a handful of rows still fills the
 * GPU. */
#include "cuda_device.cuh"

#include <string.h>

#define KCU_DEC_WARPS 4
#define KCU_DEC_KEYS (KCU_DEC_WARPS * 32) /* keys a block scores at once: one per thread */
#define KCU_DEC_MAXC (KCU_ATTN_MAX_HEAD / 32)
#define KCU_DEC_MAX_SPLITS 256 /* the merge keeps three floats a split in shared memory */

typedef struct kcu_dec_args {
  kcu_attn_geometry g;
  int64_t L, S, E, Ev, n_splits, split_len;
  int causal, dq, dk, dv, dout;
  int kvec; /* elements per 16-byte load of k rows (4 or 8), 0: scalar loads */
  int vvec; /* 1: value rows by 16-byte vectors, Ev / (4 or 8) lanes to a row; 0: by scalars */
  float scale;
  float *part;
} kcu_dec_args;

/* Whether key `key` (of keys up to k1) is scored: in range, and not removed by the mask (a
 * masked key's row is never read: a static cache's tail); an additive mask's term in *bias. */
static __device__ __forceinline__ int kcu_dec_live(const kcu_dec_args *a, const void *mask,
                                                   int64_t mrow, int64_t key, int64_t k1,
                                                   float *bias) {
  if (key >= k1) return 0;
  if (!a->g.mask_kind) return 1;
  int64_t mi = mrow + key * a->g.m_col;
  if (a->g.mask_kind == 1) return ((const unsigned char *)mask)[mi] != 0;
  return (*bias = kcu_ld(mask, a->g.dm, mi)) != -INFINITY;
}

/* The block's work for k and v of dtypes dk and dv. Called with constants for the common
 * cases, so every load's dtype branch folds away and the loads of a loop issue together (a
 * branch between a load and its use makes each one a round trip of its own). */
static __device__ __forceinline__ void kcu_dec_block(const kcu_dec_args *a, int dk, int dv,
                                                     const void *q, const void *k, const void *v,
                                                     const void *mask, void *out, float *qs,
                                                     float *wm, float *wl,
                                                     float (*wacc)[KCU_ATTN_MAX_HEAD],
                                                     float (*ps)[32]) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, E = (int)a->E, Ev = (int)a->Ev;
  /* the vector path: vv elements a lane, lpr lanes to a value row, 32 / lpr rows at once;
   * acc[t] holds dim sub_lane * vv + t of this lane's rows (the scalar path: dim lane + 32 t) */
  const int vv = dv == KILN_F32 ? 4 : 8, lpr = a->vvec ? Ev / vv : 32;
  const int sub = lane / lpr, sub_lane = lane % lpr;
  int64_t split = blockIdx.x % a->n_splits, row = blockIdx.x / a->n_splits;
  int64_t b = row / a->L, i = row % a->L, qo, ko, vo, mo, oo;
  kcu_attn_offsets(&a->g, b, &qo, &ko, &vo, &mo, &oo);
  int64_t k0 = split * a->split_len, k1 = k0 + a->split_len < a->S ? k0 + a->split_len : a->S;
  if (a->causal && i + 1 < k1) k1 = i + 1; /* keys after the row's own position are masked */
  /* the first chunk's mask read goes out with q's, not after it */
  float bias0 = 0.0f;
  int live0 = kcu_dec_live(a, mask, mo + i * a->g.m_row, k0 + threadIdx.x, k1, &bias0);
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    qs[e] = kcu_ld(q, a->dq, qo + i * a->g.q_row + e) * a->scale;
  __syncthreads();
  float m = -INFINITY, l = 0.0f, acc[KCU_DEC_MAXC];
#pragma unroll
  for (int c = 0; c < KCU_DEC_MAXC; c++) acc[c] = 0.0f;
  for (int64_t c0 = k0; c0 < k1; c0 += KCU_DEC_KEYS) {
    int64_t key = c0 + threadIdx.x;
    float sc = -INFINITY, bias = bias0;
    int live = c0 == k0 ? live0 : kcu_dec_live(a, mask, mo + i * a->g.m_row, key, k1, &bias);
    if (live) {
      int64_t kr = ko + key * a->g.k_row;
      float dot = 0.0f;
      if (a->kvec == 8) { /* constant trip counts keep f in registers and the loads in flight */
#pragma unroll 8
        for (int e = 0; e < E; e += 8) {
          float f[8];
          kcu_ld16(k, dk, (kr + e) / 8, f);
#pragma unroll
          for (int t = 0; t < 8; t++) dot += qs[e + t] * f[t];
        }
      } else if (a->kvec == 4) {
#pragma unroll 4
        for (int e = 0; e < E; e += 4) {
          float f[8];
          kcu_ld16(k, dk, (kr + e) / 4, f);
#pragma unroll
          for (int t = 0; t < 4; t++) dot += qs[e + t] * f[t];
        }
      } else {
        for (int e = 0; e < E; e++) dot += qs[e] * kcu_ld(k, dk, kr + e);
      }
      sc = dot + bias;
    }
    float m_new = fmaxf(m, kcu_warp_max(sc)); /* the same in every lane: no divergence below */
    if (m_new == -INFINITY) continue;
    float p = __expf(sc - m_new), corr = __expf(m - m_new);
    l = l * corr + kcu_warp_sum(p);
    m = m_new;
#pragma unroll
    for (int c = 0; c < KCU_DEC_MAXC; c++) acc[c] *= corr;
    int64_t first = c0 + warp * 32;
    int n = k1 - first < 32 ? (int)(k1 - first) : 32;
    if (a->vvec) { /* every row of the warp's live keys loaded; a masked key's adds nothing */
      ps[warp][lane] = p;
      __syncwarp();
#pragma unroll 4
      for (int j = sub; j < n; j += 32 / lpr) {
        float f[8];
        kcu_ld16(v, dv, (vo + (first + j) * a->g.v_row) / vv + sub_lane, f);
        float pj = ps[warp][j];
        if (pj != 0.0f) {
#pragma unroll
          for (int t = 0; t < 8; t++)
            if (t < vv) acc[t] += pj * f[t];
        }
      }
      __syncwarp();
      continue;
    }
#pragma unroll 8
    for (int j = 0; j < n; j++) {
      float pj = __shfl_sync(0xffffffffu, p, j);
      if (pj == 0.0f) continue; /* the same in every lane: a masked key's value row is not read */
      int64_t vr = vo + (first + j) * a->g.v_row;
#pragma unroll
      for (int c = 0; c < KCU_DEC_MAXC; c++) {
        int d = lane + 32 * c;
        if (d < Ev) acc[c] += pj * kcu_ld(v, dv, vr + d);
      }
    }
  }
  if (lane == 0) wm[warp] = m, wl[warp] = l;
  if (a->vvec) { /* the sub-warps' rows summed into the first's lanes */
    for (int off = lpr; off < 32; off <<= 1)
#pragma unroll
      for (int t = 0; t < 8; t++) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off);
    if (sub == 0)
#pragma unroll
      for (int t = 0; t < 8; t++)
        if (t < vv) wacc[warp][sub_lane * vv + t] = acc[t];
  } else {
#pragma unroll
    for (int c = 0; c < KCU_DEC_MAXC; c++)
      if (lane + 32 * c < Ev) wacc[warp][lane + 32 * c] = acc[c];
  }
  __syncthreads();
  float most = -INFINITY, sum = 0.0f;
  for (int w = 0; w < KCU_DEC_WARPS; w++) most = fmaxf(most, wm[w]);
  for (int w = 0; w < KCU_DEC_WARPS; w++)
    if (wm[w] != -INFINITY) sum += __expf(wm[w] - most) * wl[w];
  float *pr = a->part + (row * a->n_splits + split) * (a->Ev + 2);
  for (int d = threadIdx.x; d < Ev; d += blockDim.x) {
    float num = 0.0f;
    for (int w = 0; w < KCU_DEC_WARPS; w++)
      if (wm[w] != -INFINITY) num += __expf(wm[w] - most) * wacc[w][d];
    if (a->n_splits > 1) {
      pr[2 + d] = num;
      if (d == 0) pr[0] = most, pr[1] = sum;
    } else {
      kcu_st(out, a->dout, oo + i * a->g.o_row + d, sum > 0.0f ? num / sum : 0.0f); /* masked: 0 */
    }
  }
}

__global__ void __launch_bounds__(KCU_DEC_WARPS * 32)
    kcu_attention_decode_kernel(kcu_dec_args a, const void *q, const void *k, const void *v,
                                const void *mask, void *out) {
  __shared__ float qs[KCU_ATTN_MAX_HEAD];
  __shared__ float wm[KCU_DEC_WARPS], wl[KCU_DEC_WARPS];
  __shared__ float wacc[KCU_DEC_WARPS][KCU_ATTN_MAX_HEAD];
  __shared__ float ps[KCU_DEC_WARPS][32];
  kcu_begin_early();
  if (a.dk == KILN_F16 && a.dv == KILN_F16)
    kcu_dec_block(&a, KILN_F16, KILN_F16, q, k, v, mask, out, qs, wm, wl, wacc, ps);
  else if (a.dk == KILN_BF16 && a.dv == KILN_BF16)
    kcu_dec_block(&a, KILN_BF16, KILN_BF16, q, k, v, mask, out, qs, wm, wl, wacc, ps);
  else if (a.dk == KILN_F32 && a.dv == KILN_F32)
    kcu_dec_block(&a, KILN_F32, KILN_F32, q, k, v, mask, out, qs, wm, wl, wacc, ps);
  else
    kcu_dec_block(&a, a.dk, a.dv, q, k, v, mask, out, qs, wm, wl, wacc, ps);
}

/* One block per query row: the splits' sums rescaled to the largest of their maxima. Each
 * split's maximum, sum and weight go through shared memory once, so the value loads of all
 * splits are independent and overlap. */
__global__ void kcu_attention_decode_merge(kcu_dec_args a, void *out) {
  __shared__ float w[3][KCU_DEC_MAX_SPLITS]; /* maxima, sums, weights */
  kcu_begin_early();
  int64_t row = blockIdx.x, b = row / a.L, i = row % a.L, qo, ko, vo, mo, oo;
  kcu_attn_offsets(&a.g, b, &qo, &ko, &vo, &mo, &oo);
  const int64_t stride = a.Ev + 2;
  const int n = (int)a.n_splits;
  const float *pr = a.part + row * n * stride;
  for (int sp = threadIdx.x; sp < n; sp += blockDim.x)
    w[0][sp] = pr[sp * stride], w[1][sp] = pr[sp * stride + 1];
  __syncthreads();
  float most = -INFINITY, sum = 0.0f;
  for (int sp = 0; sp < n; sp++) most = fmaxf(most, w[0][sp]);
  for (int sp = threadIdx.x; sp < n; sp += blockDim.x) /* a split with no live key weighs 0 */
    w[2][sp] = w[0][sp] != -INFINITY ? __expf(w[0][sp] - most) : 0.0f;
  __syncthreads();
  for (int sp = 0; sp < n; sp++) sum += w[2][sp] * w[1][sp];
  for (int64_t d = threadIdx.x; d < a.Ev; d += blockDim.x) {
    float num = 0.0f; /* every split wrote its row, zeros where it had no live key */
#pragma unroll 8
    for (int sp = 0; sp < n; sp++) num += w[2][sp] * pr[sp * stride + 2 + d];
    kcu_st(out, a.dout, oo + i * a.g.o_row + d, sum > 0.0f ? num / sum : 0.0f);
  }
}

/* SMs of the current device, asked once per device (a launch path must stay cheap). */
static int kcu_sm_count(void) {
  static int counts[64];
  int device = 0, n = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 0;
  if (counts[device] > 0) return counts[device];
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) n = 0;
  counts[device] = n; /* every thread that races here stores the same number */
  return n;
}

size_t kcu_attention_part_bytes(int64_t Ev, int sms) {
  /* Splits happen only while rows < sms, and then rows * splits < 3 * sms (see below). */
  return (size_t)3 * (size_t)sms * (size_t)(Ev + 2) * sizeof(float);
}

cudaError_t kcu_attention_decode(cudaStream_t s, const kcu_attn_geometry *geo, int64_t batch,
                                 const kcu_tensor *q, const kcu_tensor *k, const kcu_tensor *v,
                                 const kcu_tensor *mask, const kcu_tensor *out, int causal,
                                 float scale, void *part, size_t part_bytes) {
  kcu_dec_args a;
  memset(&a, 0, sizeof a);
  a.g = *geo;
  a.L = q->dims[q->rank - 2];
  a.E = q->dims[q->rank - 1];
  a.S = k->dims[k->rank - 2];
  a.Ev = v->dims[v->rank - 1];
  a.causal = causal;
  a.scale = scale;
  a.dq = q->dtype; a.dk = k->dtype; a.dv = v->dtype; a.dout = out->dtype;
  a.part = (float *)part;
  int per = k->dtype == KILN_F32 ? 4 : 8;
  int kvec = (k->dtype == KILN_F32 || k->dtype == KILN_F16 || k->dtype == KILN_BF16) &&
             a.E % per == 0 && a.g.k_row % per == 0 && (uintptr_t)k->data % 16 == 0;
  for (int d = 0; kvec && d < a.g.nb; d++) kvec = a.g.kb[d] % per == 0;
  a.kvec = kvec ? per : 0;
  int vper = v->dtype == KILN_F32 ? 4 : 8, lanes = (int)(a.Ev / vper);
  int vvec = (v->dtype == KILN_F32 || v->dtype == KILN_F16 || v->dtype == KILN_BF16) &&
             a.Ev % vper == 0 && lanes >= 1 && lanes <= 32 && 32 % lanes == 0 &&
             a.g.v_row % vper == 0 && (uintptr_t)v->data % 16 == 0;
  for (int d = 0; vvec && d < a.g.nb; d++) vvec = a.g.vb[d] % vper == 0;
  a.vvec = vvec;
  int64_t rows = batch * a.L, chunks = (a.S + KCU_DEC_KEYS - 1) / KCU_DEC_KEYS;
  a.n_splits = 1;
  a.split_len = chunks * KCU_DEC_KEYS;
  /* Fewer rows than SMs: split the keys in whole chunks, about two blocks per SM. */
  int sms = kcu_sm_count();
  if (rows < sms && chunks >= 2) {
    int64_t want = (2 * sms + rows - 1) / rows, splits = want < chunks ? want : chunks;
    if (splits > KCU_DEC_MAX_SPLITS) splits = KCU_DEC_MAX_SPLITS;
    int64_t per_split = (chunks + splits - 1) / splits;
    if ((size_t)(rows * ((chunks + per_split - 1) / per_split) * (a.Ev + 2)) * sizeof(float) <=
        part_bytes) {
      a.split_len = per_split * KCU_DEC_KEYS;
      a.n_splits = (chunks + per_split - 1) / per_split;
    }
  }
  cudaGetLastError();
  kcu_launch_early(kcu_attention_decode_kernel, (unsigned)(rows * a.n_splits), KCU_DEC_KEYS, 0,
                   s, a, q->data, k->data, v->data, mask ? mask->data : NULL, out->data);
  if (a.n_splits > 1)
    kcu_launch_early(kcu_attention_decode_merge, (unsigned)rows, 128, 0, s, a, out->data);
  return cudaGetLastError();
}
