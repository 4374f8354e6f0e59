/* Init-time checks of what the CPU kernels rely on beyond the engine's shape validation:
 * storage bounds, input counts, dtypes and the attributes used as indices. After them,
 * execute can fail only on data. Also sizes the scratch the ops share. */
#include "runtime/fused_program.h"
#include "runtime/index_layout.h"
#include "runtime/internal.h"
#include "runtime/linear_inputs.h"
#include "runtime/pointwise_steps.h"
#include "runtime/sdpa_layout.h"
#include "runtime/vision_shape.h"
#include "cpu/cpu_ops.h"

typedef enum out_class {
  OUT_ANY,   /* any dtype; integer outputs compute in integers */
  OUT_FLOAT, /* f32, f16 or bf16 */
  OUT_SAME   /* a layout op: the data input's dtype, bytes moved unchanged */
} out_class;

static const char *const storage_names[5] = {"arena", "weights", "input", "output", "state"};

/* 1 when dtype, rank, dims and storage are valid and the dims make exactly t->nbytes. */
static int desc_ok(const kiln_tensor_desc *t) {
  uint64_t bytes = kiln_dtype_size(t->dtype);
  if (bytes == 0 || t->rank < 0 || t->rank > KILN_MAX_RANK || (unsigned)t->storage > 4u) return 0;
  for (int32_t d = 0; d < t->rank; d++)
    if (t->dims[d] < 0 || kiln_mul_u64(bytes, (uint64_t)t->dims[d], &bytes) != 0) return 0;
  return bytes == t->nbytes;
}

static kiln_status check_tensors(const kiln_engine *e, kiln_error *err) {
  const kiln_plan *p = &e->plan;
  for (uint32_t i = 0; i < p->n_tensors; i++) {
    const kiln_tensor_desc *t = &p->tensors[i];
    if (!desc_ok(t))
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan tensor %u: dtype %d, rank %d, storage %d or dims do not make its "
                       "%llu bytes; re-export the program",
                       (unsigned)i, (int)t->dtype, (int)t->rank, (int)t->storage,
                       (unsigned long long)t->nbytes);
    uint32_t bindings = t->storage == KILN_STORE_INPUT    ? p->n_inputs
                        : t->storage == KILN_STORE_OUTPUT ? p->n_outputs
                                                          : p->n_states;
    if (t->storage >= KILN_STORE_INPUT && t->io_index >= bindings)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan tensor %u: %.6s index %u is past the %u %.6ss; re-export the program",
                       (unsigned)i, storage_names[t->storage], (unsigned)t->io_index,
                       (unsigned)bindings, storage_names[t->storage]);
    uint64_t end = 0;
    uint64_t limit = t->nbytes; /* a caller's buffer holds the tensor at offset 0 */
    if (t->storage == KILN_STORE_ARENA) limit = p->arena_size;
    if (t->storage == KILN_STORE_WEIGHT || t->storage == KILN_STORE_STATE) limit = e->weights_size;
    if (kiln_add_u64(t->offset, t->nbytes, &end) != 0 || end > limit)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan tensor %u: %llu bytes at offset %llu lie outside its %.7s of %llu "
                       "bytes; re-export the program",
                       (unsigned)i, (unsigned long long)t->nbytes, (unsigned long long)t->offset,
                       storage_names[t->storage], (unsigned long long)limit);
  }
  for (uint32_t i = 0; i < p->n_inputs + p->n_outputs; i++) {
    uint32_t t = i < p->n_inputs ? p->inputs[i] : p->outputs[i - p->n_inputs];
    if (t >= p->n_tensors)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan I/O %u names tensor %u of %u; re-export the program", (unsigned)i,
                       (unsigned)t, (unsigned)p->n_tensors);
  }
  for (uint32_t i = 0; i < e->metadata.n_aliases; i++) {
    const kiln_alias *a = &e->metadata.aliases[i];
    if (a->output >= p->n_outputs || a->input >= p->n_inputs ||
        p->tensors[p->outputs[a->output]].nbytes != p->tensors[p->inputs[a->input]].nbytes)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "alias %u: output %u and input %u are out of range or differ in size; "
                       "re-export the program",
                       (unsigned)i, (unsigned)a->output, (unsigned)a->input);
  }
  return KILN_OK;
}

