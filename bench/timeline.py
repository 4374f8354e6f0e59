"""Kernel timelines of one bench case on one GPU: Kiln's kernels beside torch.compile's.

For a case of bench.py (name, batch, dtype), the model is exported once and its blob runs through
Kiln's engine on CUDA tensors (bound in place, graph replay), and the same model runs under
torch.compile(mode="reduce-overhead") on the same inputs. After warm-up, 10 calls of each run
under torch.profiler, whose CUDA activity (CUPTI) records every kernel, the ones replayed CUDA
graphs launch included. For each: every call's span (first kernel start to last kernel end) and
gaps (span minus the kernels' own time; negative where kernels launched early overlap), one
call's kernels in order, and the time per kernel name. Each kernel's share of the span is what its
end adds to the latest end before it (a kernel launched early that ends inside the one ahead of it
adds nothing), so the shares of a call sum to its span and say where its time goes when kernels
overlap. So a case that misses its goal shows which of its kernels take longer than the
baseline's.

usage: python3 bench/timeline.py NAME BATCH DTYPE OUT   (e.g. gpt2 1 float16 /tmp/out)
"""

import collections
import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CALL_GAP_US = 500  # kernels further apart than this belong to different calls
CALLS = 10


def profiled_calls(call, trace_path):
    """Kernels of CALLS calls of call() under the profiler, one list per call, by start time."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(CALLS):
            call()
            torch.cuda.synchronize()
            time.sleep(0.002)
    prof.export_chrome_trace(trace_path)
    return split_calls([e for e in json.load(open(trace_path))["traceEvents"] if e.get("cat") == "kernel"])


def split_calls(kernels):
    """Kernel events (ts, dur in us) grouped into calls: a kernel that starts more than CALL_GAP_US
    after every kernel before it has ended begins a new call."""
    calls, cur, end = [], [], None
    for e in sorted(kernels, key=lambda e: e["ts"]):
        if cur and e["ts"] - end > CALL_GAP_US:
            calls.append(cur)
            cur = []
        end = e["ts"] + e["dur"] if not cur else max(end, e["ts"] + e["dur"])
        cur.append(e)
    if cur:
        calls.append(cur)
    return calls


def span_and_gaps(call):
    """A call's span (first kernel start to last kernel end) and gaps (span minus the kernels'
    own time: negative where kernels overlap)."""
    span = max(e["ts"] + e["dur"] for e in call) - call[0]["ts"]
    return span, span - sum(e["dur"] for e in call)


def span_shares(call):
    """Each kernel's share of its call's span, in the call's order: how far its end moves the
    latest end of the kernels before it (the first: its duration). They sum to the span."""
    shares, latest = [], call[0]["ts"]
    for e in call:
        end = e["ts"] + e["dur"]
        shares.append(max(0.0, end - latest))
        latest = max(latest, end)
    return shares


def report(calls, title, in_order=True):
    """Prints each call's span and gaps, one call's kernels in order with their shares of the
    span, and time and span share per kernel name."""
    print(f"## {title}")
    for s in calls:
        span, gaps = span_and_gaps(s)
        print(f"call: {len(s)} kernels, span {span:.1f} us, kernel time {span - gaps:.1f} us, "
              f"gaps {gaps:.1f} us")
    if not calls:
        return
    if in_order:
        s = calls[len(calls) // 2]
        print("one call, in order: start offset, duration, gap before, share of the span, name")
        prev_end = s[0]["ts"]
        for e, share in zip(s, span_shares(s)):
            start, gap = e["ts"] - s[0]["ts"], e["ts"] - prev_end
            print(f"{start:8.1f} {e['dur']:7.1f} {gap:6.1f} {share:6.1f}  {e['name'][:104]}")
            prev_end = e["ts"] + e["dur"]
    by_name = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for s in calls:
        for e, share in zip(s, span_shares(s)):
            k = e["name"][:80]
            by_name[k][0] += 1
            by_name[k][1] += e["dur"]
            by_name[k][2] += share
    print("per kernel name, per call: count, total us, share of the span us")
    for k, (n, t, sh) in sorted(by_name.items(), key=lambda kv: -kv[1][2]):
        print(f"{n / len(calls):6.1f} {t / len(calls):8.1f} {sh / len(calls):8.1f}  {k}")
    print(flush=True)


def main(name, batch, dtype_name, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    import bench
    import kiln
    from kiln import _lib

    dtype = getattr(torch, dtype_name)
    factory, make_inputs = bench.CASES[name]
    torch.manual_seed(0)
    model = factory().eval().to(dtype)
    xs_cpu = tuple(t.contiguous() for t in make_inputs(batch, dtype))
    path = os.path.join(out_dir, f"timeline_{name}_b{batch}_{dtype_name}.pte")
    blobs = kiln.blobs(kiln.export(model, xs_cpu, path))
    os.unlink(path)
    if len(blobs) != 1:
        sys.exit(f"{name}: {len(blobs)} blobs; the timeline needs a program of one blob")
    xs = [t.cuda() for t in bench.blob_order(blobs[0], model, xs_cpu)]
    engine = _lib.Engine(blobs[0], "cuda")
    ys = [torch.empty(shape, dtype=_lib.torch_dtype(dt), device="cuda")
          for _, kind, dt, shape in engine.bindings() if kind == _lib.IO_OUTPUT]
    for _ in range(20):
        engine.execute(xs, ys)
    stats = engine.cuda_stats()
    print(f"fused groups: {stats['fused_compiled']} compiled at load, "
          f"{stats['fused_interpreted']} interpreted")
    tag = f"{name}_b{batch}_{dtype_name}"
    report(profiled_calls(lambda: engine.execute(xs, ys), os.path.join(out_dir, f"kiln_{tag}.json")),
           f"Kiln, {name} batch {batch} {dtype_name}")
    engine.close()

    cuda_model = model.cuda()
    xs = [t.cuda() for t in xs_cpu]
    if name in bench.CHANNELS_LAST:
        cuda_model = cuda_model.to(memory_format=torch.channels_last)
        xs = [t.contiguous(memory_format=torch.channels_last) for t in xs]
    with torch.no_grad():
        compiled = torch.compile(cuda_model, mode="reduce-overhead")
        for _ in range(5):
            compiled(*xs)
        report(profiled_calls(lambda: compiled(*xs), os.path.join(out_dir, f"compile_{tag}.json")),
               f"torch.compile, {name} batch {batch} {dtype_name}")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
