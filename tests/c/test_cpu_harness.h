/* Builds small plans by hand and runs them on the CPU backend directly, without the builder
 * or the plan parser; plus the value checks the CPU engine tests share. */
#ifndef KILN_TEST_CPU_HARNESS_H
#define KILN_TEST_CPU_HARNESS_H

#include "check.h"
#include "runtime/engine_internal.h"
#include "cpu/half.h"

#include <math.h>
#include <stdlib.h>

#define G_MAX_TENSORS 40
#define G_MAX_OPS 32
#define G_MAX_WORDS 256
#define G_MAX_IO 8
#define G_WEIGHT_BYTES 4096

typedef struct graph {
  kiln_tensor_desc tensors[G_MAX_TENSORS];
  kiln_op ops[G_MAX_OPS];
  uint32_t inputs[G_MAX_IO], outputs[G_MAX_IO];
  uint32_t n_tensors, n_ops, n_inputs, n_outputs;
  uint64_t arena_size;
  _Alignas(64) uint8_t weights[G_WEIGHT_BYTES];
  uint64_t weights_size;
  kiln_alias aliases[2];
  uint32_t n_aliases;
  int64_t words[G_MAX_WORDS]; /* FUSED programs */
  uint32_t n_words;
  uint32_t n_states;
} graph;

static inline graph *g_new(void) {
  graph *g = calloc(1, sizeof *g);
  if (!g) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return g;
}

/* Adds a tensor; INPUT/OUTPUT take the next binding index, ARENA the next 64-byte slot. */
static inline uint32_t g_tensor(graph *g, kiln_storage st, kiln_dtype dt, int32_t rank,
                                const int64_t *dims) {
  kiln_tensor_desc *t = &g->tensors[g->n_tensors];
  uint64_t n = 1;
  memset(t, 0, sizeof *t);
  t->dtype = dt;
  t->rank = rank;
  for (int32_t d = 0; d < rank; d++) {
    t->dims[d] = dims[d];
    n *= (uint64_t)dims[d];
  }
  t->nbytes = n * kiln_dtype_size(dt);
  t->storage = st;
  if (st == KILN_STORE_INPUT) {
    t->io_index = g->n_inputs;
    g->inputs[g->n_inputs++] = g->n_tensors;
  } else if (st == KILN_STORE_OUTPUT) {
    t->io_index = g->n_outputs;
    g->outputs[g->n_outputs++] = g->n_tensors;
  } else if (st == KILN_STORE_ARENA) {
    t->offset = g->arena_size;
    g->arena_size += (t->nbytes + 63) & ~(uint64_t)63;
  }
  return g->n_tensors++;
}

/* A WEIGHT tensor holding a copy of data. */
static inline uint32_t g_weight(graph *g, kiln_dtype dt, int32_t rank, const int64_t *dims,
                                const void *data) {
  uint32_t id = g_tensor(g, KILN_STORE_WEIGHT, dt, rank, dims);
  kiln_tensor_desc *t = &g->tensors[id];
  t->offset = g->weights_size;
  memcpy(g->weights + t->offset, data, (size_t)t->nbytes);
  g->weights_size += (t->nbytes + 63) & ~(uint64_t)63;
  return id;
}

/* A state's start-of-run record, its initial value a copy of data in the weights. */
static inline uint32_t g_state(graph *g, kiln_dtype dt, int32_t rank, const int64_t *dims,
                               const void *data) {
  uint32_t id = g_weight(g, dt, rank, dims, data);
  g->tensors[id].storage = KILN_STORE_STATE;
  g->tensors[id].io_index = g->n_states++;
  return id;
}

/* The record of state `base` that an op writes. */
static inline uint32_t g_state_written(graph *g, uint32_t base) {
  g->tensors[g->n_tensors] = g->tensors[base];
  return g->n_tensors++;
}

