/* The binary plan: encoding, and a parser that trusts nothing in the bytes it reads.
 *
 * Layout (little-endian): a 32-byte header
 *   0 char[4] "KPLN"   4 u32 version   8 u32 tensors   12 u32 ops   16 u32 inputs
 *  20 u32 outputs     24 u64 arena size
 * then one 96-byte record per tensor
 *   0 u32 dtype  4 i32 rank  8 i64 dims[8]  72 u32 storage  76 u32 io_index
 *  80 u64 offset  88 u64 nbytes
 * then one 160-byte record per op (128 bytes with iattr[8] in version 1)
 *   0 u32 kind  4 u32 n_inputs  8 u32 inputs[8]  40 u32 output  44 u32 n_iattr
 *  48 i64 iattr[12]  144 f64 fattr[2]
 * then u32 tensor indices of the inputs, then of the outputs. Unused slots are zero.
 * Version 2 then holds a symbol section (empty in a static plan): u32 symbols, u32 tensor
 * sizes, u32 attribute sizes, u32 0, then one 32-byte record per symbol
 *   0 char[16] name (NUL-padded)  16 i64 min  24 i64 max
 * then one 32-byte record per size that follows a symbol, tensor dims first, then op attributes,
 * each list in increasing (index, slot) order
 *   0 u32 tensor or op  4 u32 dim or attribute slot  8 u32 symbol (1-based)  12 u32 0
 *  16 i64 coeff  24 i64 offset
 * then the i64 words of the FUSED ops' programs, one after another in op order (none when
 * the plan has no FUSED op). A state tensor (storage 4) names its buffer by io_index, and its
 * offset is where the state's initial value lies in the weights section. */
#include "runtime/alloc.h"
#include "runtime/fused_program.h"
#include "runtime/internal.h"
#include "runtime/shape.h"
#include "runtime/symbolic.h"
#include "runtime/view.h"

#include <stdlib.h>

#define PLAN_MAGIC "KPLN"
#define PLAN_HEADER_SIZE 32u
#define PLAN_TENSOR_SIZE 96u
#define PLAN_SYM_HEADER_SIZE 16u
#define PLAN_SYM_SIZE 32u

/* Integer attribute slots of an op record, and the record's size, in a plan of this version. */
static uint32_t iattr_slots(uint32_t version) { return version >= 2 ? KILN_MAX_IATTR : 8u; }
static uint32_t op_record_size(uint32_t version) {
  return 48u + 8u * iattr_slots(version) + 8u * KILN_MAX_FATTR;
}

static const char *const storage_names[] = {"arena", "weight", "input", "output", "state"};

static uint64_t plan_bytes(uint32_t version, uint32_t n_tensors, uint32_t n_ops,
                           uint32_t n_inputs, uint32_t n_outputs) {
  /* Counts are 32-bit, so this sum stays far below 2^64. */
  return PLAN_HEADER_SIZE + (uint64_t)n_tensors * PLAN_TENSOR_SIZE +
         (uint64_t)n_ops * op_record_size(version) + ((uint64_t)n_inputs + n_outputs) * 4u;
}

static void put_tensor(uint8_t *p, const kiln_tensor_desc *t) {
  kiln_wr_u32(p, (uint32_t)t->dtype);
  kiln_wr_u32(p + 4, (uint32_t)t->rank);
  for (int i = 0; i < KILN_MAX_RANK; i++) kiln_wr_u64(p + 8 + 8 * i, (uint64_t)t->dims[i]);
  kiln_wr_u32(p + 72, (uint32_t)t->storage);
  kiln_wr_u32(p + 76, t->io_index);
  kiln_wr_u64(p + 80, t->offset);
  kiln_wr_u64(p + 88, t->nbytes);
}

static void put_op(uint8_t *p, const kiln_op *op) {
  kiln_wr_u32(p, (uint32_t)op->kind);
  kiln_wr_u32(p + 4, op->n_inputs);
  for (int i = 0; i < KILN_MAX_OP_INPUTS; i++) kiln_wr_u32(p + 8 + 4 * i, op->inputs[i]);
  kiln_wr_u32(p + 40, op->output);
  kiln_wr_u32(p + 44, op->n_iattr);
  for (int i = 0; i < KILN_MAX_IATTR; i++) kiln_wr_u64(p + 48 + 8 * i, (uint64_t)op->iattr[i]);
  for (int i = 0; i < KILN_MAX_FATTR; i++) {
    uint64_t bits;
    memcpy(&bits, &op->fattr[i], sizeof bits);
    kiln_wr_u64(p + 48 + 8 * KILN_MAX_IATTR + 8 * i, bits);
  }
}

/* How many sizes of the plan follow a symbol: tensor dims, op attributes. */
static void count_sym_sizes(const kiln_plan *plan, uint32_t *n_dims, uint32_t *n_attrs) {
  *n_dims = *n_attrs = 0;
  for (uint32_t t = 0; t < plan->n_tensors; t++)
    for (int d = 0; d < KILN_MAX_RANK; d++) *n_dims += plan->tensors[t].sym[d].symbol != 0;
  for (uint32_t i = 0; i < plan->n_ops; i++)
    for (int k = 0; k < KILN_MAX_IATTR; k++) *n_attrs += plan->ops[i].iattr_sym[k].symbol != 0;
}

static uint8_t *put_sym_size(uint8_t *p, uint32_t index, uint32_t slot, const kiln_sym_size *s) {
  kiln_wr_u32(p, index);
  kiln_wr_u32(p + 4, slot);
  kiln_wr_u32(p + 8, s->symbol);
  kiln_wr_u32(p + 12, 0);
  kiln_wr_u64(p + 16, (uint64_t)s->coeff);
  kiln_wr_u64(p + 24, (uint64_t)s->offset);
  return p + PLAN_SYM_SIZE;
}

