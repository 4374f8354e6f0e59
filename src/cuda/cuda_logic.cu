/* Comparisons and boolean ops with broadcasting, as the CPU engine computes them
 * (cpu_logic.c): floats compare in f32, integers and bools as 64-bit integers; COMPARE and
 * LOGICAL write bool, BITWISE its inputs' dtype. */
#include "cuda_device.cuh"

static __device__ __forceinline__ int kcu_is_floating(int dt) {
  return dt == KILN_F32 || dt == KILN_F16 || dt == KILN_BF16;
}

static __device__ __forceinline__ int kcu_cmp_float(int cmp, float a, float b) {
  switch (cmp) {
  case KILN_CMP_EQ: return a == b;
  case KILN_CMP_NE: return a != b;
  case KILN_CMP_LT: return a < b;
  case KILN_CMP_LE: return a <= b;
  case KILN_CMP_GT: return a > b;
  default: return a >= b; /* GE */
  }
}

static __device__ __forceinline__ int kcu_cmp_int(int cmp, long long a, long long b) {
  switch (cmp) {
  case KILN_CMP_EQ: return a == b;
  case KILN_CMP_NE: return a != b;
  case KILN_CMP_LT: return a < b;
  case KILN_CMP_LE: return a <= b;
  case KILN_CMP_GT: return a > b;
  default: return a >= b; /* GE */
  }
}

__global__ void kcu_compare_kernel(kcu_bcast g, int cmp, const void *a, const void *b, int dt,
                                   unsigned char *out, int64_t n) {
  kcu_begin_early();
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int floating = kcu_is_floating(dt);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[2];
    kcu_offsets(&g, i, 2, off);
    int r = floating ? kcu_cmp_float(cmp, kcu_ld(a, dt, off[0]), kcu_ld(b, dt, off[1]))
                     : kcu_cmp_int(cmp, kcu_ldi(a, dt, off[0]), kcu_ldi(b, dt, off[1]));
    out[i] = (unsigned char)r;
  }
}

/* Nonzero is true; NaN is nonzero. */
static __device__ __forceinline__ long long kcu_truth(const void *p, int dt, int64_t i) {
  return kcu_is_floating(dt) ? kcu_ld(p, dt, i) != 0.0f : kcu_ldi(p, dt, i) != 0;
}

/* LOGICAL on the truth of each input, BITWISE on the integers (NOT of a bool: logical not). */
__global__ void kcu_bool_kernel(kcu_bcast g, int logical, int which, int n_in, const void *a,
                                int da, const void *b, int db, void *out, int dout, int64_t n) {
  kcu_begin_early();
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[2];
    kcu_offsets(&g, i, n_in, off);
    long long x = logical ? kcu_truth(a, da, off[0]) : kcu_ldi(a, da, off[0]);
    long long y = n_in < 2 ? 0 : logical ? kcu_truth(b, db, off[1]) : kcu_ldi(b, db, off[1]);
    long long r;
    switch (which) {
    case KILN_BOOL_AND: r = x & y; break;
    case KILN_BOOL_OR: r = x | y; break;
    case KILN_BOOL_XOR: r = x ^ y; break;
    default: r = logical || dout == KILN_BOOL ? !x : ~x; break; /* NOT */
    }
    kcu_sti(out, dout, i, r);
  }
}

cudaError_t kcu_compare(cudaStream_t s, kiln_compare cmp, const kcu_tensor *a,
                        const kcu_tensor *b, const kcu_tensor *out) {
  if (out->numel == 0) return cudaSuccess;
  const kcu_tensor *ops[2] = {a, b};
  kcu_bcast g = kcu_make_bcast(out, ops, 2);
  kcu_launch_early(kcu_compare_kernel, kcu_grid(out->numel, 4), KCU_BLOCK, 0, s,
      g, (int)cmp, a->data, b->data, a->dtype, (unsigned char *)out->data, out->numel);
  return cudaGetLastError();
}

cudaError_t kcu_bool_op(cudaStream_t s, kiln_op_kind kind, kiln_bool_op which,
                        const kcu_tensor *in, uint32_t n_in, const kcu_tensor *out) {
  if (out->numel == 0) return cudaSuccess;
  const kcu_tensor *ops[2] = {&in[0], n_in > 1 ? &in[1] : &in[0]};
  kcu_bcast g = kcu_make_bcast(out, ops, (int)n_in);
  const kcu_tensor *b = ops[1];
  kcu_launch_early(kcu_bool_kernel, kcu_grid(out->numel, 4), KCU_BLOCK, 0, s,
      g, kind == KILN_OP_LOGICAL, (int)which, (int)n_in, in[0].data, in[0].dtype, b->data,
      b->dtype, out->data, out->dtype, out->numel);
  return cudaGetLastError();
}
