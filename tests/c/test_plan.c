/* The plan format: round trip, and every refusal of the parser with its exact message. */
#include "check.h"
#include "runtime/internal.h"
#include "kiln/kiln.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define WEIGHTS_SIZE 80u

/* A small valid plan: y = relu(linear(x, w, b)), x [2,3], w [4,3], b [4]. */
typedef struct fixture {
  kiln_tensor_desc tensors[6];
  kiln_op ops[3];
  uint32_t inputs[2], outputs[2];
  kiln_plan plan;
} fixture;

static void set_tensor(kiln_tensor_desc *t, kiln_dtype dtype, int32_t rank, const int64_t *dims,
                       kiln_storage storage, uint32_t io_index, uint64_t offset) {
  uint64_t n = kiln_dtype_size(dtype);
  memset(t, 0, sizeof *t);
  t->dtype = dtype;
  t->rank = rank;
  for (int32_t i = 0; i < rank; i++) t->dims[i] = dims[i], n *= (uint64_t)dims[i];
  t->storage = storage;
  t->io_index = io_index;
  t->offset = offset;
  t->nbytes = n;
}

static void fresh(fixture *f) {
  memset(f, 0, sizeof *f);
  set_tensor(&f->tensors[0], KILN_F32, 2, (int64_t[]){2, 3}, KILN_STORE_INPUT, 0, 0);
  set_tensor(&f->tensors[1], KILN_F32, 2, (int64_t[]){4, 3}, KILN_STORE_WEIGHT, 0, 0);
  set_tensor(&f->tensors[2], KILN_F32, 1, (int64_t[]){4}, KILN_STORE_WEIGHT, 0, 64);
  set_tensor(&f->tensors[3], KILN_F32, 2, (int64_t[]){2, 4}, KILN_STORE_ARENA, 0, 0);
  set_tensor(&f->tensors[4], KILN_F32, 2, (int64_t[]){2, 4}, KILN_STORE_OUTPUT, 0, 0);
  f->ops[0] = (kiln_op){KILN_OP_LINEAR, 3, {0, 1, 2}, 3, 1, {KILN_ACT_NONE}, {0, 0}, {{0, 0, 0}}};
  f->ops[1] = (kiln_op){KILN_OP_RELU, 1, {3}, 4, 0, {0}, {0, 0}, {{0, 0, 0}}};
  f->inputs[0] = 0;
  f->outputs[0] = 4;
  f->plan = (kiln_plan){KILN_PLAN_VERSION, 5, 2, 1, 1, 32, f->tensors, f->ops, f->inputs, f->outputs, 0, NULL, 0, 0, {{"", 0, 0}}};
}

static uint8_t *encode(const fixture *f, size_t *size) {
  void *bytes = NULL;
  kiln_error err = {KILN_OK, ""};
  CHECK(kiln_plan_serialize(&f->plan, &bytes, size, &err) == KILN_OK);
  return bytes;
}

/* Parses bytes and checks the status and the exact message. */
static void expect_bytes(const uint8_t *bytes, size_t size, kiln_status status, const char *msg) {
  kiln_plan out;
  kiln_error err = {KILN_OK, ""};
  kiln_status s = kiln_plan_parse(bytes, size, WEIGHTS_SIZE, &out, &err);
  CHECK(s == status);
  CHECK_STR(err.message, msg);
  CHECK(out.tensors == NULL && out.n_tensors == 0);
  kiln_plan_release(&out);
}

static void expect(const fixture *f, kiln_status status, const char *msg) {
  size_t size = 0;
  uint8_t *bytes = encode(f, &size);
  expect_bytes(bytes, size, status, msg);
  free(bytes);
}

