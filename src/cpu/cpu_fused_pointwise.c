/* POINTWISE: a fused chain of pointwise steps. Each step computes in f32 with the same
 * functions the unfused ops use, so an f32 chain matches them bit for bit; the result is
 * rounded to the output dtype once. */
#include "core/pointwise_steps.h"
#include "cpu/cpu_ops.h"

void kiln_cpu_fused_pointwise(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *in[KILN_MAX_OP_INPUTS];
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  kiln_op unary[KILN_PW_MAX_STEPS]; /* each unary step as the op kiln_cpu_unary_f32 reads */
  void *po = r->data[op->output];
  int64_t n = kiln_cpu_numel(out);
  kiln_cpu_iter it;
  memset(unary, 0, sizeof unary);
  for (uint32_t k = 0; k < op->n_inputs; k++) in[k] = kiln_cpu_desc(r, op->inputs[k]);
  for (uint32_t s = 0; s < op->n_iattr; s++) {
    unary[s].kind = KILN_PW_STEP_KIND(op->iattr[s]);
    unary[s].iattr[0] = (op->iattr[s] & KILN_PW_GELU_TANH) != 0;
    unary[s].fattr[0] = op->fattr[0];
  }
  kiln_cpu_iter_init(&it, out, in, (int32_t)op->n_inputs);
  for (int64_t i = 0; i < n; i++, kiln_cpu_iter_next(&it)) {
    float v = kiln_cpu_ldf(r->data[op->inputs[0]], in[0]->dtype, it.off[0]);
    for (uint32_t s = 0; s < op->n_iattr; s++) {
      int64_t step = op->iattr[s];
      uint32_t k = KILN_PW_STEP_INPUT(step);
      float y;
      if (!kiln_pw_is_binary(unary[s].kind)) {
        v = kiln_cpu_unary_f32(&unary[s], v);
        continue;
      }
      y = kiln_cpu_ldf(r->data[op->inputs[k]], in[k]->dtype, it.off[k]);
      v = step & KILN_PW_REVERSED ? kiln_cpu_binary_f32(unary[s].kind, y, v, 1.0f)
                                  : kiln_cpu_binary_f32(unary[s].kind, v, y, 1.0f);
    }
    kiln_cpu_stf(po, out->dtype, i, v);
  }
}
