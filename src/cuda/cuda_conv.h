/* CONV and CONV_TRANSPOSE through cuDNN: a forward convolution is an operation graph of the
 * backend API (cuda_conv_graph.h) with its bias, residual and ReLU fused where an engine takes
 * them; a transposed one is the legacy API's backward-data pass. Plans and algorithms are timed
 * at init on the engine's own buffers, one shared workspace sized then; a launch enqueues the
 * convolution and, where cuDNN did not fuse it, the epilogue kernel. Nothing here allocates at
 * execute but a variant pack built while a run with new addresses is recorded.
 * A dynamic batch: an op is planned at the upper bound and at each power of two below it (its
 * pieces); a call of batch n runs the pieces of n's binary digits on consecutive rows, as batch
 * rows of a convolution are independent, so no call computes rows it does not need. */
#ifndef KILN_CUDA_CONV_H
#define KILN_CUDA_CONV_H

#include "cuda_conv_graph.h"
#include "cuda_ops.h"

#include <cudnn.h>

/* cuDNN's workspace ceiling while algorithms are measured; the kept workspace is what the
 * chosen algorithms need. */
#define KCU_CONV_FIND_WORKSPACE ((size_t)256 << 20)

typedef struct kcu_conv {
  int active;
  int transposed, channels_last, has_bias, residual, relu;
  int allow_tf32; /* the blob lets f32 run on TF32 tensor cores */
  cudnnDataType_t dtype;
  kcu_conv_shape shape; /* forward: the graph's shape */
  kcu_conv_graph graph; /* forward: the chosen execution plan */
  /* transposed: the legacy backward-data descriptors and the measured algorithm */
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  cudnnConvolutionBwdDataAlgo_t bwd;
  size_t workspace;          /* bytes the chosen plan or algorithm needs */
  int64_t channels, inner;   /* output channels; elements between two channels of one pixel */
  int64_t batch;             /* the batch its plan runs */
  /* A dynamic batch: piece j runs batch 2^j, for each 2^j below `batch` (the caller's array) */
  struct kcu_conv *pieces;
  int n_pieces;
} kcu_conv;

/* Pieces of a batch of up to 2^KCU_CONV_MAX_PIECES - 1 rows below the upper bound. */
#define KCU_CONV_MAX_PIECES 24

/* Init checks of a CONV or CONV_TRANSPOSE op that cuDNN must take (cuda_check.c calls it). */
kiln_status kcu_check_conv(const kiln_plan *p, const kiln_op *op, uint32_t i, kiln_error *err);
/* cuDNN's own version check and handle, made once per engine that has a convolution. */
kiln_status kcu_conv_handle(cudnnHandle_t *h, cudaStream_t stream, int device, kiln_error *err);
/* Descriptors of plan op i at `batch` rows (dims[0] of its plan tensors, or a piece of it);
 * allow_tf32 lets f32 run on TF32 tensor cores. */
kiln_status kcu_conv_init(kcu_conv *c, const kiln_plan *p, uint32_t i, int64_t batch,
                          int allow_tf32, kiln_error *err);
/* The pieces plan op i needs when only its batch dim follows a symbol (0 when none: a static
 * op); -1 when another of its dims follows one, which the engine cannot plan. */
int kcu_conv_piece_count(const kiln_plan *p, uint32_t i);
/* Times the candidate plans (forward) or algorithms (transposed) on the engine's buffers with up
 * to ws_size bytes of workspace at ws and keeps the fastest; a forward op of the same shape as one
 * of the n_earlier ops at earlier (chosen already) takes that one's plan instead. Compiling plans
 * at runtime spends from *compile_left, the engine's budget in ms. */
kiln_status kcu_conv_choose(kcu_conv *c, cudnnHandle_t h, cudaStream_t s, const kiln_plan *p,
                            uint32_t i, const kcu_tensor *in, const kcu_tensor *out, void *ws,
                            size_t ws_size, const kcu_conv *earlier, uint32_t n_earlier,
                            double *compile_left, kiln_error *err);
/* Whether the op, or one of its pieces, runs cuDNN's fused kernel with a residual (which reads
 * the residual before the kernel ahead of it ends). */
int kcu_conv_fused_residual(const kcu_conv *c);
/* Enqueues the op on s, the stream the handle was given: at in[0]'s batch, by pieces when that
 * is below the planned one. */
cudaError_t kcu_conv_run(kcu_conv *c, cudnnHandle_t h, cudaStream_t s, const kcu_tensor *in,
                         uint32_t n_in, const kcu_tensor *out, void *ws, size_t ws_size);
void kcu_conv_release(kcu_conv *c);

#endif
