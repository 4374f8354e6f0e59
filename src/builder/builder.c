/* The builder API: records inputs, constants and ops, inferring each op's shape as it is
 * added, then builds a blob: graph passes, memory plan, plan, metadata and weights. */
#include "runtime/alloc.h"
#include "builder/derive_symbols.h"
#include "builder/fold.h"
#include "builder/fold_attention_mask.h"
#include "builder/fold_batch_norm.h"
#include "builder/fold_identity_ops.h"
#include "builder/fuse.h"
#include "builder/fuse_attention.h"
#include "builder/fuse_group.h"
#include "builder/fuse_grouped_kv.h"
#include "builder/fuse_swiglu.h"
#include "builder/fuse_norm.h"
#include "builder/fuse_pointwise.h"
#include "builder/fuse_rms_norm.h"
#include "builder/graph.h"
#include "runtime/internal.h"
#include "builder/layout_channels_last.h"
#include "builder/memplan.h"
#include "builder/merge_common.h"
#include "builder/merge_fused.h"
#include "builder/merge_linears.h"
#include "builder/recognize_activations.h"
#include "runtime/view.h"
#include "runtime/shape.h"
#include "runtime/symbolic.h"
#include "runtime/utf8.h"

#include <stdlib.h>
#include <string.h>

#define DEFAULT_COMPUTE_CAPABILITY 80

struct kiln_builder {
  kiln_graph graph;
  uint64_t arena_size; /* of the last successful build */
  uint32_t n_symbols;  /* bounded dynamic sizes; graph inputs' and ops' sym refer to them */
  kiln_symbol symbols[KILN_MAX_SYMBOLS];
};

kiln_builder *kiln_builder_create(void) { return kiln_calloc(1, sizeof(kiln_builder)); }

void kiln_builder_destroy(kiln_builder *b) {
  if (!b) return;
  kiln_graph_release(&b->graph);
  free(b);
}

void kiln_build_options_default(kiln_build_options *opts) {
  if (!opts) return;
  opts->device_id = 0;
  opts->min_compute_capability = 0;
  opts->allow_tf32 = 0;
  opts->fuse = 1;
}

uint64_t kiln_builder_arena_size(const kiln_builder *b) { return b ? b->arena_size : 0; }

/* ---------------------------------------------------------------- recording */

/* Checks a caller's dtype and shape and fills desc; `call` names the API call. */
static kiln_status check_shape(const char *call, kiln_dtype dtype, int32_t rank,
                               const int64_t *dims, kiln_tensor_desc *desc, kiln_error *err) {
  char shape[48];
  memset(desc, 0, sizeof *desc);
  if ((unsigned)dtype >= KILN_DTYPE_COUNT)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "builder %.12s: dtype %d is unknown; pass a kiln_dtype", call, (int)dtype);
  if (rank < 0 || rank > KILN_MAX_RANK || (rank > 0 && !dims))
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "builder %.12s: rank %d is outside 0..8 or its dims are NULL; pass a rank "
                     "0..8 and that many dims",
                     call, (int)rank);
  desc->dtype = dtype;
  desc->rank = rank;
  for (int32_t i = 0; i < rank; i++) desc->dims[i] = dims[i];
  if (kiln_shape_nbytes(dtype, rank, desc->dims, &desc->nbytes))
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "builder %.12s: shape %.40s has a dim outside 0..2^62 or exceeds 2^63 bytes; "
                     "pass a smaller shape",
                     call, kiln_shape_str(rank, desc->dims, shape, sizeof shape));
  return KILN_OK;
}

/* A binding name: 1..63 bytes of UTF-8 without control characters that no other input or output uses. */
static kiln_status check_name(const kiln_graph *g, const char *name, kiln_error *err) {
  size_t len = name ? strlen(name) : 0, fault;
  if (g->n_inputs + g->n_outputs >= KILN_MAX_BINDINGS)
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "builder: %u inputs and %u outputs reach the limit of %u bindings; split "
                     "the graph",
                     (unsigned)g->n_inputs, (unsigned)g->n_outputs, (unsigned)KILN_MAX_BINDINGS);
  if (len == 0 || len >= KILN_NAME_MAX)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "builder: a binding name is %llu bytes long; pass a name of 1..63 bytes",
                     (unsigned long long)len);
  if ((fault = kiln_utf8_name_fault(name, len)) != len)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "builder: a binding name has a control character or malformed UTF-8 at "
                     "byte %u; use printable UTF-8 text",
                     (unsigned)fault);
  for (uint32_t i = 0; i < g->n_inputs + g->n_outputs; i++) {
    const char *other = i < g->n_inputs ? g->inputs[i].name : g->outputs[i - g->n_inputs].name;
    if (strcmp(other, name) == 0)
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "builder: binding name \"%.63s\" is already taken by an input or output; "
                       "pick a unique name",
                       name);
  }
  return KILN_OK;
}

static kiln_status check_builder(const kiln_builder *b, const char *call, kiln_error *err) {
  if (b) return KILN_OK;
  return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                   "builder %.12s: the builder is NULL; create one with kiln_builder_create", call);
}

int32_t kiln_builder_add_symbol(kiln_builder *b, const char *name, int64_t min, int64_t max,
                                kiln_error *err) {
  size_t len = name ? strlen(name) : 0;
  int printable = len > 0 && len < KILN_SYMBOL_NAME_MAX;
  kiln_symbol *sym;
  if (check_builder(b, "add_symbol", err)) return -1;
  for (size_t i = 0; printable && i < len; i++) printable = name[i] > 0x20 && name[i] < 0x7f;
  if (!printable || min < 0 || min > max || max > KILN_DIM_MAX || max < 1 ||
      b->n_symbols == KILN_MAX_SYMBOLS) {
    kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
              "builder add_symbol: \"%.15s\" with bounds %lld..%lld (symbol %u of at most %u); "
              "pass 1..15 printable bytes and 0 <= min <= max <= 2^62, max >= 1",
              name ? name : "", (long long)min, (long long)max, (unsigned)b->n_symbols + 1,
              (unsigned)KILN_MAX_SYMBOLS);
    return -1;
  }
  sym = &b->symbols[b->n_symbols++];
  memset(sym, 0, sizeof *sym);
  memcpy(sym->name, name, len);
  sym->min = min;
  sym->max = max;
  return (int32_t)b->n_symbols;
}