static int is_permutation(const kiln_op *op, int32_t rank) {
  uint32_t seen = 0;
  if (op->n_iattr != (uint32_t)rank) return 0;
  for (int32_t d = 0; d < rank; d++) {
    int64_t p = op->iattr[d];
    if (p < 0 || p >= rank || (seen >> p) & 1u) return 0;
    seen |= 1u << p;
  }
  return 1;
}

/* 1 when input 0 has the output's shape and inputs first..n-1 broadcast (right-aligned) to
 * it. */
static int operands_fit(const kiln_plan *p, const kiln_op *op, uint32_t first) {
  const kiln_tensor_desc *out = &p->tensors[op->output];
  for (uint32_t k = 0; k < op->n_inputs; k++) {
    const kiln_tensor_desc *t = &p->tensors[op->inputs[k]];
    if (k && k < first) continue;
    if (t->rank > out->rank || (k == 0 && t->rank != out->rank)) return 0;
    for (int32_t d = 0; d < t->rank; d++) {
      int64_t want = out->dims[out->rank - t->rank + d];
      if (t->dims[d] != want && (k == 0 || t->dims[d] != 1)) return 0;
    }
  }
  return 1;
}

/* 1 when a norm's flags, inputs and fused steps agree (weight and bias shapes are the
 * engine's kernels' own check). */
static int norm_ok(const kiln_plan *p, const kiln_op *op) {
  const int64_t *a = op->iattr;
  int64_t max_flags = op->kind == KILN_OP_LAYER_NORM ? 3 : 1;
  uint32_t base = 1u + (uint32_t)(a[1] & 1) + (uint32_t)((a[1] >> 1) & 1), where;
  kiln_pw_span span;
  int fused = kiln_pw_span_of(op, &span);
  if (a[0] < 0 || a[0] > p->tensors[op->inputs[0]].rank || a[1] < 0 || a[1] > max_flags)
    return 0;
  if (fused ? op->n_inputs < base : op->n_inputs != base) return 0;
  return kiln_pointwise_check(op, &where) == KILN_PW_FINE && operands_fit(p, op, base);
}

/* 1 when a vision op's geometry, recomputed from its inputs and attributes, makes its output. */
static int vision_ok(const kiln_plan *p, const kiln_op *op) {
  const kiln_tensor_desc *in[KILN_MAX_OP_INPUTS];
  const kiln_tensor_desc *out = &p->tensors[op->output];
  kiln_tensor_desc want;
  char why[160];
  for (uint32_t k = 0; k < op->n_inputs; k++) in[k] = &p->tensors[op->inputs[k]];
  if (kiln_vision_infer(op, in, &want, why, sizeof why) || want.rank != out->rank) return 0;
  for (int32_t d = 0; d < out->rank; d++)
    if (want.dims[d] != out->dims[d]) return 0;
  return want.dtype == out->dtype;
}

static int same_dims(const kiln_tensor_desc *a, int32_t rank, const int64_t *dims) {
  if (a->rank != rank) return 0;
  for (int32_t d = 0; d < rank; d++)
    if (a->dims[d] != dims[d]) return 0;
  return 1;
}

/* GATHER: indices of x's rank, the output of their shape, no dim but `dim` past x's. */
static int gather_ok(const kiln_plan *p, const kiln_op *op) {
  const kiln_tensor_desc *x = &p->tensors[op->inputs[0]], *idx = &p->tensors[op->inputs[1]];
  int64_t dim = op->iattr[0];
  int ok = dim >= 0 && dim < x->rank && idx->rank == x->rank &&
           same_dims(&p->tensors[op->output], idx->rank, idx->dims);
  for (int32_t d = 0; ok && d < x->rank; d++) ok = d == dim || idx->dims[d] <= x->dims[d];
  return ok;
}

