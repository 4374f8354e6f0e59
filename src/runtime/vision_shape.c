/* Windows and output shapes of convolution, batch norm, pooling and resize, PyTorch's rules. */
#include "runtime/vision_shape.h"

#include "runtime/shape.h"

#include <stdarg.h>
#include <stdio.h>

#define PAIR_LIMIT ((int64_t)0x7fffffff)

int kiln_is_vision_op(kiln_op_kind kind) {
  return kind >= KILN_OP_CONV && kind <= KILN_OP_UPSAMPLE_BILINEAR2D;
}

/* Integer attributes each vision op takes, in order of kiln_op_kind from CONV; a convolution
 * may also carry its three optional layout and epilogue attributes. */
static const uint32_t vision_iattrs[] = {5, 6, 1, 5, 6, 1, 1, 2};

void kiln_conv_axes_of(int32_t rank, int channels_last, kiln_conv_axes *axes) {
  int two = rank == 4;
  axes->channel = channels_last ? rank - 1 : 1;
  axes->width = channels_last ? rank - 2 : rank - 1;
  axes->height = two ? (channels_last ? 1 : 2) : -1;
  axes->w_per_group = axes->channel;
  axes->w_width = axes->width;
  axes->w_height = axes->height;
}

/* 1 where the op takes an optional channels_last attribute after those. */
static const uint8_t vision_has_layout[] = {0, 0, 0, 1, 1, 1, 1, 1};

static kiln_pair pair_at(const kiln_op *op, uint32_t slot, int64_t h, int64_t w) {
  kiln_pair p = {h, w};
  if (slot < op->n_iattr) p.h = KILN_PAIR_H(op->iattr[slot]), p.w = KILN_PAIR_W(op->iattr[slot]);
  return p;
}

static int64_t int_at(const kiln_op *op, uint32_t slot, int64_t fallback) {
  return slot < op->n_iattr ? op->iattr[slot] : fallback;
}

int kiln_vision_channels_last(const kiln_op *op) {
  if (!kiln_is_vision_op(op->kind) || !vision_has_layout[op->kind - KILN_OP_CONV]) return 0;
  return int_at(op, vision_iattrs[op->kind - KILN_OP_CONV], 0) == 1;
}

void kiln_planes_of(const kiln_op *op, const kiln_tensor_desc *x, const kiln_tensor_desc *out,
                    kiln_planes *p) {
  int32_t hd = x->rank - 2 - kiln_vision_channels_last(op);
  p->batch = 1;
  for (int32_t d = 0; d < hd; d++) p->batch *= x->dims[d];
  p->channels = hd == x->rank - 2 ? 1 : x->dims[x->rank - 1];
  p->h = x->dims[hd];
  p->w = x->dims[hd + 1];
  p->oh = out->dims[hd];
  p->ow = out->dims[hd + 1];
}

void kiln_window_of(const kiln_op *op, const kiln_tensor_desc *const *in, kiln_window *win) {
  const kiln_window none = {{1, 1}, {1, 1}, {0, 0}, {1, 1}, {0, 0}, 1, 0, 0, 0, 0, 2, 0, 0, 0};
  *win = none;
  switch (op->kind) {
  case KILN_OP_CONV:
  case KILN_OP_CONV_TRANSPOSE: {
    const kiln_tensor_desc *w = in[1];
    uint32_t slot = kiln_conv_epilogue_slot(op->kind);
    kiln_conv_axes axes;
    win->channels_last = int_at(op, slot, 0) != 0;
    win->activation = int_at(op, slot + 1, KILN_ACT_NONE);
    win->residual = int_at(op, slot + 2, 0) != 0;
    kiln_conv_axes_of(w->rank, win->channels_last, &axes);
    win->spatial = in[0]->rank == 3 ? 1 : 2;
    win->kernel.w = w->rank >= 3 ? w->dims[axes.w_width] : 0;
    win->kernel.h = w->rank == 4 ? w->dims[axes.w_height] : 1;
    win->stride = pair_at(op, 0, 1, 1);
    win->padding = pair_at(op, 1, 0, 0);
    win->dilation = pair_at(op, 2, 1, 1);
    win->groups = int_at(op, 3, 1);
    win->bias = int_at(op, 4, 0) != 0;
    if (op->kind == KILN_OP_CONV_TRANSPOSE) win->out_padding = pair_at(op, 5, 0, 0);
    break;
  }
  case KILN_OP_MAX_POOL2D:
    win->kernel = pair_at(op, 0, 1, 1);
    win->stride = pair_at(op, 1, 1, 1);
    win->padding = pair_at(op, 2, 0, 0);
    win->dilation = pair_at(op, 3, 1, 1);
    win->ceil_mode = int_at(op, 4, 0) != 0;
    break;
  case KILN_OP_AVG_POOL2D:
    win->kernel = pair_at(op, 0, 1, 1);
    win->stride = pair_at(op, 1, 1, 1);
    win->padding = pair_at(op, 2, 0, 0);
    win->ceil_mode = int_at(op, 3, 0) != 0;
    win->count_include_pad = int_at(op, 4, 0) != 0;
    win->divisor = int_at(op, 5, 0);
    break;
  default: break;
  }
}