/* A caller's size expression: a declared symbol, coeff >= 1, at or above 0 over its bounds;
 * writes its value at the upper bound. `what` and `index` name the size in a refusal. */
static kiln_status check_sym(const kiln_builder *b, const char *what, unsigned index,
                             const kiln_sym_size *s, int64_t *at_max, kiln_error *err) {
  const kiln_symbol *sym = s->symbol && s->symbol <= b->n_symbols ? &b->symbols[s->symbol - 1] : NULL;
  int64_t top, bottom;
  if (!sym || s->coeff < 1 || s->coeff > KILN_DIM_MAX || s->offset < -KILN_DIM_MAX ||
      s->offset > KILN_DIM_MAX || __builtin_mul_overflow(s->coeff, sym->max, &top) ||
      __builtin_add_overflow(top, s->offset, &top) || top > KILN_DIM_MAX ||
      __builtin_mul_overflow(s->coeff, sym->min, &bottom) || bottom + s->offset < 0)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "builder %.12s %u: size %lld*symbol %u%+lld is not a size over the symbol's "
                     "bounds (of %u symbols); pass coeff >= 1 and a size in 0..2^62",
                     what, index, (long long)s->coeff, (unsigned)s->symbol, (long long)s->offset,
                     (unsigned)b->n_symbols);
  *at_max = top;
  return KILN_OK;
}

int32_t kiln_builder_add_input(kiln_builder *b, const char *name, kiln_dtype dtype, int32_t rank,
                               const int64_t *dims, kiln_error *err) {
  return kiln_builder_add_input_sym(b, name, dtype, rank, dims, NULL, err);
}

int32_t kiln_builder_add_input_sym(kiln_builder *b, const char *name, kiln_dtype dtype,
                                   int32_t rank, const int64_t *dims,
                                   const kiln_sym_size *dims_sym, kiln_error *err) {
  kiln_tensor_desc desc;
  int64_t bound[KILN_MAX_RANK];
  int32_t id;
  if (check_builder(b, "add_input", err)) return -1;
  for (int32_t d = 0; dims && rank > 0 && rank <= KILN_MAX_RANK && d < rank; d++) {
    bound[d] = dims[d];
    if (dims_sym && dims_sym[d].symbol &&
        check_sym(b, "input dim", (unsigned)d, &dims_sym[d], &bound[d], err))
      return -1;
  }
  if (check_shape("add_input", dtype, rank, dims ? bound : NULL, &desc, err) ||
      check_name(&b->graph, name, err))
    return -1;
  for (int32_t d = 0; dims_sym && d < rank; d++)
    if (dims_sym[d].symbol) desc.sym[d] = dims_sym[d];
  if ((id = kiln_graph_add_tensor(&b->graph, KILN_NODE_INPUT, &desc)) < 0) {
    kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
              "builder add_input: out of memory for input \"%.63s\"; free memory and retry", name);
    return -1;
  }
  b->graph.inputs[b->graph.n_inputs].tensor = id;
  memcpy(b->graph.inputs[b->graph.n_inputs].name, name, strlen(name) + 1);
  b->graph.n_inputs++;
  return id;
}

int32_t kiln_builder_add_constant(kiln_builder *b, kiln_dtype dtype, int32_t rank,
                                  const int64_t *dims, const void *data, size_t nbytes,
                                  kiln_error *err) {
  kiln_tensor_desc desc;
  char shape[48];
  uint8_t *copy;
  int32_t id;
  if (check_builder(b, "add_constant", err) ||
      check_shape("add_constant", dtype, rank, dims, &desc, err))
    return -1;
  if (nbytes != desc.nbytes || (nbytes && !data)) {
    kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
              "builder add_constant: %llu bytes given but %.4s %.40s holds %llu; pass exactly "
              "its bytes",
              (unsigned long long)(data ? nbytes : 0), kiln_dtype_name(dtype),
              kiln_shape_str(rank, desc.dims, shape, sizeof shape),
              (unsigned long long)desc.nbytes);
    return -1;
  }
  copy = kiln_malloc(nbytes);
  if (!copy || (id = kiln_graph_add_tensor(&b->graph, KILN_NODE_CONSTANT, &desc)) < 0) {
    free(copy);
    kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
              "builder add_constant: out of memory for %llu bytes; free memory and retry",
              (unsigned long long)nbytes);
    return -1;
  }
  if (nbytes) memcpy(copy, data, nbytes);
  b->graph.tensors[id].data = b->graph.tensors[id].owned = copy;
  return id;
}

int32_t kiln_builder_add_state(kiln_builder *b, kiln_dtype dtype, int32_t rank,
                               const int64_t *dims, const void *initial, size_t nbytes,
                               kiln_error *err) {
  int32_t id;
  if (check_builder(b, "add_state", err)) return -1;
  if (b->graph.n_states >= KILN_MAX_BINDINGS) {
    kiln_fail(err, KILN_ERR_UNSUPPORTED,
              "builder add_state: %u states reach the limit; split the graph",
              (unsigned)b->graph.n_states);
    return -1;
  }
  if ((id = kiln_builder_add_constant(b, dtype, rank, dims, initial, nbytes, err)) < 0) return -1;
  b->graph.tensors[id].node = KILN_NODE_STATE;
  b->graph.tensors[id].state = (int32_t)b->graph.n_states;
  b->graph.states[b->graph.n_states++] = (kiln_gstate){id, id};
  return id;
}

