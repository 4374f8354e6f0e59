/* The FUSED kernels the CUDA engine compiles at load (src/cuda/cuda_fused_jit.c), without a
 * GPU: each hand-written program of fused_programs.h, at the sizes and dtypes the GPU op tests
 * run it, decodes into its CUDA C++ source and NVRTC compiles that for sm_80 and sm_90; a
 * program over more than 2^32 elements takes the 64-bit index path. Identical groups give one
 * source (the engine compiles it once), other sizes another. */
#include "check.h"

#ifdef KILN_WITH_CUDA
#include "cuda/cuda_fused_group.h"
#include "fused_programs.h"

#include <stdlib.h>

typedef struct plan_builder {
  kiln_tensor_desc tensors[8];
  kiln_op op;
  int64_t words[512];
  uint32_t n_tensors, n_inputs;
} plan_builder;

static kcu_fx_jit *jit;

static uint32_t tensor(plan_builder *b, kiln_storage st, kiln_dtype dt, int32_t rank,
                       const int64_t *dims) {
  kiln_tensor_desc *t = &b->tensors[b->n_tensors];
  uint64_t n = 1;
  memset(t, 0, sizeof *t);
  t->dtype = dt;
  t->rank = rank;
  for (int d = 0; d < rank; d++) t->dims[d] = dims[d], n *= (uint64_t)dims[d];
  t->nbytes = n * kiln_dtype_size(dt);
  t->storage = st;
  if (st == KILN_STORE_INPUT) t->io_index = b->n_inputs++;
  return b->n_tensors++;
}

#define DIMS(...) (const int64_t[]){__VA_ARGS__}
#define IN(b, dt, r, ...) tensor(b, KILN_STORE_INPUT, dt, r, DIMS(__VA_ARGS__))

/* The FUSED op over the inputs b holds, writing out [rank dims], decoded as the engine does. */
static int prepare(plan_builder *b, kiln_dtype out_dt, int32_t rank, const int64_t *dims,
                   uint32_t n_maps, const int64_t *maps, uint32_t n_instrs, const int64_t *code,
                   kcu_fx *fx) {
  uint32_t n = 0, map_words = n_maps * (2u + 3u * (uint32_t)rank), out;
  kiln_plan plan;
  kcu_tensor in[KILN_MAX_OP_INPUTS], o;
  out = tensor(b, KILN_STORE_OUTPUT, out_dt, rank, dims);
  b->words[n++] = n_maps;
  b->words[n++] = n_instrs;
  memcpy(b->words + n, maps, map_words * sizeof *maps);
  n += map_words;
  memcpy(b->words + n, code, 2u * n_instrs * sizeof *code);
  n += 2u * n_instrs;
  memset(&b->op, 0, sizeof b->op);
  b->op.kind = KILN_OP_FUSED;
  b->op.n_inputs = b->n_inputs;
  for (uint32_t k = 0; k < b->n_inputs; k++) b->op.inputs[k] = k;
  b->op.output = out;
  b->op.n_iattr = 2;
  b->op.iattr[0] = 0;
  b->op.iattr[1] = n;
  memset(&plan, 0, sizeof plan);
  plan.version = KILN_PLAN_VERSION;
  plan.tensors = b->tensors;
  plan.n_tensors = b->n_tensors;
  plan.ops = &b->op;
  plan.n_ops = 1;
  plan.words = b->words;
  plan.n_words = n;
  for (uint32_t k = 0; k < b->n_inputs; k++) in[k] = kcu_tensor_shape(&b->tensors[k]);
  o = kcu_tensor_shape(&b->tensors[out]);
  return kcu_fx_prepare(&plan, &b->op, in, &o, fx) == cudaSuccess;
}

/* fx's source holds one kernel and includes nothing; NVRTC compiles it for both targets. */
static void compiles(const kcu_fx *fx, const char *name) {
  char *source = kcu_fx_source(fx);
  CHECK(source && strstr(source, "kfx_main") && !strstr(source, "#include"));
  free(source);
  for (int cc = 80; cc <= 90; cc += 10) {
    size_t bytes = 0;
    kiln_error err;
    kiln_status st = kcu_fx_jit_cubin_size(&jit, fx, cc, &bytes, &err);
    if (st != KILN_OK) fprintf(stderr, "%s, sm_%d: %s\n", name, cc, err.message);
    CHECK(st == KILN_OK && bytes > 0);
  }
}

static void test_rotary_and_mix(void) {
  int64_t maps[5 * 14], code[2 * KILN_FX_MAX_INSTRS];
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = (kiln_dtype)t;
    plan_builder b = {0};
    kcu_fx fx;
    IN(&b, dt, 3, 3, 37, 5 * 64), IN(&b, dt, 2, 37, 64), IN(&b, dt, 2, 37, 64);
    uint32_t n = fx_rotary(maps, code, 3, 5, 37, 64, dt);
    CHECK(prepare(&b, dt, 4, DIMS(3, 5, 37, 64), 5, maps, n, code, &fx));
    compiles(&fx, "rotary 3x5x37x64");

    memset(&b, 0, sizeof b);
    IN(&b, dt, 3, 1, 128, 8 * 128), IN(&b, dt, 2, 128, 128), IN(&b, dt, 2, 128, 128);
    n = fx_rotary(maps, code, 1, 8, 128, 128, dt);
    CHECK(prepare(&b, dt, 4, DIMS(1, 8, 128, 128), 5, maps, n, code, &fx));
    CHECK(fx.run == (dt == KILN_F32 ? 4 : 8));
    compiles(&fx, "rotary 1x8x128x128");

    memset(&b, 0, sizeof b);
    IN(&b, dt, 2, 33, 129), IN(&b, dt, 1, 129);
    n = fx_mix(maps, code, 33, 129);
    CHECK(prepare(&b, dt, 2, DIMS(33, 129), 2, maps, n, code, &fx));
    compiles(&fx, "every code");
  }
}

