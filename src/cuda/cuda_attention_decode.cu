/* SDPA for a few query rows over many keys (decoding: one new token against its KV cache). The
 * keys are split among many warps, each keeping an online softmax over its own keys and the
 * weighted sum of their value rows; with several splits each leaves its running max, sum and
 * unnormalized row in the scratch and the last block of the row to finish merges them (on
 * the block path, a second kernel), so a handful of rows still fills the GPU. Keys the mask
 * removes are not scored and their value rows are not read, so a static cache costs about its
 * filled part.
 *
 * Key and value rows of 16-byte f16 or bf16 vectors (head dims up to 256, aligned): the warp
 * path. The lanes of a warp share each row, a 16-byte chunk a lane (lpr = E / 8 lanes a row, 32 / lpr
 * rows at once), q's chunk in registers; a lane group scores 8 keys a pass with their loads
 * issued together and reduces each dot product by shuffles, so a pass is one round trip for
 * the keys and one for the values. A warp takes a split of a few passes: Nsight Compute on an
 * H200 showed the block-per-split kernel below latency-bound (one block of 4 warps an SM, a
 * warp issuing every 16 cycles through about 2000 instructions), so the work is cut into many
 * short warps instead.
 *
 * A decode step's cache writes may ride along (kcu_kv_append, a template copy of the warp
 * kernel): the new key and value rows are read from the step's rows where a key is the slot
 * they go to, and the kernel's threads copy them into that slot, so no INDEX_COPY kernel runs
 * between the projection and the attention.
 *
 * Other rows (f32, scalar loads): a block takes one query row and a split of the keys,
 * one key per thread; each thread reads its key's whole row against the row of q in shared
 * memory, each warp keeps an online softmax over its keys, value rows a lane per value dim, and
 * the block's warps merge at the end. */
#include "cuda_device.cuh"

#include <string.h>

#define KCU_DEC_WARPS 4
#define KCU_DEC_KEYS (KCU_DEC_WARPS * 32) /* keys a block scores at once: one per thread */
#define KCU_DEC_MAXC (KCU_ATTN_MAX_HEAD / 32)
#define KCU_DEC_MAX_SPLITS 256 /* the merge keeps three floats a split in shared memory */
#define KCU_DEC_MERGE_WARPS 4

