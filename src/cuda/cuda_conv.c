/* CONV and CONV_TRANSPOSE through cuDNN (see cuda_conv.h). A 1-d op is a 2-d one of height 1;
 * a transposed convolution is the backward-data pass of the convolution whose weight it holds,
 * followed by the epilogue kernel. */
#include "cuda_conv.h"

#include "runtime/vision_shape.h"

#include <limits.h>
#include <string.h>

static const float kcu_one = 1.0f, kcu_zero = 0.0f;

#define KCU_DNN(call, what)                                                                   \
  do {                                                                                        \
    cudnnStatus_t st_ = (call);                                                               \
    if (st_ != CUDNN_STATUS_SUCCESS) return kcu_dnn_fail(op_index, op, st_, what, err);       \
  } while (0)

static kiln_status kcu_dnn_fail(uint32_t i, const kiln_op *op, cudnnStatus_t st, const char *what,
                                kiln_error *err) {
  return kiln_fail(err, st == CUDNN_STATUS_ALLOC_FAILED ? KILN_ERR_OUT_OF_MEMORY : KILN_ERR_INTERNAL,
                   "op %u (%.14s): cuDNN %.32s failed: %.48s; check the cuDNN 9 install, or run "
                   "the program with KILN_DEVICE=cpu",
                   (unsigned)i, kiln_op_name(op->kind), what, cudnnGetErrorString(st));
}

static cudnnDataType_t kcu_dnn_type(kiln_dtype dt) {
  return dt == KILN_F16 ? CUDNN_DATA_HALF : dt == KILN_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

/* The op's tensors as [n, c, h, w] (h = 1 for a 1-d op), whatever their layout. */
typedef struct kcu_conv_geo {
  kiln_window win;
  int n, c, h, w, o, oh, ow, wk, wc; /* wk, wc: the filter's dim 0 and per-group dims */
} kcu_conv_geo;

static void kcu_conv_geo_of(const kiln_plan *p, const kiln_op *op, kcu_conv_geo *g) {
  const kiln_tensor_desc *in[KILN_MAX_OP_INPUTS], *x, *out = &p->tensors[op->output];
  kiln_conv_axes ax;
  for (uint32_t k = 0; k < op->n_inputs; k++) in[k] = &p->tensors[op->inputs[k]];
  x = in[0];
  kiln_window_of(op, in, &g->win);
  kiln_conv_axes_of(x->rank, g->win.channels_last, &ax);
  g->n = (int)x->dims[0];
  g->c = (int)x->dims[ax.channel];
  g->h = ax.height >= 0 ? (int)x->dims[ax.height] : 1;
  g->w = (int)x->dims[ax.width];
  g->o = (int)out->dims[ax.channel];
  g->oh = ax.height >= 0 ? (int)out->dims[ax.height] : 1;
  g->ow = (int)out->dims[ax.width];
  g->wk = (int)in[1]->dims[0];
  g->wc = (int)in[1]->dims[ax.w_per_group];
}

kiln_status kcu_check_conv(const kiln_plan *p, const kiln_op *op, uint32_t i, kiln_error *err) {
  const kiln_tensor_desc *x = &p->tensors[op->inputs[0]], *out = &p->tensors[op->output];
  const char *name = kiln_op_name(op->kind);
  kcu_conv_geo g;
  int64_t most = x->nbytes > out->nbytes ? (int64_t)x->nbytes : (int64_t)out->nbytes;
  if (x->dtype != KILN_F32 && x->dtype != KILN_F16 && x->dtype != KILN_BF16)
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "op %u (%.14s): cuDNN convolutions take f32, f16 or bf16, not %.8s; cast "
                     "the input before export", (unsigned)i, name, kiln_dtype_name(x->dtype));
  /* cuDNN's convolutions take int dims and index elements with 32 bits. */
  if (most / (int64_t)kiln_dtype_size(x->dtype) > INT_MAX ||
      (int64_t)p->tensors[op->inputs[1]].nbytes / (int64_t)kiln_dtype_size(x->dtype) > INT_MAX)
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "op %u (%.14s): a tensor of over 2^31-1 elements exceeds the 32-bit indexing "
                     "of cuDNN convolutions; export with a smaller batch", (unsigned)i, name);
  kcu_conv_geo_of(p, op, &g);
  if (op->kind == KILN_OP_CONV_TRANSPOSE &&
      (g.win.out_padding.h >= g.win.stride.h || g.win.out_padding.w >= g.win.stride.w))
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "op %u (%.14s): output padding %lldx%lld is not below the stride %lldx%lld, "
                     "which cuDNN needs; run the program with KILN_DEVICE=cpu", (unsigned)i, name,
                     (long long)g.win.out_padding.h, (long long)g.win.out_padding.w,
                     (long long)g.win.stride.h, (long long)g.win.stride.w);
  return KILN_OK;
}

