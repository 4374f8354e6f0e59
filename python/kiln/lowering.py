"""Edge-dialect ops to Kiln builder calls: the one table of what Kiln supports.

Each entry maps an ATen op to the builder op it becomes and passes its attributes. Shape
and dtype rules live in the C builder: the partitioner asks it about each node by
building that node alone (probe), and preprocess checks that every tensor the builder
infers matches the shape and dtype PyTorch recorded. Only conditions the builder cannot
see (a dropout probability, a memory format, the users of a multi-output op) are
written here.
"""

import math
import operator
from typing import Callable, Dict, NamedTuple, Optional

import sympy
import torch
from torch._export.utils import (
    get_buffer,
    get_lifted_tensor_constant,
    get_param,
    is_buffer,
    is_lifted_tensor_constant,
    is_param,
)
from torch.export.graph_signature import OutputKind
from torch.fx.experimental.symbolic_shapes import statically_known_true

from . import _lib
from . import lowering_composed as composed
from ._lib import Builder, KilnError
from .fx_nodes import (aten_op, dims_mask, node_args, node_value, only_first_output_used, op_name, pair, per_dim,
                       static_dims)


class Lowering(NamedTuple):
    """How one op becomes builder calls.

    lower(ctx, node) adds the node's builder op(s) and returns the output tensor id;
    check(node) returns why the node cannot be lowered, or None; compute is False for
    ops that only move or create data, which are not worth a delegate call on their own.
    """

    lower: Callable
    check: Optional[Callable] = None
    compute: bool = True


def _shape_env_bounds(symbol, size):
    """A symbol's range as the shape environment of size records it (torch.export keeps sizes 0
    and 1 apart from the others, so its lower bound there may be above the user's)."""
    ranges = size.node.shape_env.var_to_range.get(symbol)
    return None if ranges is None else (ranges.lower, ranges.upper)


def program_bounds(program, user_bounds=None):
    """A bounds function for Context: the user's range of a symbol (user_bounds by name), else
    program's range_constraints, else the shape environment's."""
    constraints = getattr(program, "range_constraints", None) or {}
    user_bounds = user_bounds or {}

    def bounds(symbol, size):
        if str(symbol) in user_bounds:
            return user_bounds[str(symbol)]
        ranges = constraints.get(symbol)
        return (ranges.lower, ranges.upper) if ranges is not None else _shape_env_bounds(symbol, size)

    return bounds


def _sym_scalar(value):
    return isinstance(value, torch.SymInt) or (isinstance(value, torch.fx.Node) and isinstance(
        value.meta.get("val"), torch.SymInt))


class Context:
    """Builder state while lowering one graph: the tensor id of each lowered node, and the builder
    symbol of each dynamic size (sympy symbol) met so far."""

    def __init__(self, builder, bounds=_shape_env_bounds):
        self.builder = builder
        self.values: Dict[torch.fx.Node, int] = {}
        self.bounds = bounds
        self.symbols = {}  # sympy symbol -> (builder symbol number, upper bound)
        self.framed = {}  # a 3-d convolution's output -> its 2-d convolution's output (lowering_composed)

    def _symbol(self, symbol, size):
        if symbol not in self.symbols:
            ranges = self.bounds(symbol, size)
            try:
                low, high = int(ranges[0]), int(ranges[1])
            except (TypeError, ValueError, OverflowError, AttributeError):
                raise KilnError(_lib.ERR_UNSUPPORTED, f"dynamic size {symbol} has no finite bounds "
                                f"({ranges}); export it with torch.export.Dim(min=, max=)") from None
            number = self.builder.add_symbol(str(symbol)[:15], max(low, 0), high)
            self.symbols[symbol] = (number, high)
        return self.symbols[symbol]

    def size(self, value):
        """(value at the upper bounds, None or (symbol, coeff, offset)) of an int, a SymInt or a node
        holding one; a SymInt must be coeff * s + offset of one symbol s."""
        if isinstance(value, torch.fx.Node):
            value = value.meta["val"]
        if not isinstance(value, torch.SymInt):
            return int(value), None
        expr = sympy.expand(value.node.expr)
        if expr.is_Integer:
            return int(expr), None
        free = list(expr.free_symbols)
        poly = None
        if len(free) == 1:
            try:
                poly = sympy.Poly(expr, free[0])
            except sympy.PolynomialError:
                poly = None
        coeffs = poly.all_coeffs() if poly is not None and poly.degree() == 1 else None
        if coeffs is None or not all(c.is_Integer for c in coeffs) or coeffs[0] < 1:
            raise KilnError(_lib.ERR_UNSUPPORTED, f"dynamic size {expr} is not a*s+b of one symbol s with "
                            "a >= 1, which Kiln plans need; export with a static size for it")
        number, high = self._symbol(free[0], value)
        coeff, offset = int(coeffs[0]), int(coeffs[1])
        return coeff * high + offset, (number, coeff, offset)

    def sizes(self, values):
        """([values at the upper bounds], [None or (symbol, coeff, offset)]) of a shape or list."""
        pairs = [self.size(v) for v in values]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def input(self, node, name):
        """A builder input shaped like node's value (dynamic dims at their bound)."""
        val = node_value(node)
        dims, syms = self.sizes(val.shape)
        return self.builder.add_input(name, _lib.kiln_dtype(val.dtype), tuple(dims), syms)

    def tensor(self, node):
        return self.values[node]

    def operand(self, value, dtype):
        """A tensor id for a node, or a rank-0 constant of dtype for a Python number."""
        if isinstance(value, torch.fx.Node):
            return self.values[value]
        return self.builder.add_constant(torch.tensor(value, dtype=dtype))

    def promoted(self, value, dtype):
        """An operand in the op's result dtype: PyTorch's type promotion made explicit."""
        tensor = self.operand(value, dtype)
        if isinstance(value, torch.fx.Node) and node_value(value).dtype != dtype:
            tensor = self.op("cast", [tensor], [_lib.kiln_dtype(dtype)])
        return tensor

    def op(self, name, inputs, iattr=(), fattr=()):
        """A builder op; an integer attribute may be a SymInt (or a node of one): a dynamic size."""
        values, syms = self.sizes(iattr)
        return self.builder.add_op(name, inputs, values, fattr, syms)


# ------------------------------------------------------------------ lowerings


def _unary(name):
    """An op of one tensor, cast first to the result's dtype (log of an integer is a float)."""
    return lambda ctx, node: ctx.op(name, [ctx.promoted(node.args[0], node_value(node).dtype)])


def _operand_kind(value):
    """What torch.result_type needs to know of an operand: a number, or a tensor's dtype and
    whether it is 0-dim (which promotes like a number of its category)."""
    if isinstance(value, torch.fx.Node):
        val = node_value(value)
        return torch.empty(() if val.dim() == 0 else (0,), dtype=val.dtype)
    return value


def _compare(which):
    """eq, ne, lt, le, gt, ge: both operands in their promoted dtype, compared into bool."""

    def lower(ctx, node):
        args = node_args(node)
        a, b = args["self"], args["other"]
        dtype = torch.result_type(_operand_kind(a), _operand_kind(b))
        inputs = [ctx.promoted(a, dtype), ctx.promoted(b, dtype)]
        return ctx.op("compare", inputs, [_lib.COMPARE[which]])

    return lower


def _check_remainder(node):
    args = node_args(node)
    dtype, other = node_value(args["self"]).dtype, args["other"]
    if dtype not in (torch.int32, torch.int64):
        return f"remainder of {dtype} (Kiln takes the remainder of i32 and i64 by a power of two)"
    if isinstance(other, bool) or not isinstance(other, int) or other <= 0 or other & (other - 1):
        return f"remainder by {other} (Kiln takes the remainder by a positive power of two only)"
    return None


def _lower_remainder(ctx, node):
    """remainder by 2^k of an integer: x & (2^k - 1), which in two's complement is Python's x % 2^k
    for every x, negative ones too (a result in [0, 2^k)): a hashing's bucket, as CANINE's."""
    args = node_args(node)
    dtype = node_value(node).dtype
    mask = ctx.operand(args["other"] - 1, dtype)
    return ctx.op("bitwise", [ctx.promoted(args["self"], dtype), mask], [_lib.BOOL_OPS["and"]])


