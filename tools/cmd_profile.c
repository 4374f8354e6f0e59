/* kiln profile FILE [--reps N]: loads each Kiln blob of a blob or .pte file on the GPU and
 * prints how long each op of its plan takes run alone, to find where a program's time goes.
 * The sum of the ops is more than a graph replay of the whole plan costs (each timed launch
 * pays its own start), so the replay's own time is printed too; the shares show which ops to
 * work on. */
#include "commands.h"
#include "mapped_file.h"
#include "pte_reader.h"

#include "runtime/device.h"
#include "cuda/cuda_backend.h"
#include "kiln/kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef KILN_WITH_CUDA
kiln_status kiln_cuda_profile_ops(kiln_engine *e, int reps, double *ms, double *graph_ms,
                                  kiln_error *err) {
  (void)e, (void)reps, (void)ms, (void)graph_ms;
  return kiln_fail(err, KILN_ERR_UNAVAILABLE,
                   "this kiln was built without the CUDA engine; build with the CUDA toolkit to "
                   "profile on a GPU");
}
#endif

typedef struct profile_run {
  int reps;
  unsigned n_blobs;
} profile_run;

static void print_dims(const kiln_tensor_desc *t) {
  printf("[");
  for (int32_t d = 0; d < t->rank; d++) printf(d ? ", %lld" : "%lld", (long long)t->dims[d]);
  printf("] %s", kiln_dtype_name(t->dtype));
}

/* Profiling times GPU kernels: without a GPU there is nothing to time, and the CPU engine's
 * remedy that the loader suggests does not apply here. */
static kiln_status need_gpu(kiln_error *err) {
  const char *reason = "";
  if (kiln_cuda_count_devices(&reason) > 0) return KILN_OK;
  return kiln_fail(err, KILN_ERR_UNAVAILABLE,
                   "kiln profile needs a CUDA GPU and found none (%.60s): run it on a machine "
                   "with a GPU",
                   reason);
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* Median microseconds of reps synchronized kiln_engine_execute calls on zeroed host buffers at
 * the plan's (upper-bound) shapes: what a caller's call costs, host work and copies included.
 * Zeros are valid indices and positions, so a plan with a KV cache runs as a step at 0. */
static kiln_status time_calls(kiln_engine *e, int reps, double *us, kiln_error *err) {
  const kiln_plan *p = kiln_engine_plan(e);
  uint32_t n = p->n_inputs + p->n_outputs;
  kiln_tensor_view *views = calloc(n ? n : 1, sizeof *views);
  double *t = calloc((size_t)reps, sizeof *t);
  kiln_status st = views && t ? KILN_OK
                              : kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                                          "out of host memory for %u call buffers; free memory and "
                                          "retry",
                                          (unsigned)n);
  for (uint32_t i = 0; st == KILN_OK && i < n; i++) {
    uint32_t at = i < p->n_inputs ? p->inputs[i] : p->outputs[i - p->n_inputs];
    const kiln_tensor_desc *d = &p->tensors[at];
    kiln_tensor_view *v = &views[i];
    v->nbytes = (size_t)d->nbytes;
    v->dtype = d->dtype;
    v->rank = d->rank;
    int64_t stride = 1;
    for (int32_t k = d->rank - 1; k >= 0; stride *= d->dims[k], k--)
      v->sizes[k] = d->dims[k], v->strides[k] = stride;
    if (!(v->data = calloc(v->nbytes ? v->nbytes : 1, 1)))
      st = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory for %llu bytes of binding %u; free memory and retry",
                     (unsigned long long)v->nbytes, (unsigned)i);
  }
  for (int r = -3; st == KILN_OK && r < reps; r++) { /* three untimed: graphs captured */
    double t0 = now_us();
    st = kiln_engine_execute(e, views, p->n_inputs, views + p->n_inputs, p->n_outputs, err);
    if (r >= 0) t[r] = now_us() - t0;
  }
  if (st == KILN_OK) {
    qsort(t, (size_t)reps, sizeof *t, by_value);
    *us = t[reps / 2];
  }
  for (uint32_t i = 0; views && i < n; i++) free(views[i].data);
  free(views);
  free(t);
  return st;
}

