/* Symbolic dims of a built plan (see derive_symbols.h). */
#include "builder/derive_symbols.h"

#include "runtime/alloc.h"
#include "runtime/symbolic.h"

#include <stdlib.h>
#include <string.h>

static const kiln_op_site probe_site = {"builder", 0, KILN_ERR_UNSUPPORTED, " (at a smaller size)"};

/* Shapes of plan at values into fresh copies of its arrays. */
static kiln_status shapes_at(const kiln_plan *plan, const int64_t *values, int check,
                             kiln_tensor_desc *tensors, kiln_op *ops, kiln_error *err) {
  memcpy(tensors, plan->tensors, sizeof *tensors * plan->n_tensors);
  memcpy(ops, plan->ops, sizeof *ops * plan->n_ops);
  return kiln_plan_shapes_at(plan, values, check, &probe_site, tensors, ops, err);
}

/* Dim d of op output t moves by delta when symbol k drops from its upper to its lower bound. */
static kiln_status record_delta(kiln_plan *plan, uint32_t t, int32_t d, uint32_t k, int64_t delta,
                                kiln_error *err) {
  const kiln_symbol *sym = &plan->symbols[k];
  kiln_sym_size *s = &plan->tensors[t].sym[d];
  int64_t span = sym->max - sym->min;
  if (s->symbol)
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "builder: plan tensor %u dim %d follows both %.15s and %.15s; Kiln takes "
                     "sizes of one symbol: export with fewer dynamic dims",
                     (unsigned)t, (int)d, plan->symbols[s->symbol - 1].name, sym->name);
  if (delta < 0 || delta % span != 0)
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "builder: plan tensor %u dim %d is not a*%.15s+b with a >= 1 over "
                     "%lld..%lld; export with a static size for it",
                     (unsigned)t, (int)d, sym->name, (long long)sym->min, (long long)sym->max);
  s->symbol = k + 1;
  s->coeff = delta / span;
  s->offset = plan->tensors[t].dims[d] - s->coeff * sym->max;
  return KILN_OK;
}

kiln_status kiln_derive_symbols(kiln_plan *plan, kiln_tensor_desc *min_tensors, kiln_op *min_ops,
                                kiln_error *err) {
  int64_t values[KILN_MAX_SYMBOLS];
  kiln_status s = KILN_OK;
  kiln_tensor_desc *work = kiln_calloc(plan->n_tensors ? plan->n_tensors : 1, sizeof *work);
  kiln_op *ops = kiln_calloc(plan->n_ops ? plan->n_ops : 1, sizeof *ops);
  if (!work || !ops) {
    s = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                  "builder: out of memory deriving the dynamic sizes of %u tensors; free memory",
                  (unsigned)plan->n_tensors);
    goto done;
  }
  for (uint32_t t = 0; t < plan->n_tensors; t++) /* a FUSED output's is back from ops below */
    if (plan->tensors[t].storage != KILN_STORE_INPUT) {
      memcpy(work[t].sym, plan->tensors[t].sym, sizeof work[t].sym);
      memset(plan->tensors[t].sym, 0, sizeof plan->tensors[t].sym);
    }
  for (uint32_t i = 0; i < plan->n_ops; i++) /* the fusion pass gave it */
    if (plan->ops[i].kind == KILN_OP_FUSED)
      memcpy(plan->tensors[plan->ops[i].output].sym, work[plan->ops[i].output].sym,
             sizeof work[0].sym);
  for (uint32_t k = 0; k < plan->n_symbols && s == KILN_OK; k++) {
    if (plan->symbols[k].min == plan->symbols[k].max) continue;
    for (uint32_t j = 0; j < plan->n_symbols; j++) values[j] = plan->symbols[j].max;
    values[k] = plan->symbols[k].min;
    if ((s = shapes_at(plan, values, 0, work, ops, err))) break;
    for (uint32_t i = 0; i < plan->n_ops && s == KILN_OK; i++) {
      uint32_t t = plan->ops[i].output;
      if (plan->ops[i].kind == KILN_OP_FUSED) continue; /* its sym is given */
      for (int32_t d = 0; d < plan->tensors[t].rank && s == KILN_OK; d++)
        if (work[t].dims[d] != plan->tensors[t].dims[d])
          s = record_delta(plan, t, d, k, plan->tensors[t].dims[d] - work[t].dims[d], err);
    }
  }
  if (s) goto done;
  /* The expressions must hold where they were not fitted: midway, then at the lower bounds. */
  for (uint32_t j = 0; j < plan->n_symbols; j++)
    values[j] = plan->symbols[j].min + (plan->symbols[j].max - plan->symbols[j].min) / 2;
  if ((s = shapes_at(plan, values, 1, work, ops, err))) goto done;
  for (uint32_t j = 0; j < plan->n_symbols; j++) values[j] = plan->symbols[j].min;
  s = shapes_at(plan, values, 1, min_tensors, min_ops, err);
done:
  free(work);
  free(ops);
  return s;
}
