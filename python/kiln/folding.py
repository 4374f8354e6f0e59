"""Constant folding before partitioning, and removal of constants nothing reads.

What depends only on constants and static shapes (arange, the masks and position ids built
from it, rotary cos/sin tables, full) is evaluated at export time and becomes a lifted
constant, so it neither stays on ExecuTorch's CPU kernels nor costs a kernel at run time.
ExecuTorch's constant_prop_pass does the evaluation; this wraps it with a size guard, which
it lacks, so that a fold never turns a small input into a much larger constant.
"""

import collections

import torch
from executorch.exir import memory
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from executorch.exir.passes import constant_prop_pass as propagation
from torch.export.exported_program import InputKind
from torch.utils import _pytree as pytree

# A folded constant may always be this large; beyond it, no larger than the constants it reads.
DEFAULT_FOLD_LIMIT_BYTES = 1 << 20

# Quantization primitives stay for the backends that match them; full is folded under the guard.
_SKIPPED = set(propagation._QUANT_PRIMITIVES_EDGE)


def _value_bytes(value):
    """Bytes of a node's example value (a tensor or a list of them); None when not a tensor."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return sum(v.numel() * v.element_size() for v in value)
    return None


def _is_static(value):
    tensors = value if isinstance(value, (list, tuple)) else [value]
    return all(isinstance(d, int) for t in tensors for d in t.shape)


_SCALARS = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


def foldable_constants(program, limit_bytes=DEFAULT_FOLD_LIMIT_BYTES):
    """Evaluates every node that reads only constants.

    Returns ({node: tensor}, {node: Python scalar}, {node name: bytes refused}). A node whose value
    would exceed both limit_bytes and the bytes of the program constants it derives from is not
    evaluated and stays in the graph (with what depends on it). A size that depends on data (a
    boolean mask's selection) is known once evaluated and checked then; the scalars read from
    constants (such a size, the checks on it) are evaluated too.
    """
    constants = propagation.get_constant_placeholder_dict(program)
    scalars = {}
    known = collections.ChainMap(constants, scalars)
    source_bytes = {node: value.numel() * value.element_size() for node, value in constants.items()}
    refused = {}
    for node in program.graph.nodes:
        if (node.op != "call_function" or node.target is memory.alloc or node.target in _SKIPPED
                or node.is_impure()):
            continue
        if not (propagation.is_const(node.args, program, known) and propagation.is_const(node.kwargs, program, known)):
            continue
        value = node.meta.get("val")
        size, scalar = _value_bytes(value), isinstance(value, _SCALARS)
        if size is None and not scalar:
            continue
        read = sum(source_bytes.get(n, 0) for n in node.all_input_nodes)
        static = not scalar and _is_static(value)
        if static and size > max(limit_bytes, read):
            refused[node.name] = size
            continue
        args, kwargs = pytree.tree_map(lambda a: propagation.get_data(a, program, known), (node.args, node.kwargs))
        with torch.no_grad():
            result = node.target(*args, **kwargs)
        if scalar:
            scalars[node] = result
            continue
        produced = None if static else _value_bytes(result)
        if produced is not None and produced > max(limit_bytes, read):
            refused[node.name] = produced
            continue
        # ExecuTorch refuses zero strides, which a folded expand would carry.
        if isinstance(result, torch.Tensor) and 0 in result.stride():
            result = result.contiguous()
        constants[node] = result
        source_bytes[node] = read
    return constants, scalars, refused


def _inline_scalars(program, scalars):
    """Writes each folded scalar into the arguments of the nodes that read it, drops the runtime
    checks (_assert_scalar) that now read a true constant, and erases the scalars' nodes nothing
    reads any more (the program's output may still)."""
    for node, value in scalars.items():
        for user in [user for user in node.users if user.op == "call_function"]:
            user.args, user.kwargs = pytree.tree_map(lambda a, n=node, v=value: v if a is n else a,
                                                     (user.args, user.kwargs))
    for node in list(program.graph.nodes):
        if node.target == torch.ops.aten._assert_scalar.default and node.args[0] is True:
            program.graph.erase_node(node)
    for node in reversed(list(scalars)):
        if not node.users:
            program.graph.erase_node(node)


def fold_constants(program, limit_bytes=DEFAULT_FOLD_LIMIT_BYTES):
    """Replaces, in place, each foldable subgraph of program by a lifted constant; returns the refusals."""
    if propagation.get_first_user_input(program) is None:
        return {}  # the lifted constants are placed before the first user input
    if any(node.target == torch.ops.higher_order.cond for node in program.graph.nodes):
        return {}
    constants, scalars, refused = foldable_constants(program, limit_bytes)
    _inline_scalars(program, scalars)
    specs = {spec.arg.name: spec for spec in program.graph_signature.input_specs}
    specs.update(propagation.create_constant_nodes_and_return_specs(constants, program))
    program.graph_signature.input_specs = [specs[n.name] for n in program.graph.find_nodes(op="placeholder")]
    propagation._update_output_node_and_specs(program, _skip_dim_order=False)
    program.graph.eliminate_dead_code()
    program.graph_module.recompile()
    return refused


_CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def drop_unused_constants(program):
    """Removes, in place, parameters, buffers and lifted constants that no node reads; returns their names.

    ExecuTorch removes unused parameters only. An unused lifted constant left behind when every
    weight went into a delegate leaves the constant segment empty, and ExecuTorch then writes
    the leftovers the deprecated way, which its runtime refuses to load.
    """
    signature = program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    placeholders = {node.name: node for node in program.graph.find_nodes(op="placeholder")}
    dropped, kept = [], []
    for spec in signature.input_specs:
        node = placeholders.get(spec.arg.name)
        if spec.kind in _CONSTANT_KINDS and spec.target not in mutated and node is not None and not node.users:
            program.graph.erase_node(node)
            program.state_dict.pop(spec.target, None)
            program.constants.pop(spec.target, None)
            dropped.append(spec.target)
        else:
            kept.append(spec)
    if dropped:
        signature.input_specs = kept
        program.graph_module.recompile()
    return dropped


class FoldConstants(ExportedProgramPassBase):
    """The export-time pass: fold constant subgraphs, then drop constants left unread."""

    def __init__(self, limit_bytes=DEFAULT_FOLD_LIMIT_BYTES):
        super().__init__()
        self.limit_bytes = limit_bytes
        self.refused = {}

    def call(self, exported_program):
        self.refused = fold_constants(exported_program, self.limit_bytes)
        drop_unused_constants(exported_program)
        return ExportedProgramPassResult(exported_program, True)