typedef struct kcu_dec_args {
  kcu_attn_geometry g;
  int64_t L, S, E, Ev, n_splits, split_len;
  int causal, dq, dk, dv, dout;
  int64_t warp_blocks; /* the warp path: blocks a query row (KCU_DECW_WARPS splits each) */
  int kvec; /* elements per 16-byte load of k rows (4 or 8), 0: scalar loads */
  int vvec; /* 1: value rows by 16-byte vectors, Ev / (4 or 8) lanes to a row; 0: by scalars */
  float scale;
  float *part;
  unsigned *arrivals; /* the warp path: a count a row, the last block to arrive merges it */
  /* the warp path's cache writes (kcu_kv_append), k's then v's: new rows of rows_of[c] 16-byte
   * chunks each, n_new[c] of them (NULL rows: none) */
  const uint4 *rows[2];
  uint4 *cache[2];
  const void *idx[2];
  int didx[2];
  int64_t n_new[2], rows_of[2];
  int *fault;
  long long *bad;
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

/* The block's work for k and v of dtype dt. Called with constants (f32, f16 or bf16), so
 * every load's dtype branch folds away and the loads of a loop issue together
 * (a branch between a load and its use makes each one a round trip of its own). */
static __device__ __forceinline__ void kcu_dec_block(const kcu_dec_args *a, const int dt,
                                                     const void *q, const void *k, const void *v,
                                                     const void *mask, void *out, float *qs,
                                                     float *wm, float *wl,
                                                     float (*wacc)[KCU_ATTN_MAX_HEAD],
                                                     float (*ps)[32]) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, E = (int)a->E, Ev = (int)a->Ev;
  /* the vector path: vv elements a lane, lpr lanes to a value row, 32 / lpr rows at once;
   * acc[t] holds dim sub_lane * vv + t of this lane's rows (the scalar path: dim lane + 32 t) */
  const int vv = dt == KILN_F32 ? 4 : 8, lpr = a->vvec ? Ev / vv : 32;
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
          kcu_ld16(k, dt, (kr + e) / 8, f);
#pragma unroll
          for (int t = 0; t < 8; t++) dot += qs[e + t] * f[t];
        }
      } else if (a->kvec == 4) {
#pragma unroll 4
        for (int e = 0; e < E; e += 4) {
          float f[8];
          kcu_ld16(k, dt, (kr + e) / 4, f);
#pragma unroll
          for (int t = 0; t < 4; t++) dot += qs[e + t] * f[t];
        }
      } else {
        for (int e = 0; e < E; e++) dot += qs[e] * kcu_ld(k, dt, kr + e);
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
        kcu_ld16(v, dt, (vo + (first + j) * a->g.v_row) / vv + sub_lane, f);
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
        if (d < Ev) acc[c] += pj * kcu_ld(v, dt, vr + d);
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
  if (a.dk == KILN_F16) /* k and v of one dtype (kcu_attention_decode) */
    kcu_dec_block(&a, KILN_F16, q, k, v, mask, out, qs, wm, wl, wacc, ps);
  else if (a.dk == KILN_BF16)
    kcu_dec_block(&a, KILN_BF16, q, k, v, mask, out, qs, wm, wl, wacc, ps);
  else
    kcu_dec_block(&a, KILN_F32, q, k, v, mask, out, qs, wm, wl, wacc, ps);
}

/* Merges query row `row`'s splits, one block of KCU_DEC_MERGE_WARPS warps: the splits' sums
 * rescaled to the largest of their maxima. Each split's maximum, sum and weight go through
 * shared memory once (the largest maximum and the total by block reductions, not a loop over
 * every split); the first warp lists the splits with a live key in order (a static cache's
 * tail leaves most of them empty), and the warps take the listed rows KCU_DEC_MERGE_BATCH at a
 * time, a lane per value dim, every load of a batch in flight together: one round trip for up
 * to KCU_DEC_MERGE_WARPS * KCU_DEC_MERGE_BATCH live splits, where a loop skipping the empty
 * splits one by one waited a round trip for each live one. The four warps' sums meet in shared
 * memory. The partial rows are read past L1: another block may have just written them. */
