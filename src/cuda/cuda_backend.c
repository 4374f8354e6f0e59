/* The CUDA engine: init uploads weights, allocates the arena, staging buffers and cuBLASLt
 * workspace, picks matmul algorithms and captures the plan as CUDA graphs; execute places
 * each caller buffer, replays a graph and synchronizes, allocating nothing.
 *
 * Graphs: graph_host is captured once with engine-owned device buffers for every input and
 * output. When all of the I/O is small (KCU_WHOLE_IO_BYTES each way), the copies from and to
 * the pinned ring are inside it, as kernels reading and writing the ring through its device
 * mapping (cuda_io_copy.cu), so a small call on host tensors is one replay; larger host
 * buffers move through the ring in chunks (cuda_staging.c, copied by the staging threads)
 * around a replay of the ops alone. Pinned caller memory skips the ring: one DMA each way.
 * graph_dev holds the same ops without host copies; when a caller passes device buffers,
 * which are bound in place, their addresses differ from the ones captured, so the op sequence
 * is re-captured and applied to graph_dev with cudaGraphExecUpdate (the driver keeps the
 * recording; no engine buffer is allocated), and reused for as long as the addresses repeat.
 * Every run ends with one kernel that reads the fault words out and clears them.
 *
 * A dynamic plan runs each call at its own sizes (the front end's per-call tensors and ops) on
 * memory sized at init for the bounds, through per-shape graph slots: see kcu_run_shape. */
#include "cuda_backend.h"

#include "runtime/engine_internal.h"
#include "runtime/branches.h"
#include "cuda_attention_gemm.h"
#include "cuda_attention_graph.h"
#include "runtime/symbolic.h"
#include "runtime/view.h"
#include "runtime/vision_shape.h"
#include "cuda_check.h"
#include "cuda_conv.h"
#include "cuda_fused_group.h"
#include "cuda_gemm.h"
#include "cuda_ops.h"
#include "cuda_staging.h"

#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KCU_WORKSPACE_BYTES ((size_t)32 << 20)
#define KCU_BIND_ALIGN 256u
#define KCU_MIN_CC 80
/* Host I/O up to this much each way rides inside graph_host: one replay, no chunk calls. */
#define KCU_WHOLE_IO_BYTES ((size_t)512 << 10)
/* The fault area: an index outside its dim in a gather, one in a state write (which wrote
 * nothing), then that write's position and length as two long longs. */
#define KCU_FAULT_BYTES 32u
#define KCU_FAULT_GATHER 0
#define KCU_FAULT_WRITE 1
#define KCU_FAULT_WHERE 2 /* in ints: bytes 8..23 */
/* A dynamic plan's graphs: this many captured shapes, and this many shapes remembered as seen
 * once without a graph. */
#define KCU_SHAPE_GRAPHS 6
#define KCU_SHAPES_SEEN 8

/* HOST: pageable, through the ring; BOUND: used in place (device memory the device can reach,
 * 256-byte aligned); DEVSTAGE (pinned host memory, or an unaligned device buffer): one
 * cudaMemcpyAsync to or from the engine's buffer. */
typedef enum kcu_mode { KCU_HOST, KCU_BOUND, KCU_DEVSTAGE } kcu_mode;

/* A FUSED op's kernel compiled at load and the run length it was compiled for. */
typedef struct kcu_fx_kernel {
  cudaKernel_t kernel;
  int32_t run;
} kcu_fx_kernel;

typedef struct kcu_io {
  uint32_t tensor;
  size_t nbytes;
  void *dev;       /* device staging */
  size_t ring_off; /* where it lies in the pinned ring when graph_host holds the copies */
  const char *name;
} kcu_io;

/* One call shape of a dynamic plan: its symbol values, and whether its host copies ride inside
 * the graph (host-staged small I/O) or it runs on the addresses in place. */
typedef struct kcu_shape_key {
  int64_t values[KILN_MAX_SYMBOLS];
  int whole;
} kcu_shape_key;

typedef struct kcu_shape_slot {
  kcu_shape_key key;
  cudaGraphExec_t exec; /* NULL: free (a graph slot) */
  void **in, **out;     /* the caller addresses the graph was recorded with */
  uint64_t used;        /* when last run, for least-recently-used eviction; 0: empty */
} kcu_shape_slot;

typedef CUresult (*kcu_ptr_attr_fn)(void *data, CUpointer_attribute attr, CUdeviceptr ptr);

/* A decode step's cache writes the decoding attention does (kcu_fold_cache_writes): an SDPA's
 * entry holds 1 + the INDEX_COPY op writing its k cache (op[0]) and its v cache (op[1]), 0 for
 * none; such an INDEX_COPY's op[0] is -1 (it launches nothing); others 0. */
typedef struct kcu_append_link {
  int32_t op[2];
} kcu_append_link;

typedef struct kcu_state {
  int device;
  cudaStream_t stream;
  cublasLtHandle_t lt;
  void *weights, *arena, *workspace;
  size_t workspace_size;
  int *fault_dev, *fault_host; /* KCU_FAULT_BYTES: see the KCU_FAULT_* slots */
  int *fault_mapped;           /* fault_host as the device addresses it */
  void **state;      /* n_states device buffers kept across executes, outside the arena */
  uint32_t n_states;
  void *ring;        /* pinned host staging, sized at init */
  void *ring_dev;    /* the ring as the device addresses it (graph_host's copy kernels) */
  kcu_staging staging;
  kiln_stage_pool *pool; /* the staging threads, started at init */
  int whole_io;      /* all I/O fits the ring at once: graph_host holds the host copies */
  uint32_t n_in, n_out;
  kcu_io *in, *out;
  kcu_gemm *gemm; /* one per op; used by LINEAR and MATMUL */
  kcu_attn_gemm *attn; /* one per op; used by SDPA */
  kcu_sdpa_graph *sdpa; /* one per op; an SDPA init gave to cuDNN's fused attention has a plan */
  void *sdpa_ws;       /* one workspace for every such SDPA, sized for the chosen plans */
  cudnnHandle_t dnn;   /* made for a plan with a convolution or an SDPA cuDNN may take */
  kcu_conv *conv;      /* one per op; used by CONV and CONV_TRANSPOSE */
  kcu_conv *conv_pieces; /* a dynamic batch's pieces, conv_piece_stride an op */
  int conv_piece_stride;
  void *conv_ws;       /* one workspace for every convolution, sized for the chosen algorithms */
  size_t conv_ws_size;
  kcu_fx_jit *fx_jit;  /* the FUSED kernels compiled at load (static plans) */
  kcu_fx_kernel *fx;   /* one per op; used by FUSED: its compiled kernel, or none */
  int32_t *norm_link;  /* one per op (static plans): a LINEAR whose one-row GEMV computes the norm
                        * ahead of it holds 1 + that norm's index; the norm, -1 (it launches
                        * nothing); others 0. See kcu_fold_norms. */
  int32_t *norm_after; /* one per op (static plans): a LINEAR whose one-row GEMV's last block
                        * computes the norm of its output holds 1 + that norm's index (the norm's
                        * norm_link is -1); others 0. See kcu_fold_norms_after. */
  unsigned *norm_arrivals; /* device: one count an op, for norm_after's GEMVs */
  kcu_append_link *append; /* one per op (static plans), or NULL; see kcu_fold_cache_writes */
  int32_t *beside;     /* one per op (static plans), or NULL: an op run beside the chain holds 1 +
                        * the first op on the chain that reads its result; others 0. See
                        * kcu_plan_beside. */
  int32_t *join;       /* with beside: one per op, 1 + the op beside whose end it waits for
                        * before it starts, else 0 (kiln_branch_joins) */
  cudaStream_t beside_stream; /* the branch those ops run on */
  cudaEvent_t fork, *beside_done; /* the chain's point a branch op starts from; one an op, when
                                   * it ends */
  void *attn_scratch;  /* scores of the SDPA op (or SwiGLU's gate and up) being run */
  size_t attn_scratch_bytes;
  kcu_dec_scratch dec; /* the decoding kernel's: attn_scratch and its arrival counts */
  cudaGraphExec_t graph_host, graph_dev;
  void **dev_in, **dev_out;   /* caller addresses graph_dev was last updated with */
  void **run_in, **run_out;   /* addresses of the run in progress */
  kcu_mode *in_mode, *out_mode;
  kcu_ptr_attr_fn ptr_attr;   /* the driver's cuPointerGetAttribute, when available */
  int dynamic;                /* the plan has symbols: per-shape graphs, no graph_host/dev */
  kcu_shape_slot graphs[KCU_SHAPE_GRAPHS], seen[KCU_SHAPES_SEEN];
  void **slot_addr;           /* every graph slot's in and out address arrays, one block */
  uint64_t clock;             /* ticks once per dynamic run */
  kiln_cuda_stats stats;
} kcu_state;

/* ---------------------------------------------------------------- allocation (init only) */

static long kcu_fail_after = -1;

void kiln_cuda_fail_allocations_after(long n) { kcu_fail_after = n; }

/* 1 when the test hook says this allocation must fail. */
static int kcu_injected(void) {
  if (kcu_fail_after < 0) return 0;
  if (kcu_fail_after == 0) return 1;
  kcu_fail_after--;
  return 0;
}

static kiln_status kcu_oom(kcu_state *s, size_t n, const char *what, kiln_error *err) {
  size_t free_b = 0, total_b = 0;
  cudaGetLastError();
  cudaMemGetInfo(&free_b, &total_b);
  return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                   "out of memory on cuda:%d: %llu bytes for the %.24s could not be allocated "
                   "(%llu of %llu bytes free); free device memory or load fewer programs",
                   s->device, (unsigned long long)n, what, (unsigned long long)free_b,
                   (unsigned long long)total_b);
}

static kiln_status kcu_dev_alloc(kcu_state *s, void **p, size_t n, const char *what,
                                 kiln_error *err) {
  *p = NULL;
  if (n == 0) return KILN_OK;
  if (kcu_injected() || cudaMalloc(p, n) != cudaSuccess) {
    *p = NULL;
    return kcu_oom(s, n, what, err);
  }
  s->stats.init_allocs++;
  return KILN_OK;
}

static kiln_status kcu_pinned_alloc(kcu_state *s, void **p, size_t n, const char *what,
                                    kiln_error *err) {
  *p = NULL;
  if (n == 0) return KILN_OK;
  if (kcu_injected() || cudaMallocHost(p, n) != cudaSuccess) {
    *p = NULL;
    cudaGetLastError();
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of pinned host memory: %llu bytes for the %.24s of cuda:%d could not "
                     "be allocated; free host memory or load fewer programs",
                     (unsigned long long)n, what, s->device);
  }
  s->stats.init_allocs++;
  return KILN_OK;
}

static void *kcu_calloc(kcu_state *s, size_t count, size_t size) {
  if (kcu_injected()) return NULL;
  void *p = calloc(count ? count : 1, size);
  if (p) s->stats.init_allocs++;
  return p;
}

/* ---------------------------------------------------------------- recording the plan */

static void *kcu_tensor_addr(const kcu_state *s, const kiln_tensor_desc *t, void *const *in,
                             void *const *out) {
  switch (t->storage) {
  case KILN_STORE_ARENA: return (char *)s->arena + t->offset;
  case KILN_STORE_WEIGHT: return (char *)s->weights + t->offset;
  case KILN_STORE_INPUT: return in[t->io_index];
  case KILN_STORE_STATE: return s->state[t->io_index];
  default: return out[t->io_index];
  }
}

static kcu_tensor kcu_resolve(const kcu_state *s, const kiln_plan *p, uint32_t index,
                              void *const *in, void *const *out) {
  kcu_tensor r = kcu_tensor_shape(&p->tensors[index]);
  r.data = kcu_tensor_addr(s, &p->tensors[index], in, out);
  return r;
}

/* Whether op j is a view the memory plan placed on its input's bytes: it launches nothing. */
static int kcu_in_place_view(const kcu_state *s, const kiln_plan *p, uint32_t j,
                             void *const *in_addr, void *const *out_addr) {
  const kiln_op *op = &p->ops[j];
  uint64_t at;
  if (op->n_inputs == 0 || !kiln_op_is_view(op, &p->tensors[op->inputs[0]], &at)) return 0;
  kcu_tensor in = kcu_resolve(s, p, op->inputs[0], in_addr, out_addr);
  kcu_tensor out = kcu_resolve(s, p, op->output, in_addr, out_addr);
  return (const char *)out.data == (const char *)in.data + at;
}

/* Whether conv op i is a cuDNN fused convolution whose residual r the last kernel ahead of it
 * wrote. cuDNN's fused kernel reads its residual before it waits for the kernel ahead (on the
 * H200, cuDNN 9: read stale when that kernel let it launch early), so a fence goes between. */
static int kcu_residual_just_written(const kcu_state *s, const kiln_plan *p, uint32_t i,
                                     const kcu_tensor *r, void *const *in_addr,
                                     void *const *out_addr) {
  if (!kcu_conv_fused_residual(&s->conv[i])) return 0;
  const char *r0 = (const char *)r->data, *r1 = r0 + (size_t)r->numel * kiln_dtype_size(r->dtype);
  for (uint32_t j = i; j-- > 0;) {
    kcu_tensor w = kcu_resolve(s, p, p->ops[j].output, in_addr, out_addr);
    const char *w0 = (const char *)w.data, *w1 = w0 + (size_t)w.numel * kiln_dtype_size(w.dtype);
    if (w0 < r1 && r0 < w1) return 1;
    if (!kcu_in_place_view(s, p, j, in_addr, out_addr) && !(s->beside && s->beside[j])) return 0;
  }
  return 0;
}

/* Norm op j as a GEMV computes it (kcu_fold_norms, kcu_fold_norms_after): its weights, and with
 * arrivals (of the output row) its output; *x: its input. */
