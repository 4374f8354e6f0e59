"""The delegation report: how much of a lowered program runs on Kiln and what stays on ExecuTorch."""

import operator
import struct
from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch
from executorch.exir.delegate import executorch_call_delegate

from . import lowering
from .program import lowered_modules

# The blob header (magic, version, header size, then offset and size of each section) and the
# plan header, whose op count follows the magic, the version and the tensor count.
_BLOB_HEADER = "<8sII7Q"
_PLAN_OFFSET_FIELD = 5
_PLAN_OPS_AT = 12

# Nodes that only route a delegate's outputs; they cost nothing at run time.
_ROUTING = (operator.getitem,)


class NotWholeError(RuntimeError):
    """kiln.export(..., require_whole=True) found compute left on ExecuTorch."""


@dataclass(frozen=True)
class LeftOut:
    op: str
    count: int
    reason: str
    compute: bool  # False for ops that only move or view data


@dataclass(frozen=True)
class DelegationReport:
    kiln_blobs: int
    kiln_ops: int  # ops of the blobs' plans, as `kiln inspect` counts them
    left_out: Tuple[LeftOut, ...]  # grouped by op, in order of first appearance
    first_compute: Tuple[str, str, str]  # (node, op, reason) of the first compute op outside; () when none

    @property
    def whole(self):
        """True when every compute-bearing op runs on Kiln."""
        return not self.first_compute

    @property
    def ops_outside(self):
        return sum(entry.count for entry in self.left_out)

    def __str__(self):
        lines = [f"kiln: {self.kiln_blobs} Kiln blob{'s' if self.kiln_blobs != 1 else ''} with "
                 f"{self.kiln_ops} ops; {self.ops_outside} {'op stays' if self.ops_outside == 1 else 'ops stay'} on ExecuTorch"]
        for entry in self.left_out:
            kind = "" if entry.compute else " (moves data only)"
            lines.append(f"  {entry.op} x{entry.count}{kind}: {entry.reason}")
        return "\n".join(lines)


def _op_name(node):
    op = lowering.aten_op(node)
    schema = getattr(op, "_schema", None)
    if schema is None:
        return str(op)
    return f"{schema.name.replace('::', '.')}.{schema.overload_name or 'default'}"


def _is_compute(node):
    entry = lowering.LOWERINGS.get(lowering.aten_op(node))
    return entry is None or entry.compute


def plan_ops(blob):
    """The number of ops in a Kiln blob's plan."""
    plan = struct.unpack_from(_BLOB_HEADER, blob)[_PLAN_OFFSET_FIELD]
    return struct.unpack_from("<I", blob, plan + _PLAN_OPS_AT)[0]


def _graph_module(program):
    if isinstance(program, torch.export.ExportedProgram):
        return program.graph_module
    return program.exported_program().graph_module


def delegation_report(program, refusals=None):
    """The report of an edge program (ExportedProgram or EdgeProgramManager) after lowering.

    refusals maps node names to the partitioner's reasons; a node it lacks is asked again.
    """
    refusals = refusals or {}
    graph_module = _graph_module(program)
    groups: Dict[str, List] = {}
    first: Tuple[str, str, str] = ()
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node.target in _ROUTING or node.target is executorch_call_delegate:
            continue
        name = _op_name(node)
        compute = _is_compute(node)
        reason = refusals.get(node.name) or lowering.refusal(node) or "supported, but alone between ExecuTorch ops it would only move data"
        if name not in groups:
            groups[name] = [0, reason, compute]
        groups[name][0] += 1
        if compute and not first:
            first = (node.name, name, reason)
    modules = lowered_modules(graph_module)
    kiln_ops = sum(plan_ops(bytes(module.processed_bytes)) for module in modules)
    left_out = tuple(LeftOut(op, count, reason, compute) for op, (count, reason, compute) in groups.items())
    return DelegationReport(len(modules), kiln_ops, left_out, first)
