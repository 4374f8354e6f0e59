/* Per-op consistency checks the CUDA engine runs at init, before anything is enqueued. */
#ifndef KILN_CUDA_CHECK_H
#define KILN_CUDA_CHECK_H

#include "kiln/kiln.h"

/* KILN_OK, or INVALID_PROGRAM / UNSUPPORTED naming op i and what disagrees. */
kiln_status kcu_check_op(const kiln_plan *plan, uint32_t i, kiln_error *err);

#endif
