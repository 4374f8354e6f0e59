/* Hand-built plans run on both backends directly: the CPU reference engine is the oracle,
 * the CUDA engine is compared with it on random data, staged and bound. The helpers are inline:
 * a program that uses a few of them compiles without unused-function warnings. */
#ifndef KILN_TEST_GPU_HARNESS_H
#define KILN_TEST_GPU_HARNESS_H

#include "check.h"
#include "runtime/engine_internal.h"
#include "cpu/half.h"
#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define P_MAX_TENSORS 32
#define P_MAX_OPS 12
#define P_MAX_IO 12

typedef struct prog {
  kiln_tensor_desc tensors[P_MAX_TENSORS];
  kiln_op ops[P_MAX_OPS];
  uint32_t inputs[P_MAX_IO], outputs[P_MAX_IO];
  uint32_t n_tensors, n_ops, n_inputs, n_outputs;
  uint64_t arena_size;
  uint8_t *weights;
  uint64_t weights_size;
  int allow_tf32;
  kiln_alias aliases[2];
  uint32_t n_aliases;
  int64_t words[256]; /* FUSED programs */
  uint32_t n_words;
  uint32_t n_states;
} prog;

static uint32_t rng_state = 12345u;
static inline double rnd(void) { /* uniform in [-1, 1) */
  rng_state = rng_state * 1664525u + 1013904223u;
  return (double)(rng_state >> 8) / (double)(1u << 23) - 1.0;
}

static inline void die(const char *what) {
  fprintf(stderr, "fatal: %s\n", what);
  exit(2);
}

static prog *p_new(void) {
  prog *p = calloc(1, sizeof *p);
  if (!p) die("out of memory");
  return p;
}

static inline void p_free(prog *p) {
  free(p->weights);
  free(p);
}

static inline uint64_t p_count(const kiln_tensor_desc *t) {
  uint64_t n = 1;
  for (int d = 0; d < t->rank; d++) n *= (uint64_t)t->dims[d];
  return n;
}

static inline uint32_t p_tensor(prog *p, kiln_storage st, kiln_dtype dt, int32_t rank, const int64_t *dims) {
  kiln_tensor_desc *t = &p->tensors[p->n_tensors];
  memset(t, 0, sizeof *t);
  t->dtype = dt;
  t->rank = rank;
  for (int d = 0; d < rank; d++) t->dims[d] = dims[d];
  t->nbytes = p_count(t) * kiln_dtype_size(dt);
  t->storage = st;
  if (st == KILN_STORE_INPUT) {
    t->io_index = p->n_inputs;
    p->inputs[p->n_inputs++] = p->n_tensors;
  } else if (st == KILN_STORE_OUTPUT) {
    t->io_index = p->n_outputs;
    p->outputs[p->n_outputs++] = p->n_tensors;
  } else if (st == KILN_STORE_ARENA) {
    t->offset = p->arena_size;
    p->arena_size += (t->nbytes + 255) & ~(uint64_t)255;
  }
  return p->n_tensors++;
}

/* Stores element i of a random value v in dtype dt (floats as given, integers rounded). */
static inline void put_value(void *buf, kiln_dtype dt, uint64_t i, double v) {
  switch (dt) {
  case KILN_F32: ((float *)buf)[i] = (float)v; break;
  case KILN_F16: ((uint16_t *)buf)[i] = kiln_f32_to_f16((float)v); break;
  case KILN_BF16: ((uint16_t *)buf)[i] = kiln_f32_to_bf16((float)v); break;
  case KILN_I64: ((int64_t *)buf)[i] = (int64_t)llround(v); break;
  case KILN_I32: ((int32_t *)buf)[i] = (int32_t)lround(v); break;
  default: ((uint8_t *)buf)[i] = v > 0; break;
  }
}

static inline double get_value(const void *buf, kiln_dtype dt, uint64_t i) {
  switch (dt) {
  case KILN_F32: return ((const float *)buf)[i];
  case KILN_F16: return kiln_f16_to_f32(((const uint16_t *)buf)[i]);
  case KILN_BF16: return kiln_bf16_to_f32(((const uint16_t *)buf)[i]);
  case KILN_I64: return (double)((const int64_t *)buf)[i];
  case KILN_I32: return ((const int32_t *)buf)[i];
  default: return ((const uint8_t *)buf)[i];
  }
}