static inline kiln_op *g_op(graph *g, kiln_op_kind kind, uint32_t n_in, const uint32_t *in,
                            uint32_t out, uint32_t n_iattr, const int64_t *iattr, double f0) {
  kiln_op *op = &g->ops[g->n_ops++];
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

/* A FUSED op over rank-`rank` output `out` with maps (2 + 3 * rank words each) and
 * instructions (two words each) as kiln.h lays them out. */
static inline kiln_op *g_fused(graph *g, uint32_t n_in, const uint32_t *in, uint32_t out,
                               int32_t rank, uint32_t n_maps, const int64_t *maps,
                               uint32_t n_instrs, const int64_t *instrs) {
  uint32_t at = g->n_words, map_words = n_maps * (2u + 3u * (uint32_t)rank);
  g->words[g->n_words++] = n_maps;
  g->words[g->n_words++] = n_instrs;
  memcpy(g->words + g->n_words, maps, map_words * sizeof *maps);
  g->n_words += map_words;
  memcpy(g->words + g->n_words, instrs, 2u * n_instrs * sizeof *instrs);
  g->n_words += 2u * n_instrs;
  return g_op(g, KILN_OP_FUSED, n_in, in, out, 2,
              (const int64_t[]){at, (int64_t)(g->n_words - at)}, 0);
}

static inline kiln_engine *g_engine(graph *g) {
  kiln_engine *e = calloc(1, sizeof *e);
  if (!e) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  kiln_plan *p = &e->plan;
  p->version = KILN_PLAN_VERSION;
  p->n_tensors = g->n_tensors;
  p->n_ops = g->n_ops;
  p->n_inputs = g->n_inputs;
  p->n_outputs = g->n_outputs;
  p->arena_size = g->arena_size;
  p->tensors = g->tensors;
  p->ops = g->ops;
  p->inputs = g->inputs;
  p->outputs = g->outputs;
  p->n_words = g->n_words;
  p->words = g->words;
  p->n_states = g->n_states;
  e->weights = g->weights_size ? g->weights : NULL;
  e->weights_size = g->weights_size;
  e->metadata.n_aliases = g->n_aliases;
  memcpy(e->metadata.aliases, g->aliases, sizeof g->aliases);
  return e;
}

static inline void g_view(const kiln_tensor_desc *t, void *data, kiln_tensor_view *v) {
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

/* Executes an engine already through init on the given buffers, in binding order. */
static inline kiln_status g_execute(kiln_engine *e, const graph *g, void *const *in,
                                    void *const *out, kiln_error *err) {
  kiln_tensor_view iv[G_MAX_IO], ov[G_MAX_IO];
  for (uint32_t i = 0; i < g->n_inputs; i++) g_view(&g->tensors[g->inputs[i]], in[i], &iv[i]);
  for (uint32_t i = 0; i < g->n_outputs; i++) g_view(&g->tensors[g->outputs[i]], out[i], &ov[i]);
  return kiln_cpu_backend.execute(e, iv, ov, err);
}

/* init, execute once, destroy. */
static inline kiln_status g_run(graph *g, void *const *in, void *const *out, kiln_error *err) {
  kiln_engine *e = g_engine(g);
  kiln_status st = kiln_cpu_backend.init(e, err);
  if (st == KILN_OK) {
    st = g_execute(e, g, in, out, err);
    kiln_cpu_backend.destroy(e);
  }
  free(e);
  return st;
}

/* ---------------------------------------------------------------- value checks */

/* Within tol of want, relative to max(1, |want|); NaN matches NaN, infinities match exactly. */
static inline int close_to(double got, double want, double tol) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return got == want;
  return fabs(got - want) <= tol * fmax(1.0, fabs(want));
}

/* Reads element i of a float buffer of dtype dt as a double. */
static inline double value_at(const void *p, kiln_dtype dt, int64_t i) {
  switch (dt) {
  case KILN_F16: return kiln_f16_to_f32(((const uint16_t *)p)[i]);
  case KILN_BF16: return kiln_bf16_to_f32(((const uint16_t *)p)[i]);
  default: return ((const float *)p)[i];
  }
}

static inline void fill_value(void *p, kiln_dtype dt, int64_t i, double v) {
  switch (dt) {
  case KILN_F16: ((uint16_t *)p)[i] = kiln_f32_to_f16((float)v); break;
  case KILN_BF16: ((uint16_t *)p)[i] = kiln_f32_to_bf16((float)v); break;
  case KILN_I64: ((int64_t *)p)[i] = (int64_t)llround(v); break;
  case KILN_I32: ((int32_t *)p)[i] = (int32_t)lround(v); break;
  case KILN_BOOL: ((uint8_t *)p)[i] = v > 0.0; break;
  default: ((float *)p)[i] = (float)v; break;
  }
}

/* The stated tolerance of each float dtype against a double reference. */
static inline double dtype_tol(kiln_dtype dt) {
  return dt == KILN_F16 ? 1e-3 : dt == KILN_BF16 ? 1e-2 : 1e-5;
}

/* One CHECK for a whole buffer; prints the first element out of tolerance. */
#define CHECK_VALUES(what, got, dt, want, n) check_values_at(__LINE__, what, got, dt, want, n)

static inline void check_values_at(int line, const char *what, const void *got, kiln_dtype dt,
                                   const double *want, int64_t n) {
  double tol = dtype_tol(dt);
  for (int64_t i = 0; i < n; i++) {
    double v = value_at(got, dt, i);
    if (!close_to(v, want[i], tol)) {
      check_failed++;
      fprintf(stderr, "line %d: %s: element %lld is %.9g, want %.9g (%s tolerance %g)\n", line,
              what, (long long)i, v, want[i], kiln_dtype_name(dt), tol);
      return;
    }
  }
  check_passed++;
}

/* Deterministic values in [-1, 1) from a fixed seed. */
static inline double next_random(uint32_t *state) {
  *state = *state * 1664525u + 1013904223u;
  return (double)(*state >> 8) / 8388608.0 - 1.0;
}

static inline void fill_random(void *p, kiln_dtype dt, int64_t n, uint32_t seed, double scale) {
  for (int64_t i = 0; i < n; i++) fill_value(p, dt, i, scale * next_random(&seed));
}

#endif
