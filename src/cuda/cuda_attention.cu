/* Fused scaled-dot-product attention, flash style: each warp owns query rows, K and V come
 * through shared memory 32 keys at a time, and an online softmax keeps a running max and
 * sum per row, so the [L, S] score matrix never reaches device memory. It runs the shapes
 * neither tensor-core path (cuda_flash_attention.cu, cuda_attention_gemm.c) takes; the
 * cuBLASLt path's softmax step is the row kernel at the end of this file. */
#include "cuda_device.cuh"

#include <string.h>

#define KCU_ATTN_WARPS 4
#define KCU_ATTN_ROWS 2 /* query rows per warp */
#define KCU_ATTN_TILE 32
#define KCU_ATTN_MAXC (KCU_ATTN_MAX_HEAD / 32)

typedef struct kcu_attn_args {
  kcu_attn_geometry g;
  int64_t L, S, E, Ev, n_tiles;
  int causal;
  float scale;
  int dq, dk, dv, dout;
  int vec; /* k and v are one 16-bit dtype, head dims multiples of 8, rows 16-byte aligned */
} kcu_attn_args;

static size_t kcu_attn_smem(int64_t E, int64_t Ev) {
  return sizeof(float) * (size_t)(KCU_ATTN_TILE * (E + 1) + KCU_ATTN_TILE * Ev +
                                  KCU_ATTN_WARPS * KCU_ATTN_ROWS * E);
}

