/* The CUDA engine's kernel launchers: one family per .cu file, all launched on one stream.
 * Launchers only enqueue work (they are captured into a CUDA graph); shapes and dtypes
 * were checked at init by cuda_check.c, so a launcher fails only on a launch error. */
#ifndef KILN_CUDA_OPS_H
#define KILN_CUDA_OPS_H

#include "runtime/index_layout.h"
#include "runtime/sdpa_layout.h"
#include "runtime/shape.h"
#include "runtime/vision_shape.h"
#include "kiln/kiln.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A plan tensor resolved to a device address for one launch. */
typedef struct kcu_tensor {
  void *data;
  kiln_dtype dtype;
  int32_t rank;
  int64_t dims[KILN_MAX_RANK];
  int64_t numel;
} kcu_tensor;

/* A plan tensor's dtype, dims and element count, without an address (data NULL). */
static inline kcu_tensor kcu_tensor_shape(const kiln_tensor_desc *t) {
  kcu_tensor r;
  r.data = NULL;
  r.dtype = t->dtype;
  r.rank = t->rank;
  r.numel = 1;
  for (int d = 0; d < KILN_MAX_RANK; d++) r.dims[d] = d < t->rank ? t->dims[d] : 0;
  for (int d = 0; d < t->rank; d++) r.numel *= t->dims[d];
  return r;
}

/* Row-major element strides of t. */
void kcu_strides(const kcu_tensor *t, int64_t *strides);
/* Strides of t broadcast (right-aligned) to a shape of `rank` dims; 0 where t has size 1. */
void kcu_broadcast_strides(const kcu_tensor *t, int32_t rank, const int64_t *dims,
                           int64_t *strides);

/* cuda_early_launch.c: whether the current device launches kernels early (compute capability
 * 9.0 and up), and a launch configuration, early when asked and possible (attr: storage for
 * its one attribute). */
int kcu_early_launch_ok(void);
cudaLaunchConfig_t kcu_launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                     int early, cudaLaunchAttribute *attr);

/* cuda_cold_cache.cu: bytes of a region to read so the L2 cache holds none of what came before
 * (0 when the region fits in the cache, where a call finds it too, else the region up to twice
 * the cache), and the read: `bytes` at data (16-byte aligned) on s, writing nothing. */
size_t kcu_cold_bytes(size_t region);
cudaError_t kcu_read_through(cudaStream_t s, const void *data, size_t bytes);
/* cuda_hold.cu: a one-warp kernel on s that runs for ns nanoseconds and lets the next kernel
 * launch early; init times GEMM candidates after it. */
#define KCU_HOLD_NS 3000
cudaError_t kcu_hold(cudaStream_t s, long long ns);

/* cuda_io_copy.cu: up to KCU_IO_COPIES copies (device addresses, host memory through its
 * device mapping included) in one kernel; then, when flags is set, flag_words ints copied from
 * flags to flags_out and flags cleared. */
#define KCU_IO_COPIES 8
#define KCU_IO_COPY_BLOCKS 1024u
typedef struct kcu_io_copies {
  const void *src[KCU_IO_COPIES];
  void *dst[KCU_IO_COPIES];
  unsigned long long bytes[KCU_IO_COPIES];
  int n;
  int *flags, *flags_out;
  int flag_words;
} kcu_io_copies;
cudaError_t kcu_io_copy(cudaStream_t s, const kcu_io_copies *c);
/* A one-warp kernel that waits for the kernels ahead and lets nothing after it launch early: put
 * before a library kernel that reads what the kernel just ahead wrote before it waits. */
cudaError_t kcu_fence(cudaStream_t s);

/* cuda_elementwise.cu: ADD/SUB/MUL/DIV (alpha for ADD/SUB), MINIMUM, MAXIMUM, broadcasting. */
cudaError_t kcu_binary(cudaStream_t s, kiln_op_kind kind, const kcu_tensor *a,
                       const kcu_tensor *b, const kcu_tensor *out, float alpha);
/* The unary ops (RELU..POW, ABS..HARDSIGMOID) and CAST; param is POW's exponent or GELU's
 * approximation flag. */
cudaError_t kcu_unary(cudaStream_t s, kiln_op_kind kind, const kcu_tensor *x,
                      const kcu_tensor *out, float param);
cudaError_t kcu_where(cudaStream_t s, const kcu_tensor *cond, const kcu_tensor *a,
                      const kcu_tensor *b, const kcu_tensor *out);
