/* Ops that move elements without changing them: RESHAPE, COPY, PERMUTE, EXPAND, CAT, SLICE
 * and SELECT. They copy bytes of the element size, so every dtype works alike. */
#include "cpu/cpu_ops.h"

/* Output element i comes from x at the iterator's offset; one odometer walks the output. */
static void gather_copy(const kiln_cpu_run *r, const kiln_op *op, kiln_cpu_iter *it) {
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  const uint8_t *src = r->data[op->inputs[0]];
  uint8_t *dst = r->data[op->output];
  size_t es = kiln_dtype_size(out->dtype);
  int64_t n = kiln_cpu_numel(out);
  for (int64_t i = 0; i < n; i++, kiln_cpu_iter_next(it))
    memcpy(dst + (size_t)i * es, src + (size_t)it->off[0] * es, es);
}

void kiln_cpu_copy(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  memmove(r->data[op->output], r->data[op->inputs[0]], (size_t)out->nbytes);
}

void kiln_cpu_permute(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  int64_t strides[KILN_MAX_RANK], stride = 1;
  for (int32_t d = x->rank - 1; d >= 0; d--) {
    strides[d] = stride;
    stride *= x->dims[d];
  }
  kiln_cpu_iter it;
  memset(&it, 0, sizeof it);
  it.rank = out->rank;
  it.n = 1;
  memcpy(it.dims, out->dims, sizeof it.dims);
  for (int32_t d = 0; d < out->rank; d++) it.strides[0][d] = strides[op->iattr[d]];
  gather_copy(r, op, &it);
}

void kiln_cpu_expand(const kiln_cpu_run *r, const kiln_op *op) {
  kiln_cpu_iter it;
  kiln_cpu_iter_init(&it, kiln_cpu_desc(r, op->output),
                     (const kiln_tensor_desc *const[]){kiln_cpu_desc(r, op->inputs[0])}, 1);
  gather_copy(r, op, &it);
}

void kiln_cpu_cat(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  uint8_t *dst = r->data[op->output];
  int32_t dim = (int32_t)op->iattr[0];
  size_t es = kiln_dtype_size(out->dtype), pos = 0;
  int64_t outer = kiln_cpu_extent(out, 0, dim);
  for (int64_t o = 0; o < outer; o++) {
    for (uint32_t k = 0; k < op->n_inputs; k++) {
      const kiln_tensor_desc *t = kiln_cpu_desc(r, op->inputs[k]);
      if (t->nbytes == 0) continue; /* also skips a legacy 1-d empty operand of another rank */
      size_t chunk = (size_t)kiln_cpu_extent(t, dim, t->rank) * es;
      memcpy(dst + pos, (const uint8_t *)r->data[op->inputs[k]] + (size_t)o * chunk, chunk);
      pos += chunk;
    }
  }
}

/* SELECT is a SLICE of one element at the index whose dim the output drops. */
void kiln_cpu_slice(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const uint8_t *src = r->data[op->inputs[0]];
  uint8_t *dst = r->data[op->output];
  int32_t dim = (int32_t)op->iattr[0];
  int is_select = op->kind == KILN_OP_SELECT;
  int64_t start = op->iattr[1], step = is_select ? 1 : op->iattr[3];
  int64_t count = is_select ? 1 : kiln_cpu_desc(r, op->output)->dims[dim];
  int64_t outer = kiln_cpu_extent(x, 0, dim), len = x->dims[dim];
  size_t inner = (size_t)kiln_cpu_extent(x, dim + 1, x->rank) * kiln_dtype_size(x->dtype);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < count; i++)
      memcpy(dst + (size_t)(o * count + i) * inner,
             src + (size_t)(o * len + start + i * step) * inner, inner);
}
