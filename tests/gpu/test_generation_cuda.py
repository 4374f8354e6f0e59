"""Greedy generation on the CUDA engine: transformers' Llama with a static KV cache, exported in
fp16 and bf16 as one Kiln blob holding the cache, run through ExecuTorch's runtime on the GPU;
the first 32 tokens equal eager generation on the GPU, and the CUDA engine's tokens equal the
CPU reference engine's for the same program.

Runs on a GPU machine only (scripts/gpu_test.sh); the CPU-only suite is tests/python."""

import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

import decoders  # noqa: E402
import kiln  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

STEPS = 32


def _method(path, device, monkeypatch):
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    monkeypatch.setenv("KILN_DEVICE", device)
    program = Runtime.get().load_program(path)
    method = program.load_method("forward")
    return program, method


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_generation_on_cuda_equals_eager(dtype, tmp_path, monkeypatch):
    model = decoders.llama(dtype=dtype)
    path = str(tmp_path / "llama.pte")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kiln.export(decoders.greedy_step(model), decoders.example_inputs(), path, strict=True,
                    require_whole=True)
    prompt = decoders.prompt_of(7)
    gpu_model = model.cuda()
    with torch.no_grad():
        eager = decoders.generate(decoders.greedy_step(gpu_model, "cuda"), prompt, STEPS, "cuda")
    tokens = {}
    for device in ("cuda", "cpu"):
        program, method = _method(path, device, monkeypatch)
        tokens[device] = decoders.generate(lambda ids, pos: method.execute([ids, pos])[0], prompt, STEPS)
        del method, program
    first_diff = next((i for i, (a, b) in enumerate(zip(tokens["cuda"], eager)) if a != b), None)
    print(f"{dtype}: cuda {tokens['cuda'][:12]}..., eager {eager[:12]}..., first difference at {first_diff}")
    assert tokens["cuda"] == tokens["cpu"]
    assert tokens["cuda"] == eager
