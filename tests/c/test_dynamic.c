/* Bounded dynamic dims: the builder derives which dims follow a symbol, the plan reader refuses
 * malformed symbol data, and the CPU engine runs every size within the bounds as a static build
 * of that size does, refusing sizes outside with the input, dim, value and bound, allocating
 * nothing. */
#include "check.h"
#include "runtime/alloc.h"
#include "runtime/view.h"
#include "kiln/kiln.h"

#include <stdlib.h>
#include <string.h>

#define D(...) ((const int64_t[]){__VA_ARGS__})
#define SEQ_MAX 8

static const float weight[12] = {1, -2, 0.5f, 3, -1, 0, 2, 1, 0.25f, -0.5f, 1, -3};

/* x [2,s,4], t [s]: y = slice(relu(reshape(linear(x, w), [2s, 3])), dim 0, 1..2s) -> [2s-1, 3],
 * z = x * reshape(t, [1, s, 1]) -> [2, s, 4]. Dynamic when seq is 0 (s in 1..SEQ_MAX), else
 * static at s = seq. */
static void *seq_blob(int64_t seq, size_t *size) {
  kiln_builder *b = kiln_builder_create();
  kiln_error err = {KILN_OK, ""};
  kiln_sym_size s = {0, 1, 0}, two_s = {0, 2, 0};
  void *blob = NULL;
  int64_t n = seq ? seq : SEQ_MAX;
  if (!seq) {
    CHECK(kiln_builder_add_symbol(b, "seq", 1, SEQ_MAX, &err) == 1);
    s.symbol = two_s.symbol = 1;
  }
  int32_t x = kiln_builder_add_input_sym(b, "x", KILN_F32, 3, D(2, n, 4),
                                         (kiln_sym_size[]){{0, 0, 0}, s, {0, 0, 0}}, &err);
  int32_t t = kiln_builder_add_input_sym(b, "t", KILN_F32, 1, D(n), &s, &err);
  int32_t w = kiln_builder_add_constant(b, KILN_F32, 2, D(3, 4), weight, sizeof weight, &err);
  int32_t h = kiln_builder_add_op(b, KILN_OP_LINEAR, (int32_t[]){x, w}, 2, NULL, 0, NULL, 0, &err);
  h = kiln_builder_add_op_sym(b, KILN_OP_RESHAPE, &h, 1, D(2 * n, 3),
                              (kiln_sym_size[]){two_s, {0, 0, 0}}, 2, NULL, 0, &err);
  h = kiln_builder_add_op(b, KILN_OP_RELU, &h, 1, NULL, 0, NULL, 0, &err);
  h = kiln_builder_add_op_sym(b, KILN_OP_SLICE, &h, 1, D(0, 1, 2 * n, 1),
                              (kiln_sym_size[]){{0, 0, 0}, {0, 0, 0}, two_s, {0, 0, 0}}, 4, NULL, 0,
                              &err);
  CHECK(kiln_builder_mark_output(b, h, "y", &err) == KILN_OK);
  h = kiln_builder_add_op_sym(b, KILN_OP_RESHAPE, &t, 1, D(1, n, 1),
                              (kiln_sym_size[]){{0, 0, 0}, s, {0, 0, 0}}, 3, NULL, 0, &err);
  h = kiln_builder_add_op(b, KILN_OP_MUL, (int32_t[]){x, h}, 2, NULL, 0, NULL, 0, &err);
  CHECK(kiln_builder_mark_output(b, h, "z", &err) == KILN_OK);
  CHECK(kiln_builder_build(b, NULL, &blob, size, &err) == KILN_OK);
  CHECK_STR(err.message, "");
  kiln_builder_destroy(b);
  return blob;
}

static kiln_tensor_view view(void *data, size_t nbytes, int32_t rank, const int64_t *sizes) {
  kiln_tensor_view v;
  int64_t stride = 1;
  memset(&v, 0, sizeof v);
  v.data = data;
  v.nbytes = nbytes;
  v.dtype = KILN_F32;
  v.rank = rank;
  for (int32_t d = rank; d-- > 0;) {
    v.sizes[d] = sizes[d];
    v.strides[d] = stride;
    stride *= sizes[d];
  }
  return v;
}