__global__ void __launch_bounds__(KCU_ATTN_WARPS * 32)
    kcu_attention_kernel(kcu_attn_args a, const void *q, const void *k, const void *v,
                         const void *mask, void *out) {
  kcu_begin_early();
  extern __shared__ float smem[];
  float *ks = smem;                                /* [TILE][E + 1] */
  float *vs = ks + KCU_ATTN_TILE * (a.E + 1);      /* [TILE][Ev] */
  float *qs = vs + KCU_ATTN_TILE * a.Ev;           /* [WARPS * ROWS][E] */
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t batch = blockIdx.x / a.n_tiles, tile = blockIdx.x % a.n_tiles;
  int64_t qo, ko, vo, mo, oo;
  kcu_attn_offsets(&a.g, batch, &qo, &ko, &vo, &mo, &oo);
  int64_t row0 = tile * (KCU_ATTN_WARPS * KCU_ATTN_ROWS);
  /* Index math in 32 bits inside a tile: rows by warp, columns by lane, no division. */
  int E = (int)a.E, Ev = (int)a.Ev;
  for (int r = warp; r < KCU_ATTN_WARPS * KCU_ATTN_ROWS; r += KCU_ATTN_WARPS) {
    int64_t row = row0 + r;
    for (int e = lane; e < E; e += 32)
      qs[r * E + e] = row < a.L ? kcu_ld(q, a.dq, qo + row * a.g.q_row + e) : 0.0f;
  }
  float m[KCU_ATTN_ROWS], l[KCU_ATTN_ROWS], acc[KCU_ATTN_ROWS][KCU_ATTN_MAXC];
#pragma unroll
  for (int r = 0; r < KCU_ATTN_ROWS; r++) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < KCU_ATTN_MAXC; c++) acc[r][c] = 0.0f;
  }
  int64_t last_row = row0 + KCU_ATTN_WARPS * KCU_ATTN_ROWS - 1;
  int64_t key_end = a.causal && last_row + 1 < a.S ? last_row + 1 : a.S;
  for (int64_t t0 = 0; t0 < key_end; t0 += KCU_ATTN_TILE) {
    __syncthreads();
    if (a.vec) {
      /* 16 bytes (8 halves) per lane: a warp reads whole K and V rows in one or two loads,
       * all issued before any is used, instead of one 2-byte load per element. */
      int kc = E / 8, chunks = kc + Ev / 8;
      for (int j = warp; j < KCU_ATTN_TILE; j += KCU_ATTN_WARPS) {
        int valid = t0 + j < a.S;
        for (int c = lane; c < chunks; c += 32) {
          int is_k = c < kc;
          const unsigned short *base = (const unsigned short *)(is_k ? k : v) +
                                       (is_k ? ko + (t0 + j) * a.g.k_row + c * 8 : vo + (t0 + j) * a.g.v_row + (c - kc) * 8);
          uint4 raw = valid ? *(const uint4 *)base : make_uint4(0, 0, 0, 0);
          const unsigned short *h = (const unsigned short *)&raw;
          float *dst = is_k ? ks + j * (E + 1) + c * 8 : vs + j * Ev + (c - kc) * 8;
#pragma unroll
          for (int t = 0; t < 8; t++) dst[t] = kcu_ld(h, a.dk, t);
        }
      }
    } else {
      for (int j = warp; j < KCU_ATTN_TILE; j += KCU_ATTN_WARPS) {
        int valid = t0 + j < a.S;
        const int64_t krow = ko + (t0 + j) * a.g.k_row, vrow = vo + (t0 + j) * a.g.v_row;
        for (int e = lane; e < E; e += 32) ks[j * (E + 1) + e] = valid ? kcu_ld(k, a.dk, krow + e) : 0.0f;
        for (int e = lane; e < Ev; e += 32) vs[j * Ev + e] = valid ? kcu_ld(v, a.dv, vrow + e) : 0.0f;
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < KCU_ATTN_ROWS; r++) {
      int64_t i = row0 + warp * KCU_ATTN_ROWS + r;
      if (i >= a.L) continue;
      int64_t key = t0 + lane;
      const float *qrow = qs + (warp * KCU_ATTN_ROWS + r) * E;
      const float *krow = ks + lane * (E + 1);
      float sc = -INFINITY;
      if (key < a.S && !(a.causal && key > i)) {
        float dot = 0.0f;
#pragma unroll 8
        for (int e = 0; e < E; e++) dot += qrow[e] * krow[e];
        sc = dot * a.scale;
        if (a.g.mask_kind) {
          int64_t mi = mo + i * a.g.m_row + key * a.g.m_col;
          if (a.g.mask_kind == 1) sc = ((const unsigned char *)mask)[mi] ? sc : -INFINITY;
          else sc += kcu_ld(mask, a.g.dm, mi);
        }
      }
      float m_new = fmaxf(m[r], kcu_warp_max(sc));
      if (m_new == -INFINITY) continue;
      float p = __expf(sc - m_new);
      float corr = __expf(m[r] - m_new);
      l[r] = l[r] * corr + kcu_warp_sum(p);
      m[r] = m_new;
#pragma unroll
      for (int c = 0; c < KCU_ATTN_MAXC; c++) acc[r][c] *= corr;
      for (int j = 0; j < KCU_ATTN_TILE; j++) {
        float pj = __shfl_sync(0xffffffffu, p, j);
        const float *vrow = vs + j * Ev;
#pragma unroll
        for (int c = 0; c < KCU_ATTN_MAXC; c++) {
          int d = lane + 32 * c;
          if (d < Ev) acc[r][c] += pj * vrow[d];
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < KCU_ATTN_ROWS; r++) {
    int64_t i = row0 + warp * KCU_ATTN_ROWS + r;
    if (i >= a.L) continue;
    float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f; /* a fully masked row gives zeros */
#pragma unroll
    for (int c = 0; c < KCU_ATTN_MAXC; c++) {
      int64_t d = lane + 32 * c;
      if (d < a.Ev) kcu_st(out, a.dout, oo + i * a.g.o_row + d, acc[r][c] * inv);
    }
  }
}

/* Strides of t's matrices (its last two dims) over out's batch dims, broadcast. */
static void kcu_attn_batch_strides(const kcu_tensor *t, const kcu_tensor *out, int64_t *st) {
  kcu_tensor lead = *t;
  lead.rank = t->rank >= 2 ? t->rank - 2 : 0;
  int64_t inner = t->rank >= 2 ? t->dims[t->rank - 2] * t->dims[t->rank - 1] : 1;
  kcu_broadcast_strides(&lead, out->rank - 2, out->dims, st);
  for (int d = 0; d < out->rank - 2; d++) st[d] *= inner;
}

int64_t kcu_attn_geometry_init(kcu_attn_geometry *g, const kcu_tensor *q, const kcu_tensor *k,
                               const kcu_tensor *v, const kcu_tensor *mask,
                               const kcu_tensor *out, int64_t S) {
  int64_t batch = 1;
  memset(g, 0, sizeof *g);
  g->nb = out->rank - 2;
  for (int d = 0; d < g->nb; d++) {
    g->bdims[d] = out->dims[d];
    batch *= out->dims[d];
    g->kv_group[d] = 1;
  }
  /* Grouped-query heads: k's dim -3 divides out's (the checks saw that v's matches k's). */
  if (k && k->rank == out->rank && g->nb >= 1 && k->dims[g->nb - 1] != out->dims[g->nb - 1] &&
      k->dims[g->nb - 1] > 1)
    g->kv_group[g->nb - 1] = out->dims[g->nb - 1] / k->dims[g->nb - 1];
  g->q_row = q ? q->dims[q->rank - 1] : 0;
  g->k_row = k ? k->dims[k->rank - 1] : 0;
  g->v_row = v ? v->dims[v->rank - 1] : 0;
  g->o_row = out->dims[out->rank - 1];
  if (q) kcu_attn_batch_strides(q, out, g->qb);
  if (k) kcu_attn_batch_strides(k, out, g->kb);
  if (v) kcu_attn_batch_strides(v, out, g->vb);
  kcu_attn_batch_strides(out, out, g->ob);
  if (mask) {
    int64_t full[KILN_MAX_RANK], st[KILN_MAX_RANK];
    for (int d = 0; d < out->rank; d++) full[d] = out->dims[d];
    full[out->rank - 1] = S;
    kcu_broadcast_strides(mask, out->rank, full, st);
    for (int d = 0; d < g->nb; d++) g->mb[d] = st[d];
    g->m_row = st[out->rank - 2];
    g->m_col = st[out->rank - 1];
    g->mask_kind = mask->dtype == KILN_BOOL ? 1 : 2;
    g->dm = mask->dtype;
  }
  return batch;
}

int kcu_sdpa_operands(const kiln_op *op, const kcu_tensor *in, const kcu_tensor *out,
                      kcu_tensor *q, kcu_tensor *k, kcu_tensor *v, const kcu_tensor **mask,
                      kcu_tensor *o, kcu_attn_geometry *geo) {
  int has_mask = op->n_iattr > 1 && op->iattr[1];
  int64_t layout = kiln_sdpa_layout(op);
  if (layout != 1) {
    *q = in[0], *k = in[1], *v = in[2], *o = *out;
    *mask = has_mask ? &in[3] : NULL;
    if (layout == 0) return 0;
    int64_t L = out->dims[1], H = out->dims[2], Ev = out->dims[3];
    o->dims[1] = H, o->dims[2] = L;
    kcu_attn_geometry_init(geo, q, k, v, *mask, o, k->dims[2]);
    geo->ob[0] = L * H * Ev; /* [B,H,L,Ev] over [B,L,H,Ev] */
    geo->ob[1] = Ev;
    geo->o_row = H * Ev;
    return 1;
  }
  const kcu_tensor *x = &in[0];
  int64_t B = x->dims[0], L = x->dims[1], H = x->dims[3], E = x->dims[4];
  size_t es = kiln_dtype_size(x->dtype);
  kcu_tensor view = *x;
  view.rank = 4;
  view.dims[0] = B, view.dims[1] = H, view.dims[2] = L, view.dims[3] = E;
  view.numel = B * H * L * E;
  *q = *k = *v = view;
  k->data = (char *)x->data + (size_t)(H * E) * es;
  v->data = (char *)x->data + (size_t)(2 * H * E) * es;
  *o = view;
  o->data = out->data;
  o->dtype = out->dtype;
  *mask = has_mask ? &in[1] : NULL;
  kcu_attn_geometry_init(geo, NULL, NULL, NULL, *mask, o, L);
  geo->qb[0] = geo->kb[0] = geo->vb[0] = L * 3 * H * E;
  geo->qb[1] = geo->kb[1] = geo->vb[1] = E;
  geo->ob[0] = L * H * E;
  geo->ob[1] = E;
  geo->q_row = geo->k_row = geo->v_row = 3 * H * E;
  geo->o_row = H * E;
  return 1;
}

cudaError_t kcu_attention_prepare(int max_head) {
  return cudaFuncSetAttribute(kcu_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              (int)kcu_attn_smem(max_head, max_head));
}

int kcu_attention_appends(const kcu_tensor *q, const kcu_tensor *k, const kcu_tensor *v,
                          const kcu_tensor *mask, const kcu_tensor *out,
                          const kcu_attn_geometry *geo) {
  kcu_attn_geometry g;
  int64_t S = k->dims[k->rank - 2], E = k->dims[k->rank - 1], Ev = v->dims[v->rank - 1];
  if (geo) g = *geo;
  else kcu_attn_geometry_init(&g, q, k, v, mask, out, S);
  /* the caches' matrices [S, E] whole, each new row at its matrix's offset over S; slots and
   * row offsets fit the kernel's 32-bit ints */
  int whole = g.k_row == E && g.v_row == Ev && S > 0 && S < INT32_MAX &&
              k->numel / S < INT32_MAX && v->numel / S < INT32_MAX;
  for (int d = 0; whole && d < g.nb; d++)
    whole = g.kb[d] % (S * E) == 0 && g.vb[d] % (S * Ev) == 0;
  return whole && out->numel > 0 && q->dims[q->rank - 2] <= KCU_ATTN_SPLIT_ROWS &&
         kcu_attention_decode_warp_path(&g, k, v); /* (an empty output launches nothing) */
}

cudaError_t kcu_attention(cudaStream_t s, const kcu_tensor *q, const kcu_tensor *k,
                          const kcu_tensor *v, const kcu_tensor *mask, const kcu_tensor *out,
                          int causal, float scale, const kcu_attn_geometry *geo,
                          const kcu_dec_scratch *dec, const kcu_kv_append *append) {
  if (append && (!dec || q->dims[q->rank - 2] > KCU_ATTN_SPLIT_ROWS))
    return cudaErrorInvalidValue;
  if (out->numel == 0) return cudaSuccess;
  kcu_attn_args a;
  memset(&a, 0, sizeof a);
  a.L = q->dims[q->rank - 2];
  a.E = q->dims[q->rank - 1];
  a.S = k->dims[k->rank - 2];
  a.Ev = v->dims[v->rank - 1];
  int64_t batch = 1;
  if (geo) {
    a.g = *geo;
    for (int d = 0; d < a.g.nb; d++) batch *= a.g.bdims[d];
  } else {
    batch = kcu_attn_geometry_init(&a.g, q, k, v, mask, out, a.S);
  }
  if (dec && a.L <= KCU_ATTN_SPLIT_ROWS) /* decoding: the keys split among warps or blocks */
    return kcu_attention_decode(s, &a.g, batch, q, k, v, mask, out, causal, scale, dec, append);
  a.causal = causal;
  a.scale = scale;
  a.dq = q->dtype; a.dk = k->dtype; a.dv = v->dtype; a.dout = out->dtype;
  int bits16 = (k->dtype == KILN_F16 || k->dtype == KILN_BF16) && v->dtype == k->dtype;
  a.vec = bits16 && a.E % 8 == 0 && a.Ev % 8 == 0 && ((uintptr_t)k->data % 16) == 0 &&
          ((uintptr_t)v->data % 16) == 0;
  a.vec = a.vec && a.g.k_row % 8 == 0 && a.g.v_row % 8 == 0;
  for (int d = 0; a.vec && d < a.g.nb; d++) a.vec = a.g.kb[d] % 8 == 0 && a.g.vb[d] % 8 == 0;
  int64_t rows = KCU_ATTN_WARPS * KCU_ATTN_ROWS;
  a.n_tiles = (a.L + rows - 1) / rows;
  kcu_launch_early(kcu_attention_kernel, (unsigned)(batch * a.n_tiles), KCU_ATTN_WARPS * 32,
                   kcu_attn_smem(a.E, a.Ev), s, a, q->data, k->data, v->data,
                   mask ? mask->data : NULL, out->data);
  return cudaGetLastError();
}

/* ---------------------------------------------------------------- softmax over score rows */

#define KCU_ATTN_ROW_THREADS 128

typedef struct kcu_attn_rows_args {
  kcu_attn_geometry g; /* mask strides only */
  int64_t L, S;
  int dp, causal;
  float scale;
} kcu_attn_rows_args;

static __device__ __forceinline__ float kcu_attn_logit(const kcu_attn_rows_args *a,
                                                       const float *row, const void *mask,
                                                       int64_t mo, int64_t i, int64_t j) {
  if (a->causal && j > i) return -INFINITY;
  float sc = row[j] * a->scale;
  if (a->g.mask_kind == 1)
    return ((const unsigned char *)mask)[mo + i * a->g.m_row + j * a->g.m_col] ? sc : -INFINITY;
  if (a->g.mask_kind == 2) sc += kcu_ld(mask, a->g.dm, mo + i * a->g.m_row + j * a->g.m_col);
  return sc;
}

/* One block per score row. The row is read three times (max, sum, write), from L2 after the
 * first. A 16-bit P is written over the start of its own f32 row, chunk by chunk after the
 * chunk was read: a chunk's P bytes end before the next chunk's scores begin. */
__global__ void __launch_bounds__(KCU_ATTN_ROW_THREADS)
    kcu_attention_softmax_kernel(kcu_attn_rows_args a, float *scores, const void *mask) {
  kcu_begin_early();
  __shared__ float red[KCU_ATTN_ROW_THREADS / 32];
  int64_t r = blockIdx.x;
  int64_t i = r % a.L, qo, ko, vo, mo, oo;
  kcu_attn_offsets(&a.g, r / a.L, &qo, &ko, &vo, &mo, &oo);
  float *row = scores + r * a.S;
  float most = -INFINITY;
  for (int64_t j = threadIdx.x; j < a.S; j += blockDim.x)
    most = fmaxf(most, kcu_attn_logit(&a, row, mask, mo, i, j));
  most = kcu_block_reduce(most, 1, red);
  float sum = 0.0f;
  if (most != -INFINITY)
    for (int64_t j = threadIdx.x; j < a.S; j += blockDim.x)
      sum += expf(kcu_attn_logit(&a, row, mask, mo, i, j) - most);
  sum = kcu_block_reduce(sum, 0, red);
  float inv = most != -INFINITY ? 1.0f / sum : 0.0f; /* every key masked: zeros */
  for (int64_t j0 = 0; j0 < a.S; j0 += blockDim.x) {
    int64_t j = j0 + threadIdx.x;
    float p = 0.0f;
    if (j < a.S && most != -INFINITY) p = expf(kcu_attn_logit(&a, row, mask, mo, i, j) - most) * inv;
    __syncthreads();
    if (j < a.S) kcu_st(row, a.dp, j, p);
  }
}

cudaError_t kcu_attention_softmax(cudaStream_t s, float *scores, kiln_dtype p_dtype,
                                  const kcu_tensor *mask, const kcu_tensor *out, int64_t S,
                                  int causal, float scale) {
  if (out->numel == 0) return cudaSuccess;
  kcu_attn_rows_args a;
  memset(&a, 0, sizeof a);
  a.L = out->dims[out->rank - 2];
  a.S = S;
  int64_t rows = a.L * kcu_attn_geometry_init(&a.g, NULL, NULL, NULL, mask, out, S);
  a.dp = p_dtype;
  a.causal = causal;
  a.scale = scale;
  kcu_launch_early(kcu_attention_softmax_kernel, (unsigned)rows, KCU_ATTN_ROW_THREADS, 0, s,
      a, scores, mask ? mask->data : NULL);
  return cudaGetLastError();
}
