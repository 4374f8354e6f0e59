"""What lowering reads off an edge-dialect node: its ATen op, its arguments by schema name, its
example value, and the builder's packing of dims and window attributes."""

import operator

from executorch.exir.dialects.edge._ops import EdgeOpOverload


def aten_op(node):
    """The ATen (or dim-order) OpOverload behind an edge or ATen node's target."""
    return node.target._op if isinstance(node.target, EdgeOpOverload) else node.target


def node_args(node):
    """The node's arguments by schema name, with the schema's defaults filled in."""
    values = {}
    positional = 0
    for argument in aten_op(node)._schema.arguments:
        if not argument.kwarg_only and positional < len(node.args):
            values[argument.name] = node.args[positional]
            positional += 1
        elif argument.name in node.kwargs:
            values[argument.name] = node.kwargs[argument.name]
        elif argument.has_default_value():
            values[argument.name] = argument.default_value
        else:
            values[argument.name] = None
    return values


def node_value(node):
    """The example value torch.export recorded for a node (a tensor, a tuple of them, a SymInt)."""
    return node.meta["val"]


def dims_mask(dims, rank):
    """The reduced dims as the builder's bitmask; none listed means all."""
    if dims is None or len(dims) == 0:
        dims = range(rank)
    mask = 0
    for dim in dims:
        mask |= 1 << (dim + rank if dim < 0 else dim)
    return mask


def pair(h, w):
    """A spatial (h, w) attribute packed as the builder's KILN_PAIR."""
    return (int(h) << 32) | int(w)


def only_first_output_used(node, what):
    """Why a multi-output node cannot be lowered when an output past its first is read, or None."""
    for user in node.users:
        if user.target is not operator.getitem or user.args[1] != 0:
            return f"{op_name(node)} whose {what} output is used (Kiln computes only the first)"
    return None


def per_dim(values, n):
    """A window attribute given once for all n dims, or once per dim, as n values."""
    values = list(values)
    return values * n if len(values) == 1 else values


def static_dims(value, first):
    """Whether the dims of a node's value from `first` on are static."""
    return all(isinstance(d, int) for d in node_value(value).shape[first:])


def op_name(node):
    """The node's op as "name.overload", for messages."""
    op = aten_op(node)
    schema = getattr(op, "_schema", None)
    return f"{schema.name}.{schema.overload_name or 'default'}" if schema is not None else str(op)