static int refuse(char *why, size_t size, const char *fmt, ...) KILN_PRINTF(3, 4);
static int refuse(char *why, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, size, fmt, ap);
  va_end(ap);
  return -1;
}

static int pair_ok(kiln_pair p, int64_t min) {
  return p.h >= min && p.w >= min && p.h <= PAIR_LIMIT && p.w <= PAIR_LIMIT;
}

/* floor((in + 2*pad - span) / stride) + 1, rounded up instead under ceil_mode (a pool's last
 * window then must still start inside the input or its left padding); -1 when no window fits. */
static int64_t sliding_out(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                           int64_t dilation, int ceil_mode) {
  int64_t span, room, out;
  if (__builtin_mul_overflow(dilation, kernel - 1, &span) || span > KILN_DIM_MAX) return -1;
  room = in + 2 * pad - span - 1;
  if (room < 0) return -1;
  out = (room + (ceil_mode ? stride - 1 : 0)) / stride + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) out--;
  return out;
}

/* (in - 1)*stride - 2*pad + dilation*(kernel - 1) + out_pad + 1, or -1 when not a size. */
static int64_t transposed_out(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                              int64_t dilation, int64_t out_pad) {
  int64_t grown, span;
  if (in < 1 || __builtin_mul_overflow(in - 1, stride, &grown) ||
      __builtin_mul_overflow(dilation, kernel - 1, &span) || span > KILN_DIM_MAX ||
      grown > KILN_DIM_MAX - span - out_pad - 1)
    return -1;
  grown += span + out_pad + 1 - 2 * pad;
  return grown >= 1 ? grown : -1;
}

static int is_channel_vector(const kiln_tensor_desc *t, int64_t channels) {
  return t->rank == 1 && t->dims[0] == channels;
}