kiln_status kiln_builder_write_state(kiln_builder *b, int32_t state, int32_t value,
                                     kiln_error *err) {
  const kiln_gtensor *st, *v;
  char shape_a[48], shape_b[48];
  kiln_status s = check_builder(b, "write_state", err);
  if (s) return s;
  if (state < 0 || (uint32_t)state >= b->graph.n_tensors ||
      b->graph.tensors[state].node != KILN_NODE_STATE || value < 0 ||
      (uint32_t)value >= b->graph.n_tensors)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "builder write_state: tensor %d is not a state or value %d is not one of the "
                     "builder's %u tensors; pass ids the builder returned",
                     (int)state, (int)value, (unsigned)b->graph.n_tensors);
  st = &b->graph.tensors[state];
  v = &b->graph.tensors[value];
  if (b->graph.states[st->state].value != state)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "builder write_state: state tensor %d already has its value after the run; "
                     "write each state once",
                     (int)state);
  if (v->desc.dtype != st->desc.dtype || v->desc.rank != st->desc.rank ||
      memcmp(v->desc.dims, st->desc.dims, sizeof v->desc.dims) != 0)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "builder write_state: value %d is %.4s %.40s but state %d is %.4s %.40s; "
                     "pass a value of the state's dtype and shape",
                     (int)value, kiln_dtype_name(v->desc.dtype),
                     kiln_shape_str(v->desc.rank, v->desc.dims, shape_a, sizeof shape_a),
                     (int)state, kiln_dtype_name(st->desc.dtype),
                     kiln_shape_str(st->desc.rank, st->desc.dims, shape_b, sizeof shape_b));
  b->graph.states[st->state].value = value;
  return KILN_OK;
}

static int64_t normalize_dim(int64_t dim, int32_t rank) {
  return dim < 0 && dim >= -(int64_t)rank ? dim + rank : dim;
}

/* A slice bound as PyTorch reads it: negative counts from the end, then clamped to 0..size. */
static int64_t clamp_bound(int64_t v, int64_t size) {
  if (v < 0) v += size;
  return v < 0 ? 0 : v > size ? size : v;
}

/* One -1 in a reshape target takes the size that keeps the element count. */
static void infer_reshape_dim(kiln_op *op, const kiln_tensor_desc *x) {
  uint64_t have = 1, rest = 1;
  int32_t hole = -1;
  for (uint32_t i = 0; i < op->n_iattr; i++) {
    if (op->iattr[i] == -1 && hole < 0) hole = (int32_t)i;
    else if (op->iattr[i] < 0 || kiln_mul_u64(rest, (uint64_t)op->iattr[i], &rest)) return;
  }
  for (int32_t i = 0; i < x->rank; i++) have *= (uint64_t)x->dims[i]; /* fits: nbytes did */
  if (hole >= 0 && rest != 0 && have % rest == 0) op->iattr[hole] = (int64_t)(have / rest);
}

/* PyTorch conventions (negative dims and indices, -1 sizes) made explicit, so that shape
 * inference and the plan see only normalized attributes. */
static void normalize_attrs(kiln_op *op, const kiln_tensor_desc *const *in) {
  const kiln_tensor_desc *x = in[0];
  int64_t *a = op->iattr;
  switch (op->kind) {
  case KILN_OP_SOFTMAX:
  case KILN_OP_LOG_SOFTMAX:
  case KILN_OP_CAT:
  case KILN_OP_INDEX_SELECT:
  case KILN_OP_CUMSUM:
  case KILN_OP_GATHER:
  case KILN_OP_ARGMAX:
  case KILN_OP_INDEX_COPY:
    if (op->n_iattr >= 1) a[0] = normalize_dim(a[0], x->rank);
    break;
  case KILN_OP_SELECT:
    if (op->n_iattr != 2) break;
    a[0] = normalize_dim(a[0], x->rank);
    if (a[0] >= 0 && a[0] < x->rank && a[1] < 0) a[1] += x->dims[a[0]];
    break;
  case KILN_OP_SLICE:
    if (op->n_iattr != 4) break;
    a[0] = normalize_dim(a[0], x->rank);
    if (a[0] < 0 || a[0] >= x->rank) break;
    a[1] = clamp_bound(a[1], x->dims[a[0]]);
    a[2] = clamp_bound(a[2], x->dims[a[0]]);
    if (a[2] < a[1]) a[2] = a[1];
    break;
  case KILN_OP_PERMUTE:
    for (uint32_t i = 0; i < op->n_iattr; i++) a[i] = normalize_dim(a[i], x->rank);
    break;
  case KILN_OP_RESHAPE: infer_reshape_dim(op, x); break;
  case KILN_OP_EXPAND:
    for (uint32_t i = 0; i < op->n_iattr; i++) {
      int64_t j = (int64_t)i - ((int64_t)op->n_iattr - x->rank);
      if (a[i] == -1 && j >= 0) a[i] = x->dims[j];
    }
    break;
  default: break;
  }
}

