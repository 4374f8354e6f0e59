/* FUSED kernels compiled at load: a static plan's group becomes CUDA C++ of its own (its
 * instructions in order, the dtypes, sizes, strides and boxes as constants) that NVRTC compiles
 * for the device, so a run costs its loads and its math, not the interpreter's dispatch per
 * instruction (cuda_fused_group.cu, which the plan's shape-changing dynamic groups still use).
 * The kernel's helpers (cuda_fused_jit.cuh) and op math (cuda_op_math.cuh, the elementwise
 * kernels' own) are embedded at build time. Identical groups (every layer's) share one compile.
 * NVRTC is opened at run time (libnvrtc.so.<CUDA major>, which PyTorch's CUDA wheels install):
 * where it is missing, the interpreter runs every group and the engine's stats say so. */
#include "cuda_fused_group.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nvrtc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cuda_op_math.cuh and cuda_fused_jit.cuh as text (written by CMake at configure). */
extern const char kcu_op_math_text[];
extern const char kcu_fused_jit_text[];

#define KFX_JIT_BLOCK 256

typedef struct kfx_nvrtc {
  nvrtcResult (*create)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                        const char *const *);
  nvrtcResult (*compile)(nvrtcProgram, int, const char *const *);
  nvrtcResult (*cubin_size)(nvrtcProgram, size_t *);
  nvrtcResult (*cubin)(nvrtcProgram, char *);
  nvrtcResult (*log_size)(nvrtcProgram, size_t *);
  nvrtcResult (*log)(nvrtcProgram, char *);
  nvrtcResult (*destroy)(nvrtcProgram *);
} kfx_nvrtc;

typedef struct kfx_compiled {
  char *source;
  cudaLibrary_t library;
  cudaKernel_t kernel;
} kfx_compiled;

struct kcu_fx_jit {
  void *dl; /* libnvrtc, NULL when not found */
  kfx_nvrtc api;
  int tried;
  kfx_compiled *items;
  uint32_t n, cap;
};

/* ---------------------------------------------------------------- source */

typedef struct kfx_text {
  char *s;
  size_t len, cap;
  int oom;
} kfx_text;

static void kfx_put(kfx_text *t, const char *fmt, ...) {
  va_list ap;
  if (t->oom) return;
  for (;;) {
    va_start(ap, fmt);
    int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->oom = 1;
      return;
    }
    if (t->s && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = (t->cap ? t->cap * 2 : 16384) + (size_t)n;
    char *s = (char *)realloc(t->s, cap);
    if (!s) {
      t->oom = 1;
      return;
    }
    t->s = s, t->cap = cap;
  }
}

/* The op kinds the op math names, as the generated source's constants. */
#define KFX_OP_NAMES(X)                                                                          \
  X(ADD) X(SUB) X(MUL) X(DIV) X(MINIMUM) X(MAXIMUM) X(RELU) X(GELU) X(SILU) X(SIGMOID) X(TANH)   \
  X(EXP) X(SQRT) X(RSQRT) X(NEG) X(POW) X(ABS) X(LOG) X(COS) X(SIN) X(ERF) X(HARDSWISH)          \
  X(HARDSIGMOID)

static void kfx_prelude(kfx_text *t, int narrow) {
#define KFX_DEFINE(name) kfx_put(t, "#define KILN_OP_%s %d\n", #name, (int)KILN_OP_##name);
  KFX_OP_NAMES(KFX_DEFINE)
#undef KFX_DEFINE
  kfx_put(t, "#define KILN_F32 %d\n#define KILN_F16 %d\n#define KILN_BF16 %d\n", (int)KILN_F32,
          (int)KILN_F16, (int)KILN_BF16);
  kfx_put(t, "#define KILN_I64 %d\n#define KILN_I32 %d\n#define KILN_BOOL %d\n", (int)KILN_I64,
          (int)KILN_I32, (int)KILN_BOOL);
  kfx_put(t, "#define KILN_MAX_OP_INPUTS %d\n", KILN_MAX_OP_INPUTS);
  kfx_put(t, "typedef %s kfx_i;\n", narrow ? "unsigned" : "long long");
  kfx_put(t, "%s\n%s\n", kcu_op_math_text, kcu_fused_jit_text);
}

/* An exact float constant: its bits. */
static void kfx_float(kfx_text *t, float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  kfx_put(t, "__uint_as_float(0x%08xu)", (unsigned)u);
}

/* The innermost coordinate bound a LOAD's or SELECT's value is compared with, as kfx_i. */
static void kfx_index(kfx_text *t, int64_t v) { kfx_put(t, "(kfx_i)(%lldLL)", (long long)v); }

