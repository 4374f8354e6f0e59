/* libFuzzer target: arbitrary bytes as a blob; every blob the loader accepts runs on the CPU
 * engine, twice, with inputs shaped by its bindings, and must give the same outputs both times;
 * a dynamic plan then runs once more at symbol values within its bounds. The sanitizers see
 * every kernel on whatever plan the parser lets through. */
#include "kiln/kiln.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Plans beyond these run too long or too large for a fuzzing iteration; skipped, not run. */
#define MAX_BYTES (1u << 20) /* the arena, and the caller buffers together */
#define MAX_WORK (1ull << 24) /* output elements times the inner extent, summed over ops */

typedef struct io_buffers {
  kiln_tensor_view in[KILN_MAX_BINDINGS], out[KILN_MAX_BINDINGS];
  uint8_t *in_data[KILN_MAX_BINDINGS], *out_data[KILN_MAX_BINDINGS];
} io_buffers;

static io_buffers io; /* large: keep it off the stack */

static uint64_t next_random(uint64_t *state) {
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return *state;
}

static int64_t numel(const kiln_tensor_desc *t) {
  int64_t n = 1;
  for (int32_t d = 0; d < t->rank; d++) n *= t->dims[d];
  return n;
}

/* 1 when the plan is small enough to run: bytes and a rough count of multiply-adds. */
static int small_enough(const kiln_plan *p) {
  uint64_t io_bytes = 0, work = 0;
  for (uint32_t i = 0; i < p->n_inputs + p->n_outputs; i++) {
    uint32_t t = i < p->n_inputs ? p->inputs[i] : p->outputs[i - p->n_inputs];
    io_bytes += p->tensors[t].nbytes;
  }
  if (p->arena_size > MAX_BYTES || io_bytes > MAX_BYTES) return 0;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    const kiln_op *op = &p->ops[i];
    uint64_t inner = 1;
    for (uint32_t k = 0; k < op->n_inputs; k++) {
      const kiln_tensor_desc *t = &p->tensors[op->inputs[k]];
      for (int32_t d = 0; d < t->rank; d++)
        if ((uint64_t)t->dims[d] > inner) inner = (uint64_t)t->dims[d];
    }
    work += (uint64_t)numel(&p->tensors[op->output]) * inner;
    if (work > MAX_WORK) return 0;
  }
  return 1;
}

/* Values a model's inputs hold: small integers (valid indices, mostly), floats of either sign
 * with the occasional zero, infinity or NaN, and booleans of 0 and 1. */
static void fill(uint8_t *dst, const kiln_tensor_desc *t, uint64_t seed) {
  uint64_t state = seed | 1u;
  int64_t n = numel(t);
  for (int64_t i = 0; i < n; i++) {
    uint64_t r = next_random(&state);
    float f = (float)((int64_t)(r % 4001) - 2000) / 256.0f;
    if (r % 97 == 0) f = (r >> 8) % 2 ? 1.0f / 0.0f : 0.0f / 0.0f;
    int64_t v = (int64_t)(r % 9) - 1;
    switch (t->dtype) {
    case KILN_F32: memcpy(dst + 4 * i, &f, 4); break;
    case KILN_F16:
    case KILN_BF16: { /* the top half of an f32 is a bf16; any 16 bits are some f16 */
      uint32_t bits;
      memcpy(&bits, &f, 4);
      uint16_t h = t->dtype == KILN_BF16 ? (uint16_t)(bits >> 16) : (uint16_t)(r >> 16);
      memcpy(dst + 2 * i, &h, 2);
      break;
    }
    case KILN_I32: { int32_t w = (int32_t)v; memcpy(dst + 4 * i, &w, 4); break; }
    case KILN_I64: memcpy(dst + 8 * i, &v, 8); break;
    case KILN_BOOL: dst[i] = (uint8_t)(r & 1); break;
    default: memset(dst + kiln_dtype_size(t->dtype) * (size_t)i, (int)(r & 0xFF),
                    kiln_dtype_size(t->dtype)); break;
    }
  }
}

static kiln_tensor_view view_of(const kiln_tensor_desc *t, uint8_t *data) {
  kiln_tensor_view v;
  int64_t stride = 1;
  memset(&v, 0, sizeof v);
  v.data = data;
  v.nbytes = (size_t)t->nbytes;
  v.dtype = t->dtype;
  v.rank = t->rank;
  for (int32_t d = t->rank; d-- > 0;) {
    v.sizes[d] = t->dims[d];
    v.strides[d] = stride;
    stride *= t->dims[d];
  }
  return v;
}

/* Runs e once on inputs from seed; 1 when execute returned KILN_OK. Every failure has a
 * message: a silent refusal traps. */
