/* The builder: shape inference of every op family, refusals naming the op and the mismatch,
 * and what build writes (dead-code removal, constant folding, GEMM recognition, epilogue
 * fusion, COPY for outputs, metadata), with every allocation failure injected. */
#include "check.h"
#include "runtime/alloc.h"
#include "runtime/shape.h"
#include "kiln/kiln.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define D(...) ((const int64_t[]){__VA_ARGS__})
#define T(...) ((const int32_t[]){__VA_ARGS__})
#define I(...) ((const int64_t[]){__VA_ARGS__})

/* A built blob taken apart again. */
typedef struct built {
  void *blob;
  size_t size;
  kiln_blob_view view;
  kiln_plan plan;
  kiln_metadata md;
} built;

static int take_apart(built *x) {
  kiln_error err = {KILN_OK, ""};
  int ok = kiln_blob_parse(x->blob, x->size, &x->view, &err) == KILN_OK &&
           kiln_metadata_parse((const char *)x->view.metadata, x->view.metadata_size, &x->md,
                               &err) == KILN_OK &&
           kiln_plan_parse(x->view.plan, x->view.plan_size, x->view.weights_size, &x->plan,
                           &err) == KILN_OK;
  if (!ok) fprintf(stderr, "take_apart: %s\n", err.message);
  CHECK(ok);
  return ok;
}

static int build(kiln_builder *b, const kiln_build_options *opts, built *x) {
  kiln_error err = {KILN_OK, ""};
  memset(x, 0, sizeof *x);
  if (kiln_builder_build(b, opts, &x->blob, &x->size, &err) != KILN_OK) {
    fprintf(stderr, "build: %s\n", err.message);
    CHECK(0);
    return 0;
  }
  return take_apart(x);
}

static void release(built *x) {
  kiln_plan_release(&x->plan);
  kiln_free(x->blob);
}

static kiln_builder *builder(void) {
  kiln_builder *b = kiln_builder_create();
  CHECK(b != NULL);
  return b;
}

static int32_t input(kiln_builder *b, const char *name, kiln_dtype dt, int32_t rank,
                     const int64_t *dims) {
  kiln_error err = {KILN_OK, ""};
  int32_t id = kiln_builder_add_input(b, name, dt, rank, dims, &err);
  if (id < 0) fprintf(stderr, "add_input: %s\n", err.message);
  CHECK(id >= 0);
  return id;
}

/* A constant of f32 values 1, 2, 3, ... (or of the given values). */
static int32_t constant(kiln_builder *b, int32_t rank, const int64_t *dims, const float *values) {
  kiln_error err = {KILN_OK, ""};
  float data[256];
  uint64_t n = 1;
  int32_t id;
  for (int32_t i = 0; i < rank; i++) n *= (uint64_t)dims[i];
  for (uint64_t i = 0; i < n && i < 256; i++) data[i] = values ? values[i] : (float)(i + 1);
  id = kiln_builder_add_constant(b, KILN_F32, rank, dims, data, n * 4, &err);
  if (id < 0) fprintf(stderr, "add_constant: %s\n", err.message);
  CHECK(id >= 0);
  return id;
}

static int32_t op(kiln_builder *b, kiln_op_kind kind, const int32_t *in, uint32_t n_in,
                  const int64_t *iattr, uint32_t n_iattr, const double *fattr, uint32_t n_fattr) {
  kiln_error err = {KILN_OK, ""};
  int32_t id = kiln_builder_add_op(b, kind, in, n_in, iattr, n_iattr, fattr, n_fattr, &err);
  if (id < 0) fprintf(stderr, "add_op %s: %s\n", kiln_op_name(kind), err.message);
  CHECK(id >= 0);
  return id;
}

static void output(kiln_builder *b, int32_t t, const char *name) {
  kiln_error err = {KILN_OK, ""};
  kiln_status s = kiln_builder_mark_output(b, t, name, &err);
  if (s) fprintf(stderr, "mark_output: %s\n", err.message);
  CHECK(s == KILN_OK);
}

/* Checks a tensor's dtype and shape, written as "f32 [2,3]". */
static void expect_shape(const kiln_builder *b, int32_t t, const char *want) {
  kiln_error err = {KILN_OK, ""};
  kiln_dtype dt;
  int32_t rank;
  int64_t dims[KILN_MAX_RANK];
  char shape[64], got[80];
  CHECK(kiln_builder_get_shape(b, t, &dt, &rank, dims, &err) == KILN_OK);
  snprintf(got, sizeof got, "%s %s", kiln_dtype_name(dt), kiln_shape_str(rank, dims, shape, sizeof shape));
  CHECK_STR(got, want);
}

/* add_op must refuse with exactly msg. */
static void expect_refusal(kiln_builder *b, kiln_op_kind kind, const int32_t *in, uint32_t n_in,
                           const int64_t *iattr, uint32_t n_iattr, const double *fattr,
                           uint32_t n_fattr, kiln_status status, const char *msg) {
  kiln_error err = {KILN_OK, ""};
  int32_t id = kiln_builder_add_op(b, kind, in, n_in, iattr, n_iattr, fattr, n_fattr, &err);
  CHECK(id == -1);
  CHECK(err.status == status);
  CHECK_STR(err.message, msg);
}

static void test_shapes(void) {
  kiln_builder *b = builder();
  int32_t a = input(b, "a", KILN_F32, 3, D(2, 1, 3)), c = input(b, "c", KILN_F32, 2, D(4, 1));
  int32_t s0 = input(b, "s0", KILN_F32, 0, NULL), v3 = input(b, "v3", KILN_F32, 1, D(3));
  int32_t e = input(b, "e", KILN_F32, 2, D(0, 3)), r13 = input(b, "r13", KILN_F32, 2, D(1, 3));
  int32_t x = input(b, "x", KILN_F32, 3, D(5, 2, 3)), w = constant(b, 2, D(4, 3), NULL);
  int32_t m1 = input(b, "m1", KILN_F32, 4, D(2, 1, 3, 4)), m2 = input(b, "m2", KILN_F32, 3, D(5, 4, 6));
  int32_t big = input(b, "big", KILN_F32, 3, D(2, 3, 4)), t10 = input(b, "t10", KILN_F32, 2, D(10, 4));
  int32_t i64 = input(b, "idx", KILN_I64, 2, D(2, 3)), i32 = input(b, "i32", KILN_I32, 1, D(3));
  int32_t table = constant(b, 2, D(10, 4), NULL), wide = input(b, "wide", KILN_F32, 2, D(5, 6));
  int32_t cond = input(b, "cond", KILN_BOOL, 2, D(2, 1));
  int32_t q = input(b, "q", KILN_F32, 4, D(1, 2, 4, 8)), k = input(b, "k", KILN_F32, 4, D(1, 2, 5, 8));
  int32_t v = input(b, "v", KILN_F32, 4, D(1, 2, 5, 6)), mask = input(b, "mask", KILN_BOOL, 2, D(4, 5));
  int32_t fmask = input(b, "fmask", KILN_F32, 3, D(2, 1, 5));
  int32_t q4 = input(b, "q4", KILN_F32, 4, D(1, 4, 4, 8)), k2 = input(b, "k2", KILN_F32, 4, D(1, 2, 5, 8));
  int32_t v2 = input(b, "v2", KILN_F32, 4, D(1, 2, 5, 6));
  int32_t h = input(b, "h", KILN_F16, 2, D(2, 3)), ln_w = constant(b, 2, D(3, 4), NULL);

  expect_shape(b, op(b, KILN_OP_ADD, T(a, c), 2, NULL, 0, NULL, 0), "f32 [2,4,3]");
  expect_shape(b, op(b, KILN_OP_SUB, T(s0, v3), 2, NULL, 0, (double[]){2}, 1), "f32 [3]");
  expect_shape(b, op(b, KILN_OP_MUL, T(e, r13), 2, NULL, 0, NULL, 0), "f32 [0,3]");
  expect_shape(b, op(b, KILN_OP_DIV, T(r13, s0), 2, NULL, 0, NULL, 0), "f32 [1,3]");
  expect_shape(b, op(b, KILN_OP_ADD, T(i64, i64), 2, NULL, 0, (double[]){3}, 1), "i64 [2,3]");
  expect_shape(b, op(b, KILN_OP_LINEAR, T(x, w), 2, NULL, 0, NULL, 0), "f32 [5,2,4]");
  expect_shape(b, op(b, KILN_OP_MATMUL, T(m1, m2), 2, NULL, 0, NULL, 0), "f32 [2,5,3,6]");
  expect_shape(b, op(b, KILN_OP_SDPA, T(q4, k2, v2), 3, I(1, 0), 2, NULL, 0), "f32 [1,4,4,6]");
  expect_shape(b, op(b, KILN_OP_SUM, T(big), 1, I(5, 0), 2, NULL, 0), "f32 [3]");
  expect_shape(b, op(b, KILN_OP_MEAN, T(big), 1, I(5, 1), 2, NULL, 0), "f32 [1,3,1]");
  expect_shape(b, op(b, KILN_OP_AMAX, T(big), 1, I(7, 0), 2, NULL, 0), "f32 []");
  expect_shape(b, op(b, KILN_OP_SUM, T(s0), 1, I(0, 0), 2, NULL, 0), "f32 []");
  expect_shape(b, op(b, KILN_OP_RESHAPE, T(big), 1, I(-1), 1, NULL, 0), "f32 [24]");
  expect_shape(b, op(b, KILN_OP_RESHAPE, T(big), 1, I(4, -1, 2), 3, NULL, 0), "f32 [4,3,2]");
  expect_shape(b, op(b, KILN_OP_RESHAPE, T(e), 1, I(3, 0), 2, NULL, 0), "f32 [3,0]");
  expect_shape(b, op(b, KILN_OP_PERMUTE, T(big), 1, I(-1, 0, 1), 3, NULL, 0), "f32 [4,2,3]");
  expect_shape(b, op(b, KILN_OP_EXPAND, T(c), 1, I(2, -1, 5), 3, NULL, 0), "f32 [2,4,5]");
  expect_shape(b, op(b, KILN_OP_EXPAND, T(r13), 1, I(0, 3), 2, NULL, 0), "f32 [0,3]");
  expect_shape(b, op(b, KILN_OP_CAT, T(r13, e, r13), 3, I(-2), 1, NULL, 0), "f32 [2,3]");
  expect_shape(b, op(b, KILN_OP_SLICE, T(t10), 1, I(0, -3, INT64_MAX, 2), 4, NULL, 0), "f32 [2,4]");
  expect_shape(b, op(b, KILN_OP_SLICE, T(t10), 1, I(-1, 1, 4, 1), 4, NULL, 0), "f32 [10,3]");
  expect_shape(b, op(b, KILN_OP_SLICE, T(t10), 1, I(0, 5, 2, 1), 4, NULL, 0), "f32 [0,4]");
  expect_shape(b, op(b, KILN_OP_SLICE, T(t10), 1, I(0, -100, 3, 1), 4, NULL, 0), "f32 [3,4]");
  expect_shape(b, op(b, KILN_OP_SELECT, T(big), 1, I(-2, -1), 2, NULL, 0), "f32 [2,4]");
  expect_shape(b, op(b, KILN_OP_EMBEDDING, T(table, i64), 2, NULL, 0, NULL, 0), "f32 [2,3,4]");
  expect_shape(b, op(b, KILN_OP_INDEX_SELECT, T(wide, i32), 2, I(1), 1, NULL, 0), "f32 [5,3]");
  expect_shape(b, op(b, KILN_OP_WHERE, T(cond, v3, s0), 3, NULL, 0, NULL, 0), "f32 [2,3]");
  expect_shape(b, op(b, KILN_OP_SDPA, T(q, k, v, mask), 4, I(0, 1), 2, NULL, 0), "f32 [1,2,4,6]");
  expect_shape(b, op(b, KILN_OP_SDPA, T(q, k, v, fmask), 4, I(0, 1), 2, NULL, 0), "f32 [1,2,4,6]");
  expect_shape(b, op(b, KILN_OP_SDPA, T(q, k, v), 3, I(1, 0), 2, (double[]){0.5}, 1), "f32 [1,2,4,6]");
  expect_shape(b, op(b, KILN_OP_SDPA, T(q, k, v, mask), 4, I(0, 1, 2), 3, NULL, 0), "f32 [1,4,2,6]");
  expect_shape(b, op(b, KILN_OP_SDPA, T(q4, k2, v2), 3, I(1, 0, 2), 3, NULL, 0), "f32 [1,4,4,6]");
  expect_shape(b, op(b, KILN_OP_CAST, T(a), 1, I(KILN_I64), 1, NULL, 0), "i64 [2,1,3]");
  expect_shape(b, op(b, KILN_OP_CAST, T(cond), 1, I(KILN_BF16), 1, NULL, 0), "bf16 [2,1]");
  expect_shape(b, op(b, KILN_OP_LAYER_NORM, T(big, ln_w, ln_w), 3, I(2, 3), 2, (double[]){1e-5}, 1),
               "f32 [2,3,4]");
  expect_shape(b, op(b, KILN_OP_LAYER_NORM, T(big), 1, I(1, 0), 2, (double[]){1e-5}, 1), "f32 [2,3,4]");
  expect_shape(b, op(b, KILN_OP_RMS_NORM, T(t10, constant(b, 1, D(4), NULL)), 2, I(1, 1), 2,
                     (double[]){1e-6}, 1),
               "f32 [10,4]");
  expect_shape(b, op(b, KILN_OP_SOFTMAX, T(big), 1, I(-1), 1, NULL, 0), "f32 [2,3,4]");
  expect_shape(b, op(b, KILN_OP_LOG_SOFTMAX, T(h), 1, I(0), 1, NULL, 0), "f16 [2,3]");
  expect_shape(b, op(b, KILN_OP_GELU, T(h), 1, I(1), 1, NULL, 0), "f16 [2,3]");
  expect_shape(b, op(b, KILN_OP_POW, T(h), 1, NULL, 0, (double[]){2}, 1), "f16 [2,3]");
  expect_shape(b, op(b, KILN_OP_COPY, T(i64), 1, NULL, 0, NULL, 0), "i64 [2,3]");
  kiln_builder_destroy(b);
}