/* INDEX: the layout of x and its index inputs gives the output's shape. */
static int index_ok(const kiln_plan *p, const kiln_op *op) {
  const kiln_tensor_desc *idx[KILN_MAX_OP_INPUTS];
  kiln_index_layout lay;
  uint32_t where;
  for (uint32_t k = 1; k < op->n_inputs; k++) idx[k - 1] = &p->tensors[op->inputs[k]];
  return kiln_index_layout_of(&p->tensors[op->inputs[0]], idx, op->n_inputs - 1, op->iattr[0],
                              &lay, &where) == KILN_INDEX_FINE &&
         same_dims(&p->tensors[op->output], lay.rank, lay.dims);
}

/* ARGMAX: a non-empty dim, the output x's shape less that dim (or 1 there with keepdim). */
static int argmax_ok(const kiln_plan *p, const kiln_op *op) {
  const kiln_tensor_desc *x = &p->tensors[op->inputs[0]];
  int64_t dim = op->iattr[0], keep = op->iattr[1], dims[KILN_MAX_RANK];
  int32_t rank = 0;
  if (dim < 0 || dim >= x->rank || (keep != 0 && keep != 1) || x->dims[dim] == 0) return 0;
  for (int32_t d = 0; d < x->rank; d++)
    if (d != dim || keep) dims[rank++] = d == dim ? 1 : x->dims[d];
  return p->tensors[op->output].dtype == KILN_I64 && same_dims(&p->tensors[op->output], rank, dims);
}

