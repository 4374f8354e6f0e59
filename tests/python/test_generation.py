"""Greedy generation with a static KV cache held by the Kiln blob, through ExecuTorch's runtime on
the CPU reference engine: tokens equal eager's, the cache stays in the engine across calls, and
a write past the cache end is refused without harming the program. The engine's logits along
eager's token sequence stay within each dtype's tolerance of eager's for 64 steps."""

import os
import warnings

import pytest
import torch
from torch.export.graph_signature import InputKind

import decoders
import kiln
from kiln import _lib

NEW_TOKENS = 64


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = decoders.llama()
    path = str(tmp_path_factory.mktemp("generation") / "llama.pte")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = kiln.export(decoders.greedy_step(model), decoders.example_inputs(), path, strict=True,
                              require_whole=True)
    return model, path, program


@pytest.fixture()
def method(exported, monkeypatch):
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    monkeypatch.setenv("KILN_DEVICE", "cpu")
    program = Runtime.get().load_program(exported[1])
    method = program.load_method("forward")
    method.program = program  # a Method does not keep its Program alive
    return method


def _step(method):
    return lambda ids, position: method.execute([ids, position])[0]


def _eager(model, prompt, new_tokens):
    with torch.no_grad():
        return decoders.generate(decoders.greedy_step(model), prompt, new_tokens)


def test_the_decoder_is_one_blob_holding_its_cache(exported):
    _, _, program = exported
    assert program.kiln_report.whole and len(kiln.blobs(program)) == 1
    signature = program.exported_program().graph_signature
    # The caches and their lengths are the blob's own: ExecuTorch keeps no buffer and writes none.
    assert not signature.buffers_to_mutate
    assert [spec.kind for spec in signature.input_specs] == [InputKind.USER_INPUT, InputKind.USER_INPUT]


def test_default_export_arguments_give_the_same_single_blob(exported, tmp_path):
    # Non-strict export lifts the cache layers' tensors as constants, whose writes lowering
    # cannot functionalize; kiln.export then exports strictly, where they are buffers.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = kiln.export(decoders.greedy_step(exported[0]), decoders.example_inputs(),
                              str(tmp_path / "default.pte"), require_whole=True)
    assert len(kiln.blobs(program)) == 1
    assert not program.exported_program().graph_signature.buffers_to_mutate