static kcu_gemv_norm kcu_norm_of(const kcu_state *s, const kiln_plan *p, int32_t j,
                                 void *const *in_addr, void *const *out_addr, kcu_tensor *x,
                                 unsigned *arrivals) {
  const kiln_op *norm = &p->ops[j];
  kcu_tensor nin[3];
  for (uint32_t k = 0; k < norm->n_inputs && k < 3; k++)
    nin[k] = kcu_resolve(s, p, norm->inputs[k], in_addr, out_addr);
  kcu_gemv_norm nrm = {(norm->iattr[1] & 1) ? nin[1].data : NULL,
                       (norm->iattr[1] & 2) ? nin[norm->n_inputs - 1].data : NULL,
                       (float)norm->fattr[0], norm->kind == KILN_OP_RMS_NORM, NULL, arrivals};
  if (arrivals) nrm.out = kcu_resolve(s, p, norm->output, in_addr, out_addr).data;
  *x = nin[0];
  return nrm;
}

static cudaError_t kcu_run_op(kcu_state *s, const kiln_plan *p, uint32_t i, cudaStream_t st,
                              void *const *in_addr, void *const *out_addr) {
  const kiln_op *op = &p->ops[i];
  kcu_tensor in[KILN_MAX_OP_INPUTS];
  for (uint32_t k = 0; k < op->n_inputs; k++) in[k] = kcu_resolve(s, p, op->inputs[k], in_addr, out_addr);
  kcu_tensor out = kcu_resolve(s, p, op->output, in_addr, out_addr);
  switch (op->kind) {
  case KILN_OP_LINEAR:
  case KILN_OP_MATMUL:
    if (s->norm_link && s->norm_link[i] > 0) { /* x is the norm's input; the GEMV normalizes it */
      kcu_tensor x;
      kcu_gemv_norm nrm = kcu_norm_of(s, p, s->norm_link[i] - 1, in_addr, out_addr, &x, NULL);
      in[0] = x;
      return kcu_gemm_run(&s->gemm[i], s->lt, st, in, op->n_inputs, &out, s->workspace,
                          s->workspace_size, &nrm);
    }
    if (s->norm_after && s->norm_after[i] > 0) { /* its last block normalizes its output */
      kcu_tensor x;
      kcu_gemv_norm nrm = kcu_norm_of(s, p, s->norm_after[i] - 1, in_addr, out_addr, &x,
                                      s->norm_arrivals + i);
      return kcu_gemm_run(&s->gemm[i], s->lt, st, in, op->n_inputs, &out, s->workspace,
                          s->workspace_size, &nrm);
    }
    return kcu_gemm_run(&s->gemm[i], s->lt, st, in, op->n_inputs, &out, s->workspace,
                        s->workspace_size, NULL);
  case KILN_OP_CONV: case KILN_OP_CONV_TRANSPOSE: {
    cudaError_t rc = cudaSuccess;
    if (kcu_residual_just_written(s, p, i, &in[op->n_inputs - 1], in_addr, out_addr))
      rc = kcu_fence(st);
    if (rc != cudaSuccess) return rc;
    return kcu_conv_run(&s->conv[i], s->dnn, st, in, op->n_inputs, &out, s->conv_ws,
                        s->conv_ws_size);
  }
  case KILN_OP_ADD: case KILN_OP_SUB: case KILN_OP_MUL: case KILN_OP_DIV:
  case KILN_OP_MINIMUM: case KILN_OP_MAXIMUM:
    return kcu_binary(st, op->kind, &in[0], &in[1], &out, (float)op->fattr[0]);
  case KILN_OP_COMPARE:
    return kcu_compare(st, (kiln_compare)op->iattr[0], &in[0], &in[1], &out);
  case KILN_OP_LOGICAL: case KILN_OP_BITWISE:
    return kcu_bool_op(st, op->kind, (kiln_bool_op)op->iattr[0], in, op->n_inputs, &out);
  case KILN_OP_GELU:
    return kcu_unary(st, op->kind, &in[0], &out, op->n_iattr > 0 && op->iattr[0] ? 1.0f : 0.0f);
  case KILN_OP_RELU: case KILN_OP_SILU: case KILN_OP_SIGMOID: case KILN_OP_TANH:
  case KILN_OP_EXP: case KILN_OP_SQRT: case KILN_OP_RSQRT: case KILN_OP_NEG: case KILN_OP_POW:
  case KILN_OP_ABS: case KILN_OP_LOG: case KILN_OP_COS: case KILN_OP_SIN: case KILN_OP_ERF:
  case KILN_OP_HARDSWISH: case KILN_OP_HARDSIGMOID: case KILN_OP_CAST:
    return kcu_unary(st, op->kind, &in[0], &out, (float)op->fattr[0]);
  case KILN_OP_SOFTMAX: case KILN_OP_LOG_SOFTMAX:
    return kcu_softmax(st, &in[0], &out, (int32_t)op->iattr[0], op->kind == KILN_OP_LOG_SOFTMAX);
  case KILN_OP_LAYER_NORM: case KILN_OP_RMS_NORM:
    if (s->norm_link && s->norm_link[i] < 0) return cudaSuccess; /* its GEMVs compute it */
    return kcu_norm(st, op, in, &out);
  case KILN_OP_SUM: case KILN_OP_MEAN: case KILN_OP_AMAX:
    return kcu_reduce(st, op->kind, &in[0], &out, (uint32_t)op->iattr[0]);
  case KILN_OP_EMBEDDING:
    return kcu_embedding(st, &in[0], &in[1], &out, s->fault_dev);
  case KILN_OP_INDEX_SELECT:
    return kcu_index_select(st, &in[0], &in[1], &out, (int32_t)op->iattr[0], s->fault_dev);
  case KILN_OP_WHERE:
    return kcu_where(st, &in[0], &in[1], &in[2], &out);
  case KILN_OP_SDPA: {
    kcu_tensor q, k, v, o;
    const kcu_tensor *mask;
    kcu_attn_geometry geo;
    int strided = kcu_sdpa_operands(op, in, &out, &q, &k, &v, &mask, &o, &geo);
    float scale = (float)op->fattr[0];
    if (scale == 0.0f) scale = 1.0f / sqrtf((float)q.dims[q.rank - 1]);
    int causal = op->n_iattr > 0 && op->iattr[0] != 0;
    if (s->append && (s->append[i].op[0] > 0 || s->append[i].op[1] > 0)) {
      kcu_kv_append app;
      memset(&app, 0, sizeof app);
      for (int c = 0; c < 2; c++) {
        if (s->append[i].op[c] <= 0) continue;
        const kiln_op *w = &p->ops[s->append[i].op[c] - 1];
        kcu_tensor idx = kcu_resolve(s, p, w->inputs[1], in_addr, out_addr);
        app.rows[c] = kcu_resolve(s, p, w->inputs[2], in_addr, out_addr).data;
        app.idx[c] = idx.data;
        app.didx[c] = idx.dtype;
      }
      app.fault = s->fault_dev + KCU_FAULT_WRITE;
      app.bad = (long long *)(void *)(s->fault_dev + KCU_FAULT_WHERE);
      return kcu_attention(st, &q, &k, &v, mask, &o, causal, scale, strided ? &geo : NULL,
                           &s->dec, &app);
    }
    /* cuDNN's fused attention where init measured it faster (kcu_choose_attention). */
    if (s->sdpa && s->sdpa[i].plan)
      return kcu_sdpa_graph_run(&s->sdpa[i], s->dnn, q.data, k.data, v.data, o.data, s->sdpa_ws) ==
                     CUDNN_STATUS_SUCCESS
                 ? cudaSuccess
                 : cudaErrorUnknown;
    /* The flash kernel wherever it takes the shape. Init chose it from plan offsets, so here
     * it can fail only on an address not 16-byte aligned; such an op has no score buffer and
     * runs on the fused kernel, as the strided heads the matmuls cannot take (packed heads,
     * heads last) do. */
    if (kcu_flash_fits(&q, &k, &v, mask, &o))
      return kcu_flash_attention(st, &q, &k, &v, mask, &o, causal, scale, strided ? &geo : NULL);
    if (s->attn[i].active)
      return kcu_attn_gemm_run(&s->attn[i], s->lt, st, in, mask, &out, causal, scale,
                               s->attn_scratch, s->workspace, s->workspace_size);
    return kcu_attention(st, &q, &k, &v, mask, &o, causal, scale, strided ? &geo : NULL,
                         s->dec.part ? &s->dec : NULL, NULL);
  }
  case KILN_OP_POINTWISE:
    return kcu_fused_pointwise(st, op, in, &out);
  case KILN_OP_BATCH_NORM:
    return kcu_batch_norm(st, op, in, &out);
  case KILN_OP_MAX_POOL2D: case KILN_OP_AVG_POOL2D: case KILN_OP_ADAPTIVE_AVG_POOL2D:
  case KILN_OP_UPSAMPLE_NEAREST2D: case KILN_OP_UPSAMPLE_BILINEAR2D: {
    const kiln_tensor_desc *x = &p->tensors[op->inputs[0]];
    kiln_planes d;
    kiln_window win;
    kiln_planes_of(op, x, &p->tensors[op->output], &d);
    kiln_window_of(op, &x, &win);
    if (op->kind == KILN_OP_UPSAMPLE_NEAREST2D || op->kind == KILN_OP_UPSAMPLE_BILINEAR2D)
      return kcu_resize(st, op, &d, &in[0], &out);
    return kcu_pool(st, op, &win, &d, &in[0], &out);
  }
  case KILN_OP_FUSED:
    if (s->fx && s->fx[i].kernel)
      return kcu_fx_jit_launch(st, s->fx[i].kernel, s->fx[i].run, in, op->n_inputs, out.data,
                               out.numel);
    return kcu_fused(st, p, op, in, &out);
  case KILN_OP_CUMSUM:
    return kcu_cumsum(st, &in[0], &out, (int32_t)op->iattr[0]);
  case KILN_OP_ARGMAX:
    return kcu_argmax(st, &in[0], &out, (int32_t)op->iattr[0]);
  case KILN_OP_GATHER:
    return kcu_gather_dim(st, &in[0], &in[1], &out, (int32_t)op->iattr[0], s->fault_dev);
  case KILN_OP_INDEX_COPY:
    if (s->append && s->append[i].op[0] < 0) return cudaSuccess; /* its attention writes it */
    return kcu_index_copy(st, &in[0], &in[1], &in[2], &out, (int32_t)op->iattr[0],
                          s->fault_dev + KCU_FAULT_WRITE,
                          (long long *)(void *)(s->fault_dev + KCU_FAULT_WHERE));
  case KILN_OP_INDEX: {
    const kiln_tensor_desc *idx[KILN_MAX_OP_INPUTS];
    kiln_index_layout lay;
    uint32_t where;
    for (uint32_t k = 1; k < op->n_inputs; k++) idx[k - 1] = &p->tensors[op->inputs[k]];
    kiln_index_layout_of(&p->tensors[op->inputs[0]], idx, op->n_inputs - 1, op->iattr[0], &lay,
                         &where); /* cuda_check.c refused a plan where it does not hold */
    return kcu_advanced_index(st, &in[0], &in[1], &out, &lay, s->fault_dev);
  }
  default:
    /* A view the memory plan placed on its input's bytes: nothing to move (in a dynamic plan
     * its offset is the same at every size, see kcu_check_dynamic_op). */
    if (kcu_in_place_view(s, p, i, in_addr, out_addr)) return cudaSuccess;
    return kcu_layout(st, op, in, op->n_inputs, &out);
  }
}

/* Adds one copy to c, enqueuing the batch first when it is full. */
static cudaError_t kcu_add_copy(kcu_state *s, kcu_io_copies *c, const void *src, void *dst,
                                size_t n) {
  cudaError_t rc = cudaSuccess;
  if (n == 0) return rc;
  if (c->n == KCU_IO_COPIES) {
    rc = kcu_io_copy(s->stream, c);
    c->n = 0;
  }
  c->src[c->n] = src;
  c->dst[c->n] = dst;
  c->bytes[c->n++] = n;
  return rc;
}

/* Enqueues the ops: each on the chain (the engine's stream), or beside it (kcu_plan_beside):
 * forked from the chain where it stands in the plan, and joined into the chain where
 * kiln_branch_joins put the joins. A join waits for every op launched beside so far (the branch
 * is one stream): a kernel joined to the branch is not launched early, and the fewer such
 * kernels the better (a decode step's rotary group joins both its position copy and the
 * attention's mask compare; the attention keeps its early launch). */
static cudaError_t kcu_run_ops(kcu_state *s, const kiln_plan *p, void *const *in_addr,
                               void *const *out_addr) {
  cudaError_t rc = cudaSuccess;
  for (uint32_t i = 0; rc == cudaSuccess && i < p->n_ops; i++) {
    if (s->join && s->join[i])
      rc = cudaStreamWaitEvent(s->stream, s->beside_done[s->join[i] - 1], 0);
    if (rc != cudaSuccess) break;
    if (!s->beside || !s->beside[i]) {
      rc = kcu_run_op(s, p, i, s->stream, in_addr, out_addr);
      continue;
    }
    rc = cudaEventRecord(s->fork, s->stream);
    if (rc == cudaSuccess) rc = cudaStreamWaitEvent(s->beside_stream, s->fork, 0);
    if (rc == cudaSuccess) rc = kcu_run_op(s, p, i, s->beside_stream, in_addr, out_addr);
    if (rc == cudaSuccess) rc = cudaEventRecord(s->beside_done[i], s->beside_stream);
  }
  return rc;
}

/* Enqueues one run: optionally the inputs in from the pinned ring (one kernel), every op, then
 * one kernel that copies the outputs out to the ring (optionally) and the fault words to the
 * host, clearing them for the next run. */
