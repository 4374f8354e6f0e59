/* The geometry of the vision ops (convolution, batch norm, pooling, resize): what their
 * attributes mean for their inputs and output. Shared by shape inference and the engines'
 * init checks, so both read an op's windows the same way. */
#ifndef KILN_VISION_SHAPE_H
#define KILN_VISION_SHAPE_H

#include "kiln/kiln.h"

#include <stddef.h>

/* 1 for CONV .. UPSAMPLE_BILINEAR2D. */
int kiln_is_vision_op(kiln_op_kind kind);

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
} kiln_window;

/* Decodes op's attributes (its inputs give the kernel of a convolution). */
void kiln_window_of(const kiln_op *op, const kiln_tensor_desc *const *in, kiln_window *win);

/* Checks a vision op against its inputs, whose descs are valid, and writes the output's dtype,
 * rank and dims; on a refusal returns -1 with why (cause, naming the attribute or input)
 * written into why[size]. */
int kiln_vision_infer(const kiln_op *op, const kiln_tensor_desc *const *in, kiln_tensor_desc *out,
                      char *why, size_t size);

#endif
