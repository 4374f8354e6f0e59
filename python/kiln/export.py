"""kiln.export: a PyTorch module to a .pte file whose supported parts run on Kiln."""

import contextlib
import logging
import operator
import os
import re
import stat
import tempfile
import warnings

import torch
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
from executorch.exir.delegate import executorch_call_delegate
from executorch.exir.lowered_backend_module import LoweredBackendModule
from executorch.exir.passes import MemoryPlanningPass
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from .backend import KilnBackend
from .dynamic_dims import (dynamic_input_dims, empties_as_zeros, finite, specialized_refusal, splits_as_views,
                           unbounded_refusal)
from .folding import DEFAULT_FOLD_LIMIT_BYTES, FoldConstants, drop_unused_constants, fold_constants
from .partitioner import KilnPartitioner
from .report import NotWholeError, delegation_report


def _exported(model, example_inputs, kwargs, dynamic_shapes, strict):
    """torch.export's program for model, which may already be one."""
    if isinstance(model, torch.export.ExportedProgram):
        given = [name for name, value in (("example_inputs", example_inputs), ("kwargs", kwargs),
                                          ("dynamic_shapes", dynamic_shapes), ("strict", strict)) if value is not None]
        if given:
            raise TypeError(f"kiln: {', '.join(given)} given with an ExportedProgram, which was exported with its "
                            "own: pass them to torch.export.export instead, or pass the nn.Module")
        return model
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"kiln: cannot export a {type(model).__name__}; pass a torch.nn.Module or a "
                        "torch.export.ExportedProgram")
    if example_inputs is None:
        example_inputs = ()
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise TypeError(f"kiln: example_inputs is a {type(example_inputs).__name__}; pass a tuple of the "
                        "positional inputs of forward (or one tensor)")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kiln: kwargs is a {type(kwargs).__name__}; pass a dict of forward's keyword inputs")
    if getattr(model, "training", False):
        warnings.warn("kiln: the model is in training mode; call model.eval() before exporting "
                      "so that dropout and batch statistics do not end up in the program")
    # Without autograd: a traced write into a cache would otherwise leave it requiring grad.
    with torch.no_grad():
        program = torch.export.export(model, tuple(example_inputs), kwargs=kwargs,
                                      dynamic_shapes=dynamic_shapes, strict=bool(strict))
        if strict is None and _mutates_constants(program):
            # Non-strict export lifts tensors reached through plain attributes (transformers'
            # static cache layers) as constants, and lowering cannot functionalize writes into a
            # constant; strict export traces them as the module's buffers, the blob's state.
            program = torch.export.export(model, tuple(example_inputs), kwargs=kwargs,
                                          dynamic_shapes=dynamic_shapes, strict=True)
    return program


def _parameter_write_refusal(program):
    """A message when forward writes a parameter in place, which ExecuTorch cannot lower; None
    when it writes none."""
    written = _written_inputs(program, InputKind.PARAMETER) + [
        spec.target for spec in program.graph_signature.output_specs if spec.kind == OutputKind.PARAMETER_MUTATION]
    if not written:
        return None
    return (f"kiln: forward writes its parameter {ascii(written[0])[:48]} in place, which ExecuTorch cannot "
            "lower; make that write before exporting (a one-time rescale: call the model once in eval mode), "
            "or hold the value in a buffer")


def _mutates_constants(program):
    """Whether an in-place op writes a lifted constant of program (a buffer export did not see)."""
    return bool(_written_inputs(program, InputKind.CONSTANT_TENSOR))


def _written_inputs(program, kind):
    """The targets of program's inputs of kind (an InputKind) that an in-place op writes."""
    targets = {spec.arg.name: spec.target for spec in program.graph_signature.input_specs if spec.kind == kind}
    written = []
    for node in program.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable:
            continue
        for argument, value in zip(schema.arguments, node.args):
            writes = argument.alias_info is not None and argument.alias_info.is_write
            if writes and isinstance(value, torch.fx.Node) and value.name in targets:
                written.append(targets[value.name])
    return written