static void test_round_trip(void) {
  fixture f;
  kiln_plan out;
  kiln_error err = {KILN_OK, ""};
  size_t size = 0;
  uint8_t *bytes;
  fresh(&f);
  f.ops[0].fattr[1] = 0.25;
  bytes = encode(&f, &size);
  CHECK(size == 32 + 5 * 96 + 2 * 160 + 2 * 4 + 16); /* and an empty symbol section */
  CHECK(memcmp(bytes, "KPLN", 4) == 0);
  CHECK(kiln_plan_parse(bytes, size, WEIGHTS_SIZE, &out, &err) == KILN_OK);
  CHECK_STR(err.message, "");
  CHECK(out.version == 2 && out.n_tensors == 5 && out.n_ops == 2);
  CHECK(out.n_inputs == 1 && out.n_outputs == 1 && out.arena_size == 32);
  CHECK(memcmp(out.tensors, f.tensors, 5 * sizeof *out.tensors) == 0);
  CHECK(memcmp(out.ops, f.ops, 2 * sizeof *out.ops) == 0);
  CHECK(out.inputs[0] == 0 && out.outputs[0] == 4);
  kiln_plan_release(&out);
  CHECK(out.tensors == NULL && out.n_tensors == 0);
  free(bytes);
}

/* A version 1 plan, eight integer attribute slots per 128-byte op record, still loads; one
 * that claims a ninth attribute is refused. */
static void test_version_1_plan_loads(void) {
  fixture f;
  kiln_plan out;
  kiln_error err = {KILN_OK, ""};
  size_t size = 0, at = 32 + 5 * 96, old_size;
  uint8_t *bytes, *old;
  fresh(&f);
  f.ops[0].fattr[0] = 0.5;
  bytes = encode(&f, &size);
  old_size = size - 2 * 32 - 16; /* no attribute slots 8..11, no symbol section */
  old = calloc(1, old_size);
  memcpy(old, bytes, at);
  kiln_wr_u32(old + 4, 1);
  for (size_t op = 0; op < 2; op++) {
    memcpy(old + at + op * 128, bytes + at + op * 160, 112);
    memcpy(old + at + op * 128 + 112, bytes + at + op * 160 + 144, 16);
  }
  memcpy(old + at + 2 * 128, bytes + at + 2 * 160, 8);
  CHECK(kiln_plan_parse(old, old_size, WEIGHTS_SIZE, &out, &err) == KILN_OK);
  CHECK_STR(err.message, "");
  CHECK(out.version == 1 && out.n_ops == 2);
  CHECK(memcmp(out.ops, f.ops, 2 * sizeof *out.ops) == 0);
  kiln_plan_release(&out);
  kiln_wr_u32(old + at + 128 + 44, 9);
  expect_bytes(old, old_size, KILN_ERR_INVALID_PROGRAM,
               "plan op 1 (relu): 1 inputs and 9 integer attributes exceed 8 and 8; re-export the "
               "program");
  free(old);
  free(bytes);
}

static void test_header_refusals(void) {
  fixture f;
  size_t size = 0;
  uint8_t *bytes;
  fresh(&f);
  bytes = encode(&f, &size);
  expect_bytes(bytes, 31, KILN_ERR_INVALID_PROGRAM,
               "plan section is 31 bytes, shorter than its 32-byte header; re-export the program");
  expect_bytes(bytes, size - 4, KILN_ERR_INVALID_PROGRAM,
               "plan section is 852 bytes but its counts (5 tensors, 2 ops, 1 inputs, 1 outputs) "
               "need 856; re-export the program");
  bytes[0] = 'X';
  expect_bytes(bytes, size, KILN_ERR_INVALID_PROGRAM,
               "plan section does not start with \"KPLN\"; re-export the program");
  bytes[0] = 'K';
  kiln_wr_u32(bytes + 4, 7);
  expect_bytes(bytes, size, KILN_ERR_INCOMPATIBLE,
               "plan version 7 is newer than this runtime understands (2): re-export the program "
               "with this Kiln release or upgrade the Kiln runtime");
  kiln_wr_u32(bytes + 4, 0);
  expect_bytes(bytes, size, KILN_ERR_INVALID_PROGRAM,
               "plan version 0 is invalid; re-export the program");
  free(bytes);

  fresh(&f);
  f.plan.n_outputs = 0;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan has 1 inputs and 0 outputs; it needs 1 or more outputs and at most 256 bindings; "
         "re-export the program");
  /* Counts that would need gigabytes are refused by the size check before any allocation. */
  fresh(&f);
  bytes = encode(&f, &size);
  kiln_wr_u32(bytes + 8, 0xFFFFFFFFu);
  expect_bytes(bytes, size, KILN_ERR_INVALID_PROGRAM,
               "plan section is 856 bytes but its counts (4294967295 tensors, 2 ops, 1 inputs, 1 "
               "outputs) need 412316860696; re-export the program");
  free(bytes);
  {
    static uint32_t many[300];
    fresh(&f);
    f.plan.n_inputs = 256;
    f.plan.inputs = many;
    expect(&f, KILN_ERR_INVALID_PROGRAM,
           "plan has 256 inputs and 1 outputs; it needs 1 or more outputs and at most 256 "
           "bindings; re-export the program");
  }
}

