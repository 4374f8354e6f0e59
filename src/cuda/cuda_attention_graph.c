/* SDPA through cuDNN's fused attention engines (see cuda_attention_graph.h). */
#include "cuda_attention_graph.h"

#include <string.h>

enum { KCU_SDPA_Q = 1, KCU_SDPA_K, KCU_SDPA_V, KCU_SDPA_O, KCU_SDPA_SCALE, KCU_SDPA_MASKVAL,
       KCU_SDPA_VIRTUAL = 100 };

/* What a masked score becomes before the softmax: exp of it less the row's max is 0. */
#define KCU_SDPA_MASK_VALUE -1e30f

int kcu_sdpa_graph_shape(kcu_sdpa_shape *sh, const kcu_tensor *q, const kcu_tensor *k,
                         const kcu_tensor *v, const kcu_tensor *mask, const kcu_tensor *o,
                         const kcu_attn_geometry *geo, int causal) {
  memset(sh, 0, sizeof *sh);
  if (mask || q->rank != 4 || k->rank != 4 || v->rank != 4 || o->rank != 4 || geo->nb != 2)
    return 0;
  if (q->dtype != KILN_F16 && q->dtype != KILN_BF16) return 0;
  if (k->dtype != q->dtype || v->dtype != q->dtype || o->dtype != q->dtype) return 0;
  sh->b = q->dims[0], sh->hq = q->dims[1], sh->L = q->dims[2], sh->E = q->dims[3];
  sh->hk = k->dims[1], sh->S = k->dims[2], sh->Ev = v->dims[3];
  if (sh->L <= KCU_ATTN_SPLIT_ROWS || sh->S < 1 || sh->E % 8 || sh->Ev % 8 || sh->E > 256 ||
      sh->Ev > 256 || k->dims[3] != sh->E)
    return 0;
  if (k->dims[0] != sh->b || v->dims[0] != sh->b || o->dims[0] != sh->b || v->dims[1] != sh->hk ||
      v->dims[2] != sh->S || o->dims[1] != sh->hq || o->dims[2] != sh->L || o->dims[3] != sh->Ev ||
      sh->hk < 1 || sh->hq % sh->hk)
    return 0;
  /* geo's batch strides are 0 where an operand broadcasts: only k and v's single head may */
  if (geo->qb[0] == 0 && sh->b > 1) return 0;
  if ((geo->kb[0] == 0 || geo->vb[0] == 0) && sh->b > 1) return 0;
  const int64_t q_str[4] = {geo->qb[0], geo->qb[1], geo->q_row, 1};
  const int64_t k_str[4] = {geo->kb[0], geo->kb[1] ? geo->kb[1] : sh->S * geo->k_row, 1,
                            geo->k_row};
  const int64_t v_str[4] = {geo->vb[0], geo->vb[1] ? geo->vb[1] : sh->S * geo->v_row,
                            geo->v_row, 1};
  const int64_t o_str[4] = {geo->ob[0], geo->ob[1], geo->o_row, 1};
  memcpy(sh->q_str, q_str, sizeof q_str);
  memcpy(sh->k_str, k_str, sizeof k_str);
  memcpy(sh->v_str, v_str, sizeof v_str);
  memcpy(sh->o_str, o_str, sizeof o_str);
  /* a single batch entry may carry a 0 stride; cuDNN wants a real one */
  if (sh->q_str[0] == 0) sh->q_str[0] = sh->hq * sh->L * sh->E;
  if (sh->k_str[0] == 0) sh->k_str[0] = sh->hk * sh->S * sh->E;
  if (sh->v_str[0] == 0) sh->v_str[0] = sh->hk * sh->S * sh->Ev;
  if (sh->q_str[1] == 0) sh->q_str[1] = sh->L * sh->E;
  if (sh->o_str[0] == 0) sh->o_str[0] = sh->hq * sh->L * sh->Ev;
  sh->causal = causal;
  sh->dtype = q->dtype == KILN_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
  return 1;
}

