/* The CPU reference engine: the oracle every GPU result is checked against. init allocates
 * the arena, the per-tensor pointer table and the ops' scratch; execute resolves pointers,
 * runs the ops in order and copies aliased outputs back into their inputs, allocating
 * nothing. */
#include "runtime/alloc.h"
#include "runtime/device.h"
#include "runtime/view.h"
#include "cpu/cpu_ops.h"

#include <stdlib.h>

#define ARENA_ALIGN 64u

typedef struct cpu_state {
  uint8_t *arena;
  uint8_t **state; /* n_states buffers kept across executes, outside the arena */
  void **data;     /* n_tensors pointers, filled by each execute */
  double *scratch; /* kiln_cpu_scratch_count doubles */
} cpu_state;

/* Stands in for the address of every zero-byte tensor, whose pointer may be NULL. */
static _Alignas(ARENA_ALIGN) uint8_t empty_tensor[ARENA_ALIGN];

static void cpu_destroy(kiln_engine *e) {
  cpu_state *s = e->impl;
  if (!s) return;
  free(s->arena);
  for (uint32_t k = 0; s->state && k < e->plan.n_states; k++) free(s->state[k]);
  free(s->state);
  free(s->data);
  free(s->scratch);
  free(s);
  e->impl = NULL;
}

/* The start-of-run record of each state: its size and where its initial value lies. */
static const kiln_tensor_desc *state_record(const kiln_plan *p, uint32_t k) {
  for (uint32_t t = 0; t < p->n_tensors; t++)
    if (p->tensors[t].storage == KILN_STORE_STATE && p->tensors[t].io_index == k)
      return &p->tensors[t];
  return NULL; /* the plan parser guarantees one per index */
}

static kiln_status cpu_reset_state(kiln_engine *e, kiln_error *err) {
  cpu_state *s = e->impl;
  (void)err;
  for (uint32_t k = 0; k < e->plan.n_states; k++) {
    const kiln_tensor_desc *t = state_record(&e->plan, k);
    if (t && t->nbytes) memcpy(s->state[k], e->weights + t->offset, (size_t)t->nbytes);
  }
  return KILN_OK;
}

static kiln_status alloc_state(kiln_engine *e, cpu_state *s, kiln_error *err) {
  const kiln_plan *p = &e->plan;
  if (p->n_states && !(s->state = kiln_calloc(p->n_states, sizeof *s->state)))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "CPU engine: out of host memory for %u state pointers; free memory",
                     (unsigned)p->n_states);
  for (uint32_t k = 0; k < p->n_states; k++) {
    const kiln_tensor_desc *t = state_record(p, k);
    if (!t || t->nbytes > SIZE_MAX ||
        !(s->state[k] = kiln_aligned_alloc(ARENA_ALIGN, t->nbytes ? (size_t)t->nbytes : 1)))
      return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                       "CPU engine: out of host memory for state %u of %llu bytes; free memory "
                       "or use a smaller cache",
                       (unsigned)k, (unsigned long long)(t ? t->nbytes : 0));
  }
  return cpu_reset_state(e, err);
}

static kiln_status cpu_init(kiln_engine *e, kiln_error *err) {
  const kiln_plan *p = &e->plan;
  e->impl = NULL;
  kiln_status st = kiln_cpu_check_plan(e, err);
  if (st != KILN_OK) return st;
  uint64_t scratch_count = kiln_cpu_scratch_count(p);
  if (p->arena_size > SIZE_MAX || scratch_count > SIZE_MAX / sizeof(double))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "CPU engine: arena of %llu bytes or scratch of %llu values exceeds the "
                     "address space; use a smaller program",
                     (unsigned long long)p->arena_size, (unsigned long long)scratch_count);
  cpu_state *s = kiln_calloc(1, sizeof *s);
  if (!s)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "CPU engine: out of host memory for its state");
  e->impl = s;
  if (p->arena_size > 0 && !(s->arena = kiln_aligned_alloc(ARENA_ALIGN, (size_t)p->arena_size))) {
    cpu_destroy(e);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "CPU engine: out of host memory for the arena of %llu bytes; free memory "
                     "or use a smaller program",
                     (unsigned long long)p->arena_size);
  }
  if ((p->n_tensors > 0 && !(s->data = kiln_calloc(p->n_tensors, sizeof(void *)))) ||
      (scratch_count > 0 && !(s->scratch = kiln_calloc((size_t)scratch_count, sizeof(double))))) {
    cpu_destroy(e);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "CPU engine: out of host memory for %llu tensor pointers and %llu scratch "
                     "values; free memory",
                     (unsigned long long)p->n_tensors, (unsigned long long)scratch_count);
  }
  if ((st = alloc_state(e, s, err)) != KILN_OK) cpu_destroy(e);
  return st;
}

