/* Shape and dtype inference: one function per op family, PyTorch semantics. */
#include "runtime/shape.h"

#include "runtime/index_layout.h"
#include "runtime/internal.h"
#include "runtime/linear_inputs.h"
#include "runtime/pointwise_steps.h"
#include "runtime/sdpa_layout.h"
#include "runtime/vision_shape.h"

#include <math.h>
#include <stdio.h>

/* What each op accepts: input count and integer attribute count ranges. */
typedef struct op_arity {
  uint8_t min_inputs, max_inputs, min_iattr, max_iattr;
} op_arity;

static const op_arity arity[KILN_OP_COUNT] = {
    [KILN_OP_LINEAR] = {2, 4, 0, 2},
    [KILN_OP_MATMUL] = {2, 2, 0, 0},
    [KILN_OP_ADD] = {2, 2, 0, 0},
    [KILN_OP_SUB] = {2, 2, 0, 0},
    [KILN_OP_MUL] = {2, 2, 0, 0},
    [KILN_OP_DIV] = {2, 2, 0, 0},
    [KILN_OP_RELU] = {1, 1, 0, 0},
    [KILN_OP_GELU] = {1, 1, 0, 1},
    [KILN_OP_SILU] = {1, 1, 0, 0},
    [KILN_OP_SIGMOID] = {1, 1, 0, 0},
    [KILN_OP_TANH] = {1, 1, 0, 0},
    [KILN_OP_EXP] = {1, 1, 0, 0},
    [KILN_OP_SQRT] = {1, 1, 0, 0},
    [KILN_OP_RSQRT] = {1, 1, 0, 0},
    [KILN_OP_NEG] = {1, 1, 0, 0},
    [KILN_OP_POW] = {1, 1, 0, 0},
    [KILN_OP_CAST] = {1, 1, 1, 1},
    [KILN_OP_SOFTMAX] = {1, 1, 1, 1},
    [KILN_OP_LOG_SOFTMAX] = {1, 1, 1, 1},
    [KILN_OP_LAYER_NORM] = {1, KILN_MAX_OP_INPUTS, 2, KILN_NORM_MAX_IATTR},
    [KILN_OP_RMS_NORM] = {1, KILN_MAX_OP_INPUTS, 2, KILN_NORM_MAX_IATTR},
    [KILN_OP_SUM] = {1, 1, 2, 2},
    [KILN_OP_MEAN] = {1, 1, 2, 2},
    [KILN_OP_AMAX] = {1, 1, 2, 2},
    [KILN_OP_RESHAPE] = {1, 1, 0, KILN_MAX_RANK},
    [KILN_OP_PERMUTE] = {1, 1, 0, KILN_MAX_RANK},
    [KILN_OP_EXPAND] = {1, 1, 0, KILN_MAX_RANK},
    [KILN_OP_CAT] = {1, KILN_MAX_OP_INPUTS, 1, 1},
    [KILN_OP_SLICE] = {1, 1, 4, 4},
    [KILN_OP_SELECT] = {1, 1, 2, 2},
    [KILN_OP_COPY] = {1, 1, 0, 0},
    [KILN_OP_EMBEDDING] = {2, 2, 0, 0},
    [KILN_OP_INDEX_SELECT] = {2, 2, 1, 1},
    [KILN_OP_WHERE] = {3, 3, 0, 0},
    [KILN_OP_SDPA] = {1, 4, 2, 3},
    [KILN_OP_POINTWISE] = {1, KILN_MAX_OP_INPUTS, 1, KILN_PW_MAX_STEPS},
    [KILN_OP_FUSED] = {1, KILN_MAX_OP_INPUTS, 2, 2},
    [KILN_OP_COMPARE] = {2, 2, 1, 1},
    [KILN_OP_LOGICAL] = {1, 2, 1, 1},
    [KILN_OP_BITWISE] = {1, 2, 1, 1},
    [KILN_OP_ABS] = {1, 1, 0, 0},
    [KILN_OP_LOG] = {1, 1, 0, 0},
    [KILN_OP_COS] = {1, 1, 0, 0},
    [KILN_OP_SIN] = {1, 1, 0, 0},
    [KILN_OP_ERF] = {1, 1, 0, 0},
    [KILN_OP_HARDSWISH] = {1, 1, 0, 0},
    [KILN_OP_HARDSIGMOID] = {1, 1, 0, 0},
    [KILN_OP_MINIMUM] = {2, 2, 0, 0},
    [KILN_OP_MAXIMUM] = {2, 2, 0, 0},
    [KILN_OP_CONV] = {2, 4, 5, 8},
    [KILN_OP_CONV_TRANSPOSE] = {2, 4, 6, 9},
    [KILN_OP_BATCH_NORM] = {3, 5, 1, 1},
    [KILN_OP_MAX_POOL2D] = {1, 1, 5, 6},
    [KILN_OP_AVG_POOL2D] = {1, 1, 6, 7},
    [KILN_OP_ADAPTIVE_AVG_POOL2D] = {1, 1, 1, 2},
    [KILN_OP_UPSAMPLE_NEAREST2D] = {1, 1, 1, 2},
    [KILN_OP_UPSAMPLE_BILINEAR2D] = {1, 1, 2, 3},
    [KILN_OP_CUMSUM] = {1, 1, 2, 2},
    [KILN_OP_GATHER] = {2, 2, 1, 1},
    [KILN_OP_INDEX] = {2, KILN_MAX_OP_INPUTS, 1, 1},
    [KILN_OP_ARGMAX] = {1, 1, 2, 2},
    [KILN_OP_INDEX_COPY] = {3, 3, 1, 1},
};

/* One inference call: the op, its inputs, and how to word a refusal. */
typedef struct infer_ctx {
  const kiln_op *op;
  const kiln_tensor_desc *const *in;
  const char *stage;
  unsigned index;
  const char *name;
  kiln_status status;
  const char *remedy;
  kiln_error *err;
} infer_ctx;

/* Two shapes printed in one message. */
typedef struct shape_text {
  char a[48], b[48];
} shape_text;

int kiln_dtype_is_float(kiln_dtype dtype) {
  return dtype == KILN_F32 || dtype == KILN_F16 || dtype == KILN_BF16;
}

static int dtype_is_index(kiln_dtype dtype) { return dtype == KILN_I32 || dtype == KILN_I64; }

const char *kiln_shape_str(int32_t rank, const int64_t *dims, char *buf, size_t size) {
  size_t used = 0;
  if (size == 0) return buf;
  buf[0] = '\0';
  for (int32_t i = -1; i <= rank && used < size; i++) {
    int n;
    if (i == -1) n = snprintf(buf + used, size - used, "[");
    else if (i == rank) n = snprintf(buf + used, size - used, "]");
    else n = snprintf(buf + used, size - used, i ? ",%lld" : "%lld", (long long)dims[i]);
    if (n < 0) break;
    used += (size_t)n;
  }
  return buf;
}