static cudaError_t kcu_enqueue(kcu_state *s, const kiln_plan *p, void *const *in_addr,
                               void *const *out_addr, int host_copies) {
  kcu_io_copies c;
  memset(&c, 0, sizeof c);
  cudaError_t rc = cudaSuccess;
  for (uint32_t i = 0; rc == cudaSuccess && host_copies && i < s->n_in; i++)
    rc = kcu_add_copy(s, &c, (char *)s->ring_dev + s->in[i].ring_off, s->in[i].dev,
                      (size_t)p->tensors[s->in[i].tensor].nbytes);
  if (rc == cudaSuccess && c.n) rc = kcu_io_copy(s->stream, &c);
  c.n = 0;
  if (rc == cudaSuccess) rc = kcu_run_ops(s, p, in_addr, out_addr);
  for (uint32_t i = 0; rc == cudaSuccess && host_copies && i < s->n_out; i++)
    rc = kcu_add_copy(s, &c, s->out[i].dev, (char *)s->ring_dev + s->out[i].ring_off,
                      (size_t)p->tensors[s->out[i].tensor].nbytes);
  c.flags = s->fault_dev;
  c.flags_out = s->fault_mapped;
  c.flag_words = (int)(KCU_FAULT_BYTES / sizeof(int));
  if (rc == cudaSuccess) rc = kcu_io_copy(s->stream, &c);
  return rc;
}

static cudaError_t kcu_capture(kcu_state *s, const kiln_plan *p, void *const *in_addr,
                               void *const *out_addr, int host_copies, cudaGraph_t *graph) {
  *graph = NULL;
  cudaError_t rc = cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal);
  if (rc != cudaSuccess) return rc;
  rc = kcu_enqueue(s, p, in_addr, out_addr, host_copies);
  cudaError_t end = cudaStreamEndCapture(s->stream, graph);
  if (rc == cudaSuccess) rc = end;
  if (rc != cudaSuccess && *graph) {
    cudaGraphDestroy(*graph);
    *graph = NULL;
  }
  return rc;
}

/* ---------------------------------------------------------------- per-shape runs (dynamic plans) */

/* Sets the ops whose CUDA setup follows the sizes to this call's (p: the call's tensors and
 * ops): each op checked again at these sizes (cheap, host only), each GEMM's layouts and
 * algorithm. Runs before an eager run or a capture, never for a replay. */
static kiln_status kcu_prepare_shape(kcu_state *s, const kiln_plan *p, kiln_error *err) {
  for (uint32_t i = 0; i < p->n_ops; i++) {
    kiln_op_kind k = p->ops[i].kind;
    kiln_status st = kcu_check_op(p, i, err);
    if (st != KILN_OK) return st;
    if (k != KILN_OP_LINEAR && k != KILN_OP_MATMUL) continue;
    if (kcu_gemm_reshape(&s->gemm[i], s->lt, p, i) != cudaSuccess)
      return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                       "op %u (%.16s): cuBLASLt has no algorithm for this call's sizes "
                       "(%lldx%lldx%lld); pass other sizes or run on the CPU reference engine",
                       i, kiln_op_name(k), (long long)s->gemm[i].M, (long long)s->gemm[i].N,
                       (long long)s->gemm[i].K);
  }
  return KILN_OK;
}

static int kcu_key_same(const kcu_shape_key *a, const kcu_shape_key *b, uint32_t n_symbols) {
  if (a->whole != b->whole) return 0;
  for (uint32_t k = 0; k < n_symbols; k++)
    if (a->values[k] != b->values[k]) return 0;
  return 1;
}

/* The slot of `table` holding key, or NULL. */
static kcu_shape_slot *kcu_find_shape(kcu_shape_slot *table, int n, const kcu_shape_key *key,
                                      uint32_t n_symbols) {
  for (int i = 0; i < n; i++)
    if (table[i].used && kcu_key_same(&table[i].key, key, n_symbols)) return &table[i];
  return NULL;
}

/* An empty slot of table, else the least recently used. */
static kcu_shape_slot *kcu_victim(kcu_shape_slot *table, int n) {
  kcu_shape_slot *v = &table[0];
  for (int i = 0; i < n; i++) {
    if (!table[i].used) return &table[i];
    if (table[i].used < v->used) v = &table[i];
  }
  return v;
}

static int kcu_slot_addresses_same(const kcu_state *s, const kcu_shape_slot *g) {
  for (uint32_t i = 0; i < s->n_in; i++)
    if (g->in[i] != s->run_in[i]) return 0;
  for (uint32_t i = 0; i < s->n_out; i++)
    if (g->out[i] != s->run_out[i]) return 0;
  return 1;
}

/* Records the ops at the run's addresses into slot g: onto its graph with cudaGraphExecUpdate
 * where the recording fits (no new executable), else into a new one. 0 when neither worked. */
static int kcu_record_slot(kcu_state *s, const kiln_plan *p, kcu_shape_slot *g, int whole) {
  cudaGraph_t graph;
  if (kcu_capture(s, p, s->run_in, s->run_out, whole, &graph) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  int ok = 0;
  if (g->exec) {
    cudaGraphExecUpdateResultInfo info;
    ok = cudaGraphExecUpdate(g->exec, graph, &info) == cudaSuccess;
    if (!ok) {
      cudaGraphExecDestroy(g->exec);
      g->exec = NULL;
    }
  }
  if (!ok) ok = cudaGraphInstantiate(&g->exec, graph, 0) == cudaSuccess;
  if (!ok) g->exec = NULL;
  cudaGraphDestroy(graph);
  cudaGetLastError();
  if (ok) {
    memcpy(g->in, s->run_in, s->n_in * sizeof(void *));
    memcpy(g->out, s->run_out, s->n_out * sizeof(void *));
  }
  return ok;
}

/* Runs a dynamic plan's ops at this call's sizes (p) on the addresses in run_in/run_out, with
 * the host copies inside when whole. Graph slots, keyed by the symbol values and whole:
 * - a key a slot holds replays its graph (re-recorded onto it if bound addresses moved);
 * - a key seen once before (the small `seen` table) is captured into an empty slot or the least
 *   recently used one, whose executable is updated in place where the recording fits;
 * - any other key runs eagerly, op by op on the stream (kernel launches only), and is noted as
 *   seen. So a decode loop at one size replays a graph from its second step, and a one-off
 *   prefill length costs no capture. Nothing of the engine's is allocated here: GEMM setup is
 *   redone in g's own storage, graphs reuse the slots made at init. */
static kiln_status kcu_run_shape(kcu_state *s, const kiln_engine *e, const kiln_plan *p,
                                 int whole, cudaError_t *rc, kiln_error *err) {
  kcu_shape_key key;
  memset(&key, 0, sizeof key);
  key.whole = whole;
  for (uint32_t k = 0; k < e->plan.n_symbols; k++) key.values[k] = e->sym_values[k];
  s->clock++;
  kcu_shape_slot *g = kcu_find_shape(s->graphs, KCU_SHAPE_GRAPHS, &key, e->plan.n_symbols);
  kiln_status st;
  if (g && g->exec) {
    g->used = s->clock;
    if (!kcu_slot_addresses_same(s, g)) {
      if ((st = kcu_prepare_shape(s, p, err)) != KILN_OK) return st;
      if (!kcu_record_slot(s, p, g, whole)) {
        g->used = 0; /* the slot is free again; this call runs eagerly */
        s->stats.direct_runs++;
        *rc = kcu_enqueue(s, p, s->run_in, s->run_out, whole);
        return KILN_OK;
      }
      s->stats.graph_updates++;
    }
    s->stats.graph_replays++;
    *rc = cudaGraphLaunch(g->exec, s->stream);
    return KILN_OK;
  }
  if ((st = kcu_prepare_shape(s, p, err)) != KILN_OK) return st;
  kcu_shape_slot *seen = kcu_find_shape(s->seen, KCU_SHAPES_SEEN, &key, e->plan.n_symbols);
  if (seen) {
    g = kcu_victim(s->graphs, KCU_SHAPE_GRAPHS);
    if (g->used) s->stats.shape_evictions++;
    g->key = key;
    g->used = s->clock;
    seen->used = 0;
    if (kcu_record_slot(s, p, g, whole)) {
      s->stats.shape_captures++;
      s->stats.graph_replays++;
      *rc = cudaGraphLaunch(g->exec, s->stream);
      return KILN_OK;
    }
    g->used = 0;
  } else {
    seen = kcu_victim(s->seen, KCU_SHAPES_SEEN);
    seen->key = key;
    seen->used = s->clock;
  }
  s->stats.direct_runs++;
  *rc = kcu_enqueue(s, p, s->run_in, s->run_out, whole);
  return KILN_OK;
}

/* ---------------------------------------------------------------- destroy and init */

static void kcu_destroy(kiln_engine *e) {
  kcu_state *s = (kcu_state *)e->impl;
  if (!s) return;
  cudaSetDevice(s->device);
  if (s->stream) cudaStreamSynchronize(s->stream);
  if (s->graph_host) cudaGraphExecDestroy(s->graph_host);
  if (s->graph_dev) cudaGraphExecDestroy(s->graph_dev);
  for (int i = 0; i < KCU_SHAPE_GRAPHS; i++)
    if (s->graphs[i].exec) cudaGraphExecDestroy(s->graphs[i].exec);
  free(s->slot_addr);
  for (uint32_t i = 0; s->gemm && i < e->plan.n_ops; i++) kcu_gemm_release(&s->gemm[i]);
  for (uint32_t i = 0; s->attn && i < e->plan.n_ops; i++) kcu_attn_gemm_release(&s->attn[i]);
  for (uint32_t i = 0; s->conv && i < e->plan.n_ops; i++) kcu_conv_release(&s->conv[i]);
  for (uint32_t i = 0; s->sdpa && i < e->plan.n_ops; i++) kcu_sdpa_graph_release(&s->sdpa[i]);
  if (s->dnn) cudnnDestroy(s->dnn);
  cudaFree(s->conv_ws);
  cudaFree(s->sdpa_ws);
  kcu_fx_jit_free(s->fx_jit);
  free(s->fx);
  free(s->norm_link);
  free(s->norm_after);
  cudaFree(s->norm_arrivals);
  free(s->append);
  for (uint32_t i = 0; s->beside_done && i < e->plan.n_ops; i++)
    if (s->beside_done[i]) cudaEventDestroy(s->beside_done[i]);
  free(s->beside_done);
  free(s->beside);
  free(s->join);
  if (s->fork) cudaEventDestroy(s->fork);
  if (s->beside_stream) cudaStreamDestroy(s->beside_stream);
  for (uint32_t i = 0; s->in && i < s->n_in; i++) cudaFree(s->in[i].dev);
  for (uint32_t i = 0; s->out && i < s->n_out; i++) cudaFree(s->out[i].dev);
  kcu_staging_release(&s->staging);
  kiln_stage_pool_destroy(s->pool);
  cudaFreeHost(s->ring);
  cudaFree(s->weights);
  cudaFree(s->arena);
  cudaFree(s->workspace);
  cudaFree(s->attn_scratch);
  cudaFree(s->dec.arrivals);
  cudaFree(s->fault_dev);
  cudaFreeHost(s->fault_host);
  for (uint32_t k = 0; s->state && k < s->n_states; k++) cudaFree(s->state[k]);
  free(s->state);
  if (s->lt) cublasLtDestroy(s->lt);
  if (s->stream) cudaStreamDestroy(s->stream);
  free(s->gemm);
  free(s->attn);
  free(s->sdpa);
  free(s->conv);
  free(s->conv_pieces);
  free(s->in);
  free(s->out);
  free(s->dev_in);
  free(s->dev_out);
  free(s->run_in);
  free(s->run_out);
  free(s->in_mode);
  free(s->out_mode);
  free(s);
  e->impl = NULL;
}

static kiln_status kcu_cuda_error(kcu_state *s, cudaError_t rc, const char *what, kiln_error *err) {
  cudaGetLastError();
  if (rc == cudaErrorMemoryAllocation) return kcu_oom(s, 0, what, err);
  return kiln_fail(err, KILN_ERR_INTERNAL,
                   "cuda:%d: %.32s failed: %.64s; check the driver and that no earlier fault "
                   "left the device unusable",
                   s->device, what, cudaGetErrorString(rc));
}

/* The device's address of pinned host memory p (NULL stays NULL). */
static kiln_status kcu_mapped(kcu_state *s, void *p, void **dev, const char *what,
                              kiln_error *err) {
  *dev = NULL;
  if (!p) return KILN_OK;
  cudaError_t rc = cudaHostGetDevicePointer(dev, p, 0);
  if (rc != cudaSuccess) return kcu_cuda_error(s, rc, what, err);
  return KILN_OK;
}

static kiln_status kcu_check_device(kcu_state *s, const kiln_engine *e, kiln_error *err) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  if (s->device < 0 || s->device >= count)
    return kiln_fail(err, KILN_ERR_UNAVAILABLE,
                     "cuda:%d does not exist: %d CUDA devices are visible; choose a device id "
                     "below %d, or KILN_DEVICE=cpu for the reference engine",
                     s->device, count, count);
  cudaError_t rc = cudaSetDevice(s->device);
  if (rc != cudaSuccess) return kcu_cuda_error(s, rc, "cudaSetDevice", err);
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, s->device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, s->device);
  int cc = major * 10 + minor;
  int need = e->metadata.min_compute_capability > KCU_MIN_CC ? e->metadata.min_compute_capability
                                                             : KCU_MIN_CC;
  if (cc < need)
    return kiln_fail(err, KILN_ERR_INCOMPATIBLE,
                     "cuda:%d has compute capability %d.%d, the program needs %d.%d; run it on a "
                     "newer GPU or export it for this one",
                     s->device, major, minor, need / 10, need % 10);
  return KILN_OK;
}

