/* Dynamic sizes evaluated for one call (see symbolic.h). */
#include "runtime/symbolic.h"

#include "runtime/fused_program.h"

#include <string.h>

/* A FUSED op's output at values: its own expressions (its program fixes no shape); with check,
 * its program decoded at these sizes, so no address it reaches here lies outside an input. */
static kiln_status fused_at(const kiln_plan *plan, uint32_t i, const kiln_op *op,
                            const kiln_tensor_desc *const *in, const int64_t *values, int check,
                            kiln_tensor_desc *got, kiln_error *err) {
  const kiln_tensor_desc *want = &plan->tensors[op->output];
  kiln_fx_prog prog;
  *got = *want;
  for (int32_t d = 0; d < want->rank; d++)
    got->dims[d] = kiln_sym_eval(&want->sym[d], want->dims[d], values);
  kiln_shape_nbytes(want->dtype, want->rank, got->dims, &got->nbytes); /* within the bound */
  return check ? kiln_fx_decode_at(plan->words, plan->n_words, op, i, in, got, &prog, err)
               : KILN_OK;
}

int kiln_tensor_is_dynamic(const kiln_tensor_desc *t) {
  for (int32_t d = 0; d < t->rank; d++)
    if (t->sym[d].symbol) return 1;
  return 0;
}

kiln_status kiln_plan_shapes_at(const kiln_plan *plan, const int64_t *values, int check,
                                const kiln_op_site *at, kiln_tensor_desc *tensors, kiln_op *ops,
                                kiln_error *err) {
  kiln_op_site site = *at;
  for (uint32_t t = 0; t < plan->n_tensors; t++) {
    const kiln_tensor_desc *p = &plan->tensors[t];
    if (p->storage != KILN_STORE_INPUT || !kiln_tensor_is_dynamic(p)) continue;
    for (int32_t d = 0; d < p->rank; d++)
      tensors[t].dims[d] = kiln_sym_eval(&p->sym[d], p->dims[d], values);
    /* within the bound, whose bytes the reader checked */
    kiln_shape_nbytes(p->dtype, p->rank, tensors[t].dims, &tensors[t].nbytes);
  }
  for (uint32_t i = 0; i < plan->n_ops; i++) {
    const kiln_op *p = &plan->ops[i];
    const kiln_tensor_desc *in[KILN_MAX_OP_INPUTS], *want = &plan->tensors[p->output];
    kiln_tensor_desc got;
    kiln_status s;
    for (uint32_t k = 0; k < p->n_iattr; k++)
      ops[i].iattr[k] = kiln_sym_eval(&p->iattr_sym[k], p->iattr[k], values);
    for (uint32_t k = 0; k < p->n_inputs; k++) in[k] = &tensors[p->inputs[k]];
    site.index = i;
    if (p->kind == KILN_OP_FUSED) {
      if ((s = fused_at(plan, i, &ops[i], in, values, check, &got, err))) return s;
    } else if ((s = kiln_infer_op(&ops[i], in, &site, &got, err))) {
      return s;
    }
    if (check && p->kind != KILN_OP_FUSED) {
      for (int32_t d = 0; d < want->rank; d++) {
        int64_t expect = kiln_sym_eval(&want->sym[d], want->dims[d], values);
        if (got.rank != want->rank || got.dims[d] != expect)
          return kiln_fail(err, site.status,
                           "%.7s op %u (%.12s): at these dynamic sizes its output dim %d is %lld "
                           "but its expression gives %lld%.24s",
                           site.stage, (unsigned)i, kiln_op_name(p->kind), (int)d,
                           (long long)(got.rank == want->rank ? got.dims[d] : -1),
                           (long long)expect, site.remedy);
      }
    }
    memcpy(tensors[p->output].dims, got.dims, sizeof got.dims);
    tensors[p->output].nbytes = got.nbytes;
  }
  return KILN_OK;
}

kiln_status kiln_plan_bind_symbols(const kiln_plan *plan, const char *const *names,
                                   const kiln_tensor_view *inputs, int64_t *values,
                                   kiln_error *err) {
  int known[KILN_MAX_SYMBOLS] = {0};
  for (uint32_t i = 0; i < plan->n_inputs; i++) {
    const kiln_tensor_desc *t = &plan->tensors[plan->inputs[i]];
    if (inputs[i].rank != t->rank) continue;
    for (int32_t d = 0; d < t->rank; d++) {
      const kiln_sym_size *s = &t->sym[d];
      const kiln_symbol *sym;
      int64_t size = inputs[i].sizes[d], lo, hi, v;
      if (!s->symbol) continue;
      sym = &plan->symbols[s->symbol - 1];
      lo = s->coeff * sym->min + s->offset;
      hi = t->dims[d];
      if (size > hi)
        return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                         "input %u (\"%.63s\") dim %d is %lld, above its bound %lld (dynamic size "
                         "%.15s); pass at most that or re-export with a larger max",
                         (unsigned)i, names[i], (int)d, (long long)size, (long long)hi, sym->name);
      if (size < lo)
        return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                         "input %u (\"%.63s\") dim %d is %lld, below its bound %lld (dynamic size "
                         "%.15s); pass at least that or re-export with a smaller min",
                         (unsigned)i, names[i], (int)d, (long long)size, (long long)lo, sym->name);
      if ((size - s->offset) % s->coeff != 0)
        return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                         "input %u (\"%.63s\") dim %d is %lld, not %lld*%.15s%+lld for a whole "
                         "%.15s; pass a size of that form",
                         (unsigned)i, names[i], (int)d, (long long)size, (long long)s->coeff,
                         sym->name, (long long)s->offset, sym->name);
      v = (size - s->offset) / s->coeff;
      if (known[s->symbol - 1] && values[s->symbol - 1] != v)
        return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                         "input %u (\"%.63s\") dim %d is %lld, giving %.15s = %lld where an earlier "
                         "input gave %lld; pass inputs of matching sizes",
                         (unsigned)i, names[i], (int)d, (long long)size, sym->name, (long long)v,
                         (long long)values[s->symbol - 1]);
      known[s->symbol - 1] = 1;
      values[s->symbol - 1] = v;
    }
  }
  for (uint32_t k = 0; k < plan->n_symbols; k++)
    if (!known[k])
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "no input of the right rank gives dynamic size %.15s; pass every input with "
                       "the rank the program takes",
                       plan->symbols[k].name);
  return KILN_OK;
}