/* Writes the symbol section (a header alone in a static plan); returns the byte after it. */
static uint8_t *put_symbols(uint8_t *p, const kiln_plan *plan, uint32_t n_dims, uint32_t n_attrs) {
  kiln_wr_u32(p, plan->n_symbols);
  kiln_wr_u32(p + 4, n_dims);
  kiln_wr_u32(p + 8, n_attrs);
  kiln_wr_u32(p + 12, 0);
  p += PLAN_SYM_HEADER_SIZE;
  for (uint32_t k = 0; k < plan->n_symbols; k++, p += PLAN_SYM_SIZE) {
    memset(p, 0, 16);
    memcpy(p, plan->symbols[k].name, strnlen(plan->symbols[k].name, 15));
    kiln_wr_u64(p + 16, (uint64_t)plan->symbols[k].min);
    kiln_wr_u64(p + 24, (uint64_t)plan->symbols[k].max);
  }
  for (uint32_t t = 0; t < plan->n_tensors; t++)
    for (uint32_t d = 0; d < KILN_MAX_RANK; d++)
      if (plan->tensors[t].sym[d].symbol) p = put_sym_size(p, t, d, &plan->tensors[t].sym[d]);
  for (uint32_t i = 0; i < plan->n_ops; i++)
    for (uint32_t k = 0; k < KILN_MAX_IATTR; k++)
      if (plan->ops[i].iattr_sym[k].symbol) p = put_sym_size(p, i, k, &plan->ops[i].iattr_sym[k]);
  return p;
}

kiln_status kiln_plan_serialize(const kiln_plan *plan, void **out, size_t *out_size,
                                kiln_error *err) {
  uint64_t size;
  uint8_t *buf, *p;
  uint32_t n_dims, n_attrs;
  if (!plan || !out || !out_size || (plan->n_tensors && !plan->tensors) ||
      (plan->n_ops && !plan->ops) || (plan->n_inputs && !plan->inputs) ||
      (plan->n_outputs && !plan->outputs))
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "plan serialize: a NULL plan, output or array with a non-zero count; pass "
                     "a complete plan");
  if (plan->n_symbols > KILN_MAX_SYMBOLS)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "plan serialize: %u symbols exceed the limit of %u; use fewer dynamic sizes",
                     (unsigned)plan->n_symbols, (unsigned)KILN_MAX_SYMBOLS);
  if (plan->n_words && !plan->words)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "plan serialize: %u program words but no array; pass a complete plan",
                     (unsigned)plan->n_words);
  count_sym_sizes(plan, &n_dims, &n_attrs);
  size = plan_bytes(KILN_PLAN_VERSION, plan->n_tensors, plan->n_ops, plan->n_inputs,
                    plan->n_outputs) +
         PLAN_SYM_HEADER_SIZE + ((uint64_t)plan->n_symbols + n_dims + n_attrs) * PLAN_SYM_SIZE +
         (uint64_t)plan->n_words * 8u;
  if (size > SIZE_MAX || !(buf = kiln_malloc((size_t)size)))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "plan serialize: out of memory for %llu bytes; free memory and retry",
                     (unsigned long long)size);
  memcpy(buf, PLAN_MAGIC, 4);
  kiln_wr_u32(buf + 4, KILN_PLAN_VERSION);
  kiln_wr_u32(buf + 8, plan->n_tensors);
  kiln_wr_u32(buf + 12, plan->n_ops);
  kiln_wr_u32(buf + 16, plan->n_inputs);
  kiln_wr_u32(buf + 20, plan->n_outputs);
  kiln_wr_u64(buf + 24, plan->arena_size);
  p = buf + PLAN_HEADER_SIZE;
  for (uint32_t i = 0; i < plan->n_tensors; i++, p += PLAN_TENSOR_SIZE)
    put_tensor(p, &plan->tensors[i]);
  for (uint32_t i = 0; i < plan->n_ops; i++, p += op_record_size(KILN_PLAN_VERSION))
    put_op(p, &plan->ops[i]);
  for (uint32_t i = 0; i < plan->n_inputs; i++, p += 4) kiln_wr_u32(p, plan->inputs[i]);
  for (uint32_t i = 0; i < plan->n_outputs; i++, p += 4) kiln_wr_u32(p, plan->outputs[i]);
  p = put_symbols(p, plan, n_dims, n_attrs);
  for (uint32_t i = 0; i < plan->n_words; i++, p += 8) kiln_wr_u64(p, (uint64_t)plan->words[i]);
  *out = buf;
  *out_size = (size_t)size;
  return KILN_OK;
}

void kiln_plan_release(kiln_plan *plan) {
  if (!plan) return;
  free(plan->tensors);
  free(plan->ops);
  free(plan->inputs);
  free(plan->outputs);
  free(plan->words);
  memset(plan, 0, sizeof *plan);
}

