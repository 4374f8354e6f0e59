/* Elementwise ops: binary arithmetic with broadcasting, unary math, cast and where (comparisons
 * and boolean ops are in cuda_logic.cu).
 * Contiguous same-shape float operands with 16-byte aligned addresses take a vectorized
 * path (16 bytes per thread per operand); everything else decomposes indices. */
#include "cuda_device.cuh"

static __device__ __forceinline__ long long kcu_binop_int(int op, long long a, long long b,
                                                          long long alpha) {
  switch (op) {
  case KILN_OP_ADD: return a + alpha * b;
  case KILN_OP_SUB: return a - alpha * b;
  case KILN_OP_MUL: return a * b;
  case KILN_OP_MINIMUM: return b < a ? b : a;
  case KILN_OP_MAXIMUM: return a < b ? b : a;
  default: return b == 0 ? 0 : a / b;
  }
}

/* RELU, NEG and ABS on integers. */
static __device__ __forceinline__ long long kcu_unop_int(int op, long long v) {
  unsigned long long negated = 0ull - (unsigned long long)v; /* wraps, as on the CPU */
  switch (op) {
  case KILN_OP_NEG: return (long long)negated;
  case KILN_OP_ABS: return v < 0 ? (long long)negated : v;
  default: return v < 0 ? 0 : v; /* RELU */
  }
}

/* Unary or binary over operands of one float dtype (DT, or dt where DT is -1) and the output's
 * shape, 16 bytes a thread. The instances for the erf GELU (ERF_GELU 1), a GEMM's epilogue over
 * a large activation, have the dtype and the op as compile-time constants: the element loop
 * unrolls, its values stay in registers and the math is straight-line code (with them read at
 * run time the values went to local memory: 392.8 us over a 268 MB f16 activation on an H100,
 * 199.0 as constants). Other ops take the one generic instance (an instance per dtype of every
 * op's math would add about 100 KB to the wheel). */
template <int DT, int ERF_GELU>
__global__ void kcu_pointwise_vec(int op, int binary, const void *a, const void *b, void *out,
                                  int dt, int64_t n, float p) {
  kcu_begin_early();
  if (DT >= 0) dt = DT;
  if (ERF_GELU) op = KILN_OP_GELU, binary = 0, p = 0.0f;
  const int per = dt == KILN_F32 ? 4 : 8;
  int64_t nv = n / per;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += stride) {
    float fa[8], fb[8];
    kcu_ld16(a, dt, v, fa);
    if (binary) kcu_ld16(b, dt, v, fb);
#pragma unroll
    for (int k = 0; k < per; k++)
      fa[k] = binary ? kcu_binop(op, fa[k], fb[k], p) : kcu_unop(op, fa[k], p);
    kcu_st16(out, dt, v, fa);
  }
  for (int64_t i = nv * per + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float x = kcu_ld(a, dt, i);
    float r = binary ? kcu_binop(op, x, kcu_ld(b, dt, i), p) : kcu_unop(op, x, p);
    kcu_st(out, dt, i, r);
  }
}

/* kcu_pointwise_vec for op over out's dtype (b NULL: unary; p its parameter). */
static cudaError_t kcu_pointwise_launch(cudaStream_t s, int op, const kcu_tensor *a,
                                        const void *b, const kcu_tensor *out, float p) {
  void (*k)(int, int, const void *, const void *, void *, int, int64_t, float) =
      kcu_pointwise_vec<-1, 0>;
  if (!b && op == KILN_OP_GELU && p == 0.0f)
    k = out->dtype == KILN_F16    ? kcu_pointwise_vec<KILN_F16, 1>
        : out->dtype == KILN_BF16 ? kcu_pointwise_vec<KILN_BF16, 1>
                                  : kcu_pointwise_vec<KILN_F32, 1>;
  return kcu_launch_early(k, kcu_grid(out->numel, 8), KCU_BLOCK, 0, s, op, b != NULL, a->data,
                          b, out->data, (int)out->dtype, out->numel, p);
}

__global__ void kcu_binary_generic(kcu_bcast g, int op, const void *a, int da, const void *b,
                                   int db, void *out, int dout, float alpha, int64_t n) {
  kcu_begin_early();
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[2];
    kcu_offsets(&g, i, 2, off);
    if (kcu_is_int(dout)) {
      long long r = kcu_binop_int(op, kcu_ldi(a, da, off[0]), kcu_ldi(b, db, off[1]),
                                  (long long)alpha);
      kcu_sti(out, dout, i, r);
    } else {
      kcu_st(out, dout, i, kcu_binop(op, kcu_ld(a, da, off[0]), kcu_ld(b, db, off[1]), alpha));
    }
  }
}