static int infer_conv(const kiln_op *op, const kiln_tensor_desc *const *in, kiln_tensor_desc *out,
                      char *why, size_t size) {
  const kiln_tensor_desc *x = in[0], *w = in[1];
  int transposed = op->kind == KILN_OP_CONV_TRANSPOSE;
  uint32_t slot = kiln_conv_epilogue_slot(op->kind);
  kiln_window win;
  kiln_conv_axes ax;
  int64_t sizes[2], outs[2];
  if (x->rank != 3 && x->rank != 4)
    return refuse(why, size, "input 0 has rank %lld but must be [N,C,W] or [N,C,H,W]",
                  (long long)x->rank);
  if (w->rank != x->rank)
    return refuse(why, size, "the weight has rank %lld but the input has rank %lld",
                  (long long)w->rank, (long long)x->rank);
  for (uint32_t k = slot; k < op->n_iattr; k++)
    if (k != slot + 1 && op->iattr[k] != 0 && op->iattr[k] != 1)
      return refuse(why, size, "iattr%lld (%s) is %lld but must be 0 or 1", (long long)k,
                    k == slot ? "channels_last" : "residual", (long long)op->iattr[k]);
  kiln_window_of(op, in, &win);
  if (win.activation != KILN_ACT_NONE && win.activation != KILN_ACT_RELU)
    return refuse(why, size, "iattr%lld (activation) is %lld but a convolution fuses only 0 "
                  "(none) or 1 (relu); apply other activations as their own op",
                  (long long)(slot + 1), (long long)win.activation);
  kiln_conv_axes_of(x->rank, win.channels_last, &ax);
  if (!pair_ok(win.stride, 1) || !pair_ok(win.dilation, 1) || !pair_ok(win.padding, 0) ||
      !pair_ok(win.out_padding, 0))
    return refuse(why, size, "stride %lld or dilation %lld (packed pairs) is below 1 or padding "
                  "below 0; pass pairs of 0..2^31-1",
                  (long long)int_at(op, 0, 0), (long long)int_at(op, 2, 0));
  if (win.spatial == 1 && (win.stride.h != 1 || win.padding.h != 0 || win.dilation.h != 1 ||
                           win.out_padding.h != 0))
    return refuse(why, size, "a 1-d convolution's h attributes must be stride 1, padding 0, "
                  "dilation 1, but stride h is %lld, padding h %lld",
                  (long long)win.stride.h, (long long)win.padding.h);
  if (int_at(op, 4, 0) != 0 && int_at(op, 4, 0) != 1)
    return refuse(why, size, "iattr4 (bias present) is %lld but must be 0 or 1",
                  (long long)int_at(op, 4, 0));
  if (op->n_inputs != 2u + (uint32_t)win.bias + (uint32_t)win.residual)
    return refuse(why, size, "has %lld inputs but iattr4 (bias present) is %lld and the "
                  "residual flag %lld",
                  (long long)op->n_inputs, (long long)win.bias, (long long)win.residual);
  int64_t groups = win.groups, channels = x->dims[ax.channel], per_group_in, outputs;
  if (groups < 1 || groups > PAIR_LIMIT || channels % groups || w->dims[0] % groups)
    return refuse(why, size, "groups %lld must be 1 or more and divide the %lld input channels "
                  "and the weight's dim 0",
                  (long long)groups, (long long)channels);
  /* A weight dim times groups may pass 2^63 in a damaged plan: refuse it, never wrap. */
  if (__builtin_mul_overflow(w->dims[transposed ? 0 : ax.w_per_group], transposed ? 1 : groups,
                             &per_group_in) ||
      __builtin_mul_overflow(w->dims[transposed ? ax.w_per_group : 0], transposed ? groups : 1,
                             &outputs))
    return refuse(why, size, "the weight's dims times %lld groups exceed 2^63; pass a smaller "
                  "weight or fewer groups",
                  (long long)groups);
  if (per_group_in != channels)
    return refuse(why, size, "the input has %lld channels but the weight with its groups "
                  "expects %lld",
                  (long long)channels, (long long)per_group_in);
  if (win.kernel.h < 1 || win.kernel.w < 1)
    return refuse(why, size, "the kernel %lldx%lld is empty", (long long)win.kernel.h,
                  (long long)win.kernel.w);
  if (transposed && (win.out_padding.h >= (win.stride.h > win.dilation.h ? win.stride.h : win.dilation.h) ||
                     win.out_padding.w >= (win.stride.w > win.dilation.w ? win.stride.w : win.dilation.w)))
    return refuse(why, size, "output padding %lldx%lld must be below the stride or the dilation",
                  (long long)win.out_padding.h, (long long)win.out_padding.w);
  if (win.bias && !is_channel_vector(in[2], outputs))
    return refuse(why, size, "the bias must be [%lld] but has rank %lld", (long long)outputs,
                  (long long)in[2]->rank);
  sizes[0] = win.spatial == 2 ? x->dims[ax.height] : 1;
  sizes[1] = x->dims[ax.width];
  for (int k = 0; k < 2; k++) {
    int64_t kernel = k ? win.kernel.w : win.kernel.h, stride = k ? win.stride.w : win.stride.h;
    int64_t pad = k ? win.padding.w : win.padding.h, dil = k ? win.dilation.w : win.dilation.h;
    outs[k] = transposed ? transposed_out(sizes[k], kernel, stride, pad, dil,
                                          k ? win.out_padding.w : win.out_padding.h)
                         : sliding_out(sizes[k], kernel, stride, pad, dil, 0);
    if (outs[k] < 1)
      return refuse(why, size, "the input's spatial size %lld is too small for its kernel, "
                    "padding and dilation (spatial dim %lld)",
                    (long long)sizes[k], (long long)k);
  }
  *out = *x;
  out->dims[ax.channel] = outputs;
  if (win.spatial == 2) out->dims[ax.height] = outs[0];
  out->dims[ax.width] = outs[1];
  if (win.residual) {
    const kiln_tensor_desc *r = in[op->n_inputs - 1];
    int same = r->rank == out->rank;
    for (int32_t d = 0; same && d < out->rank; d++) same = r->dims[d] == out->dims[d];
    if (!same)
      return refuse(why, size, "the residual (input %lld) must have the output's shape",
                    (long long)(op->n_inputs - 1));
  }
  return 0;
}