#define KCU_DEC_MERGE_BATCH 4
static __device__ __forceinline__ void kcu_dec_merge_row(kcu_dec_args a, uint32_t row, void *out,
                                                         float (*w)[KCU_DEC_MAX_SPLITS],
                                                         float (*num)[KCU_ATTN_MAX_HEAD],
                                                         float *red, int *n_live) {
  int64_t b = row / (uint32_t)a.L, i = row - b * a.L, qo, ko, vo, mo, oo;
  kcu_attn_offsets(&a.g, b, &qo, &ko, &vo, &mo, &oo);
  const int64_t stride = a.Ev + 2;
  const int n = (int)a.n_splits, Ev = (int)a.Ev, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float *pr = a.part + (int64_t)row * n * stride;
  float most = -INFINITY, sum = 0.0f, acc[KCU_DEC_MAXC];
  for (int sp = threadIdx.x; sp < n; sp += blockDim.x) {
    w[0][sp] = __ldcg(pr + sp * stride), w[1][sp] = __ldcg(pr + sp * stride + 1);
    most = fmaxf(most, w[0][sp]);
  }
  most = kcu_block_reduce(most, 1, red); /* the block's threads, each with a few splits */
  for (int sp = threadIdx.x; sp < n; sp += blockDim.x) { /* a split with no live key weighs 0 */
    w[2][sp] = w[0][sp] != -INFINITY ? __expf(w[0][sp] - most) : 0.0f;
    sum += w[2][sp] * w[1][sp];
  }
  sum = kcu_block_reduce(sum, 0, red); /* its barriers also publish w */
  int *listed = (int *)w[1]; /* the sums are in `sum` now: their row holds the list */
  if (warp == 0) {
    int count = 0;
    for (int base = 0; base < n; base += 32) {
      int sp = base + lane, live = sp < n && w[2][sp] != 0.0f;
      unsigned ballot = __ballot_sync(0xffffffffu, live);
      if (live) listed[count + __popc(ballot & ((1u << lane) - 1u))] = sp;
      count += __popc(ballot);
    }
    if (lane == 0) *n_live = count;
  }
  __syncthreads();
  const int live = *n_live;
#pragma unroll
  for (int c = 0; c < KCU_DEC_MAXC; c++) acc[c] = 0.0f;
  for (int j0 = warp * KCU_DEC_MERGE_BATCH; j0 < live;
       j0 += KCU_DEC_MERGE_WARPS * KCU_DEC_MERGE_BATCH) {
    float got[KCU_DEC_MERGE_BATCH][KCU_DEC_MAXC], ws[KCU_DEC_MERGE_BATCH];
#pragma unroll
    for (int u = 0; u < KCU_DEC_MERGE_BATCH; u++) {
      int sp = j0 + u < live ? listed[j0 + u] : -1; /* the same in every lane */
      ws[u] = sp >= 0 ? w[2][sp] : 0.0f;
#pragma unroll
      for (int c = 0; c < KCU_DEC_MAXC; c++)
        got[u][c] = sp >= 0 && lane + 32 * c < Ev ? __ldcg(pr + sp * stride + 2 + lane + 32 * c)
                                                  : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < KCU_DEC_MERGE_BATCH; u++)
#pragma unroll
      for (int c = 0; c < KCU_DEC_MAXC; c++) acc[c] += ws[u] * got[u][c];
  }
#pragma unroll
  for (int c = 0; c < KCU_DEC_MAXC; c++)
    if (lane + 32 * c < Ev) num[warp][lane + 32 * c] = acc[c];
  __syncthreads();
  for (int d = threadIdx.x; d < Ev; d += blockDim.x) {
    float total = 0.0f;
    for (int k = 0; k < KCU_DEC_MERGE_WARPS; k++) total += num[k][d];
    kcu_st(out, a.dout, oo + i * a.g.o_row + d, sum > 0.0f ? total / sum : 0.0f);
  }
}

/* The block path's merge: a block a query row. */
__global__ void __launch_bounds__(KCU_DEC_MERGE_WARPS * 32)
    kcu_attention_decode_merge(kcu_dec_args a, void *out) {
  __shared__ float w[3][KCU_DEC_MAX_SPLITS]; /* maxima, sums, weights */
  __shared__ float num[KCU_DEC_MERGE_WARPS][KCU_ATTN_MAX_HEAD];
  __shared__ float red[KCU_DEC_MERGE_WARPS];
  __shared__ int n_live;
  kcu_begin_early();
  kcu_dec_merge_row(a, blockIdx.x, out, w, num, red, &n_live);
}

#define KCU_DECW_WARPS 4  /* warps a block of the warp path: splits of one query row */
#define KCU_DECW_UNROLL 8 /* keys a lane group scores a pass, their loads issued together */

/* Which of a pass's U keys (key c0 + u * step, up to k1) are scored, and an additive mask's
 * terms: the mask's kind and dtype are branched on once, outside the loops, so the pass's mask
 * loads go out together (a branch on the dtype at each load made each a round trip). */
