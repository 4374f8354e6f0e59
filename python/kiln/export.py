"""kiln.export: a PyTorch module to a .pte file whose supported parts run on Kiln."""

import os
import stat
import tempfile
import warnings

import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.passes.constant_prop_pass import constant_prop_pass

from .partitioner import KilnPartitioner


def to_executorch(model, example_inputs, *, device_id=0, fuse=True, allow_tf32=False):
    """Exports and lowers model; returns ExecuTorch's ExecutorchProgramManager."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if getattr(model, "training", False):
        warnings.warn("kiln: the model is in training mode; call model.eval() before exporting "
                      "so that dropout and batch statistics do not end up in the program")
    # What depends only on constants and static shapes (a mask built from arange) becomes a
    # constant, so it neither splits the program nor stays on ExecuTorch's kernels.
    exported = constant_prop_pass(torch.export.export(model, tuple(example_inputs)))
    partitioner = KilnPartitioner(device_id=device_id, allow_tf32=allow_tf32, fuse=fuse)
    edge = to_edge_transform_and_lower(exported, partitioner=[partitioner])
    return edge.to_executorch()


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
