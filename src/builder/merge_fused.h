/* Sibling FUSED groups as one: the same program over adjacent parts of the same inputs (a
 * decoder's rotary embedding of q and of k, read from one projection's columns) in one kernel. */
#ifndef KILN_MERGE_FUSED_H
#define KILN_MERGE_FUSED_H

#include "builder/graph.h"

/* Two FUSED ops of a static graph with the same inputs, the same instructions and outputs of
 * one dtype whose dims differ at most along one dim d, all dims before d being 1, become one
 * FUSED op over the outputs joined along d, each former output a SLICE of it (a view: no bytes
 * move), in the first one's place. They join only where the second is the first continued
 * along d: each load's map has the same slot, strides and boxes (the boxes covering d whole: a
 * cat along d is never continued), its offset further by the first's extent along d times its
 * stride there. Never joined: an output binding or a state's value, and groups reading bytes a
 * state's in-place write may change (the second would run earlier than before). Each element
 * is computed by the same instructions from the same input elements as before: same bytes. */
kiln_status kiln_merge_fused_siblings(kiln_graph *g, kiln_error *err);

#endif
