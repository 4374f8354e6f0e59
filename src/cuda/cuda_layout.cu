/* Data movement: permute, expand, slice, select, cat, copy and reshape, all expressed as one
 * strided copy (an output index maps to a source offset through per-dim strides). The copy is
 * simplified (dims merged, elements widened to 16 bytes where every stride allows), then runs
 * on the first kernel that fits: leading columns of rows at an aligned pitch, a contiguous
 * destination by 16-byte vectors, or an element per thread. */
#include "cuda_device.cuh"

#include <string.h>

typedef struct kcu_copy_args {
  kcu_copy_geom g;
  int64_t n;
} kcu_copy_args;

#define KCU_DEFINE_COPY(name, type)                                                        \
  __global__ void name(kcu_copy_args a, const type *src, type *dst) {                     \
    kcu_begin_early();                                                                    \
    int64_t stride = (int64_t)gridDim.x * blockDim.x;                                     \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) { \
      int64_t s = a.g.src_base, t = a.g.dst_base, r = i;                                  \
      for (int d = a.g.rank - 1; d >= 0; d--) {                                           \
        int64_t c = r % a.g.dims[d];                                                      \
        r /= a.g.dims[d];                                                                 \
        s += c * a.g.src_strides[d];                                                      \
        t += c * a.g.dst_strides[d];                                                      \
      }                                                                                   \
      dst[t] = src[s];                                                                    \
    }                                                                                     \
  }

/* The same in 32-bit index math (a 64-bit division costs several times a 32-bit one), for
 * copies whose every index and offset fits. */
typedef struct kcu_copy_args32 {
  int rank;
  unsigned dims[KILN_MAX_RANK], src_strides[KILN_MAX_RANK], dst_strides[KILN_MAX_RANK];
  unsigned src_base, dst_base, n;
} kcu_copy_args32;

#define KCU_DEFINE_COPY32(name, type)                                                      \
  __global__ void name(kcu_copy_args32 a, const type *src, type *dst) {                   \
    kcu_begin_early();                                                                    \
    unsigned stride = gridDim.x * blockDim.x;                                             \
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) {      \
      unsigned s = a.src_base, t = a.dst_base, r = i;                                     \
      for (int d = a.rank - 1; d >= 0; d--) {                                             \
        unsigned c = r % a.dims[d];                                                       \
        r /= a.dims[d];                                                                   \
        s += c * a.src_strides[d];                                                        \
        t += c * a.dst_strides[d];                                                        \
      }                                                                                   \
      dst[t] = src[s];                                                                    \
    }                                                                                     \
  }

KCU_DEFINE_COPY32(kcu_copy32_1, unsigned char)
KCU_DEFINE_COPY32(kcu_copy32_2, unsigned short)
KCU_DEFINE_COPY32(kcu_copy32_4, unsigned int)
KCU_DEFINE_COPY32(kcu_copy32_8, unsigned long long)
KCU_DEFINE_COPY32(kcu_copy32_16, uint4)

/* The first L elements of each of `rows` rows at a pitch of P elements (16-byte aligned rows,
 * P at least L rounded up to a vector) into a contiguous, 16-byte aligned destination: a GEMM's
 * output at N 50257 taken out of its padded pitch. Each destination row starts at its own
 * offset within a vector, so every aligned 16-byte vector of it is two aligned source vectors
 * funnel-shifted by one per-row byte count; the row's unaligned head and tail go by bytes.
 * Loads and stores are 16 bytes wide, and no vector read lies past a row's pitch. */
static __device__ __forceinline__ unsigned kcu_pick4(unsigned q, unsigned a, unsigned b,
                                                     unsigned c, unsigned d) {
  return q == 0 ? a : q == 1 ? b : q == 2 ? c : d;
}