static void test_shape_refusals(void) {
  const kiln_status bad = KILN_ERR_INVALID_ARGUMENT;
  kiln_builder *b = builder();
  int32_t x = input(b, "x", KILN_F32, 2, D(2, 3)), w42 = constant(b, 2, D(4, 2), NULL);
  int32_t b45 = input(b, "b45", KILN_F32, 2, D(4, 5)), v4 = input(b, "v4", KILN_F32, 1, D(4));
  int32_t h = input(b, "h", KILN_F16, 2, D(2, 3)), l = input(b, "l", KILN_I64, 2, D(2, 3));
  int32_t n32 = input(b, "n32", KILN_I32, 1, D(2)), x24 = input(b, "x24", KILN_F32, 2, D(2, 4));
  int32_t f2 = input(b, "f2", KILN_F32, 1, D(2)), l22 = input(b, "l22", KILN_I64, 2, D(2, 2));
  int32_t a223 = input(b, "a223", KILN_F32, 3, D(2, 2, 3)), b334 = input(b, "b334", KILN_F32, 3, D(3, 3, 4));
  int32_t q = input(b, "q", KILN_F32, 4, D(1, 2, 4, 8)), k7 = input(b, "k7", KILN_F32, 4, D(1, 2, 5, 7));
  int32_t k = input(b, "k", KILN_F32, 4, D(1, 2, 5, 8)), v = input(b, "v", KILN_F32, 4, D(1, 2, 5, 6));
  int32_t m35 = input(b, "m35", KILN_F32, 2, D(3, 5)), z = input(b, "z", KILN_F32, 1, D(0));
  int32_t k3h = input(b, "k3h", KILN_F32, 4, D(1, 3, 5, 8)), v3h = input(b, "v3h", KILN_F32, 4, D(1, 3, 5, 6));
  int32_t q2b = input(b, "q2b", KILN_F32, 4, D(2, 2, 4, 8)), q4 = input(b, "q4", KILN_F32, 4, D(1, 4, 4, 8));
  int32_t v4h = input(b, "v4h", KILN_F32, 4, D(1, 4, 5, 6));
  int32_t r14 = input(b, "r14", KILN_F32, 2, D(1, 4));
  int32_t huge = input(b, "huge", KILN_F32, 2, D(0, (int64_t)1 << 62));
  int32_t cond = input(b, "cond", KILN_BOOL, 2, D(2, 1));

  int32_t w33 = constant(b, 2, D(3, 3), NULL);
  expect_refusal(b, KILN_OP_LINEAR, T(x, w33), 2, I(KILN_ACT_SWIGLU), 1, NULL, 0, bad,
                 "builder op 0 (linear): SwiGLU takes x and one weight of 2N rows (gate over up), "
                 "but has 2 inputs and weight [3,3]");
  expect_refusal(b, KILN_OP_LINEAR, T(x, w42), 2, NULL, 0, NULL, 0, bad,
                 "builder op 0 (linear): input 0 has 3 columns but the weight [4,2] expects 2; "
                 "the weight must be [N,K] with K = the input's last dim");
  expect_refusal(b, KILN_OP_LINEAR, T(x, v4), 2, NULL, 0, NULL, 0, bad,
                 "builder op 0 (linear): the weight must be 2-D [N,K] but has shape [4]");
  expect_refusal(b, KILN_OP_LINEAR, T(x24, w42, f2), 3, NULL, 0, NULL, 0, bad,
                 "builder op 0 (linear): input 0 has 4 columns but the weight [4,2] expects 2; "
                 "the weight must be [N,K] with K = the input's last dim");
  expect_refusal(b, KILN_OP_LINEAR, T(f2, w42, f2), 3, NULL, 0, NULL, 0, bad,
                 "builder op 0 (linear): the bias has shape [2] but the weight [4,2] needs [4]");
  expect_refusal(b, KILN_OP_MATMUL, T(x, b45), 2, NULL, 0, NULL, 0, bad,
                 "builder op 0 (matmul): a [2,3] has 3 columns but b [4,5] has 4 rows");
  expect_refusal(b, KILN_OP_MATMUL, T(x, v4), 2, NULL, 0, NULL, 0, bad,
                 "builder op 0 (matmul): input 1 has rank 1 but the op needs rank 2 or more");
  expect_refusal(b, KILN_OP_MATMUL, T(a223, b334), 2, NULL, 0, NULL, 0, bad,
                 "builder op 0 (matmul): the batch dims of a [2,2,3] and b [3,3,4] do not "
                 "broadcast");
  expect_refusal(b, KILN_OP_ADD, T(x, v4), 2, NULL, 0, NULL, 0, bad,
                 "builder op 0 (add): shapes [2,3] and [4] do not broadcast (output dim 1)");
  expect_refusal(b, KILN_OP_ADD, T(x, h), 2, NULL, 0, NULL, 0, bad,
                 "builder op 0 (add): input 1 is f16 but input 0 is f32; cast them to one dtype "
                 "first");
  expect_refusal(b, KILN_OP_ADD, T(l, l), 2, NULL, 0, (double[]){0.5}, 1, bad,
                 "builder op 0 (add): alpha 0.5 is not a whole number but the inputs are i64");
  expect_refusal(b, KILN_OP_DIV, T(n32, n32), 2, NULL, 0, NULL, 0, bad,
                 "builder op 0 (div): input 0 is i32 but the op needs f32, f16 or bf16; cast it "
                 "first");
  expect_refusal(b, KILN_OP_RELU, T(l), 1, NULL, 0, NULL, 0, bad,
                 "builder op 0 (relu): input 0 is i64 but the op needs f32, f16 or bf16; cast it "
                 "first");
  expect_refusal(b, KILN_OP_RELU, T(x, x), 2, NULL, 0, NULL, 0, bad,
                 "builder op 0 (relu): takes 1 to 1 inputs but has 2");
  expect_refusal(b, KILN_OP_SOFTMAX, T(x), 1, NULL, 0, NULL, 0, bad,
                 "builder op 0 (softmax): takes 1 to 1 integer attributes but has 0");
  expect_refusal(b, KILN_OP_SOFTMAX, T(x), 1, I(2), 1, NULL, 0, bad,
                 "builder op 0 (softmax): dim 2 is outside 0..1 of input 0 [2,3]");
  expect_refusal(b, KILN_OP_POW, T(x), 1, NULL, 0, (double[]){INFINITY}, 1, bad,
                 "builder op 0 (pow): attribute fattr0 is inf, not a finite number");
  expect_refusal(b, KILN_OP_GELU, T(x), 1, I(2), 1, NULL, 0, bad,
                 "builder op 0 (gelu): attribute iattr0 is 2 but must be 0..1");
  expect_refusal(b, KILN_OP_CAST, T(x), 1, I(9), 1, NULL, 0, bad,
                 "builder op 0 (cast): attribute iattr0 is 9 but must be 0..5");
  expect_refusal(b, KILN_OP_RESHAPE, T(x), 1, I(4, 2), 2, NULL, 0, bad,
                 "builder op 0 (reshape): cannot reshape [2,3] (6 elements) into [4,2]; the "
                 "element counts must match");
  expect_refusal(b, KILN_OP_RESHAPE, T(x), 1, I(-1, -1), 2, NULL, 0, bad,
                 "builder op 0 (reshape): cannot reshape [2,3] (6 elements) into [-1,-1]; the "
                 "element counts must match");
  expect_refusal(b, KILN_OP_PERMUTE, T(x), 1, I(0, 0), 2, NULL, 0, bad,
                 "builder op 0 (permute): [0,0] is not a permutation of the 2 dims of input 0 "
                 "[2,3]");
  expect_refusal(b, KILN_OP_PERMUTE, T(x), 1, I(0), 1, NULL, 0, bad,
                 "builder op 0 (permute): [0] is not a permutation of the 2 dims of input 0 [2,3]");
  expect_refusal(b, KILN_OP_PERMUTE, T(x), 1, I(1, 0, 2), 3, NULL, 0, bad,
                 "builder op 0 (permute): [1,0,2] is not a permutation of the 2 dims of input 0 "
                 "[2,3]");
  expect_refusal(b, KILN_OP_EXPAND, T(x), 1, I(2, 4), 2, NULL, 0, bad,
                 "builder op 0 (expand): cannot expand [2,3] to [2,4]; only size-1 dims expand "
                 "and new dims go in front");
  expect_refusal(b, KILN_OP_EXPAND, T(x), 1, I(3), 1, NULL, 0, bad,
                 "builder op 0 (expand): cannot expand [2,3] to [3]; only size-1 dims expand and "
                 "new dims go in front");
  expect_refusal(b, KILN_OP_EXPAND, T(r14), 1, I((int64_t)1 << 62, 4), 2, NULL, 0, bad,
                 "builder op 0 (expand): the output f32 [4611686018427387904,4] exceeds 2^63 "
                 "bytes or a dim exceeds 2^62");
  expect_refusal(b, KILN_OP_CAT, T(x, x24), 2, I(0), 1, NULL, 0, bad,
                 "builder op 0 (cat): input 1 [2,4] and input 0 [2,3] differ in a dim other than "
                 "0");
  expect_refusal(b, KILN_OP_CAT, T(x, h), 2, I(0), 1, NULL, 0, bad,
                 "builder op 0 (cat): input 1 is f16 but input 0 is f32; cast them to one dtype "
                 "first");
  expect_refusal(b, KILN_OP_CAT, T(huge, huge), 2, I(1), 1, NULL, 0, bad,
                 "builder op 0 (cat): the joined dim 1 exceeds 2^62 elements");
  expect_refusal(b, KILN_OP_SLICE, T(x), 1, I(0, 0, 2, 0), 4, NULL, 0, bad,
                 "builder op 0 (slice): start 0, end 2, step 0 must satisfy 0 <= start <= end <= "
                 "2 (dim 0) and step >= 1");
  expect_refusal(b, KILN_OP_SELECT, T(x), 1, I(0, 5), 2, NULL, 0, bad,
                 "builder op 0 (select): index 5 is outside 0..1 of dim 0");
  expect_refusal(b, KILN_OP_SELECT, T(x), 1, I(0, -3), 2, NULL, 0, bad,
                 "builder op 0 (select): index -1 is outside 0..1 of dim 0");
  expect_refusal(b, KILN_OP_SUM, T(x), 1, I(4, 0), 2, NULL, 0, bad,
                 "builder op 0 (sum): dim mask 4 must name one or more of the 2 dims (bit i "
                 "reduces dim i)");
  expect_refusal(b, KILN_OP_MEAN, T(x), 1, I(0, 0), 2, NULL, 0, bad,
                 "builder op 0 (mean): dim mask 0 must name one or more of the 2 dims (bit i "
                 "reduces dim i)");
  expect_refusal(b, KILN_OP_SUM, T(x), 1, I(1, 2), 2, NULL, 0, bad,
                 "builder op 0 (sum): attribute iattr1 is 2 but must be 0..1");
  expect_refusal(b, KILN_OP_AMAX, T(z), 1, I(1, 0), 2, NULL, 0, bad,
                 "builder op 0 (amax): reduces dim 0 of size 0, which has no maximum");
  expect_refusal(b, KILN_OP_LAYER_NORM, T(x, v4), 2, I(1, 1), 2, NULL, 0, bad,
                 "builder op 0 (layer_norm): input 1 has shape [4] but must equal the normalized "
                 "dims [3]");
  expect_refusal(b, KILN_OP_LAYER_NORM, T(x, v4), 2, I(1, 3), 2, NULL, 0, bad,
                 "builder op 0 (layer_norm): flags 3 (1 weight, 2 bias) mean 3 inputs but the op "
                 "has 2");
  expect_refusal(b, KILN_OP_LAYER_NORM, T(x), 1, I(3, 0), 2, NULL, 0, bad,
                 "builder op 0 (layer_norm): normalizes 3 trailing dims but input 0 [2,3] has "
                 "rank 2");
  expect_refusal(b, KILN_OP_RMS_NORM, T(x), 1, I(1, 2), 2, NULL, 0, bad,
                 "builder op 0 (rms_norm): attribute iattr1 is 2 but must be 0..1");
  expect_refusal(b, KILN_OP_EMBEDDING, T(w42, f2), 2, NULL, 0, NULL, 0, bad,
                 "builder op 0 (embedding): indices (input 1) are f32 [2] but must be i32 or i64 "
                 "of rank 7 or less");
  expect_refusal(b, KILN_OP_EMBEDDING, T(v4, n32), 2, NULL, 0, NULL, 0, bad,
                 "builder op 0 (embedding): the table (input 0) must be 2-D [V,D] but has shape "
                 "[4]");
  expect_refusal(b, KILN_OP_INDEX_SELECT, T(x, l22), 2, I(0), 1, NULL, 0, bad,
                 "builder op 0 (index_select): indices (input 1) are i64 [2,2] but must be i32 or "
                 "i64 of rank 1 or less");
  expect_refusal(b, KILN_OP_WHERE, T(x, x, x), 3, NULL, 0, NULL, 0, bad,
                 "builder op 0 (where): the condition (input 0) is f32 but must be bool");
  expect_refusal(b, KILN_OP_WHERE, T(cond, f2, v4), 3, NULL, 0, NULL, 0, bad,
                 "builder op 0 (where): input 2 [4] does not broadcast with [2,2]");
  expect_refusal(b, KILN_OP_SDPA, T(q, k7, v), 3, I(0, 0), 2, NULL, 0, bad,
                 "builder op 0 (sdpa): q [1,2,4,8], k [1,2,5,7] and v must be [...,L,E], [...,S,E] "
                 "and [...,S,Ev], batch dims equal but k,v heads (dim -3) may divide q's");
  expect_refusal(b, KILN_OP_SDPA, T(q, k3h, v3h), 3, I(0, 0), 2, NULL, 0, bad,
                 "builder op 0 (sdpa): q [1,2,4,8], k [1,3,5,8] and v must be [...,L,E], [...,S,E] "
                 "and [...,S,Ev], batch dims equal but k,v heads (dim -3) may divide q's");
  expect_refusal(b, KILN_OP_SDPA, T(q2b, k, v), 3, I(0, 0), 2, NULL, 0, bad,
                 "builder op 0 (sdpa): q [2,2,4,8], k [1,2,5,8] and v must be [...,L,E], [...,S,E] "
                 "and [...,S,Ev], batch dims equal but k,v heads (dim -3) may divide q's");
  expect_refusal(b, KILN_OP_SDPA, T(q4, k, v4h), 3, I(0, 0), 2, NULL, 0, bad,
                 "builder op 0 (sdpa): q [1,4,4,8], k [1,2,5,8] and v must be [...,L,E], [...,S,E] "
                 "and [...,S,Ev], batch dims equal but k,v heads (dim -3) may divide q's");
  expect_refusal(b, KILN_OP_SDPA, T(q, k, v, m35), 4, I(0, 1), 2, NULL, 0, bad,
                 "builder op 0 (sdpa): the mask f32 [3,5] must be bool or the query dtype and "
                 "broadcast to the scores [1,2,4,5]");
  expect_refusal(b, KILN_OP_SDPA, T(q, k, v, k), 4, I(1, 1), 2, NULL, 0, bad,
                 "builder op 0 (sdpa): causal 1 and mask flag 1 with 4 inputs; the mask flag "
                 "must match a 4th input and excludes causal");
  expect_refusal(b, KILN_OP_SDPA, T(q, k, v), 3, I(0, 1), 2, NULL, 0, bad,
                 "builder op 0 (sdpa): causal 0 and mask flag 1 with 3 inputs; the mask flag "
                 "must match a 4th input and excludes causal");
  expect_refusal(b, KILN_OP_SDPA, T(q, k, v), 3, I(0, 0, 3), 3, NULL, 0, bad,
                 "builder op 0 (sdpa): attribute iattr2 is 3 but must be 0..2");
  expect_refusal(b, KILN_OP_SDPA, T(a223, a223, a223), 3, I(0, 0, 2), 3, NULL, 0, bad,
                 "builder op 0 (sdpa): heads last (iattr2 2) takes q [B,H,L,E] of rank 4, not "
                 "rank 3");
  /* Refusals leave nothing behind: the next op is still op 0. */
  expect_refusal(b, KILN_OP_COPY, T(99), 1, NULL, 0, NULL, 0, bad,
                 "builder op 0 (copy): input 0 is tensor 99 but the builder has 27 tensors; pass "
                 "ids the builder returned");
  expect_refusal(b, (kiln_op_kind)77, T(x), 1, NULL, 0, NULL, 0, KILN_ERR_UNSUPPORTED,
                 "builder op 0: op kind 77 is unknown; pass a kiln_op_kind");
  expect_refusal(b, KILN_OP_CAT, T(x), 9, NULL, 0, NULL, 0, bad,
                 "builder op 0 (cat): 9 inputs, 0 integer and 0 real attributes; pass 1..8, 0..8 "
                 "and 0..2 with non-NULL arrays");
  expect_refusal(b, KILN_OP_ADD, T(x, x), 2, NULL, 0, NULL, 1, bad,
                 "builder op 0 (add): 2 inputs, 0 integer and 1 real attributes; pass 1..8, 0..8 "
                 "and 0..2 with non-NULL arrays");
  op(b, KILN_OP_RELU, T(x), 1, NULL, 0, NULL, 0);
  expect_refusal(b, KILN_OP_RELU, T(l), 1, NULL, 0, NULL, 0, bad,
                 "builder op 1 (relu): input 0 is i64 but the op needs f32, f16 or bf16; cast it "
                 "first");
  kiln_builder_destroy(b);
}

