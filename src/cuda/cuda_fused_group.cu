/* FUSED: the decoded program every FUSED kernel takes (kcu_fx_prepare), and the interpreting
 * kernel that runs a dynamic plan's groups (a static plan's run kernels compiled for them at
 * load, cuda_fused_jit.c, where NVRTC is installed). One generic kernel interprets a group's
 * register program, each thread over a run of V consecutive output elements along the
 * innermost dim, so that the instruction dispatch, the
 * coordinates, each load's address and the outer box tests are paid once per run. The program
 * is decoded on the host into a kernel argument (so a captured graph keeps it), with the
 * output's dims coalesced where every map allows, then padded with leading 1s to rank 4 or 8,
 * each a kernel of its own, so the coordinate and address loops have constant trip counts
 * (12-18% faster on the bench groups than loops over every rank); registers are f32 and each
 * instruction uses the unfused ops' device math (cuda_device.cuh), rounding where the program
 * says an unfused op or cast would. The last instruction's result stays in real registers
 * (each instruction works in place on it); a register read later than the next instruction
 * goes through a shared-memory register file. Outputs under 2^32 elements whose inputs are
 * under 2^31 use 32-bit coordinates and addresses (wrapping sums whose in-box total is exact).
 * In a dynamic plan every choice (merged dims, run length, vector width, index width) follows
 * the call's sizes: the program is decoded for them before each eager run or capture, never
 * per replay. A small output runs in shorter runs, so that more threads share it. */
#include "cuda_fused_group.h"
#include "runtime/fused_program.h"
#include "cuda_device.cuh"

#include <string.h>

static_assert(sizeof(kcu_fx) <= 4096, "a kernel argument takes at most 4 KB");

static __device__ __forceinline__ uint32_t kfx_div(const kcu_fx &p, int d, uint32_t n) {
  uint32_t t = __umulhi(n, p.div_m[d]);
  return (t + ((n - t) >> p.div_s1[d])) >> p.div_s2[d];
}

/* The multiplier and shifts that divide every 32-bit n by d (1 <= d < 2^32). */
static void fx_divisor(kcu_fx *p, int slot, uint64_t d) {
  int l = 0;
  while (((uint64_t)1 << l) < d) l++;
  p->div_m[slot] = (uint32_t)(((uint64_t)1 << 32) * (((uint64_t)1 << l) - d) / d + 1);
  p->div_s1[slot] = (uint8_t)(l > 0);
  p->div_s2[slot] = (uint8_t)(l > 0 ? l - 1 : 0);
}

static __device__ __forceinline__ float kcu_fx_round(int dt, float v) {
  return dt == KILN_F16 ? __half2float(__float2half_rn(v))
                        : __bfloat162float(__float2bfloat16_rn(v));
}

/* Register r of this thread in the shared register file: V floats in chunks of up to 4, laid
 * out chunk-major over the block so that a warp's chunk accesses hit distinct banks. */
template <int V> struct kfx_chunk { typedef float4 type; };
template <> struct kfx_chunk<2> { typedef float2 type; };
template <> struct kfx_chunk<1> { typedef float type; };

template <int V>
static __device__ __forceinline__ void kfx_rf_get(const float *rf, uint32_t r, float *x) {
  typedef typename kfx_chunk<V>::type chunk;
  const int per = (int)(sizeof(chunk) / sizeof(float)), n = V / per;
  const chunk *c = (const chunk *)rf + ((size_t)r * n) * blockDim.x + threadIdx.x;
#pragma unroll
  for (int q = 0; q < n; q++) {
    chunk v = c[(size_t)q * blockDim.x];
    memcpy(x + q * per, &v, sizeof v);
  }
}

template <int V>
static __device__ __forceinline__ void kfx_rf_put(float *rf, uint32_t r, const float *x) {
  typedef typename kfx_chunk<V>::type chunk;
  const int per = (int)(sizeof(chunk) / sizeof(float)), n = V / per;
  chunk *c = (chunk *)rf + ((size_t)r * n) * blockDim.x + threadIdx.x;
#pragma unroll
  for (int q = 0; q < n; q++) {
    chunk v;
    memcpy(&v, x + q * per, sizeof v);
    c[(size_t)q * blockDim.x] = v;
  }
}