__global__ void kcu_pitch_rows(const uint4 *src, uint4 *dst, unsigned rows, unsigned L,
                               unsigned P, int es_log) {
  kcu_begin_early();
  const unsigned W = 16u >> es_log, es = 1u << es_log;
  for (unsigned r = blockIdx.y; r < rows; r += gridDim.y) {
    unsigned long long d0 = (unsigned long long)r * L; /* the row's first destination element */
    unsigned long long lo = (d0 + W - 1) / W * W, hi = (d0 + L) / W * W, end = d0 + L;
    if (lo > end) lo = end;
    unsigned long long n_vec = hi > lo ? (hi - lo) / W : 0;
    unsigned b = (unsigned)((lo - d0) << es_log); /* byte shift into the row's vectors: 0-15 */
    unsigned q = b >> 2, sh = (b & 3u) * 8u;
    const uint4 *row = src + (unsigned long long)r * (P / W);
    for (unsigned long long j = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         j < n_vec; j += (unsigned long long)gridDim.x * blockDim.x) {
      uint4 x = row[j], y = b ? row[j + 1] : x;
      unsigned t0 = kcu_pick4(q, x.x, x.y, x.z, x.w), t1 = kcu_pick4(q, x.y, x.z, x.w, y.x);
      unsigned t2 = kcu_pick4(q, x.z, x.w, y.x, y.y), t3 = kcu_pick4(q, x.w, y.x, y.y, y.z);
      unsigned t4 = kcu_pick4(q, y.x, y.y, y.z, y.w);
      uint4 o;
      o.x = __funnelshift_r(t0, t1, sh), o.y = __funnelshift_r(t1, t2, sh);
      o.z = __funnelshift_r(t2, t3, sh), o.w = __funnelshift_r(t3, t4, sh);
      dst[lo / W + j] = o;
    }
    if (blockIdx.x == 0) { /* head [d0, lo) and tail [max(hi, lo), end), byte by byte */
      const unsigned char *s8 = (const unsigned char *)row;
      unsigned char *d8 = (unsigned char *)dst;
      unsigned head = (unsigned)(lo - d0) * es, from = (unsigned)((hi > lo ? hi : lo) - d0) * es;
      for (unsigned t = threadIdx.x; t < head; t += blockDim.x) d8[d0 * es + t] = s8[t];
      for (unsigned t = from + threadIdx.x; t < L * es; t += blockDim.x) d8[d0 * es + t] = s8[t];
    }
  }
}

/* Whether g (simplified) is the first dims[1] elements of rows at an aligned pitch, copied into
 * a contiguous destination: what kcu_pitch_rows takes. */
static int kcu_pitch_rows_fit(const kcu_copy_geom *g, size_t elem_size, const void *src,
                              const void *dst) {
  if (g->rank != 2 || elem_size >= 16 || g->src_strides[1] != 1 || g->dst_strides[1] != 1 ||
      g->dst_strides[0] != g->dims[1])
    return 0;
  int64_t w = (int64_t)(16 / elem_size), pitch = g->src_strides[0];
  return pitch % w == 0 && pitch >= (g->dims[1] + w - 1) / w * w &&
         ((uintptr_t)src + (uintptr_t)g->src_base * elem_size) % 16 == 0 &&
         ((uintptr_t)dst + (uintptr_t)g->dst_base * elem_size) % 16 == 0;
}

/* A copy into one contiguous, 16-byte aligned destination whose rows (innermost dim) are at
 * least a vector long: each thread writes one 16-byte vector of W elements, gathered from at
 * most two source rows, so the index math (one row decode per vector) and the stores are paid
 * per 16 bytes rather than per element. Rows of an odd width that kcu_pitch_rows does not take
 * (a slice one element in, a permute with an odd innermost dim) run here. */
static __device__ __forceinline__ unsigned kcu_row_start(const kcu_copy_args32 &a, unsigned row) {
  unsigned s = a.src_base;
  for (int d = a.rank - 2; d >= 0; d--) {
    unsigned c = row % a.dims[d];
    row /= a.dims[d];
    s += c * a.src_strides[d];
  }
  return s;
}

