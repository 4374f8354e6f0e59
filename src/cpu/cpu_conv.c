/* CONV, CONV_TRANSPOSE and BATCH_NORM, computed directly from their definitions. Sums
 * accumulate in double and round once, so the oracle's rounding stays far below any tolerance
 * a GPU result is held to. */
#include "core/vision_shape.h"
#include "cpu/cpu_ops.h"

/* The geometry of one convolution, with a 1-d op read as 2-d of height 1. */
typedef struct conv_dims {
  int64_t n, c, h, w, o, oh, ow;
  int64_t cpg, opg; /* input and output channels per group */
} conv_dims;

static void conv_dims_of(const kiln_cpu_run *r, const kiln_op *op, const kiln_window *win,
                         conv_dims *d) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  int32_t last = x->rank - 1;
  d->n = x->dims[0];
  d->c = x->dims[1];
  d->h = win->spatial == 2 ? x->dims[2] : 1;
  d->w = x->dims[last];
  d->o = out->dims[1];
  d->oh = win->spatial == 2 ? out->dims[2] : 1;
  d->ow = out->dims[last];
  d->cpg = d->c / win->groups;
  d->opg = d->o / win->groups;
}

/* One output row at a time: acc[ow] gathers every (channel, kh, kw) tap, the inner loop
 * walking the input row with the stride. */
void kiln_cpu_conv(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *in[3] = {kiln_cpu_desc(r, op->inputs[0]), kiln_cpu_desc(r, op->inputs[1]),
                                   op->n_inputs > 2 ? kiln_cpu_desc(r, op->inputs[2]) : NULL};
  kiln_window win;
  conv_dims d;
  kiln_window_of(op, in, &win);
  conv_dims_of(r, op, &win, &d);
  kiln_dtype dt = in[0]->dtype, odt = kiln_cpu_desc(r, op->output)->dtype;
  const void *px = r->data[op->inputs[0]], *pw = r->data[op->inputs[1]];
  const void *pb = win.bias ? r->data[op->inputs[2]] : NULL;
  void *po = r->data[op->output];
  int64_t kh_n = win.kernel.h, kw_n = win.kernel.w;
  double *acc = r->scratch;
  for (int64_t n = 0; n < d.n; n++)
    for (int64_t o = 0; o < d.o; o++) {
      int64_t c0 = (o / d.opg) * d.cpg;
      double bias = pb ? (double)kiln_cpu_ldf(pb, dt, o) : 0.0;
      for (int64_t oh = 0; oh < d.oh; oh++) {
        for (int64_t ow = 0; ow < d.ow; ow++) acc[ow] = bias;
        for (int64_t c = 0; c < d.cpg; c++)
          for (int64_t kh = 0; kh < kh_n; kh++) {
            int64_t ih = oh * win.stride.h - win.padding.h + kh * win.dilation.h;
            if (ih < 0 || ih >= d.h) continue;
            int64_t xrow = ((n * d.c + c0 + c) * d.h + ih) * d.w;
            int64_t wrow = ((o * d.cpg + c) * kh_n + kh) * kw_n;
            for (int64_t kw = 0; kw < kw_n; kw++) {
              double wv = kiln_cpu_ldf(pw, dt, wrow + kw);
              int64_t shift = kw * win.dilation.w - win.padding.w;
              /* the outputs whose tap lands inside the row: 0 <= ow*stride + shift < w */
              int64_t lo = shift >= 0 ? 0 : (-shift + win.stride.w - 1) / win.stride.w;
              int64_t hi = d.w - shift <= 0 ? 0 : (d.w - shift - 1) / win.stride.w + 1;
              if (hi > d.ow) hi = d.ow;
              for (int64_t ow = lo; ow < hi; ow++)
                acc[ow] += wv * (double)kiln_cpu_ldf(px, dt, xrow + ow * win.stride.w + shift);
            }
          }
        int64_t orow = ((n * d.o + o) * d.oh + oh) * d.ow;
        for (int64_t ow = 0; ow < d.ow; ow++) kiln_cpu_stf(po, odt, orow + ow, (float)acc[ow]);
      }
    }
}

