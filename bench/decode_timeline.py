"""Kernel timeline of Kiln's decode steps on one GPU: which kernels a step launches, how long each
runs, and how much of the step is gaps between them.

The decoder is generate_bench.py's (transformers' Llama-family config with seeded random weights,
fp16, 4 layers, a static cache of 1152 slots; its width, MLP width and head counts unless the
options give others), exported once; its blob runs through Kiln's C API (libkiln.so through
ctypes) on device tensors. After a warm-up, 30 steps are timed around
kiln_engine_execute, then 10 steps at positions 200-209 run under torch.profiler, whose CUDA
activity (CUPTI) records every kernel in the process, the ones a replayed CUDA graph launches
included. For each step: its kernels, its span (first kernel start to last kernel end) and the
gaps (span minus the kernels' own time: negative where kernels launched early overlap, each
counting from its start, before the one ahead of it ends); one step's kernels in order; and the
time per kernel name; with each kernel's share of the step's span (how far its end moves the
latest end before it: timeline.py), where the step's time goes. Writes decode_trace.json (the
profiler's Chrome trace) into OUT (made if missing) and prints the rest.

usage: python3 bench/decode_timeline.py OUT [--width 4096 --ffn 14336 --heads 32 --kv-heads 8]
"""

import argparse
import ctypes
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate_bench as gb  # noqa: E402
import timeline  # noqa: E402


def main(out_dir, shape):
    os.makedirs(out_dir, exist_ok=True)
    cfg = gb.llama_config(4, 1152, **shape)
    model = gb.build_model(cfg, torch.float16)
    blobs = gb.export_program(model, 1152, os.path.join(out_dir, "decode_timeline.pte"))
    cg = gb.KilnCGenerator(blobs[0], "cuda")
    cg.generate(gb.prompt_of(16, 32000, 99), 8, "cpu")
    lib = cg._lib
    ids = torch.tensor([[5]], dtype=torch.int64)
    out = torch.zeros(1, dtype=torch.int64)
    execute, handle, error = lib.lib.kiln_engine_execute, cg.engine._handle, lib.Error()

    def view(t):
        return cg._view(t.data_ptr(), tuple(t.shape))

    def step(at):
        pos = torch.tensor([at], dtype=torch.int64)
        fed = (view(ids), view(pos))
        ins = (lib.TensorView * 2)(*[fed[k] for k in cg.order])
        outs = (lib.TensorView * 1)(view(out))
        st = execute(handle, ins, 2, outs, 1, ctypes.byref(error))
        assert st == lib.OK, error.message

    for i in range(20):
        step(141 + i)
    times = []
    for i in range(30):
        t0 = time.perf_counter()
        step(161 + i)
        times.append((time.perf_counter() - t0) * 1e6)
    print("C API step median", round(statistics.median(times), 1), flush=True)
    at = iter(range(200, 200 + timeline.CALLS))
    steps = timeline.profiled_calls(lambda: step(next(at)), os.path.join(out_dir, "decode_trace.json"))
    timeline.report(steps, "decode steps at positions 200-209")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(usage=__doc__)
    parser.add_argument("out")
    for option in ("--width", "--ffn", "--heads", "--kv-heads"):
        parser.add_argument(option, type=int)
    args = vars(parser.parse_args())
    out = args.pop("out")
    main(out, {name: value for name, value in args.items() if value is not None})