#define KCU_DEFINE_ROWS(name, type)                                                        \
  __global__ void name(kcu_copy_args32 a, const type *src, type *dst) {                   \
    kcu_begin_early();                                                                    \
    const unsigned W = 16 / sizeof(type), L = a.dims[a.rank - 1];                         \
    const unsigned step = a.src_strides[a.rank - 1], n_vec = a.n / W;                     \
    unsigned stride = gridDim.x * blockDim.x, first = blockIdx.x * blockDim.x + threadIdx.x; \
    for (unsigned v = first; v < n_vec; v += stride) {                                    \
      unsigned row = v * W / L, col = v * W - row * L, s = kcu_row_start(a, row) + col * step; \
      type x[16 / sizeof(type)];                                                          \
      _Pragma("unroll")                                                                   \
      for (unsigned k = 0; k < W; k++, col++, s += step) {                                \
        if (col == L) s = kcu_row_start(a, ++row), col = 0;                               \
        x[k] = src[s];                                                                    \
      }                                                                                   \
      uint4 packed;                                                                       \
      memcpy(&packed, x, sizeof packed);                                                  \
      ((uint4 *)(dst + a.dst_base))[v] = packed;                                          \
    }                                                                                     \
    for (unsigned i = n_vec * W + first; i < a.n; i += stride) {                          \
      unsigned row = i / L;                                                               \
      dst[a.dst_base + i] = src[kcu_row_start(a, row) + (i - row * L) * step];            \
    }                                                                                     \
  }

KCU_DEFINE_ROWS(kcu_rows1, unsigned char)
KCU_DEFINE_ROWS(kcu_rows2, unsigned short)
KCU_DEFINE_ROWS(kcu_rows4, unsigned int)
KCU_DEFINE_ROWS(kcu_rows8, unsigned long long)

/* Whether the rows kernel fits b: a contiguous destination starting on a 16-byte boundary, rows
 * of at least one vector, elements narrower than a vector. */
static int kcu_rows_fit(const kcu_copy_args32 *b, size_t elem_size, const void *dst) {
  if (elem_size >= 16 || b->rank < 1 || b->dims[b->rank - 1] < 16 / elem_size) return 0;
  if (((uintptr_t)dst + (uintptr_t)b->dst_base * elem_size) % 16 != 0) return 0;
  unsigned expect = 1;
  for (int d = b->rank - 1; d >= 0; d--) {
    if (b->dst_strides[d] != expect) return 0;
    expect *= b->dims[d];
  }
  return 1;
}

KCU_DEFINE_COPY(kcu_copy1, unsigned char)
KCU_DEFINE_COPY(kcu_copy2, unsigned short)
KCU_DEFINE_COPY(kcu_copy4, unsigned int)
KCU_DEFINE_COPY(kcu_copy8, unsigned long long)
KCU_DEFINE_COPY(kcu_copy16, uint4)

/* Rewrites a copy to do the same with fewer, wider moves: dims of extent 1 dropped, a dim merged
 * into its outer neighbour where source and destination are both contiguous across the two,
 * then the element widened up to 16 bytes where the innermost dim is contiguous on both sides
 * and every extent, stride, base and address divides. A head permute [B,L,H,D] -> [B,H,L,D]
 * then moves D's bytes 16 at a time through three index dims instead of four. */
static void kcu_copy_simplify(kcu_copy_geom *g, size_t *elem_size, const void *src,
                              const void *dst) {
  kcu_copy_geom c = *g;
  int r = 0;
  for (int d = 0; d < g->rank; d++) {
    if (g->dims[d] == 1) continue;
    if (r > 0 && c.src_strides[r - 1] == g->src_strides[d] * g->dims[d] &&
        c.dst_strides[r - 1] == g->dst_strides[d] * g->dims[d]) {
      c.dims[r - 1] *= g->dims[d];
      c.src_strides[r - 1] = g->src_strides[d];
      c.dst_strides[r - 1] = g->dst_strides[d];
      continue;
    }
    c.dims[r] = g->dims[d];
    c.src_strides[r] = g->src_strides[d];
    c.dst_strides[r] = g->dst_strides[d];
    r++;
  }
  c.rank = r;
  for (size_t w = 16; r > 0 && w > *elem_size; w /= 2) {
    int64_t k = (int64_t)(w / *elem_size);
    int ok = w % *elem_size == 0 && c.src_strides[r - 1] == 1 && c.dst_strides[r - 1] == 1 &&
             c.dims[r - 1] % k == 0 && c.src_base % k == 0 && c.dst_base % k == 0 &&
             (uintptr_t)src % w == 0 && (uintptr_t)dst % w == 0;
    for (int d = 0; ok && d < r - 1; d++) ok = c.src_strides[d] % k == 0 && c.dst_strides[d] % k == 0;
    if (!ok) continue;
    c.dims[r - 1] /= k;
    for (int d = 0; d < r - 1; d++) c.src_strides[d] /= k, c.dst_strides[d] /= k;
    c.src_base /= k;
    c.dst_base /= k;
    *elem_size = w;
    break;
  }
  *g = c;
}

