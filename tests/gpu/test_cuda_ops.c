/* Every op of the plan on the CUDA engine against the CPU reference engine, on random data,
 * with caller buffers on the host (staged) and on the device (bound in place); then the
 * engine's handling of caller memory, devices, out of memory and allocation failure.
 * Run on a GPU machine by scripts/gpu_test.sh; `--fault` runs the device-fault check, which
 * leaves the process's CUDA context unusable and so runs in a process of its own;
 * `--matmul-attention` runs only the matmul and attention cases, `--padded-pitch` only the linears
 * written at a padded pitch, `--dynamic` only the dynamic-shape
 * cases, `--only SUBSTRING` only the
 * compared cases whose name contains SUBSTRING (`--only conv` the cuDNN convolutions), and
 * `--time-sdpa` times the attention paths on
 * the benchmark's shapes, `--time-linear [SUBSTRING]` the decode-shaped linears against their
 * weight-read floor, `--bench-conv` the convolution plans on ResNet-50 and MobileNetV3 shapes,
 * `--bench-fused [SUBSTRING]` the FUSED kernel on the benchmarks' fused groups (those whose
 * label contains SUBSTRING). */
#include "dynamic_groups.h"
#include "fused_programs.h"
#include "gpu_harness.h"

#include "runtime/pointwise_steps.h"
#include "runtime/vision_shape.h"
#include "cuda/cuda_attention_gemm.h"
#include "cuda/cuda_attention_graph.h"
#include "cuda/cuda_conv.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_staging.h"

#include <cuda.h>
#include <time.h>

#include "counting_malloc.h"

static int cuda_ok(cudaError_t rc, const char *what) {
  if (rc == cudaSuccess) return 1;
  fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(rc));
  return 0;
}

/* Tolerance for the next compare when not the dtype's (TF32), and its largest error. */
static double tol_override, last_error;

/* --only: a compared case runs only when its name contains this (NULL: every case). */
static const char *only_filter;

static int selected(const char *name) { return !only_filter || strstr(name, only_filter) != NULL; }

typedef struct io_range {
  double lo, hi;
} io_range;

/* -1: compare() leaves unchecked which path the CUDA engine's init gave SDPA ops; else how many
 * of them it must have given cuDNN's fused attention. */
static int expect_attention_cudnn = -1;
/* -1: unchecked; else how many norms init must have left to the GEMVs reading them, and to the
 * GEMVs writing their inputs. */
static int expect_norms_in_gemv = -1, expect_norms_after_gemv = -1;
/* -1: unchecked; else how many ops init must have put on the branch beside the chain. */
static int expect_ops_beside = -1;

/* Runs p on both engines and compares every output; ranges[i] bounds input i's values. */
static void compare(prog *p, const char *name, const io_range *ranges) {
  if (!selected(name)) {
    p_free(p);
    return;
  }
  kiln_error err;
  void *in[P_MAX_IO] = {0}, *cpu_out[P_MAX_IO] = {0}, *gpu_out[P_MAX_IO] = {0};
  void *d_in[P_MAX_IO] = {0}, *d_out[P_MAX_IO] = {0};
  for (uint32_t i = 0; i < p->n_inputs; i++) {
    const kiln_tensor_desc *t = &p->tensors[p->inputs[i]];
    in[i] = malloc(t->nbytes + 1);
    double lo = ranges ? ranges[i].lo : -1.0, hi = ranges ? ranges[i].hi : 1.0;
    fill(in[i], t->dtype, p_count(t), lo, hi);
    if (!cuda_ok(cudaMalloc(&d_in[i], t->nbytes + 1), "cudaMalloc")) die("device");
    cudaMemcpy(d_in[i], in[i], t->nbytes, cudaMemcpyHostToDevice);
  }
  for (uint32_t i = 0; i < p->n_outputs; i++) {
    const kiln_tensor_desc *t = &p->tensors[p->outputs[i]];
    cpu_out[i] = malloc(t->nbytes + 1);
    gpu_out[i] = malloc(t->nbytes + 1);
    if (!cuda_ok(cudaMalloc(&d_out[i], t->nbytes + 1), "cudaMalloc")) die("device");
  }
  kiln_engine *cpu = p_load(p, &kiln_cpu_backend, 0, &err);
  if (!cpu) fprintf(stderr, "%s: cpu load: %s\n", name, err.message);
  kiln_engine *gpu = p_load(p, &kiln_cuda_backend, 0, &err);
  if (!gpu) fprintf(stderr, "%s: cuda load: %s\n", name, err.message);
  CHECK(cpu && gpu);
  if (gpu) { /* a static plan's fused groups each run a kernel compiled for them at load */
    uint64_t fused = 0;
    kiln_cuda_stats fs;
    for (uint32_t i = 0; i < p->n_ops; i++)
      fused += p->ops[i].kind == KILN_OP_FUSED && p_count(&p->tensors[p->ops[i].output]) > 0;
    CHECK(kiln_cuda_engine_stats(gpu, &fs, &err) == KILN_OK);
    CHECK(fs.fused_compiled == fused && fs.fused_interpreted == 0);
    if (expect_attention_cudnn >= 0 && fs.attention_cudnn != (uint64_t)expect_attention_cudnn)
      printf("%s: %llu SDPA ops on cuDNN, want %d: FAIL\n", name,
             (unsigned long long)fs.attention_cudnn, expect_attention_cudnn);
    CHECK(expect_attention_cudnn < 0 || fs.attention_cudnn == (uint64_t)expect_attention_cudnn);
    if (expect_norms_in_gemv >= 0 && fs.norms_in_gemv != (uint64_t)expect_norms_in_gemv)
      printf("%s: %llu norms computed in GEMVs, want %d: FAIL\n", name,
             (unsigned long long)fs.norms_in_gemv, expect_norms_in_gemv);
    CHECK(expect_norms_in_gemv < 0 || fs.norms_in_gemv == (uint64_t)expect_norms_in_gemv);
    if (expect_norms_after_gemv >= 0 && fs.norms_after_gemv != (uint64_t)expect_norms_after_gemv)
      printf("%s: %llu norms computed after GEMVs, want %d: FAIL\n", name,
             (unsigned long long)fs.norms_after_gemv, expect_norms_after_gemv);
    CHECK(expect_norms_after_gemv < 0 ||
          fs.norms_after_gemv == (uint64_t)expect_norms_after_gemv);
    if (expect_ops_beside >= 0 && fs.ops_beside != (uint64_t)expect_ops_beside)
      printf("%s: %llu ops beside the chain, want %d: FAIL\n", name,
             (unsigned long long)fs.ops_beside, expect_ops_beside);
    CHECK(expect_ops_beside < 0 || fs.ops_beside == (uint64_t)expect_ops_beside);
  }
  if (cpu && gpu) {
    kiln_status st = p_execute(cpu, p, in, cpu_out, &err);
    if (st != KILN_OK) fprintf(stderr, "%s: cpu run: %s\n", name, err.message);
    CHECK(st == KILN_OK);
    for (int pass = 0; pass < 2; pass++) {
      kiln_cuda_stats before, after;
      kiln_cuda_engine_stats(gpu, &before, &err);
      for (uint32_t i = 0; i < p->n_outputs; i++) {
        const kiln_tensor_desc *t = &p->tensors[p->outputs[i]];
        memset(gpu_out[i], 0xff, t->nbytes); /* poison: an unwritten element shows */
        cudaMemset(d_out[i], 0xff, t->nbytes);
      }
      st = pass == 0 ? p_execute(gpu, p, in, gpu_out, &err) : p_execute(gpu, p, d_in, d_out, &err);
      if (st != KILN_OK) fprintf(stderr, "%s: cuda run (%s): %s\n", name, pass ? "bound" : "staged", err.message);
      CHECK(st == KILN_OK);
      kiln_cuda_engine_stats(gpu, &after, &err);
      if (pass == 1) {
        for (uint32_t i = 0; i < p->n_outputs; i++)
          cudaMemcpy(gpu_out[i], d_out[i], p->tensors[p->outputs[i]].nbytes, cudaMemcpyDeviceToHost);
        CHECK(after.bound - before.bound == p->n_inputs + p->n_outputs);
        CHECK(after.staged == before.staged);
      } else {
        CHECK(after.staged - before.staged == p->n_inputs + p->n_outputs);
        CHECK(after.bound == before.bound);
      }
      for (uint32_t i = 0; i < p->n_outputs; i++) {
        const kiln_tensor_desc *t = &p->tensors[p->outputs[i]];
        double e = rel_error(gpu_out[i], cpu_out[i], t->dtype, p_count(t));
        double tol = tol_override > 0 ? tol_override : dtype_tolerance(t->dtype);
        int ok = e <= tol;
        last_error = fmax(last_error, e);
        printf("%-44s %-6s out%u %-4s rel err %.2e (tol %.0e) %s\n", name,
               pass ? "bound" : "staged", i, kiln_dtype_name(t->dtype), e, tol, ok ? "ok" : "FAIL");
        CHECK(ok);
      }
    }
  }
  p_unload(cpu);
  p_unload(gpu);
  for (uint32_t i = 0; i < P_MAX_IO; i++) {
    free(in[i]);
    free(cpu_out[i]);
    free(gpu_out[i]);
    cudaFree(d_in[i]);
    cudaFree(d_out[i]);
  }
  p_free(p);
}

#define DIMS(...) (const int64_t[]){__VA_ARGS__}
#define IN(p, dt, r, ...) p_tensor(p, KILN_STORE_INPUT, dt, r, DIMS(__VA_ARGS__))
#define OUT(p, dt, r, ...) p_tensor(p, KILN_STORE_OUTPUT, dt, r, DIMS(__VA_ARGS__))
#define MID(p, dt, r, ...) p_tensor(p, KILN_STORE_ARENA, dt, r, DIMS(__VA_ARGS__))
#define OPS(...) (const uint32_t[]){__VA_ARGS__}
#define ATTR(...) (const int64_t[]){__VA_ARGS__}

static const kiln_dtype float_types[3] = {KILN_F32, KILN_F16, KILN_BF16};

/* Which linears kcu_gemm_init gives a padded pitch: those whose output rows are not 16-byte
 * aligned, that have no residual (cuBLASLt's C shares D's layout) and whose weight is a weight
 * (the GEMM reads ld_pad - N rows past its end, over_read bytes, into the engine's slack). */
static void test_gemm_pitch(void) {
  static const struct {
    kiln_dtype dt;
    int64_t n;
    int residual, weight_input;
    int64_t ld_pad;
  } cases[] = {{KILN_F16, 1001, 0, 0, 1008}, {KILN_BF16, 50257, 0, 0, 50264},
               {KILN_F32, 1001, 0, 0, 1004}, {KILN_F16, 1024, 0, 0, 0},
               {KILN_F32, 1004, 0, 0, 0},    {KILN_F16, 1001, 1, 0, 0},
               {KILN_F16, 1001, 0, 1, 0}};
  cublasLtHandle_t lt;
  if (!cuda_ok(cudaSetDevice(0), "cudaSetDevice") || cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS)
    die("cuBLASLt");
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    kiln_dtype dt = cases[c].dt;
    int64_t n = cases[c].n;
    prog *p = p_new();
    uint32_t x = IN(p, dt, 2, 40, 64), r = IN(p, dt, 2, 40, n);
    uint32_t w = cases[c].weight_input ? IN(p, dt, 2, n, 64)
                                       : p_weight(p, dt, 2, DIMS(n, 64), -0.1, 0.1);
    uint32_t y = OUT(p, dt, 2, 40, n);
    if (cases[c].residual) p_op(p, KILN_OP_LINEAR, 3, OPS(x, w, r), y, 2, ATTR(0, 1), 0);
    else p_op(p, KILN_OP_LINEAR, 2, OPS(x, w), y, 1, ATTR(0), 0);
    kiln_plan pl;
    p_plan(p, &pl);
    kcu_gemm g;
    kiln_error err;
    int ok = kcu_gemm_init(&g, lt, &pl, 0, 0, (size_t)4 << 20, &err) == KILN_OK;
    int64_t es = (int64_t)kiln_dtype_size(dt);
    printf("linear pitch %s N %lld residual %d weight input %d: ld_pad %lld scratch %llu bytes, "
           "over-read %llu bytes\n",
           kiln_dtype_name(dt), (long long)n, cases[c].residual, cases[c].weight_input,
           (long long)g.ld_pad, (unsigned long long)g.scratch_bytes,
           (unsigned long long)g.over_read);
    int64_t pad = cases[c].ld_pad;
    CHECK(ok && g.ld_pad == pad && g.scratch_bytes == (uint64_t)(pad ? 40 * pad * es : 0) &&
          g.over_read == (uint64_t)(pad ? (pad - n) * 64 * es : 0));
    kcu_gemm_release(&g);
    p_free(p);
  }
  cublasLtDestroy(lt);
}

static void test_gemm(void) {
  char name[96];
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = float_types[t];
    for (int act = 0; act <= KILN_ACT_GELU_TANH; act++) {
      for (int bias = 0; bias < 2; bias++) {
        prog *p = p_new();
        uint32_t x = IN(p, dt, 3, 2, 37, 256);
        uint32_t w = p_weight(p, dt, 2, DIMS(192, 256), -0.1, 0.1);
        uint32_t b = p_weight(p, dt, 1, DIMS(192), -1, 1);
        uint32_t y = OUT(p, dt, 3, 2, 37, 192);
        p_op(p, KILN_OP_LINEAR, bias ? 3 : 2, OPS(x, w, b), y, 1, ATTR(act), 0);
        snprintf(name, sizeof name, "linear %s act %d bias %d", kiln_dtype_name(dt), act, bias);
        compare(p, name, NULL);
      }
    }
    /* A residual added in the epilogue (cuBLASLt's C, beta 1, or the GEMV kernel's last add),
     * with and without a bias: 37 rows on cuBLASLt; 1, 3, 8 and 13 rows on each (13 on the
     * GEMV in f16 and bf16 only). */
    static const int res_rows[5] = {1, 3, 8, 13, 37};
    for (int bias = 0; bias < 2; bias++) {
      for (int c = 0; c < 9; c++) {
        int rows = res_rows[c % 5];
        kcu_test_gemv_choice = c < 4 ? 1 : c < 8 ? 0 : -1;
        prog *p = p_new();
        uint32_t x = IN(p, dt, 3, 2, rows, 256), r = IN(p, dt, 3, 2, rows, 192);
        uint32_t w = p_weight(p, dt, 2, DIMS(192, 256), -0.1, 0.1);
        uint32_t b = p_weight(p, dt, 1, DIMS(192), -1, 1);
        uint32_t y = OUT(p, dt, 3, 2, rows, 192);
        if (bias) p_op(p, KILN_OP_LINEAR, 4, OPS(x, w, b, r), y, 2, ATTR(0, 1), 0);
        else p_op(p, KILN_OP_LINEAR, 3, OPS(x, w, r), y, 2, ATTR(0, 1), 0);
        snprintf(name, sizeof name, "linear + residual %d rows %s bias %d on %s", rows,
                 kiln_dtype_name(dt), bias, c < 4 ? "gemv" : "cublaslt");
        compare(p, name, NULL);
      }
    }
    kcu_test_gemv_choice = -1;
    /* A few rows: the GEMV kernel, with each activation and bias fused; K = 520 leaves a
     * partial last round of 16-byte loads and N = 100 a partial last block of columns. The
     * same cases on cuBLASLt, which init may pick instead when it times faster. One row and
     * f32 run on the CUDA cores, 2 to 8 and 9 to 16 rows of f16 and bf16 on the tensor cores
     * (13 rows of f32 on cuBLASLt). */
    static const int64_t gemv_rows[4] = {1, 3, 8, 13};
    for (int r = 0; r < 8; r++) {
      kcu_test_gemv_choice = r < 4;
      for (int act = 0; act <= KILN_ACT_GELU_TANH; act++) {
        for (int bias = 0; bias < 2; bias++) {
          prog *p = p_new();
          uint32_t x = IN(p, dt, 2, gemv_rows[r % 4], 520);
          uint32_t w = p_weight(p, dt, 2, DIMS(100, 520), -0.1, 0.1);
          uint32_t b = p_weight(p, dt, 1, DIMS(100), -1, 1);
          uint32_t y = OUT(p, dt, 2, gemv_rows[r % 4], 100);
          p_op(p, KILN_OP_LINEAR, bias ? 3 : 2, OPS(x, w, b), y, 1, ATTR(act), 0);
          snprintf(name, sizeof name, "linear %lld rows %s act %d bias %d on %s",
                   (long long)gemv_rows[r % 4], kiln_dtype_name(dt), act, bias,
                   r < 4 ? "gemv" : "cublaslt");
          compare(p, name, NULL);
        }
      }
    }
    /* Split-K inside the GEMV block at every spread: N picks 1, 2, 4 or 8 columns per block
     * (8, 4, 2 or 1 K slices each), K = 1032 splits unevenly, a partial last block at N =
     * 10001. */
    kcu_test_gemv_choice = 1;
    static const int64_t split_n[4] = {1000, 2048, 4096, 10001};
    for (int spread = 0; spread < KCU_GEMV_SPREADS; spread++) {
      kcu_test_gemv_spread = spread;
      for (int c = 0; c < 4; c++) {
        for (int r = 0; r < 4; r++) {
          prog *p = p_new();
          uint32_t x = IN(p, dt, 2, gemv_rows[r], 1032);
          uint32_t w = p_weight(p, dt, 2, DIMS(split_n[c], 1032), -0.1, 0.1);
          uint32_t b = p_weight(p, dt, 1, DIMS(split_n[c]), -1, 1);
          uint32_t y = OUT(p, dt, 2, gemv_rows[r], split_n[c]);
          p_op(p, KILN_OP_LINEAR, 3, OPS(x, w, b), y, 1, ATTR(c == 1 ? KILN_ACT_GELU_ERF : 0),
               0);
          snprintf(name, sizeof name,
                   "linear gemv split-K spread %d N %lld (%d cols of %d) %lld rows %s", spread,
                   (long long)split_n[c], kcu_gemv_columns(split_n[c], gemv_rows[r], dt, spread),
                   kcu_gemv_tile(split_n[c], gemv_rows[r], dt, spread), (long long)gemv_rows[r],
                   kiln_dtype_name(dt));
          compare(p, name, NULL);
        }
      }
    }
    kcu_test_gemv_spread = -1;
    /* SwiGLU (w = [gate; up]): on the GEMV (its gate and up columns paired in a block) at
     * each spread, on cuBLASLt into the engine's scratch then the combine kernel, and at 40
     * rows (cuBLASLt only); N 100 and 3000 give 2 to 8 columns per GEMV block. */
    static const int64_t glu_rows[5] = {1, 3, 8, 13, 40}, glu_n[2] = {100, 3000};
    for (int choice = 0; choice <= KCU_GEMV_SPREADS; choice++) {
      kcu_test_gemv_choice = choice > 0;
      kcu_test_gemv_spread = choice - 1;
      for (int r = 0; r < 5; r++) {
        for (int c = 0; c < 2; c++) {
          if (r == 4 && choice > 0) continue;
          prog *p = p_new();
          uint32_t x = IN(p, dt, 2, glu_rows[r], 520);
          uint32_t w = p_weight(p, dt, 2, DIMS(2 * glu_n[c], 520), -0.1, 0.1);
          uint32_t y = OUT(p, dt, 2, glu_rows[r], glu_n[c]);
          p_op(p, KILN_OP_LINEAR, 2, OPS(x, w), y, 1, ATTR(KILN_ACT_SWIGLU), 0);
          snprintf(name, sizeof name, "linear swiglu %lld rows N %lld %s on %s spread %d",
                   (long long)glu_rows[r], (long long)glu_n[c], kiln_dtype_name(dt),
                   choice ? "gemv" : "cublaslt", choice - 1);
          compare(p, name, NULL);
        }
      }
    }
    kcu_test_gemv_spread = -1;
    {
      /* one scratch for attention scores and SwiGLU's gate and up: f32 SDPA on cuBLASLt, then
       * a SwiGLU linear of its output */
      kcu_test_gemv_choice = -1;
      prog *p = p_new();
      uint32_t q = IN(p, dt, 3, 2, 20, 64), k = IN(p, dt, 3, 2, 30, 64), v = IN(p, dt, 3, 2, 30, 64);
      uint32_t a = MID(p, dt, 3, 2, 20, 64);
      p_op(p, KILN_OP_SDPA, 3, OPS(q, k, v), a, 2, ATTR(0, 0), 0);
      uint32_t w = p_weight(p, dt, 2, DIMS(256, 64), -0.2, 0.2);
      p_op(p, KILN_OP_LINEAR, 2, OPS(a, w), OUT(p, dt, 3, 2, 20, 128), 1, ATTR(KILN_ACT_SWIGLU), 0);
      snprintf(name, sizeof name, "sdpa then linear swiglu %s", kiln_dtype_name(dt));
      compare(p, name, NULL);
    }
    /* Output rows not 16-byte aligned (N = 1001 or 50, as a vocabulary of 50257): cuBLASLt
     * writes them at a padded pitch into the scratch and they are copied out, the activation
     * after the copy where no epilogue computes it. */
    kcu_test_gemv_choice = 0;
    static const int64_t pad_n[2] = {1001, 50}, pad_rows[2] = {37, 300};
    for (int c = 0; c < 4; c++) {
      for (int act = 0; act <= KILN_ACT_GELU_TANH; act++) {
        prog *p = p_new();
        int64_t n = pad_n[c % 2], rows = pad_rows[c / 2];
        uint32_t x = IN(p, dt, 3, 1, rows, 264);
        uint32_t w = p_weight(p, dt, 2, DIMS(n, 264), -0.1, 0.1);
        uint32_t b = p_weight(p, dt, 1, DIMS(n), -1, 1);
        uint32_t y = OUT(p, dt, 3, 1, rows, n);
        p_op(p, KILN_OP_LINEAR, act % 2 ? 3 : 2, OPS(x, w, b), y, 1, ATTR(act), 0);
        snprintf(name, sizeof name, "linear padded pitch %lld rows N %lld %s act %d bias %d",
                 (long long)rows, (long long)n, kiln_dtype_name(dt), act, act % 2);
        compare(p, name, NULL);
      }
    }
    kcu_test_gemv_choice = -1;
    for (int act = 0; act <= KILN_ACT_GELU_TANH; act++) {
      prog *p = p_new(); /* K not a multiple of 8: cuBLASLt, erf GELU after it */
      uint32_t x = IN(p, dt, 2, 1, 20);
      uint32_t w = p_weight(p, dt, 2, DIMS(40, 20), -0.3, 0.3);
      uint32_t b = p_weight(p, dt, 1, DIMS(40), -1, 1);
      p_op(p, KILN_OP_LINEAR, 3, OPS(x, w, b), OUT(p, dt, 2, 1, 40), 1, ATTR(act), 0);
      snprintf(name, sizeof name, "linear 1 row K 20 %s act %d", kiln_dtype_name(dt), act);
      compare(p, name, NULL);
    }
    prog *p = p_new(); /* batch-1 GEMV, the MLP's shape */
    uint32_t x = IN(p, dt, 2, 1, 1024);
    uint32_t w = p_weight(p, dt, 2, DIMS(1024, 1024), -0.05, 0.05);
    uint32_t y = OUT(p, dt, 2, 1, 1024);
    p_op(p, KILN_OP_LINEAR, 2, OPS(x, w), y, 1, ATTR(KILN_ACT_NONE), 0);
    snprintf(name, sizeof name, "linear gemv %s", kiln_dtype_name(dt));
    compare(p, name, NULL);

    /* Early launch: each GEMV starts while the kernel ahead of it, which writes its input,
     * still runs. A norm over one long row writes x; the SwiGLU GEMV's output is the next
     * GEMV's input. A weight a norm computes is no weight: that GEMV launches as usual. */
    kcu_test_gemv_choice = 1;
    p = p_new();
    x = IN(p, dt, 2, 1, 16384);
    uint32_t h = MID(p, dt, 2, 1, 16384), g = MID(p, dt, 2, 1, 512);
    p_op(p, KILN_OP_RMS_NORM, 2, OPS(x, p_weight(p, dt, 1, DIMS(16384), 0.5, 1.5)), h, 2,
         ATTR(1, 1), 1e-6);
    w = p_weight(p, dt, 2, DIMS(1024, 16384), -0.02, 0.02);
    p_op(p, KILN_OP_LINEAR, 2, OPS(h, w), g, 1, ATTR(KILN_ACT_SWIGLU), 0);
    w = p_weight(p, dt, 2, DIMS(256, 512), -0.1, 0.1);
    p_op(p, KILN_OP_LINEAR, 2, OPS(g, w), OUT(p, dt, 2, 1, 256), 1, ATTR(KILN_ACT_NONE), 0);
    snprintf(name, sizeof name, "norm then linear gemv chain %s", kiln_dtype_name(dt));
    compare(p, name, NULL);
    p = p_new();
    w = MID(p, dt, 2, 256, 4096);
    p_op(p, KILN_OP_RMS_NORM, 1, OPS(IN(p, dt, 2, 256, 4096)), w, 2, ATTR(1, 0), 1e-6);
    p_op(p, KILN_OP_LINEAR, 2, OPS(IN(p, dt, 2, 1, 4096), w), OUT(p, dt, 2, 1, 256), 1,
         ATTR(KILN_ACT_NONE), 0);
    snprintf(name, sizeof name, "linear gemv computed weight %s", kiln_dtype_name(dt));
    compare(p, name, NULL);
    p = p_new(); /* kernels launched early one after another, each reading the last's output */
    x = IN(p, dt, 2, 4, 16384);
    uint32_t h2 = MID(p, dt, 2, 4, 16384), h3 = MID(p, dt, 2, 4, 16384);
    h = MID(p, dt, 2, 4, 16384);
    p_op(p, KILN_OP_RMS_NORM, 1, OPS(x), h, 2, ATTR(1, 0), 1e-6);
    p_op(p, KILN_OP_MUL, 2, OPS(h, x), h2, 0, NULL, 0);
    p_op(p, KILN_OP_LAYER_NORM, 1, OPS(h2), h3, 2, ATTR(1, 0), 1e-5);
    p_op(p, KILN_OP_ARGMAX, 1, OPS(h3), OUT(p, KILN_I64, 1, 4), 2, ATTR(1, 0), 0);
    snprintf(name, sizeof name, "early launch chain norm mul norm argmax %s",
             kiln_dtype_name(dt));
    compare(p, name, NULL);
    kcu_test_gemv_choice = -1;

    p = p_new();
    uint32_t a = IN(p, dt, 4, 2, 3, 17, 32), bm = IN(p, dt, 4, 2, 3, 32, 24);
    p_op(p, KILN_OP_MATMUL, 2, OPS(a, bm), OUT(p, dt, 4, 2, 3, 17, 24), 0, NULL, 0);
    snprintf(name, sizeof name, "matmul batched %s", kiln_dtype_name(dt));
    compare(p, name, NULL);

    p = p_new();
    a = IN(p, dt, 4, 2, 3, 17, 32);
    bm = IN(p, dt, 2, 32, 24);
    p_op(p, KILN_OP_MATMUL, 2, OPS(a, bm), OUT(p, dt, 4, 2, 3, 17, 24), 0, NULL, 0);
    snprintf(name, sizeof name, "matmul broadcast b %s", kiln_dtype_name(dt));
    compare(p, name, NULL);

    p = p_new();
    a = IN(p, dt, 4, 2, 1, 17, 32);
    bm = IN(p, dt, 4, 1, 3, 32, 24);
    p_op(p, KILN_OP_MATMUL, 2, OPS(a, bm), OUT(p, dt, 4, 2, 3, 17, 24), 0, NULL, 0);
    snprintf(name, sizeof name, "matmul partial broadcast %s", kiln_dtype_name(dt));
    compare(p, name, NULL);
  }
  prog *p = p_new(); /* TF32 when the metadata allows it: looser, still close */
  p->allow_tf32 = 1;
  uint32_t x = IN(p, KILN_F32, 2, 64, 256);
  uint32_t w = p_weight(p, KILN_F32, 2, DIMS(128, 256), -0.1, 0.1);
  p_op(p, KILN_OP_LINEAR, 2, OPS(x, w), OUT(p, KILN_F32, 2, 64, 128), 1, ATTR(0), 0);
  tol_override = 2e-3;
  last_error = 0.0;
  compare(p, "linear f32 allow_tf32", NULL);
  tol_override = 0.0;
  if (selected("linear f32 allow_tf32")) {
    printf("allow_tf32: error %.2e, above what f32 gives, so TF32 was used\n", last_error);
    CHECK(last_error > 2e-5);
  }
}

/* A norm whose output only one-row GEMVs read is computed by them (kcu_fold_norms): RMS with a
 * weight, layer norm with weight and bias on rows of mean far from 0 (the GEMV's bias and
 * residual after), a weightless RMS norm read by two GEMVs, one through a reshape placed on its
 * bytes. Not where the norm's output has another reader, where an op between the norm and its
 * GEMV (or the GEMV's own output) lies on the norm's input, where the GEMV launches more blocks
 * than the device holds at once, or in f32. The GEMVs at the spread of fewest warps: at most 260 blocks, one wave on
 * an A100 as on an H100. */
static void test_norm_in_gemv(void) {
  char name[96];
  static const io_range shifted[3] = {{0.5, 3.0}, {-1.0, 1.0}, {-1.0, 1.0}};
  kcu_test_gemv_choice = 1;
  kcu_test_gemv_spread = 0;
  for (int di = 0; di < 3; di++) {
    kiln_dtype dt = di == 0 ? KILN_F16 : di == 1 ? KILN_BF16 : KILN_F32;
    int folds = dt != KILN_F32;
    prog *p = p_new();
    uint32_t x = IN(p, dt, 3, 1, 1, 2048), h = MID(p, dt, 3, 1, 1, 2048);
    p_op(p, KILN_OP_RMS_NORM, 2, OPS(x, p_weight(p, dt, 1, DIMS(2048), 0.5, 1.5)), h, 2,
         ATTR(1, 1), 1e-6);
    p_op(p, KILN_OP_LINEAR, 2, OPS(h, p_weight(p, dt, 2, DIMS(1024, 2048), -0.05, 0.05)),
         OUT(p, dt, 3, 1, 1, 1024), 1, ATTR(KILN_ACT_NONE), 0);
    expect_norms_in_gemv = folds;
    snprintf(name, sizeof name, "norm in gemv rms %s", kiln_dtype_name(dt));
    compare(p, name, NULL);

    p = p_new();
    x = IN(p, dt, 2, 1, 1024);
    h = MID(p, dt, 2, 1, 1024);
    uint32_t r = IN(p, dt, 2, 1, 520);
    p_op(p, KILN_OP_LAYER_NORM, 3,
         OPS(x, p_weight(p, dt, 1, DIMS(1024), 0.5, 1.5), p_weight(p, dt, 1, DIMS(1024), -1, 1)),
         h, 2, ATTR(1, 3), 1e-5);
    p_op(p, KILN_OP_LINEAR, 4,
         OPS(h, p_weight(p, dt, 2, DIMS(520, 1024), -0.05, 0.05),
             p_weight(p, dt, 1, DIMS(520), -1, 1), r),
         OUT(p, dt, 2, 1, 520), 2, ATTR(KILN_ACT_NONE, 1), 0);
    snprintf(name, sizeof name, "norm in gemv layer norm bias residual %s", kiln_dtype_name(dt));
    compare(p, name, shifted);

    p = p_new();
    x = IN(p, dt, 3, 1, 1, 4096);
    h = MID(p, dt, 3, 1, 1, 4096);
    uint32_t v = MID(p, dt, 2, 1, 4096);
    p->tensors[v].offset = p->tensors[h].offset; /* the reshape is placed on h's bytes */
    p_op(p, KILN_OP_RMS_NORM, 1, OPS(x), h, 2, ATTR(1, 0), 1e-6);
    p_op(p, KILN_OP_LINEAR, 2, OPS(h, p_weight(p, dt, 2, DIMS(256, 4096), -0.05, 0.05)),
         OUT(p, dt, 3, 1, 1, 256), 1, ATTR(KILN_ACT_NONE), 0);
    p_op(p, KILN_OP_RESHAPE, 1, OPS(h), v, 2, ATTR(1, 4096), 0);
    p_op(p, KILN_OP_LINEAR, 2, OPS(v, p_weight(p, dt, 2, DIMS(1024, 4096), -0.05, 0.05)),
         OUT(p, dt, 2, 1, 512), 1, ATTR(KILN_ACT_SWIGLU), 0);
    snprintf(name, sizeof name, "norm in gemv two readers one by a view %s", kiln_dtype_name(dt));
    compare(p, name, NULL);

    expect_norms_in_gemv = 0;
    p = p_new();
    x = IN(p, dt, 2, 1, 2048);
    h = MID(p, dt, 2, 1, 2048);
    p_op(p, KILN_OP_RMS_NORM, 2, OPS(x, p_weight(p, dt, 1, DIMS(2048), 0.5, 1.5)), h, 2,
         ATTR(1, 1), 1e-6);
    p_op(p, KILN_OP_LINEAR, 2, OPS(h, p_weight(p, dt, 2, DIMS(512, 2048), -0.05, 0.05)),
         OUT(p, dt, 2, 1, 512), 1, ATTR(KILN_ACT_NONE), 0);
    p_op(p, KILN_OP_NEG, 1, OPS(h), OUT(p, dt, 2, 1, 2048), 0, NULL, 0);
    snprintf(name, sizeof name, "norm in gemv refused another reader %s", kiln_dtype_name(dt));
    compare(p, name, NULL);

    /* x = a + b, its last reader the norm; z = -c written over x's bytes before the GEMV */
    p = p_new();
    uint32_t a = IN(p, dt, 2, 1, 2048), b = IN(p, dt, 2, 1, 2048), c = IN(p, dt, 2, 1, 512);
    x = MID(p, dt, 2, 1, 2048);
    h = MID(p, dt, 2, 1, 2048);
    uint32_t z = MID(p, dt, 2, 1, 512);
    p->tensors[z].offset = p->tensors[x].offset;
    p_op(p, KILN_OP_ADD, 2, OPS(a, b), x, 0, NULL, 1.0);
    p_op(p, KILN_OP_RMS_NORM, 2, OPS(x, p_weight(p, dt, 1, DIMS(2048), 0.5, 1.5)), h, 2,
         ATTR(1, 1), 1e-6);
    p_op(p, KILN_OP_NEG, 1, OPS(c), z, 0, NULL, 0);
    p_op(p, KILN_OP_LINEAR, 3, OPS(h, p_weight(p, dt, 2, DIMS(512, 2048), -0.05, 0.05), z),
         OUT(p, dt, 2, 1, 512), 2, ATTR(KILN_ACT_NONE, 1), 0);
    snprintf(name, sizeof name, "norm in gemv refused input overwritten %s", kiln_dtype_name(dt));
    compare(p, name, NULL);

    p = p_new(); /* the same with the GEMV's output placed over x's bytes */
    a = IN(p, dt, 2, 1, 2048);
    b = IN(p, dt, 2, 1, 2048);
    x = MID(p, dt, 2, 1, 2048);
    h = MID(p, dt, 2, 1, 2048);
    z = MID(p, dt, 2, 1, 512);
    p->tensors[z].offset = p->tensors[x].offset;
    p_op(p, KILN_OP_ADD, 2, OPS(a, b), x, 0, NULL, 1.0);
    p_op(p, KILN_OP_RMS_NORM, 2, OPS(x, p_weight(p, dt, 1, DIMS(2048), 0.5, 1.5)), h, 2,
         ATTR(1, 1), 1e-6);
    p_op(p, KILN_OP_LINEAR, 2, OPS(h, p_weight(p, dt, 2, DIMS(512, 2048), -0.05, 0.05)), z, 1,
         ATTR(KILN_ACT_NONE), 0);
    p_op(p, KILN_OP_NEG, 1, OPS(z), OUT(p, dt, 2, 1, 512), 0, NULL, 0);
    snprintf(name, sizeof name, "norm in gemv refused output over input %s", kiln_dtype_name(dt));
    compare(p, name, NULL);

    p = p_new(); /* 16384 columns: 2048 blocks of 8, over 3 a multiprocessor on 132 */
    x = IN(p, dt, 2, 1, 2048);
    h = MID(p, dt, 2, 1, 2048);
    p_op(p, KILN_OP_RMS_NORM, 2, OPS(x, p_weight(p, dt, 1, DIMS(2048), 0.5, 1.5)), h, 2,
         ATTR(1, 1), 1e-6);
    p_op(p, KILN_OP_LINEAR, 2, OPS(h, p_weight(p, dt, 2, DIMS(16384, 2048), -0.05, 0.05)),
         OUT(p, dt, 2, 1, 16384), 1, ATTR(KILN_ACT_NONE), 0);
    snprintf(name, sizeof name, "norm in gemv refused more than a wave %s", kiln_dtype_name(dt));
    compare(p, name, NULL);
  }
  expect_norms_in_gemv = -1;
  kcu_test_gemv_choice = -1;
  kcu_test_gemv_spread = -1;
}

