/* The engine front end: load and execute of built blobs on the CPU reference engine, device
 * selection, binding checks at load, view checks at execute, allocation failures at load. */
#include "check.h"
#include "runtime/alloc.h"
#include "runtime/device.h"
#include "runtime/engine_internal.h"
#include "kiln/kiln.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define D(...) ((const int64_t[]){__VA_ARGS__})

/* y = linear(relu(x @ B + b1), W2, b2) and z = x * 2 with x [2,2]; by hand:
 * row [1,-2]: x@B + b1 = [-0.5, 4, 0] -> relu [0, 4, 0] -> y = 4*0.5 - 1 = 1
 * row [3, 1]: x@B + b1 = [4.5, 5, -2] -> relu [4.5, 5, 0] -> y = 4.5 + 2.5 - 1 = 6 */
static void *mlp_blob(size_t *size) {
  static const float bmat[6] = {1, 2, -1, 1, -1, 0}, b1[3] = {0.5f, 0, 1}, w2[3] = {1, 0.5f, 2},
                     b2[1] = {-1}, two = 2;
  kiln_builder *b = kiln_builder_create();
  kiln_error err = {KILN_OK, ""};
  void *blob = NULL;
  int32_t x = kiln_builder_add_input(b, "x", KILN_F32, 2, D(2, 2), &err);
  int32_t cb = kiln_builder_add_constant(b, KILN_F32, 2, D(2, 3), bmat, sizeof bmat, &err);
  int32_t cb1 = kiln_builder_add_constant(b, KILN_F32, 1, D(3), b1, sizeof b1, &err);
  int32_t cw2 = kiln_builder_add_constant(b, KILN_F32, 2, D(1, 3), w2, sizeof w2, &err);
  int32_t cb2 = kiln_builder_add_constant(b, KILN_F32, 1, D(1), b2, sizeof b2, &err);
  int32_t c2 = kiln_builder_add_constant(b, KILN_F32, 0, NULL, &two, sizeof two, &err);
  int32_t h = kiln_builder_add_op(b, KILN_OP_MATMUL, (int32_t[]){x, cb}, 2, NULL, 0, NULL, 0, &err);
  h = kiln_builder_add_op(b, KILN_OP_ADD, (int32_t[]){h, cb1}, 2, NULL, 0, NULL, 0, &err);
  h = kiln_builder_add_op(b, KILN_OP_RELU, &h, 1, NULL, 0, NULL, 0, &err);
  h = kiln_builder_add_op(b, KILN_OP_LINEAR, (int32_t[]){h, cw2, cb2}, 3, NULL, 0, NULL, 0, &err);
  CHECK(kiln_builder_mark_output(b, h, "y", &err) == KILN_OK);
  h = kiln_builder_add_op(b, KILN_OP_MUL, (int32_t[]){x, c2}, 2, NULL, 0, NULL, 0, &err);
  CHECK(kiln_builder_mark_output(b, h, "z", &err) == KILN_OK);
  CHECK(kiln_builder_build(b, NULL, &blob, size, &err) == KILN_OK);
  CHECK_STR(err.message, "");
  kiln_builder_destroy(b);
  return blob;
}

static kiln_tensor_view view(void *data, size_t nbytes, kiln_dtype dtype, int32_t rank,
                             const int64_t *sizes) {
  kiln_tensor_view v;
  int64_t stride = 1;
  memset(&v, 0, sizeof v);
  v.data = data;
  v.nbytes = nbytes;
  v.dtype = dtype;
  v.rank = rank;
  for (int32_t d = rank; d-- > 0;) {
    v.sizes[d] = sizes[d];
    v.strides[d] = stride;
    stride *= sizes[d];
  }
  return v;
}

static kiln_engine *load_cpu(const void *blob, size_t size) {
  kiln_engine_options opts;
  kiln_engine *e = NULL;
  kiln_error err = {KILN_OK, ""};
  kiln_engine_options_default(&opts);
  opts.device = KILN_DEVICE_CPU;
  if (kiln_engine_load(blob, size, &opts, &e, &err) != KILN_OK) fprintf(stderr, "load: %s\n", err.message);
  CHECK(e != NULL);
  return e;
}