/* Checks, normalizes and infers one op, then appends it; *id is its output tensor. */
static kiln_status record_op(kiln_builder *b, kiln_op_kind kind, const int32_t *inputs,
                             uint32_t n_inputs, const int64_t *iattr,
                             const kiln_sym_size *iattr_sym, uint32_t n_iattr,
                             const double *fattr, uint32_t n_fattr, int32_t *id,
                             kiln_error *err) {
  static const kiln_op_site site_base = {"builder", 0, KILN_ERR_INVALID_ARGUMENT, ""};
  kiln_op_site site = site_base;
  const kiln_tensor_desc *in[KILN_MAX_OP_INPUTS];
  kiln_tensor_desc out;
  kiln_op op;
  unsigned index = b->graph.n_ops;
  const char *name = kiln_op_name(kind);
  kiln_status s;
  if ((unsigned)kind >= KILN_OP_COUNT)
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "builder op %u: op kind %d is unknown; pass a kiln_op_kind", index, (int)kind);
  if (n_inputs == 0 || n_inputs > KILN_MAX_OP_INPUTS || !inputs || n_iattr > KILN_MAX_IATTR ||
      (n_iattr && !iattr) || n_fattr > KILN_MAX_FATTR || (n_fattr && !fattr))
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "builder op %u (%.12s): %u inputs, %u integer and %u real attributes; pass "
                     "1..8, 0..8 and 0..2 with non-NULL arrays",
                     index, name, (unsigned)n_inputs, (unsigned)n_iattr, (unsigned)n_fattr);
  memset(&op, 0, sizeof op);
  op.kind = kind;
  op.n_inputs = n_inputs;
  op.n_iattr = n_iattr;
  for (uint32_t i = 0; i < n_inputs; i++) {
    if (inputs[i] < 0 || (uint32_t)inputs[i] >= b->graph.n_tensors)
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "builder op %u (%.12s): input %u is tensor %d but the builder has %u "
                       "tensors; pass ids the builder returned",
                       index, name, (unsigned)i, (int)inputs[i], (unsigned)b->graph.n_tensors);
    op.inputs[i] = (uint32_t)inputs[i];
    in[i] = &b->graph.tensors[inputs[i]].desc;
  }
  for (uint32_t i = 0; i < n_iattr; i++) {
    op.iattr[i] = iattr[i];
    if (!iattr_sym || !iattr_sym[i].symbol) continue;
    if (!kiln_attr_may_follow_symbol(kind, i))
      return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                       "builder op %u (%.12s): attribute %u follows a dynamic size, but only "
                       "reshape/expand sizes, slice bounds and select indices may; make it static",
                       index, name, (unsigned)i);
    if ((s = check_sym(b, "op attribute", (unsigned)i, &iattr_sym[i], &op.iattr[i], err))) return s;
    op.iattr_sym[i] = iattr_sym[i];
  }
  for (uint32_t i = 0; i < n_fattr; i++) op.fattr[i] = fattr[i];
  if ((kind == KILN_OP_ADD || kind == KILN_OP_SUB) && n_fattr == 0) op.fattr[0] = 1.0; /* alpha */
  normalize_attrs(&op, in);
  site.index = index;
  memset(&out, 0, sizeof out);
  if ((s = kiln_infer_op(&op, in, &site, &out, err))) return s;
  out.storage = KILN_STORE_ARENA;
  if (kiln_graph_add_op(&b->graph, &op, &out) < 0)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder op %u (%.12s): out of memory recording the op; free memory and retry",
                     index, name);
  *id = (int32_t)b->graph.ops[index].output;
  return KILN_OK;
}

int32_t kiln_builder_add_op(kiln_builder *b, kiln_op_kind kind, const int32_t *inputs,
                            uint32_t n_inputs, const int64_t *iattr, uint32_t n_iattr,
                            const double *fattr, uint32_t n_fattr, kiln_error *err) {
  return kiln_builder_add_op_sym(b, kind, inputs, n_inputs, iattr, NULL, n_iattr, fattr, n_fattr,
                                 err);
}

int32_t kiln_builder_add_op_sym(kiln_builder *b, kiln_op_kind kind, const int32_t *inputs,
                                uint32_t n_inputs, const int64_t *iattr,
                                const kiln_sym_size *iattr_sym, uint32_t n_iattr,
                                const double *fattr, uint32_t n_fattr, kiln_error *err) {
  int32_t id = -1;
  if (check_builder(b, "add_op", err) ||
      record_op(b, kind, inputs, n_inputs, iattr, iattr_sym, n_iattr, fattr, n_fattr, &id, err))
    return -1;
  return id;
}

kiln_status kiln_builder_get_shape(const kiln_builder *b, int32_t tensor, kiln_dtype *dtype,
                                   int32_t *rank, int64_t *dims, kiln_error *err) {
  const kiln_tensor_desc *d;
  kiln_status s = check_builder(b, "get_shape", err);
  if (s) return s;
  if (tensor < 0 || (uint32_t)tensor >= b->graph.n_tensors)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "builder get_shape: tensor %d is not one of the builder's %u tensors; pass an "
                     "id the builder returned",
                     (int)tensor, (unsigned)b->graph.n_tensors);
  d = &b->graph.tensors[tensor].desc;
  if (dtype) *dtype = d->dtype;
  if (rank) *rank = d->rank;
  for (int32_t i = 0; dims && i < d->rank; i++) dims[i] = d->dims[i];
  return KILN_OK;
}

kiln_status kiln_builder_mark_output(kiln_builder *b, int32_t tensor, const char *name,
                                     kiln_error *err) {
  kiln_graph *g;
  kiln_status s = check_builder(b, "mark_output", err);
  if (s) return s;
  g = &b->graph;
  if (tensor < 0 || (uint32_t)tensor >= g->n_tensors)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "builder mark_output: tensor %d is not one of the builder's %u tensors; pass "
                     "an id the builder returned",
                     (int)tensor, (unsigned)g->n_tensors);
  if ((s = check_name(g, name, err))) return s;
  /* An output owns its buffer: an input, a constant or a second binding of one result gets
   * its own copy. */
  if (g->tensors[tensor].node != KILN_NODE_OP || kiln_graph_is_output(g, tensor)) {
    if ((s = record_op(b, KILN_OP_COPY, &tensor, 1, NULL, NULL, 0, NULL, 0, &tensor, err))) return s;
  }
  g->outputs[g->n_outputs].tensor = tensor;
  memcpy(g->outputs[g->n_outputs].name, name, strlen(name) + 1);
  g->n_outputs++;
  return KILN_OK;
}

/* ---------------------------------------------------------------- building */

/* What build assembles before writing the blob. */
typedef struct build_parts {
  kiln_plan plan;
  int32_t *map;        /* graph tensor -> plan tensor, or -1 */
  uint8_t *weights;
  uint64_t weights_size;
} build_parts;

