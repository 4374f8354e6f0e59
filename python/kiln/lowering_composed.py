"""Ops Kiln runs as several of its own builder ops, composed at export: pointwise ops written
with Kiln's (leaky_relu, elu, expm1 and log1p to full precision, ...), reductions from amax,
argmax, mean and sum (argmin, max and min along a dim, var, any), batch norm of batch statistics
from layer_norm, index remaps by constant indices (flip, reflection and replication padding,
select_scatter), scatter of a value by comparisons, constant padding, 1-d and 3-d convolutions
and pools as 2-d ones, rounding (floor, ceil, trunc, round) from casts, and grid_sample from
gathers. Each lowering here is lower(ctx, node) of lowering.Lowering; the table that maps ATen
ops to them is lowering's."""

import math

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from . import _lib
from .fx_nodes import dims_mask, node_args, node_value, op_name, only_first_output_used, pair, per_dim, static_dims


# ------------------------------------------------------------------ pointwise


def lower_log1p(ctx, node):
    """log1p(x) to full precision from log: with u = 1 + x rounded, log(u) * x / (u - 1), or x
    where u rounds to 1 (the rounding error of u cancels; Mamba's softplus reads it)."""
    dtype = node_value(node).dtype
    x = ctx.promoted(node.args[0], dtype)
    u = ctx.op("add", [x, ctx.operand(1.0, dtype)], (), [1.0])
    d = ctx.op("sub", [u, ctx.operand(1.0, dtype)], (), [1.0])
    ratio = ctx.op("div", [ctx.op("mul", [ctx.op("log", [u]), x]), d])
    exact = ctx.op("compare", [d, ctx.operand(0.0, dtype)], [_lib.COMPARE["eq"]])
    return ctx.op("where", [exact, x, ratio])


def lower_leaky_relu(ctx, node):
    """leaky_relu: x where x > 0, else x times the slope (a NaN stays NaN)."""
    args = node_args(node)
    x, dtype = ctx.tensor(args["self"]), node_value(node).dtype
    positive = ctx.op("compare", [x, ctx.operand(0.0, dtype)], [_lib.COMPARE["gt"]])
    return ctx.op("where", [positive, x, ctx.op("mul", [x, ctx.operand(float(args["negative_slope"]), dtype)])])


def lower_elu(ctx, node):
    """elu: scale * x where x > 0, else scale * alpha * (exp(input_scale * x) - 1)."""
    args = node_args(node)
    x, dtype = ctx.tensor(args["self"]), node_value(node).dtype
    scale, alpha, input_scale = (float(args[k]) for k in ("scale", "alpha", "input_scale"))
    grown = ctx.op("exp", [ctx.op("mul", [x, ctx.operand(input_scale, dtype)])])
    below = ctx.op("mul", [ctx.op("sub", [grown, ctx.operand(1.0, dtype)], (), [1.0]),
                           ctx.operand(scale * alpha, dtype)])
    positive = ctx.op("compare", [x, ctx.operand(0.0, dtype)], [_lib.COMPARE["gt"]])
    return ctx.op("where", [positive, ctx.op("mul", [x, ctx.operand(scale, dtype)]), below])


def lower_reciprocal(ctx, node):
    dtype = node_value(node).dtype
    return ctx.op("div", [ctx.operand(1.0, dtype), ctx.promoted(node.args[0], dtype)])


def lower_isnan(ctx, node):
    """isnan: x != x, true only for a NaN."""
    x = ctx.tensor(node.args[0])
    return ctx.op("compare", [x, x], [_lib.COMPARE["ne"]])


def lower_isinf(ctx, node):
    x = node.args[0]
    infinity = ctx.operand(float("inf"), node_value(x).dtype)
    return ctx.op("compare", [ctx.op("abs", [ctx.tensor(x)]), infinity], [_lib.COMPARE["eq"]])


def scaled_log(base):
    """log2 and log10: the natural log times 1 / ln(base)."""

    def lower(ctx, node):
        dtype = node_value(node).dtype
        natural = ctx.op("log", [ctx.promoted(node.args[0], dtype)])
        return ctx.op("mul", [natural, ctx.operand(1.0 / math.log(base), dtype)])

    return lower


def lower_expm1(ctx, node):
    """expm1(x) to full precision from exp: with u = exp(x) rounded, (u - 1) * x / log(u), or x
    where u rounds to 1, -1 where u - 1 does, and u itself where it overflows."""
    dtype = node_value(node).dtype
    x = ctx.promoted(node.args[0], dtype)
    u = ctx.op("exp", [x])
    d = ctx.op("sub", [u, ctx.operand(1.0, dtype)], (), [1.0])
    y = ctx.op("div", [ctx.op("mul", [d, x]), ctx.op("log", [u])])
    for test, value in ((ctx.op("compare", [d, ctx.operand(0.0, dtype)], [_lib.COMPARE["eq"]]), x),
                        (ctx.op("compare", [d, ctx.operand(-1.0, dtype)], [_lib.COMPARE["eq"]]), d),
                        (ctx.op("compare", [u, ctx.operand(float("inf"), dtype)], [_lib.COMPARE["eq"]]), u)):
        y = ctx.op("where", [test, value, y])
    return y


def check_pow_scalar(node):
    base = node_args(node)["self"]
    if isinstance(base, bool) or not isinstance(base, (int, float)) or base <= 0:
        return f"pow of the number {base} to a tensor power (Kiln takes a positive base, as exp(y * ln(base)))"
    return None


def lower_pow_scalar(ctx, node):
    """base ** y for a positive number base: exp(y * ln(base))."""
    args = node_args(node)
    dtype = node_value(node).dtype
    y = ctx.promoted(args["exponent"], dtype)
    return ctx.op("exp", [ctx.op("mul", [y, ctx.operand(math.log(args["self"]), dtype)])])


# ------------------------------------------------------------------ reductions


