"""A Llama-family decoder with transformers' static KV cache, exported for greedy generation.

The program takes input_ids [1, 1] and cache_position [1] and returns the argmax of the last
logits [1], so only token ids cross to the host; the cache lives in the program. Prompts are fed
one token per call (the decode step), then each generated token is fed back. Exported with
DYNAMIC_SHAPES instead, one program takes input_ids [1, seq] and cache_position [seq] for any seq
up to the cache length: the whole prompt in one call (prefill), then one token per call.
"""

import torch
import transformers
from transformers.integrations.executorch import (Seq2SeqLMDecoderExportableModuleWithStaticCache,
                                                  Seq2SeqLMEncoderExportableModule, TorchExportableModuleWithStaticCache)

from zoo_models import FEED_FORWARD, HEADS, LAYERS, VOCAB, WIDTH, _decoder_sizes

CACHE = 80  # slots of the static cache: a prompt of up to 17 tokens leaves room for 64 new ones


class GreedyStep(torch.nn.Module):
    """One decode step of a static-cache decoder: the id of the most likely next token."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, input_ids, cache_position):
        logits = self.decoder(input_ids=input_ids, cache_position=cache_position)
        return torch.argmax(logits[:, -1, :], dim=-1)


class LogitsStep(torch.nn.Module):
    """One decode step of a static-cache decoder: the last position's logits [1, vocab], so that an
    engine's numbers can be compared with eager's, not only their argmax."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, input_ids, cache_position):
        return self.decoder(input_ids=input_ids, cache_position=cache_position)[:, -1, :]