/* out[M,N] = silu(t[:, :N]) * t[:, N:] for t[M,2N] of out's dtype: SwiGLU after a GEMM. */
cudaError_t kcu_swiglu(cudaStream_t s, const void *t, void *out, kiln_dtype dt, int64_t M,
                       int64_t N);
/* In place on a contiguous float tensor: the activation a GEMM epilogue could not fuse. */
cudaError_t kcu_activation(cudaStream_t s, kiln_activation act, const kcu_tensor *t);

/* cuda_conv_epilogue.cu: in place on a convolution's result t, out[i] += bias[(i / inner) %
 * channels] (bias may be NULL) + residual[i] (may be NULL), then ReLU when relu. */
cudaError_t kcu_conv_epilogue(cudaStream_t s, const kcu_tensor *out, const void *bias,
                              const void *residual, int64_t channels, int64_t inner, int relu);

/* cuda_logic.cu: COMPARE of a and b (one dtype) into bool; LOGICAL or BITWISE (kind) of one
 * or two inputs, broadcasting. */
cudaError_t kcu_compare(cudaStream_t s, kiln_compare cmp, const kcu_tensor *a,
                        const kcu_tensor *b, const kcu_tensor *out);
cudaError_t kcu_bool_op(cudaStream_t s, kiln_op_kind kind, kiln_bool_op which,
                        const kcu_tensor *in, uint32_t n_in, const kcu_tensor *out);

/* cuda_fused_pointwise.cu: POINTWISE, every step of the chain in one kernel. */
cudaError_t kcu_fused_pointwise(cudaStream_t s, const kiln_op *op, const kcu_tensor *in,
                                const kcu_tensor *out);

/* cuda_fused_group.cu: FUSED, its register program interpreted per run of output elements (for
 * dynamic plans, and where no kernel was compiled for the group at load: cuda_fused_jit.c). */
cudaError_t kcu_fused(cudaStream_t s, const kiln_plan *plan, const kiln_op *op,
                      const kcu_tensor *in, const kcu_tensor *out);

/* cuda_normalize.cu */
cudaError_t kcu_softmax(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *out, int32_t dim,
                        int log);
/* LAYER_NORM or RMS_NORM op over its trailing dims, with its fused steps (in: x, weight?,
 * bias?, step operands). */
cudaError_t kcu_norm(cudaStream_t s, const kiln_op *op, const kcu_tensor *in,
                     const kcu_tensor *out);

/* cuda_reduce.cu: SUM, MEAN, AMAX over the dims in `mask`; ARGMAX along dim into i64. */
cudaError_t kcu_reduce(cudaStream_t s, kiln_op_kind kind, const kcu_tensor *x,
                       const kcu_tensor *out, uint32_t mask);
cudaError_t kcu_argmax(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *out, int32_t dim);

/* cuda_state.cu: INDEX_COPY along dim (out may be x: in place). A position outside x's dim
 * writes nothing, sets *fault to 1 and bad[0], bad[1] to the first such position and the length. */
cudaError_t kcu_index_copy(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *idx,
                           const kcu_tensor *values, const kcu_tensor *out, int32_t dim,
                           int *fault, long long *bad);

/* cuda_scan.cu: CUMSUM along dim in the output's dtype. */
cudaError_t kcu_cumsum(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *out, int32_t dim);

/* cuda_layout.cu: out[i] = src[base + sum(idx_d * strides[d])] over out's dims (any rank),
 * written at out offset dst_base + sum(idx_d * dst_strides[d]). Element size 1/2/4/8. */
typedef struct kcu_copy_geom {
  int32_t rank;
  int64_t dims[KILN_MAX_RANK];
  int64_t src_strides[KILN_MAX_RANK];
  int64_t dst_strides[KILN_MAX_RANK];
  int64_t src_base;
  int64_t dst_base;
} kcu_copy_geom;
cudaError_t kcu_strided_copy(cudaStream_t s, const void *src, void *dst, size_t elem_size,
                             const kcu_copy_geom *g);
/* PERMUTE, EXPAND, SLICE, SELECT, CAT (all inputs), COPY and RESHAPE. */
cudaError_t kcu_layout(cudaStream_t s, const kiln_op *op, const kcu_tensor *in, uint32_t n_in,
                       const kcu_tensor *out);

/* cuda_gather.cu: an index out of range writes zeros and sets *fault (a device int). */
cudaError_t kcu_embedding(cudaStream_t s, const kcu_tensor *weight, const kcu_tensor *idx,
                          const kcu_tensor *out, int *fault);
cudaError_t kcu_index_select(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *idx,
                             const kcu_tensor *out, int32_t dim, int *fault);
