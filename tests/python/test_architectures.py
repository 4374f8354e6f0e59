"""Breadth: architectures beyond the zoo, each built from its transformers or torchvision config
with seeded random weights (none left constant: zero biases and unit norm weights are varied too),
exported once with kiln.export and run on the CPU reference engine through ExecuTorch's runtime.
Each must be one Kiln blob holding all of its compute and match eager (fp32, 1e-4 of the largest
reference magnitude). No fusion or kernel here was written for them:
they are the models nobody tuned for, kept so that the next one keeps working too.

The zoo (zoo_models.py, models.CNN_ZOO) tests more of each model (the C++ runner, the GPU); these
only export, run and compare."""

import warnings

import pytest
import torch
import torch.nn as nn
import transformers as hf

import kiln
import models
from zoo_models import (FEED_FORWARD, HEADS, LAYERS, VOCAB, WIDTH, HiddenStatesOf, ImageFeaturesOf,
                        LogitsOf, _decoder_sizes, ids_and_mask, ids_only)

TOLERANCE = 1e-4


class MelFeaturesOf(nn.Module):
    """A speech encoder called on log-mel features, returning its last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_features):
        return self.model(input_features=input_features).last_hidden_state


class Seq2SeqLogitsOf(nn.Module):
    """An encoder-decoder called on input_ids and decoder_input_ids, returning its logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, decoder_input_ids):
        return self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits


class ReconstructionOf(ImageFeaturesOf):
    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).reconstruction


def _ids_and_decoder_ids(seed):
    (ids,) = ids_only(seed)
    return ids, ids[:, :8].flip(1)


def _right_padded_ids(seed, pad=1):
    """Token ids with no pad among them but the last 3 of row 1."""
    (ids,) = ids_only(seed)
    ids = torch.where(ids == pad, pad + 1, ids)
    ids[1, -3:] = pad
    return (ids,)


class PooledImageOf(ImageFeaturesOf):
    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).pooler_output


def _seeded(*shape, scale=1.0):
    return lambda seed: (scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed)),)


def _varied(model):
    """Random values for every parameter a fresh model holds constant (zero biases, unit norm
    weights, zero layer-scale, gating or position-bias tables), or the test could not tell a
    dropped bias, scale or table from a kept one."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.is_floating_point() and parameter.numel() > 0 and (parameter == parameter.flatten()[0]).all():
                noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
                parameter.add_(0.1 * noise)
    return model


def _hf(model_class, config, wrapper):
    def make():
        torch.manual_seed(0)
        return _varied(wrapper(model_class(config))).eval()

    return make


def _decoder(model_class, config_class, **extra):
    return _hf(model_class, config_class(**_decoder_sizes(), **extra), LogitsOf), ids_only


def _encoder(model_class, config):
    return _hf(model_class, config, HiddenStatesOf), ids_and_mask


def _torchvision(name, **kwargs):
    import torchvision

    return models._calibrated(lambda: _varied(getattr(torchvision.models, name)(weights=None, **kwargs)),
                             (3, 32, 32)), \
        _seeded(2, 3, 32, 32)


class SegmentationOf(nn.Module):
    """A torchvision segmentation model, returning its per-pixel class scores."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, image):
        return self.model(image)["out"]


def _torchvision_segmentation(name):
    """A torchvision segmentation model (no auxiliary head) on 64 x 64 images."""
    import torchvision

    segmentation = getattr(torchvision.models.segmentation, name)
    return models._calibrated(lambda: _varied(SegmentationOf(segmentation(weights=None, weights_backbone=None,
                                                                          aux_loss=False))), (3, 64, 64)), \
        _seeded(1, 3, 64, 64)


class FlowOf(nn.Module):
    """An optical-flow model called on two frames, returning its last flow estimate."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, image1, image2):
        return self.model(image1, image2, num_flow_updates=2)[-1]


def _raft_small():
    """torchvision's RAFT (small) on two frames of 128 x 128, the least its correlation pyramid takes."""
    import torchvision

    def make():
        torch.manual_seed(0)
        return _varied(FlowOf(torchvision.models.optical_flow.raft_small(weights=None))).eval()

    def inputs(seed):
        return _seeded(1, 3, 128, 128)(seed) + _seeded(1, 3, 128, 128)(seed + 1)

    return make, inputs


