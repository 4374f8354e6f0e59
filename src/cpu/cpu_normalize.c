/* SOFTMAX and LOG_SOFTMAX along one dim (max subtracted first), LAYER_NORM (biased variance)
 * and RMS_NORM over trailing dims. Sums and moments accumulate in double. */
#include "cpu/cpu_ops.h"

void kiln_cpu_softmax(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  const void *px = r->data[op->inputs[0]];
  void *po = r->data[op->output];
  int32_t dim = (int32_t)op->iattr[0];
  int rank0 = x->rank == 0; /* a rank-0 tensor is one row of one element */
  int64_t outer = rank0 ? 1 : kiln_cpu_extent(x, 0, dim), len = rank0 ? 1 : x->dims[dim];
  int64_t inner = rank0 ? 1 : kiln_cpu_extent(x, dim + 1, x->rank);
  int is_log = op->kind == KILN_OP_LOG_SOFTMAX;
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t in = 0; in < inner; in++) {
      int64_t base = o * len * inner + in;
      double most = -INFINITY, sum = 0.0;
      for (int64_t k = 0; k < len; k++) {
        double v = kiln_cpu_ldf(px, x->dtype, base + k * inner);
        if (v > most || v != v) most = v;
        if (most != most) break;
      }
      for (int64_t k = 0; k < len; k++)
        sum += exp((double)kiln_cpu_ldf(px, x->dtype, base + k * inner) - most);
      for (int64_t k = 0; k < len; k++) {
        double shifted = (double)kiln_cpu_ldf(px, x->dtype, base + k * inner) - most;
        double y = is_log ? shifted - log(sum) : exp(shifted) / sum;
        kiln_cpu_stf(po, out->dtype, base + k * inner, (float)y);
      }
    }
  }
}

static void normalize(const kiln_cpu_run *r, const kiln_op *op, int rms) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  int has_weight = (int)(op->iattr[1] & 1), has_bias = !rms && (op->iattr[1] & 2);
  uint32_t wi = op->inputs[1], bi = op->inputs[has_weight ? 2 : 1];
  const kiln_tensor_desc *w = has_weight ? kiln_cpu_desc(r, wi) : NULL;
  const kiln_tensor_desc *b = has_bias ? kiln_cpu_desc(r, bi) : NULL;
  const void *px = r->data[op->inputs[0]];
  const void *pw = has_weight ? r->data[wi] : NULL, *pb = has_bias ? r->data[bi] : NULL;
  void *po = r->data[op->output];
  int32_t split = x->rank - (int32_t)op->iattr[0];
  int64_t rows = kiln_cpu_extent(x, 0, split), cols = kiln_cpu_extent(x, split, x->rank);
  double eps = op->fattr[0];
  if (cols == 0) return;
  for (int64_t i = 0; i < rows; i++) {
    const int64_t base = i * cols;
    double mean = 0.0, var = 0.0;
    if (!rms) {
      for (int64_t j = 0; j < cols; j++) mean += kiln_cpu_ldf(px, x->dtype, base + j);
      mean /= (double)cols;
    }
    for (int64_t j = 0; j < cols; j++) {
      double d = (double)kiln_cpu_ldf(px, x->dtype, base + j) - mean;
      var += d * d;
    }
    double inv = 1.0 / sqrt(var / (double)cols + eps);
    for (int64_t j = 0; j < cols; j++) {
      double y = ((double)kiln_cpu_ldf(px, x->dtype, base + j) - mean) * inv;
      if (w) y *= kiln_cpu_ldf(pw, w->dtype, j);
      if (b) y += kiln_cpu_ldf(pb, b->dtype, j);
      kiln_cpu_stf(po, out->dtype, base + j, (float)y);
    }
  }
}

void kiln_cpu_layer_norm(const kiln_cpu_run *r, const kiln_op *op) { normalize(r, op, 0); }

void kiln_cpu_rms_norm(const kiln_cpu_run *r, const kiln_op *op) { normalize(r, op, 1); }
