/* SUM, MEAN and AMAX over a bitmask of dims, with or without keepdim (the output holds the
 * kept dims in order either way). Floats accumulate in double, integers in wrapping i64;
 * AMAX propagates NaN. ARGMAX along one dim: the first largest, NaN above every number. */
#include "cpu/cpu_ops.h"

typedef struct axes {
  int32_t n;
  int64_t dims[KILN_MAX_RANK];
  int64_t strides[KILN_MAX_RANK];
  int64_t idx[KILN_MAX_RANK];
} axes;

/* Steps an odometer over the chosen axes, keeping *off the element offset in x. */
static void axes_next(axes *a, int64_t *off) {
  for (int32_t d = a->n - 1; d >= 0; d--) {
    a->idx[d]++;
    *off += a->strides[d];
    if (a->idx[d] < a->dims[d]) return;
    *off -= a->strides[d] * a->dims[d];
    a->idx[d] = 0;
  }
}

static int64_t axes_count(const axes *a) {
  int64_t n = 1;
  for (int32_t d = 0; d < a->n; d++) n *= a->dims[d];
  return n;
}

static double reduce_float(kiln_op_kind kind, const void *px, kiln_dtype dt, axes *red,
                           int64_t base) {
  int64_t n = axes_count(red), off = base;
  double acc = kind == KILN_OP_AMAX ? -INFINITY : 0.0;
  for (int64_t j = 0; j < n; j++, axes_next(red, &off)) {
    double v = kiln_cpu_ldf(px, dt, off);
    if (kind != KILN_OP_AMAX)
      acc += v;
    else if (acc == acc && (v != v || v > acc))
      acc = v;
  }
  return kind == KILN_OP_MEAN ? acc / (double)n : acc;
}

static int64_t reduce_int(kiln_op_kind kind, const void *px, kiln_dtype dt, axes *red,
                          int64_t base) {
  int64_t n = axes_count(red), off = base, most = INT64_MIN;
  uint64_t sum = 0;
  for (int64_t j = 0; j < n; j++, axes_next(red, &off)) {
    int64_t v = kiln_cpu_ldi(px, dt, off);
    sum += (uint64_t)v;
    if (v > most) most = v;
  }
  return kind == KILN_OP_AMAX ? most : (int64_t)sum;
}

void kiln_cpu_reduce(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  const void *px = r->data[op->inputs[0]];
  void *po = r->data[op->output];
  axes kept = {0}, red = {0};
  int64_t strides[KILN_MAX_RANK], stride = 1;
  for (int32_t d = x->rank - 1; d >= 0; d--) {
    strides[d] = stride;
    stride *= x->dims[d];
  }
  for (int32_t d = 0; d < x->rank; d++) {
    axes *a = (op->iattr[0] >> d) & 1 ? &red : &kept;
    a->dims[a->n] = x->dims[d];
    a->strides[a->n] = strides[d];
    a->n++;
  }
  int64_t n_out = axes_count(&kept), base = 0;
  int is_float = kiln_cpu_is_float(out->dtype);
  for (int64_t o = 0; o < n_out; o++, axes_next(&kept, &base)) {
    if (is_float)
      kiln_cpu_stf(po, out->dtype, o, (float)reduce_float(op->kind, px, x->dtype, &red, base));
    else
      kiln_cpu_sti(po, out->dtype, o, reduce_int(op->kind, px, x->dtype, &red, base));
  }
}

void kiln_cpu_argmax(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const void *px = r->data[op->inputs[0]];
  void *po = r->data[op->output];
  int32_t dim = (int32_t)op->iattr[0];
  int64_t outer = kiln_cpu_extent(x, 0, dim), n = x->dims[dim];
  int64_t inner = kiln_cpu_extent(x, dim + 1, x->rank);
  int is_float = kiln_cpu_is_float(x->dtype);
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = o * n * inner + i, best = 0;
      double top = kiln_cpu_ldf(px, x->dtype, base);
      int64_t itop = kiln_cpu_ldi(px, x->dtype, base);
      for (int64_t j = 1; j < n; j++) {
        if (is_float) {
          double v = kiln_cpu_ldf(px, x->dtype, base + j * inner);
          if (top == top && (v != v || v > top)) top = v, best = j;
        } else {
          int64_t v = kiln_cpu_ldi(px, x->dtype, base + j * inner);
          if (v > itop) itop = v, best = j;
        }
      }
      kiln_cpu_sti(po, KILN_I64, o * inner + i, best);
    }
  }
}