/* A run of V elements as 16-byte vectors: V = 8 of f16 or bf16 (one) or V = 4k of f32 (k). */
template <int V> static __device__ __forceinline__ bool kfx_vec_ok(int dt) {
  return dt == KILN_F32 ? V % 4 == 0 : (dt == KILN_F16 || dt == KILN_BF16) && V == 8;
}

/* Element i of a float input (kfx_load_int takes the others). */
static __device__ __forceinline__ float kfx_ld1(const void *p, int dt, int64_t i) {
  if (dt == KILN_F32) return ((const float *)p)[i];
  if (dt == KILN_F16) return __half2float(((const __half *)p)[i]);
  return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

/* The 4 f32 or 8 f16/bf16 values of one 16-byte vector into v of N >= 4 floats (f16/bf16
 * only for N = 8). */
template <int N>
static __device__ __forceinline__ void kfx_unpack16(uint4 raw, int dt, float *v) {
  if (dt == KILN_F32) {
    v[0] = __uint_as_float(raw.x), v[1] = __uint_as_float(raw.y);
    v[2] = __uint_as_float(raw.z), v[3] = __uint_as_float(raw.w);
    return;
  }
  if (N < 8) return;
  unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int q = 0; q < 4; q++) {
    float2 t;
    if (dt == KILN_F16) {
      __half2 h;
      memcpy(&h, &w[q], sizeof h);
      t = __half22float2(h);
    } else {
      __nv_bfloat162 h;
      memcpy(&h, &w[q], sizeof h);
      t = __bfloat1622float2(h);
    }
    v[(2 * q) % N] = t.x, v[(2 * q + 1) % N] = t.y;
  }
}

template <int V>
static __device__ __forceinline__ void kfx_ld_vec(const char *addr, int dt, float *v) {
  if (dt == KILN_F32) {
#pragma unroll
    for (int q = 0; q < V / 4; q++) kfx_unpack16<4>(((const uint4 *)addr)[q], KILN_F32, v + 4 * q);
    return;
  }
  if (V == 8) kfx_unpack16<8>(*(const uint4 *)addr, dt, v);
}

/* v[k] = element at + k * s of src, for every k of the run (each address inside the box);
 * I is the index type (uint32_t: sums wrap, the in-box total is exact). */
template <int V, typename I>
static __device__ __forceinline__ void kfx_gather(const void *src, int dt, I at, I s, float *v) {
  if (s == 0) { /* broadcast along the innermost dim: one load */
    float x = kfx_ld1(src, dt, (int64_t)at);
#pragma unroll
    for (int k = 0; k < V; k++) v[k] = x;
    return;
  }
  const char *addr = (const char *)src + (int64_t)at * (dt == KILN_F32 ? 4 : 2);
  if (s == 1 && kfx_vec_ok<V>(dt) && ((uintptr_t)addr & 15u) == 0) {
    kfx_ld_vec<V>(addr, dt, v);
    return;
  }
  switch (dt) {
  case KILN_F32:
#pragma unroll
    for (int k = 0; k < V; k++) v[k] = ((const float *)src)[(int64_t)(I)(at + (I)k * s)];
    break;
  case KILN_F16:
#pragma unroll
    for (int k = 0; k < V; k++) v[k] = __half2float(((const __half *)src)[(int64_t)(I)(at + (I)k * s)]);
    break;
  default:
#pragma unroll
    for (int k = 0; k < V; k++) v[k] = __bfloat162float(((const __nv_bfloat16 *)src)[(int64_t)(I)(at + (I)k * s)]);
    break;
  }
}

/* A run's V values in an array of their own: indexed by a loop not unrolled, it lives in local
 * memory, not in the registers the run's other values use. */
template <int V> struct kfx_vals {
  float v[V];
};

/* kfx_load's innermost part for an integer or bool input, each element in [lo, hi) converted
 * as a cast to f32 converts it (at: the run's outer address). The loop is not unrolled: the
 * kernel has an instance for each run length and rank, and unrolled these rare loads added
 * 12 KB of sm_90 code to them (7 KB rolled). */