/* GATHER along dim; INDEX of x by idx[0..lay->n_idx-1] laid out as lay says (negative
 * indices count from the end). */
cudaError_t kcu_gather_dim(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *idx,
                           const kcu_tensor *out, int32_t dim, int *fault);
cudaError_t kcu_advanced_index(cudaStream_t s, const kcu_tensor *x, const kcu_tensor *idx,
                               const kcu_tensor *out, const kiln_index_layout *lay, int *fault);

/* Where each operand of an SDPA sits for one batch index (flattened over out's batch dims) and
 * how its mask broadcasts over [L, S]: filled on the host, passed to the kernels by value. */
#define KCU_ATTN_BATCH 6
typedef struct kcu_attn_geometry {
  int32_t nb; /* out's batch dims */
  int64_t bdims[KCU_ATTN_BATCH];
  int64_t qb[KCU_ATTN_BATCH], kb[KCU_ATTN_BATCH], vb[KCU_ATTN_BATCH], mb[KCU_ATTN_BATCH],
      ob[KCU_ATTN_BATCH]; /* element strides of each operand's matrix per batch dim */
  int64_t kv_group[KCU_ATTN_BATCH]; /* query heads per k,v head per batch dim: 1 but GQA's */
  int64_t q_row, k_row, v_row, o_row; /* elements between consecutive rows of each matrix */
  int64_t m_row, m_col;
  int mask_kind; /* 0 none, 1 bool (true keeps), 2 additive */
  int dm;        /* the mask's dtype */
} kcu_attn_geometry;
/* Fills g for out's batch dims, rows contiguous; q, k, v and mask may be NULL. Returns the
 * batch count. */
int64_t kcu_attn_geometry_init(kcu_attn_geometry *g, const kcu_tensor *q, const kcu_tensor *k,
                               const kcu_tensor *v, const kcu_tensor *mask,
                               const kcu_tensor *out, int64_t S);
/* An SDPA op's operands as the attention kernels take them. With packed heads, q, k and v
 * become [B,H,L,E] views into qkv [B,L,3,H,E] (at 0, H*E and 2*H*E elements); with packed
 * heads or heads last, the output a [B,H,L,Ev] view of [B,L,H,Ev]; geo their strides, and
 * returns 1. Otherwise the op's own tensors, and 0 (the launcher computes the geometry). */
int kcu_sdpa_operands(const kiln_op *op, const kcu_tensor *in, const kcu_tensor *out,
                      kcu_tensor *q, kcu_tensor *k, kcu_tensor *v, const kcu_tensor **mask,
                      kcu_tensor *o, kcu_attn_geometry *geo);

/* cuda_attention.cu: fused attention with online softmax; no score matrix in memory.
 * Head dims up to KCU_ATTN_MAX_HEAD; mask (may be NULL) is bool or additive float. A row
 * with every key masked outputs zeros. */
#define KCU_ATTN_MAX_HEAD 256
/* The decoding kernel's device scratch: the splits' partial rows (part_bytes), and on the warp
 * path n_arrivals counts, zeroed at init, one a query row: each block of a row counts itself in
 * and the last merges the row and sets its count back to 0. */
typedef struct kcu_dec_scratch {
  void *part;
  size_t part_bytes;
  unsigned *arrivals;
  int64_t n_arrivals;
} kcu_dec_scratch;
/* A decode step's cache writes the decoding kernel does in place of INDEX_COPY kernels
 * (cuda_backend.c folds them): for k (0) and v (1), rows[c] (NULL: none), one new row per
 * cache matrix, [..., 1, E] as the cache is [..., S, E], goes into slot idx[c][0] (i32 or
 * i64) of that matrix, and attention reads it from rows[c] there. A slot outside 0..S-1
 * writes nothing and is recorded as kcu_index_copy records it (fault, bad). */
typedef struct kcu_kv_append {
  const void *rows[2];
  const void *idx[2];
  int didx[2];
  int *fault;
  long long *bad;
} kcu_kv_append;
/* With dec (not NULL), at most KCU_ATTN_SPLIT_ROWS query rows run on the decoding kernel;
 * append (may be NULL) only where kcu_attention_appends holds. */
cudaError_t kcu_attention(cudaStream_t s, const kcu_tensor *q, const kcu_tensor *k,
                          const kcu_tensor *v, const kcu_tensor *mask, const kcu_tensor *out,
                          int causal, float scale, const kcu_attn_geometry *geo,
                          const kcu_dec_scratch *dec, const kcu_kv_append *append);