static void release_parts(build_parts *p) {
  kiln_plan_release(&p->plan);
  free(p->map);
  free(p->weights);
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* The last live op reading tensor t, or -1. */
static int32_t last_reader(const kiln_graph *g, int32_t t) {
  int32_t last = -1;
  for (uint32_t i = 0; i < g->n_ops; i++)
    for (uint32_t k = 0; !g->dead[i] && k < g->ops[i].n_inputs; k++)
      if (g->ops[i].inputs[k] == (uint32_t)t) last = (int32_t)i;
  return last;
}

/* Each written state gets its buffer: an INDEX_COPY of the state that is the state's last
 * reader writes it in place; any other value is copied into it by a COPY after every op. */
static kiln_status place_states(kiln_graph *g, kiln_error *err) {
  for (uint32_t i = 0; i < g->n_states; i++) {
    int32_t base = g->states[i].tensor, value = g->states[i].value, w, copy;
    const kiln_op *op;
    kiln_op c;
    kiln_tensor_desc shape;
    if (value == base) continue;
    w = g->tensors[value].node == KILN_NODE_OP ? g->tensors[value].producer : -1;
    op = w >= 0 ? &g->ops[w] : NULL;
    if (op && !g->dead[w] && op->kind == KILN_OP_INDEX_COPY && op->inputs[0] == (uint32_t)base &&
        op->inputs[1] != (uint32_t)base && op->inputs[2] != (uint32_t)base &&
        g->tensors[value].state < 0 && last_reader(g, base) == w) {
      int bound = 0;
      for (uint32_t o = 0; o < g->n_outputs; o++) bound |= g->outputs[o].tensor == value;
      if (!bound) {
        g->tensors[value].state = (int32_t)i;
        continue;
      }
    }
    memset(&c, 0, sizeof c);
    c.kind = KILN_OP_COPY;
    c.n_inputs = 1;
    c.inputs[0] = (uint32_t)value;
    shape = g->tensors[value].desc; /* adding the op may move g->tensors */
    if ((copy = kiln_graph_add_op(g, &c, &shape)) < 0)
      return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                       "builder: out of memory writing state %u; free memory and retry",
                       (unsigned)i);
    g->tensors[g->ops[copy].output].desc.storage = KILN_STORE_ARENA;
    g->tensors[g->ops[copy].output].state = (int32_t)i;
    g->states[i].value = (int32_t)g->ops[copy].output;
  }
  return KILN_OK;
}

/* Numbers the tensors the plan keeps: inputs, constants live ops read, live op outputs, and
 * the start-of-run record of each state the live ops read or write. */
static kiln_status number_tensors(const kiln_graph *g, build_parts *p, kiln_error *err) {
  uint32_t n = 0;
  uint64_t weights = 0;
  kiln_tensor_desc *t;
  for (uint32_t i = 0; i < g->n_tensors; i++) p->map[i] = -1;
  for (uint32_t i = 0; i < g->n_inputs; i++) p->map[g->inputs[i].tensor] = (int32_t)n++;
  for (uint32_t i = 0; i < g->n_ops; i++) {
    if (g->dead[i]) continue;
    for (uint32_t k = 0; k < g->ops[i].n_inputs; k++) {
      uint32_t c = g->ops[i].inputs[k];
      if (g->tensors[c].node == KILN_NODE_CONSTANT && p->map[c] < 0) p->map[c] = (int32_t)n++;
    }
    p->map[g->ops[i].output] = (int32_t)n++;
    p->plan.n_ops++;
  }
  for (uint32_t i = 0; i < g->n_ops; i++) {
    if (g->dead[i]) continue;
    for (uint32_t k = 0; k <= g->ops[i].n_inputs; k++) {
      uint32_t c = k < g->ops[i].n_inputs ? g->ops[i].inputs[k] : g->ops[i].output;
      int32_t st = g->tensors[c].state;
      if (st >= 0 && p->map[g->states[st].tensor] < 0)
        p->map[g->states[st].tensor] = (int32_t)n++;
    }
  }
  p->plan.n_tensors = n;
  p->plan.tensors = kiln_calloc(n, sizeof *p->plan.tensors);
  p->plan.ops = kiln_calloc(p->plan.n_ops, sizeof *p->plan.ops);
  p->plan.inputs = kiln_calloc(g->n_inputs, sizeof *p->plan.inputs);
  p->plan.outputs = kiln_calloc(g->n_outputs, sizeof *p->plan.outputs);
  if (!p->plan.tensors || !p->plan.ops || !p->plan.inputs || !p->plan.outputs)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder: out of memory for a plan of %u tensors; free memory and retry",
                     (unsigned)n);
  p->plan.version = KILN_PLAN_VERSION;
  p->plan.n_inputs = g->n_inputs;
  p->plan.n_outputs = g->n_outputs;
  for (uint32_t i = 0; i < g->n_tensors; i++) {
    int fused;
    if (p->map[i] < 0) continue;
    t = &p->plan.tensors[p->map[i]];
    *t = g->tensors[i].desc;
    /* derived, but a FUSED output's: its shape comes with its program, not from inference */
    fused = g->tensors[i].node == KILN_NODE_OP && g->ops[g->tensors[i].producer].kind == KILN_OP_FUSED;
    if (g->tensors[i].node != KILN_NODE_INPUT && !fused) memset(t->sym, 0, sizeof t->sym);
    t->storage = KILN_STORE_ARENA;
    t->io_index = 0;
    t->offset = 0;
    if (g->tensors[i].node == KILN_NODE_CONSTANT) {
      t->storage = KILN_STORE_WEIGHT;
      t->offset = weights = align_up(weights, KILN_WEIGHTS_ALIGN);
      weights += t->nbytes;
    }
  }
  /* Dense state indices in the order the states were added; both records share the initial value. */
  for (uint32_t i = 0, index = 0; i < g->n_states; i++) {
    int32_t base = g->states[i].tensor;
    if (p->map[base] < 0) continue;
    t = &p->plan.tensors[p->map[base]];
    t->storage = KILN_STORE_STATE;
    t->io_index = index;
    t->offset = weights = align_up(weights, KILN_WEIGHTS_ALIGN);
    weights += t->nbytes;
    for (uint32_t v = 0; v < g->n_tensors; v++) {
      if (v == (uint32_t)base || g->tensors[v].state != (int32_t)i || p->map[v] < 0) continue;
      p->plan.tensors[p->map[v]].storage = KILN_STORE_STATE;
      p->plan.tensors[p->map[v]].io_index = index;
      p->plan.tensors[p->map[v]].offset = t->offset;
    }
    index++;
  }
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    t = &p->plan.tensors[p->map[g->inputs[i].tensor]];
    t->storage = KILN_STORE_INPUT;
    t->io_index = i;
    p->plan.inputs[i] = (uint32_t)p->map[g->inputs[i].tensor];
  }
  for (uint32_t i = 0; i < g->n_outputs; i++) {
    t = &p->plan.tensors[p->map[g->outputs[i].tensor]];
    t->storage = KILN_STORE_OUTPUT;
    t->io_index = i;
    p->plan.outputs[i] = (uint32_t)p->map[g->outputs[i].tensor];
  }
  p->weights_size = weights;
  return KILN_OK;
}