/* Element count, or -1 when a dim is outside 0..KILN_DIM_MAX or the count overflows. */
static int elem_count(int32_t rank, const int64_t *dims, uint64_t *count) {
  uint64_t n = 1;
  int overflow = 0;
  for (int32_t i = 0; i < rank; i++) {
    if (dims[i] < 0 || dims[i] > KILN_DIM_MAX) return -1;
    if (kiln_mul_u64(n, (uint64_t)dims[i], &n)) overflow = 1;
  }
  for (int32_t i = 0; i < rank && overflow; i++)
    if (dims[i] == 0) overflow = 0, n = 0;
  if (overflow || n > (uint64_t)INT64_MAX) return -1;
  *count = n;
  return 0;
}

int kiln_shape_nbytes(kiln_dtype dtype, int32_t rank, const int64_t *dims, uint64_t *nbytes) {
  uint64_t count, bytes;
  size_t size = kiln_dtype_size(dtype);
  if (size == 0 || rank < 0 || rank > KILN_MAX_RANK || elem_count(rank, dims, &count)) return -1;
  if (kiln_mul_u64(count, size, &bytes) || bytes > (uint64_t)INT64_MAX) return -1;
  *nbytes = bytes;
  return 0;
}

/* Right-aligned PyTorch broadcasting of (rank, dims) with t, in place; returns the index of
 * the first incompatible output dim, or -1. */
static int broadcast_into(int32_t *rank, int64_t *dims, const kiln_tensor_desc *t) {
  int32_t r = *rank > t->rank ? *rank : t->rank;
  int64_t out[KILN_MAX_RANK];
  for (int32_t k = 0; k < r; k++) {
    int64_t a = k < *rank ? dims[*rank - 1 - k] : 1;
    int64_t b = k < t->rank ? t->dims[t->rank - 1 - k] : 1;
    if (a != b && a != 1 && b != 1) return r - 1 - k;
    out[r - 1 - k] = a == 1 ? b : a;
  }
  *rank = r;
  for (int32_t i = 0; i < r; i++) dims[i] = out[i];
  return -1;
}

static const char *shape_of(const kiln_tensor_desc *t, char *buf) {
  return kiln_shape_str(t->rank, t->dims, buf, 48);
}

static kiln_status need_float(const infer_ctx *c, uint32_t i) {
  kiln_dtype dt = c->in[i]->dtype;
  if (kiln_dtype_is_float(dt)) return KILN_OK;
  return kiln_fail(c->err, c->status,
                   "%.7s op %u (%.12s): input %u is %.4s but the op needs f32, f16 or bf16; "
                   "cast it first%.24s",
                   c->stage, c->index, c->name, (unsigned)i, kiln_dtype_name(dt), c->remedy);
}

static kiln_status need_same_dtype(const infer_ctx *c, uint32_t i, uint32_t j) {
  kiln_dtype a = c->in[i]->dtype, b = c->in[j]->dtype;
  if (a == b) return KILN_OK;
  return kiln_fail(c->err, c->status,
                   "%.7s op %u (%.12s): input %u is %.4s but input %u is %.4s; cast them to one "
                   "dtype first%.24s",
                   c->stage, c->index, c->name, (unsigned)i, kiln_dtype_name(a), (unsigned)j,
                   kiln_dtype_name(b), c->remedy);
}

/* Every input float and of input 0's dtype. */
static kiln_status need_floats_alike(const infer_ctx *c, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    kiln_status s = need_float(c, i);
    if (s == KILN_OK && i) s = need_same_dtype(c, i, 0);
    if (s) return s;
  }
  return KILN_OK;
}

static kiln_status need_min_rank(const infer_ctx *c, uint32_t i, int32_t min) {
  if (c->in[i]->rank >= min) return KILN_OK;
  return kiln_fail(c->err, c->status,
                   "%.7s op %u (%.12s): input %u has rank %d but the op needs rank %d or more%.24s",
                   c->stage, c->index, c->name, (unsigned)i, (int)c->in[i]->rank, (int)min,
                   c->remedy);
}

static kiln_status need_dim(const infer_ctx *c, int64_t dim, uint32_t i) {
  char sa[48];
  if (dim >= 0 && dim < c->in[i]->rank) return KILN_OK;
  return kiln_fail(c->err, c->status,
                   "%.7s op %u (%.12s): dim %lld is outside 0..%d of input %u %.40s%.24s",
                   c->stage, c->index, c->name, (long long)dim, (int)c->in[i]->rank - 1,
                   (unsigned)i, shape_of(c->in[i], sa), c->remedy);
}

static kiln_status need_flag(const infer_ctx *c, uint32_t slot, int64_t max) {
  int64_t v = c->op->iattr[slot];
  if (v >= 0 && v <= max) return KILN_OK;
  return kiln_fail(c->err, c->status,
                   "%.7s op %u (%.12s): attribute iattr%u is %lld but must be 0..%lld%.24s",
                   c->stage, c->index, c->name, (unsigned)slot, (long long)v, (long long)max,
                   c->remedy);
}

static void set_shape(kiln_tensor_desc *out, kiln_dtype dtype, int32_t rank, const int64_t *dims) {
  out->dtype = dtype;
  out->rank = rank;
  for (int32_t i = 0; i < KILN_MAX_RANK; i++) out->dims[i] = i < rank ? dims[i] : 0;
}

