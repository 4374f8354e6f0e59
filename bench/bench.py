"""Kiln against PyTorch eager and torch.compile on one GPU, in one process.

For an MLP (four 4096-wide layers with GELU), a transformer encoder block (d_model 1024,
16 heads, sequence 128) and a GPT-style block (d_model 2048, causal, sequence 512), at batch
1 and 32, in fp16 and fp32, and a Llama-family block (d_model 4096, 32 query and 8 key/value
heads, sequence 1 and 128) in fp16 and bf16, and whole GPT-2 (124M, with its LM head) and BERT-base at
sequence 128, batch 1 and 8, in fp16, and torchvision ResNet-50 and MobileNetV3-large at 224x224,
batch 1 and 32, in fp16 (eager and torch.compile in channels_last): the median latency and spread of synchronized calls of PyTorch
eager, torch.compile(mode="reduce-overhead"), Kiln through ExecuTorch's Module API on host and on
device tensors and Kiln through its C API alone; the achieved fraction of memory bandwidth (bytes
that must move, over time, against a device-to-device copy rate measured in this run) and of the
link (the I/O bytes at the pinned host-device copy rates measured in this run, over the time host
tensors add). Writes a markdown
table, the raw numbers as JSON and a plot into the output folder.

Kiln through ExecuTorch on device tensors and Kiln's C API on the same tensors are timed side
by side, call for call (kb_time_pair), so that clock and temperature drift between two runs does
not show as adapter overhead. Host staging's threads and chunk size are the engine's defaults
unless --stage-threads / --stage-chunk-kib set them (KILN_STAGE_THREADS, KILN_STAGE_CHUNK_KIB);
--stage-sweep first times a 64 MiB host round trip for each pair of settings.

usage: python3 bench/bench.py OUT_DIR [--iters N] [--only NAME,...] [--stage-sweep]
       [--stage-threads N] [--stage-chunk-kib K]
"""

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
if os.path.isfile(os.path.join(ROOT, "build-gpu", "libkiln.so")):  # else the package's own copy
    os.environ.setdefault("KILN_LIBRARY", os.path.join(ROOT, "build-gpu", "libkiln.so"))

import kiln  # noqa: E402

ET_DTYPE = {torch.float32: 6, torch.float16: 5, torch.bfloat16: 15, torch.int64: 4, torch.int32: 3, torch.bool: 11}


class MLP(nn.Module):
    def __init__(self, width=4096, depth=4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = F.gelu(layer(x))
        return x


class Attention(nn.Module):
    def __init__(self, width, heads, causal):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        batch, time_, width = x.shape
        qkv = self.qkv(x).reshape(batch, time_, 3, self.heads, width // self.heads)
        qkv = qkv.permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(a.transpose(1, 2).reshape(batch, time_, width))


class EncoderBlock(nn.Module):
    """Post-norm, as nn.TransformerEncoderLayer: d_model 1024, 16 heads, GELU feed-forward."""

    def __init__(self, width=1024, heads=16):
        super().__init__()
        self.attn = Attention(width, heads, causal=False)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.ff1, self.ff2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.ff2(F.gelu(self.ff1(x))))


class GPTBlock(nn.Module):
    """Pre-norm, causal: d_model 2048, 16 heads, GELU feed-forward."""

    def __init__(self, width=2048, heads=16):
        super().__init__()
        self.attn = Attention(width, heads, causal=True)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.ff1, self.ff2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ff2(F.gelu(self.ff1(self.norm2(x))))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def repeat_kv(x, times):
    batch, heads, time_, head = x.shape
    x = x[:, :, None, :, :].expand(batch, heads, times, time_, head)
    return x.reshape(batch, heads * times, time_, head)


class LlamaBlock(nn.Module):
    """A Llama-family decoder block as transformers writes it: RMSNorm computed in fp32 and cast
    back, rotary embedding by rotate_half (positions 0..seq-1), grouped-query attention by
    expand + reshape of k and v, causal, SwiGLU MLP; d_model 4096, 32 query and 8 key/value
    heads, MLP 14336, no biases."""

    def __init__(self, seq, width=4096, heads=32, kv_heads=8, hidden=14336):
        super().__init__()
        self.heads, self.kv_heads, self.head = heads, kv_heads, width // heads
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, kv_heads * self.head, bias=False)
        self.v = nn.Linear(width, kv_heads * self.head, bias=False)
        self.o = nn.Linear(width, width, bias=False)
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)
        self.norm1, self.norm2 = nn.Parameter(torch.ones(width)), nn.Parameter(torch.ones(width))
        inv_freq = 1.0 / (500000 ** (torch.arange(0, self.head, 2).float() / self.head))
        angles = torch.outer(torch.arange(seq).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)[None, None]
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())

    @staticmethod
    def rms(x, weight):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        return weight * h.to(x.dtype)

    def forward(self, x):
        batch, time_, _ = x.shape
        h = self.rms(x, self.norm1)
        q = self.q(h).view(batch, time_, -1, self.head).transpose(1, 2)
        k = self.k(h).view(batch, time_, -1, self.head).transpose(1, 2)
        v = self.v(h).view(batch, time_, -1, self.head).transpose(1, 2)
        q = q * self.cos + rotate_half(q) * self.sin
        k = k * self.cos + rotate_half(k) * self.sin
        times = self.heads // self.kv_heads
        a = F.scaled_dot_product_attention(q, repeat_kv(k, times), repeat_kv(v, times), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(batch, time_, -1))
        h = self.rms(x, self.norm2)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class GPT2(nn.Module):
    """Whole GPT-2 (the 124M configuration) with its LM head, random weights: ids to logits."""

    def __init__(self):
        super().__init__()
        import transformers

        self.model = transformers.GPT2LMHeadModel(transformers.GPT2Config())

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