static void test_api_refusals(void) {
  kiln_builder *b = builder();
  kiln_error err = {KILN_OK, ""};
  kiln_build_options opts;
  char long_name[80];
  float data[6] = {0};
  void *blob = NULL;
  size_t size = 0;
  int32_t x;
  CHECK(kiln_builder_add_input(b, "x", (kiln_dtype)6, 1, D(2), &err) == -1);
  CHECK_STR(err.message, "builder add_input: dtype 6 is unknown; pass a kiln_dtype");
  CHECK(kiln_builder_add_input(b, "x", KILN_F32, 9, D(2), &err) == -1);
  CHECK_STR(err.message, "builder add_input: rank 9 is outside 0..8 or its dims are NULL; pass a "
                         "rank 0..8 and that many dims");
  CHECK(kiln_builder_add_input(b, "x", KILN_F32, 1, NULL, &err) == -1);
  CHECK_STR(err.message, "builder add_input: rank 1 is outside 0..8 or its dims are NULL; pass a "
                         "rank 0..8 and that many dims");
  CHECK(kiln_builder_add_input(b, "x", KILN_F32, 2, D(-1, 2), &err) == -1);
  CHECK_STR(err.message, "builder add_input: shape [-1,2] has a dim outside 0..2^62 or exceeds "
                         "2^63 bytes; pass a smaller shape");
  CHECK(kiln_builder_add_input(b, "", KILN_F32, 1, D(2), &err) == -1);
  CHECK_STR(err.message, "builder: a binding name is 0 bytes long; pass a name of 1..63 bytes");
  CHECK(kiln_builder_add_input(b, NULL, KILN_F32, 1, D(2), &err) == -1);
  CHECK_STR(err.message, "builder: a binding name is 0 bytes long; pass a name of 1..63 bytes");
  memset(long_name, 'n', 64);
  long_name[64] = '\0';
  CHECK(kiln_builder_add_input(b, long_name, KILN_F32, 1, D(2), &err) == -1);
  CHECK_STR(err.message, "builder: a binding name is 64 bytes long; pass a name of 1..63 bytes");
  long_name[63] = '\0';
  CHECK(kiln_builder_add_input(b, long_name, KILN_F32, 1, D(2), &err) == 0);
  CHECK(kiln_builder_add_input(b, "a\nb", KILN_F32, 1, D(2), &err) == -1);
  CHECK_STR(err.message, "builder: a binding name has a control character or malformed UTF-8 "
                         "at byte 1; use printable UTF-8 text");
  {
    static const char *const bad[] = {"\xff\xfe", "\xc0\xaf", "a\x7f", "a\xc2\x85",
                                      "a\xed\xa0\x80", "a\xf4\x90\x80\x80", "a\xe2\x82"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
      char want[128];
      snprintf(want, sizeof want,
               "builder: a binding name has a control character or malformed UTF-8 at byte %d; "
               "use printable UTF-8 text",
               bad[i][0] == 'a');
      CHECK(kiln_builder_add_input(b, bad[i], KILN_F32, 1, D(2), &err) == -1);
      CHECK_STR(err.message, want);
    }
    kiln_builder *other = kiln_builder_create();
    CHECK(kiln_builder_add_input(other, "gr\xc3\xb6\xc3\x9f" "e\xf0\x9f\x94\xa5", KILN_F32, 1,
                                 D(2), &err) == 0);
    kiln_builder_destroy(other);
  }
  x = kiln_builder_add_input(b, "x", KILN_F32, 2, D(2, 3), &err);
  CHECK(x == 1);
  CHECK(kiln_builder_add_input(b, "x", KILN_F32, 1, D(2), &err) == -1);
  CHECK_STR(err.message, "builder: binding name \"x\" is already taken by an input or output; "
                         "pick a unique name");
  CHECK(kiln_builder_add_constant(b, KILN_F32, 2, D(2, 3), data, 20, &err) == -1);
  CHECK_STR(err.message, "builder add_constant: 20 bytes given but f32 [2,3] holds 24; pass "
                         "exactly its bytes");
  CHECK(kiln_builder_add_constant(b, KILN_F32, 2, D(2, 3), NULL, 24, &err) == -1);
  CHECK_STR(err.message, "builder add_constant: 0 bytes given but f32 [2,3] holds 24; pass "
                         "exactly its bytes");
  CHECK(kiln_builder_get_shape(b, 7, NULL, NULL, NULL, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "builder get_shape: tensor 7 is not one of the builder's 2 tensors; "
                         "pass an id the builder returned");
  CHECK(kiln_builder_mark_output(b, -1, "y", &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "builder mark_output: tensor -1 is not one of the builder's 2 tensors; "
                         "pass an id the builder returned");
  CHECK(kiln_builder_mark_output(b, x, "x", &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "builder: binding name \"x\" is already taken by an input or output; "
                         "pick a unique name");
  CHECK(kiln_builder_build(b, NULL, &blob, &size, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "builder build: no output is marked; call kiln_builder_mark_output for "
                         "each result");
  output(b, x, "y");
  kiln_build_options_default(&opts);
  opts.fuse = 2;
  CHECK(kiln_builder_build(b, &opts, &blob, &size, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "builder build: options device_id 0, min_compute_capability 0, "
                         "allow_tf32 0, fuse 2; pass non-negative numbers and flags of 0 or 1");
  kiln_build_options_default(&opts);
  opts.device_id = -1;
  CHECK(kiln_builder_build(b, &opts, &blob, &size, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_builder_build(b, &opts, NULL, &size, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "builder build: blob or blob_size is NULL; pass where to write the blob");
  CHECK(kiln_builder_add_input(NULL, "z", KILN_F32, 0, NULL, &err) == -1);
  CHECK_STR(err.message, "builder add_input: the builder is NULL; create one with "
                         "kiln_builder_create");
  CHECK(blob == NULL);
  kiln_builder_destroy(b);
  kiln_builder_destroy(NULL);
}

static void test_binding_limit(void) {
  kiln_builder *b = builder();
  kiln_error err = {KILN_OK, ""};
  char name[16];
  int32_t last = -1;
  for (int i = 0; i < KILN_MAX_BINDINGS; i++) {
    snprintf(name, sizeof name, "in%d", i);
    last = kiln_builder_add_input(b, name, KILN_F32, 0, NULL, &err);
  }
  CHECK(last == KILN_MAX_BINDINGS - 1);
  CHECK(kiln_builder_mark_output(b, last, "y", &err) == KILN_ERR_UNSUPPORTED);
  CHECK_STR(err.message, "builder: 256 inputs and 0 outputs reach the limit of 256 bindings; "
                         "split the graph");
  kiln_builder_destroy(b);
}

static const kiln_op *plan_op(const built *x, uint32_t i) { return &x->plan.ops[i]; }

static const kiln_tensor_desc *plan_tensor(const built *x, uint32_t t) {
  return &x->plan.tensors[t];
}

static const float *weight_data(const built *x, uint32_t t) {
  return (const float *)(x->view.weights + x->plan.tensors[t].offset);
}

/* Dead ops and the constants only they read are gone; an unused input stays. */
static void test_dead_code(void) {
  kiln_builder *b = builder();
  built x;
  int32_t in = input(b, "x", KILN_F32, 2, D(2, 3)), unused = input(b, "unused", KILN_F32, 1, D(5));
  int32_t c1 = constant(b, 1, D(3), NULL), w = constant(b, 2, D(4, 3), NULL);
  int32_t dead = op(b, KILN_OP_ADD, T(in, c1), 2, NULL, 0, NULL, 0);
  op(b, KILN_OP_RELU, T(dead), 1, NULL, 0, NULL, 0);
  output(b, op(b, KILN_OP_LINEAR, T(in, w), 2, NULL, 0, NULL, 0), "y");
  (void)unused;
  if (build(b, NULL, &x)) {
    CHECK(x.plan.n_ops == 1);
    CHECK(x.plan.n_tensors == 4);
    CHECK(x.plan.n_inputs == 2);
    CHECK(x.view.weights_size == 48);
    CHECK(plan_op(&x, 0)->kind == KILN_OP_LINEAR);
    CHECK(plan_tensor(&x, x.plan.inputs[1])->dims[0] == 5);
    CHECK(weight_data(&x, plan_op(&x, 0)->inputs[1])[11] == 12.0f);
    CHECK(x.plan.arena_size == 0);
    CHECK(kiln_builder_arena_size(b) == 0);
  }
  release(&x);
  kiln_builder_destroy(b);
}

/* matmul by a constant [K,N] becomes linear with the weight stored [N,K]; a transposed
 * constant feeding it becomes the original weight, never transposed twice. */
static void test_gemm_recognition(void) {
  static const float bk[6] = {1, 2, 3, 4, 5, 6}; /* [3,2] */
  kiln_builder *b = builder();
  built x;
  int32_t in = input(b, "x", KILN_F32, 3, D(4, 2, 3));
  int32_t kn = constant(b, 2, D(3, 2), bk), nk = constant(b, 2, D(5, 3), NULL);
  int32_t t = op(b, KILN_OP_PERMUTE, T(nk), 1, I(1, 0), 2, NULL, 0);
  int32_t flat = constant(b, 1, D(6), bk);
  int32_t w = op(b, KILN_OP_RESHAPE, T(flat), 1, I(2, 3), 2, NULL, 0);
  output(b, op(b, KILN_OP_MATMUL, T(in, kn), 2, NULL, 0, NULL, 0), "y0");
  output(b, op(b, KILN_OP_MATMUL, T(in, t), 2, NULL, 0, NULL, 0), "y1");
  output(b, op(b, KILN_OP_LINEAR, T(in, w), 2, NULL, 0, NULL, 0), "y2");
  if (build(b, NULL, &x)) {
    const float *w0, *w1, *w2;
    CHECK(x.plan.n_ops == 3);
    CHECK(plan_op(&x, 0)->kind == KILN_OP_LINEAR && plan_op(&x, 1)->kind == KILN_OP_LINEAR);
    w0 = weight_data(&x, plan_op(&x, 0)->inputs[1]);
    CHECK(plan_tensor(&x, plan_op(&x, 0)->inputs[1])->dims[0] == 2);
    CHECK(w0[0] == 1 && w0[1] == 3 && w0[2] == 5 && w0[3] == 2 && w0[4] == 4 && w0[5] == 6);
    w1 = weight_data(&x, plan_op(&x, 1)->inputs[1]);
    CHECK(plan_tensor(&x, plan_op(&x, 1)->inputs[1])->dims[0] == 5);
    CHECK(w1[0] == 1 && w1[1] == 2 && w1[14] == 15);
    w2 = weight_data(&x, plan_op(&x, 2)->inputs[1]);
    CHECK(plan_tensor(&x, plan_op(&x, 2)->inputs[1])->rank == 2 && w2[5] == 6);
    /* Three weights: [2,3] transposed (24 bytes), the original [5,3] (60), the reshaped 6. */
    CHECK(x.view.weights_size == 128 + 24);
    CHECK(plan_tensor(&x, plan_op(&x, 1)->inputs[1])->offset == 0); /* the original, first */
    CHECK(plan_tensor(&x, x.plan.outputs[1])->dims[2] == 5);
  }
  release(&x);
  kiln_builder_destroy(b);
}

/* An add of a constant [N] after a linear becomes its bias, then relu or gelu its
 * activation; with fuse off, or when the linear's result has another use, nothing fuses. */
static void test_epilogue_fusion(void) {
  kiln_build_options no_fuse;
  built x;
  kiln_build_options_default(&no_fuse);
  no_fuse.fuse = 0;
  for (int mode = 0; mode < 5; mode++) {
    kiln_builder *b = builder();
    int32_t in = input(b, "x", KILN_F32, 2, D(2, 3));
    int32_t kn = constant(b, 2, D(3, 4), NULL), bias = constant(b, 1, D(4), NULL);
    int32_t mm = op(b, KILN_OP_MATMUL, T(in, kn), 2, NULL, 0, NULL, 0);
    int32_t sum = mode == 1 ? op(b, KILN_OP_ADD, T(bias, mm), 2, NULL, 0, NULL, 0)
                            : op(b, KILN_OP_ADD, T(mm, bias), 2, NULL, 0, NULL, 0);
    int32_t act = mode == 2 ? op(b, KILN_OP_GELU, T(sum), 1, I(1), 1, NULL, 0)
                            : op(b, KILN_OP_RELU, T(sum), 1, NULL, 0, NULL, 0);
    output(b, act, "y");
    if (mode == 4) output(b, sum, "pre");
    if (build(b, mode == 3 ? &no_fuse : NULL, &x)) {
      const kiln_op *lin = plan_op(&x, 0);
      CHECK(lin->kind == KILN_OP_LINEAR && lin->n_inputs == 3);
      CHECK(plan_tensor(&x, lin->inputs[2])->rank == 1);
      if (mode <= 2) {
        CHECK(x.plan.n_ops == 1);
        CHECK(lin->n_iattr == 1);
        CHECK(lin->iattr[0] == (mode == 2 ? KILN_ACT_GELU_TANH : KILN_ACT_RELU));
        CHECK(lin->output == x.plan.outputs[0]);
      } else {
        CHECK(x.plan.n_ops == 2);
        CHECK(lin->iattr[0] == KILN_ACT_NONE);
        CHECK(plan_op(&x, 1)->kind == KILN_OP_RELU);
      }
    }
    release(&x);
    kiln_builder_destroy(b);
  }
  /* alpha 2 is not a plain bias; a bias of another length is not either. */
  {
    kiln_builder *b = builder();
    int32_t in = input(b, "x", KILN_F32, 2, D(2, 3)), w = constant(b, 2, D(4, 3), NULL);
    int32_t lin = op(b, KILN_OP_LINEAR, T(in, w), 2, NULL, 0, NULL, 0);
    output(b, op(b, KILN_OP_ADD, T(lin, constant(b, 1, D(4), NULL)), 2, NULL, 0, (double[]){2}, 1),
           "y");
    /* another weight: two linears of one weight would merge */
    int32_t w2 = constant(b, 2, D(4, 3), (const float[12]){2, 1, 0, -1, 3, 5, 7, 1, 2, 4, 6, 8});
    output(b, op(b, KILN_OP_GELU, T(op(b, KILN_OP_LINEAR, T(in, w2), 2, NULL, 0, NULL, 0)), 1, NULL,
                 0, NULL, 0),
           "z");
    if (build(b, NULL, &x)) {
      CHECK(x.plan.n_ops == 3);
      CHECK(plan_op(&x, 0)->n_inputs == 2 && plan_op(&x, 1)->kind == KILN_OP_ADD);
      CHECK(plan_op(&x, 2)->iattr[0] == KILN_ACT_GELU_ERF);
    }
    release(&x);
    kiln_builder_destroy(b);
  }
}

/* Each case keeps its add (or activation) as a separate op: the linear's result has another
 * use, the linear already has a bias or an activation, or the other operand is not a 1-D
 * constant of the linear's width. */
static void test_no_fusion(void) {
  for (int mode = 0; mode < 10; mode++) {
    kiln_builder *b = builder();
    built x;
    int relu_last = mode == 6 || mode == 7 || mode == 9;
    int32_t in = input(b, "x", KILN_F32, 2, D(4, 3)), w = constant(b, 2, D(4, 3), NULL);
    int32_t vec = input(b, "vec", KILN_F32, 1, D(4)), bias = constant(b, 1, D(4), NULL);
    int32_t lin, other = bias, last;
    if (mode == 1) lin = op(b, KILN_OP_LINEAR, T(in, w, bias), 3, NULL, 0, NULL, 0);
    else if (mode == 2 || mode == 9)
      lin = op(b, KILN_OP_LINEAR, T(in, w), 2, I(KILN_ACT_GELU_ERF), 1, NULL, 0);
    else if (mode == 6 || mode == 8) lin = op(b, KILN_OP_MUL, T(in, in), 2, NULL, 0, NULL, 0);
    else lin = op(b, KILN_OP_LINEAR, T(in, w), 2, NULL, 0, NULL, 0);
    if (mode == 3) other = vec;
    if (mode == 4) other = constant(b, 2, D(4, 4), NULL);
    if (mode == 5) other = constant(b, 1, D(1), NULL);
    if (mode == 8) other = constant(b, 1, D(3), NULL);
    last = relu_last ? op(b, KILN_OP_RELU, T(lin), 1, NULL, 0, NULL, 0)
                     : op(b, KILN_OP_ADD, T(lin, other), 2, NULL, 0, NULL, 0);
    output(b, last, "y");
    if (mode == 0) output(b, op(b, KILN_OP_RELU, T(lin), 1, NULL, 0, NULL, 0), "z");
    if (mode == 7) output(b, op(b, KILN_OP_SIGMOID, T(lin), 1, NULL, 0, NULL, 0), "z");
    if (build(b, NULL, &x) && (mode == 6 || mode == 8)) {
      /* a MUL is no GEMM: with its RELU or ADD it becomes one pointwise chain instead */
      CHECK(x.plan.n_ops == 1 && plan_op(&x, 0)->kind == KILN_OP_POINTWISE);
    } else if (x.blob && mode == 4) {
      /* not a bias, but an operand of the output's shape: the linear's residual */
      CHECK(x.plan.n_ops == 1 && plan_op(&x, 0)->kind == KILN_OP_LINEAR);
      CHECK(plan_op(&x, 0)->n_inputs == 3 && plan_op(&x, 0)->iattr[1] == 1);
    } else if (x.blob) {
      CHECK(x.plan.n_ops == (mode == 0 || mode == 7 ? 3u : 2u));
      CHECK(plan_op(&x, 0)->n_inputs == (mode == 1 ? 3u : 2u));
      CHECK(plan_op(&x, 0)->iattr[0] == (mode == 2 || mode == 9 ? KILN_ACT_GELU_ERF : KILN_ACT_NONE));
      CHECK(plan_op(&x, 1)->kind == (relu_last ? KILN_OP_RELU : KILN_OP_ADD));
    }
    release(&x);
    kiln_builder_destroy(b);
  }
}

/* Outputs that are inputs, constants or a second name of one result get a COPY op. */
static void test_output_copies(void) {
  kiln_builder *b = builder();
  built x;
  int32_t in = input(b, "x", KILN_F32, 1, D(3)), c = constant(b, 1, D(3), NULL);
  int32_t r = op(b, KILN_OP_RELU, T(in), 1, NULL, 0, NULL, 0);
  output(b, in, "same");
  output(b, c, "const");
  output(b, r, "r1");
  output(b, r, "r2");
  output(b, op(b, KILN_OP_PERMUTE, T(constant(b, 2, D(2, 3), NULL)), 1, I(1, 0), 2, NULL, 0),
         "perm");
  if (build(b, NULL, &x)) {
    CHECK(plan_op(&x, 0)->kind == KILN_OP_RELU);
    CHECK(plan_op(&x, 1)->kind == KILN_OP_COPY && plan_op(&x, 1)->inputs[0] == x.plan.inputs[0]);
    CHECK(plan_op(&x, 2)->kind == KILN_OP_COPY &&
          plan_tensor(&x, plan_op(&x, 2)->inputs[0])->storage == KILN_STORE_WEIGHT);
    CHECK(plan_op(&x, 3)->kind == KILN_OP_COPY &&
          plan_op(&x, 3)->inputs[0] == x.plan.outputs[2]);
    CHECK(plan_op(&x, 3)->output == x.plan.outputs[3]);
    CHECK(x.plan.n_ops == 5 && plan_op(&x, 4)->kind == KILN_OP_PERMUTE);
    CHECK(x.md.n_bindings == 6);
    CHECK_STR(x.md.bindings[1].name, "same");
    CHECK_STR(x.md.bindings[4].name, "r2");
  }
  release(&x);
  kiln_builder_destroy(b);
}

static void test_metadata(void) {
  kiln_builder *b = builder();
  kiln_build_options opts;
  built x;
  int32_t in = input(b, "tokens", KILN_I64, 2, D(1, 4));
  int32_t h = input(b, "h", KILN_F16, 0, NULL);
  output(b, op(b, KILN_OP_CAST, T(in), 1, I(KILN_F32), 1, NULL, 0), "out");
  (void)h;
  if (build(b, NULL, &x)) {
    CHECK_STR(x.md.producer, "kiln " KILN_VERSION_STRING);
    CHECK(x.md.device_id == 0 && x.md.min_compute_capability == 80 && x.md.allow_tf32 == 0);
    CHECK(x.md.n_bindings == 3 && x.md.n_aliases == 0);
    CHECK_STR(x.md.bindings[0].name, "tokens");
    CHECK(x.md.bindings[0].kind == KILN_IO_INPUT && x.md.bindings[0].dtype == KILN_I64);
    CHECK(x.md.bindings[0].rank == 2 && x.md.bindings[0].shape[1] == 4 &&
          x.md.bindings[0].max_shape[1] == 4);
    CHECK(x.md.bindings[1].kind == KILN_IO_INPUT && x.md.bindings[1].rank == 0);
    CHECK_STR(x.md.bindings[2].name, "out");
    CHECK(x.md.bindings[2].kind == KILN_IO_OUTPUT && x.md.bindings[2].dtype == KILN_F32);
  }
  release(&x);
  kiln_build_options_default(&opts);
  opts.device_id = 3;
  opts.min_compute_capability = 90;
  opts.allow_tf32 = 1;
  if (build(b, &opts, &x)) {
    CHECK(x.md.device_id == 3 && x.md.min_compute_capability == 90 && x.md.allow_tf32 == 1);
  }
  release(&x);
  kiln_builder_destroy(b);
}

/* The same graph always builds to the same bytes. */
static void test_deterministic(void) {
  void *blobs[2];
  size_t sizes[2];
  for (int i = 0; i < 2; i++) {
    kiln_builder *b = builder();
    kiln_error err = {KILN_OK, ""};
    int32_t in = input(b, "x", KILN_F32, 2, D(2, 3)), w = constant(b, 2, D(4, 3), NULL);
    output(b, op(b, KILN_OP_LINEAR, T(in, w), 2, NULL, 0, NULL, 0), "y");
    CHECK(kiln_builder_build(b, NULL, &blobs[i], &sizes[i], &err) == KILN_OK);
    kiln_builder_destroy(b);
  }
  CHECK(sizes[0] == sizes[1] && memcmp(blobs[0], blobs[1], sizes[0]) == 0);
  kiln_free(blobs[0]);
  kiln_free(blobs[1]);
}

/* One pass through the whole API; returns the first failure's status, or KILN_OK. */
static kiln_status build_once(void) {
  kiln_error err = {KILN_OK, ""};
  kiln_builder *b = kiln_builder_create();
  static const float w[12] = {0};
  void *blob = NULL;
  size_t size = 0;
  int32_t in, c, t, m;
  kiln_status s;
  if (!b) return KILN_ERR_OUT_OF_MEMORY;
  if ((in = kiln_builder_add_input(b, "x", KILN_F32, 2, D(2, 3), &err)) < 0 ||
      (c = kiln_builder_add_constant(b, KILN_F32, 2, D(4, 3), w, sizeof w, &err)) < 0 ||
      (t = kiln_builder_add_op(b, KILN_OP_PERMUTE, T(c), 1, I(1, 0), 2, NULL, 0, &err)) < 0 ||
      (m = kiln_builder_add_op(b, KILN_OP_MATMUL, T(in, t), 2, NULL, 0, NULL, 0, &err)) < 0 ||
      (m = kiln_builder_add_op(b, KILN_OP_RELU, T(m), 1, NULL, 0, NULL, 0, &err)) < 0 ||
      (m = kiln_builder_add_op(b, KILN_OP_MATMUL, T(m, c), 2, NULL, 0, NULL, 0, &err)) < 0 ||
      (s = kiln_builder_mark_output(b, m, "y", &err)) != KILN_OK ||
      (s = kiln_builder_mark_output(b, in, "x_copy", &err)) != KILN_OK ||
      (s = kiln_builder_build(b, NULL, &blob, &size, &err)) != KILN_OK) {
    s = err.status;
    if (s != KILN_ERR_OUT_OF_MEMORY) fprintf(stderr, "unexpected: %s\n", err.message);
  }
  kiln_free(blob);
  kiln_builder_destroy(b);
  return s;
}

/* Two groups of one program (a rotate-half added to its input) over the two halves of x's
 * columns, each read by a softmax: the builder joins them into one FUSED op
 * (kiln_merge_fused_siblings). Returns as build_once; with keep, the blob taken apart into it. */
static kiln_status build_siblings_once(built *keep) {
  kiln_error err = {KILN_OK, ""};
  kiln_builder *b = kiln_builder_create();
  void *blob = NULL;
  size_t size = 0;
  int32_t x;
  kiln_status s = KILN_OK;
  if (!b) return KILN_ERR_OUT_OF_MEMORY;
  if ((x = kiln_builder_add_input(b, "x", KILN_F32, 3, D(1, 1, 64), &err)) < 0) s = err.status;
  for (int k = 0; k < 2 && s == KILN_OK; k++) {
    int32_t t = kiln_builder_add_op(b, KILN_OP_SLICE, T(x), 1, I(2, 32 * k, 32 * k + 32, 1), 4,
                                    NULL, 0, &err);
    if (t >= 0) t = kiln_builder_add_op(b, KILN_OP_RESHAPE, T(t), 1, I(1, 1, 2, 16), 4, NULL, 0, &err);
    if (t >= 0) t = kiln_builder_add_op(b, KILN_OP_PERMUTE, T(t), 1, I(0, 2, 1, 3), 4, NULL, 0, &err);
    int32_t hi = -1, lo = -1, r = -1; /* t + cat(-t[..., 8:], t[..., :8]): rotate-half */
    if (t >= 0) hi = kiln_builder_add_op(b, KILN_OP_SLICE, T(t), 1, I(3, 8, 16, 1), 4, NULL, 0, &err);
    if (hi >= 0) lo = kiln_builder_add_op(b, KILN_OP_SLICE, T(t), 1, I(3, 0, 8, 1), 4, NULL, 0, &err);
    if (lo >= 0) hi = kiln_builder_add_op(b, KILN_OP_NEG, T(hi), 1, NULL, 0, NULL, 0, &err);
    if (lo >= 0 && hi >= 0)
      r = kiln_builder_add_op(b, KILN_OP_CAT, T(hi, lo), 2, I(3), 1, NULL, 0, &err);
    t = r < 0 ? -1 : kiln_builder_add_op(b, KILN_OP_ADD, T(t, r), 2, NULL, 0, (const double[]){1.0}, 1, &err);
    if (t >= 0) t = kiln_builder_add_op(b, KILN_OP_SOFTMAX, T(t), 1, I(3), 1, NULL, 0, &err);
    if (t < 0 || kiln_builder_mark_output(b, t, k ? "k" : "q", &err) != KILN_OK) s = err.status;
  }
  if (s == KILN_OK && kiln_builder_build(b, NULL, &blob, &size, &err) != KILN_OK) s = err.status;
  if (s != KILN_OK && s != KILN_ERR_OUT_OF_MEMORY) fprintf(stderr, "unexpected: %s\n", err.message);
  if (keep && s == KILN_OK) {
    keep->blob = blob, keep->size = size;
    take_apart(keep);
  } else {
    kiln_free(blob);
  }
  kiln_builder_destroy(b);
  return s;
}

/* Each allocation in turn fails: every failure is reported as out of memory, never a crash;
 * the sanitizer build checks that nothing leaks. */
static void test_allocation_failures(void) {
  built x;
  memset(&x, 0, sizeof x);
  CHECK(build_siblings_once(&x) == KILN_OK); /* the groups were joined: the failures reach it */
  CHECK(x.plan.n_ops == 5 && x.plan.ops[0].kind == KILN_OP_FUSED &&
        x.plan.tensors[x.plan.ops[0].output].dims[1] == 4 && x.plan.ops[1].kind == KILN_OP_SLICE &&
        x.plan.ops[2].kind == KILN_OP_SLICE);
  release(&x);
  for (int graph = 0; graph < 2; graph++) {
    int failures = 0, n;
    for (n = 1; n < 2000; n++) {
      kiln_status s;
      kiln_test_fail_allocations = n;
      s = graph ? build_siblings_once(NULL) : build_once();
      if (kiln_test_fail_allocations > 0) { /* the n-th allocation never came */
        CHECK(s == KILN_OK);
        break;
      }
      if (s == KILN_OK) continue; /* a failure a caller cannot see (a grown buffer retried) */
      CHECK(s == KILN_ERR_OUT_OF_MEMORY);
      failures++;
    }
    kiln_test_fail_allocations = 0;
    CHECK(n < 2000);
    CHECK(failures > 20);
  }
}

/* Comparisons, boolean ops, the new unary ops and minimum/maximum: shapes and refusals. */
static void test_logic_and_math(void) {
  const kiln_status bad = KILN_ERR_INVALID_ARGUMENT;
  kiln_builder *b = builder();
  int32_t x = input(b, "x", KILN_F32, 2, D(2, 3)), r = input(b, "r", KILN_F32, 2, D(4, 1));
  int32_t l = input(b, "l", KILN_I64, 2, D(4, 1)), lr = input(b, "lr", KILN_I64, 1, D(5));
  int32_t m = input(b, "m", KILN_BOOL, 2, D(2, 1)), h = input(b, "h", KILN_F16, 1, D(3));
  int32_t n = input(b, "n", KILN_I32, 1, D(3)), v4 = input(b, "v4", KILN_F32, 1, D(4));

  expect_shape(b, op(b, KILN_OP_COMPARE, T(l, lr), 2, I(KILN_CMP_LE), 1, NULL, 0), "bool [4,5]");
  expect_shape(b, op(b, KILN_OP_COMPARE, T(x, x), 2, I(KILN_CMP_NE), 1, NULL, 0), "bool [2,3]");
  expect_shape(b, op(b, KILN_OP_LOGICAL, T(m, x), 2, I(KILN_BOOL_AND), 1, NULL, 0), "bool [2,3]");
  expect_shape(b, op(b, KILN_OP_LOGICAL, T(n), 1, I(KILN_BOOL_NOT), 1, NULL, 0), "bool [3]");
  expect_shape(b, op(b, KILN_OP_BITWISE, T(l, lr), 2, I(KILN_BOOL_XOR), 1, NULL, 0), "i64 [4,5]");
  expect_shape(b, op(b, KILN_OP_BITWISE, T(m), 1, I(KILN_BOOL_NOT), 1, NULL, 0), "bool [2,1]");
  expect_shape(b, op(b, KILN_OP_MINIMUM, T(r, v4), 2, NULL, 0, NULL, 0), "f32 [4,4]");
  expect_shape(b, op(b, KILN_OP_MAXIMUM, T(l, lr), 2, NULL, 0, NULL, 0), "i64 [4,5]");
  expect_shape(b, op(b, KILN_OP_MAXIMUM, T(m, m), 2, NULL, 0, NULL, 0), "bool [2,1]");
  expect_shape(b, op(b, KILN_OP_ABS, T(n), 1, NULL, 0, NULL, 0), "i32 [3]");
  expect_shape(b, op(b, KILN_OP_HARDSWISH, T(h), 1, NULL, 0, NULL, 0), "f16 [3]");

  expect_refusal(b, KILN_OP_COMPARE, T(x, x), 2, I(6), 1, NULL, 0, bad,
                 "builder op 11 (compare): attribute iattr0 is 6 but must be 0..5");
  expect_refusal(b, KILN_OP_COMPARE, T(h, n), 2, I(KILN_CMP_EQ), 1, NULL, 0, bad,
                 "builder op 11 (compare): input 1 is i32 but input 0 is f16; cast them to one "
                 "dtype first");
  expect_refusal(b, KILN_OP_COMPARE, T(x, v4), 2, I(KILN_CMP_GT), 1, NULL, 0, bad,
                 "builder op 11 (compare): shapes [2,3] and [4] do not broadcast (output dim 1)");
  expect_refusal(b, KILN_OP_LOGICAL, T(m, m), 2, I(KILN_BOOL_NOT), 1, NULL, 0, bad,
                 "builder op 11 (logical): iattr0 3 (0 and, 1 or, 2 xor, 3 not) takes 1 inputs "
                 "but the op has 2");
  expect_refusal(b, KILN_OP_LOGICAL, T(m), 1, I(KILN_BOOL_OR), 1, NULL, 0, bad,
                 "builder op 11 (logical): iattr0 1 (0 and, 1 or, 2 xor, 3 not) takes 2 inputs "
                 "but the op has 1");
  expect_refusal(b, KILN_OP_LOGICAL, T(m), 1, I(-1), 1, NULL, 0, bad,
                 "builder op 11 (logical): attribute iattr0 is -1 but must be 0..3");
  expect_refusal(b, KILN_OP_BITWISE, T(x, x), 2, I(KILN_BOOL_AND), 1, NULL, 0, bad,
                 "builder op 11 (bitwise): input 0 is f32 but the op needs bool, i32 or i64; "
                 "cast it first");
  expect_refusal(b, KILN_OP_BITWISE, T(m, l), 2, I(KILN_BOOL_OR), 1, NULL, 0, bad,
                 "builder op 11 (bitwise): input 1 is i64 but input 0 is bool; cast them to one "
                 "dtype first");
  expect_refusal(b, KILN_OP_MINIMUM, T(x, h), 2, NULL, 0, NULL, 0, bad,
                 "builder op 11 (minimum): input 1 is f16 but input 0 is f32; cast them to one "
                 "dtype first");
  expect_refusal(b, KILN_OP_LOG, T(n), 1, NULL, 0, NULL, 0, bad,
                 "builder op 11 (log): input 0 is i32 but the op needs f32, f16 or bf16; cast it "
                 "first");
  expect_refusal(b, KILN_OP_ABS, T(m), 1, NULL, 0, NULL, 0, bad,
                 "builder op 11 (abs): input 0 is bool but the op needs f32, f16 or bf16; cast it "
                 "first");
  expect_refusal(b, KILN_OP_ERF, T(x), 1, I(1), 1, NULL, 0, bad,
                 "builder op 11 (erf): takes 0 to 0 integer attributes but has 1");
  kiln_builder_destroy(b);
}

/* CUMSUM, GATHER, INDEX and ARGMAX: shapes with PyTorch's conventions, and every refusal. */
static void test_index_scan_shapes(void) {
  const kiln_status bad = KILN_ERR_INVALID_ARGUMENT;
  kiln_builder *b = builder();
  int32_t x = input(b, "x", KILN_F32, 3, D(2, 3, 4)), flag = input(b, "flag", KILN_BOOL, 2, D(1, 5));
  int32_t g = input(b, "g", KILN_I64, 3, D(2, 2, 4)), g2 = input(b, "g2", KILN_I32, 2, D(2, 3));
  int32_t i2 = input(b, "i2", KILN_I64, 1, D(2)), i13 = input(b, "i13", KILN_I32, 2, D(1, 3));
  int32_t i21 = input(b, "i21", KILN_I64, 2, D(2, 1)), i3 = input(b, "i3", KILN_I64, 1, D(3));
  int32_t s0 = input(b, "s0", KILN_F32, 0, NULL), z = input(b, "z", KILN_F32, 2, D(3, 0));
  int32_t f2 = input(b, "f2", KILN_F32, 1, D(2)), big = input(b, "big", KILN_F32, 2, D(3, 5));
  int32_t x4 = input(b, "x4", KILN_F32, 4, D(2, 3, 4, 5));

  expect_shape(b, op(b, KILN_OP_CUMSUM, T(x), 1, I(-1, KILN_F32), 2, NULL, 0), "f32 [2,3,4]");
  expect_shape(b, op(b, KILN_OP_CUMSUM, T(flag), 1, I(1, KILN_I64), 2, NULL, 0), "i64 [1,5]");
  expect_shape(b, op(b, KILN_OP_CUMSUM, T(g2), 1, I(0, KILN_F16), 2, NULL, 0), "f16 [2,3]");
  expect_shape(b, op(b, KILN_OP_GATHER, T(x, g), 2, I(1), 1, NULL, 0), "f32 [2,2,4]");
  expect_shape(b, op(b, KILN_OP_GATHER, T(big, g2), 2, I(-1), 1, NULL, 0), "f32 [2,3]");
  expect_shape(b, op(b, KILN_OP_INDEX, T(x, i2), 2, I(1), 1, NULL, 0), "f32 [2,3,4]");
  expect_shape(b, op(b, KILN_OP_INDEX, T(x, i13), 2, I(2), 1, NULL, 0), "f32 [2,1,3,4]");
  expect_shape(b, op(b, KILN_OP_INDEX, T(x, i21, i13), 3, I(3), 1, NULL, 0), "f32 [2,3,4]");
  expect_shape(b, op(b, KILN_OP_INDEX, T(x, i21, i3), 3, I(6), 1, NULL, 0), "f32 [2,2,3]");
  expect_shape(b, op(b, KILN_OP_INDEX, T(x, i2, i2), 3, I(5), 1, NULL, 0), "f32 [2,3]");
  expect_shape(b, op(b, KILN_OP_INDEX, T(x4, i3, i3), 3, I(10), 1, NULL, 0), "f32 [3,2,4]");
  expect_shape(b, op(b, KILN_OP_INDEX, T(x4, i3, i3), 3, I(6), 1, NULL, 0), "f32 [2,3,5]");
  expect_shape(b, op(b, KILN_OP_INDEX, T(flag, i3), 2, I(2), 1, NULL, 0), "bool [1,3]");
  expect_shape(b, op(b, KILN_OP_ARGMAX, T(x), 1, I(-1, 0), 2, NULL, 0), "i64 [2,3]");
  expect_shape(b, op(b, KILN_OP_ARGMAX, T(x), 1, I(1, 1), 2, NULL, 0), "i64 [2,1,4]");
  expect_shape(b, op(b, KILN_OP_ARGMAX, T(g2), 1, I(0, 0), 2, NULL, 0), "i64 [3]");
  kiln_builder_destroy(b);

  b = builder();
  x = input(b, "x", KILN_F32, 3, D(2, 3, 4)), flag = input(b, "flag", KILN_BOOL, 2, D(1, 5));
  g = input(b, "g", KILN_I64, 3, D(2, 2, 4)), g2 = input(b, "g2", KILN_I32, 2, D(2, 3));
  i2 = input(b, "i2", KILN_I64, 1, D(2)), i13 = input(b, "i13", KILN_I32, 2, D(1, 3));
  i3 = input(b, "i3", KILN_I64, 1, D(3)), s0 = input(b, "s0", KILN_F32, 0, NULL);
  z = input(b, "z", KILN_F32, 2, D(3, 0)), f2 = input(b, "f2", KILN_F32, 1, D(2));
  int32_t wide = input(b, "wide", KILN_I64, 3, D(2, 2, 5));
  expect_refusal(b, KILN_OP_CUMSUM, T(x), 1, I(3, KILN_F32), 2, NULL, 0, bad,
                 "builder op 0 (cumsum): dim 3 is outside 0..2 of input 0 [2,3,4]");
  expect_refusal(b, KILN_OP_CUMSUM, T(x), 1, I(0, KILN_BOOL), 2, NULL, 0, bad,
                 "builder op 0 (cumsum): the sum dtype iattr1 is 5 but must be a kiln_dtype "
                 "other than bool");
  expect_refusal(b, KILN_OP_CUMSUM, T(x), 1, I(0, 6), 2, NULL, 0, bad,
                 "builder op 0 (cumsum): the sum dtype iattr1 is 6 but must be a kiln_dtype "
                 "other than bool");
  expect_refusal(b, KILN_OP_CUMSUM, T(s0), 1, I(0, KILN_F32), 2, NULL, 0, bad,
                 "builder op 0 (cumsum): input 0 has rank 0 but the op needs rank 1 or more");
  expect_refusal(b, KILN_OP_CUMSUM, T(x), 1, I(0), 1, NULL, 0, bad,
                 "builder op 0 (cumsum): takes 2 to 2 integer attributes but has 1");
  expect_refusal(b, KILN_OP_GATHER, T(x, g2), 2, I(0), 1, NULL, 0, bad,
                 "builder op 0 (gather): indices [2,3] must have the rank of input 0 [2,3,4] and "
                 "no larger dim but 0");
  expect_refusal(b, KILN_OP_GATHER, T(x, wide), 2, I(1), 1, NULL, 0, bad,
                 "builder op 0 (gather): indices [2,2,5] must have the rank of input 0 [2,3,4] "
                 "and no larger dim but 1");
  expect_refusal(b, KILN_OP_GATHER, T(g2, g2), 2, I(2), 1, NULL, 0, bad,
                 "builder op 0 (gather): dim 2 is outside 0..1 of input 0 [2,3]");
  expect_refusal(b, KILN_OP_GATHER, T(x, x), 2, I(0), 1, NULL, 0, bad,
                 "builder op 0 (gather): indices (input 1) are f32 [2,3,4] but must be i32 or "
                 "i64 of rank 8 or less");
  expect_refusal(b, KILN_OP_INDEX, T(x, flag), 2, I(1), 1, NULL, 0, bad,
                 "builder op 0 (index): index input 1 is a bool mask, whose result shape depends "
                 "on its values; a static plan cannot hold it");
  expect_refusal(b, KILN_OP_INDEX, T(x, i2), 2, I(3), 1, NULL, 0, bad,
                 "builder op 0 (index): dim mask 3 must name 1 of the 3 dims of input 0, one per "
                 "index input");
  expect_refusal(b, KILN_OP_INDEX, T(x, i2), 2, I(8), 1, NULL, 0, bad,
                 "builder op 0 (index): dim mask 8 must name 1 of the 3 dims of input 0, one per "
                 "index input");
  expect_refusal(b, KILN_OP_INDEX, T(x, i2, i3), 3, I(3), 1, NULL, 0, bad,
                 "builder op 0 (index): index input 2 [3] does not broadcast with the index "
                 "inputs before it");
  expect_refusal(b, KILN_OP_INDEX, T(x, f2), 2, I(1), 1, NULL, 0, bad,
                 "builder op 0 (index): indices (input 1) are f32 [2] but must be i32 or i64 of "
                 "rank 8 or less");
  expect_refusal(b, KILN_OP_INDEX, T(s0, i2), 2, I(1), 1, NULL, 0, bad,
                 "builder op 0 (index): dim mask 1 must name 1 of the 0 dims of input 0, one per "
                 "index input");
  expect_refusal(b, KILN_OP_ARGMAX, T(flag), 1, I(1, 0), 2, NULL, 0, bad,
                 "builder op 0 (argmax): input 0 is bool, which has no argmax; cast it to i32 "
                 "first");
  expect_refusal(b, KILN_OP_ARGMAX, T(z), 1, I(1, 0), 2, NULL, 0, bad,
                 "builder op 0 (argmax): dim 1 has size 0, which has no maximum");
  expect_refusal(b, KILN_OP_ARGMAX, T(x), 1, I(0, 2), 2, NULL, 0, bad,
                 "builder op 0 (argmax): attribute iattr1 is 2 but must be 0..1");
  expect_refusal(b, KILN_OP_ARGMAX, T(s0), 1, I(0, 0), 2, NULL, 0, bad,
                 "builder op 0 (argmax): dim 0 is outside 0..-1 of input 0 []");
  (void)g, (void)i13;
  kiln_builder_destroy(b);
}

/* The built blob on the CPU engine, or NULL (a failed check). */
static kiln_engine *load_cpu(const built *x) {
  kiln_error err = {KILN_OK, ""};
  kiln_engine_options o;
  kiln_engine *e = NULL;
  kiln_engine_options_default(&o);
  o.device = KILN_DEVICE_CPU;
  CHECK(kiln_engine_load(x->blob, x->size, &o, &e, &err) == KILN_OK);
  return e;
}

/* Counts the plan's ops of kind k writing a state tensor, and all its ops of kind k. */
static void count_state_writes(const built *x, kiln_op_kind k, uint32_t *to_state, uint32_t *all) {
  *to_state = *all = 0;
  for (uint32_t i = 0; i < x->plan.n_ops; i++) {
    if (plan_op(x, i)->kind != k) continue;
    (*all)++;
    *to_state += plan_tensor(x, plan_op(x, i)->output)->storage == KILN_STORE_STATE;
  }
}

/* A cache written by index_copy in place when that write is the cache's last reader; copied in
 * after the run when an op reads the old cache after the write; a state's other value (a
 * length counter) copied in; and the run keeping the state between executes. */
static void test_states(void) {
  kiln_error err = {KILN_OK, ""};
  float zeros[8] = {0};
  int64_t pos_one[1] = {1}, pos_bad[1] = {4}, length = 0;
  float row[2] = {3, 4}, y[8];
  for (int variant = 0; variant < 4; variant++) {
    /* late_reader: an op reads the old cache after the write; counted: an output reads the
     * counter (unread, its write is dropped with the state) */
    int late_reader = variant & 1, counted = variant >> 1;
    kiln_builder *b = builder();
    int32_t pos = input(b, "pos", KILN_I64, 1, D(1)), r = input(b, "row", KILN_F32, 2, D(1, 2));
    int32_t cache = kiln_builder_add_state(b, KILN_F32, 2, D(4, 2), zeros, sizeof zeros, &err);
    int32_t count = kiln_builder_add_state(b, KILN_I64, 1, D(1), &length, sizeof length, &err);
    CHECK(cache >= 0 && count >= 0);
    int32_t w = op(b, KILN_OP_INDEX_COPY, T(cache, pos, r), 3, I(0), 1, NULL, 0);
    int32_t out = op(b, KILN_OP_RELU, T(w), 1, NULL, 0, NULL, 0);
    if (late_reader) out = op(b, KILN_OP_ADD, T(out, cache), 2, NULL, 0, NULL, 0);
    int32_t next = op(b, KILN_OP_ADD, T(count, pos), 2, NULL, 0, NULL, 0);
    CHECK(kiln_builder_write_state(b, cache, w, &err) == KILN_OK);
    CHECK(kiln_builder_write_state(b, count, next, &err) == KILN_OK);
    CHECK(kiln_builder_write_state(b, count, next, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err.message, "already has its value") != NULL);
    CHECK(kiln_builder_write_state(b, cache, pos, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_builder_write_state(b, r, r, &err) == KILN_ERR_INVALID_ARGUMENT);
    output(b, out, "y");
    if (counted) output(b, next, "n");
    built x;
    if (!build(b, NULL, &x)) {
      kiln_builder_destroy(b);
      continue;
    }
    uint32_t in_place, copies, all;
    count_state_writes(&x, KILN_OP_INDEX_COPY, &in_place, &all);
    CHECK(all == 1 && in_place == (late_reader ? 0u : 1u));
    count_state_writes(&x, KILN_OP_COPY, &copies, &all);
    /* the counter when read, the cache when read late */
    CHECK(copies == (uint32_t)counted + (late_reader ? 1u : 0u));
    CHECK(x.plan.n_states == 1u + (uint32_t)counted);
    kiln_engine *e = load_cpu(&x);
    kiln_tensor_view in[2], outv[2];
    int64_t n = -1;
    uint32_t n_out = 1u + (uint32_t)counted;
    memset(in, 0, sizeof in);
    memset(outv, 0, sizeof outv);
    in[0] = (kiln_tensor_view){pos_one, 8, KILN_I64, 1, {1}, {1}};
    in[1] = (kiln_tensor_view){row, 8, KILN_F32, 2, {1, 2}, {2, 1}};
    outv[0] = (kiln_tensor_view){y, 32, KILN_F32, 2, {4, 2}, {2, 1}};
    outv[1] = (kiln_tensor_view){&n, 8, KILN_I64, 1, {1}, {1}};
    for (int run = 0; e && run < 2; run++)
      CHECK(kiln_engine_execute(e, in, 2, outv, n_out, &err) == KILN_OK);
    /* the late reader adds the row the first run left in the cache: state kept across runs */
    CHECK(y[2] == (late_reader ? 6.0f : 3.0f) && y[3] == (late_reader ? 8.0f : 4.0f) && y[0] == 0.0f);
    CHECK(!counted || n == 2); /* the counter after two runs of position 1 */
    in[0].data = pos_bad; /* past the 4 slots: refused, and the cache keeps its row */
    CHECK(e && kiln_engine_execute(e, in, 2, outv, n_out, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err.message, "position 4 (index 0) is outside the 4 slots") != NULL);
    CHECK(e && kiln_engine_reset_state(e, &err) == KILN_OK);
    in[0].data = pos_one;
    row[0] = 5;
    CHECK(e && kiln_engine_execute(e, in, 2, outv, n_out, &err) == KILN_OK);
    CHECK(y[2] == 5.0f && y[3] == 4.0f); /* after the reset no earlier row is added */
    CHECK(!counted || n == 1);
    row[0] = 3;
    kiln_engine_destroy(e);
    release(&x);
    kiln_builder_destroy(b);
  }
}

/* A state no output needs, now or in a later run, is written no more: a counter only its own
 * next value reads goes with its ops. A state only another state's write reads lives when that
 * state does: shown' = shown + feeder, feeder' = feeder + step, and y = shown + step, so y
 * shows feeder's earlier runs (1, 1, 2, 4 for steps of 1). */
static void test_unread_states(void) {
  kiln_error err = {KILN_OK, ""};
  int64_t zero = 0, step_one[1] = {1}, y = 0;
  kiln_builder *b = builder();
  int32_t step = input(b, "step", KILN_I64, 1, D(1));
  int32_t alone = kiln_builder_add_state(b, KILN_I64, 1, D(1), &zero, sizeof zero, &err);
  int32_t feeder = kiln_builder_add_state(b, KILN_I64, 1, D(1), &zero, sizeof zero, &err);
  int32_t shown = kiln_builder_add_state(b, KILN_I64, 1, D(1), &zero, sizeof zero, &err);
  CHECK(alone >= 0 && feeder >= 0 && shown >= 0);
  int32_t alone_next = op(b, KILN_OP_ADD, T(alone, step), 2, NULL, 0, NULL, 0);
  int32_t shown_next = op(b, KILN_OP_ADD, T(shown, feeder), 2, NULL, 0, NULL, 0);
  int32_t feeder_next = op(b, KILN_OP_ADD, T(feeder, step), 2, NULL, 0, NULL, 0);
  CHECK(kiln_builder_write_state(b, alone, alone_next, &err) == KILN_OK);
  CHECK(kiln_builder_write_state(b, shown, shown_next, &err) == KILN_OK);
  CHECK(kiln_builder_write_state(b, feeder, feeder_next, &err) == KILN_OK);
  output(b, op(b, KILN_OP_ADD, T(shown, step), 2, NULL, 0, NULL, 0), "y");
  built x;
  if (build(b, NULL, &x)) {
    uint32_t to_state, adds;
    count_state_writes(&x, KILN_OP_COPY, &to_state, &adds);
    CHECK(to_state == 2 && x.plan.n_states == 2); /* feeder and shown, not alone */
    count_state_writes(&x, KILN_OP_ADD, &to_state, &adds);
    CHECK(adds == 3);
    kiln_engine *e = load_cpu(&x);
    kiln_tensor_view in[1], out[1];
    memset(in, 0, sizeof in);
    memset(out, 0, sizeof out);
    in[0] = (kiln_tensor_view){step_one, 8, KILN_I64, 1, {1}, {1}};
    out[0] = (kiln_tensor_view){&y, 8, KILN_I64, 1, {1}, {1}};
    const int64_t expect[4] = {1, 1, 2, 4};
    for (int run = 0; e && run < 4; run++) {
      CHECK(kiln_engine_execute(e, in, 1, out, 1, &err) == KILN_OK);
      CHECK(y == expect[run]);
    }
    kiln_engine_destroy(e);
    release(&x);
  }
  kiln_builder_destroy(b);
}

/* A permute that moves only size-1 dims shares its input's bytes (no copy); one that moves a
 * larger dim gets a block of its own; both compute the permuted values. */
static void test_permute_views(void) {
  kiln_error err = {KILN_OK, ""};
  float x[8] = {1, -2, 3, -4, 5, -6, 7, -8}, y[8], z[8];
  kiln_build_options opts;
  kiln_build_options_default(&opts);
  opts.fuse = 0;
  kiln_builder *b = builder();
  int32_t in = input(b, "x", KILN_F32, 3, D(4, 1, 2));
  int32_t r = op(b, KILN_OP_RELU, T(in), 1, NULL, 0, NULL, 0);
  int32_t unit = op(b, KILN_OP_PERMUTE, T(r), 1, I(1, 0, 2), 3, NULL, 0); /* [1,4,2] */
  int32_t moved = op(b, KILN_OP_PERMUTE, T(r), 1, I(2, 1, 0), 3, NULL, 0); /* [2,1,4] */
  output(b, op(b, KILN_OP_NEG, T(unit), 1, NULL, 0, NULL, 0), "y");
  output(b, op(b, KILN_OP_NEG, T(moved), 1, NULL, 0, NULL, 0), "z");
  built x_;
  if (build(b, &opts, &x_)) {
    uint32_t perms = 0;
    for (uint32_t i = 0; i < x_.plan.n_ops; i++) {
      const kiln_op *o = plan_op(&x_, i);
      if (o->kind != KILN_OP_PERMUTE) continue;
      uint64_t same = plan_tensor(&x_, o->output)->offset == plan_tensor(&x_, o->inputs[0])->offset;
      CHECK(same == (o->iattr[0] == 1)); /* only the size-1 move sits on its input */
      perms++;
    }
    CHECK(perms == 2);
    kiln_engine *e = load_cpu(&x_);
    kiln_tensor_view iv[1], ov[2];
    memset(iv, 0, sizeof iv);
    memset(ov, 0, sizeof ov);
    iv[0] = (kiln_tensor_view){x, 32, KILN_F32, 3, {4, 1, 2}, {2, 2, 1}};
    ov[0] = (kiln_tensor_view){y, 32, KILN_F32, 3, {1, 4, 2}, {8, 2, 1}};
    ov[1] = (kiln_tensor_view){z, 32, KILN_F32, 3, {2, 1, 4}, {4, 4, 1}};
    CHECK(e && kiln_engine_execute(e, iv, 1, ov, 2, &err) == KILN_OK);
    for (int i = 0; i < 8; i++) CHECK(y[i] == (x[i] > 0 ? -x[i] : -0.0f));
    for (int c = 0; c < 2; c++)
      for (int n = 0; n < 4; n++) CHECK(z[c * 4 + n] == (x[n * 2 + c] > 0 ? -x[n * 2 + c] : -0.0f));
    kiln_engine_destroy(e);
    release(&x_);
  }
  kiln_builder_destroy(b);
}

/* A reshape back to its input's shape goes (its reader reads the input), and a reshape of a
 * reshape reads the first one's input, so two chains of two reshapes leave one reshape. */
static void test_reshape_chains(void) {
  kiln_builder *b = builder();
  int32_t x = input(b, "x", KILN_F32, 2, D(4, 6));
  int32_t r1 = op(b, KILN_OP_RESHAPE, T(x), 1, I(2, 2, 6), 3, NULL, 0);
  int32_t back = op(b, KILN_OP_RESHAPE, T(r1), 1, I(4, 6), 2, NULL, 0);
  output(b, op(b, KILN_OP_NEG, T(back), 1, NULL, 0, NULL, 0), "y");
  int32_t r2 = op(b, KILN_OP_RESHAPE, T(x), 1, I(2, 12), 2, NULL, 0);
  int32_t flat = op(b, KILN_OP_RESHAPE, T(r2), 1, I(24), 1, NULL, 0);
  output(b, op(b, KILN_OP_RELU, T(flat), 1, NULL, 0, NULL, 0), "z");
  /* a round trip that is itself an output stays: the binding needs an op writing it */
  int32_t r3 = op(b, KILN_OP_RESHAPE, T(x), 1, I(6, 4), 2, NULL, 0);
  output(b, op(b, KILN_OP_RESHAPE, T(r3), 1, I(4, 6), 2, NULL, 0), "w");
  built x_;
  if (build(b, NULL, &x_)) {
    uint32_t reshapes = 0, to_output = 0;
    for (uint32_t i = 0; i < x_.plan.n_ops; i++) {
      const kiln_op *o = plan_op(&x_, i);
      if (o->kind == KILN_OP_RESHAPE && plan_tensor(&x_, o->output)->storage == KILN_STORE_OUTPUT) {
        to_output++;
      } else if (o->kind == KILN_OP_RESHAPE) {
        reshapes++;
        CHECK(plan_tensor(&x_, o->inputs[0])->rank == 2 && plan_tensor(&x_, o->output)->rank == 1);
      }
      if (o->kind == KILN_OP_NEG) CHECK(plan_tensor(&x_, o->inputs[0])->storage == KILN_STORE_INPUT);
    }
    CHECK(reshapes == 1 && to_output == 1);
    release(&x_);
  }
  kiln_builder_destroy(b);
}

int main(void) {
  test_reshape_chains();
  test_permute_views();
  test_states();
  test_unread_states();
  test_shapes();
  test_shape_refusals();
  test_logic_and_math();
  test_index_scan_shapes();
  test_api_refusals();
  test_binding_limit();
  test_dead_code();
  test_gemm_recognition();
  test_epilogue_fusion();
  test_no_fusion();
  test_output_copies();
  test_metadata();
  test_deterministic();
  test_allocation_failures();
  return check_report("test_builder");
}
