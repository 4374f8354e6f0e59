/* execute allocates nothing: this program replaces malloc and its relatives with counting
 * wrappers around glibc's allocator and runs plans that together touch every op kind (checked
 * against the op enum, so a new kind fails here until a plan runs it). Under
 * AddressSanitizer, which owns malloc, the count is not taken and the runs still are. */
#include "fused_programs.h"
#include "test_cpu_harness.h"

#include <errno.h>

#include "counting_malloc.h"

static kiln_error err;
static int kind_ran[KILN_OP_COUNT]; /* op kinds the counted executes ran */

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})
#define IDS(...) ((const uint32_t[]){__VA_ARGS__})
#define BUFS(...) ((void *const[]){__VA_ARGS__})

/* Runs g once uncounted (init) and then counts the allocations of two executes. */
static long count_execute(graph *g, void *const *in, void *const *out) {
  kiln_engine *e = g_engine(g);
  kiln_status st = kiln_cpu_backend.init(e, &err);
  if (st != KILN_OK) fprintf(stderr, "init: %s\n", err.message);
  CHECK(st == KILN_OK);
  counting = 1;
  allocations = 0;
  for (int run = 0; run < 2; run++) CHECK(g_execute(e, g, in, out, &err) == KILN_OK);
  counting = 0;
  for (uint32_t i = 0; i < g->n_ops; i++) kind_ran[g->ops[i].kind] = 1;
  kiln_cpu_backend.destroy(e);
  free(e);
  return allocations;
}

static void test_gemm_norm_layout(void) {
  float x[12], w[16], y[6] = {0};
  uint32_t seed = 1;
  for (int i = 0; i < 12; i++) x[i] = (float)next_random(&seed);
  for (int i = 0; i < 16; i++) w[i] = (float)next_random(&seed);
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(3, 4));
  uint32_t tw = g_weight(g, KILN_F32, 2, DIMS(4, 4), w);
  uint32_t t1 = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 2, DIMS(3, 4));
  uint32_t t2 = g_tensor(g, KILN_STORE_ARENA, KILN_F16, 2, DIMS(3, 4));
  uint32_t t3 = g_tensor(g, KILN_STORE_ARENA, KILN_F16, 2, DIMS(4, 3));
  uint32_t t4 = g_tensor(g, KILN_STORE_ARENA, KILN_F16, 2, DIMS(4, 6));
  uint32_t t5 = g_tensor(g, KILN_STORE_ARENA, KILN_F16, 2, DIMS(2, 6));
  uint32_t t6 = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 2, DIMS(2, 6));
  uint32_t out = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 1, DIMS(6));
  g_op(g, KILN_OP_MATMUL, 2, IDS(tx, tw), t1, 0, NULL, 0);
  g_op(g, KILN_OP_CAST, 1, IDS(t1), t2, 1, DIMS(KILN_F16), 0);
  g_op(g, KILN_OP_PERMUTE, 1, IDS(t2), t3, 2, DIMS(1, 0), 0);
  g_op(g, KILN_OP_CAT, 2, IDS(t3, t3), t4, 1, DIMS(1), 0);
  g_op(g, KILN_OP_SLICE, 1, IDS(t4), t5, 4, DIMS(0, 1, 4, 2), 0);
  g_op(g, KILN_OP_LAYER_NORM, 1, IDS(t5), t6, 2, DIMS(1, 0), 1e-5);
  g_op(g, KILN_OP_AMAX, 1, IDS(t6), out, 2, DIMS(1, 0), 0);
  CHECK(count_execute(g, BUFS(x), BUFS(y)) == 0);
  CHECK(y[0] != 0.0f); /* the plan ran */
  free(g);
}