template <int V, typename I>
static __device__ __forceinline__ kfx_vals<V> kfx_load_int(const void *src, int dt, I at, I c0,
                                                           I s, I lo, I hi) {
  kfx_vals<V> r;
#pragma unroll 1
  for (int k = 0; k < V; k++) {
    I c = c0 + (I)k;
    int64_t i = (int64_t)(I)(at + c * s);
    r.v[k] = 0.0f;
    if (c < lo || c >= hi) continue;
    if (dt == KILN_I64) r.v[k] = (float)((const long long *)src)[i];
    else if (dt == KILN_I32) r.v[k] = (float)((const int *)src)[i];
    else r.v[k] = ((const unsigned char *)src)[i] ? 1.0f : 0.0f;
  }
  return r;
}

/* LOAD through map m for the run at outer coordinates coord and innermost c0..c0+V: zero
 * outside the box, and an address computed only inside it (the plan parser bounds it there). */
template <int V, int R, typename I>
static __device__ __forceinline__ void kfx_load(const kcu_fx &p, const kcu_fx_map &m,
                                                const I *coord, I c0, float *v) {
  const int ri = R - 1;
#pragma unroll
  for (int k = 0; k < V; k++) v[k] = 0.0f;
  if (!(m.box & KFX_OUTER)) {
    bool inside = true;
#pragma unroll
    for (int d = 0; d < ri; d++)
      inside = inside && coord[d] >= (I)m.lo[d] && coord[d] < (I)m.hi[d];
    if (!inside) return;
  }
  I at = (I)m.offset;
#pragma unroll
  for (int d = 0; d < ri; d++) at += coord[d] * (I)m.stride[d];
  const void *src = p.in[m.slot];
  const int dt = p.in_dtype[m.slot];
  const I s = (I)m.stride[ri];
  if (dt != KILN_F32 && dt != KILN_F16 && dt != KILN_BF16) {
    const bool inner = (m.box & KFX_INNER) != 0;
    kfx_vals<V> r = kfx_load_int<V, I>(src, dt, at, c0, s, inner ? c0 : (I)m.lo[ri],
                                       inner ? c0 + V : (I)m.hi[ri]);
#pragma unroll
    for (int k = 0; k < V; k++) v[k] = r.v[k];
    return;
  }
  if (m.box & KFX_INNER) {
    kfx_gather<V, I>(src, dt, (I)(at + c0 * s), s, v);
    return;
  }
  I lo = (I)m.lo[ri], hi = (I)m.hi[ri];
  I first = c0 > lo ? c0 : lo, last = c0 + V < hi ? c0 + V : hi;
  if (first >= last) return;
  at += first * s;
  if (first == c0 && last == c0 + V) {
    kfx_gather<V, I>(src, dt, at, s, v);
    return;
  }
#pragma unroll
  for (int k = 0; k < V; k++) /* the box splits the run: only its inside elements load */
    if (c0 + k >= first && c0 + k < last)
      v[k] = kfx_ld1(src, dt, (int64_t)(I)(at + (c0 + k - first) * s));
}

/* The long library functions (erff, tanhf, powf, logf, cosf, sinf) run one element per loop
 * trip, the run rotating through registers, so their code is not copied V times. */