/* A norm its readers do not compute (a GEMV of more than a wave reads it, or a pointwise op),
 * whose input a one-row GEMV just wrote, is computed by that GEMV's last block
 * (kcu_fold_norms_after): RMS after a GEMV with its residual, a layer norm with weight and bias
 * through a reshape placed on the GEMV's output into a program output (poisoned before each of
 * compare's runs, so each launch's last block must find the arrival count set back). Not in
 * f32, not for two rows (the tensor-core kernels), not where the norm's input is not that
 * GEMV's output. */
static void test_norm_after_gemv(void) {
  char name[96];
  kcu_test_gemv_choice = 1;
  kcu_test_gemv_spread = 0;
  for (int di = 0; di < 3; di++) {
    kiln_dtype dt = di == 0 ? KILN_F16 : di == 1 ? KILN_BF16 : KILN_F32;
    int folds = dt != KILN_F32;
    expect_norms_in_gemv = 0;
    expect_norms_after_gemv = folds;
    prog *p = p_new();
    uint32_t x = IN(p, dt, 2, 1, 2048), r = IN(p, dt, 2, 1, 1024);
    uint32_t y = MID(p, dt, 2, 1, 1024), h = MID(p, dt, 2, 1, 1024);
    p_op(p, KILN_OP_LINEAR, 3, OPS(x, p_weight(p, dt, 2, DIMS(1024, 2048), -0.05, 0.05), r), y,
         2, ATTR(KILN_ACT_NONE, 1), 0);
    p_op(p, KILN_OP_RMS_NORM, 2, OPS(y, p_weight(p, dt, 1, DIMS(1024), 0.5, 1.5)), h, 2,
         ATTR(1, 1), 1e-6);
    p_op(p, KILN_OP_LINEAR, 2, OPS(h, p_weight(p, dt, 2, DIMS(16384, 1024), -0.05, 0.05)),
         OUT(p, dt, 2, 1, 16384), 1, ATTR(KILN_ACT_NONE), 0);
    snprintf(name, sizeof name, "norm after gemv rms residual %s", kiln_dtype_name(dt));
    compare(p, name, NULL);

    p = p_new();
    x = IN(p, dt, 2, 1, 1024);
    y = MID(p, dt, 2, 1, 2048);
    uint32_t v = MID(p, dt, 3, 1, 1, 2048);
    p->tensors[v].offset = p->tensors[y].offset; /* the reshape is placed on y's bytes */
    h = OUT(p, dt, 3, 1, 1, 2048); /* poisoned between runs: each must write it */
    p_op(p, KILN_OP_LINEAR, 3,
         OPS(x, p_weight(p, dt, 2, DIMS(2048, 1024), -0.05, 0.05),
             p_weight(p, dt, 1, DIMS(2048), 0.5, 3.0)),
         y, 1, ATTR(KILN_ACT_NONE), 0);
    p_op(p, KILN_OP_RESHAPE, 1, OPS(y), v, 3, ATTR(1, 1, 2048), 0);
    p_op(p, KILN_OP_LAYER_NORM, 3,
         OPS(v, p_weight(p, dt, 1, DIMS(2048), 0.5, 1.5), p_weight(p, dt, 1, DIMS(2048), -1, 1)),
         h, 2, ATTR(1, 3), 1e-5);
    snprintf(name, sizeof name, "norm after gemv layer norm through a view %s",
             kiln_dtype_name(dt));
    compare(p, name, NULL);

    expect_norms_after_gemv = 0;
    p = p_new(); /* two rows: the tensor-core kernels, which compute no norm */
    x = IN(p, dt, 2, 2, 2048);
    y = MID(p, dt, 2, 2, 1024);
    h = MID(p, dt, 2, 2, 1024);
    p_op(p, KILN_OP_LINEAR, 2, OPS(x, p_weight(p, dt, 2, DIMS(1024, 2048), -0.05, 0.05)), y, 1,
         ATTR(KILN_ACT_NONE), 0);
    p_op(p, KILN_OP_RMS_NORM, 2, OPS(y, p_weight(p, dt, 1, DIMS(1024), 0.5, 1.5)), h, 2,
         ATTR(1, 1), 1e-6);
    p_op(p, KILN_OP_NEG, 1, OPS(h), OUT(p, dt, 2, 2, 1024), 0, NULL, 0);
    snprintf(name, sizeof name, "norm after gemv refused two rows %s", kiln_dtype_name(dt));
    compare(p, name, NULL);

    p = p_new(); /* the norm reads the GEMV's input, not its output */
    x = MID(p, dt, 2, 1, 1024);
    h = MID(p, dt, 2, 1, 1024);
    uint32_t a = IN(p, dt, 2, 1, 1024);
    p_op(p, KILN_OP_NEG, 1, OPS(a), x, 0, NULL, 0);
    p_op(p, KILN_OP_LINEAR, 2, OPS(x, p_weight(p, dt, 2, DIMS(1024, 1024), -0.05, 0.05)),
         OUT(p, dt, 2, 1, 1024), 1, ATTR(KILN_ACT_NONE), 0);
    p_op(p, KILN_OP_RMS_NORM, 2, OPS(x, p_weight(p, dt, 1, DIMS(1024), 0.5, 1.5)), h, 2,
         ATTR(1, 1), 1e-6);
    p_op(p, KILN_OP_NEG, 1, OPS(h), OUT(p, dt, 2, 1, 1024), 0, NULL, 0);
    snprintf(name, sizeof name, "norm after gemv refused the gemv's input %s",
             kiln_dtype_name(dt));
    compare(p, name, NULL);
  }
  expect_norms_in_gemv = -1;
  expect_norms_after_gemv = -1;
  kcu_test_gemv_choice = -1;
  kcu_test_gemv_spread = -1;
}

static void test_pointwise(void) {
  char name[96];
  static const kiln_op_kind bin[6] = {KILN_OP_ADD, KILN_OP_SUB,     KILN_OP_MUL,
                                      KILN_OP_DIV, KILN_OP_MINIMUM, KILN_OP_MAXIMUM};
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = float_types[t];
    for (int k = 0; k < 6; k++) {
      prog *p = p_new(); /* same shape: the vectorized path, with a tail */
      uint32_t a = IN(p, dt, 2, 33, 129), b = IN(p, dt, 2, 33, 129);
      p_op(p, bin[k], 2, OPS(a, b), OUT(p, dt, 2, 33, 129), 0, NULL, 0.5);
      snprintf(name, sizeof name, "%s same-shape %s", kiln_op_name(bin[k]), kiln_dtype_name(dt));
      io_range r[2] = {{-1, 1}, {0.5, 2}};
      compare(p, name, r);
      p = p_new(); /* broadcast both ways */
      a = IN(p, dt, 3, 4, 1, 8);
      b = IN(p, dt, 2, 3, 1);
      p_op(p, bin[k], 2, OPS(a, b), OUT(p, dt, 3, 4, 3, 8), 0, NULL, 1.0);
      snprintf(name, sizeof name, "%s broadcast %s", kiln_op_name(bin[k]), kiln_dtype_name(dt));
      compare(p, name, r);
    }
    static const kiln_op_kind un[17] = {
        KILN_OP_RELU, KILN_OP_GELU, KILN_OP_SILU, KILN_OP_SIGMOID,   KILN_OP_TANH,
        KILN_OP_EXP,  KILN_OP_SQRT, KILN_OP_RSQRT, KILN_OP_NEG,      KILN_OP_POW,
        KILN_OP_ABS,  KILN_OP_LOG,  KILN_OP_COS,   KILN_OP_SIN,      KILN_OP_ERF,
        KILN_OP_HARDSWISH, KILN_OP_HARDSIGMOID};
    for (int k = 0; k < 17; k++) {
      for (int approx = 0; approx < (un[k] == KILN_OP_GELU ? 2 : 1); approx++) {
        prog *p = p_new();
        uint32_t x = IN(p, dt, 3, 3, 7, 101);
        p_op(p, un[k], 1, OPS(x), OUT(p, dt, 3, 3, 7, 101), 1, ATTR(approx), 2.5);
        snprintf(name, sizeof name, "%s%s %s", kiln_op_name(un[k]), approx ? " tanh" : "",
                 kiln_dtype_name(dt));
        int positive = un[k] == KILN_OP_SQRT || un[k] == KILN_OP_RSQRT || un[k] == KILN_OP_POW ||
                       un[k] == KILN_OP_LOG;
        int wide = un[k] == KILN_OP_HARDSWISH || un[k] == KILN_OP_HARDSIGMOID; /* both kinks */
        io_range r = {positive ? 0.1 : wide ? -5 : -3, wide ? 5 : 3};
        compare(p, name, &r);
      }
    }
  }
  prog *p = p_new();
  uint32_t a = IN(p, KILN_I64, 2, 5, 9), b = IN(p, KILN_I64, 1, 9);
  p_op(p, KILN_OP_ADD, 2, OPS(a, b), OUT(p, KILN_I64, 2, 5, 9), 0, NULL, 2.0);
  io_range ri[2] = {{-1000, 1000}, {-1000, 1000}};
  compare(p, "add i64 alpha 2", ri);
  p = p_new();
  a = IN(p, KILN_I32, 1, 77);
  p_op(p, KILN_OP_NEG, 1, OPS(a), OUT(p, KILN_I32, 1, 77), 0, NULL, 0);
  compare(p, "neg i32", ri);
  static const kiln_dtype ints[2] = {KILN_I64, KILN_I32};
  for (int t = 0; t < 2; t++) { /* mask and position arithmetic: integers broadcast */
    for (int k = 0; k < 3; k++) {
      p = p_new();
      a = IN(p, ints[t], 2, 6, 1);
      b = IN(p, ints[t], 1, 33);
      p_op(p, bin[k], 2, OPS(a, b), OUT(p, ints[t], 2, 6, 33), 0, NULL, 1.0);
      snprintf(name, sizeof name, "%s broadcast %s", kiln_op_name(bin[k]), kiln_dtype_name(ints[t]));
      compare(p, name, ri);
    }
  }
  p = p_new();
  a = IN(p, KILN_I64, 2, 5, 9);
  p_op(p, KILN_OP_ABS, 1, OPS(a), OUT(p, KILN_I64, 2, 5, 9), 0, NULL, 0);
  compare(p, "abs i64", ri);
  p = p_new();
  a = IN(p, KILN_I32, 1, 77);
  b = IN(p, KILN_I32, 2, 3, 1);
  p_op(p, KILN_OP_MINIMUM, 2, OPS(a, b), OUT(p, KILN_I32, 2, 3, 77), 0, NULL, 0);
  compare(p, "minimum i32 broadcast", ri);
  p = p_new();
  a = IN(p, KILN_BOOL, 2, 5, 1);
  b = IN(p, KILN_BOOL, 1, 9);
  p_op(p, KILN_OP_MAXIMUM, 2, OPS(a, b), OUT(p, KILN_BOOL, 2, 5, 9), 0, NULL, 0);
  compare(p, "maximum bool broadcast", NULL);
  /* NaN from log of negatives propagates through maximum; -inf at 0 is not reached */
  p = p_new();
  a = IN(p, KILN_F32, 2, 33, 129);
  uint32_t lg = MID(p, KILN_F32, 2, 33, 129);
  p_op(p, KILN_OP_LOG, 1, OPS(a), lg, 0, NULL, 0);
  p_op(p, KILN_OP_MAXIMUM, 2, OPS(lg, a), OUT(p, KILN_F32, 2, 33, 129), 0, NULL, 0);
  compare(p, "maximum of NaN from log f32", NULL);
  /* clamp as the lowering writes it, with the lower bound above the upper in the second */
  for (int t = 0; t < 3; t++) {
    for (int swapped = 0; swapped < 2; swapped++) {
      kiln_dtype dt = float_types[t];
      p = p_new();
      uint32_t x = IN(p, dt, 2, 7, 65), m = MID(p, dt, 2, 7, 65);
      uint32_t lo = p_weight(p, dt, 0, NULL, swapped ? 0.4 : -0.6, swapped ? 0.5 : -0.5);
      uint32_t hi = p_weight(p, dt, 0, NULL, swapped ? -0.6 : 0.4, swapped ? -0.5 : 0.5);
      p_op(p, KILN_OP_MAXIMUM, 2, OPS(x, lo), m, 0, NULL, 0);
      p_op(p, KILN_OP_MINIMUM, 2, OPS(m, hi), OUT(p, dt, 2, 7, 65), 0, NULL, 0);
      snprintf(name, sizeof name, "clamp%s %s", swapped ? " min above max" : "", kiln_dtype_name(dt));
      compare(p, name, NULL);
    }
  }

  static const kiln_dtype casts[][2] = {{KILN_F32, KILN_F16}, {KILN_F16, KILN_F32},
                                        {KILN_F32, KILN_BF16}, {KILN_F32, KILN_I32},
                                        {KILN_I64, KILN_F32}, {KILN_F32, KILN_BOOL},
                                        {KILN_BOOL, KILN_F16}, {KILN_I64, KILN_I32}};
  for (size_t k = 0; k < sizeof casts / sizeof casts[0]; k++) {
    p = p_new();
    uint32_t x = IN(p, casts[k][0], 2, 13, 17);
    p_op(p, KILN_OP_CAST, 1, OPS(x), OUT(p, casts[k][1], 2, 13, 17), 1, ATTR(casts[k][1]), 0);
    snprintf(name, sizeof name, "cast %s -> %s", kiln_dtype_name(casts[k][0]), kiln_dtype_name(casts[k][1]));
    io_range r = {-100, 100};
    compare(p, name, &r);
  }
  for (int t = 0; t < 3; t++) {
    p = p_new();
    uint32_t c = IN(p, KILN_BOOL, 2, 6, 1), x = IN(p, float_types[t], 3, 2, 6, 5),
             y = IN(p, float_types[t], 1, 5);
    p_op(p, KILN_OP_WHERE, 3, OPS(c, x, y), OUT(p, float_types[t], 3, 2, 6, 5), 0, NULL, 0);
    snprintf(name, sizeof name, "where broadcast %s", kiln_dtype_name(float_types[t]));
    compare(p, name, NULL);
  }
}

/* COMPARE of x against a row of itself (so that equal pairs occur), broadcast, in every dtype;
 * LOGICAL of mixed dtypes and BITWISE of bools and integers, broadcast; NOT of each. */
static void test_logic(void) {
  char name[96];
  static const kiln_dtype all[6] = {KILN_F32, KILN_F16, KILN_BF16, KILN_I64, KILN_I32, KILN_BOOL};
  static const char *const cmp_names[6] = {"eq", "ne", "lt", "le", "gt", "ge"};
  io_range small[2] = {{-3, 3}, {-3, 3}};
  for (int t = 0; t < 6; t++) {
    for (int cmp = KILN_CMP_EQ; cmp <= KILN_CMP_GE; cmp++) {
      prog *p = p_new();
      uint32_t x = IN(p, all[t], 3, 4, 3, 40), row = MID(p, all[t], 3, 4, 1, 40);
      p_op(p, KILN_OP_SLICE, 1, OPS(x), row, 4, ATTR(1, 1, 2, 1), 0);
      p_op(p, KILN_OP_COMPARE, 2, OPS(x, row), OUT(p, KILN_BOOL, 3, 4, 3, 40), 1, ATTR(cmp), 0);
      snprintf(name, sizeof name, "compare %s %s", cmp_names[cmp], kiln_dtype_name(all[t]));
      compare(p, name, small);
    }
  }
  prog *p = p_new(); /* NaN compares unequal, and ne true */
  uint32_t x = IN(p, KILN_F32, 2, 9, 50), lg = MID(p, KILN_F32, 2, 9, 50);
  p_op(p, KILN_OP_LOG, 1, OPS(x), lg, 0, NULL, 0);
  p_op(p, KILN_OP_COMPARE, 2, OPS(lg, lg), OUT(p, KILN_BOOL, 2, 9, 50), 1, ATTR(KILN_CMP_NE), 0);
  compare(p, "compare ne of NaN f32", small);

  static const char *const op_names[4] = {"and", "or", "xor", "not"};
  static const kiln_dtype lhs[3] = {KILN_BOOL, KILN_F32, KILN_I32};
  for (int which = KILN_BOOL_AND; which <= KILN_BOOL_NOT; which++) {
    int two = which != KILN_BOOL_NOT;
    for (int t = 0; t < 3; t++) {
      p = p_new();
      x = IN(p, lhs[t], 3, 4, 1, 40);
      uint32_t y = IN(p, KILN_I64, 2, 3, 1);
      p_op(p, KILN_OP_LOGICAL, two ? 2 : 1, OPS(x, y), OUT(p, KILN_BOOL, 3, 4, two ? 3 : 1, 40), 1,
           ATTR(which), 0);
      snprintf(name, sizeof name, "logical %s %s", op_names[which], kiln_dtype_name(lhs[t]));
      io_range r[2] = {{-1, 1}, {-1, 1}}; /* integers round to -1, 0 and 1 */
      compare(p, name, r);
    }
    for (int t = 3; t < 6; t++) {
      p = p_new();
      x = IN(p, all[t], 3, 4, 1, 40);
      uint32_t y = IN(p, all[t], 2, 3, 1);
      p_op(p, KILN_OP_BITWISE, two ? 2 : 1, OPS(x, y), OUT(p, all[t], 3, 4, two ? 3 : 1, 40), 1,
           ATTR(which), 0);
      snprintf(name, sizeof name, "bitwise %s %s", op_names[which], kiln_dtype_name(all[t]));
      io_range r[2] = {{-1000, 1000}, {-1000, 1000}};
      compare(p, name, r);
    }
  }
}

/* POINTWISE chains: same-shape operands (vectorized, with a tail), broadcast operands, every
 * unary step, and the init check refusing a malformed chain. */
static void test_fused_pointwise(void) {
  char name[96];
  kiln_error err;
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = float_types[t];
    prog *p = p_new();
    uint32_t x = IN(p, dt, 2, 33, 129), y = IN(p, dt, 2, 33, 129), z = IN(p, dt, 2, 33, 129);
    int64_t same[5] = {KILN_PW_STEP(KILN_OP_MUL, 1, 0), KILN_PW_STEP(KILN_OP_SUB, 2, KILN_PW_REVERSED),
                       KILN_PW_STEP(KILN_OP_GELU, 0, KILN_PW_GELU_TANH),
                       KILN_PW_STEP(KILN_OP_ADD, 1, 0), KILN_PW_STEP(KILN_OP_TANH, 0, 0)};
    p_op(p, KILN_OP_POINTWISE, 3, OPS(x, y, z), OUT(p, dt, 2, 33, 129), 5, same, 0);
    snprintf(name, sizeof name, "pointwise same-shape %s", kiln_dtype_name(dt));
    compare(p, name, NULL);

    p = p_new();
    x = IN(p, dt, 3, 4, 3, 8);
    y = IN(p, dt, 2, 3, 1);
    z = IN(p, dt, 1, 8);
    int64_t bcast[4] = {KILN_PW_STEP(KILN_OP_MUL, 1, 0), KILN_PW_STEP(KILN_OP_ADD, 2, 0),
                        KILN_PW_STEP(KILN_OP_SILU, 0, 0), KILN_PW_STEP(KILN_OP_DIV, 2, 0)};
    p_op(p, KILN_OP_POINTWISE, 3, OPS(x, y, z), OUT(p, dt, 3, 4, 3, 8), 4, bcast, 0);
    snprintf(name, sizeof name, "pointwise broadcast %s", kiln_dtype_name(dt));
    io_range r[3] = {{-1, 1}, {-1, 1}, {0.5, 2}};
    compare(p, name, r);

    p = p_new();
    x = IN(p, dt, 2, 7, 101);
    int64_t unary[8] = {KILN_PW_STEP(KILN_OP_SQRT, 0, 0),  KILN_PW_STEP(KILN_OP_POW, 0, 0),
                        KILN_PW_STEP(KILN_OP_RSQRT, 0, 0), KILN_PW_STEP(KILN_OP_NEG, 0, 0),
                        KILN_PW_STEP(KILN_OP_EXP, 0, 0),   KILN_PW_STEP(KILN_OP_SIGMOID, 0, 0),
                        KILN_PW_STEP(KILN_OP_GELU, 0, 0),  KILN_PW_STEP(KILN_OP_RELU, 0, 0)};
    p_op(p, KILN_OP_POINTWISE, 1, OPS(x), OUT(p, dt, 2, 7, 101), 8, unary, 2.5);
    snprintf(name, sizeof name, "pointwise eight unary steps %s", kiln_dtype_name(dt));
    io_range rp = {0.1, 3};
    compare(p, name, &rp);

    /* the steps added with the comparison ops: clamp by two operands, trig, erf, the hard
     * activations, abs and log; same-shape operands, then a broadcast lower bound */
    for (int spread = 0; spread < 2; spread++) {
      p = p_new();
      x = IN(p, dt, 2, 33, 129);
      y = spread ? IN(p, dt, 1, 129) : IN(p, dt, 2, 33, 129);
      z = IN(p, dt, 2, 33, 129);
      int64_t fresh[8] = {KILN_PW_STEP(KILN_OP_MAXIMUM, 1, 0),
                          KILN_PW_STEP(KILN_OP_MINIMUM, 2, KILN_PW_REVERSED),
                          KILN_PW_STEP(KILN_OP_SIN, 0, 0),
                          KILN_PW_STEP(KILN_OP_HARDSWISH, 0, 0),
                          KILN_PW_STEP(KILN_OP_COS, 0, 0),
                          KILN_PW_STEP(KILN_OP_ERF, 0, 0),
                          KILN_PW_STEP(KILN_OP_HARDSIGMOID, 0, 0),
                          KILN_PW_STEP(KILN_OP_LOG, 0, 0)};
      p_op(p, KILN_OP_POINTWISE, 3, OPS(x, y, z), OUT(p, dt, 2, 33, 129), 8, fresh, 0);
      snprintf(name, sizeof name, "pointwise new steps%s %s", spread ? " broadcast" : "",
               kiln_dtype_name(dt));
      io_range rn[3] = {{-4, 4}, {-2, 0}, {0, 2}};
      compare(p, name, rn);
    }
    p = p_new();
    x = IN(p, dt, 2, 7, 101);
    int64_t absolute[2] = {KILN_PW_STEP(KILN_OP_ABS, 0, 0), KILN_PW_STEP(KILN_OP_LOG, 0, 0)};
    p_op(p, KILN_OP_POINTWISE, 1, OPS(x), OUT(p, dt, 2, 7, 101), 2, absolute, 0);
    snprintf(name, sizeof name, "pointwise abs, log %s", kiln_dtype_name(dt));
    io_range ra = {-3, 3};
    compare(p, name, &ra);
  }
  prog *p = p_new(); /* an operand that does not broadcast to the output */
  uint32_t x = IN(p, KILN_F32, 2, 4, 10), y = IN(p, KILN_F32, 1, 9);
  int64_t steps[2] = {KILN_PW_STEP(KILN_OP_ADD, 1, 0), KILN_PW_STEP(KILN_OP_RELU, 0, 0)};
  p_op(p, KILN_OP_POINTWISE, 2, OPS(x, y), OUT(p, KILN_F32, 2, 4, 10), 2, steps, 0);
  kiln_engine *e = p_load(p, &kiln_cuda_backend, 0, &err);
  printf("pointwise [4,10] with [9]: %s: %s\n", kiln_status_name(err.status), err.message);
  CHECK(e == NULL && err.status == KILN_ERR_INVALID_PROGRAM &&
        strstr(err.message, "op 0 (pointwise)"));
  p_unload(e);
  p_free(p);
}

/* The FUSED kernel's runs of V elements on every path: ranks 1 to 6, innermost dims that
 * take runs of 8, 4, 2 and 1 (and outputs of fewer than 8 elements), boxes and a select that
 * split the innermost dim, a select on an outer dim, broadcast loads, a load at an odd element
 * offset (no aligned vector), inputs of another dtype than the output, dims that coalesce. */
static void test_fused_runs(void) {
  static const struct {
    int32_t rank;
    int64_t dims[6];
  } shapes[] = {{1, {1}},         {1, {4}},           {1, {6}},           {1, {13}},
                {1, {64}},        {2, {7, 13}},       {2, {5, 24}},       {2, {3, 2}},
                {3, {3, 5, 7}},   {3, {2, 3, 16}},    {4, {2, 3, 5, 8}},  {4, {2, 3, 4, 36}},
                {5, {2, 2, 3, 3, 10}}, {6, {2, 1, 3, 2, 2, 32}}, {6, {1, 2, 1, 3, 1, 7}}};
  char name[128];
  int64_t maps[7 * 20], code[2 * KILN_FX_MAX_INSTRS];
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    int32_t r = shapes[k].rank;
    const int64_t *dims = shapes[k].dims;
    int64_t numel = 1;
    char shape[48];
    int at = 0;
    for (int32_t d = 0; d < r; d++) {
      numel *= dims[d];
      at += snprintf(shape + at, sizeof shape - (size_t)at, "%s%lld", d ? "x" : "", (long long)dims[d]);
    }
    for (int t = 0; t < 8; t++) {
      /* f32, f16, bf16 alike; f16 out of f32 inputs and bf16 out of f16 ones; f32, f16 and bf16
       * out of i64, i32 and bool inputs (loaded as their casts convert them) */
      static const kiln_dtype outs[8] = {KILN_F32, KILN_F16, KILN_BF16, KILN_F16, KILN_BF16,
                                         KILN_F32, KILN_F16, KILN_BF16};
      static const kiln_dtype ins[8] = {KILN_F32, KILN_F16, KILN_BF16, KILN_F32, KILN_F16,
                                        KILN_I64, KILN_I32, KILN_BOOL};
      kiln_dtype dt = outs[t], it = ins[t];
      prog *p = p_new();
      uint32_t x = IN(p, it, 1, numel + 8), y = IN(p, it, 1, dims[r - 1]), z = IN(p, it, 1, dims[0]);
      uint32_t n = fx_runs(maps, code, r, dims);
      p_fused(p, 3, OPS(x, y, z), p_tensor(p, KILN_STORE_OUTPUT, dt, r, dims), r, 7, maps, n, code);
      snprintf(name, sizeof name, "fused runs %s %s of %s", shape, kiln_dtype_name(dt),
               kiln_dtype_name(it));
      io_range wide[3] = {{-9, 9}, {-9, 9}, {-9, 9}}; /* integers of several values */
      compare(p, name, t >= 5 ? wide : NULL);
      if (t >= 3) continue;
      p = p_new(); /* contiguous maps: the dims coalesce into one */
      x = p_tensor(p, KILN_STORE_INPUT, dt, r, dims), y = p_tensor(p, KILN_STORE_INPUT, dt, r, dims);
      n = fx_chain(maps, code, r, dims, dt);
      p_fused(p, 2, OPS(x, y), p_tensor(p, KILN_STORE_OUTPUT, dt, r, dims), r, 2, maps, n, code);
      snprintf(name, sizeof name, "fused chain %s %s", shape, kiln_dtype_name(dt));
      compare(p, name, NULL);
    }
  }
  { /* a stride the parser bounds inside the load's box only: no address outside it */
    prog *p = p_new();
    uint32_t x = IN(p, KILN_F32, 1, 16);
    int64_t m[8] = {0, 0, 3695202394745864193LL, 1, 0, 0, 1, 8};
    int64_t c[4] = {KILN_FX_INSTR(KILN_FX_LOAD, 0, 0, 0, 0), 0,
                    KILN_FX_INSTR(KILN_FX_STORE, 0, 0, 0, 0), 0};
    p_fused(p, 1, OPS(x), OUT(p, KILN_F32, 2, 4, 8), 2, 1, m, 2, c);
    compare(p, "fused runs off-box stride", NULL);
  }
  for (int t = 0; t < 3; t++)
    for (int cl = 0; cl < 2; cl++) { /* the gate in both layouts, 7x7 spatial */
      kiln_dtype dt = float_types[t];
      prog *p = p_new();
      uint32_t x = cl ? IN(p, dt, 4, 2, 7, 7, 24) : IN(p, dt, 4, 2, 24, 7, 7);
      uint32_t s = cl ? IN(p, dt, 4, 2, 1, 1, 24) : IN(p, dt, 4, 2, 24, 1, 1);
      uint32_t n = fx_gate(maps, code, cl, 2, 24, 7, 7, dt);
      uint32_t o = cl ? OUT(p, dt, 4, 2, 7, 7, 24) : OUT(p, dt, 4, 2, 24, 7, 7);
      p_fused(p, 2, OPS(x, s), o, 4, 2, maps, n, code);
      snprintf(name, sizeof name, "fused gate %s %s", cl ? "channels_last" : "nchw", kiln_dtype_name(dt));
      io_range rg[2] = {{-2, 2}, {-4, 4}};
      compare(p, name, rg);
    }
}

/* FUSED programs: the rotary embedding of a packed projection (odd sizes, boxed loads and a
 * select), rounded as its unfused ops would, and a program of every instruction code. */
static void test_fused_group(void) {
  char name[96];
  int64_t maps[5 * 14], code[2 * KILN_FX_MAX_INSTRS];
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = float_types[t];
    prog *p = p_new();
    uint32_t x = IN(p, dt, 3, 3, 37, 5 * 64), c = IN(p, dt, 2, 37, 64), s = IN(p, dt, 2, 37, 64);
    uint32_t n = fx_rotary(maps, code, 3, 5, 37, 64, dt);
    p_fused(p, 3, OPS(x, c, s), OUT(p, dt, 4, 3, 5, 37, 64), 4, 5, maps, n, code);
    snprintf(name, sizeof name, "fused group rotary %s", kiln_dtype_name(dt));
    compare(p, name, NULL);

    p = p_new();
    x = IN(p, dt, 2, 33, 129);
    uint32_t y = IN(p, dt, 1, 129);
    n = fx_mix(maps, code, 33, 129);
    p_fused(p, 2, OPS(x, y), OUT(p, dt, 2, 33, 129), 2, 2, maps, n, code);
    snprintf(name, sizeof name, "fused group every code %s", kiln_dtype_name(dt));
    io_range r[2] = {{-3, 3}, {0.5, 2}};
    compare(p, name, r);

    p = p_new(); /* the Llama k group's shape: runs of 8 with vector loads and stores */
    x = IN(p, dt, 3, 1, 128, 8 * 128), c = IN(p, dt, 2, 128, 128), s = IN(p, dt, 2, 128, 128);
    n = fx_rotary(maps, code, 1, 8, 128, 128, dt);
    p_fused(p, 3, OPS(x, c, s), OUT(p, dt, 4, 1, 8, 128, 128), 4, 5, maps, n, code);
    snprintf(name, sizeof name, "fused group rotary 1x8x128x128 %s", kiln_dtype_name(dt));
    compare(p, name, NULL);
  }
  test_fused_runs();
}

