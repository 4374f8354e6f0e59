/* Scaled dot product attention, one query row at a time in double: scores, optional causal
 * (top-left aligned: key j <= query i) and mask (bool keeps where true, float adds), a stable
 * softmax, then the weighted sum of values. A row with every key masked outputs zeros, as
 * PyTorch's math attention does. */
#include "cpu/cpu_ops.h"

void kiln_cpu_sdpa(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *q = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *k = kiln_cpu_desc(r, op->inputs[1]);
  const kiln_tensor_desc *v = kiln_cpu_desc(r, op->inputs[2]);
  const kiln_tensor_desc *mask = op->n_inputs > 3 ? kiln_cpu_desc(r, op->inputs[3]) : NULL;
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  const void *pq = r->data[op->inputs[0]], *pk = r->data[op->inputs[1]];
  const void *pv = r->data[op->inputs[2]], *pm = mask ? r->data[op->inputs[3]] : NULL;
  void *po = r->data[op->output];
  int64_t l_dim = q->dims[q->rank - 2], e_dim = q->dims[q->rank - 1];
  int64_t s_dim = k->dims[k->rank - 2], ev_dim = v->dims[v->rank - 1];
  int32_t brank = out->rank - 2;
  int64_t batches = kiln_cpu_extent(out, 0, brank);
  double scale = op->fattr[0] != 0.0 ? op->fattr[0] : 1.0 / sqrt((double)e_dim);
  int causal = op->iattr[0] != 0;
  int64_t mstride[KILN_MAX_RANK] = {0}, score_dims[KILN_MAX_RANK];
  memcpy(score_dims, out->dims, sizeof score_dims);
  score_dims[out->rank - 1] = s_dim;
  if (mask) kiln_cpu_bcast_strides(mask, out->rank, score_dims, mstride);
  double *scores = r->scratch, *row = r->scratch + s_dim;
  for (int64_t b = 0; b < batches; b++) {
    int64_t oq = kiln_cpu_batch_offset(q, 2, b, brank, out->dims);
    int64_t ok = kiln_cpu_batch_offset(k, 2, b, brank, out->dims);
    int64_t ov = kiln_cpu_batch_offset(v, 2, b, brank, out->dims);
    int64_t om = mask ? kiln_cpu_batch_offset(mask, 2, b, brank, score_dims) : 0;
    for (int64_t i = 0; i < l_dim; i++) {
      double most = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < s_dim; j++) {
        double s = 0.0;
        for (int64_t e = 0; e < e_dim; e++)
          s += (double)kiln_cpu_ldf(pq, q->dtype, oq + i * e_dim + e) *
               (double)kiln_cpu_ldf(pk, k->dtype, ok + j * e_dim + e);
        s *= scale;
        if (causal && j > i) s = -INFINITY;
        if (mask) {
          int64_t m = om + i * mstride[out->rank - 2] + j * mstride[out->rank - 1];
          if (mask->dtype == KILN_BOOL)
            s = ((const uint8_t *)pm)[m] ? s : -INFINITY;
          else
            s += kiln_cpu_ldf(pm, mask->dtype, m);
        }
        scores[j] = s;
        if (s > most || s != s) most = s;
      }
      for (int64_t e = 0; e < ev_dim; e++) row[e] = 0.0;
      if (most != -INFINITY) {
        for (int64_t j = 0; j < s_dim; j++) {
          double p = exp(scores[j] - most);
          sum += p;
          for (int64_t e = 0; e < ev_dim; e++)
            row[e] += p * (double)kiln_cpu_ldf(pv, v->dtype, ov + j * ev_dim + e);
        }
        for (int64_t e = 0; e < ev_dim; e++) row[e] /= sum;
      }
      for (int64_t e = 0; e < ev_dim; e++)
        kiln_cpu_stf(po, out->dtype, (b * l_dim + i) * ev_dim + e, (float)row[e]);
    }
  }
}