static kiln_status infer_linear(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0], *w = c->in[1];
  shape_text t;
  kiln_status s = need_floats_alike(c, c->op->n_inputs);
  if (s || (s = need_min_rank(c, 0, 1)) || (s = need_flag(c, 0, KILN_ACT_SWIGLU))) return s;
  if (w->rank != 2)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): the weight must be 2-D [N,K] but has shape %.40s%.24s",
                     c->stage, c->index, c->name, shape_of(w, t.a), c->remedy);
  if (x->dims[x->rank - 1] != w->dims[1])
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): input 0 has %lld columns but the weight %.40s expects "
                     "%lld; the weight must be [N,K] with K = the input's last dim%.24s",
                     c->stage, c->index, c->name, (long long)x->dims[x->rank - 1],
                     shape_of(w, t.a), (long long)w->dims[1], c->remedy);
  int residual = kiln_linear_has_residual(c->op);
  if (c->op->n_iattr > 1 && (s = need_flag(c, 1, 1))) return s;
  if (residual && (c->op->n_inputs < 3 || c->op->iattr[0] != KILN_ACT_NONE))
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): a residual (iattr1 1) needs a third input and no "
                     "activation, but the op has %u inputs and activation %lld%.24s",
                     c->stage, c->index, c->name, (unsigned)c->op->n_inputs,
                     (long long)c->op->iattr[0], c->remedy);
  if (!residual && c->op->n_inputs > 3)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): 4 inputs need iattr1 1 (x, w, bias, residual)%.24s",
                     c->stage, c->index, c->name, c->remedy);
  if (kiln_linear_has_bias(c->op) && (c->in[2]->rank != 1 || c->in[2]->dims[0] != w->dims[0]))
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): the bias has shape %.40s but the weight %.40s needs "
                     "[%lld]%.24s",
                     c->stage, c->index, c->name, shape_of(c->in[2], t.a), shape_of(w, t.b),
                     (long long)w->dims[0], c->remedy);
  int swiglu = c->op->iattr[0] == KILN_ACT_SWIGLU;
  if (swiglu && (c->op->n_inputs != 2 || w->dims[0] % 2 != 0))
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): SwiGLU takes x and one weight of 2N rows (gate over up), "
                     "but has %u inputs and weight %.40s%.24s",
                     c->stage, c->index, c->name, (unsigned)c->op->n_inputs, shape_of(w, t.a),
                     c->remedy);
  set_shape(out, x->dtype, x->rank, x->dims);
  out->dims[x->rank - 1] = swiglu ? w->dims[0] / 2 : w->dims[0];
  if (residual) {
    const kiln_tensor_desc *r = c->in[c->op->n_inputs - 1];
    int same = r->rank == out->rank;
    for (int32_t d = 0; same && d < r->rank; d++) same = r->dims[d] == out->dims[d];
    if (!same)
      return kiln_fail(c->err, c->status,
                       "%.7s op %u (%.12s): the residual has shape %.40s but the output is "
                       "%.40s%.24s",
                       c->stage, c->index, c->name, shape_of(r, t.a), shape_of(out, t.b),
                       c->remedy);
  }
  return KILN_OK;
}

static kiln_status infer_matmul(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *a = c->in[0], *b = c->in[1];
  shape_text t;
  kiln_tensor_desc ab = *a, bb = *b;
  int32_t rank;
  int64_t dims[KILN_MAX_RANK];
  kiln_status s = need_floats_alike(c, 2);
  if (s || (s = need_min_rank(c, 0, 2)) || (s = need_min_rank(c, 1, 2))) return s;
  if (a->dims[a->rank - 1] != b->dims[b->rank - 2])
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): a %.40s has %lld columns but b %.40s has %lld rows%.24s",
                     c->stage, c->index, c->name, shape_of(a, t.a), (long long)a->dims[a->rank - 1],
                     shape_of(b, t.b), (long long)b->dims[b->rank - 2], c->remedy);
  ab.rank -= 2;
  bb.rank -= 2;
  rank = ab.rank;
  for (int32_t i = 0; i < rank; i++) dims[i] = ab.dims[i];
  if (broadcast_into(&rank, dims, &bb) >= 0)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): the batch dims of a %.40s and b %.40s do not "
                     "broadcast%.24s",
                     c->stage, c->index, c->name, shape_of(a, t.a), shape_of(b, t.b), c->remedy);
  dims[rank] = a->dims[a->rank - 2];
  dims[rank + 1] = b->dims[b->rank - 1];
  set_shape(out, a->dtype, rank + 2, dims);
  return KILN_OK;
}

/* The output of an elementwise op of one or two inputs: their broadcast shape, of dtype. */
static kiln_status broadcast_inputs(const infer_ctx *c, kiln_dtype dtype, kiln_tensor_desc *out) {
  const kiln_tensor_desc *a = c->in[0];
  shape_text t;
  int32_t rank = a->rank;
  int64_t dims[KILN_MAX_RANK];
  for (int32_t i = 0; i < rank; i++) dims[i] = a->dims[i];
  if (c->op->n_inputs > 1) {
    int bad = broadcast_into(&rank, dims, c->in[1]);
    if (bad >= 0)
      return kiln_fail(c->err, c->status,
                       "%.7s op %u (%.12s): shapes %.40s and %.40s do not broadcast (output dim "
                       "%d)%.24s",
                       c->stage, c->index, c->name, shape_of(a, t.a), shape_of(c->in[1], t.b),
                       bad, c->remedy);
  }
  set_shape(out, dtype, rank, dims);
  return KILN_OK;
}

/* ADD, SUB, MUL, DIV, MINIMUM, MAXIMUM: one dtype in and out; DIV only on floats, MINIMUM and
 * MAXIMUM on bool too. */
static kiln_status infer_binary(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *a = c->in[0];
  kiln_op_kind kind = c->op->kind;
  int min_max = kind == KILN_OP_MINIMUM || kind == KILN_OP_MAXIMUM;
  int integer_ok = kind != KILN_OP_DIV && (dtype_is_index(a->dtype) ||
                                           (min_max && a->dtype == KILN_BOOL));
  kiln_status s = need_same_dtype(c, 1, 0);
  if (s) return s;
  if (!integer_ok && (s = need_float(c, 0))) return s;
  if ((kind == KILN_OP_ADD || kind == KILN_OP_SUB) && dtype_is_index(a->dtype) &&
      c->op->fattr[0] != floor(c->op->fattr[0]))
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): alpha %g is not a whole number but the inputs are "
                     "%.4s%.24s",
                     c->stage, c->index, c->name, c->op->fattr[0], kiln_dtype_name(a->dtype),
                     c->remedy);
  return broadcast_inputs(c, a->dtype, out);
}

/* COMPARE: two inputs of one dtype -> bool. */
static kiln_status infer_compare(const infer_ctx *c, kiln_tensor_desc *out) {
  kiln_status s = need_flag(c, 0, KILN_CMP_GE);
  if (s || (s = need_same_dtype(c, 1, 0))) return s;
  return broadcast_inputs(c, KILN_BOOL, out);
}

/* LOGICAL (any dtypes -> bool) and BITWISE (one dtype of bool, i32 or i64): NOT takes one
 * input, AND, OR and XOR two. */
static kiln_status infer_bool_op(const infer_ctx *c, kiln_tensor_desc *out) {
  int64_t which = c->op->iattr[0];
  uint32_t want = which == KILN_BOOL_NOT ? 1u : 2u;
  kiln_dtype dt = c->in[0]->dtype;
  kiln_status s = need_flag(c, 0, KILN_BOOL_NOT);
  if (s) return s;
  if (c->op->n_inputs != want)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): iattr0 %lld (0 and, 1 or, 2 xor, 3 not) takes %u "
                     "inputs but the op has %u%.24s",
                     c->stage, c->index, c->name, (long long)which, (unsigned)want,
                     (unsigned)c->op->n_inputs, c->remedy);
  if (c->op->kind == KILN_OP_LOGICAL) return broadcast_inputs(c, KILN_BOOL, out);
  if (want == 2 && (s = need_same_dtype(c, 1, 0))) return s;
  if (dt != KILN_BOOL && !dtype_is_index(dt))
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): input 0 is %.4s but the op needs bool, i32 or i64; "
                     "cast it first%.24s",
                     c->stage, c->index, c->name, kiln_dtype_name(dt), c->remedy);
  return broadcast_inputs(c, dt, out);
}