cudaError_t kcu_strided_copy(cudaStream_t s, const void *src, void *dst, size_t elem_size,
                             const kcu_copy_geom *geom) {
  kcu_copy_geom simple = *geom;
  const kcu_copy_geom *g = &simple;
  kcu_copy_simplify(&simple, &elem_size, src, dst);
  kcu_copy_args a;
  a.g = *g;
  a.n = 1;
  for (int d = 0; d < g->rank; d++) a.n *= g->dims[d];
  if (a.n == 0) return cudaSuccess;
  unsigned grid = kcu_grid(a.n, 4);
  int64_t src_end = g->src_base, dst_end = g->dst_base;
  for (int d = 0; d < g->rank; d++) {
    src_end += (g->dims[d] - 1) * g->src_strides[d];
    dst_end += (g->dims[d] - 1) * g->dst_strides[d];
  }
  if (a.n < 0x7fffffffLL && src_end < 0x7fffffffLL && dst_end < 0x7fffffffLL) {
    kcu_copy_args32 b;
    memset(&b, 0, sizeof b);
    b.rank = g->rank;
    b.n = (unsigned)a.n;
    b.src_base = (unsigned)g->src_base;
    b.dst_base = (unsigned)g->dst_base;
    for (int d = 0; d < g->rank; d++) {
      b.dims[d] = (unsigned)g->dims[d];
      b.src_strides[d] = (unsigned)g->src_strides[d];
      b.dst_strides[d] = (unsigned)g->dst_strides[d];
    }
    if (kcu_pitch_rows_fit(g, elem_size, src, dst)) {
      unsigned long long vectors = (g->dims[1] * elem_size + 15) / 16;
      dim3 pitch_grid((unsigned)((vectors + KCU_BLOCK - 1) / KCU_BLOCK),
                      g->dims[0] < 65535 ? (unsigned)g->dims[0] : 65535u);
      kcu_launch_early(kcu_pitch_rows, pitch_grid, KCU_BLOCK, 0, s,
          (const uint4 *)((const char *)src + g->src_base * elem_size),
          (uint4 *)((char *)dst + g->dst_base * elem_size), (unsigned)g->dims[0],
          (unsigned)g->dims[1], (unsigned)g->src_strides[0],
          elem_size == 1 ? 0 : elem_size == 2 ? 1 : elem_size == 4 ? 2 : 3);
      return cudaGetLastError();
    }
    if (kcu_rows_fit(&b, elem_size, dst)) {
      unsigned rows_grid = kcu_grid(a.n / (int64_t)(16 / elem_size) + 1, 1);
      switch (elem_size) {
      case 1: kcu_launch_early(kcu_rows1, rows_grid, KCU_BLOCK, 0, s, b, (const unsigned char *)src, (unsigned char *)dst); break;
      case 2: kcu_launch_early(kcu_rows2, rows_grid, KCU_BLOCK, 0, s, b, (const unsigned short *)src, (unsigned short *)dst); break;
      case 4: kcu_launch_early(kcu_rows4, rows_grid, KCU_BLOCK, 0, s, b, (const unsigned int *)src, (unsigned int *)dst); break;
      default: kcu_launch_early(kcu_rows8, rows_grid, KCU_BLOCK, 0, s, b, (const unsigned long long *)src, (unsigned long long *)dst); break;
      }
      return cudaGetLastError();
    }
    switch (elem_size) {
    case 1: kcu_launch_early(kcu_copy32_1, grid, KCU_BLOCK, 0, s, b, (const unsigned char *)src, (unsigned char *)dst); break;
    case 2: kcu_launch_early(kcu_copy32_2, grid, KCU_BLOCK, 0, s, b, (const unsigned short *)src, (unsigned short *)dst); break;
    case 4: kcu_launch_early(kcu_copy32_4, grid, KCU_BLOCK, 0, s, b, (const unsigned int *)src, (unsigned int *)dst); break;
    case 8: kcu_launch_early(kcu_copy32_8, grid, KCU_BLOCK, 0, s, b, (const unsigned long long *)src, (unsigned long long *)dst); break;
    default: kcu_launch_early(kcu_copy32_16, grid, KCU_BLOCK, 0, s, b, (const uint4 *)src, (uint4 *)dst); break;
    }
    return cudaGetLastError();
  }
  switch (elem_size) {
  case 1: kcu_launch_early(kcu_copy1, grid, KCU_BLOCK, 0, s, a, (const unsigned char *)src, (unsigned char *)dst); break;
  case 2: kcu_launch_early(kcu_copy2, grid, KCU_BLOCK, 0, s, a, (const unsigned short *)src, (unsigned short *)dst); break;
  case 4: kcu_launch_early(kcu_copy4, grid, KCU_BLOCK, 0, s, a, (const unsigned int *)src, (unsigned int *)dst); break;
  case 8: kcu_launch_early(kcu_copy8, grid, KCU_BLOCK, 0, s, a, (const unsigned long long *)src, (unsigned long long *)dst); break;
  default: kcu_launch_early(kcu_copy16, grid, KCU_BLOCK, 0, s, a, (const uint4 *)src, (uint4 *)dst); break;
  }
  return cudaGetLastError();
}