template <int V>
static __device__ __forceinline__ void kfx_unary(int op, const float *x, float prm, float *y) {
#define KFX_UN(OP)                                                                              \
  case OP:                                                                                      \
    _Pragma("unroll") for (int k = 0; k < V; k++) y[k] = kcu_unop(OP, x[k], prm);               \
    break;
#define KFX_UN_LONG(OP)                                                                         \
  case OP:                                                                                      \
    _Pragma("unroll 1") for (int k = 0; k < V; k++) {                                           \
      float r = kcu_unop(OP, xs[0], prm);                                                       \
      _Pragma("unroll") for (int i = 0; i + 1 < V; i++) xs[i] = xs[i + 1], y[i] = y[i + 1];     \
      y[V - 1] = r;                                                                             \
    }                                                                                           \
    break;
  float xs[V];
#pragma unroll
  for (int k = 0; k < V; k++) xs[k] = x[k];
  switch (op) {
  KFX_UN(KILN_OP_RELU)
  KFX_UN_LONG(KILN_OP_GELU)
  KFX_UN(KILN_OP_SILU)
  KFX_UN(KILN_OP_SIGMOID)
  KFX_UN_LONG(KILN_OP_TANH)
  KFX_UN(KILN_OP_EXP)
  KFX_UN(KILN_OP_SQRT)
  KFX_UN(KILN_OP_RSQRT)
  KFX_UN(KILN_OP_NEG)
  KFX_UN_LONG(KILN_OP_POW)
  KFX_UN(KILN_OP_ABS)
  KFX_UN_LONG(KILN_OP_LOG)
  KFX_UN_LONG(KILN_OP_COS)
  KFX_UN_LONG(KILN_OP_SIN)
  KFX_UN_LONG(KILN_OP_ERF)
  KFX_UN(KILN_OP_HARDSWISH)
  KFX_UN(KILN_OP_HARDSIGMOID)
  default: /* unreachable: the plan parser accepts only the kinds above (pointwise_steps.c) */
#pragma unroll
    for (int k = 0; k < V; k++) y[k] = x[k];
    break;
  }
#undef KFX_UN
#undef KFX_UN_LONG
}

template <int V>
static __device__ __forceinline__ void kfx_binary(int op, const float *a, const float *b,
                                                  float alpha, float *y) {
#define KFX_BIN(OP)                                                                             \
  case OP:                                                                                      \
    _Pragma("unroll") for (int k = 0; k < V; k++) y[k] = kcu_binop(OP, a[k], b[k], alpha);      \
    break;
  switch (op) {
  KFX_BIN(KILN_OP_ADD)
  KFX_BIN(KILN_OP_SUB)
  KFX_BIN(KILN_OP_MUL)
  KFX_BIN(KILN_OP_MINIMUM)
  KFX_BIN(KILN_OP_MAXIMUM)
  default: /* DIV, the one kind left (pointwise_steps.c) */
#pragma unroll
    for (int k = 0; k < V; k++) y[k] = kcu_binop(KILN_OP_DIV, a[k], b[k], alpha);
    break;
  }
#undef KFX_BIN
}

template <int V>
static __device__ __forceinline__ void kfx_store(const kcu_fx &p, void *out, int64_t i0,
                                                 const float *v) {
  const int dt = p.out_dtype;
  if (p.out_vec && (dt == KILN_F32 ? V == 4 : V == 8)) { /* 16 bytes, aligned */
    uint4 raw;
    if (dt == KILN_F32) {
      raw.x = __float_as_uint(v[0]), raw.y = __float_as_uint(v[1 % V]);
      raw.z = __float_as_uint(v[2 % V]), raw.w = __float_as_uint(v[3 % V]);
    } else {
      unsigned w[4];
#pragma unroll
      for (int q = 0; q < 4; q++) {
        if (dt == KILN_F16) {
          __half2 h = __floats2half2_rn(v[(2 * q) % V], v[(2 * q + 1) % V]);
          memcpy(&w[q], &h, sizeof h);
        } else {
          __nv_bfloat162 h = __floats2bfloat162_rn(v[(2 * q) % V], v[(2 * q + 1) % V]);
          memcpy(&w[q], &h, sizeof h);
        }
      }
      raw.x = w[0], raw.y = w[1], raw.z = w[2], raw.w = w[3];
    }
    ((uint4 *)out)[i0 / V] = raw;
    return;
  }
  switch (dt) {
  case KILN_F32:
#pragma unroll
    for (int k = 0; k < V; k++) ((float *)out)[i0 + k] = v[k];
    break;
  case KILN_F16:
#pragma unroll
    for (int k = 0; k < V; k++) ((__half *)out)[i0 + k] = __float2half_rn(v[k]);
    break;
  default:
#pragma unroll
    for (int k = 0; k < V; k++) ((__nv_bfloat16 *)out)[i0 + k] = __float2bfloat16_rn(v[k]);
    break;
  }
}