typedef struct seq_io {
  float x[2 * SEQ_MAX * 4], t[SEQ_MAX], y[(2 * SEQ_MAX - 1) * 3], z[2 * SEQ_MAX * 4];
  kiln_tensor_view in[2], out[2];
} seq_io;

/* Inputs at sequence length n (t_len for t), outputs given at their bound shapes. */
static void seq_views(seq_io *io, int64_t n, int64_t t_len) {
  for (int i = 0; i < 2 * SEQ_MAX * 4; i++) io->x[i] = (float)((i * 7) % 11) - 5.0f;
  for (int i = 0; i < SEQ_MAX; i++) io->t[i] = 0.5f * (float)i - 1.0f;
  memset(io->y, 0, sizeof io->y);
  memset(io->z, 0, sizeof io->z);
  io->in[0] = view(io->x, sizeof io->x, 3, D(2, n, 4));
  io->in[1] = view(io->t, sizeof io->t, 1, D(t_len));
  io->out[0] = view(io->y, sizeof io->y, 2, D(2 * SEQ_MAX - 1, 3));
  io->out[1] = view(io->z, sizeof io->z, 3, D(2, SEQ_MAX, 4));
}

static kiln_engine *load(const void *blob, size_t size) {
  kiln_engine_options opts;
  kiln_engine *e = NULL;
  kiln_error err = {KILN_OK, ""};
  kiln_engine_options_default(&opts);
  opts.device = KILN_DEVICE_CPU;
  CHECK(kiln_engine_load(blob, size, &opts, &e, &err) == KILN_OK);
  CHECK_STR(err.message, "");
  return e;
}

static void test_builder_derives_the_dims(void) {
  size_t size = 0;
  void *blob = seq_blob(0, &size);
  kiln_blob_view bv;
  kiln_plan plan;
  kiln_error err = {KILN_OK, ""};
  CHECK(kiln_blob_parse(blob, size, &bv, &err) == KILN_OK);
  CHECK(kiln_plan_parse(bv.plan, bv.plan_size, bv.weights_size, &plan, &err) == KILN_OK);
  CHECK_STR(err.message, "");
  CHECK(plan.version == 2 && plan.n_symbols == 1 && plan.symbols[0].min == 1 &&
        plan.symbols[0].max == SEQ_MAX && strcmp(plan.symbols[0].name, "seq") == 0);
  /* y: [2s-1, 3] at its bound [15, 3] */
  const kiln_tensor_desc *y = &plan.tensors[plan.outputs[0]], *z = &plan.tensors[plan.outputs[1]];
  CHECK(y->dims[0] == 2 * SEQ_MAX - 1 && y->sym[0].symbol == 1 && y->sym[0].coeff == 2 &&
        y->sym[0].offset == -1 && y->sym[1].symbol == 0);
  CHECK(z->sym[0].symbol == 0 && z->sym[1].symbol == 1 && z->sym[1].coeff == 1 &&
        z->sym[1].offset == 0 && z->sym[2].symbol == 0);
  kiln_plan_release(&plan);
  free(blob);
}