static void test_attention_gather(void) {
  float q[24], table[8] = {1, 2, 3, 4, 5, 6, 7, 8}, o[24] = {0}, rows[4] = {0};
  int64_t idx[2] = {3, 1};
  uint8_t keep[9] = {1, 0, 1, 1, 1, 0, 0, 1, 1}, pick[3] = {1, 0, 1};
  uint32_t seed = 2;
  for (int i = 0; i < 24; i++) q[i] = (float)next_random(&seed);
  graph *g = g_new();
  uint32_t tq = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 4, DIMS(1, 2, 3, 4));
  uint32_t tm = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 2, DIMS(3, 3));
  uint32_t ti = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(2));
  uint32_t tc = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 2, DIMS(3, 1));
  uint32_t tt = g_weight(g, KILN_F32, 2, DIMS(4, 2), table);
  uint32_t t1 = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 4, DIMS(1, 2, 3, 4));
  uint32_t t2 = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 4, DIMS(1, 2, 3, 4));
  uint32_t t3 = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 4, DIMS(1, 2, 3, 4));
  uint32_t out = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 4, DIMS(1, 2, 3, 4));
  uint32_t emb = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 2));
  g_op(g, KILN_OP_SDPA, 4, IDS(tq, tq, tq, tm), t1, 2, DIMS(1, 1), 0);
  g_op(g, KILN_OP_SOFTMAX, 1, IDS(t1), t2, 1, DIMS(3), 0);
  g_op(g, KILN_OP_GELU, 1, IDS(t2), t3, 1, DIMS(0), 0);
  g_op(g, KILN_OP_WHERE, 3, IDS(tc, t3, t2), out, 0, NULL, 0);
  g_op(g, KILN_OP_EMBEDDING, 2, IDS(tt, ti), emb, 0, NULL, 0);
  CHECK(count_execute(g, BUFS(q, keep, idx, pick), BUFS(o, rows)) == 0);
  CHECK(rows[0] == 7.0f && rows[3] == 4.0f);
  free(g);
}