/* Operands of instruction s into xa (which holds the previous result) and xb. */
template <int V>
static __device__ __forceinline__ void kfx_operands(const float *rf, uint32_t code, uint32_t a,
                                                    uint32_t b, uint32_t fl, float *xa,
                                                    float *xb) {
  if (code == KILN_FX_BINARY || code == KILN_FX_SELECT) {
    if (fl & KFX_B_ACC) {
#pragma unroll
      for (int k = 0; k < V; k++) xb[k] = xa[k];
    } else {
      kfx_rf_get<V>(rf, b, xb);
    }
  }
  if (code != KILN_FX_LOAD && !(fl & KFX_A_ACC)) kfx_rf_get<V>(rf, a, xa);
}

/* __grid_constant__: the maps are indexed at run time, and this keeps them in the parameter
 * space instead of a per-thread copy. I: the index type (uint32_t narrow, int64_t wide). */
template <int V, int R, typename I>
__global__ void __launch_bounds__(KCU_BLOCK, 4)
    kcu_fx_kernel(const __grid_constant__ kcu_fx p, void *out, int64_t n_runs) {
  extern __shared__ float4 kfx_rf_mem[];
  float *rf = (float *)kfx_rf_mem;
  kcu_begin_early();
  const int ri = R - 1;
  const I row_runs = (I)(p.dims[ri] / V);
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n_runs; j += stride) {
    I coord[R > 1 ? R - 1 : 1], rest = (I)j, c0;
    float xa[V], xb[V];
    if (sizeof(I) == 4) { /* divisions as multiplies */
      uint32_t q = kfx_div(p, ri, (uint32_t)rest);
      c0 = (I)((uint32_t)rest - q * (uint32_t)row_runs) * V;
      rest = (I)q;
#pragma unroll
      for (int d = ri - 1; d >= 0; d--) {
        q = kfx_div(p, d, (uint32_t)rest);
        coord[d] = (I)((uint32_t)rest - q * (uint32_t)p.dims[d]);
        rest = (I)q;
      }
    } else {
      c0 = (rest % row_runs) * V;
      rest /= row_runs;
#pragma unroll
      for (int d = ri - 1; d >= 0; d--) {
        coord[d] = rest % (I)p.dims[d];
        rest /= (I)p.dims[d];
      }
    }
#pragma unroll
    for (int k = 0; k < V; k++) xa[k] = 0.0f;
    for (int s = 0; s < p.n_instrs; s++) {
      uint32_t w = p.code[s], code = w & 15u, dst = (w >> 4) & 15u, a = (w >> 8) & 15u;
      uint32_t b = (w >> 12) & 15u, arg = w >> 16, fl = p.flags[s];
      kfx_operands<V>(rf, code, a, b, fl, xa, xb);
      switch (code) {
      case KILN_FX_LOAD: kfx_load<V, R, I>(p, p.maps[arg], coord, c0, xa); break;
      case KILN_FX_UNARY: kfx_unary<V>((int)arg, xa, p.imm[s].f, xa); break;
      case KILN_FX_BINARY: kfx_binary<V>((int)arg, xa, xb, p.imm[s].f, xa); break;
      case KILN_FX_ROUND: /* the dtype tested once per run, not per element */
        if (arg == KILN_F16) {
#pragma unroll
          for (int k = 0; k < V; k++) xa[k] = kcu_fx_round(KILN_F16, xa[k]);
        } else {
#pragma unroll
          for (int k = 0; k < V; k++) xa[k] = kcu_fx_round(KILN_BF16, xa[k]);
        }
        break;
      case KILN_FX_SELECT:
        if ((int)arg == ri) { /* on the innermost coordinate: per element */
          I bound = (I)p.imm[s].i;
#pragma unroll
          for (int k = 0; k < V; k++) xa[k] = c0 + k < bound ? xa[k] : xb[k];
        } else { /* on an outer one: once per run */
          I c = coord[0];
#pragma unroll
          for (int d = 1; d < ri; d++)
            if ((int)arg == d) c = coord[d];
          bool first = c < (I)p.imm[s].i;
#pragma unroll
          for (int k = 0; k < V; k++) xa[k] = first ? xa[k] : xb[k];
        }
        break;
      default: kfx_store<V>(p, out, j * V, xa); continue; /* STORE */
      }
      if (fl & KFX_SPILL) kfx_rf_put<V>(rf, dst, xa);
    }
  }
}