/* Decodes and checks tensor i on its own: dtype, rank, dims, size, storage and bounds. */
static kiln_status parse_tensor(const uint8_t *p, uint32_t i, const kiln_plan *plan,
                                uint64_t weights_size, kiln_tensor_desc *t, kiln_error *err) {
  uint32_t dtype = kiln_rd_u32(p), storage = kiln_rd_u32(p + 72);
  int32_t rank = (int32_t)kiln_rd_u32(p + 4);
  uint64_t expect, end, limit;
  char shape[48];
  if (dtype >= KILN_DTYPE_COUNT)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan tensor %u: dtype %u is unknown; re-export the program", (unsigned)i,
                     (unsigned)dtype);
  if (rank < 0 || rank > KILN_MAX_RANK)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan tensor %u: rank %d is outside 0..8; re-export the program", (unsigned)i,
                     (int)rank);
  t->dtype = (kiln_dtype)dtype;
  t->rank = rank;
  for (int d = 0; d < KILN_MAX_RANK; d++) {
    t->dims[d] = (int64_t)kiln_rd_u64(p + 8 + 8 * d);
    if (d >= rank ? t->dims[d] != 0 : t->dims[d] < 0 || t->dims[d] > KILN_DIM_MAX)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan tensor %u: dim %d is %lld, outside 0..2^62 (or not 0 past rank %d); "
                       "re-export the program",
                       (unsigned)i, d, (long long)t->dims[d], (int)rank);
  }
  if (storage > KILN_STORE_STATE)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan tensor %u: storage %u is unknown; re-export the program", (unsigned)i,
                     (unsigned)storage);
  t->storage = (kiln_storage)storage;
  t->io_index = kiln_rd_u32(p + 76);
  t->offset = kiln_rd_u64(p + 80);
  t->nbytes = kiln_rd_u64(p + 88);
  kiln_shape_str(rank, t->dims, shape, sizeof shape);
  if (kiln_shape_nbytes(t->dtype, rank, t->dims, &expect))
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan tensor %u: shape %.40s exceeds 2^63 bytes; re-export the program",
                     (unsigned)i, shape);
  if (t->nbytes != expect)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan tensor %u: nbytes %llu is not the %llu bytes of %.4s %.40s; re-export "
                     "the program",
                     (unsigned)i, (unsigned long long)t->nbytes, (unsigned long long)expect,
                     kiln_dtype_name(t->dtype), shape);
  if (storage == KILN_STORE_INPUT || storage == KILN_STORE_OUTPUT) {
    uint32_t count = storage == KILN_STORE_INPUT ? plan->n_inputs : plan->n_outputs;
    if (t->offset != 0 || t->io_index >= count)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan tensor %u: %.6s index %u is outside the plan's %u (offset %llu must "
                       "be 0); re-export the program",
                       (unsigned)i, storage_names[storage], (unsigned)t->io_index, (unsigned)count,
                       (unsigned long long)t->offset);
    return KILN_OK;
  }
  if (storage == KILN_STORE_STATE && t->io_index >= KILN_MAX_BINDINGS)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan tensor %u: state index %u exceeds the limit of %u states; re-export "
                     "the program",
                     (unsigned)i, (unsigned)t->io_index, (unsigned)KILN_MAX_BINDINGS);
  limit = storage == KILN_STORE_ARENA ? plan->arena_size : weights_size;
  if ((storage != KILN_STORE_STATE && t->io_index != 0) || kiln_add_u64(t->offset, t->nbytes, &end) || end > limit ||
      t->offset % kiln_dtype_size(t->dtype) != 0)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan tensor %u: %.6s bytes at offset %llu (+%llu) are misaligned or outside "
                     "its %llu bytes (io index %u must be 0); re-export the program",
                     (unsigned)i, storage_names[storage], (unsigned long long)t->offset,
                     (unsigned long long)t->nbytes, (unsigned long long)limit,
                     (unsigned)t->io_index);
  return KILN_OK;
}

/* Decodes op i and checks what needs no other op: kind, counts, indices, unused slots. */
static kiln_status parse_op(const uint8_t *p, uint32_t i, uint32_t version, uint32_t n_tensors,
                            kiln_op *op, kiln_error *err) {
  uint32_t slots = iattr_slots(version);
  uint32_t kind = kiln_rd_u32(p);
  const char *name = kiln_op_name((kiln_op_kind)kind);
  if (kind >= KILN_OP_COUNT)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan op %u: kind %u is unknown; re-export the program", (unsigned)i,
                     (unsigned)kind);
  op->kind = (kiln_op_kind)kind;
  op->n_inputs = kiln_rd_u32(p + 4);
  op->output = kiln_rd_u32(p + 40);
  op->n_iattr = kiln_rd_u32(p + 44);
  if (op->n_inputs > KILN_MAX_OP_INPUTS || op->n_iattr > slots)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan op %u (%.12s): %u inputs and %u integer attributes exceed %u and %u; "
                     "re-export the program",
                     (unsigned)i, name, (unsigned)op->n_inputs, (unsigned)op->n_iattr,
                     (unsigned)KILN_MAX_OP_INPUTS, (unsigned)slots);
  for (uint32_t k = 0; k < KILN_MAX_OP_INPUTS; k++) {
    op->inputs[k] = kiln_rd_u32(p + 8 + 4 * k);
    if (k < op->n_inputs ? op->inputs[k] >= n_tensors : op->inputs[k] != 0)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan op %u (%.12s): input slot %u holds tensor %u but the plan has %u "
                       "tensors and %u inputs; re-export the program",
                       (unsigned)i, name, (unsigned)k, (unsigned)op->inputs[k],
                       (unsigned)n_tensors, (unsigned)op->n_inputs);
  }
  if (op->output >= n_tensors)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan op %u (%.12s): output tensor %u is outside the plan's %u tensors; "
                     "re-export the program",
                     (unsigned)i, name, (unsigned)op->output, (unsigned)n_tensors);
  for (uint32_t k = 0; k < slots; k++) {
    op->iattr[k] = (int64_t)kiln_rd_u64(p + 48 + 8 * k);
    if (k >= op->n_iattr && op->iattr[k] != 0)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan op %u (%.12s): unused attribute slot iattr%u is %lld, not 0; "
                       "re-export the program",
                       (unsigned)i, name, (unsigned)k, (long long)op->iattr[k]);
  }
  for (uint32_t k = 0; k < KILN_MAX_FATTR; k++) {
    uint64_t bits = kiln_rd_u64(p + 48 + 8 * slots + 8 * k);
    memcpy(&op->fattr[k], &bits, sizeof bits);
  }
  return KILN_OK;
}