template <int U>
static __device__ __forceinline__ void kcu_decw_live(const kcu_dec_args *a, const void *mask,
                                                     int64_t mrow, int64_t c0, int step,
                                                     int64_t k1, int *live, float *bias) {
  const int64_t mc = a->g.m_col;
#pragma unroll
  for (int u = 0; u < U; u++) {
    live[u] = c0 + u * step < k1;
    bias[u] = 0.0f;
  }
  if (a->g.mask_kind == 1) {
    const unsigned char *mb = (const unsigned char *)mask + mrow + c0 * mc;
    unsigned char got[U];
#pragma unroll
    for (int u = 0; u < U; u++) got[u] = live[u] ? mb[u * step * mc] : 0;
#pragma unroll
    for (int u = 0; u < U; u++) live[u] = got[u] != 0;
  } else if (a->g.mask_kind) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      int64_t mi = mrow + (c0 + u * step) * mc;
      if (a->g.dm == KILN_F32) bias[u] = live[u] ? ((const float *)mask)[mi] : 0.0f;
      else if (a->g.dm == KILN_F16)
        bias[u] = live[u] ? __half2float(((const __half *)mask)[mi]) : 0.0f;
      else if (a->g.dm == KILN_BF16)
        bias[u] = live[u] ? __bfloat162float(((const __nv_bfloat16 *)mask)[mi]) : 0.0f;
      else bias[u] = live[u] ? kcu_ld(mask, a->g.dm, mi) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < U; u++) live[u] = live[u] && bias[u] != -INFINITY;
  }
}

/* One warp's split of the warp path: its keys' online softmax and weighted value rows, left in
 * part (or, with one split, the output row). */