_OUTSIDE_CORE_ATEN = re.compile(r"Operator (?:torch\._ops\.)?(\S+?) is not in Core ATen opset")

# Model code outside Core ATen that has an exportable option to name: the end of the file's path
# and the function of the op's innermost recorded frame -> the remedy. transformers' MoE experts
# dispatch from one forward in that file; its default grouped experts count the tokens per
# expert with histc and size their matmul groups by the counts, while its batched experts run
# every expert on every token, weighted by the router (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE,
# GraniteMoE, GPT-OSS), and export.
_MODEL_OPTIONS = {
    ("transformers/integrations/moe.py", "forward"): 'load the model with experts_implementation="batched_mm"',
}


def _outside_core_aten(exported, error):
    """ExecuTorch's refusal of an op outside the Core ATen set (its verifier's message suggests
    options of its own API) as what a kiln.export caller can act on: the op, the model line it
    came from and, where _MODEL_OPTIONS knows that code, the option that avoids it; or None for
    any other error."""
    found = _OUTSIDE_CORE_ATEN.search(str(error))
    if found is None:
        return None
    op, where, remedy = found.group(1), "", "change that code or pick a model option that avoids it"
    for node in exported.graph.nodes:
        if node.op == "call_function" and str(node.target) == op:
            frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', node.meta.get("stack_trace") or "")
            if frames:
                path, line, function = frames[-1]
                where = f" (in {_cut(function, 24)}, {_cut(os.path.basename(path), 32)}:{line[:7]})"
                for (suffix, name), option in _MODEL_OPTIONS.items():
                    if function == name and path.replace(os.sep, "/").endswith(suffix):
                        remedy = option
            break
    # at most 255 bytes: the op's name and the frame are cut to fit
    return f"kiln: {_cut(op, 56)}{where} is not in ExecuTorch's Core ATen op set; {remedy}"


def _cut(text, size):
    """text cut to at most size bytes of UTF-8, on a character boundary."""
    return text.encode()[:size].decode(errors="ignore")


def _forget_pending_sizes(program):
    """Drops the data-dependent sizes a failed lowering of program created and never bound
    (a boolean mask's selection traced again), which would fail the next trace of it."""
    for node in program.graph.nodes:
        mode = getattr(node.meta.get("val"), "fake_mode", None)
        pending = getattr(getattr(mode, "shape_env", None), "pending_fresh_unbacked_symbols", None)
        if isinstance(pending, list):
            pending.clear()
            return