static void test_every_size_runs_as_its_static_build(void) {
  size_t size = 0, static_size = 0;
  void *blob = seq_blob(0, &size);
  kiln_engine *e = load(blob, size);
  kiln_error err = {KILN_OK, ""};
  seq_io dyn, fixed;
  for (int64_t n = 1; n <= SEQ_MAX; n += (n < 3 ? 1 : 5)) { /* 1, 2, 3, 8 */
    void *static_blob = seq_blob(n, &static_size);
    kiln_engine *s = load(static_blob, static_size);
    int32_t rank = 0;
    int64_t dims[KILN_MAX_RANK];
    seq_views(&dyn, n, n);
    seq_views(&fixed, n, n);
    fixed.out[0] = view(fixed.y, sizeof fixed.y, 2, D(2 * n - 1, 3));
    fixed.out[1] = view(fixed.z, sizeof fixed.z, 3, D(2, n, 4));
    kiln_test_fail_allocations = 1; /* still 1 after: execute allocated nothing */
    CHECK(kiln_engine_execute(e, dyn.in, 2, dyn.out, 2, &err) == KILN_OK);
    CHECK(kiln_test_fail_allocations == 1);
    kiln_test_fail_allocations = 0;
    CHECK_STR(err.message, "");
    CHECK(kiln_engine_execute(s, fixed.in, 2, fixed.out, 2, &err) == KILN_OK);
    CHECK(memcmp(dyn.y, fixed.y, sizeof dyn.y) == 0 && memcmp(dyn.z, fixed.z, sizeof dyn.z) == 0);
    CHECK(kiln_engine_output_shape(e, 0, &rank, dims, &err) == KILN_OK);
    CHECK(rank == 2 && dims[0] == 2 * n - 1 && dims[1] == 3);
    CHECK(kiln_engine_output_shape(e, 1, &rank, dims, &err) == KILN_OK);
    CHECK(rank == 3 && dims[0] == 2 && dims[1] == n && dims[2] == 4);
    kiln_engine_destroy(s);
    free(static_blob);
  }
  CHECK(kiln_engine_output_shape(e, 2, &(int32_t){0}, (int64_t[KILN_MAX_RANK]){0}, &err) ==
        KILN_ERR_INVALID_ARGUMENT);
  kiln_engine_destroy(e);
  free(blob);
}