static kiln_status kcu_setup_io(kcu_state *s, const kiln_engine *e, kiln_error *err) {
  const kiln_plan *p = &e->plan;
  const kiln_metadata *md = &e->metadata;
  s->n_in = p->n_inputs;
  s->n_out = p->n_outputs;
  s->in = (kcu_io *)kcu_calloc(s, s->n_in, sizeof(kcu_io));
  s->out = (kcu_io *)kcu_calloc(s, s->n_out, sizeof(kcu_io));
  s->dev_in = (void **)kcu_calloc(s, s->n_in, sizeof(void *));
  s->dev_out = (void **)kcu_calloc(s, s->n_out, sizeof(void *));
  s->run_in = (void **)kcu_calloc(s, s->n_in, sizeof(void *));
  s->run_out = (void **)kcu_calloc(s, s->n_out, sizeof(void *));
  s->in_mode = (kcu_mode *)kcu_calloc(s, s->n_in, sizeof(kcu_mode));
  s->out_mode = (kcu_mode *)kcu_calloc(s, s->n_out, sizeof(kcu_mode));
  if (!s->in || !s->out || !s->dev_in || !s->dev_out || !s->run_in || !s->run_out ||
      !s->in_mode || !s->out_mode)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory for the I/O tables of %u inputs and %u outputs; free "
                     "memory and load again", s->n_in, s->n_out);
  for (uint32_t i = 0; i < s->n_in; i++) {
    s->in[i].tensor = p->inputs[i];
    s->in[i].nbytes = (size_t)p->tensors[p->inputs[i]].nbytes;
    s->in[i].name = "?";
  }
  for (uint32_t i = 0; i < s->n_out; i++) {
    s->out[i].tensor = p->outputs[i];
    s->out[i].nbytes = (size_t)p->tensors[p->outputs[i]].nbytes;
    s->out[i].name = "?";
  }
  /* Names for messages: the k-th input binding names input k (the front end checked counts). */
  for (uint32_t b = 0, ni = 0, no = 0; b < md->n_bindings; b++) {
    const kiln_binding *bd = &md->bindings[b];
    if (bd->kind == KILN_IO_INPUT && ni < s->n_in) s->in[ni++].name = bd->name;
    else if (bd->kind == KILN_IO_OUTPUT && no < s->n_out) s->out[no++].name = bd->name;
  }
  for (uint32_t a = 0; a < md->n_aliases; a++) {
    const kiln_alias *al = &md->aliases[a];
    if (al->output >= s->n_out || al->input >= s->n_in ||
        s->out[al->output].nbytes != s->in[al->input].nbytes)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "alias %u pairs output %u with input %u, which differ in size or do not "
                       "exist; re-export the program", a, al->output, al->input);
  }
  kiln_status st = KILN_OK;
  size_t largest = 0, in_total = 0, out_total = 0;
  for (uint32_t i = 0; st == KILN_OK && i < s->n_in; i++) {
    st = kcu_dev_alloc(s, &s->in[i].dev, s->in[i].nbytes, "input staging", err);
    s->dev_in[i] = s->in[i].dev;
    s->in[i].ring_off = in_total;
    in_total += (s->in[i].nbytes + KCU_BIND_ALIGN - 1) / KCU_BIND_ALIGN * KCU_BIND_ALIGN;
    if (s->in[i].nbytes > largest) largest = s->in[i].nbytes;
  }
  for (uint32_t i = 0; st == KILN_OK && i < s->n_out; i++) {
    st = kcu_dev_alloc(s, &s->out[i].dev, s->out[i].nbytes, "output staging", err);
    s->dev_out[i] = s->out[i].dev;
    s->out[i].ring_off = out_total;
    out_total += (s->out[i].nbytes + KCU_BIND_ALIGN - 1) / KCU_BIND_ALIGN * KCU_BIND_ALIGN;
    if (s->out[i].nbytes > largest) largest = s->out[i].nbytes;
  }
  if (st != KILN_OK) return st;
  kiln_stage_settings stage;
  if ((st = kiln_stage_settings_from_env(&stage, err)) != KILN_OK) return st;
  /* Inputs are copied in before outputs are copied out, so the two share the ring. */
  s->whole_io = in_total <= KCU_WHOLE_IO_BYTES && out_total <= KCU_WHOLE_IO_BYTES;
  size_t ring = kcu_staging_bytes(largest, stage.chunk_bytes);
  size_t whole = in_total > out_total ? in_total : out_total;
  if (s->whole_io && whole > ring) ring = whole;
  if ((st = kcu_pinned_alloc(s, &s->ring, ring, "staging ring", err)) != KILN_OK) return st;
  if ((st = kcu_mapped(s, s->ring, &s->ring_dev, "staging ring mapping", err)) != KILN_OK) return st;
  /* Threads only where a transfer is large enough to share: smaller ones never wake them. */
  int threads = largest >= KILN_STAGE_PARALLEL_MIN ? stage.threads : 1;
  if (kcu_injected())
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory for the %d staging threads of cuda:%d; free memory or "
                     "set KILN_STAGE_THREADS lower", threads, s->device);
  if ((st = kiln_stage_pool_create(threads, &s->pool, err)) != KILN_OK) return st;
  s->stats.init_allocs++;
  s->stats.stage_threads = (uint64_t)kiln_stage_pool_threads(s->pool);
  if (kcu_injected()) return kcu_oom(s, 0, "staging events", err);
  cudaError_t rc = kcu_staging_init(&s->staging, s->ring, largest, stage.chunk_bytes, s->pool);
  if (rc != cudaSuccess) return kcu_cuda_error(s, rc, "staging events", err);
  s->stats.stage_slot_bytes = s->staging.ring.slot_bytes;
  return KILN_OK;
}

/* Whether SDPA op i needs no score buffer: it runs on the flash kernel, or it has so few query
 * rows that the fused kernel splits its keys. Decided on the plan: arena and weight tensors lie
 * at their offsets from 256-byte-aligned bases and caller buffers are bound only when 256-byte
 * aligned (else staged), so the offsets stand in for the addresses. */
static int kcu_sdpa_scoreless(const kiln_plan *p, uint32_t i) {
  const kiln_op *op = &p->ops[i];
  kcu_tensor t[KILN_MAX_OP_INPUTS], out, q, k, v, o;
  const kcu_tensor *mask;
  kcu_attn_geometry geo;
  for (uint32_t n = 0; n <= op->n_inputs && n <= KILN_MAX_OP_INPUTS; n++) {
    const kiln_tensor_desc *d = &p->tensors[n < op->n_inputs ? op->inputs[n] : op->output];
    kcu_tensor *x = n < op->n_inputs ? &t[n] : &out;
    int placed = d->storage == KILN_STORE_ARENA || d->storage == KILN_STORE_WEIGHT;
    *x = kcu_tensor_shape(d);
    x->data = (void *)(uintptr_t)(placed ? d->offset : 0);
  }
  kcu_sdpa_operands(op, t, &out, &q, &k, &v, &mask, &o, &geo);
  return kcu_flash_fits(&q, &k, &v, mask, &o) || q.dims[q.rank - 2] <= KCU_ATTN_SPLIT_ROWS;
}

/* Whether SDPA op i runs on cuBLASLt matmuls around a score buffer. Not in a dynamic plan:
 * there it takes the flash kernel where a call's shape allows, else the fused kernel (split
 * keys for a few query rows), all of which read their sizes at run time, so no matmul setup
 * has to follow the sizes. */
static int kcu_attn_gemm_planned(const kcu_state *s, const kiln_plan *p, uint32_t i) {
  return p->ops[i].kind == KILN_OP_SDPA && !s->dynamic && kiln_sdpa_layout(&p->ops[i]) == 0 &&
         !kcu_sdpa_scoreless(p, i);
}

/* What a dynamic plan may not hold on this engine: a convolution whose channels or spatial
 * sizes follow a symbol (cuDNN's plans and workspace are chosen at init; a dynamic batch runs
 * by pieces planned then). Views placed on their input's bytes need no check here: the plan
 * reader proved their offset equal at both bounds, and as every size is a nondecreasing a*s+b,
 * an offset equal there is equal between. */
static kiln_status kcu_check_dynamic_op(const kiln_plan *p, uint32_t i, kiln_error *err) {
  const kiln_op *op = &p->ops[i];
  if (!kiln_is_conv_op(op->kind) || kcu_conv_piece_count(p, i) >= 0) return KILN_OK;
  return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                   "op %u (%.14s): the CUDA engine plans a convolution's channels and spatial "
                   "sizes at load, and this one's follow a dynamic size; export them static (a "
                   "dynamic batch runs) or load the program with device cpu",
                   i, kiln_op_name(op->kind));
}

/* A static plan's FUSED ops each get a kernel compiled for their program and sizes (one compile
 * for every op with the same source); a dynamic plan's are interpreted at each call's sizes. */
static kiln_status kcu_compile_fused(kcu_state *s, const kiln_plan *p, kiln_error *err) {
  int major = 0, minor = 0;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    const kiln_op *op = &p->ops[i];
    kcu_tensor in[KILN_MAX_OP_INPUTS], out = kcu_tensor_shape(&p->tensors[op->output]);
    kcu_fx prog;
    cudaKernel_t kernel = NULL;
    if (op->kind != KILN_OP_FUSED || out.numel == 0) continue;
    if (s->dynamic) {
      s->stats.fused_interpreted++;
      continue;
    }
    if (!s->fx && !(s->fx = (kcu_fx_kernel *)kcu_calloc(s, p->n_ops, sizeof(kcu_fx_kernel))))
      return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                       "out of host memory for the fused kernel table of %u ops; free memory "
                       "and load again", p->n_ops);
    if (!major && (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, s->device) ||
                   cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, s->device)))
      return kcu_cuda_error(s, cudaGetLastError(), "device query", err);
    for (uint32_t k = 0; k < op->n_inputs; k++)
      in[k] = kcu_tensor_shape(&p->tensors[op->inputs[k]]);
    if (kcu_fx_prepare(p, op, in, &out, &prog) != cudaSuccess)
      return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                       "op %u (fused): its program does not decode at the plan's sizes; "
                       "re-export the program", i);
    kiln_status st = kcu_fx_jit_kernel(&s->fx_jit, &prog, major * 10 + minor, &kernel, err);
    if (st != KILN_OK) return st;
    s->fx[i].kernel = kernel;
    s->fx[i].run = prog.run;
    if (kernel) s->stats.fused_compiled++;
    else s->stats.fused_interpreted++;
  }
  return KILN_OK;
}

static kiln_status kcu_setup_ops(kcu_state *s, const kiln_engine *e, kiln_error *err) {
  const kiln_plan *p = &e->plan;
  int gemms = 0, attention = 0, attn_gemm = 0, convs = 0;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    kiln_status st = kcu_check_op(p, i, err);
    if (st != KILN_OK) return st;
    if (s->dynamic && (st = kcu_check_dynamic_op(p, i, err)) != KILN_OK) return st;
    gemms |= p->ops[i].kind == KILN_OP_LINEAR || p->ops[i].kind == KILN_OP_MATMUL;
    attention |= p->ops[i].kind == KILN_OP_SDPA;
    convs |= kiln_is_conv_op(p->ops[i].kind);
    attn_gemm |= kcu_attn_gemm_planned(s, p, i);
  }
  if (s->dynamic && e->shaped.tensors) {
    /* Every op also at the lower bounds, where a size of 1 could break what the bounds allow
     * (before any call, so the front end holds no shapes of its own in `shaped` yet);
     * other sizes are checked again as a call first meets them (kcu_prepare_shape). */
    static const kiln_op_site site = {"plan", 0, KILN_ERR_INVALID_PROGRAM, "; re-export the program"};
    int64_t lo[KILN_MAX_SYMBOLS], hi[KILN_MAX_SYMBOLS];
    kiln_status st = KILN_OK;
    for (uint32_t k = 0; k < p->n_symbols; k++) lo[k] = p->symbols[k].min, hi[k] = p->symbols[k].max;
    st = kiln_plan_shapes_at(p, lo, 1, &site, e->shaped.tensors, e->shaped.ops, err);
    for (uint32_t i = 0; st == KILN_OK && i < p->n_ops; i++) st = kcu_check_op(&e->shaped, i, err);
    kiln_status back = kiln_plan_shapes_at(p, hi, 1, &site, e->shaped.tensors, e->shaped.ops, err);
    if (st != KILN_OK || back != KILN_OK) return st != KILN_OK ? st : back;
  }
  s->gemm = (kcu_gemm *)kcu_calloc(s, p->n_ops, sizeof(kcu_gemm));
  s->attn = (kcu_attn_gemm *)kcu_calloc(s, p->n_ops, sizeof(kcu_attn_gemm));
  s->conv = (kcu_conv *)kcu_calloc(s, p->n_ops, sizeof(kcu_conv));
  if (!s->gemm || !s->attn || !s->conv)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory for the matmul table of %u ops; free memory and load "
                     "again", p->n_ops);
  if (gemms || attn_gemm) {
    if (kcu_injected() || cublasLtCreate(&s->lt) != CUBLAS_STATUS_SUCCESS) {
      s->lt = NULL;
      return kcu_oom(s, 0, "cuBLASLt handle", err);
    }
    s->workspace_size = KCU_WORKSPACE_BYTES;
    kiln_status st = kcu_dev_alloc(s, &s->workspace, s->workspace_size, "matmul workspace", err);
    if (st != KILN_OK) return st;
  }
  if (convs) {
    if (kcu_injected()) return kcu_oom(s, 0, "cuDNN handle", err);
    kiln_status st = kcu_conv_handle(&s->dnn, s->stream, s->device, err);
    if (st != KILN_OK) return st;
  }
  for (uint32_t i = 0; i < p->n_ops; i++) {
    int pieces = kiln_is_conv_op(p->ops[i].kind) ? kcu_conv_piece_count(p, i) : 0;
    if (pieces > s->conv_piece_stride) s->conv_piece_stride = pieces;
  }
  if (s->conv_piece_stride &&
      !(s->conv_pieces = (kcu_conv *)kcu_calloc(s, (size_t)p->n_ops * s->conv_piece_stride,
                                                sizeof(kcu_conv))))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory for the convolution pieces of a dynamic batch; free "
                     "memory and load again");
  for (uint32_t i = 0; i < p->n_ops; i++) {
    if (!kiln_is_conv_op(p->ops[i].kind)) continue;
    const int64_t batch = p->tensors[p->ops[i].inputs[0]].dims[0];
    kcu_conv *c = &s->conv[i];
    kiln_status st = kcu_conv_init(c, p, i, batch, e->metadata.allow_tf32, err);
    if (st != KILN_OK) return st;
    int pieces = kcu_conv_piece_count(p, i);
    if (pieces > 0) c->pieces = &s->conv_pieces[(size_t)i * s->conv_piece_stride];
    for (int j = 0; j < pieces; j++) {
      st = kcu_conv_init(&c->pieces[j], p, i, (int64_t)1 << j, e->metadata.allow_tf32, err);
      c->n_pieces = j + 1; /* released with the op from here on */
      if (st != KILN_OK) return st;
    }
  }
  for (uint32_t i = 0; i < p->n_ops; i++) {
    kiln_op_kind k = p->ops[i].kind;
    if (k != KILN_OP_LINEAR && k != KILN_OP_MATMUL) continue;
    kiln_status st = kcu_gemm_init(&s->gemm[i], s->lt, p, i, e->metadata.allow_tf32,
                                   s->workspace_size, err);
    if (st != KILN_OK) return st;
  }
  uint64_t scratch = 0;
  int sms = 0;
  if (attention && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, s->device) != cudaSuccess)
    sms = 0, cudaGetLastError();
  for (uint32_t i = 0; i < p->n_ops; i++) {
    if (p->ops[i].kind != KILN_OP_SDPA) continue;
    /* no score buffer, no matmuls: the flash kernel, or the fused kernel for strided heads, for
     * a few query rows (split keys, their partial rows in the scratch) and in a dynamic plan */
    if (!kcu_attn_gemm_planned(s, p, i)) {
      const kiln_tensor_desc *o = &p->tensors[p->ops[i].output];
      if (sms > 0 && kcu_attention_part_bytes(o->dims[o->rank - 1], sms) > scratch)
        scratch = kcu_attention_part_bytes(o->dims[o->rank - 1], sms);
      continue;
    }
    kiln_status st = kcu_attn_gemm_init(&s->attn[i], s->lt, p, i, e->metadata.allow_tf32,
                                        s->workspace_size, err);
    if (st != KILN_OK) return st;
    if (s->attn[i].scratch_bytes > scratch) scratch = s->attn[i].scratch_bytes;
  }
  for (uint32_t i = 0; i < p->n_ops; i++)
    if (s->gemm[i].scratch_bytes > scratch) scratch = s->gemm[i].scratch_bytes;
  /* One buffer serves every SDPA op's scores and every SwiGLU or padded linear's result: the
   * ops run one after another on one stream. */
  kiln_status sst = kcu_dev_alloc(s, &s->attn_scratch, (size_t)scratch, "attention scores", err);
  if (sst != KILN_OK) return sst;
  s->attn_scratch_bytes = (size_t)scratch;
  for (uint32_t i = 0; i < p->n_ops; i++)
    if (s->gemm[i].scratch_bytes) s->gemm[i].scratch = s->attn_scratch;
  s->dec.part = s->attn_scratch;
  s->dec.part_bytes = s->attn_scratch_bytes;
  if (attention && sms > 0 && s->attn_scratch) {
    s->dec.n_arrivals = kcu_attention_arrivals(sms);
    size_t bytes = (size_t)s->dec.n_arrivals * sizeof(unsigned);
    sst = kcu_dev_alloc(s, (void **)&s->dec.arrivals, bytes, "decoding arrival counts", err);
    if (sst != KILN_OK) return sst;
    cudaError_t rc = cudaMemset(s->dec.arrivals, 0, bytes);
    if (rc != cudaSuccess) return kcu_cuda_error(s, rc, "decoding arrival counts", err);
  }
  if (attention) {
    cudaError_t rc = kcu_attention_prepare(KCU_ATTN_MAX_HEAD);
    if (rc == cudaSuccess) rc = kcu_flash_prepare();
    if (rc != cudaSuccess) return kcu_cuda_error(s, rc, "attention kernel setup", err);
  }
  return kcu_compile_fused(s, p, err);
}

