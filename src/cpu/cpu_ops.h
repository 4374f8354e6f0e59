/* The CPU reference engine's ops: one family per file, each reading the resolved tensor
 * pointers of one run. Shapes were checked by the engine and dtypes by cpu_check.c at init,
 * so an op fails only on data (an index out of range). No op allocates. */
#ifndef KILN_CPU_OPS_H
#define KILN_CPU_OPS_H

#include "runtime/engine_internal.h"
#include "runtime/pointwise_steps.h"
#include "cpu/half.h"

#include <math.h>

/* What every op sees during one execute. */
typedef struct kiln_cpu_run {
  const kiln_plan *plan;
  void *const *data; /* per tensor: its bytes for this run */
  double *scratch;   /* kiln_cpu_scratch_count(plan) doubles */
} kiln_cpu_run;

static inline const kiln_tensor_desc *kiln_cpu_desc(const kiln_cpu_run *r, uint32_t t) {
  return &r->plan->tensors[t];
}

/* ---------------------------------------------------------------- loads and stores */

static inline int kiln_cpu_is_float(kiln_dtype dt) {
  return dt == KILN_F32 || dt == KILN_F16 || dt == KILN_BF16;
}

/* Float to integer as the GPU converts: toward zero, saturating, NaN to 0. */
static inline int64_t kiln_cpu_f2i(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775807.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

static inline float kiln_cpu_ldf(const void *p, kiln_dtype dt, int64_t i) {
  switch (dt) {
  case KILN_F32: return ((const float *)p)[i];
  case KILN_F16: return kiln_f16_to_f32(((const uint16_t *)p)[i]);
  case KILN_BF16: return kiln_bf16_to_f32(((const uint16_t *)p)[i]);
  case KILN_I64: return (float)((const int64_t *)p)[i];
  case KILN_I32: return (float)((const int32_t *)p)[i];
  default: return ((const uint8_t *)p)[i] ? 1.0f : 0.0f;
  }
}

static inline int64_t kiln_cpu_ldi(const void *p, kiln_dtype dt, int64_t i) {
  switch (dt) {
  case KILN_I64: return ((const int64_t *)p)[i];
  case KILN_I32: return ((const int32_t *)p)[i];
  case KILN_BOOL: return ((const uint8_t *)p)[i] ? 1 : 0;
  default: return kiln_cpu_f2i(kiln_cpu_ldf(p, dt, i));
  }
}

static inline void kiln_cpu_stf(void *p, kiln_dtype dt, int64_t i, float v) {
  switch (dt) {
  case KILN_F32: ((float *)p)[i] = v; break;
  case KILN_F16: ((uint16_t *)p)[i] = kiln_f32_to_f16(v); break;
  case KILN_BF16: ((uint16_t *)p)[i] = kiln_f32_to_bf16(v); break;
  case KILN_I64: ((int64_t *)p)[i] = kiln_cpu_f2i(v); break;
  case KILN_I32: {
    int64_t q = kiln_cpu_f2i(v);
    ((int32_t *)p)[i] = (int32_t)(q < INT32_MIN ? INT32_MIN : q > INT32_MAX ? INT32_MAX : q);
    break;
  }
  default: ((uint8_t *)p)[i] = v != 0.0f; break;
  }
}

/* Integers wrap to the width of the dtype, as two's complement. */
static inline void kiln_cpu_sti(void *p, kiln_dtype dt, int64_t i, int64_t v) {
  switch (dt) {
  case KILN_I64: ((int64_t *)p)[i] = v; break;
  case KILN_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)v; break;
  case KILN_BOOL: ((uint8_t *)p)[i] = v != 0; break;
  default: kiln_cpu_stf(p, dt, i, (float)v); break;
  }
}

/* ---------------------------------------------------------------- indexing (cpu_index.c) */

int64_t kiln_cpu_numel(const kiln_tensor_desc *t);
/* Product of dims [from, to). */
int64_t kiln_cpu_extent(const kiln_tensor_desc *t, int32_t from, int32_t to);
/* Element strides of t broadcast (right-aligned) to `rank` dims: 0 where t has size 1 or
 * no dim. */
void kiln_cpu_bcast_strides(const kiln_tensor_desc *t, int32_t rank, const int64_t *dims,
                            int64_t *strides);

/* Walks every element of an output shape, keeping each operand's broadcast offset (at most
 * KILN_MAX_OP_INPUTS operands). */
typedef struct kiln_cpu_iter {
  int32_t rank;
  int32_t n;
  int64_t dims[KILN_MAX_RANK];
  int64_t idx[KILN_MAX_RANK];
  int64_t strides[KILN_MAX_OP_INPUTS][KILN_MAX_RANK];
  int64_t off[KILN_MAX_OP_INPUTS];
} kiln_cpu_iter;

void kiln_cpu_iter_init(kiln_cpu_iter *it, const kiln_tensor_desc *out,
                        const kiln_tensor_desc *const *operands, int32_t n);
void kiln_cpu_iter_next(kiln_cpu_iter *it);