/* Binding list `list` (inputs or outputs) and each tensor's io_index name each other. */
static kiln_status check_io_list(const kiln_plan *plan, kiln_storage storage,
                                 const uint32_t *list, uint32_t count, kiln_error *err) {
  const char *what = storage_names[storage];
  for (uint32_t i = 0; i < count; i++) {
    uint32_t t = list[i];
    if (t >= plan->n_tensors || plan->tensors[t].storage != storage ||
        plan->tensors[t].io_index != i)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan %.6s %u names tensor %u, which is not %.6s %u of the plan's %u "
                       "tensors; re-export the program",
                       what, (unsigned)i, (unsigned)t, what, (unsigned)i,
                       (unsigned)plan->n_tensors);
  }
  for (uint32_t t = 0; t < plan->n_tensors; t++) {
    const kiln_tensor_desc *d = &plan->tensors[t];
    if (d->storage == storage && list[d->io_index] != t)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan tensor %u claims %.6s %u but that binding is tensor %u; re-export "
                       "the program",
                       (unsigned)t, what, (unsigned)d->io_index, (unsigned)list[d->io_index]);
  }
  return KILN_OK;
}

/* Op i reads only what exists before it, writes a fresh tensor, and its output's dtype and
 * shape are what its inputs and attributes give. writer[t] is the op that wrote t, or -1. */
/* Whether op may write state tensor `want`: INDEX_COPY in place on that state's unwritten
 * record, or COPY from a tensor of another buffer; an operand on the same state is refused. */
static int writes_state_ok(const kiln_plan *plan, const kiln_op *op, const int64_t *written) {
  const kiln_tensor_desc *want = &plan->tensors[op->output];
  for (uint32_t k = 0; k < op->n_inputs; k++) {
    const kiln_tensor_desc *in = &plan->tensors[op->inputs[k]];
    int same = in->storage == KILN_STORE_STATE && in->io_index == want->io_index;
    if (op->kind == KILN_OP_INDEX_COPY && k == 0) {
      if (!same || written[op->inputs[0]] >= 0) return 0;
    } else if (same) {
      return 0;
    }
  }
  return op->kind == KILN_OP_INDEX_COPY || op->kind == KILN_OP_COPY;
}

static kiln_status check_op(const kiln_plan *plan, uint32_t i, int64_t *writer,
                            const int64_t *written, kiln_error *err) {
  static const kiln_op_site site_base = {"plan", 0, KILN_ERR_INVALID_PROGRAM,
                                         "; re-export the program"};
  const kiln_op *op = &plan->ops[i];
  const char *name = kiln_op_name(op->kind);
  const kiln_tensor_desc *in[KILN_MAX_OP_INPUTS];
  const kiln_tensor_desc *want = &plan->tensors[op->output];
  kiln_tensor_desc got;
  kiln_op_site site = site_base;
  char shape_want[48], shape_got[48];
  kiln_status s;
  for (uint32_t k = 0; k < op->n_inputs; k++) {
    const kiln_tensor_desc *t = &plan->tensors[op->inputs[k]];
    int base_state = t->storage == KILN_STORE_STATE && written[op->inputs[k]] < 0;
    if (t->storage != KILN_STORE_WEIGHT && t->storage != KILN_STORE_INPUT && !base_state &&
        writer[op->inputs[k]] < 0)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan op %u (%.12s): input %u reads tensor %u, which no earlier op writes; "
                       "re-export the program",
                       (unsigned)i, name, (unsigned)k, (unsigned)op->inputs[k]);
    in[k] = t;
  }
  if (want->storage == KILN_STORE_STATE && !writes_state_ok(plan, op, written))
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan op %u (%.12s): writes tensor %u of state %u, but only index_copy in "
                     "place on that state, or a copy from another buffer, may; re-export the "
                     "program",
                     (unsigned)i, name, (unsigned)op->output, (unsigned)want->io_index);
  if (want->storage != KILN_STORE_ARENA && want->storage != KILN_STORE_OUTPUT &&
      want->storage != KILN_STORE_STATE)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan op %u (%.12s): writes tensor %u of %.6s storage, but ops write only "
                     "arena and output tensors; re-export the program",
                     (unsigned)i, name, (unsigned)op->output, storage_names[want->storage]);
  if (writer[op->output] >= 0)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan op %u (%.12s): writes tensor %u, which op %lld already wrote; "
                     "re-export the program",
                     (unsigned)i, name, (unsigned)op->output, (long long)writer[op->output]);
  site.index = i;
  if (op->kind == KILN_OP_FUSED) {
    kiln_fx_prog prog; /* the program fixes no shape: it is checked against the output's */
    if ((s = kiln_fx_decode(plan->words, plan->n_words, op, i, in, want, &prog, err))) return s;
    got = *want;
  } else if ((s = kiln_infer_op(op, in, &site, &got, err))) {
    return s;
  }
  if (got.dtype != want->dtype || got.rank != want->rank ||
      memcmp(got.dims, want->dims, sizeof got.dims) != 0)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan op %u (%.12s): output tensor %u is %.4s %.40s but its inputs give "
                     "%.4s %.40s; re-export the program",
                     (unsigned)i, name, (unsigned)op->output, kiln_dtype_name(want->dtype),
                     kiln_shape_str(want->rank, want->dims, shape_want, sizeof shape_want),
                     kiln_dtype_name(got.dtype),
                     kiln_shape_str(got.rank, got.dims, shape_got, sizeof shape_got));
  writer[op->output] = i;
  return KILN_OK;
}

/* The state records: per index one record no op writes (the value at the start of a run) and
 * at most one that an op writes, both of one dtype, shape and initial value; the index range
 * is dense; and no op after the write reads the start value, which the write replaced. */
