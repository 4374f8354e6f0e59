/* Two GPUs, through the public API: a program placed on device 1 by its metadata runs
 * there and the load option moves it; a caller buffer on device 0 is refused by a program
 * on device 1 until the caller enables peer access, then accepted with exact results; two
 * programs on two devices run at once from two threads. Integer-valued f32 data keeps every
 * result exact, so CUDA and CPU results are compared bit for bit. */
#include "check.h"
#include "cuda/cuda_backend.h"
#include "kiln/kiln.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 16
#define WIDTH 64
#define BIG_ELEMS ((int64_t)1 << 28) /* a 1 GiB intermediate, visible in nvidia-smi */

static void die(const char *what, const kiln_error *err) {
  fprintf(stderr, "fatal: %s: %s\n", what, err ? err->message : "");
  exit(2);
}

/* out = relu(x @ w^T + b) * 2 - x, plus a second output: the max of a 1 GiB expansion of x's
 * first element (which sizes the arena). Weights and inputs are small integers. */
static void build(int32_t device_id, void **blob, size_t *size) {
  kiln_error err;
  kiln_builder *b = kiln_builder_create();
  if (!b) die("builder", NULL);
  int64_t xd[2] = {ROWS, WIDTH}, wd[2] = {WIDTH, WIDTH}, bd[1] = {WIDTH};
  static float w[WIDTH * WIDTH], bias[WIDTH];
  for (int i = 0; i < WIDTH * WIDTH; i++) w[i] = (float)((i * 7) % 5 - 2);
  for (int i = 0; i < WIDTH; i++) bias[i] = (float)(i % 9 - 4);
  int32_t x = kiln_builder_add_input(b, "x", KILN_F32, 2, xd, &err);
  int32_t wt = kiln_builder_add_constant(b, KILN_F32, 2, wd, w, sizeof w, &err);
  int32_t bt = kiln_builder_add_constant(b, KILN_F32, 1, bd, bias, sizeof bias, &err);
  int32_t lin = kiln_builder_add_op(b, KILN_OP_LINEAR, (int32_t[]){x, wt, bt}, 3,
                                    (int64_t[]){KILN_ACT_RELU}, 1, NULL, 0, &err);
  int32_t two = kiln_builder_add_op(b, KILN_OP_ADD, (int32_t[]){lin, lin}, 2, NULL, 0,
                                    (double[]){1.0}, 1, &err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_SUB, (int32_t[]){two, x}, 2, NULL, 0,
                                  (double[]){1.0}, 1, &err);
  int32_t first = kiln_builder_add_op(b, KILN_OP_SLICE, (int32_t[]){x}, 1,
                                      (int64_t[]){1, 0, 1, 1}, 4, NULL, 0, &err);
  int32_t big = kiln_builder_add_op(b, KILN_OP_EXPAND, (int32_t[]){first}, 1,
                                    (int64_t[]){ROWS, BIG_ELEMS / ROWS}, 2, NULL, 0, &err);
  int32_t s = kiln_builder_add_op(b, KILN_OP_AMAX, (int32_t[]){big}, 1, (int64_t[]){3, 0}, 2,
                                  NULL, 0, &err);
  if (y < 0 || s < 0) die("building the program", &err);
  if (kiln_builder_mark_output(b, y, "y", &err) || kiln_builder_mark_output(b, s, "s", &err))
    die("marking outputs", &err);
  kiln_build_options opts;
  kiln_build_options_default(&opts);
  opts.device_id = device_id;
  if (kiln_builder_build(b, &opts, blob, size, &err)) die("build", &err);
  kiln_builder_destroy(b);
}

static kiln_engine *load(const void *blob, size_t size, kiln_device_kind kind, int32_t device_id) {
  kiln_error err;
  kiln_engine_options opts;
  kiln_engine_options_default(&opts);
  opts.device = kind;
  opts.device_id = device_id;
  kiln_engine *e = NULL;
  if (kiln_engine_load(blob, size, &opts, &e, &err)) die("load", &err);
  return e;
}

