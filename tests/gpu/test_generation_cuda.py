"""Greedy generation on the CUDA engine: transformers' Llama with a static KV cache, exported in
fp16 and bf16 as one Kiln blob holding the cache, run on the CUDA engine through the C API
(ExecuTorch's Python runtime needs the PyTorch its bindings were built against, which a GPU
machine may not have; the CPU suite runs the same program through it). For 64 new tokens: the
engine's logits along eager's greedy sequence on the GPU (teacher-forced, so the two cannot
diverge) are within the dtype's tolerance of eager's at every step; its greedy tokens, on device
and on host tensors, equal eager's for the first 32 and differ after only at a near tie of
eager's; the CPU reference engine's tokens too. The engine's counters show that on device tensors
no byte reached host memory and on host tensors only the token ids did, never the cache, and
that each layer's key and value cache writes ran inside its decoding attention.
Exported with a dynamic sequence dim, one program prefills a whole
prompt and then decodes one token per call on the CUDA engine, the tokens equal to the CPU
engine's at prompt lengths from 1 to the cache length (repeated lengths replay graph slots, more
lengths than slots evict them), and a prompt past the cache length is refused by the front end.

Runs on a GPU machine only (scripts/gpu_test.sh); the CPU-only suite is tests/python."""

import math
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

STEPS = 64  # new tokens per generation
EQUAL_STEPS = 32  # of them, those that must equal eager's whatever the margins


def _blob(module):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = kiln.to_executorch(module, decoders.example_inputs(), strict=True, require_whole=True)
    (blob,) = kiln.blobs(program)
    return blob


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_generation_on_cuda_equals_eager(dtype):
    model = decoders.llama(dtype=dtype)
    greedy_blob, logits_blob = _blob(decoders.greedy_step(model)), _blob(decoders.logits_step(model))
    prompt, tolerance = decoders.prompt_of(7), decoders.LOGITS_TOLERANCE[dtype]
    calls = len(prompt) + STEPS - 1
    gpu_model = model.cuda()
    with torch.no_grad():
        eager_tokens, eager = decoders.greedy_logits(decoders.logits_step(gpu_model, "cuda"), prompt, STEPS, "cuda")

    # Logits, teacher-forced on eager's tokens, on device tensors.
    with _lib.Engine(logits_blob, "cuda") as engine:
        step = decoders.engine_step(engine, "cuda")
        argmax, logits = decoders.greedy_logits(step, prompt, STEPS, "cuda", tokens=eager_tokens)
    # Greedy tokens on device tensors, then on host tensors, counting what the engine copied.
    tokens, moved = {}, {}
    with _lib.Engine(greedy_blob, "cuda") as engine:
        bindings = engine.bindings()
        folded = engine.cuda_stats()["cache_writes_in_attention"]
        beside = engine.cuda_stats()["ops_beside"]
        for where in ("cuda", "cpu"):
            engine.reset_state()
            before = engine.cuda_stats()
            tokens[where] = decoders.generate(decoders.engine_step(engine, where), prompt, STEPS, where)
            after = engine.cuda_stats()
            moved[where] = {key: after[key] - before[key] for key in after}
    with _lib.Engine(greedy_blob, "cpu") as engine:
        tokens["cpu engine"] = decoders.generate(decoders.engine_step(engine, "cpu"), prompt, STEPS)

    # Everything measured is printed before the first assertion, so one run tells all.
    errors = (logits - eager).norm(dim=1) / eager.norm(dim=1)
    flips = [i for i, (a, b) in enumerate(zip(argmax, eager_tokens)) if a != b]
    print(f"{dtype}: logits against eager's, relative error max {float(errors.max()):.2e}, median "
          f"{float(errors.median()):.2e} (tolerance {tolerance:.0e}); argmax differs at {flips}")
    for where, got in tokens.items():
        first = next((i for i, (a, b) in enumerate(zip(got, eager_tokens)) if a != b), None)
        print(f"{dtype} {where}: {got[:12]}..., eager {eager_tokens[:12]}..., first difference at {first}")
    for where, counters in moved.items():
        print(f"{dtype}: counters over {calls} calls on {where} tensors: {dict((k, v) for k, v in counters.items() if v)}")
    print(f"{dtype}: cache writes done by the decoding attention: {folded}; "
          f"ops beside the chain: {beside}")

    assert len(set(eager_tokens)) > 4  # the text moves: the cache matters
    problems = decoders.logits_problems(logits, eager, tolerance, argmax)
    assert not problems, problems[:8]
    for where, got in tokens.items():
        problems = decoders.divergence_problems(got, eager_tokens, eager, EQUAL_STEPS, tolerance)
        assert not problems, f"{where}: {problems}"
    # The cache is the blob's state, not its I/O: ids, position and token, 8 bytes each.
    io_bytes = [math.prod(shape) * _lib.lib.kiln_dtype_size(dt) for _, _, dt, shape in bindings]
    out_bytes = sum(n for n, (_, kind, _, _) in zip(io_bytes, bindings) if kind == _lib.IO_OUTPUT)
    assert len(bindings) == 3 and io_bytes == [8, 8, 8], bindings
    device, host = moved["cuda"], moved["cpu"]
    # Device tensors: every buffer bound in place, nothing through engine buffers or to the host.
    assert device["host_out_bytes"] == 0 and device["staged"] == 0 and device["stage_chunks"] == 0, device
    assert device["bound"] == len(bindings) * calls, device
    # Host tensors: each call stages its three buffers and copies only the token's 8 bytes out.
    assert host["host_out_bytes"] == out_bytes * calls, host
    assert host["staged"] == len(bindings) * calls and host["bound"] == 0, host
    # Each layer's key and value cache writes run inside its decoding attention, no kernel of
    # their own.
    assert folded == 2 * model.config.num_hidden_layers, folded
    # The position's copy and the attention mask's compare run on a branch beside the chain of
    # kernels: their results are first read by the rotary group and the attention.
    assert beside == 2, beside
    # The cache stayed in the engine: never set back to its initial values during a generation.
    assert device["state_resets"] == 0 and host["state_resets"] == 0


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
            step = decoders.engine_step(engine, device)
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