static kiln_status kcu_instantiate(kcu_state *s, const kiln_plan *p, int host_copies,
                                   cudaGraphExec_t *exec, kiln_error *err) {
  cudaGraph_t graph;
  if (kcu_injected()) return kcu_oom(s, 0, "CUDA graph", err);
  cudaError_t rc = kcu_capture(s, p, s->dev_in, s->dev_out, host_copies, &graph);
  if (rc != cudaSuccess) return kcu_cuda_error(s, rc, "graph capture", err);
  rc = cudaGraphInstantiate(exec, graph, 0);
  cudaGraphDestroy(graph);
  if (rc != cudaSuccess) {
    *exec = NULL;
    return kcu_cuda_error(s, rc, "graph instantiation", err);
  }
  return KILN_OK;
}

/* Measures every convolution's algorithms with a generous workspace, then keeps a workspace of
 * just what the chosen ones need. Runs once the arena and I/O buffers exist. */
static kiln_status kcu_choose_convs(kcu_state *s, const kiln_plan *p, kiln_error *err) {
  size_t need = 0, free_b = 0, total_b = 0, trial = KCU_CONV_FIND_WORKSPACE;
  double compile_left = KCU_GRAPH_COMPILE_BUDGET_MS; /* bounds the load time of a large CNN */
  kiln_status st;
  if (!s->dnn) return KILN_OK;
  /* Measuring must not take the memory other programs on the device need. */
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess && free_b / 4 < trial) trial = free_b / 4;
  cudaGetLastError();
  if ((st = kcu_dev_alloc(s, &s->conv_ws, trial, "convolution workspace", err)) != KILN_OK)
    return st;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    const kiln_op *op = &p->ops[i];
    if (!s->conv[i].active) continue;
    kcu_tensor in[KILN_MAX_OP_INPUTS];
    for (uint32_t k = 0; k < op->n_inputs; k++) in[k] = kcu_resolve(s, p, op->inputs[k], s->dev_in, s->dev_out);
    kcu_tensor out = kcu_resolve(s, p, op->output, s->dev_in, s->dev_out);
    st = kcu_conv_choose(&s->conv[i], s->dnn, s->stream, p, i, in, &out, s->conv_ws, trial,
                         s->conv, i, &compile_left, err);
    if (st != KILN_OK) return st;
    const kcu_conv_graph *g = &s->conv[i].graph;
    if (!s->conv[i].transposed && !g->shared) {
      if (g->reused) s->stats.choices_reused++;
      else s->stats.choices_measured++;
    }
    if (s->conv[i].workspace > need) need = s->conv[i].workspace;
    for (int j = 0; j < s->conv[i].n_pieces; j++) {
      kcu_conv *piece = &s->conv[i].pieces[j];
      st = kcu_conv_choose(piece, s->dnn, s->stream, p, i, in, &out, s->conv_ws, trial, NULL, 0,
                           &compile_left, err);
      if (st != KILN_OK) return st;
      if (!piece->transposed) {
        if (piece->graph.reused) s->stats.choices_reused++;
        else s->stats.choices_measured++;
      }
      if (piece->workspace > need) need = piece->workspace;
    }
  }
  cudaFree(s->conv_ws);
  s->conv_ws = NULL;
  s->conv_ws_size = need;
  return kcu_dev_alloc(s, &s->conv_ws, need, "convolution workspace", err);
}

/* Which SDPA path init takes (kiln_cuda_attention_choice); 0: the faster. */
static int kcu_sdpa_forced;

void kiln_cuda_attention_choice(int path) { kcu_sdpa_forced = path; }

/* cuDNN's attention replaces an op's own kernel only when faster by this factor: within timing
 * noise the op keeps the kernel it was tested with. */
#define KCU_SDPA_MARGIN 0.97f
/* Workspace cuDNN's attention plans may take while init chooses, at most. */
#define KCU_SDPA_TRIAL_WORKSPACE ((size_t)16 << 20)

typedef struct kcu_op_call {
  kcu_state *s;
  const kiln_plan *p;
  uint32_t i;
} kcu_op_call;

static cudaError_t kcu_op_call_run(void *ctx, cudaStream_t stream) {
  const kcu_op_call *c = (const kcu_op_call *)ctx;
  (void)stream; /* kcu_run_op enqueues on the engine's stream */
  return kcu_run_op(c->s, c->p, c->i, c->s->stream, c->s->dev_in, c->s->dev_out);
}

/* Each static SDPA op cuDNN's fused attention may take (kcu_sdpa_graph_shape) gets the faster
 * of its own kernel and cuDNN's plans, both timed as the engine replays them on its buffers.
 * cuDNN failing to build or run any plan leaves the op on its own kernel. */
static kiln_status kcu_choose_attention(kcu_state *s, const kiln_plan *p, kiln_error *err) {
  size_t free_b = 0, total_b = 0, trial = KCU_SDPA_TRIAL_WORKSPACE, need = 0;
  int candidates = 0;
  kiln_status st;
  if (s->dynamic || kcu_sdpa_forced == KILN_CUDA_ATTENTION_OWN) return KILN_OK;
  for (uint32_t i = 0; i < p->n_ops; i++) candidates |= p->ops[i].kind == KILN_OP_SDPA;
  if (!candidates) return KILN_OK;
  if (!(s->sdpa = (kcu_sdpa_graph *)kcu_calloc(s, p->n_ops, sizeof(kcu_sdpa_graph))))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory for the attention plan table of %u ops; free memory "
                     "and load again", p->n_ops);
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess && free_b / 4 < trial) trial = free_b / 4;
  cudaGetLastError();
  for (uint32_t i = 0; i < p->n_ops; i++) {
    const kiln_op *op = &p->ops[i];
    kcu_tensor in[KILN_MAX_OP_INPUTS], q, k, v, o;
    const kcu_tensor *mask;
    kcu_attn_geometry geo;
    kcu_sdpa_shape sh;
    if (op->kind != KILN_OP_SDPA) continue;
    for (uint32_t j = 0; j < op->n_inputs; j++) in[j] = kcu_resolve(s, p, op->inputs[j], s->dev_in, s->dev_out);
    kcu_tensor out = kcu_resolve(s, p, op->output, s->dev_in, s->dev_out);
    if (!kcu_sdpa_operands(op, in, &out, &q, &k, &v, &mask, &o, &geo))
      kcu_attn_geometry_init(&geo, &q, &k, &v, mask, &o, k.dims[k.rank - 2]);
    float scale = (float)op->fattr[0];
    if (scale == 0.0f) scale = 1.0f / sqrtf((float)q.dims[q.rank - 1]);
    int causal = op->n_iattr > 0 && op->iattr[0] != 0;
    if (!kcu_sdpa_graph_shape(&sh, &q, &k, &v, mask, &o, &geo, causal)) continue;
    if (!s->dnn) {
      if (kcu_injected()) return kcu_oom(s, 0, "cuDNN handle", err);
      if ((st = kcu_conv_handle(&s->dnn, s->stream, s->device, err)) != KILN_OK) return st;
    }
    /* an earlier op of this shape decided: the same plan, or its own kernel, untimed */
    int shared = 0, declined = 0;
    for (uint32_t j = 0; j < i && !shared && !declined; j++) {
      shared = kcu_sdpa_graph_share(&s->sdpa[i], &s->sdpa[j], &sh, scale, q.data, k.data, v.data,
                                    o.data);
      declined = s->sdpa[j].declined && s->sdpa[j].scale == scale &&
                 memcmp(&s->sdpa[j].shape, &sh, sizeof sh) == 0;
    }
    if (shared) s->stats.attention_cudnn++;
    if (shared || declined) continue;
    if (!s->sdpa_ws && (st = kcu_dev_alloc(s, &s->sdpa_ws, trial, "attention workspace", err)) != KILN_OK)
      return st;
    kcu_op_call call = {s, p, i};
    float own = kcu_sdpa_forced == KILN_CUDA_ATTENTION_CUDNN ? -1.0f
                                                             : kcu_time_recorded(s->stream, kcu_op_call_run, &call);
    if (kcu_sdpa_graph_choose(&s->sdpa[i], s->dnn, s->stream, &sh, scale, q.data, k.data, v.data,
                              o.data, s->sdpa_ws, trial) != CUDNN_STATUS_SUCCESS)
      continue;
    s->stats.choices_measured++;
    if (kcu_sdpa_forced != KILN_CUDA_ATTENTION_CUDNN && own >= 0.0f &&
        s->sdpa[i].time_us >= own * KCU_SDPA_MARGIN) {
      kcu_sdpa_graph_release(&s->sdpa[i]);
      s->sdpa[i].declined = 1;
      continue;
    }
    s->stats.attention_cudnn++;
    if (s->sdpa[i].workspace > need) need = s->sdpa[i].workspace;
  }
  if (!s->sdpa_ws) return KILN_OK;
  cudaFree(s->sdpa_ws);
  s->sdpa_ws = NULL;
  return need ? kcu_dev_alloc(s, &s->sdpa_ws, need, "attention workspace", err) : KILN_OK;
}

/* The start-of-run record of state k: its size and where its initial value lies. */
static const kiln_tensor_desc *kcu_state_record(const kiln_plan *p, uint32_t k) {
  for (uint32_t t = 0; t < p->n_tensors; t++)
    if (p->tensors[t].storage == KILN_STORE_STATE && p->tensors[t].io_index == k)
      return &p->tensors[t];
  return NULL; /* the plan parser guarantees one per index */
}

static kiln_status kcu_alloc_state(kcu_state *s, const kiln_plan *p, kiln_error *err) {
  if (p->n_states && !(s->state = (void **)kcu_calloc(s, p->n_states, sizeof *s->state)))
    return kcu_oom(s, p->n_states * sizeof *s->state, "state table", err);
  s->n_states = p->n_states;
  for (uint32_t k = 0; k < p->n_states; k++) {
    const kiln_tensor_desc *t = kcu_state_record(p, k);
    kiln_status st = kcu_dev_alloc(s, &s->state[k], t && t->nbytes ? (size_t)t->nbytes : 1,
                                   "state", err);
    if (st != KILN_OK) return st;
  }
  return KILN_OK;
}