static kiln_status infer_pointwise(const infer_ctx *c, kiln_tensor_desc *out) {
  int integer_ok = c->op->kind == KILN_OP_ABS && dtype_is_index(c->in[0]->dtype);
  kiln_status s = integer_ok ? KILN_OK : need_float(c, 0);
  if (s) return s;
  if (c->op->kind == KILN_OP_GELU && (s = need_flag(c, 0, 1))) return s;
  set_shape(out, c->in[0]->dtype, c->in[0]->rank, c->in[0]->dims);
  return KILN_OK;
}

static kiln_status infer_cast(const infer_ctx *c, kiln_tensor_desc *out) {
  kiln_status s = need_flag(c, 0, KILN_DTYPE_COUNT - 1);
  if (s) return s;
  set_shape(out, (kiln_dtype)c->op->iattr[0], c->in[0]->rank, c->in[0]->dims);
  return KILN_OK;
}

static kiln_status infer_softmax(const infer_ctx *c, kiln_tensor_desc *out) {
  kiln_status s = need_float(c, 0);
  if (s || (s = need_dim(c, c->op->iattr[0], 0))) return s;
  set_shape(out, c->in[0]->dtype, c->in[0]->rank, c->in[0]->dims);
  return KILN_OK;
}

static kiln_status infer_reduce(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0];
  int64_t mask = c->op->iattr[0];
  int32_t rank = 0;
  int64_t dims[KILN_MAX_RANK];
  kiln_status s = need_float(c, 0);
  if (s || (s = need_flag(c, 1, 1))) return s;
  if (mask < 0 || (mask >> x->rank) != 0 || (mask == 0 && x->rank > 0))
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): dim mask %lld must name one or more of the %d dims "
                     "(bit i reduces dim i)%.24s",
                     c->stage, c->index, c->name, (long long)mask, (int)x->rank, c->remedy);
  for (int32_t i = 0; i < x->rank; i++) {
    if (!((mask >> i) & 1)) {
      dims[rank++] = x->dims[i];
      continue;
    }
    if (c->op->kind == KILN_OP_AMAX && x->dims[i] == 0)
      return kiln_fail(c->err, c->status,
                       "%.7s op %u (%.12s): reduces dim %d of size 0, which has no maximum%.24s",
                       c->stage, c->index, c->name, (int)i, c->remedy);
    if (c->op->iattr[1]) dims[rank++] = 1;
  }
  set_shape(out, x->dtype, rank, dims);
  return KILN_OK;
}

static kiln_status infer_reshape(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0];
  int32_t rank = (int32_t)c->op->n_iattr;
  uint64_t have = 0, want = 0;
  shape_text t;
  int bad = elem_count(rank, c->op->iattr, &want);
  elem_count(x->rank, x->dims, &have);
  if (bad || have != want)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): cannot reshape %.40s (%llu elements) into %.40s; the "
                     "element counts must match%.24s",
                     c->stage, c->index, c->name, shape_of(x, t.a), (unsigned long long)have,
                     kiln_shape_str(rank, c->op->iattr, t.b, sizeof t.b), c->remedy);
  set_shape(out, x->dtype, rank, c->op->iattr);
  return KILN_OK;
}

static kiln_status infer_permute(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0];
  int32_t rank = x->rank;
  int64_t dims[KILN_MAX_RANK];
  int seen[KILN_MAX_RANK] = {0};
  int ok = (int32_t)c->op->n_iattr == rank;
  shape_text t;
  for (int32_t i = 0; ok && i < rank; i++) {
    int64_t p = c->op->iattr[i];
    ok = p >= 0 && p < rank && !seen[p];
    if (ok) seen[p] = 1, dims[i] = x->dims[p];
  }
  if (!ok)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): %.40s is not a permutation of the %d dims of input 0 "
                     "%.40s%.24s",
                     c->stage, c->index, c->name,
                     kiln_shape_str((int32_t)c->op->n_iattr, c->op->iattr, t.a, sizeof t.a),
                     (int)rank, shape_of(x, t.b), c->remedy);
  set_shape(out, x->dtype, rank, dims);
  return KILN_OK;
}

static kiln_status infer_expand(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0];
  int32_t rank = (int32_t)c->op->n_iattr, lead = rank - x->rank;
  int ok = lead >= 0;
  shape_text t;
  for (int32_t i = 0; ok && i < rank; i++) {
    int64_t want = c->op->iattr[i];
    ok = want >= 0 && want <= KILN_DIM_MAX;
    if (ok && i >= lead) ok = x->dims[i - lead] == want || x->dims[i - lead] == 1;
  }
  if (!ok)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): cannot expand %.40s to %.40s; only size-1 dims expand "
                     "and new dims go in front%.24s",
                     c->stage, c->index, c->name, shape_of(x, t.a),
                     kiln_shape_str(rank, c->op->iattr, t.b, sizeof t.b), c->remedy);
  set_shape(out, x->dtype, rank, c->op->iattr);
  return KILN_OK;
}

static kiln_status infer_cat(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0];
  int64_t dim = c->op->iattr[0];
  uint64_t total = 0;
  shape_text t;
  kiln_status s = need_min_rank(c, 0, 1);
  if (s || (s = need_dim(c, dim, 0))) return s;
  for (uint32_t i = 0; i < c->op->n_inputs; i++) {
    const kiln_tensor_desc *p = c->in[i];
    int same = p->rank == x->rank;
    if ((s = need_same_dtype(c, i, 0))) return s;
    for (int32_t d = 0; same && d < x->rank; d++) same = d == dim || p->dims[d] == x->dims[d];
    if (!same)
      return kiln_fail(c->err, c->status,
                       "%.7s op %u (%.12s): input %u %.40s and input 0 %.40s differ in a dim "
                       "other than %lld%.24s",
                       c->stage, c->index, c->name, (unsigned)i, shape_of(p, t.a),
                       shape_of(x, t.b), (long long)dim, c->remedy);
    if (kiln_add_u64(total, (uint64_t)p->dims[dim], &total) || total > (uint64_t)KILN_DIM_MAX)
      return kiln_fail(c->err, c->status,
                       "%.7s op %u (%.12s): the joined dim %lld exceeds 2^62 elements%.24s",
                       c->stage, c->index, c->name, (long long)dim, c->remedy);
  }
  set_shape(out, x->dtype, x->rank, x->dims);
  out->dims[dim] = (int64_t)total;
  return KILN_OK;
}