kiln_status kcu_conv_handle(cudnnHandle_t *h, cudaStream_t stream, int device, kiln_error *err) {
  size_t version = cudnnGetVersion();
  *h = NULL;
  if (version < 90000)
    return kiln_fail(err, KILN_ERR_UNAVAILABLE,
                     "cuda:%d: the loaded cuDNN is version %llu but convolutions need 9.0 or newer; "
                     "install nvidia-cudnn-cu13 9.x or put cuDNN 9 on the library path",
                     device, (unsigned long long)version);
  cudnnStatus_t st = cudnnCreate(h);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetStream(*h, stream);
  if (st != CUDNN_STATUS_SUCCESS) {
    if (*h) cudnnDestroy(*h);
    *h = NULL;
    return kiln_fail(err, st == CUDNN_STATUS_ALLOC_FAILED ? KILN_ERR_OUT_OF_MEMORY
                                                          : KILN_ERR_UNAVAILABLE,
                     "cuda:%d: cuDNN could not start (%.48s); check that cuDNN 9's libraries "
                     "(libcudnn*.so.9) are on the library path beside libcudnn.so.9",
                     device, cudnnGetErrorString(st));
  }
  return KILN_OK;
}

/* The legacy descriptors of a transposed op: its backward-data pass takes them. */
static kiln_status kcu_conv_legacy_init(kcu_conv *c, const kiln_op *op, uint32_t op_index,
                                        const kcu_conv_geo *g, kiln_error *err) {
  cudnnTensorFormat_t fmt = c->channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  int n, ch, h, w;
  KCU_DNN(cudnnCreateTensorDescriptor(&c->x), "tensor descriptor");
  KCU_DNN(cudnnCreateTensorDescriptor(&c->y), "tensor descriptor");
  KCU_DNN(cudnnCreateFilterDescriptor(&c->w), "filter descriptor");
  KCU_DNN(cudnnCreateConvolutionDescriptor(&c->conv), "convolution descriptor");
  KCU_DNN(cudnnSetTensor4dDescriptor(c->x, fmt, c->dtype, g->n, g->c, g->h, g->w), "input shape");
  KCU_DNN(cudnnSetTensor4dDescriptor(c->y, fmt, c->dtype, g->n, g->o, g->oh, g->ow), "output shape");
  KCU_DNN(cudnnSetFilter4dDescriptor(c->w, c->dtype, fmt, g->wk, g->wc, (int)g->win.kernel.h,
                                     (int)g->win.kernel.w),
          "filter shape");
  KCU_DNN(cudnnSetConvolution2dDescriptor(c->conv, (int)g->win.padding.h, (int)g->win.padding.w,
                                          (int)g->win.stride.h, (int)g->win.stride.w,
                                          (int)g->win.dilation.h, (int)g->win.dilation.w,
                                          CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
          "convolution geometry");
  KCU_DNN(cudnnSetConvolutionGroupCount(c->conv, (int)g->win.groups), "group count");
  /* f32 stays on FMA units unless the blob allows TF32; halves take tensor cores. */
  KCU_DNN(cudnnSetConvolutionMathType(c->conv, c->dtype != CUDNN_DATA_FLOAT ? CUDNN_TENSOR_OP_MATH
                                               : c->allow_tf32 ? CUDNN_DEFAULT_MATH
                                                               : CUDNN_FMA_MATH),
          "math type");
  /* The forward convolution of the output side must give the input side exactly. */
  KCU_DNN(cudnnGetConvolution2dForwardOutputDim(c->conv, c->y, c->w, &n, &ch, &h, &w),
          "output shape check");
  if (n != g->n || ch != g->c || h != g->h || w != g->w)
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "op %u (%.14s): cuDNN computes a [%d,%d,%d,%d] side where the plan has "
                     "another; run the program with KILN_DEVICE=cpu",
                     (unsigned)op_index, kiln_op_name(op->kind), n, ch, h, w);
  return KILN_OK;
}

