"""bench/generate_bench.py without a GPU: its model building, export and generation through
ExecuTorch's Module (libkiln_bench's kb_gen_* entry points) and through Kiln's C API (libkiln.so
through ctypes, in the same process) at a tiny size on the CPU engine, and its report, so that the
GPU-only benchmark cannot rot."""

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
blobs = gb.export_program(model, 24, path)
out = {{"blobs": len(blobs)}}
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
# The same blob through the C API while Module's engine is loaded: each run from a reset state.
capi = gb.KilnCGenerator(blobs[0], "cpu")
tokens, prefill, steps = capi.generate(prompt, 12)
out.update(capi=tokens, capi_calls=[len(prefill), len(steps)], capi_positive=min(prefill + steps) > 0)
out["capi_again"] = capi.generate(prompt, 12)[0]
out["capi_spaced"] = capi.generate(prompt, 12, spaced=True)[0]
try:
    capi.generate(gb.prompt_of(20, 256), 8)  # 28 positions in 24 slots
except RuntimeError as error:
    out["capi_past_the_end"] = error.message
out["capi_after_refusal"] = capi.generate(prompt, 12)[0]
capi.close()
dynamic = gb.export_program(model, 24, {pte!r} + ".dynamic.pte", dynamic_max=24)
capi = gb.KilnCGenerator(dynamic[0], "cpu")
tokens, prefill, steps = capi.generate(prompt, 12, chunk=3)
out.update(capi_chunked=tokens, capi_chunked_calls=[len(prefill), len(steps)])
capi.close()
out["libraries"] = gb.mapped_libraries()
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
    assert out["capi"] == out["capi_again"] == out["capi_spaced"] == out["capi_after_refusal"] == out["tokens"]
    assert "position 24 " in out["capi_past_the_end"] and "nothing was written" in out["capi_past_the_end"]
    assert out["capi_calls"] == [7, 11] and out["capi_positive"]
    assert out["capi_chunked"] == out["tokens"] and out["capi_chunked_calls"] == [3, 11]
    # One libkiln.so for the C API and the bench library; the delegate beside them for Module.
    libraries = out["libraries"]
    assert len(libraries["libkiln.so"]) == 1, libraries
    assert len(libraries["libkiln_bench.so"]) == 1 and len(libraries["libexecutorch_backend_kiln.so"]) == 1, libraries


def run_of(kiln_step, compile_step, tokens, eager_tokens, capi_step=None):
    timing = {"prefill_us": 1000.0, "prefill_calls": [700.0, 100.0, 200.0], "steps_us": [kiln_step] * 3}
    run_ = {"kiln_host": dict(timing, tokens=tokens), "kiln_device": dict(timing, tokens=tokens),
            "eager": {"prefill_us": 500.0, "steps_us": [400.0] * 3, "tokens": eager_tokens},
            "compile": {"prefill_us": 900.0, "steps_us": [compile_step] * 3, "tokens": eager_tokens}}
    if capi_step is not None:  # the C API: host I/O capi_step, device I/O 5 us less
        for io, step in (("host", capi_step), ("device", capi_step - 5)):
            run_[f"capi_{io}"] = dict(timing, steps_us=[step, step + 1, step - 1], tokens=tokens,
                                      vs_module={"prefix": 3, "equal": 3, "of": 3})
    return run_


def test_report_marks_the_goals_and_counts_agreeing_tokens():
    gb = load_generate_bench()
    assert gb.agreement([1, 2, 3, 4], [1, 2, 9, 4]) == {"prefix": 2, "equal": 3, "of": 4}
    assert gb.agreement([1, 2], [1, 2]) == {"prefix": 2, "equal": 2, "of": 2}
    assert gb.num(float("nan")) == "-" and gb.num(2.345, 2) == "2.35"  # a column not measured, one that was
    args = gb.parse(["out"])
    settings = {k: v for k, v in vars(args).items() if k not in ("dtypes", "out", "workdir")}
    met = run_of(100.0, 200.0, [5, 6, 7], [5, 6, 7], 60.0)  # 0.5 of compile, 1.25 of the floor
    missed = run_of(190.0, 200.0, [5, 8, 7], [5, 6, 7])  # 0.95 of compile, 2.375 of the floor; no C API
    result = {"dtype": "float16", "floor_us": 80.0, "weight_bytes": 1 << 20, "cache_bytes": 1 << 20, "blobs": 1,
              "pte_bytes": 1 << 20, "export_s": 1.0, "compile_s": 1.0, "compile_fullgraph": True,
              "reset_us": [2000.0], "reset_repeats_tokens": True, "runs": {"128": met, "1024": missed}}
    for run_ in (met, missed):
        for key in ("kiln_host", "kiln_device", "compile"):
            run_[key]["vs_eager"] = gb.agreement(run_[key]["tokens"], run_["eager"]["tokens"])
        run_["kiln_host"]["vs_compile"] = gb.agreement(run_["kiln_host"]["tokens"], run_["compile"]["tokens"])
        run_["distinct_tokens"] = 3
    text = gb.table({"device": "GPU", "date": "2026-12-01", "copy_rate": 4e12, "settings": settings,
                     "libraries": {"libkiln.so": ["build/libkiln.so"]}, "results": [result]})
    lines = text.splitlines()
    rows = [line for line in lines if line.startswith("| float16")]
    header = next(line for line in lines if line.startswith("| dtype"))
    # The existing columns keep their places; the C API's four follow them.
    assert header.endswith("| tokens = eager | tokens = compile | distinct | Kiln C API decode host "
                           "| Kiln C API decode dev | Module - C API host | Module - C API dev |"), header
    assert header.count("|") == lines[lines.index(header) + 1].count("|") == rows[0].count("|") == rows[1].count("|")
    assert ("| 100.0 | 100.0 | 400.0 | 200.0 | 80.0 | 1.25 (met), dev 1.25 | 0.50 (met), dev 0.50 | 3 / 3 of 3 "
            in rows[0])
    assert rows[0].endswith("| 3 / 3 of 3 | 3 | 60.0 | 55.0 | 40.0 | 45.0 |"), rows[0]
    assert "| 2.38 (missed), dev 2.38 | 0.95 (missed), dev 0.95 | 1 / 2 of 3 |" in rows[1]
    assert rows[1].endswith("| 3 | - | - | - | - |"), rows[1]  # a report from before the C API columns
    assert "Kiln C API decode (us): the same blob through Kiln's C API alone" in text
    assert "libkiln.so: build/libkiln.so." in text
    assert "Kiln C API tokens equal to Module's (host / dev I/O), by prompt: 128: 3 / 3 of 3." in text
    assert "state reset by reloading forward, 2 ms" in text
    assert "the median one (ms, host I/O), by prompt: 128: 0.7 / 0.20, 1024: 0.7 / 0.20." in text


def test_the_cache_must_hold_the_longest_prompt_and_its_steps():
    gb = load_generate_bench()
    with pytest.raises(SystemExit):
        gb.parse(["out", "--prompts", "1100", "--steps", "64"])
    assert gb.parse(["out", "--quick"]).prompts == [128]