static void test_normalize_reduce(void) {
  char name[96];
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = float_types[t];
    for (int log = 0; log < 2; log++) {
      kiln_op_kind k = log ? KILN_OP_LOG_SOFTMAX : KILN_OP_SOFTMAX;
      for (int dim = 1; dim < 3; dim++) {
        prog *p = p_new();
        uint32_t x = IN(p, dt, 3, 4, 33, 300);
        p_op(p, k, 1, OPS(x), OUT(p, dt, 3, 4, 33, 300), 1, ATTR(dim), 0);
        snprintf(name, sizeof name, "%s dim %d %s", kiln_op_name(k), dim, kiln_dtype_name(dt));
        io_range r = {-8, 8};
        compare(p, name, &r);
      }
    }
    prog *p = p_new();
    uint32_t x = IN(p, dt, 3, 3, 40, 1024);
    uint32_t w = p_weight(p, dt, 1, DIMS(1024), 0.5, 1.5), b = p_weight(p, dt, 1, DIMS(1024), -1, 1);
    p_op(p, KILN_OP_LAYER_NORM, 3, OPS(x, w, b), OUT(p, dt, 3, 3, 40, 1024), 2, ATTR(1, 3), 1e-5);
    snprintf(name, sizeof name, "layer_norm w+b %s", kiln_dtype_name(dt));
    compare(p, name, NULL);
    /* 600 rows: the blocks take two vectors a thread (the last thread of a row one) */
    p = p_new();
    x = IN(p, dt, 3, 2, 300, 1000);
    w = p_weight(p, dt, 1, DIMS(1000), 0.5, 1.5), b = p_weight(p, dt, 1, DIMS(1000), -1, 1);
    p_op(p, KILN_OP_LAYER_NORM, 3, OPS(x, w, b), OUT(p, dt, 3, 2, 300, 1000), 2, ATTR(1, 3), 1e-5);
    snprintf(name, sizeof name, "layer_norm w+b 600 rows %s", kiln_dtype_name(dt));
    compare(p, name, NULL);
    p = p_new();
    x = IN(p, dt, 3, 5, 6, 64);
    p_op(p, KILN_OP_LAYER_NORM, 1, OPS(x), OUT(p, dt, 3, 5, 6, 64), 2, ATTR(2, 0), 1e-5);
    snprintf(name, sizeof name, "layer_norm 2 dims no affine %s", kiln_dtype_name(dt));
    compare(p, name, NULL);
    p = p_new();
    x = IN(p, dt, 2, 17, 4096);
    w = p_weight(p, dt, 1, DIMS(4096), 0.5, 1.5);
    p_op(p, KILN_OP_RMS_NORM, 2, OPS(x, w), OUT(p, dt, 2, 17, 4096), 2, ATTR(1, 1), 1e-6);
    snprintf(name, sizeof name, "rms_norm %s", kiln_dtype_name(dt));
    compare(p, name, NULL);
    /* Fused steps: a residual add before a layer norm, gelu and a broadcast mul after it. */
    p = p_new();
    x = IN(p, dt, 3, 3, 40, 1024);
    uint32_t res = IN(p, dt, 3, 3, 40, 1024), gate = IN(p, dt, 3, 3, 1, 1024);
    w = p_weight(p, dt, 1, DIMS(1024), 0.5, 1.5), b = p_weight(p, dt, 1, DIMS(1024), -1, 1);
    p_op(p, KILN_OP_LAYER_NORM, 5, OPS(x, w, b, res, gate), OUT(p, dt, 3, 3, 40, 1024), 6,
         ATTR(1, 3, 1, KILN_PW_STEP(KILN_OP_ADD, 3, 0), KILN_PW_STEP(KILN_OP_GELU, 0, 0),
              KILN_PW_STEP(KILN_OP_MUL, 4, 0)),
         1e-5);
    snprintf(name, sizeof name, "layer_norm fused add, gelu, mul %s", kiln_dtype_name(dt));
    compare(p, name, NULL);
    /* An RMS norm over two dims: (x - m) * s before it, x^2 and silu after; m broadcasts by
     * row, s by column. */
    p = p_new();
    x = IN(p, dt, 3, 7, 9, 130);
    uint32_t m = IN(p, dt, 3, 7, 9, 1), sc = IN(p, dt, 1, 130);
    kiln_op *op = p_op(p, KILN_OP_RMS_NORM, 3, OPS(x, m, sc), OUT(p, dt, 3, 7, 9, 130), 7,
                       ATTR(2, 0, 2, KILN_PW_STEP(KILN_OP_SUB, 1, 0),
                            KILN_PW_STEP(KILN_OP_MUL, 2, 0), KILN_PW_STEP(KILN_OP_POW, 0, 0),
                            KILN_PW_STEP(KILN_OP_SILU, 0, 0)),
                       1e-6);
    op->fattr[1] = 2.0;
    snprintf(name, sizeof name, "rms_norm fused sub, mul, pow, silu %s", kiln_dtype_name(dt));
    compare(p, name, NULL);

    static const kiln_op_kind red[3] = {KILN_OP_SUM, KILN_OP_MEAN, KILN_OP_AMAX};
    for (int k = 0; k < 3; k++) {
      p = p_new();
      x = IN(p, dt, 3, 6, 50, 70);
      p_op(p, red[k], 1, OPS(x), OUT(p, dt, 1, 6), 2, ATTR(6, 0), 0);
      snprintf(name, sizeof name, "%s trailing dims %s", kiln_op_name(red[k]), kiln_dtype_name(dt));
      compare(p, name, NULL);
      p = p_new();
      x = IN(p, dt, 3, 6, 50, 7);
      p_op(p, red[k], 1, OPS(x), OUT(p, dt, 3, 1, 50, 1), 2, ATTR(5, 1), 0);
      snprintf(name, sizeof name, "%s outer dims keepdim %s", kiln_op_name(red[k]), kiln_dtype_name(dt));
      compare(p, name, NULL);
    }
  }
  for (int t = 0; t < 3; t++) {
    prog *p = p_new(); /* few outputs, long reductions: a block per output */
    uint32_t x = IN(p, float_types[t], 2, 3, 100000);
    p_op(p, KILN_OP_MEAN, 1, OPS(x), OUT(p, float_types[t], 1, 3), 2, ATTR(2, 0), 0);
    snprintf(name, sizeof name, "mean of long rows %s", kiln_dtype_name(float_types[t]));
    compare(p, name, NULL);
    p = p_new();
    x = IN(p, float_types[t], 2, 300, 500);
    p_op(p, KILN_OP_AMAX, 1, OPS(x), OUT(p, float_types[t], 0, 0), 2, ATTR(3, 0), 0);
    snprintf(name, sizeof name, "amax of everything %s", kiln_dtype_name(float_types[t]));
    compare(p, name, NULL);
  }
  prog *p = p_new();
  uint32_t x = IN(p, KILN_I64, 2, 9, 100000);
  p_op(p, KILN_OP_SUM, 1, OPS(x), OUT(p, KILN_I64, 1, 9), 2, ATTR(2, 0), 0);
  io_range r = {-1e6, 1e6};
  compare(p, "sum i64", &r);
}

static void test_layout_gather(void) {
  char name[96];
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = float_types[t];
    const char *dn = kiln_dtype_name(dt);
    prog *p = p_new();
    uint32_t x = IN(p, dt, 4, 2, 3, 4, 5);
    p_op(p, KILN_OP_PERMUTE, 1, OPS(x), OUT(p, dt, 4, 2, 4, 3, 5), 4, ATTR(0, 2, 1, 3), 0);
    snprintf(name, sizeof name, "permute 0213 %s", dn);
    compare(p, name, NULL);
    /* Copies whose innermost dim stays contiguous move 16 bytes at a time: a head permute, a
     * cat along rows, a slice starting on a row; a slice starting one element in does not. */
    p = p_new();
    x = IN(p, dt, 4, 2, 33, 4, 64);
    p_op(p, KILN_OP_PERMUTE, 1, OPS(x), OUT(p, dt, 4, 2, 4, 33, 64), 4, ATTR(0, 2, 1, 3), 0);
    snprintf(name, sizeof name, "permute heads wide %s", dn);
    compare(p, name, NULL);
    p = p_new();
    uint32_t ca = IN(p, dt, 3, 2, 3, 8), cb = IN(p, dt, 3, 2, 5, 8);
    p_op(p, KILN_OP_CAT, 2, OPS(ca, cb), OUT(p, dt, 3, 2, 8, 8), 1, ATTR(1), 0);
    snprintf(name, sizeof name, "cat rows wide %s", dn);
    compare(p, name, NULL);
    p = p_new();
    x = IN(p, dt, 3, 4, 20, 16);
    p_op(p, KILN_OP_SLICE, 1, OPS(x), OUT(p, dt, 3, 4, 12, 16), 4, ATTR(1, 3, 15, 1), 0);
    snprintf(name, sizeof name, "slice rows wide %s", dn);
    compare(p, name, NULL);
    p = p_new();
    x = IN(p, dt, 3, 4, 20, 16);
    p_op(p, KILN_OP_SLICE, 1, OPS(x), OUT(p, dt, 3, 4, 20, 8), 4, ATTR(2, 1, 9, 1), 0);
    snprintf(name, sizeof name, "slice inner from 1 %s", dn);
    compare(p, name, NULL);
    /* Rows of an odd width into a contiguous output: 16-byte stores gathered across row ends,
     * then a tail shorter than a vector. */
    p = p_new();
    x = IN(p, dt, 3, 3, 5, 37);
    p_op(p, KILN_OP_SLICE, 1, OPS(x), OUT(p, dt, 3, 3, 5, 33), 4, ATTR(2, 2, 35, 1), 0);
    snprintf(name, sizeof name, "slice odd rows %s", dn);
    compare(p, name, NULL);
    /* the first 37 of rows 48 long: aligned 16-byte loads shifted by each row's offset */
    p = p_new();
    x = IN(p, dt, 2, 6, 48);
    p_op(p, KILN_OP_SLICE, 1, OPS(x), OUT(p, dt, 2, 6, 37), 4, ATTR(1, 0, 37, 1), 0);
    snprintf(name, sizeof name, "slice pitch rows %s", dn);
    compare(p, name, NULL);
    p = p_new();
    x = IN(p, dt, 3, 7, 9, 11);
    p_op(p, KILN_OP_PERMUTE, 1, OPS(x), OUT(p, dt, 3, 11, 7, 9), 3, ATTR(2, 0, 1), 0);
    snprintf(name, sizeof name, "permute 201 %s", dn);
    compare(p, name, NULL);
    p = p_new();
    x = IN(p, dt, 2, 3, 1);
    p_op(p, KILN_OP_EXPAND, 1, OPS(x), OUT(p, dt, 3, 2, 3, 4), 3, ATTR(2, 3, 4), 0);
    snprintf(name, sizeof name, "expand %s", dn);
    compare(p, name, NULL);
    p = p_new();
    uint32_t a = IN(p, dt, 3, 2, 3, 4), b = IN(p, dt, 3, 2, 5, 4), c = IN(p, dt, 3, 2, 1, 4);
    p_op(p, KILN_OP_CAT, 3, OPS(a, b, c), OUT(p, dt, 3, 2, 9, 4), 1, ATTR(1), 0);
    snprintf(name, sizeof name, "cat dim 1 %s", dn);
    compare(p, name, NULL);
    p = p_new();
    x = IN(p, dt, 3, 4, 20, 6);
    p_op(p, KILN_OP_SLICE, 1, OPS(x), OUT(p, dt, 3, 4, 6, 6), 4, ATTR(1, 3, 15, 2), 0);
    snprintf(name, sizeof name, "slice step 2 %s", dn);
    compare(p, name, NULL);
    p = p_new();
    x = IN(p, dt, 3, 4, 20, 6);
    p_op(p, KILN_OP_SELECT, 1, OPS(x), OUT(p, dt, 2, 4, 6), 2, ATTR(1, 7), 0);
    snprintf(name, sizeof name, "select %s", dn);
    compare(p, name, NULL);
    p = p_new();
    x = IN(p, dt, 2, 6, 10);
    uint32_t m = MID(p, dt, 3, 3, 2, 10);
    p_op(p, KILN_OP_RESHAPE, 1, OPS(x), m, 3, ATTR(3, 2, 10), 0);
    p_op(p, KILN_OP_COPY, 1, OPS(m), OUT(p, dt, 3, 3, 2, 10), 0, NULL, 0);
    snprintf(name, sizeof name, "reshape + copy %s", dn);
    compare(p, name, NULL);

    p = p_new();
    uint32_t w = p_weight(p, dt, 2, DIMS(50, 96), -1, 1);
    uint32_t idx = IN(p, KILN_I64, 2, 3, 7);
    p_op(p, KILN_OP_EMBEDDING, 2, OPS(w, idx), OUT(p, dt, 3, 3, 7, 96), 0, NULL, 0);
    snprintf(name, sizeof name, "embedding i64 %s", dn);
    io_range r = {0, 49.4};
    compare(p, name, &r);
    p = p_new();
    x = IN(p, dt, 3, 4, 30, 5);
    idx = IN(p, KILN_I32, 1, 12);
    p_op(p, KILN_OP_INDEX_SELECT, 2, OPS(x, idx), OUT(p, dt, 3, 4, 12, 5), 1, ATTR(1), 0);
    snprintf(name, sizeof name, "index_select i32 %s", dn);
    io_range r2[2] = {{-1, 1}, {0, 29.4}};
    compare(p, name, r2);
  }
  /* odd rows of 8-byte and 1-byte elements: 2 and 16 to a vector */
  static const kiln_dtype narrow_wide[2] = {KILN_I64, KILN_BOOL};
  for (int t = 0; t < 2; t++) {
    prog *p = p_new();
    uint32_t x = IN(p, narrow_wide[t], 2, 7, 41);
    p_op(p, KILN_OP_SLICE, 1, OPS(x), OUT(p, narrow_wide[t], 2, 7, 39), 4, ATTR(1, 1, 40, 1), 0);
    snprintf(name, sizeof name, "slice odd rows %s", kiln_dtype_name(narrow_wide[t]));
    io_range r = {-50, 50};
    compare(p, name, &r);
    p = p_new();
    x = IN(p, narrow_wide[t], 2, 9, 48);
    p_op(p, KILN_OP_SLICE, 1, OPS(x), OUT(p, narrow_wide[t], 2, 9, 37), 4, ATTR(1, 0, 37, 1), 0);
    snprintf(name, sizeof name, "slice pitch rows %s", kiln_dtype_name(narrow_wide[t]));
    compare(p, name, &r);
  }
}

/* CUMSUM (short lines on one thread, long ones on a warp), ARGMAX, GATHER and INDEX against
 * the CPU engine, every index input within its range (negative ones too, for INDEX). */
static void test_index_scan(void) {
  char name[96];
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = float_types[t];
    const char *dn = kiln_dtype_name(dt);
    prog *p = p_new();
    uint32_t x = IN(p, dt, 3, 3, 10, 5);
    p_op(p, KILN_OP_CUMSUM, 1, OPS(x), OUT(p, dt, 3, 3, 10, 5), 2, ATTR(1, dt), 0);
    snprintf(name, sizeof name, "cumsum short dim 1 %s", dn);
    compare(p, name, NULL);
    p = p_new();
    x = IN(p, dt, 2, 6, 300);
    p_op(p, KILN_OP_CUMSUM, 1, OPS(x), OUT(p, dt, 2, 6, 300), 2, ATTR(1, dt), 0);
    snprintf(name, sizeof name, "cumsum long rows %s", dn);
    compare(p, name, NULL);
    p = p_new();
    x = IN(p, dt, 3, 4, 7, 9);
    p_op(p, KILN_OP_ARGMAX, 1, OPS(x), OUT(p, KILN_I64, 2, 4, 9), 2, ATTR(1, 0), 0);
    snprintf(name, sizeof name, "argmax short dim 1 %s", dn);
    compare(p, name, NULL);
    p = p_new();
    x = IN(p, dt, 2, 5, 700);
    p_op(p, KILN_OP_ARGMAX, 1, OPS(x), OUT(p, KILN_I64, 2, 5, 1), 2, ATTR(1, 1), 0);
    snprintf(name, sizeof name, "argmax long rows keepdim %s", dn);
    compare(p, name, NULL);
    p = p_new(); /* greedy decoding: two rows over a vocabulary, one block each */
    x = IN(p, dt, 2, 2, 32003);
    p_op(p, KILN_OP_ARGMAX, 1, OPS(x), OUT(p, KILN_I64, 1, 2), 2, ATTR(1, 0), 0);
    snprintf(name, sizeof name, "argmax vocabulary rows %s", dn);
    compare(p, name, NULL);
    p = p_new(); /* aligned rows read by vectors, the maximum tied (in f16 and bf16) */
    x = IN(p, dt, 2, 3, 32000);
    p_op(p, KILN_OP_ARGMAX, 1, OPS(x), OUT(p, KILN_I64, 1, 3), 2, ATTR(1, 0), 0);
    snprintf(name, sizeof name, "argmax vocabulary rows ties %s", dn);
    io_range few = {0, 5};
    compare(p, name, &few);
    p = p_new(); /* a long strided dim: rows of 5000 with 3 columns between */
    x = IN(p, dt, 3, 2, 5000, 3);
    p_op(p, KILN_OP_ARGMAX, 1, OPS(x), OUT(p, KILN_I64, 2, 2, 3), 2, ATTR(1, 0), 0);
    snprintf(name, sizeof name, "argmax long strided dim %s", dn);
    compare(p, name, NULL);
    p = p_new();
    x = IN(p, dt, 3, 4, 30, 6);
    uint32_t idx = IN(p, KILN_I64, 3, 4, 11, 6);
    p_op(p, KILN_OP_GATHER, 2, OPS(x, idx), OUT(p, dt, 3, 4, 11, 6), 1, ATTR(1), 0);
    snprintf(name, sizeof name, "gather dim 1 %s", dn);
    io_range r[2] = {{-1, 1}, {0, 29.4}};
    compare(p, name, r);
    p = p_new();
    x = IN(p, dt, 3, 2, 5, 12);
    idx = IN(p, KILN_I32, 2, 5, 7);
    uint32_t idx2 = IN(p, KILN_I64, 1, 7);
    p_op(p, KILN_OP_INDEX, 3, OPS(x, idx, idx2), OUT(p, dt, 3, 2, 5, 7), 1, ATTR(6), 0);
    snprintf(name, sizeof name, "index dims 1,2 broadcast %s", dn);
    io_range r3[3] = {{-1, 1}, {-5, 4.4}, {-12, 11.4}};
    compare(p, name, r3);
  }
  prog *p = p_new(); /* position ids from a bool attention mask */
  uint32_t x = IN(p, KILN_BOOL, 2, 2, 130);
  p_op(p, KILN_OP_CUMSUM, 1, OPS(x), OUT(p, KILN_I64, 2, 2, 130), 2, ATTR(1, KILN_I64), 0);
  compare(p, "cumsum bool to i64", NULL);
  p = p_new();
  x = IN(p, KILN_I32, 2, 40, 3);
  p_op(p, KILN_OP_CUMSUM, 1, OPS(x), OUT(p, KILN_I32, 2, 40, 3), 2, ATTR(0, KILN_I32), 0);
  io_range wide = {-2e9, 2e9}; /* sums wrap */
  compare(p, "cumsum i32 dim 0 wrapping", &wide);
  p = p_new();
  x = IN(p, KILN_I32, 2, 3, 100);
  p_op(p, KILN_OP_ARGMAX, 1, OPS(x), OUT(p, KILN_I64, 1, 3), 2, ATTR(1, 0), 0);
  io_range few = {0, 5}; /* many ties: the first one wins */
  compare(p, "argmax i32 ties", &few);
  p = p_new();
  x = IN(p, KILN_I32, 2, 2, 9000);
  p_op(p, KILN_OP_ARGMAX, 1, OPS(x), OUT(p, KILN_I64, 1, 2), 2, ATTR(1, 0), 0);
  compare(p, "argmax i32 ties long rows", &few);
  p = p_new(); /* transformers' mask code: x [1,16] by [1,1,1,1] and [1,1,16,1] */
  x = IN(p, KILN_BOOL, 2, 1, 16);
  uint32_t i0 = IN(p, KILN_I64, 4, 1, 1, 1, 1), i1 = IN(p, KILN_I64, 4, 1, 1, 16, 1);
  p_op(p, KILN_OP_INDEX, 3, OPS(x, i0, i1), OUT(p, KILN_BOOL, 4, 1, 1, 16, 1), 1, ATTR(3), 0);
  io_range r[3] = {{-1, 1}, {0, 0}, {0, 15.4}};
  compare(p, "index mask rows bool", r);
  p = p_new(); /* indexed dims apart: the broadcast index shape leads */
  x = IN(p, KILN_F32, 3, 6, 4, 9);
  i0 = IN(p, KILN_I64, 2, 3, 1);
  i1 = IN(p, KILN_I64, 1, 5);
  p_op(p, KILN_OP_INDEX, 3, OPS(x, i0, i1), OUT(p, KILN_F32, 3, 3, 5, 4), 1, ATTR(5), 0);
  io_range r2[3] = {{-1, 1}, {-6, 5.4}, {-9, 8.4}};
  compare(p, "index dims 0,2 apart f32", r2);
}

/* One pooling or resize op on x of sizes n, c, h, w, NCHW or channels_last ([n,h,w,c]); the
 * output's shape comes from shape inference. f32 is held to 1e-5. */
static void vision_case(const char *what, kiln_op_kind kind, kiln_dtype dt, int last,
                        const int64_t *nchw, uint32_t n_iattr, const int64_t *iattr, double f0,
                        double f1) {
  char name[96], why[160];
  int64_t attrs[KILN_MAX_IATTR] = {0};
  const int64_t nhwc[4] = {nchw[0], nchw[2], nchw[3], nchw[1]};
  prog *p = p_new();
  uint32_t x = p_tensor(p, KILN_STORE_INPUT, dt, 4, last ? nhwc : nchw);
  memcpy(attrs, iattr, n_iattr * sizeof *attrs);
  attrs[n_iattr] = last;
  kiln_op probe = {kind, 1, {x}, 0, n_iattr + 1, {0}, {f0, f1}, {{0, 0, 0}}};
  memcpy(probe.iattr, attrs, sizeof attrs);
  const kiln_tensor_desc *in[1] = {&p->tensors[x]};
  kiln_tensor_desc want;
  if (kiln_vision_infer(&probe, in, &want, why, sizeof why)) {
    fprintf(stderr, "%s: %s\n", what, why);
    CHECK(0);
    p_free(p);
    return;
  }
  kiln_op *op = p_op(p, kind, 1, OPS(x), p_tensor(p, KILN_STORE_OUTPUT, dt, 4, want.dims),
                     n_iattr + 1, attrs, f0);
  op->fattr[1] = f1;
  snprintf(name, sizeof name, "%s %s %s", what, last ? "nhwc" : "nchw", kiln_dtype_name(dt));
  tol_override = dt == KILN_F32 ? 1e-5 : 0;
  compare(p, name, NULL);
  tol_override = 0;
}

#define P KILN_PAIR

/* Ops beside the chain (kcu_plan_beside). A scan of 16384 elements by one warp runs far longer
 * than the chain's negation, so the add reading both gets a half-written scan unless it waits
 * for the branch: through a view of the scan too. A scan whose input the chain overwrites
 * before its reader stays on the chain. */
static void test_beside(void) {
  const io_range ranges[2] = {{0, 1}, {-1, 1}};
  for (int through_view = 0; through_view < 2; through_view++) {
    prog *p = p_new();
    int r = 2 - through_view; /* the view drops the leading 1 */
    uint32_t a = IN(p, KILN_F32, 2, 1, 16384), b = p_tensor(p, KILN_STORE_INPUT, KILN_F32, r,
                                                             DIMS(1, 16384) + 2 - r);
    uint32_t c = MID(p, KILN_F32, 2, 1, 16384);
    uint32_t n = p_tensor(p, KILN_STORE_ARENA, KILN_F32, r, DIMS(1, 16384) + 2 - r);
    p_op(p, KILN_OP_CUMSUM, 1, OPS(a), c, 2, ATTR(1, KILN_F32), 0);
    if (through_view) {
      uint32_t v = MID(p, KILN_F32, 1, 16384);
      p->tensors[v].offset = p->tensors[c].offset;
      p_op(p, KILN_OP_RESHAPE, 1, OPS(c), v, 1, ATTR(16384), 0);
      c = v;
    }
    p_op(p, KILN_OP_NEG, 1, OPS(b), n, 0, NULL, 0);
    p_op(p, KILN_OP_ADD, 2, OPS(c, n), p_tensor(p, KILN_STORE_OUTPUT, KILN_F32, r,
                                                 DIMS(1, 16384) + 2 - r), 0, NULL, 1.0);
    expect_ops_beside = 1;
    compare(p, through_view ? "beside: a scan read through a view two ops later"
                            : "beside: a scan read two ops later", ranges);
  }
  prog *p = p_new();
  uint32_t a = IN(p, KILN_F32, 2, 1, 16384), b = IN(p, KILN_F32, 2, 1, 16384);
  uint32_t t = MID(p, KILN_F32, 2, 1, 16384), c = MID(p, KILN_F32, 2, 1, 16384);
  uint32_t u = MID(p, KILN_F32, 2, 1, 16384);
  p->tensors[u].offset = p->tensors[t].offset; /* the chain's negation writes the scan's input */
  p_op(p, KILN_OP_NEG, 1, OPS(a), t, 0, NULL, 0);
  p_op(p, KILN_OP_CUMSUM, 1, OPS(t), c, 2, ATTR(1, KILN_F32), 0);
  p_op(p, KILN_OP_NEG, 1, OPS(b), u, 0, NULL, 0);
  p_op(p, KILN_OP_ADD, 2, OPS(c, u), OUT(p, KILN_F32, 2, 1, 16384), 0, NULL, 1.0);
  expect_ops_beside = 0;
  compare(p, "beside: a scan whose input the chain overwrites stays on it", ranges);
  expect_ops_beside = -1;
}

/* Pooling, resize and unfolded batch norm on the shapes of ResNet, MobileNetV3, ConvNeXt and
 * UNet-like decoders, in each dtype and layout; channel counts that are not a multiple of a
 * 16-byte vector take the scalar path in channels_last. */
static void test_vision(void) {
  char name[96];
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = float_types[t];
    for (int last = 0; last < 2; last++) {
      /* ResNet's stem pool and its head */
      vision_case("max_pool2d resnet stem", KILN_OP_MAX_POOL2D, dt, last, DIMS(2, 64, 112, 112), 5,
                  ATTR(P(3, 3), P(2, 2), P(1, 1), P(1, 1), 0), 0, 0);
      vision_case("adaptive_avg_pool2d resnet-50 head", KILN_OP_ADAPTIVE_AVG_POOL2D, dt, last,
                  DIMS(2, 2048, 7, 7), 1, ATTR(P(1, 1)), 0, 0);
      /* MobileNetV3's squeeze-excite pools and its last stage */
      vision_case("adaptive_avg_pool2d mobilenet se", KILN_OP_ADAPTIVE_AVG_POOL2D, dt, last,
                  DIMS(4, 72, 28, 28), 1, ATTR(P(1, 1)), 0, 0);
      vision_case("adaptive_avg_pool2d mobilenet head", KILN_OP_ADAPTIVE_AVG_POOL2D, dt, last,
                  DIMS(1, 960, 7, 7), 1, ATTR(P(1, 1)), 0, 0);
      vision_case("adaptive_avg_pool2d odd channels", KILN_OP_ADAPTIVE_AVG_POOL2D, dt, last,
                  DIMS(3, 27, 9, 11), 1, ATTR(P(1, 1)), 0, 0);
      /* ConvNeXt's global pool before its last norm */
      vision_case("adaptive_avg_pool2d convnext head", KILN_OP_ADAPTIVE_AVG_POOL2D, dt, last,
                  DIMS(2, 768, 7, 7), 1, ATTR(P(1, 1)), 0, 0);
      vision_case("adaptive_avg_pool2d 13x11 to 5x7", KILN_OP_ADAPTIVE_AVG_POOL2D, dt, last,
                  DIMS(2, 16, 13, 11), 1, ATTR(P(5, 7)), 0, 0);
      vision_case("max_pool2d dilated ceil", KILN_OP_MAX_POOL2D, dt, last, DIMS(2, 24, 15, 15), 5,
                  ATTR(P(3, 3), P(2, 2), P(1, 1), P(2, 2), 1), 0, 0);
      vision_case("max_pool2d 2x2 odd channels", KILN_OP_MAX_POOL2D, dt, last, DIMS(2, 12, 17, 16),
                  5, ATTR(P(2, 2), P(2, 2), P(0, 0), P(1, 1), 1), 0, 0);
      vision_case("avg_pool2d ceil skip padding", KILN_OP_AVG_POOL2D, dt, last, DIMS(2, 32, 28, 27),
                  6, ATTR(P(3, 3), P(2, 2), P(1, 1), 1, 0, 0), 0, 0);
      vision_case("avg_pool2d count padding", KILN_OP_AVG_POOL2D, dt, last, DIMS(2, 40, 14, 14), 6,
                  ATTR(P(3, 3), P(1, 1), P(1, 1), 0, 1, 0), 0, 0);
      vision_case("avg_pool2d divisor override", KILN_OP_AVG_POOL2D, dt, last, DIMS(2, 8, 12, 18),
                  6, ATTR(P(2, 3), P(2, 3), P(0, 1), 0, 1, 5), 0, 0);
      /* UNet-like decoders: doubling, by a scale factor, bilinear both ways */
      vision_case("upsample_nearest2d x2", KILN_OP_UPSAMPLE_NEAREST2D, dt, last,
                  DIMS(2, 64, 28, 28), 1, ATTR(P(56, 56)), 0, 0);
      vision_case("upsample_nearest2d scale 1.7", KILN_OP_UPSAMPLE_NEAREST2D, dt, last,
                  DIMS(2, 12, 10, 9), 1, ATTR(P(17, 15)), 1.7, 1.7);
      vision_case("upsample_bilinear2d x2", KILN_OP_UPSAMPLE_BILINEAR2D, dt, last,
                  DIMS(2, 32, 28, 28), 2, ATTR(P(56, 56), 0), 0, 0);
      vision_case("upsample_bilinear2d aligned", KILN_OP_UPSAMPLE_BILINEAR2D, dt, last,
                  DIMS(2, 16, 13, 17), 2, ATTR(P(26, 34), 1), 0, 0);
      vision_case("upsample_bilinear2d down odd channels", KILN_OP_UPSAMPLE_BILINEAR2D, dt, last,
                  DIMS(1, 6, 31, 29), 2, ATTR(P(12, 20), 0), 0, 0);
    }
    /* a batch norm the builder could not fold: weight and bias, or neither, over 2-d and 1-d */
    for (int affine = 0; affine < 2; affine++) {
      prog *p = p_new();
      int64_t c = affine ? 96 : 24;
      uint32_t x = affine ? IN(p, dt, 4, 2, 96, 14, 14) : IN(p, dt, 3, 4, 24, 50);
      uint32_t mean = p_weight(p, dt, 1, DIMS(c), -1, 1), var = p_weight(p, dt, 1, DIMS(c), 0.2, 2);
      uint32_t w = p_weight(p, dt, 1, DIMS(c), 0.5, 1.5), b = p_weight(p, dt, 1, DIMS(c), -1, 1);
      uint32_t out = affine ? OUT(p, dt, 4, 2, 96, 14, 14) : OUT(p, dt, 3, 4, 24, 50);
      if (affine) p_op(p, KILN_OP_BATCH_NORM, 5, OPS(x, mean, var, w, b), out, 1, ATTR(3), 1e-5);
      else p_op(p, KILN_OP_BATCH_NORM, 3, OPS(x, mean, var), out, 1, ATTR(0), 1e-3);
      snprintf(name, sizeof name, "batch_norm %s %s", affine ? "affine 2-d" : "plain 1-d",
               kiln_dtype_name(dt));
      tol_override = dt == KILN_F32 ? 1e-5 : 0;
      compare(p, name, NULL);
      tol_override = 0;
    }
  }
}

#undef P

static void test_attention(void) {
  char name[96];
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = float_types[t];
    const char *dn = kiln_dtype_name(dt);
    for (int causal = 0; causal < 2; causal++) {
      prog *p = p_new();
      uint32_t q = IN(p, dt, 4, 2, 4, 45, 64), k = IN(p, dt, 4, 2, 4, 45, 64), v = IN(p, dt, 4, 2, 4, 45, 64);
      p_op(p, KILN_OP_SDPA, 3, OPS(q, k, v), OUT(p, dt, 4, 2, 4, 45, 64), 2, ATTR(causal, 0), 0);
      snprintf(name, sizeof name, "sdpa causal %d %s", causal, dn);
      io_range r[3] = {{-2, 2}, {-2, 2}, {-1, 1}};
      compare(p, name, r);
    }
    prog *p = p_new(); /* L != S, Ev != E, bool mask broadcast over batch, scale given */
    uint32_t q = IN(p, dt, 3, 3, 21, 128), k = IN(p, dt, 3, 3, 70, 128), v = IN(p, dt, 3, 3, 70, 32);
    uint32_t m = IN(p, KILN_BOOL, 2, 21, 70);
    p_op(p, KILN_OP_SDPA, 4, OPS(q, k, v, m), OUT(p, dt, 3, 3, 21, 32), 2, ATTR(0, 1), 0.2);
    snprintf(name, sizeof name, "sdpa bool mask L!=S Ev!=E %s", dn);
    io_range r[4] = {{-2, 2}, {-2, 2}, {-1, 1}, {-0.5, 1}};
    compare(p, name, r);
    p = p_new(); /* additive float mask, k/v shared across heads */
    q = IN(p, dt, 4, 2, 8, 16, 32);
    k = IN(p, dt, 4, 2, 1, 40, 32);
    v = IN(p, dt, 4, 2, 1, 40, 32);
    m = IN(p, dt, 4, 2, 1, 1, 40);
    p_op(p, KILN_OP_SDPA, 4, OPS(q, k, v, m), OUT(p, dt, 4, 2, 8, 16, 32), 2, ATTR(0, 1), 0);
    snprintf(name, sizeof name, "sdpa float mask, shared kv %s", dn);
    io_range r2[4] = {{-2, 2}, {-2, 2}, {-1, 1}, {-3, 0}};
    compare(p, name, r2);
    p = p_new(); /* causal with L < S, head dim 128, batch and heads, additive mask on top */
    q = IN(p, dt, 4, 2, 3, 20, 128);
    k = IN(p, dt, 4, 2, 3, 50, 128);
    v = IN(p, dt, 4, 2, 3, 50, 64);
    m = IN(p, dt, 4, 2, 1, 20, 50);
    p_op(p, KILN_OP_SDPA, 4, OPS(q, k, v, m), OUT(p, dt, 4, 2, 3, 20, 64), 2, ATTR(1, 1), 0);
    snprintf(name, sizeof name, "sdpa causal L<S E128 float mask %s", dn);
    compare(p, name, r2);
    p = p_new(); /* k and v shared by every batch matrix: a zero batch stride */
    q = IN(p, dt, 4, 2, 4, 16, 64);
    k = IN(p, dt, 2, 30, 64);
    v = IN(p, dt, 2, 30, 64);
    p_op(p, KILN_OP_SDPA, 3, OPS(q, k, v), OUT(p, dt, 4, 2, 4, 16, 64), 2, ATTR(0, 0), 0);
    snprintf(name, sizeof name, "sdpa kv shared by all %s", dn);
    compare(p, name, r);
    for (int shared = 0; shared < 2; shared++) {
      /* Rows 5 and 17 with every key masked give zeros, as on the CPU: on the tensor-core paths
       * (k, v per batch: cuBLASLt for f32, the flash kernel for f16 and bf16) and on the fused
       * kernel (k, v shared by the heads only). */
      p = p_new();
      q = IN(p, dt, 4, 2, 2, 24, 64);
      k = IN(p, dt, 4, 2, shared ? 1 : 2, 24, 64);
      v = IN(p, dt, 4, 2, shared ? 1 : 2, 24, 64);
      m = p_weight(p, KILN_BOOL, 2, DIMS(24, 24), -0.5, 1);
      memset(p->weights + p->tensors[m].offset + 5 * 24, 0, 24);
      memset(p->weights + p->tensors[m].offset + 17 * 24, 0, 24);
      p_op(p, KILN_OP_SDPA, 4, OPS(q, k, v, m), OUT(p, dt, 4, 2, 2, 24, 64), 2, ATTR(0, 1), 0);
      snprintf(name, sizeof name, "sdpa fully masked rows %s %s", shared ? "fused" : "gemm", dn);
      compare(p, name, r);
    }
    p = p_new(); /* the GPT block's shape */
    q = IN(p, dt, 4, 1, 16, 512, 128);
    k = IN(p, dt, 4, 1, 16, 512, 128);
    v = IN(p, dt, 4, 1, 16, 512, 128);
    p_op(p, KILN_OP_SDPA, 3, OPS(q, k, v), OUT(p, dt, 4, 1, 16, 512, 128), 2, ATTR(1, 0), 0);
    snprintf(name, sizeof name, "sdpa causal 16x512x128 %s", dn);
    compare(p, name, NULL);
  }
}