/* 1 when the op's attributes are usable as indices into its tensors' dims. */
static int attrs_ok(const kiln_plan *p, const kiln_op *op) {
  const kiln_tensor_desc *x = &p->tensors[op->inputs[0]];
  const kiln_tensor_desc *out = &p->tensors[op->output];
  const int64_t *a = op->iattr;
  switch (op->kind) {
  case KILN_OP_LINEAR: {
    const kiln_tensor_desc *res = &p->tensors[op->inputs[op->n_inputs - 1]];
    int residual = kiln_linear_has_residual(op), ok = res->rank == out->rank;
    for (int32_t d = 0; ok && d < res->rank; d++) ok = res->dims[d] == out->dims[d];
    return a[0] >= KILN_ACT_NONE && a[0] <= KILN_ACT_SWIGLU && x->rank >= 1 &&
           p->tensors[op->inputs[1]].rank == 2 && (a[1] == 0 || a[1] == 1) &&
           op->n_inputs <= 3u + (uint32_t)residual &&
           (!residual || (ok && a[0] == KILN_ACT_NONE && op->n_inputs >= 3));
  }
  case KILN_OP_MATMUL: return x->rank >= 1 && p->tensors[op->inputs[1]].rank >= 1;
  case KILN_OP_GELU: return a[0] == 0 || a[0] == 1;
  case KILN_OP_CAST: return a[0] == (int64_t)out->dtype;
  case KILN_OP_SOFTMAX:
  case KILN_OP_LOG_SOFTMAX: return a[0] >= 0 && a[0] < (x->rank > 0 ? x->rank : 1);
  case KILN_OP_LAYER_NORM:
  case KILN_OP_RMS_NORM: return norm_ok(p, op);
  case KILN_OP_SUM:
  case KILN_OP_MEAN:
  case KILN_OP_AMAX: return a[0] >= 0 && a[0] < ((int64_t)1 << x->rank) && (a[1] == 0 || a[1] == 1);
  case KILN_OP_RESHAPE:
  case KILN_OP_COPY: return x->nbytes == out->nbytes;
  case KILN_OP_PERMUTE: return x->rank == out->rank && is_permutation(op, x->rank);
  case KILN_OP_EXPAND: return x->rank <= out->rank;
  case KILN_OP_CAT: return a[0] >= 0 && a[0] < out->rank;
  case KILN_OP_SLICE:
    return a[0] >= 0 && a[0] < x->rank && out->rank == x->rank && a[1] >= 0 && a[3] >= 1 &&
           (out->dims[a[0]] == 0 ||
            (a[1] < x->dims[a[0]] && out->dims[a[0]] - 1 <= (x->dims[a[0]] - 1 - a[1]) / a[3]));
  case KILN_OP_SELECT: return a[0] >= 0 && a[0] < x->rank && a[1] >= 0 && a[1] < x->dims[a[0]];
  case KILN_OP_EMBEDDING: return x->rank == 2;
  case KILN_OP_INDEX_SELECT: return a[0] >= 0 && a[0] < x->rank;
  case KILN_OP_INDEX_COPY:
    return a[0] >= 0 && a[0] < x->rank && p->tensors[op->inputs[1]].rank == 1 &&
           same_dims(out, x->rank, x->dims) &&
           p->tensors[op->inputs[2]].dims[a[0]] == p->tensors[op->inputs[1]].dims[0];
  case KILN_OP_SDPA:
    if (kiln_sdpa_layout(op) == 1) /* packed heads: qkv [B,L,3,H,E] -> [B,L,H,E] */
      return (a[1] == 0 || a[1] == 1) && op->n_inputs == 1u + (uint32_t)a[1] &&
             x->rank == 5 && x->dims[2] == 3 && out->rank == 4 && out->dims[0] == x->dims[0] &&
             out->dims[1] == x->dims[1] && out->dims[2] == x->dims[3] &&
             out->dims[3] == x->dims[4];
    if (kiln_sdpa_layout(op) != 0 &&
        (kiln_sdpa_layout(op) != 2 || x->rank != 4 || out->rank != 4))
      return 0; /* heads last: q [B,H,L,E] -> [B,L,H,Ev] */
    return (a[1] == 0 || a[1] == 1) && op->n_inputs == 3u + (uint32_t)a[1] && out->rank >= 2 &&
           x->rank >= 2 && p->tensors[op->inputs[1]].rank >= 2 &&
           p->tensors[op->inputs[2]].rank >= 2;
  case KILN_OP_POINTWISE: {
    uint32_t where;
    return kiln_pointwise_check(op, &where) == KILN_PW_FINE && operands_fit(p, op, 1);
  }
  case KILN_OP_FUSED: {
    const kiln_tensor_desc *in[KILN_MAX_OP_INPUTS];
    kiln_fx_prog prog;
    for (uint32_t k = 0; k < op->n_inputs; k++) in[k] = &p->tensors[op->inputs[k]];
    return kiln_fx_decode(p->words, p->n_words, op, 0, in, out, &prog, NULL) == KILN_OK;
  }
  case KILN_OP_COMPARE: return a[0] >= KILN_CMP_EQ && a[0] <= KILN_CMP_GE;
  case KILN_OP_LOGICAL:
  case KILN_OP_BITWISE:
    return a[0] >= KILN_BOOL_AND && a[0] <= KILN_BOOL_NOT &&
           op->n_inputs == (a[0] == KILN_BOOL_NOT ? 1u : 2u);
  case KILN_OP_CUMSUM:
    return a[0] >= 0 && a[0] < x->rank && a[1] == (int64_t)out->dtype &&
           out->dtype != KILN_BOOL && same_dims(out, x->rank, x->dims);
  case KILN_OP_GATHER: return gather_ok(p, op);
  case KILN_OP_INDEX: return index_ok(p, op);
  case KILN_OP_ARGMAX: return argmax_ok(p, op);
  default: return kiln_is_vision_op(op->kind) ? vision_ok(p, op) : 1;
  }
}

/* The first input whose dtype the op does not take with its output's dtype, or -1. */
static int bad_operand(const kiln_plan *p, const kiln_op *op, out_class cls) {
  kiln_dtype out = p->tensors[op->output].dtype;
  for (uint32_t k = 0; k < op->n_inputs; k++) {
    kiln_dtype dt = p->tensors[op->inputs[k]].dtype;
    int ok;
    switch (op->kind) {
    case KILN_OP_EMBEDDING:
    case KILN_OP_INDEX_SELECT: ok = k == 0 ? dt == out : (dt == KILN_I32 || dt == KILN_I64); break;
    case KILN_OP_WHERE: ok = k != 0 || dt == KILN_BOOL; break;
    case KILN_OP_SDPA: /* the mask: input 3 of q, k, v, mask or input 1 of packed qkv, mask */
      ok = !((op->n_inputs == 4 && k == 3) || (op->n_inputs == 2 && k == 1)) ||
           dt == KILN_BOOL || kiln_cpu_is_float(dt);
      break;
    case KILN_OP_POINTWISE: ok = dt == out; break;
    case KILN_OP_COMPARE: ok = out == KILN_BOOL && dt == p->tensors[op->inputs[0]].dtype; break;
    case KILN_OP_LOGICAL: ok = out == KILN_BOOL; break;
    case KILN_OP_BITWISE: ok = dt == out && !kiln_cpu_is_float(out); break;
    case KILN_OP_GATHER:
    case KILN_OP_INDEX: ok = k == 0 ? dt == out : (dt == KILN_I32 || dt == KILN_I64); break;
    case KILN_OP_INDEX_COPY: ok = k == 1 ? (dt == KILN_I32 || dt == KILN_I64) : dt == out; break;
    case KILN_OP_ARGMAX: ok = dt != KILN_BOOL; break;
    default: ok = cls != OUT_SAME || dt == out; break;
    }
    if (!ok) return (int)k;
  }
  return -1;
}

