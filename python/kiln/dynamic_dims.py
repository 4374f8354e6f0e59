"""Dynamic dims kept through lowering: each must have finite bounds (Kiln plans memory for the
upper bound), ops that would let ExecuTorch fix one at its example size are rewritten first, and
a dim that lowering fixed anyway is refused rather than written as a static program."""

import operator

import torch
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from .fx_nodes import node_args

_aten = torch.ops.aten


def finite(value):
    """value as an int, or None for an infinite or symbolic bound."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None


def _user_input_dims(program):
    """(input name, dim, size) for every dim of every user input tensor of program."""
    user_inputs = set(program.graph_signature.user_inputs)
    for node in program.graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        if node.name in user_inputs and isinstance(value, torch.Tensor):
            for dim, size in enumerate(value.shape):
                yield node.name, dim, size


def unbounded_refusal(program):
    """The first dynamic dimension of a user input without finite bounds, as a message; None when
    every one is bounded."""
    for name, dim, size in _user_input_dims(program):
        if isinstance(size, int):
            continue
        bounds = program.range_constraints.get(size.node.expr)
        if bounds is not None and finite(bounds.upper) is not None and finite(bounds.lower) is not None:
            continue
        within = f" in [{bounds.lower}, {bounds.upper}]"[:32] if bounds is not None else ""
        return (f"kiln: input {ascii(name)[:48]} dimension {dim} is dynamic ({str(size)[:24]}{within}) without "
                "an upper bound; Kiln plans memory for the bound: export it with torch.export.Dim(name, max=N)")
    return None


def _pieces(node):
    """How each output of a list-returning split is read from its input, as (op, args) per output
    for a view op, or None where a piece's extent along the split dim is not static."""
    target = node.target
    if target in (_aten.split_with_sizes.default, _aten.split.Tensor, _aten.chunk.default):
        args = node_args(node)
        source, dim = args["self"], args["dim"] % args["self"].meta["val"].dim()
        views, start = [], 0
        for piece in node.meta["val"]:
            size = piece.shape[dim]
            if not isinstance(size, int):
                return None
            views.append((_aten.slice.Tensor, (source, dim, start, start + size)))
            start += size
        return views
    if target is _aten.unbind.int:
        args = node_args(node)
        return [(_aten.select.int, (args["self"], args["dim"], index)) for index in range(len(node.meta["val"]))]
    return None


def splits_as_views(program):
    """Rewrites, in place, each split, chunk and unbind over a dynamic shape into one slice (or
    select) per output. ExecuTorch's verifier sizes a list-returning op's result by the length of
    its first tensor, which fixes a dynamic first dim (a batch) at its example size; a view per
    output returns a tensor, which it does not size that way. Kiln lowers the splits to the same
    slices, so the plan is unchanged."""
    graph = program.graph_module.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or not isinstance(node.meta.get("val"), (list, tuple)):
            continue
        if all(isinstance(size, int) for piece in node.meta["val"] for size in piece.shape):
            continue
        views = _pieces(node)
        if views is None or not all(user.target is operator.getitem for user in node.users):
            continue
        for user in list(node.users):
            op, args = views[user.args[1]]
            with graph.inserting_before(user):
                view = graph.call_function(op, args)
            view.meta.update(node.meta)  # the model's line and module, for reports
            for key in ("val", "tensor_meta"):  # the piece's own value, not the list's
                view.meta.pop(key, None)
                if key in user.meta:
                    view.meta[key] = user.meta[key]
            user.replace_all_uses_with(view)
            graph.erase_node(user)
        graph.erase_node(node)
        changed = True
    if changed:
        graph.lint()
        program.graph_module.recompile()
    return program


# Uninitialized allocations and the zero fills that may stand for them, with the same arguments
# (empty's memory_format aside, which zeros does not take).
_ZEROS_FOR = {
    _aten.new_empty.default: _aten.new_zeros.default,
    _aten.empty.memory_format: _aten.zeros.default,
    _aten.empty_like.default: _aten.zeros_like.default,
}


def empties_as_zeros(program):
    """Rewrites, in place, each empty over a dynamic shape into zeros of that shape (an empty's
    contents are unspecified, so zeros are one of its values). ExecuTorch lowers an empty into an
    allocation op whose sizes are plain ints, which fixes a dynamic dim (a batch) at its example
    size; a zero fill keeps it, and Kiln plans it as a broadcast constant. DeepSeek-V3's latent
    attention writes its keys into such an empty."""
    graph = program.graph_module.graph
    changed = False
    for node in list(graph.nodes):
        zeros = _ZEROS_FOR.get(node.target) if node.op == "call_function" else None
        value = node.meta.get("val")
        if zeros is None or not isinstance(value, torch.Tensor) or all(is_concrete_int(s) for s in value.shape):
            continue
        kwargs = dict(node.kwargs)
        if zeros is _aten.zeros.default:
            kwargs.pop("memory_format", None)
        node.target, node.kwargs = zeros, kwargs
        changed = True
    if changed:
        graph.lint()
        program.graph_module.recompile()
    return program


def dynamic_input_dims(program):
    """{(input name, dim): its symbol} for each dynamic dim of program's user inputs, to compare with
    the lowered program (lowering that fixes a dim fixes it in program's own values too)."""
    return {(name, dim): str(size) for name, dim, size in _user_input_dims(program) if not is_concrete_int(size)}


def specialized_refusal(dynamic, lowered):
    """The first of the dynamic dims (dynamic_input_dims of the exported program) that lowered, the
    edge program, has fixed at a size, as a message; None when every one stayed dynamic."""
    for name, dim, size in _user_input_dims(lowered):
        if (name, dim) in dynamic and is_concrete_int(size):
            return (f"kiln: input {ascii(name)[:48]} dim {dim} was exported dynamic ({dynamic[name, dim][:24]}) but "
                    f"lowering fixed it at {int(size)} (an op guards on its size); export it static or change "
                    "that op (TORCH_LOGS=+dynamic names it)")
    return None