static void kcu_geom_init(kcu_copy_geom *g, const kcu_tensor *out) {
  memset(g, 0, sizeof *g);
  g->rank = out->rank;
  for (int d = 0; d < out->rank; d++) g->dims[d] = out->dims[d];
  kcu_strides(out, g->dst_strides);
}

cudaError_t kcu_layout(cudaStream_t s, const kiln_op *op, const kcu_tensor *in, uint32_t n_in,
                       const kcu_tensor *out) {
  size_t es = kiln_dtype_size(out->dtype);
  int64_t in_str[KILN_MAX_RANK];
  kcu_strides(&in[0], in_str);
  kcu_copy_geom g;
  kcu_geom_init(&g, out);
  switch (op->kind) {
  case KILN_OP_PERMUTE:
    for (int d = 0; d < out->rank; d++) g.src_strides[d] = in_str[op->iattr[d]];
    break;
  case KILN_OP_EXPAND:
    kcu_broadcast_strides(&in[0], out->rank, out->dims, g.src_strides);
    break;
  case KILN_OP_SLICE: {
    int64_t dim = op->iattr[0];
    for (int d = 0; d < out->rank; d++) g.src_strides[d] = in_str[d];
    g.src_strides[dim] = in_str[dim] * op->iattr[3];
    g.src_base = op->iattr[1] * in_str[dim];
    break;
  }
  case KILN_OP_SELECT: {
    int64_t dim = op->iattr[0], index = op->iattr[1];
    if (index < 0) index += in[0].dims[dim];
    for (int d = 0, e = 0; d < in[0].rank; d++)
      if (d != dim) g.src_strides[e++] = in_str[d];
    g.src_base = index * in_str[dim];
    break;
  }
  case KILN_OP_CAT: {
    int64_t dim = op->iattr[0], at = 0;
    for (uint32_t k = 0; k < n_in; k++) {
      kcu_copy_geom part;
      kcu_geom_init(&part, &in[k]);
      for (int d = 0; d < out->rank; d++) part.dst_strides[d] = g.dst_strides[d];
      kcu_strides(&in[k], part.src_strides);
      part.dst_base = at * g.dst_strides[dim];
      at += in[k].dims[dim];
      cudaError_t rc = kcu_strided_copy(s, in[k].data, out->data, es, &part);
      if (rc != cudaSuccess) return rc;
    }
    return cudaSuccess;
  }
  default: /* COPY, RESHAPE: same bytes, maybe in place */
    if (in[0].data == out->data || out->numel == 0) return cudaSuccess;
    return cudaMemcpyAsync(out->data, in[0].data, (size_t)out->numel * es,
                           cudaMemcpyDeviceToDevice, s);
  }
  return kcu_strided_copy(s, in[0].data, out->data, es, &g);
}
