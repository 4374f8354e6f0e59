/* A forward convolution through cuDNN's backend API (see cuda_conv_graph.h). Tensors carry the
 * plan's strides for NCHW or NHWC; a 1-d convolution arrives as a 2-d one of height 1. */
#include "cuda_conv_graph.h"

#include "cuda_choice_cache.h"

#include <stdbool.h>
#include <string.h>
#include <time.h>

enum { KCU_UID_X = 1, KCU_UID_W, KCU_UID_Y, KCU_UID_BIAS, KCU_UID_RES, KCU_UID_VIRTUAL = 100 };

/* Runs of one candidate per timed graph launch: enough to hide the launch itself. */
#define KCU_GRAPH_TIMED_RUNS 5

#define KCU_TRY(call)                                                                              \
  do {                                                                                             \
    cudnnStatus_t st_ = (call);                                                                    \
    if (st_ != CUDNN_STATUS_SUCCESS) return st_;                                                   \
  } while (0)

static cudnnStatus_t kcu_make(kcu_dnn_set *set, cudnnBackendDescriptorType_t type,
                              cudnnBackendDescriptor_t *d) {
  *d = NULL;
  if (set->n == KCU_GRAPH_MAX_DESCS) return CUDNN_STATUS_INTERNAL_ERROR;
  cudnnStatus_t st = cudnnBackendCreateDescriptor(type, d);
  if (st == CUDNN_STATUS_SUCCESS) set->d[set->n++] = *d;
  return st;
}

static void kcu_set_release(kcu_dnn_set *set) {
  while (set->n > 0) cudnnBackendDestroyDescriptor(set->d[--set->n]);
}

static cudnnStatus_t kcu_set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                             cudnnBackendAttributeType_t type, int64_t n, const void *v) {
  return cudnnBackendSetAttribute(d, name, type, n, v);
}

