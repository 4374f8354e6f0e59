/* SOFTMAX and LOG_SOFTMAX along one dim (max subtracted first), LAYER_NORM (biased variance)
 * and RMS_NORM over trailing dims, with any pointwise steps fused before and after them. Sums
 * and moments accumulate in double. */
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

/* Element offsets, at x's element e, of the step operands (inputs first..n-1) broadcast to
 * x's shape by the strides st. */
static void operand_offsets(const kiln_tensor_desc *x, const kiln_op *op, uint32_t first,
                            const int64_t (*st)[KILN_MAX_RANK], int64_t e, int64_t *off) {
  for (uint32_t k = first; k < op->n_inputs; k++) off[k] = 0;
  for (int32_t d = x->rank - 1; d >= 0; d--) {
    int64_t c = e % x->dims[d];
    e /= x->dims[d];
    for (uint32_t k = first; k < op->n_inputs; k++) off[k] += c * st[k][d];
  }
}

/* The norm's input at element e: x, through the steps fused before the norm (in f32). */
static double norm_input(const kiln_cpu_run *r, const kiln_op *op, const kiln_cpu_steps *st,
                         const int64_t (*bst)[KILN_MAX_RANK], int64_t e) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  float v = kiln_cpu_ldf(r->data[op->inputs[0]], x->dtype, e);
  int64_t off[KILN_MAX_OP_INPUTS];
  if (st->span.n_before == 0) return v;
  operand_offsets(x, op, st->span.first_operand, bst, e, off);
  return kiln_cpu_steps_run(r, op, st, 0, st->span.n_before, v, off);
}

/* Steps fused before the norm apply to x in f32 and feed the statistics; steps fused after it
 * apply to the normalized, scaled value in f32 before the one rounding. */
static void normalize(const kiln_cpu_run *r, const kiln_op *op, int rms) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  int has_weight = (int)(op->iattr[1] & 1), has_bias = !rms && (op->iattr[1] & 2);
  uint32_t wi = op->inputs[1], bi = op->inputs[has_weight ? 2 : 1];
  const kiln_tensor_desc *w = has_weight ? kiln_cpu_desc(r, wi) : NULL;
  const kiln_tensor_desc *b = has_bias ? kiln_cpu_desc(r, bi) : NULL;
  const void *pw = has_weight ? r->data[wi] : NULL, *pb = has_bias ? r->data[bi] : NULL;
  void *po = r->data[op->output];
  int32_t split = x->rank - (int32_t)op->iattr[0];
  int64_t rows = kiln_cpu_extent(x, 0, split), cols = kiln_cpu_extent(x, split, x->rank);
  int64_t bst[KILN_MAX_OP_INPUTS][KILN_MAX_RANK], off[KILN_MAX_OP_INPUTS];
  double eps = op->fattr[0];
  kiln_cpu_steps st;
  int fused = kiln_cpu_steps_init(&st, op);
  if (cols == 0) return;
  for (uint32_t k = fused ? st.span.first_operand : op->n_inputs; k < op->n_inputs; k++)
    kiln_cpu_bcast_strides(kiln_cpu_desc(r, op->inputs[k]), x->rank, x->dims, bst[k]);
  for (int64_t i = 0; i < rows; i++) {
    const int64_t base = i * cols;
    double mean = 0.0, var = 0.0;
    if (!rms) {
      for (int64_t j = 0; j < cols; j++) mean += norm_input(r, op, &st, bst, base + j);
      mean /= (double)cols;
    }
    for (int64_t j = 0; j < cols; j++) {
      double d = norm_input(r, op, &st, bst, base + j) - mean;
      var += d * d;
    }
    double inv = 1.0 / sqrt(var / (double)cols + eps);
    for (int64_t j = 0; j < cols; j++) {
      double y = (norm_input(r, op, &st, bst, base + j) - mean) * inv;
      float v;
      if (w) y *= kiln_cpu_ldf(pw, w->dtype, j);
      if (b) y += kiln_cpu_ldf(pb, b->dtype, j);
      v = (float)y;
      if (st.span.n_steps > st.span.n_before) {
        operand_offsets(x, op, st.span.first_operand, bst, base + j, off);
        v = kiln_cpu_steps_run(r, op, &st, st.span.n_before, st.span.n_steps, v, off);
      }
      kiln_cpu_stf(po, out->dtype, base + j, v);
    }
  }
}

void kiln_cpu_layer_norm(const kiln_cpu_run *r, const kiln_op *op) { normalize(r, op, 0); }

void kiln_cpu_rms_norm(const kiln_cpu_run *r, const kiln_op *op) { normalize(r, op, 1); }