static kiln_status infer_slice(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0];
  const int64_t *a = c->op->iattr;
  int64_t size, span;
  kiln_status s = need_dim(c, a[0], 0);
  if (s) return s;
  size = x->dims[a[0]];
  if (a[1] < 0 || a[1] > a[2] || a[2] > size || a[3] < 1)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): start %lld, end %lld, step %lld must satisfy 0 <= start "
                     "<= end <= %lld (dim %lld) and step >= 1%.24s",
                     c->stage, c->index, c->name, (long long)a[1], (long long)a[2],
                     (long long)a[3], (long long)size, (long long)a[0], c->remedy);
  span = a[2] - a[1];
  set_shape(out, x->dtype, x->rank, x->dims);
  out->dims[a[0]] = span / a[3] + (span % a[3] != 0);
  return KILN_OK;
}

static kiln_status infer_select(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0];
  int64_t dim = c->op->iattr[0], index = c->op->iattr[1];
  int32_t rank = 0;
  int64_t dims[KILN_MAX_RANK];
  kiln_status s = need_dim(c, dim, 0);
  if (s) return s;
  if (index < 0 || index >= x->dims[dim])
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): index %lld is outside 0..%lld of dim %lld%.24s",
                     c->stage, c->index, c->name, (long long)index, (long long)x->dims[dim] - 1,
                     (long long)dim, c->remedy);
  for (int32_t i = 0; i < x->rank; i++)
    if (i != dim) dims[rank++] = x->dims[i];
  set_shape(out, x->dtype, rank, dims);
  return KILN_OK;
}

static kiln_status need_indices(const infer_ctx *c, uint32_t i, int32_t max_rank) {
  const kiln_tensor_desc *idx = c->in[i];
  shape_text t;
  if (dtype_is_index(idx->dtype) && idx->rank <= max_rank) return KILN_OK;
  return kiln_fail(c->err, c->status,
                   "%.7s op %u (%.12s): indices (input %u) are %.4s %.40s but must be i32 or i64 "
                   "of rank %d or less%.24s",
                   c->stage, c->index, c->name, (unsigned)i, kiln_dtype_name(idx->dtype),
                   shape_of(idx, t.a), (int)max_rank, c->remedy);
}

static kiln_status infer_embedding(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *w = c->in[0], *idx = c->in[1];
  shape_text t;
  kiln_status s = need_indices(c, 1, KILN_MAX_RANK - 1);
  if (s) return s;
  if (w->rank != 2)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): the table (input 0) must be 2-D [V,D] but has shape "
                     "%.40s%.24s",
                     c->stage, c->index, c->name, shape_of(w, t.a), c->remedy);
  set_shape(out, w->dtype, idx->rank + 1, idx->dims);
  out->dims[idx->rank] = w->dims[1];
  return KILN_OK;
}

static kiln_status infer_index_select(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0];
  int64_t dim = c->op->iattr[0];
  kiln_status s = need_dim(c, dim, 0);
  if (s || (s = need_indices(c, 1, 1)) || (s = need_min_rank(c, 1, 1))) return s;
  set_shape(out, x->dtype, x->rank, x->dims);
  out->dims[dim] = c->in[1]->dims[0];
  return KILN_OK;
}

static kiln_status infer_cumsum(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0];
  int64_t to = c->op->iattr[1];
  kiln_status s = need_min_rank(c, 0, 1);
  if (s || (s = need_dim(c, c->op->iattr[0], 0))) return s;
  if (to < 0 || to >= KILN_DTYPE_COUNT || to == KILN_BOOL)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): the sum dtype iattr1 is %lld but must be a "
                     "kiln_dtype other than bool%.24s",
                     c->stage, c->index, c->name, (long long)to, c->remedy);
  set_shape(out, (kiln_dtype)to, x->rank, x->dims);
  return KILN_OK;
}

/* INDEX_COPY: values shaped as x but idx's length along dim, in x's dtype. */
static kiln_status infer_index_copy(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0], *v = c->in[2];
  int64_t dim = c->op->iattr[0];
  shape_text t;
  kiln_status s = need_min_rank(c, 0, 1);
  int fits;
  if (s || (s = need_dim(c, dim, 0)) || (s = need_indices(c, 1, 1)) ||
      (s = need_min_rank(c, 1, 1)) || (s = need_same_dtype(c, 0, 2)))
    return s;
  fits = v->rank == x->rank;
  for (int32_t d = 0; fits && d < x->rank; d++)
    fits = v->dims[d] == (d == dim ? c->in[1]->dims[0] : x->dims[d]);
  if (!fits)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): values %.40s must be input 0 %.40s with dim %lld the "
                     "index count%.24s",
                     c->stage, c->index, c->name, shape_of(v, t.a), shape_of(x, t.b),
                     (long long)dim, c->remedy);
  set_shape(out, x->dtype, x->rank, x->dims);
  return KILN_OK;
}

/* GATHER: indices of x's rank, no dim but the gathered one larger than x's. */
static kiln_status infer_gather(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0], *idx = c->in[1];
  int64_t dim = c->op->iattr[0];
  shape_text t;
  int fits = idx->rank == x->rank;
  kiln_status s = need_dim(c, dim, 0);
  if (s || (s = need_indices(c, 1, KILN_MAX_RANK))) return s;
  for (int32_t d = 0; fits && d < x->rank; d++) fits = d == dim || idx->dims[d] <= x->dims[d];
  if (!fits)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): indices %.40s must have the rank of input 0 %.40s and "
                     "no larger dim but %lld%.24s",
                     c->stage, c->index, c->name, shape_of(idx, t.a), shape_of(x, t.b),
                     (long long)dim, c->remedy);
  set_shape(out, x->dtype, idx->rank, idx->dims);
  return KILN_OK;
}

/* INDEX: one index tensor per set bit of the mask, laid out as index_layout.h says. */
static kiln_status infer_index(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0];
  uint32_t n_idx = c->op->n_inputs - 1, where = 0;
  kiln_index_layout lay;
  shape_text t;
  kiln_status s;
  for (uint32_t i = 1; i <= n_idx; i++) {
    if (c->in[i]->dtype == KILN_BOOL)
      return kiln_fail(c->err, c->status,
                       "%.7s op %u (%.12s): index input %u is a bool mask, whose result shape "
                       "depends on its values; a static plan cannot hold it%.24s",
                       c->stage, c->index, c->name, (unsigned)i, c->remedy);
    if ((s = need_indices(c, i, KILN_MAX_RANK))) return s;
  }
  switch (kiln_index_layout_of(x, c->in + 1, n_idx, c->op->iattr[0], &lay, &where)) {
  case KILN_INDEX_BAD_MASK:
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): dim mask %lld must name %u of the %d dims of input 0, "
                     "one per index input%.24s",
                     c->stage, c->index, c->name, (long long)c->op->iattr[0], (unsigned)n_idx,
                     (int)x->rank, c->remedy);
  case KILN_INDEX_NO_BROADCAST:
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): index input %u %.40s does not broadcast with the "
                     "index inputs before it%.24s",
                     c->stage, c->index, c->name, (unsigned)where, shape_of(c->in[where], t.a),
                     c->remedy);
  case KILN_INDEX_TOO_RANKED:
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): the result would have rank %d, above %d%.24s",
                     c->stage, c->index, c->name, (int)lay.rank, KILN_MAX_RANK, c->remedy);
  case KILN_INDEX_FINE: break;
  }
  set_shape(out, x->dtype, lay.rank, lay.dims);
  return KILN_OK;
}

