"""The real-architecture zoo (transformers' GPT-2, BERT, DistilBERT, Llama, Qwen2) on the CUDA
engine in fp16 and bf16: each model is one Kiln blob, which runs on the GPU on CUDA tensors and
matches PyTorch eager on the GPU, and whose CUDA result matches the CPU reference engine. Then
the convolutional zoo (torchvision ResNet-18/50, MobileNetV3 small/large, ConvNeXt-tiny,
transformers' ViT) at 3x224x224 in fp16 and fp32, each one blob, against eager on the GPU.

Runs on a GPU machine only (scripts/gpu_test.sh); the CPU-only suite is tests/python."""

import inspect
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

import kiln  # noqa: E402
from kiln import _lib  # noqa: E402
from models import CNN_ZOO_224  # noqa: E402
from zoo_models import REAL_ZOO  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Against eager on the GPU, and CUDA against the CPU engine, at the project's tolerances.
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 2e-2}


def relative_error(got, want):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    peak = want.abs().max().item()
    return (got - want).abs().max().item() / (peak if peak > 0 else 1.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("spec", REAL_ZOO, ids=[m.name for m in REAL_ZOO])
def test_real_model_cuda_matches_eager(spec, dtype):
    model = spec.make().to(dtype)
    inputs = spec.inputs(1)
    program = kiln.to_executorch(model, inputs, require_whole=True)
    (blob,) = kiln.blobs(program)
    # The blob's inputs are named after forward's parameters, in the order the graph reads them.
    by_name = dict(zip(inspect.signature(model.forward).parameters, inputs))
    with _lib.Engine(blob, "cpu") as engine:
        ordered = [by_name[b[0]] for b in engine.bindings() if b[1] == _lib.IO_INPUT]
    cuda_inputs = [t.cuda() for t in inputs]
    with torch.no_grad():
        eager = model.cuda()(*cuda_inputs)
    (got,) = kiln.run_blob(blob, [t.cuda() for t in ordered], device="cuda")
    assert got.is_cuda and got.shape == eager.shape and got.dtype == eager.dtype
    (reference,) = kiln.run_blob(blob, ordered, device="cpu")
    assert eager.float().std().item() > 1e-3, f"{spec.name}: degenerate output"
    vs_eager, vs_cpu = relative_error(got, eager), relative_error(got, reference)
    print(f"{spec.name} {dtype}: vs eager on cuda {vs_eager:.2e}, vs the CPU engine {vs_cpu:.2e} "
          f"(tol {TOLERANCE[dtype]:.0e})")
    assert vs_eager <= TOLERANCE[dtype]
    assert vs_cpu <= TOLERANCE[dtype]


# fp16 against fp16 eager; fp32 (no TF32 on either side) against eager in float64, since over
# fifty layers fp32 eager itself drifts by about 2e-5 of the output's range at 224x224.
CNN_TOLERANCE = {torch.float16: 1e-2, torch.float32: 1e-4}


@pytest.fixture
def no_tf32():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["f16", "f32"])
@pytest.mark.parametrize("spec", CNN_ZOO_224, ids=[m.name for m in CNN_ZOO_224])
def test_cnn_cuda_matches_eager(spec, dtype, no_tf32):
    model = spec.make()
    (images,) = spec.inputs()
    program = kiln.to_executorch(model.to(dtype), (images.to(dtype),), require_whole=True)
    blobs = kiln.blobs(program)
    assert len(blobs) == 1, f"{spec.name}: {len(blobs)} Kiln blobs"
    x = images.cuda()
    with torch.no_grad():
        reference = model.cuda().to(torch.float64 if dtype == torch.float32 else dtype)
        eager = reference(x.to(torch.float64 if dtype == torch.float32 else dtype))
    (got,) = kiln.run_blob(blobs[0], [x.to(dtype)], device="cuda")
    assert got.is_cuda and got.shape == eager.shape and got.dtype == dtype
    assert eager.float().std().item() > 1e-3, f"{spec.name}: degenerate output"
    assert (eager[0] - eager[1]).abs().max() > 1e-2 * eager.abs().max(), f"{spec.name}: images alike"
    error = relative_error(got, eager)
    print(f"{spec.name} {dtype} 224x224: vs eager on cuda{' (float64)' if dtype == torch.float32 else ''} "
          f"{error:.2e} (tol {CNN_TOLERANCE[dtype]:.0e})")
    assert error <= CNN_TOLERANCE[dtype]
