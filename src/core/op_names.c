/* The name of each op, as messages and `kiln inspect` print it. */
#include "kiln/kiln.h"

static const char *const op_names[KILN_OP_COUNT] = {
    [KILN_OP_LINEAR] = "linear",
    [KILN_OP_MATMUL] = "matmul",
    [KILN_OP_ADD] = "add",
    [KILN_OP_SUB] = "sub",
    [KILN_OP_MUL] = "mul",
    [KILN_OP_DIV] = "div",
    [KILN_OP_RELU] = "relu",
    [KILN_OP_GELU] = "gelu",
    [KILN_OP_SILU] = "silu",
    [KILN_OP_SIGMOID] = "sigmoid",
    [KILN_OP_TANH] = "tanh",
    [KILN_OP_EXP] = "exp",
    [KILN_OP_SQRT] = "sqrt",
    [KILN_OP_RSQRT] = "rsqrt",
    [KILN_OP_NEG] = "neg",
    [KILN_OP_POW] = "pow",
    [KILN_OP_CAST] = "cast",
    [KILN_OP_SOFTMAX] = "softmax",
    [KILN_OP_LOG_SOFTMAX] = "log_softmax",
    [KILN_OP_LAYER_NORM] = "layer_norm",
    [KILN_OP_RMS_NORM] = "rms_norm",
    [KILN_OP_SUM] = "sum",
    [KILN_OP_MEAN] = "mean",
    [KILN_OP_AMAX] = "amax",
    [KILN_OP_RESHAPE] = "reshape",
    [KILN_OP_PERMUTE] = "permute",
    [KILN_OP_EXPAND] = "expand",
    [KILN_OP_CAT] = "cat",
    [KILN_OP_SLICE] = "slice",
    [KILN_OP_SELECT] = "select",
    [KILN_OP_COPY] = "copy",
    [KILN_OP_EMBEDDING] = "embedding",
    [KILN_OP_INDEX_SELECT] = "index_select",
    [KILN_OP_WHERE] = "where",
    [KILN_OP_SDPA] = "sdpa",
    [KILN_OP_POINTWISE] = "pointwise",
    [KILN_OP_CUMSUM] = "cumsum",
    [KILN_OP_GATHER] = "gather",
    [KILN_OP_INDEX] = "index",
    [KILN_OP_ARGMAX] = "argmax",
};

const char *kiln_op_name(kiln_op_kind op) {
  return (unsigned)op < KILN_OP_COUNT ? op_names[op] : "unknown";
}
