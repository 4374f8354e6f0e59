/* The geometry of the vision ops (convolution, batch norm, pooling, resize): what their
 * attributes mean for their inputs and output. Shared by shape inference and the engines'
 * init checks, so both read an op's windows the same way. */
#ifndef KILN_VISION_SHAPE_H
#define KILN_VISION_SHAPE_H

#include "kiln/kiln.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 for CONV .. UPSAMPLE_BILINEAR2D. */
int kiln_is_vision_op(kiln_op_kind kind);

static inline int kiln_is_conv_op(kiln_op_kind kind) {
  return kind == KILN_OP_CONV || kind == KILN_OP_CONV_TRANSPOSE;
}

/* One spatial pair attribute, or its default when the op has fewer attributes. */
typedef struct kiln_pair {
  int64_t h, w;
} kiln_pair;

/* The spatial windows of a CONV, CONV_TRANSPOSE or pooling op, decoded once. */
typedef struct kiln_window {
  kiln_pair kernel, stride, padding, dilation, out_padding;
  int64_t groups;
  int bias, ceil_mode, count_include_pad;
  int64_t divisor;  /* AVG_POOL2D divisor override, 0 for none */
  int32_t spatial;  /* 1 or 2 spatial dims */
  int channels_last; /* convolutions: x, w and the output hold channels innermost */
  int64_t activation; /* convolutions: kiln_activation applied last */
  int residual;       /* convolutions: the last input is added before the activation */
} kiln_window;

/* The attribute slots of a convolution's layout and epilogue: CONV 5, 6, 7; CONV_TRANSPOSE
 * 6, 7, 8 (after its output padding). */
static inline uint32_t kiln_conv_epilogue_slot(kiln_op_kind kind) {
  return kind == KILN_OP_CONV_TRANSPOSE ? 6u : 5u;
}

/* Where a convolution's dims sit: x and the output are [N,C,(H,)W] or [N,(H,)W,C]; the weight
 * is [lead, per-group, (kh,)kw] or [lead, (kh,)kw, per-group]. */
typedef struct kiln_conv_axes {
  int32_t channel;     /* x's and the output's channel dim */
  int32_t height;      /* x's and the output's H dim; -1 for a 1-d op */
  int32_t width;       /* x's and the output's W dim */
  int32_t w_per_group; /* the weight's per-group channel dim */
  int32_t w_height;    /* the weight's kh dim; -1 for a 1-d op */
  int32_t w_width;     /* the weight's kw dim */
} kiln_conv_axes;

void kiln_conv_axes_of(int32_t rank, int channels_last, kiln_conv_axes *axes);

/* The layout of a pooling or resize op as a batch of [H,W,C] images: channels_last is
 * [N,H,W,C]; NCHW ([...,H,W]) is every leading dim as the batch and C = 1, so element (b, y, x,
 * c) is at ((b*H + y)*W + x)*C + c in either, and the output's likewise with OH, OW. */
typedef struct kiln_planes {
  int64_t batch, channels, h, w, oh, ow;
} kiln_planes;

/* 1 when op's optional trailing channels_last attribute is 1 (0 when absent or not a layout op). */
int kiln_vision_channels_last(const kiln_op *op);

/* The planes of a pooling or resize op whose shapes were checked by kiln_vision_infer. */
void kiln_planes_of(const kiln_op *op, const kiln_tensor_desc *x, const kiln_tensor_desc *out,
                    kiln_planes *p);

/* Decodes op's attributes (its inputs give the kernel of a convolution). */
void kiln_window_of(const kiln_op *op, const kiln_tensor_desc *const *in, kiln_window *win);

/* Checks a vision op against its inputs, whose descs are valid, and writes the output's dtype,
 * rank and dims; on a refusal returns -1 with why (cause, naming the attribute or input)
 * written into why[size]. */
int kiln_vision_infer(const kiln_op *op, const kiln_tensor_desc *const *in, kiln_tensor_desc *out,
                      char *why, size_t size);

#ifdef __cplusplus
}
#endif

#endif