static kiln_status check_states(kiln_plan *plan, const int64_t *written, kiln_error *err) {
  int64_t base[KILN_MAX_BINDINGS], last[KILN_MAX_BINDINGS];
  uint32_t n = 0;
  for (uint32_t k = 0; k < KILN_MAX_BINDINGS; k++) base[k] = last[k] = -1;
  for (uint32_t t = 0; t < plan->n_tensors; t++) {
    const kiln_tensor_desc *d = &plan->tensors[t];
    uint32_t k = d->io_index;
    if (d->storage != KILN_STORE_STATE) continue;
    if (k + 1 > n) n = k + 1;
    if (written[t] >= 0) {
      if (last[k] >= 0)
        return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                         "plan state %u is written by ops %lld and %lld; a state takes one "
                         "write per run; re-export the program",
                         (unsigned)k, (long long)last[k], (long long)written[t]);
      last[k] = written[t];
    } else if (base[k] >= 0) {
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan state %u has two unwritten records, tensors %lld and %u; "
                       "re-export the program",
                       (unsigned)k, (long long)base[k], (unsigned)t);
    } else {
      base[k] = t;
    }
  }
  for (uint32_t k = 0; k < n; k++)
    if (base[k] < 0)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan state %u has no record of its value at the start of a run (the "
                       "plan has %u states); re-export the program",
                       (unsigned)k, (unsigned)n);
  for (uint32_t t = 0; t < plan->n_tensors; t++) {
    const kiln_tensor_desc *d = &plan->tensors[t], *b;
    if (d->storage != KILN_STORE_STATE) continue;
    b = &plan->tensors[base[d->io_index]];
    if (d->dtype != b->dtype || d->rank != b->rank || d->offset != b->offset ||
        memcmp(d->dims, b->dims, sizeof d->dims) != 0)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan tensor %u differs from tensor %lld, the same state %u, in dtype, "
                       "shape or initial value; re-export the program",
                       (unsigned)t, (long long)base[d->io_index], (unsigned)d->io_index);
  }
  for (uint32_t i = 0; i < plan->n_ops; i++) {
    const kiln_op *op = &plan->ops[i];
    for (uint32_t k = 0; k < op->n_inputs; k++) {
      const kiln_tensor_desc *d = &plan->tensors[op->inputs[k]];
      if (d->storage == KILN_STORE_STATE && written[op->inputs[k]] < 0 &&
          last[d->io_index] >= 0 && (int64_t)i > last[d->io_index])
        return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                         "plan op %u (%.12s) reads state %u as it was before op %lld wrote it; "
                         "re-export the program",
                         (unsigned)i, kiln_op_name(op->kind), (unsigned)d->io_index,
                         (long long)last[d->io_index]);
    }
  }
  plan->n_states = n;
  return KILN_OK;
}

/* 1 when the byte ranges [a, a + an) and [b, b + bn) share a byte (ends checked at parse). */
static int ranges_meet(uint64_t a, uint64_t an, uint64_t b, uint64_t bn) {
  return an && bn && a < b + bn && b < a + an;
}

/* What the engines assume of the arena beyond each tensor's bounds. Every kernel on both
 * engines reads its inputs while it writes its output, in an order no caller controls:
 * elementwise, cast, where and fused pointwise by element, chunk or 16-byte vector; layout
 * ops (permute, expand, cat, slice, select, copy) by gather or memcpy; reductions, softmax and
 * norms by rows they read twice; linear and matmul by GEMM or GEMV tiles (cuBLASLt takes no
 * output on an operand); attention by tiles of q, k and v staged while o is stored; embedding
 * and index_select by rows. So no output byte may lie on an input byte. The one exception is a
 * view the memory plan placed exactly on its input's bytes, which both engines skip. The other
 * is a write into state, which lives outside the arena: index_copy's output may be its input 0's
 * own state buffer (in place; writes_state_ok admits nothing else onto a state). The arena
 * is at most its tensors' reach aligned up, so a damaged size cannot reserve host or device
 * memory at load. */
static kiln_status check_arena(const kiln_plan *plan, kiln_error *err) {
  uint64_t end = 0, limit;
  for (uint32_t t = 0; t < plan->n_tensors; t++) {
    const kiln_tensor_desc *d = &plan->tensors[t];
    if (d->storage == KILN_STORE_ARENA && d->offset + d->nbytes > end) end = d->offset + d->nbytes;
  }
  limit = end > UINT64_MAX - KILN_ARENA_ALIGN ? UINT64_MAX
                                              : (end + KILN_ARENA_ALIGN - 1) / KILN_ARENA_ALIGN *
                                                    KILN_ARENA_ALIGN;
  if (plan->arena_size > limit)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan arena size %llu exceeds the %llu bytes its tensors reach (aligned to "
                     "%u); re-export the program",
                     (unsigned long long)plan->arena_size, (unsigned long long)limit,
                     (unsigned)KILN_ARENA_ALIGN);
  for (uint32_t i = 0; i < plan->n_ops; i++) {
    const kiln_op *op = &plan->ops[i];
    const kiln_tensor_desc *out = &plan->tensors[op->output];
    if (out->storage != KILN_STORE_ARENA) continue; /* each output binding is its own buffer */
    for (uint32_t k = 0; k < op->n_inputs; k++) {
      const kiln_tensor_desc *in = &plan->tensors[op->inputs[k]];
      uint64_t at;
      if (in->storage != KILN_STORE_ARENA ||
          !ranges_meet(out->offset, out->nbytes, in->offset, in->nbytes))
        continue;
      if (k == 0 && kiln_op_is_view(op, in, &at) && out->offset == in->offset + at) continue;
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan op %u (%.12s): output tensor %u (arena %llu +%llu) overlaps input "
                       "%u, tensor %u (arena %llu +%llu); re-export the program",
                       (unsigned)i, kiln_op_name(op->kind), (unsigned)op->output,
                       (unsigned long long)out->offset, (unsigned long long)out->nbytes,
                       (unsigned)k, (unsigned)op->inputs[k], (unsigned long long)in->offset,
                       (unsigned long long)in->nbytes);
    }
  }
  return KILN_OK;
}