template <int DT, bool APPEND>
static __device__ __forceinline__ void kcu_dec_warp(kcu_dec_args a, uint32_t row, int64_t split,
                                                    const void *q, const void *k, const void *v,
                                                    const void *mask, void *out,
                                                    const int *slot) {
  const int VEC = DT == KILN_F32 ? 4 : 8, U = KCU_DECW_UNROLL;
  const int lane = threadIdx.x & 31, lpr = (int)(a.E / VEC), rpw = 32 / lpr;
  const int sub = lane / lpr, sl = lane % lpr;
  int64_t b = row / (uint32_t)a.L, i = row - b * a.L, qo, ko, vo, mo, oo;
  kcu_attn_offsets(&a.g, b, &qo, &ko, &vo, &mo, &oo);
  int64_t k0 = split * a.split_len, k1 = k0 + a.split_len < a.S ? k0 + a.split_len : a.S;
  if (a.causal && i + 1 < k1) k1 = i + 1;
  const int64_t mrow = mo + i * a.g.m_row;
  /* a new row's key: read from the step's rows, not from the cache slot being written (the
   * cache is [..., S, E] with rows of E, so a matrix's offset over S is its new row's) */
  const int knew = (int)(ko / a.S / VEC) + sl, vnew = (int)(vo / a.S / VEC) + sl;
  float qf[8], acc[8], m = -INFINITY, l = 0.0f;
  const int64_t qi = qo + i * a.g.q_row + sl * VEC;
  if (a.dq == DT && qi % VEC == 0 && (uintptr_t)q % 16 == 0) { /* q's chunk in one load */
    kcu_unpack16(((const uint4 *)q)[qi / VEC], DT, qf);
  } else {
#pragma unroll
    for (int t = 0; t < VEC; t++) qf[t] = kcu_ld(q, a.dq, qi + t);
  }
#pragma unroll
  for (int t = 0; t < VEC; t++) {
    qf[t] *= a.scale;
    acc[t] = 0.0f;
  }
  for (int64_t c0 = k0; c0 < k1; c0 += (int64_t)rpw * U) {
    uint4 raw[KCU_DECW_UNROLL];
    float sc[KCU_DECW_UNROLL], bias[KCU_DECW_UNROLL];
    int live[KCU_DECW_UNROLL];
    kcu_decw_live<KCU_DECW_UNROLL>(&a, mask, mrow, c0 + sub, rpw, k1, live, bias);
#pragma unroll
    for (int u = 0; u < U; u++) {
      int64_t key = c0 + u * rpw + sub;
      const uint4 *at = APPEND && (int)key == slot[0]
                            ? a.rows[0] + knew
                            : (const uint4 *)k + (ko + key * a.g.k_row) / VEC + sl;
      raw[u] = live[u] ? *at : make_uint4(0, 0, 0, 0);
    }
    float most = -INFINITY;
#pragma unroll
    for (int u = 0; u < U; u++) {
      float f[8];
      kcu_unpack16(raw[u], DT, f);
      sc[u] = 0.0f;
#pragma unroll
      for (int t = 0; t < VEC; t++) sc[u] += qf[t] * f[t];
    }
    /* the row's lanes' sums, the U keys' shuffles of a step issued together */
    for (int off = lpr / 2; off > 0; off >>= 1)
#pragma unroll
      for (int u = 0; u < U; u++) sc[u] += __shfl_xor_sync(0xffffffffu, sc[u], off);
#pragma unroll
    for (int u = 0; u < U; u++) {
      sc[u] = live[u] ? sc[u] + bias[u] : -INFINITY;
      most = fmaxf(most, sc[u]);
    }
    for (int off = lpr; off < 32; off <<= 1)
      most = fmaxf(most, __shfl_xor_sync(0xffffffffu, most, off));
    float m_new = fmaxf(m, most); /* the same in every lane */
    if (m_new == -INFINITY) continue;
    float corr = __expf(m - m_new), sum = 0.0f, p[KCU_DECW_UNROLL];
#pragma unroll
    for (int u = 0; u < U; u++) {
      p[u] = live[u] ? __expf(sc[u] - m_new) : 0.0f;
      sum += p[u];
      int64_t key = c0 + u * rpw + sub; /* a key not scored: its value row is not read */
      const uint4 *at = APPEND && (int)key == slot[1]
                            ? a.rows[1] + vnew
                            : (const uint4 *)v + (vo + key * a.g.v_row) / VEC + sl;
      raw[u] = live[u] ? *at : make_uint4(0, 0, 0, 0);
    }
    for (int off = lpr; off < 32; off <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    l = l * corr + sum;
    m = m_new;
#pragma unroll
    for (int t = 0; t < VEC; t++) acc[t] *= corr;
#pragma unroll
    for (int u = 0; u < U; u++) {
      float f[8];
      kcu_unpack16(raw[u], DT, f);
#pragma unroll
      for (int t = 0; t < VEC; t++) acc[t] += p[u] * f[t];
    }
  }
  for (int off = lpr; off < 32; off <<= 1) /* the row groups' sums into every group */
#pragma unroll
    for (int t = 0; t < VEC; t++) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off);
  if (sub != 0) return;
  if (a.n_splits > 1) {
    float *pr = a.part + ((int64_t)row * a.n_splits + split) * (a.Ev + 2);
#pragma unroll
    for (int t = 0; t < VEC; t++) pr[2 + sl * VEC + t] = acc[t];
    if (sl == 0) pr[0] = m, pr[1] = l;
  } else {
#pragma unroll
    for (int t = 0; t < VEC; t++) /* every key masked: zeros */
      kcu_st(out, a.dout, oo + i * a.g.o_row + sl * VEC + t, l > 0.0f ? acc[t] / l : 0.0f);
  }
}

/* The step's cache writes (kcu_kv_append), k's (c 0) and v's (1): slot[c], the new rows' slot,
 * or -1 for none or one outside the cache, and got[c], this thread's first 16-byte chunk of the
 * rows (its index in the grid), loaded together with the slot and ahead of the warp's own
 * loads, so none waits on another; kcu_dec_store_rows writes them at the end. */
static __device__ __forceinline__ void kcu_dec_load_rows(const kcu_dec_args *a, int *slot,
                                                         uint4 *got) {
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
#pragma unroll
  for (int c = 0; c < 2; c++) {
    long long at = a->rows[c] ? kcu_ldi(a->idx[c], a->didx[c], 0) : -1;
    got[c] = e < a->n_new[c] * a->rows_of[c] ? a->rows[c][e] : make_uint4(0, 0, 0, 0);
    slot[c] = at >= 0 && at < a->S ? (int)at : -1;
  }
}