/* Device to device from the uploaded weights, where each initial value lies. */
static kiln_status kcu_reset_state(kiln_engine *e, kiln_error *err) {
  kcu_state *s = (kcu_state *)e->impl;
  cudaError_t rc = cudaSetDevice(s->device);
  for (uint32_t k = 0; rc == cudaSuccess && k < s->n_states; k++) {
    const kiln_tensor_desc *t = kcu_state_record(&e->plan, k);
    if (t && t->nbytes)
      rc = cudaMemcpyAsync(s->state[k], (const char *)s->weights + t->offset, (size_t)t->nbytes,
                           cudaMemcpyDeviceToDevice, s->stream);
  }
  if (rc == cudaSuccess) rc = cudaStreamSynchronize(s->stream);
  if (rc != cudaSuccess) return kcu_cuda_error(s, rc, "state reset", err);
  s->stats.state_resets++;
  return KILN_OK;
}

/* Byte ranges of tensors a and b (as init resolves them) overlap. */
static int kcu_overlap(const kcu_state *s, const kiln_plan *p, uint32_t a, uint32_t b) {
  const char *a0 = (const char *)kcu_tensor_addr(s, &p->tensors[a], s->dev_in, s->dev_out);
  const char *b0 = (const char *)kcu_tensor_addr(s, &p->tensors[b], s->dev_in, s->dev_out);
  return a0 < b0 + p->tensors[b].nbytes && b0 < a0 + p->tensors[a].nbytes;
}

/* Whether every reader of tensor t (written by op j: the norm's output, n elements of dtype
 * dt, or a view of it) is a GEMV taking it as its one input row, directly or through views the
 * memory plan placed on its bytes (reshapes, copies); *last: the last of them. With link, each
 * such GEMV's entry is set to it. depth bounds the views followed. */
static int kcu_norm_readers_fold(const kcu_state *s, const kiln_plan *p, uint32_t j, uint32_t t,
                                 int64_t n, kiln_dtype dt, int depth, uint32_t *last,
                                 int32_t *link, int32_t value) {
  int readers = 0;
  for (uint32_t c = j + 1; c < p->n_ops; c++) {
    const kiln_op *op = &p->ops[c];
    int reads = 0, other = 0;
    for (uint32_t k = 0; k < op->n_inputs; k++) {
      reads |= op->inputs[k] == t;
      other |= op->inputs[k] == t && k > 0;
    }
    if (!reads) continue;
    if (other) return 0;
    const kcu_gemm *g = &s->gemm[c];
    if (op->kind == KILN_OP_LINEAR && g->gemv && g->M == 1 && g->K == n &&
        p->tensors[op->output].dtype == dt &&
        kcu_gemv_norm_one_wave(g->N, g->K, dt, g->act, g->gemv - 1)) {
      readers++;
      if (c > *last) *last = c;
      if (link) link[c] = value;
    } else if (depth > 0 && op->n_inputs == 1 &&
               p->tensors[op->output].nbytes == p->tensors[t].nbytes &&
               p->tensors[op->output].storage == KILN_STORE_ARENA &&
               kcu_tensor_addr(s, &p->tensors[op->output], s->dev_in, s->dev_out) ==
                   kcu_tensor_addr(s, &p->tensors[t], s->dev_in, s->dev_out) &&
               kcu_in_place_view(s, p, c, s->dev_in, s->dev_out)) {
      if (!kcu_norm_readers_fold(s, p, c, op->output, n, dt, depth - 1, last, link, value))
        return 0;
      readers++;
    } else {
      return 0;
    }
  }
  return readers > 0;
}

/* Whether op j is a LAYER_NORM or RMS_NORM a GEMV kernel can compute: f16 or bf16 over one row
 * of *n elements that fits, no steps fused into it, its weight and bias weights, its input
 * 16-byte aligned. */
static int kcu_norm_foldable(const kcu_state *s, const kiln_plan *p, uint32_t j, int64_t *n) {
  const kiln_op *op = &p->ops[j];
  if (op->kind != KILN_OP_LAYER_NORM && op->kind != KILN_OP_RMS_NORM) return 0;
  const kiln_tensor_desc *x = &p->tensors[op->inputs[0]], *y = &p->tensors[op->output];
  int64_t flags = op->iattr[1];
  uint32_t want = 1 + (uint32_t)(flags & 1) + (uint32_t)((flags >> 1) & 1);
  *n = 1;
  for (int d = x->rank - (int)op->iattr[0]; d < x->rank; d++) *n *= x->dims[d];
  if (!kcu_gemv_norm_fits(1, *n, x->dtype) || y->dtype != x->dtype || op->n_inputs != want ||
      op->n_iattr > 2)
    return 0; /* (more attributes: pointwise steps fused into the norm) */
  int ok = (uintptr_t)kcu_tensor_addr(s, x, s->dev_in, s->dev_out) % 16 == 0;
  for (uint32_t k = 1; k < want; k++) {
    const kiln_tensor_desc *w = &p->tensors[op->inputs[k]];
    ok &= w->storage == KILN_STORE_WEIGHT && w->dtype == x->dtype && w->offset % 16 == 0;
  }
  return ok && (uint64_t)*n * kiln_dtype_size(x->dtype) == y->nbytes;
}

/* *table (norm_link or norm_after), allocated zeroed at its first use. */
static kiln_status kcu_norm_table(kcu_state *s, const kiln_plan *p, int32_t **table,
                                  kiln_error *err) {
  if (!*table && !(*table = (int32_t *)kcu_calloc(s, p->n_ops, sizeof(int32_t))))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory for the norm table of %u ops; free memory and load "
                     "again", p->n_ops);
  return KILN_OK;
}

/* A LAYER_NORM or RMS_NORM (kcu_norm_foldable) whose output only one-row GEMVs read is computed
 * by those GEMVs (cuda_gemv.cu): it launches nothing, and each reads the norm's input. A decode
 * step's norms ran as kernels of their own between GEMVs, about 3 us each on its critical path.
 * Static plans only (a dynamic one's row count changes which kernel runs). */
static kiln_status kcu_fold_norms(kcu_state *s, const kiln_plan *p, kiln_error *err) {
  if (s->dynamic || !s->gemm) return KILN_OK;
  for (uint32_t j = 0; j < p->n_ops; j++) {
    const kiln_op *op = &p->ops[j];
    const kiln_tensor_desc *x = &p->tensors[op->inputs[0]];
    int64_t n;
    uint32_t last = j;
    if (!kcu_norm_foldable(s, p, j, &n) || p->tensors[op->output].storage != KILN_STORE_ARENA ||
        !kcu_norm_readers_fold(s, p, j, op->output, n, x->dtype, 4, &last, NULL, 0))
      continue;
    int ok = 1;
    /* the norm's input keeps its bytes until its last GEMV has read them (its own output
     * included: a block may store while another still reads the row) */
    for (uint32_t c = j + 1; ok && c <= last; c++)
      ok = !kcu_overlap(s, p, p->ops[c].output, op->inputs[0]);
    if (!ok) continue;
    kiln_status st = kcu_norm_table(s, p, &s->norm_link, err);
    if (st != KILN_OK) return st;
    kcu_norm_readers_fold(s, p, j, op->output, n, x->dtype, 4, &last, s->norm_link, (int32_t)j + 1);
    s->norm_link[j] = -1;
    s->stats.norms_in_gemv++;
  }
  return KILN_OK;
}

/* A norm (kcu_norm_foldable) its readers do not compute, whose input is the output of the
 * one-row GEMV ahead of it (only views that launch nothing between), is computed by that GEMV's
 * last block (cuda_gemv.cu): it launches nothing. A decode step's norms ahead of the GEMVs too
 * wide for kcu_fold_norms (the MLP's, the LM head's) ran as kernels of their own, about 4 us
 * each on its critical path. Not where the norm's output lies on its input. Static plans only. */
static kiln_status kcu_fold_norms_after(kcu_state *s, const kiln_plan *p, kiln_error *err) {
  if (s->dynamic || !s->gemm) return KILN_OK;
  for (uint32_t j = 1; j < p->n_ops; j++) {
    const kiln_op *op = &p->ops[j];
    int64_t n;
    if ((s->norm_link && s->norm_link[j]) || !kcu_norm_foldable(s, p, j, &n)) continue;
    uint32_t i = j - 1;
    while (i > 0 && kcu_in_place_view(s, p, i, s->dev_in, s->dev_out)) i--;
    const kiln_op *lin = &p->ops[i];
    const kcu_gemm *g = &s->gemm[i];
    const kiln_tensor_desc *x = &p->tensors[op->inputs[0]], *y = &p->tensors[lin->output];
    if (lin->kind != KILN_OP_LINEAR || !g->gemv || g->M != 1 || g->N != n ||
        (s->norm_link && s->norm_link[i]) || (s->norm_after && s->norm_after[i]) ||
        y->dtype != x->dtype || y->nbytes != x->nbytes ||
        kcu_tensor_addr(s, y, s->dev_in, s->dev_out) !=
            kcu_tensor_addr(s, x, s->dev_in, s->dev_out) ||
        kcu_overlap(s, p, op->output, op->inputs[0]))
      continue;
    kiln_status st = kcu_norm_table(s, p, &s->norm_link, err);
    if (st == KILN_OK) st = kcu_norm_table(s, p, &s->norm_after, err);
    if (st != KILN_OK) return st;
    s->norm_after[i] = (int32_t)j + 1;
    s->norm_link[j] = -1;
    s->stats.norms_after_gemv++;
  }
  if (!s->norm_after) return KILN_OK;
  size_t bytes = (size_t)p->n_ops * sizeof(unsigned);
  kiln_status st = kcu_dev_alloc(s, (void **)&s->norm_arrivals, bytes, "norm arrival counts", err);
  if (st != KILN_OK) return st;
  cudaError_t rc = cudaMemset(s->norm_arrivals, 0, bytes);
  return rc == cudaSuccess ? KILN_OK : kcu_cuda_error(s, rc, "norm arrival counts", err);
}

/* The INDEX_COPY writing the cache that SDPA op i reads as its input `operand` (1: k, 2: v),
 * where the decoding kernel can do that write itself, or -1: a state written in place, one
 * 16-byte-aligned row per matrix at one slot along dim -2, read by op i alone (as that operand
 * only), and the rows and slot index, in the arena (a caller's buffers may alias), keep their
 * bytes until op i has read them (no op from the write to op i, op i included, writes over
 * them). */
static int32_t kcu_append_source(const kcu_state *s, const kiln_plan *p, uint32_t i,
                                 uint32_t operand) {
  uint32_t t = p->ops[i].inputs[operand];
  const kiln_tensor_desc *c = &p->tensors[t];
  int32_t j = -1;
  if (c->storage != KILN_STORE_STATE || c->rank < 2) return -1;
  for (uint32_t o = 0; o < p->n_ops; o++) {
    if (p->ops[o].output == t && o < i) j = (int32_t)o;
    for (uint32_t k = 0; k < p->ops[o].n_inputs; k++)
      if (p->ops[o].inputs[k] == t && (o != i || k != operand)) return -1;
  }
  if (j < 0) return -1;
  const kiln_op *w = &p->ops[j];
  if (w->kind != KILN_OP_INDEX_COPY || w->iattr[0] != c->rank - 2) return -1;
  uint32_t idx = w->inputs[1], rows = w->inputs[2];
  if (p->tensors[idx].storage != KILN_STORE_ARENA || p->tensors[rows].storage != KILN_STORE_ARENA ||
      kcu_tensor_addr(s, &p->tensors[w->inputs[0]], s->dev_in, s->dev_out) !=
          kcu_tensor_addr(s, c, s->dev_in, s->dev_out) ||
      kcu_tensor_shape(&p->tensors[idx]).numel != 1 ||
      p->tensors[rows].nbytes * (uint64_t)c->dims[c->rank - 2] != c->nbytes ||
      (uintptr_t)kcu_tensor_addr(s, &p->tensors[rows], s->dev_in, s->dev_out) % 16 != 0)
    return -1;
  for (uint32_t o = (uint32_t)j + 1; o <= i; o++)
    if (kcu_overlap(s, p, p->ops[o].output, rows) || kcu_overlap(s, p, p->ops[o].output, idx))
      return -1;
  return j;
}

/* A decode step's KV cache writes: an INDEX_COPY of one new row into a cache that only the
 * SDPA after it reads is done by that SDPA's decoding kernel (the warp path), which reads the
 * new row from the step's rows and copies it into the cache as it runs. Two kernels a layer,
 * each on the step's critical path, launch no more. Static plans, SDPAs that run on the
 * decoding kernel (not cuDNN, the flash kernel or matmuls), heads first or heads last. */
static kiln_status kcu_fold_cache_writes(kcu_state *s, const kiln_plan *p, kiln_error *err) {
  if (s->dynamic || !s->dec.part) return KILN_OK;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    const kiln_op *op = &p->ops[i];
    if (op->kind != KILN_OP_SDPA || kiln_sdpa_layout(op) == 1 || (s->sdpa && s->sdpa[i].plan) ||
        s->attn[i].active)
      continue;
    kcu_tensor in[KILN_MAX_OP_INPUTS], out, q, k, v, o;
    const kcu_tensor *mask;
    kcu_attn_geometry geo;
    for (uint32_t n = 0; n < op->n_inputs; n++)
      in[n] = kcu_resolve(s, p, op->inputs[n], s->dev_in, s->dev_out);
    out = kcu_resolve(s, p, op->output, s->dev_in, s->dev_out);
    int strided = kcu_sdpa_operands(op, in, &out, &q, &k, &v, &mask, &o, &geo);
    if (kcu_flash_fits(&q, &k, &v, mask, &o) ||
        !kcu_attention_appends(&q, &k, &v, mask, &o, strided ? &geo : NULL))
      continue;
    int32_t src[2] = {kcu_append_source(s, p, i, 1), kcu_append_source(s, p, i, 2)};
    if (src[0] < 0 && src[1] < 0) continue;
    if (!s->append &&
        !(s->append = (kcu_append_link *)kcu_calloc(s, p->n_ops, sizeof(kcu_append_link))))
      return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                       "out of host memory for the cache write table of %u ops; free memory "
                       "and load again", p->n_ops);
    for (int c = 0; c < 2; c++) {
      if (src[c] < 0) continue;
      s->append[i].op[c] = src[c] + 1;
      s->append[src[c]].op[0] = -1;
      s->stats.cache_writes_in_attention++;
    }
  }
  return KILN_OK;
}