def _torchvision_video(name):
    """A torchvision video classifier on 4 frames of 32 x 32."""
    import torchvision

    return models._calibrated(lambda: _varied(getattr(torchvision.models.video, name)(weights=None)),
                             (3, 4, 32, 32)), \
        _seeded(1, 3, 4, 32, 32)


_SIZES = dict(num_hidden_layers=LAYERS, hidden_size=WIDTH, intermediate_size=FEED_FORWARD,
              num_attention_heads=HEADS)


def _batched_experts(model_class, config_class, **extra):
    """A transformers MoE decoder with its batched experts (every expert on every token, weighted
    by the router): its default grouped experts export histc, outside Core ATen."""
    sizes = _decoder_sizes()
    sizes.update({key: extra.pop(key) for key in list(extra) if key in sizes})
    return (_hf(lambda config: model_class._from_config(config, experts_implementation="batched_mm"),
                config_class(**sizes, **extra), LogitsOf), ids_only)

ARCHITECTURES = {
    # decoders: rotary variants (partial, interleaved), parallel attention and MLP, ALiBi,
    # learned positions, soft-capped and normalized queries and keys
    "mistral": _decoder(hf.MistralForCausalLM, hf.MistralConfig, sliding_window=None),
    "phi3": _decoder(hf.Phi3ForCausalLM, hf.Phi3Config),
    "gemma2": _decoder(hf.Gemma2ForCausalLM, hf.Gemma2Config, head_dim=16),
    "qwen3": _decoder(hf.Qwen3ForCausalLM, hf.Qwen3Config, head_dim=16),
    "gpt_neox": (_hf(hf.GPTNeoXForCausalLM, hf.GPTNeoXConfig(**_SIZES, vocab_size=VOCAB), LogitsOf), ids_only),
    "falcon": (_hf(hf.FalconForCausalLM, hf.FalconConfig(num_hidden_layers=LAYERS, hidden_size=WIDTH,
                                                         num_attention_heads=HEADS, vocab_size=VOCAB),
                   LogitsOf), ids_only),
    "bloom": (_hf(hf.BloomForCausalLM, hf.BloomConfig(n_layer=LAYERS, hidden_size=WIDTH, n_head=HEADS,
                                                      vocab_size=VOCAB), LogitsOf), ids_only),
    "gptj": (_hf(hf.GPTJForCausalLM, hf.GPTJConfig(n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB,
                                                   n_positions=64, rotary_dim=8), LogitsOf), ids_only),
    "opt": (_hf(hf.OPTForCausalLM, hf.OPTConfig(num_hidden_layers=LAYERS, hidden_size=WIDTH, ffn_dim=FEED_FORWARD,
                                                num_attention_heads=HEADS, vocab_size=VOCAB,
                                                word_embed_proj_dim=WIDTH), LogitsOf), ids_only),
    # one key/value head for all queries; local layers with a sliding window beside global ones;
    # parallel attention and MLP under a bias-free LayerNorm with scaled logits
    "gpt_bigcode": (_hf(hf.GPTBigCodeForCausalLM, hf.GPTBigCodeConfig(n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS,
                                                                      vocab_size=VOCAB, multi_query=True),
                        LogitsOf), ids_only),
    "gemma3": (_hf(hf.Gemma3ForCausalLM, hf.Gemma3TextConfig(**_decoder_sizes(), head_dim=16, sliding_window=8),
                   LogitsOf), ids_only),
    "cohere": _decoder(hf.CohereForCausalLM, hf.CohereConfig),
    # parallel attention and MLP with partial rotary; normalized queries and keys with squared
    # ReLU; LayerNorm with a weight offset by one
    "phi": _decoder(hf.PhiForCausalLM, hf.PhiConfig),
    "persimmon": _decoder(hf.PersimmonForCausalLM, hf.PersimmonConfig),
    "nemotron": _decoder(hf.NemotronForCausalLM, hf.NemotronConfig, head_dim=16),
    # mixtures of experts, routed by topk; transformers' batched experts (every expert on every
    # token, weighted by the router), as its default grouped ones export an op outside Core ATen
    "mixtral": (_hf(lambda config: hf.MixtralForCausalLM._from_config(config, experts_implementation="batched_mm"),
                    hf.MixtralConfig(**_decoder_sizes(), num_local_experts=4, num_experts_per_tok=2,
                                     sliding_window=None), LogitsOf), ids_only),
    "qwen2_moe": (_hf(lambda config: hf.Qwen2MoeForCausalLM._from_config(config, experts_implementation="batched_mm"),
                      hf.Qwen2MoeConfig(**_decoder_sizes(), num_experts=4, num_experts_per_tok=2,
                                        moe_intermediate_size=32, shared_expert_intermediate_size=64),
                      LogitsOf), ids_only),
    # PhiMoE's sparse mixer: the chosen expert masked out of the router's scores by a scatter
    "phimoe": (_hf(lambda config: hf.PhimoeForCausalLM._from_config(config, experts_implementation="batched_mm"),
                   hf.PhimoeConfig(**_decoder_sizes(), num_local_experts=4, num_experts_per_tok=2), LogitsOf),
               ids_only),
    # recurrences: Mamba 2's chunked state-space scan, RecurrentGemma's gated linear recurrence
    # beside local attention, RWKV's time mixing
    "mamba2": (_hf(hf.Mamba2ForCausalLM, hf.Mamba2Config(num_hidden_layers=LAYERS, hidden_size=WIDTH, num_heads=8,
                                                         head_dim=16, vocab_size=VOCAB, state_size=16, n_groups=1,
                                                         chunk_size=16), LogitsOf), ids_only),
    "recurrent_gemma": (_hf(hf.RecurrentGemmaForCausalLM,
                            hf.RecurrentGemmaConfig(num_hidden_layers=3, hidden_size=WIDTH, intermediate_size=FEED_FORWARD,
                                                    num_attention_heads=HEADS, num_key_value_heads=1, vocab_size=VOCAB,
                                                    lru_width=WIDTH, attention_window_size=16, head_dim=16),
                            LogitsOf), ids_only),
    "rwkv": (_hf(hf.RwkvForCausalLM, hf.RwkvConfig(num_hidden_layers=LAYERS, hidden_size=WIDTH, vocab_size=VOCAB,
                                                   attention_hidden_size=WIDTH, intermediate_size=FEED_FORWARD,
                                                   context_length=64), LogitsOf), ids_only),
    # a state-space model: its selective scan unrolled over the sequence, softplus through log1p
    "mamba": (_hf(hf.MambaForCausalLM, hf.MambaConfig(num_hidden_layers=LAYERS, hidden_size=WIDTH, vocab_size=VOCAB,
                                                       state_size=8, intermediate_size=FEED_FORWARD), LogitsOf),
              ids_only),
    # multi-head latent attention (low-rank queries and keys and values, a rotary part of each
    # head apart) with routing limited to the best expert groups; attention sinks and sliding
    # windows with biased, clamped SwiGLU experts; more routed experts
    "deepseek_v3": _batched_experts(hf.DeepseekV3ForCausalLM, hf.DeepseekV3Config, num_key_value_heads=HEADS,
                                    n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                    first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                                    qk_nope_head_dim=8, v_head_dim=16, n_group=2, topk_group=1),
    "gpt_oss": _batched_experts(hf.GptOssForCausalLM, hf.GptOssConfig, num_local_experts=4,
                                num_experts_per_tok=2, head_dim=16, sliding_window=8),
    "qwen3_moe": _batched_experts(hf.Qwen3MoeForCausalLM, hf.Qwen3MoeConfig, num_experts=4, num_experts_per_tok=2,
                                  moe_intermediate_size=32),
    "olmoe": _batched_experts(hf.OlmoeForCausalLM, hf.OlmoeConfig, num_experts=4, num_experts_per_tok=2),
    "granitemoe": _batched_experts(hf.GraniteMoeForCausalLM, hf.GraniteMoeConfig, num_local_experts=4,
                                   num_experts_per_tok=2),
    # scaled embeddings, residuals and logits; norms after attention and MLP with normalized
    # queries and keys; interleaved partial rotary with extra norms; sliding layers beside global
    # ones without positions; activations quantized to 8 bits and weights to three levels
    "granite": _decoder(hf.GraniteForCausalLM, hf.GraniteConfig),
    "olmo2": _decoder(hf.Olmo2ForCausalLM, hf.Olmo2Config),
    "glm4": _decoder(hf.Glm4ForCausalLM, hf.Glm4Config),
    "exaone4": _decoder(hf.Exaone4ForCausalLM, hf.Exaone4Config, sliding_window=8),
    "cohere2": _decoder(hf.Cohere2ForCausalLM, hf.Cohere2Config, sliding_window=8),
    "bitnet": _decoder(hf.BitNetForCausalLM, hf.BitNetConfig),
    # a state-space model with normed states; rotary on interleaved pairs over part of the head;
    # sinusoidal and learned positions with scaled embeddings
    "falcon_mamba": (_hf(hf.FalconMambaForCausalLM, hf.FalconMambaConfig(num_hidden_layers=LAYERS, hidden_size=WIDTH,
                                                                          vocab_size=VOCAB, state_size=8), LogitsOf),
                     ids_only),
    "codegen": (_hf(hf.CodeGenForCausalLM, hf.CodeGenConfig(n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS,
                                                            vocab_size=VOCAB, rotary_dim=8), LogitsOf), ids_only),
    "xglm": (_hf(hf.XGLMForCausalLM, hf.XGLMConfig(num_layers=LAYERS, d_model=WIDTH, attention_heads=HEADS,
                                                   ffn_dim=FEED_FORWARD, vocab_size=VOCAB), LogitsOf), ids_only),
    "biogpt": (_hf(hf.BioGptForCausalLM, hf.BioGptConfig(**_SIZES, vocab_size=VOCAB), LogitsOf), ids_only),
    # encoder-decoders: cross attention, T5's relative position buckets (integer neg)
    "bart": (_hf(hf.BartForConditionalGeneration,
                 hf.BartConfig(encoder_layers=LAYERS, decoder_layers=LAYERS, d_model=WIDTH, encoder_attention_heads=HEADS,
                               decoder_attention_heads=HEADS, encoder_ffn_dim=FEED_FORWARD,
                               decoder_ffn_dim=FEED_FORWARD, vocab_size=VOCAB, max_position_embeddings=64),
                 Seq2SeqLogitsOf), _ids_and_decoder_ids),
    # mBART's decoder input is its input shifted right around the last token that is not padding:
    # a count of bools
    "mbart": (_hf(hf.MBartForConditionalGeneration,
                  hf.MBartConfig(encoder_layers=LAYERS, decoder_layers=LAYERS, d_model=WIDTH, encoder_attention_heads=HEADS,
                                 decoder_attention_heads=HEADS, encoder_ffn_dim=FEED_FORWARD,
                                 decoder_ffn_dim=FEED_FORWARD, vocab_size=VOCAB, max_position_embeddings=64,
                                 pad_token_id=1),
                  LogitsOf), _right_padded_ids),
    "t5": (_hf(hf.T5ForConditionalGeneration, hf.T5Config(num_layers=LAYERS, d_model=WIDTH, d_ff=FEED_FORWARD,
                                                          num_heads=HEADS, d_kv=16, vocab_size=VOCAB),
               Seq2SeqLogitsOf), _ids_and_decoder_ids),
    # encoders: factorized embeddings, disentangled relative attention, relative position buckets
    "deberta_v2": _encoder(hf.DebertaV2Model, hf.DebertaV2Config(**_SIZES, vocab_size=VOCAB, max_position_embeddings=64,
                                                                  relative_attention=True,
                                                                  pos_att_type=["p2c", "c2p"])),
    "roberta": _encoder(hf.RobertaModel, hf.RobertaConfig(**_SIZES, vocab_size=VOCAB)),
    # a discriminator's embeddings; relative position buckets shared by every layer; rotary
    # positions in an encoder; span-based dynamic convolutions beside attention; grouped 1-d
    # convolutions for every projection; layout boxes embedded beside the tokens
    "electra": _encoder(hf.ElectraModel, hf.ElectraConfig(**_SIZES, vocab_size=VOCAB, embedding_size=WIDTH)),
    "mpnet": _encoder(hf.MPNetModel, hf.MPNetConfig(**_SIZES, vocab_size=VOCAB)),
    "roformer": _encoder(hf.RoFormerModel, hf.RoFormerConfig(**_SIZES, vocab_size=VOCAB)),
    "convbert": _encoder(hf.ConvBertModel, hf.ConvBertConfig(**_SIZES, vocab_size=VOCAB)),
    "squeezebert": _encoder(hf.SqueezeBertModel,
                            hf.SqueezeBertConfig(**_SIZES, vocab_size=VOCAB, embedding_size=WIDTH)),
    "layoutlm": _encoder(hf.LayoutLMModel, hf.LayoutLMConfig(**_SIZES, vocab_size=VOCAB)),
    "albert": _encoder(hf.AlbertModel, hf.AlbertConfig(**_SIZES, vocab_size=VOCAB, embedding_size=32)),
    "mobilebert": _encoder(hf.MobileBertModel, hf.MobileBertConfig(**_SIZES, vocab_size=VOCAB, embedding_size=32,
                                                                    intra_bottleneck_size=32, true_hidden_size=32)),
    "t5_encoder": _encoder(hf.T5EncoderModel, hf.T5Config(num_layers=LAYERS, d_model=WIDTH, d_ff=FEED_FORWARD,
                                                          num_heads=HEADS, d_kv=16, vocab_size=VOCAB)),
    # rotary positions in encoders: local sliding-window layers beside global ones with GeGLU;
    # ESM's token-dropout rescaling
    "modernbert": _encoder(hf.ModernBertModel, hf.ModernBertConfig(hidden_size=WIDTH, intermediate_size=FEED_FORWARD,
                                                                    num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                                                    vocab_size=VOCAB, pad_token_id=0, bos_token_id=1,
                                                                    eos_token_id=2, cls_token_id=1, sep_token_id=2)),
    "esm": _encoder(hf.EsmModel, hf.EsmConfig(**_SIZES, vocab_size=VOCAB, pad_token_id=0,
                                              position_embedding_type="rotary")),
    # relative attention over sinusoidal relative positions with per-head biases (XLNet)
    "xlnet": (_hf(hf.XLNetModel, hf.XLNetConfig(n_layer=LAYERS, d_model=WIDTH, n_head=HEADS, d_inner=FEED_FORWARD,
                                                vocab_size=VOCAB), HiddenStatesOf), ids_and_mask),
    # characters hashed into buckets (remainder by a power of two), downsampled by a convolution
    "canine": _encoder(hf.CanineModel, hf.CanineConfig(**_SIZES, downsampling_rate=4, num_hash_buckets=64)),
    # pooled queries, its relative shift written into slices of a copy (slice_scatter)
    "funnel": _encoder(hf.FunnelBaseModel, hf.FunnelConfig(block_sizes=[1, 1], d_model=WIDTH, n_head=HEADS, d_head=16,
                                                           d_inner=FEED_FORWARD, vocab_size=VOCAB)),
    # vision and speech
    "clip_vision": (_hf(hf.CLIPVisionModel, hf.CLIPVisionConfig(**_SIZES, image_size=32, patch_size=8),
                        PooledImageOf), _seeded(1, 3, 32, 32)),
    # position ids bucketized from a patch mask of static shape: an op outside Core ATen, folded
    "smolvlm_vision": (_hf(hf.SmolVLMVisionTransformer, hf.SmolVLMVisionConfig(**_SIZES, image_size=32, patch_size=8),
                           ImageFeaturesOf), _seeded(1, 3, 32, 32)),
    "whisper_encoder": (_hf(lambda config: hf.WhisperModel(config).encoder,
                            hf.WhisperConfig(encoder_layers=LAYERS, decoder_layers=1, d_model=WIDTH,
                                             encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                                             encoder_ffn_dim=FEED_FORWARD, decoder_ffn_dim=FEED_FORWARD,
                                             num_mel_bins=16, max_source_positions=32, vocab_size=VOCAB,
                                             pad_token_id=0, bos_token_id=0, eos_token_id=1,
                                             decoder_start_token_id=0), MelFeaturesOf), _seeded(1, 16, 64, scale=8.0)),
    "segformer": (_hf(hf.SegformerModel, hf.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                                             hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                                                             patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2]),
                      ImageFeaturesOf), _seeded(1, 3, 32, 32)),
    # a relative position bias table per layer; global response normalization
    "beit": (_hf(hf.BeitModel, hf.BeitConfig(**_SIZES, image_size=32, patch_size=8, use_relative_position_bias=True),
                 ImageFeaturesOf), _seeded(1, 3, 32, 32)),
    "convnextv2": (_hf(hf.ConvNextV2Model, hf.ConvNextV2Config(depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 48, 64]),
                       ImageFeaturesOf), _seeded(1, 3, 64, 64)),
    # video: a tubelet embedding (a 3-d patch convolution), divided space-time attention
    # (its class token repeated over the frames)
    "videomae": (_hf(hf.VideoMAEModel, hf.VideoMAEConfig(**_SIZES, image_size=32, patch_size=8, num_frames=4,
                                                         tubelet_size=2), ImageFeaturesOf), _seeded(1, 4, 3, 32, 32)),
    "timesformer": (_hf(hf.TimesformerModel, hf.TimesformerConfig(**_SIZES, image_size=32, patch_size=8, num_frames=2),
                        ImageFeaturesOf), _seeded(1, 2, 3, 32, 32)),
    # cosine attention under a learned logit scale, its position bias from an MLP over log-spaced
    # offsets; attention biases gathered by index, hardswish; keys from a strided convolution
    "swinv2": (_hf(hf.Swinv2Model, hf.Swinv2Config(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                                   num_heads=[2, 2], window_size=4), ImageFeaturesOf),
               _seeded(1, 3, 32, 32)),
    "levit": (models._calibrated(_hf(hf.LevitModel, hf.LevitConfig(image_size=64, hidden_sizes=[32, 48, 64],
                                                                   num_attention_heads=[1, 2, 2], depths=[1, 1, 1],
                                                                   key_dim=[8, 8, 8]), ImageFeaturesOf),
                                 (3, 64, 64)), _seeded(1, 3, 64, 64)),
    "pvt_v2": (_hf(hf.PvtV2Model, hf.PvtV2Config(depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 48, 64],
                                                 num_attention_heads=[1, 2, 2, 4]), ImageFeaturesOf),
               _seeded(1, 3, 64, 64)),
    # segmentation: dilated convolutions beside a pooled branch, upsampled to the input's size
    "deeplabv3": _torchvision_segmentation("deeplabv3_mobilenet_v3_large"),
    "efficientnet_b0": _torchvision("efficientnet_b0"),
    "shufflenet_v2": _torchvision("shufflenet_v2_x0_5"),
    "squeezenet": _torchvision("squeezenet1_0"),
    # layer scale with interpolated positions; average pooling as the token mixer; a
    # transformer's tokens reassembled into a feature pyramid by transposed convolutions; grouped
    # convolutions with squeeze-and-excitation
    "dinov2": (_hf(hf.Dinov2Model, hf.Dinov2Config(num_hidden_layers=LAYERS, hidden_size=WIDTH,
                                                   num_attention_heads=HEADS, image_size=32, patch_size=8),
                   ImageFeaturesOf), _seeded(1, 3, 32, 32)),
    "poolformer": (_hf(hf.PoolFormerModel, hf.PoolFormerConfig(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1]),
                       ImageFeaturesOf), _seeded(1, 3, 64, 64)),
    "dpt": (_hf(hf.DPTModel, hf.DPTConfig(num_hidden_layers=4, hidden_size=WIDTH, num_attention_heads=HEADS,
                                          intermediate_size=FEED_FORWARD, image_size=32, patch_size=8,
                                          backbone_out_indices=[0, 1, 2, 3]), ImageFeaturesOf),
            _seeded(1, 3, 32, 32)),
    "regnet": (_hf(hf.RegNetModel, hf.RegNetConfig(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], groups_width=8),
                   ImageFeaturesOf), _seeded(1, 3, 64, 64)),
    # a hierarchical vision transformer pooling its queries by a max over each window (max.dim)
    "hiera": (_hf(hf.HieraModel, hf.HieraConfig(embed_dim=16, image_size=[64, 64], patch_size=[7, 7],
                                                patch_stride=[4, 4], patch_padding=[3, 3], depths=[1, 1],
                                                num_heads=[1, 2], query_stride=[2, 2], num_query_pool=1,
                                                masked_unit_size=[4, 4], mask_unit_attention=[True, False]),
                  ImageFeaturesOf), _seeded(1, 3, 64, 64)),
    # super-resolution: a clone of permuted windows (a copy into another dim order), a pixel shuffle
    "swin2sr": (_hf(hf.Swin2SRForImageSuperResolution,
                    hf.Swin2SRConfig(image_size=16, patch_size=1, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                     window_size=4, upscale=2, upsampler="pixelshuffle"), ReconstructionOf),
                _seeded(1, 3, 16, 16)),
    # multi-scale deformable attention: its samples taken by grid_sample
    "deformable_detr": (_hf(hf.DeformableDetrModel, hf.DeformableDetrConfig(
        use_timm_backbone=False, use_pretrained_backbone=False, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=8,
        backbone_config=hf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1],
                                        out_features=["stage2", "stage3", "stage4"])), ImageFeaturesOf),
                        _seeded(1, 3, 128, 128)),
    # 3-d convolutions over frames alone, time alone and both, with batch norms over frames
    "r2plus1d_18": _torchvision_video("r2plus1d_18"),
    # optical flow: instance norms (batch statistics), a correlation volume, grid_sample lookups
    "raft_small": _raft_small(),
}