/* The rows into their slots (no thread of the kernel reads those slots from the cache:
 * kcu_dec_warp reads the rows); a slot outside the cache writes nothing and is recorded. */
static __device__ __forceinline__ void kcu_dec_store_rows(const kcu_dec_args *a, const int *slot,
                                                          const uint4 *got) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
#pragma unroll
  for (int c = 0; c < 2; c++) {
    if (!a->rows[c]) continue;
    if (slot[c] < 0) {
      if (blockIdx.x == 0 && threadIdx.x == 0 && atomicCAS(a->fault, 0, 1) == 0)
        a->bad[0] = kcu_ldi(a->idx[c], a->didx[c], 0), a->bad[1] = a->S;
      continue;
    }
    const int64_t per = a->rows_of[c], n = a->n_new[c] * per;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
      int64_t r = e / per;
      a->cache[c][(r * a->S + slot[c]) * per + (e - r * per)] = e < stride ? got[c] : a->rows[c][e];
    }
  }
}

/* The warp path (see the top): dtype DT for k and v, a split of keys a warp. Written for f32
 * (4-element chunks) too, but built for f16 and bf16 only (bf16 on a 4096-slot cache: 29.2 us
 * against the block kernel's 34.4): an f32 copy would put the runtime wheel over its size
 * budget, so f32 rows take the block kernel. With arrival counts, the last block of a row to
 * finish merges the row's splits, where a second kernel did after all of them ended. */
template <int DT, bool APPEND>
__global__ void __launch_bounds__(KCU_DECW_WARPS * 32)
    kcu_attention_decode_warps(kcu_dec_args a, const void *q, const void *k, const void *v,
                               const void *mask, void *out) {
  kcu_begin_early();
  int slot[2] = {-1, -1};
  uint4 got[2];
  if (APPEND) kcu_dec_load_rows(&a, slot, got);
  /* 32-bit index math: blocks and rows are under 2^31 */
  const uint32_t blocks = (uint32_t)a.warp_blocks, row = blockIdx.x / blocks;
  const int64_t split = (blockIdx.x - row * blocks) * KCU_DECW_WARPS + (threadIdx.x >> 5);
  if (split < a.n_splits) /* a whole warp: no shuffle waits on it */
    kcu_dec_warp<DT, APPEND>(a, row, split, q, k, v, mask, out, slot);
  if (APPEND) kcu_dec_store_rows(&a, slot, got);
  if (!a.arrivals) return;
  /* The last block of the row to finish merges its splits (their rows are in part). */
  __shared__ float w[3][KCU_DEC_MAX_SPLITS];
  __shared__ float num[KCU_DEC_MERGE_WARPS][KCU_ATTN_MAX_HEAD];
  __shared__ float red[KCU_DEC_MERGE_WARPS];
  __shared__ int last, n_live;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&a.arrivals[row], 1u) == blocks - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  kcu_dec_merge_row(a, row, out, w, num, red, &n_live);
  if (threadIdx.x == 0) a.arrivals[row] = 0; /* for the next launch */
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

/* Warps of the warp path a launch aims at: 16 an SM, each with a short chain of work. */
#define KCU_DECW_TARGET 16

size_t kcu_attention_part_bytes(int64_t Ev, int sms) {
  /* Splits of all rows together: at most KCU_DECW_TARGET * sms (the warp path) and fewer than
   * 3 * sms (the block path; see below). */
  return (size_t)KCU_DECW_TARGET * (size_t)sms * (size_t)(Ev + 2) * sizeof(float);
}

int64_t kcu_attention_arrivals(int sms) {
  /* A merge needs two splits a row, so at most half as many rows as splits. */
  return (int64_t)KCU_DECW_TARGET * sms / 2;
}