/* Random values in [lo, hi): floats uniform, integers rounded. */
static inline void fill(void *buf, kiln_dtype dt, uint64_t n, double lo, double hi) {
  for (uint64_t i = 0; i < n; i++) put_value(buf, dt, i, lo + (hi - lo) * (rnd() + 1.0) / 2.0);
}

static inline uint32_t p_weight(prog *p, kiln_dtype dt, int32_t rank, const int64_t *dims, double lo,
                         double hi) {
  uint32_t id = p_tensor(p, KILN_STORE_WEIGHT, dt, rank, dims);
  kiln_tensor_desc *t = &p->tensors[id];
  t->offset = p->weights_size;
  uint64_t size = (t->offset + t->nbytes + 63) & ~(uint64_t)63;
  uint8_t *w = realloc(p->weights, size ? size : 1);
  if (!w) die("out of memory");
  p->weights = w;
  fill(w + t->offset, dt, p_count(t), lo, hi);
  p->weights_size = size;
  return id;
}

/* A state's start-of-run record with a random initial value in the weights, and the record an
 * op writes. */
static inline uint32_t p_state(prog *p, kiln_dtype dt, int32_t rank, const int64_t *dims) {
  uint32_t id = p_weight(p, dt, rank, dims, -1, 1);
  p->tensors[id].storage = KILN_STORE_STATE;
  p->tensors[id].io_index = p->n_states++;
  return id;
}

static inline uint32_t p_state_written(prog *p, uint32_t base) {
  p->tensors[p->n_tensors] = p->tensors[base];
  return p->n_tensors++;
}

static kiln_op *p_op(prog *p, kiln_op_kind kind, uint32_t n_in, const uint32_t *in, uint32_t out,
                     uint32_t n_iattr, const int64_t *iattr, double f0) {
  kiln_op *op = &p->ops[p->n_ops++];
  memset(op, 0, sizeof *op);
  op->kind = kind;
  op->n_inputs = n_in;
  memcpy(op->inputs, in, n_in * sizeof *in);
  op->output = out;
  op->n_iattr = n_iattr;
  if (n_iattr) memcpy(op->iattr, iattr, n_iattr * sizeof *iattr);
  op->fattr[0] = f0;
  return op;
}

/* A FUSED op over a rank-`rank` output with maps and instructions laid out as in kiln.h. */
static inline kiln_op *p_fused(prog *p, uint32_t n_in, const uint32_t *in, uint32_t out, int32_t rank,
                        uint32_t n_maps, const int64_t *maps, uint32_t n_instrs,
                        const int64_t *instrs) {
  uint32_t at = p->n_words, map_words = n_maps * (2u + 3u * (uint32_t)rank);
  p->words[p->n_words++] = n_maps;
  p->words[p->n_words++] = n_instrs;
  memcpy(p->words + p->n_words, maps, map_words * sizeof *maps);
  p->n_words += map_words;
  memcpy(p->words + p->n_words, instrs, 2u * n_instrs * sizeof *instrs);
  p->n_words += 2u * n_instrs;
  return p_op(p, KILN_OP_FUSED, n_in, in, out, 2, (const int64_t[]){at, (int64_t)(p->n_words - at)}, 0);
}

/* A plan viewing p's arrays (no copy, no weights): for calling an op's setup directly. */
static inline void p_plan(const prog *p, kiln_plan *pl) {
  memset(pl, 0, sizeof *pl);
  pl->version = KILN_PLAN_VERSION;
  pl->n_tensors = p->n_tensors;
  pl->n_ops = p->n_ops;
  pl->n_inputs = p->n_inputs;
  pl->n_outputs = p->n_outputs;
  pl->tensors = (kiln_tensor_desc *)p->tensors;
  pl->ops = (kiln_op *)p->ops;
  pl->inputs = (uint32_t *)p->inputs;
  pl->outputs = (uint32_t *)p->outputs;
}

/* An engine through backend init, with its own aligned copy of the weights (the CUDA engine
 * frees the host copy once uploaded). NULL with err set on failure. */