class Bert(nn.Module):
    """Whole BERT-base, random weights: ids and attention mask to the last hidden state."""

    def __init__(self):
        super().__init__()
        import transformers

        self.model = transformers.BertModel(transformers.BertConfig(), add_pooling_layer=False)

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def torchvision_model(name):
    """A torchvision model with random weights whose batch-norm statistics are those of random
    224x224 images, so that its outputs are not degenerate."""

    def make():
        import torchvision

        model = getattr(torchvision.models, name)(weights=None)
        for norm in model.modules():
            if isinstance(norm, nn.modules.batchnorm._BatchNorm):
                norm.momentum = None
                norm.reset_running_stats()
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model.to(device).train()
        with torch.no_grad():
            model(torch.randn(8, 3, 224, 224, generator=torch.Generator().manual_seed(1)).to(device))
        return model.cpu().eval()

    return make


def activations(shape):
    """One input of shape(batch), uniform in [-1, 1) in the case's dtype."""
    return lambda batch, dtype: ((torch.rand(shape(batch)) * 2 - 1).to(dtype),)


def tokens(vocab, seq, mask):
    """Token ids (and an all-ones attention mask) for a batch of seq tokens."""
    def make(batch, dtype):
        ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
        return (ids, torch.ones(batch, seq, dtype=torch.long)) if mask else (ids,)
    return make


CASES = {
    "mlp": (MLP, activations(lambda b: (b, 4096))),
    "encoder": (EncoderBlock, activations(lambda b: (b, 128, 1024))),
    "gpt_block": (GPTBlock, activations(lambda b: (b, 512, 2048))),
    "llama_s1": (lambda: LlamaBlock(seq=1), activations(lambda b: (b, 1, 4096))),
    "llama_s128": (lambda: LlamaBlock(seq=128), activations(lambda b: (b, 128, 4096))),
    "gpt2": (GPT2, tokens(50257, 128, mask=False)),
    "bert": (Bert, tokens(30522, 128, mask=True)),
    "resnet50": (torchvision_model("resnet50"), activations(lambda b: (b, 3, 224, 224))),
    "mobilenet_v3_large": (torchvision_model("mobilenet_v3_large"), activations(lambda b: (b, 3, 224, 224))),
}
# The dtypes and batches each case runs in, where not fp16 and fp32 at batch 1 and 32.
CASE_DTYPES = {"llama_s1": (torch.float16, torch.bfloat16), "llama_s128": (torch.float16, torch.bfloat16),
               "gpt2": (torch.float16,), "bert": (torch.float16,),
               "resnet50": (torch.float16,), "mobilenet_v3_large": (torch.float16,)}
