/* SDPA on the tensor cores without a score matrix, FlashAttention-2's loop: a block of four
 * warps owns 64 query rows (16 per warp) and walks K and V 64 keys at a time through shared
 * memory (cp.async). S = Q K^T and O += P V are mma.sync m16n8k16 with f32 accumulators in
 * registers; an online softmax in f32 (base 2, log2(e) folded into the scale) rescales O as a
 * row's max grows, and P goes from S's accumulators into the next mma's A operand without
 * leaving registers, because the two fragment layouts coincide.
 * Under grouped-query attention a block's 64 rows are 16, 32 or 64 query rows of 4, 2 or 1 of
 * the query heads that share one key/value head (a warp per head at 4), so each K and V tile is
 * read once for all of them. Q stays in shared memory and is read again for each tile, and K
 * and V have one buffer each, K's next tile loading while this tile's softmax and P V run: 168
 * registers and 52 KB for head dim 128, three blocks a multiprocessor. (Measured on an H200
 * against the earlier kernel, Q in registers and K, V double-buffered at 252 registers and 87 KB,
 * two blocks: a Llama-family prefill, batch 32, 32/8 heads, 128 causal, 78 to 59 us.)
 * f16 and bf16, head dims 64 and 128 (E == Ev); tails of L and S are zero-filled and masked. */
#include "cuda_device.cuh"

#include <string.h>

#define KCU_FLASH_WARPS 4
#define KCU_FLASH_BQ 64 /* query rows per block, 16 per warp */
#define KCU_FLASH_BK 64 /* keys per shared memory tile */
#define KCU_FLASH_PAD 8 /* halves per row: the 8 rows one ldmatrix reads hit distinct banks */
#define KCU_FLASH_MAXD 128
#define KCU_FLASH_LOG2E 1.4426950408889634f

typedef struct kcu_flash_args {
  kcu_attn_geometry g;
  int64_t batch, L, S;
  int n_qtiles;
  int causal;
  int heads_log2;   /* a block takes 1 << heads_log2 consecutive heads of one k/v head */
  float scale_log2; /* scale * log2(e): scores become base-2 logits in one multiply */
} kcu_flash_args;

/* Dynamic shared memory: the Q tile, a K and a V tile, rows padded. */
static size_t kcu_flash_smem(int D) {
  return (size_t)(KCU_FLASH_BQ + 2 * KCU_FLASH_BK) * (size_t)(D + KCU_FLASH_PAD) * 2u;
}

