/* The cuDNN backend-API helpers every graph of the engine shares (see cuda_dnn.h). */
#include "cuda_dnn.h"

#include <stdbool.h>
#include <string.h>

cudnnStatus_t kcu_dnn_make(kcu_dnn_set *set, cudnnBackendDescriptorType_t type,
                           cudnnBackendDescriptor_t *d) {
  *d = NULL;
  if (set->n == KCU_DNN_MAX_DESCS) return CUDNN_STATUS_INTERNAL_ERROR;
  cudnnStatus_t st = cudnnBackendCreateDescriptor(type, d);
  if (st == CUDNN_STATUS_SUCCESS) set->d[set->n++] = *d;
  return st;
}

void kcu_dnn_release(kcu_dnn_set *set) {
  while (set->n > 0) cudnnBackendDestroyDescriptor(set->d[--set->n]);
}

cudnnStatus_t kcu_dnn_attr(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                           cudnnBackendAttributeType_t type, int64_t n, const void *v) {
  return cudnnBackendSetAttribute(d, name, type, n, v);
}

cudnnStatus_t kcu_dnn_attr_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                                cudnnBackendDescriptor_t v) {
  return kcu_dnn_attr(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

int64_t kcu_dnn_alignment(const void *p) {
  uintptr_t a = (uintptr_t)p;
  int64_t al = 1;
  while (al < 16 && (a & (uintptr_t)al) == 0) al *= 2;
  return al;
}

cudnnStatus_t kcu_dnn_tensor(kcu_dnn_set *set, cudnnBackendDescriptor_t *t, int64_t uid,
                             cudnnDataType_t dt, int rank, const int64_t *dims,
                             const int64_t *strides, int is_virtual, int by_value, int64_t align) {
  bool virt = is_virtual != 0, value = by_value != 0;
  KCU_DNN_TRY(kcu_dnn_make(set, CUDNN_BACKEND_TENSOR_DESCRIPTOR, t));
  KCU_DNN_TRY(kcu_dnn_attr(*t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
  KCU_DNN_TRY(kcu_dnn_attr(*t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, dims));
  KCU_DNN_TRY(kcu_dnn_attr(*t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, strides));
  KCU_DNN_TRY(kcu_dnn_attr(*t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
  KCU_DNN_TRY(kcu_dnn_attr(*t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
  KCU_DNN_TRY(kcu_dnn_attr(*t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt));
  if (value)
    KCU_DNN_TRY(kcu_dnn_attr(*t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &value));
  return cudnnBackendFinalize(*t);
}

cudnnStatus_t kcu_dnn_pointwise(kcu_dnn_set *set, cudnnBackendDescriptor_t *node,
                                cudnnPointwiseMode_t mode, cudnnDataType_t prec, int64_t axis,
                                cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t pw;
  KCU_DNN_TRY(kcu_dnn_make(set, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw));
  KCU_DNN_TRY(kcu_dnn_attr(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
  KCU_DNN_TRY(kcu_dnn_attr(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec));
  if (axis >= 0)
    KCU_DNN_TRY(kcu_dnn_attr(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis));
  KCU_DNN_TRY(cudnnBackendFinalize(pw));
  KCU_DNN_TRY(kcu_dnn_make(set, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, node));
  KCU_DNN_TRY(kcu_dnn_attr_desc(*node, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw));
  KCU_DNN_TRY(kcu_dnn_attr_desc(*node, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x));
  if (b) KCU_DNN_TRY(kcu_dnn_attr_desc(*node, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b));
  if (t) KCU_DNN_TRY(kcu_dnn_attr_desc(*node, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t));
  KCU_DNN_TRY(kcu_dnn_attr_desc(*node, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y));
  return cudnnBackendFinalize(*node);
}

cudnnStatus_t kcu_dnn_graph(kcu_dnn_set *set, cudnnBackendDescriptor_t *graph, cudnnHandle_t h,
                            cudnnBackendDescriptor_t *ops, int n) {
  KCU_DNN_TRY(kcu_dnn_make(set, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, graph));
  KCU_DNN_TRY(kcu_dnn_attr(*graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
  KCU_DNN_TRY(kcu_dnn_attr(*graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n,
                           ops));
  return cudnnBackendFinalize(*graph);
}

cudnnStatus_t kcu_dnn_pack(cudnnBackendDescriptor_t *pack, const int64_t *uid, int n,
                           void *const *ptr, void *ws) {
  cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, pack);
  if (st != CUDNN_STATUS_SUCCESS) {
    *pack = NULL;
    return st;
  }
  st = kcu_dnn_attr(*pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uid);
  if (st == CUDNN_STATUS_SUCCESS)
    st = kcu_dnn_attr(*pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptr);
  if (st == CUDNN_STATUS_SUCCESS)
    st = kcu_dnn_attr(*pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(*pack);
  if (st != CUDNN_STATUS_SUCCESS) {
    cudnnBackendDestroyDescriptor(*pack);
    *pack = NULL;
  }
  return st;
}

cudnnStatus_t kcu_dnn_execute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, kcu_dnn_bound *b,
                              const int64_t *uid, int n, void *const *ptr, void *ws) {
  int same = b->pack && b->ws == ws && n <= KCU_DNN_MAX_IO;
  for (int k = 0; same && k < n; k++) same = b->ptr[k] == ptr[k];
  if (!same) {
    if (n > KCU_DNN_MAX_IO) return CUDNN_STATUS_BAD_PARAM;
    kcu_dnn_unbind(b);
    KCU_DNN_TRY(kcu_dnn_pack(&b->pack, uid, n, ptr, ws));
    for (int k = 0; k < n; k++) b->ptr[k] = ptr[k];
    b->ws = ws;
  }
  return cudnnBackendExecute(h, plan, b->pack);
}

void kcu_dnn_unbind(kcu_dnn_bound *b) {
  if (b->pack) cudnnBackendDestroyDescriptor(b->pack);
  memset(b, 0, sizeof *b);
}

cudnnStatus_t kcu_dnn_engine_of(cudnnBackendDescriptor_t cfg, int64_t *index, unsigned *notes,
                                unsigned *behavior) {
  cudnnBackendDescriptor_t eng;
  cudnnBackendNumericalNote_t list[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  cudnnBackendBehaviorNote_t blist[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  int64_t got = 0, n_notes = 0, n_behavior = 0;
  KCU_DNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng));
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

cudnnStatus_t kcu_dnn_plan(cudnnHandle_t h, cudnnBackendDescriptor_t cfg,
                           cudnnBackendDescriptor_t *plan, size_t *workspace) {
  int64_t ws = 0, got = 0;
  cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, plan);
  if (st != CUDNN_STATUS_SUCCESS) {
    *plan = NULL;
    return st;
  }
  st = kcu_dnn_attr(*plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  if (st == CUDNN_STATUS_SUCCESS)
    st = kcu_dnn_attr_desc(*plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(*plan);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendGetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                  CUDNN_TYPE_INT64, 1, &got, &ws);
  if (st == CUDNN_STATUS_SUCCESS && ws < 0) st = CUDNN_STATUS_NOT_SUPPORTED;
  if (st != CUDNN_STATUS_SUCCESS) {
    cudnnBackendDestroyDescriptor(*plan);
    *plan = NULL;
    return st;
  }
  *workspace = (size_t)ws;
  return CUDNN_STATUS_SUCCESS;
}

float kcu_time_recorded(cudaStream_t s, cudaError_t (*run)(void *ctx, cudaStream_t s), void *ctx) {
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  cudaEvent_t start = NULL, stop = NULL;
  float best = -1.0f;
  cudaError_t rc = run(ctx, s);
  if (rc == cudaSuccess) rc = cudaStreamSynchronize(s);
  if (rc == cudaSuccess) rc = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (rc == cudaSuccess) {
    for (int r = 0; rc == cudaSuccess && r < KCU_TIMED_RUNS; r++) rc = run(ctx, s);
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
    float us = ms * 1000.0f / KCU_TIMED_RUNS;
    if (rc == cudaSuccess && (best < 0.0f || us < best)) best = us;
  }
  if (rc != cudaSuccess) best = -1.0f;
  cudaStreamSynchronize(s);
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError(); /* a candidate's failure is not the engine's */
  return best;
}