static void test_runs_and_gates(void) {
  static const struct {
    int32_t rank;
    int64_t dims[6];
  } shapes[] = {{1, {1}},         {1, {13}},          {1, {64}},       {2, {7, 13}},
                {2, {5, 24}},     {3, {3, 5, 7}},     {4, {2, 3, 4, 36}}, {5, {2, 2, 3, 3, 10}},
                {6, {2, 1, 3, 2, 2, 32}}};
  int64_t maps[7 * 20], code[2 * KILN_FX_MAX_INSTRS];
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    int32_t r = shapes[k].rank;
    const int64_t *dims = shapes[k].dims;
    int64_t numel = 1;
    for (int32_t d = 0; d < r; d++) numel *= dims[d];
    for (int t = 0; t < 7; t++) { /* f32, f16, bf16; f16 of f32; f32, f16, bf16 of integers */
      static const kiln_dtype outs[7] = {KILN_F32, KILN_F16, KILN_BF16, KILN_F16,
                                         KILN_F32, KILN_F16, KILN_BF16};
      static const kiln_dtype ins[7] = {KILN_F32, KILN_F16, KILN_BF16, KILN_F32,
                                        KILN_I64, KILN_I32, KILN_BOOL};
      kiln_dtype dt = outs[t], it = ins[t];
      plan_builder b = {0};
      kcu_fx fx;
      tensor(&b, KILN_STORE_INPUT, it, 1, DIMS(numel + 8));
      tensor(&b, KILN_STORE_INPUT, it, 1, DIMS(dims[r - 1]));
      tensor(&b, KILN_STORE_INPUT, it, 1, DIMS(dims[0]));
      uint32_t n = fx_runs(maps, code, r, dims);
      CHECK(prepare(&b, dt, r, dims, 7, maps, n, code, &fx));
      compiles(&fx, "runs");
    }
  }
  for (int cl = 0; cl < 2; cl++) {
    plan_builder b = {0};
    kcu_fx fx;
    if (cl) IN(&b, KILN_F16, 4, 2, 7, 7, 24), IN(&b, KILN_F16, 4, 2, 1, 1, 24);
    else IN(&b, KILN_F16, 4, 2, 24, 7, 7), IN(&b, KILN_F16, 4, 2, 24, 1, 1);
    uint32_t n = fx_gate(maps, code, cl, 2, 24, 7, 7, KILN_F16);
    CHECK(prepare(&b, KILN_F16, 4, cl ? DIMS(2, 7, 7, 24) : DIMS(2, 24, 7, 7), 2, maps, n, code,
                  &fx));
    compiles(&fx, "gate");
  }
}

/* Over 2^32 elements: 64-bit coordinates, runs of one, rank 8. Nothing is allocated. */
static void test_wide(void) {
  int64_t maps[2 * 8], code[2 * KILN_FX_MAX_INSTRS];
  const int64_t dims[2] = {70000, 70000};
  plan_builder b = {0};
  kcu_fx fx;
  tensor(&b, KILN_STORE_INPUT, KILN_F32, 2, dims);
  tensor(&b, KILN_STORE_INPUT, KILN_F32, 2, dims);
  uint32_t n = fx_chain(maps, code, 2, dims, KILN_F32);
  CHECK(prepare(&b, KILN_F32, 2, dims, 2, maps, n, code, &fx));
  CHECK(!fx.narrow && fx.run == 1 && fx.rank == KILN_MAX_RANK);
  char *source = kcu_fx_source(&fx);
  CHECK(source && strstr(source, "typedef long long kfx_i;"));
  free(source);
  compiles(&fx, "wide chain");
}

/* The source is a function of the program and its sizes alone. */
static void test_same_program_same_source(void) {
  int64_t maps[5 * 14], code[2 * KILN_FX_MAX_INSTRS];
  char *src[3];
  for (int k = 0; k < 3; k++) {
    plan_builder b = {0};
    kcu_fx fx;
    int64_t s = k < 2 ? 128 : 64;
    IN(&b, KILN_F16, 3, 1, s, 8 * 128), IN(&b, KILN_F16, 2, s, 128), IN(&b, KILN_F16, 2, s, 128);
    uint32_t n = fx_rotary(maps, code, 1, 8, s, 128, KILN_F16);
    CHECK(prepare(&b, KILN_F16, 4, DIMS(1, 8, s, 128), 5, maps, n, code, &fx));
    src[k] = kcu_fx_source(&fx);
  }
  CHECK(src[0] && src[1] && src[2] && strcmp(src[0], src[1]) == 0 && strcmp(src[0], src[2]) != 0);
  for (int k = 0; k < 3; k++) free(src[k]);
}

int main(void) {
  test_rotary_and_mix();
  test_runs_and_gates();
  test_wide();
  test_same_program_same_source();
  kcu_fx_jit_free(jit);
  return check_report("test_fused_source");
}
#else
int main(void) {
  printf("test_fused_source: built without the CUDA engine: nothing to compile\n");
  return check_report("test_fused_source");
}
#endif