/* The warp path's splits (a whole number of passes each) and launch, for f16 or bf16 k and v. */
static void kcu_decode_warps(cudaStream_t s, kcu_dec_args *a, int64_t rows, int sms,
                             const kcu_dec_scratch *dec, const void *q, const void *k,
                             const void *v, const void *mask, void *out) {
  size_t part_bytes = dec->part_bytes;
  int lpr = (int)(a->E / 8);
  int64_t pass = (int64_t)(32 / lpr) * KCU_DECW_UNROLL, passes = (a->S + pass - 1) / pass;
  int64_t splits = sms > 0 ? ((int64_t)KCU_DECW_TARGET * sms + rows - 1) / rows : 1;
  int64_t fit = (int64_t)(part_bytes / ((size_t)rows * (size_t)(a->Ev + 2) * sizeof(float)));
  if (splits > passes) splits = passes;
  if (splits > KCU_DEC_MAX_SPLITS) splits = KCU_DEC_MAX_SPLITS;
  if (splits > fit) splits = fit;
  if (splits < 1) splits = 1;
  int64_t per_split = (passes + splits - 1) / splits;
  a->split_len = per_split * pass;
  a->n_splits = (passes + per_split - 1) / per_split;
  a->warp_blocks = (a->n_splits + KCU_DECW_WARPS - 1) / KCU_DECW_WARPS;
  if (a->n_splits > 1 && dec->arrivals && rows <= dec->n_arrivals) a->arrivals = dec->arrivals;
  unsigned grid = (unsigned)(rows * a->warp_blocks);
  /* a copy of its own for a step's cache writes, so the others keep their loads as they were
   * (the slot's test on every key cost a plain decode step about 1 us a call) */
  void (*kernel)(kcu_dec_args, const void *, const void *, const void *, const void *, void *) =
      a->dk == KILN_BF16 ? (a->rows[0] || a->rows[1] ? kcu_attention_decode_warps<KILN_BF16, true>
                                                     : kcu_attention_decode_warps<KILN_BF16, false>)
                         : (a->rows[0] || a->rows[1] ? kcu_attention_decode_warps<KILN_F16, true>
                                                     : kcu_attention_decode_warps<KILN_F16, false>);
  kcu_launch_early(kernel, grid, KCU_DECW_WARPS * 32, 0, s, *a, q, k, v, mask, out);
}

/* Whether k's rows (of E elements) and v's (of Ev) load as 16-byte vectors: *kvec elements a
 * load (4 or 8; 0: scalar loads), *vvec 1 where Ev / (4 or 8) lanes tile a warp. */
static void kcu_dec_vectors(const kcu_attn_geometry *g, const kcu_tensor *k, const kcu_tensor *v,
                            int *kvec, int *vvec) {
  int64_t E = k->dims[k->rank - 1], Ev = v->dims[v->rank - 1];
  int per = k->dtype == KILN_F32 ? 4 : 8;
  int kv = kiln_dtype_is_float(k->dtype) &&
           E % per == 0 && g->k_row % per == 0 && (uintptr_t)k->data % 16 == 0;
  for (int d = 0; kv && d < g->nb; d++) kv = g->kb[d] % per == 0;
  *kvec = kv ? per : 0;
  int vper = v->dtype == KILN_F32 ? 4 : 8, lanes = (int)(Ev / vper);
  int vv = kiln_dtype_is_float(v->dtype) &&
           Ev % vper == 0 && lanes >= 1 && lanes <= 32 && 32 % lanes == 0 &&
           g->v_row % vper == 0 && (uintptr_t)v->data % 16 == 0;
  for (int d = 0; vv && d < g->nb; d++) vv = g->vb[d] % vper == 0;
  *vvec = vv;
}