static void op_rule(kiln_op_kind kind, uint32_t *min_in, uint32_t *max_in, out_class *cls) {
  *min_in = 1;
  *max_in = 1;
  *cls = OUT_FLOAT;
  switch (kind) {
  case KILN_OP_LINEAR: *min_in = 2, *max_in = 4; break;
  case KILN_OP_MATMUL:
  case KILN_OP_DIV: *min_in = *max_in = 2; break;
  case KILN_OP_ADD:
  case KILN_OP_SUB:
  case KILN_OP_MUL:
  case KILN_OP_MINIMUM:
  case KILN_OP_MAXIMUM:
  case KILN_OP_COMPARE: *min_in = *max_in = 2, *cls = OUT_ANY; break;
  case KILN_OP_LOGICAL:
  case KILN_OP_BITWISE: *max_in = 2, *cls = OUT_ANY; break;
  case KILN_OP_RELU:
  case KILN_OP_NEG:
  case KILN_OP_ABS:
  case KILN_OP_CAST:
  case KILN_OP_SUM:
  case KILN_OP_AMAX: *cls = OUT_ANY; break;
  case KILN_OP_LAYER_NORM:
  case KILN_OP_RMS_NORM: *max_in = KILN_MAX_OP_INPUTS; break;
  case KILN_OP_RESHAPE:
  case KILN_OP_PERMUTE:
  case KILN_OP_EXPAND:
  case KILN_OP_SLICE:
  case KILN_OP_SELECT:
  case KILN_OP_COPY: *cls = OUT_SAME; break;
  case KILN_OP_CAT: *max_in = KILN_MAX_OP_INPUTS, *cls = OUT_SAME; break;
  case KILN_OP_EMBEDDING:
  case KILN_OP_INDEX_SELECT: *min_in = *max_in = 2, *cls = OUT_SAME; break;
  case KILN_OP_WHERE: *min_in = *max_in = 3, *cls = OUT_ANY; break;
  case KILN_OP_SDPA: *min_in = 1, *max_in = 4; break;
  case KILN_OP_POINTWISE:
  case KILN_OP_FUSED: *max_in = KILN_MAX_OP_INPUTS; break;
  case KILN_OP_CONV:
  case KILN_OP_CONV_TRANSPOSE: *min_in = 2, *max_in = 4; break;
  case KILN_OP_BATCH_NORM: *min_in = 3, *max_in = 5; break;
  case KILN_OP_CUMSUM:
  case KILN_OP_ARGMAX: *cls = OUT_ANY; break;
  case KILN_OP_GATHER: *min_in = *max_in = 2, *cls = OUT_SAME; break;
  case KILN_OP_INDEX: *min_in = 2, *max_in = KILN_MAX_OP_INPUTS, *cls = OUT_SAME; break;
  case KILN_OP_INDEX_COPY: *min_in = *max_in = 3, *cls = OUT_SAME; break;
  default: break; /* the float unary ops, softmax, mean, pooling and resize */
  }
}