static void kfx_load_code(kfx_text *t, const kcu_fx *p, const kcu_fx_map *m, int dst) {
  const int ri = p->rank - 1;
  const int dt = p->in_dtype[m->slot];
  kfx_put(t, "    {\n      bool inside = true");
  if (!(m->box & KFX_OUTER))
    for (int d = 0; d < ri; d++) {
      if (m->lo[d] == 0 && m->hi[d] == p->dims[d]) continue;
      kfx_put(t, " && c%d >= ", d), kfx_index(t, m->lo[d]);
      kfx_put(t, " && c%d < ", d), kfx_index(t, m->hi[d]);
    }
  kfx_put(t, ";\n      kfx_i at = ");
  kfx_index(t, m->offset);
  for (int d = 0; d < ri; d++)
    if (m->stride[d] != 0 && p->dims[d] != 1)
      kfx_put(t, " + c%d * ", d), kfx_index(t, m->stride[d]);
  kfx_put(t, ";\n");
  if (m->box & KFX_INNER) {
    kfx_put(t, "      kfx_load_inner<V, %d>(io.in[%d], inside, at, cr, ", dt, m->slot);
    kfx_index(t, m->stride[ri]);
  } else {
    kfx_put(t, "      kfx_load_cut<V, %d>(io.in[%d], inside, at, cr, ", dt, m->slot);
    kfx_index(t, m->stride[ri]);
    kfx_put(t, ", "), kfx_index(t, m->lo[ri]);
    kfx_put(t, ", "), kfx_index(t, m->hi[ri]);
  }
  kfx_put(t, ", r%d);\n    }\n", dst);
}

char *kcu_fx_source(const kcu_fx *p) {
  kfx_text t = {0};
  const int ri = p->rank - 1, V = p->run;
  int used[KILN_FX_MAX_REGS] = {0};
  int64_t n_runs = 1;
  for (int d = 0; d < p->rank; d++) n_runs *= p->dims[d];
  n_runs /= V;
  kfx_prelude(&t, p->narrow);
  kfx_put(&t, "#define V %d\n", V);
  kfx_put(&t, "#define KFX_EACH _Pragma(\"unroll\") for (int k = 0; k < V; k++)\n");
  kfx_put(&t, "extern \"C\" __global__ void __launch_bounds__(%d) kfx_main(const kfx_io io) {\n",
          KFX_JIT_BLOCK);
  kfx_put(&t, "  kfx_begin_early();\n");
  kfx_put(&t, "  for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < %lldLL;"
              " j += (long long)gridDim.x * blockDim.x) {\n", (long long)n_runs);
  kfx_put(&t, "    kfx_i rest = (kfx_i)j;\n");
  kfx_put(&t, "    const kfx_i cr = (kfx_i)(rest %% (kfx_i)%lldLL) * V;\n",
          (long long)(p->dims[ri] / V));
  kfx_put(&t, "    rest /= (kfx_i)%lldLL;\n", (long long)(p->dims[ri] / V));
  for (int d = ri - 1; d >= 0; d--) {
    kfx_put(&t, "    const kfx_i c%d = rest %% (kfx_i)%lldLL;\n", d, (long long)p->dims[d]);
    kfx_put(&t, "    rest /= (kfx_i)%lldLL;\n", (long long)p->dims[d]);
  }
  for (int s = 0; s < p->n_instrs; s++) {
    uint32_t code = p->code[s] & 15u, dst = (p->code[s] >> 4) & 15u;
    if (code != KILN_FX_STORE && !used[dst]) {
      used[dst] = 1;
      kfx_put(&t, "    float r%u[V];\n", dst);
    }
  }
  for (int s = 0; s < p->n_instrs; s++) {
    uint32_t w = p->code[s], code = w & 15u, dst = (w >> 4) & 15u, a = (w >> 8) & 15u;
    uint32_t b = (w >> 12) & 15u, arg = w >> 16;
    switch (code) {
    case KILN_FX_LOAD: kfx_load_code(&t, p, &p->maps[arg], (int)dst); break;
    case KILN_FX_UNARY:
      kfx_put(&t, "    KFX_EACH r%u[k] = kcu_unop(%u, r%u[k], ", dst, arg, a);
      kfx_float(&t, p->imm[s].f);
      kfx_put(&t, ");\n");
      break;
    case KILN_FX_BINARY:
      kfx_put(&t, "    KFX_EACH r%u[k] = kcu_binop(%u, r%u[k], r%u[k], ", dst,
              arg, a, b);
      kfx_float(&t, p->imm[s].f);
      kfx_put(&t, ");\n");
      break;
    case KILN_FX_ROUND:
      kfx_put(&t, "    KFX_EACH r%u[k] = kfx_round<%d>(r%u[k]);\n", dst,
              arg == KILN_F16 ? KILN_F16 : KILN_BF16, a);
      break;
    case KILN_FX_SELECT: /* on the innermost coordinate (per element) or an outer one */
      if ((int)arg == ri)
        kfx_put(&t, "    KFX_EACH r%u[k] = cr + k < ", dst);
      else
        kfx_put(&t, "    KFX_EACH r%u[k] = c%u < ", dst, arg);
      kfx_index(&t, p->imm[s].i);
      kfx_put(&t, " ? r%u[k] : r%u[k];\n", a, b);
      break;
    default: /* STORE */
      kfx_put(&t, "    kfx_store<V, %d>(io.out, j * V, r%u);\n", p->out_dtype, a);
      break;
    }
  }
  kfx_put(&t, "  }\n}\n");
  if (t.oom) {
    free(t.s);
    return NULL;
  }
  return t.s;
}