static void views(float *x, float *y, float *s, kiln_tensor_view *in, kiln_tensor_view *out) {
  memset(in, 0, sizeof *in);
  memset(out, 0, 2 * sizeof *out);
  in->data = x;
  in->nbytes = sizeof(float) * ROWS * WIDTH;
  in->dtype = KILN_F32;
  in->rank = 2;
  in->sizes[0] = ROWS; in->sizes[1] = WIDTH; in->strides[0] = WIDTH; in->strides[1] = 1;
  out[0] = *in;
  out[0].data = y;
  out[1].data = s;
  out[1].nbytes = sizeof(float);
  out[1].dtype = KILN_F32;
  out[1].rank = 0;
}

static kiln_status run(kiln_engine *e, float *x, float *y, float *s, kiln_error *err) {
  kiln_tensor_view in, out[2];
  views(x, y, s, &in, out);
  return kiln_engine_execute(e, &in, 1, out, 2, err);
}

static void fill_input(float *x, int seed) {
  for (int i = 0; i < ROWS * WIDTH; i++) x[i] = (float)((i * 31 + seed * 17) % 7 - 3);
}

static void reference(const void *blob, size_t size, const float *x, float *y, float *s) {
  kiln_error err;
  kiln_engine *cpu = load(blob, size, KILN_DEVICE_CPU, 0);
  if (run(cpu, (float *)x, y, s, &err)) die("cpu run", &err);
  kiln_engine_destroy(cpu);
}

static void show_smi(const char *when) {
  printf("nvidia-smi %s:\n", when);
  fflush(stdout);
  if (system("nvidia-smi --query-gpu=index,memory.used --format=csv,noheader") != 0)
    printf("  (nvidia-smi failed)\n");
}

typedef struct worker {
  kiln_engine *e;
  const float *x, *want_y, *want_s;
  int runs, good;
} worker;