/* The kinds the other plans leave out, in one chain of f32 [2,3] tensors. */
static void test_remaining_kinds(void) {
  static const float w[12] = {1, 2, 3, 4, -1, 0.5f, 2, 1, 0, 1, -2, 3}, bias[3] = {0.5f, -1, 2},
                     den[3] = {2, 4, -8};
  static const int64_t pick[2] = {2, 0};
  float x[8], y[6] = {0}, z[4] = {0};
  uint32_t seed = 3, t[24];
  for (int i = 0; i < 8; i++) x[i] = (float)next_random(&seed);
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 4));
  uint32_t tw = g_weight(g, KILN_F32, 2, DIMS(3, 4), w);
  uint32_t tb = g_weight(g, KILN_F32, 1, DIMS(3), bias);
  uint32_t td = g_weight(g, KILN_F32, 1, DIMS(3), den);
  uint32_t ti = g_weight(g, KILN_I64, 1, DIMS(2), pick);
  for (int i = 0; i < 17; i++) t[i] = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 2, DIMS(2, 3));
  uint32_t sum = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 2, DIMS(2, 1));
  uint32_t mean = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 1, DIMS(3));
  uint32_t flat = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 2, DIMS(3, 2));
  uint32_t row = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 1, DIMS(2));
  uint32_t wide = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 2, DIMS(2, 3));
  uint32_t out = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 3));
  uint32_t cols = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 2));
  static const kiln_op_kind unary[] = {KILN_OP_RELU, KILN_OP_SILU, KILN_OP_SIGMOID, KILN_OP_TANH,
                                       KILN_OP_EXP,  KILN_OP_SQRT, KILN_OP_RSQRT,   KILN_OP_NEG};
  g_op(g, KILN_OP_LINEAR, 3, IDS(tx, tw, tb), t[0], 1, DIMS(KILN_ACT_NONE), 0);
  g_op(g, KILN_OP_ADD, 2, IDS(t[0], t[0]), t[1], 0, NULL, 1.0);
  g_op(g, KILN_OP_SUB, 2, IDS(t[1], t[0]), t[2], 0, NULL, 0.5);
  g_op(g, KILN_OP_MUL, 2, IDS(t[2], t[1]), t[3], 0, NULL, 0);
  g_op(g, KILN_OP_DIV, 2, IDS(t[3], td), t[4], 0, NULL, 0);
  for (int i = 0; i < 8; i++) g_op(g, unary[i], 1, IDS(t[4 + i]), t[5 + i], 0, NULL, 0);
  g_op(g, KILN_OP_POW, 1, IDS(t[12]), t[13], 0, NULL, 2.0);
  g_op(g, KILN_OP_LOG_SOFTMAX, 1, IDS(t[13]), t[14], 1, DIMS(1), 0);
  g_op(g, KILN_OP_RMS_NORM, 1, IDS(t[14]), t[15], 2, DIMS(1, 0), 1e-6);
  g_op(g, KILN_OP_SUM, 1, IDS(t[15]), sum, 2, DIMS(2, 1), 0);
  g_op(g, KILN_OP_MEAN, 1, IDS(t[15]), mean, 2, DIMS(1, 0), 0);
  g_op(g, KILN_OP_RESHAPE, 1, IDS(t[15]), flat, 2, DIMS(3, 2), 0);
  g_op(g, KILN_OP_SELECT, 1, IDS(flat), row, 2, DIMS(0, 1), 0);
  g_op(g, KILN_OP_EXPAND, 1, IDS(mean), wide, 2, DIMS(2, 3), 0);
  g_op(g, KILN_OP_COPY, 1, IDS(wide), t[16], 0, NULL, 0);
  g_op(g, KILN_OP_INDEX_SELECT, 2, IDS(t[16], ti), cols, 1, DIMS(1), 0);
  t[17] = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 2, DIMS(2, 3));
  g_op(g, KILN_OP_MINIMUM, 2, IDS(t[16], t[15]), t[17], 0, NULL, 0);
  g_op(g, KILN_OP_POINTWISE, 2, IDS(t[16], t[15]), out, 2,
       DIMS(KILN_PW_STEP(KILN_OP_RELU, 0, 0), KILN_PW_STEP(KILN_OP_ADD, 1, 0)), 0);
  CHECK(count_execute(g, BUFS(x), BUFS(y, z)) == 0);
  CHECK(z[0] != 0.0f || z[1] != 0.0f); /* the plan ran */
  free(g);
}

/* A cache row written in place at a position input, then read out: the state is the engine's,
 * kept across the two counted runs, and nothing is allocated. */
static void test_state_write(void) {
  float cache[8] = {0}, row[2] = {1.5f, -2.0f}, y[8] = {0};
  int64_t pos[1] = {2};
  graph *g = g_new();
  uint32_t tp = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(1));
  uint32_t tr = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(1, 2));
  uint32_t base = g_state(g, KILN_F32, 2, DIMS(4, 2), cache);
  uint32_t written = g_state_written(g, base);
  uint32_t out = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(4, 2));
  g_op(g, KILN_OP_INDEX_COPY, 3, IDS(base, tp, tr), written, 1, DIMS(0), 0);
  g_op(g, KILN_OP_COPY, 1, IDS(written), out, 0, NULL, 0);
  CHECK(count_execute(g, BUFS(pos, row), BUFS(y)) == 0);
  CHECK(y[4] == 1.5f && y[5] == -2.0f && y[0] == 0.0f && y[7] == 0.0f);
  free(g);
}

/* Every op kind of the enum ran in a counted execute. */
static void test_every_kind_ran(void) {
  int missing = 0;
  for (int k = 0; k < KILN_OP_COUNT; k++)
    if (!kind_ran[k]) missing++, fprintf(stderr, "no plan here runs op kind %s\n", kiln_op_name((kiln_op_kind)k));
  CHECK(missing == 0);
}