/* Whether output dims a and a + 1 can become one dim of size n_a * n_b: every map's address is
 * then a stride times the merged coordinate and its box one range of it, and no SELECT reads
 * the inner coordinate alone. */
static int fx_mergeable(const kcu_fx *p, int a) {
  int64_t na = p->dims[a], nb = p->dims[a + 1];
  for (int s = 0; s < p->n_instrs; s++)
    if ((p->code[s] & 15u) == KILN_FX_SELECT && (int)(p->code[s] >> 16) == a + 1 && na != 1 &&
        nb != 1)
      return 0;
  for (int m = 0; m < KILN_FX_MAX_MAPS; m++) {
    const kcu_fx_map *x = &p->maps[m];
    int empty = x->lo[a] == x->hi[a] || x->lo[a + 1] == x->hi[a + 1];
    int inner_full = x->lo[a + 1] == 0 && x->hi[a + 1] == nb;
    if (na != 1 && nb != 1 && (__int128)x->stride[a] != (__int128)x->stride[a + 1] * nb)
      return 0;
    if (!empty && !inner_full && x->hi[a] - x->lo[a] != 1) return 0;
  }
  return 1;
}

static void fx_merge(kcu_fx *p, int a) {
  int64_t na = p->dims[a], nb = p->dims[a + 1];
  for (int m = 0; m < KILN_FX_MAX_MAPS; m++) {
    kcu_fx_map *x = &p->maps[m];
    int64_t lo, hi, stride = nb != 1 ? x->stride[a + 1] : x->stride[a];
    if (x->lo[a] == x->hi[a] || x->lo[a + 1] == x->hi[a + 1])
      lo = hi = 0;
    else if (x->lo[a + 1] == 0 && x->hi[a + 1] == nb)
      lo = x->lo[a] * nb, hi = x->hi[a] * nb;
    else
      lo = x->lo[a] * nb + x->lo[a + 1], hi = x->lo[a] * nb + x->hi[a + 1];
    x->stride[a] = stride, x->lo[a] = lo, x->hi[a] = hi;
    for (int d = a + 1; d + 1 < p->rank; d++)
      x->stride[d] = x->stride[d + 1], x->lo[d] = x->lo[d + 1], x->hi[d] = x->hi[d + 1];
  }
  for (int s = 0; s < p->n_instrs; s++) {
    uint32_t w = p->code[s];
    int d = (int)(w >> 16);
    if ((w & 15u) != KILN_FX_SELECT || d < a) continue;
    if (d == a) /* c_a < bound is c_a * nb + c_b < bound * nb */
      p->imm[s].i *= nb;
    else if (d == a + 1 && nb == 1) /* c_b is 0: always or never below the bound */
      p->imm[s].i = p->imm[s].i > 0 ? na : 0;
    /* d == a + 1 with na == 1: the merged coordinate is c_b, the bound stays */
    if (d > a) p->code[s] = (w & 0xffffu) | (uint32_t)(d - 1) << 16;
  }
  p->dims[a] = na * nb;
  for (int d = a + 1; d + 1 < p->rank; d++) p->dims[d] = p->dims[d + 1];
  p->rank--;
}

/* Which operands come from the previous instruction's result, which results are read again
 * later (those live in the register file), and how many registers that file holds. */
static void fx_schedule(kcu_fx *p, const kiln_fx_prog *prog) {
  p->n_rf = 0;
  for (uint32_t s = 0; s < prog->n_instrs; s++) {
    const kiln_fx_instr *x = &prog->instrs[s];
    const kiln_fx_instr *prev = s ? &prog->instrs[s - 1] : NULL;
    int from_prev = prev && prev->code != KILN_FX_STORE;
    uint8_t fl = 0;
    if (from_prev && x->code != KILN_FX_LOAD && prev->dst == x->a) fl |= KFX_A_ACC;
    if (from_prev && (x->code == KILN_FX_BINARY || x->code == KILN_FX_SELECT) &&
        prev->dst == x->b)
      fl |= KFX_B_ACC;
    if (x->code != KILN_FX_STORE)
      for (uint32_t t = s + 1; t < prog->n_instrs; t++) {
        const kiln_fx_instr *y = &prog->instrs[t];
        int reads = (y->code != KILN_FX_LOAD && y->a == x->dst) ||
                    ((y->code == KILN_FX_BINARY || y->code == KILN_FX_SELECT) && y->b == x->dst);
        if (reads && t > s + 1) {
          fl |= KFX_SPILL;
          if ((int32_t)x->dst + 1 > p->n_rf) p->n_rf = (int32_t)x->dst + 1;
          break;
        }
        if (y->code != KILN_FX_STORE && y->dst == x->dst) break;
      }
    p->flags[s] = fl;
  }
}

