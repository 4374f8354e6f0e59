/* POINTWISE: a fused chain of pointwise steps in one kernel. Each thread keeps its value in an
 * f32 register through every step (the math of the unfused ops, from cuda_device.cuh) and
 * stores it once. Operands that are all contiguous, of the output's shape and 16-byte aligned
 * take a vectorized path; otherwise each extra operand's broadcast offset is decomposed from
 * the element index. */
#include "core/pointwise_steps.h"
#include "cuda_device.cuh"

#include <string.h>

/* The chain, passed by value: decoded steps, operands and their broadcast strides. */
typedef struct kcu_chain {
  int32_t n_steps, n_in, rank, dtype;
  int32_t kind[KILN_PW_MAX_STEPS];
  int32_t slot[KILN_PW_MAX_STEPS];     /* a binary step's operand input, 0 for unary */
  int32_t reversed[KILN_PW_MAX_STEPS]; /* operand op value */
  float param[KILN_PW_MAX_STEPS];      /* POW's exponent, GELU's tanh flag */
  const void *in[KILN_MAX_OP_INPUTS];
  int64_t dims[KILN_MAX_RANK];
  int64_t st[KILN_MAX_OP_INPUTS][KILN_MAX_RANK];
} kcu_chain;

static __device__ __forceinline__ float kcu_chain_step(const kcu_chain *c, int s, float v,
                                                       float y) {
  if (c->slot[s] == 0) return kcu_unop(c->kind[s], v, c->param[s]);
  return c->reversed[s] ? kcu_binop(c->kind[s], y, v, 1.0f) : kcu_binop(c->kind[s], v, y, 1.0f);
}

/* Every operand contiguous and of the output's shape: 16 bytes per operand per thread. */
__global__ void kcu_chain_vec(kcu_chain c, void *out, int64_t n) {
  int per = c.dtype == KILN_F32 ? 4 : 8;
  int64_t nv = n / per;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += stride) {
    float x[8], y[8] = {0};
    kcu_ld16(c.in[0], c.dtype, v, x);
    for (int s = 0; s < c.n_steps; s++) {
      if (c.slot[s]) kcu_ld16(c.in[c.slot[s]], c.dtype, v, y);
      for (int k = 0; k < per; k++) x[k] = kcu_chain_step(&c, s, x[k], y[k]);
    }
    kcu_st16(out, c.dtype, v, x);
  }
  for (int64_t i = nv * per + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float x = kcu_ld(c.in[0], c.dtype, i);
    for (int s = 0; s < c.n_steps; s++)
      x = kcu_chain_step(&c, s, x, c.slot[s] ? kcu_ld(c.in[c.slot[s]], c.dtype, i) : 0.0f);
    kcu_st(out, c.dtype, i, x);
  }
}

/* Any broadcast: input 0 has the output's shape, the others are read at their offsets. */
__global__ void kcu_chain_generic(kcu_chain c, void *out, int64_t n) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[KILN_MAX_OP_INPUTS], rest = i;
    for (int k = 1; k < c.n_in; k++) off[k] = 0;
    for (int d = c.rank - 1; d >= 0; d--) {
      int64_t at = rest % c.dims[d];
      rest /= c.dims[d];
      for (int k = 1; k < c.n_in; k++) off[k] += at * c.st[k][d];
    }
    float x = kcu_ld(c.in[0], c.dtype, i);
    for (int s = 0; s < c.n_steps; s++)
      x = kcu_chain_step(&c, s, x, c.slot[s] ? kcu_ld(c.in[c.slot[s]], c.dtype, off[c.slot[s]]) : 0.0f);
    kcu_st(out, c.dtype, i, x);
  }
}

static int kcu_chain_vec_ok(const kcu_tensor *in, uint32_t n_in, const kcu_tensor *out) {
  if (((uintptr_t)out->data & 15u) != 0) return 0;
  for (uint32_t k = 0; k < n_in; k++) {
    if (((uintptr_t)in[k].data & 15u) != 0 || in[k].rank != out->rank) return 0;
    for (int d = 0; d < out->rank; d++)
      if (in[k].dims[d] != out->dims[d]) return 0;
  }
  return 1;
}

cudaError_t kcu_fused_pointwise(cudaStream_t s, const kiln_op *op, const kcu_tensor *in,
                                const kcu_tensor *out) {
  kcu_chain c;
  if (out->numel == 0) return cudaSuccess;
  memset(&c, 0, sizeof c);
  c.n_steps = (int32_t)op->n_iattr;
  c.n_in = (int32_t)op->n_inputs;
  c.rank = out->rank;
  c.dtype = out->dtype;
  for (uint32_t k = 0; k < op->n_iattr; k++) {
    int64_t step = op->iattr[k];
    c.kind[k] = (int32_t)KILN_PW_STEP_KIND(step);
    c.slot[k] = kiln_pw_is_binary(KILN_PW_STEP_KIND(step)) ? (int32_t)KILN_PW_STEP_INPUT(step) : 0;
    c.reversed[k] = (step & KILN_PW_REVERSED) != 0;
    c.param[k] = c.kind[k] == KILN_OP_POW ? (float)op->fattr[0]
                                          : (step & KILN_PW_GELU_TANH) ? 1.0f : 0.0f;
  }
  for (uint32_t k = 0; k < op->n_inputs; k++) {
    c.in[k] = in[k].data;
    kcu_broadcast_strides(&in[k], out->rank, out->dims, c.st[k]);
  }
  for (int d = 0; d < out->rank; d++) c.dims[d] = out->dims[d];
  if (kcu_chain_vec_ok(in, op->n_inputs, out))
    kcu_chain_vec<<<kcu_grid(out->numel, 8), KCU_BLOCK, 0, s>>>(c, out->data, out->numel);
  else
    kcu_chain_generic<<<kcu_grid(out->numel, 4), KCU_BLOCK, 0, s>>>(c, out->data, out->numel);
  return cudaGetLastError();
}