static __device__ __forceinline__ void kcu_cp_async16(uint32_t dst, const void *src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}
static __device__ __forceinline__ void kcu_cp_commit(void) {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* Waits until at most one of this thread's copy groups, the last committed, is in flight. */
static __device__ __forceinline__ void kcu_cp_wait_but_last(void) {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

static __device__ __forceinline__ void kcu_ldsm4(uint32_t *r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
static __device__ __forceinline__ void kcu_ldsm4_t(uint32_t *r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

/* Two floats as one register of two 16-bit values, the first in the low half. */
static __device__ __forceinline__ uint32_t kcu_pack2(float x, float y, const int bf16) {
  if (bf16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *(uint32_t *)&h;
  }
  __half2 h = __floats2half2_rn(x, y);
  return *(uint32_t *)&h;
}

/* Starts copying rows [row0, row0 + 64) of a [rows, D] matrix into a padded smem tile; rows
 * past the end are zero-filled (a zero V row times a zero P adds nothing, where garbage could
 * add NaN). */
static __device__ __forceinline__ void kcu_flash_load(uint32_t dst, const unsigned short *src,
                                                      int row0, int rows, int64_t stride,
                                                      const int D) {
  const int chunks = D / 8; /* 16-byte chunks per row */
#pragma unroll
  for (int it = 0; it < KCU_FLASH_BK * chunks / (KCU_FLASH_WARPS * 32); it++) {
    int c = (int)threadIdx.x + it * KCU_FLASH_WARPS * 32, r = c / chunks, col = c % chunks;
    int ok = row0 + r < rows;
    const unsigned short *g = ok ? src + (int64_t)(row0 + r) * stride + col * 8 : src;
    kcu_cp_async16(dst + (uint32_t)((r * (D + KCU_FLASH_PAD) + col * 8) * 2), g, ok ? 16 : 0);
  }
}

/* An additive mask's value at i in base 2. Not inlined: the scores' unrolled steps each call it
 * only under an additive mask, and inlined its dtype switch would multiply their code. */
static __device__ __noinline__ float kcu_flash_additive(const void *mask, int dm, int64_t i) {
  return kcu_ld(mask, dm, i) * KCU_FLASH_LOG2E;
}

/* D and bf16 are compile-time constants at each kernel below, so loops over head dims unroll
 * and the fragment arrays stay in registers. */
static __device__ __forceinline__ void kcu_flash_body(const kcu_flash_args *a, const void *q,
                                                      const void *k, const void *v,
                                                      const void *mask, void *out, const int D,
                                                      const int bf16) {
  extern __shared__ __align__(16) unsigned char kcu_flash_sm[];
  const int ROWB = (D + KCU_FLASH_PAD) * 2; /* bytes per smem row */
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int g = lane >> 2, t4 = lane & 3;     /* mma fragment row group and column pair */
  int lm = lane >> 3, lr = lane & 7;    /* ldmatrix: which 8x8 matrix this lane addresses, its row */

  /* Query tiles run last first: under causal masking they carry the most keys, and blocks
   * are dispatched roughly in index order. A block's heads are consecutive in the innermost
   * batch dim; each takes rows_log2 = 6 - heads_log2 query rows, warp w the head w >> (2 -
   * heads_log2). */
  const int hl = a->heads_log2, rows_log2 = 6 - hl;
  int64_t groups = a->batch >> hl, blk = blockIdx.x;
  int qtile = a->n_qtiles - 1 - (int)(blk / groups);
  /* The warp's mask and output offsets wait in shared memory: registers go to the tiles. */
  __shared__ int64_t kcu_flash_offsets[KCU_FLASH_WARPS][2];
  int64_t qo, ko, vo, mo, oo;
  kcu_attn_offsets(&a->g, (blk % groups) << hl, &qo, &ko, &vo, &mo, &oo);
  const int nb = a->g.nb;
  const int64_t qh = hl ? a->g.qb[nb - 1] : 0, head = warp >> (2 - hl);
  if (hl) mo += head * a->g.mb[nb - 1], oo += head * a->g.ob[nb - 1];
  if (lane == 0) kcu_flash_offsets[warp][0] = mo, kcu_flash_offsets[warp][1] = oo;
  __syncwarp(); /* the warp's other lanes read them, the first before any __syncthreads */
  const unsigned short *qg = (const unsigned short *)q + qo;
  const unsigned short *kg = (const unsigned short *)k + ko;
  const unsigned short *vg = (const unsigned short *)v + vo;
  /* rows and keys in 32 bits: kcu_flash_fits holds L and S under 2^31 */
  const int L = (int)a->L, S = (int)a->S;
  int r0 = qtile << rows_log2, wrow = r0 + (warp & ((1 << (2 - hl)) - 1)) * 16;
  int key_end = a->causal && r0 + (1 << rows_log2) < S ? r0 + (1 << rows_log2) : S;
  int n_tiles = (key_end + KCU_FLASH_BK - 1) / KCU_FLASH_BK;

  uint32_t sq = (uint32_t)__cvta_generic_to_shared(kcu_flash_sm);
  uint32_t sk = sq + (uint32_t)(KCU_FLASH_BQ * ROWB), sv = sk + (uint32_t)(KCU_FLASH_BK * ROWB);
  { /* smem row r: query row r0 + r % (1 << rows_log2) of the block's head r >> rows_log2 */
    const int chunks = D / 8;
#pragma unroll
    for (int it = 0; it < KCU_FLASH_BQ * chunks / (KCU_FLASH_WARPS * 32); it++) {
      int c = (int)threadIdx.x + it * KCU_FLASH_WARPS * 32, r = c / chunks, col = c % chunks;
      int row = r0 + (r & ((1 << rows_log2) - 1)), ok = row < L;
      const unsigned short *src =
          ok ? qg + (r >> rows_log2) * qh + (int64_t)row * a->g.q_row + col * 8 : qg;
      kcu_cp_async16(sq + (uint32_t)((r * (D + KCU_FLASH_PAD) + col * 8) * 2), src, ok ? 16 : 0);
    }
  }
  kcu_flash_load(sk, kg, 0, S, a->g.k_row, D);
  kcu_cp_commit();
  kcu_flash_load(sv, vg, 0, S, a->g.v_row, D);
  kcu_cp_commit();

  float o[KCU_FLASH_MAXD / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* rows g and g + 8 */
  /* This warp's Q rows as A fragments, K's as B's (plain ldmatrix gives K^T's), V's by the
   * transposing ldmatrix. */
  const uint32_t qaddr = sq + (uint32_t)((warp * 16 + lr + (lm & 1) * 8) * ROWB + (lm >> 1) * 16);
  const uint32_t kaddr = sk + (uint32_t)((lr + (lm >> 1) * 8) * ROWB + (lm & 1) * 16);
  const uint32_t vaddr = sv + (uint32_t)((lr + (lm & 1) * 8) * ROWB + (lm >> 1) * 16);

  for (int t = 0; t < n_tiles; t++) {
    int t0 = t * KCU_FLASH_BK;
    /* A bool mask's bits for this tile's 32 scores of this lane, loaded before the wait for K
     * so the two round trips overlap: every load unconditional (an index out of range reads
     * the first element; those scores are masked below), so all 32 are in flight at once,
     * and one register holds them. An additive mask is read where it is added. */
    uint32_t kept = 0;
    if (a->g.mask_kind == 1) {
      int64_t mo = kcu_flash_offsets[warp][0];
#pragma unroll
      for (int n = 0; n < KCU_FLASH_BK / 8; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          int i = wrow + g + (c >> 1) * 8, j = t0 + n * 8 + 2 * t4 + (c & 1);
          int64_t mi = i < L && j < S ? mo + i * a->g.m_row + j * a->g.m_col : mo;
          kept |= (uint32_t)(((const unsigned char *)mask)[mi] != 0) << (n * 4 + c);
        }
    }
    kcu_cp_wait_but_last(); /* K (and Q) landed; V may still be in flight */
    __syncthreads();
    /* Keys at or past kmax in this tile are masked for all 16 rows of the warp (beyond S, or
     * beyond the warp's last row when causal): their mma steps are skipped. */
    int lim = S - t0;
    if (a->causal && wrow + 16 - t0 < lim) lim = wrow + 16 - t0;
    int kmax = lim < KCU_FLASH_BK ? lim : KCU_FLASH_BK; /* <= 0: all masked, skipped */

    float s[KCU_FLASH_BK / 8][4];
#pragma unroll
    for (int n = 0; n < KCU_FLASH_BK / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    if (kmax > 0) { /* one test around the loop: the steps' ldmatrix loads stay predicated */
#pragma unroll
      for (int ks = 0; ks < D / 16; ks++) {
        uint32_t qa[4];
        kcu_ldsm4(qa, qaddr + (uint32_t)(ks * 32));
#pragma unroll
        for (int np = 0; np < KCU_FLASH_BK / 16; np++) {
          if (np * 16 >= kmax) continue;
          uint32_t b[4];
          kcu_ldsm4(b, kaddr + (uint32_t)(np * 16 * ROWB + ks * 32));
          kcu_mma(s[2 * np], qa, b[0], b[1], bf16);
          kcu_mma(s[2 * np + 1], qa, b[2], b[3], bf16);
        }
      }
    }
    __syncthreads(); /* every warp is done with this K tile: the next one loads */
    if (t + 1 < n_tiles) kcu_flash_load(sk, kg, t0 + KCU_FLASH_BK, S, a->g.k_row, D);
    kcu_cp_commit();

    if (kmax > 0) {
      int check = a->g.mask_kind || t0 + KCU_FLASH_BK > S ||
                  (a->causal && t0 + KCU_FLASH_BK - 1 > wrow);
      if (!check) {
#pragma unroll
        for (int n = 0; n < KCU_FLASH_BK / 8; n++)
#pragma unroll
          for (int c = 0; c < 4; c++) s[n][c] *= a->scale_log2;
      } else {
        /* Predicated, not branched: the additive mask's load is a call, so the 32 unrolled
         * steps stay a few instructions each. */
        int64_t mo = a->g.mask_kind == 2 ? kcu_flash_offsets[warp][0] : 0;
#pragma unroll
        for (int n = 0; n < KCU_FLASH_BK / 8; n++)
#pragma unroll
          for (int c = 0; c < 4; c++) {
            int i = wrow + g + (c >> 1) * 8, j = t0 + n * 8 + 2 * t4 + (c & 1);
            int masked = j >= S || (a->causal && j > i) ||
                         (a->g.mask_kind == 1 && !(kept >> (n * 4 + c) & 1u));
            float x = s[n][c] * a->scale_log2;
            if (a->g.mask_kind == 2 && !masked && i < L) /* rows past L are padding */
              x += kcu_flash_additive(mask, a->g.dm, mo + i * a->g.m_row + j * a->g.m_col);
            s[n][c] = masked ? -INFINITY : x;
          }
      }

      /* Online softmax; the four lanes of a quad share a row. */
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < KCU_FLASH_BK / 8; n++) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float m_new = fmaxf(m[h], mx);
        float base = m_new == -INFINITY ? 0.0f : m_new; /* every key so far masked: p = 0, not NaN */
        float corr = exp2f(m[h] - base);
        m[h] = m_new;
        l[h] *= corr;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
          o[n][2 * h] *= corr;
          o[n][2 * h + 1] *= corr;
        }
#pragma unroll
        for (int n = 0; n < KCU_FLASH_BK / 8; n++) {
          s[n][2 * h] = exp2f(s[n][2 * h] - base);
          s[n][2 * h + 1] = exp2f(s[n][2 * h + 1] - base);
          l[h] += s[n][2 * h] + s[n][2 * h + 1]; /* this lane's part; the quad sums at the end */
        }
      }
    }
    kcu_cp_wait_but_last(); /* V landed; the next K may still be in flight */
    __syncthreads();

    /* O += P V: S's accumulators for keys 16kk..16kk+15 are exactly P's A fragment. */
#pragma unroll
    for (int kk = 0; kk < KCU_FLASH_BK / 16; kk++) {
      if (kk * 16 >= kmax) continue;
      uint32_t pa[4] = {kcu_pack2(s[2 * kk][0], s[2 * kk][1], bf16),
                        kcu_pack2(s[2 * kk][2], s[2 * kk][3], bf16),
                        kcu_pack2(s[2 * kk + 1][0], s[2 * kk + 1][1], bf16),
                        kcu_pack2(s[2 * kk + 1][2], s[2 * kk + 1][3], bf16)};
#pragma unroll
      for (int dp = 0; dp < D / 16; dp++) {
        uint32_t b[4];
        kcu_ldsm4_t(b, vaddr + (uint32_t)(kk * 16 * ROWB + dp * 32));
        kcu_mma(o[2 * dp], pa, b[0], b[1], bf16);
        kcu_mma(o[2 * dp + 1], pa, b[2], b[3], bf16);
      }
    }
    __syncthreads(); /* every warp is done with this V tile: the next one loads */
    if (t + 1 < n_tiles) kcu_flash_load(sv, vg, t0 + KCU_FLASH_BK, S, a->g.v_row, D);
    kcu_cp_commit();
  }

  /* Normalize, stage the warp's 16 rows in its own rows of the Q tile (only it read them),
   * then write whole rows with 16-byte stores. */
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    inv[h] = l[h] > 0.0f ? 1.0f / l[h] : 0.0f; /* a fully masked row gives zeros */
  }
  unsigned char *stage = kcu_flash_sm + warp * 16 * ROWB;
#pragma unroll
  for (int n = 0; n < D / 8; n++)
#pragma unroll
    for (int h = 0; h < 2; h++)
      *(uint32_t *)(stage + (g + 8 * h) * ROWB + (n * 8 + 2 * t4) * 2) =
          kcu_pack2(o[n][2 * h] * inv[h], o[n][2 * h + 1] * inv[h], bf16);
  __syncwarp();
  unsigned short *og = (unsigned short *)out + kcu_flash_offsets[warp][1];
  const int chunks = D / 8;
#pragma unroll
  for (int it = 0; it < 16 * chunks / 32; it++) {
    int c = lane + it * 32, r = c / chunks, col = c % chunks;
    int row = wrow + r;
    if (row < L)
      *(uint4 *)(og + (int64_t)row * a->g.o_row + col * 8) =
          *(const uint4 *)(stage + r * ROWB + col * 16);
  }
}

#define KCU_FLASH_KERNEL(name, D, BF16)                                                       \
  __global__ void __launch_bounds__(KCU_FLASH_WARPS * 32, 3)                                   \
      name(kcu_flash_args a, const void *q, const void *k, const void *v, const void *mask,    \
           void *out) {                                                                        \
    kcu_begin_early();                                                                         \
    kcu_flash_body(&a, q, k, v, mask, out, D, BF16);                                           \
  }
KCU_FLASH_KERNEL(kcu_flash_f16_64, 64, 0)
KCU_FLASH_KERNEL(kcu_flash_f16_128, 128, 0)
KCU_FLASH_KERNEL(kcu_flash_bf16_64, 64, 1)
KCU_FLASH_KERNEL(kcu_flash_bf16_128, 128, 1)

/* Batch strides of t (its last two dims excluded) broadcast to out's batch dims. */
int kcu_flash_fits(const kcu_tensor *q, const kcu_tensor *k, const kcu_tensor *v,
                   const kcu_tensor *mask, const kcu_tensor *out) {
  kiln_dtype dt = out->dtype;
  if ((dt != KILN_F16 && dt != KILN_BF16) || q->dtype != dt || k->dtype != dt || v->dtype != dt)
    return 0;
  if (q->rank < 2 || k->rank < 2 || v->rank < 2 || out->rank != q->rank ||
      out->rank - 2 > KCU_ATTN_BATCH)
    return 0;
  int64_t L = q->dims[q->rank - 2], E = q->dims[q->rank - 1], S = k->dims[k->rank - 2];
  if ((E != 64 && E != 128) || k->dims[k->rank - 1] != E || v->dims[v->rank - 1] != E ||
      v->dims[v->rank - 2] != S || out->dims[out->rank - 1] != E)
    return 0;
  if (L < 1 || S < 1 || L > INT32_MAX || S > INT32_MAX || out->numel < 1) return 0;
  if (L <= KCU_ATTN_SPLIT_ROWS) return 0; /* decoding: the fused kernel splits the keys instead */
  /* One block per 64 query rows of each batch matrix: at most 2^31 - 1 blocks. */
  if ((out->numel / (L * E)) * ((L + KCU_FLASH_BQ - 1) / KCU_FLASH_BQ) > INT32_MAX) return 0;
  if (mask && mask->dtype != KILN_BOOL && mask->dtype != KILN_F32 && mask->dtype != KILN_F16 &&
      mask->dtype != KILN_BF16)
    return 0;
  /* Rows move in 16-byte copies; every row and batch stride is a multiple of 64 elements. */
  return (uintptr_t)q->data % 16 == 0 && (uintptr_t)k->data % 16 == 0 &&
         (uintptr_t)v->data % 16 == 0 && (uintptr_t)out->data % 16 == 0;
}

cudaError_t kcu_flash_prepare(void) {
  cudaError_t rc = cudaSuccess;
  const void *kernels[4] = {(const void *)kcu_flash_f16_64, (const void *)kcu_flash_bf16_64,
                            (const void *)kcu_flash_f16_128, (const void *)kcu_flash_bf16_128};
  for (int i = 0; i < 4 && rc == cudaSuccess; i++)
    rc = cudaFuncSetAttribute(kernels[i], cudaFuncAttributeMaxDynamicSharedMemorySize,
                              (int)kcu_flash_smem(i < 2 ? 64 : 128));
  return rc;
}

cudaError_t kcu_flash_attention(cudaStream_t s, const kcu_tensor *q, const kcu_tensor *k,
                                const kcu_tensor *v, const kcu_tensor *mask,
                                const kcu_tensor *out, int causal, float scale,
                                const kcu_attn_geometry *geo) {
  kcu_flash_args a;
  memset(&a, 0, sizeof a);
  a.L = q->dims[q->rank - 2];
  a.S = k->dims[k->rank - 2];
  int D = (int)q->dims[q->rank - 1];
  if (geo) {
    a.g = *geo;
    a.batch = 1;
    for (int d = 0; d < a.g.nb; d++) a.batch *= a.g.bdims[d];
  } else {
    a.batch = kcu_attn_geometry_init(&a.g, q, k, v, mask, out, a.S);
  }
  a.causal = causal;
  a.scale_log2 = scale * KCU_FLASH_LOG2E;
  /* Heads of one k/v head share a block (4, 2 or 1 of them): its K and V tiles serve all. */
  int64_t group = a.g.nb > 0 ? a.g.kv_group[a.g.nb - 1] : 1;
  a.heads_log2 = group % 4 == 0 ? 2 : group % 2 == 0 ? 1 : 0;
  int64_t rows = KCU_FLASH_BQ >> a.heads_log2;
  a.n_qtiles = (int)((a.L + rows - 1) / rows);
  int bf16 = out->dtype == KILN_BF16;
  void (*kernel)(kcu_flash_args, const void *, const void *, const void *, const void *, void *) =
      D == 64 ? (bf16 ? kcu_flash_bf16_64 : kcu_flash_f16_64)
              : (bf16 ? kcu_flash_bf16_128 : kcu_flash_f16_128);
  kcu_launch_early(kernel, (unsigned)((a.batch >> a.heads_log2) * a.n_qtiles), KCU_FLASH_WARPS * 32,
                   kcu_flash_smem(D), s, a, q->data, k->data, v->data,
                   mask ? mask->data : NULL, out->data);
  return cudaGetLastError();
}
