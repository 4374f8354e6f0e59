/* Shape and dtype inference for every op, shared by the builder and the plan parser so
 * that a plan an engine loads has exactly the shapes the builder computed. */
#ifndef KILN_SHAPE_H
#define KILN_SHAPE_H

#include "kiln/kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest dimension a tensor may have (the metadata bounds shapes the same way). */
#define KILN_DIM_MAX ((int64_t)1 << 62)

/* Where an op sits, so a refusal reads "builder op 3 (linear): ..." or "plan op 3 ...". */
typedef struct kiln_op_site {
  const char *stage;  /* "builder" or "plan" (at most 7 bytes) */
  uint32_t index;     /* the op's index in that stage */
  kiln_status status; /* what a refusal returns */
  const char *remedy; /* appended to each message (at most 24 bytes): "; re-export the program" */
} kiln_op_site;

/* Writes the byte size of a tensor; returns -1 for an unknown dtype, a rank outside
 * 0..KILN_MAX_RANK, a dim outside 0..KILN_DIM_MAX, or a size above INT64_MAX. */
int kiln_shape_nbytes(kiln_dtype dtype, int32_t rank, const int64_t *dims, uint64_t *nbytes);

/* Formats "[2,3,4]" into buf (truncated to size) and returns buf. */
const char *kiln_shape_str(int32_t rank, const int64_t *dims, char *buf, size_t size);

/* 1 for f32, f16 and bf16. */
int kiln_dtype_is_float(kiln_dtype dtype);

/* 1 when a and b have the same rank and dims, the symbols the dims of a dynamic plan follow
 * included (two dims at one upper bound that follow different symbols differ). */
static inline int kiln_same_dims(const kiln_tensor_desc *a, const kiln_tensor_desc *b) {
  if (a->rank != b->rank) return 0;
  for (int32_t d = 0; d < a->rank; d++)
    if (a->dims[d] != b->dims[d] || a->sym[d].symbol != b->sym[d].symbol ||
        (a->sym[d].symbol &&
         (a->sym[d].coeff != b->sym[d].coeff || a->sym[d].offset != b->sym[d].offset)))
      return 0;
  return 1;
}

/* As kiln_same_dims, and the same dtype. */
static inline int kiln_same_desc(const kiln_tensor_desc *a, const kiln_tensor_desc *b) {
  return a->dtype == b->dtype && kiln_same_dims(a, b);
}

/* How many query heads share one key/value head in batch dim d of an SDPA of rank r: 1 when
 * the dims are equal; q_dim / kv_dim on the heads dim (r - 3) when kv_dim divides it (grouped-
 * query attention: key/value head = query head / group); else 0, no fit. */
static inline int64_t kiln_sdpa_kv_group(int32_t r, int32_t d, int64_t q_dim, int64_t kv_dim) {
  if (q_dim == kv_dim) return 1;
  return d == r - 3 && kv_dim > 0 && q_dim % kv_dim == 0 ? q_dim / kv_dim : 0;
}

/* Checks op (kind, input count, attributes) against its inputs, whose dtype, rank and dims
 * are already valid, and writes the output's dtype, rank, dims and nbytes. Dims in
 * attributes must already be normalized (non-negative, in range). */
kiln_status kiln_infer_op(const kiln_op *op, const kiln_tensor_desc *const *inputs,
                          const kiln_op_site *site, kiln_tensor_desc *out, kiln_error *err);

#ifdef __cplusplus
}
#endif

#endif
