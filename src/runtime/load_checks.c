/* The load-time checks of a blob (see load_checks.h). */
#include "runtime/load_checks.h"

#include "runtime/shape.h"

#include <string.h>

static const char *io_name(kiln_io_kind kind) { return kind == KILN_IO_INPUT ? "input" : "output"; }

/* The metadata's bindings and the plan's inputs and outputs agree in count, dtype and shape. */
static kiln_status check_bindings(const kiln_metadata *md, const kiln_plan *plan, kiln_error *err) {
  uint32_t n[2] = {0, 0};
  for (uint32_t i = 0; i < md->n_bindings; i++) n[md->bindings[i].kind]++;
  if (n[KILN_IO_INPUT] != plan->n_inputs || n[KILN_IO_OUTPUT] != plan->n_outputs)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "the metadata binds %u inputs and %u outputs but the plan has %u inputs and "
                     "%u outputs; re-export the program",
                     (unsigned)n[KILN_IO_INPUT], (unsigned)n[KILN_IO_OUTPUT],
                     (unsigned)plan->n_inputs, (unsigned)plan->n_outputs);
  n[0] = n[1] = 0;
  for (uint32_t i = 0; i < md->n_bindings; i++) {
    const kiln_binding *b = &md->bindings[i];
    uint32_t k = n[b->kind]++;
    const kiln_tensor_desc *t =
        &plan->tensors[b->kind == KILN_IO_INPUT ? plan->inputs[k] : plan->outputs[k]];
    char have[48], want[48];
    if (b->dtype != t->dtype || b->rank != t->rank ||
        memcmp(b->shape, t->dims, sizeof b->shape[0] * (size_t)b->rank) != 0)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "metadata %.6s %u (\"%.63s\") is %.4s %.40s but the plan's tensor is %.4s "
                       "%.40s; re-export the program",
                       io_name(b->kind), (unsigned)k, b->name, kiln_dtype_name(b->dtype),
                       kiln_shape_str(b->rank, b->shape, have, sizeof have),
                       kiln_dtype_name(t->dtype),
                       kiln_shape_str(t->rank, t->dims, want, sizeof want));
  }
  return KILN_OK;
}

kiln_status kiln_check_blob(const void *blob, size_t size, kiln_blob_view *view,
                            kiln_metadata *md, kiln_plan *plan, kiln_error *err) {
  kiln_status s;
  memset(plan, 0, sizeof *plan);
  if ((s = kiln_blob_parse(blob, size, view, err)) ||
      (s = kiln_metadata_parse((const char *)view->metadata, view->metadata_size, md, err)) ||
      (s = kiln_plan_parse(view->plan, view->plan_size, view->weights_size, plan, err)))
    return s;
  if ((s = check_bindings(md, plan, err))) kiln_plan_release(plan);
  return s;
}
