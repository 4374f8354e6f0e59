/* A chain of pointwise steps on the device: POINTWISE's whole op, and the steps fused before
 * and after a norm. Each step computes in f32 with the math of the unfused op
 * (cuda_device.cuh), so a fused step gives what its op alone would before rounding. */
#ifndef KILN_CUDA_CHAIN_CUH
#define KILN_CUDA_CHAIN_CUH

#include "runtime/pointwise_steps.h"
#include "cuda_device.cuh"

/* The steps decoded for the device, passed by value: operand pointers and their broadcast
 * strides against the chain's shape. in[0] is x; full[k] says operand k has that shape. */
typedef struct kcu_chain {
  int32_t n_steps, n_in, rank, dtype;
  int32_t kind[KILN_PW_MAX_STEPS];
  int32_t slot[KILN_PW_MAX_STEPS];     /* a binary step's operand input, 0 for unary */
  int32_t reversed[KILN_PW_MAX_STEPS]; /* operand op value */
  float param[KILN_PW_MAX_STEPS];      /* POW's exponent, GELU's tanh flag */
  const void *in[KILN_MAX_OP_INPUTS];
  int32_t full[KILN_MAX_OP_INPUTS];
  int64_t dims[KILN_MAX_RANK];
  int64_t st[KILN_MAX_OP_INPUTS][KILN_MAX_RANK];
} kcu_chain;

/* Fills c from span for operands in[0..n_in) broadcast to shape's dims (host). */
void kcu_chain_init(kcu_chain *c, const kiln_pw_span *span, const kcu_tensor *in, uint32_t n_in,
                    const kcu_tensor *shape);

/* One step of kind on v: unary, or binary with operand y (y op v where reversed). */
static __device__ __forceinline__ float kcu_step_math(int kind, int binary, int reversed,
                                                      float param, float v, float y) {
  if (!binary) return kcu_unop(kind, v, param);
  return reversed ? kcu_binop(kind, y, v, 1.0f) : kcu_binop(kind, v, y, 1.0f);
}

static __device__ __forceinline__ float kcu_chain_step(const kcu_chain *c, int s, float v,
                                                       float y) {
  return kcu_step_math(c->kind[s], c->slot[s] != 0, c->reversed[s], c->param[s], v, y);
}

/* Element offset of operand k at element i of the chain's shape. */
static __device__ __forceinline__ int64_t kcu_chain_offset(const kcu_chain *c, int k, int64_t i) {
  int64_t off = 0;
  if (c->full[k]) return i;
  for (int d = c->rank - 1; d >= 0; d--) {
    off += (i % c->dims[d]) * c->st[k][d];
    i /= c->dims[d];
  }
  return off;
}

/* Steps [from, to) on v, the value at element i. */
static __device__ __forceinline__ float kcu_chain_apply(const kcu_chain *c, int from, int to,
                                                        float v, int64_t i) {
  for (int s = from; s < to; s++) {
    int k = c->slot[s];
    v = kcu_chain_step(c, s, v, k ? kcu_ld(c->in[k], c->dtype, kcu_chain_offset(c, k, i)) : 0.0f);
  }
  return v;
}

#endif
