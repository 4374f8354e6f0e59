/* LINEAR (with its fused bias and activation epilogue) and MATMUL with broadcast batch dims.
 * Dot products accumulate in double so the oracle's own rounding stays far below any
 * tolerance a GPU result is held to. */
#include "runtime/linear_inputs.h"
#include "cpu/cpu_ops.h"

/* y = silu(x gate^T) * (x up^T), w = [gate; up] of 2n rows: each product rounded to f32 and
 * combined in f32, as SILU and MUL after two LINEARs compute it. */
static void linear_swiglu(const kiln_tensor_desc *x, const kiln_tensor_desc *w,
                          const kiln_tensor_desc *out, const void *px, const void *pw, void *po,
                          int64_t rows, int64_t k_dim, int64_t n) {
  for (int64_t i = 0; i < rows; i++) {
    for (int64_t j = 0; j < n; j++) {
      double gate = 0.0, up = 0.0;
      for (int64_t k = 0; k < k_dim; k++) {
        double xv = (double)kiln_cpu_ldf(px, x->dtype, i * k_dim + k);
        gate += xv * (double)kiln_cpu_ldf(pw, w->dtype, j * k_dim + k);
        up += xv * (double)kiln_cpu_ldf(pw, w->dtype, (n + j) * k_dim + k);
      }
      float g = (float)gate;
      kiln_cpu_stf(po, out->dtype, i * n + j, g / (1.0f + expf(-g)) * (float)up);
    }
  }
}

/* y = act(x @ w^T + bias) (+ residual, added in f32 to the f32 result): both operands are
 * read along contiguous rows of K. */
void kiln_cpu_linear(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *w = kiln_cpu_desc(r, op->inputs[1]);
  const kiln_tensor_desc *bias = kiln_linear_has_bias(op) ? kiln_cpu_desc(r, op->inputs[2]) : NULL;
  uint32_t ri = op->inputs[op->n_inputs - 1];
  const kiln_tensor_desc *res = kiln_linear_has_residual(op) ? kiln_cpu_desc(r, ri) : NULL;
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  const void *px = r->data[op->inputs[0]], *pw = r->data[op->inputs[1]];
  const void *pb = bias ? r->data[op->inputs[2]] : NULL, *pr = res ? r->data[ri] : NULL;
  void *po = r->data[op->output];
  int64_t rows = kiln_cpu_extent(x, 0, x->rank - 1), k_dim = x->dims[x->rank - 1];
  int64_t n_dim = w->dims[0];
  if (op->iattr[0] == KILN_ACT_SWIGLU) {
    linear_swiglu(x, w, out, px, pw, po, rows, k_dim, n_dim / 2);
    return;
  }
  for (int64_t i = 0; i < rows; i++) {
    for (int64_t j = 0; j < n_dim; j++) {
      double acc = bias ? (double)kiln_cpu_ldf(pb, bias->dtype, j) : 0.0;
      for (int64_t k = 0; k < k_dim; k++)
        acc += (double)kiln_cpu_ldf(px, x->dtype, i * k_dim + k) *
               (double)kiln_cpu_ldf(pw, w->dtype, j * k_dim + k);
      float y = kiln_cpu_activate((kiln_activation)op->iattr[0], (float)acc);
      if (res) y += kiln_cpu_ldf(pr, res->dtype, i * n_dim + j);
      kiln_cpu_stf(po, out->dtype, i * n_dim + j, y);
    }
  }
}

/* A vector operand acts as one row (a) or one column (b) and contributes no output dim. */
void kiln_cpu_matmul(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *a = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *b = kiln_cpu_desc(r, op->inputs[1]);
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  const void *pa = r->data[op->inputs[0]], *pb = r->data[op->inputs[1]];
  void *po = r->data[op->output];
  int64_t m_dim = a->rank >= 2 ? a->dims[a->rank - 2] : 1, k_dim = a->dims[a->rank - 1];
  int64_t n_dim = b->rank >= 2 ? b->dims[b->rank - 1] : 1;
  int32_t brank = out->rank - (a->rank >= 2) - (b->rank >= 2);
  int64_t batches = kiln_cpu_extent(out, 0, brank);
  double *acc = r->scratch;
  for (int64_t bi = 0; bi < batches; bi++) {
    int64_t oa = kiln_cpu_batch_offset(a, 2, bi, brank, out->dims);
    int64_t ob = kiln_cpu_batch_offset(b, 2, bi, brank, out->dims);
    int64_t oo = bi * m_dim * n_dim;
    for (int64_t i = 0; i < m_dim; i++) {
      for (int64_t j = 0; j < n_dim; j++) acc[j] = 0.0;
      for (int64_t k = 0; k < k_dim; k++) {
        double aik = kiln_cpu_ldf(pa, a->dtype, oa + i * k_dim + k);
        for (int64_t j = 0; j < n_dim; j++)
          acc[j] += aik * (double)kiln_cpu_ldf(pb, b->dtype, ob + k * n_dim + j);
      }
      for (int64_t j = 0; j < n_dim; j++)
        kiln_cpu_stf(po, out->dtype, oo + i * n_dim + j, (float)acc[j]);
    }
  }
}