/* The forward op's graph shape, its output side checked against cuDNN's arithmetic. */
static kiln_status kcu_conv_shape_init(kcu_conv *c, const kiln_op *op, uint32_t op_index,
                                       const kcu_conv_geo *g, kiln_error *err) {
  kcu_conv_shape *sh = &c->shape;
  const kiln_pair *pad = &g->win.padding, *st = &g->win.stride, *dil = &g->win.dilation;
  int64_t oh = (g->h + 2 * pad->h - dil->h * (g->win.kernel.h - 1) - 1) / st->h + 1;
  int64_t ow = (g->w + 2 * pad->w - dil->w * (g->win.kernel.w - 1) - 1) / st->w + 1;
  if (oh != g->oh || ow != g->ow)
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "op %u (%.14s): cuDNN computes a [%d,%d,%lld,%lld] side where the plan has "
                     "another; run the program with KILN_DEVICE=cpu",
                     (unsigned)op_index, kiln_op_name(op->kind), g->n, g->o, (long long)oh,
                     (long long)ow);
  sh->x[0] = g->n, sh->x[1] = g->c, sh->x[2] = g->h, sh->x[3] = g->w;
  sh->w[0] = g->wk, sh->w[1] = g->wc, sh->w[2] = g->win.kernel.h, sh->w[3] = g->win.kernel.w;
  sh->y[0] = g->n, sh->y[1] = g->o, sh->y[2] = g->oh, sh->y[3] = g->ow;
  sh->pad[0] = pad->h, sh->pad[1] = pad->w;
  sh->stride[0] = st->h, sh->stride[1] = st->w;
  sh->dilation[0] = dil->h, sh->dilation[1] = dil->w;
  sh->channels_last = c->channels_last;
  sh->has_bias = c->has_bias;
  sh->residual = c->residual;
  sh->relu = c->relu;
  sh->dtype = c->dtype;
  sh->allow_tf32 = c->allow_tf32;
  c->graph.graphs = KCU_GRAPH_FUSED | KCU_GRAPH_PLAIN;
  return KILN_OK;
}

kiln_status kcu_conv_init(kcu_conv *c, const kiln_plan *p, uint32_t op_index, int64_t batch,
                          int allow_tf32, kiln_error *err) {
  const kiln_op *op = &p->ops[op_index];
  kcu_conv_geo g;
  memset(c, 0, sizeof *c);
  c->active = 1;
  kcu_conv_geo_of(p, op, &g);
  g.n = (int)batch;
  c->batch = batch;
  c->transposed = op->kind == KILN_OP_CONV_TRANSPOSE;
  c->channels_last = g.win.channels_last;
  c->has_bias = g.win.bias;
  c->residual = g.win.residual;
  c->relu = g.win.activation == KILN_ACT_RELU;
  c->allow_tf32 = allow_tf32;
  c->dtype = kcu_dnn_type(p->tensors[op->inputs[0]].dtype);
  c->channels = g.o;
  c->inner = c->channels_last ? 1 : (int64_t)g.oh * g.ow;
  return c->transposed ? kcu_conv_legacy_init(c, op, op_index, &g, err)
                       : kcu_conv_shape_init(c, op, op_index, &g, err);
}