/* Pads the output to rank r with leading dims of 1 (every map's box over them whole), so the
 * kernel's coordinate and address loops have a constant trip count. */
static void fx_pad(kcu_fx *p, int r) {
  int pad = r - p->rank;
  if (pad <= 0) return;
  for (int d = p->rank - 1; d >= 0; d--) p->dims[d + pad] = p->dims[d];
  for (int m = 0; m < KILN_FX_MAX_MAPS; m++) {
    kcu_fx_map *x = &p->maps[m];
    for (int d = p->rank - 1; d >= 0; d--)
      x->stride[d + pad] = x->stride[d], x->lo[d + pad] = x->lo[d], x->hi[d + pad] = x->hi[d];
    for (int d = 0; d < pad; d++) x->stride[d] = 0, x->lo[d] = 0, x->hi[d] = 1;
  }
  for (int d = 0; d < pad; d++) p->dims[d] = 1;
  for (int s = 0; s < p->n_instrs; s++)
    if ((p->code[s] & 15u) == KILN_FX_SELECT)
      p->code[s] = (p->code[s] & 0xffffu) | ((p->code[s] >> 16) + (uint32_t)pad) << 16;
  p->rank = r;
}

template <int V, int R, typename I>
static void fx_launch(cudaStream_t s, const kcu_fx &p, void *out, int64_t numel) {
  int64_t n_runs = numel / V, block = KCU_BLOCK;
  size_t per_thread = (size_t)p.n_rf * V * sizeof(float);
  while (block > 32 && per_thread * (size_t)block > 48 * 1024) block /= 2;
  int64_t blocks = (n_runs + block - 1) / block;
  if (blocks > 65535LL * 16) blocks = 65535LL * 16;
  kcu_launch_early(kcu_fx_kernel<V, R, I>, (unsigned)blocks, (unsigned)block,
                   per_thread * (size_t)block, s, p, out, n_runs);
}

template <int R>
static void fx_launch_v(cudaStream_t s, const kcu_fx &p, int v, void *out, int64_t numel) {
  if (v == 8)
    fx_launch<8, R, uint32_t>(s, p, out, numel);
  else if (v == 4)
    fx_launch<4, R, uint32_t>(s, p, out, numel);
  else if (v == 2)
    fx_launch<2, R, uint32_t>(s, p, out, numel);
  else
    fx_launch<1, R, uint32_t>(s, p, out, numel);
}