/* The I/O of the MLP: x, then outputs y and z. */
typedef struct mlp_io {
  float x[4], y[2], z[4];
  kiln_tensor_view in[1], out[2];
} mlp_io;

static void mlp_views(mlp_io *io) {
  static const float x[4] = {1, -2, 3, 1};
  memcpy(io->x, x, sizeof x);
  memset(io->y, 0, sizeof io->y);
  memset(io->z, 0, sizeof io->z);
  io->in[0] = view(io->x, sizeof io->x, KILN_F32, 2, D(2, 2));
  io->out[0] = view(io->y, sizeof io->y, KILN_F32, 2, D(2, 1));
  io->out[1] = view(io->z, sizeof io->z, KILN_F32, 2, D(2, 2));
}

static void expect_mlp_result(const mlp_io *io) {
  CHECK(io->y[0] == 1.0f && io->y[1] == 6.0f);
  CHECK(io->z[0] == 2.0f && io->z[1] == -4.0f && io->z[2] == 6.0f && io->z[3] == 2.0f);
}

static void test_load_and_execute(void) {
  size_t size = 0;
  void *blob = mlp_blob(&size), *copy = malloc(size);
  kiln_error err = {KILN_OK, ""};
  kiln_engine *e;
  mlp_io io;
  memcpy(copy, blob, size);
  e = load_cpu(copy, size);
  free(copy); /* the engine keeps what it needs */
  if (e) {
    CHECK_STR(kiln_engine_device_name(e), "cpu");
    CHECK(kiln_engine_metadata(e)->n_bindings == 3);
    CHECK(kiln_engine_plan(e)->n_ops == 3);
    CHECK(kiln_engine_plan(e)->ops[0].kind == KILN_OP_LINEAR);
    CHECK(kiln_engine_plan(e)->ops[0].iattr[0] == KILN_ACT_RELU);
    for (int run = 0; run < 2; run++) {
      mlp_views(&io);
      CHECK(kiln_engine_execute(e, io.in, 1, io.out, 2, &err) == KILN_OK);
      CHECK_STR(err.message, "");
      expect_mlp_result(&io);
    }
    kiln_engine_destroy(e);
  }
  kiln_engine_destroy(NULL);
  CHECK(kiln_engine_metadata(NULL) == NULL && kiln_engine_plan(NULL) == NULL);
  kiln_free(blob);
}

/* What a load with KILN_DEVICE=env (NULL: unset) and default options reports. */
static kiln_status load_with_env(const char *env, const void *blob, size_t size, kiln_error *err,
                                 char *device) {
  kiln_engine *e = NULL;
  kiln_status s;
  if (env) setenv("KILN_DEVICE", env, 1);
  else unsetenv("KILN_DEVICE");
  s = kiln_engine_load(blob, size, NULL, &e, err);
  device[0] = '\0';
  if (e) snprintf(device, 32, "%s", kiln_engine_device_name(e));
  kiln_engine_destroy(e);
  unsetenv("KILN_DEVICE");
  return s;
}

static int gpu_present;

static int is_no_gpu_message(const char *msg) {
  return strcmp(msg, "no CUDA GPU found (the CUDA runtime reports no device): set KILN_DEVICE=cpu "
                     "or pass the load option device=cpu to run the CPU reference engine") == 0 ||
         strcmp(msg, "no CUDA GPU found (this library was built without CUDA): set "
                     "KILN_DEVICE=cpu or pass the load option device=cpu to run the CPU "
                     "reference engine") == 0;
}