@pytest.mark.parametrize("program", ["exported", "exported_dynamic"])
def test_each_layer_projects_q_k_and_v_in_one_gemm(program, request):
    """q, k and v read the normalized input once: one LINEAR over their stacked weights per
    layer, its columns read in place (views in the decode step; in the dynamic program, whose
    sequence may be longer, by the rotary and head split groups), instead of three."""
    from test_dynamic_shapes import KILN_CLI
    import re
    import subprocess

    model, path, _ = request.getfixturevalue(program)
    config = model.config
    head = config.hidden_size // config.num_attention_heads
    qkv = (config.num_attention_heads + 2 * config.num_key_value_heads) * head
    out = subprocess.run([KILN_CLI, "inspect", path], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    weights = re.findall(r"op \d+: linear\(t\d+ \[[\d, ]+\], t\d+ \[(\d+), (\d+)\]", out.stdout)
    assert weights, out.stdout  # the filter found the plan's GEMMs
    shapes = [(int(n), int(k)) for n, k in weights]
    assert shapes.count((qkv, config.hidden_size)) == config.num_hidden_layers, shapes
    kv = config.num_key_value_heads * head
    assert (kv, config.hidden_size) not in shapes, shapes
    # per layer q/k/v, o, SwiGLU's gate and up, down; then the LM head
    assert len(shapes) == 4 * config.num_hidden_layers + 1, shapes


@pytest.mark.parametrize("length", [1, 7])
def test_generation_equals_eager(exported, method, length):
    model = exported[0]
    prompt = decoders.prompt_of(length)
    expected = _eager(model, prompt, NEW_TOKENS)
    assert decoders.generate(_step(method), prompt, NEW_TOKENS) == expected
    assert len(set(expected)) > 4  # the weights are not degenerate: the text moves


def test_a_prompt_filling_the_cache_then_a_step_past_its_end(exported, method):
    model = exported[0]
    prompt = decoders.prompt_of(decoders.CACHE)
    assert decoders.generate(_step(method), prompt, 1) == _eager(model, prompt, 1)
    with pytest.raises(RuntimeError):
        method.execute([torch.tensor([[5]]), torch.tensor([decoders.CACHE])])


def test_a_refused_step_writes_nothing_and_the_program_stays_usable(exported, method):
    model = exported[0]
    prompt = decoders.prompt_of(7)
    expected = _eager(model, prompt, 8)
    run = _step(method)
    refused = []

    def step_with_a_bad_call(ids, position):
        if int(position[0]) == len(prompt) + 2:  # mid-generation, a position past the cache end
            with pytest.raises(RuntimeError):
                run(ids, torch.tensor([decoders.CACHE + 3]))
            refused.append(True)
        return run(ids, position)

    assert decoders.generate(step_with_a_bad_call, prompt, 8) == expected
    assert refused


def _engine_step(engine):
    def step(ids, position):
        out = torch.zeros(1, dtype=torch.long)
        engine.execute([ids.contiguous(), position.contiguous()], [out])
        return out

    return step


def test_the_engine_names_the_position_and_the_cache_length(exported):
    engine = _lib.Engine(kiln.blobs(exported[2])[0], device="cpu")
    with pytest.raises(_lib.KilnError) as caught:
        _engine_step(engine)(torch.tensor([[5]]), torch.tensor([decoders.CACHE]))
    assert f"position {decoders.CACHE} " in caught.value.message
    assert f"outside the {decoders.CACHE} slots" in caught.value.message
    assert "nothing was written" in caught.value.message


def test_state_persists_across_calls_and_reset_restores_it(exported):
    blob = kiln.blobs(exported[2])[0]
    prompt = decoders.prompt_of(7)
    last = (torch.tensor([[prompt[-1]]]), torch.tensor([len(prompt) - 1]))
    fresh = int(_engine_step(_lib.Engine(blob, device="cpu"))(*last)[0])
    engine = _lib.Engine(blob, device="cpu")
    step = _engine_step(engine)
    for position, token in enumerate(prompt):
        after_prompt = int(step(torch.tensor([[token]]), torch.tensor([position]))[0])
    # The earlier calls' keys and values are in the cache: the same last call gives another token.
    assert after_prompt != fresh
    assert after_prompt == decoders.generate(_engine_step(_lib.Engine(blob, device="cpu")), prompt, 1)[0]
    engine.reset_state()
    assert int(step(*last)[0]) == fresh


def test_the_cpp_runner_generates_the_same_tokens(exported, tmp_path):
    from test_executorch_e2e import PACKAGE_DIR, ROOT, configure_and_build, run

    build = str(tmp_path / "generate")
    configure_and_build(os.path.join(ROOT, "examples", "generate"), build, os.path.join(PACKAGE_DIR, "cmake"))
    prompt = decoders.prompt_of(7)
    result = run([os.path.join(build, "generate"), exported[1], "--prompt", ",".join(map(str, prompt)),
                  "--tokens", str(NEW_TOKENS), "--device", "cpu"])
    assert result.returncode == 0, result.stderr[-2000:]
    lines = dict(line.split(":", 1) for line in result.stdout.splitlines() if ":" in line)
    assert [int(t) for t in lines["tokens"].split()] == _eager(exported[0], prompt, NEW_TOKENS)
    assert "tokens/s" in lines["prefill"] and "tokens/s" in lines["decode"]


# ---------------------------------------------------------------- one program, any prompt length

@pytest.fixture(scope="module")
def exported_dynamic(tmp_path_factory):
    """The same decoder exported with a dynamic sequence dim (1 to the cache length): one program
    prefills a whole prompt in one call, then decodes one token per call."""
    model = decoders.llama()
    path = str(tmp_path_factory.mktemp("dynamic_generation") / "llama_dynamic.pte")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = kiln.export(decoders.greedy_step(model), decoders.prefill_inputs(), path, strict=True,
                              dynamic_shapes=decoders.DYNAMIC_SHAPES, require_whole=True)
    return model, path, program


def test_the_dynamic_decoder_is_one_whole_blob_with_the_sequence_symbol(exported_dynamic, exported):
    from test_dynamic_shapes import KILN_CLI
    import subprocess

    program = exported_dynamic[2]
    report = program.kiln_report
    assert len(kiln.blobs(program)) == 1 and report.whole and report.ops_outside == 0, report
    with _lib.Engine(kiln.blobs(program)[0], device="cpu") as engine:  # the cache writes' positions too
        inputs = sorted(name for name, kind, _, _ in engine.bindings() if kind == _lib.IO_INPUT)
    assert len(inputs) == 2 and "cache_position" in inputs[0] and "input_ids" in inputs[1], inputs
    out = subprocess.run([KILN_CLI, "inspect", exported_dynamic[1]], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f": 1..{decoders.CACHE} (dims shown at the upper bound)" in out.stdout
    # Its pointwise ops and views are fused into groups as the static program's are (the rotary
    # embeddings of q and k, the rotary table): about as many ops as the static program, not the
    # third more it had when a dynamic plan took no groups.
    groups = [line for line in out.stdout.splitlines() if ": fused(" in line and "; group [" in line]
    assert len(groups) >= 2 * 2 + 1, out.stdout[-3000:]
    static_ops = exported[2].kiln_report.kiln_ops
    assert report.kiln_ops <= static_ops + 4, (report.kiln_ops, static_ops)


@pytest.mark.parametrize("length", [1, 7, decoders.CACHE - 16])
def test_prefill_of_the_whole_prompt_then_decode_equals_eager(exported_dynamic, length, monkeypatch):
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    monkeypatch.setenv("KILN_DEVICE", "cpu")
    model, path, _ = exported_dynamic
    program = Runtime.get().load_program(path)
    method = program.load_method("forward")
    prompt = decoders.prompt_of(length)
    expected = _eager(model, prompt, 16)
    assert decoders.prefill_generate(_step(method), prompt, 16) == expected
    with pytest.raises(RuntimeError):  # past the bound: ExecuTorch refuses it before Kiln sees it
        method.execute([torch.zeros(1, decoders.CACHE + 1, dtype=torch.long), torch.arange(decoders.CACHE + 1)])


def test_the_dynamic_engine_prefills_the_whole_cache_and_refuses_one_more(exported_dynamic):
    model, _, program = exported_dynamic
    engine = _lib.Engine(kiln.blobs(program)[0], device="cpu")
    names = [name for name, kind, _, _ in engine.bindings() if kind == _lib.IO_INPUT]

    def step(ids, position):
        feeds = {"input_ids": ids, "cache_position": position}
        out = torch.zeros(1, dtype=torch.long)
        engine.execute([next(t for key, t in feeds.items() if key in name) for name in names], [out])
        return out

    prompt = decoders.prompt_of(decoders.CACHE)
    assert decoders.prefill_generate(step, prompt, 1) == _eager(model, prompt, 1)
    engine.reset_state()
    with pytest.raises(_lib.KilnError) as refused:
        step(torch.zeros(1, decoders.CACHE + 1, dtype=torch.long), torch.arange(decoders.CACHE + 1))
    assert f"is {decoders.CACHE + 1}, above its bound {decoders.CACHE}" in refused.value.message
    short = decoders.prompt_of(7)
    assert decoders.prefill_generate(step, short, 8) == _eager(model, short, 8)


def test_the_cpp_runner_prefills_the_whole_prompt_in_one_call(exported_dynamic, tmp_path):
    from test_executorch_e2e import PACKAGE_DIR, ROOT, configure_and_build, run

    build = str(tmp_path / "generate")
    configure_and_build(os.path.join(ROOT, "examples", "generate"), build, os.path.join(PACKAGE_DIR, "cmake"))
    prompt = decoders.prompt_of(7)
    result = run([os.path.join(build, "generate"), exported_dynamic[1], "--prompt", ",".join(map(str, prompt)),
                  "--tokens", "16", "--device", "cpu", "--prefill", "whole"])
    assert result.returncode == 0, result.stderr[-2000:]
    lines = dict(line.split(":", 1) for line in result.stdout.splitlines() if ":" in line)
    assert [int(t) for t in lines["tokens"].split()] == _eager(exported_dynamic[0], prompt, 16)
    # the static program cannot take the prompt in one call: refused, not a wrong answer
    static = str(tmp_path / "static.pte")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kiln.export(decoders.greedy_step(exported_dynamic[0]), decoders.example_inputs(), static, strict=True)
    refused = run([os.path.join(build, "generate"), static, "--prompt", ",".join(map(str, prompt)),
                   "--tokens", "4", "--device", "cpu", "--prefill", "whole"])
    assert refused.returncode == 3 and "in one call failed" in refused.stderr, refused.stderr[-2000:]


@pytest.mark.parametrize("name", sorted(decoders.FAMILIES))
def test_other_decoder_families_prefill_and_decode_equal_to_eager(name, tmp_path, monkeypatch):
    """Families nobody tuned for, exported as a user would (strict, dynamic sequence): one whole
    blob whose prefill-then-decode tokens equal eager's."""
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    model = decoders.family(name)
    path = str(tmp_path / f"{name}.pte")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kiln.export(decoders.greedy_step(model), decoders.prefill_inputs(), path, strict=True,
                    dynamic_shapes=decoders.DYNAMIC_SHAPES, require_whole=True)
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    method = Runtime.get().load_program(path).load_method("forward")
    prompt = decoders.prompt_of(7)
    expected = _eager(model, prompt, 16)
    assert len(set(expected)) > 1, f"{name}: eager repeats one token, which any result would match"
    assert decoders.prefill_generate(_step(method), prompt, 16) == expected


def test_an_encoder_decoder_generates_with_its_decoder_cache_in_the_blob(tmp_path, monkeypatch):
    """BART through transformers' seq2seq recipe: the encoder one program, the decoder step another
    whose self-attention cache is its blob's state (the encoder's states an input); each one whole
    blob, and greedy tokens through both equal eager's."""
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    model = decoders.bart()
    encoder, step = decoders.seq2seq_programs(model)
    source = decoders.source_of()
    with torch.no_grad():
        states = encoder(source)
    paths = [str(tmp_path / "encoder.pte"), str(tmp_path / "decoder.pte")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        programs = [kiln.export(encoder, (source,), paths[0], strict=True, require_whole=True),
                    kiln.export(step, (torch.tensor([[2]]), states, torch.tensor([0])), paths[1], strict=True,
                                require_whole=True)]
    assert [len(kiln.blobs(program)) for program in programs] == [1, 1]
    assert not programs[1].exported_program().graph_signature.buffers_to_mutate
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    loaded = [Runtime.get().load_program(path) for path in paths]  # a Method does not keep them alive
    encode, decode = (program.load_method("forward") for program in loaded)
    with torch.no_grad():
        expected = decoders.seq2seq_generate(encoder, decoders.seq2seq_programs(model)[1], source, 24)
    assert len(set(expected)) > 4, expected  # the weights are not degenerate: the text moves
    with torch.no_grad():  # and it follows the source
        assert decoders.seq2seq_generate(encoder, decoders.seq2seq_programs(model)[1], decoders.source_of(5),
                                         24) != expected
    got = decoders.seq2seq_generate(lambda ids: encode.execute([ids])[0],
                                    lambda ids, states, position: decode.execute([ids, states, position])[0],
                                    source, 24)
    assert got == expected


# ---------------------------------------------------------------- logits against eager's

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
def test_logits_teacher_forced_on_eager_tokens_are_within_tolerance(dtype):
    """The CPU engine's logits along eager's greedy sequence, for 64 steps, within the dtype's
    tolerance of eager's on the CPU; its own greedy tokens equal eager's for 32 steps and differ
    after only at a near tie of eager's. tests/gpu runs the same on the CUDA engine."""
    model = decoders.llama(dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = kiln.to_executorch(decoders.logits_step(model), decoders.example_inputs(), strict=True,
                                     require_whole=True)
    (blob,) = kiln.blobs(program)
    prompt, tolerance = decoders.prompt_of(7), decoders.LOGITS_TOLERANCE[dtype]
    with torch.no_grad():
        eager_tokens, eager = decoders.greedy_logits(decoders.logits_step(model), prompt, NEW_TOKENS)
    assert len(set(eager_tokens)) > 4  # the text moves: the cache matters
    with _lib.Engine(blob, device="cpu") as engine:
        step = decoders.engine_step(engine)
        argmax, logits = decoders.greedy_logits(step, prompt, NEW_TOKENS, tokens=eager_tokens)
        engine.reset_state()
        tokens, _ = decoders.greedy_logits(step, prompt, NEW_TOKENS)
        engine.reset_state()

        def one_wrong_token(ids, position):  # a cache holding another token at position 3
            return step(ids + 1 if int(position[0]) == 3 else ids, position)

        _, wrong = decoders.greedy_logits(one_wrong_token, prompt, NEW_TOKENS, tokens=eager_tokens)
    errors = ((logits - eager).norm(dim=1) / eager.norm(dim=1))
    print(f"{dtype}: relative error max {float(errors.max()):.2e}, median {float(errors.median()):.2e}; "
          f"argmax differs at {[i for i, (a, b) in enumerate(zip(argmax, eager_tokens)) if a != b]}")
    assert logits.shape == (NEW_TOKENS, model.config.vocab_size)
    assert not decoders.logits_problems(logits, eager, tolerance, argmax)
    assert not decoders.divergence_problems(tokens, eager_tokens, eager, 32, tolerance)
    # The tolerance tells a wrong cache apart at every step.
    assert len(decoders.logits_problems(wrong, eager, tolerance)) >= NEW_TOKENS


def test_the_logits_checks_flag_what_rounding_cannot_explain():
    tolerance = 1e-2
    want = torch.tensor([[1.0, 0.999, 0.0], [1.0, 0.5, 0.0]])  # a near tie, then a clear winner
    assert not decoders.logits_problems(want, want, tolerance)
    assert not decoders.logits_problems(want, want, tolerance, got_argmax=[1, 0])  # flips at the tie
    problems = decoders.logits_problems(want, want, tolerance, got_argmax=[0, 1])
    assert len(problems) == 1 and problems[0].startswith("step 1: argmax 1 against eager's 0"), problems
    problems = decoders.logits_problems(want + torch.tensor([0.0, 0.0, 0.02]), want, tolerance)
    assert [p.split(":")[0] for p in problems] == ["step 0", "step 1"] and "relative error" in problems[0], problems
    # Free-running tokens: equal for the first equal_steps, then different only at a near tie.
    assert not decoders.divergence_problems([0, 1], [0, 0], want[[1, 0]], 1, tolerance)
    assert "within the first 1" in decoders.divergence_problems([1, 1], [0, 0], want[[1, 0]], 1, tolerance)[0]
    assert "no near tie" in decoders.divergence_problems([0, 1], [0, 0], want[[0, 1]], 1, tolerance)[0]
    assert decoders.divergence_problems([0], [0, 0], want, 1, tolerance)


def test_the_cuda_counters_binding_mirrors_the_header_and_refuses_a_cpu_engine(exported):
    """tests/gpu counts the bytes the CUDA engine copies to the host through Engine.cuda_stats: its
    fields are kiln_cuda_stats' in order, and an engine of the CPU asking for them is refused."""
    import re

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "src", "cuda", "cuda_backend.h")) as f:
        header = f.read()
    body = re.search(r"typedef struct kiln_cuda_stats \{(.*?)\} kiln_cuda_stats;", header, re.S).group(1)
    fields = re.findall(r"^\s*uint64_t (\w+);", body, re.M)
    assert len(fields) == body.count(";") > 10, body
    assert tuple(fields) == _lib.CUDA_STATS_FIELDS
    with _lib.Engine(kiln.blobs(exported[2])[0], device="cpu") as engine:
        with pytest.raises(_lib.KilnError) as refused:
            engine.cuda_stats()
    if hasattr(_lib.lib, "kiln_cuda_engine_stats"):  # a library with the CUDA engine: the C refusal
        assert "the engine does not run on CUDA" in refused.value.message
    else:
        assert "exports no kiln_cuda_engine_stats" in refused.value.message


def test_heads_of_64_write_attention_heads_last_and_generate_as_the_unfused_program():
    """With heads of 64 in f16 (as bf16, the flash kernel's), each SDPA of the dynamic decoder takes
    the permute after it and writes [B,L,H,E] itself (iattr2 2); prefill then decode on the CPU
    engine give the tokens of the same program built without fusion."""
    from test_dynamic_shapes import KILN_CLI
    from zoo_models import _decoder_sizes
    import re
    import subprocess
    import transformers

    torch.manual_seed(0)
    sizes = dict(_decoder_sizes(), max_position_embeddings=decoders.CACHE, hidden_size=128,
                 num_attention_heads=2, num_key_value_heads=1)
    config = transformers.LlamaConfig(**sizes)
    model = transformers.LlamaForCausalLM(config).to(torch.float16).eval()
    model.generation_config.cache_implementation = "static"
    blobs = {}
    for fuse in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = kiln.to_executorch(decoders.greedy_step(model), decoders.prefill_inputs(),
                                         dynamic_shapes=decoders.DYNAMIC_SHAPES, strict=True,
                                         require_whole=True, fuse=fuse)
        (blobs[fuse],) = kiln.blobs(program)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"heads_last_{os.getpid()}.kiln")
    with open(path, "wb") as f:
        f.write(blobs[True])
    try:
        out = subprocess.run([KILN_CLI, "inspect", path], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(path)
    assert out.returncode == 0, out.stderr
    sdpas = re.findall(r": sdpa\(.*-> (t\d+) \[([\d, ]+)\]; iattr \[([-\d, ]+)\]", out.stdout)
    assert len(sdpas) == config.num_hidden_layers, out.stdout[-3000:]
    for result, dims, attrs in sdpas:
        assert attrs.split(", ")[2] == "2" and dims.split(", ")[2:] == ["2", "64"], (dims, attrs)
        assert f": permute({result} " not in out.stdout, result  # the head merge is the SDPA's
    tokens = {}
    for fuse, blob in blobs.items():
        with _lib.Engine(blob, device="cpu") as engine:
            step = decoders.engine_step(engine, "cpu")
            tokens[fuse] = [decoders.prefill_generate(step, decoders.prompt_of(length), 8)
                            for length in (1, 7)]
    assert tokens[True] == tokens[False]
    assert len(set(tokens[True][1])) > 1, tokens  # the model does not repeat one token