__global__ void kcu_unary_generic(int op, const void *x, int dx, void *out, int dout, float p,
                                  int64_t n) {
  kcu_begin_early();
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (op == KILN_OP_CAST && (kcu_is_int(dx) || kcu_is_int(dout))) {
      if (kcu_is_int(dx)) kcu_sti(out, dout, i, kcu_ldi(x, dx, i));
      else kcu_st(out, dout, i, kcu_ld(x, dx, i));
    } else if (kcu_is_int(dout)) {
      kcu_sti(out, dout, i, kcu_unop_int(op, kcu_ldi(x, dx, i)));
    } else {
      kcu_st(out, dout, i, kcu_unop(op, kcu_ld(x, dx, i), p));
    }
  }
}

__global__ void kcu_where_kernel(kcu_bcast g, const unsigned char *c, const void *a, int da,
                                 const void *b, int db, void *out, int dout, int64_t n) {
  kcu_begin_early();
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[3];
    kcu_offsets(&g, i, 3, off);
    int pick = c[off[0]] != 0;
    if (kcu_is_int(dout)) kcu_sti(out, dout, i, pick ? kcu_ldi(a, da, off[1]) : kcu_ldi(b, db, off[2]));
    else kcu_st(out, dout, i, pick ? kcu_ld(a, da, off[1]) : kcu_ld(b, db, off[2]));
  }
}

static int kcu_same_shape(const kcu_tensor *a, const kcu_tensor *b) {
  if (a->rank != b->rank) return 0;
  for (int d = 0; d < a->rank; d++)
    if (a->dims[d] != b->dims[d]) return 0;
  return 1;
}

static int kcu_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

kcu_bcast kcu_make_bcast(const kcu_tensor *out, const kcu_tensor *const *ops, int n) {
  kcu_bcast g;
  memset(&g, 0, sizeof g);
  g.rank = out->rank;
  for (int d = 0; d < out->rank; d++) g.dims[d] = out->dims[d];
  for (int k = 0; k < n; k++) kcu_broadcast_strides(ops[k], out->rank, out->dims, g.st[k]);
  return g;
}

void kcu_strides(const kcu_tensor *t, int64_t *strides) {
  int64_t s = 1;
  for (int d = t->rank - 1; d >= 0; d--) {
    strides[d] = s;
    s *= t->dims[d];
  }
}

void kcu_broadcast_strides(const kcu_tensor *t, int32_t rank, const int64_t *dims,
                           int64_t *strides) {
  int64_t own[KILN_MAX_RANK];
  kcu_strides(t, own);
  for (int d = 0; d < rank; d++) {
    int td = d - (rank - t->rank);
    strides[d] = (td < 0 || t->dims[td] == 1 || dims[d] == 1) ? 0 : own[td];
  }
}

static int kcu_vec_ok(const kcu_tensor *out, const kcu_tensor *a, const kcu_tensor *b) {
  if (!kiln_dtype_is_float(out->dtype) || a->dtype != out->dtype || !kcu_same_shape(a, out))
    return 0;
  if (b && (b->dtype != out->dtype || !kcu_same_shape(b, out) || !kcu_aligned16(b->data)))
    return 0;
  return kcu_aligned16(a->data) && kcu_aligned16(out->data);
}

cudaError_t kcu_binary(cudaStream_t s, kiln_op_kind kind, const kcu_tensor *a,
                       const kcu_tensor *b, const kcu_tensor *out, float alpha) {
  if (out->numel == 0) return cudaSuccess;
  if (kcu_vec_ok(out, a, b)) {
    kcu_pointwise_launch(s, kind, a, b->data, out, alpha);
  } else {
    const kcu_tensor *ops[2] = {a, b};
    kcu_bcast g = kcu_make_bcast(out, ops, 2);
    kcu_launch_early(kcu_binary_generic, kcu_grid(out->numel, 4), KCU_BLOCK, 0, s,
        g, kind, a->data, a->dtype, b->data, b->dtype, out->data, out->dtype, alpha, out->numel);
  }
  return cudaGetLastError();
}