int kcu_conv_piece_count(const kiln_plan *p, uint32_t i) {
  const kiln_op *op = &p->ops[i];
  kcu_conv_geo g;
  int dynamic = 0, n = 0;
  kcu_conv_geo_of(p, op, &g);
  for (uint32_t k = 0; k <= op->n_inputs; k++) {
    const kiln_tensor_desc *t = &p->tensors[k < op->n_inputs ? op->inputs[k] : op->output];
    /* x, the output and a residual have batch rows; the weight and bias do not */
    int rows = k == 0 || k == op->n_inputs || (g.win.residual && k == op->n_inputs - 1);
    for (int32_t d = 0; d < t->rank; d++) {
      if (!t->sym[d].symbol) continue;
      if (d != 0 || !rows) return -1;
      dynamic = 1;
    }
  }
  if (!dynamic) return 0;
  while (n < KCU_CONV_MAX_PIECES && ((int64_t)1 << n) < p->tensors[op->inputs[0]].dims[0]) n++;
  return n;
}

/* t narrowed to `rows` batch rows from row `first`. */
static void kcu_rows_of(kcu_tensor *t, int64_t first, int64_t rows) {
  int64_t row = t->dims[0] ? t->numel / t->dims[0] : 0;
  t->data = (char *)t->data + first * row * (int64_t)kiln_dtype_size(t->dtype);
  t->dims[0] = rows;
  t->numel = row * rows;
}

/* The op's tensors at `rows` batch rows from row `first`: x, the output and a residual move;
 * the weight and bias do not. */
static void kcu_conv_rows(const kcu_conv *c, const kcu_tensor *in, uint32_t n_in,
                          const kcu_tensor *out, int64_t first, int64_t rows, kcu_tensor *pin,
                          kcu_tensor *pout) {
  for (uint32_t k = 0; k < n_in; k++) pin[k] = in[k];
  *pout = *out;
  kcu_rows_of(&pin[0], first, rows);
  kcu_rows_of(pout, first, rows);
  if (c->residual) kcu_rows_of(&pin[n_in - 1], first, rows);
}

/* One measured or suggested backward-data algorithm. */
typedef struct kcu_algo {
  int algo;
  cudnnStatus_t status;
  float time;
  size_t memory;
  cudnnMathType_t math;
} kcu_algo;

#define KCU_MAX_ALGOS 16

/* 1 when a result may be kept: it ran, fits the workspace, and f32 without TF32 stays on FMA. */
static int kcu_algo_usable(const kcu_conv *c, const kcu_algo *a, size_t ws_size) {
  if (a->status != CUDNN_STATUS_SUCCESS || a->memory > ws_size) return 0;
  return c->dtype != CUDNN_DATA_FLOAT || c->allow_tf32 ||
         (a->math != CUDNN_TENSOR_OP_MATH && a->math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
}

/* The backward-data algorithms ranked fastest first, *found of them: measured with Find on the
 * buffers, or cuDNN's heuristic when Find cannot run. */
static kiln_status kcu_rank_algos(kcu_conv *c, cudnnHandle_t h, const kiln_op *op,
                                  uint32_t op_index, const kcu_tensor *in, const kcu_tensor *out,
                                  void *ws, size_t ws_size, kcu_algo *algos, int *found_out,
                                  kiln_error *err) {
  int found = 0;
  cudnnConvolutionBwdDataAlgoPerf_t perf[KCU_MAX_ALGOS];
  cudnnStatus_t st = cudnnFindConvolutionBackwardDataAlgorithmEx(
      h, c->w, in[1].data, c->x, in[0].data, c->conv, c->y, out->data, KCU_MAX_ALGOS, &found,
      perf, ws, ws_size);
  if (st != CUDNN_STATUS_SUCCESS)
    st = cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c->w, c->x, c->conv, c->y, KCU_MAX_ALGOS,
                                                     &found, perf);
  for (int k = 0; st == CUDNN_STATUS_SUCCESS && k < found; k++)
    algos[k] = (kcu_algo){(int)perf[k].algo, perf[k].status, perf[k].time, perf[k].memory,
                          perf[k].mathType};
  if (st != CUDNN_STATUS_SUCCESS) return kcu_dnn_fail(op_index, op, st, "algorithm search", err);
  *found_out = found < KCU_MAX_ALGOS ? found : KCU_MAX_ALGOS;
  return KILN_OK;
}

