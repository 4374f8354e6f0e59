/* FUSED: a group's register program, run once per output element with reference semantics:
 * f32 registers, the unfused ops' own math (kiln_cpu_unary_f32, kiln_cpu_binary_f32), and a
 * rounding wherever the program says an unfused op's output or a cast would round. A dynamic
 * plan's program runs over this call's output dims, its boxes cut to them. */
#include "runtime/fused_program.h"
#include "cpu/cpu_ops.h"

static float round_as(kiln_dtype dt, float v) {
  return dt == KILN_F16 ? kiln_f16_to_f32(kiln_f32_to_f16(v))
                        : kiln_bf16_to_f32(kiln_f32_to_bf16(v));
}

void kiln_cpu_fused(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *in[KILN_MAX_OP_INPUTS];
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  void *po = r->data[op->output];
  int64_t n = kiln_cpu_numel(out), coord[KILN_MAX_RANK] = {0};
  kiln_op unary; /* a unary instruction as the op kiln_cpu_unary_f32 reads */
  kiln_fx_prog prog;
  float reg[KILN_FX_MAX_REGS];
  for (uint32_t k = 0; k < op->n_inputs; k++) in[k] = kiln_cpu_desc(r, op->inputs[k]);
  /* checked at these sizes when the call's shapes were set, so decoding again cannot fail */
  if (kiln_fx_decode_at(r->plan->words, r->plan->n_words, op, 0, in, out, &prog, NULL) != KILN_OK)
    return;
  memset(&unary, 0, sizeof unary);
  for (int64_t i = 0; i < n; i++) {
    for (uint32_t s = 0; s < prog.n_instrs; s++) {
      const kiln_fx_instr *x = &prog.instrs[s];
      float v = 0.0f;
      switch (x->code) {
      case KILN_FX_LOAD: {
        const kiln_fx_map *m = &prog.maps[x->arg];
        int64_t at = m->offset, inside = 1;
        for (int32_t d = 0; d < prog.rank; d++) inside &= coord[d] >= m->lo[d] && coord[d] < m->hi[d];
        /* The parser bounds the address inside the box only: outside it, it may overflow. */
        for (int32_t d = 0; inside && d < prog.rank; d++) at += coord[d] * m->stride[d];
        if (inside) v = kiln_cpu_ldf(r->data[op->inputs[m->slot]], in[m->slot]->dtype, at);
        break;
      }
      case KILN_FX_UNARY:
        unary.kind = (kiln_op_kind)x->arg;
        unary.iattr[0] = x->gelu_tanh;
        unary.fattr[0] = x->imm;
        v = kiln_cpu_unary_f32(&unary, reg[x->a]);
        break;
      case KILN_FX_BINARY:
        v = kiln_cpu_binary_f32((kiln_op_kind)x->arg, reg[x->a], reg[x->b], (float)x->imm);
        break;
      case KILN_FX_ROUND: v = round_as((kiln_dtype)x->arg, reg[x->a]); break;
      case KILN_FX_SELECT: v = coord[x->arg] < x->bound ? reg[x->a] : reg[x->b]; break;
      default: kiln_cpu_stf(po, out->dtype, i, reg[x->a]); continue; /* STORE */
      }
      reg[x->dst] = v;
    }
    for (int32_t d = prog.rank - 1; d >= 0; d--) {
      if (++coord[d] < out->dims[d]) break;
      coord[d] = 0;
    }
  }
}