CASE_BATCHES = {"gpt2": (1, 8), "bert": (1, 8), "resnet50": (1, 32), "mobilenet_v3_large": (1, 32)}
# The cases whose eager and torch.compile baselines run in channels_last (model and inputs), the
# layout cuDNN's tensor-core kernels want, as a user tuning a CNN would run them.
CHANNELS_LAST = {"resnet50", "mobilenet_v3_large"}

# Goals (not assertions): Kiln over the faster of eager and compile.
def goal(batch, dtype):
    if batch == 1:
        return 0.5 if dtype == torch.float16 else 0.8
    return 1.0


def spread(times):
    times = sorted(times)
    return times[len(times) // 2], times[int(len(times) * 0.1)], times[int(len(times) * 0.9) - 1]


def time_torch(fn, xs, iters):
    for _ in range(5):
        fn(*xs)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn(*xs)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def copy_rate():
    """Bytes read plus written per second by a 2 GiB device-to-device copy (median of 20)."""
    a = torch.empty(1 << 31, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rates = []
    for i in range(23):
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        if i >= 3:
            rates.append(2 * a.numel() / (start.elapsed_time(end) * 1e-3))
    del a, b
    torch.cuda.empty_cache()
    return statistics.median(rates)


def pinned_rates(nbytes=1 << 28):
    """Host-to-device and device-to-host bytes per second of a 256 MiB copy between pinned host
    memory and the GPU (median of 20 each): the link's rate that host staging can reach."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rates = {}
    for key, dst, src in (("h2d", dev, host), ("d2h", host, dev)):
        samples = []
        for i in range(23):
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            if i >= 3:
                samples.append(nbytes / (start.elapsed_time(end) * 1e-3))
        rates[key] = statistics.median(samples)
    del host, dev
    torch.cuda.empty_cache()
    return rates


def host_copy_rates(lib, nbytes=1 << 26):
    """Bytes per second of copying 64 MiB of pageable memory into pinned memory with 1, 2, 4 and
    8 CPU threads: the host side of staging, which Kiln does on one thread."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    rates = {threads: lib.kb_host_copy_rate(ctypes.c_void_p(dst.data_ptr()), ctypes.c_void_p(src.data_ptr()),
                                            ctypes.c_size_t(nbytes), threads, 10) for threads in (1, 2, 4, 8)}
    del src, dst
    return rates


def _pointers(tensors):
    return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])


def blob_order(blob, model, tensors):
    """tensors (in forward's order) in the order of the blob's input bindings, which are named
    after forward's parameters but ordered as the delegated graph first reads them."""
    import inspect

    from kiln import _lib

    by_name = dict(zip(inspect.signature(model.forward).parameters, tensors))
    with _lib.Engine(blob, "cpu") as engine:
        names = [b[0] for b in engine.bindings() if b[1] == _lib.IO_INPUT]
    return [by_name[n] for n in names]