def negative(ctx, x):
    """-x for a node x: neg for floats, 0 - x for integers (T5's relative position buckets),
    which have no neg op."""
    dtype = node_value(x).dtype
    if dtype.is_floating_point:
        return ctx.op("neg", [ctx.tensor(x)])
    return ctx.op("sub", [ctx.operand(0, dtype), ctx.tensor(x)], (), [1.0])


def lower_neg(ctx, node):
    return negative(ctx, node.args[0])


def arg_extreme(largest):
    """argmax, or argmin as the argmax of -x (the first of equal minima, as PyTorch picks)."""

    def lower(ctx, node):
        args = node_args(node)
        x = args["self"]
        xs = ctx.tensor(x) if largest else negative(ctx, x)
        if args["dim"] is None:  # over every element: of the flattened tensor, then reshaped
            flat = ctx.op("reshape", [xs], [node_value(x).numel()])
            return ctx.op("reshape", [ctx.op("argmax", [flat], [0, 0])], list(node_value(node).shape))
        return ctx.op("argmax", [xs], [args["dim"], int(bool(args["keepdim"]))])

    return lower


def check_float_input(node, name="self"):
    """None when the node's input `name` is a float tensor, else the refusal."""
    x = node_args(node)[name]
    if not node_value(x).dtype.is_floating_point:
        return f"{op_name(node)} of {node_value(x).dtype} (Kiln composes it of float ops)"
    return None


def check_min_max_dim(node):
    x = node_args(node)["self"]
    if node_value(x).dim() == 0:
        return f"{op_name(node)} of a 0-d tensor"
    return check_float_input(node)


def lower_amin(ctx, node):
    """amin as -amax(-x)."""
    args = node_args(node)
    x = args["self"]
    mask = dims_mask(args["dim"], node_value(x).dim())
    largest = ctx.op("amax", [ctx.op("neg", [ctx.tensor(x)])], [mask, int(bool(args["keepdim"]))])
    return ctx.op("neg", [largest])


def extreme_along(largest):
    """max.dim and min.dim: (values, indices) along one dim, an amax and an argmax (of -x for
    the minimum); the builder drops the indices where nothing reads them."""

    def lower(ctx, node):
        args = node_args(node)
        x = args["self"]
        dim, keep = args["dim"] % node_value(x).dim(), int(bool(args["keepdim"]))
        xs = ctx.tensor(x) if largest else ctx.op("neg", [ctx.tensor(x)])
        values = ctx.op("amax", [xs], [1 << dim, keep])
        return values if largest else ctx.op("neg", [values]), ctx.op("argmax", [xs], [dim, keep])

    return lower


def lower_mean_all(ctx, node):
    """mean over every element, in the dtype asked for."""
    args = node_args(node)
    x, dtype = args["self"], node_value(node).dtype
    return ctx.op("mean", [ctx.promoted(x, dtype)], [dims_mask(None, node_value(x).dim()), 0])


def _var_correction(node):
    args = node_args(node)
    if "unbiased" in args:  # var.dim
        return 1 if args["unbiased"] else 0
    return 1 if args["correction"] is None else args["correction"]


def check_var(node):
    args = node_args(node)
    x = args["self"]
    if not node_value(x).dtype.is_floating_point:
        return f"{op_name(node)} of {node_value(x).dtype} (Kiln composes it of float ops)"
    dims = args["dim"] if args["dim"] else range(node_value(x).dim())
    if any(not isinstance(node_value(x).shape[d], int) for d in dims):
        return f"{op_name(node)} over a dynamic dim (Kiln divides by a count fixed at export)"
    return None


def lower_var(ctx, node):
    """var: the mean of squared deviations from the mean (two passes, as PyTorch), divided by
    max(0, count - correction)."""
    args = node_args(node)
    x, dtype = args["self"], node_value(node).dtype
    shape = node_value(x).shape
    dims = args["dim"] if args["dim"] else range(len(shape))
    mask = dims_mask(args["dim"], len(shape))
    count = math.prod(shape[d] for d in dims)
    xs = ctx.tensor(x)
    deviation = ctx.op("sub", [xs, ctx.op("mean", [xs], [mask, 1])], (), [1.0])
    total = ctx.op("sum", [ctx.op("mul", [deviation, deviation])], [mask, int(bool(args["keepdim"]))])
    return ctx.op("div", [total, ctx.operand(float(max(0, count - _var_correction(node))), dtype)])


def check_batch_norm_stats(node):
    """batch_norm of batch statistics (instance norm, a batch norm without running stats)."""
    refusal = check_float_input(node, "input")
    if refusal is not None:
        return refusal
    if not static_dims(node_args(node)["input"], 0):
        return f"{op_name(node)} of a dynamic shape (Kiln counts each channel's elements at export)"
    return only_first_output_used(node, "mean or invstd")


