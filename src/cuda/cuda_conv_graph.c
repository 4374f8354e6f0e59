/* A forward convolution through cuDNN's backend API (see cuda_conv_graph.h). Tensors carry the
 * plan's strides for NCHW or NHWC; a 1-d convolution arrives as a 2-d one of height 1. */
#include "cuda_conv_graph.h"

#include "cuda_choice_cache.h"

#include <string.h>
#include <time.h>

enum { KCU_UID_X = 1, KCU_UID_W, KCU_UID_Y, KCU_UID_BIAS, KCU_UID_RES, KCU_UID_VIRTUAL = 100 };

/* A tensor of dims [n, c, h, w] held NHWC or NCHW; virtual ones live only inside the graph. */
static cudnnStatus_t kcu_conv_tensor(kcu_dnn_set *set, cudnnBackendDescriptor_t *t, int64_t uid,
                                     cudnnDataType_t dt, const int64_t dims[4], int channels_last,
                                     int is_virtual, int64_t align) {
  int64_t strides[4];
  if (channels_last) {
    strides[1] = 1;
    strides[3] = dims[1];
    strides[2] = dims[1] * dims[3];
    strides[0] = strides[2] * dims[2];
  } else {
    strides[3] = 1;
    strides[2] = dims[3];
    strides[1] = dims[2] * dims[3];
    strides[0] = strides[1] * dims[1];
  }
  return kcu_dnn_tensor(set, t, uid, dt, 4, dims, strides, is_virtual, 0, align);
}

/* The operation graph of sh into set: the convolution, then (fused) bias, residual and ReLU as
 * pointwise nodes through f32 virtual tensors. uid/n_io: the I/O tensors a variant pack binds. */