static void test_tensor_refusals(void) {
  fixture f;
  fresh(&f);
  f.tensors[1].dtype = (kiln_dtype)9;
  expect(&f, KILN_ERR_INVALID_PROGRAM, "plan tensor 1: dtype 9 is unknown; re-export the program");
  fresh(&f);
  f.tensors[3].rank = 9;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 3: rank 9 is outside 0..8; re-export the program");
  fresh(&f);
  f.tensors[3].rank = -1;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 3: rank -1 is outside 0..8; re-export the program");
  fresh(&f);
  f.tensors[3].dims[1] = -4;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 3: dim 1 is -4, outside 0..2^62 (or not 0 past rank 2); re-export the "
         "program");
  fresh(&f);
  f.tensors[3].dims[5] = 1;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 3: dim 5 is 1, outside 0..2^62 (or not 0 past rank 2); re-export the "
         "program");
  fresh(&f);
  f.tensors[3].dims[0] = ((int64_t)1 << 62) + 1;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 3: dim 0 is 4611686018427387905, outside 0..2^62 (or not 0 past rank 2); "
         "re-export the program");
  fresh(&f);
  f.tensors[3].dims[0] = (int64_t)1 << 62;
  f.tensors[3].dims[1] = 4;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 3: shape [4611686018427387904,4] exceeds 2^63 bytes; re-export the "
         "program");
  fresh(&f);
  f.tensors[3].nbytes = 31;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 3: nbytes 31 is not the 32 bytes of f32 [2,4]; re-export the program");
  fresh(&f);
  f.tensors[3].storage = (kiln_storage)5;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 3: storage 5 is unknown; re-export the program");
  fresh(&f);
  f.tensors[0].io_index = 1;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 0: input index 1 is outside the plan's 1 (offset 0 must be 0); re-export "
         "the program");
  fresh(&f);
  f.tensors[4].offset = 8;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 4: output index 0 is outside the plan's 1 (offset 8 must be 0); re-export "
         "the program");
  fresh(&f);
  f.tensors[3].offset = 4;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 3: arena bytes at offset 4 (+32) are misaligned or outside its 32 bytes (io "
         "index 0 must be 0); re-export the program");
  fresh(&f);
  f.tensors[3].offset = UINT64_MAX - 3;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 3: arena bytes at offset 18446744073709551612 (+32) are misaligned or "
         "outside its 32 bytes (io index 0 must be 0); re-export the program");
  fresh(&f);
  f.tensors[2].offset = 68;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 2: weight bytes at offset 68 (+16) are misaligned or outside its 80 bytes "
         "(io index 0 must be 0); re-export the program");
  fresh(&f);
  f.tensors[2].offset = 62;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 2: weight bytes at offset 62 (+16) are misaligned or outside its 80 bytes "
         "(io index 0 must be 0); re-export the program");
  fresh(&f);
  f.tensors[1].io_index = 2;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 1: weight bytes at offset 0 (+48) are misaligned or outside its 80 bytes "
         "(io index 2 must be 0); re-export the program");
}

static void test_io_list_refusals(void) {
  fixture f;
  fresh(&f);
  f.inputs[0] = 3;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan input 0 names tensor 3, which is not input 0 of the plan's 5 tensors; re-export "
         "the program");
  fresh(&f);
  f.inputs[0] = 77;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan input 0 names tensor 77, which is not input 0 of the plan's 5 tensors; re-export "
         "the program");
  fresh(&f);
  f.outputs[0] = 3;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan output 0 names tensor 3, which is not output 0 of the plan's 5 tensors; re-export "
         "the program");
  /* One tensor listed twice. */
  fresh(&f);
  f.plan.n_inputs = 2;
  f.inputs[1] = 0;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan input 1 names tensor 0, which is not input 1 of the plan's 5 tensors; re-export "
         "the program");
  /* A second tensor claiming input 0 while the list names the first. */
  fresh(&f);
  set_tensor(&f.tensors[5], KILN_F32, 1, (int64_t[]){3}, KILN_STORE_INPUT, 0, 0);
  f.plan.n_tensors = 6;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 5 claims input 0 but that binding is tensor 0; re-export the program");
}

