/* Comparisons and boolean ops, broadcasting: COMPARE and LOGICAL write bool, BITWISE its
 * inputs' dtype. Floats compare in f32, where f16 and bf16 are exact; integers and bools as
 * 64-bit integers. */
#include "cpu/cpu_ops.h"

static int compare_f32(kiln_compare cmp, float a, float b) {
  switch (cmp) {
  case KILN_CMP_EQ: return a == b;
  case KILN_CMP_NE: return a != b;
  case KILN_CMP_LT: return a < b;
  case KILN_CMP_LE: return a <= b;
  case KILN_CMP_GT: return a > b;
  default: return a >= b; /* GE */
  }
}

static int compare_int(kiln_compare cmp, int64_t a, int64_t b) {
  switch (cmp) {
  case KILN_CMP_EQ: return a == b;
  case KILN_CMP_NE: return a != b;
  case KILN_CMP_LT: return a < b;
  case KILN_CMP_LE: return a <= b;
  case KILN_CMP_GT: return a > b;
  default: return a >= b; /* GE */
  }
}

static int64_t bool_op(kiln_bool_op which, int64_t a, int64_t b) {
  switch (which) {
  case KILN_BOOL_AND: return a & b;
  case KILN_BOOL_OR: return a | b;
  case KILN_BOOL_XOR: return a ^ b;
  default: return ~a; /* NOT */
  }
}

/* Nonzero is true; NaN is nonzero. */
static int64_t truth(const void *p, kiln_dtype dt, int64_t i) {
  if (kiln_cpu_is_float(dt)) return kiln_cpu_ldf(p, dt, i) != 0.0f;
  return kiln_cpu_ldi(p, dt, i) != 0;
}

void kiln_cpu_compare(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *a = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *b = kiln_cpu_desc(r, op->inputs[1]);
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  const void *pa = r->data[op->inputs[0]], *pb = r->data[op->inputs[1]];
  uint8_t *po = r->data[op->output];
  kiln_compare cmp = (kiln_compare)op->iattr[0];
  int64_t n = kiln_cpu_numel(out);
  kiln_cpu_iter it;
  kiln_cpu_iter_init(&it, out, (const kiln_tensor_desc *const[]){a, b}, 2);
  for (int64_t i = 0; i < n; i++, kiln_cpu_iter_next(&it)) {
    if (kiln_cpu_is_float(a->dtype))
      po[i] = (uint8_t)compare_f32(cmp, kiln_cpu_ldf(pa, a->dtype, it.off[0]),
                                   kiln_cpu_ldf(pb, b->dtype, it.off[1]));
    else
      po[i] = (uint8_t)compare_int(cmp, kiln_cpu_ldi(pa, a->dtype, it.off[0]),
                                   kiln_cpu_ldi(pb, b->dtype, it.off[1]));
  }
}

/* LOGICAL on the truth of each input, BITWISE on the integers themselves (NOT of a bool is
 * its logical not). */
void kiln_cpu_bool_op(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *in[2], *out = kiln_cpu_desc(r, op->output);
  const void *p[2];
  void *po = r->data[op->output];
  kiln_bool_op which = (kiln_bool_op)op->iattr[0];
  int logical = op->kind == KILN_OP_LOGICAL;
  int64_t n = kiln_cpu_numel(out);
  kiln_cpu_iter it;
  for (uint32_t k = 0; k < op->n_inputs; k++) {
    in[k] = kiln_cpu_desc(r, op->inputs[k]);
    p[k] = r->data[op->inputs[k]];
  }
  kiln_cpu_iter_init(&it, out, in, (int32_t)op->n_inputs);
  for (int64_t i = 0; i < n; i++, kiln_cpu_iter_next(&it)) {
    int64_t v[2] = {0, 0};
    for (uint32_t k = 0; k < op->n_inputs; k++)
      v[k] = logical ? truth(p[k], in[k]->dtype, it.off[k])
                     : kiln_cpu_ldi(p[k], in[k]->dtype, it.off[k]);
    int64_t res = bool_op(which, v[0], v[1]);
    if (which == KILN_BOOL_NOT && (logical || out->dtype == KILN_BOOL)) res = !v[0];
    kiln_cpu_sti(po, out->dtype, i, res);
  }
}