/* A mask from comparisons and boolean ops on positions; every new float unary op in a row. */
static void test_logic_and_math(void) {
  float x[6] = {-2.0f, -0.5f, 0.0f, 0.5f, 1.0f, 4.0f}, y[6] = {0};
  int64_t ids[3] = {0, 1, 2};
  uint8_t mask[9] = {0};
  graph *g = g_new();
  uint32_t ti = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(3));
  uint32_t tc = g_tensor(g, KILN_STORE_ARENA, KILN_I64, 2, DIMS(3, 1));
  uint32_t t1 = g_tensor(g, KILN_STORE_ARENA, KILN_BOOL, 2, DIMS(3, 3));
  uint32_t t2 = g_tensor(g, KILN_STORE_ARENA, KILN_BOOL, 2, DIMS(3, 3));
  uint32_t t3 = g_tensor(g, KILN_STORE_ARENA, KILN_I64, 2, DIMS(3, 1));
  uint32_t tm = g_tensor(g, KILN_STORE_OUTPUT, KILN_BOOL, 2, DIMS(3, 3));
  g_op(g, KILN_OP_RESHAPE, 1, IDS(ti), tc, 2, DIMS(3, 1), 0);
  g_op(g, KILN_OP_COMPARE, 2, IDS(ti, tc), t1, 1, DIMS(KILN_CMP_LE), 0);
  g_op(g, KILN_OP_BITWISE, 1, IDS(t1), t2, 1, DIMS(KILN_BOOL_NOT), 0);
  g_op(g, KILN_OP_ABS, 1, IDS(tc), t3, 0, NULL, 0);
  g_op(g, KILN_OP_LOGICAL, 2, IDS(t2, t3), tm, 1, DIMS(KILN_BOOL_XOR), 0);
  static const kiln_op_kind unary[7] = {KILN_OP_ABS, KILN_OP_LOG, KILN_OP_COS, KILN_OP_SIN,
                                        KILN_OP_ERF, KILN_OP_HARDSWISH, KILN_OP_HARDSIGMOID};
  graph *h = g_new();
  uint32_t hx = g_tensor(h, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 3));
  uint32_t prev = hx;
  for (int k = 0; k < 7; k++) {
    uint32_t t = g_tensor(h, KILN_STORE_ARENA, KILN_F32, 2, DIMS(2, 3));
    g_op(h, unary[k], 1, IDS(prev), t, 0, NULL, 0);
    prev = t;
  }
  uint32_t hy = g_tensor(h, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 3));
  g_op(h, KILN_OP_MAXIMUM, 2, IDS(prev, hx), hy, 0, NULL, 0);
  CHECK(count_execute(g, BUFS(ids), BUFS(mask)) == 0);
  CHECK(mask[0] == 0 && mask[1] == 1 && mask[3] == 1); /* mask[i][j]: (j > i) xor (i != 0) */
  CHECK(count_execute(h, BUFS(x), BUFS(y)) == 0);
  CHECK(y[5] == 4.0f);
  free(g);
  free(h);
}

