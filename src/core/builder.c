/* The builder API: records inputs, constants and ops, inferring each op's shape as it is
 * added, then builds a blob: graph passes, memory plan, plan, metadata and weights. */
#include "core/alloc.h"
#include "core/fold.h"
#include "core/fold_batch_norm.h"
#include "core/fuse.h"
#include "core/fuse_attention.h"
#include "core/fuse_grouped_kv.h"
#include "core/fuse_swiglu.h"
#include "core/fuse_norm.h"
#include "core/fuse_pointwise.h"
#include "core/graph.h"
#include "core/internal.h"
#include "core/layout_channels_last.h"
#include "core/memplan.h"
#include "core/view.h"
#include "core/shape.h"
#include "core/utf8.h"

#include <stdlib.h>
#include <string.h>

#define DEFAULT_COMPUTE_CAPABILITY 80

struct kiln_builder {
  kiln_graph graph;
  uint64_t arena_size; /* of the last successful build */
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

int32_t kiln_builder_add_input(kiln_builder *b, const char *name, kiln_dtype dtype, int32_t rank,
                               const int64_t *dims, kiln_error *err) {
  kiln_tensor_desc desc;
  int32_t id;
  if (check_builder(b, "add_input", err) ||
      check_shape("add_input", dtype, rank, dims, &desc, err) || check_name(&b->graph, name, err))
    return -1;
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
                             uint32_t n_inputs, const int64_t *iattr, uint32_t n_iattr,
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
  for (uint32_t i = 0; i < n_iattr; i++) op.iattr[i] = iattr[i];
  for (uint32_t i = 0; i < n_fattr; i++) op.fattr[i] = fattr[i];
  if ((kind == KILN_OP_ADD || kind == KILN_OP_SUB) && n_fattr == 0) op.fattr[0] = 1.0; /* alpha */
  normalize_attrs(&op, in);
  site.index = index;
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
  int32_t id = -1;
  if (check_builder(b, "add_op", err) ||
      record_op(b, kind, inputs, n_inputs, iattr, n_iattr, fattr, n_fattr, &id, err))
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
    if ((s = record_op(b, KILN_OP_COPY, &tensor, 1, NULL, 0, NULL, 0, &tensor, err))) return s;
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

/* Numbers the tensors the plan keeps: inputs, constants live ops read, live op outputs. */
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
    if (p->map[i] < 0) continue;
    t = &p->plan.tensors[p->map[i]];
    *t = g->tensors[i].desc;
    t->storage = KILN_STORE_ARENA;
    t->io_index = 0;
    t->offset = 0;
    if (g->tensors[i].node == KILN_NODE_CONSTANT) {
      t->storage = KILN_STORE_WEIGHT;
      t->offset = weights = align_up(weights, KILN_WEIGHTS_ALIGN);
      weights += t->nbytes;
    }
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
    if (p->map[i] < 0 || g->tensors[i].node != KILN_NODE_CONSTANT) continue;
    t = &p->plan.tensors[p->map[i]];
    if (t->nbytes) memcpy(p->weights + t->offset, g->tensors[i].data, (size_t)t->nbytes);
  }
  return KILN_OK;
}

/* The live ops in order, renumbered, and the arena laid out by liveness; a view (view.h) of an
 * arena tensor shares its input's block. */
static kiln_status plan_ops_and_arena(const kiln_graph *g, build_parts *p, kiln_error *err) {
  kiln_plan *plan = &p->plan;
  kiln_mem_block *blocks = kiln_calloc(plan->n_tensors, sizeof *blocks);
  int32_t *block_of = kiln_calloc(plan->n_tensors, sizeof *block_of);
  uint64_t *view_at = kiln_calloc(plan->n_tensors, sizeof *view_at); /* bytes into the block */
  uint32_t n_blocks = 0, step = 0;
  kiln_status s = KILN_OK;
  if (!blocks || !block_of || !view_at) {
    s = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                  "builder: out of memory planning %u tensors; free memory and retry",
                  (unsigned)plan->n_tensors);
    goto done;
  }
  for (uint32_t t = 0; t < plan->n_tensors; t++) block_of[t] = -1;
  for (uint32_t i = 0; i < g->n_ops; i++) {
    kiln_op *op;
    if (g->dead[i]) continue;
    op = &plan->ops[step];
    *op = g->ops[i];
    op->output = (uint32_t)p->map[op->output];
    for (uint32_t k = 0; k < op->n_inputs; k++) {
      op->inputs[k] = (uint32_t)p->map[op->inputs[k]];
      if (block_of[op->inputs[k]] >= 0) blocks[block_of[op->inputs[k]]].last = step;
    }
    if (plan->tensors[op->output].storage == KILN_STORE_ARENA) {
      uint64_t at;
      if (block_of[op->inputs[0]] >= 0 &&
          kiln_op_is_view(op, &plan->tensors[op->inputs[0]], &at)) {
        /* a view: inside its input's block, which now lives as long as the view is read */
        block_of[op->output] = block_of[op->inputs[0]];
        view_at[op->output] = view_at[op->inputs[0]] + at;
      } else {
        blocks[n_blocks] = (kiln_mem_block){plan->tensors[op->output].nbytes, step, step, 0};
        block_of[op->output] = (int32_t)n_blocks++;
      }
    }
    step++;
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

/* Rewrites g: constants folded, GEMMs recognized, batch norms folded into convolutions,
 * epilogues fused, dead code removed, convolutions laid out channels-last, then SwiGLU's gate and up projections joined into one
 * GEMM, repeated k and v heads dropped (grouped-query attention), attention's head split and
 * merge taken into the SDPA, pointwise chains fused (after the epilogues, so a GEMM keeps its
 * activation), then pointwise ops next to a norm fused into it. */
static kiln_status run_passes(kiln_graph *g, const kiln_build_options *opts, kiln_error *err) {
  kiln_status s;
  if ((s = kiln_fold_constants(g, err)) || (s = kiln_recognize_gemm(g, err))) return s;
  if (opts->fuse && (s = kiln_fold_batch_norm(g, err))) return s;
  if (opts->fuse && (s = kiln_fuse_epilogues(g, err))) return s;
  if ((s = kiln_graph_remove_dead(g, err))) return s;
  if (opts->fuse && (s = kiln_layout_channels_last(g, err))) return s;
  if (opts->fuse && (s = kiln_fuse_swiglu(g, err))) return s;
  if (opts->fuse && (s = kiln_fuse_grouped_kv(g, err))) return s;
  if (opts->fuse && (s = kiln_fuse_attention(g, err))) return s;
  if (opts->fuse && (s = kiln_fuse_pointwise(g, err))) return s;
  return opts->fuse ? kiln_fuse_norms(g, err) : KILN_OK;
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
  if ((s = run_passes(g, opts, err))) goto done;
  if (!(parts.map = kiln_calloc(g->n_tensors, sizeof *parts.map))) {
    s = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                  "builder build: out of memory numbering %u tensors; free memory and retry",
                  (unsigned)g->n_tensors);
    goto done;
  }
  if ((s = number_tensors(g, &parts, err)) || (s = pack_weights(g, &parts, err)) ||
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
