/* The channels-last layout pass: a CNN's convolutions, and the layout-agnostic ops fed by
 * them, run on NHWC tensors, with one PERMUTE at each edge of that region. */
#ifndef KILN_LAYOUT_CHANNELS_LAST_H
#define KILN_LAYOUT_CHANNELS_LAST_H

#include "builder/graph.h"

/* Every 2-d NCHW CONV joins the region, and so does each op reading a region tensor that can
 * run channels-last: an elementwise unary op or cast, a binary op whose operands both have
 * its output's 4-d shape, a pooling or resize op (its channels_last attribute). Region ops
 * switch to NHWC; constant convolution weights are permuted here; any other tensor entering
 * the region is permuted to NHWC once, and a region tensor read outside it or bound as an
 * output is permuted back once. */
kiln_status kiln_layout_channels_last(kiln_graph *g, kiln_error *err);

#endif
