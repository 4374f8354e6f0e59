/* Ops whose output is a contiguous run of their input's bytes. The builder places such an
 * output inside its input's arena block instead of giving it a block of its own, and the
 * engines skip the op when the two addresses show it already holds. */
#ifndef KILN_VIEW_H
#define KILN_VIEW_H

#include "kiln/kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when op's output is the bytes of its input `in` from *offset on: RESHAPE and COPY
 * (offset 0), a PERMUTE that keeps the order of every dim larger than 1 (offset 0), SELECT,
 * and a SLICE of step 1, of a dim with only size-1 dims before it. */
int kiln_op_is_view(const kiln_op *op, const kiln_tensor_desc *in, uint64_t *offset);

#ifdef __cplusplus
}
#endif

#endif
