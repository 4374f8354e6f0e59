/* Attention with packed heads or heads last: the head split and merge around an SDPA run
 * inside it. */
#ifndef KILN_FUSE_ATTENTION_H
#define KILN_FUSE_ATTENTION_H

#include "builder/graph.h"

/* The pattern exported multi-head attention has: qkv [B,L,3,H,E] permuted (2,0,3,1,4), its three
 * slices selected as q, k and v, SDPA, and the result permuted (0,2,1,3) back to [B,L,H,E].
 * When the permutes and selects feed nothing else, the SDPA reads qkv itself and writes
 * [B,L,H,E] (iattr2 = 1) in the last permute's place, and the copies are gone. The same holds
 * for x [B,L,3*H*E] sliced along its last dim into q, k and v, each reshaped to [B,L,H,E] and
 * permuted (0,2,1,3), as GPT-2 splits its fused projection: x is viewed as qkv. Only f16 and
 * bf16 heads of 64 or 128 are packed: those the GPU runs on its flash kernel, which reads any
 * row stride; other attention runs fastest on strided-batched matmuls, which need the
 * copies. With `heads_last`, an SDPA of such heads whose q, k and v come otherwise (rotary
 * embeddings, grouped-query heads) still takes the merge: it writes [B,L,H,Ev] (iattr2 = 2).
 * The builder asks for that only on its last call, after linears are joined, so heads that
 * can still be packed are not taken first. */
kiln_status kiln_fuse_attention(kiln_graph *g, int heads_last, kiln_error *err);

#endif