static void test_op_refusals(void) {
  fixture f;
  fresh(&f);
  f.ops[1].kind = (kiln_op_kind)KILN_OP_COUNT;
  char unknown[96]; /* the first kind past the enum, whatever the enum's length */
  snprintf(unknown, sizeof unknown, "plan op 1: kind %d is unknown; re-export the program",
           (int)KILN_OP_COUNT);
  expect(&f, KILN_ERR_INVALID_PROGRAM, unknown);
  fresh(&f);
  f.ops[1].n_inputs = 9;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (relu): 9 inputs and 0 integer attributes exceed 8 and 12; re-export the "
         "program");
  fresh(&f);
  f.ops[1].n_iattr = 13;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (relu): 1 inputs and 13 integer attributes exceed 8 and 12; re-export the "
         "program");
  fresh(&f);
  f.ops[1].inputs[0] = 5;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (relu): input slot 0 holds tensor 5 but the plan has 5 tensors and 1 inputs; "
         "re-export the program");
  fresh(&f);
  f.ops[1].inputs[3] = 1;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (relu): input slot 3 holds tensor 1 but the plan has 5 tensors and 1 inputs; "
         "re-export the program");
  fresh(&f);
  f.ops[1].output = 5;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (relu): output tensor 5 is outside the plan's 5 tensors; re-export the "
         "program");
  fresh(&f);
  f.ops[1].iattr[2] = -3;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (relu): unused attribute slot iattr2 is -3, not 0; re-export the program");
  fresh(&f);
  f.ops[1].n_inputs = 2;
  f.ops[1].inputs[1] = 1;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (relu): takes 1 to 1 inputs but has 2; re-export the program");
  fresh(&f);
  f.ops[0].fattr[0] = NAN;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 0 (linear): attribute fattr0 is nan, not a finite number; re-export the "
         "program");
  fresh(&f);
  f.ops[0].iattr[0] = 5;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 0 (linear): attribute iattr0 is 5 but must be 0..4; re-export the program");
  fresh(&f);
  f.ops[0].iattr[0] = KILN_ACT_SWIGLU; /* SwiGLU with a bias */
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 0 (linear): SwiGLU takes x and one weight of 2N rows (gate over up), but has 3 "
         "inputs and weight [4,3]; re-export the program");
}

static void test_order_refusals(void) {
  fixture f;
  /* The relu runs first and reads what the linear writes later. */
  fresh(&f);
  f.ops[0] = (kiln_op){KILN_OP_RELU, 1, {3}, 4, 0, {0}, {0, 0}, {{0, 0, 0}}};
  f.ops[1] = (kiln_op){KILN_OP_LINEAR, 3, {0, 1, 2}, 3, 1, {KILN_ACT_NONE}, {0, 0}, {{0, 0, 0}}};
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 0 (relu): input 0 reads tensor 3, which no earlier op writes; re-export the "
         "program");
  /* An op reading its own output. */
  fresh(&f);
  f.ops[1].inputs[0] = 4;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (relu): input 0 reads tensor 4, which no earlier op writes; re-export the "
         "program");
  fresh(&f);
  f.ops[1].output = 1;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (relu): writes tensor 1 of weight storage, but ops write only arena and "
         "output tensors; re-export the program");
  fresh(&f);
  f.ops[1].output = 0;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (relu): writes tensor 0 of input storage, but ops write only arena and "
         "output tensors; re-export the program");
  fresh(&f);
  f.ops[1] = (kiln_op){KILN_OP_LINEAR, 3, {0, 1, 2}, 3, 1, {KILN_ACT_RELU}, {0, 0}, {{0, 0, 0}}};
  f.ops[2] = (kiln_op){KILN_OP_RELU, 1, {3}, 4, 0, {0}, {0, 0}, {{0, 0, 0}}};
  f.plan.n_ops = 3;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (linear): writes tensor 3, which op 0 already wrote; re-export the program");
  fresh(&f);
  f.plan.n_ops = 1;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan output 0 (tensor 4) is written by no op; re-export the program");
}