static void test_vision(void) {
  float x[2 * 6 * 6], w[3 * 2 * 3 * 3], y[3 * 2 * 2] = {0};
  float stats[3] = {0.5f, 1.0f, 2.0f};
  uint32_t seed = 3;
  for (int i = 0; i < 72; i++) x[i] = (float)next_random(&seed);
  for (int i = 0; i < 54; i++) w[i] = (float)next_random(&seed);
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 4, DIMS(1, 2, 6, 6));
  uint32_t tw = g_weight(g, KILN_F32, 4, DIMS(3, 2, 3, 3), w);
  uint32_t ts = g_weight(g, KILN_F32, 1, DIMS(3), stats);
  uint32_t c1 = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 4, DIMS(1, 3, 6, 6));
  uint32_t c2 = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 4, DIMS(1, 3, 6, 6));
  uint32_t c3 = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 4, DIMS(1, 3, 3, 3));
  uint32_t c4 = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 4, DIMS(1, 3, 6, 6));
  uint32_t c5 = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 4, DIMS(1, 3, 6, 6));
  uint32_t c6 = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 4, DIMS(1, 3, 3, 3));
  uint32_t ty = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 4, DIMS(1, 3, 2, 2));
  g_op(g, KILN_OP_CONV, 2, IDS(tx, tw), c1, 5,
       DIMS(KILN_PAIR(1, 1), KILN_PAIR(1, 1), KILN_PAIR(1, 1), 1, 0), 0);
  g_op(g, KILN_OP_BATCH_NORM, 3, IDS(c1, ts, ts), c2, 1, DIMS(0), 1e-5);
  g_op(g, KILN_OP_MAX_POOL2D, 1, IDS(c2), c3, 5,
       DIMS(KILN_PAIR(3, 3), KILN_PAIR(2, 2), KILN_PAIR(1, 1), KILN_PAIR(1, 1), 0), 0);
  g_op(g, KILN_OP_UPSAMPLE_BILINEAR2D, 1, IDS(c3), c4, 2, DIMS(KILN_PAIR(6, 6), 0), 0);
  g_op(g, KILN_OP_UPSAMPLE_NEAREST2D, 1, IDS(c4), c5, 1, DIMS(KILN_PAIR(6, 6)), 0);
  g_op(g, KILN_OP_AVG_POOL2D, 1, IDS(c5), c6, 6,
       DIMS(KILN_PAIR(2, 2), KILN_PAIR(2, 2), KILN_PAIR(0, 0), 0, 1, 0), 0);
  g_op(g, KILN_OP_ADAPTIVE_AVG_POOL2D, 1, IDS(c6), ty, 1, DIMS(KILN_PAIR(2, 2)), 0);
  CHECK(count_execute(g, BUFS(x), BUFS(y)) == 0);
  CHECK(y[0] != 0.0f);
  free(g);

  graph *l = g_new(); /* the pooling and resize ops on channels_last [N,H,W,C] */
  float last_out[3] = {0};
  uint32_t lx = g_tensor(l, KILN_STORE_INPUT, KILN_F32, 4, DIMS(1, 6, 6, 2));
  uint32_t l1 = g_tensor(l, KILN_STORE_ARENA, KILN_F32, 4, DIMS(1, 3, 3, 2));
  uint32_t l2 = g_tensor(l, KILN_STORE_ARENA, KILN_F32, 4, DIMS(1, 6, 6, 2));
  uint32_t l3 = g_tensor(l, KILN_STORE_ARENA, KILN_F32, 4, DIMS(1, 12, 12, 2));
  uint32_t l4 = g_tensor(l, KILN_STORE_ARENA, KILN_F32, 4, DIMS(1, 6, 6, 2));
  uint32_t ly = g_tensor(l, KILN_STORE_OUTPUT, KILN_F32, 4, DIMS(1, 1, 1, 2));
  g_op(l, KILN_OP_MAX_POOL2D, 1, IDS(lx), l1, 6,
       DIMS(KILN_PAIR(3, 3), KILN_PAIR(2, 2), KILN_PAIR(1, 1), KILN_PAIR(1, 1), 0, 1), 0);
  g_op(l, KILN_OP_UPSAMPLE_BILINEAR2D, 1, IDS(l1), l2, 3, DIMS(KILN_PAIR(6, 6), 0, 1), 0);
  g_op(l, KILN_OP_UPSAMPLE_NEAREST2D, 1, IDS(l2), l3, 2, DIMS(KILN_PAIR(12, 12), 1), 0);
  g_op(l, KILN_OP_AVG_POOL2D, 1, IDS(l3), l4, 7,
       DIMS(KILN_PAIR(2, 2), KILN_PAIR(2, 2), KILN_PAIR(0, 0), 0, 1, 0, 1), 0);
  g_op(l, KILN_OP_ADAPTIVE_AVG_POOL2D, 1, IDS(l4), ly, 2, DIMS(KILN_PAIR(1, 1), 1), 0);
  CHECK(count_execute(l, BUFS(x), BUFS(last_out)) == 0);
  CHECK(last_out[0] != 0.0f);
  free(l);

  graph *h = g_new(); /* the transposed convolution */
  uint32_t hx = g_tensor(h, KILN_STORE_INPUT, KILN_F32, 4, DIMS(1, 3, 2, 2));
  uint32_t hw = g_weight(h, KILN_F32, 4, DIMS(3, 2, 3, 3), w);
  uint32_t hy = g_tensor(h, KILN_STORE_OUTPUT, KILN_F32, 4, DIMS(1, 2, 3, 3));
  float out[18] = {0};
  g_op(h, KILN_OP_CONV_TRANSPOSE, 2, IDS(hx, hw), hy, 6,
       DIMS(KILN_PAIR(2, 2), KILN_PAIR(1, 1), KILN_PAIR(1, 1), 1, 0, KILN_PAIR(0, 0)), 0);
  CHECK(count_execute(h, BUFS(x), BUFS(out)) == 0);
  free(h);

  graph *k = g_new(); /* channels-last, with the residual and ReLU epilogue */
  float res[108] = {0}, nhwc[108] = {0};
  uint32_t kx = g_tensor(k, KILN_STORE_INPUT, KILN_F32, 4, DIMS(1, 6, 6, 2));
  uint32_t kr = g_tensor(k, KILN_STORE_INPUT, KILN_F32, 4, DIMS(1, 6, 6, 3));
  uint32_t kw = g_weight(k, KILN_F32, 4, DIMS(3, 3, 3, 2), w);
  uint32_t ky = g_tensor(k, KILN_STORE_OUTPUT, KILN_F32, 4, DIMS(1, 6, 6, 3));
  g_op(k, KILN_OP_CONV, 3, IDS(kx, kw, kr), ky, 8,
       DIMS(KILN_PAIR(1, 1), KILN_PAIR(1, 1), KILN_PAIR(1, 1), 1, 0, 1, KILN_ACT_RELU, 1), 0);
  CHECK(count_execute(k, BUFS(x, res), BUFS(nhwc)) == 0);
  free(k);
}

