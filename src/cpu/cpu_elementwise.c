/* Pointwise ops: broadcasting binary arithmetic, unary math, cast and where. Float outputs
 * compute in f32; integer and bool outputs compute in 64-bit integers that wrap.
 * Comparisons and boolean ops are in cpu_logic.c. */
#include "cpu/cpu_ops.h"

float kiln_cpu_activate(kiln_activation act, float x) {
  switch (act) {
  case KILN_ACT_RELU: return x > 0.0f ? x : 0.0f;
  case KILN_ACT_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  case KILN_ACT_GELU_TANH: {
    float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
  }
  default: return x;
  }
}

static int64_t binary_int(kiln_op_kind kind, int64_t a, int64_t b, int64_t alpha) {
  uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
  switch (kind) {
  case KILN_OP_ADD: return (int64_t)(ua + (uint64_t)alpha * ub);
  case KILN_OP_SUB: return (int64_t)(ua - (uint64_t)alpha * ub);
  case KILN_OP_MINIMUM: return b < a ? b : a;
  case KILN_OP_MAXIMUM: return a < b ? b : a;
  default: return (int64_t)(ua * ub); /* MUL; DIV has a float output */
  }
}

float kiln_cpu_binary_f32(kiln_op_kind kind, float a, float b, float alpha) {
  switch (kind) {
  case KILN_OP_ADD: return a + alpha * b;
  case KILN_OP_SUB: return a - alpha * b;
  case KILN_OP_MUL: return a * b;
  /* NaN propagates from either side, as PyTorch's minimum and maximum do (fminf drops it);
   * of two equal values (0 and -0) a wins, as in std::min and std::max. */
  case KILN_OP_MINIMUM: return a != a || b != b ? NAN : (b < a ? b : a);
  case KILN_OP_MAXIMUM: return a != a || b != b ? NAN : (a < b ? b : a);
  default: return a / b;
  }
}

/* x + 3 clamped to [0, 6], the factor hardswish and hardsigmoid share, in PyTorch's order. */
static float relu6_shift3(float x) {
  float y = x + 3.0f;
  return y < 0.0f ? 0.0f : (y > 6.0f ? 6.0f : y);
}

void kiln_cpu_binary(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *a = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *b = kiln_cpu_desc(r, op->inputs[1]);
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  const void *pa = r->data[op->inputs[0]], *pb = r->data[op->inputs[1]];
  void *po = r->data[op->output];
  int64_t n = kiln_cpu_numel(out);
  int has_alpha = op->kind == KILN_OP_ADD || op->kind == KILN_OP_SUB;
  double alpha = has_alpha ? op->fattr[0] : 1.0;
  kiln_cpu_iter it;
  kiln_cpu_iter_init(&it, out, (const kiln_tensor_desc *const[]){a, b}, 2);
  if (kiln_cpu_is_float(out->dtype)) {
    for (int64_t i = 0; i < n; i++, kiln_cpu_iter_next(&it)) {
      float x = kiln_cpu_ldf(pa, a->dtype, it.off[0]), y = kiln_cpu_ldf(pb, b->dtype, it.off[1]);
      kiln_cpu_stf(po, out->dtype, i, kiln_cpu_binary_f32(op->kind, x, y, (float)alpha));
    }
    return;
  }
  int64_t ialpha = kiln_cpu_f2i(alpha);
  for (int64_t i = 0; i < n; i++, kiln_cpu_iter_next(&it)) {
    int64_t x = kiln_cpu_ldi(pa, a->dtype, it.off[0]), y = kiln_cpu_ldi(pb, b->dtype, it.off[1]);
    kiln_cpu_sti(po, out->dtype, i, binary_int(op->kind, x, y, ialpha));
  }
}