def lower_batch_norm_stats(ctx, node):
    """batch_norm of the batch's own statistics, as instance norm calls it on the batch folded into
    the channels: a layer_norm of each channel's row (its samples and positions; the channels
    moved first when there are several samples), then the per-channel weight and bias."""
    args = node_args(node)
    x = args["input"]
    shape = list(node_value(x).shape)
    order = [1, 0] + list(range(2, len(shape)))
    xs = ctx.tensor(x)
    first = xs if shape[0] == 1 else ctx.op("permute", [xs], order)
    rows = ctx.op("reshape", [first], [shape[1], math.prod(shape) // shape[1]])
    normed = ctx.op("layer_norm", [rows], [1, 0], [float(args["eps"])])
    if shape[0] == 1:
        y = ctx.op("reshape", [normed], shape)
    else:
        y = ctx.op("permute", [ctx.op("reshape", [normed], [shape[i] for i in order])], order)
    return per_channel_affine(ctx, y, args["weight"], args["bias"], shape)


def per_channel_affine(ctx, y, weight, bias, shape):
    """y * weight + bias, y of shape `shape`, weight and bias (nodes, or None) a value for each
    channel of dim 1, broadcast over the other dims: the affine step of group and instance norms."""
    per_channel = [shape[1]] + [1] * (len(shape) - 2)
    if weight is not None:
        y = ctx.op("mul", [y, ctx.op("reshape", [ctx.tensor(weight)], per_channel)])
    if bias is not None:
        y = ctx.op("add", [y, ctx.op("reshape", [ctx.tensor(bias)], per_channel)], (), [1.0])
    return y


def check_any(node):
    dtype = node_value(node_args(node)["self"]).dtype
    if dtype == torch.uint8:
        return "any of a uint8 tensor (its result is uint8; Kiln gives bool)"
    return None


def lower_any(ctx, node):
    """any: whether the largest magnitude (as f32) is nonzero; a NaN counts, as in PyTorch."""
    args = node_args(node)
    x = args["self"]
    rank = node_value(x).dim()
    dims = args.get("dim")
    dims = [dims] if isinstance(dims, int) else dims
    values = ctx.promoted(x, torch.float32)
    largest = ctx.op("amax", [ctx.op("abs", [values])], [dims_mask(dims, rank), int(bool(args.get("keepdim")))])
    return ctx.op("compare", [largest, ctx.operand(0.0, torch.float32)], [_lib.COMPARE["ne"]])


# ------------------------------------------------------------------ index remaps


def _padded_along(ctx, y, shape, dim, before, after, fill):
    """y (of shape, a list updated to the result's) with `before` and `after` slots of fill (a
    constant of all dims 1) added along dim, or as many dropped where negative: a slice, then a
    cat with fill broadcast to each side."""
    if before < 0 or after < 0:
        start, end = max(-before, 0), shape[dim] - max(-after, 0)
        y = ctx.op("slice", [y], [dim, start, end, 1])
        shape[dim] = end - start

    def side(width):
        dims = list(shape)
        dims[dim] = width
        return ctx.op("expand", [fill], dims)

    parts = ([side(before)] if before > 0 else []) + [y] + ([side(after)] if after > 0 else [])
    if len(parts) > 1:
        y = ctx.op("cat", parts, [dim])
        shape[dim] = shape[dim] + max(before, 0) + max(after, 0)
    return y


def check_constant_pad(node):
    pad = node_args(node)["pad"]
    if any(not isinstance(p, int) for p in pad):
        return f"{op_name(node)} with symbolic padding {list(pad)} (Kiln plans hold static padding)"
    return None


def lower_constant_pad(ctx, node):
    """constant_pad_nd: each padded dim padded with the fill value or cut (pad pairs run from the
    last dim)."""
    args = node_args(node)
    x, pad, value = args["self"], list(args["pad"]), args["value"]
    shape = list(node_value(x).shape)
    y = ctx.tensor(x)
    fill = ctx.builder.add_constant(torch.full([1] * len(shape), value, dtype=node_value(x).dtype))
    for k in range(len(pad) // 2):
        y = _padded_along(ctx, y, shape, len(shape) - 1 - k, pad[2 * k], pad[2 * k + 1], fill)
    return y


def _picked(ctx, x, dim, index):
    """x's slots along dim in the order of the list index: an index_select by a constant."""
    return ctx.op("index_select", [x, ctx.builder.add_constant(torch.tensor(index, dtype=torch.int64))], [dim])


def check_flip(node):
    args = node_args(node)
    x = node_value(args["self"])
    if any(not isinstance(x.shape[d], int) for d in args["dims"]):
        return f"{op_name(node)} along a dynamic dim (Kiln reverses by a constant index)"
    return None


def lower_flip(ctx, node):
    args = node_args(node)
    shape = node_value(args["self"]).shape
    y = ctx.tensor(args["self"])
    for dim in args["dims"]:
        y = _picked(ctx, y, dim % len(shape), list(range(shape[dim] - 1, -1, -1)))
    return y


def edge_pad(mirror):
    """reflection_pad (mirror: the slots next to the edge, the edge itself not repeated) and
    replication_pad (the edge slot repeated), each padded dim an index_select by a constant
    index; padding pairs run from the last dim."""

    def lower(ctx, node):
        args = node_args(node)
        shape = node_value(args["self"]).shape
        y = ctx.tensor(args["self"])
        pad = list(args["padding"])
        for k in range(len(pad) // 2):
            dim, before, after = len(shape) - 1 - k, pad[2 * k], pad[2 * k + 1]
            if before == 0 and after == 0:
                continue
            size = shape[dim]
            if mirror:
                index = list(range(before, 0, -1)) + list(range(size)) + list(range(size - 2, size - 2 - after, -1))
            else:
                index = [0] * before + list(range(size)) + [size - 1] * after
            y = _picked(ctx, y, dim, index)
        return y

    return lower


def check_edge_pad(node):
    args = node_args(node)
    shape, pad = node_value(args["self"]).shape, list(args["padding"])
    for k in range(len(pad) // 2):
        size = shape[len(shape) - 1 - k]
        if not isinstance(size, int):
            return f"{op_name(node)} of a dynamic dim (Kiln pads by a constant index)"
        if min(pad[2 * k], pad[2 * k + 1]) < 0:
            return f"{op_name(node)} with negative padding {pad}"
    return None


def check_select_scatter(node):
    args = node_args(node)
    if not isinstance(node_value(args["self"]).shape[args["dim"]], int) or not isinstance(args["index"], int):
        return "select_scatter over a dynamic dim or at a dynamic index (Kiln plans it static)"
    return None


def lower_select_scatter(ctx, node):
    """select_scatter: self's slots before the index, src as one slot, and self's slots after."""
    args = node_args(node)
    x, src = args["self"], args["src"]
    shape = list(node_value(x).shape)
    dim = args["dim"] % len(shape)
    index = args["index"] % shape[dim]
    slot = list(shape)
    slot[dim] = 1
    pieces = [ctx.op("reshape", [ctx.tensor(src)], slot)]
    if index > 0:
        pieces.insert(0, ctx.op("slice", [ctx.tensor(x)], [dim, 0, index, 1]))
    if index + 1 < shape[dim]:
        pieces.append(ctx.op("slice", [ctx.tensor(x)], [dim, index + 1, shape[dim], 1]))
    return ctx.op("cat", pieces, [dim]) if len(pieces) > 1 else ctx.op("copy", pieces)


def check_scatter_value(node):
    args = node_args(node)
    shape, index = node_value(args["self"]).shape, node_value(args["index"]).shape
    if not shape:
        return "scatter into a 0-d tensor"
    dim = args["dim"] % len(shape)
    if len(index) != len(shape) or any(not statically_known_true(index[k] == shape[k])
                                       for k in range(len(shape)) if k != dim):
        shapes = f"scatter with an index of shape {list(index)} into {list(shape)}"[:120]
        return (f"{shapes}: Kiln scatters with an index as large as self in every dim but dim; expand the "
                "index to self's shape outside dim")
    if not isinstance(shape[dim], int) or not isinstance(index[dim], int):
        return ("scatter of a value along a dynamic dim (Kiln numbers the slots along dim statically); export "
                "that dim static")
    return None


def lower_scatter_value(ctx, node):
    """scatter of a value (a routing mask's chosen experts set to -inf): slot j along dim takes the
    value where one of the index's entries along dim is j, else self's. The index, given a new
    dim before dim, is compared with the slot numbers 0..n-1, and any over the index's entries
    picks the slots (a where)."""
    args = node_args(node)
    x, index = args["self"], args["index"]
    shape, wide = list(node_value(x).shape), list(node_value(index).shape)
    dim = args["dim"] % len(shape)
    wide.insert(dim, 1)
    slots = [1] * len(wide)
    slots[dim] = shape[dim]
    numbers = ctx.builder.add_constant(torch.arange(shape[dim], dtype=torch.int64).reshape(slots))
    hits = ctx.op("compare", [ctx.op("reshape", [ctx.tensor(index)], wide), numbers], [_lib.COMPARE["eq"]])
    hits = ctx.op("cast", [hits], [_lib.kiln_dtype(torch.float32)])
    hit = ctx.op("compare", [ctx.op("amax", [hits], [dims_mask([dim + 1], len(wide)), 0]),
                             ctx.operand(0.0, torch.float32)], [_lib.COMPARE["ne"]])
    dtype = node_value(node).dtype
    value = args["value"] if dtype.is_floating_point else int(args["value"])
    return ctx.op("where", [hit, ctx.operand(value, dtype), ctx.tensor(x)])


# ------------------------------------------------------------------ col2im (fold) as a gather and a sum


def _col2im_geometry(node):
    """col2im's input as (batch or None, channels, kernel, dilation, padding, stride, output size,
    block grid), all static."""
    args = node_args(node)
    shape = list(node_value(args["self"]).shape)
    kernel, dilation = list(args["kernel_size"]), list(args["dilation"])
    padding, stride, size = list(args["padding"]), list(args["stride"]), list(args["output_size"])
    grid = [(size[d] + 2 * padding[d] - dilation[d] * (kernel[d] - 1) - 1) // stride[d] + 1 for d in range(2)]
    batch = shape[0] if len(shape) == 3 else None
    return batch, shape[-2] // (kernel[0] * kernel[1]), kernel, dilation, padding, stride, size, grid


# The most a constant gather table (int64s: col2im's blocks of each pixel, unfold's windows) may
# take in a blob.
GATHER_TABLE_LIMIT_BYTES = 64 << 20


def check_col2im(node):
    args = node_args(node)
    x = node_value(args["self"])
    values = list(x.shape) + list(args["output_size"])
    if not all(isinstance(v, int) for v in values):
        return "col2im over a dynamic shape (Kiln plans it static)"
    if x.dim() not in (2, 3):
        return f"col2im of a rank-{x.dim()} input (PyTorch takes rank 2 or 3)"
    size, kernel = list(args["output_size"]), list(args["kernel_size"])
    table = size[0] * size[1] * kernel[0] * kernel[1] * 8  # at most every kernel tap a pixel
    if table > GATHER_TABLE_LIMIT_BYTES:
        return (f"col2im to {size[0]}x{size[1]} with a {kernel[0]}x{kernel[1]} kernel: its gather table could take "
                f"{table >> 20} MiB of the blob (Kiln's limit {GATHER_TABLE_LIMIT_BYTES >> 20} MiB); fold a smaller "
                "output or in tiles")
    return check_float_input(node)


def _col2im_table(kernel, dilation, padding, stride, size, grid):
    """For each output pixel (row-major), the columns of the flattened blocks [kh * kw * L] that
    land on it, padded with kh * kw * L (a zero column appended) to the most any pixel gets."""
    blocks = grid[0] * grid[1]
    zero = kernel[0] * kernel[1] * blocks
    lists = []
    for y in range(size[0]):
        for x in range(size[1]):
            found = []
            for i in range(kernel[0]):
                row = y + padding[0] - i * dilation[0]
                if row < 0 or row % stride[0] or row // stride[0] >= grid[0]:
                    continue
                for j in range(kernel[1]):
                    col = x + padding[1] - j * dilation[1]
                    if col < 0 or col % stride[1] or col // stride[1] >= grid[1]:
                        continue
                    found.append((i * kernel[1] + j) * blocks + (row // stride[0]) * grid[1] + col // stride[1])
            lists.append(found)
    most = max(1, max(len(found) for found in lists))
    return torch.tensor([found + [zero] * (most - len(found)) for found in lists], dtype=torch.int64), most


def lower_col2im(ctx, node):
    """col2im (nn.Fold, overlap-add of sliding blocks): each output pixel sums the block columns
    that land on it. Which they are follows from the static geometry alone, so a constant table
    lists them per pixel; an index_select gathers them (a zero column fills the short lists at
    the borders and between strides) and a sum over the list adds them. PyTorch decomposes it
    into an index_put that accumulates, which Kiln does not take."""
    args = node_args(node)
    x = args["self"]
    batch, channels, kernel, dilation, padding, stride, size, grid = _col2im_geometry(node)
    n = batch if batch is not None else 1
    columns = kernel[0] * kernel[1] * grid[0] * grid[1]
    table, most = _col2im_table(kernel, dilation, padding, stride, size, grid)
    flat = ctx.op("reshape", [ctx.tensor(x)], [n, channels, columns])
    zeros = ctx.builder.add_constant(torch.zeros(n, channels, 1, dtype=node_value(x).dtype))
    padded = ctx.op("cat", [flat, zeros], [2])
    picked = ctx.op("index_select", [padded, ctx.builder.add_constant(table.flatten())], [2])
    picked = ctx.op("reshape", [picked], [n, channels, size[0] * size[1], most])
    summed = ctx.op("sum", [picked], [dims_mask([3], 4), 0])
    out = [n, channels] + size if batch is not None else [channels] + size
    return ctx.op("reshape", [summed], out)


# ------------------------------------------------------------------ unfold (sliding windows along a dim)


def _unfold_geometry(node):
    """Tensor.unfold's (input shape, dim, window size, step, window count) of an input of rank 1
    or more."""
    args = node_args(node)
    shape = list(node_value(args["self"]).shape)
    dim = args["dimension"] % len(shape)
    size, step = args["size"], args["step"]
    return shape, dim, size, step, (shape[dim] - size) // step + 1


def check_unfold(node):
    if not node_value(node_args(node)["self"]).shape:
        return "unfold of a 0-d tensor (Kiln unfolds along a dim); reshape it to [1] first"
    shape, dim, size, step, count = _unfold_geometry(node)
    if isinstance(shape[dim], torch.SymInt):
        return (f"unfold along dim {dim}, whose size is dynamic (Kiln gathers the windows by a constant table); "
                "export that dim static")
    table = count * size * 8
    if table > GATHER_TABLE_LIMIT_BYTES:
        return (f"unfold of {count} windows of {size}: its gather table would take {table >> 20} MiB of the blob "
                f"(Kiln's limit {GATHER_TABLE_LIMIT_BYTES >> 20} MiB); unfold a shorter dim or in pieces")
    return None


def lower_unfold(ctx, node):
    """Tensor.unfold(dim, size, step) (HaloNet's blocks, framing a signal): window i's slot j is
    the input's slot i * step + j along dim. One index_select by a constant table of every
    window's slots, a reshape splitting dim into (windows, size), and a permute moving size last,
    where PyTorch puts it."""
    shape, dim, size, step, count = _unfold_geometry(node)
    x = ctx.tensor(node_args(node)["self"])
    picked = _picked(ctx, x, dim, [i * step + j for i in range(count) for j in range(size)])
    split = ctx.op("reshape", [picked], shape[:dim] + [count, size] + shape[dim + 1:])
    if dim == len(shape) - 1:
        return split
    rank = len(shape) + 1
    return ctx.op("permute", [split], list(range(dim + 1)) + list(range(dim + 2, rank)) + [dim + 1])


# ------------------------------------------------------------------ 1-d and 3-d convolutions and pools as 2-d ones


def _as_rows(ctx, x):
    """A 1-d pool's input [N, C, L] (or [C, L]) as images [N, C, 1, L]."""
    shape = list(node_value(x).shape)
    return ctx.op("reshape", [ctx.tensor(x)], ([1] if len(shape) == 2 else []) + shape[:-1] + [1, shape[-1]])


def lower_avg_pool_1d(ctx, node):
    args = node_args(node)
    kernel = per_dim(args["kernel_size"], 1)[0]
    stride = per_dim(args["stride"], 1)[0] if args["stride"] else kernel
    padding = per_dim(args["padding"], 1)[0]
    iattr = [pair(1, kernel), pair(1, stride), pair(0, padding), int(bool(args["ceil_mode"])),
             int(bool(args["count_include_pad"])), 0]
    y = ctx.op("avg_pool2d", [_as_rows(ctx, args["self"])], iattr)
    return ctx.op("reshape", [y], list(node_value(node).shape))


def lower_adaptive_avg_pool_1d(ctx, node):
    y = ctx.op("adaptive_avg_pool2d", [_as_rows(ctx, node.args[0])], [pair(1, node_value(node).shape[-1])])
    return ctx.op("reshape", [y], list(node_value(node).shape))


def _frames(ctx, x, shape, pad, fill, dtype):
    """x of shape [n, channels, T, *cells] with `pad` (before, after) frames of fill added along
    T, as [n, T', channels, *cells]: the frames made the leading dim after the batch."""
    shape = list(shape)
    if any(pad):
        value = ctx.builder.add_constant(torch.full([1] * len(shape), fill, dtype=dtype))
        x = _padded_along(ctx, x, shape, 2, pad[0], pad[1], value)
    return ctx.op("permute", [x], [0, 2, 1] + list(range(3, len(shape))))


def _taps(ctx, frames, kernel, stride, dilation, out_frames, total):
    """For each tap j of a window of `kernel` frames, the frames it reads for every output frame:
    frames [n, total, ...] sliced along dim 1 from j * dilation with step stride."""
    span = (out_frames - 1) * stride + 1
    taps = []
    for j in range(kernel):
        start = j * dilation
        whole = start == 0 and stride == 1 and span == total
        taps.append(frames if whole else ctx.op("slice", [frames], [1, start, start + span, stride]))
    return taps


def lower_convolution_3d(ctx, node):
    """A 3-d convolution as one 2-d convolution over all output frames: each output frame's
    input frames (zero frames where the time padding reaches) gathered by one index_select and
    stacked along the channels, tap by tap within each group, and the weight's taps moved
    beside its input channels in the same order (a permute the builder folds on a constant
    weight)."""
    args = node_args(node)
    x, w, out = node_value(args["input"]), node_value(args["weight"]), node_value(node)
    stride, padding, dilation = (per_dim(args[k], 3) for k in ("stride", "padding", "dilation"))
    groups = int(args["groups"])
    n, c, t = x.shape[0], x.shape[1], x.shape[2]
    o, cg, kt = w.shape[0], w.shape[1], w.shape[2]
    cells, t_out = list(x.shape[3:]), out.shape[2]
    frames = _frames(ctx, ctx.tensor(args["input"]), x.shape, (padding[0], padding[0]), 0, x.dtype)
    picked = [s * stride[0] + j * dilation[0] for s in range(t_out) for j in range(kt)]
    if picked != list(range(t + 2 * padding[0])):
        frames = _picked(ctx, frames, 1, picked)  # [n, t_out * kt, c, *cells]
    if groups > 1 and kt > 1:  # each group's channels together: [group, tap, channel]
        frames = ctx.op("reshape", [frames], [n, t_out, kt, groups, cg, cells[0] * cells[1]])
        frames = ctx.op("permute", [frames], [0, 1, 3, 2, 4, 5])
    images = ctx.op("reshape", [frames], [n * t_out, kt * c] + cells)
    weight = ctx.op("permute", [ctx.tensor(args["weight"])], [0, 2, 1, 3, 4])
    weight = ctx.op("reshape", [weight], [o, kt * cg] + list(w.shape[3:]))
    inputs = [images, weight] + ([ctx.tensor(args["bias"])] if args["bias"] is not None else [])
    iattr = [pair(stride[1], stride[2]), pair(padding[1], padding[2]), pair(dilation[1], dilation[2]), groups,
             int(args["bias"] is not None)]
    y = ctx.op("conv", inputs, iattr)
    restored = restored_frames(ctx, y, [n, t_out, o] + list(out.shape[3:]))
    ctx.framed[restored] = (y, [n, t_out, o] + list(out.shape[3:]))
    return restored


def restored_frames(ctx, images, shape):
    """Images [n * t, c, h, w] (one a frame) as the clip [n, c, t, h, w]; shape is [n, t, c, h, w]."""
    return ctx.op("permute", [ctx.op("reshape", [images], shape)], [0, 2, 1, 3, 4])


def _window_3d(args):
    """kernel, stride (empty means the kernel) and padding of a 3-d pool, three each."""
    kernel = per_dim(args["kernel_size"], 3)
    stride = per_dim(args["stride"], 3) if args["stride"] else kernel
    return kernel, stride, per_dim(args["padding"], 3)


def check_pool_3d(node):
    x = node_args(node)["self"]
    if node_value(x).dim() != 5:
        return f"a 3-d pool of a {node_value(x).dim()}-d input (Kiln pools batched [N, C, T, H, W] ones)"
    if not static_dims(x, 1):
        return "a 3-d pool over dynamic channels, frames or cells (Kiln plans them static)"
    return None


def check_max_pool_3d(node):
    return check_pool_3d(node) or only_first_output_used(node, "indices")


def _pooled_frames(ctx, node, x, fill, pool_2d):
    """A 3-d pool as a 2-d one over frames, then over each output frame's window of frames:
    the input's frames (with the time padding's frames of fill, and after the last frame as
    many more as ceil mode reads) pooled by pool_2d([frames as images]); returns the taps of
    pooled frames, [n, t_out, c, h', w'] each, for the caller to combine."""
    args = node_args(node)
    kernel, stride, padding = _window_3d(args)
    dilation = per_dim(args.get("dilation") or [1], 3)
    out = node_value(node)
    out = out[0] if isinstance(out, tuple) else out  # max_pool3d's: (values, indices)
    shape, out = list(node_value(x).shape), list(out.shape)
    n, c, t = shape[0], shape[1], shape[2]
    t_out = out[2]
    reach = (t_out - 1) * stride[0] + (kernel[0] - 1) * dilation[0] + 1  # frames the windows span
    pad = (padding[0], max(reach - t - padding[0], 0))
    frames = _frames(ctx, ctx.tensor(x), shape, pad, fill, node_value(x).dtype)
    total = t + pad[0] + pad[1]
    images = ctx.op("reshape", [frames], [n * total, c] + shape[3:])
    pooled = ctx.op("reshape", [pool_2d(images, kernel, stride, padding, dilation)], [n, total, c] + out[3:])
    return _taps(ctx, pooled, kernel[0], stride[0], dilation[0], t_out, total)


def lower_max_pool_3d(ctx, node):
    """max_pool3d: frames max-pooled in 2-d, then the elementwise maximum of each output frame's
    window of pooled frames (padding frames are -inf)."""
    args = node_args(node)

    def pool_2d(images, kernel, stride, padding, dilation):
        iattr = [pair(kernel[1], kernel[2]), pair(stride[1], stride[2]), pair(padding[1], padding[2]),
                 pair(dilation[1], dilation[2]), int(bool(args["ceil_mode"]))]
        return ctx.op("max_pool2d", [images], iattr)

    taps = _pooled_frames(ctx, node, args["self"], float("-inf"), pool_2d)
    y = taps[0]
    for tap in taps[1:]:
        y = ctx.op("maximum", [y, tap])
    return ctx.op("permute", [y], [0, 2, 1, 3, 4])


def _avg_pool_3d_divisors(node):
    """Each output cell's divisor of avg_pool3d, as PyTorch's own kernel counts it (its window
    size, clipped where ceil mode or padding say, or the override): the sums of ones over the
    windows divided by their average, computed once at export in double."""
    args = node_args(node)
    shape = [1, 1] + list(node_value(args["self"]).shape[2:])
    ones = torch.ones(shape, dtype=torch.float64)
    kernel, stride, padding = _window_3d(args)
    mean = torch.nn.functional.avg_pool3d(ones, kernel, stride, padding, bool(args["ceil_mode"]),
                                          bool(args["count_include_pad"]), args["divisor_override"])
    sums = torch.nn.functional.avg_pool3d(ones, kernel, stride, padding, bool(args["ceil_mode"]), True, 1)
    return torch.round(sums / mean)


def lower_avg_pool_3d(ctx, node):
    """avg_pool3d: frames sum-pooled in 2-d (divisor 1), the sums of each output frame's window
    of frames added (padding frames are zeros), then divided by each cell's divisor (see
    _avg_pool_3d_divisors)."""
    args = node_args(node)

    def pool_2d(images, kernel, stride, padding, dilation):
        iattr = [pair(kernel[1], kernel[2]), pair(stride[1], stride[2]), pair(padding[1], padding[2]),
                 int(bool(args["ceil_mode"])), 1, 1]
        return ctx.op("avg_pool2d", [images], iattr)

    taps = _pooled_frames(ctx, node, args["self"], 0.0, pool_2d)
    y = taps[0]
    for tap in taps[1:]:
        y = ctx.op("add", [y, tap], (), [1.0])
    y = ctx.op("permute", [y], [0, 2, 1, 3, 4])
    divisors = _avg_pool_3d_divisors(node).to(node_value(node).dtype)
    return ctx.op("div", [y, ctx.builder.add_constant(divisors)])


def check_adaptive_avg_pool_3d(node):
    x, out = node_value(node.args[0]), node_value(node)
    if x.dim() != 5 or not static_dims(node.args[0], 2):
        return "a 3-d adaptive pool of other than a batched input with static frames and cells"
    if any(i % o for i, o in zip(x.shape[2:], out.shape[2:])):
        return (f"a 3-d adaptive pool from {list(x.shape[2:])} to {list(out.shape[2:])}, not whole windows "
                "(Kiln takes output sizes that divide the input's)")
    return None


def lower_adaptive_avg_pool_3d(ctx, node):
    """A 3-d adaptive pool whose windows tile the input: each dim split into (windows, window
    size) and the mean over the window sizes."""
    x, out = node_value(node.args[0]), node_value(node)
    split = list(x.shape[:2])
    for i, o in zip(x.shape[2:], out.shape[2:]):
        split += [o, i // o]
    y = ctx.op("reshape", [ctx.tensor(node.args[0])], split)
    return ctx.op("mean", [y], [(1 << 3) | (1 << 5) | (1 << 7), 0])


# ------------------------------------------------------------------ rounding

_EXACT_F32 = float(1 << 23)  # from here on every f32 is an integer


def _floor(ctx, v):
    """floor of f32 v whose magnitude is far below 2^63: its value toward zero (a cast to i64
    and back), less one where that is above v."""
    f32 = _lib.kiln_dtype(torch.float32)
    toward_zero = ctx.op("cast", [ctx.op("cast", [v], [_lib.kiln_dtype(torch.int64)])], [f32])
    above = ctx.op("cast", [ctx.op("compare", [toward_zero, v], [_lib.COMPARE["gt"]])], [f32])
    return ctx.op("sub", [toward_zero, above], (), [1.0])


def _round_half_even(ctx, v):
    """v rounded to the nearest integer, a tie to the even one (as nearbyint)."""
    f32 = torch.float32
    low = _floor(ctx, v)
    fraction = ctx.op("sub", [v, low], (), [1.0])
    half = ctx.operand(0.5, f32)
    odd = ctx.op("sub", [low, ctx.op("mul", [_floor(ctx, ctx.op("mul", [low, half])), ctx.operand(2.0, f32)])],
                 (), [1.0])
    tie_to_odd = ctx.op("logical", [ctx.op("compare", [fraction, half], [_lib.COMPARE["eq"]]),
                                    ctx.op("compare", [odd, ctx.operand(1.0, f32)], [_lib.COMPARE["eq"]])],
                        [_lib.BOOL_OPS["and"]])
    up = ctx.op("logical", [ctx.op("compare", [fraction, half], [_lib.COMPARE["gt"]]), tie_to_odd],
                [_lib.BOOL_OPS["or"]])
    return ctx.op("add", [low, ctx.op("cast", [up], [_lib.kiln_dtype(f32)])], (), [1.0])


def rounded(which):
    """floor, ceil, trunc and round (half to even) of a float tensor, in f32 (a half-precision
    input cast there and back: exact): from a cast toward zero where |x| < 2^23, x itself past
    that (an integer already), NaN and infinities too; an integer tensor is its own result."""

    def lower(ctx, node):
        x = node_args(node)["self"]
        dtype = node_value(x).dtype
        if not dtype.is_floating_point:
            return ctx.op("copy", [ctx.tensor(x)])
        f32 = torch.float32
        v = ctx.promoted(x, f32)
        if which == "floor":
            y = _floor(ctx, v)
        elif which == "ceil":
            y = ctx.op("neg", [_floor(ctx, ctx.op("neg", [v]))])
        elif which == "trunc":
            y = ctx.op("cast", [ctx.op("cast", [v], [_lib.kiln_dtype(torch.int64)])], [_lib.kiln_dtype(f32)])
        else:
            y = _round_half_even(ctx, v)
        small = ctx.op("compare", [ctx.op("abs", [v]), ctx.operand(_EXACT_F32, f32)], [_lib.COMPARE["lt"]])
        y = ctx.op("where", [small, y, v])
        return y if dtype == f32 else ctx.op("cast", [y], [_lib.kiln_dtype(dtype)])

    return lower


def lower_sign(ctx, node):
    """sign: (x > 0) - (x < 0) in x's dtype (0 for zeros and NaN, as PyTorch gives)."""
    x = node_args(node)["self"]
    dtype = node_value(x).dtype
    zero = ctx.operand(0, dtype)
    signs = [ctx.op("cast", [ctx.op("compare", [ctx.tensor(x), zero], [_lib.COMPARE[c]])], [_lib.kiln_dtype(dtype)])
             for c in ("gt", "lt")]
    return ctx.op("sub", signs, (), [1.0])


# ------------------------------------------------------------------ grid_sample

_GRID_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
_GRID_PADDINGS = {0: "zeros", 1: "border", 2: "reflection"}


def check_grid_sampler(node):
    args = node_args(node)
    x, grid = node_value(args["input"]), node_value(args["grid"])
    mode, padding = args["interpolation_mode"], args["padding_mode"]
    if mode not in (0, 1):
        return f"grid_sample with mode {_GRID_MODES.get(mode, mode)} (Kiln samples bilinear and nearest)"
    if padding not in (0, 1):
        return (f"grid_sample with padding {_GRID_PADDINGS.get(padding, padding)} (Kiln pads with zeros or "
                "the border)")
    if not x.dtype.is_floating_point or not static_dims(args["input"], 1) or not static_dims(args["grid"], 1):
        return "grid_sample of other than a float input and grid with static dims past the batch"
    return None


def _source_coordinate(ctx, g, size, align_corners, border):
    """A normalized grid coordinate in [-1, 1] as a source index along a dim of `size` cells
    (f32), clamped to the border or, for zero padding, to [-2, size + 1] (past -1 or size every
    cell a sample reads is outside either way, and the clamp keeps the floor's cast in range)."""
    f32 = torch.float32
    if align_corners:
        scaled = ctx.op("mul", [ctx.op("add", [g, ctx.operand(1.0, f32)], (), [1.0]),
                                ctx.operand((size - 1) / 2, f32)])
    else:
        scaled = ctx.op("div", [ctx.op("sub", [ctx.op("mul", [ctx.op("add", [g, ctx.operand(1.0, f32)], (), [1.0]),
                                                              ctx.operand(float(size), f32)]),
                                               ctx.operand(1.0, f32)], (), [1.0]), ctx.operand(2.0, f32)])
    low, high = (0.0, float(size - 1)) if border else (-2.0, float(size + 1))
    return ctx.op("minimum", [ctx.op("maximum", [scaled, ctx.operand(low, f32)]), ctx.operand(high, f32)])


def _inside(ctx, c, size):
    f32 = torch.float32
    return ctx.op("logical", [ctx.op("compare", [c, ctx.operand(0.0, f32)], [_lib.COMPARE["ge"]]),
                              ctx.op("compare", [c, ctx.operand(float(size - 1), f32)], [_lib.COMPARE["le"]])],
                  [_lib.BOOL_OPS["and"]])


def lower_grid_sampler(ctx, node):
    """grid_sample (bilinear or nearest; zeros or border padding; both align_corners): the
    source coordinates computed in f32 as PyTorch computes them, each sample's cells read by a
    gather over the flattened [N, C, H * W] input at y * W + x (clamped into the image), and
    weighted by where they fall, a cell outside the image weighing 0 under zero padding."""
    args = node_args(node)
    x, grid = args["input"], args["grid"]
    n, c, h, w = node_value(x).shape
    out_h, out_w = node_value(grid).shape[1:3]
    dtype, f32, i64 = node_value(x).dtype, torch.float32, torch.int64
    border, align = args["padding_mode"] == 1, bool(args["align_corners"])
    g = ctx.promoted(grid, f32)
    ix = _source_coordinate(ctx, ctx.op("select", [g], [3, 0]), w, align, border)
    iy = _source_coordinate(ctx, ctx.op("select", [g], [3, 1]), h, align, border)
    flat = ctx.op("reshape", [ctx.tensor(x)], [n, c, h * w])
    zero = ctx.operand(0.0, f32)

    def sample(cy, cx, weight):
        """The cells at (cy, cx) (f32 [N, Ho, Wo]) times weight (None: 1), as f32 [N, C, Ho * Wo]."""
        if not border:
            inside = ctx.op("logical", [_inside(ctx, cx, w), _inside(ctx, cy, h)], [_lib.BOOL_OPS["and"]])
            weight = ctx.op("where", [inside, ctx.operand(1.0, f32) if weight is None else weight, zero])
        cells = []
        for coordinate, size in ((cy, h), (cx, w)):
            clamped = ctx.op("minimum", [ctx.op("maximum", [coordinate, zero]), ctx.operand(float(size - 1), f32)])
            cells.append(ctx.op("cast", [clamped], [_lib.kiln_dtype(i64)]))
        at = ctx.op("add", [ctx.op("mul", [cells[0], ctx.operand(w, i64)]), cells[1]], (), [1.0])
        at = ctx.op("expand", [ctx.op("reshape", [at], [n, 1, out_h * out_w])], [n, c, out_h * out_w])
        values = ctx.op("gather", [flat, at], [2])
        if dtype != f32:
            values = ctx.op("cast", [values], [_lib.kiln_dtype(f32)])
        if weight is None:
            return values
        return ctx.op("mul", [values, ctx.op("reshape", [weight], [n, 1, out_h * out_w])])

    if args["interpolation_mode"] == 1:
        y = sample(_round_half_even(ctx, iy), _round_half_even(ctx, ix), None)
    else:
        x0, y0 = _floor(ctx, ix), _floor(ctx, iy)
        one = ctx.operand(1.0, f32)
        x1, y1 = (ctx.op("add", [v, one], (), [1.0]) for v in (x0, y0))
        wx1, wy1 = ctx.op("sub", [ix, x0], (), [1.0]), ctx.op("sub", [iy, y0], (), [1.0])
        wx0, wy0 = (ctx.op("sub", [one, v], (), [1.0]) for v in (wx1, wy1))
        y = None
        for cy, wy in ((y0, wy0), (y1, wy1)):
            for cx, wx in ((x0, wx0), (x1, wx1)):
                term = sample(cy, cx, ctx.op("mul", [wy, wx]))
                y = term if y is None else ctx.op("add", [y, term], (), [1.0])
    y = ctx.op("reshape", [y], [n, c, out_h, out_w])
    return y if dtype == f32 else ctx.op("cast", [y], [_lib.kiln_dtype(dtype)])
