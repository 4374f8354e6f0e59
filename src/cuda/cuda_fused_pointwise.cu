/* POINTWISE: a fused chain of pointwise steps in one kernel. Each thread keeps its value in an
 * f32 register through every step (the math of the unfused ops, from cuda_device.cuh) and
 * stores it once. Operands that are all contiguous, of the output's shape and 16-byte aligned
 * take a vectorized path; otherwise each extra operand's broadcast offset is decomposed from
 * the element index. */
#include "cuda_chain.cuh"

#include <string.h>

/* Every operand contiguous and of the output's shape: 16 bytes per operand per thread. */
__global__ void kcu_chain_vec(kcu_chain c, void *out, int64_t n) {
  kcu_begin_early();
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
  kcu_begin_early();
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    kcu_st(out, c.dtype, i, kcu_chain_apply(&c, 0, c.n_steps, kcu_ld(c.in[0], c.dtype, i), i));
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

void kcu_chain_init(kcu_chain *c, const kiln_pw_span *span, const kcu_tensor *in, uint32_t n_in,
                    const kcu_tensor *shape) {
  memset(c, 0, sizeof *c);
  c->n_steps = (int32_t)span->n_steps;
  c->n_in = (int32_t)n_in;
  c->rank = shape->rank;
  c->dtype = in[0].dtype;
  for (uint32_t k = 0; k < span->n_steps; k++) {
    int64_t step = span->steps[k];
    c->kind[k] = (int32_t)KILN_PW_STEP_KIND(step);
    c->slot[k] = kiln_pw_is_binary(KILN_PW_STEP_KIND(step)) ? (int32_t)KILN_PW_STEP_INPUT(step) : 0;
    c->reversed[k] = (step & KILN_PW_REVERSED) != 0;
    c->param[k] = c->kind[k] == KILN_OP_POW ? (float)span->exponent
                                            : (step & KILN_PW_GELU_TANH) ? 1.0f : 0.0f;
  }
  for (uint32_t k = 0; k < n_in; k++) {
    c->in[k] = in[k].data;
    kcu_broadcast_strides(&in[k], shape->rank, shape->dims, c->st[k]);
    c->full[k] = in[k].numel == shape->numel;
  }
  for (int d = 0; d < shape->rank; d++) c->dims[d] = shape->dims[d];
}

cudaError_t kcu_fused_pointwise(cudaStream_t s, const kiln_op *op, const kcu_tensor *in,
                                const kcu_tensor *out) {
  kcu_chain c;
  kiln_pw_span span;
  if (out->numel == 0) return cudaSuccess;
  kiln_pw_span_of(op, &span);
  kcu_chain_init(&c, &span, in, op->n_inputs, out);
  if (kcu_chain_vec_ok(in, op->n_inputs, out))
    kcu_launch_early(kcu_chain_vec, kcu_grid(out->numel, 8), KCU_BLOCK, 0, s, c, out->data,
                     out->numel);
  else
    kcu_launch_early(kcu_chain_generic, kcu_grid(out->numel, 4), KCU_BLOCK, 0, s, c, out->data,
                     out->numel);
  return cudaGetLastError();
}