/* A virtual f32 tensor [b, h, rows, cols] of the graph, packed. */
static cudnnStatus_t kcu_sdpa_virtual(kcu_dnn_set *set, cudnnBackendDescriptor_t *t, int64_t *uid,
                                      cudnnDataType_t dt, const kcu_sdpa_shape *sh, int64_t cols) {
  int64_t dims[4] = {sh->b, sh->hq, sh->L, cols};
  int64_t str[4] = {sh->hq * sh->L * cols, sh->L * cols, cols, 1};
  return kcu_dnn_tensor(set, t, (*uid)++, dt, 4, dims, str, 1, 0, 16);
}

static cudnnStatus_t kcu_sdpa_matmul(kcu_dnn_set *set, cudnnBackendDescriptor_t *node,
                                     cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                     cudnnBackendDescriptor_t c) {
  cudnnBackendDescriptor_t mm;
  cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  KCU_DNN_TRY(kcu_dnn_make(set, CUDNN_BACKEND_MATMUL_DESCRIPTOR, &mm));
  KCU_DNN_TRY(kcu_dnn_attr(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
  KCU_DNN_TRY(cudnnBackendFinalize(mm));
  KCU_DNN_TRY(kcu_dnn_make(set, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, node));
  KCU_DNN_TRY(kcu_dnn_attr_desc(*node, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a));
  KCU_DNN_TRY(kcu_dnn_attr_desc(*node, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b));
  KCU_DNN_TRY(kcu_dnn_attr_desc(*node, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c));
  KCU_DNN_TRY(kcu_dnn_attr_desc(*node, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm));
  return cudnnBackendFinalize(*node);
}

static cudnnStatus_t kcu_sdpa_reduce(kcu_dnn_set *set, cudnnBackendDescriptor_t *node,
                                     cudnnReduceTensorOp_t op, cudnnBackendDescriptor_t x,
                                     cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t red;
  cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  KCU_DNN_TRY(kcu_dnn_make(set, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, &red));
  KCU_DNN_TRY(kcu_dnn_attr(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
                           1, &op));
  KCU_DNN_TRY(kcu_dnn_attr(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
  KCU_DNN_TRY(cudnnBackendFinalize(red));
  KCU_DNN_TRY(kcu_dnn_make(set, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, node));
  KCU_DNN_TRY(kcu_dnn_attr_desc(*node, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x));
  KCU_DNN_TRY(kcu_dnn_attr_desc(*node, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y));
  KCU_DNN_TRY(kcu_dnn_attr_desc(*node, CUDNN_ATTR_OPERATION_REDUCTION_DESC, red));
  return cudnnBackendFinalize(*node);
}

/* The operation graph of sh into set (see cuda_attention_graph.h), tensors aligned as io is. */
static cudnnStatus_t kcu_sdpa_build(kcu_dnn_set *set, cudnnBackendDescriptor_t *graph,
                                    cudnnHandle_t h, const kcu_sdpa_shape *sh,
                                    void *const io[4]) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, dt = sh->dtype;
  int64_t q_dims[4] = {sh->b, sh->hq, sh->L, sh->E}, kt_dims[4] = {sh->b, sh->hk, sh->E, sh->S};
  int64_t v_dims[4] = {sh->b, sh->hk, sh->S, sh->Ev}, o_dims[4] = {sh->b, sh->hq, sh->L, sh->Ev};
  int64_t one[4] = {1, 1, 1, 1}, uid = KCU_SDPA_VIRTUAL;
  cudnnBackendDescriptor_t q, kt, v, o, scale, s, scaled, masked, mx, sub, ex, sum, lg, stats, p,
      op[16];
  int n = 0;
  KCU_DNN_TRY(kcu_dnn_tensor(set, &q, KCU_SDPA_Q, dt, 4, q_dims, sh->q_str, 0, 0,
                             kcu_dnn_alignment(io[0])));
  KCU_DNN_TRY(kcu_dnn_tensor(set, &kt, KCU_SDPA_K, dt, 4, kt_dims, sh->k_str, 0, 0,
                             kcu_dnn_alignment(io[1])));
  KCU_DNN_TRY(kcu_dnn_tensor(set, &v, KCU_SDPA_V, dt, 4, v_dims, sh->v_str, 0, 0,
                             kcu_dnn_alignment(io[2])));
  KCU_DNN_TRY(kcu_dnn_tensor(set, &o, KCU_SDPA_O, dt, 4, o_dims, sh->o_str, 0, 0,
                             kcu_dnn_alignment(io[3])));
  KCU_DNN_TRY(kcu_dnn_tensor(set, &scale, KCU_SDPA_SCALE, f32, 4, one, one, 0, 1, 16));
  KCU_DNN_TRY(kcu_sdpa_virtual(set, &s, &uid, f32, sh, sh->S));
  KCU_DNN_TRY(kcu_sdpa_matmul(set, &op[n++], q, kt, s));
  KCU_DNN_TRY(kcu_sdpa_virtual(set, &scaled, &uid, f32, sh, sh->S));
  KCU_DNN_TRY(kcu_dnn_pointwise(set, &op[n++], CUDNN_POINTWISE_MUL, f32, -1, s, scale, NULL,
                                scaled));
  masked = scaled;
  if (sh->causal) { /* top left: query row i sees keys 0..i */
    cudnnBackendDescriptor_t maskval, row, col, keep;
    KCU_DNN_TRY(kcu_dnn_tensor(set, &maskval, KCU_SDPA_MASKVAL, f32, 4, one, one, 0, 1, 16));
    KCU_DNN_TRY(kcu_sdpa_virtual(set, &row, &uid, f32, sh, sh->S));
    KCU_DNN_TRY(kcu_sdpa_virtual(set, &col, &uid, f32, sh, sh->S));
    KCU_DNN_TRY(kcu_sdpa_virtual(set, &keep, &uid, CUDNN_DATA_BOOLEAN, sh, sh->S));
    KCU_DNN_TRY(kcu_sdpa_virtual(set, &masked, &uid, f32, sh, sh->S));
    KCU_DNN_TRY(kcu_dnn_pointwise(set, &op[n++], CUDNN_POINTWISE_GEN_INDEX, f32, 2, scaled, NULL,
                                  NULL, row));
    KCU_DNN_TRY(kcu_dnn_pointwise(set, &op[n++], CUDNN_POINTWISE_GEN_INDEX, f32, 3, scaled, NULL,
                                  NULL, col));
    KCU_DNN_TRY(kcu_dnn_pointwise(set, &op[n++], CUDNN_POINTWISE_CMP_GE, f32, -1, row, col, NULL,
                                  keep));
    KCU_DNN_TRY(kcu_dnn_pointwise(set, &op[n++], CUDNN_POINTWISE_BINARY_SELECT, f32, -1, scaled,
                                  maskval, keep, masked));
  }
  KCU_DNN_TRY(kcu_sdpa_virtual(set, &mx, &uid, f32, sh, 1));
  KCU_DNN_TRY(kcu_sdpa_reduce(set, &op[n++], CUDNN_REDUCE_TENSOR_MAX, masked, mx));
  KCU_DNN_TRY(kcu_sdpa_virtual(set, &sub, &uid, f32, sh, sh->S));
  KCU_DNN_TRY(kcu_dnn_pointwise(set, &op[n++], CUDNN_POINTWISE_SUB, f32, -1, masked, mx, NULL,
                                sub));
  KCU_DNN_TRY(kcu_sdpa_virtual(set, &ex, &uid, f32, sh, sh->S));
  KCU_DNN_TRY(kcu_dnn_pointwise(set, &op[n++], CUDNN_POINTWISE_EXP, f32, -1, sub, NULL, NULL, ex));
  KCU_DNN_TRY(kcu_sdpa_virtual(set, &sum, &uid, f32, sh, 1));
  KCU_DNN_TRY(kcu_sdpa_reduce(set, &op[n++], CUDNN_REDUCE_TENSOR_ADD, ex, sum));
  KCU_DNN_TRY(kcu_sdpa_virtual(set, &lg, &uid, f32, sh, 1));
  KCU_DNN_TRY(kcu_dnn_pointwise(set, &op[n++], CUDNN_POINTWISE_LOG, f32, -1, sum, NULL, NULL, lg));
  KCU_DNN_TRY(kcu_sdpa_virtual(set, &stats, &uid, f32, sh, 1));
  KCU_DNN_TRY(kcu_dnn_pointwise(set, &op[n++], CUDNN_POINTWISE_ADD, f32, -1, mx, lg, NULL, stats));
  /* P in the I/O dtype: the engines take no f32 P (measured: no configuration offered) */
  KCU_DNN_TRY(kcu_sdpa_virtual(set, &p, &uid, dt, sh, sh->S));
  KCU_DNN_TRY(kcu_dnn_pointwise(set, &op[n++], CUDNN_POINTWISE_DIV, f32, -1, ex, sum, NULL, p));
  KCU_DNN_TRY(kcu_sdpa_matmul(set, &op[n++], p, v, o));
  return kcu_dnn_graph(set, graph, h, op, n);
}

/* The variant pack's slots for q, k, v, o and the by-value scalars of g's graph: a pack naming a
 * tensor its graph lacks does not run. */
static int kcu_sdpa_slots(const kcu_sdpa_graph *g, void *q, void *k, void *v, void *o,
                          int64_t *uid, void **ptr) {
  static const int64_t ids[KCU_SDPA_IO] = {KCU_SDPA_Q,     KCU_SDPA_K,    KCU_SDPA_V,
                                           KCU_SDPA_O,     KCU_SDPA_SCALE, KCU_SDPA_MASKVAL};
  void *p[KCU_SDPA_IO] = {q, k, v, o, (void *)&g->scale, (void *)&g->mask_value};
  memcpy(uid, ids, sizeof ids);
  memcpy(ptr, p, sizeof p);
  return g->causal ? KCU_SDPA_IO : KCU_SDPA_IO - 1; /* the mask value is the causal graph's */
}

typedef struct kcu_sdpa_call {
  cudnnHandle_t h;
  cudnnBackendDescriptor_t plan, pack;
} kcu_sdpa_call;

static cudaError_t kcu_sdpa_call_run(void *ctx, cudaStream_t s) {
  const kcu_sdpa_call *c = (const kcu_sdpa_call *)ctx;
  (void)s; /* the handle is bound to the stream */
  return cudnnBackendExecute(c->h, c->plan, c->pack) == CUDNN_STATUS_SUCCESS ? cudaSuccess
                                                                             : cudaErrorUnknown;
}

cudnnStatus_t kcu_sdpa_graph_choose(kcu_sdpa_graph *g, cudnnHandle_t h, cudaStream_t s,
                                    const kcu_sdpa_shape *sh, float scale, void *q, void *k,
                                    void *v, void *o, void *ws, size_t ws_size) {
  cudnnBackendDescriptor_t graph, heur, cfg[KCU_SDPA_MAX_PLANS], best_plan = NULL;
  cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  void *io[4] = {q, k, v, o}, *ptr[KCU_SDPA_IO];
  int64_t uid[KCU_SDPA_IO], count = 0;
  int best = -1;
  memset(g, 0, sizeof *g);
  g->scale = scale;
  g->mask_value = KCU_SDPA_MASK_VALUE;
  g->causal = sh->causal;
  int n_io = kcu_sdpa_slots(g, q, k, v, o, uid, ptr);
  cudnnStatus_t st = kcu_sdpa_build(&g->kept, &graph, h, sh, io);
  if (st == CUDNN_STATUS_SUCCESS) st = kcu_dnn_make(&g->kept, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);
  if (st == CUDNN_STATUS_SUCCESS)
    st = kcu_dnn_attr_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  if (st == CUDNN_STATUS_SUCCESS)
    st = kcu_dnn_attr(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(heur);
  for (int c = 0; st == CUDNN_STATUS_SUCCESS && c < KCU_SDPA_MAX_PLANS; c++)
    st = kcu_dnn_make(&g->kept, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[c]);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, KCU_SDPA_MAX_PLANS, &count, cfg);
  for (int c = 0; st == CUDNN_STATUS_SUCCESS && c < (int)count && c < KCU_SDPA_MAX_PLANS; c++) {
    kcu_sdpa_call call = {h, NULL, NULL};
    size_t need = 0;
    if (kcu_dnn_plan(h, cfg[c], &call.plan, &need) != CUDNN_STATUS_SUCCESS) continue;
    float us = -1.0f;
    if (need <= ws_size && kcu_dnn_pack(&call.pack, uid, n_io, ptr, ws) == CUDNN_STATUS_SUCCESS) {
      us = kcu_time_recorded(s, kcu_sdpa_call_run, &call);
      cudnnBackendDestroyDescriptor(call.pack);
    }
    if (us >= 0.0f && (best < 0 || us < g->time_us)) {
      if (best_plan) cudnnBackendDestroyDescriptor(best_plan);
      best_plan = call.plan;
      best = c;
      g->time_us = us;
      g->workspace = need;
    } else {
      cudnnBackendDestroyDescriptor(call.plan);
    }
  }
  unsigned notes = 0, behavior = 0;
  if (st == CUDNN_STATUS_SUCCESS && best >= 0)
    st = kcu_dnn_engine_of(cfg[best], &g->engine, &notes, &behavior);
  if (st == CUDNN_STATUS_SUCCESS && best >= 0 && g->kept.n < KCU_DNN_MAX_DESCS) {
    g->kept.d[g->kept.n++] = best_plan; /* released with the graph's descriptors */
    g->plan = best_plan;
    g->shape = *sh;
    for (int j = 0; j < 4; j++) g->align[j] = kcu_dnn_alignment(io[j]);
    return CUDNN_STATUS_SUCCESS;
  }
  if (best_plan) cudnnBackendDestroyDescriptor(best_plan);
  kcu_sdpa_graph_release(g);
  return st == CUDNN_STATUS_SUCCESS ? CUDNN_STATUS_NOT_SUPPORTED : st;
}

int kcu_sdpa_graph_share(kcu_sdpa_graph *g, const kcu_sdpa_graph *from, const kcu_sdpa_shape *sh,
                         float scale, void *q, void *k, void *v, void *o) {
  void *io[4] = {q, k, v, o};
  if (!from->plan || from->scale != scale || memcmp(&from->shape, sh, sizeof *sh) != 0) return 0;
  for (int j = 0; j < 4; j++)
    if (kcu_dnn_alignment(io[j]) < from->align[j]) return 0;
  *g = *from;
  g->kept.n = 0; /* the owner releases the plan and its descriptors */
  memset(&g->bound, 0, sizeof g->bound);
  g->shared = 1;
  return 1;
}

cudnnStatus_t kcu_sdpa_graph_run(kcu_sdpa_graph *g, cudnnHandle_t h, void *q, void *k, void *v,
                                 void *o, void *ws) {
  int64_t uid[KCU_SDPA_IO];
  void *ptr[KCU_SDPA_IO];
  int n_io = kcu_sdpa_slots(g, q, k, v, o, uid, ptr);
  return kcu_dnn_execute(h, g->plan, &g->bound, uid, n_io, ptr, ws);
}

void kcu_sdpa_graph_release(kcu_sdpa_graph *g) {
  kcu_dnn_unbind(&g->bound);
  kcu_dnn_release(&g->kept);
  g->plan = NULL;
}
