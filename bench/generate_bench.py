"""Greedy generation of a Llama-family decoder on one GPU: Kiln through ExecuTorch's Module beside
transformers eager and torch.compile, in one process.

The decoder is built from a transformers LlamaConfig with seeded random weights (nothing is
downloaded): hidden 2048, MLP 8192, 16 query and 4 key/value heads, RoPE, vocabulary 32000, 4
layers by default, a static KV cache of 1152 slots. It is exported once with kiln.export
(transformers' TorchExportableModuleWithStaticCache, greedy argmax inside the program, the cache
the blob's own state) and run through ExecuTorch's Module by libkiln_bench.so (ctypes: ExecuTorch's
Python runtime is not needed on the GPU machine). For prompts of 128 and 1024 tokens it times the
prefill (token by token from a program of sequence length 1; --dynamic-prefill exports a bounded
sequence dimension and prefills in calls of --prefill-chunk tokens, the whole prompt by default)
and the decode steps after it, on host I/O (ids, positions and tokens in host
memory, as a runner has them) and on device I/O (the same slots in GPU memory). The state is reset
between runs by unloading and reloading forward (the delegate's handle owns the cache).

The same blob also runs through Kiln's C API alone (libkiln.so through ctypes, as kiln._lib loads
it, in the same process as libkiln_bench.so): one engine, its state reset between runs, the same
prompt, positions and slots, host and device I/O, each call timed around kiln_engine_execute. The
Module median minus the C API's is what ExecuTorch's Module and the delegate add to a decode step.

Baselines on the same GPU: transformers eager with the same static cache (prefill in one call, and
token by token for the shorter prompts), and torch.compile(mode="reduce-overhead", fullgraph) of
the same step (decode steps; the prompt token by token, or in one call with --compile-prefill).
The weight-read floor is the bytes of every weight one decode step reads (the embedding table
excluded: one row of it is read; the LM head included) over the device-to-device copy rate
measured in the same run. Writes generate_<date>_h200.{md,json} and the per-op profile of the
decode step (kiln profile) into OUT.

usage: python3 bench/generate_bench.py OUT [--dtype float16,bfloat16] [--layers 4] [--quick]
"""

import argparse
import ctypes
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))
import bench  # noqa: E402  (sets KILN_LIBRARY to the CUDA build where there is one)
import decoders  # noqa: E402  (GreedyStep: the argmax of the last logits inside the program)

kiln = bench.kiln

GPU = "cuda"  # where the baselines and device I/O run
GOAL_COMPILE = 0.8  # decode step over torch.compile's
GOAL_FLOOR = 1.3  # decode step over the weight-read floor


def llama_config(layers, cache_len, width=2048, ffn=8192, heads=16, kv_heads=4, vocab=32000):
    import transformers

    return transformers.LlamaConfig(hidden_size=width, intermediate_size=ffn, num_attention_heads=heads,
                                    num_key_value_heads=kv_heads, num_hidden_layers=layers, vocab_size=vocab,
                                    max_position_embeddings=cache_len, tie_word_embeddings=False)