/* ---------------------------------------------------------------- convolution (cuDNN) */

typedef struct conv_shape {
  const char *name;
  int transposed, spatial;
  int64_t n, c, h, w, o, kh, kw, s, pad, dil, groups, out_pad;
} conv_shape;

static int64_t conv_side(const conv_shape *c, int64_t in, int64_t k) {
  return c->transposed ? (in - 1) * c->s - 2 * c->pad + c->dil * (k - 1) + c->out_pad + 1
                       : (in + 2 * c->pad - c->dil * (k - 1) - 1) / c->s + 1;
}

/* [n, ch, h, w] as the plan holds it: NCHW or NHWC, without h for a 1-d op. */
static uint32_t conv_tensor(prog *p, kiln_storage st, kiln_dtype dt, int spatial, int nhwc,
                            int64_t n, int64_t ch, int64_t h, int64_t w) {
  int64_t d[4];
  int32_t r = 0;
  d[r++] = n;
  if (!nhwc) d[r++] = ch;
  if (spatial == 2) d[r++] = h;
  d[r++] = w;
  if (nhwc) d[r++] = ch;
  return p_tensor(p, st, dt, r, d);
}

static const char *const conv_epilogues[] = {"bias", "bias relu", "bias res relu", "res"};

/* The one-op program of a convolution in one dtype and layout with one epilogue: 0 bias, 1 bias
 * + ReLU, 2 bias + residual + ReLU, 3 residual alone. */
static prog *conv_prog(const conv_shape *c, kiln_dtype dt, int nhwc, int epilogue) {
  int bias = epilogue < 3, relu = epilogue == 1 || epilogue == 2, residual = epilogue >= 2;
  int64_t oh = c->spatial == 2 ? conv_side(c, c->h, c->kh) : 1, ow = conv_side(c, c->w, c->kw);
  int64_t kh = c->spatial == 2 ? c->kh : 1;
  int64_t lead = c->transposed ? c->c : c->o, per = c->transposed ? c->o / c->groups : c->c / c->groups;
  double scale = 1.0 / sqrt((double)((c->transposed ? c->c / c->groups : per) * kh * c->kw));
  prog *p = p_new();
  uint32_t x = conv_tensor(p, KILN_STORE_INPUT, dt, c->spatial, nhwc, c->n, c->c, c->h, c->w);
  uint32_t w = conv_tensor(p, KILN_STORE_WEIGHT, dt, c->spatial, nhwc, lead, per, kh, c->kw);
  kiln_tensor_desc *wt = &p->tensors[w];
  wt->offset = p->weights_size;
  p->weights_size = (wt->offset + wt->nbytes + 63) & ~(uint64_t)63;
  p->weights = realloc(p->weights, p->weights_size);
  if (!p->weights) die("out of memory");
  fill(p->weights + wt->offset, dt, p_count(wt), -scale, scale);
  uint32_t b = p_weight(p, dt, 1, DIMS(c->o), -0.5, 0.5);
  uint32_t r = residual ? conv_tensor(p, KILN_STORE_INPUT, dt, c->spatial, nhwc, c->n, c->o, oh, ow) : 0;
  uint32_t y = conv_tensor(p, KILN_STORE_OUTPUT, dt, c->spatial, nhwc, c->n, c->o, oh, ow);
  uint32_t ins[4], n_in = 0, at = 0;
  ins[n_in++] = x, ins[n_in++] = w;
  if (bias) ins[n_in++] = b;
  if (residual) ins[n_in++] = r;
  int64_t a[9];
  a[at++] = KILN_PAIR(c->spatial == 2 ? c->s : 1, c->s);
  a[at++] = KILN_PAIR(c->spatial == 2 ? c->pad : 0, c->pad);
  a[at++] = KILN_PAIR(c->spatial == 2 ? c->dil : 1, c->dil);
  a[at++] = c->groups, a[at++] = bias;
  if (c->transposed) a[at++] = KILN_PAIR(c->spatial == 2 ? c->out_pad : 0, c->out_pad);
  a[at++] = nhwc, a[at++] = relu ? KILN_ACT_RELU : KILN_ACT_NONE, a[at++] = residual;
  p_op(p, c->transposed ? KILN_OP_CONV_TRANSPOSE : KILN_OP_CONV, n_in, ins, y, at, a, 0);
  return p;
}

/* One convolution through the engine (cuDNN's fused graph where an engine takes it). */
static void conv_case(const conv_shape *c, kiln_dtype dt, int nhwc, int epilogue) {
  char name[128];
  snprintf(name, sizeof name, "conv %s %s %s %s", c->name, kiln_dtype_name(dt), nhwc ? "nhwc" : "nchw",
           conv_epilogues[epilogue]);
  compare(conv_prog(c, dt, nhwc, epilogue), name, NULL);
}

static void test_conv(void) {
  static const conv_shape shapes[] = {
      /* name               T  sp  n   c   h   w   o  kh kw  s pad dil  g op */
      {"resnet stem 7x7 s2", 0, 2, 2, 3, 32, 32, 64, 7, 7, 2, 3, 1, 1, 0},
      {"resnet 3x3", 0, 2, 2, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1, 0},
      {"resnet 1x1 s2 down", 0, 2, 2, 64, 14, 14, 128, 1, 1, 2, 0, 1, 1, 0},
      {"depthwise 3x3", 0, 2, 2, 32, 15, 15, 32, 3, 3, 1, 1, 1, 32, 0},
      {"depthwise 5x5 s2", 0, 2, 1, 48, 17, 17, 48, 5, 5, 2, 2, 1, 48, 0},
      {"grouped 3x3 g4", 0, 2, 2, 32, 12, 12, 64, 3, 3, 1, 1, 1, 4, 0},
      {"dilated 3x3 d2", 0, 2, 2, 16, 13, 13, 24, 3, 3, 1, 2, 2, 1, 0},
      {"1-d k5 s2", 0, 1, 2, 16, 1, 61, 24, 1, 5, 2, 2, 1, 1, 0},
      {"transposed 4x4 s2", 1, 2, 2, 32, 8, 8, 16, 4, 4, 2, 1, 1, 1, 0},
      {"transposed 3x3 s2 op1 g2", 1, 2, 1, 16, 7, 7, 16, 3, 3, 2, 1, 1, 2, 1},
      {"transposed 1-d k4 s2", 1, 1, 2, 16, 1, 20, 8, 1, 4, 2, 1, 1, 1, 0},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    for (int t = 0; t < 3; t++)
      for (int nhwc = 0; nhwc < 2; nhwc++)
        for (int epi = 0; epi < 4; epi++) conv_case(&shapes[i], float_types[t], nhwc, epi);
}

/* ---------------------------------------------------------------- convolution plans, directly */

/* One CONV op driven through kcu_conv on device buffers of its own: the plan cuDNN's heuristics
 * and the timing chose, its output against the CPU engine's, optionally its time per run. */
typedef struct conv_direct {
  kcu_conv c;
  kcu_conv_graph graph; /* what was chosen, kept after c is released (its descriptors are not) */
  size_t workspace;
  int ok;            /* init, choice and a run succeeded */
  double rel_err;    /* against the CPU engine; -1 when not compared */
  double us;         /* median per run of the chosen plan in a CUDA graph; -1 when not timed */
  double legacy_us;  /* the legacy API's fastest forward algorithm (convolution alone); -1 none */
  int legacy_algo;
  double choose_ms;  /* init's choice: building, heuristics, timing every candidate */
} conv_direct;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The legacy API's Find over the same shape: the time of its fastest usable forward algorithm. */
static double conv_legacy_us(const kcu_conv_shape *sh, cudnnHandle_t h, const kcu_tensor *in,
                             const kcu_tensor *out, void *ws, size_t ws_size, int *algo) {
  cudnnTensorDescriptor_t x = NULL, y = NULL;
  cudnnFilterDescriptor_t w = NULL;
  cudnnConvolutionDescriptor_t conv = NULL;
  cudnnConvolutionFwdAlgoPerf_t perf[8];
  cudnnTensorFormat_t fmt = sh->channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  int found = 0;
  double best = -1.0;
  cudnnStatus_t st = cudnnCreateTensorDescriptor(&x);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnCreateTensorDescriptor(&y);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnCreateFilterDescriptor(&w);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnCreateConvolutionDescriptor(&conv);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnSetTensor4dDescriptor(x, fmt, sh->dtype, (int)sh->x[0], (int)sh->x[1], (int)sh->x[2], (int)sh->x[3]);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnSetTensor4dDescriptor(y, fmt, sh->dtype, (int)sh->y[0], (int)sh->y[1], (int)sh->y[2], (int)sh->y[3]);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnSetFilter4dDescriptor(w, sh->dtype, fmt, (int)sh->w[0], (int)sh->w[1], (int)sh->w[2], (int)sh->w[3]);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnSetConvolution2dDescriptor(conv, (int)sh->pad[0], (int)sh->pad[1], (int)sh->stride[0],
                                         (int)sh->stride[1], (int)sh->dilation[0], (int)sh->dilation[1],
                                         CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetConvolutionGroupCount(conv, (int)(sh->x[1] / sh->w[1]));
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnSetConvolutionMathType(conv, sh->dtype != CUDNN_DATA_FLOAT ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnFindConvolutionForwardAlgorithmEx(h, x, in[0].data, w, in[1].data, conv, y, out->data, 8,
                                                &found, perf, ws, ws_size);
  for (int k = 0; st == CUDNN_STATUS_SUCCESS && k < found; k++)
    if (perf[k].status == CUDNN_STATUS_SUCCESS && (best < 0 || perf[k].time * 1e3 < best)) {
      best = perf[k].time * 1e3;
      *algo = (int)perf[k].algo;
    }
  if (x) cudnnDestroyTensorDescriptor(x);
  if (y) cudnnDestroyTensorDescriptor(y);
  if (w) cudnnDestroyFilterDescriptor(w);
  if (conv) cudnnDestroyConvolutionDescriptor(conv);
  return best;
}

/* Median microseconds per run of the chosen plan, 20 runs recorded as one CUDA graph. */
static double conv_direct_time(kcu_conv *c, cudnnHandle_t h, cudaStream_t s, const kcu_tensor *in,
                               uint32_t n_in, const kcu_tensor *out, void *ws, size_t ws_size) {
  enum { RUNS = 20, LAUNCHES = 9 };
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  cudaEvent_t a, b;
  double t[LAUNCHES];
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaError_t rc = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  for (int r = 0; rc == cudaSuccess && r < RUNS; r++) rc = kcu_conv_run(c, h, s, in, n_in, out, ws, ws_size);
  cudaError_t end = cudaStreamEndCapture(s, &graph);
  if (rc == cudaSuccess) rc = end;
  if (rc == cudaSuccess) rc = cudaGraphInstantiate(&exec, graph, 0);
  if (rc == cudaSuccess) rc = cudaGraphLaunch(exec, s);
  for (int l = 0; rc == cudaSuccess && l < LAUNCHES; l++) {
    float ms = 0.0f;
    cudaEventRecord(a, s);
    rc = cudaGraphLaunch(exec, s);
    cudaEventRecord(b, s);
    if (rc == cudaSuccess) rc = cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
    t[l] = ms * 1e3 / RUNS;
  }
  for (int i = 1; rc == cudaSuccess && i < LAUNCHES; i++) /* insertion sort for the median */
    for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
      double v = t[j];
      t[j] = t[j - 1];
      t[j - 1] = v;
    }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (rc != cudaSuccess) fprintf(stderr, "conv timing: %s\n", cudaGetErrorString(rc));
  return rc == cudaSuccess ? t[LAUNCHES / 2] : -1.0;
}

/* Runs conv_prog(cs, dt, nhwc, epilogue) through kcu_conv with only the graphs in `graphs`
 * allowed and compile_ms of runtime compilation; compares with the CPU engine when compare_cpu,
 * times when bench. */
static void conv_direct_run(const conv_shape *cs, kiln_dtype dt, int nhwc, int epilogue, int graphs,
                            int allow_tf32, double compile_ms, int compare_cpu, int bench,
                            conv_direct *r) {
  prog *p = conv_prog(cs, dt, nhwc, epilogue);
  kiln_plan pl;
  kiln_error err;
  void *host_in[P_MAX_IO] = {0}, *dev_in[P_MAX_IO] = {0}, *dev_out = NULL, *dev_w = NULL, *ws = NULL;
  void *cpu_out = NULL, *gpu_out = NULL;
  size_t ws_size = KCU_CONV_FIND_WORKSPACE;
  cudaStream_t s = NULL;
  cudnnHandle_t h = NULL;
  memset(r, 0, sizeof *r);
  r->rel_err = r->us = r->legacy_us = -1.0;
  p_plan(p, &pl);
  const kiln_tensor_desc *yt = &p->tensors[p->outputs[0]];
  for (uint32_t i = 0; i < p->n_inputs; i++) {
    const kiln_tensor_desc *t = &p->tensors[p->inputs[i]];
    host_in[i] = malloc(t->nbytes);
    if (!host_in[i]) die("out of memory");
    fill(host_in[i], dt, p_count(t), -1.0, 1.0);
    if (!cuda_ok(cudaMalloc(&dev_in[i], t->nbytes), "cudaMalloc")) die("device");
    cudaMemcpy(dev_in[i], host_in[i], t->nbytes, cudaMemcpyHostToDevice);
  }
  if (!cuda_ok(cudaMalloc(&dev_out, yt->nbytes), "cudaMalloc") ||
      !cuda_ok(cudaMalloc(&dev_w, p->weights_size), "cudaMalloc") ||
      !cuda_ok(cudaMalloc(&ws, ws_size), "cudaMalloc"))
    die("device");
  cudaMemcpy(dev_w, p->weights, p->weights_size, cudaMemcpyHostToDevice);
  const kiln_op *op = &p->ops[0];
  kcu_tensor in[KILN_MAX_OP_INPUTS], out;
  for (uint32_t k = 0; k <= op->n_inputs; k++) {
    const kiln_tensor_desc *t = &p->tensors[k < op->n_inputs ? op->inputs[k] : op->output];
    kcu_tensor *kt = k < op->n_inputs ? &in[k] : &out;
    memset(kt, 0, sizeof *kt);
    kt->data = t->storage == KILN_STORE_INPUT ? dev_in[t->io_index]
               : t->storage == KILN_STORE_WEIGHT ? (char *)dev_w + t->offset : dev_out;
    kt->dtype = t->dtype;
    kt->rank = t->rank;
    kt->numel = (int64_t)p_count(t);
    for (int d = 0; d < t->rank; d++) kt->dims[d] = t->dims[d];
  }
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  kiln_status st = kcu_conv_handle(&h, s, 0, &err);
  if (st == KILN_OK)
    st = kcu_conv_init(&r->c, &pl, 0, pl.tensors[pl.ops[0].inputs[0]].dims[0], allow_tf32, &err);
  if (st == KILN_OK) {
    double t0 = now_ms();
    r->c.graph.graphs = graphs;
    double compile_left = compile_ms;
    st = kcu_conv_choose(&r->c, h, s, &pl, 0, in, &out, ws, ws_size, NULL, 0, &compile_left, &err);
    r->choose_ms = now_ms() - t0;
  }
  if (st != KILN_OK) fprintf(stderr, "%s: %s\n", cs->name, err.message);
  r->ok = st == KILN_OK &&
          cuda_ok(kcu_conv_run(&r->c, h, s, in, op->n_inputs, &out, ws, ws_size), "conv run") &&
          cuda_ok(cudaStreamSynchronize(s), "conv run");
  if (r->ok && compare_cpu) {
    kiln_engine *cpu = p_load(p, &kiln_cpu_backend, 0, &err);
    cpu_out = malloc(yt->nbytes);
    gpu_out = malloc(yt->nbytes);
    if (!cpu || !cpu_out || !gpu_out) die("cpu engine");
    void *outs[1] = {cpu_out};
    if (p_execute(cpu, p, host_in, outs, &err) != KILN_OK) die(err.message);
    cudaMemcpy(gpu_out, dev_out, yt->nbytes, cudaMemcpyDeviceToHost);
    r->rel_err = rel_error(gpu_out, cpu_out, dt, p_count(yt));
    p_unload(cpu);
  }
  if (r->ok && bench) {
    r->us = conv_direct_time(&r->c, h, s, in, op->n_inputs, &out, ws, ws_size);
    r->legacy_us = conv_legacy_us(&r->c.shape, h, in, &out, ws, ws_size, &r->legacy_algo);
  }
  r->graph = r->c.graph;
  r->workspace = r->c.workspace;
  kcu_conv_release(&r->c);
  if (h) cudnnDestroy(h);
  cudaStreamDestroy(s);
  for (uint32_t i = 0; i < P_MAX_IO; i++) {
    free(host_in[i]);
    cudaFree(dev_in[i]);
  }
  cudaFree(dev_out);
  cudaFree(dev_w);
  cudaFree(ws);
  free(cpu_out);
  free(gpu_out);
  p_free(p);
}

/* "A3 eng 12 fused tc": where the chosen plan came from and what it is. */
static void conv_choice_text(const conv_direct *r, char *buf, size_t n) {
  const kcu_conv_graph *g = &r->graph;
  snprintf(buf, n, "%s%-2d eng %-3lld %-5s%s%s%s%s ws %lluK timed %d refused %d",
           g->from_fallback ? "F" : "A", g->heur_rank, (long long)g->engine, g->fused ? "fused" : "plain",
           g->notes & (1u << CUDNN_NUMERICAL_NOTE_TENSOR_CORE) ? " tc" : "",
           g->notes & (1u << CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) ? " down" : "",
           g->notes & (1u << CUDNN_NUMERICAL_NOTE_WINOGRAD) ? " wino" : "",
           g->behavior & (1u << CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) ? " rtc" : "",
           (unsigned long long)(r->workspace >> 10), g->timed, g->refused);
  /* each graph's build, the configurations heuristics offered, the plans built from them */
  size_t at = strlen(buf);
  snprintf(buf + at, n - at, " [fused %s %d>%d, plain %s %d>%d, compiled %.0f ms]",
           g->build_status[0] == CUDNN_STATUS_SUCCESS ? "ok" : cudnnGetErrorString(g->build_status[0]),
           g->offered[0], g->built[0],
           g->build_status[1] == CUDNN_STATUS_SUCCESS ? "ok" : cudnnGetErrorString(g->build_status[1]),
           g->offered[1], g->built[1], (double)g->compile_ms);
}

/* The branches of the graph choice, each against the CPU engine: the fused graph alone must be
 * accepted for f16 NHWC bias + residual + ReLU; the plain graph alone runs the epilogue kernel;
 * f32 without TF32 keeps no engine noted for tensor cores or down-converted inputs; two ops of one
 * shape share a plan. */
static void test_conv_graph(void) {
  static const conv_shape res3x3 = {"resnet 3x3", 0, 2, 2, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1, 0};
  const unsigned lowered = (1u << CUDNN_NUMERICAL_NOTE_TENSOR_CORE) |
                           (1u << CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS);
  conv_direct r;
  char text[400];
  if (selected("conv graph fused")) {
    conv_direct_run(&res3x3, KILN_F16, 1, 2, KCU_GRAPH_FUSED, 0, KCU_GRAPH_COMPILE_BUDGET_MS, 1, 0, &r);
    conv_choice_text(&r, text, sizeof text);
    printf("conv graph fused only f16 nhwc bias res relu: %s, %s, rel err %.2e\n",
           r.ok ? "ok" : "FAILED", text, r.rel_err);
    CHECK(r.ok && r.graph.fused && r.rel_err >= 0 && r.rel_err <= dtype_tolerance(KILN_F16));
  }
  if (selected("conv graph plain")) {
    conv_direct_run(&res3x3, KILN_F16, 1, 2, KCU_GRAPH_PLAIN, 0, KCU_GRAPH_COMPILE_BUDGET_MS, 1, 0, &r);
    conv_choice_text(&r, text, sizeof text);
    printf("conv graph plain only f16 nhwc bias res relu: %s, %s, rel err %.2e\n",
           r.ok ? "ok" : "FAILED", text, r.rel_err);
    CHECK(r.ok && !r.graph.fused && r.rel_err >= 0 && r.rel_err <= dtype_tolerance(KILN_F16));
  }
  /* Two convolutions of one shape in one engine: the second runs the first's plan with its own
   * variant pack. */
  for (int t = 0; t < 2; t++) {
    kiln_dtype dt = t ? KILN_F32 : KILN_F16;
    int nhwc = !t;
    prog *p = p_new();
    uint32_t x = conv_tensor(p, KILN_STORE_INPUT, dt, 2, nhwc, 2, 64, 14, 14);
    uint32_t w1 = p_weight(p, dt, 4, nhwc ? DIMS(64, 3, 3, 64) : DIMS(64, 64, 3, 3), -0.05, 0.05);
    uint32_t w2 = p_weight(p, dt, 4, nhwc ? DIMS(64, 3, 3, 64) : DIMS(64, 64, 3, 3), -0.05, 0.05);
    uint32_t b1 = p_weight(p, dt, 1, DIMS(64), -0.5, 0.5), b2 = p_weight(p, dt, 1, DIMS(64), -0.5, 0.5);
    uint32_t h = conv_tensor(p, KILN_STORE_ARENA, dt, 2, nhwc, 2, 64, 14, 14);
    uint32_t y = conv_tensor(p, KILN_STORE_OUTPUT, dt, 2, nhwc, 2, 64, 14, 14);
    p_op(p, KILN_OP_CONV, 3, OPS(x, w1, b1), h, 8,
         ATTR(KILN_PAIR(1, 1), KILN_PAIR(1, 1), KILN_PAIR(1, 1), 1, 1, nhwc, KILN_ACT_RELU, 0), 0);
    p_op(p, KILN_OP_CONV, 3, OPS(h, w2, b2), y, 8,
         ATTR(KILN_PAIR(1, 1), KILN_PAIR(1, 1), KILN_PAIR(1, 1), 1, 1, nhwc, KILN_ACT_RELU, 0), 0);
    compare(p, t ? "conv graph shared plan f32 nchw" : "conv graph shared plan f16 nhwc", NULL);
  }
  /* A fused residual the kernel just ahead wrote (conv(relu(x)) + relu(x)): cuDNN's fused
   * convolutions read their residual before they wait for that kernel, so the engine puts a
   * fence between the two. Staged and bound runs both launch the ReLU early. */
  for (int t = 0; t < 2; t++) {
    kiln_dtype dt = t ? KILN_BF16 : KILN_F16;
    prog *p = p_new();
    uint32_t x = conv_tensor(p, KILN_STORE_INPUT, dt, 2, 1, 2, 64, 14, 14);
    uint32_t h = conv_tensor(p, KILN_STORE_ARENA, dt, 2, 1, 2, 64, 14, 14);
    uint32_t w = p_weight(p, dt, 4, DIMS(64, 3, 3, 64), -0.05, 0.05);
    uint32_t b = p_weight(p, dt, 1, DIMS(64), -0.5, 0.5);
    uint32_t y = conv_tensor(p, KILN_STORE_OUTPUT, dt, 2, 1, 2, 64, 14, 14);
    p_op(p, KILN_OP_RELU, 1, OPS(x), h, 0, NULL, 0);
    p_op(p, KILN_OP_CONV, 4, OPS(h, w, b, h), y, 8,
         ATTR(KILN_PAIR(1, 1), KILN_PAIR(1, 1), KILN_PAIR(1, 1), 1, 1, 1, KILN_ACT_NONE, 1), 0);
    compare(p, t ? "conv residual from the kernel ahead bf16 nhwc" : "conv residual from the kernel ahead f16 nhwc", NULL);
  }
  /* The engine's compile budget spent: only precompiled engines, on the 1x1 + residual shape
   * where a runtime-compiled one wins when it may. */
  if (selected("conv graph no compile budget")) {
    static const conv_shape res1x1 = {"resnet 1x1", 0, 2, 1, 256, 14, 14, 1024, 1, 1, 1, 0, 1, 1, 0};
    conv_direct_run(&res1x1, KILN_F16, 1, 2, KCU_GRAPH_FUSED | KCU_GRAPH_PLAIN, 0, 0.0, 1, 0, &r);
    conv_choice_text(&r, text, sizeof text);
    printf("conv graph no compile budget f16 nhwc 1x1 bias res relu: %s, %s, rel err %.2e\n",
           r.ok ? "ok" : "FAILED", text, r.rel_err);
    CHECK(r.ok && !(r.graph.behavior & (1u << CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION)) &&
          r.graph.compile_ms == 0.0f && r.rel_err >= 0 && r.rel_err <= dtype_tolerance(KILN_F16));
  }
  /* A convolution chosen at one load is taken untimed at the next load of its shape (a shape no
   * other case of this program has), and both engines compute alike. */
  if (selected("conv graph choice reused")) {
    static const conv_shape odd = {"odd 3x3", 0, 2, 1, 40, 11, 11, 56, 3, 3, 1, 1, 1, 1, 0};
    prog *p = conv_prog(&odd, KILN_F16, 1, 1);
    kiln_error err;
    kiln_engine *a = p_load(p, &kiln_cuda_backend, 0, &err);
    kiln_engine *b = a ? p_load(p, &kiln_cuda_backend, 0, &err) : NULL;
    if (!b) fprintf(stderr, "conv graph choice reused: cuda load: %s\n", err.message);
    CHECK(a != NULL && b != NULL);
    if (a && b) {
      kiln_cuda_stats sa, sb;
      const kiln_tensor_desc *xt = &p->tensors[p->inputs[0]], *yt = &p->tensors[p->outputs[0]];
      void *hx = malloc(xt->nbytes), *ya = malloc(yt->nbytes), *yb = malloc(yt->nbytes);
      if (!hx || !ya || !yb) die("out of memory");
      fill(hx, KILN_F16, p_count(xt), -1, 1);
      void *in[1] = {hx}, *oa[1] = {ya}, *ob[1] = {yb};
      kiln_cuda_engine_stats(a, &sa, &err);
      kiln_cuda_engine_stats(b, &sb, &err);
      CHECK(p_execute(a, p, in, oa, &err) == KILN_OK && p_execute(b, p, in, ob, &err) == KILN_OK);
      double e = rel_error(yb, ya, KILN_F16, p_count(yt));
      printf("conv graph choice reused: first load measured %llu reused %llu, second measured %llu "
             "reused %llu; outputs %s (rel err %.1e)\n",
             (unsigned long long)sa.choices_measured, (unsigned long long)sa.choices_reused,
             (unsigned long long)sb.choices_measured, (unsigned long long)sb.choices_reused,
             memcmp(ya, yb, yt->nbytes) == 0 ? "identical" : "differ", e);
      CHECK(sa.choices_measured == 1 && sa.choices_reused == 0);
      CHECK(sb.choices_measured == 0 && sb.choices_reused == 1);
      CHECK(e <= dtype_tolerance(KILN_F16));
      free(hx);
      free(ya);
      free(yb);
    }
    p_unload(a);
    p_unload(b);
    p_free(p);
  }
  for (int tf32 = 0; tf32 < 2 && selected("conv graph f32"); tf32++) {
    conv_direct_run(&res3x3, KILN_F32, 1, 0, KCU_GRAPH_FUSED | KCU_GRAPH_PLAIN, tf32,
                    KCU_GRAPH_COMPILE_BUDGET_MS, 1, 0, &r);
    conv_choice_text(&r, text, sizeof text);
    double tol = tf32 ? 5e-3 : dtype_tolerance(KILN_F32);
    printf("conv graph f32 nhwc bias %s: %s, %s, rel err %.2e (tol %.0e)\n", tf32 ? "tf32 allowed" : "no tf32",
           r.ok ? "ok" : "FAILED", text, r.rel_err, tol);
    CHECK(r.ok && r.rel_err >= 0 && r.rel_err <= tol);
    if (!tf32) CHECK((r.graph.notes & lowered) == 0);
  }
}

/* --bench-conv: ResNet-50's batch-1 convolutions and MobileNetV3's depthwise ones at batch 1
 * and 32, NHWC f16: the chosen plan, its median time per run, the legacy API's fastest. */
static int bench_conv(void) {
  static const struct {
    conv_shape s;
    int epilogue;
  } cases[] = {
      /* name                    T  sp  n    c    h    w     o  kh kw  s pad dil  g op */
      {{"r50 stem 7x7 s2 224", 0, 2, 1, 3, 224, 224, 64, 7, 7, 2, 3, 1, 1, 0}, 1},
      {{"r50 3x3 56x56x64", 0, 2, 1, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 0}, 1},
      {{"r50 1x1 56x56 64>256", 0, 2, 1, 64, 56, 56, 256, 1, 1, 1, 0, 1, 1, 0}, 2},
      {{"r50 3x3 28x28x128", 0, 2, 1, 128, 28, 28, 128, 3, 3, 1, 1, 1, 1, 0}, 1},
      {{"r50 3x3 14x14x256", 0, 2, 1, 256, 14, 14, 256, 3, 3, 1, 1, 1, 1, 0}, 1},
      {{"r50 1x1 14x14 256>1024", 0, 2, 1, 256, 14, 14, 1024, 1, 1, 1, 0, 1, 1, 0}, 2},
      {{"r50 3x3 7x7x512", 0, 2, 1, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1, 0}, 1},
      {{"r50 1x1 7x7 512>2048", 0, 2, 1, 512, 7, 7, 2048, 1, 1, 1, 0, 1, 1, 0}, 2},
      {{"r50 1x1 7x7 512>2048", 0, 2, 1, 512, 7, 7, 2048, 1, 1, 1, 0, 1, 1, 0}, 0},
      {{"mnv3 dw3 112x112x16", 0, 2, 1, 16, 112, 112, 16, 3, 3, 1, 1, 1, 16, 0}, 1},
      {{"mnv3 dw3 s2 112x112x64", 0, 2, 1, 64, 112, 112, 64, 3, 3, 2, 1, 1, 64, 0}, 1},
      {{"mnv3 dw5 s2 56x56x72", 0, 2, 1, 72, 56, 56, 72, 5, 5, 2, 2, 1, 72, 0}, 1},
      {{"mnv3 dw5 28x28x120", 0, 2, 1, 120, 28, 28, 120, 5, 5, 1, 2, 1, 120, 0}, 1},
      {{"mnv3 dw3 14x14x480", 0, 2, 1, 480, 14, 14, 480, 3, 3, 1, 1, 1, 480, 0}, 0},
      {{"mnv3 dw5 7x7x960", 0, 2, 1, 960, 7, 7, 960, 5, 5, 1, 2, 1, 960, 0}, 0},
  };
  double total = 0.0, legacy_total = 0.0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int mobile = strncmp(cases[i].s.name, "mnv3", 4) == 0;
    for (int batch = 1; batch <= (mobile ? 32 : 1); batch += 31) {
      conv_shape cs = cases[i].s;
      conv_direct r;
      char text[400];
      cs.n = batch;
      conv_direct_run(&cs, KILN_F16, 1, cases[i].epilogue, KCU_GRAPH_FUSED | KCU_GRAPH_PLAIN, 0,
                      KCU_GRAPH_COMPILE_BUDGET_MS, 0, 1, &r);
      conv_choice_text(&r, text, sizeof text);
      printf("bench-conv %-24s b%-2d %-13s %8.1f us  legacy %8.1f us (algo %d)  %s  choose %.0f ms%s\n",
             cs.name, batch, conv_epilogues[cases[i].epilogue], r.us, r.legacy_us, r.legacy_algo, text,
             r.choose_ms, r.ok ? "" : "  FAILED");
      CHECK(r.ok && r.us > 0.0);
      if (batch == 1 && !mobile && r.us > 0) total += r.us;
      if (batch == 1 && !mobile && r.legacy_us > 0) legacy_total += r.legacy_us;
    }
  }
  printf("bench-conv the r50 cases above, summed: %.1f us (legacy convolutions alone %.1f us)\n",
         total, legacy_total);
  return check_report("test_cuda_ops --bench-conv");
}

/* A ResNet block on the engine: conv (bias, ReLU), conv (bias, + identity, ReLU), NHWC f16;
 * execute allocates nothing: with every allocation failing, runs succeed on staged and bound
 * buffers, and the device's free memory is unchanged. */
static void test_conv_noalloc(void) {
  kiln_error err;
  prog *p = p_new();
  uint32_t x = IN(p, KILN_F16, 4, 2, 14, 14, 64);
  uint32_t w1 = p_weight(p, KILN_F16, 4, DIMS(64, 3, 3, 64), -0.05, 0.05);
  uint32_t w2 = p_weight(p, KILN_F16, 4, DIMS(64, 3, 3, 64), -0.05, 0.05);
  uint32_t b = p_weight(p, KILN_F16, 1, DIMS(64), -0.5, 0.5);
  uint32_t h = MID(p, KILN_F16, 4, 2, 14, 14, 64);
  uint32_t y = OUT(p, KILN_F16, 4, 2, 14, 14, 64);
  p_op(p, KILN_OP_CONV, 3, OPS(x, w1, b), h, 8,
       ATTR(KILN_PAIR(1, 1), KILN_PAIR(1, 1), KILN_PAIR(1, 1), 1, 1, 1, KILN_ACT_RELU, 0), 0);
  p_op(p, KILN_OP_CONV, 4, OPS(h, w2, b, x), y, 8,
       ATTR(KILN_PAIR(1, 1), KILN_PAIR(1, 1), KILN_PAIR(1, 1), 1, 1, 1, KILN_ACT_RELU, 1), 0);
  kiln_engine *e = p_load(p, &kiln_cuda_backend, 0, &err);
  if (!e) fprintf(stderr, "conv block: cuda load: %s\n", err.message);
  CHECK(e != NULL);
  if (!e) {
    p_free(p);
    return;
  }
  size_t n = (size_t)p->tensors[x].nbytes;
  void *hx = malloc(n), *hy = malloc(n), *dx = NULL, *dy = NULL;
  fill(hx, KILN_F16, p_count(&p->tensors[x]), -1, 1);
  cudaMalloc(&dx, n);
  cudaMalloc(&dy, n);
  cudaMemcpy(dx, hx, n, cudaMemcpyHostToDevice);
  size_t free0 = 0, free1 = 0, total = 0;
  cudaMemGetInfo(&free0, &total);
  kiln_cuda_fail_allocations_after(0);
  int all_ok = 1;
  for (int i = 0; i < 20; i++) {
    void *hin[1] = {hx}, *hout[1] = {hy}, *din[1] = {dx}, *dout[1] = {dy};
    all_ok &= p_execute(e, p, hin, hout, &err) == KILN_OK;
    all_ok &= p_execute(e, p, din, dout, &err) == KILN_OK;
  }
  kiln_cuda_fail_allocations_after(-1);
  cudaMemGetInfo(&free1, &total);
  printf("conv block: 40 runs with allocation failure injected: %s; device free memory %s\n",
         all_ok ? "all ok" : "FAILED", free0 == free1 ? "unchanged" : "CHANGED");
  CHECK(all_ok && free0 == free1);
  cudaFree(dx);
  cudaFree(dy);
  free(hx);
  free(hy);
  p_unload(e);
  p_free(p);
}

static void flash_compare(prog *p, const char *name, const io_range *ranges);
static void time_sdpa_shape(const char *label, int64_t batch, int64_t heads, int64_t kv_heads,
                            int64_t L, int64_t E, int causal, kiln_dtype dt);

/* Grouped-query attention (k and v with fewer heads, key/value head = query head / group)
 * against the CPU engine: on cuBLASLt (f32, and f16 heads of 32) with the grouped heads as one
 * taller matrix, on the flash kernel (f16, bf16), with masks and causal, decode-shaped L = 1;
 * then the three kernels against each other on the device. */
static void test_grouped_attention(void) {
  char name[96];
  io_range r[4] = {{-2, 2}, {-2, 2}, {-1, 1}, {-3, 0}};
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = float_types[t];
    const char *dn = kiln_dtype_name(dt);
    prog *p = p_new();
    uint32_t q = IN(p, dt, 4, 2, 8, 40, 64), k = IN(p, dt, 4, 2, 2, 40, 64),
             v = IN(p, dt, 4, 2, 2, 40, 64);
    p_op(p, KILN_OP_SDPA, 3, OPS(q, k, v), OUT(p, dt, 4, 2, 8, 40, 64), 2, ATTR(1, 0), 0);
    snprintf(name, sizeof name, "sdpa grouped 8/2 causal %s", dn);
    if (t == 0) compare(p, name, r); else flash_compare(p, name, r);
    /* On the flash kernel, heads of a key/value head sharing a block: a mask of each query
     * head's own (additive, 4 heads a block; bool, 2 heads a block, rows off the tile) */
    for (int mk = 0; mk < 2 && t > 0; mk++) {
      int64_t hq = mk ? 4 : 8, rows = mk ? 45 : 70;
      p = p_new();
      q = IN(p, dt, 4, 2, hq, rows, 64), k = IN(p, dt, 4, 2, 2, 90, 64);
      v = IN(p, dt, 4, 2, 2, 90, 64);
      uint32_t hm = mk ? IN(p, KILN_BOOL, 4, 1, hq, rows, 90) : IN(p, dt, 4, 2, hq, rows, 90);
      p_op(p, KILN_OP_SDPA, 4, OPS(q, k, v, hm), OUT(p, dt, 4, 2, hq, rows, 64), 2, ATTR(0, 1), 0);
      snprintf(name, sizeof name, "sdpa grouped %lld/2 %s mask per head %s", (long long)hq,
               mk ? "bool" : "float", dn);
      io_range rm[4] = {{-2, 2}, {-2, 2}, {-1, 1}, {mk ? -0.5 : -3, 1}};
      flash_compare(p, name, rm);
    }
    p = p_new(); /* head dim 32: cuBLASLt for every dtype; an additive mask per batch */
    q = IN(p, dt, 4, 2, 6, 20, 32), k = IN(p, dt, 4, 2, 3, 30, 32), v = IN(p, dt, 4, 2, 3, 30, 32);
    uint32_t m = IN(p, dt, 4, 2, 1, 20, 30);
    p_op(p, KILN_OP_SDPA, 4, OPS(q, k, v, m), OUT(p, dt, 4, 2, 6, 20, 32), 2, ATTR(0, 1), 0);
    snprintf(name, sizeof name, "sdpa grouped 6/3 E32 float mask %s", dn);
    compare(p, name, r);
    p = p_new(); /* decode: one query row, 32 query and 8 key/value heads, a bool mask */
    q = IN(p, dt, 4, 1, 32, 1, 128), k = IN(p, dt, 4, 1, 8, 77, 128), v = IN(p, dt, 4, 1, 8, 77, 128);
    m = IN(p, KILN_BOOL, 2, 1, 77);
    p_op(p, KILN_OP_SDPA, 4, OPS(q, k, v, m), OUT(p, dt, 4, 1, 32, 1, 128), 2, ATTR(0, 1), 0);
    snprintf(name, sizeof name, "sdpa grouped 32/8 decode bool mask %s", dn);
    io_range rb[4] = {{-2, 2}, {-2, 2}, {-1, 1}, {-0.5, 1}};
    compare(p, name, rb);
    /* Decoding over a long cache: the keys split among blocks and merged. A mask keeping about
     * one key in fifty (most splits see none), one keeping none (zeros), an additive one. */
    const double keep[3] = {1, 0.02, -0.5};
    for (int km = 0; km < 3; km++) {
      p = p_new();
      q = IN(p, dt, 4, 1, 32, 1, 128), k = IN(p, dt, 4, 1, 8, 1152, 128), v = IN(p, dt, 4, 1, 8, 1152, 128);
      m = IN(p, KILN_BOOL, 2, 1, 1152);
      p_op(p, KILN_OP_SDPA, 4, OPS(q, k, v, m), OUT(p, dt, 4, 1, 32, 1, 128), 2, ATTR(0, 1), 0);
      snprintf(name, sizeof name, "sdpa split keys decode 32/8 S1152 keep<%.2f %s", keep[km], dn);
      io_range rk[4] = {{-2, 2}, {-2, 2}, {-1, 1}, {-1, keep[km]}};
      compare(p, name, rk);
    }
    /* Value rows that do not tile a warp in 16-byte vectors (40 dims: lane per dim) and narrow
     * ones that do (32 dims: 8 rows at once in f16, 4 in f32), over split keys. */
    const int64_t ev[2] = {40, 32};
    for (int c = 0; c < 2; c++) {
      p = p_new();
      q = IN(p, dt, 4, 1, 8, 2, 32), k = IN(p, dt, 4, 1, 2, 500, 32);
      v = IN(p, dt, 4, 1, 2, 500, ev[c]), m = IN(p, KILN_BOOL, 2, 2, 500);
      p_op(p, KILN_OP_SDPA, 4, OPS(q, k, v, m), OUT(p, dt, 4, 1, 8, 2, ev[c]), 2, ATTR(0, 1), 0);
      snprintf(name, sizeof name, "sdpa split keys decode Ev%lld %s", (long long)ev[c], dn);
      io_range rv[4] = {{-2, 2}, {-2, 2}, {-1, 1}, {-0.5, 1}};
      compare(p, name, rv);
    }
    p = p_new(); /* four query rows, causal, an additive mask, 16 heads over 2 */
    q = IN(p, dt, 4, 1, 16, 4, 64), k = IN(p, dt, 4, 1, 2, 700, 64), v = IN(p, dt, 4, 1, 2, 700, 64);
    m = IN(p, dt, 4, 1, 1, 4, 700);
    p_op(p, KILN_OP_SDPA, 4, OPS(q, k, v, m), OUT(p, dt, 4, 1, 16, 4, 64), 2, ATTR(1, 1), 0);
    snprintf(name, sizeof name, "sdpa split keys 4 rows causal float mask %s", dn);
    compare(p, name, r);
    p = p_new(); /* one key/value head for all query heads (multi-query) */
    q = IN(p, dt, 4, 1, 4, 16, 64), k = IN(p, dt, 4, 1, 1, 16, 64), v = IN(p, dt, 4, 1, 1, 16, 64);
    p_op(p, KILN_OP_SDPA, 3, OPS(q, k, v), OUT(p, dt, 4, 1, 4, 16, 64), 2, ATTR(1, 0), 0);
    snprintf(name, sizeof name, "sdpa grouped 4/1 causal %s", dn);
    compare(p, name, r);
  }
  if (selected("sdpa grouped kernels") && cuda_ok(kcu_flash_prepare(), "kcu_flash_prepare") &&
      cuda_ok(kcu_attention_prepare(KCU_ATTN_MAX_HEAD), "kcu_attention_prepare"))
    for (int t = 1; t < 3; t++) {
      time_sdpa_shape("sdpa grouped kernels", 2, 8, 2, 70, 64, 1, float_types[t]);
      time_sdpa_shape("sdpa grouped kernels", 1, 32, 8, 128, 128, 1, float_types[t]);
    }
}

