"""The model zoo on the CUDA engine: every Kiln blob of every model against the CPU reference
engine, with host tensors (staged) and CUDA tensors (bound in place); and each model that is
one blob end to end against PyTorch eager on the GPU, at the zoo's stated tolerance.

Runs on a GPU machine only (scripts/gpu_test.sh); the CPU-only suite is tests/python."""

import inspect
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

import kiln  # noqa: E402
from kiln import _lib  # noqa: E402
from models import ZOO  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# CUDA against the CPU engine: f32 with TF32 off, f16 and bf16 at the project's tolerances.
ENGINE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def relative_error(got, want):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    peak = want.abs().max().item() if want.numel() else 0.0
    return (got - want).abs().max().item() / (peak if peak > 0 else 1.0) if want.numel() else 0.0


def pair_outputs(name, got, eager):
    """Pairs blob outputs with the model's: in order when every shape agrees (the delegate
    kept the model's order), else by shape, which must then be unique."""
    if all(g.shape == e.shape and g.dtype == e.dtype for g, e in zip(got, eager)):
        return list(zip(got, eager))
    pairs, remaining = [], list(got)
    for e in eager:
        matches = [g for g in remaining if g.shape == e.shape and g.dtype == e.dtype]
        assert len(matches) == 1, f"{name}: output {tuple(e.shape)} pairs with {len(matches)} blob outputs"
        pairs.append((matches[0], e))
        remaining = [r for r in remaining if r is not matches[0]]
    return pairs


def random_inputs(blob, seed):
    """Inputs shaped by the blob's bindings: floats in [-1, 1), integers 0 (always in range)."""
    generator = torch.Generator().manual_seed(seed)
    with _lib.Engine(blob, "cpu") as engine:
        bindings = [b for b in engine.bindings() if b[1] == _lib.IO_INPUT]
    tensors = []
    for _, _, dtype, shape in bindings:
        torch_dtype = _lib.torch_dtype(dtype)
        if torch_dtype.is_floating_point:
            tensors.append((torch.rand(shape, generator=generator) * 2 - 1).to(torch_dtype))
        else:
            tensors.append(torch.zeros(shape, dtype=torch_dtype))
    return tensors


@pytest.mark.parametrize("model", ZOO, ids=[m.name for m in ZOO])
def test_blobs_cuda_match_cpu(model):
    program = kiln.to_executorch(model.make(), model.inputs())
    blobs = kiln.blobs(program)
    assert len(blobs) == model.kiln_blobs
    for index, blob in enumerate(blobs):
        inputs = random_inputs(blob, seed=index)
        want = kiln.run_blob(blob, inputs, device="cpu")
        staged = kiln.run_blob(blob, inputs, device="cuda")
        bound = kiln.run_blob(blob, [t.cuda() for t in inputs], device="cuda")
        torch.cuda.synchronize()
        for w, s, b in zip(want, staged, bound):
            assert b.is_cuda
            tolerance = ENGINE_TOLERANCE.get(w.dtype, 0.0)
            for name, got in (("staged", s), ("bound", b)):
                error = relative_error(got, w)
                print(f"{model.name} blob {index} {name} {w.dtype}: rel err {error:.2e} (tol {tolerance:.0e})")
                assert error <= tolerance, f"{model.name} blob {index} {name}: {error:.2e} > {tolerance:.0e}"


@pytest.mark.parametrize("model", [m for m in ZOO if m.kiln_blobs == 1 and not m.cpu_ops],
                         ids=[m.name for m in ZOO if m.kiln_blobs == 1 and not m.cpu_ops])
def test_model_cuda_matches_eager_on_gpu(model):
    module = model.make()
    inputs = model.inputs()
    (blob,) = kiln.blobs(kiln.to_executorch(module, inputs))
    cuda_module = module.cuda()
    cuda_inputs = [t.cuda() for t in inputs]
    with torch.no_grad():
        eager = cuda_module(*cuda_inputs)
    eager = eager if isinstance(eager, (tuple, list)) else (eager,)
    # The blob binds its inputs by torch.export's placeholder names, in the order the delegate
    # call passes them: the forward arguments, and p_/b_ for parameters and buffers if the
    # partitioner passed them in rather than baking them into the blob.
    by_name = dict(zip(inspect.signature(module.forward).parameters, cuda_inputs))
    by_name.update({"p_" + n.replace(".", "_"): t for n, t in cuda_module.named_parameters()})
    by_name.update({"b_" + n.replace(".", "_"): t for n, t in cuda_module.named_buffers()})
    with _lib.Engine(blob, "cpu") as engine:
        names = [b[0] for b in engine.bindings() if b[1] == _lib.IO_INPUT]
    assert set(names) <= set(by_name), f"{model.name}: bindings {names}, model inputs {list(by_name)}"
    got = kiln.run_blob(blob, [by_name[n] for n in names], device="cuda")
    assert len(got) == len(eager)
    for g, e in pair_outputs(model.name, got, eager):
        error = relative_error(g, e)
        print(f"{model.name} vs eager on cuda: rel err {error:.2e} (tol {model.tolerance:.0e})")
        assert error <= model.tolerance