static kiln_status resolve(kiln_engine *e, const kiln_tensor_view *inputs,
                           const kiln_tensor_view *outputs, kiln_error *err) {
  cpu_state *s = e->impl;
  for (uint32_t i = 0; i < kiln_engine_current(e)->n_tensors; i++) {
    const kiln_tensor_desc *t = &kiln_engine_current(e)->tensors[i];
    void *base = NULL;
    switch (t->storage) {
    case KILN_STORE_ARENA: base = s->arena; break;
    case KILN_STORE_WEIGHT: base = e->weights; break;
    case KILN_STORE_INPUT: base = inputs[t->io_index].data; break;
    case KILN_STORE_OUTPUT: base = outputs[t->io_index].data; break;
    case KILN_STORE_STATE: break; /* its offset is the initial value's, in the weights */
    }
    if (t->storage == KILN_STORE_STATE) {
      s->data[i] = t->nbytes ? (void *)s->state[t->io_index] : (void *)empty_tensor;
      continue;
    }
    if (t->nbytes == 0) {
      s->data[i] = empty_tensor;
    } else if (!base) {
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "tensor %u: %.6s %u has no data for its %llu bytes; pass a buffer",
                       (unsigned)i, t->storage == KILN_STORE_OUTPUT ? "output" : "input",
                       (unsigned)t->io_index, (unsigned long long)t->nbytes);
    } else {
      s->data[i] = (uint8_t *)base + t->offset;
    }
  }
  return KILN_OK;
}

/* 1 when op is a view whose output the memory plan placed on its input's bytes: nothing to
 * copy (and copying a range onto itself is no job for memcpy). */
static int holds_already(const kiln_cpu_run *r, const kiln_op *op) {
  uint64_t at;
  return kiln_op_is_view(op, kiln_cpu_desc(r, op->inputs[0]), &at) &&
         (const uint8_t *)r->data[op->output] == (const uint8_t *)r->data[op->inputs[0]] + at;
}

static kiln_status run_op(const kiln_cpu_run *r, uint32_t index, kiln_error *err) {
  const kiln_op *op = &r->plan->ops[index];
  switch (op->kind) {
  case KILN_OP_LINEAR: kiln_cpu_linear(r, op); break;
  case KILN_OP_MATMUL: kiln_cpu_matmul(r, op); break;
  case KILN_OP_ADD:
  case KILN_OP_SUB:
  case KILN_OP_MUL:
  case KILN_OP_DIV:
  case KILN_OP_MINIMUM:
  case KILN_OP_MAXIMUM: kiln_cpu_binary(r, op); break;
  case KILN_OP_COMPARE: kiln_cpu_compare(r, op); break;
  case KILN_OP_LOGICAL:
  case KILN_OP_BITWISE: kiln_cpu_bool_op(r, op); break;
  case KILN_OP_ABS:
  case KILN_OP_LOG:
  case KILN_OP_COS:
  case KILN_OP_SIN:
  case KILN_OP_ERF:
  case KILN_OP_HARDSWISH:
  case KILN_OP_HARDSIGMOID:
  case KILN_OP_RELU:
  case KILN_OP_GELU:
  case KILN_OP_SILU:
  case KILN_OP_SIGMOID:
  case KILN_OP_TANH:
  case KILN_OP_EXP:
  case KILN_OP_SQRT:
  case KILN_OP_RSQRT:
  case KILN_OP_NEG:
  case KILN_OP_POW: kiln_cpu_unary(r, op); break;
  case KILN_OP_CAST: kiln_cpu_cast(r, op); break;
  case KILN_OP_SOFTMAX:
  case KILN_OP_LOG_SOFTMAX: kiln_cpu_softmax(r, op); break;
  case KILN_OP_LAYER_NORM: kiln_cpu_layer_norm(r, op); break;
  case KILN_OP_RMS_NORM: kiln_cpu_rms_norm(r, op); break;
  case KILN_OP_SUM:
  case KILN_OP_MEAN:
  case KILN_OP_AMAX: kiln_cpu_reduce(r, op); break;
  case KILN_OP_RESHAPE:
  case KILN_OP_COPY: if (!holds_already(r, op)) kiln_cpu_copy(r, op); break;
  case KILN_OP_PERMUTE: kiln_cpu_permute(r, op); break;
  case KILN_OP_EXPAND: kiln_cpu_expand(r, op); break;
  case KILN_OP_CAT: kiln_cpu_cat(r, op); break;
  case KILN_OP_SLICE:
  case KILN_OP_SELECT: if (!holds_already(r, op)) kiln_cpu_slice(r, op); break;
  case KILN_OP_EMBEDDING: return kiln_cpu_embedding(r, index, op, err);
  case KILN_OP_INDEX_SELECT: return kiln_cpu_index_select(r, index, op, err);
  case KILN_OP_WHERE: kiln_cpu_where(r, op); break;
  case KILN_OP_SDPA: kiln_cpu_sdpa(r, op); break;
  case KILN_OP_POINTWISE: kiln_cpu_fused_pointwise(r, op); break;
  case KILN_OP_FUSED: kiln_cpu_fused(r, op); break;
  case KILN_OP_CONV: kiln_cpu_conv(r, op); break;
  case KILN_OP_CONV_TRANSPOSE: kiln_cpu_conv_transpose(r, op); break;
  case KILN_OP_BATCH_NORM: kiln_cpu_batch_norm(r, op); break;
  case KILN_OP_MAX_POOL2D: kiln_cpu_max_pool2d(r, op); break;
  case KILN_OP_AVG_POOL2D: kiln_cpu_avg_pool2d(r, op); break;
  case KILN_OP_ADAPTIVE_AVG_POOL2D: kiln_cpu_adaptive_avg_pool2d(r, op); break;
  case KILN_OP_UPSAMPLE_NEAREST2D: kiln_cpu_upsample_nearest2d(r, op); break;
  case KILN_OP_UPSAMPLE_BILINEAR2D: kiln_cpu_upsample_bilinear2d(r, op); break;
  case KILN_OP_CUMSUM: kiln_cpu_cumsum(r, op); break;
  case KILN_OP_GATHER: return kiln_cpu_gather(r, index, op, err);
  case KILN_OP_INDEX: return kiln_cpu_index(r, index, op, err);
  case KILN_OP_ARGMAX: kiln_cpu_argmax(r, op); break;
  case KILN_OP_INDEX_COPY: return kiln_cpu_index_copy(r, index, op, err);
  case KILN_OP_COUNT: break; /* refused at init */
  }
  return KILN_OK;
}