cudaError_t kcu_fx_prepare(const kiln_plan *plan, const kiln_op *op, const kcu_tensor *in,
                           const kcu_tensor *out, kcu_fx *p_out) {
  const kiln_tensor_desc *desc[KILN_MAX_OP_INPUTS];
  kiln_fx_prog prog;
  kcu_fx &p = *p_out;
  int v;
  for (uint32_t k = 0; k < op->n_inputs; k++) desc[k] = &plan->tensors[op->inputs[k]];
  /* at this call's sizes (plan holds them), boxes cut to the call's output dims; cuda_check.c
   * decoded it at these sizes before any run, so it decodes again */
  if (kiln_fx_decode_at(plan->words, plan->n_words, op, 0, desc, &plan->tensors[op->output],
                        &prog, NULL) != KILN_OK)
    return cudaErrorInvalidValue;
  memset(&p, 0, sizeof p);
  p.rank = prog.rank;
  p.n_instrs = (int32_t)prog.n_instrs;
  p.out_dtype = out->dtype;
  p.out_vec = ((uintptr_t)out->data & 15u) == 0;
  for (uint32_t k = 0; k < op->n_inputs; k++) p.in[k] = in[k].data, p.in_dtype[k] = in[k].dtype;
  for (int d = 0; d < out->rank; d++) p.dims[d] = out->dims[d];
  if (p.rank == 0) p.rank = 1, p.dims[0] = 1; /* a scalar is a run of one */
  /* unused maps get a whole-output box and zero strides, so they never stop a merge */
  for (int m = 0; m < KILN_FX_MAX_MAPS; m++)
    for (int d = 0; d < p.rank; d++) p.maps[m].hi[d] = p.dims[d];
  for (uint32_t m = 0; m < prog.n_maps; m++) {
    const kiln_fx_map *src = &prog.maps[m];
    kcu_fx_map *dst = &p.maps[m];
    dst->slot = (int32_t)src->slot;
    dst->offset = src->offset;
    for (int d = 0; d < prog.rank; d++)
      dst->stride[d] = src->stride[d], dst->lo[d] = src->lo[d], dst->hi[d] = src->hi[d];
  }
  for (uint32_t i = 0; i < prog.n_instrs; i++) {
    const kiln_fx_instr *x = &prog.instrs[i];
    p.code[i] = x->code | x->dst << 4 | x->a << 8 | x->b << 12 | x->arg << 16;
    if (x->code == KILN_FX_SELECT)
      p.imm[i].i = x->bound;
    else if (x->code == KILN_FX_UNARY && x->arg == KILN_OP_GELU)
      p.imm[i].f = x->gelu_tanh ? 1.0f : 0.0f;
    else
      p.imm[i].f = (float)x->imm;
  }
  for (int a = p.rank - 2; a >= 0; a--)
    if (fx_mergeable(&p, a)) fx_merge(&p, a);
  /* 32-bit index math: every coordinate under 2^32 and every in-box address under 2^31 */
  int narrow = out->numel <= (int64_t)UINT32_MAX;
  for (uint32_t k = 0; k < op->n_inputs; k++) narrow &= in[k].numel <= (int64_t)INT32_MAX;
  fx_pad(&p, !narrow || p.rank > 4 ? KILN_MAX_RANK : 4);
  for (uint32_t m = 0; m < prog.n_maps; m++) {
    kcu_fx_map *x = &p.maps[m];
    int ri = p.rank - 1, outer = 1;
    for (int d = 0; d < ri; d++) outer &= x->lo[d] == 0 && x->hi[d] == p.dims[d];
    int inner = x->lo[ri] == 0 && x->hi[ri] == p.dims[ri];
    x->box = (outer && inner ? KFX_FULL : 0) | (outer ? KFX_OUTER : 0) | (inner ? KFX_INNER : 0);
  }
  fx_schedule(&p, &prog);
  /* a run is 16 bytes of output where the innermost dim divides into such runs */
  v = out->dtype == KILN_F32 ? 4 : 8;
  while (v > 1 && p.dims[p.rank - 1] % v != 0) v /= 2;
  /* a small output (a decoding step's) in shorter runs: more threads, each a shorter program */
  while (v > 1 && out->numel / v < KFX_FEW_RUNS) v /= 2;
  if (narrow) {
    fx_divisor(&p, p.rank - 1, (uint64_t)(p.dims[p.rank - 1] / v));
    for (int d = 0; d + 1 < p.rank; d++) fx_divisor(&p, d, (uint64_t)p.dims[d]);
  }
  p.run = narrow ? v : 1;
  p.narrow = narrow;
  return cudaSuccess;
}

cudaError_t kcu_fused(cudaStream_t s, const kiln_plan *plan, const kiln_op *op,
                      const kcu_tensor *in, const kcu_tensor *out) {
  kcu_fx p;
  if (out->numel == 0) return cudaSuccess;
  cudaError_t rc = kcu_fx_prepare(plan, op, in, out, &p);
  if (rc != cudaSuccess) return rc;
  if (!p.narrow)
    fx_launch<1, KILN_MAX_RANK, int64_t>(s, p, out->data, out->numel); /* rare: one variant */
  else if (p.rank == 4)
    fx_launch_v<4>(s, p, p.run, out->data, out->numel);
  else
    fx_launch_v<KILN_MAX_RANK>(s, p, p.run, out->data, out->numel);
  return cudaGetLastError();
}