/* Copies each kept constant to its offset in one weights buffer. */
static kiln_status pack_weights(const kiln_graph *g, build_parts *p, kiln_error *err) {
  if (p->weights_size > SIZE_MAX || !(p->weights = kiln_calloc(1, (size_t)p->weights_size)))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder: out of memory for %llu bytes of weights; free memory and retry",
                     (unsigned long long)p->weights_size);
  for (uint32_t i = 0; i < g->n_tensors; i++) {
    const kiln_tensor_desc *t;
    if (p->map[i] < 0 ||
        (g->tensors[i].node != KILN_NODE_CONSTANT && g->tensors[i].node != KILN_NODE_STATE))
      continue;
    t = &p->plan.tensors[p->map[i]];
    if (t->nbytes) memcpy(p->weights + t->offset, g->tensors[i].data, (size_t)t->nbytes);
  }
  return KILN_OK;
}

/* The live ops in order, renumbered; each FUSED op's program moves from its graph constant to
 * the plan's words. A static plan's ops carry no symbolic attributes. */
static kiln_status number_ops(const kiln_graph *g, build_parts *p, kiln_error *err) {
  uint32_t step = 0, word = 0;
  kiln_plan *plan = &p->plan;
  for (uint32_t i = 0; i < g->n_ops; i++)
    if (!g->dead[i] && g->ops[i].kind == KILN_OP_FUSED) plan->n_words += (uint32_t)g->ops[i].iattr[1];
  if (!(plan->words = kiln_calloc(plan->n_words, sizeof *plan->words)))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder: out of memory for %u program words; free memory and retry",
                     (unsigned)plan->n_words);
  for (uint32_t i = 0; i < g->n_ops; i++) {
    kiln_op *op;
    if (g->dead[i]) continue;
    op = &plan->ops[step++];
    *op = g->ops[i];
    if (!plan->n_symbols) memset(op->iattr_sym, 0, sizeof op->iattr_sym);
    if (op->kind == KILN_OP_FUSED) {
      memcpy(plan->words + word, g->tensors[op->iattr[0]].data, (size_t)op->iattr[1] * 8u);
      op->iattr[0] = word;
      word += (uint32_t)op->iattr[1];
    }
    op->output = (uint32_t)p->map[op->output];
    for (uint32_t k = 0; k < op->n_inputs; k++) op->inputs[k] = (uint32_t)p->map[op->inputs[k]];
  }
  return KILN_OK;
}

/* 1 when op is a view (view.h) of its input at the same byte at the upper and, for a dynamic
 * plan, the lower bounds (min_ops and min_tensors): the engines place a view once. */
static int fixed_view(const kiln_plan *plan, uint32_t i, const kiln_op *min_ops,
                      const kiln_tensor_desc *min_tensors, uint64_t *at) {
  const kiln_op *op = &plan->ops[i];
  uint64_t at_min;
  if (!kiln_op_is_view(op, &plan->tensors[op->inputs[0]], at)) return 0;
  return !min_ops || (kiln_op_is_view(&min_ops[i], &min_tensors[op->inputs[0]], &at_min) &&
                      at_min == *at);
}

/* The arena laid out by liveness; a view of an arena tensor shares its input's block. */
static kiln_status plan_arena(build_parts *p, const kiln_op *min_ops,
                              const kiln_tensor_desc *min_tensors, kiln_error *err) {
  kiln_plan *plan = &p->plan;
  kiln_mem_block *blocks = kiln_calloc(plan->n_tensors, sizeof *blocks);
  int32_t *block_of = kiln_calloc(plan->n_tensors, sizeof *block_of);
  uint64_t *view_at = kiln_calloc(plan->n_tensors, sizeof *view_at); /* bytes into the block */
  uint32_t n_blocks = 0;
  kiln_status s = KILN_OK;
  if (!blocks || !block_of || !view_at) {
    s = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                  "builder: out of memory planning %u tensors; free memory and retry",
                  (unsigned)plan->n_tensors);
    goto done;
  }
  for (uint32_t t = 0; t < plan->n_tensors; t++) block_of[t] = -1;
  for (uint32_t step = 0; step < plan->n_ops; step++) {
    const kiln_op *op = &plan->ops[step];
    for (uint32_t k = 0; k < op->n_inputs; k++)
      if (block_of[op->inputs[k]] >= 0) blocks[block_of[op->inputs[k]]].last = step;
    if (plan->tensors[op->output].storage == KILN_STORE_ARENA) {
      uint64_t at;
      if (block_of[op->inputs[0]] >= 0 && fixed_view(plan, step, min_ops, min_tensors, &at)) {
        /* a view: inside its input's block, which now lives as long as the view is read */
        block_of[op->output] = block_of[op->inputs[0]];
        view_at[op->output] = view_at[op->inputs[0]] + at;
      } else {
        blocks[n_blocks] = (kiln_mem_block){plan->tensors[op->output].nbytes, step, step, 0};
        block_of[op->output] = (int32_t)n_blocks++;
      }
    }
  }
  if ((s = kiln_memplan(blocks, n_blocks, KILN_ARENA_ALIGN, &plan->arena_size, err))) goto done;
  for (uint32_t t = 0; t < plan->n_tensors; t++)
    if (block_of[t] >= 0) plan->tensors[t].offset = blocks[block_of[t]].offset + view_at[t];
