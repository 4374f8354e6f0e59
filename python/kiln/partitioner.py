"""KilnPartitioner: tags the largest subgraphs of supported nodes for the Kiln backend."""

import logging

from executorch.exir.backend.canonical_partitioners.pattern_op_partitioner import (
    generate_pattern_op_partitions,
)
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data
from torch.export.graph_signature import OutputKind
from torch.fx import Node
from torch.fx.passes.operator_support import OperatorSupportBase

from . import _lib, lowering
from .backend import KilnBackend

log = logging.getLogger(__name__)


class _KilnSupport(OperatorSupportBase):
    """Asks the lowering table (and through it the C builder) about each node."""

    def __init__(self):
        self.refusals = {}

    def is_node_supported(self, submodules, node):
        if node.op != "call_function":
            return False
        reason = lowering.refusal(node)
        if reason is not None:
            self.refusals[node.name] = reason
            log.debug("kiln: %s stays on ExecuTorch: %s", node.name, reason)
        return reason is None


def tag_states(exported_program):
    """Gives a buffer the program mutates (a KV cache) to the blob that reads it when that blob
    also computes its new value: the blob then holds it as state, kept on the engine's device
    across calls. Otherwise it stays with ExecuTorch and crosses into the blob each call."""
    signature = exported_program.graph_signature
    output_node = exported_program.graph.output_node()
    new_value = {spec.target: value for spec, value in zip(signature.output_specs, output_node.args[0])
                 if spec.kind == OutputKind.BUFFER_MUTATION}
    for node in exported_program.graph.find_nodes(op="placeholder"):
        value = new_value.get(signature.inputs_to_buffers.get(node.name))
        if not isinstance(value, Node) or value.meta.get("delegation_tag") is None:
            continue
        tag = value.meta["delegation_tag"]
        if node.users and all(user.meta.get("delegation_tag") == tag for user in node.users):
            node.meta["delegation_tag"] = tag


def _is_layout_only(partition):
    return all(not lowering.LOWERINGS[lowering.aten_op(n)].compute for n in partition.nodes)


class KilnPartitioner(Partitioner):
    """Delegates every supported node to KilnBackend; the rest stays on ExecuTorch's kernels.

    A partition that only reshapes, copies or creates constants is left to ExecuTorch:
    a delegate call would cost more than it saves. After partition(), refusals maps the
    name of each node left to ExecuTorch to the reason.
    """

    def __init__(self, device_id=0, allow_tf32=False, fuse=True, bounds=None):
        """bounds: {symbol name: (min, max)} of the dynamic sizes as the user exported them
        (torch.export's edge programs raise a lower bound of 1 to 2); kiln.export passes them."""
        super().__init__()
        _lib.check_int32("device_id", device_id)
        self.compile_specs = [
            CompileSpec("device_id", str(device_id).encode()),
            CompileSpec("allow_tf32", b"1" if allow_tf32 else b"0"),
            CompileSpec("fuse", b"1" if fuse else b"0"),
        ]
        if bounds:
            text = ";".join(f"{name}={low}:{high}" for name, (low, high) in sorted(bounds.items()))
            self.compile_specs.append(CompileSpec("bounds", text.encode("ascii")))
        self.delegation_spec = DelegationSpec(KilnBackend.__name__, self.compile_specs)
        self.refusals = {}

    def ops_to_not_decompose(self, ep):
        # An op is kept whole only when Kiln takes every node of it; a per-node filter would
        # push ExecuTorch onto a path that loses the strides of kept ops (SDPA then view).
        ops = {}
        for node in ep.graph.nodes:
            if node.op == "call_function" and node.target in lowering.OPS_TO_NOT_DECOMPOSE:
                ops[node.target] = ops.get(node.target, True) and lowering.refusal(node) is None
        return [op for op, supported in ops.items() if supported], None

    def partition(self, exported_program):
        support = _KilnSupport()
        partitions = generate_pattern_op_partitions(exported_program.graph_module, op_support=support)
        tags = {}
        for partition in partitions:
            if _is_layout_only(partition):
                continue
            tag = f"kiln_{partition.id}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
        # A dynamic size goes into a blob only with all its readers: a blob never outputs one.
        for node in exported_program.graph_module.graph.nodes:
            tag = node.meta.get("delegation_tag")
            if tag and lowering.is_size_node(node) and any(
                    user.meta.get("delegation_tag") != tag for user in node.users):
                del node.meta["delegation_tag"]
        tag_constant_data(exported_program)
        tag_states(exported_program)
        self.refusals = support.refusals
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)