static kiln_status profile_blob(const uint8_t *data, size_t size, const char *what,
                                profile_run *run, kiln_error *err) {
  kiln_engine_options opts;
  kiln_engine *e = NULL;
  kiln_status gpu = need_gpu(err);
  if (gpu != KILN_OK) return gpu;
  kiln_engine_options_default(&opts);
  opts.device = KILN_DEVICE_CUDA;
  kiln_status st = kiln_engine_load(data, size, &opts, &e, err);
  if (st != KILN_OK) return st;
  const kiln_plan *p = kiln_engine_plan(e);
  double *ms = calloc(p->n_ops ? p->n_ops : 1, sizeof *ms), total = 0.0, graph_ms = 0.0;
  if (!ms) {
    kiln_engine_destroy(e);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "out of host memory for %u op timings",
                     (unsigned)p->n_ops);
  }
  st = kiln_cuda_profile_ops(e, run->reps, ms, &graph_ms, err);
  if (st == KILN_OK) {
    for (uint32_t i = 0; i < p->n_ops; i++) total += ms[i];
    printf("%s on %s: %u ops, %.1f us in all (each op alone, mean of %d runs)\n", what,
           kiln_engine_device_name(e), (unsigned)p->n_ops, total * 1e3, run->reps);
    printf("  one graph of the whole plan: %.1f us per replay (mean of %d back to back)\n",
           graph_ms * 1e3, run->reps);
    double call_us = 0.0;
    kiln_error call_err = {KILN_OK, ""};
    if (time_calls(e, run->reps, &call_us, &call_err) == KILN_OK)
      printf("  one synchronized call on host buffers: %.1f us (median of %d)\n", call_us,
             run->reps);
    else
      printf("  one synchronized call on host buffers: not timed (%s)\n", call_err.message);
    printf("  %4s %10s %6s  %s\n", "op", "us", "share", "what");
    for (uint32_t i = 0; i < p->n_ops; i++) {
      printf("  %4u %10.1f %5.1f%%  %s -> ", (unsigned)i, ms[i] * 1e3,
             total > 0.0 ? 100.0 * ms[i] / total : 0.0, kiln_op_name(p->ops[i].kind));
      print_dims(&p->tensors[p->ops[i].output]);
      printf("\n");
    }
    run->n_blobs++;
  }
  free(ms);
  kiln_engine_destroy(e);
  return st;
}

static kiln_status profile_delegate(const kiln_pte_delegate *d, void *ctx, kiln_error *err) {
  char what[160], name[64];
  if (strcmp(d->id, KILN_BACKEND_ID) != 0) return KILN_OK;
  snprintf(what, sizeof what, "plan %u \"%s\" delegate %u", (unsigned)d->plan,
           kiln_clean_text(d->plan_name, name, sizeof name), (unsigned)d->index);
  return profile_blob(d->data, (size_t)d->size, what, (profile_run *)ctx, err);
}

int kiln_cmd_profile(int argc, char **argv) {
  profile_run run = {20, 0};
  const char *path = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      run.reps = atoi(argv[++i]);
    } else if (!path && argv[i][0] != '-') {
      path = argv[i];
    } else {
      path = NULL;
      break;
    }
  }
  if (!path || run.reps < 1 || run.reps > 100000) {
    fprintf(stderr, "usage: kiln profile FILE [--reps N]\n"
                    "  times each op of each " KILN_BACKEND_ID " blob in FILE (a blob or a .pte)"
                    " on the GPU, N runs each (default 20, at most 100000)\n");
    return 2;
  }
  kiln_error err = {KILN_OK, ""};
  mapped_file f;
  kiln_pte_info info;
  kiln_status st = kiln_map_file(path, &f, &err);
  if (st == KILN_OK && f.size >= 8 && memcmp(f.data, KILN_BLOB_MAGIC, 8) == 0)
    st = profile_blob(f.data, f.size, "blob", &run, &err);
  else if (st == KILN_OK)
    st = kiln_pte_read(f.data, f.size, &info, profile_delegate, &run, &err);
  if (st == KILN_OK && run.n_blobs == 0)
    st = kiln_fail(&err, KILN_ERR_INVALID_ARGUMENT,
                   "the program holds no %.16s blob: export it with Kiln's partitioner first",
                   KILN_BACKEND_ID);
  kiln_unmap_file(&f);
  if (st != KILN_OK) {
    fprintf(stderr, "%s\n", err.message);
    return 1;
  }
  return 0;
}
