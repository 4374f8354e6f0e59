"""The real-architecture zoo (transformers' GPT-2, BERT, DistilBERT, Llama, Qwen2) on the CUDA
engine in fp16 and bf16: each model is one Kiln blob, which runs on the GPU on CUDA tensors and
matches PyTorch eager on the GPU, and whose CUDA result matches the CPU reference engine. Then
the convolutional zoo (torchvision ResNet-18/50, MobileNetV3 small/large, ConvNeXt-tiny,
transformers' ViT) at 3x224x224 in fp16 and fp32, each one blob, against eager on the GPU. Then
architectures whose ops Kiln composes at export (R(2+1)D's 3-d convolutions, Hiera, Deformable
DETR's grid_sample, Swin2SR) against float64 eager and the CPU engine.

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


def in_binding_order(blob, model, inputs):
    """The inputs in the order the blob binds them: named after forward's parameters, in the
    order the graph reads them (as given where forward's names are not the blob's)."""
    by_name = dict(zip(inspect.signature(model.forward).parameters, inputs))
    with _lib.Engine(blob, "cpu") as engine:
        names = [b[0] for b in engine.bindings() if b[1] == _lib.IO_INPUT]
    return [by_name[n] for n in names] if all(n in by_name for n in names) else list(inputs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("spec", REAL_ZOO, ids=[m.name for m in REAL_ZOO])
def test_real_model_cuda_matches_eager(spec, dtype):
    model = spec.make().to(dtype)
    # Images and waveforms take the model's dtype; token ids stay integers.
    inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in spec.inputs(1))
    program = kiln.to_executorch(model, inputs, require_whole=True)
    (blob,) = kiln.blobs(program)
    ordered = in_binding_order(blob, model, inputs)
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


# Both against eager in float64 (no TF32), with the weights as rounded to the dtype: fp32 within
# 1e-4 (fp32 eager itself drifts by about 2e-5 of the output's range at 224x224); fp16 within
# 1e-2, or, where fp16 rounding over fifty layers takes eager fp16 itself near that, no more than
# 1.25 times eager fp16's own error (ResNet-50 at 224x224).
CNN_TOLERANCE = {torch.float16: 1e-2, torch.float32: 1e-4}


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
        eager = model.cuda()(x.to(dtype))
        reference = model.to(torch.float64)(x.to(torch.float64))
    (got,) = kiln.run_blob(blobs[0], [x.to(dtype)], device="cuda")
    assert got.is_cuda and got.shape == eager.shape and got.dtype == dtype
    assert reference.float().std().item() > 1e-3, f"{spec.name}: degenerate output"
    assert (reference[0] - reference[1]).abs().max() > 1e-2 * reference.abs().max(), f"{spec.name}: images alike"
    error = relative_error(got, reference)
    eager_error = relative_error(eager, reference)
    bound = CNN_TOLERANCE[dtype] if dtype == torch.float32 else max(CNN_TOLERANCE[dtype], 1.25 * eager_error)
    print(f"{spec.name} {dtype} 224x224: vs float64 eager on cuda {error:.2e}, eager {dtype} itself "
          f"{eager_error:.2e} (bound {bound:.1e})")
    assert error <= bound


# Architectures whose ops Kiln composes at export (lowering_composed.py): 3-d convolutions and
# pools, max along a dim, grid_sample, copies into another dim order, constants folded past
# ExecuTorch's op-set check; from test_architectures. (RAFT builds its coordinate grids in f32,
# so eager RAFT itself fails in f16 and f64: it is not among them.)
COMPOSED = ["r2plus1d_18", "hiera", "deformable_detr", "swin2sr", "smolvlm_vision"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["f16", "f32"])
@pytest.mark.parametrize("name", COMPOSED)
def test_composed_ops_cuda_match_float64_eager(name, dtype, no_tf32):
    """Against eager in float64 on the GPU, as the convolutional zoo (fp16 within 1e-2 or 1.25
    times eager fp16's own error: R(2+1)D's fp16 rounding is about 1.2e-2 on the CPU engine),
    and against the CPU engine within the same bound."""
    from test_architectures import ARCHITECTURES

    make, inputs = ARCHITECTURES[name]
    model, xs = make(), [x.to(dtype) for x in inputs(1)]
    program = kiln.to_executorch(model.to(dtype), tuple(xs), require_whole=True)
    (blob,) = kiln.blobs(program)
    with torch.no_grad():
        eager = model.cuda()(*[x.cuda() for x in xs])
        reference = model.to(torch.float64)(*[x.to(torch.float64).cuda() for x in xs])
    (got,) = kiln.run_blob(blob, [x.cuda() for x in xs], device="cuda")
    (on_cpu,) = kiln.run_blob(blob, xs, device="cpu")
    assert got.is_cuda and got.shape == eager.shape and got.dtype == dtype
    assert reference.float().std().item() > 1e-3, f"{name}: degenerate output"
    error, eager_error = relative_error(got, reference), relative_error(eager, reference)
    bound = CNN_TOLERANCE[dtype] if dtype == torch.float32 else max(CNN_TOLERANCE[dtype], 1.25 * eager_error)
    vs_cpu = relative_error(got, on_cpu)
    print(f"{name} {dtype}: vs float64 eager on cuda {error:.2e}, eager {dtype} itself {eager_error:.2e}, "
          f"vs the CPU engine {vs_cpu:.2e} (bound {bound:.1e})")
    assert error <= bound and vs_cpu <= bound