static kiln_status infer_argmax(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0];
  int64_t dim = c->op->iattr[0];
  int32_t rank = 0;
  int64_t dims[KILN_MAX_RANK];
  kiln_status s = need_dim(c, dim, 0);
  if (s || (s = need_flag(c, 1, 1))) return s;
  if (x->dtype == KILN_BOOL)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): input 0 is bool, which has no argmax; cast it to i32 "
                     "first%.24s",
                     c->stage, c->index, c->name, c->remedy);
  if (x->dims[dim] == 0)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): dim %lld has size 0, which has no maximum%.24s",
                     c->stage, c->index, c->name, (long long)dim, c->remedy);
  for (int32_t d = 0; d < x->rank; d++)
    if (d != dim || c->op->iattr[1]) dims[rank++] = d == dim ? 1 : x->dims[d];
  set_shape(out, KILN_I64, rank, dims);
  return KILN_OK;
}

static kiln_status infer_where(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *cond = c->in[0], *a = c->in[1];
  int32_t rank = cond->rank;
  int64_t dims[KILN_MAX_RANK];
  shape_text t;
  kiln_status s = need_same_dtype(c, 2, 1);
  if (s) return s;
  if (cond->dtype != KILN_BOOL)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): the condition (input 0) is %.4s but must be bool%.24s",
                     c->stage, c->index, c->name, kiln_dtype_name(cond->dtype), c->remedy);
  for (int32_t i = 0; i < rank; i++) dims[i] = cond->dims[i];
  for (uint32_t i = 1; i < 3; i++)
    if (broadcast_into(&rank, dims, c->in[i]) >= 0)
      return kiln_fail(c->err, c->status,
                       "%.7s op %u (%.12s): input %u %.40s does not broadcast with %.40s%.24s",
                       c->stage, c->index, c->name, (unsigned)i, shape_of(c->in[i], t.a),
                       kiln_shape_str(rank, dims, t.b, sizeof t.b), c->remedy);
  set_shape(out, a->dtype, rank, dims);
  return KILN_OK;
}

/* Input `mask` of an SDPA is bool or input 0's dtype and broadcasts to the scores' shape. */
static kiln_status need_mask_fits(const infer_ctx *c, uint32_t mask, int32_t rank,
                                  const int64_t *scores) {
  const kiln_tensor_desc *m = c->in[mask];
  shape_text t;
  int fits = m->rank <= rank && (m->dtype == KILN_BOOL || m->dtype == c->in[0]->dtype);
  for (int32_t i = 0; fits && i < m->rank; i++) {
    int64_t want = scores[rank - m->rank + i];
    fits = m->dims[i] == want || m->dims[i] == 1;
  }
  if (fits) return KILN_OK;
  return kiln_fail(c->err, c->status,
                   "%.7s op %u (%.12s): the mask %.4s %.40s must be bool or the query dtype and "
                   "broadcast to the scores %.40s%.24s",
                   c->stage, c->index, c->name, kiln_dtype_name(m->dtype), shape_of(m, t.a),
                   kiln_shape_str(rank, scores, t.b, sizeof t.b), c->remedy);
}

/* SDPA with packed heads (iattr2 1): qkv [B, L, 3, H, E] and a mask broadcast to the scores
 * [B, H, L, L] -> [B, L, H, E]. */
static kiln_status infer_sdpa_packed(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0];
  int has_mask = c->op->n_inputs == 2;
  shape_text t;
  kiln_status s = need_float(c, 0);
  if (s || (s = need_flag(c, 0, 1)) || (s = need_flag(c, 1, 1))) return s;
  if (c->op->iattr[1] != has_mask || (has_mask && c->op->iattr[0]) || x->rank != 5 ||
      x->dims[2] != 3)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): packed heads take qkv [B,L,3,H,E] (got %.40s) and a "
                     "mask only as a 2nd input without causal%.24s",
                     c->stage, c->index, c->name, shape_of(x, t.a), c->remedy);
  if (has_mask) {
    int64_t scores[4] = {x->dims[0], x->dims[3], x->dims[1], x->dims[1]};
    if ((s = need_mask_fits(c, 1, 4, scores))) return s;
  }
  int64_t dims[4] = {x->dims[0], x->dims[1], x->dims[3], x->dims[4]};
  set_shape(out, x->dtype, 4, dims);
  return KILN_OK;
}

static kiln_status infer_sdpa(const infer_ctx *c, kiln_tensor_desc *out) {
  int64_t layout = kiln_sdpa_layout(c->op);
  if (layout != 0) {
    kiln_status s = need_flag(c, 2, 2);
    if (s || layout == 1) return s ? s : infer_sdpa_packed(c, out);
    if (c->in[0]->rank != 4)
      return kiln_fail(c->err, c->status,
                       "%.7s op %u (%.12s): heads last (iattr2 2) takes q [B,H,L,E] of rank 4, "
                       "not rank %d%.24s",
                       c->stage, c->index, c->name, (int)c->in[0]->rank, c->remedy);
  }
  if (c->op->n_inputs < 3)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): takes q, k, v and a mask, but has %u inputs%.24s",
                     c->stage, c->index, c->name, (unsigned)c->op->n_inputs, c->remedy);
  const kiln_tensor_desc *q = c->in[0], *k = c->in[1], *v = c->in[2];
  int32_t r = q->rank;
  int has_mask = c->op->n_inputs == 4;
  shape_text t;
  kiln_status s = need_floats_alike(c, 3);
  if (s || (s = need_min_rank(c, 0, 2)) || (s = need_flag(c, 0, 1)) || (s = need_flag(c, 1, 1)))
    return s;
  if (c->op->iattr[1] != has_mask || (has_mask && c->op->iattr[0]))
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): causal %lld and mask flag %lld with %u inputs; the mask "
                     "flag must match a 4th input and excludes causal%.24s",
                     c->stage, c->index, c->name, (long long)c->op->iattr[0],
                     (long long)c->op->iattr[1], (unsigned)c->op->n_inputs, c->remedy);
  int ok = k->rank == r && v->rank == r && k->dims[r - 1] == q->dims[r - 1] &&
           v->dims[r - 2] == k->dims[r - 2];
  for (int32_t i = 0; ok && i < r - 2; i++)
    ok = k->dims[i] == v->dims[i] &&
         kiln_sdpa_kv_group(r, i, q->dims[i], k->dims[i]) > 0;
  if (!ok)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): q %.40s, k %.40s and v must be [...,L,E], [...,S,E] and "
                     "[...,S,Ev], batch dims equal but k,v heads (dim -3) may divide q's%.24s",
                     c->stage, c->index, c->name, shape_of(q, t.a), shape_of(k, t.b), c->remedy);
  if (has_mask) {
    int64_t scores[KILN_MAX_RANK];
    for (int32_t i = 0; i < r; i++) scores[i] = q->dims[i];
    scores[r - 1] = k->dims[r - 2];
    if ((s = need_mask_fits(c, 3, r, scores))) return s;
  }
  set_shape(out, q->dtype, r, q->dims);
  out->dims[r - 1] = v->dims[r - 1];
  if (layout == 2) /* [B,H,L,Ev] written as [B,L,H,Ev] */
    out->dims[1] = q->dims[2], out->dims[2] = q->dims[1];
  return KILN_OK;
}