static int infer_batch_norm(const kiln_op *op, const kiln_tensor_desc *const *in,
                            kiln_tensor_desc *out, char *why, size_t size) {
  const kiln_tensor_desc *x = in[0];
  int64_t flags = op->iattr[0];
  if (x->rank < 2)
    return refuse(why, size, "input 0 has rank %lld but needs [N,C,...]", (long long)x->rank);
  if (flags < 0 || flags > 3)
    return refuse(why, size, "iattr0 %lld must be 0..3 (bit0 weight, bit1 bias)",
                  (long long)flags);
  if (op->n_inputs != 3u + (uint32_t)(flags & 1) + (uint32_t)(flags >> 1))
    return refuse(why, size, "has %lld inputs but flags %lld mean x, mean, var, then weight "
                  "and bias as present",
                  (long long)op->n_inputs, (long long)flags);
  if (op->fattr[0] < 0)
    return refuse(why, size, "eps must not be negative");
  for (uint32_t i = 1; i < op->n_inputs; i++)
    if (!is_channel_vector(in[i], x->dims[1]))
      return refuse(why, size, "input %lld must be [%lld], one value per channel", (long long)i,
                    (long long)x->dims[1]);
  *out = *x;
  return 0;
}

static int infer_pool(const kiln_op *op, const kiln_tensor_desc *const *in, kiln_tensor_desc *out,
                      int32_t hd, char *why, size_t size) {
  const kiln_tensor_desc *x = in[0];
  kiln_window win;
  int64_t outs[2];
  kiln_window_of(op, in, &win);
  if (!pair_ok(win.kernel, 1) || !pair_ok(win.stride, 1) || !pair_ok(win.dilation, 1) ||
      !pair_ok(win.padding, 0))
    return refuse(why, size, "kernel %lld or stride %lld (packed pairs) is below 1, or padding "
                  "or dilation out of range",
                  (long long)op->iattr[0], (long long)op->iattr[1]);
  if (win.padding.h > win.kernel.h / 2 || win.padding.w > win.kernel.w / 2)
    return refuse(why, size, "padding %lldx%lld is more than half the kernel",
                  (long long)win.padding.h, (long long)win.padding.w);
  for (uint32_t slot = op->kind == KILN_OP_MAX_POOL2D ? 4 : 3; slot < 5 && slot < op->n_iattr; slot++)
    if (op->iattr[slot] != 0 && op->iattr[slot] != 1)
      return refuse(why, size, "iattr%lld is %lld but must be 0 or 1", (long long)slot,
                    (long long)op->iattr[slot]);
  if (win.divisor < 0 || win.divisor > PAIR_LIMIT)
    return refuse(why, size, "the divisor override %lld must be 0 (none) or positive",
                  (long long)win.divisor);
  for (int k = 0; k < 2; k++) {
    int64_t in_size = x->dims[hd + k];
    outs[k] = sliding_out(in_size, k ? win.kernel.w : win.kernel.h, k ? win.stride.w : win.stride.h,
                          k ? win.padding.w : win.padding.h, k ? win.dilation.w : win.dilation.h,
                          win.ceil_mode);
    if (outs[k] < 1)
      return refuse(why, size, "the input's spatial size %lld is smaller than the window "
                    "(spatial dim %lld)",
                    (long long)in_size, (long long)k);
  }
  *out = *x;
  out->dims[hd] = outs[0];
  out->dims[hd + 1] = outs[1];
  return 0;
}