def llama(seed=0, dtype=torch.float32):
    """A two-layer Llama (grouped-query attention, rotary embeddings) with seeded random weights."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**dict(_decoder_sizes(), max_position_embeddings=CACHE))
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    model.generation_config.cache_implementation = "static"
    return model


# Other decoder families, each at the zoo's sizes: sliding-window attention (Gemma 3), normalized
# queries and keys (Qwen3, Gemma 3), soft-capped logits and sandwich norms (Gemma 2), a fused qkv
# projection (Phi-3). Gemma's head is untied from its embedding: tied, random weights make every
# step pick one token whatever the input.
_GEMMA = dict(head_dim=16, tie_word_embeddings=False)
FAMILIES = {
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, dict(sliding_window=None)),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(head_dim=16)),
    "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM, _GEMMA),
    "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM, _GEMMA),
    "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM, {}),
}


def family(name, seed=0):
    """A two-layer decoder of FAMILIES[name] with seeded random weights, ready for greedy_step."""
    config_class, model_class, extra = FAMILIES[name]
    torch.manual_seed(seed)
    config = config_class(**dict(_decoder_sizes(), max_position_embeddings=CACHE), **extra)
    model = model_class(config).eval()
    model.generation_config.cache_implementation = "static"
    return model


def greedy_step(model, device="cpu"):
    """A fresh GreedyStep with its own empty cache of CACHE slots."""
    step = GreedyStep(TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=CACHE,
                                                           device=torch.device(device)))
    return step.eval()


def logits_step(model, device="cpu"):
    """A fresh LogitsStep with its own empty cache of CACHE slots."""
    step = LogitsStep(TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=CACHE,
                                                           device=torch.device(device)))
    return step.eval()


def example_inputs(device="cpu"):
    return (torch.tensor([[3]], device=device), torch.tensor([0], device=device))


SEQ = torch.export.Dim("seq", min=1, max=CACHE)
DYNAMIC_SHAPES = ({1: SEQ}, {0: SEQ})


def prefill_inputs(length=5, device="cpu"):
    """Example inputs of a prompt of `length` tokens from position 0, for export with DYNAMIC_SHAPES."""
    return (torch.arange(3, 3 + length, device=device)[None], torch.arange(length, device=device))


def prefill_generate(step, prompt, new_tokens, device="cpu"):
    """Greedy generation through one dynamic step(input_ids, cache_position): the whole prompt in
    one call from position 0, then each new token fed back alone; returns the new token ids."""
    token = int(step(torch.tensor([prompt], device=device), torch.arange(len(prompt), device=device))[0])
    out = [token]
    for position in range(len(prompt), len(prompt) + new_tokens - 1):
        token = int(step(torch.tensor([[token]], device=device), torch.tensor([position], device=device))[0])
        out.append(token)
    return out


def generate(step, prompt, new_tokens, device="cpu"):
    """Greedy generation through step(input_ids, cache_position) -> token id: the prompt token by
    token from position 0, then each new token fed back; returns the new token ids."""
    out = []
    token = None
    for position in range(len(prompt) + new_tokens - 1):
        fed = prompt[position] if position < len(prompt) else token
        token = int(step(torch.tensor([[fed]], device=device), torch.tensor([position], device=device))[0])
        if position >= len(prompt) - 1:
            out.append(token)
    return out


def prompt_of(length, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (length,), generator=generator).tolist()


def engine_step(engine, device="cpu"):
    """step(input_ids, cache_position) -> the output of a loaded blob (_lib.Engine) whose state,
    the cache, persists across calls; inputs are matched to its bindings by name, tensors live on
    device ("cpu" or "cuda")."""
    from kiln import _lib

    inputs = [name for name, kind, _, _ in engine.bindings() if kind == _lib.IO_INPUT]
    (out_dtype, out_shape), = [(dt, shape) for _, kind, dt, shape in engine.bindings() if kind == _lib.IO_OUTPUT]

    def step(ids, pos):
        feeds = {"input_ids": ids.to(device), "cache_position": pos.to(device)}
        ordered = [next(t for key, t in feeds.items() if key in name) for name in inputs]
        out = torch.empty(out_shape, dtype=_lib.torch_dtype(out_dtype), device=device)
        engine.execute(ordered, [out])
        return out

    return step


def greedy_logits(step, prompt, new_tokens, device="cpu", tokens=None):
    """new_tokens steps of step(input_ids, cache_position) -> logits [1, vocab]: the prompt token by
    token from position 0, then after step i its argmax (greedy generation) or, given tokens,
    tokens[i] (teacher forcing: two engines see one sequence and cannot diverge). Returns each
    step's argmax and its logits as float32 [new_tokens, vocab] on the CPU."""
    argmaxes, rows = [], []
    for position in range(len(prompt) + new_tokens - 1):
        if position < len(prompt):
            fed = prompt[position]
        else:
            fed = argmaxes[-1] if tokens is None else tokens[position - len(prompt)]
        logits = step(torch.tensor([[fed]], device=device), torch.tensor([position], device=device))
        if position >= len(prompt) - 1:
            argmaxes.append(int(torch.argmax(logits.reshape(-1))))
            rows.append(logits.detach().reshape(-1).float().cpu())
    return argmaxes, torch.stack(rows)


# Per step, ||logits - eager's|| <= tolerance * ||eager's||. Unit roundoff is 2**-11 (4.9e-4) in
# fp16 and 2**-8 (3.9e-3) in bf16: 1e-2 is 20 units of fp16, 3e-2 about 8 of bf16. The CPU engine
# against eager on the CPU, teacher-forced for 64 steps, measured at most 9e-4 (fp16), 7.4e-3
# (bf16) and 2.5e-7 (f32); one wrong token early in the cache moves eager's own logits by 7.5e-2
# or more at every later step.
LOGITS_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def near_tie(row, tolerance):
    """Whether a row's top-2 margin is within tolerance times its largest magnitude: rounding of
    that order may flip its argmax."""
    top = torch.topk(row, 2).values
    return float(top[0] - top[1]) <= tolerance * float(row.abs().max())