def run_case(lib, name, batch, dtype, iters, workdir):
    factory, make_inputs = CASES[name]
    torch.manual_seed(0)
    model = factory().eval().to(dtype)
    xs_cpu = tuple(t.contiguous() for t in make_inputs(batch, dtype))
    row = {"model": name, "batch": batch, "dtype": str(dtype).replace("torch.", "")}
    row["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())

    # Kiln: export on this machine (the large programs cannot travel), then time.
    path = os.path.join(workdir, f"{name}_b{batch}_{row['dtype']}.pte")
    t0 = time.perf_counter()
    program = kiln.export(model, xs_cpu, path)
    row["export_s"] = time.perf_counter() - t0
    blobs = kiln.blobs(program)
    row["blobs"] = len(blobs)
    output_node = next(n for n in program.exported_program().graph.nodes if n.op == "output")
    outs = [a.meta["val"] for a in output_node.args[0]]
    ys_cpu = [torch.empty(tuple(v.shape), dtype=v.dtype) for v in outs]
    row["in_bytes"] = sum(t.numel() * t.element_size() for t in xs_cpu)
    row["out_bytes"] = sum(t.numel() * t.element_size() for t in ys_cpu)
    row["bytes"] = row["param_bytes"] + row["in_bytes"] + row["out_bytes"]
    sizes = (ctypes.c_int64 * sum(t.dim() for t in xs_cpu))(*[d for t in xs_cpu for d in t.shape])
    ranks = (ctypes.c_int * len(xs_cpu))(*[t.dim() for t in xs_cpu])
    dtypes = (ctypes.c_int * len(xs_cpu))(*[ET_DTYPE[t.dtype] for t in xs_cpu])
    times = (ctypes.c_double * iters)()
    msg = ctypes.create_string_buffer(256)
    rc = lib.kb_time_pte(path.encode(), len(xs_cpu), _pointers(xs_cpu), sizes, ranks, dtypes, 0, None, 5, iters,
                         times, msg, 256)
    if rc != 0:
        raise RuntimeError(f"{name}: kb_time_pte: {msg.value.decode()}")
    row["kiln_et"] = list(times)
    # The same program through Module on device tensors: from_blob on CUDA memory, the outputs
    # given with set_output; both reach the engine, which binds them in place. With one blob,
    # timed call for call beside the C API on the same device tensors (bound in place, graph
    # replay only, as eager has them).
    xs_dev = [t.cuda() for t in xs_cpu]
    ys_dev = [t.cuda() for t in ys_cpu]
    if len(blobs) == 1:
        times_c = (ctypes.c_double * iters)()
        blob_ptrs = _pointers(blob_order(blobs[0], model, xs_dev) + ys_dev)
        rc = lib.kb_time_pair(path.encode(), len(xs_dev), _pointers(xs_dev), sizes, ranks, dtypes, len(ys_dev),
                              _pointers(ys_dev), blobs[0], len(blobs[0]), blob_ptrs, 5, iters, times, times_c,
                              msg, 256)
        if rc == 0:
            row["kiln_et_dev"], row["kiln_dev"] = list(times), list(times_c)
        else:  # a program ExecuTorch plans: the C API alone
            print(f"{name}: kb_time_pair on device: {msg.value.decode()}", flush=True)
            rc = lib.kb_time_blob(blobs[0], len(blobs[0]), blob_ptrs, 5, iters, times, msg, 256)
            if rc != 0:
                raise RuntimeError(f"{name}: kb_time_blob on device: {msg.value.decode()}")
            row["kiln_dev"] = list(times)
        # The C API alone on host buffers (staged).
        xs_blob = blob_order(blobs[0], model, xs_cpu)
        rc = lib.kb_time_blob(blobs[0], len(blobs[0]), _pointers(xs_blob + ys_cpu), 5, iters, times, msg, 256)
        if rc != 0:
            raise RuntimeError(f"{name}: kb_time_blob: {msg.value.decode()}")
        row["kiln_c"] = list(times)
    else:
        rc = lib.kb_time_pte(path.encode(), len(xs_dev), _pointers(xs_dev), sizes, ranks, dtypes, len(ys_dev),
                             _pointers(ys_dev), 5, iters, times, msg, 256)
        if rc == 0:
            row["kiln_et_dev"] = list(times)
        else:  # a program ExecuTorch plans: the other columns stand
            print(f"{name}: kb_time_pte on device: {msg.value.decode()}", flush=True)
    del xs_dev, ys_dev
    os.unlink(path)

    # PyTorch on the same GPU.
    cuda_model = model.cuda()
    xs = [t.cuda() for t in xs_cpu]
    if name in CHANNELS_LAST:
        cuda_model = cuda_model.to(memory_format=torch.channels_last)
        xs = [t.contiguous(memory_format=torch.channels_last) for t in xs]
    row["baseline_layout"] = "channels_last" if name in CHANNELS_LAST else "contiguous"
    with torch.no_grad():
        eager_out = cuda_model(*xs)
        if len(blobs) == 1:
            got = kiln.run_blob(blobs[0], blob_order(blobs[0], model, xs), device="cuda")[0]
            peak = eager_out.double().abs().max().item()
            row["err"] = (got.double() - eager_out.double()).abs().max().item() / peak
        row["eager"] = time_torch(cuda_model, xs, iters)
        t0 = time.perf_counter()
        compiled = torch.compile(cuda_model, mode="reduce-overhead")
        for _ in range(3):
            compiled(*xs)
        row["compile_s"] = time.perf_counter() - t0
        row["compile"] = time_torch(compiled, xs, iters)
    del cuda_model, compiled, xs
    torch.cuda.empty_cache()
    torch._dynamo.reset()
    return row


def et_dev_minus_dev(r):
    """Kiln ET dev minus Kiln dev: the median of the call-for-call differences when the two were
    timed side by side (kb_time_pair), else the difference of the medians."""
    et_dev, dev = r["kiln_et_dev"], r["kiln_dev"]
    if len(et_dev) == len(dev):
        return spread([a - b for a, b in zip(et_dev, dev)])[0]
    return spread(et_dev)[0] - spread(dev)[0]


def link_columns(r, links):
    """ET dev - dev, the host goal (Kiln dev + 10 us + the I/O at 70% of the pinned rates) and
    the achieved fraction of the link: I/O bytes at the pinned rates over Kiln ET minus Kiln dev
    ("-" where that difference is no more than the bytes' time at the pinned rates: a fraction
    over 1 is the two timings' noise, not a rate)."""
    if "kiln_et_dev" not in r or "kiln_dev" not in r or not links:
        return "- | - | - | -"
    et, dev = spread(r["kiln_et"])[0], spread(r["kiln_dev"])[0]
    delta = et_dev_minus_dev(r)
    wire = (r["in_bytes"] / links["h2d"] + r["out_bytes"] / links["d2h"]) * 1e6
    goal = dev + 10 + wire / 0.7
    fraction = f"{wire / (et - dev):.2f}" if et - dev > wire else "-"
    dev_mark = "met" if delta <= 10 else "missed"
    host_mark = "met" if et <= goal else "missed"
    return f"{delta:.1f} ({dev_mark}) | {goal:.0f} ({host_mark}) | {wire:.0f} | {fraction}"


def stage_line(stage):
    """The staging settings the run used, for the table's header."""
    if not stage:
        return ""
    return (f" Host staging: {stage['threads']} threads, chunks of at most {stage['chunk_kib']} KiB"
            f" ({stage['source']}).")


def table(rows, rate, device, date, links=None, stage=None, sweep=None):
    links = links or {}
    link_line = (f" Pinned copy rates in the same run: host to device {links['h2d'] / 1e9:.1f} GB/s, device to host {links['d2h'] / 1e9:.1f} GB/s;"
                 " pageable to pinned host copy (the CPU side of staging) by threads: "
                 + ", ".join(f"{t}: {r / 1e9:.1f} GB/s" for t, r in links.get("host_copy", {}).items()) + "."
                 if links else "")
    lines = [
        f"# Kiln benchmark, {date}, {device}",
        "",
        f"Median latency of synchronized calls in microseconds (p10-p90 in brackets); device-to-device copy rate measured in the same run: {rate / 1e12:.2f} TB/s (read + write).{link_line}{stage_line(stage)}",
        "Kiln ET: through ExecuTorch's Module API on host tensors (as ExecuTorch passes them: input and output cross PCIe every call). Kiln C: kiln_engine_execute alone on the same host buffers. Kiln dev: kiln_engine_execute on CUDA tensors (bound in place, graph replay; the same footing as eager and compile, whose tensors live on the GPU). ET overhead: Kiln ET minus Kiln C. ratio ET / ratio dev: Kiln ET / Kiln dev over the faster of eager and compile; goal: the target ratio. BW: bytes that must move (weights + input + output) over Kiln dev's time, as a fraction of the copy rate. Kiln ET dev: through ExecuTorch's Module on CUDA tensors (from_blob on device memory, the output given with set_output), timed call for call beside Kiln dev. ET dev - dev: the median of the per-call differences of Kiln ET dev and Kiln dev (goal: 10 us). host goal: Kiln dev + 10 us + the I/O bytes at 70% of the pinned rates, against Kiln ET (met or missed). wire: the I/O bytes at the pinned rates (us). link: wire over Kiln ET minus Kiln dev, the achieved fraction of the pinned rate on the host path (the goal asks 0.7 once the fixed 10 us is paid). Eager and compile run the CNN cases (" + ", ".join(sorted(CHANNELS_LAST)) + ") in channels_last.",
        "",
        "| model | batch | dtype | eager | compile | Kiln ET | Kiln C | Kiln ET dev | Kiln dev | ET overhead | ET dev - dev | host goal | wire | link | ratio ET | ratio dev | goal | BW | err vs eager | blobs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        def cell(key):
            if key not in r:
                return "-"
            m, lo, hi = spread(r[key])
            return f"{m:.0f} [{lo:.0f}-{hi:.0f}]"
        et = spread(r["kiln_et"])[0]
        best = min(spread(r["eager"])[0], spread(r["compile"])[0])
        c = spread(r["kiln_c"])[0] if "kiln_c" in r else float("nan")
        dev = spread(r["kiln_dev"])[0] if "kiln_dev" in r else float("nan")
        bw = r["bytes"] / (dev * 1e-6) / rate
        err = f"{r['err']:.1e}" if "err" in r else "-"
        ratio, ratio_dev = et / best, dev / best
        mark = f"ET {'met' if ratio <= r['goal'] else 'missed'}, dev {'met' if ratio_dev <= r['goal'] else 'missed'}"
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['dtype']} | {cell('eager')} | {cell('compile')} | {cell('kiln_et')} "
            f"| {cell('kiln_c')} | {cell('kiln_et_dev')} | {cell('kiln_dev')} | {et - c:.1f} | {link_columns(r, links)} "
            f"| {ratio:.2f} | {ratio_dev:.2f} | {r['goal']} ({mark}) "
            f"| {bw:.2f} | {err} | {r['blobs']} |"
        )
    mlp = [r for r in rows if r["model"] == "mlp" and r["batch"] == 1 and r["dtype"] == "float16"]
    if mlp:
        floor = mlp[0]["param_bytes"] / rate * 1e6  # the weights read once, at the copy rate
        dev = spread(mlp[0]["kiln_dev"])[0] if "kiln_dev" in mlp[0] else float("nan")
        lines += ["", f"fp16 MLP batch 1: weight-read floor {floor:.1f} us (weight bytes over the copy rate); Kiln ET {spread(mlp[0]['kiln_et'])[0] / floor:.2f}x of it, Kiln dev {dev / floor:.2f}x."]
    if sweep:
        lines += ["", sweep_table(sweep, links)]
    return "\n".join(lines) + "\n"


