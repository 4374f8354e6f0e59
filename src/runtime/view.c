/* Which ops are views of their input (see view.h). */
#include "runtime/view.h"

int kiln_op_is_view(const kiln_op *op, const kiln_tensor_desc *in, uint64_t *offset) {
  int64_t dim, start, inner = 1;
  *offset = 0;
  if (op->kind == KILN_OP_RESHAPE || op->kind == KILN_OP_COPY) return 1;
  if (op->kind == KILN_OP_PERMUTE) { /* moving only size-1 dims leaves the bytes in order */
    int32_t last = -1;
    for (int32_t j = 0; j < in->rank; j++) {
      int64_t d = op->iattr[j];
      if (d < 0 || d >= in->rank) return 0;
      if (in->dims[d] == 1) continue;
      if (d < last) return 0;
      last = (int32_t)d;
    }
    return 1;
  }
  if (op->kind != KILN_OP_SELECT && op->kind != KILN_OP_SLICE) return 0;
  dim = op->iattr[0];
  start = op->iattr[1];
  if (dim < 0 || dim >= in->rank) return 0;
  if (op->kind == KILN_OP_SELECT && start < 0) start += in->dims[dim];
  if (start < 0 || start >= in->dims[dim]) return 0;
  if (op->kind == KILN_OP_SLICE && op->iattr[3] != 1) return 0;
  for (int32_t d = 0; d < dim; d++)
    if (in->dims[d] != 1) return 0;
  for (int32_t d = (int32_t)dim + 1; d < in->rank; d++) inner *= in->dims[d];
  *offset = (uint64_t)start * (uint64_t)inner * kiln_dtype_size(in->dtype);
  return 1;
}