/* The FUSED ops' programs tile the words in op order, so no word is unaccounted for. */
static kiln_status check_words(const kiln_plan *plan, kiln_error *err) {
  uint64_t at = 0;
  for (uint32_t i = 0; i < plan->n_ops; i++) {
    const kiln_op *op = &plan->ops[i];
    if (op->kind != KILN_OP_FUSED) continue;
    if (op->n_iattr != 2 || op->iattr[0] != (int64_t)at || op->iattr[1] < 2 ||
        (uint64_t)op->iattr[1] > plan->n_words - at)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan op %u (fused): program at word %lld (+%lld) does not follow the one "
                       "before at word %llu of %u; re-export the program",
                       (unsigned)i, (long long)op->iattr[0], (long long)op->iattr[1],
                       (unsigned long long)at, (unsigned)plan->n_words);
    at += (uint64_t)op->iattr[1];
  }
  if (at != plan->n_words)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan has %u program words but its fused ops' programs take %llu; "
                     "re-export the program",
                     (unsigned)plan->n_words, (unsigned long long)at);
  return KILN_OK;
}

/* Decodes one sized record's expression: a known symbol, coeff >= 1, the stored size `at_max` is
 * its value at the symbol's bound and its value at the lower bound is not negative. */
static kiln_status parse_sym_size(const uint8_t *p, const kiln_plan *plan, const char *what,
                                  uint32_t index, uint32_t slot, int64_t at_max,
                                  kiln_sym_size *out, kiln_error *err) {
  const kiln_symbol *sym;
  int64_t top, bottom;
  out->symbol = kiln_rd_u32(p + 8);
  out->coeff = (int64_t)kiln_rd_u64(p + 16);
  out->offset = (int64_t)kiln_rd_u64(p + 24);
  if (out->symbol == 0 || out->symbol > plan->n_symbols || kiln_rd_u32(p + 12) != 0)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan %.6s %u slot %u follows symbol %u but the plan has symbols 1..%u; "
                     "re-export the program",
                     what, (unsigned)index, (unsigned)slot, (unsigned)out->symbol,
                     (unsigned)plan->n_symbols);
  sym = &plan->symbols[out->symbol - 1];
  if (out->coeff < 1 || out->coeff > KILN_DIM_MAX || out->offset < -KILN_DIM_MAX ||
      out->offset > KILN_DIM_MAX || __builtin_mul_overflow(out->coeff, sym->max, &top) ||
      __builtin_add_overflow(top, out->offset, &top) || top != at_max ||
      (bottom = out->coeff * sym->min + out->offset) < 0)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan %.6s %u slot %u is %lld but %lld*%.15s%+lld over %.15s's bounds %lld..%lld "
                     "does not end there at or above 0; re-export the program",
                     what, (unsigned)index, (unsigned)slot, (long long)at_max,
                     (long long)out->coeff, sym->name, (long long)out->offset, sym->name,
                     (long long)sym->min, (long long)sym->max);
  return KILN_OK;
}

/* The symbol section: bounds, then each size that follows a symbol, in increasing order. */
static kiln_status parse_symbols(const uint8_t *p, kiln_plan *plan, kiln_error *err) {
  uint32_t n_dims = kiln_rd_u32(p + 4), n_attrs = kiln_rd_u32(p + 8);
  uint64_t last = 0;
  int used[KILN_MAX_SYMBOLS] = {0};
  kiln_status s;
  p += PLAN_SYM_HEADER_SIZE;
  for (uint32_t k = 0; k < plan->n_symbols; k++, p += PLAN_SYM_SIZE) {
    kiln_symbol *sym = &plan->symbols[k];
    size_t len = strnlen((const char *)p, 16);
    int printable = len > 0 && len < 16;
    for (size_t c = 0; c < 16; c++)
      if (c < len ? p[c] < 0x21 || p[c] > 0x7e : p[c] != 0) printable = 0;
    memcpy(sym->name, p, 16);
    sym->name[15] = 0;
    sym->min = (int64_t)kiln_rd_u64(p + 16);
    sym->max = (int64_t)kiln_rd_u64(p + 24);
    if (!printable)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan symbol %u: its name is not 1..15 printable ASCII bytes padded with "
                       "NULs; re-export the program",
                       (unsigned)k + 1);
    if (sym->min < 0 || sym->min > sym->max || sym->max > KILN_DIM_MAX)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan symbol %u (%.15s): bounds %lld..%lld are inverted or outside "
                       "0..2^62; re-export the program",
                       (unsigned)k + 1, sym->name, (long long)sym->min, (long long)sym->max);
  }
  for (uint32_t j = 0; j < n_dims + n_attrs; j++, p += PLAN_SYM_SIZE) {
    int is_dim = j < n_dims;
    uint32_t index = kiln_rd_u32(p), slot = kiln_rd_u32(p + 4);
    uint64_t key = (uint64_t)index << 32 | slot;
    const char *what = is_dim ? "tensor" : "op";
    if (j != 0 && j != n_dims && key <= last)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan %.6s %u slot %u is listed out of order or twice among the dynamic "
                       "sizes; re-export the program",
                       what, (unsigned)index, (unsigned)slot);
    last = key;
    if (is_dim) {
      kiln_tensor_desc *t;
      if (index >= plan->n_tensors || slot >= (uint32_t)plan->tensors[index].rank ||
          plan->tensors[index].storage == KILN_STORE_WEIGHT ||
          plan->tensors[index].storage == KILN_STORE_STATE)
        return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                         "plan tensor %u dim %u cannot be dynamic: no such tensor or dim, or a weight "
                         "or state; re-export the program",
                         (unsigned)index, (unsigned)slot);
      t = &plan->tensors[index];
      if ((s = parse_sym_size(p, plan, what, index, slot, t->dims[slot], &t->sym[slot], err)))
        return s;
      if (t->storage == KILN_STORE_INPUT) used[t->sym[slot].symbol - 1] = 1;
    } else {
      kiln_op *op;
      if (index >= plan->n_ops || slot >= plan->ops[index].n_iattr ||
          !kiln_attr_may_follow_symbol(plan->ops[index].kind, slot))
        return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                         "plan op %u attribute %u cannot be dynamic: no such op or attribute, or "
                         "not a size; re-export the program",
                         (unsigned)index, (unsigned)slot);
      op = &plan->ops[index];
      if ((s = parse_sym_size(p, plan, what, index, slot, op->iattr[slot], &op->iattr_sym[slot],
                              err)))
        return s;
    }
  }
  for (uint32_t k = 0; k < plan->n_symbols; k++)
    if (!used[k])
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan symbol %u (%.15s) sizes no input dim, so no call can give its value; "
                       "re-export the program",
                       (unsigned)k + 1, plan->symbols[k].name);
  return KILN_OK;
}

