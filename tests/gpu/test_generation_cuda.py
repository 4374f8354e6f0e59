"""Greedy generation on the CUDA engine: transformers' Llama with a static KV cache, exported in
fp16 and bf16 as one Kiln blob holding the cache, run on the CUDA engine through the C API on
device tensors (ExecuTorch's Python runtime needs the PyTorch its bindings were built against,
which a GPU machine may not have; the CPU suite runs the same program through it); the first 32
tokens equal eager generation on the GPU, and the CUDA engine's tokens equal the CPU reference
engine's for the same blob. Exported with a dynamic sequence dim, one program prefills a whole
prompt and then decodes one token per call on the CUDA engine, the tokens equal to the CPU
engine's at prompt lengths from 1 to the cache length (repeated lengths replay graph slots, more
lengths than slots evict them), and a prompt past the cache length is refused by the front end.

Runs on a GPU machine only (scripts/gpu_test.sh); the CPU-only suite is tests/python."""

import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

import decoders  # noqa: E402
import kiln  # noqa: E402
from kiln import _lib  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

STEPS = 32


def _stepper(engine, device):
    """step(input_ids, cache_position) -> token ids on one engine, whose state (the cache) persists
    across calls; inputs are matched to the blob's bindings by name."""
    inputs = [name for name, kind, _, _ in engine.bindings() if kind == _lib.IO_INPUT]
    (out_dtype, out_shape), = [(dt, shape) for _, kind, dt, shape in engine.bindings() if kind == _lib.IO_OUTPUT]

    def step(ids, pos):
        feeds = {"input_ids": ids.to(device), "cache_position": pos.to(device)}
        ordered = [next(t for key, t in feeds.items() if key in name) for name in inputs]
        out = torch.empty(out_shape, dtype=_lib.torch_dtype(out_dtype), device=device)
        engine.execute(ordered, [out])
        return out

    return step


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_generation_on_cuda_equals_eager(dtype):
    model = decoders.llama(dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = kiln.to_executorch(decoders.greedy_step(model), decoders.example_inputs(), strict=True,
                                     require_whole=True)
    (blob,) = kiln.blobs(program)
    prompt = decoders.prompt_of(7)
    gpu_model = model.cuda()
    with torch.no_grad():
        eager = decoders.generate(decoders.greedy_step(gpu_model, "cuda"), prompt, STEPS, "cuda")
    tokens = {}
    for device in ("cuda", "cpu"):
        with _lib.Engine(blob, device) as engine:
            tokens[device] = decoders.generate(_stepper(engine, device), prompt, STEPS, device)
    first_diff = next((i for i, (a, b) in enumerate(zip(tokens["cuda"], eager)) if a != b), None)
    print(f"{dtype}: cuda {tokens['cuda'][:12]}..., eager {eager[:12]}..., first difference at {first_diff}")
    assert tokens["cuda"] == tokens["cpu"]
    assert tokens["cuda"] == eager


# Prompt lengths for the dynamic program: 7 and 1 repeat (their second run captures a graph,
# later ones replay it); ten lengths in all, more than the engine's graph slots; the cache length
# is the bound.
PROMPTS = (7, 1, 7, 7, 2, 3, 4, 5, 6, 9, 1, 11, decoders.CACHE - 8, 7, 1)


def _dynamic_blob(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = kiln.to_executorch(decoders.greedy_step(model), decoders.prefill_inputs(),
                                     dynamic_shapes=decoders.DYNAMIC_SHAPES, strict=True, require_whole=True)
    (blob,) = kiln.blobs(program)
    return blob


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
def test_dynamic_prefill_then_decode_on_cuda_equals_the_cpu_engine(dtype):
    model = decoders.llama(dtype=dtype)
    blob = _dynamic_blob(model)
    tokens = {}
    for device in ("cuda", "cpu"):
        runs = []
        with _lib.Engine(blob, device) as engine:
            step = _stepper(engine, device)
            for length in PROMPTS:
                engine.reset_state()
                runs.append(decoders.prefill_generate(step, decoders.prompt_of(length), 8, device))
            engine.reset_state()
            runs.append(decoders.prefill_generate(step, decoders.prompt_of(decoders.CACHE), 1, device))
            with pytest.raises(_lib.KilnError) as refused:
                step(torch.zeros(1, decoders.CACHE + 1, dtype=torch.long),
                     torch.arange(decoders.CACHE + 1))
            message = refused.value.message
            assert f"is {decoders.CACHE + 1}, above its bound {decoders.CACHE}" in message, message
            assert "pass at most that or re-export with a larger max" in message, message
            engine.reset_state()
            assert decoders.prefill_generate(step, decoders.prompt_of(7), 8, device) == runs[0]
        tokens[device] = runs
    print(f"{dtype}: prefill 7 then 8 steps: cuda {tokens['cuda'][0]}, cpu {tokens['cpu'][0]}")
    for length, got, want in zip(PROMPTS + (decoders.CACHE,), tokens["cuda"], tokens["cpu"]):
        assert got == want, f"prompt of {length}: cuda {got}, cpu {want}"
    with torch.no_grad():  # eager's token-by-token generation, for the record
        eager = decoders.generate(decoders.greedy_step(model.cuda(), "cuda"), decoders.prompt_of(7), 8, "cuda")
    print(f"{dtype}: eager on the GPU, token by token: {eager}")