/* ADAPTIVE_AVG_POOL2D and the upsamples: the output size is the attribute. */
static int infer_resize(const kiln_op *op, const kiln_tensor_desc *const *in,
                        kiln_tensor_desc *out, int32_t hd, char *why, size_t size) {
  const kiln_tensor_desc *x = in[0];
  kiln_pair to = pair_at(op, 0, 0, 0);
  if (!pair_ok(to, 1))
    return refuse(why, size, "output size %lldx%lld must be 1..2^31-1 each", (long long)to.h,
                  (long long)to.w);
  if (x->dims[hd] < 1 || x->dims[hd + 1] < 1)
    return refuse(why, size, "the input's spatial size %lldx%lld is empty",
                  (long long)x->dims[hd], (long long)x->dims[hd + 1]);
  if (op->kind == KILN_OP_UPSAMPLE_BILINEAR2D && op->iattr[1] != 0 && op->iattr[1] != 1)
    return refuse(why, size, "iattr1 (align_corners) is %lld but must be 0 or 1",
                  (long long)op->iattr[1]);
  /* A source index is dst / scale in f32, then an integer: bound the scale so it stays one. */
  for (int k = 0; k < 2; k++)
    if (!(op->fattr[k] == 0 || (op->fattr[k] >= 1.0 / PAIR_LIMIT && op->fattr[k] <= PAIR_LIMIT)))
      return refuse(why, size, "scale factor %g must be 0 (from the sizes) or 2^-31..2^31",
                    op->fattr[k]);
  *out = *x;
  out->dims[hd] = to.h;
  out->dims[hd + 1] = to.w;
  return 0;
}

int kiln_vision_infer(const kiln_op *op, const kiln_tensor_desc *const *in, kiln_tensor_desc *out,
                      char *why, size_t size) {
  const kiln_tensor_desc *x = in[0];
  uint32_t want = vision_iattrs[op->kind - KILN_OP_CONV];
  int layout = vision_has_layout[op->kind - KILN_OP_CONV];
  if (kiln_is_conv_op(op->kind)) {
    if (op->n_iattr < want || op->n_iattr > want + 3)
      return refuse(why, size, "takes %lld to %lld integer attributes but has %lld",
                    (long long)want, (long long)(want + 3), (long long)op->n_iattr);
  } else if (op->n_iattr != want && !(layout && op->n_iattr == want + 1)) {
    return refuse(why, size, "takes %lld integer attributes%s but has %lld", (long long)want,
                  layout ? " (one more: channels_last)" : "", (long long)op->n_iattr);
  }
  if (layout && op->n_iattr > want && op->iattr[want] != 0 && op->iattr[want] != 1)
    return refuse(why, size, "iattr%lld (channels_last) is %lld but must be 0 or 1",
                  (long long)want, (long long)op->iattr[want]);
  for (uint32_t i = 0; i < op->n_inputs; i++)
    if (!kiln_dtype_is_float(in[i]->dtype) || in[i]->dtype != x->dtype)
      return refuse(why, size, "input %lld must be a float of input 0's dtype (dtype %lld)",
                    (long long)i, (long long)in[i]->dtype);
  if (kiln_is_conv_op(op->kind))
    return infer_conv(op, in, out, why, size);
  if (op->kind == KILN_OP_BATCH_NORM) return infer_batch_norm(op, in, out, why, size);
  if (x->rank < 3)
    return refuse(why, size, "input 0 has rank %lld but needs [...,C,H,W]",
                  (long long)x->rank);
  if (kiln_vision_channels_last(op) && x->rank != 4)
    return refuse(why, size, "input 0 has rank %lld but channels_last needs [N,H,W,C]",
                  (long long)x->rank);
  int32_t hd = x->rank - 2 - kiln_vision_channels_last(op);
  if (op->kind == KILN_OP_MAX_POOL2D || op->kind == KILN_OP_AVG_POOL2D)
    return infer_pool(op, in, out, hd, why, size);
  return infer_resize(op, in, out, hd, why, size);
}
