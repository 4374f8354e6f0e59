/* POINTWISE: a fused chain of pointwise steps. Each step computes in f32 with the same
 * functions the unfused ops use, so an f32 chain matches them bit for bit; the result is
 * rounded to the output dtype once. The norms run their fused steps through the same code. */
#include "cpu/cpu_ops.h"

int kiln_cpu_steps_init(kiln_cpu_steps *st, const kiln_op *op) {
  memset(st, 0, sizeof *st);
  if (!kiln_pw_span_of(op, &st->span)) return 0;
  for (uint32_t s = 0; s < st->span.n_steps && s < KILN_PW_MAX_STEPS; s++) {
    st->unary[s].kind = KILN_PW_STEP_KIND(st->span.steps[s]);
    st->unary[s].iattr[0] = (st->span.steps[s] & KILN_PW_GELU_TANH) != 0;
    st->unary[s].fattr[0] = st->span.exponent;
  }
  return 1;
}

float kiln_cpu_steps_run(const kiln_cpu_run *r, const kiln_op *op, const kiln_cpu_steps *st,
                         uint32_t from, uint32_t to, float v, const int64_t *off) {
  for (uint32_t s = from; s < to; s++) {
    int64_t step = st->span.steps[s];
    uint32_t k = KILN_PW_STEP_INPUT(step);
    float y;
    if (!kiln_pw_is_binary(st->unary[s].kind)) {
      v = kiln_cpu_unary_f32(&st->unary[s], v);
      continue;
    }
    y = kiln_cpu_ldf(r->data[op->inputs[k]], kiln_cpu_desc(r, op->inputs[k])->dtype, off[k]);
    v = step & KILN_PW_REVERSED ? kiln_cpu_binary_f32(st->unary[s].kind, y, v, 1.0f)
                                : kiln_cpu_binary_f32(st->unary[s].kind, v, y, 1.0f);
  }
  return v;
}

void kiln_cpu_fused_pointwise(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *in[KILN_MAX_OP_INPUTS];
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  void *po = r->data[op->output];
  int64_t n = kiln_cpu_numel(out);
  kiln_cpu_steps st;
  kiln_cpu_iter it;
  kiln_cpu_steps_init(&st, op);
  for (uint32_t k = 0; k < op->n_inputs; k++) in[k] = kiln_cpu_desc(r, op->inputs[k]);
  kiln_cpu_iter_init(&it, out, in, (int32_t)op->n_inputs);
  for (int64_t i = 0; i < n; i++, kiln_cpu_iter_next(&it)) {
    float v = kiln_cpu_ldf(r->data[op->inputs[0]], in[0]->dtype, it.off[0]);
    kiln_cpu_stf(po, out->dtype, i, kiln_cpu_steps_run(r, op, &st, 0, st.span.n_steps, v, it.off));
  }
}