static kiln_status check_op(const kiln_plan *p, uint32_t index, kiln_error *err) {
  const kiln_op *op = &p->ops[index];
  const char *name = kiln_op_name(op->kind);
  uint32_t min_in, max_in;
  out_class cls;
  if ((unsigned)op->kind >= KILN_OP_COUNT)
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "plan op %u: unknown op kind %d; update the runtime or re-export",
                     (unsigned)index, (int)op->kind);
  op_rule(op->kind, &min_in, &max_in, &cls);
  int io_ok = op->n_inputs >= min_in && op->n_inputs <= max_in && op->output < p->n_tensors;
  for (uint32_t k = 0; io_ok && k < op->n_inputs; k++) io_ok = op->inputs[k] < p->n_tensors;
  if (!io_ok)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan op %u (%.16s): %u inputs (wants %u to %u) or a tensor index out of "
                     "range; re-export the program",
                     (unsigned)index, name, (unsigned)op->n_inputs, (unsigned)min_in,
                     (unsigned)max_in);
  const kiln_tensor_desc *out = &p->tensors[op->output];
  int state_write = out->storage == KILN_STORE_STATE &&
                    (op->kind == KILN_OP_INDEX_COPY || op->kind == KILN_OP_COPY);
  if (out->storage != KILN_STORE_ARENA && out->storage != KILN_STORE_OUTPUT && !state_write)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan op %u (%.16s): writes into an input or weight tensor; re-export "
                     "the program",
                     (unsigned)index, name);
  if (cls == OUT_FLOAT && !kiln_cpu_is_float(out->dtype))
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "plan op %u (%.16s): output dtype %.8s is not supported, only f32, f16 and "
                     "bf16; cast to a float dtype before this op",
                     (unsigned)index, name, kiln_dtype_name(out->dtype));
  int bad = bad_operand(p, op, cls);
  if (bad >= 0)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan op %u (%.16s): input %d has dtype %.8s, which this op does not take "
                     "with output dtype %.8s; re-export the program",
                     (unsigned)index, name, bad, kiln_dtype_name(p->tensors[op->inputs[bad]].dtype),
                     kiln_dtype_name(out->dtype));
  if (!attrs_ok(p, op))
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan op %u (%.16s): attributes %lld, %lld, %lld, %lld do not fit its %u "
                     "inputs of rank %d; re-export the program",
                     (unsigned)index, name, (long long)op->iattr[0], (long long)op->iattr[1],
                     (long long)op->iattr[2], (long long)op->iattr[3], (unsigned)op->n_inputs,
                     (int)p->tensors[op->inputs[0]].rank);
  return KILN_OK;
}

kiln_status kiln_cpu_check_plan(const kiln_engine *e, kiln_error *err) {
  kiln_status st = check_tensors(e, err);
  for (uint32_t i = 0; st == KILN_OK && i < e->plan.n_ops; i++) st = check_op(&e->plan, i, err);
  return st;
}

uint64_t kiln_cpu_scratch_count(const kiln_plan *p) {
  uint64_t most = 0;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    const kiln_op *op = &p->ops[i];
    uint64_t need = 0;
    if (op->kind == KILN_OP_MATMUL) {
      const kiln_tensor_desc *b = &p->tensors[op->inputs[1]];
      need = b->rank >= 2 ? (uint64_t)b->dims[b->rank - 1] : 1; /* one output row of sums */
    } else if (op->kind == KILN_OP_SDPA && kiln_sdpa_layout(op) == 1) {
      const kiln_tensor_desc *x = &p->tensors[op->inputs[0]];
      need = (uint64_t)x->dims[1] + (uint64_t)x->dims[4]; /* scores, row */
    } else if (op->kind == KILN_OP_SDPA) {
      const kiln_tensor_desc *k = &p->tensors[op->inputs[1]], *v = &p->tensors[op->inputs[2]];
      need = (uint64_t)k->dims[k->rank - 2] + (uint64_t)v->dims[v->rank - 1]; /* scores, row */
    } else if (op->kind == KILN_OP_CONV) {
      const kiln_tensor_desc *out = &p->tensors[op->output];
      int channels_last = op->n_iattr > 5 && op->iattr[5] != 0;
      need = (uint64_t)out->dims[out->rank - 1 - channels_last]; /* one output row of sums */
    }
    if (need > most) most = need;
  }
  return most;
}