/* CUMSUM, GATHER, INDEX with two broadcasting index inputs, and ARGMAX in one plan. */
static void test_scan_index(void) {
  uint8_t keep[6] = {1, 1, 0, 1, 1, 1};
  float x[6] = {0.5f, -1, 2, 4, 3, -2};
  int64_t cols[4] = {2, 0, 1, 1}, rows[2] = {1, 0}, pick[3] = {2, 0, -1}, best[2] = {0}, pos[6] = {0};
  float picked[6] = {0};
  graph *g = g_new();
  uint32_t tk = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 2, DIMS(2, 3));
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 3));
  uint32_t tc = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 2, DIMS(2, 2));
  uint32_t tr = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 2, DIMS(2, 1));
  uint32_t tp = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(3));
  uint32_t t1 = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 2, DIMS(2, 2));
  uint32_t out_pos = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 2, DIMS(2, 3));
  uint32_t out_pick = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 3));
  uint32_t out_best = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 1, DIMS(2));
  g_op(g, KILN_OP_CUMSUM, 1, IDS(tk), out_pos, 2, DIMS(1, KILN_I64), 0);
  g_op(g, KILN_OP_GATHER, 2, IDS(tx, tc), t1, 1, DIMS(1), 0);
  g_op(g, KILN_OP_INDEX, 3, IDS(tx, tr, tp), out_pick, 1, DIMS(3), 0);
  g_op(g, KILN_OP_ARGMAX, 1, IDS(t1), out_best, 2, DIMS(1, 0), 0);
  CHECK(count_execute(g, BUFS(keep, x, cols, rows, pick), BUFS(pos, picked, best)) == 0);
  CHECK(pos[2] == 2 && pos[5] == 3 && picked[0] == -2 && picked[5] == 2);
  CHECK(best[0] == 0 && best[1] == 0); /* t1 = {2, 0.5; 3, 3} */
  free(g);
}

