/* CUMSUM: running sums along one dim. x is converted to the sum's dtype first (PyTorch's
 * dtype= rule); integers wrap in 64 bits, floats accumulate in double and each prefix is
 * rounded once. */
#include "cpu/cpu_ops.h"

/* v as the float dtype dt holds it. */
static double rounded_to(kiln_dtype dt, float v) {
  switch (dt) {
  case KILN_F16: return kiln_f16_to_f32(kiln_f32_to_f16(v));
  case KILN_BF16: return kiln_bf16_to_f32(kiln_f32_to_bf16(v));
  default: return v;
  }
}

void kiln_cpu_cumsum(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  const void *px = r->data[op->inputs[0]];
  void *po = r->data[op->output];
  int32_t dim = (int32_t)op->iattr[0];
  int64_t outer = kiln_cpu_extent(x, 0, dim), n = x->dims[dim];
  int64_t inner = kiln_cpu_extent(x, dim + 1, x->rank);
  int is_float = kiln_cpu_is_float(out->dtype);
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t i = 0; i < inner; i++) {
      double sum = 0.0;
      uint64_t total = 0;
      for (int64_t j = 0; j < n; j++) {
        int64_t at = (o * n + j) * inner + i;
        if (is_float) {
          sum += rounded_to(out->dtype, kiln_cpu_ldf(px, x->dtype, at));
          kiln_cpu_stf(po, out->dtype, at, (float)sum);
        } else {
          total += (uint64_t)kiln_cpu_ldi(px, x->dtype, at);
          kiln_cpu_sti(po, out->dtype, at, (int64_t)total);
        }
      }
    }
  }
}
