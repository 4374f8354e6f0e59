"""A Llama-family decoder with transformers' static KV cache, exported for greedy generation.

The program takes input_ids [1, 1] and cache_position [1] and returns the argmax of the last
logits [1], so only token ids cross to the host; the cache lives in the program. Prompts are fed
one token per call (the decode step), then each generated token is fed back. Exported with
DYNAMIC_SHAPES instead, one program takes input_ids [1, seq] and cache_position [seq] for any seq
up to the cache length: the whole prompt in one call (prefill), then one token per call.
"""

import torch
import transformers
from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

from zoo_models import _decoder_sizes

CACHE = 80  # slots of the static cache: a prompt of up to 17 tokens leaves room for 64 new ones


class GreedyStep(torch.nn.Module):
    """One decode step of a static-cache decoder: the id of the most likely next token."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, input_ids, cache_position):
        logits = self.decoder(input_ids=input_ids, cache_position=cache_position)
        return torch.argmax(logits[:, -1, :], dim=-1)


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