/* Whether kcu_attention with dec and geometry geo (NULL: its own) runs these operands on the
 * decoding kernel's warp path, the one that takes an append, over whole cache matrices. */
int kcu_attention_appends(const kcu_tensor *q, const kcu_tensor *k, const kcu_tensor *v,
                          const kcu_tensor *mask, const kcu_tensor *out,
                          const kcu_attn_geometry *geo);
/* Query rows up to which an SDPA runs on the decoding kernel (cuda_attention_decode.cu):
 * neither tensor-core path fills the GPU with so few rows. */
#define KCU_ATTN_SPLIT_ROWS 8
/* cuda_attention_decode.cu: the keys split among warps (f16 rows of 16-byte vectors) or blocks
 * when the rows alone cannot fill the GPU, the splits' partial rows in dec's part and merged
 * by each row's last block (warps) or a second kernel (blocks). An append off the warp path
 * is refused (cudaErrorInvalidValue) before anything launches. */
cudaError_t kcu_attention_decode(cudaStream_t s, const kcu_attn_geometry *geo, int64_t batch,
                                 const kcu_tensor *q, const kcu_tensor *k, const kcu_tensor *v,
                                 const kcu_tensor *mask, const kcu_tensor *out, int causal,
                                 float scale, const kcu_dec_scratch *dec,
                                 const kcu_kv_append *append);
/* Whether kcu_attention_decode runs these operands (geometry g) on the warp path. */
int kcu_attention_decode_warp_path(const kcu_attn_geometry *g, const kcu_tensor *k,
                                   const kcu_tensor *v);
/* The partial rows any split decoding launch with value head dim Ev needs on sms SMs, and the
 * arrival counts (rows a warp-path launch merges in its own blocks at most). */
size_t kcu_attention_part_bytes(int64_t Ev, int sms);
int64_t kcu_attention_arrivals(int sms);
/* Raises the kernel's dynamic shared memory limit once, at init. */
cudaError_t kcu_attention_prepare(int max_head);
/* Turns f32 scores [batch, L, S] (batch and L as out's leading dims) into probabilities in
 * place: scale, causal and mask applied, a stable softmax per row in f32, each row written as
 * p_dtype from the start of its own score row (so rows keep their byte stride). A row with
 * every key masked becomes zeros. */
cudaError_t kcu_attention_softmax(cudaStream_t s, float *scores, kiln_dtype p_dtype,
                                  const kcu_tensor *mask, const kcu_tensor *out, int64_t S,
                                  int causal, float scale);

/* cuda_flash_attention.cu: attention on the tensor cores (mma.sync), flash style: no score
 * matrix in memory. Takes q, k, v and out of one dtype, f16 or bf16, head dims E == Ev in
 * {64, 128}, any L and S >= 1, k and v broadcast over batch dims, the same masks as
 * kcu_attention, and 16-byte aligned q, k, v and out (geo: as for kcu_attention). kcu_flash_fits says whether it takes a
 * shape (host only, no device call); kcu_flash_prepare raises the kernels' dynamic shared
 * memory limit once, at init. */
int kcu_flash_fits(const kcu_tensor *q, const kcu_tensor *k, const kcu_tensor *v,
                   const kcu_tensor *mask, const kcu_tensor *out);
cudaError_t kcu_flash_prepare(void);
cudaError_t kcu_flash_attention(cudaStream_t s, const kcu_tensor *q, const kcu_tensor *k,
                                const kcu_tensor *v, const kcu_tensor *mask,
                                const kcu_tensor *out, int causal, float scale,
                                const kcu_attn_geometry *geo);

/* cuda_pool.cu: MAX_POOL2D, AVG_POOL2D and ADAPTIVE_AVG_POOL2D of x into out, shaped as d says
 * (NCHW or channels_last), windows as win says; f32 math, channels in 16-byte vectors when C
 * and the addresses allow. */
cudaError_t kcu_pool(cudaStream_t s, const kiln_op *op, const kiln_window *win,
                     const kiln_planes *d, const kcu_tensor *x, const kcu_tensor *out);
/* cuda_resize.cu: UPSAMPLE_NEAREST2D and UPSAMPLE_BILINEAR2D, source indices as the CPU
 * engine computes them (f32, rounded the same way). */
cudaError_t kcu_resize(cudaStream_t s, const kiln_op *op, const kiln_planes *d,
                       const kcu_tensor *x, const kcu_tensor *out);
/* cuda_batch_norm.cu: BATCH_NORM as a per-channel affine over dim 1, in f32 (in: x, mean, var,
 * weight?, bias?). */