/* Makes algorithm a the op's own, with its math type and the workspace cuDNN says it needs. */
static cudnnStatus_t kcu_conv_keep(kcu_conv *c, cudnnHandle_t h, const kcu_algo *a) {
  size_t bytes = 0;
  /* f32 without TF32 stays on FMA math whatever Find ran it with (default math admits TF32). */
  int fma_only = c->dtype == CUDNN_DATA_FLOAT && !c->allow_tf32;
  cudnnStatus_t st = cudnnSetConvolutionMathType(c->conv, fma_only ? CUDNN_FMA_MATH : a->math);
  c->bwd = (cudnnConvolutionBwdDataAlgo_t)a->algo;
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnGetConvolutionBackwardDataWorkspaceSize(h, c->w, c->x, c->conv, c->y, c->bwd, &bytes);
  c->workspace = bytes > a->memory ? bytes : a->memory;
  return st;
}

static kiln_status kcu_no_algorithm(const kcu_conv *c, const kiln_op *op, uint32_t op_index,
                                    size_t ws_size, kiln_error *err) {
  return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                   "op %u (%.14s): cuDNN has no algorithm for this %.4s %.5s convolution within "
                   "%llu MiB of workspace; use channels-last f16/bf16 or KILN_DEVICE=cpu",
                   (unsigned)op_index, kiln_op_name(op->kind),
                   c->dtype == CUDNN_DATA_FLOAT ? "f32" : c->dtype == CUDNN_DATA_HALF ? "f16" : "bf16",
                   c->channels_last ? "NHWC" : "NCHW", (unsigned long long)(ws_size >> 20));
}

static kcu_conv_io kcu_io_of(const kcu_conv *c, const kcu_tensor *in, uint32_t n_in,
                             const kcu_tensor *out) {
  kcu_conv_io io;
  io.x = in[0].data;
  io.w = in[1].data;
  io.y = out->data;
  io.bias = c->has_bias ? in[2].data : NULL;
  io.residual = c->residual ? in[n_in - 1].data : NULL;
  return io;
}

kiln_status kcu_conv_choose(kcu_conv *c, cudnnHandle_t h, cudaStream_t s, const kiln_plan *p,
                            uint32_t op_index, const kcu_tensor *in, const kcu_tensor *out,
                            void *ws, size_t ws_size, const kcu_conv *earlier,
                            uint32_t n_earlier, double *compile_left, kiln_error *err) {
  const kiln_op *op = &p->ops[op_index];
  kcu_tensor pin[KILN_MAX_OP_INPUTS], pout;
  if (c->batch < in[0].dims[0]) {
    /* a piece: timed on rows from the second, whose addresses are the least aligned any call
     * gives it (a row's multiple past a base aligned to 16 bytes) */
    kcu_conv_rows(c, in, op->n_inputs, out, 1, c->batch, pin, &pout);
    in = pin, out = &pout;
  }
  if (!c->transposed) {
    kcu_conv_io io = kcu_io_of(c, in, op->n_inputs, out);
    int shared = 0;
    /* ResNet's repeated blocks: one plan per shape, chosen once */
    for (uint32_t j = 0; j < n_earlier && !shared; j++)
      shared = earlier[j].active && !earlier[j].transposed && !earlier[j].graph.shared &&
               memcmp(&earlier[j].shape, &c->shape, sizeof c->shape) == 0 &&
               kcu_conv_graph_share(&c->graph, &earlier[j].graph, &io);
    cudnnStatus_t st = shared ? CUDNN_STATUS_SUCCESS
                              : kcu_conv_graph_choose(&c->graph, h, s, &c->shape, &io, out,
                                                      c->channels, c->inner, ws, ws_size,
                                                      compile_left);
    if (st == CUDNN_STATUS_NOT_SUPPORTED) return kcu_no_algorithm(c, op, op_index, ws_size, err);
    KCU_DNN(st, "execution plan");
    c->workspace = c->graph.workspace;
  } else {
    kcu_algo algos[KCU_MAX_ALGOS];
    const kcu_algo *best = NULL;
    int found = 0;
    kiln_status ks = kcu_rank_algos(c, h, op, op_index, in, out, ws, ws_size, algos, &found, err);
    if (ks != KILN_OK) return ks;
    for (int k = 0; k < found && !best; k++)
      if (kcu_algo_usable(c, &algos[k], ws_size)) best = &algos[k];
    if (!best) return kcu_no_algorithm(c, op, op_index, ws_size, err);
    KCU_DNN(kcu_conv_keep(c, h, best), "workspace query");
  }
  cudaError_t rc = kcu_conv_run(c, h, s, in, op->n_inputs, out, ws, ws_size);
  if (rc == cudaSuccess) rc = cudaStreamSynchronize(s);
  if (rc != cudaSuccess)
    return kiln_fail(err, KILN_ERR_INTERNAL,
                     "op %u (%.14s): the first run of the chosen cuDNN %.9s %lld failed "
                     "(%.48s); run the program with KILN_DEVICE=cpu and report it",
                     (unsigned)op_index, kiln_op_name(op->kind),
                     c->transposed ? "algorithm" : "engine",
                     c->transposed ? (long long)c->bwd : (long long)c->graph.engine,
                     cudaGetErrorString(rc));
  return KILN_OK;
}