int kcu_attention_decode_warp_path(const kcu_attn_geometry *g, const kcu_tensor *k,
                                   const kcu_tensor *v) {
  /* rows of 16-byte vectors with E == Ev in f16 or bf16: E / 8 lanes (1 to 32, a divisor of
   * 32) to a row */
  int kvec, vvec;
  kcu_dec_vectors(g, k, v, &kvec, &vvec);
  return kvec && vvec && (k->dtype == KILN_F16 || k->dtype == KILN_BF16) &&
         v->dtype == k->dtype && k->dims[k->rank - 1] == v->dims[v->rank - 1];
}

/* The append's fields of a: the new rows, [..., 1, E] over the cache's [..., S, E]. */
static void kcu_dec_set_append(kcu_dec_args *a, const kcu_kv_append *append, const kcu_tensor *k,
                               const kcu_tensor *v) {
  const kcu_tensor *cache[2] = {k, v};
  for (int c = 0; c < 2; c++) {
    if (!append->rows[c]) continue;
    const kcu_tensor *t = cache[c];
    a->rows[c] = (const uint4 *)append->rows[c];
    a->cache[c] = (uint4 *)t->data;
    a->idx[c] = append->idx[c];
    a->didx[c] = append->didx[c];
    a->rows_of[c] = t->dims[t->rank - 1] / 8;
    a->n_new[c] = t->numel / (t->dims[t->rank - 1] * a->S);
  }
  a->fault = append->fault;
  a->bad = append->bad;
}

cudaError_t kcu_attention_decode(cudaStream_t s, const kcu_attn_geometry *geo, int64_t batch,
                                 const kcu_tensor *q, const kcu_tensor *k, const kcu_tensor *v,
                                 const kcu_tensor *mask, const kcu_tensor *out, int causal,
                                 float scale, const kcu_dec_scratch *dec,
                                 const kcu_kv_append *append) {
  /* k and v of one float dtype, as an SDPA's inputs are: the kernels are built for those */
  if (k->dtype != v->dtype || !kiln_dtype_is_float(k->dtype)) return cudaErrorInvalidValue;
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
  a.part = (float *)dec->part;
  kcu_dec_vectors(&a.g, k, v, &a.kvec, &a.vvec);
  int64_t rows = batch * a.L, chunks = (a.S + KCU_DEC_KEYS - 1) / KCU_DEC_KEYS;
  int sms = kcu_sm_count();
  cudaGetLastError();
  int warps = kcu_attention_decode_warp_path(&a.g, k, v);
  if (append && !warps) return cudaErrorInvalidValue;
  if (append) kcu_dec_set_append(&a, append, k, v);
  if (warps) {
    kcu_decode_warps(s, &a, rows, sms, dec, q->data, k->data, v->data,
                     mask ? mask->data : NULL, out->data);
  } else {
    a.n_splits = 1;
    a.split_len = chunks * KCU_DEC_KEYS;
    /* Fewer rows than SMs: split the keys in whole chunks, about two blocks per SM. */
    if (rows < sms && chunks >= 2) {
      int64_t want = (2 * sms + rows - 1) / rows, splits = want < chunks ? want : chunks;
      if (splits > KCU_DEC_MAX_SPLITS) splits = KCU_DEC_MAX_SPLITS;
      int64_t per_split = (chunks + splits - 1) / splits;
      if ((size_t)(rows * ((chunks + per_split - 1) / per_split) * (a.Ev + 2)) * sizeof(float) <=
          dec->part_bytes) {
        a.split_len = per_split * KCU_DEC_KEYS;
        a.n_splits = (chunks + per_split - 1) / per_split;
      }
    }
    kcu_launch_early(kcu_attention_decode_kernel, (unsigned)(rows * a.n_splits), KCU_DEC_KEYS, 0,
                     s, a, q->data, k->data, v->data, mask ? mask->data : NULL, out->data);
  }
  if (a.n_splits > 1 && !a.arrivals)
    kcu_launch_early(kcu_attention_decode_merge, (unsigned)rows, KCU_DEC_MERGE_WARPS * 32, 0, s,
                     a, out->data);
  return cudaGetLastError();
}
