"""Dynamic shapes on the CUDA engine: an MLP, a transformer encoder, ResNet-18 and a mix of
strided, grouped, transposed and 1-d convolutions exported with a dynamic batch dim run on the
CUDA engine at every batch within the bounds, on host tensors (staged) and CUDA tensors (bound
in place), equal to the CPU reference engine for the same blob; outputs take the call's shape.
The sizes repeat (graph slots replay) and outnumber the engine's slots (they are evicted). A
convolution runs a batch below its bound by pieces planned at load (1, 2, 4 and 8 rows under a
bound of 10), so batches 1 to 10 take every combination of them. A convolution whose image
size is dynamic is refused on the CUDA engine at load. The decoder with a dynamic sequence is
tests/gpu/test_generation_cuda.py.

Runs on a GPU machine only (scripts/gpu_test.sh); the CPU-only suite is tests/python."""

import os
import sys

import pytest
import torch
import torchvision
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

import kiln  # noqa: E402
import models  # noqa: E402
from kiln import _lib  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}
MAX_BATCH = 10
BATCHES = (1, 7, MAX_BATCH, 7, 1, 1, 2, 3, 4, 5, 6, 8, 9, 2, 3, MAX_BATCH, 1, 7)


class ConvMix(nn.Module):
    """A convolution with ReLU, a grouped one added back (a residual), a strided transposed one
    and a 1-d one over the flattened image."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(4, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.c3 = nn.Conv1d(4, 6, 3, padding=1)

    def forward(self, x):
        h = torch.relu(self.c1(x))
        h = h + self.c2(h)
        return self.c3(self.up(h).flatten(2))


CASES = {
    "mlp": (lambda: models.MLP(), (16,)),
    "encoder": (lambda: models._encoder(), (12, 32)),
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), (3, 32, 32)),
    "convs": (ConvMix, (4, 12, 12)),
}


def _run(engine, inputs, device):
    """One execute with outputs at their bound; each returned at the shape this call gave it."""
    outs = [torch.empty(shape, dtype=_lib.torch_dtype(dtype), device=device)
            for _, kind, dtype, shape in engine.bindings() if kind == _lib.IO_OUTPUT]
    engine.execute([t.contiguous() for t in inputs], outs)
    shaped = []
    for k, out in enumerate(outs):
        shape = engine.output_shape(k)
        shaped.append(out.view(-1)[: torch.Size(shape).numel()].view(shape))
    return shaped


def _error(got, want):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_dynamic_batch_on_cuda_equals_the_cpu_engine(name, dtype):
    make, row = CASES[name]
    torch.manual_seed(0)
    model = make().eval().to(dtype)
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    with torch.no_grad():
        program = kiln.to_executorch(model, (torch.randn(2, *row).to(dtype),), dynamic_shapes=({0: batch},),
                                     require_whole=True)
    (blob,) = kiln.blobs(program)
    worst = 0.0
    with _lib.Engine(blob, "cuda") as gpu, _lib.Engine(blob, "cpu") as cpu:
        for index, n in enumerate(BATCHES):
            x = torch.randn(n, *row, generator=torch.Generator().manual_seed(index)).to(dtype)
            (want,) = _run(cpu, [x], "cpu")
            assert want.shape[0] == n
            for device in ("cpu", "cuda"):  # host tensors are staged, CUDA tensors bound
                (got,) = _run(gpu, [x.to(device)], device)
                assert got.shape == want.shape, (n, device)
                error = _error(got, want)
                worst = max(worst, error)
                assert error <= TOLERANCE[dtype], f"batch {n} on {device} tensors: error {error}"
        with pytest.raises(_lib.KilnError) as refused:
            _run(gpu, [torch.randn(MAX_BATCH + 1, *row).to(dtype)], "cpu")
        assert f"dim 0 is {MAX_BATCH + 1}, above its bound {MAX_BATCH}" in refused.value.message
    print(f"{name} {dtype}: {len(BATCHES)} batches, host and device tensors, worst error {worst:.2e}")


def test_a_dynamic_image_size_is_refused_on_cuda():
    torch.manual_seed(0)
    model = nn.Conv2d(3, 4, 3).eval()
    height = torch.export.Dim("height", min=8, max=16)
    with torch.no_grad():
        program = kiln.to_executorch(model, (torch.randn(1, 3, 12, 12),), dynamic_shapes=({2: height},),
                                     require_whole=True)
    (blob,) = kiln.blobs(program)
    with _lib.Engine(blob, "cpu"):
        pass  # the CPU engine takes it
    with pytest.raises(_lib.KilnError) as refused:
        _lib.Engine(blob, "cuda")
    assert "export them static (a dynamic batch runs) or load the program with device cpu" in (
        refused.value.message)