def _half(entry):
    """An architecture's model in fp16, with its inputs."""
    make, inputs = entry
    return (lambda: make().half()), inputs


# In fp16, T5 clamps its hidden states below infinity where any of them overflowed: isinf and
# any inside every layer.
HALF_ARCHITECTURES = {"t5_encoder": _half(ARCHITECTURES["t5_encoder"])}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES) + [f"{n}_fp16" for n in sorted(HALF_ARCHITECTURES)])
def test_architecture_runs_whole_on_kiln_and_matches_eager(name, tmp_path, monkeypatch):
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    half = name.endswith("_fp16")
    make, inputs = HALF_ARCHITECTURES[name[:-5]] if half else ARCHITECTURES[name]
    model = make()
    args = inputs(1)
    with torch.no_grad():
        expected, other = model(*args).float(), model(*inputs(2)).float()
    # not degenerate: outputs spread and depend on the input, or any result would pass
    spread = expected.std().item()
    assert spread > 1e-3 and (expected - other).abs().max().item() > 0.1 * spread, f"{name}: degenerate"
    path = str(tmp_path / f"{name}.pte")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = kiln.export(model, args, path)
    report = program.kiln_report
    assert report.kiln_blobs == 1 and report.ops_outside == 0, f"{name}: {report}"
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    (actual,) = Runtime.get().load_program(path).load_method("forward").execute(list(args))
    assert actual.shape == expected.shape, f"{name}: {list(actual.shape)}, expected {list(expected.shape)}"
    error = (actual.double() - expected.double()).abs().max().item()
    allowed = (models.F16_TOLERANCE if half else TOLERANCE) * expected.abs().max().item()
    assert error <= allowed, f"{name}: max error {error:.3g}, allowed {allowed:.3g}"
