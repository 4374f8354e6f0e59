/* The engine front end: load (container, metadata, plan, bindings, device), execute (caller
 * views checked against the bindings, one caller at a time), destroy. */
#include "runtime/alloc.h"
#include "runtime/device.h"
#include "runtime/engine_internal.h"
#include "runtime/load_checks.h"
#include "runtime/shape.h"
#include "runtime/symbolic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kiln_engine_options_default(kiln_engine_options *opts) {
  if (!opts) return;
  opts->device = KILN_DEVICE_AUTO;
  opts->device_id = -1;
}

static const char *io_name(kiln_io_kind kind) { return kind == KILN_IO_INPUT ? "input" : "output"; }

static void release_engine(kiln_engine *e, int locked) {
  if (!e) return;
  kiln_plan_release(&e->plan);
  free(e->shaped.tensors);
  free(e->shaped.ops);
  free(e->weights);
  if (locked) pthread_mutex_destroy(&e->lock);
  free(e);
}

/* Parses what the blob holds into e and keeps a copy of the weights. */
static kiln_status read_blob(kiln_engine *e, const void *blob, size_t blob_size, kiln_error *err) {
  kiln_blob_view view;
  kiln_status s = kiln_check_blob(blob, blob_size, &view, &e->metadata, &e->plan, err);
  if (s) return s;
  e->weights_size = view.weights_size;
  if (view.weights_size == 0) return KILN_OK;
  if (!(e->weights = kiln_aligned_alloc(KILN_WEIGHTS_ALIGN, view.weights_size)))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory for %llu bytes of weights; free memory or load a smaller "
                     "program",
                     (unsigned long long)view.weights_size);
  memcpy(e->weights, view.weights, view.weights_size);
  return KILN_OK;
}

/* A dynamic plan gets its per-call copy of tensors and ops, at the upper bounds until a call. */
static kiln_status prepare_shapes(kiln_engine *e, kiln_error *err) {
  const kiln_plan *p = &e->plan;
  e->current = p;
  if (!p->n_symbols) return KILN_OK;
  e->shaped = *p;
  e->shaped.tensors = kiln_calloc(p->n_tensors ? p->n_tensors : 1, sizeof *p->tensors);
  e->shaped.ops = kiln_calloc(p->n_ops ? p->n_ops : 1, sizeof *p->ops);
  if (!e->shaped.tensors || !e->shaped.ops)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory for the per-call shapes of %u tensors; free memory",
                     (unsigned)p->n_tensors);
  memcpy(e->shaped.tensors, p->tensors, sizeof *p->tensors * p->n_tensors);
  memcpy(e->shaped.ops, p->ops, sizeof *p->ops * p->n_ops);
  e->current = &e->shaped;
  return KILN_OK;
}

kiln_status kiln_engine_load(const void *blob, size_t blob_size, const kiln_engine_options *opts,
                             kiln_engine **out, kiln_error *err) {
  kiln_engine_options defaults;
  kiln_device_kind kind;
  kiln_engine *e;
  kiln_status s;
  if (!out)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "kiln_engine_load needs somewhere to put the engine: pass a kiln_engine **");
  *out = NULL;
  if (!opts) {
    kiln_engine_options_default(&defaults);
    opts = &defaults;
  }
  if (!(e = kiln_calloc(1, sizeof *e)))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory for the engine; free memory and retry");
  if ((s = read_blob(e, blob, blob_size, err)) || (s = prepare_shapes(e, err)) ||
      (s = kiln_select_device(opts, e->metadata.device_id, kiln_cuda_count_devices, &kind,
                              &e->device_id, err))) {
    release_engine(e, 0);
    return s;
  }
  if (kind == KILN_DEVICE_CPU) {
    e->backend = &kiln_cpu_backend;
    snprintf(e->device_name, sizeof e->device_name, "cpu");
  } else {
#ifdef KILN_WITH_CUDA
    e->backend = &kiln_cuda_backend;
    snprintf(e->device_name, sizeof e->device_name, "cuda:%d", (int)e->device_id);
#endif
  }
  if (pthread_mutex_init(&e->lock, NULL) != 0) {
    release_engine(e, 0);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "could not create the engine's lock; free resources and retry");
  }
  if ((s = e->backend->init(e, err))) {
    release_engine(e, 1);
    return s;
  }
  *out = e;
  return KILN_OK;
}

