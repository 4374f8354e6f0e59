/* Pointwise-chain fusion: one kernel, one pass over memory, for a run of pointwise ops. */
#ifndef KILN_FUSE_POINTWISE_H
#define KILN_FUSE_POINTWISE_H

#include "core/graph.h"

/* Each maximal chain of 2..KILN_PW_MAX_STEPS float pointwise ops (the unary ops, and ADD, SUB
 * with alpha 1, MUL, DIV whose other operand broadcasts to the chain without enlarging it),
 * where every op reads the previous one's result and nothing else reads it, becomes one
 * KILN_OP_POINTWISE op in the last op's place. Longer chains split; a second POW ends one. */
kiln_status kiln_fuse_pointwise(kiln_graph *g, kiln_error *err);

#endif
