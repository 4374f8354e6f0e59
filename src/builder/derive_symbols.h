/* Ahead of time: which dims of a built plan follow its symbols, found by running shape
 * inference at other symbol values. */
#ifndef KILN_DERIVE_SYMBOLS_H
#define KILN_DERIVE_SYMBOLS_H

#include "kiln/kiln.h"

/* Fills the sym of every op output of plan but a FUSED op's, which it keeps (its inputs' sym
 * and ops' iattr_sym already set):
 * each dim must be coeff * s + offset of at most one symbol s, coeff >= 1, checked at the
 * lower bounds and midway. Writes the shapes at the lower bounds into min_tensors and min_ops
 * (n_tensors and n_ops entries), for placing views. */
kiln_status kiln_derive_symbols(kiln_plan *plan, kiln_tensor_desc *min_tensors, kiln_op *min_ops,
                                kiln_error *err);

#endif