/* Each output gathers the input taps that the scatter definition sends to it: ih*stride -
 * padding + kh*dilation == oh. */
void kiln_cpu_conv_transpose(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *in[3] = {kiln_cpu_desc(r, op->inputs[0]), kiln_cpu_desc(r, op->inputs[1]),
                                   op->n_inputs > 2 ? kiln_cpu_desc(r, op->inputs[2]) : NULL};
  kiln_window win;
  conv_dims d;
  kiln_window_of(op, in, &win);
  conv_dims_of(r, op, &win, &d);
  kiln_dtype dt = in[0]->dtype, odt = kiln_cpu_desc(r, op->output)->dtype;
  const void *px = r->data[op->inputs[0]], *pw = r->data[op->inputs[1]];
  const void *pb = win.bias ? r->data[op->inputs[2]] : NULL;
  void *po = r->data[op->output];
  int64_t kh_n = win.kernel.h, kw_n = win.kernel.w, i = 0;
  for (int64_t n = 0; n < d.n; n++)
    for (int64_t o = 0; o < d.o; o++) {
      int64_t g = o / d.opg, og = o % d.opg;
      for (int64_t oh = 0; oh < d.oh; oh++)
        for (int64_t ow = 0; ow < d.ow; ow++, i++) {
          double acc = pb ? (double)kiln_cpu_ldf(pb, dt, o) : 0.0;
          for (int64_t kh = 0; kh < kh_n; kh++) {
            int64_t th = oh + win.padding.h - kh * win.dilation.h;
            if (th < 0 || th % win.stride.h || th / win.stride.h >= d.h) continue;
            for (int64_t kw = 0; kw < kw_n; kw++) {
              int64_t tw = ow + win.padding.w - kw * win.dilation.w;
              if (tw < 0 || tw % win.stride.w || tw / win.stride.w >= d.w) continue;
              int64_t ih = th / win.stride.h, iw = tw / win.stride.w;
              for (int64_t c = g * d.cpg; c < (g + 1) * d.cpg; c++)
                acc += (double)kiln_cpu_ldf(px, dt, ((n * d.c + c) * d.h + ih) * d.w + iw) *
                       (double)kiln_cpu_ldf(pw, dt, ((c * d.opg + og) * kh_n + kh) * kw_n + kw);
            }
          }
          kiln_cpu_stf(po, odt, i, (float)acc);
        }
    }
}

/* y = x * scale + shift per channel, scale = weight / sqrt(var + eps), shift = bias - mean *
 * scale: the same affine the builder folds into a convolution. */
void kiln_cpu_batch_norm(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]), *out = kiln_cpu_desc(r, op->output);
  const void *px = r->data[op->inputs[0]], *pmean = r->data[op->inputs[1]];
  const void *pvar = r->data[op->inputs[2]];
  int has_weight = (int)(op->iattr[0] & 1), has_bias = (int)((op->iattr[0] >> 1) & 1);
  const void *pweight = has_weight ? r->data[op->inputs[3]] : NULL;
  const void *pbias = has_bias ? r->data[op->inputs[3 + has_weight]] : NULL;
  void *po = r->data[op->output];
  kiln_dtype dt = x->dtype;
  int64_t channels = x->dims[1], inner = kiln_cpu_extent(x, 2, x->rank), i = 0;
  int64_t outer = x->dims[0];
  for (int64_t n = 0; n < outer; n++)
    for (int64_t c = 0; c < channels; c++) {
      double scale = 1.0 / sqrt((double)kiln_cpu_ldf(pvar, dt, c) + op->fattr[0]);
      if (pweight) scale *= (double)kiln_cpu_ldf(pweight, dt, c);
      double shift = (pbias ? (double)kiln_cpu_ldf(pbias, dt, c) : 0.0) -
                     (double)kiln_cpu_ldf(pmean, dt, c) * scale;
      for (int64_t k = 0; k < inner; k++, i++)
        kiln_cpu_stf(po, out->dtype, i, (float)((double)kiln_cpu_ldf(px, dt, i) * scale + shift));
    }
}