cudaError_t kcu_unary(cudaStream_t s, kiln_op_kind kind, const kcu_tensor *x,
                      const kcu_tensor *out, float param) {
  if (out->numel == 0) return cudaSuccess;
  if (kind != KILN_OP_CAST && kcu_vec_ok(out, x, NULL)) {
    kcu_pointwise_launch(s, kind, x, NULL, out, param);
  } else {
    kcu_launch_early(kcu_unary_generic, kcu_grid(out->numel, 4), KCU_BLOCK, 0, s,
        kind, x->data, x->dtype, out->data, out->dtype, param, out->numel);
  }
  return cudaGetLastError();
}

cudaError_t kcu_where(cudaStream_t s, const kcu_tensor *cond, const kcu_tensor *a,
                      const kcu_tensor *b, const kcu_tensor *out) {
  if (out->numel == 0) return cudaSuccess;
  const kcu_tensor *ops[3] = {cond, a, b};
  kcu_bcast g = kcu_make_bcast(out, ops, 3);
  kcu_launch_early(kcu_where_kernel, kcu_grid(out->numel, 4), KCU_BLOCK, 0, s,
      g, (const unsigned char *)cond->data, a->data, a->dtype, b->data, b->dtype, out->data,
      out->dtype, out->numel);
  return cudaGetLastError();
}

cudaError_t kcu_activation(cudaStream_t s, kiln_activation act, const kcu_tensor *t) {
  kiln_op_kind kind = act == KILN_ACT_RELU ? KILN_OP_RELU : KILN_OP_GELU;
  float param = act == KILN_ACT_GELU_TANH ? 1.0f : 0.0f;
  return kcu_unary(s, kind, t, t, param);
}

/* silu(gate) * up of t's rows [gate | up] (2N wide) into out's rows (N wide), V elements a
 * thread: one scalar (V = 1), or a 16-byte vector (V = 4 for f32, 8 for f16 and bf16) where N
 * is a multiple of V, so each thread's loads and store are one instruction each. A row per
 * block row (blockIdx.y), so no thread divides its index; dtype and V are constants. */
template <int DT, int V>
__global__ void kcu_swiglu_kernel(const void *t, void *out, int64_t M, int64_t N) {
  kcu_begin_early();
  const int64_t nv = N / V, step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t m = blockIdx.y; m < M; m += gridDim.y)
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < nv; j += step) {
      float gate[8], up[8];
      kcu_ldv(t, DT, m * 2 * N + j * V, V, gate);
      kcu_ldv(t, DT, m * 2 * N + N + j * V, V, up);
#pragma unroll
      for (int k = 0; k < V; k++) gate[k] = kcu_unop(KILN_OP_SILU, gate[k], 0.0f) * up[k];
      kcu_stv(out, DT, m * N + j * V, V, gate);
    }
}

template <int DT, int V>
static void kcu_swiglu_launch(cudaStream_t s, const void *t, void *out, int64_t M, int64_t N) {
  int64_t nv = N / V, bx = (nv + KCU_BLOCK - 1) / KCU_BLOCK;
  dim3 grid((unsigned)(bx < 65535 ? bx : 65535), (unsigned)(M < 65535 ? M : 65535));
  kcu_launch_early(kcu_swiglu_kernel<DT, V>, grid, KCU_BLOCK, 0, s, t, out, M, N);
}

cudaError_t kcu_swiglu(cudaStream_t s, const void *t, void *out, kiln_dtype dt, int64_t M,
                       int64_t N) {
  if (M * N == 0) return cudaSuccess;
  int vec = N % (dt == KILN_F32 ? 4 : 8) == 0 && (uintptr_t)t % 16 == 0 &&
            (uintptr_t)out % 16 == 0;
  if (dt == KILN_F16)
    vec ? kcu_swiglu_launch<KILN_F16, 8>(s, t, out, M, N)
        : kcu_swiglu_launch<KILN_F16, 1>(s, t, out, M, N);
  else if (dt == KILN_BF16)
    vec ? kcu_swiglu_launch<KILN_BF16, 8>(s, t, out, M, N)
        : kcu_swiglu_launch<KILN_BF16, 1>(s, t, out, M, N);
  else
    vec ? kcu_swiglu_launch<KILN_F32, 4>(s, t, out, M, N)
        : kcu_swiglu_launch<KILN_F32, 1>(s, t, out, M, N);
  return cudaGetLastError();
}