static int run_once(kiln_engine *e, const kiln_plan *p, uint64_t seed) {
  kiln_error err = {KILN_OK, ""};
  for (uint32_t k = 0; k < p->n_inputs; k++)
    fill(io.in_data[k], &p->tensors[p->inputs[k]], seed + k);
  for (uint32_t k = 0; k < p->n_outputs; k++)
    memset(io.out_data[k], 0xA5, (size_t)p->tensors[p->outputs[k]].nbytes);
  kiln_status s = kiln_engine_execute(e, io.in, p->n_inputs, io.out, p->n_outputs, &err);
  if (s != KILN_OK && err.message[0] == '\0') __builtin_trap();
  return s == KILN_OK;
}

/* A dynamic plan's run at symbol values from seed within their bounds, outputs given at their
 * bounds: the front end checks this call's shapes (every FUSED program's addresses among them)
 * before anything runs, so it runs or is refused with a message, never reading out of bounds. */
static void run_at_other_sizes(kiln_engine *e, const kiln_plan *p, uint64_t seed) {
  int64_t values[KILN_MAX_SYMBOLS];
  kiln_tensor_view in[KILN_MAX_BINDINGS];
  kiln_error err = {KILN_OK, ""};
  uint64_t state = seed | 1u;
  if (!p->n_symbols) return;
  for (uint32_t k = 0; k < p->n_symbols; k++) {
    uint64_t span = (uint64_t)(p->symbols[k].max - p->symbols[k].min) + 1;
    values[k] = p->symbols[k].min + (int64_t)(next_random(&state) % span);
  }
  for (uint32_t k = 0; k < p->n_inputs; k++) {
    const kiln_tensor_desc *t = &p->tensors[p->inputs[k]];
    int64_t stride = 1;
    in[k] = io.in[k];
    for (int32_t d = t->rank; d-- > 0;) {
      const kiln_sym_size *s = &t->sym[d];
      in[k].sizes[d] = s->symbol ? s->coeff * values[s->symbol - 1] + s->offset : t->dims[d];
      in[k].strides[d] = stride;
      stride *= in[k].sizes[d];
    }
    in[k].nbytes = (size_t)stride * kiln_dtype_size(t->dtype);
  }
  if (kiln_engine_execute(e, in, p->n_inputs, io.out, p->n_outputs, &err) != KILN_OK &&
      err.message[0] == '\0')
    __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kiln_blob_view blob;
  kiln_plan probe;
  kiln_engine_options opts;
  kiln_engine *e = NULL;
  uint64_t seed = 1469598103934665603ull;
  if (kiln_blob_parse(data, size, &blob, NULL) != KILN_OK ||
      kiln_plan_parse(blob.plan, blob.plan_size, blob.weights_size, &probe, NULL) != KILN_OK)
    return 0;
  int fits = small_enough(&probe);
  kiln_plan_release(&probe);
  if (!fits) return 0;
  kiln_engine_options_default(&opts);
  opts.device = KILN_DEVICE_CPU;
  if (kiln_engine_load(data, size, &opts, &e, NULL) != KILN_OK) return 0;
  const kiln_plan *p = kiln_engine_plan(e);
  int ok = 1;
  for (size_t i = 0; i < size; i++) seed = (seed ^ data[i]) * 1099511628211ull;
  for (uint32_t k = 0; k < p->n_inputs + p->n_outputs; k++) {
    int in = k < p->n_inputs;
    uint32_t j = in ? k : k - p->n_inputs;
    const kiln_tensor_desc *t = &p->tensors[in ? p->inputs[j] : p->outputs[j]];
    uint8_t *buf = malloc(t->nbytes ? (size_t)t->nbytes : 1);
    if (!buf) ok = 0;
    (in ? io.in_data : io.out_data)[j] = buf;
    (in ? io.in : io.out)[j] = view_of(t, buf);
  }
  if (ok && run_once(e, p, seed)) {
    /* A second run on the same inputs: no state may leak from the first into the outputs. */
    uint8_t *first[KILN_MAX_BINDINGS];
    for (uint32_t k = 0; k < p->n_outputs; k++) {
      size_t n = (size_t)p->tensors[p->outputs[k]].nbytes;
      first[k] = malloc(n ? n : 1);
      if (first[k]) memcpy(first[k], io.out_data[k], n);
    }
    if (!run_once(e, p, seed)) __builtin_trap();
    for (uint32_t k = 0; k < p->n_outputs; k++) {
      if (first[k] &&
          memcmp(first[k], io.out_data[k], (size_t)p->tensors[p->outputs[k]].nbytes) != 0)
        __builtin_trap();
      free(first[k]);
    }
    run_at_other_sizes(e, p, seed);
  }
  for (uint32_t k = 0; k < p->n_inputs; k++) free(io.in_data[k]);
  for (uint32_t k = 0; k < p->n_outputs; k++) free(io.out_data[k]);
  kiln_engine_destroy(e);
  return 0;
}
