/* Pointwise-chain fusion: one kernel, one pass over memory, for a run of pointwise ops. */
#ifndef KILN_FUSE_POINTWISE_H
#define KILN_FUSE_POINTWISE_H

#include "builder/graph.h"

/* Each maximal chain of 2..KILN_PW_MAX_STEPS float pointwise ops (the unary ops, and ADD, SUB
 * with alpha 1, MUL, DIV whose other operand broadcasts to the chain without enlarging it),
 * where every op reads the previous one's result and nothing else reads it, becomes one
 * KILN_OP_POINTWISE op in the last op's place. Longer chains split; a second POW ends one. */
kiln_status kiln_fuse_pointwise(kiln_graph *g, kiln_error *err);

/* Writes op as a POINTWISE op into *out: a copy of a POINTWISE op, or the one step a lone
 * pointwise op is, reading the operand of its output's shape as x. 0 when op cannot be one. */
int kiln_pointwise_of(const kiln_graph *g, const kiln_op *op, kiln_op *out);

#endif