/* Element offset of the matrix (trailing `core` dims) of t that batch index b of the batch
 * shape bdims[brank] reads, with t's batch dims broadcast against it; a dim of t that divides
 * the batch dim is read in groups (grouped-query heads: index / (batch dim / t's dim)). */
int64_t kiln_cpu_batch_offset(const kiln_tensor_desc *t, int32_t core, int64_t b, int32_t brank,
                              const int64_t *bdims);

/* ---------------------------------------------------------------- op families */

/* cpu_check.c: refuses at init what the kernels do not handle and sizes the scratch. */
kiln_status kiln_cpu_check_plan(const kiln_engine *e, kiln_error *err);
uint64_t kiln_cpu_scratch_count(const kiln_plan *plan);

/* cpu_elementwise.c */
float kiln_cpu_activate(kiln_activation act, float x);
void kiln_cpu_binary(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_unary(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_cast(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_where(const kiln_cpu_run *r, const kiln_op *op);
/* One element of a float op in f32: ADD..DIV, MINIMUM, MAXIMUM, and the unary ops (RELU..POW,
 * ABS..HARDSIGMOID) of op, which carries GELU's iattr0 and POW's fattr0. */
float kiln_cpu_binary_f32(kiln_op_kind kind, float a, float b, float alpha);
float kiln_cpu_unary_f32(const kiln_op *op, float x);

/* cpu_logic.c: COMPARE; LOGICAL and BITWISE */
void kiln_cpu_compare(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_bool_op(const kiln_cpu_run *r, const kiln_op *op);

/* cpu_fused_pointwise.c: POINTWISE, every step in f32 and one rounding to the output dtype;
 * and the steps of an op decoded once and run on one element, shared with the norms. */
typedef struct kiln_cpu_steps {
  kiln_pw_span span;
  kiln_op unary[KILN_PW_MAX_STEPS]; /* each unary step as the op kiln_cpu_unary_f32 reads */
} kiln_cpu_steps;
/* 0 when op carries no steps. */
int kiln_cpu_steps_init(kiln_cpu_steps *st, const kiln_op *op);
/* Steps [from, to) on v; off[k] is operand input k's element offset. */
float kiln_cpu_steps_run(const kiln_cpu_run *r, const kiln_op *op, const kiln_cpu_steps *st,
                         uint32_t from, uint32_t to, float v, const int64_t *off);
void kiln_cpu_fused_pointwise(const kiln_cpu_run *r, const kiln_op *op);
/* cpu_fused_group.c: FUSED, its program per output element (f32 registers, its roundings). */
void kiln_cpu_fused(const kiln_cpu_run *r, const kiln_op *op);

/* cpu_gemm.c */
void kiln_cpu_linear(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_matmul(const kiln_cpu_run *r, const kiln_op *op);

/* cpu_normalize.c */
void kiln_cpu_softmax(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_layer_norm(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_rms_norm(const kiln_cpu_run *r, const kiln_op *op);

/* cpu_reduce.c: SUM, MEAN, AMAX; ARGMAX */
void kiln_cpu_reduce(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_argmax(const kiln_cpu_run *r, const kiln_op *op);

/* cpu_scan.c: CUMSUM */
void kiln_cpu_cumsum(const kiln_cpu_run *r, const kiln_op *op);

/* cpu_layout.c */
void kiln_cpu_copy(const kiln_cpu_run *r, const kiln_op *op); /* RESHAPE and COPY */
void kiln_cpu_permute(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_expand(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_cat(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_slice(const kiln_cpu_run *r, const kiln_op *op); /* SLICE and SELECT */

/* cpu_gather.c: an index outside the table is refused, naming the op and the index. */
kiln_status kiln_cpu_embedding(const kiln_cpu_run *r, uint32_t index, const kiln_op *op,
                               kiln_error *err);
/* out = x with slots idx[k] along dim replaced by values' slot k (in place when out is x). */
kiln_status kiln_cpu_index_copy(const kiln_cpu_run *r, uint32_t index, const kiln_op *op,
                                kiln_error *err);
kiln_status kiln_cpu_index_select(const kiln_cpu_run *r, uint32_t index, const kiln_op *op,
                                  kiln_error *err);
kiln_status kiln_cpu_gather(const kiln_cpu_run *r, uint32_t index, const kiln_op *op,
                            kiln_error *err);
kiln_status kiln_cpu_index(const kiln_cpu_run *r, uint32_t index, const kiln_op *op,
                           kiln_error *err);

/* cpu_attention.c */
void kiln_cpu_sdpa(const kiln_cpu_run *r, const kiln_op *op);

/* cpu_conv.c: CONV reads one output row of sums from the scratch */
void kiln_cpu_conv(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_conv_transpose(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_batch_norm(const kiln_cpu_run *r, const kiln_op *op);

/* cpu_pool.c */
void kiln_cpu_max_pool2d(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_avg_pool2d(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_adaptive_avg_pool2d(const kiln_cpu_run *r, const kiln_op *op);

/* cpu_resize.c */
void kiln_cpu_upsample_nearest2d(const kiln_cpu_run *r, const kiln_op *op);
void kiln_cpu_upsample_bilinear2d(const kiln_cpu_run *r, const kiln_op *op);

#endif