class Scale(nn.Module):
    def forward(self, x):
        return x * 2.0


def stage_sweep(lib, iters, workdir, nbytes=1 << 26):
    """Host staging's rate for each thread count and chunk size: a program that reads and writes
    nbytes (x * 2 in fp16) on host buffers against the same on device buffers; rate = bytes in
    and out over the time host buffers add."""
    x = torch.randn(nbytes // 2).to(torch.float16)
    path = os.path.join(workdir, "stage_sweep.pte")
    blob = kiln.blobs(kiln.export(Scale(), (x,), path))[0]
    os.unlink(path)
    dev = [x.cuda(), torch.empty_like(x, device="cuda")]
    times = (ctypes.c_double * iters)()
    msg = ctypes.create_string_buffer(256)
    results = []
    saved = {k: os.environ.get(k) for k in ("KILN_STAGE_THREADS", "KILN_STAGE_CHUNK_KIB")}
    for chunk_kib in (256, 512, 1024, 2048, 4096, 8192):
        for threads in (1, 2, 4, 8, 16):
            os.environ["KILN_STAGE_THREADS"], os.environ["KILN_STAGE_CHUNK_KIB"] = str(threads), str(chunk_kib)
            if lib.kb_time_blob(blob, len(blob), None, 3, iters, times, msg, 256) != 0:
                raise RuntimeError(f"stage sweep: {msg.value.decode()}")
            host = spread(list(times))[0]
            if lib.kb_time_blob(blob, len(blob), _pointers(dev), 3, iters, times, msg, 256) != 0:
                raise RuntimeError(f"stage sweep on device: {msg.value.decode()}")
            device = spread(list(times))[0]
            rate = 2 * nbytes / max(host - device, 1e-9) * 1e6
            results.append({"threads": threads, "chunk_kib": chunk_kib, "host_us": host, "dev_us": device,
                            "rate": rate})
            print(f"stage sweep: {threads} threads, chunk {chunk_kib} KiB: {rate / 1e9:.1f} GB/s "
                  f"(host {host:.0f} us, device {device:.0f} us)", flush=True)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    return {"bytes": nbytes, "results": results}


def sweep_table(sweep, links):
    """The staging sweep as a table: GB/s in and out, and the fraction of the pinned rate."""
    pinned = 2 / (1 / links["h2d"] + 1 / links["d2h"]) if links else float("nan")
    chunks = sorted({r["chunk_kib"] for r in sweep["results"]})
    threads = sorted({r["threads"] for r in sweep["results"]})
    by = {(r["threads"], r["chunk_kib"]): r["rate"] for r in sweep["results"]}
    lines = [f"Host staging sweep: {sweep['bytes'] >> 20} MiB in and {sweep['bytes'] >> 20} MiB out on host buffers, "
             f"minus the same on device buffers; GB/s (fraction of the pinned rate, {pinned / 1e9:.1f} GB/s)."
             " Rows: KILN_STAGE_THREADS; columns: KILN_STAGE_CHUNK_KIB.",
             "", "| threads | " + " | ".join(f"{c} KiB" for c in chunks) + " |",
             "| --- | " + " | ".join("---" for _ in chunks) + " |"]
    for t in threads:
        lines.append(f"| {t} | " + " | ".join(f"{by[(t, c)] / 1e9:.1f} ({by[(t, c)] / pinned:.2f})" for c in chunks) + " |")
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']}\nb{r['batch']} {r['dtype'].replace('float', 'f')}" for r in rows]
    series = [("eager", "eager"), ("compile", "torch.compile"), ("kiln_et", "Kiln (ExecuTorch, host I/O)"),
              ("kiln_c", "Kiln (C API, host I/O)"), ("kiln_et_dev", "Kiln (ExecuTorch, device I/O)"),
              ("kiln_dev", "Kiln (C API, device I/O)")]
    width = 0.13
    fig, ax = plt.subplots(figsize=(max(10, len(rows) * 1.2), 5))
    for k, (key, name) in enumerate(series):
        values = [spread(r[key])[0] if key in r else 0 for r in rows]
        ax.bar([i + (k - 2) * width for i in range(len(rows))], values, width, label=name)
    ax.set_yscale("log")
    ax.set_ylabel("median latency per call (us, log)")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.legend()
    ax.set_title("Kiln vs PyTorch on one GPU")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--only", default=None)
    parser.add_argument("--batches", default=None, help="run only these batch sizes (comma-separated)")
    parser.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    parser.add_argument("--budget-s", type=float, default=1e9, help="start no case after this many seconds")
    parser.add_argument("--stage-sweep", action="store_true", help="time host staging for each thread count and chunk size first")
    parser.add_argument("--stage-threads", type=int, default=None, help="KILN_STAGE_THREADS for the cases")
    parser.add_argument("--stage-chunk-kib", type=int, default=None, help="KILN_STAGE_CHUNK_KIB for the cases")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib = ctypes.CDLL(os.environ.get("KILN_BENCH_LIBRARY", os.path.join(ROOT, "build-bench", "libkiln_bench.so")))
    lib.kb_time_pte.restype = ctypes.c_int
    lib.kb_host_copy_rate.restype = ctypes.c_double
    lib.kb_time_blob.restype = ctypes.c_int
    lib.kb_time_blob.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                 ctypes.POINTER(ctypes.c_double), ctypes.c_char_p, ctypes.c_int]
    lib.kb_time_pair.restype = ctypes.c_int
    lib.kb_time_pair.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                 ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double),
                                 ctypes.POINTER(ctypes.c_double), ctypes.c_char_p, ctypes.c_int]
    device = torch.cuda.get_device_name(0)
    rate = copy_rate()
    links = pinned_rates()
    links["host_copy"] = host_copy_rates(lib)
    print(f"copy rate {rate / 1e12:.2f} TB/s on {device}; pinned host to device {links['h2d'] / 1e9:.1f} GB/s, "
          f"device to host {links['d2h'] / 1e9:.1f} GB/s; pageable to pinned host copy by threads "
          + ", ".join(f"{t}: {r / 1e9:.1f}" for t, r in links["host_copy"].items()) + " GB/s", flush=True)
    workdir = os.environ.get("TMPDIR", "/tmp")
    sweep = stage_sweep(lib, args.iters, workdir) if args.stage_sweep else None
    if sweep:
        print(sweep_table(sweep, links), flush=True)
    if args.stage_threads is not None:
        os.environ["KILN_STAGE_THREADS"] = str(args.stage_threads)
    if args.stage_chunk_kib is not None:
        os.environ["KILN_STAGE_CHUNK_KIB"] = str(args.stage_chunk_kib)
    cores = len(os.sched_getaffinity(0))
    stage = {"threads": os.environ.get("KILN_STAGE_THREADS", str(min(cores, 8))),
             "chunk_kib": os.environ.get("KILN_STAGE_CHUNK_KIB", "8192"),
             "source": "set by KILN_STAGE_THREADS / KILN_STAGE_CHUNK_KIB"
             if "KILN_STAGE_THREADS" in os.environ or "KILN_STAGE_CHUNK_KIB" in os.environ
             else f"the defaults: min({cores} cores, 8) and 8192 KiB"}
    rows = []
    gpu = next((g for g in ("h100", "h200") if g in device.lower()), "gpu")
    stem = os.path.join(args.out, f"bench_{args.date}_{gpu}")
    started = time.perf_counter()
    # Batch 1 first, fp16 before fp32: a run cut short by its budget loses the least.
    for batch, dtype in ((1, torch.float16), (1, torch.bfloat16), (1, torch.float32), (8, torch.float16),
                         (32, torch.float16), (32, torch.bfloat16), (32, torch.float32)):
        for name in CASES:
            if args.only and name not in args.only.split(","):
                continue
            if dtype not in CASE_DTYPES.get(name, (torch.float16, torch.float32)):
                continue
            if batch not in CASE_BATCHES.get(name, (1, 32)):
                continue
            if args.batches and str(batch) not in args.batches.split(","):
                continue
            if time.perf_counter() - started > args.budget_s:
                print(f"{name} b{batch} {dtype}: not run, over the time budget", flush=True)
                continue
            t0 = time.perf_counter()
            try:
                row = run_case(lib, name, batch, dtype, args.iters, workdir)
            except Exception as error:  # one failing case must not lose the others
                print(f"{name} b{batch} {dtype}: FAILED: {error}", flush=True)
                continue
            row["goal"] = goal(batch, dtype)
            rows.append(row)
            print(f"{name} b{batch} {row['dtype']}: eager {spread(row['eager'])[0]:.0f} compile "
                  f"{spread(row['compile'])[0]:.0f} kiln {spread(row['kiln_et'])[0]:.0f} kiln ET dev "
                  f"{spread(row['kiln_et_dev'])[0] if 'kiln_et_dev' in row else float('nan'):.0f} us "
                  f"(export {row['export_s']:.0f} s, compile {row['compile_s']:.0f} s, "
                  f"case {time.perf_counter() - t0:.0f} s)", flush=True)
            # Written after every case, so a run cut short still leaves its table.
            with open(stem + ".md", "w") as f:
                f.write(table(rows, rate, device, args.date, links, stage, sweep))
            with open(stem + ".json", "w") as f:
                json.dump({"device": device, "date": args.date, "copy_rate": rate, "pinned_rates": links,
                           "stage": stage, "stage_sweep": sweep, "rows": rows}, f)
    if rows:
        plot(rows, stem + ".png")
    print(table(rows, rate, device, args.date, links, stage, sweep))


if __name__ == "__main__":
    main()