/* One caller view against its binding: buffer, dtype, shape, contiguity, size. */
static kiln_status check_view(const kiln_binding *b, uint32_t k, const kiln_tensor_desc *t,
                              const kiln_tensor_view *v, kiln_error *err) {
  const char *io = io_name(b->kind);
  char have[48], want[48];
  int32_t shown_rank = v->rank < 0 ? 0 : v->rank > KILN_MAX_RANK ? KILN_MAX_RANK : v->rank;
  int64_t expect = 1;
  if (!v->data && t->nbytes)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.6s %u (\"%.63s\") has no data (NULL); pass a buffer of %llu bytes", io,
                     (unsigned)k, b->name, (unsigned long long)t->nbytes);
  if (v->dtype != t->dtype)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.6s %u (\"%.63s\") is %.7s but the program takes %.4s; pass a %.4s tensor",
                     io, (unsigned)k, b->name, kiln_dtype_name(v->dtype),
                     kiln_dtype_name(t->dtype), kiln_dtype_name(t->dtype));
  /* A dynamic output's view may be larger than this call's size (its bound, say). */
  int sized = v->rank == t->rank;
  for (int32_t d = 0; sized && d < t->rank; d++)
    sized = b->kind == KILN_IO_OUTPUT && t->sym[d].symbol ? v->sizes[d] >= t->dims[d]
                                                          : v->sizes[d] == t->dims[d];
  if (!sized)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.6s %u (\"%.63s\") has shape %.40s but the program takes %.40s; pass a "
                     "tensor of that shape",
                     io, (unsigned)k, b->name,
                     kiln_shape_str(shown_rank, v->sizes, have, sizeof have),
                     kiln_shape_str(t->rank, t->dims, want, sizeof want));
  /* Row-major, where a dim of size 1 may have any stride and an empty tensor is contiguous. */
  if (t->nbytes) {
    for (int32_t d = t->rank; d-- > 0;) {
      if (v->sizes[d] != 1 && v->strides[d] != expect)
        return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                         "%.6s %u (\"%.63s\") has strides %.40s, not contiguous for shape %.40s; "
                         "pass a contiguous tensor",
                         io, (unsigned)k, b->name,
                         kiln_shape_str(t->rank, v->strides, have, sizeof have),
                         kiln_shape_str(t->rank, v->sizes, want, sizeof want));
      expect *= v->sizes[d];
    }
  }
  if (v->nbytes < t->nbytes)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.6s %u (\"%.63s\") has a %llu-byte buffer but its shape needs %llu bytes; "
                     "pass a large enough buffer",
                     io, (unsigned)k, b->name, (unsigned long long)v->nbytes,
                     (unsigned long long)t->nbytes);
  return KILN_OK;
}

/* The bytes a view's binding uses, as an address range. */
static void view_range(const kiln_plan *plan, kiln_io_kind kind, uint32_t k,
                       const kiln_tensor_view *v, uintptr_t *lo, uintptr_t *hi) {
  uint32_t t = kind == KILN_IO_INPUT ? plan->inputs[k] : plan->outputs[k];
  *lo = (uintptr_t)v->data;
  *hi = *lo + (uintptr_t)plan->tensors[t].nbytes;
}

/* No output shares a byte with an input or another output. Both engines read every input
 * while they write outputs and copy an aliased output back after the run, so none performs a
 * shared pair in place, declared alias or not. */
static kiln_status check_disjoint(const kiln_engine *e, const kiln_tensor_view *inputs,
                                  const kiln_tensor_view *outputs, kiln_error *err) {
  const kiln_plan *plan = e->current;
  const char *name[2][KILN_MAX_BINDINGS];
  uint32_t n[2] = {0, 0};
  for (uint32_t i = 0; i < e->metadata.n_bindings; i++) {
    const kiln_binding *b = &e->metadata.bindings[i];
    name[b->kind][n[b->kind]++] = b->name;
  }
  for (uint32_t o = 0; o < plan->n_outputs; o++) {
    uintptr_t lo, hi;
    view_range(plan, KILN_IO_OUTPUT, o, &outputs[o], &lo, &hi);
    for (uint32_t j = 0; lo < hi && j < plan->n_inputs + o; j++) {
      int is_in = j < plan->n_inputs;
      uint32_t k = is_in ? j : j - plan->n_inputs;
      uintptr_t lo2, hi2;
      view_range(plan, is_in ? KILN_IO_INPUT : KILN_IO_OUTPUT, k, is_in ? &inputs[k] : &outputs[k],
                 &lo2, &hi2);
      if (lo2 < hi2 && lo < hi2 && lo2 < hi)
        return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                         "output %u (\"%.63s\") shares bytes with %.6s %u (\"%.63s\"); pass "
                         "disjoint buffers (an aliased output is copied back after)",
                         (unsigned)o, name[KILN_IO_OUTPUT][o], is_in ? "input" : "output",
                         (unsigned)k, name[is_in ? KILN_IO_INPUT : KILN_IO_OUTPUT][k]);
    }
  }
  return KILN_OK;
}

