/* UPSAMPLE_NEAREST2D and UPSAMPLE_BILINEAR2D over the last two dims, source indices computed in
 * f32 by PyTorch's rules so that the same pixels are chosen. */
#include "cpu/cpu_ops.h"

/* input/output, or 1/scale when the op was given a scale factor. */
static float size_ratio(int64_t in, int64_t out, double scale) {
  return scale > 0.0 ? (float)(1.0 / scale) : (float)in / (float)out;
}

static int64_t nearest_source(int64_t dst, int64_t in, int64_t out, double scale) {
  if (out == in) return dst;
  if (out == 2 * in) return dst >> 1;
  int64_t src = (int64_t)floorf((float)dst * size_ratio(in, out, scale));
  return src < in - 1 ? src : in - 1;
}

void kiln_cpu_upsample_nearest2d(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]), *out = kiln_cpu_desc(r, op->output);
  const void *px = r->data[op->inputs[0]];
  void *po = r->data[op->output];
  int64_t planes = kiln_cpu_extent(x, 0, x->rank - 2), i = 0;
  int64_t h = x->dims[x->rank - 2], w = x->dims[x->rank - 1];
  int64_t oh_n = out->dims[out->rank - 2], ow_n = out->dims[out->rank - 1];
  for (int64_t p = 0; p < planes; p++)
    for (int64_t oh = 0; oh < oh_n; oh++) {
      int64_t ih = nearest_source(oh, h, oh_n, op->fattr[0]);
      for (int64_t ow = 0; ow < ow_n; ow++, i++) {
        int64_t iw = nearest_source(ow, w, ow_n, op->fattr[1]);
        kiln_cpu_stf(po, out->dtype, i, kiln_cpu_ldf(px, x->dtype, (p * h + ih) * w + iw));
      }
    }
}

/* The two source taps of one output coordinate and the weight of the second. */
typedef struct linear_tap {
  int64_t i0, i1;
  float lambda;
} linear_tap;

static linear_tap linear_source(int64_t dst, int64_t in, int64_t out, int align_corners,
                                double scale) {
  linear_tap t;
  float real;
  if (align_corners) {
    float ratio = out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
    real = ratio * (float)dst;
  } else {
    real = size_ratio(in, out, scale) * ((float)dst + 0.5f) - 0.5f;
    if (real < 0.0f) real = 0.0f;
  }
  t.i0 = (int64_t)floorf(real);
  if (t.i0 > in - 1) t.i0 = in - 1;
  t.lambda = real - (float)t.i0;
  t.lambda = t.lambda < 0.0f ? 0.0f : t.lambda > 1.0f ? 1.0f : t.lambda;
  t.i1 = t.i0 + (t.i0 < in - 1 ? 1 : 0);
  return t;
}

void kiln_cpu_upsample_bilinear2d(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]), *out = kiln_cpu_desc(r, op->output);
  const void *px = r->data[op->inputs[0]];
  void *po = r->data[op->output];
  int align = op->iattr[1] != 0;
  int64_t planes = kiln_cpu_extent(x, 0, x->rank - 2), i = 0;
  int64_t h = x->dims[x->rank - 2], w = x->dims[x->rank - 1];
  int64_t oh_n = out->dims[out->rank - 2], ow_n = out->dims[out->rank - 1];
  for (int64_t p = 0; p < planes; p++)
    for (int64_t oh = 0; oh < oh_n; oh++) {
      linear_tap th = linear_source(oh, h, oh_n, align, op->fattr[0]);
      const int64_t row0 = (p * h + th.i0) * w, row1 = (p * h + th.i1) * w;
      for (int64_t ow = 0; ow < ow_n; ow++, i++) {
        linear_tap tw = linear_source(ow, w, ow_n, align, op->fattr[1]);
        float top = (1.0f - tw.lambda) * kiln_cpu_ldf(px, x->dtype, row0 + tw.i0) +
                    tw.lambda * kiln_cpu_ldf(px, x->dtype, row0 + tw.i1);
        float bottom = (1.0f - tw.lambda) * kiln_cpu_ldf(px, x->dtype, row1 + tw.i0) +
                       tw.lambda * kiln_cpu_ldf(px, x->dtype, row1 + tw.i1);
        kiln_cpu_stf(po, out->dtype, i, (1.0f - th.lambda) * top + th.lambda * bottom);
      }
    }
}