static void test_shape_refusals(void) {
  fixture f;
  /* The declared output disagrees with what the op computes. */
  fresh(&f);
  set_tensor(&f.tensors[4], KILN_F32, 2, (int64_t[]){2, 5}, KILN_STORE_OUTPUT, 0, 0);
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (relu): output tensor 4 is f32 [2,5] but its inputs give f32 [2,4]; "
         "re-export the program");
  fresh(&f);
  set_tensor(&f.tensors[4], KILN_F16, 2, (int64_t[]){2, 4}, KILN_STORE_OUTPUT, 0, 0);
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (relu): output tensor 4 is f16 [2,4] but its inputs give f32 [2,4]; "
         "re-export the program");
  /* The weight's K disagrees with the input's last dim. */
  fresh(&f);
  set_tensor(&f.tensors[1], KILN_F32, 2, (int64_t[]){4, 2}, KILN_STORE_WEIGHT, 0, 0);
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 0 (linear): input 0 has 3 columns but the weight [4,2] expects 2; the weight "
         "must be [N,K] with K = the input's last dim; re-export the program");
  fresh(&f);
  set_tensor(&f.tensors[2], KILN_F32, 1, (int64_t[]){3}, KILN_STORE_WEIGHT, 0, 64);
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 0 (linear): the bias has shape [3] but the weight [4,3] needs [4]; re-export "
         "the program");
  fresh(&f);
  set_tensor(&f.tensors[0], KILN_I32, 2, (int64_t[]){2, 3}, KILN_STORE_INPUT, 0, 0);
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 0 (linear): input 0 is i32 but the op needs f32, f16 or bf16; cast it "
         "first; re-export the program");
}

static void accept(const fixture *f) {
  size_t size = 0;
  uint8_t *bytes = encode(f, &size);
  kiln_plan out;
  kiln_error err = {KILN_OK, ""};
  CHECK(kiln_plan_parse(bytes, size, WEIGHTS_SIZE, &out, &err) == KILN_OK);
  CHECK_STR(err.message, "");
  kiln_plan_release(&out);
  free(bytes);
}

/* x f32 [1,4,4,2] -> one pooling or resize op -> y, the plan's only op. */
static void vision_plan(fixture *f, kiln_op_kind kind, uint32_t n_iattr, const int64_t *iattr,
                        const int64_t *out_dims) {
  memset(f, 0, sizeof *f);
  set_tensor(&f->tensors[0], KILN_F32, 4, (int64_t[]){1, 4, 4, 2}, KILN_STORE_INPUT, 0, 0);
  set_tensor(&f->tensors[1], KILN_F32, 4, out_dims, KILN_STORE_OUTPUT, 0, 0);
  f->ops[0] = (kiln_op){kind, 1, {0}, 1, n_iattr, {0}, {0, 0}, {{0, 0, 0}}};
  memcpy(f->ops[0].iattr, iattr, n_iattr * sizeof *iattr);
  f->plan = (kiln_plan){KILN_PLAN_VERSION, 2, 1, 1, 1, 0, f->tensors, f->ops, f->inputs, f->outputs, 0, NULL, 0, 0, {{"", 0, 0}}};
  f->outputs[0] = 1;
}

