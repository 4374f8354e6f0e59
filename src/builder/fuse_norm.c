/* Norm fusion: steps before and after LAYER_NORM and RMS_NORM (see fuse_norm.h). */
#include "builder/fuse_norm.h"

#include "builder/fuse_pointwise.h"
#include "runtime/pointwise_steps.h"

#include <stdlib.h>

static int has_pow(const kiln_op *pw) {
  for (uint32_t s = 0; s < pw->n_iattr; s++)
    if (KILN_PW_STEP_KIND(pw->iattr[s]) == KILN_OP_POW) return 1;
  return 0;
}

/* Appends the steps of POINTWISE op pw to norm op f, its operands after f's inputs (each
 * once); 0 (f unchanged) when they do not fit. */
static int append_steps(kiln_op *f, const kiln_op *pw) {
  kiln_op next = *f;
  kiln_pw_span span;
  kiln_pw_span_of(f, &span);
  for (uint32_t s = 0; s < span.n_steps && has_pow(pw); s++)
    if (KILN_PW_STEP_KIND(span.steps[s]) == KILN_OP_POW) return 0; /* one exponent */
  if (next.n_iattr + pw->n_iattr > KILN_NORM_MAX_IATTR) return 0;
  for (uint32_t s = 0; s < pw->n_iattr; s++) {
    int64_t step = pw->iattr[s];
    uint32_t slot = KILN_PW_STEP_INPUT(step), at = 0;
    if (KILN_PW_STEP_KIND(step) == KILN_OP_POW) next.fattr[1] = pw->fattr[0];
    if (slot) {
      uint32_t tensor = pw->inputs[slot];
      at = span.first_operand;
      while (at < next.n_inputs && next.inputs[at] != tensor) at++;
      if (at == KILN_MAX_OP_INPUTS) return 0;
      if (at == next.n_inputs) next.inputs[next.n_inputs++] = tensor;
      step &= ~((int64_t)KILN_PW_INPUT_MASK << KILN_PW_INPUT_SHIFT);
      step |= (int64_t)at << KILN_PW_INPUT_SHIFT;
    }
    next.iattr[next.n_iattr++] = step;
  }
  *f = next;
  return 1;
}

/* The POINTWISE form of the live op writing tensor t when only the norm reads t, or 0. */
static int producer_chain(const kiln_graph *g, uint32_t t, const uint32_t *uses, kiln_op *pw) {
  int32_t p = kiln_graph_producer(g, t, uses, 1);
  return p >= 0 && kiln_pointwise_of(g, &g->ops[p], pw);
}

/* The POINTWISE form of the one live op reading t, when it reads t as x and nowhere else. */
static int reader_chain(const kiln_graph *g, uint32_t t, const uint32_t *uses,
                        const int32_t *reader, kiln_op *pw) {
  if (uses[t] != 1 || reader[t] < 0 || g->dead[reader[t]] ||
      !kiln_pointwise_of(g, &g->ops[reader[t]], pw))
    return 0;
  for (uint32_t k = 1; k < pw->n_inputs; k++) /* then it reads t as x */
    if (pw->inputs[k] == t) return 0;
  return 1;
}

static void fuse_one(kiln_graph *g, uint32_t n, const uint32_t *uses, const int32_t *reader) {
  kiln_op f = g->ops[n], pw;
  uint32_t place = n;
  f.n_iattr = 3;
  f.iattr[2] = 0;
  f.fattr[1] = 0.0;
  if (producer_chain(g, f.inputs[0], uses, &pw) && append_steps(&f, &pw)) {
    g->dead[g->tensors[f.inputs[0]].producer] = 1;
    f.inputs[0] = pw.inputs[0];
    f.iattr[2] = (int64_t)pw.n_iattr;
  }
  if (reader_chain(g, f.output, uses, reader, &pw) && append_steps(&f, &pw)) {
    place = (uint32_t)reader[f.output];
    f.output = pw.output;
    g->dead[n] = 1;
  }
  if (f.n_iattr > 3) g->ops[place] = f;
}

kiln_status kiln_fuse_norms(kiln_graph *g, kiln_error *err) {
  uint32_t *uses;
  int32_t *reader;
  kiln_status s = kiln_graph_readers(g, "norms", &uses, &reader, err);
  if (s != KILN_OK) return s;
  for (uint32_t i = 0; i < g->n_ops; i++) {
    const kiln_op *op = &g->ops[i];
    if (!g->dead[i] && (op->kind == KILN_OP_LAYER_NORM || op->kind == KILN_OP_RMS_NORM) &&
        op->n_iattr == 2)
      fuse_one(g, i, uses, reader);
  }
  free(uses);
  free(reader);
  return KILN_OK;
}
