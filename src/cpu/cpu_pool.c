/* MAX_POOL2D, AVG_POOL2D and ADAPTIVE_AVG_POOL2D over the last two dims, every leading dim a
 * plane (NCHW), or over H and W of [N,H,W,C] (channels_last), with PyTorch's window rules. */
#include "runtime/vision_shape.h"
#include "cpu/cpu_ops.h"

/* Element (b, y, x, c) of one image batch, NCHW being C = 1 (see kiln_planes). */
static int64_t at_in(const kiln_planes *d, int64_t b, int64_t y, int64_t x, int64_t c) {
  return ((b * d->h + y) * d->w + x) * d->channels + c;
}

static int64_t at_out(const kiln_planes *d, int64_t b, int64_t y, int64_t x, int64_t c) {
  return ((b * d->oh + y) * d->ow + x) * d->channels + c;
}

/* The largest tap, padding never chosen; a NaN in the window wins, as in PyTorch. */
void kiln_cpu_max_pool2d(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]), *out = kiln_cpu_desc(r, op->output);
  const void *px = r->data[op->inputs[0]];
  void *po = r->data[op->output];
  kiln_window win;
  kiln_planes d;
  kiln_window_of(op, &x, &win);
  kiln_planes_of(op, x, out, &d);
  for (int64_t b = 0; b < d.batch; b++)
    for (int64_t c = 0; c < d.channels; c++)
      for (int64_t oh = 0; oh < d.oh; oh++)
        for (int64_t ow = 0; ow < d.ow; ow++) {
          float best = -INFINITY;
          for (int64_t kh = 0; kh < win.kernel.h; kh++) {
            int64_t ih = oh * win.stride.h - win.padding.h + kh * win.dilation.h;
            if (ih < 0 || ih >= d.h) continue;
            for (int64_t kw = 0; kw < win.kernel.w; kw++) {
              int64_t iw = ow * win.stride.w - win.padding.w + kw * win.dilation.w;
              if (iw < 0 || iw >= d.w) continue;
              float v = kiln_cpu_ldf(px, x->dtype, at_in(&d, b, ih, iw, c));
              if (v > best || v != v) best = v;
              if (best != best) break;
            }
            if (best != best) break;
          }
          kiln_cpu_stf(po, out->dtype, at_out(&d, b, oh, ow, c), best);
        }
}

/* The window is clipped to the padded input for count_include_pad and to the input for the
 * sum; the divisor is the override, else the one of those the op names. */
void kiln_cpu_avg_pool2d(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]), *out = kiln_cpu_desc(r, op->output);
  const void *px = r->data[op->inputs[0]];
  void *po = r->data[op->output];
  kiln_window win;
  kiln_planes d;
  kiln_window_of(op, &x, &win);
  kiln_planes_of(op, x, out, &d);
  for (int64_t b = 0; b < d.batch; b++)
    for (int64_t c = 0; c < d.channels; c++)
      for (int64_t oh = 0; oh < d.oh; oh++)
        for (int64_t ow = 0; ow < d.ow; ow++) {
          int64_t h0 = oh * win.stride.h - win.padding.h, w0 = ow * win.stride.w - win.padding.w;
          int64_t h1 = h0 + win.kernel.h, w1 = w0 + win.kernel.w;
          if (h1 > d.h + win.padding.h) h1 = d.h + win.padding.h;
          if (w1 > d.w + win.padding.w) w1 = d.w + win.padding.w;
          int64_t padded = (h1 - h0) * (w1 - w0);
          if (h0 < 0) h0 = 0;
          if (w0 < 0) w0 = 0;
          if (h1 > d.h) h1 = d.h;
          if (w1 > d.w) w1 = d.w;
          double sum = 0.0;
          for (int64_t ih = h0; ih < h1; ih++)
            for (int64_t iw = w0; iw < w1; iw++)
              sum += (double)kiln_cpu_ldf(px, x->dtype, at_in(&d, b, ih, iw, c));
          int64_t divisor = win.divisor             ? win.divisor
                            : win.count_include_pad ? padded
                                                    : (h1 - h0) * (w1 - w0);
          kiln_cpu_stf(po, out->dtype, at_out(&d, b, oh, ow, c),
                       h0 < h1 && w0 < w1 ? (float)(sum / (double)divisor) : 0.0f);
        }
}

/* Output i averages input rows floor(i*H/OH) up to ceil((i+1)*H/OH). */
void kiln_cpu_adaptive_avg_pool2d(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]), *out = kiln_cpu_desc(r, op->output);
  const void *px = r->data[op->inputs[0]];
  void *po = r->data[op->output];
  kiln_planes d;
  kiln_planes_of(op, x, out, &d);
  for (int64_t b = 0; b < d.batch; b++)
    for (int64_t c = 0; c < d.channels; c++)
      for (int64_t oh = 0; oh < d.oh; oh++)
        for (int64_t ow = 0; ow < d.ow; ow++) {
          int64_t h0 = oh * d.h / d.oh, h1 = ((oh + 1) * d.h + d.oh - 1) / d.oh;
          int64_t w0 = ow * d.w / d.ow, w1 = ((ow + 1) * d.w + d.ow - 1) / d.ow;
          double sum = 0.0;
          for (int64_t ih = h0; ih < h1; ih++)
            for (int64_t iw = w0; iw < w1; iw++)
              sum += (double)kiln_cpu_ldf(px, x->dtype, at_in(&d, b, ih, iw, c));
          kiln_cpu_stf(po, out->dtype, at_out(&d, b, oh, ow, c),
                       (float)(sum / (double)((h1 - h0) * (w1 - w0))));
        }
}
