/* UPSAMPLE_NEAREST2D and UPSAMPLE_BILINEAR2D over the last two dims (NCHW) or H and W of
 * [N,H,W,C] (channels_last), source indices computed in f32 by PyTorch's rules so that the same
 * pixels are chosen. */
#include "runtime/vision_shape.h"
#include "cpu/cpu_ops.h"

/* Element (b, y, x, c) of an image batch of rows of `w`, NCHW being C = 1 (see kiln_planes). */
static int64_t at(const kiln_planes *d, int64_t rows, int64_t w, int64_t b, int64_t y, int64_t x,
                  int64_t c) {
  return ((b * rows + y) * w + x) * d->channels + c;
}

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
  kiln_planes d;
  kiln_planes_of(op, x, out, &d);
  for (int64_t b = 0; b < d.batch; b++)
    for (int64_t c = 0; c < d.channels; c++)
      for (int64_t oh = 0; oh < d.oh; oh++) {
        int64_t ih = nearest_source(oh, d.h, d.oh, op->fattr[0]);
        for (int64_t ow = 0; ow < d.ow; ow++) {
          int64_t iw = nearest_source(ow, d.w, d.ow, op->fattr[1]);
          kiln_cpu_stf(po, out->dtype, at(&d, d.oh, d.ow, b, oh, ow, c),
                       kiln_cpu_ldf(px, x->dtype, at(&d, d.h, d.w, b, ih, iw, c)));
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
  kiln_planes d;
  kiln_planes_of(op, x, out, &d);
  for (int64_t b = 0; b < d.batch; b++)
    for (int64_t c = 0; c < d.channels; c++)
      for (int64_t oh = 0; oh < d.oh; oh++) {
        linear_tap th = linear_source(oh, d.h, d.oh, align, op->fattr[0]);
        for (int64_t ow = 0; ow < d.ow; ow++) {
          linear_tap tw = linear_source(ow, d.w, d.ow, align, op->fattr[1]);
          float v00 = kiln_cpu_ldf(px, x->dtype, at(&d, d.h, d.w, b, th.i0, tw.i0, c));
          float v01 = kiln_cpu_ldf(px, x->dtype, at(&d, d.h, d.w, b, th.i0, tw.i1, c));
          float v10 = kiln_cpu_ldf(px, x->dtype, at(&d, d.h, d.w, b, th.i1, tw.i0, c));
          float v11 = kiln_cpu_ldf(px, x->dtype, at(&d, d.h, d.w, b, th.i1, tw.i1, c));
          float top = (1.0f - tw.lambda) * v00 + tw.lambda * v01;
          float bottom = (1.0f - tw.lambda) * v10 + tw.lambda * v11;
          kiln_cpu_stf(po, out->dtype, at(&d, d.oh, d.ow, b, oh, ow, c),
                       (1.0f - th.lambda) * top + th.lambda * bottom);
        }
      }
}