done:
  free(blocks);
  free(block_of);
  free(view_at);
  return s;
}

/* Ops numbered, a dynamic plan's dims derived from its symbols, then the arena. */
static kiln_status plan_ops_and_arena(const kiln_graph *g, build_parts *p, kiln_error *err) {
  kiln_plan *plan = &p->plan;
  kiln_tensor_desc *min_tensors = NULL;
  kiln_op *min_ops = NULL;
  kiln_status s;
  if ((s = number_ops(g, p, err))) return s;
  if (!plan->n_symbols) return plan_arena(p, NULL, NULL, err);
  min_tensors = kiln_calloc(plan->n_tensors ? plan->n_tensors : 1, sizeof *min_tensors);
  min_ops = kiln_calloc(plan->n_ops ? plan->n_ops : 1, sizeof *min_ops);
  if (!min_tensors || !min_ops)
    s = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                  "builder: out of memory for the lower-bound shapes of %u tensors; free memory",
                  (unsigned)plan->n_tensors);
  else if ((s = kiln_derive_symbols(plan, min_tensors, min_ops, err)) == KILN_OK)
    s = plan_arena(p, min_ops, min_tensors, err);
  free(min_tensors);
  free(min_ops);
  return s;
}

/* Each symbol sizes some input dim, so that a call's inputs give its value. */
static kiln_status take_symbols(const kiln_builder *b, const kiln_graph *g, kiln_plan *plan,
                                kiln_error *err) {
  for (uint32_t k = 0; k < b->n_symbols; k++) {
    int used = 0;
    for (uint32_t i = 0; i < g->n_inputs && !used; i++) {
      const kiln_tensor_desc *t = &g->tensors[g->inputs[i].tensor].desc;
      for (int32_t d = 0; d < t->rank; d++) used |= t->sym[d].symbol == k + 1;
    }
    if (!used)
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "builder build: symbol %.15s sizes no input dim, so no call could give its "
                       "value; use it in an input's dims or drop it",
                       b->symbols[k].name);
  }
  plan->n_symbols = b->n_symbols;
  memcpy(plan->symbols, b->symbols, sizeof plan->symbols);
  return KILN_OK;
}

/* The metadata JSON: bindings are the inputs, then the outputs, in the order they were named. */
static kiln_status write_metadata(const kiln_graph *g, const kiln_build_options *opts,
                                  char **json, size_t *json_len, kiln_error *err) {
  kiln_metadata *md = kiln_calloc(1, sizeof *md);
  kiln_status s;
  if (!md)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder: out of memory for the metadata; free memory and retry");
  memcpy(md->producer, "kiln " KILN_VERSION_STRING, sizeof("kiln " KILN_VERSION_STRING));
  md->device_id = opts->device_id;
  md->min_compute_capability =
      opts->min_compute_capability ? opts->min_compute_capability : DEFAULT_COMPUTE_CAPABILITY;
  md->allow_tf32 = opts->allow_tf32;
  md->n_bindings = g->n_inputs + g->n_outputs;
  for (uint32_t i = 0; i < md->n_bindings; i++) {
    const kiln_gbinding *gb = i < g->n_inputs ? &g->inputs[i] : &g->outputs[i - g->n_inputs];
    const kiln_tensor_desc *t = &g->tensors[gb->tensor].desc;
    kiln_binding *bd = &md->bindings[i];
    memcpy(bd->name, gb->name, sizeof bd->name);
    bd->kind = i < g->n_inputs ? KILN_IO_INPUT : KILN_IO_OUTPUT;
    bd->dtype = t->dtype;
    bd->rank = t->rank;
    for (int32_t d = 0; d < t->rank; d++) bd->shape[d] = bd->max_shape[d] = t->dims[d];
  }
  s = kiln_metadata_write(md, json, json_len, err);
  free(md);
  return s;
}

static kiln_status check_options(const kiln_build_options *o, kiln_error *err) {
  if (o->device_id < 0 || o->min_compute_capability < 0 || (o->allow_tf32 & ~1) || (o->fuse & ~1))
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "builder build: options device_id %d, min_compute_capability %d, allow_tf32 "
                     "%d, fuse %d; pass non-negative numbers and flags of 0 or 1",
                     (int)o->device_id, (int)o->min_compute_capability, o->allow_tf32, o->fuse);
  return KILN_OK;
}

