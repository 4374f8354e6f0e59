/* EMBEDDING and INDEX_SELECT: rows picked by data-dependent indices. Every index is checked
 * against the table before anything is written, so a refused run leaves the output as it was. */
#include "cpu/cpu_ops.h"

static kiln_status check_indices(const kiln_cpu_run *r, uint32_t index, const kiln_op *op,
                                 int64_t rows, kiln_error *err) {
  const kiln_tensor_desc *idx = kiln_cpu_desc(r, op->inputs[1]);
  const void *pi = r->data[op->inputs[1]];
  int64_t n = kiln_cpu_numel(idx);
  for (int64_t i = 0; i < n; i++) {
    int64_t v = kiln_cpu_ldi(pi, idx->dtype, i);
    if (v < 0 || v >= rows)
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "op %u (%.16s): index %lld at element %lld is outside the %lld rows; pass "
                       "indices from 0 to rows-1",
                       (unsigned)index, kiln_op_name(op->kind), (long long)v, (long long)i,
                       (long long)rows);
  }
  return KILN_OK;
}

/* out[i, :] = weight[idx[i], :] for weight[V,D]. */
kiln_status kiln_cpu_embedding(const kiln_cpu_run *r, uint32_t index, const kiln_op *op,
                               kiln_error *err) {
  const kiln_tensor_desc *w = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *idx = kiln_cpu_desc(r, op->inputs[1]);
  kiln_status st = check_indices(r, index, op, w->dims[0], err);
  if (st != KILN_OK) return st;
  const uint8_t *src = r->data[op->inputs[0]];
  const void *pi = r->data[op->inputs[1]];
  uint8_t *dst = r->data[op->output];
  size_t row = (size_t)w->dims[1] * kiln_dtype_size(w->dtype);
  int64_t n = kiln_cpu_numel(idx);
  for (int64_t i = 0; i < n; i++)
    memcpy(dst + (size_t)i * row, src + (size_t)kiln_cpu_ldi(pi, idx->dtype, i) * row, row);
  return KILN_OK;
}

/* Along dim, output slot k holds x's slot idx[k]. */
kiln_status kiln_cpu_index_select(const kiln_cpu_run *r, uint32_t index, const kiln_op *op,
                                  kiln_error *err) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *idx = kiln_cpu_desc(r, op->inputs[1]);
  int32_t dim = (int32_t)op->iattr[0];
  kiln_status st = check_indices(r, index, op, x->dims[dim], err);
  if (st != KILN_OK) return st;
  const uint8_t *src = r->data[op->inputs[0]];
  const void *pi = r->data[op->inputs[1]];
  uint8_t *dst = r->data[op->output];
  int64_t outer = kiln_cpu_extent(x, 0, dim), len = x->dims[dim], n = kiln_cpu_numel(idx);
  size_t inner = (size_t)kiln_cpu_extent(x, dim + 1, x->rank) * kiln_dtype_size(x->dtype);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t k = 0; k < n; k++)
      memcpy(dst + (size_t)(o * n + k) * inner,
             src + (size_t)(o * len + kiln_cpu_ldi(pi, idx->dtype, k)) * inner, inner);
  return KILN_OK;
}