static void expect_refused(kiln_engine *e, int64_t n, int64_t t_len, const char *message) {
  kiln_error err = {KILN_OK, ""};
  seq_io io;
  seq_views(&io, n, t_len);
  CHECK(kiln_engine_execute(e, io.in, 2, io.out, 2, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, message);
}

static void test_sizes_outside_the_bounds_are_refused(void) {
  size_t size = 0;
  void *blob = seq_blob(0, &size);
  kiln_engine *e = load(blob, size);
  kiln_error err = {KILN_OK, ""};
  seq_io io;
  expect_refused(e, 9, 9,
                 "input 0 (\"x\") dim 1 is 9, above its bound 8 (dynamic size seq); pass at most "
                 "that or re-export with a larger max");
  expect_refused(e, 0, 0,
                 "input 0 (\"x\") dim 1 is 0, below its bound 1 (dynamic size seq); pass at least "
                 "that or re-export with a smaller min");
  expect_refused(e, 3, 4,
                 "input 1 (\"t\") dim 0 is 4, giving seq = 4 where an earlier input gave 3; pass "
                 "inputs of matching sizes");
  /* an output view smaller than this call's size is refused; the engine stays usable */
  seq_views(&io, 5, 5);
  io.out[1] = view(io.z, sizeof io.z, 3, D(2, 4, 4));
  CHECK(kiln_engine_execute(e, io.in, 2, io.out, 2, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "output 1 (\"z\") has shape [2,4,4] but the program takes [2,5,4]") != NULL);
  seq_views(&io, 5, 5);
  CHECK(kiln_engine_execute(e, io.in, 2, io.out, 2, &err) == KILN_OK);
  kiln_engine_destroy(e);
  free(blob);
}

/* The plan of the dynamic blob, decoded, for a test to damage and re-encode. */
static void decoded(kiln_plan *plan, uint64_t *weights_size) {
  size_t size = 0;
  void *blob = seq_blob(0, &size);
  kiln_blob_view bv;
  kiln_error err = {KILN_OK, ""};
  CHECK(kiln_blob_parse(blob, size, &bv, &err) == KILN_OK);
  CHECK(kiln_plan_parse(bv.plan, bv.plan_size, bv.weights_size, plan, &err) == KILN_OK);
  *weights_size = bv.weights_size;
  free(blob);
}

/* The first op of kind k in the plan, the first weight tensor, and the plan's dynamic sizes
 * (tensor dims and op attributes that follow a symbol): where the messages below point. */
static uint32_t first_op(const kiln_plan *p, kiln_op_kind k) {
  uint32_t i = 0;
  while (i < p->n_ops && p->ops[i].kind != k) i++;
  return i;
}

static uint32_t first_weight(const kiln_plan *p) {
  uint32_t t = 0;
  while (t < p->n_tensors && p->tensors[t].storage != KILN_STORE_WEIGHT) t++;
  return t;
}

static uint32_t dynamic_sizes(const kiln_plan *p) {
  uint32_t n = 0;
  for (uint32_t t = 0; t < p->n_tensors; t++)
    for (int d = 0; d < KILN_MAX_RANK; d++) n += p->tensors[t].sym[d].symbol != 0;
  for (uint32_t i = 0; i < p->n_ops; i++)
    for (int k = 0; k < KILN_MAX_IATTR; k++) n += p->ops[i].iattr_sym[k].symbol != 0;
  return n;
}

static void expect_plan_refused(kiln_plan *plan, uint64_t weights_size, const char *message) {
  void *bytes = NULL;
  size_t size = 0;
  kiln_plan out;
  kiln_error err = {KILN_OK, ""};
  CHECK(kiln_plan_serialize(plan, &bytes, &size, &err) == KILN_OK);
  CHECK(kiln_plan_parse(bytes, size, weights_size, &out, &err) == KILN_ERR_INVALID_PROGRAM);
  CHECK_STR(err.message, message);
  kiln_free(bytes);
  kiln_plan_release(plan);
}

static void test_reader_refuses_malformed_symbol_data(void) {
  kiln_plan p;
  uint64_t w;
  uint32_t y;
  decoded(&p, &w);
  p.symbols[0].min = 9;
  expect_plan_refused(&p, w,
                      "plan symbol 1 (seq): bounds 9..8 are inverted or outside 0..2^62; re-export "
                      "the program");
  decoded(&p, &w);
  memcpy(p.symbols[0].name, "s q", 4);
  expect_plan_refused(&p, w,
                      "plan symbol 1: its name is not 1..15 printable ASCII bytes padded with NULs; "
                      "re-export the program");
  char want[256];
  decoded(&p, &w);
  y = p.outputs[0];
  p.tensors[y].sym[0].symbol = 2;
  snprintf(want, sizeof want,
           "plan tensor %u slot 0 follows symbol 2 but the plan has symbols 1..1; re-export the "
           "program", (unsigned)y);
  expect_plan_refused(&p, w, want);
  decoded(&p, &w);
  p.tensors[y].sym[0].offset = -2; /* the stored dim 15 is above 2*8-2 */
  snprintf(want, sizeof want,
           "plan tensor %u slot 0 is 15 but 2*seq-2 over seq's bounds 1..8 does not end there at "
           "or above 0; re-export the program", (unsigned)y);
  expect_plan_refused(&p, w, want);
  decoded(&p, &w);
  uint32_t slice = first_op(&p, KILN_OP_SLICE), first_w = first_weight(&p);
  CHECK(slice < p.n_ops && first_w < p.n_tensors);
  p.tensors[p.outputs[0]].sym[0] = (kiln_sym_size){1, 1, 7}; /* right at the bound, wrong below */
  snprintf(want, sizeof want,
           "plan op %u (slice): at these dynamic sizes its output dim 0 is 1 but its expression "
           "gives 8; re-export the program", (unsigned)slice);
  expect_plan_refused(&p, w, want);
  decoded(&p, &w);
  p.ops[slice].iattr_sym[0] = (kiln_sym_size){1, 1, -8}; /* the slice's dim is no size */
  snprintf(want, sizeof want,
           "plan op %u attribute 0 cannot be dynamic: no such op or attribute, or not a size; "
           "re-export the program", (unsigned)slice);
  expect_plan_refused(&p, w, want);
  decoded(&p, &w);
  for (uint32_t t = 0; t < p.n_tensors; t++)
    if (p.tensors[t].storage == KILN_STORE_WEIGHT) p.tensors[t].sym[0] = (kiln_sym_size){1, 1, -5};
  snprintf(want, sizeof want,
           "plan tensor %u dim 0 cannot be dynamic: no such tensor or dim, or a weight or state; "
           "re-export the program", (unsigned)first_w);
  expect_plan_refused(&p, w, want);
  decoded(&p, &w);
  p.n_symbols = 2;
  memcpy(p.symbols[1].name, "batch", 6);
  p.symbols[1].min = 1, p.symbols[1].max = 4;
  expect_plan_refused(&p, w,
                      "plan symbol 2 (batch) sizes no input dim, so no call can give its value; "
                      "re-export the program");
}

static void test_reader_refuses_a_damaged_symbol_section(void) {
  kiln_plan p;
  uint64_t w;
  void *bytes = NULL;
  size_t size = 0;
  kiln_plan out;
  kiln_error err = {KILN_OK, ""};
  decoded(&p, &w);
  CHECK(kiln_plan_serialize(&p, &bytes, &size, &err) == KILN_OK);
  uint8_t *sym = (uint8_t *)bytes + 32 + p.n_tensors * 96 + p.n_ops * 160 + (p.n_inputs + p.n_outputs) * 4;
  sym[0] = 0; /* no symbols in a version 2 plan */
  CHECK(kiln_plan_parse(bytes, size, w, &out, &err) == KILN_ERR_INVALID_PROGRAM);
  char want[256];
  snprintf(want, sizeof want,
           "plan declares 0 symbols and %u dynamic sizes; a version 2 plan holds 0..8 symbols, "
           "sizes only with a symbol, and a zero reserved word; re-export the program",
           (unsigned)dynamic_sizes(&p));
  CHECK(dynamic_sizes(&p) >= 8); /* the inputs', the reshape's, the slice's and their outputs' */
  CHECK_STR(err.message, want);
  sym[0] = 1;
  memcpy(sym + 16 + 32 + 32, sym + 16 + 32, 32); /* the second dim record repeats the first */
  CHECK(kiln_plan_parse(bytes, size, w, &out, &err) == KILN_ERR_INVALID_PROGRAM);
  CHECK(strstr(err.message, "is listed out of order or twice among the dynamic sizes") != NULL);
  CHECK(kiln_plan_parse(bytes, size - 32, w, &out, &err) == KILN_ERR_INVALID_PROGRAM);
  kiln_free(bytes);
  kiln_plan_release(&p);
}

/* x [3, s] -> relu -> select(dim 0, 1) -> relu: the select would be a view at byte 4s, which moves
 * with s, so the builder gives it its own bytes and the reader refuses a plan that shares them. */
static void test_a_view_that_moves_with_a_symbol_is_copied(void) {
  kiln_builder *b = kiln_builder_create();
  kiln_error err = {KILN_OK, ""};
  kiln_sym_size s = {1, 1, 0};
  void *blob = NULL, *bytes = NULL;
  size_t size = 0, plan_size = 0;
  kiln_blob_view bv;
  kiln_plan plan, out;
  CHECK(kiln_builder_add_symbol(b, "s", 1, 16, &err) == 1);
  int32_t x = kiln_builder_add_input_sym(b, "x", KILN_F32, 2, D(3, 16),
                                         (kiln_sym_size[]){{0, 0, 0}, s}, &err);
  int32_t h = kiln_builder_add_op(b, KILN_OP_RELU, &x, 1, NULL, 0, NULL, 0, &err);
  h = kiln_builder_add_op(b, KILN_OP_SELECT, &h, 1, D(0, 1), 2, NULL, 0, &err);
  h = kiln_builder_add_op(b, KILN_OP_RELU, &h, 1, NULL, 0, NULL, 0, &err);
  CHECK(kiln_builder_mark_output(b, h, "y", &err) == KILN_OK);
  CHECK(kiln_builder_build(b, NULL, &blob, &size, &err) == KILN_OK);
  CHECK(kiln_blob_parse(blob, size, &bv, &err) == KILN_OK);
  CHECK(kiln_plan_parse(bv.plan, bv.plan_size, bv.weights_size, &plan, &err) == KILN_OK);
  const kiln_tensor_desc *in = &plan.tensors[plan.ops[1].inputs[0]];
  kiln_tensor_desc *sel = &plan.tensors[plan.ops[1].output];
  CHECK(sel->offset != in->offset + 16 * 4);
  sel->offset = in->offset + 16 * 4; /* placed as a view at the bound */
  plan.arena_size = 256;              /* what the tensors then reach */
  CHECK(kiln_plan_serialize(&plan, &bytes, &plan_size, &err) == KILN_OK);
  CHECK(kiln_plan_parse(bytes, plan_size, bv.weights_size, &out, &err) == KILN_ERR_INVALID_PROGRAM);
  CHECK_STR(err.message,
            "plan op 1 (select): a view at byte 64 of its input at the upper bounds moves at the "
            "lower bounds; re-export the program");
  kiln_free(bytes);
  kiln_plan_release(&plan);
  free(blob);
  kiln_builder_destroy(b);
}

static void test_builder_refusals(void) {
  kiln_builder *b = kiln_builder_create();
  kiln_error err = {KILN_OK, ""};
  kiln_sym_size s = {1, 1, 0};
  void *blob = NULL;
  size_t size = 0;
  CHECK(kiln_builder_add_symbol(b, "s", 5, 4, &err) == -1);
  CHECK_STR(err.message,
            "builder add_symbol: \"s\" with bounds 5..4 (symbol 1 of at most 8); pass 1..15 "
            "printable bytes and 0 <= min <= max <= 2^62, max >= 1");
  CHECK(kiln_builder_add_symbol(b, "s", 1, 8, &err) == 1);
  CHECK(kiln_builder_add_input_sym(b, "x", KILN_F32, 2, D(8, 4),
                                   (kiln_sym_size[]){{2, 1, 0}, {0, 0, 0}}, &err) == -1);
  CHECK_STR(err.message,
            "builder input dim 0: size 1*symbol 2+0 is not a size over the symbol's bounds (of 1 "
            "symbols); pass coeff >= 1 and a size in 0..2^62");
  int32_t x = kiln_builder_add_input_sym(b, "x", KILN_F32, 2, D(8, 4),
                                         (kiln_sym_size[]){s, {0, 0, 0}}, &err);
  CHECK(x >= 0);
  CHECK(kiln_builder_add_op_sym(b, KILN_OP_SOFTMAX, &x, 1, D(0), &s, 1, NULL, 0, &err) == -1);
  CHECK_STR(err.message,
            "builder op 0 (softmax): attribute 0 follows a dynamic size, but only reshape/expand "
            "sizes, slice bounds and select indices may; make it static");
  /* every other row: ceil(s / 2) is no a*s+b over 1..8 */
  int32_t h = kiln_builder_add_op_sym(b, KILN_OP_SLICE, &x, 1, D(0, 0, 8, 2),
                                      (kiln_sym_size[]){{0, 0, 0}, {0, 0, 0}, s, {0, 0, 0}}, 4, NULL,
                                      0, &err);
  CHECK(kiln_builder_mark_output(b, h, "y", &err) == KILN_OK);
  CHECK(kiln_builder_build(b, NULL, &blob, &size, &err) == KILN_ERR_UNSUPPORTED);
  CHECK_STR(err.message,
            "builder: plan tensor 1 dim 0 is not a*s+b with a >= 1 over 1..8; export with a "
            "static size for it");
  kiln_builder_destroy(b);
  b = kiln_builder_create();
  CHECK(kiln_builder_add_symbol(b, "unused", 1, 8, &err) == 1);
  x = kiln_builder_add_input(b, "x", KILN_F32, 1, D(4), &err);
  h = kiln_builder_add_op(b, KILN_OP_RELU, &x, 1, NULL, 0, NULL, 0, &err);
  CHECK(kiln_builder_mark_output(b, h, "y", &err) == KILN_OK);
  CHECK(kiln_builder_build(b, NULL, &blob, &size, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message,
            "builder build: symbol unused sizes no input dim, so no call could give its value; use "
            "it in an input's dims or drop it");
  kiln_builder_destroy(b);
}

int main(void) {
  test_builder_derives_the_dims();
  test_every_size_runs_as_its_static_build();
  test_sizes_outside_the_bounds_are_refused();
  test_reader_refuses_malformed_symbol_data();
  test_reader_refuses_a_damaged_symbol_section();
  test_a_view_that_moves_with_a_symbol_is_copied();
  test_builder_refusals();
  return check_report("test_dynamic");
}