def build_model(config, dtype, seed=0):
    """The causal LM with seeded random weights (transformers' own init), on the CPU, in eval mode."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    model.generation_config.cache_implementation = "static"
    return model


def greedy_step(model, cache_len, device):
    """forward(input_ids [1, n], cache_position [n]) -> the next token id [1], with its own static cache."""
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    wrapped = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=cache_len,
                                                   device=torch.device(device))
    return decoders.GreedyStep(wrapped).eval()


def export_program(model, cache_len, path, dynamic_max=None):
    """The greedy step as one Kiln blob holding its cache, written to path; returns the program's
    blobs. With dynamic_max, its sequence dimension is exported as Dim(1..dynamic_max), for
    prefill in calls of several tokens."""
    ids, positions, dynamic = torch.tensor([[3]]), torch.tensor([0]), None
    if dynamic_max:
        seq = torch.export.Dim("seq", min=1, max=dynamic_max)
        ids, positions = torch.tensor([[3, 4]]), torch.tensor([0, 1])  # two tokens: not specialized to 1
        dynamic = {"input_ids": {1: seq}, "cache_position": {0: seq}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = kiln.export(greedy_step(model, cache_len, "cpu"), (ids, positions), path, strict=True,
                              require_whole=True, dynamic_shapes=dynamic)
    return kiln.blobs(program)


def weight_bytes(model):
    """Bytes of the weights one decode step reads: every parameter once, less the embedding table
    (a step reads one row of it) unless it is also the LM head."""
    unique = {p.data_ptr(): p for p in model.parameters()}
    total = sum(p.numel() * p.element_size() for p in unique.values())
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if embed.data_ptr() != head.data_ptr():
        total -= embed.numel() * embed.element_size()
    return total


def cache_bytes(config, cache_len, dtype):
    """Bytes of the whole static KV cache (keys and values of every layer)."""
    head = config.hidden_size // config.num_attention_heads
    size = torch.tensor([], dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head * cache_len * size


def prompt_of(length, vocab, seed=1):
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def mapped_libraries(names=("libkiln.so", "libexecutorch_backend_kiln.so", "libkiln_bench.so")):
    """{library name: [files]} of these libraries mapped into this process (relative to the
    repository inside it): which builds the C API (libkiln.so) and the Module path (the delegate
    library) ran."""
    found = {}
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            path = fields[5].strip() if len(fields) == 6 else ""
            if os.path.basename(path) in names:
                path = os.path.realpath(path)
                if path.startswith(os.path.realpath(bench.ROOT) + os.sep):
                    path = os.path.relpath(path, os.path.realpath(bench.ROOT))
                found.setdefault(os.path.basename(path), set()).add(path)
    return {name: sorted(paths) for name, paths in found.items()}


def slot_layout(prompt, new_tokens, device, chunk=1, spaced=None, start=0):
    """The ids and positions slots of one generation (see KilnGenerator.generate): (seq,
    positions, stride, first); slot p is seq[first + p * stride], the prompt in its first slots."""
    slots = len(prompt) + new_tokens
    spaced = device != "cpu" if spaced is None else spaced
    stride, first = (2, 1) if spaced and chunk == 1 else (1, 0)
    seq = torch.zeros(slots * stride + first, dtype=torch.long)
    seq[first::stride][:len(prompt)] = torch.tensor(prompt)
    positions = torch.zeros_like(seq)
    positions[first::stride] = torch.arange(start, start + slots)
    return seq.to(device), positions.to(device), stride, first


def load_library(path=None):
    lib = ctypes.CDLL(path or os.environ.get("KILN_BENCH_LIBRARY",
                                             os.path.join(bench.ROOT, "build-bench", "libkiln_bench.so")))
    lib.kb_gen_open.restype = ctypes.c_void_p
    lib.kb_gen_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    lib.kb_gen_caller_inputs.restype = ctypes.c_int
    lib.kb_gen_caller_inputs.argtypes = [ctypes.c_void_p]
    lib.kb_gen_close.restype = None
    lib.kb_gen_close.argtypes = [ctypes.c_void_p]
    lib.kb_gen_reset.restype = ctypes.c_int
    lib.kb_gen_reset.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_double), ctypes.c_char_p, ctypes.c_int]
    lib.kb_gen_run.restype = ctypes.c_int
    lib.kb_gen_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                               ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double), ctypes.c_char_p,
                               ctypes.c_int]
    return lib


class KilnGenerator:
    """A decoder .pte loaded through ExecuTorch's Module (libkiln_bench's kb_gen_*)."""

    def __init__(self, lib, path):
        self.lib, self.msg = lib, ctypes.create_string_buffer(256)
        self.handle = lib.kb_gen_open(path.encode(), self.msg, 256)
        if not self.handle:
            raise RuntimeError(f"kb_gen_open {path}: {self.msg.value.decode()}")
        self.device_inputs = bool(lib.kb_gen_caller_inputs(self.handle))

    def close(self):
        if self.handle:
            self.lib.kb_gen_close(self.handle)
            self.handle = None

    def reset(self):
        """Reloads forward, which gives back the program's initial cache; returns the microseconds."""
        load_us = ctypes.c_double()
        if self.lib.kb_gen_reset(self.handle, ctypes.byref(load_us), self.msg, 256) != 0:
            raise RuntimeError(f"kb_gen_reset: {self.msg.value.decode()}")
        return load_us.value

    def generate(self, prompt, new_tokens, device="cpu", chunk=1, spaced=None, start=0):
        """Greedy generation from position start (0: a new text) with ids, positions and tokens in device's memory:
        (new token ids, prefill call times, decode step times), microseconds. spaced (the default
        on a GPU) puts every slot at 8 bytes past a 16-byte boundary, never at the 256 the engine
        binds in place: it copies each call's slots into its own buffers and replays one graph,
        where slots it could bind, at a new address every call, would be re-captured each time."""
        if device != "cpu" and not self.device_inputs:
            raise RuntimeError("the program's inputs are in ExecuTorch's memory plan, which copies them on the "
                               "host: generate from host memory")
        seq, positions, stride, first = slot_layout(prompt, new_tokens, device, chunk, spaced, start)
        n_prefill = -(-len(prompt) // chunk)
        times = (ctypes.c_double * (n_prefill + new_tokens - 1))()
        rc = self.lib.kb_gen_run(self.handle, seq.data_ptr() + 8 * first, positions.data_ptr() + 8 * first,
                                 len(prompt), new_tokens, chunk, stride, times, self.msg, 256)
        if rc != 0:
            raise RuntimeError(f"kb_gen_run: {self.msg.value.decode()}")
        times = [round(t, 1) for t in times]
        return seq[first::stride][len(prompt):].tolist(), times[:n_prefill], times[n_prefill:]


class KilnCGenerator:
    """The program's blob through Kiln's C API alone (libkiln.so, kiln._lib): one engine on
    engine_device kept across runs, each run from reset_state(), calling on the slots exactly as
    kb_gen_run does; each call is timed around kiln_engine_execute, its views built beforehand."""

    def __init__(self, blob, engine_device="cuda"):
        from kiln import _lib

        self._lib = _lib
        self.engine = _lib.Engine(blob, engine_device)
        inputs = [name for name, kind, _, _ in self.engine.bindings() if kind == _lib.IO_INPUT]
        # Bindings are named after forward's parameters, ordered as the graph first reads them.
        self.order = [next(i for i, key in enumerate(("input_ids", "cache_position")) if key in name)
                      for name in inputs]
        if sorted(self.order) != [0, 1]:
            raise RuntimeError(f"the blob's inputs {inputs} are not input_ids and cache_position")

    def close(self):
        self.engine.close()

    def _view(self, address, shape):
        """A contiguous int64 view of shape at address."""
        view = self._lib.TensorView()
        view.data, view.nbytes, view.dtype, view.rank = address, 8 * math.prod(shape), self._lib.I64, len(shape)
        for d, size in enumerate(shape):
            view.sizes[d], view.strides[d] = size, math.prod(shape[d + 1:])
        return view

    def generate(self, prompt, new_tokens, device="cpu", chunk=1, spaced=None, start=0):
        """As KilnGenerator.generate, on the C API: (new token ids, prefill call times, decode step
        times), microseconds."""
        lib = self._lib
        self.engine.reset_state()
        seq, positions, stride, first = slot_layout(prompt, new_tokens, device, chunk, spaced, start)
        ids_at = lambda p: seq.data_ptr() + 8 * (first + p * stride)
        pos_at = lambda p: positions.data_ptr() + 8 * (first + p * stride)
        calls = [(at, min(chunk, len(prompt) - at), len(prompt)) for at in range(0, len(prompt), chunk)]
        calls += [(p, 1, p + 1) for p in range(len(prompt), len(prompt) + new_tokens - 1)]
        prepared = []
        for at, n, out in calls:
            fed = (self._view(ids_at(at), (1, n)), self._view(pos_at(at), (n,)))
            prepared.append(((lib.TensorView * 2)(*[fed[k] for k in self.order]),
                             (lib.TensorView * 1)(self._view(ids_at(out), (1,)))))
        execute, handle, error = lib.lib.kiln_engine_execute, self.engine._handle, lib.Error()
        error_ref, times = ctypes.byref(error), []
        for ins, outs in prepared:
            t0 = time.perf_counter()
            status = execute(handle, ins, 2, outs, 1, error_ref)
            t1 = time.perf_counter()
            if status != lib.OK:
                raise lib.KilnError(status, error.message.decode("utf-8", "replace"))
            times.append(round((t1 - t0) * 1e6, 1))
        n_prefill = len(calls) - (new_tokens - 1)
        return seq[first::stride][len(prompt):].tolist(), times[:n_prefill], times[n_prefill:]


def torch_generate(step, prompt, new_tokens, device, whole_prompt):
    """Greedy generation through a torch step (eager or compiled): the prompt in one call or token
    by token, then new_tokens - 1 decode steps, each synchronized; (tokens, prefill us, step us)."""
    # Each call's inputs made beforehand, each its own tensor: views at moving offsets would make
    # dynamo recompile, and making them in the loop would time their copies.
    ids = torch.tensor([prompt], device=device)
    ids_each = [ids[:, i:i + 1].clone() for i in range(len(prompt))]
    positions = [torch.tensor([p], device=device) for p in range(len(prompt) + new_tokens)]
    prompt_positions = torch.arange(len(prompt), device=device)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        if whole_prompt:
            token = step(ids, prompt_positions).clone()
        else:
            for i in range(len(prompt)):
                token = step(ids_each[i], positions[i]).clone()
        sync()
        prefill = (time.perf_counter() - t0) * 1e6
        tokens, times = [token], []
        for p in range(len(prompt), len(prompt) + new_tokens - 1):
            t0 = time.perf_counter()
            # A compiled step replays a CUDA graph whose output buffer the next replay rewrites.
            token = step(token.view(1, 1), positions[p]).clone()
            sync()
            times.append(round((time.perf_counter() - t0) * 1e6, 1))
            tokens.append(token)
    return [int(t) for t in torch.cat(tokens).tolist()], prefill, times


def agreement(tokens, reference):
    """How many leading tokens equal the reference's, and how many equal it in all."""
    prefix = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))
    return {"prefix": prefix, "equal": sum(a == b for a, b in zip(tokens, reference)), "of": len(reference)}