/* The optional channels_last attribute of the pooling and resize ops: 0 or 1, rank 4. */
static void test_channels_last_refusals(void) {
  const int64_t pool[6] = {KILN_PAIR(2, 2), KILN_PAIR(2, 2), 0, KILN_PAIR(1, 1), 0, 1};
  fixture f;
  vision_plan(&f, KILN_OP_MAX_POOL2D, 6, pool, (int64_t[]){1, 2, 2, 2});
  accept(&f);
  vision_plan(&f, KILN_OP_MAX_POOL2D, 5, pool, (int64_t[]){1, 4, 2, 1});
  accept(&f); /* absent: NCHW */
  vision_plan(&f, KILN_OP_MAX_POOL2D, 6, pool, (int64_t[]){1, 4, 2, 1});
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 0 (max_pool2d): output tensor 1 is f32 [1,4,2,1] but its inputs give f32 "
         "[1,2,2,2]; re-export the program");
  vision_plan(&f, KILN_OP_MAX_POOL2D, 6, pool, (int64_t[]){1, 2, 2, 2});
  f.ops[0].iattr[5] = 2;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 0 (max_pool2d): iattr5 (channels_last) is 2 but must be 0 or 1; re-export the "
         "program");
  const int64_t avg[7] = {KILN_PAIR(2, 2), KILN_PAIR(2, 2), 0, 0, 1, 0, -1};
  vision_plan(&f, KILN_OP_AVG_POOL2D, 7, avg, (int64_t[]){1, 2, 2, 2});
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 0 (avg_pool2d): iattr6 (channels_last) is -1 but must be 0 or 1; re-export the "
         "program");
  const int64_t up[3] = {KILN_PAIR(8, 8), 0, 1};
  vision_plan(&f, KILN_OP_UPSAMPLE_BILINEAR2D, 3, up, (int64_t[]){1, 8, 8, 2});
  accept(&f);
  vision_plan(&f, KILN_OP_UPSAMPLE_BILINEAR2D, 4, (int64_t[]){KILN_PAIR(8, 8), 0, 1, 0},
              (int64_t[]){1, 8, 8, 2});
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 0 (upsample_bil): takes 2 to 3 integer attributes but has 4; re-export the "
         "program");
  const int64_t near[2] = {KILN_PAIR(8, 8), 1};
  vision_plan(&f, KILN_OP_UPSAMPLE_NEAREST2D, 2, near, (int64_t[]){1, 8, 8, 2});
  accept(&f);
  const int64_t adaptive[2] = {KILN_PAIR(1, 1), 1};
  vision_plan(&f, KILN_OP_ADAPTIVE_AVG_POOL2D, 2, adaptive, (int64_t[]){1, 1, 1, 2});
  accept(&f);
  set_tensor(&f.tensors[0], KILN_F32, 3, (int64_t[]){4, 4, 2}, KILN_STORE_INPUT, 0, 0);
  set_tensor(&f.tensors[1], KILN_F32, 3, (int64_t[]){1, 1, 2}, KILN_STORE_OUTPUT, 0, 0);
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 0 (adaptive_avg): input 0 has rank 3 but channels_last needs [N,H,W,C]; "
         "re-export the program");
}

/* linear -> t3, then op 1 (relu or a view) t3 -> t5 at arena offset `at`, relu t5 -> out. */
static void chain(fixture *f, kiln_op_kind kind, uint64_t at) {
  fresh(f);
  set_tensor(&f->tensors[5], KILN_F32, 2, (int64_t[]){2, 4}, KILN_STORE_ARENA, 0, at);
  f->ops[1] = (kiln_op){kind, 1, {3}, 5, 0, {0}, {0, 0}, {{0, 0, 0}}};
  if (kind == KILN_OP_RESHAPE) f->ops[1].n_iattr = 2, f->ops[1].iattr[0] = 2, f->ops[1].iattr[1] = 4;
  f->ops[2] = (kiln_op){KILN_OP_RELU, 1, {5}, 4, 0, {0}, {0, 0}, {{0, 0, 0}}};
  f->plan.n_tensors = 6;
  f->plan.n_ops = 3;
  f->plan.arena_size = at + 32 > 32 ? at + 32 : 32;
}

static void test_memory_refusals(void) {
  fixture f;
  /* An op writing onto bytes it reads: the engines' kernels assume they do not meet. */
  chain(&f, KILN_OP_RELU, 16);
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (relu): output tensor 5 (arena 16 +32) overlaps input 0, tensor 3 (arena 0 "
         "+32); re-export the program");
  chain(&f, KILN_OP_RELU, 0);
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (relu): output tensor 5 (arena 0 +32) overlaps input 0, tensor 3 (arena 0 "
         "+32); re-export the program");
  chain(&f, KILN_OP_RELU, 32);
  accept(&f);
  /* A view the memory plan placed on its input's bytes is the one legitimate overlap... */
  chain(&f, KILN_OP_RESHAPE, 0);
  accept(&f);
  /* ...but not one shifted off them (the select at 0 of an input at 8, as found by fuzzing). */
  chain(&f, KILN_OP_RESHAPE, 8);
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (reshape): output tensor 5 (arena 8 +32) overlaps input 0, tensor 3 (arena 0 "
         "+32); re-export the program");
  chain(&f, KILN_OP_SELECT, 0);
  set_tensor(&f.tensors[3], KILN_F32, 2, (int64_t[]){2, 4}, KILN_STORE_ARENA, 0, 8);
  set_tensor(&f.tensors[5], KILN_F32, 1, (int64_t[]){4}, KILN_STORE_ARENA, 0, 0);
  set_tensor(&f.tensors[4], KILN_F32, 1, (int64_t[]){4}, KILN_STORE_OUTPUT, 0, 0);
  f.ops[1].n_iattr = 2;
  f.ops[1].iattr[1] = 1;
  f.plan.arena_size = 40;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (select): output tensor 5 (arena 0 +16) overlaps input 0, tensor 3 (arena 8 "
         "+32); re-export the program");
  f.tensors[5].offset = 24;
  accept(&f);
  /* The arena is at most its tensors' reach rounded up to the arena alignment. */
  fresh(&f);
  f.plan.arena_size = 256;
  accept(&f);
  f.plan.arena_size = 257;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan arena size 257 exceeds the 256 bytes its tensors reach (aligned to 256); "
         "re-export the program");
  f.plan.arena_size = 21000000000ull;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan arena size 21000000000 exceeds the 256 bytes its tensors reach (aligned to 256); "
         "re-export the program");
}