/* The last op of p (SDPA) as the flash kernel's predicate sees it, every buffer at `base`. */
static int flash_takes(const prog *p, uintptr_t base) {
  const kiln_op *op = &p->ops[p->n_ops - 1];
  int has_mask = op->n_iattr > 1 && op->iattr[1];
  uint32_t ids[5] = {op->inputs[0], op->inputs[1], op->inputs[2], op->output,
                     has_mask ? op->inputs[3] : op->output};
  kcu_tensor t[5];
  for (int k = 0; k < 5; k++) {
    const kiln_tensor_desc *d = &p->tensors[ids[k]];
    memset(&t[k], 0, sizeof t[k]);
    t[k].data = (void *)base;
    t[k].dtype = d->dtype;
    t[k].rank = d->rank;
    t[k].numel = (int64_t)p_count(d);
    for (int r = 0; r < d->rank; r++) t[k].dims[r] = d->dims[r];
  }
  return kcu_flash_fits(&t[0], &t[1], &t[2], has_mask ? &t[4] : NULL, &t[3]);
}

/* A case meant for the flash kernel: its predicate takes the shape (and refuses it at an
 * address off 16 bytes, which the engine then runs on the fused kernel), then the compare. */
static void flash_compare(prog *p, const char *name, const io_range *ranges) {
  if (selected(name)) {
    int takes = flash_takes(p, 256), unaligned = flash_takes(p, 264);
    if (!takes || unaligned) printf("%s: flash predicate %d, unaligned %d: FAIL\n", name, takes, unaligned);
    CHECK(takes && !unaligned);
  }
  compare(p, name, ranges);
}

/* Packed heads: q, k and v read from qkv [B,L,3,H,E] and the output written as [B,L,H,E], on
 * the flash kernel (f16/bf16, head dims 64 and 128, causal or a bool mask) and on the fused
 * kernel (f32, and f16 with head dim 32); then heads last. */
static void test_packed_attention(void) {
  static const struct {
    kiln_dtype dt;
    int64_t L, H, E;
    int causal, mask;
  } cases[5] = {{KILN_F16, 77, 3, 64, 1, 0},
                {KILN_BF16, 130, 2, 128, 0, 1},
                {KILN_F16, 128, 4, 64, 0, 0},
                {KILN_F32, 45, 2, 64, 1, 0},
                {KILN_F16, 33, 2, 32, 0, 1}};
  char name[96];
  for (int c = 0; c < 5; c++) {
    kiln_dtype dt = cases[c].dt;
    int64_t L = cases[c].L, H = cases[c].H, E = cases[c].E;
    prog *p = p_new();
    uint32_t x = IN(p, dt, 5, 2, L, 3, H, E);
    uint32_t m = cases[c].mask ? IN(p, KILN_BOOL, 2, L, L) : 0;
    p_op(p, KILN_OP_SDPA, cases[c].mask ? 2 : 1, OPS(x, m), OUT(p, dt, 4, 2, L, H, E), 3,
         ATTR(cases[c].causal, cases[c].mask, 1), 0);
    snprintf(name, sizeof name, "sdpa packed %s L%lld H%lld E%lld causal %d mask %d",
             kiln_dtype_name(dt), (long long)L, (long long)H, (long long)E, cases[c].causal,
             cases[c].mask);
    compare(p, name, NULL);
  }
  /* Heads last: q [B,H,L,E], k and v [B,Hkv,S,E] (grouped), the output written [B,L,H,E]: on
   * the flash kernel (whole and partial tiles, causal or a bool mask), the decoding kernels (a
   * few query rows) and the fused kernel (f32). */
  static const struct {
    kiln_dtype dt;
    int64_t L, S, H, Hkv, E;
    int causal, mask;
  } last[6] = {{KILN_F16, 128, 128, 8, 2, 128, 1, 0}, {KILN_BF16, 77, 77, 4, 4, 64, 1, 0},
               {KILN_F16, 70, 90, 6, 3, 64, 0, 1},    {KILN_BF16, 1, 300, 8, 2, 128, 0, 0},
               {KILN_F16, 5, 40, 4, 1, 64, 0, 1},     {KILN_F32, 33, 33, 4, 2, 64, 1, 0}};
  for (int c = 0; c < 6; c++) {
    kiln_dtype dt = last[c].dt;
    int64_t L = last[c].L, S = last[c].S, H = last[c].H, Hkv = last[c].Hkv, E = last[c].E;
    prog *p = p_new();
    uint32_t q = IN(p, dt, 4, 2, H, L, E), k = IN(p, dt, 4, 2, Hkv, S, E),
             v = IN(p, dt, 4, 2, Hkv, S, E);
    uint32_t m = last[c].mask ? IN(p, KILN_BOOL, 2, L, S) : 0;
    p_op(p, KILN_OP_SDPA, last[c].mask ? 4 : 3, OPS(q, k, v, m), OUT(p, dt, 4, 2, L, H, E), 3,
         ATTR(last[c].causal, last[c].mask, 2), 0);
    snprintf(name, sizeof name, "sdpa heads last %s L%lld S%lld H%lld/%lld E%lld causal %d mask %d",
             kiln_dtype_name(dt), (long long)L, (long long)S, (long long)H, (long long)Hkv,
             (long long)E, last[c].causal, last[c].mask);
    compare(p, name, NULL);
  }
}

/* SDPA on cuDNN's fused attention (init forced to it where a plan builds), against the CPU
 * engine: causal or not, L and S apart both ways, grouped heads, packed heads and heads last,
 * head dims 64, 128 and 80 (which the flash kernel does not take); the shapes it must refuse
 * (a mask tensor, f32, a few query rows) stay on Kiln's kernels. Then the timed choice. */
static void test_cudnn_attention(void) {
  static const struct {
    int64_t B, H, Hkv, L, S, E;
    int causal, layout, mask, f32, want;
  } cases[] = {
      {2, 4, 4, 128, 128, 64, 0, 0, 0, 0, 1},  {1, 2, 2, 512, 512, 128, 1, 0, 0, 0, 1},
      {2, 3, 3, 77, 45, 64, 1, 0, 0, 0, 1},    {2, 3, 3, 45, 77, 64, 0, 0, 0, 0, 1},
      {2, 8, 2, 40, 40, 64, 1, 0, 0, 0, 1},    {2, 4, 1, 33, 50, 128, 1, 0, 0, 0, 1},
      {1, 4, 4, 96, 96, 80, 1, 0, 0, 0, 1},    {2, 3, 3, 77, 77, 64, 1, 1, 0, 0, 1},
      {2, 8, 2, 128, 128, 128, 1, 2, 0, 0, 1}, {2, 4, 4, 64, 64, 64, 0, 0, 1, 0, 0},
      {2, 4, 4, 64, 64, 64, 1, 0, 0, 1, 0},    {2, 4, 4, 4, 64, 64, 0, 0, 0, 0, 0},
  };
  char name[128];
  kiln_cuda_attention_choice(KILN_CUDA_ATTENTION_CUDNN);
  for (int t = 1; t < 3; t++) {
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      kiln_dtype dt = cases[c].f32 ? KILN_F32 : float_types[t];
      int64_t B = cases[c].B, H = cases[c].H, Hkv = cases[c].Hkv, L = cases[c].L, S = cases[c].S,
              E = cases[c].E;
      prog *p = p_new();
      uint32_t q, k, v, m = 0, n_in = 3;
      if (cases[c].layout == 1) { /* packed heads: qkv [B, L, 3, H, E], out [B, L, H, E] */
        q = IN(p, dt, 5, B, L, 3, H, E);
        p_op(p, KILN_OP_SDPA, 1, OPS(q), OUT(p, dt, 4, B, L, H, E), 3, ATTR(cases[c].causal, 0, 1), 0);
      } else {
        q = IN(p, dt, 4, B, H, L, E);
        k = IN(p, dt, 4, B, Hkv, S, E);
        v = IN(p, dt, 4, B, Hkv, S, E);
        if (cases[c].mask) m = IN(p, KILN_BOOL, 2, L, S), n_in = 4;
        uint32_t o = cases[c].layout == 2 ? OUT(p, dt, 4, B, L, H, E) : OUT(p, dt, 4, B, H, L, E);
        p_op(p, KILN_OP_SDPA, n_in, OPS(q, k, v, m), o, 3,
             ATTR(cases[c].causal, cases[c].mask, cases[c].layout), 0);
      }
      snprintf(name, sizeof name, "sdpa cudnn B%lld H%lld/%lld L%lld S%lld E%lld causal %d layout %d mask %d %s",
               (long long)B, (long long)H, (long long)Hkv, (long long)L, (long long)S, (long long)E,
               cases[c].causal, cases[c].layout, cases[c].mask, kiln_dtype_name(dt));
      expect_attention_cudnn = cases[c].want;
      compare(p, name, NULL);
    }
  }
  /* two SDPAs of one shape (a model's layers): one plan, shared, both on cuDNN */
  for (int t = 1; t < 3; t++) {
    kiln_dtype dt = float_types[t];
    prog *p = p_new();
    uint32_t q = IN(p, dt, 4, 2, 4, 96, 64), k = IN(p, dt, 4, 2, 4, 96, 64),
             v = IN(p, dt, 4, 2, 4, 96, 64), mid = MID(p, dt, 4, 2, 4, 96, 64);
    p_op(p, KILN_OP_SDPA, 3, OPS(q, k, v), mid, 2, ATTR(1, 0), 0);
    p_op(p, KILN_OP_SDPA, 3, OPS(mid, k, v), OUT(p, dt, 4, 2, 4, 96, 64), 2, ATTR(1, 0), 0);
    snprintf(name, sizeof name, "sdpa cudnn two of one shape share a plan %s", kiln_dtype_name(dt));
    if (selected(name)) { /* one choice timed, not two */
      kiln_error err;
      kiln_cuda_stats st;
      memset(&st, 0, sizeof st);
      kiln_engine *e = p_load(p, &kiln_cuda_backend, 0, &err);
      if (e) kiln_cuda_engine_stats(e, &st, &err);
      p_unload(e);
      printf("%s: %llu choices timed, %llu on cuDNN\n", name, (unsigned long long)st.choices_measured,
             (unsigned long long)st.attention_cudnn);
      CHECK(e && st.choices_measured == 1 && st.attention_cudnn == 2);
    }
    expect_attention_cudnn = 2;
    compare(p, name, NULL);
  }
  expect_attention_cudnn = -1;
  /* every allocation of a load that gives cuDNN an SDPA, made to fail in turn: an out-of-memory
   * error each time, nothing leaked */
  if (selected("sdpa cudnn allocation failures")) {
    kiln_error err;
    prog *p = p_new();
    uint32_t q = IN(p, KILN_F16, 4, 1, 2, 64, 64), k = IN(p, KILN_F16, 4, 1, 2, 64, 64),
             v = IN(p, KILN_F16, 4, 1, 2, 64, 64);
    p_op(p, KILN_OP_SDPA, 3, OPS(q, k, v), OUT(p, KILN_F16, 4, 1, 2, 64, 64), 2, ATTR(1, 0), 0);
    kiln_engine *e = p_load(p, &kiln_cuda_backend, 0, &err);
    kiln_cuda_stats st;
    memset(&st, 0, sizeof st);
    if (e) kiln_cuda_engine_stats(e, &st, &err);
    p_unload(e);
    size_t free0 = 0, free1 = 0, total = 0;
    cudaMemGetInfo(&free0, &total);
    int refused = 0, loaded = 0, other = 0;
    /* past init_allocs: the handles and graphs, which fail the same way but are not counted */
    for (long n = 0; n <= (long)st.init_allocs + 8; n++) {
      kiln_cuda_fail_allocations_after(n);
      e = p_load(p, &kiln_cuda_backend, 0, &err);
      kiln_cuda_fail_allocations_after(-1);
      if (e) loaded++;
      else if (err.status == KILN_ERR_OUT_OF_MEMORY) refused++;
      else other++;
      p_unload(e);
    }
    cudaMemGetInfo(&free1, &total);
    printf("sdpa cudnn allocation failures: %llu on cuDNN, %d refused with out of memory, %d "
           "loaded, %d other errors; device free memory %s\n",
           (unsigned long long)st.attention_cudnn, refused, loaded, other,
           free0 == free1 ? "unchanged" : "CHANGED");
    CHECK(st.attention_cudnn == 1 && refused > 3 && loaded > 0 && other == 0 && free0 == free1);
    p_free(p);
  }
  /* the timed choice: either path, the same answer */
  kiln_cuda_attention_choice(KILN_CUDA_ATTENTION_TIMED);
  expect_attention_cudnn = -1;
  for (int t = 1; t < 3; t++) {
    prog *p = p_new();
    kiln_dtype dt = float_types[t];
    uint32_t q = IN(p, dt, 4, 4, 8, 256, 64), k = IN(p, dt, 4, 4, 8, 256, 64),
             v = IN(p, dt, 4, 4, 8, 256, 64);
    p_op(p, KILN_OP_SDPA, 3, OPS(q, k, v), OUT(p, dt, 4, 4, 8, 256, 64), 2, ATTR(1, 0), 0);
    snprintf(name, sizeof name, "sdpa cudnn timed choice causal 4x8x256x64 %s", kiln_dtype_name(dt));
    compare(p, name, NULL);
  }
  kiln_cuda_attention_choice(KILN_CUDA_ATTENTION_OWN);
}

/* SDPA on the tensor-core flash kernel, f16 and bf16, head dims 64 and 128: whole tiles, the
 * GPT block's causal 512, L and S off the 64-row tiles both ways, bool and additive masks
 * with fully masked rows, and k and v broadcast over several batch dims. */
static void test_flash_attention(void) {
  char name[96];
  io_range r[4] = {{-2, 2}, {-2, 2}, {-1, 1}, {-0.5, 1}};
  io_range ra[4] = {{-2, 2}, {-2, 2}, {-1, 1}, {-3, 0}};
  for (int t = 1; t < 3; t++) {
    kiln_dtype dt = float_types[t];
    const char *dn = kiln_dtype_name(dt);
    for (int64_t e = 64; e <= 128; e += 64) {
      prog *p = p_new(); /* the encoder's shape, fewer heads */
      uint32_t q = IN(p, dt, 4, 2, 4, 128, e), k = IN(p, dt, 4, 2, 4, 128, e),
               v = IN(p, dt, 4, 2, 4, 128, e);
      p_op(p, KILN_OP_SDPA, 3, OPS(q, k, v), OUT(p, dt, 4, 2, 4, 128, e), 2, ATTR(0, 0), 0);
      snprintf(name, sizeof name, "sdpa flash 128x128 E%d %s", (int)e, dn);
      flash_compare(p, name, r);

      p = p_new(); /* the GPT block's: causal, 512 keys, every tile position on the diagonal */
      q = IN(p, dt, 4, 1, 2, 512, e);
      k = IN(p, dt, 4, 1, 2, 512, e);
      v = IN(p, dt, 4, 1, 2, 512, e);
      p_op(p, KILN_OP_SDPA, 3, OPS(q, k, v), OUT(p, dt, 4, 1, 2, 512, e), 2, ATTR(1, 0), 0);
      snprintf(name, sizeof name, "sdpa flash causal 512x512 E%d %s", (int)e, dn);
      flash_compare(p, name, r);

      static const int64_t tails[2][2] = {{77, 45}, {45, 77}};
      for (int s = 0; s < 2; s++) {
        for (int causal = 0; causal < 2; causal++) {
          int64_t L = tails[s][0], S = tails[s][1];
          p = p_new();
          q = IN(p, dt, 4, 2, 3, L, e);
          k = IN(p, dt, 4, 2, 3, S, e);
          v = IN(p, dt, 4, 2, 3, S, e);
          p_op(p, KILN_OP_SDPA, 3, OPS(q, k, v), OUT(p, dt, 4, 2, 3, L, e), 2, ATTR(causal, 0), 0);
          snprintf(name, sizeof name, "sdpa flash L%d S%d causal %d E%d %s", (int)L, (int)S,
                   causal, (int)e, dn);
          flash_compare(p, name, r);
        }
      }

      /* A bool mask [L, S] (true keeps) with rows 5 and 66 all false: zeros there, as on the
       * CPU; 66 is in the second, partial query tile. Causal on top for E 128. */
      p = p_new();
      q = IN(p, dt, 4, 2, 2, 70, e);
      k = IN(p, dt, 4, 2, 2, 90, e);
      v = IN(p, dt, 4, 2, 2, 90, e);
      uint32_t m = p_weight(p, KILN_BOOL, 2, DIMS(70, 90), -0.5, 1);
      memset(p->weights + p->tensors[m].offset + 5 * 90, 0, 90);
      memset(p->weights + p->tensors[m].offset + 66 * 90, 0, 90);
      p_op(p, KILN_OP_SDPA, 4, OPS(q, k, v, m), OUT(p, dt, 4, 2, 2, 70, e), 2, ATTR(e == 128, 1), 0);
      snprintf(name, sizeof name, "sdpa flash bool mask masked rows causal %d E%d %s",
               e == 128, (int)e, dn);
      flash_compare(p, name, r);

      /* An additive f32 mask (another dtype than q) with row 9 all -inf, and scale given. */
      p = p_new();
      q = IN(p, dt, 4, 2, 2, 70, e);
      k = IN(p, dt, 4, 2, 2, 90, e);
      v = IN(p, dt, 4, 2, 2, 90, e);
      m = p_weight(p, KILN_F32, 2, DIMS(70, 90), -3, 0);
      float *row9 = (float *)(p->weights + p->tensors[m].offset) + 9 * 90;
      for (int j = 0; j < 90; j++) row9[j] = -INFINITY;
      p_op(p, KILN_OP_SDPA, 4, OPS(q, k, v, m), OUT(p, dt, 4, 2, 2, 70, e), 2, ATTR(0, 1), 0.1);
      snprintf(name, sizeof name, "sdpa flash f32 mask -inf row E%d %s", (int)e, dn);
      flash_compare(p, name, r);

      /* An additive mask of q's dtype broadcast over heads and rows, causal, L < S. */
      p = p_new();
      q = IN(p, dt, 4, 2, 3, 40, e);
      k = IN(p, dt, 4, 2, 3, 100, e);
      v = IN(p, dt, 4, 2, 3, 100, e);
      m = IN(p, dt, 4, 2, 1, 1, 100);
      p_op(p, KILN_OP_SDPA, 4, OPS(q, k, v, m), OUT(p, dt, 4, 2, 3, 40, e), 2, ATTR(1, 1), 0);
      snprintf(name, sizeof name, "sdpa flash %s mask causal L<S E%d %s", dn, (int)e, dn);
      flash_compare(p, name, ra);

      /* Three batch dims; k broadcast over the first and last, v over the last two, a bool
       * mask over the first two; causal, scale given. */
      p = p_new();
      q = IN(p, dt, 5, 2, 3, 2, 50, e);
      k = IN(p, dt, 4, 3, 1, 60, e);
      v = IN(p, dt, 5, 2, 1, 1, 60, e);
      m = IN(p, KILN_BOOL, 3, 2, 50, 60);
      p_op(p, KILN_OP_SDPA, 4, OPS(q, k, v, m), OUT(p, dt, 5, 2, 3, 2, 50, e), 2, ATTR(1, 1), 0.3);
      snprintf(name, sizeof name, "sdpa flash batch dims kv broadcast E%d %s", (int)e, dn);
      flash_compare(p, name, r);
    }
  }
  /* Shapes it does not take: f32, E != Ev, head dim 32, mixed dtypes. */
  static const struct {
    kiln_dtype q, k, v;
    int64_t e, ev;
  } refused[4] = {{KILN_F32, KILN_F32, KILN_F32, 64, 64},
                  {KILN_F16, KILN_F16, KILN_F16, 64, 32},
                  {KILN_F16, KILN_F16, KILN_F16, 32, 32},
                  {KILN_F16, KILN_BF16, KILN_F16, 64, 64}};
  for (int c = 0; c < 4; c++) {
    prog *p = p_new();
    uint32_t q = IN(p, refused[c].q, 3, 2, 64, refused[c].e);
    uint32_t k = IN(p, refused[c].k, 3, 2, 64, refused[c].e);
    uint32_t v = IN(p, refused[c].v, 3, 2, 64, refused[c].ev);
    p_op(p, KILN_OP_SDPA, 3, OPS(q, k, v), OUT(p, refused[c].q, 3, 2, 64, refused[c].ev), 2,
         ATTR(0, 0), 0);
    CHECK(!flash_takes(p, 256));
    p_free(p);
  }
}

/* ---------------------------------------------------------------- --bench-fused */

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* Times the FUSED kernel alone on p's one op (random inputs on the device): 20 launches
 * captured in a graph (so the host's per-launch decode is not timed), the median of 11 replays,
 * and the bytes of every input and the output over that time. */
static const char *bench_fused_only; /* --bench-fused SUBSTRING */

static void bench_fused(const prog *p, const char *label) {
  enum { LAUNCHES = 20, REPLAYS = 11 };
  if (bench_fused_only && !strstr(label, bench_fused_only)) return;
  kiln_plan pl;
  kcu_tensor in[KILN_MAX_OP_INPUTS], out;
  const kiln_op *op = &p->ops[0];
  uint64_t bytes = 0;
  float ms[REPLAYS];
  memset(&pl, 0, sizeof pl);
  pl.tensors = (kiln_tensor_desc *)p->tensors;
  pl.n_tensors = p->n_tensors;
  pl.words = (int64_t *)p->words;
  pl.n_words = p->n_words;
  for (uint32_t k = 0; k <= op->n_inputs; k++) {
    const kiln_tensor_desc *t = &p->tensors[k < op->n_inputs ? op->inputs[k] : op->output];
    kcu_tensor *x = k < op->n_inputs ? &in[k] : &out;
    void *host = malloc(t->nbytes);
    if (!host || !cuda_ok(cudaMalloc(&x->data, t->nbytes), "cudaMalloc")) die("bench memory");
    fill(host, t->dtype, p_count(t), -1, 1);
    cudaMemcpy(x->data, host, t->nbytes, cudaMemcpyHostToDevice);
    free(host);
    x->dtype = t->dtype;
    x->rank = t->rank;
    memcpy(x->dims, t->dims, sizeof x->dims);
    x->numel = (int64_t)p_count(t);
    bytes += t->nbytes;
  }
  cudaStream_t st;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  cudaEvent_t e0, e1;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  int ok = cuda_ok(kcu_fused(st, &pl, op, in, &out), label) &&
           cuda_ok(cudaStreamSynchronize(st), label) &&
           cuda_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), label);
  for (int i = 0; i < LAUNCHES && ok; i++) ok = cuda_ok(kcu_fused(st, &pl, op, in, &out), label);
  ok = ok && cuda_ok(cudaStreamEndCapture(st, &graph), label) &&
       cuda_ok(cudaGraphInstantiate(&exec, graph, 0), label) &&
       cuda_ok(cudaGraphLaunch(exec, st), label);
  for (int i = 0; i < REPLAYS && ok; i++) {
    cudaEventRecord(e0, st);
    ok = cuda_ok(cudaGraphLaunch(exec, st), label);
    cudaEventRecord(e1, st);
    ok = ok && cuda_ok(cudaEventSynchronize(e1), label);
    cudaEventElapsedTime(&ms[i], e0, e1);
  }
  CHECK(ok);
  if (ok) {
    qsort(ms, REPLAYS, sizeof ms[0], cmp_float);
    double us = ms[REPLAYS / 2] * 1e3 / LAUNCHES;
    printf("%-52s %9.1f us %8.1f GB/s (%.1f MB)\n", label, us, (double)bytes / (us * 1e3),
           (double)bytes / 1e6);
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(st);
  for (uint32_t k = 0; k < op->n_inputs; k++) cudaFree(in[k].data);
  cudaFree(out.data);
}

/* The FUSED groups of the Llama block and MobileNetV3 benchmarks at their shapes, and a plain
 * pointwise chain, timed on the kernel alone. */
static int time_fused(void) {
  int64_t maps[6 * 20], code[2 * KILN_FX_MAX_INSTRS];
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = float_types[t];
    char label[96];
    for (int h = 4; h <= 16; h += 12) { /* a decoding step's: one position */
      prog *p = p_new();
      uint32_t x = IN(p, dt, 3, 1, 1, h * 128), c = IN(p, dt, 2, 1, 128), s = IN(p, dt, 2, 1, 128);
      uint32_t n = fx_rotary(maps, code, 1, h, 1, 128, dt);
      p_fused(p, 3, OPS(x, c, s), OUT(p, dt, 4, 1, h, 1, 128), 4, 5, maps, n, code);
      snprintf(label, sizeof label, "rotary [1,%d,1,128] %s", h, kiln_dtype_name(dt));
      bench_fused(p, label);
      p_free(p);
    }
    for (int b = 1; b <= 32; b += 31)
      for (int h = 8; h <= 32; h += 24) {
        prog *p = p_new();
        uint32_t x = IN(p, dt, 3, b, 128, h * 128), c = IN(p, dt, 2, 128, 128),
                 s = IN(p, dt, 2, 128, 128);
        uint32_t n = fx_rotary(maps, code, b, h, 128, 128, dt);
        p_fused(p, 3, OPS(x, c, s), OUT(p, dt, 4, b, h, 128, 128), 4, 5, maps, n, code);
        snprintf(label, sizeof label, "rotary [%d,%d,128,128] %s", b, h, kiln_dtype_name(dt));
        bench_fused(p, label);
        p_free(p);
      }
    for (int cl = 0; cl < 2; cl++) {
      prog *p = p_new();
      uint32_t x = cl ? IN(p, dt, 4, 32, 7, 7, 960) : IN(p, dt, 4, 32, 960, 7, 7);
      uint32_t s = cl ? IN(p, dt, 4, 32, 1, 1, 960) : IN(p, dt, 4, 32, 960, 1, 1);
      uint32_t n = fx_gate(maps, code, cl, 32, 960, 7, 7, dt);
      uint32_t o = cl ? OUT(p, dt, 4, 32, 7, 7, 960) : OUT(p, dt, 4, 32, 960, 7, 7);
      p_fused(p, 2, OPS(x, s), o, 4, 2, maps, n, code);
      snprintf(label, sizeof label, "gate x*hardsigmoid(s) [32,960,7,7] %s %s",
               cl ? "channels_last" : "nchw", kiln_dtype_name(dt));
      bench_fused(p, label);
      p_free(p);
    }
    prog *p = p_new();
    uint32_t x = IN(p, dt, 2, 4096, 4096), y = IN(p, dt, 2, 4096, 4096);
    uint32_t n = fx_chain(maps, code, 2, DIMS(4096, 4096), dt);
    p_fused(p, 2, OPS(x, y), OUT(p, dt, 2, 4096, 4096), 2, 2, maps, n, code);
    snprintf(label, sizeof label, "chain silu(x+y)*y [4096,4096] %s", kiln_dtype_name(dt));
    bench_fused(p, label);
    p_free(p);
  }
  return check_report("test_cuda_ops --bench-fused");
}

