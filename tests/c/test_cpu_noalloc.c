/* execute allocates nothing: this program replaces malloc and its relatives with counting
 * wrappers around glibc's allocator and runs plans that touch every op family. Under
 * AddressSanitizer, which owns malloc, the count is not taken and the runs still are. */
#include "test_cpu_harness.h"

#include <errno.h>

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif

/* volatile: the compiler assumes malloc touches no program memory */
static volatile int counting;
static volatile long allocations;

#ifndef SANITIZED
extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);

void *malloc(size_t size) {
  allocations += counting;
  return __libc_malloc(size);
}
void *calloc(size_t count, size_t size) {
  allocations += counting;
  return __libc_calloc(count, size);
}
void *realloc(void *p, size_t size) {
  allocations += counting;
  return __libc_realloc(p, size);
}
void *aligned_alloc(size_t alignment, size_t size) {
  allocations += counting;
  return __libc_memalign(alignment, size);
}
int posix_memalign(void **out, size_t alignment, size_t size) {
  allocations += counting;
  *out = __libc_memalign(alignment, size);
  return *out ? 0 : ENOMEM;
}
#endif

static kiln_error err;

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})
#define IDS(...) ((const uint32_t[]){__VA_ARGS__})
#define BUFS(...) ((void *const[]){__VA_ARGS__})

/* Runs g once uncounted (init) and then counts the allocations of two executes. */
static long count_execute(graph *g, void *const *in, void *const *out) {
  kiln_engine *e = g_engine(g);
  CHECK(kiln_cpu_backend.init(e, &err) == KILN_OK);
  counting = 1;
  allocations = 0;
  for (int run = 0; run < 2; run++) CHECK(g_execute(e, g, in, out, &err) == KILN_OK);
  counting = 0;
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
  test_attention_gather();
  test_scan_index();
  return check_report("test_cpu_noalloc");
}