/* Messages for the faults kiln_pointwise_check finds. */
static kiln_status pointwise_fault(const infer_ctx *c, kiln_pw_fault fault, uint32_t where) {
  const kiln_op *op = c->op;
  kiln_pw_span span = {op->iattr, 0, 0, 1, 0.0};
  kiln_pw_span_of(op, &span);
  switch (fault) {
  case KILN_PW_BAD_STEP:
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): step %u is %lld, not a float unary, add, sub, mul or "
                     "div step with its own flags%.24s",
                     c->stage, c->index, c->name, (unsigned)where, (long long)span.steps[where],
                     c->remedy);
  case KILN_PW_BAD_INPUT:
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): step %u reads input %u but binary steps read inputs "
                     "%u..%u and unary steps 0%.24s",
                     c->stage, c->index, c->name, (unsigned)where,
                     (unsigned)KILN_PW_STEP_INPUT(span.steps[where]), (unsigned)span.first_operand,
                     (unsigned)op->n_inputs - 1, c->remedy);
  case KILN_PW_SECOND_POW:
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): step %u is a second pow but the op holds one "
                     "exponent%.24s",
                     c->stage, c->index, c->name, (unsigned)where, c->remedy);
  case KILN_PW_UNUSED_INPUT:
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): input %u is read by no step%.24s", c->stage, c->index,
                     c->name, (unsigned)where, c->remedy);
  case KILN_PW_BAD_FATTR:
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): fattr %g, %g: the pow exponent is set without a pow "
                     "step, or a pointwise op's fattr1 is not 0%.24s",
                     c->stage, c->index, c->name, op->fattr[0], op->fattr[1], c->remedy);
  case KILN_PW_BAD_SPLIT:
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): %lld steps before the norm but it carries %u steps "
                     "(at least 1)%.24s",
                     c->stage, c->index, c->name, (long long)op->iattr[2],
                     (unsigned)span.n_steps, c->remedy);
  case KILN_PW_FINE: break;
  }
  return KILN_OK;
}

/* Inputs first..n-1 (step operands) broadcast to input 0 without enlarging it. */
static kiln_status need_operands_fit(const infer_ctx *c, uint32_t first) {
  const kiln_tensor_desc *x = c->in[0];
  shape_text t;
  for (uint32_t i = first; i < c->op->n_inputs; i++) {
    int32_t rank = x->rank;
    int64_t dims[KILN_MAX_RANK];
    int same;
    for (int32_t d = 0; d < rank; d++) dims[d] = x->dims[d];
    same = broadcast_into(&rank, dims, c->in[i]) < 0 && rank == x->rank;
    for (int32_t d = 0; same && d < rank; d++) same = dims[d] == x->dims[d];
    if (!same)
      return kiln_fail(c->err, c->status,
                       "%.7s op %u (%.12s): input %u %.40s does not broadcast to input 0 %.40s "
                       "without enlarging it%.24s",
                       c->stage, c->index, c->name, (unsigned)i, shape_of(c->in[i], t.a),
                       shape_of(x, t.b), c->remedy);
  }
  return KILN_OK;
}

/* POINTWISE: float steps on x; each extra operand broadcasts to x without enlarging it. */
static kiln_status infer_fused_pointwise(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0];
  uint32_t where = 0;
  kiln_pw_fault fault = kiln_pointwise_check(c->op, &where);
  kiln_status s = need_floats_alike(c, c->op->n_inputs);
  if (s || (s = pointwise_fault(c, fault, where)) || (s = need_operands_fit(c, 1))) return s;
  set_shape(out, x->dtype, x->rank, x->dims);
  return KILN_OK;
}

/* LAYER_NORM, RMS_NORM: weight and bias of the normalized dims' shape, then the operands of
 * the steps fused before and after the norm (see POINTWISE). */
static kiln_status infer_norm(const infer_ctx *c, kiln_tensor_desc *out) {
  const kiln_tensor_desc *x = c->in[0];
  int64_t k = c->op->iattr[0], flags = c->op->iattr[1];
  int max_flags = c->op->kind == KILN_OP_LAYER_NORM ? 3 : 1;
  uint32_t want_inputs, where = 0;
  kiln_pw_span span;
  kiln_pw_fault fault;
  int fused = kiln_pw_span_of(c->op, &span);
  shape_text t;
  kiln_status s = need_floats_alike(c, c->op->n_inputs);
  if (s || (s = need_flag(c, 1, max_flags))) return s;
  if (k < 1 || k > x->rank)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): normalizes %lld trailing dims but input 0 %.40s has "
                     "rank %d%.24s",
                     c->stage, c->index, c->name, (long long)k, shape_of(x, t.a), (int)x->rank,
                     c->remedy);
  want_inputs = 1 + (unsigned)(flags & 1) + (unsigned)((flags >> 1) & 1);
  if (fused ? c->op->n_inputs < want_inputs : c->op->n_inputs != want_inputs)
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (%.12s): flags %lld (1 weight, 2 bias) mean %u inputs%.22s but "
                     "the op has %u%.24s",
                     c->stage, c->index, c->name, (long long)flags, want_inputs,
                     fused ? " before step operands" : "", (unsigned)c->op->n_inputs, c->remedy);
  for (uint32_t i = 1; i < want_inputs; i++) {
    const kiln_tensor_desc *p = c->in[i];
    int same = p->rank == k;
    for (int32_t d = 0; same && d < k; d++) same = p->dims[d] == x->dims[x->rank - k + d];
    if (!same)
      return kiln_fail(c->err, c->status,
                       "%.7s op %u (%.12s): input %u has shape %.40s but must equal the "
                       "normalized dims %.40s%.24s",
                       c->stage, c->index, c->name, (unsigned)i, shape_of(p, t.a),
                       kiln_shape_str((int32_t)k, x->dims + x->rank - k, t.b, sizeof t.b),
                       c->remedy);
  }
  fault = kiln_pointwise_check(c->op, &where);
  if ((s = pointwise_fault(c, fault, where)) || (s = need_operands_fit(c, want_inputs))) return s;
  set_shape(out, x->dtype, x->rank, x->dims);
  return KILN_OK;
}