static void test_device_environment(void) {
  size_t size = 0;
  void *blob = mlp_blob(&size);
  kiln_error err = {KILN_OK, ""};
  kiln_engine_options opts;
  kiln_engine *e = NULL;
  char device[32];
  kiln_status s;
  CHECK(load_with_env("cpu", blob, size, &err, device) == KILN_OK);
  CHECK_STR(device, "cpu");
  CHECK(load_with_env("bogus", blob, size, &err, device) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "KILN_DEVICE=\"bogus\" names no device: set it to cpu or cuda, or unset "
                         "it to use the GPU");
  CHECK(load_with_env("CPU", blob, size, &err, device) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(load_with_env("a\tvery long value that goes on and on", blob, size, &err, device) ==
        KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "KILN_DEVICE=\"a?very long value that goes on a\" names no device: set "
                         "it to cpu or cuda, or unset it to use the GPU");
  /* Without a GPU, cuda (asked for or by default) says so and names the way out. */
  for (int i = 0; i < 2; i++) {
    s = load_with_env(i ? NULL : "cuda", blob, size, &err, device);
    if (s == KILN_OK) {
      CHECK_STR(device, "cuda:0"); /* a machine with a GPU runs it there */
      gpu_present = 1;
    } else {
      CHECK(s == KILN_ERR_UNAVAILABLE);
      CHECK(is_no_gpu_message(err.message));
    }
  }
  /* A device id the machine lacks: refused naming the id and the count (or no GPU at all). */
  kiln_engine_options_default(&opts);
  opts.device = KILN_DEVICE_CUDA;
  opts.device_id = 99;
  s = kiln_engine_load(blob, size, &opts, &e, &err);
  CHECK(s == KILN_ERR_UNAVAILABLE && e == NULL);
  if (strncmp(err.message, "CUDA device 99", 14) == 0) {
    char want[256];
    int count = kiln_cuda_count_devices(&(const char *){""});
    snprintf(want, sizeof want,
             "CUDA device 99 does not exist: this machine has %d (0..%d); pass the load option "
             "device_id or export for an existing device",
             count, count - 1);
    CHECK_STR(err.message, want);
  } else {
    CHECK(is_no_gpu_message(err.message));
  }
  /* The option wins over the environment. */
  setenv("KILN_DEVICE", "bogus", 1);
  kiln_engine_options_default(&opts);
  CHECK(opts.device == KILN_DEVICE_AUTO && opts.device_id == -1);
  opts.device = KILN_DEVICE_CPU;
  CHECK(kiln_engine_load(blob, size, &opts, &e, &err) == KILN_OK);
  kiln_engine_destroy(e);
  unsetenv("KILN_DEVICE");
  opts.device = (kiln_device_kind)7;
  CHECK(kiln_engine_load(blob, size, &opts, &e, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "load option device 7 is not AUTO (0), CPU (1) or CUDA (2); pass one of "
                         "them");
  opts.device = KILN_DEVICE_CPU;
  opts.device_id = -2;
  CHECK(kiln_engine_load(blob, size, &opts, &e, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "load option device_id -2 is below -1; pass -1 for the program's device "
                         "or a device number");
  CHECK(e == NULL);
  CHECK(kiln_engine_load(blob, size, &opts, NULL, &err) == KILN_ERR_INVALID_ARGUMENT);
  kiln_free(blob);
}

static int counter_calls;
static int two_gpus(const char **reason) {
  counter_calls++;
  (void)reason;
  return 2;
}
static int no_gpus(const char **reason) {
  counter_calls++;
  *reason = "test has none";
  return 0;
}

static void test_device_selection(void) {
  kiln_engine_options opts;
  kiln_error err = {KILN_OK, ""};
  kiln_device_kind kind;
  int32_t id = -7;
  kiln_engine_options_default(&opts);
  opts.device = KILN_DEVICE_CUDA;
  CHECK(kiln_select_device(&opts, 1, two_gpus, &kind, &id, &err) == KILN_OK);
  CHECK(kind == KILN_DEVICE_CUDA && id == 1);
  opts.device_id = 0;
  CHECK(kiln_select_device(&opts, 1, two_gpus, &kind, &id, &err) == KILN_OK);
  CHECK(id == 0);
  opts.device_id = 5;
  CHECK(kiln_select_device(&opts, 1, two_gpus, &kind, &id, &err) == KILN_ERR_UNAVAILABLE);
  CHECK_STR(err.message, "CUDA device 5 does not exist: this machine has 2 (0..1); pass the load "
                         "option device_id or export for an existing device");
  opts.device_id = -1;
  CHECK(kiln_select_device(&opts, 2, two_gpus, &kind, &id, &err) == KILN_ERR_UNAVAILABLE);
  CHECK_STR(err.message, "CUDA device 2 does not exist: this machine has 2 (0..1); pass the load "
                         "option device_id or export for an existing device");
  CHECK(kiln_select_device(&opts, 0, no_gpus, &kind, &id, &err) == KILN_ERR_UNAVAILABLE);
  CHECK_STR(err.message, "no CUDA GPU found (test has none): set KILN_DEVICE=cpu or pass the load "
                         "option device=cpu to run the CPU reference engine");
  /* The CPU needs no GPU count and keeps the id it was given. */
  counter_calls = 0;
  opts.device = KILN_DEVICE_CPU;
  opts.device_id = 9;
  CHECK(kiln_select_device(&opts, 0, no_gpus, &kind, &id, &err) == KILN_OK);
  CHECK(kind == KILN_DEVICE_CPU && id == 9 && counter_calls == 0);
}

/* A blob whose metadata was rewritten by edit(). */
static void *reblob(const void *blob, size_t size, void (*edit)(kiln_metadata *), size_t *out_size) {
  kiln_error err = {KILN_OK, ""};
  kiln_blob_view v;
  kiln_metadata *md = calloc(1, sizeof *md);
  char *json = NULL;
  size_t json_len = 0;
  void *out = NULL;
  CHECK(kiln_blob_parse(blob, size, &v, &err) == KILN_OK);
  CHECK(kiln_metadata_parse((const char *)v.metadata, v.metadata_size, md, &err) == KILN_OK);
  edit(md);
  CHECK(kiln_metadata_write(md, &json, &json_len, &err) == KILN_OK);
  CHECK(kiln_blob_write(json, json_len, v.plan, v.plan_size, v.weights, v.weights_size, &out,
                        out_size, &err) == KILN_OK);
  kiln_free(json);
  free(md);
  return out;
}

static void add_binding(kiln_metadata *md) {
  md->bindings[md->n_bindings] = md->bindings[0];
  snprintf(md->bindings[md->n_bindings].name, KILN_NAME_MAX, "extra");
  md->n_bindings++;
}

static void drop_binding(kiln_metadata *md) { md->n_bindings--; }

static void reshape_binding(kiln_metadata *md) {
  md->bindings[0].shape[1] = 3;
  md->bindings[0].max_shape[1] = 3;
}

static void retype_binding(kiln_metadata *md) { md->bindings[2].dtype = KILN_F16; }

static void expect_load_refusal(const void *blob, size_t size, kiln_status status, const char *msg) {
  kiln_engine_options opts;
  kiln_engine *e = NULL;
  kiln_error err = {KILN_OK, ""};
  kiln_engine_options_default(&opts);
  opts.device = KILN_DEVICE_CPU;
  CHECK(kiln_engine_load(blob, size, &opts, &e, &err) == status);
  CHECK(e == NULL);
  if (msg) CHECK_STR(err.message, msg);
}

static void test_binding_checks(void) {
  size_t size = 0, bad_size = 0;
  void *blob = mlp_blob(&size), *bad;
  kiln_blob_view v;
  kiln_error err = {KILN_OK, ""};
  bad = reblob(blob, size, add_binding, &bad_size);
  expect_load_refusal(bad, bad_size, KILN_ERR_INVALID_PROGRAM,
                      "the metadata binds 2 inputs and 2 outputs but the plan has 1 inputs and 2 "
                      "outputs; re-export the program");
  kiln_free(bad);
  bad = reblob(blob, size, drop_binding, &bad_size);
  expect_load_refusal(bad, bad_size, KILN_ERR_INVALID_PROGRAM,
                      "the metadata binds 1 inputs and 1 outputs but the plan has 1 inputs and 2 "
                      "outputs; re-export the program");
  kiln_free(bad);
  bad = reblob(blob, size, reshape_binding, &bad_size);
  expect_load_refusal(bad, bad_size, KILN_ERR_INVALID_PROGRAM,
                      "metadata input 0 (\"x\") is f32 [2,3] but the plan's tensor is f32 [2,2]; "
                      "re-export the program");
  kiln_free(bad);
  bad = reblob(blob, size, retype_binding, &bad_size);
  expect_load_refusal(bad, bad_size, KILN_ERR_INVALID_PROGRAM,
                      "metadata output 1 (\"z\") is f16 [2,2] but the plan's tensor is f32 [2,2]; "
                      "re-export the program");
  kiln_free(bad);
  /* A corrupt container or plan is refused as the parsers word it. */
  expect_load_refusal(blob, size - 1, KILN_ERR_INVALID_PROGRAM, NULL);
  expect_load_refusal(NULL, 0, KILN_ERR_INVALID_PROGRAM, NULL);
  CHECK(kiln_blob_parse(blob, size, &v, &err) == KILN_OK);
  ((uint8_t *)blob)[v.plan - (const uint8_t *)blob + 4] = 9;
  expect_load_refusal(blob, size, KILN_ERR_INCOMPATIBLE,
                      "plan version 9 is newer than this runtime understands (2): re-export the "
                      "program with this Kiln release or upgrade the Kiln runtime");
  kiln_free(blob);
}

static void expect_exec_refusal(kiln_engine *e, const mlp_io *io, uint32_t n_in, uint32_t n_out,
                                const char *msg) {
  kiln_error err = {KILN_OK, ""};
  CHECK(kiln_engine_execute(e, io->in, n_in, io->out, n_out, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, msg);
}

static void test_view_checks(void) {
  size_t size = 0;
  void *blob = mlp_blob(&size);
  kiln_engine *e = load_cpu(blob, size);
  kiln_error err = {KILN_OK, ""};
  mlp_io io;
  if (!e) return;
  mlp_views(&io);
  expect_exec_refusal(e, &io, 2, 2,
                      "execute got 2 inputs and 2 outputs (arrays given and given) but the "
                      "program has 1 and 2; pass one view per binding");
  expect_exec_refusal(e, &io, 1, 1,
                      "execute got 1 inputs and 1 outputs (arrays given and given) but the "
                      "program has 1 and 2; pass one view per binding");
  CHECK(kiln_engine_execute(e, NULL, 1, io.out, 2, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "execute got 1 inputs and 2 outputs (arrays NULL and given) but the "
                         "program has 1 and 2; pass one view per binding");
  io.in[0].dtype = KILN_F16;
  expect_exec_refusal(e, &io, 1, 2,
                      "input 0 (\"x\") is f16 but the program takes f32; pass a f32 tensor");
  io.in[0].dtype = (kiln_dtype)42;
  expect_exec_refusal(e, &io, 1, 2,
                      "input 0 (\"x\") is unknown but the program takes f32; pass a f32 tensor");
  mlp_views(&io);
  io.out[1].sizes[1] = 3;
  expect_exec_refusal(e, &io, 1, 2,
                      "output 1 (\"z\") has shape [2,3] but the program takes [2,2]; pass a "
                      "tensor of that shape");
  mlp_views(&io);
  io.in[0].rank = 3;
  expect_exec_refusal(e, &io, 1, 2,
                      "input 0 (\"x\") has shape [2,2,0] but the program takes [2,2]; pass a "
                      "tensor of that shape");
  io.in[0].rank = 99;
  expect_exec_refusal(e, &io, 1, 2,
                      "input 0 (\"x\") has shape [2,2,0,0,0,0,0,0] but the program takes [2,2]; "
                      "pass a tensor of that shape");
  mlp_views(&io);
  io.in[0].nbytes = 15;
  expect_exec_refusal(e, &io, 1, 2,
                      "input 0 (\"x\") has a 15-byte buffer but its shape needs 16 bytes; pass a "
                      "large enough buffer");
  mlp_views(&io);
  io.out[0].data = NULL;
  expect_exec_refusal(e, &io, 1, 2,
                      "output 0 (\"y\") has no data (NULL); pass a buffer of 8 bytes");
  mlp_views(&io);
  io.in[0].strides[0] = 1;
  io.in[0].strides[1] = 2;
  expect_exec_refusal(e, &io, 1, 2,
                      "input 0 (\"x\") has strides [1,2], not contiguous for shape [2,2]; pass a "
                      "contiguous tensor");
  /* A dim of size 1 may carry any stride, and a larger buffer is fine. */
  mlp_views(&io);
  io.out[0].strides[1] = 77;
  io.in[0].nbytes = 64;
  CHECK(kiln_engine_execute(e, io.in, 1, io.out, 2, &err) == KILN_OK);
  expect_mlp_result(&io);
  CHECK(kiln_engine_execute(NULL, io.in, 1, io.out, 2, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "execute got a NULL engine; pass one from kiln_engine_load");
  kiln_engine_destroy(e);
  kiln_free(blob);
}

/* y = x.permute(1, 0) for x [2,2]. */
static void *permute_blob(size_t *size) {
  kiln_builder *b = kiln_builder_create();
  kiln_error err = {KILN_OK, ""};
  void *blob = NULL;
  int32_t x = kiln_builder_add_input(b, "x", KILN_F32, 2, D(2, 2), &err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_PERMUTE, &x, 1, D(1, 0), 2, NULL, 0, &err);
  CHECK(kiln_builder_mark_output(b, y, "y", &err) == KILN_OK);
  CHECK(kiln_builder_build(b, NULL, &blob, size, &err) == KILN_OK);
  kiln_builder_destroy(b);
  return blob;
}

static void alias_output_to_input(kiln_metadata *md) {
  md->aliases[0] = (kiln_alias){0, 0, "inplace"};
  md->n_aliases = 1;
}

/* Caller buffers that share bytes between an output and any other binding are refused: the
 * engines read inputs while writing outputs, so a shared pair gave wrong values. */
static void test_overlapping_views(void) {
  size_t size = 0, permute_size = 0, alias_size = 0;
  void *blob = mlp_blob(&size), *permute = permute_blob(&permute_size), *aliased;
  kiln_error err = {KILN_OK, ""};
  kiln_engine *e = load_cpu(blob, size);
  float buf[8] = {0}, px[4] = {1, 2, 3, 4}, py[4] = {0};
  kiln_tensor_view pin, pout;
  mlp_io io;
  if (e) {
    mlp_views(&io);
    io.out[1].data = io.x;
    expect_exec_refusal(e, &io, 1, 2,
                        "output 1 (\"z\") shares bytes with input 0 (\"x\"); pass disjoint "
                        "buffers (an aliased output is copied back after)");
    mlp_views(&io);
    io.out[0].data = io.x + 3;
    expect_exec_refusal(e, &io, 1, 2,
                        "output 0 (\"y\") shares bytes with input 0 (\"x\"); pass disjoint "
                        "buffers (an aliased output is copied back after)");
    mlp_views(&io);
    io.out[0].data = io.z + 3;
    expect_exec_refusal(e, &io, 1, 2,
                        "output 1 (\"z\") shares bytes with output 0 (\"y\"); pass disjoint "
                        "buffers (an aliased output is copied back after)");
    /* Touching is not sharing. */
    mlp_views(&io);
    io.out[1].data = buf;
    io.out[0].data = buf + 4;
    io.in[0].data = buf + 6;
    memcpy(buf + 6, (const float[]){1, -2}, 8);
    io.in[0].nbytes = 8; /* too short, but refused only after the overlap rule passed */
    expect_exec_refusal(e, &io, 1, 2,
                        "input 0 (\"x\") has a 8-byte buffer but its shape needs 16 bytes; pass "
                        "a large enough buffer");
    mlp_views(&io);
    io.out[1].data = buf;
    io.out[0].data = buf + 4;
    CHECK(kiln_engine_execute(e, io.in, 1, io.out, 2, &err) == KILN_OK);
    CHECK(buf[4] == 1.0f && buf[5] == 6.0f && buf[0] == 2.0f && buf[3] == 2.0f);
    kiln_engine_destroy(e);
  }
  /* A declared in-place alias is no exception: the permute came out [1,3,3,4]. */
  aliased = reblob(permute, permute_size, alias_output_to_input, &alias_size);
  e = load_cpu(aliased, alias_size);
  if (e) {
    pin = view(px, sizeof px, KILN_F32, 2, D(2, 2));
    pout = view(px, sizeof px, KILN_F32, 2, D(2, 2));
    CHECK(kiln_engine_execute(e, &pin, 1, &pout, 1, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK_STR(err.message, "output 0 (\"y\") shares bytes with input 0 (\"x\"); pass disjoint "
                           "buffers (an aliased output is copied back after)");
    CHECK(px[1] == 2.0f && px[2] == 3.0f);
    pout = view(py, sizeof py, KILN_F32, 2, D(2, 2));
    CHECK(kiln_engine_execute(e, &pin, 1, &pout, 1, &err) == KILN_OK);
    CHECK(py[0] == 1.0f && py[1] == 3.0f && py[2] == 2.0f && py[3] == 4.0f);
    CHECK(px[0] == 1.0f && px[1] == 3.0f && px[2] == 2.0f && px[3] == 4.0f);
    kiln_engine_destroy(e);
  }
  kiln_free(aliased);
  kiln_free(permute);
  kiln_free(blob);
}

/* Where a GPU exists, the same blob runs there with the same result. */
static void test_cuda_execute(void) {
  size_t size = 0;
  void *blob;
  kiln_engine_options opts;
  kiln_engine *e = NULL;
  kiln_error err = {KILN_OK, ""};
  mlp_io io;
  if (!gpu_present) return;
  blob = mlp_blob(&size);
  kiln_engine_options_default(&opts);
  opts.device = KILN_DEVICE_CUDA;
  CHECK(kiln_engine_load(blob, size, &opts, &e, &err) == KILN_OK);
  if (e) {
    mlp_views(&io);
    CHECK(kiln_engine_execute(e, io.in, 1, io.out, 2, &err) == KILN_OK);
    expect_mlp_result(&io);
    kiln_engine_destroy(e);
  }
  printf("test_engine: the MLP ran on cuda:0 too\n");
  kiln_free(blob);
}

/* A backend that records whether the engine's lock is held while it runs. */
static int lock_was_held, probe_runs;

static kiln_status probe_execute(kiln_engine *e, const kiln_tensor_view *inputs,
                                 const kiln_tensor_view *outputs, kiln_error *err) {
  int rc = pthread_mutex_trylock(&e->lock);
  if (rc == 0) pthread_mutex_unlock(&e->lock);
  lock_was_held = rc == EBUSY;
  probe_runs++;
  return kiln_cpu_backend.execute(e, inputs, outputs, err);
}

static const kiln_backend probe_backend = {"probe", NULL, probe_execute, NULL, NULL};

/* execute holds the handle's lock around the backend and releases it after. */
static void test_execute_holds_lock(void) {
  size_t size = 0;
  void *blob = mlp_blob(&size);
  kiln_engine *e = load_cpu(blob, size);
  kiln_error err = {KILN_OK, ""};
  mlp_io io;
  if (e) {
    const kiln_backend *real = e->backend;
    e->backend = &probe_backend;
    mlp_views(&io);
    CHECK(kiln_engine_execute(e, io.in, 1, io.out, 2, &err) == KILN_OK);
    CHECK(probe_runs == 1 && lock_was_held);
    expect_mlp_result(&io);
    CHECK(pthread_mutex_trylock(&e->lock) == 0);
    pthread_mutex_unlock(&e->lock);
    e->backend = real;
    kiln_engine_destroy(e);
  }
  kiln_free(blob);
}

/* Each allocation of a load in turn fails: out of memory is reported, nothing crashes, and
 * (in the sanitizer build) nothing leaks; then a load succeeds and runs. */
static void test_load_allocation_failures(void) {
  size_t size = 0;
  void *blob = mlp_blob(&size);
  kiln_engine_options opts;
  int failures = 0, n;
  kiln_engine_options_default(&opts);
  opts.device = KILN_DEVICE_CPU;
  for (n = 1; n < 100; n++) {
    kiln_engine *e = NULL;
    kiln_error err = {KILN_OK, ""};
    kiln_status s;
    kiln_test_fail_allocations = n;
    s = kiln_engine_load(blob, size, &opts, &e, &err);
    if (kiln_test_fail_allocations > 0) {
      mlp_io io;
      kiln_test_fail_allocations = 0;
      CHECK(s == KILN_OK);
      mlp_views(&io);
      CHECK(e && kiln_engine_execute(e, io.in, 1, io.out, 2, &err) == KILN_OK);
      expect_mlp_result(&io);
      kiln_engine_destroy(e);
      break;
    }
    CHECK(s == KILN_ERR_OUT_OF_MEMORY);
    CHECK(e == NULL);
    CHECK(strstr(err.message, "out of") != NULL);
    failures++;
  }
  kiln_test_fail_allocations = 0;
  CHECK(failures >= 8);
  CHECK(n < 100);
  kiln_free(blob);
}

int main(void) {
  test_load_and_execute();
  test_device_environment();
  test_device_selection();
  test_binding_checks();
  test_view_checks();
  test_overlapping_views();
  test_execute_holds_lock();
  test_cuda_execute();
  test_load_allocation_failures();
  return check_report("test_engine");
}