def _logical(which):
    """logical_*: any dtypes (nonzero is true) into bool."""

    def lower(ctx, node):
        args = node_args(node)
        inputs = [ctx.tensor(args["self"])]
        if which != "not":
            inputs.append(ctx.tensor(args["other"]))
        return ctx.op("logical", inputs, [_lib.BOOL_OPS[which]])

    return lower


def _bitwise(which):
    """bitwise_*: operands in the result's dtype (bool, i32 or i64)."""

    def lower(ctx, node):
        args = node_args(node)
        dtype = node_value(node).dtype
        inputs = [ctx.promoted(args["self"], dtype)]
        if which != "not":
            inputs.append(ctx.promoted(args["other"], dtype))
        return ctx.op("bitwise", inputs, [_lib.BOOL_OPS[which]])

    return lower


def _min_max(name):
    def lower(ctx, node):
        args = node_args(node)
        dtype = node_value(node).dtype
        return ctx.op(name, [ctx.promoted(args["self"], dtype), ctx.promoted(args["other"], dtype)])

    return lower


def _clamped(ctx, node, x, low, high):
    """x bounded below by low and above by high (None: no bound), each a number or a node,
    in the result's dtype: maximum with low, then minimum with high, as PyTorch's clamp (a
    NaN propagates, and low > high gives high)."""
    dtype = node_value(node).dtype
    value = ctx.promoted(x, dtype)
    if low is not None:
        value = ctx.op("maximum", [value, ctx.promoted(low, dtype)])
    if high is not None:
        value = ctx.op("minimum", [value, ctx.promoted(high, dtype)])
    return value


def _lower_clamp(ctx, node):
    args = node_args(node)
    return _clamped(ctx, node, args["self"], args["min"], args["max"])


def _check_clamp(node):
    args = node_args(node)
    if args["min"] is None and args["max"] is None:
        return "clamp with neither min nor max"
    return None


def _lower_hardtanh(ctx, node):
    args = node_args(node)
    return _clamped(ctx, node, args["self"], args["min_val"], args["max_val"])


_BOOL_ARITHMETIC = {"add": "or", "mul": "and"}  # what add and mul of two bools are


def _binary(name, has_alpha):
    def lower(ctx, node):
        args = node_args(node)
        dtype = node_value(node).dtype
        inputs = [ctx.promoted(args["self"], dtype), ctx.promoted(args["other"], dtype)]
        if dtype == torch.bool:  # a mask times (or plus) a mask: and (or), as PyTorch computes it
            return ctx.op("logical", inputs, [_lib.BOOL_OPS[_BOOL_ARITHMETIC[name]]])
        fattr = [float(args["alpha"])] if has_alpha else []
        return ctx.op(name, inputs, (), fattr)

    return lower


def _lower_linear(ctx, node):
    args = node_args(node)
    inputs = [ctx.tensor(args["input"]), ctx.tensor(args["weight"])]
    if args["bias"] is not None:
        inputs.append(ctx.tensor(args["bias"]))
    return ctx.op("linear", inputs, [_lib.ACT_NONE])


def _check_addmm(node):
    args = node_args(node)
    if args["beta"] != 1 or args["alpha"] != 1:
        return f"addmm with beta={args['beta']} alpha={args['alpha']} (Kiln needs 1 and 1)"
    return None


def _lower_addmm(ctx, node):
    args = node_args(node)
    product = ctx.op("matmul", [ctx.tensor(args["mat1"]), ctx.tensor(args["mat2"])])
    return ctx.op("add", [product, ctx.tensor(args["self"])], (), [1.0])


def _lower_matmul(ctx, node):
    return ctx.op("matmul", [ctx.tensor(node.args[0]), ctx.tensor(node.args[1])])


_GELU_APPROXIMATIONS = {"none": 0, "tanh": 1}


def _lower_gelu(ctx, node):
    approximate = _GELU_APPROXIMATIONS[node_args(node)["approximate"]]
    return ctx.op("gelu", [ctx.tensor(node.args[0])], [approximate])


def _lower_pow(ctx, node):
    args = node_args(node)
    return ctx.op("pow", [ctx.tensor(args["self"])], (), [float(args["exponent"])])


def _softmax(name):
    def lower(ctx, node):
        args = node_args(node)
        return ctx.op(name, [ctx.tensor(args["self"])], [args["dim"]])

    return lower


def _lower_layer_norm(ctx, node):
    args = node_args(node)
    inputs = [ctx.tensor(args["input"])]
    flags = 0
    if args["weight"] is not None:
        inputs.append(ctx.tensor(args["weight"]))
        flags |= 1
    if args["bias"] is not None:
        inputs.append(ctx.tensor(args["bias"]))
        flags |= 2
    return ctx.op("layer_norm", inputs, [len(args["normalized_shape"]), flags], [float(args["eps"])])


def _check_native_layer_norm(node):
    for user in node.users:
        if user.target is not operator.getitem or user.args[1] != 0:
            return "native_layer_norm whose mean or rstd output is used (Kiln computes only the output)"
    return None


def _lower_getitem(ctx, node):
    """One output of a multi-output node (a split's piece), or the one Kiln computes."""
    value = ctx.tensor(node.args[0])
    return value[node.args[1]] if isinstance(value, tuple) else value


def _lower_rms_norm(ctx, node):
    args = node_args(node)
    x = args["input"]
    inputs = [ctx.tensor(x)]
    if args["weight"] is not None:
        inputs.append(ctx.tensor(args["weight"]))
    eps = args["eps"]
    if eps is None:  # PyTorch's default: the machine epsilon of the input dtype
        eps = torch.finfo(node_value(x).dtype).eps
    flags = 1 if args["weight"] is not None else 0
    return ctx.op("rms_norm", inputs, [len(args["normalized_shape"]), flags], [float(eps)])


def _check_group_norm(node):
    return only_first_output_used(node, "mean or rstd")


def _lower_group_norm(ctx, node):
    """native_group_norm: a layer_norm over each group's channels and positions, then the
    per-channel weight and bias broadcast over the positions."""
    args = node_args(node)
    x = args["input"]
    shape = list(node_value(x).shape)
    groups = args["group"]
    per_group = shape[1] // groups
    for size in shape[2:]:
        per_group = per_group * size
    rows = ctx.op("reshape", [ctx.tensor(x)], [shape[0], groups, per_group])
    y = ctx.op("reshape", [ctx.op("layer_norm", [rows], [1, 0], [float(args["eps"])])], shape)
    return composed.per_channel_affine(ctx, y, args["weight"], args["bias"], shape)


def _reduced(ctx, node, name, dtype):
    """The reduction `name` of node's input over its dims, the input cast to dtype first."""
    args = node_args(node)
    x = args["self"]
    mask = dims_mask(args["dim"], node_value(x).dim())
    return ctx.op(name, [ctx.promoted(x, dtype)], [mask, int(bool(args["keepdim"]))])


def _reduce(name):
    """sum, mean or amax over dims; a dtype asked for (sum's and mean's) is the input's before
    the reduction, as PyTorch casts it."""
    return lambda ctx, node: _reduced(ctx, node, name, node_value(node).dtype)


COUNT_LIMIT = 2**24  # f32 holds every integer up to here: a sum of as many 0s and 1s is exact


def _summed_count(node):
    """The most elements one output of a reduction sums (dynamic dims at their bound), or None
    where a dim has no bound."""
    args = node_args(node)
    shape = node_value(args["self"]).shape
    dims = args["dim"] if args["dim"] else range(len(shape))
    count = 1
    for dim in dims:
        size = shape[dim]
        if isinstance(size, torch.SymInt):
            size = size.node.shape_env.bound_sympy(size.node.expr).upper
            if not isinstance(size, sympy.Integer):  # unbounded (torch's int_oo is no Integer)
                return None
        count *= int(size)
    return count


_CASTS = {"aten::_to_copy", "dim_order_ops::_to_dim_order_copy"}


def _counts(value):
    """Whether every element of an fx value is 0 or 1: a bool, or a bool cast to a number (the
    `mask.long().sum()` idiom)."""
    if node_value(value).dtype == torch.bool:
        return True
    return (isinstance(value, torch.fx.Node) and value.op == "call_function"
            and aten_op(value)._schema.name in _CASTS and node_value(value.args[0]).dtype == torch.bool)