float kiln_cpu_unary_f32(const kiln_op *op, float x) {
  switch (op->kind) {
  case KILN_OP_RELU: return kiln_cpu_activate(KILN_ACT_RELU, x);
  case KILN_OP_GELU:
    return kiln_cpu_activate(op->iattr[0] ? KILN_ACT_GELU_TANH : KILN_ACT_GELU_ERF, x);
  case KILN_OP_SILU: return x / (1.0f + expf(-x));
  case KILN_OP_SIGMOID: return 1.0f / (1.0f + expf(-x));
  case KILN_OP_TANH: return tanhf(x);
  case KILN_OP_EXP: return expf(x);
  case KILN_OP_SQRT: return sqrtf(x);
  case KILN_OP_RSQRT: return 1.0f / sqrtf(x);
  case KILN_OP_NEG: return -x;
  case KILN_OP_ABS: return fabsf(x);
  case KILN_OP_LOG: return logf(x);
  case KILN_OP_COS: return cosf(x);
  case KILN_OP_SIN: return sinf(x);
  case KILN_OP_ERF: return erff(x);
  case KILN_OP_HARDSWISH: return x * relu6_shift3(x) / 6.0f;
  case KILN_OP_HARDSIGMOID: return relu6_shift3(x) / 6.0f;
  default: return powf(x, (float)op->fattr[0]); /* POW */
  }
}

/* RELU, NEG and ABS on integers, wrapping: -INT64_MIN and |INT64_MIN| are INT64_MIN. */
static int64_t unary_int(kiln_op_kind kind, int64_t v) {
  uint64_t negated = 0u - (uint64_t)v;
  switch (kind) {
  case KILN_OP_NEG: return (int64_t)negated;
  case KILN_OP_ABS: return v < 0 ? (int64_t)negated : v;
  default: return v > 0 ? v : 0; /* RELU */
  }
}

void kiln_cpu_unary(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  const void *px = r->data[op->inputs[0]];
  void *po = r->data[op->output];
  int64_t n = kiln_cpu_numel(out);
  if (kiln_cpu_is_float(out->dtype)) {
    for (int64_t i = 0; i < n; i++)
      kiln_cpu_stf(po, out->dtype, i, kiln_cpu_unary_f32(op, kiln_cpu_ldf(px, x->dtype, i)));
    return;
  }
  for (int64_t i = 0; i < n; i++)
    kiln_cpu_sti(po, out->dtype, i, unary_int(op->kind, kiln_cpu_ldi(px, x->dtype, i)));
}

/* Floats convert through f32 (to integers: toward zero, saturating, NaN to 0; to bool:
 * nonzero); integers and bools convert through i64 (to narrower integers: wrapping). */
void kiln_cpu_cast(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  const void *px = r->data[op->inputs[0]];
  void *po = r->data[op->output];
  int64_t n = kiln_cpu_numel(out);
  if (kiln_cpu_is_float(x->dtype)) {
    for (int64_t i = 0; i < n; i++) kiln_cpu_stf(po, out->dtype, i, kiln_cpu_ldf(px, x->dtype, i));
  } else {
    for (int64_t i = 0; i < n; i++) kiln_cpu_sti(po, out->dtype, i, kiln_cpu_ldi(px, x->dtype, i));
  }
}

void kiln_cpu_where(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *c = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *a = kiln_cpu_desc(r, op->inputs[1]);
  const kiln_tensor_desc *b = kiln_cpu_desc(r, op->inputs[2]);
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  const uint8_t *pc = r->data[op->inputs[0]];
  const void *pa = r->data[op->inputs[1]], *pb = r->data[op->inputs[2]];
  void *po = r->data[op->output];
  int64_t n = kiln_cpu_numel(out);
  int is_float = kiln_cpu_is_float(out->dtype);
  kiln_cpu_iter it;
  kiln_cpu_iter_init(&it, out, (const kiln_tensor_desc *const[]){c, a, b}, 3);
  for (int64_t i = 0; i < n; i++, kiln_cpu_iter_next(&it)) {
    int take_a = pc[it.off[0]] != 0;
    const void *src = take_a ? pa : pb;
    kiln_dtype dt = take_a ? a->dtype : b->dtype;
    int64_t off = take_a ? it.off[1] : it.off[2];
    if (is_float)
      kiln_cpu_stf(po, out->dtype, i, kiln_cpu_ldf(src, dt, off));
    else
      kiln_cpu_sti(po, out->dtype, i, kiln_cpu_ldi(src, dt, off));
  }
}