cudaError_t kcu_batch_norm(cudaStream_t s, const kiln_op *op, const kcu_tensor *in,
                           const kcu_tensor *out);

/* cuda_gemv.cu: y[M,N] = act(x[M,K] w[N,K]^T + bias) + residual for a few rows, f32
 * accumulation, bias and residual (y's shape and dtype; either may be NULL) and activation
 * fused; x and w contiguous and 16-byte aligned. With KILN_ACT_SWIGLU, w has 2N rows (gate over
 * up), no bias or residual: y = silu(x gate^T) * (x up^T). w_fixed: w is a weight, which no
 * kernel writes, so the GEMV launches early and starts reading it before the kernel ahead of
 * it ends. */
#define KCU_GEMV_MAX_ROWS 8      /* f32 */
#define KCU_GEMV_MMA_MAX_ROWS 16 /* f16 and bf16 */
static inline int kcu_gemv_fits(int64_t M, int64_t K, kiln_dtype dt) {
  int most = dt == KILN_F16 || dt == KILN_BF16 ? KCU_GEMV_MMA_MAX_ROWS : KCU_GEMV_MAX_ROWS;
  return M >= 1 && M <= most && K > 0 && K % 8 == 0;
}
/* A norm over a row that the one-row f16 or bf16 kernel computes: x' = (x - mean) * rstd * w + b,
 * rounded to the dtype, as KILN_OP_LAYER_NORM and KILN_OP_RMS_NORM (rms: no mean) store it.
 * Without out, of the input row before the GEMV multiplies (x is then the norm's input; K
 * wide); with out, of the output row y, written to out by the block that finishes last (N
 * wide, a multiple of 8; arrivals: a count in device memory, 0 before the launch and after). */
typedef struct kcu_gemv_norm {
  const void *w, *b; /* the norm's weight and bias, either NULL; 16-byte aligned */
  float eps;
  int rms;
  void *out;          /* NULL: the input row's norm */
  unsigned *arrivals; /* with out */
} kcu_gemv_norm;
#define KCU_GEMV_NORM_MAX_K 16384 /* the normalized row a block keeps in shared memory */
static inline int kcu_gemv_norm_fits(int64_t M, int64_t K, kiln_dtype dt) {
  return M == 1 && (dt == KILN_F16 || dt == KILN_BF16) && K <= KCU_GEMV_NORM_MAX_K;
}
cudaError_t kcu_gemv(cudaStream_t s, const void *x, const void *w, const void *bias,
                     const void *residual, void *y, kiln_dtype dt, int64_t M, int64_t N,
                     int64_t K, kiln_activation act, int w_fixed, int spread,
                     const kcu_gemv_norm *norm);
/* 1 when a one-row GEMV of N columns over K at `spread` computing its norm launches no more
 * blocks than the device holds at once (only then is the norm worth computing in it). */
int kcu_gemv_norm_one_wave(int64_t N, int64_t K, kiln_dtype dt, kiln_activation act, int spread);
/* A GEMV launch aims at (KCU_GEMV_BASE_WARPS << spread) warps in all, spread 0 ..
 * KCU_GEMV_SPREADS - 1: fewer, longer warps suit a small weight (each warp's loads all in
 * flight at once), more warps a long K. Which is fastest depends on the shape and the GPU, so
 * init times each (cuda_gemm.c); sizes it did not time take the default. */
#define KCU_GEMV_BASE_WARPS 2048
#define KCU_GEMV_SPREADS 4
#define KCU_GEMV_DEFAULT_SPREAD 2
/* Two to sixteen rows of f16 or bf16 multiply on the tensor cores, a column of 16 or 8 weight
 * rows a warp; one row, or f32, on the CUDA cores, a weight row a warp. */
static inline int kcu_gemv_tensor_cores(int64_t M, kiln_dtype dt) {
  return M > 1 && (dt == KILN_F16 || dt == KILN_BF16);
}
/* The weight rows of a GEMV column (a warp's) for N weight rows (2N with SwiGLU) of M input
 * rows at `spread`: 1 on the CUDA cores; on the tensor cores 16, or 8 for up to 8 input rows
 * where columns of 16 would leave the launch fewer warps than the spread aims at. */
int kcu_gemv_tile(int64_t N, int64_t M, kiln_dtype dt, int spread);
/* The columns one GEMV block of 8 warps takes for N weight rows of M input rows at `spread`
 * (8, 4, 2 or 1; the warps split each column's K 8 / columns ways). */
int kcu_gemv_columns(int64_t N, int64_t M, kiln_dtype dt, int spread);

#ifdef __cplusplus
}
#endif

#endif
