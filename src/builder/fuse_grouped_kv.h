/* Grouped-query attention as models write it: the repeated k and v are not materialized. */
#ifndef KILN_FUSE_GROUPED_KV_H
#define KILN_FUSE_GROUPED_KV_H

#include "builder/graph.h"

/* The pattern of `repeat_kv`: k [..., Hkv, S, E] viewed as [..., Hkv, 1, S, E], expanded to
 * [..., Hkv, n, S, E] and viewed as [..., Hkv*n, S, E] for an SDPA whose q has Hkv*n heads.
 * When k and v both have it and the expands feed nothing else, the SDPA reads the Hkv heads
 * themselves (key/value head = query head / n) and the expands are gone. */
kiln_status kiln_fuse_grouped_kv(kiln_graph *g, kiln_error *err);

#endif