static cudnnStatus_t kcu_set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                                  cudnnBackendDescriptor_t v) {
  return kcu_set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

/* The largest power of two up to 16 dividing the address: the alignment the plan may assume. */
static int64_t kcu_alignment(const void *p) {
  uintptr_t a = (uintptr_t)p;
  int64_t al = 1;
  while (al < 16 && (a & (uintptr_t)al) == 0) al *= 2;
  return al;
}

/* A tensor of dims [n, c, h, w] held NHWC or NCHW; virtual ones live only inside the graph. */
static cudnnStatus_t kcu_dnn_tensor(kcu_dnn_set *set, cudnnBackendDescriptor_t *t, int64_t uid,
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
  bool virt = is_virtual != 0;
  KCU_TRY(kcu_make(set, CUDNN_BACKEND_TENSOR_DESCRIPTOR, t));
  KCU_TRY(kcu_set(*t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
  KCU_TRY(kcu_set(*t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
  KCU_TRY(kcu_set(*t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides));
  KCU_TRY(kcu_set(*t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
  KCU_TRY(kcu_set(*t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
  KCU_TRY(kcu_set(*t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt));
  return cudnnBackendFinalize(*t);
}

/* One pointwise node y = mode(x[, b]) computed in f32. */
static cudnnStatus_t kcu_pointwise(kcu_dnn_set *set, cudnnBackendDescriptor_t *node,
                                   cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t pw;
  cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  KCU_TRY(kcu_make(set, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw));
  KCU_TRY(kcu_set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
  KCU_TRY(kcu_set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec));
  KCU_TRY(cudnnBackendFinalize(pw));
  KCU_TRY(kcu_make(set, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, node));
  KCU_TRY(kcu_set_desc(*node, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw));
  KCU_TRY(kcu_set_desc(*node, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x));
  if (b) KCU_TRY(kcu_set_desc(*node, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b));
  KCU_TRY(kcu_set_desc(*node, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y));
  return cudnnBackendFinalize(*node);
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
  KCU_TRY(kcu_dnn_tensor(set, &x, KCU_UID_X, sh->dtype, sh->x, sh->channels_last, 0,
                         kcu_alignment(io->x)));
  KCU_TRY(kcu_dnn_tensor(set, &w, KCU_UID_W, sh->dtype, sh->w, sh->channels_last, 0,
                         kcu_alignment(io->w)));
  uid[n++] = KCU_UID_X;
  uid[n++] = KCU_UID_W;
  uid[n++] = KCU_UID_Y;
  KCU_TRY(tail ? kcu_dnn_tensor(set, &y, KCU_UID_VIRTUAL, CUDNN_DATA_FLOAT, sh->y,
                                sh->channels_last, 1, 16)
               : kcu_dnn_tensor(set, &y, KCU_UID_Y, sh->dtype, sh->y, sh->channels_last, 0,
                                kcu_alignment(io->y)));
  KCU_TRY(kcu_make(set, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &conv));
  KCU_TRY(kcu_set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
  KCU_TRY(kcu_set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
  KCU_TRY(kcu_set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial));
  KCU_TRY(kcu_set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, sh->dilation));
  KCU_TRY(kcu_set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, sh->stride));
  KCU_TRY(kcu_set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, sh->pad));
  KCU_TRY(kcu_set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, sh->pad));
  KCU_TRY(cudnnBackendFinalize(conv));
  KCU_TRY(kcu_make(set, CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, &op[n_ops]));
  KCU_TRY(kcu_set(op[n_ops], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1,
                  &alpha));
  KCU_TRY(kcu_set(op[n_ops], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1,
                  &beta));
  KCU_TRY(kcu_set_desc(op[n_ops], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv));
  KCU_TRY(kcu_set_desc(op[n_ops], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x));
  KCU_TRY(kcu_set_desc(op[n_ops], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w));
  KCU_TRY(kcu_set_desc(op[n_ops], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y));
  KCU_TRY(cudnnBackendFinalize(op[n_ops]));
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
      KCU_TRY(kcu_dnn_tensor(set, &operand, KCU_UID_BIAS, sh->dtype, bias_dims, sh->channels_last,
                             0, kcu_alignment(io->bias)));
      uid[n++] = KCU_UID_BIAS;
    } else if (step == 1) {
      KCU_TRY(kcu_dnn_tensor(set, &operand, KCU_UID_RES, sh->dtype, sh->y, sh->channels_last, 0,
                             kcu_alignment(io->residual)));
      uid[n++] = KCU_UID_RES;
    } else {
      pm = CUDNN_POINTWISE_RELU_FWD;
    }
    tail--;
    KCU_TRY(tail ? kcu_dnn_tensor(set, &out, KCU_UID_VIRTUAL + 1 + step, CUDNN_DATA_FLOAT, sh->y,
                                  sh->channels_last, 1, 16)
                 : kcu_dnn_tensor(set, &out, KCU_UID_Y, sh->dtype, sh->y, sh->channels_last, 0,
                                  kcu_alignment(io->y)));
    KCU_TRY(kcu_pointwise(set, &op[n_ops], pm, prev, operand, out));
    n_ops++;
    prev = out;
  }
  KCU_TRY(kcu_make(set, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, graph));
  KCU_TRY(kcu_set(*graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
  KCU_TRY(kcu_set(*graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n_ops, op));
  KCU_TRY(cudnnBackendFinalize(*graph));
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

static cudnnStatus_t kcu_pack(cudnnBackendDescriptor_t *pack, const int64_t *uid, int n,
                              void *const *ptr, void *ws) {
  cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, pack);
  if (st != CUDNN_STATUS_SUCCESS) {
    *pack = NULL;
    return st;
  }
  st = kcu_set(*pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uid);
  if (st == CUDNN_STATUS_SUCCESS)
    st = kcu_set(*pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptr);
  if (st == CUDNN_STATUS_SUCCESS)
    st = kcu_set(*pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(*pack);
  if (st != CUDNN_STATUS_SUCCESS) {
    cudnnBackendDestroyDescriptor(*pack);
    *pack = NULL;
  }
  return st;
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

/* The engine of cfg: its global index, numerical and behaviour notes as bits. */
static cudnnStatus_t kcu_engine_of(cudnnBackendDescriptor_t cfg, int64_t *index, unsigned *notes,
                                   unsigned *behavior) {
  cudnnBackendDescriptor_t eng;
  cudnnBackendNumericalNote_t list[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  cudnnBackendBehaviorNote_t blist[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  int64_t got = 0, n_notes = 0, n_behavior = 0;
  KCU_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng));
  cudnnStatus_t st = cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &eng);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got,
                                  index);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                  CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n_notes, list);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                  CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n_behavior, blist);
  *notes = *behavior = 0;
  for (int64_t k = 0; st == CUDNN_STATUS_SUCCESS && k < n_notes; k++)
    if ((int)list[k] >= 0 && (int)list[k] < 32) *notes |= 1u << (int)list[k];
  for (int64_t k = 0; st == CUDNN_STATUS_SUCCESS && k < n_behavior; k++)
    if ((int)blist[k] >= 0 && (int)blist[k] < 32) *behavior |= 1u << (int)blist[k];
  cudnnBackendDestroyDescriptor(eng);
  return st;
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
  st = kcu_set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  if (st == CUDNN_STATUS_SUCCESS)
    st = kcu_set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
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
    int64_t ws = 0, got = 0;
    int dup = 0, rtc;
    double t0;
    memset(&c, 0, sizeof c);
    c.cfg = cfg[k];
    cfg[k] = NULL;
    c.graph = graph_kind;
    c.rank = k;
    c.from_fallback = mode == CUDNN_HEUR_MODE_FALLBACK;
    if (added >= room || (again && k != again->rank) ||
        kcu_engine_of(c.cfg, &c.engine, &c.notes, &c.behavior) != CUDNN_STATUS_SUCCESS ||
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
    st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &c.plan);
    if (st != CUDNN_STATUS_SUCCESS) c.plan = NULL;
    if (st == CUDNN_STATUS_SUCCESS)
      st = kcu_set(c.plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    if (st == CUDNN_STATUS_SUCCESS)
      st = kcu_set_desc(c.plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, c.cfg);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(c.plan);
    if (rtc) {
      double spent = kcu_now_ms() - t0;
      *t->compile_left -= spent;
      t->compile_ms += spent;
      t->compiled++; /* a failed compilation spent its time too */
    }
    if (st == CUDNN_STATUS_SUCCESS)
      st = cudnnBackendGetAttribute(c.plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                    CUDNN_TYPE_INT64, 1, &got, &ws);
    st = st == CUDNN_STATUS_SUCCESS ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED;
    if (st != CUDNN_STATUS_SUCCESS || ws < 0 || (uint64_t)ws > ws_size) {
      kcu_candidate_release(&c);
      st = CUDNN_STATUS_SUCCESS; /* the next configuration may fit */
      continue;
    }
    c.workspace = (size_t)ws;
    cand[have + added++] = c;
  }
  for (int k = 0; k < made; k++)
    if (cfg[k]) cudnnBackendDestroyDescriptor(cfg[k]);
  cudnnBackendDestroyDescriptor(heur);
  return added;
}

/* One run of a candidate: the plan, then the epilogue kernel when its graph is the plain one. */
static cudaError_t kcu_candidate_run(cudnnHandle_t h, cudaStream_t s, const kcu_candidate *c,
                                     cudnnBackendDescriptor_t pack, const kcu_conv_shape *sh,
                                     const kcu_conv_io *io, const kcu_tensor *out, int64_t channels,
                                     int64_t inner) {
  if (cudnnBackendExecute(h, c->plan, pack) != CUDNN_STATUS_SUCCESS) return cudaErrorUnknown;
  if (c->graph == 0 || (!sh->has_bias && !sh->residual && !sh->relu)) return cudaSuccess;
  return kcu_conv_epilogue(s, out, sh->has_bias ? io->bias : NULL,
                           sh->residual ? io->residual : NULL, channels, inner, sh->relu);
}

/* Microseconds per run of c: checked once directly, then recorded as a CUDA graph of
 * KCU_GRAPH_TIMED_RUNS runs (as the engine replays it) and the faster of two launches kept.
 * A negative result: the candidate failed to run or to be recorded. */
static float kcu_time_candidate(cudnnHandle_t h, cudaStream_t s, const kcu_candidate *c,
                                const int64_t *uid, int n_io, const kcu_conv_shape *sh,
                                const kcu_conv_io *io, const kcu_tensor *out, int64_t channels,
                                int64_t inner, void *ws) {
  void *ptr[KCU_GRAPH_MAX_IO] = {0};
  cudnnBackendDescriptor_t pack;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  cudaEvent_t start = NULL, stop = NULL;
  float best = -1.0f;
  kcu_io_ptrs(io, uid, n_io, ptr);
  if (kcu_pack(&pack, uid, n_io, ptr, ws) != CUDNN_STATUS_SUCCESS) return -1.0f;
  cudaError_t rc = kcu_candidate_run(h, s, c, pack, sh, io, out, channels, inner);
  if (rc == cudaSuccess) rc = cudaStreamSynchronize(s);
  if (rc == cudaSuccess) rc = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (rc == cudaSuccess) {
    for (int r = 0; rc == cudaSuccess && r < KCU_GRAPH_TIMED_RUNS; r++)
      rc = kcu_candidate_run(h, s, c, pack, sh, io, out, channels, inner);
    cudaError_t end = cudaStreamEndCapture(s, &graph);
    if (rc == cudaSuccess) rc = end;
  }
  if (rc == cudaSuccess) rc = cudaGraphInstantiate(&exec, graph, 0);
  if (rc == cudaSuccess) rc = cudaEventCreate(&start);
  if (rc == cudaSuccess) rc = cudaEventCreate(&stop);
  if (rc == cudaSuccess) rc = cudaGraphLaunch(exec, s); /* warm */
  for (int pass = 0; rc == cudaSuccess && pass < 2; pass++) {
    float ms = 0.0f;
    rc = cudaEventRecord(start, s);
    if (rc == cudaSuccess) rc = cudaGraphLaunch(exec, s);
    if (rc == cudaSuccess) rc = cudaEventRecord(stop, s);
    if (rc == cudaSuccess) rc = cudaEventSynchronize(stop);
    if (rc == cudaSuccess) rc = cudaEventElapsedTime(&ms, start, stop);
    float us = ms * 1000.0f / KCU_GRAPH_TIMED_RUNS;
    if (rc == cudaSuccess && (best < 0.0f || us < best)) best = us;
  }
  if (rc != cudaSuccess) best = -1.0f;
  cudaStreamSynchronize(s);
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudnnBackendDestroyDescriptor(pack);
  cudaGetLastError(); /* a candidate's failure is not the engine's */
  return best;
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
      kcu_set_release(&set[k]);
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
    kcu_set_release(&set[0]);
    kcu_set_release(&set[1]);
    return CUDNN_STATUS_NOT_SUPPORTED;
  }
  const kcu_candidate *c = &cand[best];
  kcu_set_release(&set[1 - c->graph]);
  g->kept = set[c->graph];
  /* the plan and its configuration join the graph's descriptors, released with them */
  if (g->kept.n + 2 > KCU_GRAPH_MAX_DESCS) {
    kcu_candidate_release(&cand[best]);
    kcu_set_release(&g->kept);
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
  for (int k = 0; k < g->n_io; k++) g->align[k] = kcu_alignment(ptr[k]);
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
  for (int k = 0; k < KCU_GRAPH_MAX_IO; k++) key.align[k] = kcu_alignment(ptr[k]);
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
    if (kcu_alignment(ptr[k]) < from->align[k]) return 0;
  *g = *from;
  g->kept.n = 0; /* the owner releases the plan and its descriptors */
  g->pack = NULL;
  g->pack_ws = NULL;
  memset(g->pack_ptr, 0, sizeof g->pack_ptr);
  g->shared = 1;
  g->timed = 0;
  return 1;
}

cudnnStatus_t kcu_conv_graph_run(kcu_conv_graph *g, cudnnHandle_t h, const kcu_conv_io *io,
                                 void *ws) {
  void *ptr[KCU_GRAPH_MAX_IO] = {0};
  kcu_io_ptrs(io, g->uid, g->n_io, ptr);
  int same = g->pack && g->pack_ws == ws;
  for (int k = 0; same && k < g->n_io; k++) same = g->pack_ptr[k] == ptr[k];
  if (!same) {
    /* new addresses: only while a run is being recorded, never on a graph replay */
    if (g->pack) cudnnBackendDestroyDescriptor(g->pack);
    g->pack = NULL;
    KCU_TRY(kcu_pack(&g->pack, g->uid, g->n_io, ptr, ws));
    memcpy(g->pack_ptr, ptr, sizeof ptr);
    g->pack_ws = ws;
  }
  return cudnnBackendExecute(h, g->plan, g->pack);
}

void kcu_conv_graph_release(kcu_conv_graph *g) {
  if (g->pack) cudnnBackendDestroyDescriptor(g->pack);
  g->pack = NULL;
  kcu_set_release(&g->kept);
  g->plan = NULL;
}