@contextlib.contextmanager
def _tracer_errors_unlogged():
    """Keeps the tracer's error log quiet while a lowering Kiln may retry runs: on a size it cannot
    decide it logs the failure with its whole traceback before raising it, which read as an
    export that failed when the retry then succeeds. The raised error carries the same message."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    saved = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(saved)


def lower(model, example_inputs=None, *, kwargs=None, dynamic_shapes=None, strict=None, device_id=0, fuse=True,
          allow_tf32=False, fold_limit_bytes=DEFAULT_FOLD_LIMIT_BYTES):
    """Exports (unless model is an ExportedProgram), folds constants and lowers to Kiln.

    Returns (EdgeProgramManager, DelegationReport). An ExportedProgram given has its splits and
    empties over dynamic shapes rewritten in place into views and zeros (see dynamic_dims).
    """
    if isinstance(fold_limit_bytes, bool) or not isinstance(fold_limit_bytes, int) or fold_limit_bytes < 0:
        raise ValueError(f"kiln: fold_limit_bytes={fold_limit_bytes!r} is not a byte count; pass an int >= 0")
    exported = _exported(model, example_inputs, kwargs, dynamic_shapes, strict)
    refusal = _parameter_write_refusal(exported) or unbounded_refusal(exported)
    if refusal is not None:
        raise ValueError(refusal)
    empties_as_zeros(splits_as_views(exported))
    dynamic = dynamic_input_dims(exported)
    bounds = {str(symbol): (finite(r.lower), finite(r.upper)) for symbol, r in exported.range_constraints.items()
              if finite(r.lower) is not None and finite(r.upper) is not None}
    partitioner = KilnPartitioner(device_id=device_id, allow_tf32=allow_tf32, fuse=fuse, bounds=bounds)

    def lowered(program):
        return to_edge_transform_and_lower(program, transform_passes=[FoldConstants(fold_limit_bytes)],
                                           partitioner=[partitioner])

    try:
        with _tracer_errors_unlogged():
            edge = lowered(exported)
    except Exception as error:
        message = _outside_core_aten(exported, error)
        if message is None and not isinstance(error, GuardOnDataDependentSymNode):
            raise
        # ExecuTorch verifies the op set and retraces every view before Kiln's folding runs, so
        # an op outside the set that reads only constants (position ids bucketized from a mask of
        # static shape), or a view whose size a computation on constants decides (a slice of an
        # arange whose ends are tensors, as Funnel's relative positions), is folded first, in the
        # functional form, where the buffers a program writes are known and never folded.
        _forget_pending_sizes(exported)
        functional = exported.run_decompositions({})
        fold_constants(functional, fold_limit_bytes)
        try:
            edge = lowered(functional)
        except Exception as again:
            if message is None or _outside_core_aten(functional, again) is None:
                raise
            raise ValueError(message) from error
    refusal = specialized_refusal(dynamic, edge.exported_program())
    if refusal is not None:
        raise ValueError(refusal)
    # Constants whose readers all went into blobs may be left unread; see drop_unused_constants.
    drop_unused_constants(edge.exported_program())
    return edge, delegation_report(edge, partitioner.refusals)


def to_executorch(model, example_inputs=None, *, kwargs=None, dynamic_shapes=None, strict=None, device_id=0,
                  fuse=True, allow_tf32=False, fold_limit_bytes=DEFAULT_FOLD_LIMIT_BYTES, require_whole=False):
    """Exports and lowers model; returns ExecuTorch's ExecutorchProgramManager.

    model is an nn.Module (exported with torch.export.export(model, example_inputs, kwargs=,
    dynamic_shapes=, strict=)) or an ExportedProgram. The delegation report is the returned
    manager's kiln_report; it is also a warning when compute stays on ExecuTorch, or, with
    require_whole=True, a NotWholeError naming the first op left out.
    """
    edge, report = lower(model, example_inputs, kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=strict,
                         device_id=device_id, fuse=fuse, allow_tf32=allow_tf32, fold_limit_bytes=fold_limit_bytes)
    if not report.whole:
        node, op, reason = report.first_compute
        if require_whole:
            raise NotWholeError(f"kiln: {op} (node {node}) stays on ExecuTorch: {reason}; the program is not "
                                f"whole on Kiln (require_whole=True)\n{report}")
        warnings.warn(str(report), stacklevel=3)
    program = edge.to_executorch(caller_buffer_config(edge.exported_program()))
    program.kiln_report = report
    return program


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


def export(model, example_inputs=None, path=None, *, kwargs=None, dynamic_shapes=None, strict=None, device_id=0,
           fuse=True, allow_tf32=False, fold_limit_bytes=DEFAULT_FOLD_LIMIT_BYTES, require_whole=False):
    """Exports model to the ExecuTorch program path, delegating what Kiln supports.

    model is an nn.Module in eval mode or a torch.export.ExportedProgram (then example_inputs
    is None); the other arguments are to_executorch's. The file is replaced only after export, lowering
    and serialization all succeed: a refused export leaves an existing file untouched.
    Returns the ExecutorchProgramManager (kiln.blobs lists its Kiln blobs).
    """
    if path is None:
        raise TypeError("kiln: export needs the path of the .pte file to write")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"kiln: cannot write {path}: the directory {directory} does not exist")
    program = to_executorch(model, example_inputs, kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=strict,
                            device_id=device_id, fuse=fuse, allow_tf32=allow_tf32,
                            fold_limit_bytes=fold_limit_bytes, require_whole=require_whole)
    _write_beside(path, program.buffer)
    return program