static kiln_status check_views(kiln_engine *e, const kiln_tensor_view *inputs,
                               uint32_t n_inputs, const kiln_tensor_view *outputs,
                               uint32_t n_outputs, kiln_error *err) {
  const kiln_plan *plan = e->current;
  uint32_t n[2] = {0, 0};
  if (n_inputs != plan->n_inputs || n_outputs != plan->n_outputs || (n_inputs && !inputs) ||
      (n_outputs && !outputs))
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "execute got %u inputs and %u outputs (arrays %.8s and %.8s) but the program "
                     "has %u and %u; pass one view per binding",
                     (unsigned)n_inputs, (unsigned)n_outputs, inputs ? "given" : "NULL",
                     outputs ? "given" : "NULL", (unsigned)plan->n_inputs,
                     (unsigned)plan->n_outputs);
  if (plan->n_symbols) {
    static const kiln_op_site call_site = {"plan", 0, KILN_ERR_INVALID_PROGRAM,
                                           "; re-export the program"};
    const char *names[KILN_MAX_BINDINGS];
    kiln_status s;
    for (uint32_t i = 0; i < e->metadata.n_bindings; i++)
      if (e->metadata.bindings[i].kind == KILN_IO_INPUT) names[n[0]++] = e->metadata.bindings[i].name;
    n[0] = 0;
    if ((s = kiln_plan_bind_symbols(&e->plan, names, inputs, e->sym_values, err))) return s;
    if (!e->shaped_valid ||
        memcmp(e->shaped_values, e->sym_values, sizeof *e->sym_values * plan->n_symbols) != 0) {
      e->shaped_valid = 0; /* a refusal below leaves the shapes half written */
      if ((s = kiln_plan_shapes_at(&e->plan, e->sym_values, 1, &call_site, e->shaped.tensors,
                                   e->shaped.ops, err)))
        return s;
      memcpy(e->shaped_values, e->sym_values, sizeof *e->sym_values * plan->n_symbols);
      e->shaped_valid = 1;
    }
  }
  for (uint32_t i = 0; i < e->metadata.n_bindings; i++) {
    const kiln_binding *b = &e->metadata.bindings[i];
    uint32_t k = n[b->kind]++;
    int in = b->kind == KILN_IO_INPUT;
    kiln_status s = check_view(b, k, &plan->tensors[in ? plan->inputs[k] : plan->outputs[k]],
                               in ? &inputs[k] : &outputs[k], err);
    if (s) return s;
  }
  return check_disjoint(e, inputs, outputs, err);
}

kiln_status kiln_engine_execute(kiln_engine *e, const kiln_tensor_view *inputs, uint32_t n_inputs,
                                const kiln_tensor_view *outputs, uint32_t n_outputs,
                                kiln_error *err) {
  kiln_status s;
  if (!e)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "execute got a NULL engine; pass one from kiln_engine_load");
  if (pthread_mutex_lock(&e->lock) != 0)
    return kiln_fail(err, KILN_ERR_INTERNAL,
                     "execute could not take the engine's lock; the handle may be destroyed");
  s = check_views(e, inputs, n_inputs, outputs, n_outputs, err);
  if (s == KILN_OK) s = e->backend->execute(e, inputs, outputs, err);
  pthread_mutex_unlock(&e->lock);
  return s;
}

kiln_status kiln_engine_reset_state(kiln_engine *e, kiln_error *err) {
  kiln_status s;
  if (!e)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "reset_state got a NULL engine; pass one from kiln_engine_load");
  if (pthread_mutex_lock(&e->lock) != 0)
    return kiln_fail(err, KILN_ERR_INTERNAL,
                     "reset_state could not take the engine's lock; the handle may be destroyed");
  s = e->backend->reset_state(e, err);
  pthread_mutex_unlock(&e->lock);
  return s;
}

void kiln_engine_destroy(kiln_engine *e) {
  if (!e) return;
  e->backend->destroy(e);
  release_engine(e, 1);
}

const kiln_metadata *kiln_engine_metadata(const kiln_engine *e) { return e ? &e->metadata : NULL; }

const kiln_plan *kiln_engine_plan(const kiln_engine *e) { return e ? &e->plan : NULL; }

kiln_status kiln_engine_output_shape(const kiln_engine *e, uint32_t k, int32_t *rank,
                                     int64_t *dims, kiln_error *err) {
  const kiln_tensor_desc *t;
  if (!e || !rank || !dims || k >= e->plan.n_outputs)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "output_shape got a NULL engine, rank or dims, or output %u of the program's "
                     "%u; pass an output index and room for 8 dims",
                     (unsigned)k, e ? (unsigned)e->plan.n_outputs : 0u);
  t = &e->current->tensors[e->current->outputs[k]];
  *rank = t->rank;
  for (int32_t d = 0; d < t->rank; d++) dims[d] = t->dims[d];
  return KILN_OK;
}

const char *kiln_engine_device_name(const kiln_engine *e) { return e ? e->device_name : ""; }
