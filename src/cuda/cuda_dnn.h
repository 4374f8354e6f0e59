/* What every cuDNN backend-API graph of the engine shares: descriptor sets released together,
 * attribute setters, pointwise nodes, variant packs, an engine configuration's engine and
 * notes, plans made from configurations, and the timing of a recorded run. */
#ifndef KILN_CUDA_DNN_H
#define KILN_CUDA_DNN_H

#include <cuda_runtime.h>
#include <cudnn.h>
#include <stddef.h>
#include <stdint.h>

/* Descriptors one graph holds with its plan. */
#define KCU_DNN_MAX_DESCS 64

#define KCU_DNN_TRY(call)                                                                          \
  do {                                                                                             \
    cudnnStatus_t st_ = (call);                                                                    \
    if (st_ != CUDNN_STATUS_SUCCESS) return st_;                                                   \
  } while (0)

/* Descriptors that live as long as a plan built from them. */
typedef struct kcu_dnn_set {
  cudnnBackendDescriptor_t d[KCU_DNN_MAX_DESCS];
  int n;
} kcu_dnn_set;

/* A descriptor of `type` owned by set. */
cudnnStatus_t kcu_dnn_make(kcu_dnn_set *set, cudnnBackendDescriptorType_t type,
                           cudnnBackendDescriptor_t *d);
void kcu_dnn_release(kcu_dnn_set *set);
cudnnStatus_t kcu_dnn_attr(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                           cudnnBackendAttributeType_t type, int64_t n, const void *v);
cudnnStatus_t kcu_dnn_attr_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                                cudnnBackendDescriptor_t v);
/* The largest power of two up to 16 dividing the address: the alignment a plan may assume. */
int64_t kcu_dnn_alignment(const void *p);
/* A tensor of `rank` dims and strides; virtual ones live only inside the graph, by-value ones
 * are host scalars read when the plan runs. */
cudnnStatus_t kcu_dnn_tensor(kcu_dnn_set *set, cudnnBackendDescriptor_t *t, int64_t uid,
                             cudnnDataType_t dt, int rank, const int64_t *dims,
                             const int64_t *strides, int is_virtual, int by_value, int64_t align);
/* One pointwise node y = mode(x[, b[, t]]) computed in `prec`; axis >= 0 only for GEN_INDEX. */
cudnnStatus_t kcu_dnn_pointwise(kcu_dnn_set *set, cudnnBackendDescriptor_t *node,
                                cudnnPointwiseMode_t mode, cudnnDataType_t prec, int64_t axis,
                                cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y);
/* The finalized operation graph of n nodes. */
cudnnStatus_t kcu_dnn_graph(kcu_dnn_set *set, cudnnBackendDescriptor_t *graph, cudnnHandle_t h,
                            cudnnBackendDescriptor_t *ops, int n);
/* A finalized variant pack binding uid[k] to ptr[k]; the caller destroys it. */
cudnnStatus_t kcu_dnn_pack(cudnnBackendDescriptor_t *pack, const int64_t *uid, int n,
                           void *const *ptr, void *ws);
/* Variant pack slots a graph binds, at most. */
#define KCU_DNN_MAX_IO 8
/* A plan's variant pack, kept for the addresses it binds. */
typedef struct kcu_dnn_bound {
  cudnnBackendDescriptor_t pack; /* NULL until the first run */
  void *ptr[KCU_DNN_MAX_IO], *ws;
} kcu_dnn_bound;
/* Enqueues plan on the addresses ptr (n of them, uid[k] naming ptr[k]) and workspace ws,
 * building b's pack again only when they changed, which happens while a run is recorded (at
 * init or when caller buffers are rebound), never on a graph replay. */
cudnnStatus_t kcu_dnn_execute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, kcu_dnn_bound *b,
                              const int64_t *uid, int n, void *const *ptr, void *ws);
void kcu_dnn_unbind(kcu_dnn_bound *b);
/* The engine of cfg: its global index, numerical and behaviour notes as bits. */
cudnnStatus_t kcu_dnn_engine_of(cudnnBackendDescriptor_t cfg, int64_t *index, unsigned *notes,
                                unsigned *behavior);
/* The finalized plan of configuration cfg and the workspace it needs; the caller destroys it
 * (NULL on failure). */
cudnnStatus_t kcu_dnn_plan(cudnnHandle_t h, cudnnBackendDescriptor_t cfg,
                           cudnnBackendDescriptor_t *plan, size_t *workspace);

/* Runs of one candidate per timed graph launch: enough to hide the launch itself. */
#define KCU_TIMED_RUNS 5
/* Microseconds per run of run(ctx): run once directly, then recorded as a CUDA graph of
 * KCU_TIMED_RUNS runs (as the engine replays it) and the faster of two launches kept. Negative
 * when it failed to run or to be recorded; a failure leaves no CUDA error behind. */
float kcu_time_recorded(cudaStream_t s, cudaError_t (*run)(void *ctx, cudaStream_t s), void *ctx);

#endif