/* Ops beside the chain. A small op whose result is first read a few kernels later (a decode
 * step's position and its attention mask, an encoder's mask arithmetic) need not hold up the
 * kernels between: it runs on a second stream forked from the chain where it stands in the plan,
 * and the first op on the chain reading its result (directly or through views placed on its
 * bytes) waits for it. The captured graph has two branches; the chain's kernels keep launching
 * early one after another. Static plans; not the matmuls, convolutions, attention or state
 * writes, nor an op reading state. */
#define KCU_BESIDE_MAX_BYTES ((uint64_t)256 << 10)

/* Whether op i, not a view on its input's bytes, launches anything: not a norm a GEMV computes
 * or a cache write the decoding attention does. */
static int kcu_op_launches(const kcu_state *s, uint32_t i) {
  return !(s->norm_link && s->norm_link[i] < 0) && !(s->append && s->append[i].op[0] < 0);
}

/* Whether op i, launching kernels of its own, may run beside the chain. */
static int kcu_may_go_beside(const kiln_plan *p, uint32_t i) {
  const kiln_op *op = &p->ops[i];
  switch (op->kind) {
  case KILN_OP_LINEAR:
  case KILN_OP_MATMUL:
  case KILN_OP_CONV:
  case KILN_OP_CONV_TRANSPOSE:
  case KILN_OP_SDPA:
  case KILN_OP_INDEX_COPY: return 0;
  default: break;
  }
  const kiln_tensor_desc *out = &p->tensors[op->output];
  if (out->storage != KILN_STORE_ARENA || out->nbytes > KCU_BESIDE_MAX_BYTES) return 0;
  for (uint32_t k = 0; k < op->n_inputs; k++)
    if (p->tensors[op->inputs[k]].storage == KILN_STORE_STATE) return 0;
  return 1;
}

/* Which ops run beside the chain (runtime/branches.h decides from what init knows of each op
 * and the bytes each tensor takes). */
static kiln_status kcu_plan_beside(kcu_state *s, const kiln_plan *p, kiln_error *err) {
  if (s->dynamic) return KILN_OK;
  size_t ops = p->n_ops, tensors = p->n_tensors;
  int32_t *beside = (int32_t *)kcu_calloc(s, ops, sizeof *beside);
  uint64_t(*bytes)[2] = (uint64_t(*)[2])kcu_calloc(s, tensors, sizeof *bytes);
  uint8_t *flags = (uint8_t *)kcu_calloc(s, 3 * ops + tensors, 1);
  kiln_status st = KILN_OK;
  uint32_t n = 0;
  if (!beside || !bytes || !flags) {
    st = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "out of host memory planning the branches of %u "
                   "ops; free memory and load again", p->n_ops);
    goto done;
  }
  kiln_branch_facts f = {flags, flags + ops, flags + 2 * ops, (const uint64_t(*)[2])bytes};
  for (uint32_t t = 0; t < p->n_tensors; t++) {
    bytes[t][0] = (uint64_t)(uintptr_t)kcu_tensor_addr(s, &p->tensors[t], s->dev_in, s->dev_out);
    bytes[t][1] = bytes[t][0] + p->tensors[t].nbytes;
  }
  for (uint32_t i = 0; i < p->n_ops; i++) {
    int view = kcu_in_place_view(s, p, i, s->dev_in, s->dev_out);
    flags[2 * ops + i] = (uint8_t)view;
    flags[ops + i] = (uint8_t)(!view && kcu_op_launches(s, i));
    flags[i] = (uint8_t)(flags[ops + i] && kcu_may_go_beside(p, i));
  }
  if (!(n = kiln_plan_branches(p, &f, flags + 3 * ops, beside))) goto done;
  s->beside_done = (cudaEvent_t *)kcu_calloc(s, p->n_ops, sizeof *s->beside_done);
  s->join = (int32_t *)kcu_calloc(s, p->n_ops, sizeof *s->join);
  if (!s->beside_done || !s->join) {
    st = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "out of host memory for the branch events of "
                   "%u ops; free memory and load again", p->n_ops);
    goto done;
  }
  cudaError_t rc = kcu_injected() ? cudaErrorMemoryAllocation
                   : cudaStreamCreateWithFlags(&s->beside_stream, cudaStreamNonBlocking);
  if (rc == cudaSuccess) rc = cudaEventCreateWithFlags(&s->fork, cudaEventDisableTiming);
  for (uint32_t i = 0; rc == cudaSuccess && i < p->n_ops; i++)
    if (beside[i]) rc = cudaEventCreateWithFlags(&s->beside_done[i], cudaEventDisableTiming);
  if (rc != cudaSuccess) {
    st = kcu_cuda_error(s, rc, "branch stream and events", err);
    goto done;
  }
  kiln_branch_joins(beside, p->n_ops, s->join);
  s->beside = beside;
  beside = NULL;
  s->stats.ops_beside = n;
done:
  free(beside);
  free(bytes);
  free(flags);
  return st;
}

static kiln_status kcu_init_state(kiln_engine *e, kcu_state *s, kiln_error *err) {
  kiln_status st = kcu_check_device(s, e, err);
  if (st != KILN_OK) return st;
  snprintf(e->device_name, sizeof e->device_name, "cuda:%d", s->device);
  if (kcu_injected() || cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking) != cudaSuccess) {
    s->stream = NULL;
    return kcu_oom(s, 0, "stream", err);
  }
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &fn, 12000, cudaEnableDefault,
                                       &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess)
    s->ptr_attr = (kcu_ptr_attr_fn)fn;
  cudaGetLastError();
  if ((st = kcu_setup_ops(s, e, err)) != KILN_OK) return st;
  /* zeroed slack after the weights for the rows a padded-pitch linear reads past its weight */
  uint64_t slack = 0;
  for (uint32_t i = 0; i < e->plan.n_ops; i++)
    if (s->gemm && s->gemm[i].over_read > slack) slack = s->gemm[i].over_read;
  st = kcu_dev_alloc(s, &s->weights, e->weights_size + (size_t)slack, "weights", err);
  if (st != KILN_OK) return st;
  if (e->weights_size || slack) {
    cudaError_t rc = cudaMemcpy(s->weights, e->weights, e->weights_size, cudaMemcpyHostToDevice);
    if (rc == cudaSuccess && slack)
      rc = cudaMemset((char *)s->weights + e->weights_size, 0, (size_t)slack);
    if (rc != cudaSuccess) return kcu_cuda_error(s, rc, "weight upload", err);
  }
  if ((st = kcu_dev_alloc(s, &s->arena, e->plan.arena_size, "arena", err)) != KILN_OK) return st;
  if ((st = kcu_dev_alloc(s, (void **)&s->fault_dev, KCU_FAULT_BYTES, "fault flag", err)) != KILN_OK)
    return st;
  if ((st = kcu_pinned_alloc(s, (void **)&s->fault_host, KCU_FAULT_BYTES, "fault flag", err)) != KILN_OK)
    return st;
  if ((st = kcu_mapped(s, s->fault_host, (void **)&s->fault_mapped, "fault flag mapping", err)) != KILN_OK)
    return st;
  /* Each run's last kernel reads the fault words out and clears them for the next run. */
  cudaError_t zero = cudaMemset(s->fault_dev, 0, KCU_FAULT_BYTES);
  if (zero != cudaSuccess) return kcu_cuda_error(s, zero, "fault flag", err);
  if ((st = kcu_alloc_state(s, &e->plan, err)) != KILN_OK) return st;
  if ((st = kcu_setup_io(s, e, err)) != KILN_OK) return st;
  /* Buffers exist now: time the heuristic's matmul candidates on them and keep the fastest,
   * each run after the weights are read through where they outgrow the L2 cache. */
  kcu_cold cold = {s->weights, kcu_cold_bytes(e->weights_size)};
  for (uint32_t i = 0; i < e->plan.n_ops; i++) {
    const kiln_op *op = &e->plan.ops[i];
    int attn = op->kind == KILN_OP_SDPA && s->attn[i].active;
    if (op->kind != KILN_OP_LINEAR && op->kind != KILN_OP_MATMUL && !attn) continue;
    kcu_tensor in[KILN_MAX_OP_INPUTS];
    for (uint32_t k = 0; k < op->n_inputs; k++) in[k] = kcu_resolve(s, &e->plan, op->inputs[k], s->dev_in, s->dev_out);
    kcu_tensor out = kcu_resolve(s, &e->plan, op->output, s->dev_in, s->dev_out);
    if (attn)
      kcu_attn_gemm_tune(&s->attn[i], s->lt, s->stream, in, &out, s->attn_scratch, s->workspace,
                         s->workspace_size, &cold);
    else
      switch (kcu_gemm_tune(&s->gemm[i], s->lt, s->stream, in, op->n_inputs, &out, s->workspace,
                            s->workspace_size, &cold)) {
      case KCU_CHOICE_MEASURED: s->stats.choices_measured++; break;
      case KCU_CHOICE_REUSED: s->stats.choices_reused++; break;
      default: break;
      }
    if (!attn) kcu_gemm_keep_tuned(&s->gemm[i]);
  }
  if ((st = kcu_fold_norms(s, &e->plan, err)) != KILN_OK) return st;
  if ((st = kcu_fold_norms_after(s, &e->plan, err)) != KILN_OK) return st;
  if ((st = kcu_choose_convs(s, &e->plan, err)) != KILN_OK) return st;
  if ((st = kcu_choose_attention(s, &e->plan, err)) != KILN_OK) return st;
  if ((st = kcu_fold_cache_writes(s, &e->plan, err)) != KILN_OK) return st;
  if ((st = kcu_plan_beside(s, &e->plan, err)) != KILN_OK) return st;
  cudaError_t rc;
  if (s->dynamic) {
    /* Graph slots are filled by calls; their address tables exist now. One eager run at the
     * bounds loads every kernel. */
    uint32_t per = s->n_in + s->n_out;
    if (!(s->slot_addr = (void **)kcu_calloc(s, (size_t)KCU_SHAPE_GRAPHS * per, sizeof(void *))))
      return kcu_oom(s, (size_t)KCU_SHAPE_GRAPHS * per * sizeof(void *), "graph slot tables", err);
    for (int g = 0; g < KCU_SHAPE_GRAPHS; g++) {
      s->graphs[g].in = s->slot_addr + (size_t)g * per;
      s->graphs[g].out = s->graphs[g].in + s->n_in;
    }
    rc = kcu_enqueue(s, &e->plan, s->dev_in, s->dev_out, s->whole_io);
  } else {
    if ((st = kcu_instantiate(s, &e->plan, s->whole_io, &s->graph_host, err)) != KILN_OK) return st;
    if ((st = kcu_instantiate(s, &e->plan, 0, &s->graph_dev, err)) != KILN_OK) return st;
    /* One replay loads every kernel now, so the first execute costs what the others do. */
    rc = cudaGraphLaunch(s->graph_host, s->stream);
  }
  if (rc == cudaSuccess) rc = cudaStreamSynchronize(s->stream);
  if (rc != cudaSuccess) return kcu_cuda_error(s, rc, "first run", err);
  return kcu_reset_state(e, err); /* that replay wrote the state with whatever the inputs held */
}

static kiln_status kcu_init(kiln_engine *e, kiln_error *err) {
  kcu_state *s = (kcu_state *)calloc(1, sizeof *s);
  if (!s || kcu_injected()) {
    free(s);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory for the CUDA engine's state; free memory and load again");
  }
  s->device = e->device_id;
  s->dynamic = e->plan.n_symbols > 0;
  e->impl = s;
  kiln_status st = kcu_init_state(e, s, err);
  if (st != KILN_OK) {
    kcu_destroy(e);
    return st;
  }
  /* The device holds the weights now; the host copy is not needed again. */
  free(e->weights);
  e->weights = NULL;
  return KILN_OK;
}

/* ---------------------------------------------------------------- execute */

static int kcu_reachable(const kcu_state *s, const struct cudaPointerAttributes *a, const void *ptr) {
  if (a->devicePointer == NULL) return 0;
  if (a->type != cudaMemoryTypeDevice || a->device == s->device || !s->ptr_attr) return 1;
  /* Memory of another device: usable only once the caller mapped it for this one. */
  unsigned long long flags = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
  if (s->ptr_attr(&flags, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS)
    return 1;
  return flags != CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
}

static kiln_status kcu_place(kcu_state *s, const kcu_io *io, const char *kind, void *ptr,
                             kcu_mode *mode, void **addr, kiln_error *err) {
  struct cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  cudaError_t rc = cudaPointerGetAttributes(&a, ptr);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.6s %.64s: CUDA cannot classify its buffer (%.48s); pass host memory or "
                     "memory usable from cuda:%d",
                     kind, io->name, cudaGetErrorString(rc), s->device);
  }
  if (a.type == cudaMemoryTypeUnregistered) {
    *mode = KCU_HOST;
    *addr = io->dev;
    return KILN_OK;
  }
  if (!kcu_reachable(s, &a, ptr))
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.6s %.64s is memory of cuda:%d, which cuda:%d cannot reach; enabling peer "
                     "access is the caller's process-wide decision, which a delegate does not "
                     "make on its behalf",
                     kind, io->name, a.device, s->device);
  if (a.type == cudaMemoryTypeHost || ((uintptr_t)a.devicePointer % KCU_BIND_ALIGN) != 0) {
    /* Pinned host memory: one DMA each way, not every kernel reading it across the link. Matmul
     * algorithms were chosen for aligned operands: copy the rare unaligned buffer too. */
    *mode = KCU_DEVSTAGE;
    *addr = io->dev;
    return KILN_OK;
  }
  *mode = KCU_BOUND;
  *addr = a.devicePointer;
  return KILN_OK;
}

