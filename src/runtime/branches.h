/* Which ops of a plan may run on a branch beside the chain of the others: an op whose result
 * the chain reads only some kernels later need not hold up the kernels between, so an engine
 * may run it on a second stream forked where it stands in the plan and join it before its first
 * reader on the chain. The engine says what it knows of each op and tensor; this decides. */
#ifndef KILN_BRANCHES_H
#define KILN_BRANCHES_H

#include "kiln/kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_branch_facts {
  const uint8_t *candidate;  /* an op: the engine could run it beside the chain */
  const uint8_t *launches;   /* an op: the engine launches work for it */
  const uint8_t *view;       /* an op: its output is its input 0's bytes (it writes nothing) */
  const uint64_t (*bytes)[2]; /* a tensor: [first, end) of its bytes, one address space */
} kiln_branch_facts;

/* Weighs the ops from the last back, so the ops after each are placed when it is: a candidate
 * goes beside when an op of the chain reads its result (directly or through views of it), a
 * kernel of the chain runs between, and no op of the chain between writes a byte it reads or
 * writes. beside[i] gets 1 + that reader for such an op, else 0; derived is n_tensors bytes of
 * scratch. Returns how many ops go beside. */
uint32_t kiln_plan_branches(const kiln_plan *p, const kiln_branch_facts *f, uint8_t *derived,
                            int32_t *beside);

/* Where the chain joins the branch, from beside (kiln_plan_branches) over n_ops ops: the branch
 * is one stream, so a join waits for every op launched beside so far, and an op beside needs no
 * join of its own when a join before its reader covers it. join[i] gets 1 + the op beside whose
 * end op i waits for before it starts, else 0. Each op beside has its reader on the chain after
 * it, so every op beside is joined before the last op ends. */
void kiln_branch_joins(const int32_t *beside, uint32_t n_ops, int32_t *join);

#ifdef __cplusplus
}
#endif

#endif