/* A dynamic plan's shapes hold at the lower bounds too, and every view the memory plan placed
 * on its input's bytes starts at the same byte there: the engines place views once. */
static kiln_status check_dynamic(const kiln_plan *plan, kiln_error *err) {
  static const kiln_op_site site = {"plan", 0, KILN_ERR_INVALID_PROGRAM, "; re-export the program"};
  int64_t values[KILN_MAX_SYMBOLS];
  kiln_tensor_desc *tensors = kiln_calloc(plan->n_tensors ? plan->n_tensors : 1, sizeof *tensors);
  kiln_op *ops = kiln_calloc(plan->n_ops ? plan->n_ops : 1, sizeof *ops);
  kiln_status s = KILN_OK;
  if (!tensors || !ops) {
    s = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                  "plan: out of memory checking %u tensors at their lower bounds; free memory",
                  (unsigned)plan->n_tensors);
    goto done;
  }
  memcpy(tensors, plan->tensors, sizeof *tensors * plan->n_tensors);
  memcpy(ops, plan->ops, sizeof *ops * plan->n_ops);
  for (uint32_t k = 0; k < plan->n_symbols; k++) values[k] = plan->symbols[k].min;
  if ((s = kiln_plan_shapes_at(plan, values, 1, &site, tensors, ops, err))) goto done;
  for (uint32_t i = 0; i < plan->n_ops; i++) {
    const kiln_op *op = &plan->ops[i];
    const kiln_tensor_desc *in = &plan->tensors[op->inputs[0]], *out = &plan->tensors[op->output];
    uint64_t at_max, at_min;
    if (out->storage != KILN_STORE_ARENA || in->storage != KILN_STORE_ARENA ||
        !kiln_op_is_view(op, in, &at_max) || out->offset != in->offset + at_max)
      continue;
    if (!kiln_op_is_view(&ops[i], &tensors[op->inputs[0]], &at_min) || at_min != at_max) {
      s = kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                    "plan op %u (%.12s): a view at byte %llu of its input at the upper bounds "
                    "moves at the lower bounds; re-export the program",
                    (unsigned)i, kiln_op_name(op->kind), (unsigned long long)at_max);
      goto done;
    }
  }
done:
  free(tensors);
  free(ops);
  return s;
}

static kiln_status parse_body(const uint8_t *p, uint64_t weights_size, kiln_plan *plan,
                              kiln_error *err) {
  int64_t *writer, *written;
  const uint8_t *symbols;
  kiln_status s = KILN_OK;
  p += PLAN_HEADER_SIZE;
  for (uint32_t i = 0; i < plan->n_tensors; i++, p += PLAN_TENSOR_SIZE)
    if ((s = parse_tensor(p, i, plan, weights_size, &plan->tensors[i], err))) return s;
  for (uint32_t i = 0; i < plan->n_ops; i++, p += op_record_size(plan->version))
    if ((s = parse_op(p, i, plan->version, plan->n_tensors, &plan->ops[i], err))) return s;
  for (uint32_t i = 0; i < plan->n_inputs; i++, p += 4) plan->inputs[i] = kiln_rd_u32(p);
  for (uint32_t i = 0; i < plan->n_outputs; i++, p += 4) plan->outputs[i] = kiln_rd_u32(p);
  symbols = p; /* version 2: the symbol section, its sizes checked by kiln_plan_parse */
  if (plan->version >= 2)
    p += PLAN_SYM_HEADER_SIZE + ((uint64_t)kiln_rd_u32(p) + kiln_rd_u32(p + 4) + kiln_rd_u32(p + 8)) *
                                   PLAN_SYM_SIZE;
  for (uint32_t i = 0; i < plan->n_words; i++, p += 8) plan->words[i] = (int64_t)kiln_rd_u64(p);
  if ((s = check_words(plan, err))) return s;
  if ((s = check_io_list(plan, KILN_STORE_INPUT, plan->inputs, plan->n_inputs, err)) ||
      (s = check_io_list(plan, KILN_STORE_OUTPUT, plan->outputs, plan->n_outputs, err)))
    return s;
  writer = kiln_malloc(sizeof *writer * (plan->n_tensors ? plan->n_tensors : 1));
  written = kiln_malloc(sizeof *written * (plan->n_tensors ? plan->n_tensors : 1));
  if (!writer || !written) {
    free(writer);
    free(written);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "plan: out of memory for %u tensors; free memory and retry",
                     (unsigned)plan->n_tensors);
  }
  for (uint32_t t = 0; t < plan->n_tensors; t++) writer[t] = written[t] = -1;
  for (uint32_t i = 0; i < plan->n_ops; i++) written[plan->ops[i].output] = i;
  for (uint32_t i = 0; i < plan->n_ops && s == KILN_OK; i++)
    s = check_op(plan, i, writer, written, err);
  for (uint32_t i = 0; i < plan->n_outputs && s == KILN_OK; i++)
    if (writer[plan->outputs[i]] < 0)
      s = kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                    "plan output %u (tensor %u) is written by no op; re-export the program",
                    (unsigned)i, (unsigned)plan->outputs[i]);
  if (s == KILN_OK) s = check_states(plan, written, err);
  if (s == KILN_OK) s = check_arena(plan, err);
  free(writer);
  free(written);
  if (s == KILN_OK && plan->n_symbols && (s = parse_symbols(symbols, plan, err)) == KILN_OK)
    s = check_dynamic(plan, err);
  return s;
}