static kiln_engine *p_load(const prog *p, const kiln_backend *be, int device, kiln_error *err) {
  kiln_engine *e = calloc(1, sizeof *e);
  if (!e) die("out of memory");
  kiln_plan *pl = &e->plan;
  pl->version = KILN_PLAN_VERSION;
  pl->n_tensors = p->n_tensors;
  pl->n_ops = p->n_ops;
  pl->n_inputs = p->n_inputs;
  pl->n_outputs = p->n_outputs;
  pl->arena_size = p->arena_size;
  pl->tensors = (kiln_tensor_desc *)p->tensors;
  pl->ops = (kiln_op *)p->ops;
  pl->inputs = (uint32_t *)p->inputs;
  pl->outputs = (uint32_t *)p->outputs;
  pl->n_words = p->n_words;
  pl->words = (int64_t *)p->words;
  pl->n_states = p->n_states;
  if (p->weights_size) {
    e->weights = aligned_alloc(KILN_WEIGHTS_ALIGN, (p->weights_size + 63) & ~(uint64_t)63);
    if (!e->weights) die("out of memory");
    memcpy(e->weights, p->weights, p->weights_size);
  }
  e->weights_size = p->weights_size;
  e->device_id = device;
  e->backend = be;
  kiln_metadata *md = &e->metadata;
  md->device_id = device;
  md->allow_tf32 = p->allow_tf32;
  md->n_aliases = p->n_aliases;
  memcpy(md->aliases, p->aliases, sizeof p->aliases);
  for (uint32_t i = 0; i < p->n_inputs; i++) {
    kiln_binding *b = &md->bindings[md->n_bindings++];
    snprintf(b->name, sizeof b->name, "in%u", i);
    b->kind = KILN_IO_INPUT;
  }
  for (uint32_t i = 0; i < p->n_outputs; i++) {
    kiln_binding *b = &md->bindings[md->n_bindings++];
    snprintf(b->name, sizeof b->name, "out%u", i);
    b->kind = KILN_IO_OUTPUT;
  }
  if (be->init(e, err) != KILN_OK) {
    free(e->weights);
    free(e);
    return NULL;
  }
  return e;
}

static inline void p_unload(kiln_engine *e) {
  if (!e) return;
  e->backend->destroy(e);
  free(e->weights);
  free(e);
}

static inline void p_view(const kiln_tensor_desc *t, void *data, kiln_tensor_view *v) {
  memset(v, 0, sizeof *v);
  v->data = data;
  v->nbytes = (size_t)t->nbytes;
  v->dtype = t->dtype;
  v->rank = t->rank;
  int64_t stride = 1;
  for (int32_t d = t->rank - 1; d >= 0; d--) {
    v->sizes[d] = t->dims[d];
    v->strides[d] = stride;
    stride *= t->dims[d];
  }
}

static inline kiln_status p_execute(kiln_engine *e, const prog *p, void *const *in, void *const *out,
                             kiln_error *err) {
  kiln_tensor_view iv[P_MAX_IO], ov[P_MAX_IO];
  for (uint32_t i = 0; i < p->n_inputs; i++) p_view(&p->tensors[p->inputs[i]], in[i], &iv[i]);
  for (uint32_t i = 0; i < p->n_outputs; i++) p_view(&p->tensors[p->outputs[i]], out[i], &ov[i]);
  return e->backend->execute(e, iv, ov, err);
}

static inline double dtype_tolerance(kiln_dtype dt) {
  return dt == KILN_F16 ? 1e-2 : dt == KILN_BF16 ? 2e-2 : dt == KILN_F32 ? 1e-4 : 0.0;
}

/* max|got - want| / max|want| (absolute when want is all zeros); NaN where they disagree on NaN. */
static inline double rel_error(const void *got, const void *want, kiln_dtype dt, uint64_t n) {
  double peak = 0.0, worst = 0.0;
  for (uint64_t i = 0; i < n; i++) peak = fmax(peak, fabs(get_value(want, dt, i)));
  for (uint64_t i = 0; i < n; i++) {
    double g = get_value(got, dt, i), w = get_value(want, dt, i);
    if (isnan(g) || isnan(w)) {
      if (isnan(g) != isnan(w)) return NAN;
      continue;
    }
    worst = fmax(worst, fabs(g - w));
  }
  return peak > 0.0 ? worst / peak : worst;
}

#endif
