/* FUSED: one generic kernel interprets a group's register program, one thread per output
 * element. The program is decoded on the host into a kernel argument (so a captured graph
 * keeps it), registers are f32 and each instruction uses the unfused ops' device math
 * (cuda_device.cuh), rounding where the program says an unfused op or cast would. */
#include "core/fused_program.h"
#include "cuda_device.cuh"

#include <string.h>

typedef struct kcu_fx_map {
  int32_t slot, full;
  int64_t offset;
  int64_t stride[KILN_MAX_RANK], lo[KILN_MAX_RANK], hi[KILN_MAX_RANK];
} kcu_fx_map;

/* The program as the kernel reads it: about 3.5 KB, under the 4 KB a kernel argument takes. */
typedef struct kcu_fx {
  int32_t rank, n_instrs, out_dtype;
  int32_t narrow; /* the output has fewer than 2^32 elements: 32-bit index division */
  int32_t in_dtype[KILN_MAX_OP_INPUTS];
  const void *in[KILN_MAX_OP_INPUTS];
  int64_t dims[KILN_MAX_RANK];
  kcu_fx_map maps[KILN_FX_MAX_MAPS];
  uint32_t code[KILN_FX_MAX_INSTRS]; /* code | dst << 4 | a << 8 | b << 12 | arg << 16 */
  union {
    float f;     /* POW's exponent, GELU's tanh flag, ADD/SUB's alpha */
    int64_t i;   /* SELECT's bound */
  } imm[KILN_FX_MAX_INSTRS];
} kcu_fx;

static_assert(sizeof(kcu_fx) <= 4096, "a kernel argument takes at most 4 KB");

static __device__ __forceinline__ float kcu_fx_round(int dt, float v) {
  return dt == KILN_F16 ? __half2float(__float2half_rn(v))
                        : __bfloat162float(__float2bfloat16_rn(v));
}

/* __grid_constant__: the maps are indexed at run time, and this keeps them in the parameter
 * space instead of a per-thread copy. */
__global__ void kcu_fx_kernel(const __grid_constant__ kcu_fx p, void *out, int64_t n) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t coord[KILN_MAX_RANK], rest = i;
    float reg[KILN_FX_MAX_REGS];
    if (p.narrow) { /* a 64-bit division costs several times a 32-bit one */
      uint32_t r32 = (uint32_t)i;
      for (int d = p.rank - 1; d >= 0; d--) {
        coord[d] = r32 % (uint32_t)p.dims[d];
        r32 /= (uint32_t)p.dims[d];
      }
    } else {
      for (int d = p.rank - 1; d >= 0; d--) {
        coord[d] = rest % p.dims[d];
        rest /= p.dims[d];
      }
    }
    for (int s = 0; s < p.n_instrs; s++) {
      uint32_t w = p.code[s], code = w & 15u, dst = (w >> 4) & 15u, a = (w >> 8) & 15u;
      uint32_t b = (w >> 12) & 15u, arg = w >> 16;
      float v = 0.0f;
      switch (code) {
      case KILN_FX_LOAD: {
        const kcu_fx_map *m = &p.maps[arg];
        int64_t at = m->offset;
        int inside = 1;
        for (int d = 0; d < p.rank; d++) {
          if (!m->full) inside &= coord[d] >= m->lo[d] && coord[d] < m->hi[d];
          at += coord[d] * m->stride[d];
        }
        if (inside) v = kcu_ld(p.in[m->slot], p.in_dtype[m->slot], at);
        break;
      }
      case KILN_FX_UNARY: v = kcu_unop((int)arg, reg[a], p.imm[s].f); break;
      case KILN_FX_BINARY: v = kcu_binop((int)arg, reg[a], reg[b], p.imm[s].f); break;
      case KILN_FX_ROUND: v = kcu_fx_round((int)arg, reg[a]); break;
      case KILN_FX_SELECT: v = coord[arg] < p.imm[s].i ? reg[a] : reg[b]; break;
      default: kcu_st(out, p.out_dtype, i, reg[a]); continue; /* STORE */
      }
      reg[dst] = v;
    }
  }
}

cudaError_t kcu_fused(cudaStream_t s, const kiln_plan *plan, const kiln_op *op,
                      const kcu_tensor *in, const kcu_tensor *out) {
  const kiln_tensor_desc *desc[KILN_MAX_OP_INPUTS];
  kiln_fx_prog prog;
  kcu_fx p;
  if (out->numel == 0) return cudaSuccess;
  for (uint32_t k = 0; k < op->n_inputs; k++) desc[k] = &plan->tensors[op->inputs[k]];
  /* cuda_check.c decoded this program at init, so it decodes again */
  if (kiln_fx_decode(plan->words, plan->n_words, op, 0, desc, &plan->tensors[op->output], &prog,
                     NULL) != KILN_OK)
    return cudaErrorInvalidValue;
  memset(&p, 0, sizeof p);
  p.rank = prog.rank;
  p.n_instrs = (int32_t)prog.n_instrs;
  p.out_dtype = out->dtype;
  p.narrow = out->numel <= (int64_t)UINT32_MAX;
  for (uint32_t k = 0; k < op->n_inputs; k++) p.in[k] = in[k].data, p.in_dtype[k] = in[k].dtype;
  for (int d = 0; d < out->rank; d++) p.dims[d] = out->dims[d];
  for (uint32_t m = 0; m < prog.n_maps; m++) {
    const kiln_fx_map *src = &prog.maps[m];
    kcu_fx_map *dst = &p.maps[m];
    dst->slot = (int32_t)src->slot;
    dst->full = src->full;
    dst->offset = src->offset;
    memcpy(dst->stride, src->stride, sizeof dst->stride);
    memcpy(dst->lo, src->lo, sizeof dst->lo);
    memcpy(dst->hi, src->hi, sizeof dst->hi);
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
  kcu_fx_kernel<<<kcu_grid(out->numel, 4), KCU_BLOCK, 0, s>>>(p, out->data, out->numel);
  return cudaGetLastError();
}
