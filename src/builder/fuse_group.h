/* General fusion: connected groups of pointwise ops, float casts and index-remapping views
 * become one KILN_OP_FUSED op whose program reads each input through an index map composed
 * from the views between it and the output. */
#ifndef KILN_FUSE_GROUP_H
#define KILN_FUSE_GROUP_H

#include "builder/graph.h"

/* From the last op backward, each groupable op (float pointwise ops and POINTWISE chains,
 * CAST between floats, COPY, RESHAPE, PERMUTE, EXPAND, SLICE, SELECT, CAT) gathers every
 * groupable producer whose result only the group reads, and in a static graph also one whose
 * result of at most 4096 elements others read too (a decode step's rotary tables, read by every
 * layer), which the group then recomputes: once every reader recomputes it, no op computes it
 * apart. A group doing the work of two or more kernels becomes one FUSED op in its last op's
 * place. Where a view cannot be composed (a
 * reshape splitting a computed dim, a cat along a mixed dim) or the program outgrows its
 * limits, the value there is left to be written by a group of its own. Every op's rounding to
 * its dtype is kept, so a fused group computes what its ops did. The programs live in constant
 * tensors of the graph (op iattr0) until the plan is written. In a dynamic graph (n_symbols
 * bounded sizes) a group is kept only where its program, cut to the output's dims at each size
 * probed (kiln_fx_decode_at), is the one compiled there; elsewhere a member whose loads follow a
 * symbol is left out, as a failure to compile leaves one. A FUSED output gets the sym its
 * root's output had (its shape comes with its program, not from shape inference). */
kiln_status kiln_fuse_groups(kiln_graph *g, const kiln_symbol *symbols, uint32_t n_symbols,
                             kiln_error *err);

#endif