static cudnnStatus_t kcu_build_graph(kcu_dnn_set *set, cudnnBackendDescriptor_t *graph,
                                     cudnnHandle_t h, const kcu_conv_shape *sh,
                                     const kcu_conv_io *io, int fused, int64_t *uid, int *n_io) {
  cudnnBackendDescriptor_t x, w, y, conv, op[4], prev;
  int n_ops = 0, n = 0;
  int64_t spatial = 2, bias_dims[4] = {1, sh->y[1], 1, 1};
  cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  float alpha = 1.0f, beta = 0.0f;
  /* pointwise nodes after the convolution, the last of which writes y */
  int tail = fused ? sh->has_bias + sh->residual + sh->relu : 0;
  KCU_DNN_TRY(kcu_conv_tensor(set, &x, KCU_UID_X, sh->dtype, sh->x, sh->channels_last, 0,
                         kcu_dnn_alignment(io->x)));
  KCU_DNN_TRY(kcu_conv_tensor(set, &w, KCU_UID_W, sh->dtype, sh->w, sh->channels_last, 0,
                         kcu_dnn_alignment(io->w)));
  uid[n++] = KCU_UID_X;
  uid[n++] = KCU_UID_W;
  uid[n++] = KCU_UID_Y;
  KCU_DNN_TRY(tail ? kcu_conv_tensor(set, &y, KCU_UID_VIRTUAL, CUDNN_DATA_FLOAT, sh->y,
                                sh->channels_last, 1, 16)
               : kcu_conv_tensor(set, &y, KCU_UID_Y, sh->dtype, sh->y, sh->channels_last, 0,
                                kcu_dnn_alignment(io->y)));
  KCU_DNN_TRY(kcu_dnn_make(set, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &conv));
  KCU_DNN_TRY(kcu_dnn_attr(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
  KCU_DNN_TRY(kcu_dnn_attr(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
  KCU_DNN_TRY(kcu_dnn_attr(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial));
  KCU_DNN_TRY(kcu_dnn_attr(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, sh->dilation));
  KCU_DNN_TRY(kcu_dnn_attr(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, sh->stride));
  KCU_DNN_TRY(kcu_dnn_attr(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, sh->pad));
  KCU_DNN_TRY(kcu_dnn_attr(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, sh->pad));
  KCU_DNN_TRY(cudnnBackendFinalize(conv));
  KCU_DNN_TRY(kcu_dnn_make(set, CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, &op[n_ops]));
  KCU_DNN_TRY(kcu_dnn_attr(op[n_ops], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1,
                  &alpha));
  KCU_DNN_TRY(kcu_dnn_attr(op[n_ops], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1,
                  &beta));
  KCU_DNN_TRY(kcu_dnn_attr_desc(op[n_ops], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv));
  KCU_DNN_TRY(kcu_dnn_attr_desc(op[n_ops], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x));
  KCU_DNN_TRY(kcu_dnn_attr_desc(op[n_ops], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w));
  KCU_DNN_TRY(kcu_dnn_attr_desc(op[n_ops], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y));
  KCU_DNN_TRY(cudnnBackendFinalize(op[n_ops]));
  n_ops++;
  prev = y;
  /* bias, residual, ReLU in PyTorch's order; each node's output is virtual but the last */
  for (int step = 0; step < 3 && tail > 0; step++) {
    cudnnBackendDescriptor_t operand = NULL, out;
    cudnnPointwiseMode_t pm = CUDNN_POINTWISE_ADD;
    if (step == 0 && !sh->has_bias) continue;
    if (step == 1 && !sh->residual) continue;
    if (step == 2 && !sh->relu) continue;
    if (step == 0) {
      KCU_DNN_TRY(kcu_conv_tensor(set, &operand, KCU_UID_BIAS, sh->dtype, bias_dims, sh->channels_last,
                             0, kcu_dnn_alignment(io->bias)));
      uid[n++] = KCU_UID_BIAS;
    } else if (step == 1) {
      KCU_DNN_TRY(kcu_conv_tensor(set, &operand, KCU_UID_RES, sh->dtype, sh->y, sh->channels_last, 0,
                             kcu_dnn_alignment(io->residual)));
      uid[n++] = KCU_UID_RES;
    } else {
      pm = CUDNN_POINTWISE_RELU_FWD;
    }
    tail--;
    KCU_DNN_TRY(tail ? kcu_conv_tensor(set, &out, KCU_UID_VIRTUAL + 1 + step, CUDNN_DATA_FLOAT, sh->y,
                                  sh->channels_last, 1, 16)
                 : kcu_conv_tensor(set, &out, KCU_UID_Y, sh->dtype, sh->y, sh->channels_last, 0,
                                  kcu_dnn_alignment(io->y)));
    KCU_DNN_TRY(kcu_dnn_pointwise(set, &op[n_ops], pm, CUDNN_DATA_FLOAT, -1, prev, operand, NULL, out));
    n_ops++;
    prev = out;
  }
  KCU_DNN_TRY(kcu_dnn_graph(set, graph, h, op, n_ops));
  *n_io = n;
  return CUDNN_STATUS_SUCCESS;
}

static void kcu_io_ptrs(const kcu_conv_io *io, const int64_t *uid, int n, void **ptr) {
  for (int k = 0; k < n; k++)
    ptr[k] = uid[k] == KCU_UID_X      ? io->x
             : uid[k] == KCU_UID_W    ? io->w
             : uid[k] == KCU_UID_Y    ? io->y
             : uid[k] == KCU_UID_BIAS ? io->bias
                                      : io->residual;
}

/* One timed candidate: an engine configuration made into a plan of one of the graphs. */
typedef struct kcu_candidate {
  cudnnBackendDescriptor_t cfg, plan;
  int graph; /* 0 fused, 1 plain */
  int64_t engine;
  int rank, from_fallback;
  unsigned notes, behavior;
  size_t workspace;
  float time_us;
} kcu_candidate;

static void kcu_candidate_release(kcu_candidate *c) {
  if (c->plan) cudnnBackendDestroyDescriptor(c->plan);
  if (c->cfg) cudnnBackendDestroyDescriptor(c->cfg);
  c->plan = c->cfg = NULL;
}

/* 1 when the engine's numerics are allowed: no dtype takes inputs converted down (PyTorch refuses
 * those too), and f32 without TF32 takes no tensor cores. */
static int kcu_numerics_allowed(const kcu_conv_shape *sh, unsigned notes) {
  if (notes & (1u << CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) return 0;
  return sh->dtype != CUDNN_DATA_FLOAT || sh->allow_tf32 ||
         (notes & (1u << CUDNN_NUMERICAL_NOTE_TENSOR_CORE)) == 0;
}

static double kcu_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* What collecting one graph's candidates counts and spends. */
typedef struct kcu_collect_tally {
  int refused;          /* configurations refused for their numerics */
  int compiled;         /* plans of this graph compiled at runtime */
  int offered;          /* configurations the heuristics gave */
  double *compile_left; /* the engine's runtime-compilation budget left, ms */
  double compile_ms;    /* spent on this op */
} kcu_collect_tally;

/* Appends to cand[] the plans of graph that heuristic mode offers and that fit: allowed
 * numerics, a plan that finalizes, workspace within ws_size; at most `room` of them, and at most
 * KCU_GRAPH_MAX_COMPILED compiled at runtime while the budget lasts. With `again`, only the
 * configuration at its rank, and only if it is still its engine. */
static int kcu_collect(cudnnHandle_t h, cudnnBackendDescriptor_t graph, int graph_kind,
                       cudnnBackendHeurMode_t mode, const kcu_conv_shape *sh, size_t ws_size,
                       kcu_candidate *cand, int have, int room, kcu_collect_tally *t,
                       const kcu_conv_choice *again) {
  cudnnBackendDescriptor_t heur, cfg[2 * KCU_GRAPH_MAX_PLANS + 8];
  int64_t count = 0, max_cfg = (int64_t)(sizeof cfg / sizeof cfg[0]);
  int added = 0, made = 0, first = have;
  if (room <= 0) return 0;
  cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);
  if (st != CUDNN_STATUS_SUCCESS) return 0;
  st = kcu_dnn_attr_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  if (st == CUDNN_STATUS_SUCCESS)
    st = kcu_dnn_attr(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(heur);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
  if (count > max_cfg) count = max_cfg;
  while (st == CUDNN_STATUS_SUCCESS && made < count) {
    st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[made]);
    if (st == CUDNN_STATUS_SUCCESS) made++;
  }
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, made, &count, cfg);
  if (st != CUDNN_STATUS_SUCCESS) count = 0;
  t->offered += (int)count;
  for (int k = 0; k < (int)count && k < made; k++) {
    kcu_candidate c;
    int dup = 0, rtc;
    double t0;
    memset(&c, 0, sizeof c);
    c.cfg = cfg[k];
    cfg[k] = NULL;
    c.graph = graph_kind;
    c.rank = k;
    c.from_fallback = mode == CUDNN_HEUR_MODE_FALLBACK;
    if (added >= room || (again && k != again->rank) ||
        kcu_dnn_engine_of(c.cfg, &c.engine, &c.notes, &c.behavior) != CUDNN_STATUS_SUCCESS ||
        (again && c.engine != again->engine)) {
      kcu_candidate_release(&c);
      continue;
    }
    /* the fallback list repeats engines mode A offered with the same default knobs */
    for (int j = 0; c.from_fallback && !again && j < first; j++)
      dup |= cand[j].graph == graph_kind && cand[j].engine == c.engine;
    if (dup) {
      kcu_candidate_release(&c);
      continue;
    }
    if (!kcu_numerics_allowed(sh, c.notes)) {
      t->refused++;
      kcu_candidate_release(&c);
      continue;
    }
    /* a plan compiled at runtime costs NVRTC time at load (100s of ms): few, within budget */
    rtc = (c.behavior & (1u << CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION)) != 0;
    if (rtc && (t->compiled >= KCU_GRAPH_MAX_COMPILED || *t->compile_left <= 0.0)) {
      kcu_candidate_release(&c);
      continue;
    }
    t0 = kcu_now_ms();
    st = kcu_dnn_plan(h, c.cfg, &c.plan, &c.workspace);
    if (rtc) {
      double spent = kcu_now_ms() - t0;
      *t->compile_left -= spent;
      t->compile_ms += spent;
      t->compiled++; /* a failed compilation spent its time too */
    }
    if (st != CUDNN_STATUS_SUCCESS || c.workspace > ws_size) {
      kcu_candidate_release(&c);
      st = CUDNN_STATUS_SUCCESS; /* the next configuration may fit */
      continue;
    }
    cand[have + added++] = c;
  }
  for (int k = 0; k < made; k++)
    if (cfg[k]) cudnnBackendDestroyDescriptor(cfg[k]);
  cudnnBackendDestroyDescriptor(heur);
  return added;
}

/* One timed run of a candidate: the plan, then the epilogue kernel when its graph is the plain
 * one. */
typedef struct kcu_candidate_call {
  cudnnHandle_t h;
  const kcu_candidate *c;
  cudnnBackendDescriptor_t pack;
  const kcu_conv_shape *sh;
  const kcu_conv_io *io;
  const kcu_tensor *out;
  int64_t channels, inner;
} kcu_candidate_call;

static cudaError_t kcu_candidate_run(void *ctx, cudaStream_t s) {
  const kcu_candidate_call *a = (const kcu_candidate_call *)ctx;
  const kcu_conv_shape *sh = a->sh;
  if (cudnnBackendExecute(a->h, a->c->plan, a->pack) != CUDNN_STATUS_SUCCESS)
    return cudaErrorUnknown;
  if (a->c->graph == 0 || (!sh->has_bias && !sh->residual && !sh->relu)) return cudaSuccess;
  return kcu_conv_epilogue(s, a->out, sh->has_bias ? a->io->bias : NULL,
                           sh->residual ? a->io->residual : NULL, a->channels, a->inner, sh->relu);
}

/* Microseconds per run of c as the engine replays it (kcu_time_recorded); negative when it
 * failed to run or to be recorded. */
static float kcu_time_candidate(cudnnHandle_t h, cudaStream_t s, const kcu_candidate *c,
                                const int64_t *uid, int n_io, const kcu_conv_shape *sh,
                                const kcu_conv_io *io, const kcu_tensor *out, int64_t channels,
                                int64_t inner, void *ws) {
  void *ptr[KCU_GRAPH_MAX_IO] = {0};
  kcu_candidate_call call = {h, c, NULL, sh, io, out, channels, inner};
  kcu_io_ptrs(io, uid, n_io, ptr);
  if (kcu_dnn_pack(&call.pack, uid, n_io, ptr, ws) != CUDNN_STATUS_SUCCESS) return -1.0f;
  float us = kcu_time_recorded(s, kcu_candidate_run, &call);
  cudnnBackendDestroyDescriptor(call.pack);
  return us;
}

/* The choice itself: every candidate timed, or with `again` only the one an earlier load chose,
 * untimed. */
static cudnnStatus_t kcu_graph_pick(kcu_conv_graph *g, cudnnHandle_t h, cudaStream_t s,
                                    const kcu_conv_shape *sh, const kcu_conv_io *io,
                                    const kcu_tensor *out, int64_t channels, int64_t inner,
                                    void *ws, size_t ws_size, double *compile_left,
                                    const kcu_conv_choice *again) {
  kcu_dnn_set set[2];
  cudnnBackendDescriptor_t graph[2] = {NULL, NULL};
  int64_t uid[2][KCU_GRAPH_MAX_IO];
  int n_io[2] = {0, 0}, n = 0, best = -1, refused = 0;
  double compile_ms = 0.0;
  kcu_candidate cand[4 * KCU_GRAPH_MAX_PLANS];
  int has_tail = sh->has_bias || sh->residual || sh->relu;
  memset(set, 0, sizeof set);
  /* graph 0 fuses the epilogue (where there is one), graph 1 is the convolution alone */
  for (int k = 0; k < 2; k++) {
    int wanted = k == 0 ? has_tail && (g->graphs & KCU_GRAPH_FUSED)
                        : !has_tail || (g->graphs & KCU_GRAPH_PLAIN);
    if (!wanted || (again && again->graph != k)) continue;
    g->build_status[k] = kcu_build_graph(&set[k], &graph[k], h, sh, io, k == 0, uid[k], &n_io[k]);
    if (g->build_status[k] != CUDNN_STATUS_SUCCESS) {
      kcu_dnn_release(&set[k]);
      graph[k] = NULL;
      continue;
    }
    int before = n;
    kcu_collect_tally t = {0, 0, 0, compile_left, 0.0};
    if (again)
      n += kcu_collect(h, graph[k], k, again->from_fallback ? CUDNN_HEUR_MODE_FALLBACK
                                                            : CUDNN_HEUR_MODE_A,
                       sh, ws_size, cand, n, 1, &t, again);
    else
      n += kcu_collect(h, graph[k], k, CUDNN_HEUR_MODE_A, sh, ws_size, cand, n,
                       KCU_GRAPH_MAX_PLANS, &t, NULL);
    if (!again)
      n += kcu_collect(h, graph[k], k, CUDNN_HEUR_MODE_FALLBACK, sh, ws_size, cand, n,
                       KCU_GRAPH_MAX_PLANS - (n - before), &t, NULL);
    g->offered[k] = t.offered;
    g->built[k] = n - before;
    refused += t.refused;
    compile_ms += t.compile_ms;
  }
  g->compile_ms = (float)compile_ms;
  for (int k = 0; k < n && !again; k++) {
    cand[k].time_us = kcu_time_candidate(h, s, &cand[k], uid[cand[k].graph], n_io[cand[k].graph],
                                         sh, io, out, channels, inner, ws);
    if (cand[k].time_us >= 0.0f && (best < 0 || cand[k].time_us < cand[best].time_us)) best = k;
  }
  if (again && n == 1) {
    best = 0;
    cand[0].time_us = again->time_us;
  }
  g->timed = again ? 0 : n;
  g->refused = refused;
  for (int k = 0; k < n; k++)
    if (k != best) kcu_candidate_release(&cand[k]);
  if (best < 0) {
    kcu_dnn_release(&set[0]);
    kcu_dnn_release(&set[1]);
    return CUDNN_STATUS_NOT_SUPPORTED;
  }
  const kcu_candidate *c = &cand[best];
  kcu_dnn_release(&set[1 - c->graph]);
  g->kept = set[c->graph];
  /* the plan and its configuration join the graph's descriptors, released with them */
  if (g->kept.n + 2 > KCU_DNN_MAX_DESCS) {
    kcu_candidate_release(&cand[best]);
    kcu_dnn_release(&g->kept);
    return CUDNN_STATUS_INTERNAL_ERROR;
  }
  g->kept.d[g->kept.n++] = c->cfg;
  g->kept.d[g->kept.n++] = c->plan;
  g->plan = c->plan;
  g->fused = c->graph == 0;
  g->n_io = n_io[c->graph];
  memcpy(g->uid, uid[c->graph], sizeof g->uid);
  void *ptr[KCU_GRAPH_MAX_IO] = {0};
  kcu_io_ptrs(io, g->uid, g->n_io, ptr);
  for (int k = 0; k < g->n_io; k++) g->align[k] = kcu_dnn_alignment(ptr[k]);
  g->workspace = c->workspace;
  g->engine = c->engine;
  g->heur_rank = c->rank;
  g->from_fallback = c->from_fallback;
  g->notes = c->notes;
  g->behavior = c->behavior;
  g->time_us = c->time_us;
  return CUDNN_STATUS_SUCCESS;
}

/* What decides a choice (the process's cache key) and what was chosen. */
typedef struct kcu_conv_choice_key {
  kcu_conv_shape shape;
  int64_t align[KCU_GRAPH_MAX_IO]; /* of x, w, y, bias, residual */
  int64_t ws_size;
  int32_t device, graphs;
} kcu_conv_choice_key;
_Static_assert(sizeof(kcu_conv_choice_key) <= KCU_CHOICE_KEY_BYTES, "convolution key too long");
_Static_assert(sizeof(kcu_conv_choice) <= KCU_CHOICE_VALUE_BYTES, "convolution choice too long");

cudnnStatus_t kcu_conv_graph_choose(kcu_conv_graph *g, cudnnHandle_t h, cudaStream_t s,
                                    const kcu_conv_shape *sh, const kcu_conv_io *io,
                                    const kcu_tensor *out, int64_t channels, int64_t inner,
                                    void *ws, size_t ws_size, double *compile_left) {
  kcu_conv_choice_key key;
  kcu_conv_choice kept;
  const void *ptr[KCU_GRAPH_MAX_IO] = {io->x, io->w, io->y, io->bias, io->residual};
  int device = 0;
  cudaGetDevice(&device);
  memset(&key, 0, sizeof key);
  memset(&kept, 0, sizeof kept);
  key.shape = *sh;
  for (int k = 0; k < KCU_GRAPH_MAX_IO; k++) key.align[k] = kcu_dnn_alignment(ptr[k]);
  key.ws_size = (int64_t)ws_size;
  key.device = device;
  key.graphs = g->graphs;
  g->reused = 0;
  /* an earlier load chose for this key: the same plan again, untimed, within the budget */
  if (kcu_choice_find(&key, sizeof key, &kept, sizeof kept) &&
      (!kept.compiled || *compile_left > 0.0) &&
      kcu_graph_pick(g, h, s, sh, io, out, channels, inner, ws, ws_size, compile_left, &kept) ==
          CUDNN_STATUS_SUCCESS) {
    g->reused = 1;
    return CUDNN_STATUS_SUCCESS;
  }
  cudnnStatus_t st =
      kcu_graph_pick(g, h, s, sh, io, out, channels, inner, ws, ws_size, compile_left, NULL);
  if (st != CUDNN_STATUS_SUCCESS) return st;
  kept.engine = g->engine;
  kept.graph = g->fused ? 0 : 1;
  kept.from_fallback = g->from_fallback;
  kept.rank = g->heur_rank;
  kept.compiled = (g->behavior & (1u << CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION)) != 0;
  kept.time_us = g->time_us;
  kcu_choice_keep(&key, sizeof key, &kept, sizeof kept);
  return CUDNN_STATUS_SUCCESS;
}

int kcu_conv_graph_share(kcu_conv_graph *g, const kcu_conv_graph *from, const kcu_conv_io *io) {
  void *ptr[KCU_GRAPH_MAX_IO] = {0};
  if (!from->plan || from->graphs != g->graphs) return 0;
  kcu_io_ptrs(io, from->uid, from->n_io, ptr);
  for (int k = 0; k < from->n_io; k++)
    if (kcu_dnn_alignment(ptr[k]) < from->align[k]) return 0;
  *g = *from;
  g->kept.n = 0; /* the owner releases the plan and its descriptors */
  memset(&g->bound, 0, sizeof g->bound);
  g->shared = 1;
  g->timed = 0;
  return 1;
}

cudnnStatus_t kcu_conv_graph_run(kcu_conv_graph *g, cudnnHandle_t h, const kcu_conv_io *io,
                                 void *ws) {
  void *ptr[KCU_GRAPH_MAX_IO] = {0};
  kcu_io_ptrs(io, g->uid, g->n_io, ptr);
  return kcu_dnn_execute(h, g->plan, &g->bound, g->uid, g->n_io, ptr, ws);
}

void kcu_conv_graph_release(kcu_conv_graph *g) {
  kcu_dnn_unbind(&g->bound);
  kcu_dnn_release(&g->kept);
  g->plan = NULL;
}