def logits_problems(got, want, tolerance, got_argmax=None):
    """What is wrong with got's logits [steps, vocab] against eager's (want), teacher-forced on one
    sequence: a step whose relative error exceeds tolerance, or whose argmax (got_argmax, else got's
    own) differs from want's away from a near tie of want's. Empty when all is well."""
    problems = []
    got_argmax = got_argmax if got_argmax is not None else torch.argmax(got, dim=1).tolist()
    for i, (g, w) in enumerate(zip(got, want)):
        error = float((g - w).norm() / w.norm())
        if error > tolerance:
            problems.append(f"step {i}: relative error {error:.2e} above {tolerance:.0e}")
        if got_argmax[i] != int(torch.argmax(w)) and not near_tie(w, tolerance):
            problems.append(f"step {i}: argmax {got_argmax[i]} against eager's {int(torch.argmax(w))}, "
                            f"whose top-2 margin is no near tie")
    return problems


def divergence_problems(tokens, want_tokens, want_logits, equal_steps, tolerance):
    """What is wrong with free-running greedy tokens against eager's (want_tokens, whose logits are
    want_logits): a difference within the first equal_steps, or a first difference after them
    away from a near tie of eager's (later tokens follow another text and are not compared)."""
    first = next((i for i, (a, b) in enumerate(zip(tokens, want_tokens)) if a != b), None)
    if first is None:
        return [] if len(tokens) == len(want_tokens) else [f"{len(tokens)} tokens against {len(want_tokens)}"]
    if first < equal_steps:
        return [f"token {first} differs ({tokens[first]} against eager's {want_tokens[first]}), within the "
                f"first {equal_steps}"]
    if not near_tie(want_logits[first], tolerance):
        return [f"token {first} differs ({tokens[first]} against eager's {want_tokens[first]}) where eager's "
                f"top-2 margin is no near tie"]
    return []


# ---------------------------------------------------------------- an encoder-decoder (BART)

SOURCE = 12  # tokens of the encoder's input
TARGET_CACHE = 32  # slots of the decoder's self-attention cache


class Seq2SeqGreedyStep(torch.nn.Module):
    """One decode step of an encoder-decoder with a static self-attention cache: the id of the most
    likely next token given the encoder's states."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, decoder_input_ids, encoder_hidden_states, cache_position):
        logits = self.decoder(decoder_input_ids, encoder_hidden_states, cache_position)
        return torch.argmax(logits[:, -1, :], dim=-1)


def bart(seed=0):
    """A two-layer BART with seeded random weights; its head is untied from the embedding (tied,
    random weights pick one token at every step), and its weights are drawn 5x wider than BART's
    init, or the next token would depend on the last token alone, not on the cache or the source."""
    torch.manual_seed(seed)
    config = transformers.BartConfig(vocab_size=VOCAB, d_model=WIDTH, encoder_layers=LAYERS, decoder_layers=LAYERS,
                                     encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                                     encoder_ffn_dim=FEED_FORWARD, decoder_ffn_dim=FEED_FORWARD,
                                     max_position_embeddings=64, tie_word_embeddings=False, init_std=0.1)
    model = transformers.BartForConditionalGeneration(config).eval()
    model.generation_config.cache_implementation = "static"
    return model


def seq2seq_programs(model):
    """transformers' export recipe for an encoder-decoder: (the encoder, a fresh greedy decoder step)."""
    encoder = Seq2SeqLMEncoderExportableModule(model.get_encoder()).eval()
    decoder = Seq2SeqLMDecoderExportableModuleWithStaticCache(model, max_static_cache_length=TARGET_CACHE,
                                                              batch_size=1)
    return encoder, Seq2SeqGreedyStep(decoder).eval()


def source_of(seed=2):
    return torch.randint(2, VOCAB, (1, SOURCE), generator=torch.Generator().manual_seed(seed))


def seq2seq_generate(encode, step, source, new_tokens, start=2):
    """Greedy generation: the source encoded once, then each token fed back to step from `start`."""
    states = encode(source)
    token, out = start, []
    for position in range(new_tokens):
        token = int(step(torch.tensor([[token]]), states, torch.tensor([position]))[0])
        out.append(token)
    return out