/* ---------------------------------------------------------------- --time-sdpa */

typedef struct sdpa_bench {
  kcu_tensor in[3], out[4]; /* outputs of flash, the cuBLASLt path, the fused kernel, cuDNN */
  cudaStream_t s;
  int causal;
  float scale;
  cublasLtHandle_t lt;
  kcu_attn_gemm ag;
  cudnnHandle_t dnn;
  kcu_sdpa_graph dg; /* cuDNN's fused attention, its plan chosen as the engine's init does */
  void *ws, *scratch;
  size_t ws_size;
} sdpa_bench;

static cudaError_t bench_call(sdpa_bench *b, int path) {
  if (path == 0)
    return kcu_flash_attention(b->s, &b->in[0], &b->in[1], &b->in[2], NULL, &b->out[0], b->causal, b->scale, NULL);
  if (path == 1)
    return kcu_attn_gemm_run(&b->ag, b->lt, b->s, b->in, NULL, &b->out[1], b->causal, b->scale,
                             b->scratch, b->ws, b->ws_size);
  if (path == 3)
    return kcu_sdpa_graph_run(&b->dg, b->dnn, b->in[0].data, b->in[1].data, b->in[2].data,
                              b->out[3].data, b->ws) == CUDNN_STATUS_SUCCESS
               ? cudaSuccess
               : cudaErrorUnknown;
  return kcu_attention(b->s, &b->in[0], &b->in[1], &b->in[2], NULL, &b->out[2], b->causal, b->scale, NULL,
                       NULL, NULL);
}

/* Microseconds per call, averaged over back-to-back calls after a warm-up; -1 on an error. */
static double bench_us(sdpa_bench *b, int path) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaError_t rc = cudaSuccess;
  for (int i = 0; i < 3 && rc == cudaSuccess; i++) rc = bench_call(b, path);
  float ms = 0.0f;
  int iters = 0;
  if (rc == cudaSuccess) rc = cudaStreamSynchronize(b->s);
  /* Enough calls for about 20 ms, at least 5. */
  cudaEventRecord(e0, b->s);
  rc = rc == cudaSuccess ? bench_call(b, path) : rc;
  cudaEventRecord(e1, b->s);
  if (rc == cudaSuccess) rc = cudaEventSynchronize(e1);
  cudaEventElapsedTime(&ms, e0, e1);
  iters = ms > 0.0f ? (int)(20.0f / ms) : 100;
  if (iters < 5) iters = 5;
  if (iters > 200) iters = 200;
  cudaEventRecord(e0, b->s);
  for (int i = 0; i < iters && rc == cudaSuccess; i++) rc = bench_call(b, path);
  cudaEventRecord(e1, b->s);
  if (rc == cudaSuccess) rc = cudaEventSynchronize(e1);
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (rc != cudaSuccess) {
    fprintf(stderr, "path %d: %s\n", path, cudaGetErrorString(rc));
    cudaGetLastError();
    return -1.0;
  }
  return 1000.0 * ms / iters;
}

/* max|a - b| / max|b| over n 16-bit values of dtype dt in device memory. */
static double device_rel_error(const void *a, const void *b, kiln_dtype dt, uint64_t n) {
  void *ha = malloc(n * 2), *hb = malloc(n * 2);
  if (!ha || !hb) die("out of memory");
  cudaMemcpy(ha, a, n * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(hb, b, n * 2, cudaMemcpyDeviceToHost);
  double e = rel_error(ha, hb, dt, n);
  free(ha);
  free(hb);
  return e;
}

static void time_sdpa_shape(const char *label, int64_t batch, int64_t heads, int64_t kv_heads,
                            int64_t L, int64_t E, int causal, kiln_dtype dt) {
  prog *p = p_new();
  uint32_t q = IN(p, dt, 4, batch, heads, L, E), k = IN(p, dt, 4, batch, kv_heads, L, E),
           v = IN(p, dt, 4, batch, kv_heads, L, E);
  uint32_t o = OUT(p, dt, 4, batch, heads, L, E);
  p_op(p, KILN_OP_SDPA, 3, OPS(q, k, v), o, 2, ATTR(causal, 0), 0);
  kiln_plan pl;
  p_plan(p, &pl);

  sdpa_bench b;
  memset(&b, 0, sizeof b);
  uint64_t n = (uint64_t)(batch * heads * L * E);
  void *host = malloc(n * 2);
  if (!host) die("out of memory");
  for (int t = 0; t < 7; t++) {
    kcu_tensor *kt = t < 3 ? &b.in[t] : &b.out[t - 3];
    kt->dtype = dt;
    kt->rank = 4;
    kt->dims[0] = batch;
    kt->dims[1] = t == 1 || t == 2 ? kv_heads : heads;
    kt->dims[2] = L;
    kt->dims[3] = E;
    kt->numel = (int64_t)n; /* k and v use the first kv_heads / heads of theirs */
    if (!cuda_ok(cudaMalloc(&kt->data, n * 2), "cudaMalloc")) die("device");
    kt->numel = batch * kt->dims[1] * L * E;
    if (t < 3) {
      fill(host, dt, n, t == 2 ? -1 : -2, t == 2 ? 1 : 2);
      cudaMemcpy(kt->data, host, n * 2, cudaMemcpyHostToDevice);
    }
  }
  free(host);
  b.causal = causal;
  b.scale = 1.0f / sqrtf((float)E);
  cudaStreamCreateWithFlags(&b.s, cudaStreamNonBlocking);
  b.ws_size = (size_t)32 << 20;
  kiln_error err;
  int gemm = cublasLtCreate(&b.lt) == CUBLAS_STATUS_SUCCESS &&
             cudaMalloc(&b.ws, b.ws_size) == cudaSuccess &&
             kcu_attn_gemm_init(&b.ag, b.lt, &pl, 0, 0, b.ws_size, &err) == KILN_OK && b.ag.active &&
             cudaMalloc(&b.scratch, b.ag.scratch_bytes) == cudaSuccess;
  if (gemm)
    kcu_attn_gemm_tune(&b.ag, b.lt, b.s, b.in, &b.out[1], b.scratch, b.ws, b.ws_size, NULL);
  kcu_attn_geometry geo;
  kcu_sdpa_shape sh;
  kcu_attn_geometry_init(&geo, &b.in[0], &b.in[1], &b.in[2], NULL, &b.out[3], L);
  int dnn = kcu_sdpa_graph_shape(&sh, &b.in[0], &b.in[1], &b.in[2], NULL, &b.out[3], &geo, causal) &&
            cudnnCreate(&b.dnn) == CUDNN_STATUS_SUCCESS && cudnnSetStream(b.dnn, b.s) == CUDNN_STATUS_SUCCESS &&
            kcu_sdpa_graph_choose(&b.dg, b.dnn, b.s, &sh, b.scale, b.in[0].data, b.in[1].data, b.in[2].data,
                                  b.out[3].data, b.ws, b.ws_size) == CUDNN_STATUS_SUCCESS;
  cudaGetLastError();
  double flash = bench_us(&b, 0), lt = gemm ? bench_us(&b, 1) : -1.0, fma = bench_us(&b, 2);
  double cudnn = dnn ? bench_us(&b, 3) : -1.0;
  double flops = 4.0 * (double)batch * heads * L * L * E * (causal ? 0.5 : 1.0);
  double e_lt = gemm ? device_rel_error(b.out[0].data, b.out[1].data, dt, n) : -1.0;
  double e_fma = device_rel_error(b.out[0].data, b.out[2].data, dt, n);
  double e_dnn = dnn ? device_rel_error(b.out[3].data, b.out[2].data, dt, n) : -1.0;
  printf("time-sdpa %-10s b%-3lld kv%-3lld %-4s flash %8.1f us (%5.1f TFLOP/s)  cublasLt %8.1f us  fma %8.1f us"
         "  cudnn %8.1f us (engine %lld)  flash vs cublasLt %.1e, vs fma %.1e, cudnn vs fma %.1e\n",
         label, (long long)batch, (long long)kv_heads, kiln_dtype_name(dt), flash, flops / (flash * 1e6), lt, fma,
         cudnn, dnn ? (long long)b.dg.engine : -1LL, e_lt, e_fma, e_dnn);
  CHECK(flash > 0.0 && e_fma <= dtype_tolerance(dt) && (!gemm || e_lt <= dtype_tolerance(dt)));
  CHECK(!dnn || (cudnn > 0.0 && e_dnn <= dtype_tolerance(dt)));
  kcu_sdpa_graph_release(&b.dg);
  if (b.dnn) cudnnDestroy(b.dnn);
  kcu_attn_gemm_release(&b.ag);
  if (b.lt) cublasLtDestroy(b.lt);
  cudaFree(b.ws);
  cudaFree(b.scratch);
  for (int t = 0; t < 3; t++) cudaFree(b.in[t].data);
  for (int t = 0; t < 4; t++) cudaFree(b.out[t].data);
  cudaStreamDestroy(b.s);
  p_free(p);
}

/* Decoding's attention (one query row per head over a long cache) on the tiled fused kernel
 * and on the decoding kernel (keys split among warps), its splits merged by a kernel after it or
 * by the last block of a row to finish (the engine's way): microseconds per call, agreement.
 * keep < S: a bool mask keeps the first keep keys, as a static cache filled that far. */
static void time_sdpa_decode(int64_t heads, int64_t kv_heads, int64_t S, int64_t E, kiln_dtype dt,
                             int64_t keep) {
  kcu_tensor t[4], m;
  unsigned char *mask_host = NULL;
  const int64_t rows[4] = {heads, kv_heads, kv_heads, heads}, len[4] = {1, S, S, 1};
  void *outs[3] = {NULL, NULL, NULL}, *part = NULL;
  unsigned *arrivals = NULL;
  const int64_t n_arrivals = kcu_attention_arrivals(132 * 2);
  size_t part_bytes = kcu_attention_part_bytes(E, 132 * 2);
  for (int i = 0; i < 4; i++) {
    memset(&t[i], 0, sizeof t[i]);
    t[i].dtype = dt;
    t[i].rank = 4;
    t[i].dims[0] = 1, t[i].dims[1] = rows[i], t[i].dims[2] = len[i], t[i].dims[3] = E;
    t[i].numel = rows[i] * len[i] * E;
    uint64_t n = (uint64_t)t[i].numel;
    if (!cuda_ok(cudaMalloc(&t[i].data, n * 4), "cudaMalloc")) die("device");
    void *host = malloc(n * 4);
    if (!host) die("out of memory");
    fill(host, dt, n, -2, 2);
    cudaMemcpy(t[i].data, host, n * kiln_dtype_size(dt), cudaMemcpyHostToDevice);
    free(host);
  }
  memset(&m, 0, sizeof m);
  m.dtype = KILN_BOOL;
  m.rank = 4;
  m.dims[0] = m.dims[1] = m.dims[2] = 1, m.dims[3] = S;
  m.numel = S;
  if (!(mask_host = malloc((size_t)S))) die("out of memory");
  for (int64_t j = 0; j < S; j++) mask_host[j] = j < keep;
  if (!cuda_ok(cudaMalloc(&m.data, (size_t)S), "cudaMalloc")) die("device");
  cudaMemcpy(m.data, mask_host, (size_t)S, cudaMemcpyHostToDevice);
  free(mask_host);
  const kcu_tensor *mask = keep < S ? &m : NULL;
  outs[0] = t[3].data;
  if (!cuda_ok(cudaMalloc(&outs[1], (size_t)t[3].numel * 4), "cudaMalloc") ||
      !cuda_ok(cudaMalloc(&outs[2], (size_t)t[3].numel * 4), "cudaMalloc") ||
      !cuda_ok(cudaMalloc(&part, part_bytes), "cudaMalloc") ||
      !cuda_ok(cudaMalloc((void **)&arrivals, (size_t)n_arrivals * sizeof(unsigned)), "cudaMalloc") ||
      !cuda_ok(cudaMemset(arrivals, 0, (size_t)n_arrivals * sizeof(unsigned)), "cudaMemset"))
    die("device");
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  double us[3];
  /* split 0: no decoding scratch (the tiled kernel); 1: the merge kernel after the splits;
   * 2: the last block of a row merges it (the engine's way, with arrival counts) */
  const kcu_dec_scratch merge_kernel = {part, part_bytes, NULL, 0};
  const kcu_dec_scratch merge_by_last = {part, part_bytes, arrivals, n_arrivals};
  const kcu_dec_scratch *decs[3] = {NULL, &merge_kernel, &merge_by_last};
  for (int split = 0; split < 3; split++) {
    const kcu_dec_scratch *dec = decs[split];
    kcu_tensor o = t[3];
    o.data = outs[split];
    float scale = 1.0f / sqrtf((float)E), ms = 0.0f;
    cudaError_t rc = cudaSuccess;
    for (int i = 0; i < 3 && rc == cudaSuccess; i++)
      rc = kcu_attention(st, &t[0], &t[1], &t[2], mask, &o, 0, scale, NULL, dec, NULL);
    cudaEventRecord(e0, st);
    for (int i = 0; i < 100 && rc == cudaSuccess; i++)
      rc = kcu_attention(st, &t[0], &t[1], &t[2], mask, &o, 0, scale, NULL, dec, NULL);
    cudaEventRecord(e1, st);
    if (rc == cudaSuccess) rc = cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    us[split] = rc == cudaSuccess ? ms * 10.0 : -1.0;
  }
  double e = device_rel_error(outs[0], outs[1], dt, (uint64_t)t[3].numel);
  double e2 = device_rel_error(outs[0], outs[2], dt, (uint64_t)t[3].numel);
  printf("time-sdpa decode %lld/%lld heads S %lld keep %lld E %lld %-4s tiled %8.1f us  decoding + merge kernel %6.1f us  decoding merging its rows %6.1f us  agree %.1e %.1e\n",
         (long long)heads, (long long)kv_heads, (long long)S, (long long)keep, (long long)E,
         kiln_dtype_name(dt), us[0], us[1], us[2], e, e2);
  CHECK(us[0] > 0.0 && us[1] > 0.0 && us[2] > 0.0 && e <= dtype_tolerance(dt) &&
        e2 <= dtype_tolerance(dt));
  for (int i = 0; i < 4; i++) cudaFree(t[i].data);
  cudaFree(m.data);
  cudaFree(outs[1]);
  cudaFree(outs[2]);
  cudaFree(arrivals);
  cudaFree(part);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(st);
}

/* The attention of bench/bench.py's encoder (16 heads, L = S = 128, head dim 64), GPT block
 * (16 heads, L = S = 512, causal, head dim 128) and Llama block (32 query and 8 key/value
 * heads, L = S = 128, causal, head dim 128) at batch 1 and 32. */
static int time_sdpa(void) {
  if (!cuda_ok(kcu_flash_prepare(), "kcu_flash_prepare") ||
      !cuda_ok(kcu_attention_prepare(KCU_ATTN_MAX_HEAD), "kcu_attention_prepare"))
    return 1;
  for (int t = 1; t < 3; t++) {
    for (int b = 1; b <= 32; b += 31) {
      time_sdpa_shape("encoder", b, 16, 16, 128, 64, 0, float_types[t]);
      time_sdpa_shape("gpt_block", b, 16, 16, 512, 128, 1, float_types[t]);
      time_sdpa_shape("llama_gqa", b, 32, 8, 128, 128, 1, float_types[t]);
    }
    time_sdpa_decode(16, 4, 1152, 128, float_types[t], 1152);
    time_sdpa_decode(16, 4, 1152, 128, float_types[t], 150);
    time_sdpa_decode(32, 8, 4096, 128, float_types[t], 4096);
    time_sdpa_decode(32, 8, 4096, 128, float_types[t], 600);
  }
  return check_report("test_cuda_ops --time-sdpa");
}

/* ---------------------------------------------------------------- --time-linear */

/* Decode-shaped LINEARs: M of 1 to 16 rows against weights of a 2048- and a 4096-wide
 * Llama-family layer and the benchmark MLP's (those whose label contains `only`, NULL: all),
 * on the GEMV kernel at each spread and on cuBLASLt at each of its candidates, against
 * the weight-read floor: the weight's bytes over the device-to-device copy rate measured here.
 * Each is timed as a CUDA graph of calls reading copies of the weight in turn (at least 256 MiB
 * of them, more than the L2 cache holds), so each call reads its weight from device memory and
 * launches early behind the call ahead, as in a decode step; microseconds per call, the fastest
 * of 3 replays. */
typedef struct linear_bench {
  kcu_gemm g;
  cublasLtHandle_t lt;
  cudaStream_t s;
  kcu_tensor in[2], out;
  void **w; /* the copies */
  int copies;
  void *ws;
  size_t ws_size;
} linear_bench;

static double linear_us(linear_bench *b) {
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  cudaError_t rc = cudaStreamBeginCapture(b->s, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < b->copies && rc == cudaSuccess; i++) {
    b->in[1].data = b->w[i];
    rc = kcu_gemm_run(&b->g, b->lt, b->s, b->in, 2, &b->out, b->ws, b->ws_size, NULL);
  }
  cudaError_t end = cudaStreamEndCapture(b->s, &graph);
  rc = rc == cudaSuccess ? end : rc;
  if (rc == cudaSuccess) rc = cudaGraphInstantiate(&exec, graph, 0);
  double best = -1.0;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int r = 0; r < 4 && rc == cudaSuccess; r++) { /* the first a warm-up */
    float ms = 0.0f;
    cudaEventRecord(e0, b->s);
    rc = cudaGraphLaunch(exec, b->s);
    cudaEventRecord(e1, b->s);
    if (rc == cudaSuccess) rc = cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    double us = 1000.0 * ms / b->copies;
    if (r > 0 && (best < 0.0 || us < best)) best = us;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (rc != cudaSuccess) {
    fprintf(stderr, "time-linear: %s\n", cudaGetErrorString(rc));
    cudaGetLastError();
    return -1.0;
  }
  return best;
}

/* The device-to-device copy rate in bytes a microsecond (read + write), the fastest of 5
 * copies of 512 MiB. */
static double copy_rate(cudaStream_t s) {
  const size_t bytes = (size_t)512 << 20;
  void *a = NULL, *c = NULL;
  if (!cuda_ok(cudaMalloc(&a, bytes), "cudaMalloc") || !cuda_ok(cudaMalloc(&c, bytes), "cudaMalloc"))
    die("device");
  cudaMemset(a, 1, bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  double best = 0.0;
  for (int r = 0; r < 6; r++) {
    float ms = 0.0f;
    cudaEventRecord(e0, s);
    cudaMemcpyAsync(c, a, bytes, cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    double rate = 2.0 * (double)bytes / (1000.0 * ms);
    if (r > 0 && rate > best) best = rate;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(c);
  return best;
}

static void time_linear_shape(const char *label, int64_t M, int64_t N, int64_t K,
                              kiln_activation act, kiln_dtype dt, double rate) {
  int glu = act == KILN_ACT_SWIGLU;
  int64_t rows = glu ? 2 * N : N;
  prog *p = p_new();
  uint32_t x = IN(p, dt, 2, M, K), w = p_weight(p, dt, 2, DIMS(rows, K), -0.1, 0.1);
  uint32_t y = OUT(p, dt, 2, M, N);
  p_op(p, KILN_OP_LINEAR, 2, OPS(x, w), y, 1, ATTR(act), 0);
  kiln_plan pl;
  p_plan(p, &pl);
  linear_bench b;
  memset(&b, 0, sizeof b);
  size_t es = kiln_dtype_size(dt), w_bytes = (size_t)(rows * K) * es;
  b.copies = (int)(((size_t)256 << 20) / w_bytes) + 1;
  if (b.copies < 4) b.copies = 4;
  if (b.copies > 64) b.copies = 64;
  if (!(b.w = calloc((size_t)b.copies, sizeof *b.w))) die("out of memory");
  void *host = malloc(w_bytes > (size_t)(M * K) * es ? w_bytes : (size_t)(M * K) * es);
  if (!host) die("out of memory");
  fill(host, dt, (uint64_t)(rows * K), -0.1, 0.1);
  for (int i = 0; i < b.copies; i++) {
    if (!cuda_ok(cudaMalloc(&b.w[i], w_bytes), "cudaMalloc")) die("device");
    cudaMemcpy(b.w[i], host, w_bytes, cudaMemcpyHostToDevice);
  }
  const int64_t dims[3][2] = {{M, K}, {rows, K}, {M, N}};
  kcu_tensor *ts[3] = {&b.in[0], &b.in[1], &b.out};
  for (int i = 0; i < 3; i++) {
    ts[i]->dtype = dt;
    ts[i]->rank = 2;
    ts[i]->dims[0] = dims[i][0], ts[i]->dims[1] = dims[i][1];
    ts[i]->numel = dims[i][0] * dims[i][1];
  }
  void *y_ref = NULL;
  if (!cuda_ok(cudaMalloc(&b.in[0].data, (size_t)(M * K) * es), "cudaMalloc") ||
      !cuda_ok(cudaMalloc(&b.out.data, (size_t)(M * N) * es), "cudaMalloc") ||
      !cuda_ok(cudaMalloc(&y_ref, (size_t)(M * N) * es), "cudaMalloc"))
    die("device");
  fill(host, dt, (uint64_t)(M * K), -1, 1);
  cudaMemcpy(b.in[0].data, host, (size_t)(M * K) * es, cudaMemcpyHostToDevice);
  free(host);
  cudaStreamCreateWithFlags(&b.s, cudaStreamNonBlocking);
  b.ws_size = (size_t)32 << 20;
  kiln_error err;
  if (cublasLtCreate(&b.lt) != CUBLAS_STATUS_SUCCESS || !cuda_ok(cudaMalloc(&b.ws, b.ws_size), "cudaMalloc") ||
      kcu_gemm_init(&b.g, b.lt, &pl, 0, 0, b.ws_size, &err) != KILN_OK)
    die("time-linear: init");
  if (b.g.scratch_bytes && !cuda_ok(cudaMalloc(&b.g.scratch, b.g.scratch_bytes), "cudaMalloc"))
    die("device");
  /* cuBLASLt at each candidate (its output the reference), then the GEMV at each spread */
  double lt = -1.0;
  int lt_best = -1;
  b.g.gemv = 0;
  cublasLtMatmulAlgo_t kept = b.g.algo;
  for (int c = 0; c < b.g.n_candidates; c++) {
    b.g.algo = b.g.candidates[c];
    double us = linear_us(&b);
    if (us > 0.0 && (lt < 0.0 || us < lt)) lt = us, lt_best = c, kept = b.g.algo;
  }
  b.g.algo = kept;
  if (lt > 0.0) {
    b.in[1].data = b.w[0];
    kcu_gemm_run(&b.g, b.lt, b.s, b.in, 2, &b.out, b.ws, b.ws_size, NULL);
    cudaMemcpyAsync(y_ref, b.out.data, (size_t)(M * N) * es, cudaMemcpyDeviceToDevice, b.s);
    cudaStreamSynchronize(b.s);
  }
  double gemv = -1.0, e = 0.0;
  int gemv_best = -1;
  for (int spread = 0; spread < KCU_GEMV_SPREADS; spread++) {
    b.g.gemv = 1 + spread;
    double us = linear_us(&b);
    if (us > 0.0 && (gemv < 0.0 || us < gemv)) gemv = us, gemv_best = spread;
    if (lt > 0.0 && spread == 0) {
      cudaStreamSynchronize(b.s);
      e = device_rel_error(b.out.data, y_ref, dt, (uint64_t)(M * N));
    }
  }
  double floor_us = (double)w_bytes / rate;
  printf("time-linear %-11s M %2lld N %5lld K %5lld %-4s floor %6.2f us  cublasLt %7.2f (%.2fx, #%d)  "
         "gemv %s %7.2f (%.2fx, spread %d, tile %2d)  agree %.1e\n",
         label, (long long)M, (long long)N, (long long)K, kiln_dtype_name(dt), floor_us, lt,
         lt / floor_us, lt_best, kcu_gemv_tensor_cores(M, dt) ? "tensor cores" : "cuda cores  ",
         gemv, gemv / floor_us, gemv_best, kcu_gemv_tile(rows, M, dt, gemv_best), e);
  CHECK(lt > 0.0 && gemv > 0.0 && e <= dtype_tolerance(dt));
  kcu_gemm_release(&b.g);
  cudaFree(b.g.scratch);
  cublasLtDestroy(b.lt);
  cudaFree(b.ws);
  for (int i = 0; i < b.copies; i++) cudaFree(b.w[i]);
  free(b.w);
  cudaFree(b.in[0].data);
  cudaFree(b.out.data);
  cudaFree(y_ref);
  cudaStreamDestroy(b.s);
  p_free(p);
}

static int time_linear(const char *only) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  double rate = copy_rate(s);
  cudaStreamDestroy(s);
  printf("time-linear copy rate %.0f GB/s (read + write)\n", rate / 1000.0);
  static const struct {
    const char *label;
    int64_t N, K;
    kiln_activation act;
  } shapes[] = {
      {"qkv-2048", 3072, 2048, KILN_ACT_NONE},  {"o-2048", 2048, 2048, KILN_ACT_NONE},
      {"swiglu-2048", 8192, 2048, KILN_ACT_SWIGLU}, {"down-2048", 2048, 8192, KILN_ACT_NONE},
      {"qkv-4096", 6144, 4096, KILN_ACT_NONE},  {"o-4096", 4096, 4096, KILN_ACT_NONE},
      {"swiglu-4096", 14336, 4096, KILN_ACT_SWIGLU}, {"down-4096", 4096, 14336, KILN_ACT_NONE},
      {"mlp-gelu", 4096, 4096, KILN_ACT_GELU_ERF},
  };
  static const int64_t ms[5] = {1, 2, 4, 8, 16};
  for (int t = 1; t < 3; t++)
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
      for (int m = 0; m < 5 && (!only || strstr(shapes[i].label, only)); m++)
        time_linear_shape(shapes[i].label, ms[m], shapes[i].N, shapes[i].K, shapes[i].act,
                          float_types[t], rate);
  return check_report("test_cuda_ops --time-linear");
}

/* A small program used by the residency and failure tests: out = relu(x @ w^T + b) + x. */
static prog *small_prog(void) {
  prog *p = p_new();
  uint32_t x = IN(p, KILN_F32, 2, 8, 64);
  uint32_t w = p_weight(p, KILN_F32, 2, DIMS(64, 64), -0.2, 0.2);
  uint32_t b = p_weight(p, KILN_F32, 1, DIMS(64), -1, 1);
  uint32_t h = MID(p, KILN_F32, 2, 8, 64);
  p_op(p, KILN_OP_LINEAR, 3, OPS(x, w, b), h, 1, ATTR(KILN_ACT_RELU), 0);
  p_op(p, KILN_OP_ADD, 2, OPS(h, x), OUT(p, KILN_F32, 2, 8, 64), 0, NULL, 1.0);
  return p;
}

/* Runs the small program on engine e with host buffers and checks it against the CPU. */
static int small_run_ok(kiln_engine *e, const prog *p) {
  float x[8 * 64], want[8 * 64], got[8 * 64];
  fill(x, KILN_F32, 8 * 64, -1, 1);
  kiln_error err;
  kiln_engine *cpu = p_load(p, &kiln_cpu_backend, 0, &err);
  void *in[1] = {x}, *wo[1] = {want}, *go[1] = {got};
  int ok = cpu && p_execute(cpu, p, in, wo, &err) == KILN_OK;
  p_unload(cpu);
  kiln_status st = p_execute(e, p, in, go, &err);
  if (st != KILN_OK) fprintf(stderr, "small run: %s\n", err.message);
  return ok && st == KILN_OK && rel_error(got, want, KILN_F32, 8 * 64) <= 1e-4;
}

/* A linear written at a padded pitch, its output bound in place at a new address each run: the
 * graph follows the address (one update per run, no op-by-op run) and the rows are right. */
static void test_padded_pitch_bound(void) {
  prog *p = p_new();
  uint32_t x = IN(p, KILN_F16, 2, 8, 64);
  uint32_t w = p_weight(p, KILN_F16, 2, DIMS(1001, 64), -0.2, 0.2);
  p_op(p, KILN_OP_LINEAR, 2, OPS(x, w), OUT(p, KILN_F16, 2, 8, 1001), 1, ATTR(0), 0);
  kiln_error err;
  kiln_engine *e = p_load(p, &kiln_cuda_backend, 0, &err);
  kiln_engine *cpu = p_load(p, &kiln_cpu_backend, 0, &err);
  static uint16_t hx[8 * 64], want[8 * 1001], got[8 * 1001];
  fill(hx, KILN_F16, 8 * 64, -1, 1);
  void *in[1] = {hx}, *wo[1] = {want};
  CHECK(e && cpu && p_execute(cpu, p, in, wo, &err) == KILN_OK);
  void *dx = NULL, *dy[2] = {NULL, NULL};
  cudaMalloc(&dx, sizeof hx);
  cudaMalloc(&dy[0], sizeof got);
  cudaMalloc(&dy[1], sizeof got);
  cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice);
  kiln_cuda_stats s0, s1;
  int ok = e != NULL && kiln_cuda_engine_stats(e, &s0, &err) == KILN_OK;
  for (int r = 0; ok && r < 4; r++) {
    void *din[1] = {dx}, *dout[1] = {dy[r % 2]};
    cudaMemset(dy[r % 2], 0, sizeof got);
    ok = p_execute(e, p, din, dout, &err) == KILN_OK &&
         cudaMemcpy(got, dy[r % 2], sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess &&
         rel_error(got, want, KILN_F16, 8 * 1001) <= dtype_tolerance(KILN_F16);
  }
  ok = ok && kiln_cuda_engine_stats(e, &s1, &err) == KILN_OK;
  printf("padded pitch, output bound at two addresses in turn, 4 runs: graph updates %llu, "
         "replays %llu, op-by-op runs %llu\n",
         (unsigned long long)(s1.graph_updates - s0.graph_updates),
         (unsigned long long)(s1.graph_replays - s0.graph_replays),
         (unsigned long long)(s1.direct_runs - s0.direct_runs));
  CHECK(ok && s1.graph_updates - s0.graph_updates == 4 &&
        s1.graph_replays - s0.graph_replays == 4 && s1.direct_runs == s0.direct_runs);
  cudaFree(dx);
  cudaFree(dy[0]);
  cudaFree(dy[1]);
  p_unload(e);
  p_unload(cpu);
  p_free(p);
}

static void test_residency(void) {
  kiln_error err;
  prog *p = small_prog();
  kiln_engine *e = p_load(p, &kiln_cuda_backend, 0, &err);
  CHECK(e != NULL);
  if (!e) return;
  kiln_cuda_stats s0, s1, s2, s3;
  kiln_cuda_engine_stats(e, &s0, &err);
  CHECK(small_run_ok(e, p)); /* host buffers: staged */
  kiln_cuda_engine_stats(e, &s1, &err);
  CHECK(s1.staged - s0.staged == 2 && s1.bound == s0.bound);
  printf("host buffers: staged %llu, bound %llu\n", (unsigned long long)(s1.staged - s0.staged),
         (unsigned long long)(s1.bound - s0.bound));

  float *dx, *dy, hx[8 * 64], hy[8 * 64];
  cudaMalloc((void **)&dx, sizeof hx);
  cudaMalloc((void **)&dy, sizeof hy);
  fill(hx, KILN_F32, 8 * 64, -1, 1);
  cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice);
  void *din[1] = {dx}, *dout[1] = {dy};
  CHECK(p_execute(e, p, din, dout, &err) == KILN_OK);
  CHECK(p_execute(e, p, din, dout, &err) == KILN_OK);
  kiln_cuda_engine_stats(e, &s2, &err);
  printf("device buffers, two runs: staged %llu, bound %llu, graph updates %llu, replays %llu\n",
         (unsigned long long)(s2.staged - s1.staged), (unsigned long long)(s2.bound - s1.bound),
         (unsigned long long)(s2.graph_updates - s1.graph_updates),
         (unsigned long long)(s2.graph_replays - s1.graph_replays));
  CHECK(s2.staged == s1.staged && s2.bound - s1.bound == 4);
  CHECK(s2.graph_updates - s1.graph_updates == 1 && s2.graph_replays - s1.graph_replays == 2);

  /* The CPU reference engine refuses device memory (what a CUDA tensor passed through
   * ExecuTorch's Python runtime becomes) rather than read it as host memory. */
  kiln_engine *cpu = p_load(p, &kiln_cpu_backend, 0, &err);
  kiln_status cpu_st = cpu ? p_execute(cpu, p, din, dout, &err) : KILN_ERR_INTERNAL;
  printf("device buffers on the CPU engine: %s: %s\n", kiln_status_name(cpu_st), err.message);
  CHECK(cpu_st == KILN_ERR_INVALID_ARGUMENT && strstr(err.message, "is memory of cuda:0") != NULL);
  p_unload(cpu);

  /* An unaligned device buffer is usable but copied once into aligned engine memory. */
  float *dx2;
  cudaMalloc((void **)&dx2, sizeof hx + 16);
  cudaMemcpy((char *)dx2 + 4, hx, sizeof hx, cudaMemcpyHostToDevice);
  void *uin[1] = {(char *)dx2 + 4};
  CHECK(p_execute(e, p, uin, dout, &err) == KILN_OK);
  kiln_cuda_engine_stats(e, &s3, &err);
  CHECK(s3.staged - s2.staged == 1 && s3.bound - s2.bound == 1);
  cudaMemcpy(hy, dy, sizeof hy, cudaMemcpyDeviceToHost);
  float ref[8 * 64];
  void *hin[1] = {hx}, *hout[1] = {ref};
  CHECK(p_execute(e, p, hin, hout, &err) == KILN_OK);
  CHECK(memcmp(ref, hy, sizeof hy) == 0);

  /* Memory the device cannot reach: a virtual range reserved and backed on this device but
   * never granted access (cuMemSetAccess), which is what another card's memory is before
   * the caller enables peer access. */
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  int vmm = cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
            cuMemAddressReserve(&va, gran, 0, 0, 0) == CUDA_SUCCESS &&
            cuMemCreate(&h, gran, &prop, 0) == CUDA_SUCCESS && cuMemMap(va, gran, 0, h, 0) == CUDA_SUCCESS;
  CHECK(vmm);
  if (vmm) {
    void *vin[1] = {(void *)(uintptr_t)va};
    kiln_status st = p_execute(e, p, vin, dout, &err);
    printf("unmapped device range: %s: %s\n", kiln_status_name(st), err.message);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT);
    CHECK(small_run_ok(e, p)); /* the process and the engine are still usable */
    cuMemUnmap(va, gran);
    cuMemRelease(h);
    cuMemAddressFree(va, gran);
  }

  /* execute allocates nothing: with every allocation failing, runs still succeed, and the
   * device's free memory is the same after many runs on both paths. */
  size_t free0 = 0, free1 = 0, total = 0;
  cudaMemGetInfo(&free0, &total);
  kiln_cuda_fail_allocations_after(0);
  int all_ok = 1;
  for (int i = 0; i < 50; i++) {
    all_ok &= small_run_ok(e, p);
    float *alt = i % 2 ? dx : dx2; /* alternate addresses: graph updates each time */
    void *ain[1] = {alt};
    all_ok &= p_execute(e, p, ain, dout, &err) == KILN_OK;
  }
  kiln_engine *refused = p_load(p, &kiln_cuda_backend, 0, &err);
  CHECK(refused == NULL && err.status == KILN_ERR_OUT_OF_MEMORY); /* the hook does fail init */
  kiln_cuda_fail_allocations_after(-1);
  cudaMemGetInfo(&free1, &total);
  CHECK(all_ok);
  CHECK(free0 == free1);
  printf("100 runs with allocation failure injected: %s; device free memory %s\n",
         all_ok ? "all ok" : "FAILED", free0 == free1 ? "unchanged" : "CHANGED");
  cudaFree(dx);
  cudaFree(dx2);
  cudaFree(dy);
  p_unload(e);
  p_free(p);
}

/* Host buffers larger than the staging ring and of odd sizes move through it in chunks and
 * arrive whole: out0 = x + x with x 12,000,036 bytes (5.7 ring slots, not a multiple of 256),
 * out1 = y + y with y 7 halves; on host, device and mixed buffers, and with every allocation
 * failing (execute allocates nothing). */
static void test_chunked_staging(void) {
  kiln_error err;
  prog *p = p_new();
  uint32_t x = IN(p, KILN_F32, 2, 3, 1000003);
  uint32_t y = IN(p, KILN_F16, 1, 7);
  p_op(p, KILN_OP_ADD, 2, OPS(x, x), OUT(p, KILN_F32, 2, 3, 1000003), 0, NULL, 1.0);
  p_op(p, KILN_OP_ADD, 2, OPS(y, y), OUT(p, KILN_F16, 1, 7), 0, NULL, 1.0);
  const size_t nx = 3 * 1000003 * sizeof(float), ny = 7 * 2;
  kiln_engine *e = p_load(p, &kiln_cuda_backend, 0, &err);
  kiln_engine *cpu = p_load(p, &kiln_cpu_backend, 0, &err);
  CHECK(e && cpu);
  kiln_cuda_stats init;
  size_t slot = 0, chunk = 1;
  if (e && kiln_cuda_engine_stats(e, &init, &err) == KILN_OK) {
    kiln_stage_ring ring; /* the engine's chunk for a transfer of nx bytes */
    kiln_stage_ring_init(&ring, NULL, (size_t)init.stage_slot_bytes, KCU_STAGE_SLOTS, 0);
    slot = ring.slot_bytes;
    chunk = kiln_stage_chunk_bytes(&ring, nx);
  }
  const unsigned long long x_chunks = (nx + chunk - 1) / chunk, per_run = 2 * x_chunks + 2;
  float *hx = malloc(nx), *want = malloc(nx), *got = malloc(nx);
  uint16_t hy[7], want_y[7], got_y[7];
  void *dx = NULL, *dout = NULL;
  CHECK(cuda_ok(cudaMalloc(&dx, nx), "cudaMalloc") && cuda_ok(cudaMalloc(&dout, nx), "cudaMalloc"));
  if (!e || !cpu || !hx || !want || !got || !dx || !dout) goto done;
  fill(hx, KILN_F32, nx / 4, -1, 1);
  fill(hy, KILN_F16, 7, -1, 1);
  cudaMemcpy(dx, hx, nx, cudaMemcpyHostToDevice);
  void *in[2] = {hx, hy}, *wo[2] = {want, want_y};
  CHECK(p_execute(cpu, p, in, wo, &err) == KILN_OK);
  /* Four ways in: all host, twice (the ring's slots turn over), device x, device out0. */
  void *ins[4][2] = {{hx, hy}, {hx, hy}, {dx, hy}, {hx, hy}};
  for (int way = 0; way < 4; way++) {
    void *outs[2] = {way == 3 ? dout : (void *)got, got_y};
    memset(got, 0xff, nx);
    memset(got_y, 0xff, ny);
    cudaMemset(dout, 0xff, nx);
    kiln_cuda_stats a, b;
    kiln_cuda_engine_stats(e, &a, &err);
    kiln_status st = p_execute(e, p, ins[way], outs, &err);
    if (st != KILN_OK) fprintf(stderr, "chunked staging, way %d: %s\n", way, err.message);
    CHECK(st == KILN_OK);
    kiln_cuda_engine_stats(e, &b, &err);
    if (way == 3) cudaMemcpy(got, dout, nx, cudaMemcpyDeviceToHost);
    unsigned long long chunks = b.stage_chunks - a.stage_chunks;
    unsigned long long expect = way < 2 ? per_run : per_run - x_chunks;
    int same = memcmp(got, want, nx) == 0 && memcmp(got_y, want_y, ny) == 0;
    printf("chunked staging, way %d: %llu chunks of at most %zu bytes (slot %zu; expected %llu), "
           "outputs %s\n", way, chunks, chunk, slot, expect, same ? "equal to the CPU engine's" : "DIFFER");
    CHECK(same && chunks == expect);
  }
  size_t free0 = 0, free1 = 0, total = 0;
  cudaMemGetInfo(&free0, &total);
  kiln_cuda_fail_allocations_after(0);
  int all_ok = 1;
  for (int i = 0; i < 5; i++) {
    void *outs[2] = {got, got_y};
    all_ok &= p_execute(e, p, in, outs, &err) == KILN_OK && memcmp(got, want, nx) == 0;
  }
  kiln_cuda_fail_allocations_after(-1);
  cudaMemGetInfo(&free1, &total);
  printf("chunked staging with allocation failure injected: %s; device free memory %s\n",
         all_ok ? "all ok" : "FAILED", free0 == free1 ? "unchanged" : "CHANGED");
  CHECK(all_ok && free0 == free1);
done:
  free(hx);
  free(want);
  free(got);
  cudaFree(dx);
  cudaFree(dout);
  p_unload(e);
  p_unload(cpu);
  p_free(p);
}

/* Refusals: a plan whose shapes disagree is refused at init (never a device fault), and an
 * index out of its table is reported after the run, leaving the engine usable. */
static void test_refusals(void) {
  kiln_error err;
  prog *p = p_new(); /* linear whose weight has the wrong K */
  uint32_t x = IN(p, KILN_F32, 2, 4, 32);
  uint32_t w = p_weight(p, KILN_F32, 2, DIMS(16, 31), -1, 1);
  p_op(p, KILN_OP_LINEAR, 2, OPS(x, w), OUT(p, KILN_F32, 2, 4, 16), 1, ATTR(0), 0);
  kiln_engine *e = p_load(p, &kiln_cuda_backend, 0, &err);
  printf("linear with K 32 vs 31: %s: %s\n", kiln_status_name(err.status), err.message);
  CHECK(e == NULL && err.status == KILN_ERR_INVALID_PROGRAM && strstr(err.message, "op 0 (linear)"));
  p_unload(e);
  p_free(p);

  p = p_new(); /* slice reaching past its input */
  x = IN(p, KILN_F32, 2, 4, 10);
  p_op(p, KILN_OP_SLICE, 1, OPS(x), OUT(p, KILN_F32, 2, 4, 6), 4, ATTR(1, 5, 11, 1), 0);
  e = p_load(p, &kiln_cuda_backend, 0, &err);
  printf("slice past the end: %s: %s\n", kiln_status_name(err.status), err.message);
  CHECK(e == NULL && err.status == KILN_ERR_INVALID_PROGRAM);
  p_unload(e);
  p_free(p);

  /* A transposed convolution whose output padding reaches the stride (PyTorch allows it below
   * the dilation): cuDNN's backward data cannot size it, so the CUDA engine refuses it. */
  p = p_new();
  x = IN(p, KILN_F32, 4, 1, 2, 4, 4);
  w = IN(p, KILN_F32, 4, 2, 2, 3, 3);
  p_op(p, KILN_OP_CONV_TRANSPOSE, 2, OPS(x, w), OUT(p, KILN_F32, 4, 1, 2, 9, 9), 6,
       ATTR(KILN_PAIR(1, 1), KILN_PAIR(0, 0), KILN_PAIR(2, 2), 1, 0, KILN_PAIR(1, 1)), 0);
  e = p_load(p, &kiln_cpu_backend, 0, &err);
  CHECK(e != NULL);
  p_unload(e);
  e = p_load(p, &kiln_cuda_backend, 0, &err);
  printf("conv_transpose output padding 1, stride 1: %s: %s\n", kiln_status_name(err.status), err.message);
  CHECK(e == NULL && err.status == KILN_ERR_UNSUPPORTED && strstr(err.message, "not below the stride"));
  p_unload(e);
  p_free(p);

  p = p_new(); /* a pool whose output is not what its window gives */
  x = IN(p, KILN_F16, 4, 1, 8, 8, 16);
  p_op(p, KILN_OP_AVG_POOL2D, 1, OPS(x), OUT(p, KILN_F16, 4, 1, 4, 4, 8), 7,
       ATTR(KILN_PAIR(2, 2), KILN_PAIR(2, 2), KILN_PAIR(0, 0), 0, 1, 0, 1), 0);
  e = p_load(p, &kiln_cuda_backend, 0, &err);
  printf("avg_pool2d output of the wrong shape: %s: %s\n", kiln_status_name(err.status), err.message);
  CHECK(e == NULL && err.status == KILN_ERR_INVALID_PROGRAM && strstr(err.message, "op 0 (avg_pool2d)"));
  p_unload(e);
  p_free(p);

  p = p_new(); /* a logical not given two inputs */
  x = IN(p, KILN_BOOL, 2, 4, 10);
  p_op(p, KILN_OP_LOGICAL, 2, OPS(x, x), OUT(p, KILN_BOOL, 2, 4, 10), 1, ATTR(KILN_BOOL_NOT), 0);
  e = p_load(p, &kiln_cuda_backend, 0, &err);
  printf("logical not of two inputs: %s: %s\n", kiln_status_name(err.status), err.message);
  CHECK(e == NULL && err.status == KILN_ERR_INVALID_PROGRAM && strstr(err.message, "op 0 (logical)"));
  p_unload(e);
  p_free(p);

  p = p_new(); /* a comparison into f32 */
  x = IN(p, KILN_F32, 2, 4, 10);
  p_op(p, KILN_OP_COMPARE, 2, OPS(x, x), OUT(p, KILN_F32, 2, 4, 10), 1, ATTR(KILN_CMP_LT), 0);
  e = p_load(p, &kiln_cuda_backend, 0, &err);
  printf("compare into f32: %s: %s\n", kiln_status_name(err.status), err.message);
  CHECK(e == NULL && err.status == KILN_ERR_INVALID_PROGRAM && strstr(err.message, "op 0 (compare)"));
  p_unload(e);
  p_free(p);

  p = p_new(); /* a binary op whose input does not broadcast */
  x = IN(p, KILN_F32, 2, 4, 10);
  uint32_t y = IN(p, KILN_F32, 1, 9);
  p_op(p, KILN_OP_ADD, 2, OPS(x, y), OUT(p, KILN_F32, 2, 4, 10), 0, NULL, 1.0);
  e = p_load(p, &kiln_cuda_backend, 0, &err);
  printf("add [4,10] + [9]: %s: %s\n", kiln_status_name(err.status), err.message);
  CHECK(e == NULL && err.status == KILN_ERR_INVALID_PROGRAM);
  p_unload(e);
  p_free(p);

  p = p_new(); /* gather whose indices are wider than x along a dim not gathered */
  x = IN(p, KILN_F32, 2, 4, 6);
  uint32_t wide = IN(p, KILN_I64, 2, 4, 7);
  p_op(p, KILN_OP_GATHER, 2, OPS(x, wide), OUT(p, KILN_F32, 2, 4, 7), 1, ATTR(0), 0);
  e = p_load(p, &kiln_cuda_backend, 0, &err);
  printf("gather [4,7] from [4,6] along 0: %s: %s\n", kiln_status_name(err.status), err.message);
  CHECK(e == NULL && err.status == KILN_ERR_INVALID_PROGRAM && strstr(err.message, "op 0 (gather)"));
  p_unload(e);
  p_free(p);

  p = p_new(); /* index whose output ignores where the broadcast index shape goes */
  x = IN(p, KILN_F32, 3, 2, 3, 4);
  uint32_t picks = IN(p, KILN_I64, 1, 5);
  p_op(p, KILN_OP_INDEX, 2, OPS(x, picks), OUT(p, KILN_F32, 3, 5, 2, 4), 1, ATTR(2), 0);
  e = p_load(p, &kiln_cuda_backend, 0, &err);
  printf("index dim 1 into [5,2,4]: %s: %s\n", kiln_status_name(err.status), err.message);
  CHECK(e == NULL && err.status == KILN_ERR_INVALID_PROGRAM && strstr(err.message, "op 0 (index)"));
  p_unload(e);
  p_free(p);

  p = p_new(); /* embedding index out of range */
  w = p_weight(p, KILN_F32, 2, DIMS(10, 8), -1, 1);
  uint32_t idx = IN(p, KILN_I64, 1, 3);
  p_op(p, KILN_OP_EMBEDDING, 2, OPS(w, idx), OUT(p, KILN_F32, 2, 3, 8), 0, NULL, 0);
  e = p_load(p, &kiln_cuda_backend, 0, &err);
  CHECK(e != NULL);
  if (e) {
    int64_t bad[3] = {1, 10, 2}, good[3] = {1, 9, 2};
    float out[24];
    void *in[1] = {bad}, *outs[1] = {out};
    kiln_status st = p_execute(e, p, in, outs, &err);
    printf("embedding index 10 of 10 rows: %s: %s\n", kiln_status_name(st), err.message);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT);
    in[0] = good;
    CHECK(p_execute(e, p, in, outs, &err) == KILN_OK); /* the flag was reset: usable again */
  }
  p_unload(e);
  p_free(p);

  p = p_new(); /* gather and index with an index out of range, in one plan */
  x = IN(p, KILN_F32, 2, 4, 6);
  uint32_t gi = IN(p, KILN_I64, 2, 4, 3), ii = IN(p, KILN_I32, 1, 5);
  p_op(p, KILN_OP_GATHER, 2, OPS(x, gi), OUT(p, KILN_F32, 2, 4, 3), 1, ATTR(1), 0);
  p_op(p, KILN_OP_INDEX, 2, OPS(x, ii), OUT(p, KILN_F32, 2, 5, 6), 1, ATTR(1), 0);
  e = p_load(p, &kiln_cuda_backend, 0, &err);
  CHECK(e != NULL);
  if (e) {
    float xs[24], g_out[12], i_out[30];
    int64_t cols[12] = {0};
    int32_t rows[5] = {3, -4, 0, 1, 2};
    for (int k = 0; k < 24; k++) xs[k] = (float)k + 1.0f;
    void *in[3] = {xs, cols, rows}, *outs[2] = {g_out, i_out};
    CHECK(p_execute(e, p, in, outs, &err) == KILN_OK);
    CHECK(g_out[0] == 1.0f && i_out[0] == 19.0f && i_out[6] == 1.0f);
    cols[5] = 6;
    kiln_status st = p_execute(e, p, in, outs, &err);
    printf("gather index 6 of 6: %s: %s\n", kiln_status_name(st), err.message);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT && strstr(err.message, "gather or index"));
    CHECK(g_out[5] == 0.0f && g_out[4] == 7.0f); /* the bad element is zero, the rest right */
    cols[5] = 0;
    rows[1] = -5;
    st = p_execute(e, p, in, outs, &err);
    printf("index -5 of 4 rows: %s: %s\n", kiln_status_name(st), err.message);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT);
    CHECK(i_out[6] == 0.0f && i_out[11] == 0.0f && i_out[12] == 1.0f);
    rows[1] = -4;
    CHECK(p_execute(e, p, in, outs, &err) == KILN_OK);
    CHECK(i_out[6] == 1.0f);
  }
  p_unload(e);
  p_free(p);
}

