/* CONV, CONV_TRANSPOSE and BATCH_NORM, computed directly from their definitions. Sums
 * accumulate in double and round once, so the oracle's rounding stays far below any tolerance
 * a GPU result is held to. */
#include "runtime/vision_shape.h"
#include "cpu/cpu_ops.h"

/* The geometry of one convolution, with a 1-d op read as 2-d of height 1, and the element
 * strides of x, the weight and the output in either layout. */
typedef struct conv_dims {
  int64_t n, c, h, w, o, oh, ow;
  int64_t cpg, opg; /* input and output channels per group */
  int64_t xs_n, xs_c, xs_h, xs_w; /* x */
  int64_t ws_lead, ws_group, ws_kh, ws_kw; /* the weight's dim 0, per-group channel, kh, kw */
  int64_t os_n, os_c, os_h, os_w; /* the output and the residual */
} conv_dims;

/* Strides of a [n, c, h, w] tensor held NCHW or NHWC. */
static void layout_strides(int channels_last, int64_t c, int64_t h, int64_t w, int64_t *sn,
                           int64_t *sc, int64_t *sh, int64_t *sw) {
  *sn = c * h * w;
  *sc = channels_last ? 1 : h * w;
  *sh = channels_last ? w * c : w;
  *sw = channels_last ? c : 1;
}

static void conv_dims_of(const kiln_cpu_run *r, const kiln_op *op, const kiln_window *win,
                         conv_dims *d) {
  const kiln_tensor_desc *x = kiln_cpu_desc(r, op->inputs[0]);
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  kiln_conv_axes ax;
  int64_t wk = op->kind == KILN_OP_CONV ? 0 : 1; /* CONV_TRANSPOSE's per-group dim is O/g */
  kiln_conv_axes_of(x->rank, win->channels_last, &ax);
  d->n = x->dims[0];
  d->c = x->dims[ax.channel];
  d->h = win->spatial == 2 ? x->dims[ax.height] : 1;
  d->w = x->dims[ax.width];
  d->o = out->dims[ax.channel];
  d->oh = win->spatial == 2 ? out->dims[ax.height] : 1;
  d->ow = out->dims[ax.width];
  d->cpg = d->c / win->groups;
  d->opg = d->o / win->groups;
  layout_strides(win->channels_last, d->c, d->h, d->w, &d->xs_n, &d->xs_c, &d->xs_h, &d->xs_w);
  layout_strides(win->channels_last, d->o, d->oh, d->ow, &d->os_n, &d->os_c, &d->os_h, &d->os_w);
  layout_strides(win->channels_last, wk ? d->opg : d->cpg, win->kernel.h, win->kernel.w,
                 &d->ws_lead, &d->ws_group, &d->ws_kh, &d->ws_kw);
}

/* The epilogue both convolutions share: the residual, then the activation, one rounding. */
static void store_output(const kiln_cpu_run *r, const kiln_op *op, const kiln_window *win,
                         int64_t at, double acc) {
  const kiln_tensor_desc *out = kiln_cpu_desc(r, op->output);
  if (win->residual) acc += (double)kiln_cpu_ldf(r->data[op->inputs[op->n_inputs - 1]],
                                                 out->dtype, at);
  if (win->activation == KILN_ACT_RELU && acc < 0) acc = 0;
  kiln_cpu_stf(r->data[op->output], out->dtype, at, (float)acc);
}

/* One output row at a time: acc[ow] gathers every (channel, kh, kw) tap, the inner loop
 * walking the input row with the stride. */