/* Rewrites g: ops computing what an earlier op computed merged into it, constants folded, GEMMs
 * recognized, copies of what nothing writes dropped (so no clone hides a residual from its GEMM),
 * written-out activations made the op they compute, gathers and ANDs that give their input back
 * made views of it, outer products made multiplies, dead code removed, batch norms folded into
 * convolutions, epilogues fused (residuals through a flattening reshape too), dead code removed, convolutions
 * laid out channels-last, then SwiGLU's gate and up projections joined into one GEMM, repeated k
 * and v heads dropped (grouped-query attention), attention's head split and merge taken into the
 * SDPA, the reshape chains those leave folded and the copies they leave dropped, constant
 * attention masks that say only "causal" folded into the SDPA, written-out RMSNorms made RMS_NORM
 * ops, pointwise chains fused (after the epilogues, so a GEMM keeps its activation), pointwise ops
 * next to a norm fused into it, then linears of one input (attention's q, k and v) joined into one
 * GEMM whose outputs are column slices (after every pattern pass, so each saw the linears apart,
 * SwiGLU's gate and up among them; right before the grouping, as a linear joins only where its
 * slice is a view or the grouping will read its columns in place) and attention's head split taken
 * into the SDPA once more where they were its q, k and v (elsewhere its head merge alone), then
 * what remains of pointwise ops,
 * casts and views grouped into FUSED ops (in a dynamic plan, those whose index maps hold at every
 * size), and in a static plan sibling groups of one program over adjacent parts of their inputs
 * (a decode step's rotary embedding of q and of k) joined into one. */
static kiln_status run_passes(kiln_graph *g, const kiln_build_options *opts,
                              const kiln_builder *b, kiln_error *err) {
  kiln_status s;
  if (opts->fuse && (s = kiln_merge_common_ops(g, err))) return s;
  if ((s = kiln_fold_constants(g, err)) || (s = kiln_recognize_gemm(g, err))) return s;
  if (opts->fuse && ((s = kiln_drop_copies(g, err)) || (s = kiln_recognize_activations(g, err))))
    return s;
  if (opts->fuse && (s = kiln_fold_identity_ops(g, b->n_symbols != 0, err))) return s;
  if (opts->fuse && (s = kiln_outer_products_to_mul(g, err))) return s;
  /* dead first: a norm lowered onto the 2-d convolution of a 3-d one leaves the frames put back
   * for it unread, and a convolution folds only a norm that is its one reader */
  if (opts->fuse && ((s = kiln_graph_remove_dead(g, err)) || (s = kiln_fold_batch_norm(g, err))))
    return s;
  if (opts->fuse && (s = kiln_fuse_epilogues(g, err))) return s;
  if ((s = kiln_graph_remove_dead(g, err))) return s;
  if (opts->fuse && (s = kiln_layout_channels_last(g, err))) return s;
  if (opts->fuse && (s = kiln_fuse_swiglu(g, err))) return s;
  if (opts->fuse && (s = kiln_fuse_grouped_kv(g, err))) return s;
  if (opts->fuse && (s = kiln_fuse_attention(g, 0, err))) return s;
  if (opts->fuse && ((s = kiln_fold_reshapes(g, err)) || (s = kiln_drop_copies(g, err)) ||
                     (s = kiln_graph_remove_dead(g, err))))
    return s;
  if (opts->fuse && (s = kiln_fold_attention_masks(g, b->n_symbols != 0, err))) return s;
  if (opts->fuse && (s = kiln_fuse_rms_norms(g, err))) return s;
  if (opts->fuse && (s = kiln_fuse_pointwise(g, err))) return s;
  if (opts->fuse && (s = kiln_fuse_norms(g, err))) return s;
  if (opts->fuse && (s = kiln_merge_linears(g, b->n_symbols != 0, err))) return s;
  if (opts->fuse && ((s = kiln_fuse_attention(g, 1, err)) || (s = kiln_fold_reshapes(g, err)) ||
                     (s = kiln_graph_remove_dead(g, err))))
    return s;
  if (opts->fuse && (s = kiln_fuse_groups(g, b->symbols, b->n_symbols, err))) return s;
  return opts->fuse && b->n_symbols == 0 ? kiln_merge_fused_siblings(g, err) : KILN_OK;
}

kiln_status kiln_builder_build(kiln_builder *b, const kiln_build_options *opts, void **blob,
                               size_t *blob_size, kiln_error *err) {
  kiln_build_options defaults;
  kiln_graph *g = NULL;
  build_parts parts;
  void *plan_bytes = NULL;
  size_t plan_size = 0, json_len = 0;
  char *json = NULL;
  kiln_status s = check_builder(b, "build", err);
  memset(&parts, 0, sizeof parts);
  if (s) return s;
  if (!blob || !blob_size)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "builder build: blob or blob_size is NULL; pass where to write the blob");
  if (!opts) {
    kiln_build_options_default(&defaults);
    opts = &defaults;
  }
  if ((s = check_options(opts, err))) return s;
  if (b->graph.n_outputs == 0)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "builder build: no output is marked; call kiln_builder_mark_output for each "
                     "result");
  if (!(g = kiln_calloc(1, sizeof *g)) || kiln_graph_clone(&b->graph, g)) {
    s = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                  "builder build: out of memory copying %u tensors and %u ops; free memory and "
                  "retry",
                  (unsigned)b->graph.n_tensors, (unsigned)b->graph.n_ops);
    goto done;
  }
  if ((s = run_passes(g, opts, b, err)) || (s = place_states(g, err))) goto done;
  if (!(parts.map = kiln_calloc(g->n_tensors, sizeof *parts.map))) {
    s = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                  "builder build: out of memory numbering %u tensors; free memory and retry",
                  (unsigned)g->n_tensors);
    goto done;
  }
  if ((s = take_symbols(b, g, &parts.plan, err)) || (s = number_tensors(g, &parts, err)) ||
      (s = pack_weights(g, &parts, err)) ||
      (s = plan_ops_and_arena(g, &parts, err)) ||
      (s = kiln_plan_serialize(&parts.plan, &plan_bytes, &plan_size, err)) ||
      (s = write_metadata(g, opts, &json, &json_len, err)) ||
      (s = kiln_blob_write(json, json_len, plan_bytes, plan_size, parts.weights,
                           (size_t)parts.weights_size, blob, blob_size, err)))
    goto done;
  b->arena_size = parts.plan.arena_size;
done:
  if (g) kiln_graph_release(g);
  free(g);
  release_parts(&parts);
  free(plan_bytes);
  kiln_free(json);
  return s;
}