kiln_status kiln_plan_parse(const void *data, size_t size, uint64_t weights_size, kiln_plan *out,
                            kiln_error *err) {
  const uint8_t *p = data;
  kiln_plan plan;
  uint64_t need;
  kiln_status s;
  if (!out || (!data && size))
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "plan parse: NULL output or data; pass the plan section and a plan to fill");
  memset(out, 0, sizeof *out);
  memset(&plan, 0, sizeof plan);
  if (size < PLAN_HEADER_SIZE)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan section is %llu bytes, shorter than its 32-byte header; re-export the "
                     "program",
                     (unsigned long long)size);
  if (memcmp(p, PLAN_MAGIC, 4) != 0)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan section does not start with \"KPLN\"; re-export the program");
  plan.version = kiln_rd_u32(p + 4);
  if (plan.version > KILN_PLAN_VERSION)
    return kiln_fail(err, KILN_ERR_INCOMPATIBLE,
                     "plan version %u is newer than this runtime understands (%u): re-export the "
                     "program with this Kiln release or upgrade the Kiln runtime",
                     (unsigned)plan.version, (unsigned)KILN_PLAN_VERSION);
  if (plan.version == 0)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan version 0 is invalid; re-export the program");
  plan.n_tensors = kiln_rd_u32(p + 8);
  plan.n_ops = kiln_rd_u32(p + 12);
  plan.n_inputs = kiln_rd_u32(p + 16);
  plan.n_outputs = kiln_rd_u32(p + 20);
  plan.arena_size = kiln_rd_u64(p + 24);
  need = plan_bytes(plan.version, plan.n_tensors, plan.n_ops, plan.n_inputs, plan.n_outputs);
  if (plan.version >= 2 && (need += PLAN_SYM_HEADER_SIZE) <= size) {
    const uint8_t *q = p + need - PLAN_SYM_HEADER_SIZE;
    uint32_t n_dims = kiln_rd_u32(q + 4), n_attrs = kiln_rd_u32(q + 8);
    plan.n_symbols = kiln_rd_u32(q);
    if (plan.n_symbols > KILN_MAX_SYMBOLS || kiln_rd_u32(q + 12) != 0 ||
        (plan.n_symbols == 0 && (n_dims || n_attrs)))
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "plan declares %u symbols and %llu dynamic sizes; a version 2 plan holds "
                       "0..%u symbols, sizes only with a symbol, and a zero reserved word; "
                       "re-export the program",
                       (unsigned)plan.n_symbols, (unsigned long long)n_dims + n_attrs,
                       (unsigned)KILN_MAX_SYMBOLS);
    need += ((uint64_t)plan.n_symbols + n_dims + n_attrs) * PLAN_SYM_SIZE;
    if (size > need && (size - need) % 8u == 0 && (size - need) / 8u <= UINT32_MAX) {
      plan.n_words = (uint32_t)((size - need) / 8u); /* programs; check_words accounts for each */
      need = size;
    }
  }
  if (need != size)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan section is %llu bytes but its counts (%u tensors, %u ops, %u inputs, "
                     "%u outputs) need %llu; re-export the program",
                     (unsigned long long)size, (unsigned)plan.n_tensors, (unsigned)plan.n_ops,
                     (unsigned)plan.n_inputs, (unsigned)plan.n_outputs, (unsigned long long)need);
  if (plan.n_outputs == 0 || (uint64_t)plan.n_inputs + plan.n_outputs > KILN_MAX_BINDINGS)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "plan has %u inputs and %u outputs; it needs 1 or more outputs and at most "
                     "%u bindings; re-export the program",
                     (unsigned)plan.n_inputs, (unsigned)plan.n_outputs,
                     (unsigned)KILN_MAX_BINDINGS);
  plan.tensors = kiln_calloc(plan.n_tensors, sizeof *plan.tensors);
  plan.ops = kiln_calloc(plan.n_ops, sizeof *plan.ops);
  plan.inputs = kiln_calloc(plan.n_inputs, sizeof *plan.inputs);
  plan.outputs = kiln_calloc(plan.n_outputs, sizeof *plan.outputs);
  plan.words = kiln_calloc(plan.n_words, sizeof *plan.words);
  if (!plan.tensors || !plan.ops || !plan.inputs || !plan.outputs || !plan.words) {
    s = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                  "plan: out of memory for %u tensors and %u ops; free memory and retry",
                  (unsigned)plan.n_tensors, (unsigned)plan.n_ops);
    kiln_plan_release(&plan);
    return s;
  }
  if ((s = parse_body(p, weights_size, &plan, err))) {
    kiln_plan_release(&plan);
    return s;
  }
  *out = plan;
  return KILN_OK;
}