static int kcu_same_addresses(const kcu_state *s) {
  for (uint32_t i = 0; i < s->n_in; i++)
    if (s->run_in[i] != s->dev_in[i]) return 0;
  for (uint32_t i = 0; i < s->n_out; i++)
    if (s->run_out[i] != s->dev_out[i]) return 0;
  return 1;
}

/* Runs the ops on the addresses in run_in/run_out through graph_dev, updated if they changed. */
static cudaError_t kcu_run_bound(kcu_state *s, const kiln_plan *p) {
  if (!kcu_same_addresses(s)) {
    cudaGraph_t graph;
    cudaError_t rc = kcu_capture(s, p, s->run_in, s->run_out, 0, &graph);
    int updated = 0;
    if (rc == cudaSuccess) {
      cudaGraphExecUpdateResultInfo info;
      updated = cudaGraphExecUpdate(s->graph_dev, graph, &info) == cudaSuccess;
      cudaGraphDestroy(graph);
    }
    cudaGetLastError();
    if (!updated) {
      /* The recording did not fit graph_dev: launch op by op; try the graph again next time. */
      for (uint32_t i = 0; i < s->n_in; i++) s->dev_in[i] = NULL;
      s->stats.direct_runs++;
      return kcu_enqueue(s, p, s->run_in, s->run_out, 0);
    }
    memcpy(s->dev_in, s->run_in, s->n_in * sizeof(void *));
    memcpy(s->dev_out, s->run_out, s->n_out * sizeof(void *));
    s->stats.graph_updates++;
  }
  s->stats.graph_replays++;
  return cudaGraphLaunch(s->graph_dev, s->stream);
}

/* This call's bytes of input i and output i (a dynamic plan's are at most the bound's). */
static size_t kcu_in_bytes(const kcu_state *s, const kiln_plan *p, uint32_t i) {
  return (size_t)p->tensors[s->in[i].tensor].nbytes;
}
static size_t kcu_out_bytes(const kcu_state *s, const kiln_plan *p, uint32_t i) {
  return (size_t)p->tensors[s->out[i].tensor].nbytes;
}

/* Moves caller input i (n bytes) into the engine's buffer unless it is bound in place. */
static cudaError_t kcu_stage_in(kcu_state *s, uint32_t i, const void *data, size_t n) {
  if (s->in_mode[i] == KCU_BOUND) {
    s->stats.bound++;
    return cudaSuccess;
  }
  s->stats.staged++;
  if (n == 0) return cudaSuccess;
  if (s->in_mode[i] == KCU_HOST) return kcu_stage_upload(&s->staging, s->stream, s->in[i].dev, data, n);
  return cudaMemcpyAsync(s->in[i].dev, data, n, cudaMemcpyDefault, s->stream);
}

/* Enqueues the copy of a device output that is not bound; host outputs wait for kcu_stage_out. */
static cudaError_t kcu_copy_device_out(kcu_state *s, uint32_t i, void *data, size_t n) {
  if (s->out_mode[i] == KCU_BOUND) {
    s->stats.bound++;
    return cudaSuccess;
  }
  s->stats.staged++;
  if (s->out_mode[i] == KCU_HOST || n == 0) return cudaSuccess;
  return cudaMemcpyAsync(data, s->out[i].dev, n, cudaMemcpyDefault, s->stream);
}

static kiln_status kcu_execute(kiln_engine *e, const kiln_tensor_view *inputs,
                               const kiln_tensor_view *outputs, kiln_error *err) {
  kcu_state *s = (kcu_state *)e->impl;
  const kiln_plan *p = kiln_engine_current(e); /* this call's sizes when the plan is dynamic */
  cudaError_t rc = cudaSetDevice(s->device);
  if (rc != cudaSuccess) return kcu_cuda_error(s, rc, "cudaSetDevice", err);
  int all_host = 1, any_bound = 0;
  for (uint32_t i = 0; i < s->n_in; i++) {
    kiln_status st = kcu_place(s, &s->in[i], "input", inputs[i].data, &s->in_mode[i], &s->run_in[i], err);
    if (st != KILN_OK) return st;
    all_host &= s->in_mode[i] == KCU_HOST;
    any_bound |= s->in_mode[i] == KCU_BOUND;
  }
  for (uint32_t i = 0; i < s->n_out; i++) {
    kiln_status st = kcu_place(s, &s->out[i], "output", outputs[i].data, &s->out_mode[i], &s->run_out[i], err);
    if (st != KILN_OK) return st;
    all_host &= s->out_mode[i] == KCU_HOST;
    any_bound |= s->out_mode[i] == KCU_BOUND;
  }
  int whole = all_host && s->whole_io;
  kiln_status shape_st = KILN_OK;
  if (whole) {
    /* Small host I/O: through the ring in one piece, the copies inside the graph. */
    for (uint32_t i = 0; i < s->n_in; i++)
      kcu_stage_copy(&s->staging, (char *)s->ring + s->in[i].ring_off, inputs[i].data,
                     kcu_in_bytes(s, p, i));
    s->stats.staged += s->n_in + s->n_out;
    if (s->dynamic) {
      shape_st = kcu_run_shape(s, e, p, 1, &rc, err);
    } else {
      s->stats.graph_replays++;
      rc = cudaGraphLaunch(s->graph_host, s->stream);
    }
  } else {
    for (uint32_t i = 0; rc == cudaSuccess && i < s->n_in; i++)
      rc = kcu_stage_in(s, i, inputs[i].data, kcu_in_bytes(s, p, i));
    if (rc == cudaSuccess && s->dynamic) {
      shape_st = kcu_run_shape(s, e, p, 0, &rc, err);
    } else if (rc == cudaSuccess && !any_bound && !s->whole_io) {
      s->stats.graph_replays++; /* every address is the engine's own: graph_host has just the ops */
      rc = cudaGraphLaunch(s->graph_host, s->stream);
    } else if (rc == cudaSuccess) {
      rc = kcu_run_bound(s, p);
    }
    for (uint32_t i = 0; rc == cudaSuccess && shape_st == KILN_OK && i < s->n_out; i++)
      rc = kcu_copy_device_out(s, i, outputs[i].data, kcu_out_bytes(s, p, i));
  }
  if (shape_st != KILN_OK) {
    /* refused before anything ran: wait for the staged copies already on the stream */
    cudaStreamSynchronize(s->stream);
    kcu_staging_idle(&s->staging);
    cudaGetLastError();
    return shape_st;
  }
  /* In-place outputs (a KV cache) go back into their input's buffer, wherever it lives. */
  for (uint32_t a = 0; rc == cudaSuccess && a < e->metadata.n_aliases; a++) {
    const kiln_alias *al = &e->metadata.aliases[a];
    void *dst = inputs[al->input].data;
    const void *src = s->run_out[al->output];
    if (dst != src && kcu_out_bytes(s, p, al->output))
      rc = cudaMemcpyAsync(dst, src, kcu_out_bytes(s, p, al->output), cudaMemcpyDefault, s->stream);
  }
  for (uint32_t i = 0; i < s->n_out; i++)
    if (s->out_mode[i] == KCU_HOST) s->stats.host_out_bytes += kcu_out_bytes(s, p, i);
  /* Host outputs leave in chunks, each copied out while the next one is still on the link. */
  for (uint32_t i = 0; rc == cudaSuccess && !whole && i < s->n_out; i++)
    if (s->out_mode[i] == KCU_HOST)
      rc = kcu_stage_download(&s->staging, s->stream, outputs[i].data, s->out[i].dev,
                              kcu_out_bytes(s, p, i));
  cudaError_t sync = cudaStreamSynchronize(s->stream);
  kcu_staging_idle(&s->staging);
  s->stats.stage_chunks = s->staging.ring.chunks;
  if (rc == cudaSuccess) rc = sync;
  if (rc != cudaSuccess) {
    cudaGetLastError();
    cudaMemset(s->fault_dev, 0, KCU_FAULT_BYTES); /* the run may have stopped before its last kernel */
    cudaGetLastError();
    return kiln_fail(err, KILN_ERR_INTERNAL,
                     "cuda:%d: the run failed (%.40s); usual causes, in order: an input buffer "
                     "shorter than its shape, a buffer freed during the call, a fault in another "
                     "delegate earlier in the same program; read the first error",
                     s->device, cudaGetErrorString(rc));
  }
  if (whole)
    for (uint32_t i = 0; i < s->n_out; i++)
      kcu_stage_copy(&s->staging, outputs[i].data, (char *)s->ring + s->out[i].ring_off,
                     kcu_out_bytes(s, p, i));
  if (s->fault_host[KCU_FAULT_WRITE]) {
    const long long *where = (const long long *)(const void *)(s->fault_host + KCU_FAULT_WHERE);
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "index_copy on cuda:%d: position %lld is outside the %lld slots of the "
                     "tensor (a state's cache length); nothing was written; pass positions from "
                     "0 to %lld",
                     s->device, where[0], where[1], where[1] - 1);
  }
  if (s->fault_host[KCU_FAULT_GATHER])
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "an index input holds a value outside its dim (embedding, index_select, "
                     "gather or index on cuda:%d); those elements were written as zeros: check "
                     "the index inputs", s->device);
  return KILN_OK;
}

/* ---------------------------------------------------------------- the table and accessors */

const kiln_backend kiln_cuda_backend = {"cuda", kcu_init, kcu_execute, kcu_destroy,
                                        kcu_reset_state};

int kiln_cuda_device_count(kiln_error *err) {
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count < 1) {
    cudaGetLastError();
    kiln_fail(err, KILN_ERR_UNAVAILABLE,
              "no CUDA GPU was found (%.64s); set KILN_DEVICE=cpu or the load option to run "
              "the CPU reference engine",
              rc != cudaSuccess ? cudaGetErrorString(rc) : "no device");
    return -1;
  }
  return count;
}

int kiln_cuda_buffer_device(const void *ptr) {
  struct cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    cudaGetLastError(); /* no driver or no device: no device memory either */
    return -1;
  }
  return a.type == cudaMemoryTypeDevice && a.hostPointer == NULL ? a.device : -1;
}

kiln_status kiln_cuda_engine_stats(const kiln_engine *e, kiln_cuda_stats *out, kiln_error *err) {
  if (!e || e->backend != &kiln_cuda_backend || !e->impl)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "the engine does not run on CUDA; load it with the CUDA device to read "
                     "its counters");
  *out = ((const kcu_state *)e->impl)->stats;
  return KILN_OK;
}

const void *kiln_cuda_engine_arena(const kiln_engine *e) {
  return e && e->backend == &kiln_cuda_backend && e->impl ? ((const kcu_state *)e->impl)->arena
                                                          : NULL;
}

kiln_status kiln_cuda_profile_ops(kiln_engine *e, int reps, double *ms, double *graph_ms,
                                  kiln_error *err) {
  if (!e || e->backend != &kiln_cuda_backend || !e->impl)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "the engine does not run on CUDA; load it with the CUDA device to profile "
                     "its ops");
  kcu_state *s = (kcu_state *)e->impl;
  const kiln_plan *p = &e->plan;
  void *in_addr[KILN_MAX_BINDINGS], *out_addr[KILN_MAX_BINDINGS];
  cudaEvent_t start = NULL, stop = NULL;
  for (uint32_t i = 0; i < s->n_in; i++) in_addr[i] = s->in[i].dev;
  for (uint32_t i = 0; i < s->n_out; i++) out_addr[i] = s->out[i].dev;
  cudaError_t rc = cudaSetDevice(s->device);
  if (s->dynamic) { /* GEMMs may hold a call's sizes: profile every op at the bounds */
    kiln_status st = kcu_prepare_shape(s, p, err);
    if (st != KILN_OK) return st;
  }
  if (rc == cudaSuccess) rc = cudaEventCreate(&start);
  if (rc == cudaSuccess) rc = cudaEventCreate(&stop);
  for (uint32_t i = 0; rc == cudaSuccess && i < p->n_ops; i++) {
    float elapsed = 0.0f;
    rc = kcu_run_op(s, p, i, s->stream, in_addr, out_addr); /* untimed: caches and clocks settle */
    if (rc == cudaSuccess) rc = cudaEventRecord(start, s->stream);
    for (int r = 0; rc == cudaSuccess && r < reps; r++)
      rc = kcu_run_op(s, p, i, s->stream, in_addr, out_addr);
    if (rc == cudaSuccess) rc = cudaEventRecord(stop, s->stream);
    if (rc == cudaSuccess) rc = cudaEventSynchronize(stop);
    if (rc == cudaSuccess) rc = cudaEventElapsedTime(&elapsed, start, stop);
    ms[i] = (double)elapsed / (reps > 0 ? reps : 1);
  }
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  float whole = 0.0f;
  if (rc == cudaSuccess) rc = kcu_capture(s, p, in_addr, out_addr, 0, &graph);
  if (rc == cudaSuccess) rc = cudaGraphInstantiate(&exec, graph, 0);
  if (rc == cudaSuccess) rc = cudaGraphLaunch(exec, s->stream); /* untimed, as each op's first */
  if (rc == cudaSuccess) rc = cudaEventRecord(start, s->stream);
  for (int r = 0; rc == cudaSuccess && r < reps; r++) rc = cudaGraphLaunch(exec, s->stream);
  if (rc == cudaSuccess) rc = cudaEventRecord(stop, s->stream);
  if (rc == cudaSuccess) rc = cudaEventSynchronize(stop);
  if (rc == cudaSuccess) rc = cudaEventElapsedTime(&whole, start, stop);
  *graph_ms = (double)whole / (reps > 0 ? reps : 1);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  if (rc != cudaSuccess) return kcu_cuda_error(s, rc, "profiling the ops", err);
  return KILN_OK;
}