/* The op at c's own batch. */
static cudaError_t kcu_conv_run_one(kcu_conv *c, cudnnHandle_t h, cudaStream_t s,
                                    const kcu_tensor *in, uint32_t n_in, const kcu_tensor *out,
                                    void *ws, size_t ws_size) {
  kcu_conv_io io = kcu_io_of(c, in, n_in, out);
  cudnnStatus_t st;
  if (!c->transposed) {
    st = kcu_conv_graph_run(&c->graph, h, &io, ws);
    if (c->graph.fused) return st == CUDNN_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
  } else {
    st = cudnnConvolutionBackwardData(h, &kcu_one, c->w, in[1].data, c->x, in[0].data, c->conv,
                                      c->bwd, ws, ws_size, &kcu_zero, c->y, out->data);
  }
  if (st != CUDNN_STATUS_SUCCESS) return cudaErrorUnknown;
  if (!io.bias && !io.residual && !c->relu) return cudaSuccess;
  return kcu_conv_epilogue(s, out, io.bias, io.residual, c->channels, c->inner, c->relu);
}

int kcu_conv_fused_residual(const kcu_conv *c) {
  int fused = !c->transposed && c->residual && c->graph.fused;
  for (int j = 0; j < c->n_pieces; j++) fused |= kcu_conv_fused_residual(&c->pieces[j]);
  return fused;
}

cudaError_t kcu_conv_run(kcu_conv *c, cudnnHandle_t h, cudaStream_t s, const kcu_tensor *in,
                         uint32_t n_in, const kcu_tensor *out, void *ws, size_t ws_size) {
  int64_t n = in[0].dims[0], first = 0;
  kcu_tensor pin[KILN_MAX_OP_INPUTS], pout;
  if (n == c->batch || !c->n_pieces) return kcu_conv_run_one(c, h, s, in, n_in, out, ws, ws_size);
  if (n > c->batch) return cudaErrorInvalidValue; /* the bounds were checked: never */
  for (int j = c->n_pieces; j-- > 0;) {
    int64_t rows = (int64_t)1 << j;
    if (!(n & rows)) continue;
    kcu_conv_rows(c, in, n_in, out, first, rows, pin, &pout);
    cudaError_t rc = kcu_conv_run_one(&c->pieces[j], h, s, pin, n_in, &pout, ws, ws_size);
    if (rc != cudaSuccess) return rc;
    first += rows;
  }
  return cudaSuccess;
}

void kcu_conv_release(kcu_conv *c) {
  if (!c->active) return;
  for (int j = 0; j < c->n_pieces; j++) kcu_conv_release(&c->pieces[j]);
  kcu_conv_graph_release(&c->graph);
  if (c->x) cudnnDestroyTensorDescriptor(c->x);
  if (c->y) cudnnDestroyTensorDescriptor(c->y);
  if (c->w) cudnnDestroyFilterDescriptor(c->w);
  if (c->conv) cudnnDestroyConvolutionDescriptor(c->conv);
  memset(c, 0, sizeof *c);
}
