/* One engine handle run by four threads at once: execute serializes them, so every thread gets
 * exactly the result a lone caller gets even though all runs share one arena. */
#include "check.h"

#include "kiln/kiln.h"

#include <pthread.h>
#include <stdlib.h>

#define THREADS 4
#define RUNS 60
#define ROWS 8
#define WIDTH 256

static kiln_engine *engine;
static float expected[THREADS][ROWS * WIDTH];
static int mismatches[THREADS];

/* x[ROWS,WIDTH] -> four linear+relu layers: long enough that unserialized runs interleave. */
static int build(void **blob, size_t *size) {
  static float w[WIDTH * WIDTH];
  const int64_t x_dims[2] = {ROWS, WIDTH}, w_dims[2] = {WIDTH, WIDTH};
  kiln_error err = {KILN_OK, ""};
  kiln_builder *b = kiln_builder_create();
  int32_t t, wt;
  int ok = b != NULL;
  for (int i = 0; i < WIDTH * WIDTH; i++) w[i] = (float)((i * 13) % 29 - 14) / 256.0f;
  ok = ok && (t = kiln_builder_add_input(b, "x", KILN_F32, 2, x_dims, &err)) >= 0;
  ok = ok && (wt = kiln_builder_add_constant(b, KILN_F32, 2, w_dims, w, sizeof w, &err)) >= 0;
  for (int layer = 0; ok && layer < 4; layer++) {
    ok = (t = kiln_builder_add_op(b, KILN_OP_LINEAR, (int32_t[]){t, wt}, 2, NULL, 0, NULL, 0,
                                  &err)) >= 0 &&
         (t = kiln_builder_add_op(b, KILN_OP_RELU, &t, 1, NULL, 0, NULL, 0, &err)) >= 0;
  }
  ok = ok && kiln_builder_mark_output(b, t, "y", &err) == KILN_OK &&
       kiln_builder_build(b, NULL, blob, size, &err) == KILN_OK;
  if (!ok) fprintf(stderr, "build: %s\n", err.message);
  kiln_builder_destroy(b);
  return ok;
}

static kiln_tensor_view view(float *data) {
  kiln_tensor_view v = {data, sizeof(float) * ROWS * WIDTH, KILN_F32, 2, {ROWS, WIDTH}, {WIDTH, 1}};
  return v;
}

static void input_for(int thread, float *x) {
  for (int i = 0; i < ROWS * WIDTH; i++) x[i] = (float)((i + 31 * thread) % 23) / 8.0f;
}

static int run(float *x, float *y) {
  kiln_error err = {KILN_OK, ""};
  kiln_tensor_view in = view(x), out = view(y);
  kiln_status s = kiln_engine_execute(engine, &in, 1, &out, 1, &err);
  if (s != KILN_OK) fprintf(stderr, "execute: %s\n", err.message);
  return s == KILN_OK;
}

static void *worker(void *arg) {
  int id = (int)(intptr_t)arg;
  static float x[THREADS][ROWS * WIDTH], y[THREADS][ROWS * WIDTH];
  input_for(id, x[id]);
  for (int r = 0; r < RUNS; r++) {
    if (!run(x[id], y[id]) || memcmp(y[id], expected[id], sizeof expected[id]) != 0)
      mismatches[id]++;
  }
  return NULL;
}

int main(void) {
  void *blob = NULL;
  size_t size = 0;
  kiln_error err = {KILN_OK, ""};
  kiln_engine_options opts;
  pthread_t threads[THREADS];
  static float x[ROWS * WIDTH];

  kiln_engine_options_default(&opts);
  opts.device = KILN_DEVICE_CPU;
  CHECK(build(&blob, &size));
  CHECK(blob && kiln_engine_load(blob, size, &opts, &engine, &err) == KILN_OK);
  kiln_free(blob);
  if (!engine) return check_report("test_engine_threads");

  /* The lone caller's answers, one input per thread, all different. */
  for (int id = 0; id < THREADS; id++) {
    input_for(id, x);
    CHECK(run(x, expected[id]));
  }
  CHECK(memcmp(expected[0], expected[1], sizeof expected[0]) != 0);

  for (int id = 0; id < THREADS; id++)
    CHECK(pthread_create(&threads[id], NULL, worker, (void *)(intptr_t)id) == 0);
  for (int id = 0; id < THREADS; id++) {
    pthread_join(threads[id], NULL);
    if (mismatches[id]) fprintf(stderr, "thread %d: %d of %d runs wrong\n", id, mismatches[id], RUNS);
    CHECK(mismatches[id] == 0);
  }
  printf("%d threads x %d runs on one handle: %s\n", THREADS, RUNS,
         mismatches[0] + mismatches[1] + mismatches[2] + mismatches[3] ? "MISMATCH" : "all equal");
  kiln_engine_destroy(engine);
  return check_report("test_engine_threads");
}
