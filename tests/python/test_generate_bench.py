"""bench/generate_bench.py without a GPU: its model building, export and generation through
ExecuTorch's Module (libkiln_bench's kb_gen_* entry points) at a tiny size on the CPU engine, and its
report, so that the GPU-only benchmark cannot rot."""

import importlib.util
import json
import os

import pytest

from test_executorch_e2e import PACKAGE_DIR, ROOT, executorch_cmake_dir, run, run_python

CHILD = """
import json, sys
sys.path.insert(0, {bench!r})
import torch
import generate_bench as gb

config = gb.llama_config(1, 24, width=64, ffn=128, heads=4, kv_heads=2, vocab=256)
model = gb.build_model(config, torch.float32)
path = {pte!r}
out = {{"blobs": gb.export_program(model, 24, path)}}
generator = gb.KilnGenerator(gb.load_library({library!r}), path)
prompt = gb.prompt_of(7, 256)
tokens, prefill, steps = generator.generate(prompt, 12)
out.update(tokens=tokens, prefill_calls=len(prefill), steps=len(steps), positive=min(prefill + steps) > 0)
out["reset_us"] = generator.reset()
# From the last prompt token alone at its position: what follows depends on the cache before it.
alone = lambda: generator.generate(prompt[-1:], 12, start=len(prompt) - 1)[0]
out["on_initial_cache"] = alone()
generator.generate(prompt[:-1], 1)
out["after_the_prompt"] = alone()
generator.reset()
out["on_reset_cache"] = alone()
generator.reset()
out["after_reset"] = generator.generate(prompt, 12)[0]
generator.reset()
out["spaced"] = generator.generate(prompt, 12, spaced=True)[0]  # the slot layout of device I/O
try:
    generator.generate(gb.prompt_of(20, 256), 8)  # 28 positions in 24 slots
except RuntimeError as error:
    out["past_the_end"] = str(error)
out["after_refusal"] = generator.generate(prompt, 12)[0]
generator.close()
step = gb.greedy_step(model, 24, "cpu")
out["eager"] = gb.torch_generate(step, prompt, 12, "cpu", whole_prompt=False)[0]
out["eager_whole"] = gb.torch_generate(step, prompt, 12, "cpu", whole_prompt=True)[0]
print(json.dumps(out))
"""


def load_generate_bench():
    spec = importlib.util.spec_from_file_location("generate_bench_script", os.path.join(ROOT, "bench", "generate_bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench_library(tmp_path_factory):
    build = str(tmp_path_factory.mktemp("bench"))
    kiln_library = os.path.join(os.path.dirname(PACKAGE_DIR), "libkiln.so")
    for command in (
        ["cmake", "-S", os.path.join(ROOT, "bench"), "-B", build, "-G", "Ninja", f"-Dexecutorch_DIR={executorch_cmake_dir()}",
         f"-Dexecutorch_backend_kiln_DIR={os.path.join(PACKAGE_DIR, 'cmake')}", f"-DKILN_LIBRARY={kiln_library}"],
        ["cmake", "--build", build, "-j2"],
    ):
        result = run(command)
        assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return os.path.join(build, "libkiln_bench.so")


def test_a_tiny_decoder_generates_eager_tokens_through_module(bench_library, tmp_path):
    # In a child: the bench library registers the delegate with its own ExecuTorch runtime.
    code = CHILD.format(bench=os.path.join(ROOT, "bench"), pte=str(tmp_path / "tiny.pte"), library=bench_library)
    result = run_python(code, device="cpu")
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["blobs"] == 1
    assert out["prefill_calls"] == 7 and out["steps"] == 11 and out["positive"]
    assert out["tokens"] == out["eager"] == out["eager_whole"]
    assert len(set(out["tokens"])) > 2  # the weights are not degenerate
    assert out["reset_us"] > 0 and out["after_reset"] == out["tokens"]
    assert out["after_the_prompt"] == out["tokens"] != out["on_initial_cache"] == out["on_reset_cache"]
    assert out["spaced"] == out["tokens"]
    assert "kb_gen_run: forward failed at position 24" in out["past_the_end"]
    assert out["after_refusal"] == out["tokens"]


def run_of(kiln_step, compile_step, tokens, eager_tokens):
    timing = {"prefill_us": 1000.0, "prefill_calls": [700.0, 100.0, 200.0], "steps_us": [kiln_step] * 3}
    return {"kiln_host": dict(timing, tokens=tokens), "kiln_device": dict(timing, tokens=tokens),
            "eager": {"prefill_us": 500.0, "steps_us": [400.0] * 3, "tokens": eager_tokens},
            "compile": {"prefill_us": 900.0, "steps_us": [compile_step] * 3, "tokens": eager_tokens}}


def test_report_marks_the_goals_and_counts_agreeing_tokens():
    gb = load_generate_bench()
    assert gb.agreement([1, 2, 3, 4], [1, 2, 9, 4]) == {"prefix": 2, "equal": 3, "of": 4}
    assert gb.agreement([1, 2], [1, 2]) == {"prefix": 2, "equal": 2, "of": 2}
    assert gb.num(float("nan")) == "-" and gb.num(2.345, 2) == "2.35"  # a column not measured, one that was
    args = gb.parse(["out"])
    settings = {k: v for k, v in vars(args).items() if k not in ("dtypes", "out", "workdir")}
    met = run_of(100.0, 200.0, [5, 6, 7], [5, 6, 7])  # 0.5 of compile, 1.25 of the floor
    missed = run_of(190.0, 200.0, [5, 8, 7], [5, 6, 7])  # 0.95 of compile, 2.375 of the floor
    result = {"dtype": "float16", "floor_us": 80.0, "weight_bytes": 1 << 20, "cache_bytes": 1 << 20, "blobs": 1,
              "pte_bytes": 1 << 20, "export_s": 1.0, "compile_s": 1.0, "compile_fullgraph": True,
              "reset_us": [2000.0], "reset_repeats_tokens": True, "runs": {"128": met, "1024": missed}}
    for run_ in (met, missed):
        for key in ("kiln_host", "kiln_device", "compile"):
            run_[key]["vs_eager"] = gb.agreement(run_[key]["tokens"], run_["eager"]["tokens"])
        run_["kiln_host"]["vs_compile"] = gb.agreement(run_["kiln_host"]["tokens"], run_["compile"]["tokens"])
        run_["distinct_tokens"] = 3
    text = gb.table({"device": "GPU", "date": "2026-12-01", "copy_rate": 4e12, "settings": settings,
                     "results": [result]})
    rows = [line for line in text.splitlines() if line.startswith("| float16")]
    assert "| 1.25 (met), dev 1.25 | 0.50 (met), dev 0.50 | 3 / 3 of 3 |" in rows[0]
    assert "| 2.38 (missed), dev 2.38 | 0.95 (missed), dev 0.95 | 1 / 2 of 3 |" in rows[1]
    assert "state reset by reloading forward, 2 ms" in text
    assert "the median one (ms, host I/O), by prompt: 128: 0.7 / 0.20, 1024: 0.7 / 0.20." in text


def test_the_cache_must_hold_the_longest_prompt_and_its_steps():
    gb = load_generate_bench()
    with pytest.raises(SystemExit):
        gb.parse(["out", "--prompts", "1100", "--steps", "64"])
    assert gb.parse(["out", "--quick"]).prompts == [128]
