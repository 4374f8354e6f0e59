/* Index arithmetic shared by the CPU ops: element counts, broadcast strides, odometers. */
#include "cpu/cpu_ops.h"

int64_t kiln_cpu_extent(const kiln_tensor_desc *t, int32_t from, int32_t to) {
  int64_t n = 1;
  for (int32_t d = from; d < to; d++) n *= t->dims[d];
  return n;
}

int64_t kiln_cpu_numel(const kiln_tensor_desc *t) { return kiln_cpu_extent(t, 0, t->rank); }

void kiln_cpu_bcast_strides(const kiln_tensor_desc *t, int32_t rank, const int64_t *dims,
                            int64_t *strides) {
  int64_t stride = 1;
  for (int32_t d = rank - 1, td = t->rank - 1; d >= 0; d--, td--) {
    if (td < 0) {
      strides[d] = 0;
      continue;
    }
    strides[d] = t->dims[td] == 1 && dims[d] != 1 ? 0 : stride;
    stride *= t->dims[td];
  }
}

void kiln_cpu_iter_init(kiln_cpu_iter *it, const kiln_tensor_desc *out,
                        const kiln_tensor_desc *const *operands, int32_t n) {
  memset(it, 0, sizeof *it);
  it->rank = out->rank;
  it->n = n;
  memcpy(it->dims, out->dims, sizeof it->dims);
  for (int32_t k = 0; k < n; k++)
    kiln_cpu_bcast_strides(operands[k], out->rank, out->dims, it->strides[k]);
}

void kiln_cpu_iter_next(kiln_cpu_iter *it) {
  for (int32_t d = it->rank - 1; d >= 0; d--) {
    it->idx[d]++;
    for (int32_t k = 0; k < it->n; k++) it->off[k] += it->strides[k][d];
    if (it->idx[d] < it->dims[d]) return;
    for (int32_t k = 0; k < it->n; k++) it->off[k] -= it->strides[k][d] * it->dims[d];
    it->idx[d] = 0;
  }
}

int64_t kiln_cpu_batch_offset(const kiln_tensor_desc *t, int32_t core, int64_t b, int32_t brank,
                              const int64_t *bdims) {
  int32_t tb = t->rank > core ? t->rank - core : 0;
  int64_t stride = kiln_cpu_extent(t, tb, t->rank), off = 0;
  for (int32_t d = brank - 1, td = tb - 1; d >= 0; d--, td--) {
    int64_t c = b % bdims[d];
    b /= bdims[d];
    if (td < 0) continue;
    if (t->dims[td] != 1) off += c / (bdims[d] / t->dims[td]) * stride; /* grouped when fewer */
    stride *= t->dims[td];
  }
  return off;
}
