"""kiln.export: a PyTorch module to a .pte file whose supported parts run on Kiln."""

import operator
import os
import stat
import tempfile
import warnings

import torch
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
from executorch.exir.delegate import executorch_call_delegate
from torch.export.graph_signature import InputKind, OutputKind
from executorch.exir.passes import MemoryPlanningPass
from executorch.exir.lowered_backend_module import LoweredBackendModule

from .backend import KilnBackend
from .partitioner import KilnPartitioner


def to_executorch(model, example_inputs, *, device_id=0, fuse=True, allow_tf32=False):
    """Exports and lowers model; returns ExecuTorch's ExecutorchProgramManager."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if getattr(model, "training", False):
        warnings.warn("kiln: the model is in training mode; call model.eval() before exporting "
                      "so that dropout and batch statistics do not end up in the program")
    exported = torch.export.export(model, tuple(example_inputs))
    partitioner = KilnPartitioner(device_id=device_id, allow_tf32=allow_tf32, fuse=fuse)
    edge = to_edge_transform_and_lower(exported, partitioner=[partitioner])
    return edge.to_executorch(caller_buffer_config(edge.exported_program()))


def _kiln_call(node):
    """Whether node is a delegate call whose lowered module is a Kiln blob."""
    if node.op != "call_function" or node.target is not executorch_call_delegate:
        return False
    owner = node.graph.owning_module
    module = getattr(owner, node.args[0].target, None)
    return isinstance(module, LoweredBackendModule) and module.backend_id == KilnBackend.__name__


def caller_buffer_config(program):
    """ExecuTorch's backend config that leaves the program's inputs (outputs) out of its memory
    plan when every one of them only feeds (comes straight from) a Kiln blob, so the caller's
    buffers are what the delegate receives: set_input shares the tensor's data pointer, and
    unplanned outputs take the buffer given with set_output_data_ptr (Module::set_output)."""
    graph = program.graph_module.graph
    placeholders = {node.name: node for node in graph.nodes if node.op == "placeholder"}
    user_inputs = [placeholders[spec.arg.name] for spec in program.graph_signature.input_specs
                   if spec.kind == InputKind.USER_INPUT and getattr(spec.arg, "name", None) in placeholders]
    inputs_to_kiln = bool(user_inputs) and all(
        node.users and all(_kiln_call(user) for user in node.users) for node in user_inputs)
    output_node = next(node for node in graph.nodes if node.op == "output")
    returned = list(output_node.args[0])
    user = [value for value, spec in zip(returned, program.graph_signature.output_specs)
            if spec.kind == OutputKind.USER_OUTPUT]
    # Each output a distinct result of a Kiln call: a buffer returned twice cannot be the caller's twice.
    outputs_from_kiln = bool(user) and len(set(user)) == len(user) and all(
        isinstance(value, torch.fx.Node) and (_kiln_call(value) or (
            value.target is operator.getitem and _kiln_call(value.args[0]))) for value in user)
    return ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(
        alloc_graph_input=not inputs_to_kiln, alloc_graph_output=not outputs_from_kiln))


def _write_beside(path, data):
    """Writes data to a temporary file beside path, syncs it, then moves it into place."""
    directory = os.path.dirname(os.path.abspath(path))
    mode = stat.S_IMODE(os.stat(path).st_mode) if os.path.exists(path) else 0o644
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)


def export(model, example_inputs, path, *, device_id=0, fuse=True, allow_tf32=False):
    """Exports model to the ExecuTorch program path, delegating what Kiln supports.

    The model should be in eval mode. The file is replaced only after export, lowering
    and serialization all succeed: a refused export leaves an existing file untouched.
    Returns the ExecutorchProgramManager (kiln.blobs lists its Kiln blobs).
    """
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"kiln: cannot write {path}: the directory {directory} does not exist")
    program = to_executorch(model, example_inputs, device_id=device_id, fuse=fuse, allow_tf32=allow_tf32)
    _write_beside(path, program.buffer)
    return program
