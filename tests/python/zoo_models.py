"""Real architectures for the tests, built from transformers configs small enough for CI.

Each entry builds the model from a config with seeded random weights in eval mode (nothing is
downloaded) and wraps it so forward takes tensors (input_ids, and attention_mask where the
architecture reads one) and returns one tensor. inputs(seed) gives example inputs; two seeds
give two different batches, which the tests use to check that the weights are not degenerate.
"""

from dataclasses import dataclass
from typing import Callable, Tuple

import torch
import torch.nn as nn
import transformers

BATCH = 2
SEQUENCE = 16
VOCAB = 256
WIDTH = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2  # grouped-query attention: two query heads share each key/value head
FEED_FORWARD = 128
POSITIONS = 32
PADDING = 4  # the second row of a masked batch ends in this many padding tokens


@dataclass(frozen=True)
class RealModel:
    name: str
    make: Callable[[], nn.Module]
    inputs: Callable[[int], Tuple[torch.Tensor, ...]]


class LogitsOf(nn.Module):
    """A causal LM called on input_ids alone, returning its logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


class HiddenStatesOf(nn.Module):
    """An encoder called on input_ids and attention_mask, returning its last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class ImageFeaturesOf(nn.Module):
    """A vision encoder called on pixel_values, returning its last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).last_hidden_state


class AudioFeaturesOf(nn.Module):
    """A speech encoder called on a raw waveform, returning its last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_values):
        return self.model(input_values=input_values).last_hidden_state


def token_ids(seed, batch=BATCH):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, SEQUENCE), generator=generator)


def ids_only(seed):
    return (token_ids(seed),)


def one_row_of_ids(seed):
    # At batch 1 GPT-2's attention leaves unused empty constants, which once made a program that did not load.
    return (token_ids(seed, batch=1),)


def ids_and_mask(seed):
    mask = torch.ones(BATCH, SEQUENCE, dtype=torch.long)
    mask[1, SEQUENCE - PADDING:] = 0
    return token_ids(seed), mask


def image(seed, size=56):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 3, size, size, generator=generator),)


def waveform(seed, samples=800):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(1, samples, generator=generator),)


def _built(model_class, config, wrapper, seed=0):
    def make():
        torch.manual_seed(seed)
        return wrapper(model_class(config)).eval()

    return make


def _decoder_sizes():
    return dict(
        num_hidden_layers=LAYERS, hidden_size=WIDTH, intermediate_size=FEED_FORWARD,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
        max_position_embeddings=POSITIONS, bos_token_id=0, eos_token_id=1, pad_token_id=None,
    )


def gpt2_config():
    return transformers.GPT2Config(n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, n_inner=FEED_FORWARD,
                                   vocab_size=VOCAB, n_positions=POSITIONS, bos_token_id=0, eos_token_id=1)


def bert_config():
    return transformers.BertConfig(num_hidden_layers=LAYERS, hidden_size=WIDTH, intermediate_size=FEED_FORWARD,
                                   num_attention_heads=HEADS, vocab_size=VOCAB, max_position_embeddings=POSITIONS,
                                   pad_token_id=0)


def distilbert_config():
    return transformers.DistilBertConfig(n_layers=LAYERS, dim=WIDTH, hidden_dim=FEED_FORWARD, n_heads=HEADS,
                                         vocab_size=VOCAB, max_position_embeddings=POSITIONS, pad_token_id=0)



def swin_config():
    # 56x56 pixels in 4x4 patches give 14x14 tokens, which the 4x4 windows pad to 16x16; the
    # merged 7x7 pad to 8x8.
    return transformers.SwinConfig(image_size=56, patch_size=4, embed_dim=32, depths=[1, 1], num_heads=[2, 4],
                                   window_size=4)


def wav2vec2_config():
    # The feature encoder's first convolution is group-normalized, as in wav2vec2-base.
    return transformers.Wav2Vec2Config(num_hidden_layers=LAYERS, hidden_size=WIDTH, intermediate_size=FEED_FORWARD,
                                       num_attention_heads=HEADS, conv_dim=(16, 16), conv_stride=(5, 2),
                                       conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                       num_conv_pos_embedding_groups=4)


REAL_ZOO = [
    RealModel("gpt2", _built(transformers.GPT2LMHeadModel, gpt2_config(), LogitsOf), one_row_of_ids),
    RealModel("bert", _built(transformers.BertModel, bert_config(), HiddenStatesOf), ids_and_mask),
    RealModel("distilbert", _built(transformers.DistilBertModel, distilbert_config(), HiddenStatesOf), ids_and_mask),
    RealModel("llama", _built(transformers.LlamaForCausalLM, transformers.LlamaConfig(**_decoder_sizes()), LogitsOf),
              ids_only),
    RealModel("qwen2", _built(transformers.Qwen2ForCausalLM, transformers.Qwen2Config(**_decoder_sizes()), LogitsOf),
              ids_only),
    RealModel("swin", _built(transformers.SwinModel, swin_config(), ImageFeaturesOf), image),
    RealModel("wav2vec2", _built(transformers.Wav2Vec2Model, wav2vec2_config(), AudioFeaturesOf), waveform),
]

REAL_BY_NAME = {model.name: model for model in REAL_ZOO}


class ExportedRealModel:
    """One zoo model exported with kiln.export: the file, the inputs, eager's outputs, the report."""

    def __init__(self, spec, directory):
        import os
        import time
        import warnings

        import kiln

        self.spec = spec
        self.path = os.path.join(str(directory), f"{spec.name}.pte")
        self.input_path = os.path.join(str(directory), f"{spec.name}.in")  # raw bytes, for C++
        self.inputs = spec.inputs(1)
        model = spec.make()
        with torch.no_grad():
            self.expected = model(*self.inputs)
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.program = kiln.export(model, self.inputs, self.path)
        self.export_seconds = time.perf_counter() - start
        self.warnings = [str(w.message) for w in caught if str(w.message).startswith("kiln:")]
        self.report = self.program.kiln_report
        with open(self.input_path, "wb") as f:
            f.write(b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in self.inputs))
