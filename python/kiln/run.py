"""kiln.run_blob: runs one Kiln blob on torch tensors through libkiln, without ExecuTorch."""

import torch

from . import _lib


def run_blob(blob, inputs, device="cpu"):
    """Loads blob on device ("cpu", "cuda" or "auto"), runs it on inputs, returns the outputs.

    Inputs are passed in binding order (those the delegate call receives); each is made
    contiguous first. Outputs are new tensors, shaped and typed by the blob's metadata, on
    the device of the first input; a dynamic output has the shape this call gave it.
    """
    inputs = list(inputs)
    for index, tensor in enumerate(inputs):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"kiln: input {index} is a {type(tensor).__name__}, not a torch.Tensor")
        if device == "cpu" and tensor.device.type != "cpu":
            raise ValueError(
                f"kiln: input {index} is on {tensor.device}, which the CPU engine cannot read; "
                "move it to the CPU or run on device='cuda'"
            )
    inputs = [tensor.contiguous() for tensor in inputs]
    out_device = inputs[0].device if inputs else torch.device("cpu")
    with _lib.Engine(blob, device) as engine:
        outputs = [
            torch.empty(shape, dtype=_lib.torch_dtype(dtype), device=out_device)
            for _, kind, dtype, shape in engine.bindings()
            if kind == _lib.IO_OUTPUT
        ]
        engine.execute(inputs, outputs)
        # A dynamic output was allocated at its bound and written contiguously in this call's shape.
        outputs = [out.view(-1)[: _numel(engine.output_shape(k))].view(engine.output_shape(k))
                   for k, out in enumerate(outputs)]
    return outputs


def _numel(shape):
    count = 1
    for size in shape:
        count *= size
    return count