/* A dynamic MLP x[s,K] -> linear+GELU -> softmax -> linear -> matmul, s in 1..max. */
static void *dynamic_mlp(kiln_dtype dt, int64_t K, int64_t max, size_t *size) {
  kiln_builder *b = kiln_builder_create();
  kiln_error err = {KILN_OK, ""};
  kiln_sym_size s = {1, 1, 0};
  void *blob = NULL;
  int64_t H = 96, O = 32, Z = 16;
  size_t es = kiln_dtype_size(dt);
  void *w1 = malloc((size_t)(H * K) * es), *b1 = malloc((size_t)H * es);
  void *w2 = malloc((size_t)(O * H) * es), *w3 = malloc((size_t)(O * Z) * es);
  fill(w1, dt, (uint64_t)(H * K), -0.2, 0.2);
  fill(b1, dt, (uint64_t)H, -0.5, 0.5);
  fill(w2, dt, (uint64_t)(O * H), -1, 1);
  fill(w3, dt, (uint64_t)(O * Z), -1, 1);
  CHECK(kiln_builder_add_symbol(b, "batch", 1, max, &err) == 1);
  int32_t x = kiln_builder_add_input_sym(b, "x", dt, 2, DIMS(max, K),
                                         (kiln_sym_size[]){s, {0, 0, 0}}, &err);
  int32_t W1 = kiln_builder_add_constant(b, dt, 2, DIMS(H, K), w1, (size_t)(H * K) * es, &err);
  int32_t B1 = kiln_builder_add_constant(b, dt, 1, DIMS(H), b1, (size_t)H * es, &err);
  int32_t W2 = kiln_builder_add_constant(b, dt, 2, DIMS(O, H), w2, (size_t)(O * H) * es, &err);
  int32_t W3 = kiln_builder_add_constant(b, dt, 2, DIMS(O, Z), w3, (size_t)(O * Z) * es, &err);
  int32_t h = kiln_builder_add_op(b, KILN_OP_LINEAR, (int32_t[]){x, W1, B1}, 3,
                                  ATTR(KILN_ACT_GELU_TANH), 1, NULL, 0, &err);
  int32_t sm = kiln_builder_add_op(b, KILN_OP_SOFTMAX, &h, 1, ATTR(1), 1, NULL, 0, &err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_LINEAR, (int32_t[]){sm, W2}, 2, ATTR(0), 1, NULL, 0, &err);
  int32_t z = kiln_builder_add_op(b, KILN_OP_MATMUL, (int32_t[]){y, W3}, 2, NULL, 0, NULL, 0, &err);
  CHECK(z >= 0);
  if (z < 0) fprintf(stderr, "dynamic mlp: %s\n", err.message);
  CHECK(kiln_builder_mark_output(b, y, "y", &err) == KILN_OK);
  CHECK(kiln_builder_mark_output(b, z, "z", &err) == KILN_OK);
  kiln_build_options opts;
  kiln_build_options_default(&opts);
  opts.fuse = 1;
  if (kiln_builder_build(b, &opts, &blob, size, &err) != KILN_OK) {
    fprintf(stderr, "dynamic mlp build: %s\n", err.message);
    blob = NULL;
  }
  kiln_builder_destroy(b);
  free(w1), free(b1), free(w2), free(w3);
  return blob;
}

static kiln_engine *load_on(const void *blob, size_t size, kiln_device_kind kind) {
  kiln_engine_options opts;
  kiln_error err = {KILN_OK, ""};
  kiln_engine *e = NULL;
  kiln_engine_options_default(&opts);
  opts.device = kind;
  if (kiln_engine_load(blob, size, &opts, &e, &err) != KILN_OK)
    fprintf(stderr, "dynamic plan load on %s: %s\n", kind == KILN_DEVICE_CPU ? "cpu" : "cuda",
            err.message);
  return e;
}

/* One call at batch n on cpu and gpu (gpu buffers host or device), outputs compared; 1 if ok. */
static int dynamic_call(kiln_engine *cpu, kiln_engine *gpu, kiln_dtype dt, int64_t K, int64_t max,
                        int64_t n, int bound, void *dev[3], const char *name) {
  kiln_error err = {KILN_OK, ""};
  size_t es = kiln_dtype_size(dt);
  int64_t cols[2] = {32, 16};
  void *hin = malloc((size_t)(max * K) * es), *cpu_out[2], *gpu_out[2];
  fill(hin, dt, (uint64_t)(n * K), -1, 1);
  kiln_tensor_view in, outs_cpu[2], outs_gpu[2];
  memset(&in, 0, sizeof in);
  in.data = bound ? dev[0] : hin;
  in.dtype = dt;
  in.rank = 2;
  in.sizes[0] = n, in.sizes[1] = K;
  in.strides[0] = K, in.strides[1] = 1;
  in.nbytes = (uint64_t)(n * K) * es;
  if (bound) cudaMemcpy(dev[0], hin, (size_t)in.nbytes, cudaMemcpyHostToDevice);
  for (int o = 0; o < 2; o++) {
    size_t bytes = (size_t)(max * cols[o]) * es;
    cpu_out[o] = malloc(bytes);
    gpu_out[o] = malloc(bytes);
    memset(gpu_out[o], 0xff, bytes);
    if (bound) cudaMemset(dev[1 + o], 0xff, bytes);
    kiln_tensor_view v;
    memset(&v, 0, sizeof v);
    v.dtype = dt;
    v.rank = 2;
    v.sizes[0] = max, v.sizes[1] = cols[o]; /* given at the bound: the call writes n rows */
    v.strides[0] = cols[o], v.strides[1] = 1;
    v.nbytes = bytes;
    v.data = cpu_out[o];
    outs_cpu[o] = v;
    v.data = bound ? dev[1 + o] : gpu_out[o];
    outs_gpu[o] = v;
  }
  kiln_tensor_view in_cpu = in;
  in_cpu.data = hin;
  int ok = kiln_engine_execute(cpu, &in_cpu, 1, outs_cpu, 2, &err) == KILN_OK;
  if (!ok) fprintf(stderr, "%s: cpu run at %lld: %s\n", name, (long long)n, err.message);
  kiln_status st = kiln_engine_execute(gpu, &in, 1, outs_gpu, 2, &err);
  if (st != KILN_OK) fprintf(stderr, "%s: cuda run at %lld: %s\n", name, (long long)n, err.message);
  ok &= st == KILN_OK;
  for (int o = 0; ok && o < 2; o++) {
    int32_t rank = 0;
    int64_t dims[KILN_MAX_RANK];
    ok &= kiln_engine_output_shape(gpu, (uint32_t)o, &rank, dims, &err) == KILN_OK && rank == 2 &&
          dims[0] == n && dims[1] == cols[o];
    if (bound) cudaMemcpy(gpu_out[o], dev[1 + o], (size_t)(max * cols[o]) * es, cudaMemcpyDeviceToHost);
    double e = rel_error(gpu_out[o], cpu_out[o], dt, (uint64_t)(n * cols[o]));
    last_error = fmax(last_error, e);
    ok &= e <= dtype_tolerance(dt);
    /* the rows past this call's size are not written */
    if (n < max) ok &= ((uint8_t *)gpu_out[o])[(size_t)(n * cols[o]) * es] == 0xff;
  }
  free(hin);
  for (int o = 0; o < 2; o++) free(cpu_out[o]), free(gpu_out[o]);
  return ok;
}

/* Allocations of raw CUDA calls like those a replay makes: if CUDA itself allocates, a count of
 * zero cannot be asked of execute. */
static long graph_launch_baseline(void *dev) {
  cudaStream_t st;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  struct cudaPointerAttributes a;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
  cudaMemsetAsync(dev, 0, 64, st);
  cudaStreamEndCapture(st, &graph);
  cudaGraphInstantiate(&exec, graph, 0);
  counting = 1;
  allocations = 0;
  for (int i = 0; i < 8; i++) {
    cudaPointerGetAttributes(&a, dev);
    cudaGraphLaunch(exec, st);
    cudaStreamSynchronize(st);
  }
  counting = 0;
  long n = allocations;
  allocations = 0;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  return n;
}

/* A plan with a bounded dynamic dim on the CUDA engine: every size within bounds equals the CPU
 * engine (host-staged and device-bound), outputs take the call's shape, graph slots are filled
 * on a shape's second call, replayed, and evicted when more shapes come than slots; execute
 * allocates nothing (allocation failure injected; no malloc on a replay); a size past the
 * bound is refused with the front end's message and the program stays usable. */
static void test_dynamic_plan(void) {
  static const int64_t sizes[] = {1, 7, 24, 7, 1, 1, 2, 3, 4, 5, 6, 8, 24, 2, 3, 4, 5, 6, 8, 1, 7, 13, 64, 64};
  const int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
  for (int cfg = 0; cfg < 4; cfg++) {
    kiln_dtype dt = cfg < 3 ? float_types[cfg] : KILN_F32;
    int64_t K = cfg < 3 ? 64 : 4096, max = cfg < 3 ? 24 : 64; /* the last: chunked host I/O */
    char name[64];
    snprintf(name, sizeof name, "dynamic mlp %s K=%lld", kiln_dtype_name(dt), (long long)K);
    size_t size = 0;
    void *blob = dynamic_mlp(dt, K, max, &size);
    kiln_engine *cpu = blob ? load_on(blob, size, KILN_DEVICE_CPU) : NULL;
    kiln_engine *gpu = blob ? load_on(blob, size, KILN_DEVICE_CUDA) : NULL;
    CHECK(cpu && gpu);
    if (!cpu || !gpu) {
      kiln_engine_destroy(cpu);
      kiln_engine_destroy(gpu);
      kiln_free(blob);
      continue;
    }
    void *dev[3];
    size_t es = kiln_dtype_size(dt);
    cudaMalloc(&dev[0], (size_t)(max * K) * es);
    cudaMalloc(&dev[1], (size_t)(max * 32) * es);
    cudaMalloc(&dev[2], (size_t)(max * 16) * es);
    last_error = 0;
    int ok = 1;
    for (int pass = 0; pass < 2; pass++)
      for (int i = 0; i < n_sizes; i++) {
        int64_t n = sizes[i] > max ? max : sizes[i];
        ok &= dynamic_call(cpu, gpu, dt, K, max, n, pass, dev, name);
      }
    kiln_cuda_stats st;
    kiln_error err = {KILN_OK, ""};
    kiln_cuda_engine_stats(gpu, &st, &err);
    printf("%-34s %d sizes staged and bound: rel err %.2e (tol %.0e) %s; %llu eager, %llu "
           "captures, %llu evictions, %llu replays\n",
           name, n_sizes, last_error, dtype_tolerance(dt), ok ? "ok" : "FAIL",
           (unsigned long long)st.direct_runs, (unsigned long long)st.shape_captures,
           (unsigned long long)st.shape_evictions, (unsigned long long)st.graph_replays);
    CHECK(ok);
    CHECK(st.direct_runs > 0 && st.shape_captures > 0 && st.shape_evictions > 0 &&
          st.graph_replays > 0);
    /* No allocation at execute: every size again, eager, captured and evicted, with every
     * allocation of the engine failing; then a decode-like loop at size 1, which replays,
     * calling malloc not once. */
    size_t free0 = 0, free1 = 0, total = 0;
    cudaMemGetInfo(&free0, &total);
    kiln_cuda_fail_allocations_after(0);
    int noalloc = 1;
    for (int i = 0; i < n_sizes; i++)
      noalloc &= dynamic_call(cpu, gpu, dt, K, max, sizes[i] > max ? max : sizes[i], i % 2, dev, name);
    kiln_cuda_fail_allocations_after(-1);
    kiln_cuda_stats before, after;
    kiln_cuda_engine_stats(gpu, &before, &err);
    {
      kiln_tensor_view in, out[2];
      memset(&in, 0, sizeof in);
      memset(out, 0, sizeof out);
      in.data = dev[0], in.dtype = dt, in.rank = 2, in.sizes[0] = 1, in.sizes[1] = K;
      in.strides[0] = K, in.strides[1] = 1, in.nbytes = (uint64_t)K * es;
      for (int o = 0; o < 2; o++) {
        int64_t c = o ? 16 : 32;
        out[o].data = dev[1 + o], out[o].dtype = dt, out[o].rank = 2, out[o].sizes[0] = 1;
        out[o].sizes[1] = c, out[o].strides[0] = c, out[o].strides[1] = 1;
        out[o].nbytes = (uint64_t)c * es;
      }
      for (int w = 0; w < 2; w++) /* seen, then captured (or replayed): the slot is warm */
        noalloc &= kiln_engine_execute(gpu, &in, 1, out, 2, &err) == KILN_OK;
      counting = 1;
      for (int r = 0; r < 8; r++) noalloc &= kiln_engine_execute(gpu, &in, 1, out, 2, &err) == KILN_OK;
      counting = 0;
    }
    kiln_cuda_engine_stats(gpu, &after, &err);
    cudaMemGetInfo(&free1, &total);
    long during = allocations, base = graph_launch_baseline(dev[1]);
    printf("%-34s allocation failure injected over %d sizes, then 8 replays at 1: %s, %ld "
           "mallocs (raw graph launches alike: %ld), %llu replays, init allocations %llu then "
           "%llu; device free memory %s\n",
           name, n_sizes, noalloc ? "all ok" : "FAILED", during, base,
           (unsigned long long)(after.graph_replays - before.graph_replays),
           (unsigned long long)st.init_allocs, (unsigned long long)after.init_allocs,
           free0 == free1 ? "unchanged" : "CHANGED");
    CHECK(noalloc && after.graph_replays - before.graph_replays >= 8);
    CHECK(during == 0 || base > 0);
    CHECK(after.init_allocs == st.init_allocs);
    allocations = 0;
    /* Past the bound: the front end's refusal, nothing run; then the program still runs. */
    {
      kiln_tensor_view in, out[2];
      int64_t n = max + 1;
      void *big = malloc((size_t)(n * K) * es), *o0 = malloc((size_t)(n * 32) * es),
           *o1 = malloc((size_t)(n * 16) * es);
      memset(&in, 0, sizeof in);
      memset(out, 0, sizeof out);
      in.data = big, in.dtype = dt, in.rank = 2, in.sizes[0] = n, in.sizes[1] = K;
      in.strides[0] = K, in.strides[1] = 1, in.nbytes = (uint64_t)(n * K) * es;
      for (int o = 0; o < 2; o++) {
        int64_t c = o ? 16 : 32;
        out[o].data = o ? o1 : o0, out[o].dtype = dt, out[o].rank = 2, out[o].sizes[0] = n;
        out[o].sizes[1] = c, out[o].strides[0] = c, out[o].strides[1] = 1;
        out[o].nbytes = (uint64_t)(n * c) * es;
      }
      kiln_status rs = kiln_engine_execute(gpu, &in, 1, out, 2, &err);
      char want[96];
      snprintf(want, sizeof want, "input 0 (\"x\") dim 0 is %lld, above its bound %lld", (long long)n,
               (long long)max);
      printf("%-34s batch %lld: %s: %s\n", name, (long long)n, kiln_status_name(rs), err.message);
      CHECK(rs == KILN_ERR_INVALID_ARGUMENT && strstr(err.message, want) &&
            strstr(err.message, "pass at most that or re-export with a larger max"));
      CHECK(dynamic_call(cpu, gpu, dt, K, max, 5, 0, dev, name));
      free(big), free(o0), free(o1);
    }
    cudaFree(dev[0]), cudaFree(dev[1]), cudaFree(dev[2]);
    kiln_engine_destroy(cpu);
    kiln_engine_destroy(gpu);
    kiln_free(blob);
  }
}

/* ---------------------------------------------------------------- FUSED groups, dynamic plans */

#define DYNF_MAX 40
#define DYNF_IO 12

/* Caller buffers of a dynamic plan's bindings at their bounds, on the host and on the device. */
typedef struct dynf_io {
  uint32_t n_in, n_out;
  const kiln_tensor_desc *in[DYNF_IO], *out[DYNF_IO];
  void *host_in[DYNF_IO], *dev_in[DYNF_IO], *cpu_out[DYNF_IO], *host_out[DYNF_IO],
      *dev_out[DYNF_IO];
  kiln_tensor_view cpu_iv[DYNF_IO], gpu_iv[DYNF_IO], cpu_ov[DYNF_IO], gpu_ov[DYNF_IO];
} dynf_io;

static int dynf_alloc(dynf_io *io, const kiln_plan *plan) {
  int ok = plan->n_inputs <= DYNF_IO && plan->n_outputs <= DYNF_IO;
  memset(io, 0, sizeof *io);
  for (uint32_t k = 0; ok && k < plan->n_inputs + plan->n_outputs; k++) {
    int in = k < plan->n_inputs;
    const kiln_tensor_desc *t =
        &plan->tensors[in ? plan->inputs[k] : plan->outputs[k - plan->n_inputs]];
    size_t bytes = t->nbytes ? (size_t)t->nbytes : 1;
    if (in) {
      io->in[io->n_in] = t;
      io->host_in[io->n_in] = malloc(bytes);
      ok &= io->host_in[io->n_in] && cudaMalloc(&io->dev_in[io->n_in], bytes) == cudaSuccess;
      io->n_in++;
    } else {
      io->out[io->n_out] = t;
      io->cpu_out[io->n_out] = malloc(bytes);
      io->host_out[io->n_out] = malloc(bytes);
      ok &= io->cpu_out[io->n_out] && io->host_out[io->n_out] &&
            cudaMalloc(&io->dev_out[io->n_out], bytes) == cudaSuccess;
      io->n_out++;
    }
  }
  return ok;
}