/* FUSED programs: the rotary embedding of a packed projection, rounded to f16, checked against
 * the same arithmetic written out here; then a program of every instruction code. */
static void test_fused_group(void) {
  float x[24], cs[12], sn[12], mix[12] = {0}, y[4] = {0.5f, -1.0f, 1.5f, 2.0f};
  uint16_t out[24] = {0};
  int64_t maps[5 * 14], code[2 * KILN_FX_MAX_INSTRS];
  uint32_t seed = 5;
  for (int i = 0; i < 24; i++) x[i] = (float)next_random(&seed);
  for (int i = 0; i < 12; i++) cs[i] = (float)next_random(&seed), sn[i] = (float)next_random(&seed);
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 3, DIMS(1, 3, 8));
  uint32_t tc = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(3, 4));
  uint32_t ts = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(3, 4));
  uint32_t tm = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(3, 4));
  uint32_t ty = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(4));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F16, 4, DIMS(1, 2, 3, 4));
  uint32_t tmix = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(3, 4));
  uint32_t tbox = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(3, 4));
  float boxed[12];
  uint32_t n = fx_rotary(maps, code, 1, 2, 3, 4, KILN_F16);
  g_fused(g, 3, IDS(tx, tc, ts), to, 4, 5, maps, n, code);
  n = fx_mix(maps, code, 3, 4);
  g_fused(g, 2, IDS(tm, ty), tmix, 2, 2, maps, n, code);
  /* a load outside its box gives 0: rows 1 and 2 of cs, row 0 zero */
  g_fused(g, 1, IDS(tc), tbox, 2, 1, DIMS(0, 0, 4, 1, 1, 0, 3, 4), 2,
          DIMS(KILN_FX_INSTR(KILN_FX_LOAD, 0, 0, 0, 0), 0, KILN_FX_INSTR(KILN_FX_STORE, 0, 0, 0, 0), 0));
  CHECK(count_execute(g, BUFS(x, cs, sn, cs, y), BUFS(out, mix, boxed)) == 0);
  for (int i = 0; i < 12; i++) CHECK(boxed[i] == (i < 4 ? 0.0f : cs[i]));
  for (int h = 0; h < 2; h++)
    for (int s = 0; s < 3; s++)
      for (int d = 0; d < 4; d++) {
        const float *row = x + s * 8 + h * 4;
        float a = kiln_f16_to_f32(kiln_f32_to_f16(row[d] * cs[s * 4 + d]));
        float r = d < 2 ? -row[d + 2] : row[d - 2];
        float b = kiln_f16_to_f32(kiln_f32_to_f16(r * sn[s * 4 + d]));
        CHECK(out[(h * 3 + s) * 4 + d] == kiln_f32_to_f16(a + b));
      }
  CHECK(mix[0] != 0.0f || mix[5] != 0.0f); /* the second program ran */
  free(g);
}

int main(void) {
#ifdef SANITIZED
  printf("test_cpu_noalloc: AddressSanitizer owns malloc; allocations are not counted here\n");
#else
  counting = 1; /* the wrappers count: a check that cannot fail proves nothing */
  allocations = 0;
  void *volatile probe = malloc(16);
  free(probe);
  counting = 0;
  CHECK(allocations == 1);
#endif
  test_gemm_norm_layout();
  test_vision();
  test_attention_gather();
  test_remaining_kinds();
  test_logic_and_math();
  test_scan_index();
  test_fused_group();
  test_state_write();
  test_every_kind_ran();
  return check_report("test_cpu_noalloc");
}
