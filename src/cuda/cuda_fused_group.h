/* A FUSED group's register program as its GPU kernels take it: decoded at a launch's sizes, the
 * output's dims merged where every map allows and padded to rank 4 or 8, each instruction
 * scheduled. cuda_fused_group.cu interprets it; cuda_fused_jit.c compiles it into a kernel of
 * its own at load. */
#ifndef KILN_CUDA_FUSED_GROUP_H
#define KILN_CUDA_FUSED_GROUP_H

#include "cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  KFX_FULL = 1,  /* the box is the whole output */
  KFX_OUTER = 2, /* the box covers every outer (not innermost) dim */
  KFX_INNER = 4  /* the box covers the innermost dim */
};

enum {
  KFX_A_ACC = 1, /* operand a is the previous instruction's result */
  KFX_B_ACC = 2, /* operand b is */
  KFX_SPILL = 4  /* the result is read again after the next instruction */
};

/* Runs under which an output is cut into shorter runs: about 128 threads an SM on an H200. */
#define KFX_FEW_RUNS 16384

typedef struct kcu_fx_map {
  int32_t slot, box; /* box: KFX_FULL | KFX_OUTER | KFX_INNER */
  int64_t offset;
  int64_t stride[KILN_MAX_RANK], lo[KILN_MAX_RANK], hi[KILN_MAX_RANK];
} kcu_fx_map;

/* The program as the kernel reads it: about 3.5 KB, under the 4 KB a kernel argument takes. */
typedef struct kcu_fx {
  int32_t rank, n_instrs, out_dtype;
  int32_t out_vec;  /* the output is 16-byte aligned: a run of 16 bytes stores as one vector */
  int32_t n_rf;     /* registers in the shared-memory register file */
  int32_t run;      /* V: consecutive output elements along the innermost dim a thread takes */
  int32_t narrow;   /* 32-bit coordinates and addresses (rank 4 or 8), else 64-bit (rank 8) */
  int32_t in_dtype[KILN_MAX_OP_INPUTS];
  const void *in[KILN_MAX_OP_INPUTS];
  int64_t dims[KILN_MAX_RANK]; /* coalesced */
  /* 32-bit division by dims[d] (by the runs per row for the innermost) as a multiply: n / d =
   * (t + ((n - t) >> s1)) >> s2 with t = umulhi(n, m) */
  uint32_t div_m[KILN_MAX_RANK];
  uint8_t div_s1[KILN_MAX_RANK], div_s2[KILN_MAX_RANK];
  kcu_fx_map maps[KILN_FX_MAX_MAPS];
  uint32_t code[KILN_FX_MAX_INSTRS]; /* code | dst << 4 | a << 8 | b << 12 | arg << 16 */
  uint8_t flags[KILN_FX_MAX_INSTRS]; /* KFX_A_ACC | KFX_B_ACC | KFX_SPILL */
  union {
    float f;     /* POW's exponent, GELU's tanh flag, ADD/SUB's alpha */
    int64_t i;   /* SELECT's bound */
  } imm[KILN_FX_MAX_INSTRS];
} kcu_fx;


/* p for op at plan's sizes with in and out (their data may be NULL where only the program is
 * wanted, not a launch): cudaErrorInvalidValue if it does not decode there. */
cudaError_t kcu_fx_prepare(const kiln_plan *plan, const kiln_op *op, const kcu_tensor *in,
                           const kcu_tensor *out, kcu_fx *p);

/* cuda_fused_jit.c: an engine's FUSED kernels compiled at load by NVRTC, each source compiled
 * once however many ops share it. */
typedef struct kcu_fx_jit kcu_fx_jit;

/* Compiles p's kernel for device (compute capability cc, e.g. 90), or finds it compiled:
 * *kernel NULL when NVRTC is not installed (the interpreter then runs the op). */
kiln_status kcu_fx_jit_kernel(kcu_fx_jit **jit, const kcu_fx *p, int cc, cudaKernel_t *kernel,
                              kiln_error *err);
void kcu_fx_jit_free(kcu_fx_jit *jit);
/* Test hook: NVRTC's cubin of p's kernel for sm_<cc>, compiled and dropped (no device needed):
 * its size in *bytes, or an error naming what NVRTC said. */
kiln_status kcu_fx_jit_cubin_size(kcu_fx_jit **jit, const kcu_fx *p, int cc, size_t *bytes,
                                  kiln_error *err);
/* Launches kernel (compiled for a program, its sizes, dtypes and run length) on in's and out's
 * data. */
cudaError_t kcu_fx_jit_launch(cudaStream_t s, cudaKernel_t kernel, int32_t run,
                              const kcu_tensor *in, uint32_t n_in, void *out, int64_t numel);
/* The CUDA C++ source of p's kernel (kfx_main), malloc'd; NULL when out of memory. */
char *kcu_fx_source(const kcu_fx *p);

#ifdef __cplusplus
}
#endif

#endif