/* Convolution, batch norm, pooling and resize: the geometry's own words name the fault. */
static kiln_status infer_vision(const infer_ctx *c, kiln_tensor_desc *out) {
  char why[160];
  if (kiln_vision_infer(c->op, c->in, out, why, sizeof why) == 0) return KILN_OK;
  return kiln_fail(c->err, c->status, "%.7s op %u (%.12s): %.159s%.24s", c->stage, c->index,
                   c->name, why, c->remedy);
}

static kiln_status infer_dispatch(const infer_ctx *c, kiln_tensor_desc *out) {
  switch (c->op->kind) {
  case KILN_OP_LINEAR: return infer_linear(c, out);
  case KILN_OP_MATMUL: return infer_matmul(c, out);
  case KILN_OP_ADD:
  case KILN_OP_SUB:
  case KILN_OP_MUL:
  case KILN_OP_DIV:
  case KILN_OP_MINIMUM:
  case KILN_OP_MAXIMUM: return infer_binary(c, out);
  case KILN_OP_COMPARE: return infer_compare(c, out);
  case KILN_OP_LOGICAL:
  case KILN_OP_BITWISE: return infer_bool_op(c, out);
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
  case KILN_OP_POW: return infer_pointwise(c, out);
  case KILN_OP_CAST: return infer_cast(c, out);
  case KILN_OP_SOFTMAX:
  case KILN_OP_LOG_SOFTMAX: return infer_softmax(c, out);
  case KILN_OP_LAYER_NORM:
  case KILN_OP_RMS_NORM: return infer_norm(c, out);
  case KILN_OP_SUM:
  case KILN_OP_MEAN:
  case KILN_OP_AMAX: return infer_reduce(c, out);
  case KILN_OP_RESHAPE: return infer_reshape(c, out);
  case KILN_OP_PERMUTE: return infer_permute(c, out);
  case KILN_OP_EXPAND: return infer_expand(c, out);
  case KILN_OP_CAT: return infer_cat(c, out);
  case KILN_OP_SLICE: return infer_slice(c, out);
  case KILN_OP_SELECT: return infer_select(c, out);
  case KILN_OP_COPY:
    set_shape(out, c->in[0]->dtype, c->in[0]->rank, c->in[0]->dims);
    return KILN_OK;
  case KILN_OP_EMBEDDING: return infer_embedding(c, out);
  case KILN_OP_INDEX_SELECT: return infer_index_select(c, out);
  case KILN_OP_WHERE: return infer_where(c, out);
  case KILN_OP_SDPA: return infer_sdpa(c, out);
  case KILN_OP_POINTWISE: return infer_fused_pointwise(c, out);
  case KILN_OP_CONV:
  case KILN_OP_CONV_TRANSPOSE:
  case KILN_OP_BATCH_NORM:
  case KILN_OP_MAX_POOL2D:
  case KILN_OP_AVG_POOL2D:
  case KILN_OP_ADAPTIVE_AVG_POOL2D:
  case KILN_OP_UPSAMPLE_NEAREST2D:
  case KILN_OP_UPSAMPLE_BILINEAR2D: return infer_vision(c, out);
  case KILN_OP_CUMSUM: return infer_cumsum(c, out);
  case KILN_OP_GATHER: return infer_gather(c, out);
  case KILN_OP_INDEX_COPY: return infer_index_copy(c, out);
  case KILN_OP_INDEX: return infer_index(c, out);
  case KILN_OP_ARGMAX: return infer_argmax(c, out);
  case KILN_OP_FUSED: /* its shape comes with its program, which the plan parser checks */
    return kiln_fail(c->err, c->status,
                     "%.7s op %u (fused): fused groups are made by the builder's fusion pass, "
                     "not added%.24s",
                     c->stage, c->index, c->remedy);
  case KILN_OP_COUNT: break;
  }
  return kiln_fail(c->err, c->status, "%.7s op %u: op kind %u is unknown%.24s", c->stage,
                   c->index, (unsigned)c->op->kind, c->remedy);
}

kiln_status kiln_infer_op(const kiln_op *op, const kiln_tensor_desc *const *inputs,
                          const kiln_op_site *site, kiln_tensor_desc *out, kiln_error *err) {
  infer_ctx c = {op, inputs, site->stage, (unsigned)site->index, kiln_op_name(op->kind),
                 site->status, site->remedy, err};
  const op_arity *a;
  char shape[48];
  kiln_status s;
  if ((unsigned)op->kind >= KILN_OP_COUNT)
    return kiln_fail(err, c.status, "%.7s op %u: op kind %u is unknown%.24s", c.stage, c.index,
                     (unsigned)op->kind, c.remedy);
  a = &arity[op->kind];
  if (op->n_inputs < a->min_inputs || op->n_inputs > a->max_inputs)
    return kiln_fail(err, c.status, "%.7s op %u (%.12s): takes %u to %u inputs but has %u%.24s",
                     c.stage, c.index, c.name, (unsigned)a->min_inputs, (unsigned)a->max_inputs,
                     (unsigned)op->n_inputs, c.remedy);
  if (op->n_iattr < a->min_iattr || op->n_iattr > a->max_iattr)
    return kiln_fail(err, c.status,
                     "%.7s op %u (%.12s): takes %u to %u integer attributes but has %u%.24s",
                     c.stage, c.index, c.name, (unsigned)a->min_iattr, (unsigned)a->max_iattr,
                     (unsigned)op->n_iattr, c.remedy);
  for (uint32_t i = 0; i < KILN_MAX_FATTR; i++)
    if (!isfinite(op->fattr[i]))
      return kiln_fail(err, c.status,
                       "%.7s op %u (%.12s): attribute fattr%u is %g, not a finite number%.24s",
                       c.stage, c.index, c.name, (unsigned)i, op->fattr[i], c.remedy);
  if ((s = infer_dispatch(&c, out))) return s;
  if (kiln_shape_nbytes(out->dtype, out->rank, out->dims, &out->nbytes))
    return kiln_fail(err, c.status,
                     "%.7s op %u (%.12s): the output %.4s %.40s exceeds 2^63 bytes or a dim "
                     "exceeds 2^62%.24s",
                     c.stage, c.index, c.name, kiln_dtype_name(out->dtype),
                     kiln_shape_str(out->rank, out->dims, shape, sizeof shape), c.remedy);
  return KILN_OK;
}