def _check_sum(node):
    """A sum into a float dtype casts its input there first; a sum of 0s and 1s into an integer
    (a count: tokens that are not padding) sums them in f32, exact while it stays below 2^24."""
    x = node_args(node)["self"]
    dtype, into = node_value(x).dtype, node_value(node).dtype
    if into.is_floating_point:
        return None
    if not _counts(x):
        return (f"sum of {dtype} into {into} (Kiln sums floats, and counts bools or bools cast to "
                "integers); cast the input to a float dtype first")
    count = _summed_count(node)
    if count is None or count > COUNT_LIMIT:
        return (f"sum of {count or 'unbounded'} bools an output (f32 counts at most 2^24 exactly); "
                "sum fewer at a time, or bound the dynamic dims")
    return None


def _lower_sum(ctx, node):
    into = node_value(node).dtype
    if into.is_floating_point:
        return _reduced(ctx, node, "sum", into)
    return ctx.op("cast", [_reduced(ctx, node, "sum", torch.float32)], [_lib.kiln_dtype(into)])


def _lower_reshape(ctx, node):
    return ctx.op("reshape", [ctx.tensor(node.args[0])], list(node_value(node).shape))


def _lower_permute(ctx, node):
    args = node_args(node)
    return ctx.op("permute", [ctx.tensor(args["self"])], list(args["dims"]))


def _lower_transpose(ctx, node):
    args = node_args(node)
    rank = node_value(args["self"]).dim()
    perm = list(range(rank))
    a, b = args["dim0"], args["dim1"]
    perm[a], perm[b] = perm[b], perm[a]
    return ctx.op("permute", [ctx.tensor(args["self"])], perm)


def _lower_t(ctx, node):
    rank = node_value(node.args[0]).dim()
    return ctx.op("permute", [ctx.tensor(node.args[0])], list(reversed(range(rank))))


def _lower_expand(ctx, node):
    return ctx.op("expand", [ctx.tensor(node.args[0])], list(node_value(node).shape))


def _tiles(count):
    """Whether a repeat count tiles its dim: any but a static 1 (a dynamic count, the node computing
    it, tiles by its size at run time)."""
    return not isinstance(count, int) or count != 1


def _check_repeat(node):
    args = node_args(node)
    x, repeats = node_value(args["self"]), list(args["repeats"])
    tiled = sum(_tiles(r) for r in repeats)
    if len(repeats) + tiled > _lib.MAX_RANK:
        return (f"repeat of a rank-{x.dim()} tensor by {len(repeats)} counts, {tiled} of them tiling "
                f"(Kiln's views take {_lib.MAX_RANK} dims, one more for each tiled dim)")
    return None


def _lower_repeat(ctx, node):
    """repeat: x viewed with a unit dim before each dim it tiles (and unit dims in front for
    repeats longer than its rank), those expanded to the repeat counts, then merged with the
    dims after them: views, which the builder fuses into one copy."""
    args = node_args(node)
    shape, repeats = list(node_value(args["self"]).shape), list(args["repeats"])
    shape = [1] * (len(repeats) - len(shape)) + shape
    viewed, expanded = [], []
    for size, count in zip(shape, repeats):
        if _tiles(count):
            viewed.append(1)
            expanded.append(count)
        viewed.append(size)
        expanded.append(size)
    y = ctx.op("reshape", [ctx.tensor(args["self"])], viewed)
    y = ctx.op("expand", [y], expanded)
    return ctx.op("reshape", [y], list(node_value(node).shape))


def _lower_cat(ctx, node):
    """cat; more inputs than an op takes (DenseNet's blocks join dozens) become cats of runs of
    consecutive inputs first, each input copied at most twice while the count allows."""
    args = node_args(node)
    pieces, dim = [ctx.tensor(t) for t in args["tensors"]], args["dim"]
    first = 0  # pieces before it are joined runs already
    while len(pieces) > _lib.MAX_OP_INPUTS:
        if len(pieces) - first < 2:
            first = 0
        run = min(_lib.MAX_OP_INPUTS, len(pieces) - _lib.MAX_OP_INPUTS + 1, len(pieces) - first)
        pieces[first:first + run] = [ctx.op("cat", pieces[first:first + run], [dim])]
        first += 1
    return ctx.op("cat", pieces, [dim])


_INT64_MAX = 2**63 - 1


def _bound_at(ctx, size, bound):
    """A slice bound or select index against a dim of dynamic size: counted from the end when
    negative, the size itself when at or past it (the builder clamps only static bounds)."""
    if isinstance(bound, torch.fx.Node) or not isinstance(size, torch.SymInt):
        return bound
    if bound < 0:
        return size + bound
    return size if bound >= ctx.size(size)[0] else bound


def _lower_slice(ctx, node):
    args = node_args(node)
    start = 0 if args["start"] is None else args["start"]
    end = _INT64_MAX if args["end"] is None else args["end"]
    size = node_value(args["self"]).shape[args["dim"]]
    start, end = _bound_at(ctx, size, start), _bound_at(ctx, size, end)
    return ctx.op("slice", [ctx.tensor(args["self"])], [args["dim"], start, end, args["step"]])


def _slice_scatter_run(node):
    """slice_scatter's dim and the run [start, end) of slots it writes, normalized as PyTorch does."""
    args = node_args(node)
    shape = node_value(args["self"]).shape
    dim = args["dim"] % len(shape)
    size = shape[dim]
    start = 0 if args["start"] is None else args["start"]
    end = size if args["end"] is None else args["end"]
    start, end = (b + size if b < 0 else b for b in (start, end))
    start = min(max(start, 0), size)
    return dim, start, min(max(end, start), size)


def _check_slice_scatter(node):
    args = node_args(node)
    if args["step"] != 1:
        return f"slice_scatter with step {args['step']} (Kiln writes one run of consecutive slots)"
    size = node_value(args["self"]).shape[args["dim"]]
    if any(isinstance(v, (torch.fx.Node, torch.SymInt)) for v in (size, args["start"], args["end"])):
        return "slice_scatter over a dynamic dim or at a dynamic position (Kiln plans it static)"
    return None


def _lower_slice_scatter(ctx, node):
    """slice_scatter with step 1: self's slots before the run, src, and self's slots after it,
    joined along the dim (a slice and a cat each, which the builder fuses into one copy)."""
    args = node_args(node)
    x = args["self"]
    dim, start, end = _slice_scatter_run(node)
    size = node_value(x).shape[dim]
    pieces = [ctx.tensor(args["src"])]
    if start > 0:
        pieces.insert(0, ctx.op("slice", [ctx.tensor(x)], [dim, 0, start, 1]))
    if end < size:
        pieces.append(ctx.op("slice", [ctx.tensor(x)], [dim, end, size, 1]))
    return ctx.op("cat", pieces, [dim]) if len(pieces) > 1 else ctx.op("copy", pieces)


def _lower_select(ctx, node):
    args = node_args(node)
    index = _bound_at(ctx, node_value(args["self"]).shape[args["dim"]], args["index"])
    return ctx.op("select", [ctx.tensor(args["self"])], [args["dim"], index])


def _lower_copy(ctx, node):
    """clone, _to_copy and their dim-order forms: a cast when the dtype changes."""
    x = node.args[0]
    out_dtype = node_value(node).dtype
    if node_value(x).dtype != out_dtype:
        return ctx.op("cast", [ctx.tensor(x)], [_lib.kiln_dtype(out_dtype)])
    return ctx.op("copy", [ctx.tensor(x)])


_CONTIGUOUS_FORMATS = (None, torch.contiguous_format, torch.preserve_format)


def _check_copy(node):
    """A copy into another memory format or dim order (a clone of a permuted tensor is one) is a
    plain copy inside a blob, where only values count; its result may not leave the blob, whose
    tensors are contiguous, so every reader must be a Kiln op."""
    args = node_args(node)
    dim_order = args.get("dim_order")
    if args.get("memory_format") not in _CONTIGUOUS_FORMATS:
        layout = f"memory format {args['memory_format']}"
    elif dim_order is not None and list(dim_order) != list(range(node_value(node).dim())):
        layout = f"dim order {list(dim_order)}"
    else:
        return None
    for user in node.users:
        if user.op != "call_function" or refusal(user) is not None:
            return f"copy to {layout} read outside Kiln by {user.name} (Kiln tensors are contiguous)"
    return None