static void *work(void *arg) {
  worker *w = arg;
  float y[ROWS * WIDTH], s;
  kiln_error err;
  for (int i = 0; i < w->runs; i++) {
    memset(y, 0xff, sizeof y);
    if (run(w->e, (float *)w->x, y, &s, &err) == KILN_OK &&
        memcmp(y, w->want_y, sizeof y) == 0 && s == *w->want_s)
      w->good++;
  }
  return NULL;
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0); /* a run cut short keeps what it printed */
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) {
    fprintf(stderr, "test_two_gpus: needs two CUDA devices, %d visible\n", count);
    return 2;
  }
  kiln_error err;
  void *blob1, *blob0;
  size_t size1, size0;
  build(1, &blob1, &size1);
  build(0, &blob0, &size0);
  float x[ROWS * WIDTH], want_y[ROWS * WIDTH], want_s, y[ROWS * WIDTH], s;
  fill_input(x, 1);
  reference(blob1, size1, x, want_y, &want_s);

  /* (1) The metadata places it on device 1; seen from inside the engine and from nvidia-smi. */
  show_smi("before loading");
  kiln_engine *e1 = load(blob1, size1, KILN_DEVICE_CUDA, -1);
  struct cudaPointerAttributes pa;
  memset(&pa, 0, sizeof pa);
  cudaPointerGetAttributes(&pa, kiln_cuda_engine_arena(e1));
  printf("metadata device_id 1: engine on %s, arena on device %d\n", kiln_engine_device_name(e1), pa.device);
  CHECK_STR(kiln_engine_device_name(e1), "cuda:1");
  CHECK(pa.type == cudaMemoryTypeDevice && pa.device == 1);
  show_smi("with the program loaded on device 1");
  CHECK(run(e1, x, y, &s, &err) == KILN_OK);
  CHECK(memcmp(y, want_y, sizeof y) == 0 && s == want_s);
  kiln_engine *moved = load(blob1, size1, KILN_DEVICE_CUDA, 0);
  memset(&pa, 0, sizeof pa);
  cudaPointerGetAttributes(&pa, kiln_cuda_engine_arena(moved));
  printf("load option device_id 0: engine on %s, arena on device %d\n", kiln_engine_device_name(moved), pa.device);
  CHECK_STR(kiln_engine_device_name(moved), "cuda:0");
  CHECK(pa.device == 0);
  CHECK(run(moved, x, y, &s, &err) == KILN_OK);
  CHECK(memcmp(y, want_y, sizeof y) == 0 && s == want_s);
  kiln_engine_destroy(moved);

  /* (2) A caller buffer on device 0, peer access not enabled, to the program on device 1. */
  float *d0_x, *d0_y, *d0_s;
  cudaSetDevice(0);
  CHECK(cudaMalloc((void **)&d0_x, sizeof x) == cudaSuccess);
  CHECK(cudaMalloc((void **)&d0_y, sizeof y) == cudaSuccess);
  CHECK(cudaMalloc((void **)&d0_s, sizeof s) == cudaSuccess);
  cudaMemcpy(d0_x, x, sizeof x, cudaMemcpyHostToDevice);
  cudaSetDevice(1);
  memset(&pa, 0, sizeof pa);
  cudaPointerGetAttributes(&pa, d0_x);
  printf("device-0 buffer seen from device 1 before peer access: type %d device %d devicePointer %s\n",
         (int)pa.type, pa.device, pa.devicePointer ? "set" : "NULL");
  kiln_status st = run(e1, d0_x, d0_y, d0_s, &err);
  printf("without peer access: %s: %s\n", kiln_status_name(st), err.message);
  CHECK(st == KILN_ERR_INVALID_ARGUMENT && strstr(err.message, "peer access") &&
        strstr(err.message, "cuda:0") && strstr(err.message, "cuda:1"));
  kiln_engine *other = load(blob0, size0, KILN_DEVICE_CUDA, -1);
  float x2[ROWS * WIDTH], want2_y[ROWS * WIDTH], want2_s;
  fill_input(x2, 2);
  reference(blob0, size0, x2, want2_y, &want2_s);
  CHECK(run(other, x2, y, &s, &err) == KILN_OK);
  CHECK(memcmp(y, want2_y, sizeof y) == 0 && s == want2_s);
  CHECK(run(e1, x, y, &s, &err) == KILN_OK); /* the refused engine still works */
  CHECK(memcmp(y, want_y, sizeof y) == 0);

  /* (3) The caller enables peer access from device 1 to device 0: the same buffers work. */
  cudaSetDevice(1);
  cudaError_t rc = cudaDeviceEnablePeerAccess(0, 0);
  printf("cudaDeviceEnablePeerAccess(1 -> 0): %s\n", cudaGetErrorString(rc));
  CHECK(rc == cudaSuccess);
  kiln_cuda_stats before, after;
  kiln_cuda_engine_stats(e1, &before, &err);
  st = run(e1, d0_x, d0_y, d0_s, &err);
  if (st) printf("with peer access: %s\n", err.message);
  CHECK(st == KILN_OK);
  kiln_cuda_engine_stats(e1, &after, &err);
  memset(y, 0, sizeof y);
  cudaMemcpy(y, d0_y, sizeof y, cudaMemcpyDeviceToHost);
  cudaMemcpy(&s, d0_s, sizeof s, cudaMemcpyDeviceToHost);
  printf("with peer access: bound %llu buffers, staged %llu; result %s the CPU reference\n",
         (unsigned long long)(after.bound - before.bound),
         (unsigned long long)(after.staged - before.staged),
         memcmp(y, want_y, sizeof y) == 0 && s == want_s ? "bit-identical to" : "DIFFERS from");
  CHECK(after.bound - before.bound == 3 && after.staged == before.staged);
  CHECK(memcmp(y, want_y, sizeof y) == 0 && s == want_s);

  /* (4) Two programs on two devices, concurrently from two threads. */
  worker w1 = {e1, x, want_y, &want_s, 100, 0}, w0 = {other, x2, want2_y, &want2_s, 100, 0};
  pthread_t t1, t0;
  pthread_create(&t1, NULL, work, &w1);
  pthread_create(&t0, NULL, work, &w0);
  pthread_join(t1, NULL);
  pthread_join(t0, NULL);
  printf("concurrent: cuda:1 %d/%d exact, cuda:0 %d/%d exact\n", w1.good, w1.runs, w0.good, w0.runs);
  CHECK(w1.good == w1.runs && w0.good == w0.runs);

  cudaSetDevice(0);
  cudaFree(d0_x);
  cudaFree(d0_y);
  cudaFree(d0_s);
  kiln_engine_destroy(e1);
  kiln_engine_destroy(other);
  kiln_free(blob1);
  kiln_free(blob0);
  return check_report("test_two_gpus");
}
