/* A forward convolution as a cuDNN operation graph (the backend API): the convolution with its
 * bias add, residual add and ReLU as pointwise nodes of one graph where an engine fuses them,
 * else the convolution alone; engine configurations from cuDNN's heuristics, each candidate
 * plan timed at init on the engine's buffers, the fastest kept. */
#ifndef KILN_CUDA_CONV_GRAPH_H
#define KILN_CUDA_CONV_GRAPH_H

#include "cuda_dnn.h"
#include "cuda_ops.h"

#include <cudnn.h>

/* Which graphs the choice may use: every bit by default; a test narrows it to one. */
#define KCU_GRAPH_FUSED 1 /* convolution, bias, residual and ReLU in one graph */
#define KCU_GRAPH_PLAIN 2 /* the convolution alone, the epilogue kernel after it */

/* Candidate plans timed per graph. */
#define KCU_GRAPH_MAX_PLANS 8
/* Of those, plans compiled at runtime (NVRTC, 100s of ms each) per graph. */
#define KCU_GRAPH_MAX_COMPILED 1
/* Runtime compilation one engine may spend choosing all its convolutions, ms: a bound on load
 * time; past it, precompiled engines only. */
#define KCU_GRAPH_COMPILE_BUDGET_MS 4000.0
/* Variant pack slots: x, w, y, bias, residual. */
#define KCU_GRAPH_MAX_IO 5

/* The shape of one forward convolution, dims in [n, c, h, w] order whatever the layout. */
typedef struct kcu_conv_shape {
  int64_t x[4], w[4], y[4];
  int64_t pad[2], stride[2], dilation[2];
  int channels_last, has_bias, residual, relu;
  cudnnDataType_t dtype;
  int allow_tf32; /* f32 may use TF32 tensor cores */
} kcu_conv_shape;

/* The device addresses of one run. */
typedef struct kcu_conv_io {
  void *x, *w, *y, *bias, *residual;
} kcu_conv_io;

/* A choice kept for the process (cuda_choice_cache.h): the configuration at `rank` of the
 * heuristic list of `graph` (0 fused, 1 plain), still engine `engine` when rebuilt. */
typedef struct kcu_conv_choice {
  int64_t engine;
  int32_t graph, from_fallback, rank, compiled;
  float time_us;
} kcu_conv_choice;

typedef struct kcu_conv_graph {
  kcu_dnn_set kept;                  /* the chosen graph's tensors, nodes, config and plan */
  cudnnBackendDescriptor_t plan;     /* NULL until chosen */
  kcu_dnn_bound bound;               /* the plan's variant pack for the last addresses */
  int64_t uid[KCU_GRAPH_MAX_IO];
  int64_t align[KCU_GRAPH_MAX_IO]; /* the byte alignment the plan assumes of each */
  int n_io;
  int fused;          /* the chosen plan computes bias, residual and ReLU itself */
  int graphs;         /* KCU_GRAPH_* bits the choice may use */
  size_t workspace;   /* bytes the chosen plan needs */
  /* What was chosen and why, for timing reports and tests. */
  int64_t engine;     /* cuDNN's global engine index */
  int heur_rank;      /* position in its heuristic list */
  int from_fallback;  /* 1: the fallback list, 0: heuristic mode A */
  unsigned notes;     /* bit k: numerical note k of the engine */
  unsigned behavior;  /* bit k: behaviour note k */
  float time_us;      /* measured per run, epilogue kernel included when not fused */
  int timed;          /* candidate plans timed */
  int refused;        /* configurations refused for their numerics (see kcu_numerics_allowed) */
  int shared;         /* the plan is another op's of the same shape, which owns it */
  int reused;         /* chosen untimed: an earlier load in the process chose it for this key */
  /* Per graph (0 fused, 1 plain): how its build ended, configurations offered, plans built. */
  cudnnStatus_t build_status[2];
  int offered[2], built[2];
  float compile_ms;   /* spent compiling plans at runtime for this op */
} kcu_conv_graph;

/* Builds the graphs of sh, times up to KCU_GRAPH_MAX_PLANS plans of each within ws_size bytes of
 * workspace on io and keeps the fastest; runtime compilation spends from *compile_left (ms).
 * What an earlier load in the process chose for the same shape, alignments, workspace and
 * device is taken again untimed (both loads then run the same kernels).
 * CUDNN_STATUS_NOT_SUPPORTED when no plan runs. */
cudnnStatus_t kcu_conv_graph_choose(kcu_conv_graph *g, cudnnHandle_t h, cudaStream_t s,
                                    const kcu_conv_shape *sh, const kcu_conv_io *io,
                                    const kcu_tensor *out, int64_t channels, int64_t inner,
                                    void *ws, size_t ws_size, double *compile_left);
/* Takes the plan `from` chose for an op of the same shape when io's addresses are as aligned as
 * the plan assumes; 0 when they are not. The owner must outlive g. */
int kcu_conv_graph_share(kcu_conv_graph *g, const kcu_conv_graph *from, const kcu_conv_io *io);
/* Enqueues the chosen plan on io; builds a variant pack only when the addresses changed, which
 * happens while a run is recorded (at init or when caller buffers are rebound). */
cudnnStatus_t kcu_conv_graph_run(kcu_conv_graph *g, cudnnHandle_t h, const kcu_conv_io *io,
                                 void *ws);
void kcu_conv_graph_release(kcu_conv_graph *g);

#endif
