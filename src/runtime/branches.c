/* Ops beside the chain (see branches.h). */
#include "runtime/branches.h"

#include <string.h>

static int overlap(const kiln_branch_facts *f, uint32_t a, uint32_t b) {
  return f->bytes[a][0] < f->bytes[b][1] && f->bytes[b][0] < f->bytes[a][1];
}

/* The first op after i on the chain reading op i's result or a view of it; -1 where none does
 * or where an op of the chain before it writes bytes op i reads or writes. *launches: the
 * chain's kernels between. */
static int64_t chain_reader(const kiln_plan *p, const kiln_branch_facts *f, uint32_t i,
                            const int32_t *beside, uint8_t *derived, int *launches) {
  const kiln_op *op = &p->ops[i];
  memset(derived, 0, p->n_tensors);
  derived[op->output] = 1;
  *launches = 0;
  for (uint32_t k = i + 1; k < p->n_ops; k++) {
    const kiln_op *o = &p->ops[k];
    int reads = 0;
    for (uint32_t n = 0; n < o->n_inputs; n++) reads |= derived[o->inputs[n]];
    if (reads && f->view[k] && derived[o->inputs[0]]) derived[o->output] = 1;
    else if (reads && !beside[k]) return k;
    if (f->view[k] || beside[k]) continue; /* a view writes nothing; the branch runs after op i */
    if (overlap(f, o->output, op->output)) return -1;
    for (uint32_t n = 0; n < op->n_inputs; n++)
      if (overlap(f, o->output, op->inputs[n])) return -1;
    *launches += f->launches[k] != 0;
  }
  return -1;
}

uint32_t kiln_plan_branches(const kiln_plan *p, const kiln_branch_facts *f, uint8_t *derived,
                            int32_t *beside) {
  uint32_t n = 0;
  for (uint32_t i = p->n_ops; i-- > 0;) {
    int launches = 0;
    int64_t j = f->candidate[i] ? chain_reader(p, f, i, beside, derived, &launches) : -1;
    beside[i] = j >= 0 && launches > 0 ? (int32_t)j + 1 : 0;
    n += beside[i] != 0;
  }
  return n;
}

void kiln_branch_joins(const int32_t *beside, uint32_t n_ops, int32_t *join) {
  int64_t last = -1, joined = -1; /* the latest op beside so far, and the latest joined */
  for (uint32_t i = 0; i < n_ops; i++) {
    int wait = 0;
    for (int64_t b = joined + 1; !wait && b <= last; b++) wait = beside[b] == (int32_t)i + 1;
    join[i] = wait ? (int32_t)last + 1 : 0;
    if (wait) joined = last;
    if (beside[i]) last = i;
  }
}