static void dynf_free(dynf_io *io) {
  for (uint32_t k = 0; k < io->n_in; k++) free(io->host_in[k]), cudaFree(io->dev_in[k]);
  for (uint32_t k = 0; k < io->n_out; k++)
    free(io->cpu_out[k]), free(io->host_out[k]), cudaFree(io->dev_out[k]);
}

static void dynf_view(kiln_tensor_view *v, const kiln_tensor_desc *t, int64_t n, void *data) {
  int64_t stride = 1;
  memset(v, 0, sizeof *v);
  v->data = data;
  v->dtype = t->dtype;
  v->rank = t->rank;
  dyn_dims_at(t, n, v->sizes);
  for (int32_t d = t->rank - 1; d >= 0; d--) v->strides[d] = stride, stride *= v->sizes[d];
  v->nbytes = (uint64_t)stride * kiln_dtype_size(t->dtype);
}

/* Views at sequence n (inputs filled anew), the GPU's on the device when bound. */
static void dynf_views(dynf_io *io, int64_t n, int bound) {
  for (uint32_t k = 0; k < io->n_in; k++) {
    dynf_view(&io->cpu_iv[k], io->in[k], n, io->host_in[k]);
    fill(io->host_in[k], io->in[k]->dtype, io->cpu_iv[k].nbytes / kiln_dtype_size(io->in[k]->dtype),
         -1.5, 1.5);
    if (bound)
      cudaMemcpy(io->dev_in[k], io->host_in[k], (size_t)io->cpu_iv[k].nbytes,
                 cudaMemcpyHostToDevice);
    io->gpu_iv[k] = io->cpu_iv[k];
    io->gpu_iv[k].data = bound ? io->dev_in[k] : io->host_in[k];
  }
  for (uint32_t k = 0; k < io->n_out; k++) {
    size_t bytes = io->out[k]->nbytes ? (size_t)io->out[k]->nbytes : 1;
    dynf_view(&io->cpu_ov[k], io->out[k], n, io->cpu_out[k]);
    memset(io->host_out[k], 0xff, bytes);
    if (bound) cudaMemset(io->dev_out[k], 0xff, bytes);
    io->gpu_ov[k] = io->cpu_ov[k];
    io->gpu_ov[k].data = bound ? io->dev_out[k] : io->host_out[k];
  }
}

/* One call at sequence n on both engines (the GPU's buffers bound or staged), every output
 * compared, shaped at n, and nothing written past this call's bytes; 1 if all hold. */
static int dynf_call(kiln_engine *cpu, kiln_engine *gpu, dynf_io *io, int64_t n, int bound,
                     const char *name) {
  kiln_error err = {KILN_OK, ""};
  int ok;
  dynf_views(io, n, bound);
  ok = kiln_engine_execute(cpu, io->cpu_iv, io->n_in, io->cpu_ov, io->n_out, &err) == KILN_OK;
  if (!ok) fprintf(stderr, "%s: cpu run at %lld: %s\n", name, (long long)n, err.message);
  kiln_status st = kiln_engine_execute(gpu, io->gpu_iv, io->n_in, io->gpu_ov, io->n_out, &err);
  if (st != KILN_OK) fprintf(stderr, "%s: cuda run at %lld: %s\n", name, (long long)n, err.message);
  ok &= st == KILN_OK;
  for (uint32_t k = 0; ok && k < io->n_out; k++) {
    const kiln_tensor_desc *t = io->out[k];
    size_t es = kiln_dtype_size(t->dtype), bytes = (size_t)io->cpu_ov[k].nbytes;
    int32_t rank = 0;
    int64_t dims[KILN_MAX_RANK];
    ok &= kiln_engine_output_shape(gpu, k, &rank, dims, &err) == KILN_OK && rank == t->rank &&
          !memcmp(dims, io->cpu_ov[k].sizes, sizeof *dims * (size_t)rank);
    if (bound) cudaMemcpy(io->host_out[k], io->dev_out[k], t->nbytes, cudaMemcpyDeviceToHost);
    double e = rel_error(io->host_out[k], io->cpu_out[k], t->dtype, bytes / es);
    last_error = fmax(last_error, e);
    if (!(e <= dtype_tolerance(t->dtype)))
      fprintf(stderr, "%s: output %u at %lld %s: rel err %.3e\n", name, (unsigned)k, (long long)n,
              bound ? "bound" : "staged", e);
    ok &= e <= dtype_tolerance(t->dtype);
    if (bytes < t->nbytes) ok &= ((uint8_t *)io->host_out[k])[bytes] == 0xff;
  }
  return ok;
}

/* A dynamic plan with FUSED groups on the CUDA engine: the groups valid at every size (rotary
 * embeddings of heads permuted to [1, H, s, D], RMSNorm pieces, a broadcast against an [s, D]
 * table) and those left after cutting what follows s, in f32, f16 and bf16, against the CPU
 * engine at sizes 1, midway, the bound and 1 again after larger ones, caller buffers staged and
 * bound; each shape runs eagerly, is captured on its second call and replayed after, so every
 * launch path (merged dims, run length and vector width at the call's sizes) meets each size;
 * execute allocates nothing (every engine allocation failing; no malloc on a replay). */
static void test_dynamic_fused(void) {
  static const int64_t sizes[] = {1, 20, DYNF_MAX, 1, 1, 1, 7, DYNF_MAX, DYNF_MAX, 20, 3, 1, 39};
  static const dyn_graph_fn graphs[2] = {dyn_groups, dyn_moving};
  static const char *const graph_names[2] = {"groups", "groups cut"};
  const int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
  for (int cfg = 0; cfg < 6; cfg++) {
    kiln_dtype dt = float_types[cfg % 3];
    kiln_builder *b = kiln_builder_create();
    kiln_build_options opts;
    kiln_error err = {KILN_OK, ""};
    kiln_blob_view bv;
    kiln_plan plan;
    void *blob = NULL;
    size_t size = 0;
    char name[64];
    snprintf(name, sizeof name, "dynamic fused %s %s", graph_names[cfg / 3], kiln_dtype_name(dt));
    kiln_build_options_default(&opts);
    opts.fuse = 1;
    int built = b && graphs[cfg / 3](b, dt, DYNF_MAX) &&
                kiln_builder_build(b, &opts, &blob, &size, &err) == KILN_OK &&
                kiln_blob_parse(blob, size, &bv, &err) == KILN_OK &&
                kiln_plan_parse(bv.plan, bv.plan_size, bv.weights_size, &plan, &err) == KILN_OK;
    kiln_builder_destroy(b);
    if (!built) fprintf(stderr, "%s: %s\n", name, err.message);
    CHECK(built);
    if (!built) {
      kiln_free(blob);
      continue;
    }
    uint32_t fused = 0;
    for (uint32_t i = 0; i < plan.n_ops; i++) fused += plan.ops[i].kind == KILN_OP_FUSED;
    CHECK(fused == (cfg < 3 ? 5u : 2u));
    kiln_engine *cpu = load_on(blob, size, KILN_DEVICE_CPU);
    kiln_engine *gpu = load_on(blob, size, KILN_DEVICE_CUDA);
    dynf_io io;
    int ok = cpu && gpu && dynf_alloc(&io, &plan);
    CHECK(ok);
    last_error = 0;
    for (int pass = 0; ok && pass < 2; pass++)
      for (int i = 0; i < n_sizes; i++) ok &= dynf_call(cpu, gpu, &io, sizes[i], pass, name);
    kiln_cuda_stats st, before, after;
    memset(&st, 0, sizeof st);
    if (gpu) kiln_cuda_engine_stats(gpu, &st, &err);
    printf("%-34s %u groups, %d sizes staged and bound: rel err %.2e (tol %.0e) %s; %llu eager, "
           "%llu captures, %llu replays\n",
           name, (unsigned)fused, n_sizes, last_error, dtype_tolerance(dt), ok ? "ok" : "FAIL",
           (unsigned long long)st.direct_runs, (unsigned long long)st.shape_captures,
           (unsigned long long)st.graph_replays);
    CHECK(ok && st.direct_runs > 0 && st.shape_captures > 0 && st.graph_replays > 0);
    if (ok) { /* every size again with every engine allocation failing, then replays at 1 */
      int noalloc = 1;
      kiln_cuda_fail_allocations_after(0);
      for (int i = 0; i < n_sizes; i++) noalloc &= dynf_call(cpu, gpu, &io, sizes[i], i % 2, name);
      kiln_cuda_fail_allocations_after(-1);
      kiln_cuda_engine_stats(gpu, &before, &err);
      dynf_views(&io, 1, 1);
      allocations = 0;
      for (int r = 0; r < 10; r++) { /* seen, captured (or replayed), then 8 replays */
        counting = r >= 2;
        noalloc &=
            kiln_engine_execute(gpu, io.gpu_iv, io.n_in, io.gpu_ov, io.n_out, &err) == KILN_OK;
      }
      counting = 0;
      kiln_cuda_engine_stats(gpu, &after, &err);
      long during = allocations, base = graph_launch_baseline(io.dev_out[0]);
      printf("%-34s allocation failure injected over %d sizes, then 8 replays at 1: %s, %ld "
             "mallocs (raw graph launches alike: %ld), init allocations %llu then %llu\n",
             name, n_sizes, noalloc ? "all ok" : "FAILED", during, base,
             (unsigned long long)st.init_allocs, (unsigned long long)after.init_allocs);
      CHECK(noalloc && after.graph_replays - before.graph_replays >= 8);
      CHECK(during == 0 || base > 0);
      CHECK(after.init_allocs == st.init_allocs);
      allocations = 0;
    }
    if (cpu && gpu) dynf_free(&io);
    kiln_engine_destroy(cpu);
    kiln_engine_destroy(gpu);
    kiln_plan_release(&plan);
    kiln_free(blob);
  }
}

/* A one-op convolution plan whose dim `dim` of x (and of its output) follows a symbol in
 * [lo, hi]; x is [4, 3, 8, 8] but for that dim, hi at the bound. */
static int dyn_conv_blob(int dim, int64_t lo, int64_t hi, void **blob, size_t *size,
                         kiln_error *err) {
  kiln_builder *b = kiln_builder_create();
  kiln_sym_size sym[4] = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
  int64_t dims[4] = {4, 3, 8, 8};
  float w[4 * 3 * 3 * 3];
  for (int i = 0; i < 108; i++) w[i] = (float)rnd();
  sym[dim] = (kiln_sym_size){1, 1, 0};
  dims[dim] = hi;
  int ok = b && kiln_builder_add_symbol(b, dim ? "height" : "batch", lo, hi, err) == 1;
  int32_t x = ok ? kiln_builder_add_input_sym(b, "x", KILN_F32, 4, dims, sym, err) : -1;
  int32_t wt = ok ? kiln_builder_add_constant(b, KILN_F32, 4, DIMS(4, 3, 3, 3), w, sizeof w, err)
                  : -1;
  int32_t y = x < 0 || wt < 0 ? -1
              : kiln_builder_add_op(b, KILN_OP_CONV, (int32_t[]){x, wt}, 2,
                                    ATTR(KILN_PAIR(1, 1), KILN_PAIR(1, 1), KILN_PAIR(1, 1), 1, 0),
                                    5, NULL, 0, err);
  kiln_build_options bo;
  kiln_build_options_default(&bo);
  bo.fuse = 0; /* the convolution as it was added */
  ok = y >= 0 && kiln_builder_mark_output(b, y, "y", err) == KILN_OK &&
       kiln_builder_build(b, &bo, blob, size, err) == KILN_OK;
  kiln_builder_destroy(b);
  return ok;
}

/* A convolution with a dynamic batch (bound 4: pieces of 1 and 2 rows) equals the CPU engine at
 * each batch, caller buffers staged and bound; one whose image height follows a symbol is
 * refused at load, naming the op and the remedy, while the CPU engine runs it. */
static void test_dynamic_conv(void) {
  static const int64_t batches[] = {1, 2, 3, 4, 3, 1, 4, 2};
  kiln_error err = {KILN_OK, ""};
  kiln_blob_view bv;
  kiln_plan plan;
  void *blob = NULL;
  size_t size = 0;
  int built = dyn_conv_blob(0, 1, 4, &blob, &size, &err) &&
              kiln_blob_parse(blob, size, &bv, &err) == KILN_OK &&
              kiln_plan_parse(bv.plan, bv.plan_size, bv.weights_size, &plan, &err) == KILN_OK;
  if (!built) fprintf(stderr, "dynamic conv: %s\n", err.message);
  CHECK(built);
  if (built) {
    kiln_engine *cpu = load_on(blob, size, KILN_DEVICE_CPU);
    kiln_engine *gpu = load_on(blob, size, KILN_DEVICE_CUDA);
    dynf_io io;
    int ok = cpu && gpu && dynf_alloc(&io, &plan);
    CHECK(ok);
    last_error = 0;
    for (int pass = 0; ok && pass < 2; pass++)
      for (size_t i = 0; i < sizeof batches / sizeof batches[0]; i++)
        ok &= dynf_call(cpu, gpu, &io, batches[i], pass, "dynamic conv");
    printf("dynamic conv batch 1-4 by pieces, staged and bound: rel err %.2e %s\n", last_error,
           ok ? "ok" : "FAIL");
    CHECK(ok);
    if (cpu && gpu) dynf_free(&io);
    kiln_engine_destroy(cpu);
    kiln_engine_destroy(gpu);
    kiln_plan_release(&plan);
  }
  kiln_free(blob);
  blob = NULL;
  built = dyn_conv_blob(2, 6, 10, &blob, &size, &err);
  CHECK(built);
  kiln_engine *cpu = built ? load_on(blob, size, KILN_DEVICE_CPU) : NULL;
  CHECK(cpu != NULL);
  kiln_engine_options opts;
  kiln_engine *e = NULL;
  kiln_engine_options_default(&opts);
  opts.device = KILN_DEVICE_CUDA;
  kiln_status st = built ? kiln_engine_load(blob, size, &opts, &e, &err) : KILN_ERR_INTERNAL;
  printf("dynamic image height on CUDA: %s: %s\n", kiln_status_name(st), err.message);
  CHECK(st == KILN_ERR_UNSUPPORTED && e == NULL && strstr(err.message, "(conv): the CUDA engine") &&
        strstr(err.message, "export them static (a dynamic batch runs)"));
  kiln_engine_destroy(e);
  kiln_engine_destroy(cpu);
  kiln_free(blob);
}

static void test_init_failures(void) {
  kiln_error err;
  prog *p = small_prog();
  /* Every allocation init makes, made to fail in turn: an error each time, nothing leaked. */
  size_t free0 = 0, free1 = 0, total = 0;
  kiln_engine *e = p_load(p, &kiln_cuda_backend, 0, &err);
  kiln_cuda_stats st;
  kiln_cuda_engine_stats(e, &st, &err);
  long n = (long)st.init_allocs + 4;
  p_unload(e);
  cudaMemGetInfo(&free0, &total);
  int refused = 0, loaded = 0;
  for (long k = 0; k <= n + 4; k++) {
    kiln_cuda_fail_allocations_after(k);
    e = p_load(p, &kiln_cuda_backend, 0, &err);
    kiln_cuda_fail_allocations_after(-1);
    if (e) {
      loaded++;
      CHECK(small_run_ok(e, p));
      p_unload(e);
    } else {
      refused++;
      CHECK(err.status == KILN_ERR_OUT_OF_MEMORY);
    }
  }
  cudaMemGetInfo(&free1, &total);
  printf("allocation failure at each of %ld points: %d refused with out of memory, %d loaded; "
         "device free memory %s\n", n, refused, loaded, free0 == free1 ? "unchanged" : "CHANGED");
  CHECK(refused > 5 && loaded > 0 && free0 == free1);

  /* A device that does not exist. */
  int count = 0;
  cudaGetDeviceCount(&count);
  e = p_load(p, &kiln_cuda_backend, count, &err);
  printf("device id %d: %s: %s\n", count, kiln_status_name(err.status), err.message);
  CHECK(e == NULL && err.status == KILN_ERR_UNAVAILABLE && strstr(err.message, "does not exist"));

  /* An arena larger than the device: a returned error, then another program runs. */
  prog *big = p_new();
  uint32_t x = IN(big, KILN_F32, 1, 1);
  uint64_t huge = (uint64_t)total / 4 * 2; /* elements: twice the device's bytes */
  uint32_t m = p_tensor(big, KILN_STORE_ARENA, KILN_F32, 1, DIMS((int64_t)huge));
  p_op(big, KILN_OP_EXPAND, 1, OPS(x), m, 1, ATTR((int64_t)huge), 0);
  p_op(big, KILN_OP_SUM, 1, OPS(m), OUT(big, KILN_F32, 1, 1), 2, ATTR(1, 1), 0);
  e = p_load(big, &kiln_cuda_backend, 0, &err);
  printf("arena of %llu bytes: %s: %s\n", (unsigned long long)big->arena_size,
         kiln_status_name(err.status), err.message);
  CHECK(e == NULL && err.status == KILN_ERR_OUT_OF_MEMORY);
  p_unload(e);
  p_free(big);
  e = p_load(p, &kiln_cuda_backend, 0, &err);
  CHECK(e && small_run_ok(e, p));
  p_unload(e);
  p_free(p);
}

/* An input whose device buffer is far shorter than its shape: a 1 GiB range of addresses of
 * which only the first granule is backed, so the kernel reading it faults for certain; the
 * run must come back as an internal error naming the usual causes. */
static int fault_check(void) {
  kiln_error err;
  prog *p = p_new();
  int64_t n = (int64_t)1 << 28;
  uint32_t x = IN(p, KILN_F32, 1, n);
  p_op(p, KILN_OP_SUM, 1, OPS(x), OUT(p, KILN_F32, 1, 1), 2, ATTR(1, 1), 0);
  kiln_engine *e = p_load(p, &kiln_cuda_backend, 0, &err);
  CHECK(e != NULL);
  if (!e) return check_report("test_cuda_ops --fault");
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  CUmemAccessDesc access;
  memset(&access, 0, sizeof access);
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  int ok = cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
           cuMemAddressReserve(&va, (size_t)n * 4, 0, 0, 0) == CUDA_SUCCESS &&
           cuMemCreate(&h, gran, &prop, 0) == CUDA_SUCCESS && cuMemMap(va, gran, 0, h, 0) == CUDA_SUCCESS &&
           cuMemSetAccess(va, gran, &access, 1) == CUDA_SUCCESS;
  CHECK(ok);
  float result = 0.0f;
  void *in[1] = {(void *)(uintptr_t)va}, *outs[1] = {&result};
  kiln_status st = p_execute(e, p, in, outs, &err);
  printf("short device buffer: %s: %s\n", kiln_status_name(st), err.message);
  CHECK(st == KILN_ERR_INTERNAL && strstr(err.message, "shorter than its shape") &&
        strstr(err.message, "first error"));
  return check_report("test_cuda_ops --fault");
}

/* Loads p on the CPU and CUDA engines; where either fails, says so, frees p and returns 0. */
static int load_both(prog *p, const char *name, kiln_engine **cpu, kiln_engine **gpu) {
  kiln_error err = {KILN_OK, ""};
  *cpu = p_load(p, &kiln_cpu_backend, 0, &err);
  *gpu = *cpu ? p_load(p, &kiln_cuda_backend, 0, &err) : NULL;
  CHECK(*cpu && *gpu);
  if (*cpu && *gpu) return 1;
  fprintf(stderr, "%s: load failed: %s\n", name, err.message);
  p_unload(*cpu);
  p_unload(*gpu);
  p_free(p);
  return 0;
}

/* A KV-cache step, cache[:, :, pos] = rows in place on a state, then the cache read out: three
 * steps, a refused one, another step and a reset, on the CPU and CUDA engines side by side. The
 * cache is copied exactly, so the two must agree to the byte; only the output crosses to the
 * host. */
static void test_state_write(void) {
  static const int64_t steps[5][2] = {{0, 1}, {2, 3}, {4, 5}, {5, 6}, {0, 3}};
  char name[64];
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = float_types[t];
    snprintf(name, sizeof name, "index_copy state %s", kiln_dtype_name(dt));
    if (!selected(name)) continue;
    prog *p = p_new();
    uint32_t pos = IN(p, KILN_I64, 1, 2), rows = IN(p, dt, 4, 1, 2, 2, 4);
    uint32_t base = p_state(p, dt, 4, DIMS(1, 2, 6, 4));
    uint32_t written = p_state_written(p, base);
    p_op(p, KILN_OP_INDEX_COPY, 3, OPS(base, pos, rows), written, 1, ATTR(2), 0);
    p_op(p, KILN_OP_COPY, 1, OPS(written), OUT(p, dt, 4, 1, 2, 6, 4), 0, NULL, 0);
    kiln_error err = {KILN_OK, ""};
    kiln_engine *cpu, *gpu;
    if (!load_both(p, name, &cpu, &gpu)) continue;
    size_t row_bytes = 16 * kiln_dtype_size(dt), out_bytes = 48 * kiln_dtype_size(dt);
    uint8_t *in_rows = malloc(row_bytes), *a = malloc(out_bytes), *b = malloc(out_bytes);
    if (!in_rows || !a || !b) die("out of memory");
    kiln_cuda_stats before, after;
    kiln_cuda_engine_stats(gpu, &before, &err);
    for (int s = 0; s < 6; s++) {
      int64_t where[2] = {steps[s < 5 ? s : 4][0], steps[s < 5 ? s : 4][1]};
      if (s == 5) { /* after a reset both start again from the initial value */
        CHECK(cpu->backend->reset_state(cpu, &err) == KILN_OK);
        CHECK(gpu->backend->reset_state(gpu, &err) == KILN_OK);
      }
      fill(in_rows, dt, 16, -1, 1);
      memset(a, 0, out_bytes);
      memset(b, 0xff, out_bytes);
      kiln_status sa = p_execute(cpu, p, (void *[]){where, in_rows}, (void *[]){a}, &err);
      kiln_status sb = p_execute(gpu, p, (void *[]){where, in_rows}, (void *[]){b}, &err);
      if (s == 3) { /* position 6 is past the 6 slots: refused, nothing written */
        CHECK(sa == KILN_ERR_INVALID_ARGUMENT && sb == KILN_ERR_INVALID_ARGUMENT);
        CHECK(strstr(err.message, "position 6 is outside the 6 slots") != NULL);
        continue;
      }
      CHECK(sa == KILN_OK && sb == KILN_OK);
      CHECK(memcmp(a, b, out_bytes) == 0);
    }
    kiln_cuda_engine_stats(gpu, &after, &err);
    /* Each of the six runs (the refused one too) copied only its output to the host. */
    CHECK(after.host_out_bytes - before.host_out_bytes == 6 * out_bytes);
    CHECK(after.state_resets - before.state_resets == 1);
    printf("%-40s %s\n", name, "compared");
    free(in_rows);
    free(a);
    free(b);
    p_unload(cpu);
    p_unload(gpu);
    p_free(p);
  }
}

/* A decode step's attention over a KV cache it writes: cache[:, :, pos] = the step's key and
 * value rows (in place on two states), then SDPA of 32 query heads over the 8 cache heads, as a
 * Llama-family layer lowers. In f16 and bf16 the decoding kernel does both writes (no
 * INDEX_COPY kernel); f32 keeps them. Heads first, and heads last (the output [B,L,H,E], as a
 * layer's attention reshaped for its output projection lowers). Every step is compared with the
 * CPU engine, with a mask keeping most keys of the whole cache, so a row written to the wrong
 * slot, or not at all, shows at the next steps (slots in a warp's first pass of keys and in its
 * second); a slot past the cache is refused and writes nothing. In the last two cases the kernel
 * just ahead of the attention computes the mask (an additive one, a sum over 8192 zeros or a
 * -inf, long enough to still run when the attention, launched early, starts): a mask read before
 * the attention's wait on that kernel shows as keys scored that the step's mask removes. */
static void test_cache_attention(void) {
  enum { S = 1152, STEPS = 8, W = 8192 }; /* two passes of keys a warp of the decoding kernel */
  static const int64_t slots[STEPS] = {5, 6, 0, S - 1, S, 7, 5, 6};
  char name[80];
  for (int t = 0; t < 8; t++) {
    kiln_dtype dt = t < 6 ? float_types[t % 3] : float_types[t - 5];
    int last = t >= 3 && t < 6, ahead = t >= 6;
    snprintf(name, sizeof name, "sdpa writing its cache%s %s",
             last ? " heads last" : ahead ? " masked by the kernel ahead" : "",
             kiln_dtype_name(dt));
    if (!selected(name)) continue;
    prog *p = p_new();
    uint32_t pos_in = IN(p, KILN_I64, 1, 1), q = IN(p, dt, 4, 1, 32, 1, 128);
    uint32_t k_in = IN(p, dt, 4, 1, 8, 1, 128), v_in = IN(p, dt, 4, 1, 8, 1, 128);
    uint32_t mask = ahead ? IN(p, dt, 3, 1, S, W) : IN(p, KILN_BOOL, 2, 1, S);
    uint32_t pos = MID(p, KILN_I64, 1, 1);
    uint32_t k_row = MID(p, dt, 4, 1, 8, 1, 128), v_row = MID(p, dt, 4, 1, 8, 1, 128);
    uint32_t kc = p_state(p, dt, 4, DIMS(1, 8, S, 128)), vc = p_state(p, dt, 4, DIMS(1, 8, S, 128));
    uint32_t kw = p_state_written(p, kc), vw = p_state_written(p, vc);
    p_op(p, KILN_OP_COPY, 1, OPS(pos_in), pos, 0, NULL, 0);
    p_op(p, KILN_OP_COPY, 1, OPS(k_in), k_row, 0, NULL, 0);
    p_op(p, KILN_OP_COPY, 1, OPS(v_in), v_row, 0, NULL, 0);
    p_op(p, KILN_OP_INDEX_COPY, 3, OPS(kc, pos, k_row), kw, 1, ATTR(2), 0);
    p_op(p, KILN_OP_INDEX_COPY, 3, OPS(vc, pos, v_row), vw, 1, ATTR(2), 0);
    uint32_t sums = mask;
    if (ahead)
      p_op(p, KILN_OP_SUM, 1, OPS(mask), sums = MID(p, dt, 2, 1, S), 2, ATTR(4, 0), 0);
    if (last)
      p_op(p, KILN_OP_SDPA, 4, OPS(q, kw, vw, mask), OUT(p, dt, 4, 1, 1, 32, 128), 3, ATTR(0, 1, 2), 0);
    else
      p_op(p, KILN_OP_SDPA, 4, OPS(q, kw, vw, sums), OUT(p, dt, 4, 1, 32, 1, 128), 2, ATTR(0, 1), 0);
    kiln_error err = {KILN_OK, ""};
    kiln_engine *cpu, *gpu;
    if (!load_both(p, name, &cpu, &gpu)) continue;
    kiln_cuda_stats stats;
    CHECK(kiln_cuda_engine_stats(gpu, &stats, &err) == KILN_OK);
    uint64_t want_folded = dt == KILN_F32 ? 0 : 2; /* f32 rows take the block kernel */
    if (stats.cache_writes_in_attention != want_folded)
      printf("%s: %llu cache writes in the attention, want %llu: FAIL\n", name,
             (unsigned long long)stats.cache_writes_in_attention, (unsigned long long)want_folded);
    CHECK(stats.cache_writes_in_attention == want_folded);
    size_t es = kiln_dtype_size(dt), row_bytes = 8 * 128 * es, out_bytes = 32 * 128 * es;
    uint8_t *qb = malloc(4 * row_bytes), *kb = malloc(row_bytes), *vb = malloc(row_bytes);
    size_t mask_bytes = ahead ? (size_t)S * W * es : S;
    uint8_t *mb = malloc(mask_bytes), *a = malloc(out_bytes), *b = malloc(out_bytes);
    if (!qb || !kb || !vb || !mb || !a || !b) die("out of memory");
    double worst = 0.0;
    for (int step = 0; step < STEPS; step++) {
      int64_t at = slots[step];
      fill(qb, dt, 4 * 8 * 128, -2, 2);
      fill(kb, dt, 8 * 128, -2, 2);
      fill(vb, dt, 8 * 128, -1, 1);
      if (ahead) { /* a row of zeros keeps its key, one with a -inf removes it */
        memset(mb, 0, mask_bytes);
        for (int key = 0; key < S; key++)
          if (key != at && rnd() < -0.6)
            put_value(mb, dt, (uint64_t)key * W + (uint64_t)(key * 37) % W, -INFINITY);
      } else {
        fill(mb, KILN_BOOL, S, -0.25, 1); /* about four keys in five kept */
        if (at < S) mb[at] = 1;
      }
      memset(a, 0, out_bytes);
      memset(b, 0xff, out_bytes);
      void *in[5] = {&at, qb, kb, vb, mb};
      kiln_status sa = p_execute(cpu, p, in, (void *[]){a}, &err);
      kiln_status sb = p_execute(gpu, p, in, (void *[]){b}, &err);
      if (at >= S) { /* refused by both, nothing written: the next steps still agree */
        CHECK(sa == KILN_ERR_INVALID_ARGUMENT && sb == KILN_ERR_INVALID_ARGUMENT);
        CHECK(strstr(err.message, "position 1152 is outside the 1152 slots") != NULL);
        continue;
      }
      CHECK(sa == KILN_OK && sb == KILN_OK);
      double e = rel_error(b, a, dt, 32 * 128);
      worst = fmax(worst, e);
      if (e > dtype_tolerance(dt))
        printf("%s: step %d at slot %lld: rel err %.2e: FAIL\n", name, step, (long long)at, e);
      CHECK(e <= dtype_tolerance(dt));
    }
    printf("%-40s %d steps, worst rel err %.2e (tol %.0e)\n", name, STEPS, worst,
           dtype_tolerance(dt));
    free(qb);
    free(kb);
    free(vb);
    free(mb);
    free(a);
    free(b);
    p_unload(cpu);
    p_unload(gpu);
    p_free(p);
  }
}

/* A GEMM timed at one load is not timed again at the next load of the same shape: the second
 * engine takes the first's algorithm, so both compute the same bytes. */
static void test_choice_cache(void) {
  kiln_error err;
  prog *p = p_new();
  uint32_t x = IN(p, KILN_F16, 2, 136, 520);
  uint32_t w = p_weight(p, KILN_F16, 2, DIMS(392, 520), -0.1, 0.1);
  p_op(p, KILN_OP_LINEAR, 2, OPS(x, w), OUT(p, KILN_F16, 2, 136, 392), 0, NULL, 0);
  kiln_engine *a = p_load(p, &kiln_cuda_backend, 0, &err);
  kiln_engine *b = a ? p_load(p, &kiln_cuda_backend, 0, &err) : NULL;
  CHECK(a != NULL && b != NULL);
  if (a && b) {
    kiln_cuda_stats sa, sb;
    kiln_cuda_engine_stats(a, &sa, &err);
    kiln_cuda_engine_stats(b, &sb, &err);
    printf("choice cache: first load measured %llu reused %llu, second measured %llu reused %llu\n",
           (unsigned long long)sa.choices_measured, (unsigned long long)sa.choices_reused,
           (unsigned long long)sb.choices_measured, (unsigned long long)sb.choices_reused);
    CHECK(sa.choices_measured == 1 && sa.choices_reused == 0);
    CHECK(sb.choices_measured == 0 && sb.choices_reused == 1);
    static uint16_t hx[136 * 520], ya[136 * 392], yb[136 * 392];
    fill(hx, KILN_F16, 136 * 520, -1, 1);
    void *in[1] = {hx}, *oa[1] = {ya}, *ob[1] = {yb};
    CHECK(p_execute(a, p, in, oa, &err) == KILN_OK && p_execute(b, p, in, ob, &err) == KILN_OK);
    CHECK(memcmp(ya, yb, sizeof ya) == 0);
  }
  p_unload(a);
  p_unload(b);
  p_free(p);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0); /* a run cut short keeps what it printed */
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    fprintf(stderr, "test_cuda_ops: no CUDA device; run it on a GPU machine\n");
    return 2;
  }
  /* The op tests test Kiln's own attention kernels; test_cudnn_attention the cuDNN path. */
  kiln_cuda_attention_choice(KILN_CUDA_ATTENTION_OWN);
  if (argc > 1 && strcmp(argv[1], "--fault") == 0) return fault_check();
  if (argc > 1 && strcmp(argv[1], "--time-sdpa") == 0) return time_sdpa();
  if (argc > 1 && strcmp(argv[1], "--time-linear") == 0) return time_linear(argc > 2 ? argv[2] : NULL);
  if (argc > 1 && strcmp(argv[1], "--bench-conv") == 0) return bench_conv();
  if (argc > 1 && strcmp(argv[1], "--bench-fused") == 0) {
    bench_fused_only = argc > 2 ? argv[2] : NULL;
    return time_fused();
  }
  if (argc > 1 && strcmp(argv[1], "--padded-pitch") == 0) {
    /* The linears written at a padded pitch alone. */
    test_gemm_pitch();
    test_padded_pitch_bound();
    return check_report("test_cuda_ops --padded-pitch");
  }
  if (argc > 1 && strcmp(argv[1], "--matmul-attention") == 0) {
    /* The matmul and attention cases alone: quick to run against a changed kernel. */
    test_gemm_pitch();
    test_padded_pitch_bound();
    test_gemm();
    test_norm_in_gemv();
    test_norm_after_gemv();
    test_attention();
    test_flash_attention();
    test_packed_attention();
    test_grouped_attention();
    test_cudnn_attention();
    return check_report("test_cuda_ops --matmul-attention");
  }
  if (argc > 1 && strcmp(argv[1], "--dynamic") == 0) {
    /* The dynamic-shape cases alone. */
    test_dynamic_plan();
    test_dynamic_fused();
    test_dynamic_conv();
    return check_report("test_cuda_ops --dynamic");
  }
  if (argc > 2 && strcmp(argv[1], "--only") == 0) only_filter = argv[2];
  test_gemm_pitch();
  test_padded_pitch_bound();
  test_gemm();
  test_norm_in_gemv();
  test_norm_after_gemv();
  test_pointwise();
  test_logic();
  test_fused_pointwise();
  test_fused_group();
  test_normalize_reduce();
  test_layout_gather();
  test_index_scan();
  test_beside();
  test_vision();
  test_attention();
  test_flash_attention();
  test_packed_attention();
  test_grouped_attention();
  test_cudnn_attention();
  test_conv();
  test_conv_graph();
  test_state_write();
  test_cache_attention();
  if (only_filter) return check_report("test_cuda_ops --only");
  test_conv_noalloc();
  test_choice_cache();
  test_residency();
  test_chunked_staging();
  test_refusals();
  test_dynamic_plan();
  test_dynamic_fused();
  test_dynamic_conv();
  test_init_failures();
  return check_report("test_cuda_ops");
}