/* A byte whose bits may change without making the fixture invalid: the arena size, the
 * weights' offsets (weights may share bytes), the linear's activation and attribute count,
 * the relu's kind (silu and neg take the same shapes) and both ops' reals. */
static int may_change(size_t byte) {
  size_t ops = 32 + 5 * 96;
  if (byte >= 24 && byte < 32) return 1;
  if (byte >= 32 + 96 + 80 && byte < 32 + 96 + 88) return 1;
  if (byte >= 32 + 2 * 96 + 80 && byte < 32 + 2 * 96 + 88) return 1;
  if (byte == ops + 48 || byte == ops + 44 || byte == ops + 160) return 1;
  for (size_t op = 0; op < 2; op++)
    if (byte >= ops + op * 160 + 144 && byte < ops + op * 160 + 160) return 1;
  return 0;
}

/* Every truncation and every single-bit flip of a valid plan parses or is refused with a
 * message; under the sanitizers this also proves nothing is read out of bounds. */
static void test_corruption_never_crashes(void) {
  fixture f;
  size_t size = 0;
  uint8_t *bytes, *copy;
  int refused = 0, silent = 0, ok_parses = 0, unexpected = 0;
  fresh(&f);
  bytes = encode(&f, &size);
  copy = malloc(size);
  for (size_t n = 0; n < size; n++) {
    kiln_plan out;
    kiln_error err = {KILN_OK, ""};
    memcpy(copy, bytes, n);
    if (kiln_plan_parse(copy, n, WEIGHTS_SIZE, &out, &err) != KILN_OK) refused++;
  }
  CHECK(refused == (int)size);
  for (size_t i = 0; i < size * 8; i++) {
    kiln_plan out;
    kiln_error err = {KILN_OK, ""};
    memcpy(copy, bytes, size);
    copy[i / 8] ^= (uint8_t)(1u << (i % 8));
    if (kiln_plan_parse(copy, size, WEIGHTS_SIZE, &out, &err) == KILN_OK) {
      ok_parses++;
      if (!may_change(i / 8)) unexpected++, fprintf(stderr, "flip of bit %u accepted\n", (unsigned)i);
      kiln_plan_release(&out);
    } else if (err.message[0] == '\0') {
      silent++;
    }
  }
  CHECK(silent == 0);
  CHECK(unexpected == 0);
  CHECK(ok_parses > 0);
  free(copy);
  free(bytes);
}