/* ---------------------------------------------------------------- compile and launch */

static int kfx_open(kcu_fx_jit *j) {
  if (j->tried) return j->dl != NULL;
  j->tried = 1;
  char name[32];
  snprintf(name, sizeof name, "libnvrtc.so.%d", CUDART_VERSION / 1000);
  j->dl = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!j->dl) return 0;
#define KFX_SYM(field, sym)                                                                    \
  if (!(*(void **)&j->api.field = dlsym(j->dl, sym))) goto missing;
  KFX_SYM(create, "nvrtcCreateProgram")
  KFX_SYM(compile, "nvrtcCompileProgram")
  KFX_SYM(cubin_size, "nvrtcGetCUBINSize")
  KFX_SYM(cubin, "nvrtcGetCUBIN")
  KFX_SYM(log_size, "nvrtcGetProgramLogSize")
  KFX_SYM(log, "nvrtcGetProgramLog")
  KFX_SYM(destroy, "nvrtcDestroyProgram")
#undef KFX_SYM
  return 1;
missing:
  dlclose(j->dl);
  j->dl = NULL;
  return 0;
}

/* NVRTC's cubin of source for sm_<cc> (malloc'd, its size in *bytes); on failure err names
 * NVRTC's first error line. Needs no device. */
static kiln_status kfx_cubin(kcu_fx_jit *j, const char *source, int cc, char **cubin,
                             size_t *bytes, kiln_error *err) {
  nvrtcProgram prog = NULL;
  char arch[40], first[96] = "";
  snprintf(arch, sizeof arch, "--gpu-architecture=sm_%d", cc);
  const char *opts[] = {arch, "--std=c++17"};
  *cubin = NULL;
  *bytes = 0;
  nvrtcResult r = j->api.create(&prog, source, "kiln_fused.cu", 0, NULL, NULL);
  if (r == NVRTC_SUCCESS) r = j->api.compile(prog, 2, opts);
  if (r != NVRTC_SUCCESS && prog) {
    size_t n = 0;
    char *log = j->api.log_size(prog, &n) == NVRTC_SUCCESS && n ? (char *)malloc(n) : NULL;
    if (log && j->api.log(prog, log) == NVRTC_SUCCESS) {
      const char *e = strstr(log, "error");
      snprintf(first, sizeof first, "%.80s", e ? e : log);
      for (char *c = first; *c; c++)
        if (*c == '\n') *c = ' ';
    }
    free(log);
  }
  if (r == NVRTC_SUCCESS) r = j->api.cubin_size(prog, bytes);
  if (r == NVRTC_SUCCESS && !(*cubin = (char *)malloc(*bytes ? *bytes : 1))) {
    j->api.destroy(&prog);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory for a fused group's kernel; free memory and load again");
  }
  if (r == NVRTC_SUCCESS) r = j->api.cubin(prog, *cubin);
  if (prog) j->api.destroy(&prog);
  if (r != NVRTC_SUCCESS) {
    free(*cubin);
    *cubin = NULL;
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "NVRTC could not compile a fused group's kernel for sm_%d (%d: %.80s); "
                     "install an NVRTC that knows this GPU or report the program",
                     cc, (int)r, first);
  }
  return KILN_OK;
}

