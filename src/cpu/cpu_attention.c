/* Scaled dot product attention, one query row at a time in double: scores, optional causal
 * (top-left aligned: key j <= query i) and mask (bool keeps where true, float adds), a stable
 * softmax, then the weighted sum of values. A row with every key masked outputs zeros, as
 * PyTorch's math attention does. Packed heads read q, k and v from one [B,L,3,H,E] tensor and
 * write [B,L,H,E]; heads last read [B,H,L,E] q and write [B,L,H,Ev]. */
#include "cpu/cpu_ops.h"
#include "runtime/sdpa_layout.h"

void kiln_cpu_sdpa(const kiln_cpu_run *r, const kiln_op *op) {
  int64_t layout = kiln_sdpa_layout(op);
  int packed = layout == 1, has_mask = op->iattr[1] != 0;
  const kiln_tensor_desc *q = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *k = packed ? q : kiln_cpu_desc(r, op->inputs[1]);
  const kiln_tensor_desc *v = packed ? q : kiln_cpu_desc(r, op->inputs[2]);
  uint32_t mi = op->inputs[packed ? 1 : 3];
  const kiln_tensor_desc *mask = has_mask ? kiln_cpu_desc(r, mi) : NULL;
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  const void *pq = r->data[op->inputs[0]];
  const void *pk = packed ? pq : r->data[op->inputs[1]], *pv = packed ? pq : r->data[op->inputs[2]];
  const void *pm = mask ? r->data[mi] : NULL;
  void *po = r->data[op->output];
  /* The logical [..., L, E] view: packed qkv [B,L,3,H,E] is B*H matrices whose rows lie 3*H*E
   * apart, and the output's rows (packed or heads last) H*Ev apart. */
  int64_t lead[KILN_MAX_RANK]; /* the logical output's dims */
  memcpy(lead, out->dims, sizeof lead);
  if (layout == 2) lead[1] = out->dims[2], lead[2] = out->dims[1];
  int64_t heads = packed ? q->dims[3] : layout == 2 ? lead[1] : 1;
  int64_t l_dim = packed ? q->dims[1] : q->dims[q->rank - 2], e_dim = q->dims[q->rank - 1];
  int64_t s_dim = packed ? l_dim : k->dims[k->rank - 2], ev_dim = v->dims[v->rank - 1];
  int64_t in_row = packed ? 3 * heads * e_dim : e_dim, out_row = heads * ev_dim;
  int32_t brank = packed ? 2 : out->rank - 2, srank = brank + 2;
  int64_t batches = packed ? q->dims[0] * heads : 1;
  for (int32_t d = 0; !packed && d < brank; d++) batches *= lead[d];
  double scale = op->fattr[0] != 0.0 ? op->fattr[0] : 1.0 / sqrt((double)e_dim);
  int causal = op->iattr[0] != 0;
  int64_t mstride[KILN_MAX_RANK] = {0}, score_dims[KILN_MAX_RANK];
  if (packed) {
    score_dims[0] = q->dims[0], score_dims[1] = heads;
  } else {
    memcpy(score_dims, lead, sizeof score_dims);
  }
  score_dims[srank - 2] = l_dim;
  score_dims[srank - 1] = s_dim;
  if (mask) kiln_cpu_bcast_strides(mask, srank, score_dims, mstride);
  double *scores = r->scratch, *row = r->scratch + s_dim;
  for (int64_t b = 0; b < batches; b++) {
    int64_t oq, ok, ov, oo;
    oo = (b / heads) * l_dim * out_row + (b % heads) * ev_dim;
    if (packed) {
      oq = (b / heads) * l_dim * in_row + (b % heads) * e_dim;
      ok = oq + heads * e_dim;
      ov = oq + 2 * heads * e_dim;
    } else {
      oq = kiln_cpu_batch_offset(q, 2, b, brank, lead);
      ok = kiln_cpu_batch_offset(k, 2, b, brank, lead);
      ov = kiln_cpu_batch_offset(v, 2, b, brank, lead);
    }
    int64_t om = mask ? kiln_cpu_batch_offset(mask, 2, b, brank, score_dims) : 0;
    for (int64_t i = 0; i < l_dim; i++) {
      double most = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < s_dim; j++) {
        double sc = 0.0;
        for (int64_t e = 0; e < e_dim; e++)
          sc += (double)kiln_cpu_ldf(pq, q->dtype, oq + i * in_row + e) *
                (double)kiln_cpu_ldf(pk, k->dtype, ok + j * (packed ? in_row : e_dim) + e);
        sc *= scale;
        if (causal && j > i) sc = -INFINITY;
        if (mask) {
          int64_t m = om + i * mstride[srank - 2] + j * mstride[srank - 1];
          if (mask->dtype == KILN_BOOL)
            sc = ((const uint8_t *)pm)[m] ? sc : -INFINITY;
          else
            sc += kiln_cpu_ldf(pm, mask->dtype, m);
        }
        scores[j] = sc;
        if (sc > most || sc != sc) most = sc;
      }
      for (int64_t e = 0; e < ev_dim; e++) row[e] = 0.0;
      if (most != -INFINITY) {
        for (int64_t j = 0; j < s_dim; j++) {
          double p = exp(scores[j] - most);
          sum += p;
          for (int64_t e = 0; e < ev_dim; e++)
            row[e] += p * (double)kiln_cpu_ldf(pv, v->dtype,
                                               ov + j * (packed ? in_row : ev_dim) + e);
        }
        for (int64_t e = 0; e < ev_dim; e++) row[e] /= sum;
      }
      for (int64_t e = 0; e < ev_dim; e++)
        kiln_cpu_stf(po, out->dtype, oo + i * out_row + e, (float)row[e]);
    }
  }
}
