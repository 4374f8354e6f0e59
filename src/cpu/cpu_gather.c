/* EMBEDDING, INDEX_SELECT, GATHER and INDEX: elements picked by data-dependent indices. Every
 * index is checked against its dim before anything is written, so a refused run leaves the
 * output as it was. */
#include "runtime/index_layout.h"
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

/* The write positions of a state (a KV cache) are checked before any byte moves, and the
 * refusal names the position and the length, so a step past the cache end writes nothing. */
kiln_status kiln_cpu_index_copy(const kiln_cpu_run *r, uint32_t index, const kiln_op *op,
                                kiln_error *err) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *idx = kiln_cpu_desc(r, op->inputs[1]);
  int32_t dim = (int32_t)op->iattr[0];
  const void *pi = r->data[op->inputs[1]];
  const uint8_t *src = r->data[op->inputs[2]];
  uint8_t *dst = r->data[op->output];
  int64_t outer = kiln_cpu_extent(x, 0, dim), len = x->dims[dim], n = idx->dims[0];
  size_t inner = (size_t)kiln_cpu_extent(x, dim + 1, x->rank) * kiln_dtype_size(x->dtype);
  for (int64_t k = 0; k < n; k++) {
    int64_t v = kiln_cpu_ldi(pi, idx->dtype, k);
    if (v < 0 || v >= len)
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "op %u (index_copy): position %lld (index %lld) is outside the %lld slots "
                       "of dim %d; nothing was written; pass positions from 0 to %lld",
                       (unsigned)index, (long long)v, (long long)k, (long long)len, (int)dim,
                       (long long)(len - 1));
  }
  if (dst != r->data[op->inputs[0]] && x->nbytes)
    memcpy(dst, r->data[op->inputs[0]], (size_t)x->nbytes);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t k = 0; k < n; k++)
      memcpy(dst + (size_t)(o * len + kiln_cpu_ldi(pi, idx->dtype, k)) * inner,
             src + (size_t)(o * n + k) * inner, inner);
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

/* Every element of index input `input` lies in lo..size-1, lo being 0 or -size. */
static kiln_status check_range(const kiln_cpu_run *r, uint32_t index, const kiln_op *op,
                               uint32_t input, int32_t dim, int64_t size, int negative_ok,
                               kiln_error *err) {
  const kiln_tensor_desc *idx = kiln_cpu_desc(r, op->inputs[input]);
  const void *pi = r->data[op->inputs[input]];
  int64_t n = kiln_cpu_numel(idx), lo = negative_ok ? -size : 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t v = kiln_cpu_ldi(pi, idx->dtype, i);
    if (v < lo || v >= size)
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "op %u (%.16s): index %lld at element %lld of input %u is outside "
                       "%lld..%lld of dim %d; pass indices in that range",
                       (unsigned)index, kiln_op_name(op->kind), (long long)v, (long long)i,
                       (unsigned)input, (long long)lo, (long long)size - 1, (int)dim);
  }
  return KILN_OK;
}

/* Row-major element strides of t. */
static void strides_of(const kiln_tensor_desc *t, int64_t *strides) {
  int64_t stride = 1;
  for (int32_t d = t->rank - 1; d >= 0; d--) strides[d] = stride, stride *= t->dims[d];
}

/* out[i] = x[i with coordinate dim replaced by idx[i]]. */
kiln_status kiln_cpu_gather(const kiln_cpu_run *r, uint32_t index, const kiln_op *op,
                            kiln_error *err) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *idx = kiln_cpu_desc(r, op->inputs[1]);
  int32_t dim = (int32_t)op->iattr[0];
  kiln_status st = check_range(r, index, op, 1, dim, x->dims[dim], 0, err);
  if (st != KILN_OK) return st;
  const uint8_t *src = r->data[op->inputs[0]];
  const void *pi = r->data[op->inputs[1]];
  uint8_t *dst = r->data[op->output];
  size_t elem = kiln_dtype_size(x->dtype);
  int64_t xs[KILN_MAX_RANK], n = kiln_cpu_numel(idx);
  strides_of(x, xs);
  for (int64_t i = 0; i < n; i++) {
    int64_t rest = i, from = 0;
    for (int32_t d = idx->rank - 1; d >= 0; d--) {
      int64_t c = rest % idx->dims[d];
      rest /= idx->dims[d];
      from += (d == dim ? kiln_cpu_ldi(pi, idx->dtype, i) : c) * xs[d];
    }
    memcpy(dst + (size_t)i * elem, src + (size_t)from * elem, elem);
  }
  return KILN_OK;
}

/* Advanced indexing: each output element walks x's unindexed dims directly and reads one
 * element of every index input at its position in the broadcast index shape. */
kiln_status kiln_cpu_index(const kiln_cpu_run *r, uint32_t index, const kiln_op *op,
                           kiln_error *err) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *idx[KILN_MAX_OP_INPUTS];
  uint32_t n_idx = op->n_inputs - 1, where;
  kiln_index_layout lay;
  for (uint32_t k = 0; k < n_idx; k++) idx[k] = kiln_cpu_desc(r, op->inputs[k + 1]);
  kiln_index_layout_of(x, idx, n_idx, op->iattr[0], &lay, &where); /* checked at init */
  for (uint32_t k = 0; k < n_idx; k++) {
    kiln_status st = check_range(r, index, op, k + 1, lay.x_dim[k], x->dims[lay.x_dim[k]], 1, err);
    if (st != KILN_OK) return st;
  }
  const uint8_t *src = r->data[op->inputs[0]];
  uint8_t *dst = r->data[op->output];
  size_t elem = kiln_dtype_size(x->dtype);
  int64_t xs[KILN_MAX_RANK], bs[KILN_MAX_OP_INPUTS][KILN_MAX_RANK], n = 1;
  strides_of(x, xs);
  for (uint32_t k = 0; k < n_idx; k++) kiln_cpu_bcast_strides(idx[k], lay.b_rank, lay.b_dims, bs[k]);
  for (int32_t d = 0; d < lay.rank; d++) n *= lay.dims[d];
  for (int64_t i = 0; i < n; i++) {
    int64_t rest = i, from = 0, at[KILN_MAX_OP_INPUTS] = {0};
    for (int32_t d = lay.rank - 1; d >= 0; d--) {
      int64_t c = rest % lay.dims[d];
      rest /= lay.dims[d];
      if (lay.walks[d] >= 0) from += c * xs[lay.walks[d]];
      else
        for (uint32_t k = 0; k < n_idx; k++) at[k] += c * bs[k][d - lay.b_at];
    }
    for (uint32_t k = 0; k < n_idx; k++) {
      int64_t v = kiln_cpu_ldi(r->data[op->inputs[k + 1]], idx[k]->dtype, at[k]);
      from += (v < 0 ? v + x->dims[lay.x_dim[k]] : v) * xs[lay.x_dim[k]];
    }
    memcpy(dst + (size_t)i * elem, src + (size_t)from * elem, elem);
  }
  return KILN_OK;
}