def compile_step(step):
    """torch.compile of the step, fullgraph where dynamo manages it; (compiled, fullgraph?)."""
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    probe = (torch.tensor([[3]], device=GPU), torch.tensor([0], device=GPU))
    try:
        with torch.no_grad():
            compiled(*probe)
        return compiled, True
    except Exception as error:  # a graph break: the same step without fullgraph
        print(f"torch.compile fullgraph failed ({type(error).__name__}: {str(error)[:200]}); without fullgraph",
              flush=True)
        torch._dynamo.reset()
        return torch.compile(step, mode="reduce-overhead"), False


def median(values):
    return statistics.median(values) if values else float("nan")


def run_dtype(lib, args, dtype, rate, workdir, log):
    name = str(dtype).replace("torch.", "")
    config = llama_config(args.layers, args.cache, args.width, args.ffn, args.heads, args.kv_heads, args.vocab)
    t0 = time.perf_counter()
    model = build_model(config, dtype, args.seed)
    result = {"dtype": name, "weight_bytes": weight_bytes(model), "cache_bytes": cache_bytes(config, args.cache, dtype),
              "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
              "build_s": time.perf_counter() - t0, "runs": {}}
    result["floor_us"] = result["weight_bytes"] / rate * 1e6
    path = os.path.join(workdir, f"llama_{args.layers}l_{name}.pte")
    t0 = time.perf_counter()
    blobs = export_program(model, args.cache, path, args.cache if args.dynamic_prefill else None)
    result["blobs"] = len(blobs)
    result["export_s"] = time.perf_counter() - t0
    result["pte_bytes"] = os.path.getsize(path)
    gc.collect()
    log(f"{name}: built in {result['build_s']:.0f} s, exported in {result['export_s']:.0f} s "
        f"({result['blobs']} blob, {result['pte_bytes'] / 2**20:.0f} MiB); weights read per step "
        f"{result['weight_bytes'] / 2**20:.0f} MiB, floor {result['floor_us']:.1f} us")
    chunk = args.prefill_chunk if args.dynamic_prefill else 1
    warm = prompt_of(16, args.vocab, seed=99)

    # Kiln through ExecuTorch's Module: a warm-up generation, then each measured run from a reset.
    t0 = time.perf_counter()
    kiln_gen = KilnGenerator(lib, path)
    try:
        kiln_gen.generate(warm, 8, "cpu", chunk)
        result["open_s"] = time.perf_counter() - t0
        log(f"{name}: Kiln program loaded through Module and warmed up in {result['open_s']:.1f} s")
        resets = []
        for length in args.prompts:
            prompt = prompt_of(length, args.vocab)
            run = result["runs"].setdefault(str(length), {})
            for io in ("host", "device") if kiln_gen.device_inputs else ("host",):
                resets.append(kiln_gen.reset())
                tokens, prefill, steps = kiln_gen.generate(prompt, args.steps, "cpu" if io == "host" else GPU, chunk)
                run[f"kiln_{io}"] = {"tokens": tokens, "prefill_us": sum(prefill), "prefill_calls": prefill,
                                     "steps_us": steps}
            if "kiln_device" not in run:
                run["kiln_device"] = {"tokens": [], "prefill_us": float("nan"), "steps_us": [],
                                      "not_run": "the program's inputs are planned by ExecuTorch: host memory only"}
            log(f"{name} prompt {length}: Kiln prefill {run['kiln_host']['prefill_us'] / 1e3:.1f} ms "
                f"(device I/O {run['kiln_device']['prefill_us'] / 1e3:.1f}), decode "
                f"{median(run['kiln_host']['steps_us']):.1f} us (device I/O {median(run['kiln_device']['steps_us']):.1f})")
        result["reset_us"] = resets
        # The same tokens from the same prompt twice: the reset left no state behind.
        kiln_gen.reset()
        again = kiln_gen.generate(prompt_of(args.prompts[0], args.vocab), args.steps, "cpu", chunk)[0]
        result["reset_repeats_tokens"] = again == result["runs"][str(args.prompts[0])]["kiln_host"]["tokens"]
    finally:
        kiln_gen.close()
    gc.collect()

    # The same blob through Kiln's C API alone, on the same prompts, positions and slots.
    if len(blobs) == 1:
        capi = KilnCGenerator(blobs[0], GPU)
        try:
            capi.generate(warm, 8, "cpu", chunk)
            for length in args.prompts:
                prompt = prompt_of(length, args.vocab)
                run = result["runs"][str(length)]
                for io in ("host", "device"):
                    tokens, prefill, steps = capi.generate(prompt, args.steps, "cpu" if io == "host" else GPU, chunk)
                    run[f"capi_{io}"] = {"tokens": tokens, "prefill_us": sum(prefill), "prefill_calls": prefill,
                                         "steps_us": steps, "vs_module": agreement(tokens, run["kiln_host"]["tokens"])}
                capi_steps = {io: median(run[f"capi_{io}"]["steps_us"]) for io in ("host", "device")}
                extra = {io: median(run[f"kiln_{io}"]["steps_us"]) - capi_steps[io] for io in ("host", "device")}
                run["module_minus_capi_us"] = extra
                log(f"{name} prompt {length}: Kiln C API decode {capi_steps['host']:.1f} us (device I/O "
                    f"{capi_steps['device']:.1f}); Module minus C API {extra['host']:.1f} us (device I/O {extra['device']:.1f})")
        finally:
            capi.close()
    del blobs
    gc.collect()

    # transformers eager with its static cache, and torch.compile of the same step, on the GPU.
    cuda_model = model.to(GPU)
    eager = greedy_step(cuda_model, args.cache, GPU)
    torch_generate(eager, warm, 8, GPU, whole_prompt=True)
    for length in args.prompts:
        prompt = prompt_of(length, args.vocab)
        run = result["runs"][str(length)]
        torch_generate(eager, prompt, 2, GPU, whole_prompt=True)  # this prompt's shape seen once
        tokens, prefill, steps = torch_generate(eager, prompt, args.steps, GPU, whole_prompt=True)
        run["eager"] = {"tokens": tokens, "prefill_us": prefill, "steps_us": steps}
        if length <= args.eager_token_prefill_max:
            tokens, prefill, _ = torch_generate(eager, prompt, 2, GPU, whole_prompt=False)
            run["eager_token_prefill"] = {"tokens": tokens, "prefill_us": prefill}
        log(f"{name} prompt {length}: eager prefill {run['eager']['prefill_us'] / 1e3:.1f} ms, decode "
            f"{median(run['eager']['steps_us']):.1f} us")
    skips = torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0)
    t0 = time.perf_counter()
    compiled, result["compile_fullgraph"] = compile_step(greedy_step(cuda_model, args.cache, GPU))
    torch_generate(compiled, warm, 8, GPU, whole_prompt=False)
    result["compile_s"] = time.perf_counter() - t0
    # Steps that Inductor ran without CUDA graphs (a mutated input it could not replay, say).
    result["cudagraph_skips"] = torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0) - skips
    for length in args.prompts:
        prompt = prompt_of(length, args.vocab)
        run = result["runs"][str(length)]
        tokens, prefill, steps = torch_generate(compiled, prompt, args.steps, GPU, whole_prompt=False)
        run["compile"] = {"tokens": tokens, "prefill_us": prefill, "steps_us": steps}
        if args.compile_prefill:
            torch_generate(compiled, prompt, 2, GPU, whole_prompt=True)  # compiles this prompt's shape
            run["compile_whole_prefill"] = {"prefill_us": torch_generate(compiled, prompt, 2, GPU, True)[1]}
        for key in ("kiln_host", "kiln_device", "compile"):
            run[key]["vs_eager"] = agreement(run[key]["tokens"], run["eager"]["tokens"])
        run["kiln_host"]["vs_compile"] = agreement(run["kiln_host"]["tokens"], run["compile"]["tokens"])
        run["distinct_tokens"] = len(set(run["eager"]["tokens"]))
        log(f"{name} prompt {length}: compile decode {median(run['compile']['steps_us']):.1f} us; Kiln tokens equal "
            f"eager's for the first {run['kiln_host']['vs_eager']['prefix']} of {args.steps} "
            f"({run['distinct_tokens']} distinct)")
    del eager, compiled, cuda_model, model
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()

    if args.profile_reps:
        result["profile"] = profile(path, args.profile_reps)
    if not args.keep:
        os.unlink(path)
    return result