def _check_as_strided(node):
    """as_strided is taken only where it reads the input's elements in order (a reshape): what
    a flatten of a permuted tensor with unit dims becomes in the edge dialect."""
    args = node_args(node)
    # A dynamic size or stride is a node computing it; its value is a SymInt, compared without guards.
    size, stride = ([value.meta["val"] if isinstance(value, torch.fx.Node) else value for value in args[name]]
                    for name in ("size", "stride"))
    expected, running = [], 1
    for extent in reversed(size):
        expected.append(running)
        running *= extent
    expected.reverse()
    in_order = all(statically_known_true(extent == 1) or statically_known_true(s == e)
                   for extent, s, e in zip(size, stride, expected))
    whole = statically_known_true(running == node_value(args["self"]).numel())
    if args["storage_offset"] not in (None, 0) or not in_order or not whole:
        return f"as_strided to size {size} stride {stride} offset {args['storage_offset']} (only in-order views)"
    return None


def _lower_embedding(ctx, node):
    args = node_args(node)
    return ctx.op("embedding", [ctx.tensor(args["weight"]), ctx.tensor(args["indices"])])


def _lower_index_select(ctx, node):
    args = node_args(node)
    return ctx.op("index_select", [ctx.tensor(args["self"]), ctx.tensor(args["index"])], [args["dim"]])


def _lower_where(ctx, node):
    args = node_args(node)
    dtype = node_value(node).dtype
    inputs = [ctx.tensor(args["condition"]), ctx.promoted(args["self"], dtype),
              ctx.promoted(args["other"], dtype)]
    return ctx.op("where", inputs)


def _lower_masked_fill(ctx, node):
    args = node_args(node)
    dtype = node_value(node).dtype
    inputs = [ctx.tensor(args["mask"]), ctx.operand(args["value"], dtype), ctx.tensor(args["self"])]
    return ctx.op("where", inputs)


def _check_sdpa(node):
    args = node_args(node)
    if args["dropout_p"] != 0:
        return f"scaled_dot_product_attention with dropout_p={args['dropout_p']} (inference only)"
    return None


def _lower_sdpa(ctx, node):
    args = node_args(node)
    inputs = [ctx.tensor(args["query"]), ctx.tensor(args["key"]), ctx.tensor(args["value"])]
    if args["attn_mask"] is not None:
        inputs.append(ctx.tensor(args["attn_mask"]))
    scale = 0.0 if args["scale"] is None else float(args["scale"])
    iattr = [int(bool(args["is_causal"])), int(args["attn_mask"] is not None)]
    return ctx.op("sdpa", inputs, iattr, [scale])


def _spatial_pair(values, spatial, fill):
    """A 1- or 2-d window attribute as a pair; a 1-d op gets fill for h."""
    values = [values] if isinstance(values, int) else list(values)
    if spatial == 1:
        return pair(fill, values[0])
    if len(values) == 1:
        values = values * 2
    return pair(values[0], values[1])


def _is_patch_convolution(args):
    """A convolution that cuts its input into disjoint patches (kernel = stride, no padding or
    dilation, one group), the patch or tubelet embedding of vision and video transformers, with
    static spatial dims and channels."""
    x, w = node_value(args["input"]), node_value(args["weight"])
    n = x.dim() - 2
    kernel = list(w.shape[2:])
    return (not args["transposed"] and args["groups"] == 1 and per_dim(args["stride"], n) == kernel
            and all(p == 0 for p in per_dim(args["padding"], n))
            and all(d == 1 for d in per_dim(args["dilation"], n))
            and not any(isinstance(d, torch.SymInt) for d in list(x.shape[1:]) + kernel))


def _check_convolution(node):
    args = node_args(node)
    spatial = node_value(args["input"]).dim() - 2
    if spatial == 3:
        if args["transposed"]:
            return "a transposed 3-d convolution (Kiln runs 3-d ones as 2-d convolutions of frames)"
        if not static_dims(args["input"], 1) or not static_dims(args["weight"], 0):
            return "a 3-d convolution over dynamic channels, frames or cells (Kiln plans them static)"
        return None
    if spatial not in (1, 2):
        return f"a {spatial}-d convolution (Kiln runs 1-d, 2-d and 3-d)"
    if args["transposed"]:
        stride = per_dim(args["stride"], spatial)
        padding = per_dim(args["output_padding"], spatial)
        if any(o >= s for o, s in zip(padding, stride)):
            return (f"a transposed convolution with output padding {padding} not below its stride "
                    f"{stride} (cuDNN, which runs Kiln's convolutions on the GPU, needs it below)")
    return None