static void test_serialize_arguments(void) {
  kiln_plan empty;
  kiln_error err = {KILN_OK, ""};
  void *out = NULL;
  size_t size = 0;
  memset(&empty, 0, sizeof empty);
  empty.n_tensors = 2;
  CHECK(kiln_plan_serialize(&empty, &out, &size, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "plan serialize: a NULL plan, output or array with a non-zero count; "
                         "pass a complete plan");
  CHECK(kiln_plan_parse(NULL, 4, 0, &empty, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message,
            "plan parse: NULL output or data; pass the plan section and a plan to fill");
}

/* A KV-cache step: cache = index_copy(cache, pos, row) in place on state 0, out = copy(cache).
 * t0 pos i64 [1], t1 row f32 [1,2], t2 the state at the start (f32 [4,2], initial value at
 * weights 0), t3 the state written, t4 the output. */
static void state_fixture(fixture *f) {
  memset(f, 0, sizeof *f);
  set_tensor(&f->tensors[0], KILN_I64, 1, (int64_t[]){1}, KILN_STORE_INPUT, 0, 0);
  set_tensor(&f->tensors[1], KILN_F32, 2, (int64_t[]){1, 2}, KILN_STORE_INPUT, 1, 0);
  set_tensor(&f->tensors[2], KILN_F32, 2, (int64_t[]){4, 2}, KILN_STORE_STATE, 0, 0);
  set_tensor(&f->tensors[3], KILN_F32, 2, (int64_t[]){4, 2}, KILN_STORE_STATE, 0, 0);
  set_tensor(&f->tensors[4], KILN_F32, 2, (int64_t[]){4, 2}, KILN_STORE_OUTPUT, 0, 0);
  f->ops[0] = (kiln_op){KILN_OP_INDEX_COPY, 3, {2, 0, 1}, 3, 1, {0}, {0, 0}, {{0, 0, 0}}};
  f->ops[1] = (kiln_op){KILN_OP_COPY, 1, {3}, 4, 0, {0}, {0, 0}, {{0, 0, 0}}};
  f->inputs[0] = 0;
  f->inputs[1] = 1;
  f->outputs[0] = 4;
  f->plan = (kiln_plan){KILN_PLAN_VERSION, 5, 2, 2, 1, 0, f->tensors, f->ops, f->inputs, f->outputs, 0, NULL, 0, 0, {{"", 0, 0}}};
}

static void test_state_rules(void) {
  fixture f;
  kiln_plan out;
  kiln_error err = {KILN_OK, ""};
  size_t size = 0;
  uint8_t *bytes;
  state_fixture(&f);
  bytes = encode(&f, &size);
  CHECK(kiln_plan_parse(bytes, size, WEIGHTS_SIZE, &out, &err) == KILN_OK);
  CHECK(out.n_states == 1 && out.tensors[3].storage == KILN_STORE_STATE);
  kiln_plan_release(&out);
  free(bytes);
  state_fixture(&f);
  f.tensors[2].offset = 64; /* its initial value past the 80-byte weights */
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 2: state bytes at offset 64 (+32) are misaligned or outside its 80 bytes "
         "(io index 0 must be 0); re-export the program");
  state_fixture(&f);
  f.tensors[3].offset = 32;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 3 differs from tensor 2, the same state 0, in dtype, shape or initial "
         "value; re-export the program");
  state_fixture(&f);
  f.tensors[2].io_index = f.tensors[3].io_index = 1; /* state 0 has no record */
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan state 0 has no record of its value at the start of a run (the plan has 2 "
         "states); re-export the program");
  state_fixture(&f);
  f.tensors[2].io_index = 300;
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan tensor 2: state index 300 exceeds the limit of 256 states; re-export the program");
  state_fixture(&f);
  f.ops[0] = (kiln_op){KILN_OP_RELU, 1, {2}, 3, 0, {0}, {0, 0}, {{0, 0, 0}}}; /* not a state write */
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 0 (relu): writes tensor 3 of state 0, but only index_copy in place on that "
         "state, or a copy from another buffer, may; re-export the program");
  state_fixture(&f);
  f.tensors[2].storage = KILN_STORE_WEIGHT; /* index_copy onto a state from a weight */
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 0 (index_copy): writes tensor 3 of state 0, but only index_copy in place on "
         "that state, or a copy from another buffer, may; re-export the program");
  state_fixture(&f);
  f.ops[1].inputs[0] = 2; /* reads the start value after op 0 replaced it */
  expect(&f, KILN_ERR_INVALID_PROGRAM,
         "plan op 1 (copy) reads state 0 as it was before op 0 wrote it; re-export the program");
}

int main(void) {
  test_round_trip();
  test_version_1_plan_loads();
  test_state_rules();
  test_header_refusals();
  test_tensor_refusals();
  test_io_list_refusals();
  test_op_refusals();
  test_order_refusals();
  test_shape_refusals();
  test_channels_last_refusals();
  test_memory_refusals();
  test_corruption_never_crashes();
  test_serialize_arguments();
  return check_report("test_plan");
}