/* source compiled for sm_<cc> and loaded (every device of the process may launch it). */
static kiln_status kfx_compile(kcu_fx_jit *j, const char *source, int cc, kfx_compiled *out,
                               kiln_error *err) {
  char *cubin;
  size_t bytes;
  kiln_status st = kfx_cubin(j, source, cc, &cubin, &bytes, err);
  if (st != KILN_OK) return st;
  cudaError_t rc = cudaLibraryLoadData(&out->library, cubin, NULL, NULL, 0, NULL, NULL, 0);
  free(cubin);
  if (rc == cudaSuccess) rc = cudaLibraryGetKernel(&out->kernel, out->library, "kfx_main");
  if (rc != cudaSuccess) {
    cudaGetLastError();
    kiln_status code =
        rc == cudaErrorMemoryAllocation ? KILN_ERR_OUT_OF_MEMORY : KILN_ERR_UNSUPPORTED;
    return kiln_fail(err, code,
                     "loading a fused group's compiled kernel failed (%.60s); free device memory "
                     "or update the NVIDIA driver", cudaGetErrorString(rc));
  }
  return KILN_OK;
}

kiln_status kcu_fx_jit_cubin_size(kcu_fx_jit **jit, const kcu_fx *p, int cc, size_t *bytes,
                                  kiln_error *err) {
  char *cubin = NULL, *source;
  *bytes = 0;
  if (!*jit && !(*jit = (kcu_fx_jit *)calloc(1, sizeof **jit)))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "out of host memory; free memory and retry");
  if (!kfx_open(*jit))
    return kiln_fail(err, KILN_ERR_UNSUPPORTED,
                     "NVRTC (libnvrtc) was not found; install the CUDA toolkit's NVRTC");
  if (!(source = kcu_fx_source(p)))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "out of host memory; free memory and retry");
  kiln_status st = kfx_cubin(*jit, source, cc, &cubin, bytes, err);
  free(source);
  free(cubin);
  return st;
}

kiln_status kcu_fx_jit_kernel(kcu_fx_jit **jit, const kcu_fx *p, int cc, cudaKernel_t *kernel,
                              kiln_error *err) {
  *kernel = NULL;
  if (!*jit && !(*jit = (kcu_fx_jit *)calloc(1, sizeof **jit)))
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory for the fused kernels; free memory and load again");
  kcu_fx_jit *j = *jit;
  if (!kfx_open(j)) return KILN_OK; /* no NVRTC: the interpreter runs the group */
  char *source = kcu_fx_source(p);
  if (!source)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory for a fused group's source; free memory and load again");
  for (uint32_t i = 0; i < j->n; i++)
    if (strcmp(j->items[i].source, source) == 0) {
      free(source);
      *kernel = j->items[i].kernel;
      return KILN_OK;
    }
  if (j->n == j->cap) {
    uint32_t cap = j->cap ? 2 * j->cap : 8;
    kfx_compiled *items = (kfx_compiled *)realloc(j->items, cap * sizeof *items);
    if (!items) {
      free(source);
      return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                       "out of host memory for the fused kernels; free memory and load again");
    }
    j->items = items, j->cap = cap;
  }
  kfx_compiled c = {source, NULL, NULL};
  kiln_status st = kfx_compile(j, source, cc, &c, err);
  if (st != KILN_OK) {
    if (c.library) cudaLibraryUnload(c.library);
    free(source);
    return st;
  }
  j->items[j->n++] = c;
  *kernel = c.kernel;
  return KILN_OK;
}

void kcu_fx_jit_free(kcu_fx_jit *j) {
  if (!j) return;
  for (uint32_t i = 0; i < j->n; i++) {
    cudaLibraryUnload(j->items[i].library);
    free(j->items[i].source);
  }
  free(j->items);
  if (j->dl) dlclose(j->dl);
  free(j);
}

cudaError_t kcu_fx_jit_launch(cudaStream_t s, cudaKernel_t kernel, int32_t run,
                              const kcu_tensor *in, uint32_t n_in, void *out, int64_t numel) {
  struct {
    const void *in[KILN_MAX_OP_INPUTS];
    void *out;
  } io;
  memset(&io, 0, sizeof io);
  for (uint32_t k = 0; k < n_in; k++) io.in[k] = in[k].data;
  io.out = out;
  int64_t n_runs = numel / run, blocks = (n_runs + KFX_JIT_BLOCK - 1) / KFX_JIT_BLOCK;
  if (blocks > 65535LL * 16) blocks = 65535LL * 16;
  if (blocks < 1) return cudaSuccess;
  cudaLaunchAttribute attr;
  dim3 grid = {(unsigned)blocks, 1, 1}, block = {KFX_JIT_BLOCK, 1, 1};
  cudaLaunchConfig_t c = kcu_launch_config(grid, block, 0, s, 1, &attr);
  void *args[] = {&io};
  return cudaLaunchKernelExC(&c, (const void *)kernel, args);
}