def _lower_patch_convolution(ctx, node):
    """A 3-d patch convolution as a linear: the input cut into its patches (a slice drops what
    the convolution drops past the last whole patch), each patch's channels and kernel cells
    flattened in the weight's order, times the weight as [out, in * cells], then the output
    channels moved back to dim 1."""
    args = node_args(node)
    x, w = node_value(args["input"]), node_value(args["weight"])
    kernel, spatial = list(w.shape[2:]), list(x.shape[2:])
    n, cells = len(kernel), [d // k for d, k in zip(spatial, kernel)]
    y = ctx.tensor(args["input"])
    for i, (size, k, c) in enumerate(zip(spatial, kernel, cells)):
        if c * k != size:
            y = ctx.op("slice", [y], [2 + i, 0, c * k, 1])
    cut = [x.shape[0], x.shape[1]]
    for c, k in zip(cells, kernel):
        cut += [c, k]
    y = ctx.op("reshape", [y], cut)
    y = ctx.op("permute", [y], [0] + [2 + 2 * i for i in range(n)] + [1] + [3 + 2 * i for i in range(n)])
    depth = x.shape[1] * math.prod(kernel)
    y = ctx.op("reshape", [y], [x.shape[0]] + cells + [depth])
    inputs = [y, ctx.op("reshape", [ctx.tensor(args["weight"])], [w.shape[0], depth])]
    if args["bias"] is not None:
        inputs.append(ctx.tensor(args["bias"]))
    y = ctx.op("linear", inputs, [_lib.ACT_NONE])
    return ctx.op("permute", [y], [0, n + 1] + list(range(1, n + 1)))


def _lower_convolution(ctx, node):
    args = node_args(node)
    spatial = node_value(args["input"]).dim() - 2
    if spatial == 3 and _is_patch_convolution(args):
        return _lower_patch_convolution(ctx, node)
    if spatial == 3:
        return composed.lower_convolution_3d(ctx, node)
    inputs = [ctx.tensor(args["input"]), ctx.tensor(args["weight"])]
    if args["bias"] is not None:
        inputs.append(ctx.tensor(args["bias"]))
    iattr = [_spatial_pair(args["stride"], spatial, 1), _spatial_pair(args["padding"], spatial, 0),
             _spatial_pair(args["dilation"], spatial, 1), int(args["groups"]),
             int(args["bias"] is not None)]
    if not args["transposed"]:  # PyTorch ignores output_padding here
        return ctx.op("conv", inputs, iattr)
    iattr.append(_spatial_pair(args["output_padding"], spatial, 0))
    return ctx.op("conv_transpose", inputs, iattr)


def _check_batch_norm(node):
    return only_first_output_used(node, "mean or invstd")


def _lower_batch_norm(ctx, node):
    """batch_norm; of a 3-d convolution's output, on its 2-d convolution's output (the same
    channels at dim 1) with the frames put back after, so the builder folds it into that
    convolution."""
    args = node_args(node)
    x = ctx.tensor(args["input"])
    framed = ctx.framed.get(x)
    inputs = [framed[0] if framed else x, ctx.tensor(args["running_mean"]), ctx.tensor(args["running_var"])]
    flags = 0
    if args["weight"] is not None:
        inputs.append(ctx.tensor(args["weight"]))
        flags |= 1
    if args["bias"] is not None:
        inputs.append(ctx.tensor(args["bias"]))
        flags |= 2
    y = ctx.op("batch_norm", inputs, [flags], [float(args["eps"])])
    return composed.restored_frames(ctx, y, framed[1]) if framed else y


def _pool_window(args):
    """kernel, stride (empty means the kernel) and padding of a 2-d pool as pairs."""
    kernel = args["kernel_size"]
    stride = args["stride"] if args["stride"] else kernel
    return _spatial_pair(kernel, 2, 1), _spatial_pair(stride, 2, 1), _spatial_pair(args["padding"], 2, 0)


def _check_max_pool(node):
    return only_first_output_used(node, "indices")


def _lower_max_pool(ctx, node):
    args = node_args(node)
    kernel, stride, padding = _pool_window(args)
    iattr = [kernel, stride, padding, _spatial_pair(args["dilation"], 2, 1), int(bool(args["ceil_mode"]))]
    return ctx.op("max_pool2d", [ctx.tensor(args["self"])], iattr)


def _lower_avg_pool(ctx, node):
    args = node_args(node)
    kernel, stride, padding = _pool_window(args)
    divisor = args["divisor_override"] or 0
    iattr = [kernel, stride, padding, int(bool(args["ceil_mode"])),
             int(bool(args["count_include_pad"])), int(divisor)]
    return ctx.op("avg_pool2d", [ctx.tensor(args["self"])], iattr)


def _output_pair(node):
    shape = node_value(node).shape
    return pair(shape[-2], shape[-1])


def _lower_adaptive_avg_pool(ctx, node):
    return ctx.op("adaptive_avg_pool2d", [ctx.tensor(node.args[0])], [_output_pair(node)])


def _upsample_scales(args):
    """The scale factors PyTorch computes source indices with, 0 where it uses the sizes."""
    if args.get("scale_factors") is not None:
        return [float(f) for f in args["scale_factors"]]
    return [float(args.get("scales_h") or 0.0), float(args.get("scales_w") or 0.0)]


def _lower_upsample_nearest(ctx, node):
    args = node_args(node)
    x = args.get("input", args.get("self"))
    return ctx.op("upsample_nearest2d", [ctx.tensor(x)], [_output_pair(node)], _upsample_scales(args))


def _lower_upsample_bilinear(ctx, node):
    args = node_args(node)
    x = args.get("input", args.get("self"))
    iattr = [_output_pair(node), int(bool(args["align_corners"]))]
    return ctx.op("upsample_bilinear2d", [ctx.tensor(x)], iattr, _upsample_scales(args))


def _lower_cumsum(ctx, node):
    args = node_args(node)
    return ctx.op("cumsum", [ctx.tensor(args["self"])], [args["dim"], _lib.kiln_dtype(node_value(node).dtype)])


def _lower_gather(ctx, node):
    args = node_args(node)
    return ctx.op("gather", [ctx.tensor(args["self"]), ctx.tensor(args["index"])], [args["dim"]])


def _check_index(node):
    for position, index in enumerate(node_args(node)["indices"]):
        if isinstance(index, torch.fx.Node) and node_value(index).dtype in (torch.bool, torch.uint8):
            return (f"index.Tensor with a bool mask at position {position}: the result's shape "
                    "depends on the mask's values (Kiln plans are static)")
    return None


def _lower_index(ctx, node):
    """x[i0, i1, ...]: one index input per indexed dim, named by a bitmask (None skips a dim)."""
    args = node_args(node)
    mask, inputs = 0, [ctx.tensor(args["self"])]
    for dim, index in enumerate(args["indices"]):
        if index is not None:
            mask |= 1 << dim
            inputs.append(ctx.tensor(index))
    return ctx.op("index", inputs, [mask])


def _put_dim(node):
    """The one indexed dim of an index_put that writes whole slots (index_copy's form), or why not."""
    args = node_args(node)
    indices = list(args["indices"])
    given = [dim for dim, index in enumerate(indices) if index is not None]
    if args["accumulate"]:
        return None, "index_put with accumulate=True (Kiln writes, it does not add)"
    if len(given) != 1:
        return None, f"index_put with {len(given)} index tensors (Kiln writes slots along one dim)"
    dim = given[0]
    index = node_value(indices[dim])
    if index.dim() != 1 or index.dtype not in (torch.int32, torch.int64):
        return None, f"index_put with a {index.dtype} index of rank {index.dim()} (Kiln takes a 1-D integer one)"
    expected = list(node_value(args["self"]).shape)
    expected[dim] = index.shape[0]
    values = args["values"]
    if not isinstance(values, torch.fx.Node) or list(node_value(values).shape) != expected:
        return None, f"index_put whose values are not shaped {expected} (Kiln does not broadcast them)"
    return dim, None


def _check_index_put(node):
    return _put_dim(node)[1]


def _lower_index_put(ctx, node):
    """self[..., idx, ...] = values along one dim: Kiln's index_copy (in place on a state)."""
    args = node_args(node)
    dim = _put_dim(node)[0]
    return ctx.op("index_copy", [ctx.tensor(args["self"]), ctx.tensor(args["indices"][dim]),
                                 ctx.promoted(args["values"], node_value(node).dtype)], [dim])


def _lower_index_copy(ctx, node):
    args = node_args(node)
    return ctx.op("index_copy", [ctx.tensor(args["self"]), ctx.tensor(args["index"]),
                                 ctx.tensor(args["source"])], [args["dim"]])


def _lower_copy_into(ctx, node):
    """copy(self, src): src cast to self's dtype and broadcast to its shape; self's values unread."""
    args = node_args(node)
    out = node_value(node)
    value = ctx.promoted(args["src"], out.dtype)
    if tuple(node_value(args["src"]).shape) != tuple(out.shape):
        return ctx.op("expand", [value], list(out.shape))
    return ctx.op("copy", [value])


_TOPK_MAX = 8


def _check_topk(node):
    args = node_args(node)
    x, k = args["self"], args["k"]
    if node_value(x).dim() == 0:
        return "topk of a 0-d tensor"
    dim = args["dim"] % node_value(x).dim()
    if not isinstance(k, int) or not 1 <= k <= _TOPK_MAX:
        return f"topk with k = {k} (Kiln selects 1 to {_TOPK_MAX} elements, one argmax each)"
    if not node_value(x).dtype.is_floating_point:
        return f"topk of {node_value(x).dtype} (Kiln selects from float tensors)"
    if not isinstance(node_value(x).shape[dim], int):
        return "topk along a dim of dynamic size"
    return None


def _lower_topk(ctx, node):
    """topk for small k (an MoE router picking its experts): k rounds of argmax, each masking
    what it took to -inf; the values gathered from x. Where only -inf is left, a round takes the
    first element not taken yet, so no index comes twice. Largest first, as sorted=True asks."""
    args = node_args(node)
    x, k, largest = args["self"], args["k"], args["largest"]
    val = node_value(x)
    dim = args["dim"] % val.dim()
    dtype = val.dtype
    xs = ctx.tensor(x)
    cur = xs if largest else ctx.op("neg", [xs])
    along = [1] * val.dim()
    along[dim] = val.shape[dim]
    positions = ctx.builder.add_constant(torch.arange(val.shape[dim]).reshape(along))
    low, zero, one = (ctx.operand(v, dtype) for v in (float("-inf"), 0.0, 1.0))
    taken = None
    values, indices = [], []
    for _ in range(k):
        pick = ctx.op("argmax", [cur], [dim, 1])
        if taken is not None:
            untaken = ctx.op("where", [taken, zero, one])
            first = ctx.op("argmax", [untaken], [dim, 1])
            left = ctx.op("gather", [cur, pick], [dim])
            exhausted = ctx.op("compare", [left, low], [_lib.COMPARE["eq"]])
            pick = ctx.op("where", [exhausted, first, pick])
        hit = ctx.op("compare", [positions, pick], [_lib.COMPARE["eq"]])
        taken = hit if taken is None else ctx.op("logical", [taken, hit], [_lib.BOOL_OPS["or"]])
        cur = ctx.op("where", [hit, low, cur])
        values.append(ctx.op("gather", [xs, pick], [dim]))
        indices.append(pick)
    if k == 1:
        return values[0], indices[0]
    return ctx.op("cat", values, [dim]), ctx.op("cat", indices, [dim])


def _lower_split(ctx, node):
    """split and split_with_sizes: one slice per piece, sized as PyTorch sized the outputs."""
    args = node_args(node)
    x, dim = args["self"], args["dim"]
    pieces, start = [], 0
    for piece in node_value(node):
        size = piece.shape[dim]
        pieces.append(ctx.op("slice", [ctx.tensor(x)], [dim, start, start + size, 1]))
        start += size
    return tuple(pieces)


_SIZE_TARGETS = (torch.ops.aten.sym_size.int, operator.add, operator.sub, operator.mul, operator.neg,
                 operator.floordiv)


def _lower_size(ctx, node):
    return None


def is_size_node(node):
    """Whether node computes a dynamic size (no builder op of its own)."""
    lowering = LOWERINGS.get(aten_op(node)) if node.op == "call_function" else None
    return lowering is not None and lowering.lower is _lower_size


def _check_size(node):
    """A size read or computed on dynamic dims goes with its readers: each must be a Kiln op."""
    if not isinstance(node.meta.get("val"), torch.SymInt):
        return f"{op_name(node)} of a value other than a dynamic size"
    for user in node.users:
        reason = refusal(user)
        if reason is not None:
            return f"a dynamic size read by {user.name}, which stays on ExecuTorch ({reason})"
    return None


def _lower_alias(ctx, node):
    return ctx.op("copy", [ctx.tensor(node.args[0])])


def _static_scalars(*names):
    """A check refusing a creation op whose named scalar arguments are symbolic."""

    def check(node):
        args = node_args(node)
        for name in names:
            if isinstance(args.get(name), torch.fx.Node):
                return f"{op_name(node)} with a symbolic {name} (Kiln plans are static)"
        return None

    return check


def _filled(value_of):
    """A creation op: a builder constant of the node's shape, or over a dynamic shape, a constant
    of one element expanded to it."""

    def lower(ctx, node):
        val = node_value(node)
        if all(isinstance(d, int) for d in val.shape):
            return ctx.builder.add_constant(torch.full(tuple(val.shape), value_of(node), dtype=val.dtype))
        one = ctx.builder.add_constant(torch.full((1,) * val.dim(), value_of(node), dtype=val.dtype))
        return ctx.op("expand", [one], list(val.shape))

    return lower


def _affine(value):
    """Whether a SymInt (or a node of one) is a*s+b of one symbol s with integers a >= 1 and b,
    the only dynamic sizes a Kiln plan holds."""
    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
    if not isinstance(value, torch.SymInt):
        return not isinstance(value, torch.fx.Node)
    expr = sympy.expand(value.node.expr)
    if expr.is_Integer:
        return True
    if len(expr.free_symbols) != 1:
        return False
    try:
        poly = sympy.Poly(expr, *expr.free_symbols)
    except sympy.PolynomialError:
        return False
    coeffs = poly.all_coeffs()
    return poly.degree() == 1 and all(c.is_Integer for c in coeffs) and coeffs[0] >= 1


def _check_arange(node):
    """A symbolic end is fine when start and step are static and the length follows one symbol
    (a slice of the arange at the bound); a symbolic start or step is not."""
    reason = _static_scalars("start", "step")(node)
    if reason is None and not _affine(node_value(node).shape[0]):
        reason = (f"{op_name(node)} of length {node_value(node).shape[0]}, not a*s+b of one dynamic size "
                  "(Kiln plans hold only those)")
    return reason


def _lower_arange(ctx, node):
    args = node_args(node)
    start, step = args.get("start", 0), args.get("step", 1)
    length = node_value(node).shape[0]
    if not isinstance(args["end"], torch.fx.Node) and not isinstance(length, torch.SymInt):
        return ctx.builder.add_constant(torch.arange(start, args["end"], step, dtype=node_value(node).dtype))
    # A dynamic end: the arange at the bound, of which each call reads its first `length` values.
    longest = ctx.size(length)[0]
    full = ctx.builder.add_constant(torch.arange(longest, dtype=node_value(node).dtype) * step + start)
    return ctx.op("slice", [full], [0, 0, length, 1])


def _check_scalar_tensor(node):
    if _affine(node_args(node)["s"]):
        return None
    return f"{op_name(node)} of {node_args(node)['s']}, not a*s+b of one dynamic size (Kiln plans hold only those)"


def _lower_scalar_tensor(ctx, node):
    value, dtype = node_args(node)["s"], node_value(node).dtype
    if not _sym_scalar(value):
        return ctx.builder.add_constant(torch.tensor(value, dtype=dtype))
    # A dynamic size as a value: the element at that index of 0, 1, ... up to its bound.
    return ctx.op("select", [ctx.builder.add_constant(torch.arange(ctx.size(value)[0] + 1, dtype=dtype))],
                  [0, value])


def _ops(*names):
    """The OpOverloads named "namespace::op.overload"."""
    found = []
    for name in names:
        packet, _, overload = name.rpartition(".")
        namespace, _, op = packet.partition("::")
        found.append(getattr(getattr(getattr(torch.ops, namespace), op), overload))
    return found


def _table():
    table = {}

    def add(names, lowering):
        for op in _ops(*names):
            table[op] = lowering

    add(["aten::linear.default"], Lowering(_lower_linear))
    add(["aten::addmm.default"], Lowering(_lower_addmm, _check_addmm))
    add(["aten::mm.default", "aten::bmm.default", "aten::matmul.default"], Lowering(_lower_matmul))
    add(["aten::add.Tensor", "aten::add.Scalar"], Lowering(_binary("add", True)))
    add(["aten::sub.Tensor", "aten::sub.Scalar"], Lowering(_binary("sub", True)))
    add(["aten::mul.Tensor", "aten::mul.Scalar"], Lowering(_binary("mul", False)))
    add(["aten::div.Tensor", "aten::div.Scalar"], Lowering(_binary("div", False)))
    for name in ("relu", "silu", "sigmoid", "tanh", "exp", "sqrt", "rsqrt"):
        add([f"aten::{name}.default"], Lowering(_unary(name)))
    for name in ("abs", "log", "cos", "sin", "erf", "hardswish", "hardsigmoid"):
        add([f"aten::{name}.default"], Lowering(_unary(name)))
    add(["aten::neg.default"], Lowering(composed.lower_neg))
    add(["aten::log1p.default"], Lowering(composed.lower_log1p))
    add(["aten::expm1.default"], Lowering(composed.lower_expm1))
    add(["aten::log2.default"], Lowering(composed.scaled_log(2)))
    add(["aten::log10.default"], Lowering(composed.scaled_log(10)))
    add(["aten::reciprocal.default"], Lowering(composed.lower_reciprocal))
    add(["aten::leaky_relu.default"], Lowering(composed.lower_leaky_relu, composed.check_float_input))
    add(["aten::elu.default"], Lowering(composed.lower_elu, composed.check_float_input))
    add(["aten::isnan.default"], Lowering(composed.lower_isnan, composed.check_float_input))
    add(["aten::isinf.default"], Lowering(composed.lower_isinf, composed.check_float_input))
    add(["aten::pow.Scalar"], Lowering(composed.lower_pow_scalar, composed.check_pow_scalar))
    for which in ("floor", "ceil", "trunc", "round"):
        add([f"aten::{which}.default"], Lowering(composed.rounded(which)))
    add(["aten::sign.default"], Lowering(composed.lower_sign))
    for which in ("eq", "ne", "lt", "le", "gt", "ge"):
        add([f"aten::{which}.Tensor", f"aten::{which}.Scalar"], Lowering(_compare(which)))
    for which in ("and", "or", "xor", "not"):
        add([f"aten::logical_{which}.default"], Lowering(_logical(which)))
    for which in ("and", "or", "xor"):
        add([f"aten::bitwise_{which}.Tensor", f"aten::bitwise_{which}.Scalar"], Lowering(_bitwise(which)))
    add(["aten::bitwise_not.default"], Lowering(_bitwise("not")))
    add(["aten::remainder.Scalar"], Lowering(_lower_remainder, _check_remainder))
    add(["aten::minimum.default"], Lowering(_min_max("minimum")))
    add(["aten::maximum.default"], Lowering(_min_max("maximum")))
    add(["aten::clamp.default", "aten::clamp.Tensor"], Lowering(_lower_clamp, _check_clamp))
    add(["aten::hardtanh.default"], Lowering(_lower_hardtanh))
    add(["aten::gelu.default"], Lowering(_lower_gelu))
    add(["aten::pow.Tensor_Scalar"], Lowering(_lower_pow))
    add(["aten::_softmax.default", "aten::softmax.int"], Lowering(_softmax("softmax")))
    add(["aten::_log_softmax.default", "aten::log_softmax.int"], Lowering(_softmax("log_softmax")))
    add(["aten::layer_norm.default"], Lowering(_lower_layer_norm))
    add(["aten::native_layer_norm.default"], Lowering(_lower_layer_norm, _check_native_layer_norm))
    add(["aten::rms_norm.default"], Lowering(_lower_rms_norm))
    add(["aten::native_group_norm.default"], Lowering(_lower_group_norm, _check_group_norm))
    add(["aten::mean.dim"], Lowering(_reduce("mean")))
    add(["aten::sum.dim_IntList"], Lowering(_lower_sum, _check_sum))
    add(["aten::amax.default"], Lowering(_reduce("amax")))
    add(["aten::view_copy.default", "aten::view.default", "aten::reshape.default",
         "aten::_unsafe_view.default", "aten::squeeze_copy.dims", "aten::squeeze_copy.dim",
         "aten::squeeze_copy.default", "aten::squeeze.dims", "aten::squeeze.dim",
         "aten::squeeze.default", "aten::unsqueeze_copy.default", "aten::unsqueeze.default"],
        Lowering(_lower_reshape, compute=False))
    add(["aten::permute_copy.default", "aten::permute.default"], Lowering(_lower_permute, compute=False))
    add(["aten::transpose_copy.int", "aten::transpose.int"], Lowering(_lower_transpose, compute=False))
    add(["aten::t_copy.default", "aten::t.default"], Lowering(_lower_t, compute=False))
    add(["aten::expand_copy.default", "aten::expand.default"], Lowering(_lower_expand, compute=False))
    add(["aten::cat.default"], Lowering(_lower_cat, compute=False))
    add(["aten::repeat.default"], Lowering(_lower_repeat, _check_repeat, compute=False))
    add(["aten::slice_copy.Tensor", "aten::slice.Tensor"], Lowering(_lower_slice, compute=False))
    add(["aten::select_copy.int", "aten::select.int"], Lowering(_lower_select, compute=False))
    add(["aten::slice_scatter.default"],
        Lowering(_lower_slice_scatter, _check_slice_scatter, compute=False))
    add(["aten::clone.default", "aten::_to_copy.default", "dim_order_ops::_clone_dim_order.default",
         "dim_order_ops::_to_dim_order_copy.default"], Lowering(_lower_copy, _check_copy, compute=False))
    add(["aten::as_strided_copy.default", "aten::as_strided.default"],
        Lowering(_lower_reshape, _check_as_strided, compute=False))
    add(["aten::embedding.default"], Lowering(_lower_embedding))
    add(["aten::index_select.default"], Lowering(_lower_index_select))
    add(["aten::where.self"], Lowering(_lower_where))
    add(["aten::masked_fill.Scalar"], Lowering(_lower_masked_fill))
    add(["aten::scaled_dot_product_attention.default"], Lowering(_lower_sdpa, _check_sdpa))
    add(["aten::convolution.default"], Lowering(_lower_convolution, _check_convolution))
    add(["aten::_native_batch_norm_legit_no_training.default"],
        Lowering(_lower_batch_norm, _check_batch_norm))
    add(["aten::max_pool2d_with_indices.default"], Lowering(_lower_max_pool, _check_max_pool))
    add(["aten::max_pool2d.default"], Lowering(_lower_max_pool))
    add(["aten::avg_pool2d.default"], Lowering(_lower_avg_pool))
    add(["aten::max_pool3d_with_indices.default"], Lowering(composed.lower_max_pool_3d, composed.check_max_pool_3d))
    add(["aten::avg_pool3d.default"], Lowering(composed.lower_avg_pool_3d, composed.check_pool_3d))
    add(["aten::col2im.default"], Lowering(composed.lower_col2im, composed.check_col2im))
    add(["aten::unfold_copy.default", "aten::unfold.default"],
        Lowering(composed.lower_unfold, composed.check_unfold, compute=False))
    add(["aten::_adaptive_avg_pool2d.default", "aten::adaptive_avg_pool2d.default"],
        Lowering(_lower_adaptive_avg_pool))
    add(["aten::avg_pool1d.default"], Lowering(composed.lower_avg_pool_1d))
    add(["aten::adaptive_avg_pool1d.default"], Lowering(composed.lower_adaptive_avg_pool_1d))
    add(["aten::_adaptive_avg_pool3d.default", "aten::adaptive_avg_pool3d.default"],
        Lowering(composed.lower_adaptive_avg_pool_3d, composed.check_adaptive_avg_pool_3d))
    add(["aten::upsample_nearest2d.vec", "aten::upsample_nearest2d.default"],
        Lowering(_lower_upsample_nearest))
    add(["aten::upsample_bilinear2d.vec", "aten::upsample_bilinear2d.default"],
        Lowering(_lower_upsample_bilinear))
    add(["aten::constant_pad_nd.default"],
        Lowering(composed.lower_constant_pad, composed.check_constant_pad, compute=False))
    add(["aten::cumsum.default"], Lowering(_lower_cumsum))
    add(["aten::grid_sampler_2d.default"], Lowering(composed.lower_grid_sampler, composed.check_grid_sampler))
    add(["aten::flip.default"], Lowering(composed.lower_flip, composed.check_flip, compute=False))
    for rank in (1, 2, 3):
        for name, mirror in (("reflection", True), ("replication", False)):
            add([f"aten::{name}_pad{rank}d.default"],
                Lowering(composed.edge_pad(mirror), composed.check_edge_pad, compute=False))
    add(["aten::select_scatter.default"],
        Lowering(composed.lower_select_scatter, composed.check_select_scatter, compute=False))
    add(["aten::scatter.value"], Lowering(composed.lower_scatter_value, composed.check_scatter_value))
    add(["aten::gather.default"], Lowering(_lower_gather))
    add(["aten::index.Tensor"], Lowering(_lower_index, _check_index))
    add(["aten::argmax.default"], Lowering(composed.arg_extreme(True)))
    add(["aten::argmin.default"], Lowering(composed.arg_extreme(False)))
    add(["aten::amin.default"], Lowering(composed.lower_amin, composed.check_float_input))
    add(["aten::max.dim"], Lowering(composed.extreme_along(True), composed.check_min_max_dim))
    add(["aten::min.dim"], Lowering(composed.extreme_along(False), composed.check_min_max_dim))
    add(["aten::mean.default"], Lowering(composed.lower_mean_all))
    add(["aten::var.correction", "aten::var.dim"], Lowering(composed.lower_var, composed.check_var))
    add(["aten::any.default", "aten::any.dim", "aten::any.dims"], Lowering(composed.lower_any, composed.check_any))
    add(["aten::_native_batch_norm_legit.no_stats"],
        Lowering(composed.lower_batch_norm_stats, composed.check_batch_norm_stats))
    add(["aten::topk.default"], Lowering(_lower_topk, _check_topk))
    add(["aten::index_put.default"], Lowering(_lower_index_put, _check_index_put))
    add(["aten::index_copy.default"], Lowering(_lower_index_copy))
    add(["aten::copy.default"], Lowering(_lower_copy_into, compute=False))
    add(["aten::split_with_sizes_copy.default", "aten::split_with_sizes.default",
         "aten::split_copy.Tensor", "aten::split.Tensor"], Lowering(_lower_split, compute=False))
    add(["aten::alias_copy.default", "aten::alias.default"], Lowering(_lower_alias, compute=False))
    fill_value = _filled(lambda node: node_args(node)["fill_value"])
    add(["aten::full.default", "aten::full_like.default"],
        Lowering(fill_value, _static_scalars("fill_value"), compute=False))
    add(["aten::zeros.default", "aten::zeros_like.default"], Lowering(_filled(lambda node: 0), compute=False))
    add(["aten::ones.default", "aten::ones_like.default"], Lowering(_filled(lambda node: 1), compute=False))
    add(["aten::scalar_tensor.default"], Lowering(_lower_scalar_tensor, _check_scalar_tensor, compute=False))
    add(["aten::arange.default", "aten::arange.start", "aten::arange.start_step"],
        Lowering(_lower_arange, _check_arange, compute=False))
    table[operator.getitem] = Lowering(_lower_getitem, compute=False)
    # Size arithmetic on dynamic dims: no builder op; the ops reading it take it as an attribute.
    for target in _SIZE_TARGETS:
        table[target] = Lowering(_lower_size, _check_size, compute=False)
    return table


LOWERINGS = _table()

# Kept whole by to_edge_transform_and_lower, when Kiln takes the node, instead of being
# decomposed into many small ops.
OPS_TO_NOT_DECOMPOSE = _ops(
    "aten::linear.default",
    "aten::scaled_dot_product_attention.default",
    "aten::layer_norm.default",
    "aten::rms_norm.default",
    "aten::silu.default",
    "aten::hardswish.default",
    "aten::hardsigmoid.default",
    "aten::upsample_nearest2d.vec",
    "aten::upsample_bilinear2d.vec",
    "aten::col2im.default",
)


# ------------------------------------------------------------------ support


def _tensor_refusal(value, what):
    if not isinstance(value, torch.Tensor):
        return f"{what} is not a tensor"
    if _lib.kiln_dtype(value.dtype) is None:
        return f"{what} has dtype {value.dtype}, which Kiln does not support"
    return None


def _has_dynamic_shape(node):
    values = [node.meta.get("val")] + [arg.meta.get("val") for arg in node.all_input_nodes]
    flat = [v for value in values for v in (value if isinstance(value, (tuple, list)) else [value])]
    return any(isinstance(v, torch.Tensor) and not all(isinstance(d, int) for d in v.shape) for v in flat)


def _probe(node, lowering):
    """Builds the node alone, its tensor inputs as builder inputs; the builder's refusal or None."""
    if _has_dynamic_shape(node):
        try:
            return _probe_static(node, lowering)
        except (TypeError, ValueError, RuntimeError) as exc:  # a lowering that needs static sizes
            return f"{op_name(node)} with a dynamic shape, which its lowering cannot take ({exc})"
    return _probe_static(node, lowering)


def _probe_static(node, lowering):
    with Builder() as builder:
        ctx = Context(builder)
        try:
            for index, arg in enumerate(node.all_input_nodes):
                if not _sym_scalar(arg):
                    ctx.values[arg] = ctx.input(arg, f"probe_{index}")
            tensor = lowering.lower(ctx, node)
            if tensor is not None:
                check_inferred(ctx, node, tensor)
        except KilnError as exc:
            return exc.message
    return None


def refusal(node):
    """Why Kiln cannot take this node, or None when it can."""
    if node.op != "call_function":
        return f"{node.op} node"
    lowering = LOWERINGS.get(aten_op(node))
    if lowering is None:
        return f"{op_name(node)} is not a Kiln op"
    if node.target is operator.getitem:  # of a multi-output node: supported with its source
        return refusal(node.args[0])
    for arg in node.all_input_nodes:
        if _sym_scalar(arg):  # a dynamic size, taken as an attribute
            continue
        reason = _tensor_refusal(arg.meta.get("val"), f"input {arg.name}")
        if reason:
            return reason
    if lowering.lower is _lower_size:
        return lowering.check(node)
    # Before the outputs: a check names the cause of an output shape that is not static.
    if lowering.check is not None:
        reason = lowering.check(node)
        if reason:
            return reason
    values = node.meta.get("val")
    outputs = values if isinstance(values, (tuple, list)) else [values]
    for index, value in enumerate(outputs):
        reason = _tensor_refusal(value, f"output {index}")
        if reason:
            return reason
    return _probe(node, lowering)


def check_inferred(ctx, node, tensor):
    """Refuses a tensor whose builder-inferred dtype or shape differs from PyTorch's; a tuple
    of tensors (a split) is checked output by output."""
    val = node_value(node)
    if isinstance(tensor, tuple):
        if len(tensor) != len(val):
            raise KilnError(_lib.ERR_UNSUPPORTED,
                            f"{node.name}: lowered to {len(tensor)} outputs but PyTorch has {len(val)}")
        pairs = zip(tensor, val)
    else:  # a multi-output op of which Kiln computes the first (native_layer_norm)
        pairs = [(tensor, val[0] if isinstance(val, (tuple, list)) else val)]
    for one, value in pairs:
        dtype, shape = ctx.builder.get_shape(one)
        expected = (_lib.kiln_dtype(value.dtype), tuple(ctx.sizes(value.shape)[0]))
        if (dtype, shape) != expected:
            raise KilnError(
                _lib.ERR_UNSUPPORTED,
                f"{node.name}: the builder inferred {_lib.DTYPE_NAMES[dtype]}{list(shape)} but "
                f"PyTorch computed {_lib.DTYPE_NAMES[expected[0]]}{list(expected[1])}",
            )


# ------------------------------------------------------------------ programs


def _constant(program, node):
    """The tensor behind a parameter, buffer or lifted constant placeholder, else None."""
    if is_param(program, node):
        return get_param(program, node)
    if is_buffer(program, node):
        return get_buffer(program, node)
    if is_lifted_tensor_constant(program, node):
        return get_lifted_tensor_constant(program, node)
    return None


def build_blob(program, device_id=0, allow_tf32=False, fuse=True, bounds=None):
    """Lowers a delegated edge subprogram into blob bytes.

    Its parameters, buffers and lifted constants become builder constants; the buffers it
    mutates become states the engine keeps, written with each BUFFER_MUTATION output.
    """
    signature = program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    states = {node.name for node in program.graph.find_nodes(op="placeholder")
              if signature.inputs_to_buffers.get(node.name) in mutated}
    return build_graph(
        program.graph, lambda node: _constant(program, node),
        device_id=device_id, allow_tf32=allow_tf32, fuse=fuse, states=states,
        mutations=_mutation_targets(program), bounds=program_bounds(program, bounds),
    )


def _mutation_targets(program):
    """Per graph output position, the placeholder name of the buffer it writes, or None."""
    signature = program.graph_signature
    placeholder_of = {target: name for name, target in signature.inputs_to_buffers.items()}
    return [placeholder_of.get(spec.target) if spec.kind == OutputKind.BUFFER_MUTATION else None
            for spec in signature.output_specs]


def _binding_name(name, index):
    """The node's name, or when longer than a binding name may be, a prefix made unique by
    the binding's index."""
    if len(name.encode("utf-8")) < _lib.NAME_MAX:
        return name
    return f"{name.encode('utf-8')[:48].decode('utf-8', 'ignore')}~{index}"


def build_graph(graph, constant_of, device_id=0, allow_tf32=False, fuse=True, states=(), mutations=(),
                bounds=_shape_env_bounds):
    """Lowers a graph into blob bytes: each placeholder is a constant when constant_of(node)
    returns its tensor (a state, starting from that tensor, when its name is in states), else
    a builder input (in graph order); the outputs in order are the marked outputs, except
    that output i writes the state mutations[i] names, when it names one. bounds(symbol, size)
    gives a dynamic size's (min, max)."""
    with Builder() as builder:
        ctx = Context(builder, bounds)
        index = 0  # of the next binding
        state_of = {}
        for node in graph.nodes:
            if node.op == "placeholder":
                if _sym_scalar(node):  # a dynamic size ExecuTorch passes; the engine reads the shapes
                    continue
                constant = constant_of(node)
                if constant is not None and node.name in states:
                    ctx.values[node] = state_of[node.name] = ctx.builder.add_state(constant)
                    continue
                if constant is not None:
                    ctx.values[node] = ctx.builder.add_constant(constant)
                    continue
                reason = _tensor_refusal(node_value(node), f"input {node.name}")
                if reason:
                    raise KilnError(_lib.ERR_UNSUPPORTED, reason)
                ctx.values[node] = ctx.input(node, _binding_name(node.name, index))
                index += 1
            elif node.op == "call_function":
                lowering = LOWERINGS.get(aten_op(node))
                if lowering is None:
                    raise KilnError(_lib.ERR_UNSUPPORTED, f"{node.name}: {op_name(node)} is not a Kiln op")
                tensor = lowering.lower(ctx, node)
                if tensor is None:  # a dynamic size, read by the ops that take it
                    continue
                check_inferred(ctx, node, tensor)
                ctx.values[node] = tensor
            elif node.op == "output":
                targets = list(mutations) + [None] * (len(node.args[0]) - len(mutations))
                for out, target in zip(node.args[0], targets):
                    if target is not None:
                        builder.write_state(state_of[target], ctx.tensor(out))
                        continue
                    builder.mark_output(ctx.tensor(out), _binding_name(out.name, index))
                    index += 1
            else:
                raise KilnError(_lib.ERR_UNSUPPORTED, f"{node.name}: {node.op} nodes are not supported")
        return builder.build(device_id=device_id, allow_tf32=allow_tf32, fuse=fuse)