/* A device buffer (a CUDA tensor handed on by ExecuTorch) is refused, never read as host memory. */
static kiln_status check_host_buffers(const kiln_engine *e, const kiln_tensor_view *inputs,
                                      const kiln_tensor_view *outputs, kiln_error *err) {
  uint32_t n[2] = {0, 0};
  for (uint32_t b = 0; b < e->metadata.n_bindings; b++) {
    const kiln_binding *bd = &e->metadata.bindings[b];
    int in = bd->kind == KILN_IO_INPUT;
    const kiln_tensor_view *v = in ? &inputs[n[0]++] : &outputs[n[1]++];
    int device = v->nbytes ? kiln_buffer_device(v->data) : -1;
    if (device >= 0)
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "%.6s %.64s is memory of cuda:%d, which the CPU reference engine cannot "
                       "read; pass a host tensor, or load the program on CUDA",
                       in ? "input" : "output", bd->name, device);
  }
  return KILN_OK;
}

static kiln_status cpu_execute(kiln_engine *e, const kiln_tensor_view *inputs,
                               const kiln_tensor_view *outputs, kiln_error *err) {
  cpu_state *s = e->impl;
  kiln_status st = check_host_buffers(e, inputs, outputs, err);
  if (st == KILN_OK) st = resolve(e, inputs, outputs, err);
  /* this call's sizes: a dynamic plan's kernels read the dims the engine set for the call */
  const kiln_cpu_run run = {kiln_engine_current(e), s->data, s->scratch};
  for (uint32_t i = 0; st == KILN_OK && i < e->plan.n_ops; i++) st = run_op(&run, i, err);
  for (uint32_t i = 0; st == KILN_OK && i < e->metadata.n_aliases; i++) {
    const kiln_alias *a = &e->metadata.aliases[i];
    uint32_t from = e->plan.outputs[a->output], to = e->plan.inputs[a->input];
    if (s->data[from] != s->data[to])
      memmove(s->data[to], s->data[from], (size_t)kiln_engine_current(e)->tensors[from].nbytes);
  }
  return st;
}

const kiln_backend kiln_cpu_backend = {"cpu", cpu_init, cpu_execute, cpu_destroy,
                                       cpu_reset_state};