def profile(path, reps):
    """kiln profile of the program: each op of the decode step timed alone on the GPU."""
    cli = os.environ.get("KILN_CLI") or next((c for c in (os.path.join(bench.ROOT, d, "kiln") for d in ("build", "build-gpu"))
                                              if os.path.isfile(c)), "kiln")
    try:
        done = subprocess.run([cli, "profile", path, "--reps", str(reps)], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as error:  # the measurements stand without it
        return f"{cli} profile did not run: {error}\n"
    return done.stdout + (f"\n{cli} profile exited {done.returncode}: {done.stderr[-2000:]}" if done.returncode else "")


def num(value, digits=1):
    """value with digits decimals, or "-" where it was not measured."""
    return "-" if value != value else f"{value:.{digits}f}"


def decode_cells(run, floor):
    """Decode medians and the goal ratios of one prompt length."""
    kiln_host, kiln_dev = median(run["kiln_host"]["steps_us"]), median(run["kiln_device"]["steps_us"])
    comp = median(run["compile"]["steps_us"])
    # The C API alone (absent from reports older than its columns).
    capi_host, capi_dev = (median(run[key]["steps_us"]) if key in run else float("nan")
                           for key in ("capi_host", "capi_device"))
    mark = lambda ratio, goal: f"{ratio:.2f} ({'met' if ratio <= goal else 'missed'})"
    return {"kiln_host": num(kiln_host), "kiln_device": num(kiln_dev), "eager": num(median(run["eager"]["steps_us"])),
            "compile": num(comp), "floor": mark(kiln_host / floor, GOAL_FLOOR) + f", dev {num(kiln_dev / floor, 2)}",
            "vs_compile": mark(kiln_host / comp, GOAL_COMPILE) + f", dev {num(kiln_dev / comp, 2)}",
            "capi_host": num(capi_host), "capi_device": num(capi_dev),
            "module_minus_capi_host": num(kiln_host - capi_host), "module_minus_capi_device": num(kiln_dev - capi_dev)}


def capi_tokens(result):
    """How many of the C API's new tokens (host I/O / dev I/O) equal Module's on host I/O, by prompt."""
    cells = [f"{length}: {run['capi_host']['vs_module']['equal']} / {run['capi_device']['vs_module']['equal']} of "
             f"{run['capi_host']['vs_module']['of']}" for length, run in result["runs"].items() if "capi_host" in run]
    return f" Kiln C API tokens equal to Module's (host / dev I/O), by prompt: {', '.join(cells)}." if cells else ""


def table(report):
    """The markdown report: a header explaining the columns, then one row per dtype and prompt."""
    args = report["settings"]
    lines = [
        f"# Greedy generation, {report['date']}, {report['device']}",
        "",
        f"Llama-family decoder with random weights: hidden {args['width']}, MLP {args['ffn']}, {args['heads']} query and "
        f"{args['kv_heads']} key/value heads, {args['layers']} layers, vocabulary {args['vocab']}, static KV cache of "
        f"{args['cache']} slots, batch 1; {args['steps']} new tokens after each prompt (the first from the prefill, then "
        f"{args['steps'] - 1} decode steps). Device-to-device copy rate "
        f"measured in the same run: {report['copy_rate'] / 1e12:.2f} TB/s (read + write)."
        + "".join(f" {name}: {', '.join(paths)}." for name, paths in report.get("libraries", {}).items()),
        "",
        "Prefill (ms): the prompt's latency until the first new token. Kiln: through ExecuTorch's Module, "
        + ("in calls of %d tokens (a program with a dynamic sequence dimension)" % args["prefill_chunk"]
           if args["dynamic_prefill"] else "token by token (the exported program's sequence length is 1)")
        + "; host: ids, positions and the token in host memory (a runner's loop), dev: the same in GPU memory."
        " eager: transformers with its static cache, the prompt in one call; eager/token: the same token by token."
        " compile: torch.compile(mode=\"reduce-overhead\") of the same step, token by token"
        + (" (compile/whole: in one call)" if args["compile_prefill"] else "") + "."
        " Decode (us): the median of the synchronized steps after the prompt."
        " floor: the bytes of the weights one step reads (the embedding table excluded, the LM head included) over"
        f" the copy rate; Kiln/floor (goal <= {GOAL_FLOOR}) and Kiln/compile (goal <= {GOAL_COMPILE}) for host I/O,"
        " met or missed, then for device I/O. tokens: how many of Kiln's (host I/O) new tokens equal eager's from the"
        " first on, then in all, and the same against compile; distinct: distinct tokens eager generated."
        " Kiln C API decode (us): the same blob through Kiln's C API alone (libkiln.so through ctypes, one engine,"
        " its state reset between runs), on the same prompt, positions and slots, host and dev I/O as above, the"
        " median step timed around kiln_engine_execute; Module - C API: Kiln decode minus Kiln C API decode, what"
        " ExecuTorch's Module and the delegate add to a step (the two runs one after the other, not call for call).",
        "",
        "| dtype | prompt | Kiln prefill host | Kiln prefill dev | eager prefill | eager/token | compile prefill"
        + (" | compile/whole" if args["compile_prefill"] else "")
        + " | Kiln decode host | Kiln decode dev | eager decode | compile decode | floor | Kiln/floor | Kiln/compile"
        " | tokens = eager | tokens = compile | distinct | Kiln C API decode host | Kiln C API decode dev"
        " | Module - C API host | Module - C API dev |",
        "| --- | --- | --- | --- | --- | --- | ---" + (" | ---" if args["compile_prefill"] else "")
        + " | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in report["results"]:
        for length, run in result["runs"].items():
            d = decode_cells(run, result["floor_us"])
            ms = lambda key: num(run[key]["prefill_us"] / 1e3) if key in run else "-"
            eq = lambda a: f"{a['prefix']} / {a['equal']} of {a['of']}"
            lines.append(
                f"| {result['dtype']} | {length} | {ms('kiln_host')} | {ms('kiln_device')} | {ms('eager')} "
                f"| {ms('eager_token_prefill')} | {ms('compile')}"
                + (f" | {ms('compile_whole_prefill')}" if args["compile_prefill"] else "")
                + f" | {d['kiln_host']} | {d['kiln_device']} | {d['eager']} | {d['compile']} "
                f"| {result['floor_us']:.1f} | {d['floor']} | {d['vs_compile']} | {eq(run['kiln_host']['vs_eager'])} "
                f"| {eq(run['kiln_host']['vs_compile'])} | {run['distinct_tokens']} | {d['capi_host']} "
                f"| {d['capi_device']} | {d['module_minus_capi_host']} | {d['module_minus_capi_device']} |")
    lines.append("")
    for result in report["results"]:
        resets = result.get("reset_us", [])
        first = [f"{length}: {num(run['kiln_host']['prefill_calls'][0] / 1e3)} / "
                 f"{num(median(run['kiln_host']['prefill_calls']) / 1e3, 2)}" for length, run in result["runs"].items()]
        lines.append(
            f"{result['dtype']}: export {result['export_s']:.0f} s ({result['blobs']} blob, {result['pte_bytes'] / 2**20:.0f} MiB),"
            f" torch.compile {result['compile_s']:.0f} s (fullgraph: {'yes' if result['compile_fullgraph'] else 'no'},"
            f" CUDA graphs skipped: {result.get('cudagraph_skips', 0)});"
            f" weights read per step {result['weight_bytes'] / 2**20:.0f} MiB, whole KV cache"
            f" {result['cache_bytes'] / 2**20:.1f} MiB; state reset by reloading forward, {median(resets) / 1e3:.0f} ms"
            f" (median of {len(resets)}); the same prompt after a reset gives the same tokens:"
            f" {'yes' if result['reset_repeats_tokens'] else 'NO'}; Kiln's first prefill call after the reset"
            f" and the median one (ms, host I/O), by prompt: {', '.join(first)}.{capi_tokens(result)}")
    return "\n".join(lines) + "\n"


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--dtype", default="float16,bfloat16", help="comma-separated: float16, bfloat16, float32")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--cache", type=int, default=1152, help="static cache slots (the longest prompt + --steps)")
    parser.add_argument("--prompts", default="128,1024", help="comma-separated prompt lengths")
    parser.add_argument("--steps", type=int, default=64, help="new tokens per run (the decode steps and the first)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eager-token-prefill-max", type=int, default=128,
                        help="also time eager's prefill token by token for prompts up to this length")
    parser.add_argument("--compile-prefill", action="store_true",
                        help="also time torch.compile's prefill in one call (a compilation per prompt length)")
    parser.add_argument("--dynamic-prefill", action="store_true",
                        help="export the sequence dimension as Dim(1..cache) and prefill in calls of --prefill-chunk")
    parser.add_argument("--prefill-chunk", type=int, default=1024)
    parser.add_argument("--profile-reps", type=int, default=20, help="kiln profile repetitions per op (0: no profile)")
    parser.add_argument("--quick", action="store_true", help="fp16 only, prompt 128, 16 steps, profile of 5 reps")
    parser.add_argument("--keep", action="store_true", help="keep the exported .pte in the work folder")
    parser.add_argument("--workdir", default=os.environ.get("TMPDIR", "/tmp"))
    parser.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    args = parser.parse_args(argv)
    if args.quick:
        args.dtype, args.prompts, args.steps, args.profile_reps = "float16", "128", 16, 5
    args.dtypes = [getattr(torch, d) for d in args.dtype.split(",")]
    args.prompts = [int(p) for p in args.prompts.split(",")]
    if max(args.prompts) + args.steps > args.cache:
        parser.error(f"a prompt of {max(args.prompts)} and {args.steps} steps need more than the {args.cache} cache slots")
    return args


def main(argv=None):
    args = parse(argv)
    os.makedirs(args.out, exist_ok=True)
    lib = load_library()
    started = time.perf_counter()
    log = lambda text: print(f"[{time.perf_counter() - started:5.0f} s] {text}", flush=True)
    libraries = mapped_libraries()  # the C API's libkiln.so and the delegate the Module path runs
    log(f"libraries: {libraries}")
    device = torch.cuda.get_device_name(0)
    rate = bench.copy_rate()
    log(f"copy rate {rate / 1e12:.2f} TB/s on {device}")
    settings = {k: v for k, v in vars(args).items() if k not in ("dtypes", "out", "workdir")}
    report = {"device": device, "date": args.date, "copy_rate": rate, "settings": settings, "libraries": libraries,
              "results": []}
    stem = os.path.join(args.out, f"generate_{args.date}_h200")
    for dtype in args.dtypes:
        result = run_dtype(lib, args, dtype, rate, args.workdir, log)
        if "profile" in result:
            with open(f"{stem}_profile_{result['dtype']}.txt", "w") as f:
                # kiln profile runs a plan at its upper bounds: a dynamic program's is a full prefill.
                what = (f"a prefill at the sequence bound ({args.cache} tokens)" if args.dynamic_prefill
                        else "the decode step (seq 1)")
                f.write(f"kiln profile of {what}: {args.layers} layers, {result['dtype']}\n")
                f.write(result["profile"])
        report["results"].append(result)
        # Written after every dtype, so a run cut short still leaves its table.
        with open(stem + ".json", "w") as f:
            json.dump(report, f)
        with open(stem + ".md", "w") as f:
            f.write(table(report))
    print(table(report))
    log("done")


if __name__ == "__main__":
    main()
