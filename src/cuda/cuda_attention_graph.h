/* SDPA as one cuDNN operation graph (the backend API), the form cuDNN's fused attention engines
 * take: S = Q K^T in f32, S times the scale, under a causal mask a generated row and column
 * index compared and S or a large negative value selected, then the softmax as max, S - max,
 * exp, sum and exp / sum (its statistics log(sum) + max virtual), and O = P V. K enters
 * transposed by its strides; grouped-query attention gives K and V fewer heads than Q, with no
 * copy. Init builds it for each static SDPA op that fits, times the plans of cuDNN's
 * heuristics on the engine's buffers beside the op's own kernel, and keeps the faster. */
#ifndef KILN_CUDA_ATTENTION_GRAPH_H
#define KILN_CUDA_ATTENTION_GRAPH_H

#include "cuda_dnn.h"
#include "cuda_ops.h"

/* Plans of the heuristics' list timed per op. */
#define KCU_SDPA_MAX_PLANS 3
/* Variant pack slots: q, k, v, o and the scale and mask value passed by value. */
#define KCU_SDPA_IO 6

/* One SDPA as the graph takes it: element strides of [batch, head, row, column] per operand. */
typedef struct kcu_sdpa_shape {
  int64_t b, hq, hk, L, S, E, Ev;
  int64_t q_str[4], k_str[4], v_str[4], o_str[4];
  int causal;
  cudnnDataType_t dtype;
} kcu_sdpa_shape;

typedef struct kcu_sdpa_graph {
  kcu_sdpa_shape shape;          /* what the plan computes */
  int64_t align[4];              /* the byte alignment the plan assumes of q, k, v and o */
  int shared;                    /* the plan is another op's of the same shape, which owns it */
  int declined;                  /* no plan: timed slower than the op's own kernel (shape and
                                    scale kept, so ops of the same shape skip the timing) */
  kcu_dnn_set kept;              /* the graph's descriptors, its configuration and plan */
  cudnnBackendDescriptor_t plan; /* NULL: the op runs on Kiln's own kernels */
  kcu_dnn_bound bound;           /* the plan's variant pack for the last addresses */
  float scale, mask_value;       /* the by-value scalars the pack points at */
  int causal;                    /* the graph masks causally and binds the mask value */
  size_t workspace;              /* bytes the plan needs */
  int64_t engine;                /* cuDNN's global engine index */
  float time_us;                 /* measured per run */
} kcu_sdpa_graph;

/* Fills sh for an SDPA of q, k, v into o (all [B, H, rows, E] of one dtype; geo their strides)
 * when the graph may take it: f16 or bf16, no mask tensor (causal or none), head dims multiples
 * of 8 up to 256, K and V with q's batch and a head count dividing q's, and more query rows
 * than the decoding kernel takes. 0 when not. */
int kcu_sdpa_graph_shape(kcu_sdpa_shape *sh, const kcu_tensor *q, const kcu_tensor *k,
                         const kcu_tensor *v, const kcu_tensor *mask, const kcu_tensor *o,
                         const kcu_attn_geometry *geo, int causal);
/* Builds the graph of sh, times up to KCU_SDPA_MAX_PLANS plans within ws_size bytes of
 * workspace on q, k, v and o, and keeps the fastest. CUDNN_STATUS_NOT_SUPPORTED when no plan
 * runs. */
cudnnStatus_t kcu_sdpa_graph_choose(kcu_sdpa_graph *g, cudnnHandle_t h, cudaStream_t s,
                                    const kcu_sdpa_shape *sh, float scale, void *q, void *k,
                                    void *v, void *o, void *ws, size_t ws_size);
/* Takes the plan `from` chose for an SDPA of the same shape and scale when q, k, v and o are as
 * aligned as it assumes (a model's layers: one plan built and timed for all); 0 when not. The
 * owner must outlive g. */
int kcu_sdpa_graph_share(kcu_sdpa_graph *g, const kcu_sdpa_graph *from, const kcu_sdpa_shape *sh,
                         float scale, void *q, void *k, void *v, void *o);
/* Enqueues the chosen plan; builds a variant pack only when the addresses changed, which
 * happens while a run is recorded (at init or when caller buffers are rebound). */
cudnnStatus_t kcu_sdpa_graph_run(kcu_sdpa_graph *g, cudnnHandle_t h, void *q, void *k, void *v,
                                 void *o, void *ws);
void kcu_sdpa_graph_release(kcu_sdpa_graph *g);

#endif