void kiln_cpu_conv(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *in[KILN_MAX_OP_INPUTS];
  kiln_window win;
  conv_dims d;
  for (uint32_t k = 0; k < op->n_inputs; k++) in[k] = kiln_cpu_desc(r, op->inputs[k]);
  kiln_window_of(op, in, &win);
  conv_dims_of(r, op, &win, &d);
  kiln_dtype dt = in[0]->dtype;
  const void *px = r->data[op->inputs[0]], *pw = r->data[op->inputs[1]];
  const void *pb = win.bias ? r->data[op->inputs[2]] : NULL;
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
            int64_t xrow = n * d.xs_n + (c0 + c) * d.xs_c + ih * d.xs_h;
            int64_t wrow = o * d.ws_lead + c * d.ws_group + kh * d.ws_kh;
            for (int64_t kw = 0; kw < kw_n; kw++) {
              double wv = kiln_cpu_ldf(pw, dt, wrow + kw * d.ws_kw);
              int64_t shift = kw * win.dilation.w - win.padding.w;
              /* the outputs whose tap lands inside the row: 0 <= ow*stride + shift < w */
              int64_t lo = shift >= 0 ? 0 : (-shift + win.stride.w - 1) / win.stride.w;
              int64_t hi = d.w - shift <= 0 ? 0 : (d.w - shift - 1) / win.stride.w + 1;
              if (hi > d.ow) hi = d.ow;
              for (int64_t ow = lo; ow < hi; ow++)
                acc[ow] += wv * (double)kiln_cpu_ldf(
                                    px, dt, xrow + (ow * win.stride.w + shift) * d.xs_w);
            }
          }
        int64_t orow = n * d.os_n + o * d.os_c + oh * d.os_h;
        for (int64_t ow = 0; ow < d.ow; ow++) store_output(r, op, &win, orow + ow * d.os_w, acc[ow]);
      }
    }
}

/* Each output gathers the input taps that the scatter definition sends to it: ih*stride -
 * padding + kh*dilation == oh. */
void kiln_cpu_conv_transpose(const kiln_cpu_run *r, const kiln_op *op) {
  const kiln_tensor_desc *in[KILN_MAX_OP_INPUTS];
  kiln_window win;
  conv_dims d;
  for (uint32_t k = 0; k < op->n_inputs; k++) in[k] = kiln_cpu_desc(r, op->inputs[k]);
  kiln_window_of(op, in, &win);
  conv_dims_of(r, op, &win, &d);
  kiln_dtype dt = in[0]->dtype;
  const void *px = r->data[op->inputs[0]], *pw = r->data[op->inputs[1]];
  const void *pb = win.bias ? r->data[op->inputs[2]] : NULL;
  int64_t kh_n = win.kernel.h, kw_n = win.kernel.w;
  for (int64_t n = 0; n < d.n; n++)
    for (int64_t o = 0; o < d.o; o++) {
      int64_t g = o / d.opg, og = o % d.opg;
      for (int64_t oh = 0; oh < d.oh; oh++)
        for (int64_t ow = 0; ow < d.ow; ow++) {
          double acc = pb ? (double)kiln_cpu_ldf(pb, dt, o) : 0.0;
          for (int64_t kh = 0; kh < kh_n; kh++) {
            int64_t th = oh + win.padding.h - kh * win.dilation.h;
            if (th < 0 || th % win.stride.h || th / win.stride.h >= d.h) continue;
            for (int64_t kw = 0; kw < kw_n; kw++) {
              int64_t tw = ow + win.padding.w - kw * win.dilation.w;
              if (tw < 0 || tw % win.stride.w || tw / win.stride.w >= d.w) continue;
              int64_t ih = th / win.stride.h, iw = tw / win.stride.w;
              for (int64_t c = g * d.cpg; c < (g + 1) * d.cpg; c++)
                acc += (double)kiln_cpu_ldf(px, dt,
                                            n * d.xs_n + c * d.xs_c + ih * d.xs_h + iw * d.xs_w) *
                       (double)kiln_cpu_ldf(pw, dt, c * d.ws_lead + og * d.ws_group +
                                                        kh * d.ws_kh + kw * d.ws_kw);
            }
          }
          store_output(r, op, &win, n * d.os_n + o * d.os_c + oh * d.os_h + ow * d.os_w, acc);
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
