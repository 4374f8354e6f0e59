"""The model zoo shared by the exporter tests and the end-to-end tests.

Each entry builds a small module in eval mode and its example inputs from fixed seeds, and
states how close Kiln must come to PyTorch eager: max |kiln - eager| <= tolerance * max
|eager| over each output. kiln_blobs is how many Kiln blobs the lowered program holds, and
cpu_ops the edge ops left to ExecuTorch's own kernels between them.
"""

import math
from dataclasses import dataclass
from typing import Callable, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

F32_TOLERANCE = 1e-4
F16_TOLERANCE = 1e-2


@dataclass(frozen=True)
class ZooModel:
    name: str
    make: Callable[[], nn.Module]
    inputs: Callable[[], Tuple[torch.Tensor, ...]]
    tolerance: float
    kiln_blobs: int = 1
    cpu_ops: Tuple[str, ...] = ()


def _seeded(factory, seed=0):
    def make():
        torch.manual_seed(seed)
        return factory().eval()

    return make


def _randn(*shape, seed=1, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(dtype)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 8)
        )

    def forward(self, x):
        return self.net(x)


def _encoder():
    return nn.TransformerEncoderLayer(
        d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, activation="gelu", batch_first=True
    )


class GPTBlock(nn.Module):
    """Pre-norm decoder block: causal self-attention through SDPA, then a tanh-GELU MLP."""

    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):
        batch, time, width = x.shape
        qkv = self.qkv(self.ln1(x)).view(batch, time, 3, self.heads, width // self.heads)
        qkv = qkv.permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, time, width))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class MaskedAttention(nn.Module):
    """Attention written out: matmul, scale, a causal mask buffer, softmax, matmul."""

    def __init__(self, width=16, heads=2, time=6):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.register_buffer("blocked", torch.triu(torch.ones(time, time, dtype=torch.bool), 1))

    def forward(self, x):
        batch, time, width = x.shape

        def heads(t):
            return t.view(batch, time, self.heads, width // self.heads).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(width // self.heads)
        weights = scores.masked_fill(self.blocked, float("-inf")).softmax(-1)
        return (weights @ v).transpose(1, 2).reshape(batch, time, width)


class TokenHead(nn.Module):
    def __init__(self, vocab=50, width=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids):
        return self.head(self.norm(self.embed(ids)))


class ResidualStack(nn.Module):
    """Residual SiLU blocks behind a hand-written RMS norm, then torch's RMSNorm."""

    def __init__(self, width=32, depth=3):
        super().__init__()
        self.gains = nn.ParameterList([nn.Parameter(1 + 0.1 * torch.randn(width)) for _ in range(depth)])
        self.fc1 = nn.ModuleList([nn.Linear(width, 2 * width) for _ in range(depth)])
        self.fc2 = nn.ModuleList([nn.Linear(2 * width, width) for _ in range(depth)])
        self.norm = nn.RMSNorm(width, eps=1e-6)

    def forward(self, x):
        for gain, fc1, fc2 in zip(self.gains, self.fc1, self.fc2):
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gain
            x = x + fc2(F.silu(fc1(h)))
        return self.norm(x)


class NormChain(nn.Module):
    """layer_norm and GELU in turn, then a tail of pointwise ops and a log-softmax."""

    def __init__(self, width=24):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.ln2 = nn.LayerNorm(width, elementwise_affine=False)
        self.ln3 = nn.LayerNorm(width)

    def forward(self, x):
        h = F.gelu(self.ln1(x))
        h = F.gelu(self.ln2(h), approximate="tanh")
        h = self.ln3(h)
        h = torch.sigmoid(h) * torch.tanh(h) + torch.exp(-h * h) / 3.0
        h = torch.sqrt(h * h + 1.0) - 0.5
        return F.log_softmax(h, dim=-1), torch.softmax(h, dim=1)


class OpMix(nn.Module):
    """The data-movement, reduction and selection ops, with an explicit addmm and a cast."""

    def __init__(self, width=8):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width, width))
        self.bias = nn.Parameter(torch.randn(width))
        self.register_buffer("rows", torch.tensor([2, 0, 9], dtype=torch.int64))
        self.register_buffer("keep", torch.rand(10, width) > 0.5)

    def forward(self, x, y):
        h = torch.addmm(self.bias, x, self.weight)  # [4, 8]
        h = torch.cat([h, y.expand(4, 8), h[1:3] * 2.0], dim=0)  # [10, 8]
        h = torch.where(self.keep, h, h * 0.1)
        picked = torch.index_select(h, 0, self.rows)  # [3, 8]
        b = torch.bmm(picked.unsqueeze(0), h.t().unsqueeze(0)).squeeze(0)  # [3, 10]
        rounded = b.to(torch.float16).to(torch.float32)
        stats = torch.stack([rounded.amax(-1), rounded.sum(-1), rounded.mean(-1)], dim=-1)
        return stats, h[3], picked.permute(1, 0)


class Mixed(nn.Module):
    """Kiln ops split by two ops Kiln does not take (atan, and topk of more than 8): three
    blobs, two CPU ops between."""

    def __init__(self, width=16):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)
        self.fc3 = nn.Linear(9, 8)

    def forward(self, x):
        h = torch.atan(self.fc1(x).relu())
        values, _ = torch.topk(self.fc2(h), 9, dim=-1)
        return self.fc3(values.relu())


class HalfMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(F.gelu(self.norm(self.fc1(x))) * 0.5 + 1)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _repeat_kv(x, times):
    batch, heads, time, head = x.shape
    x = x[:, :, None, :, :].expand(batch, heads, times, time, head)
    return x.reshape(batch, heads * times, time, head)


class LlamaBlock(nn.Module):
    """A decoder block as transformers writes Llama's: RMSNorm computed in f32 and cast back,
    rotary embedding by rotate_half, grouped-query attention by expand + reshape of k and v
    (or SDPA's enable_gqa), causal, and a SwiGLU MLP; no biases."""

    def __init__(self, width=64, heads=4, kv_heads=2, hidden=128, enable_gqa=False):
        super().__init__()
        self.heads, self.kv_heads, self.head = heads, kv_heads, width // heads
        self.enable_gqa = enable_gqa
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, kv_heads * self.head, bias=False)
        self.v = nn.Linear(width, kv_heads * self.head, bias=False)
        self.o = nn.Linear(width, width, bias=False)
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)
        self.norm1 = nn.Parameter(1 + 0.1 * torch.randn(width))
        self.norm2 = nn.Parameter(1 + 0.1 * torch.randn(width))

    @staticmethod
    def rms(x, weight):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return weight * h.to(x.dtype)

    def forward(self, x, cos, sin):
        """x [B,T,D]; cos, sin [B,T,head] as transformers passes a layer its position_embeddings."""
        batch, time, _ = x.shape
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        h = self.rms(x, self.norm1)
        q = self.q(h).view(batch, time, -1, self.head).transpose(1, 2)
        k = self.k(h).view(batch, time, -1, self.head).transpose(1, 2)
        v = self.v(h).view(batch, time, -1, self.head).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if self.enable_gqa:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            times = self.heads // self.kv_heads
            a = F.scaled_dot_product_attention(q, _repeat_kv(k, times), _repeat_kv(v, times), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(batch, time, -1))
        h = self.rms(x, self.norm2)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def _rotary(batch, time, head, dtype=torch.float32):
    """Llama's rotary position embeddings for positions 0..time-1: cos and sin [B,T,head]."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head, 2).float() / head))
    angles = torch.outer(torch.arange(time).float(), inv_freq)
    angles = torch.cat((angles, angles), dim=-1).expand(batch, time, head)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _half(factory):
    return lambda: factory().half()


ZOO = [
    ZooModel("mlp", _seeded(MLP), lambda: (_randn(4, 16),), F32_TOLERANCE),
    ZooModel("encoder", _seeded(_encoder), lambda: (_randn(2, 6, 32),), F32_TOLERANCE),
    ZooModel("gpt_block", _seeded(GPTBlock), lambda: (_randn(2, 8, 32),), F32_TOLERANCE),
    ZooModel("masked_attention", _seeded(MaskedAttention), lambda: (_randn(2, 6, 16),), F32_TOLERANCE),
    ZooModel(
        "token_head",
        _seeded(TokenHead),
        lambda: (torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1)),),
        F32_TOLERANCE,
    ),
    ZooModel("residual_stack", _seeded(ResidualStack), lambda: (_randn(3, 32),), F32_TOLERANCE),
    ZooModel("norm_chain", _seeded(NormChain), lambda: (_randn(2, 3, 24),), F32_TOLERANCE),
    ZooModel("op_mix", _seeded(OpMix), lambda: (_randn(4, 8), _randn(1, 8, seed=2)), F32_TOLERANCE),
    ZooModel(
        "mixed",
        _seeded(Mixed),
        lambda: (_randn(5, 16),),
        F32_TOLERANCE,
        kiln_blobs=3,
        cpu_ops=("aten.atan", "aten.topk"),
    ),
    ZooModel(
        "half_mlp",
        _seeded(_half(HalfMLP)),
        lambda: (_randn(4, 16, dtype=torch.float16),),
        F16_TOLERANCE,
    ),
    ZooModel(
        "llama_block", _seeded(LlamaBlock), lambda: (_randn(2, 8, 64), *_rotary(2, 8, 16)), F32_TOLERANCE
    ),
    ZooModel(
        "llama_block_gqa_half",
        _seeded(_half(lambda: LlamaBlock(enable_gqa=True))),
        lambda: (_randn(1, 8, 64, dtype=torch.float16), *_rotary(1, 8, 16, torch.float16)),
        F16_TOLERANCE,
    ),
]

BY_NAME = {model.name: model for model in ZOO}


# ------------------------------------------------------------------ convolutional networks


def _calibrated(factory, shape, seed=0, batches=3):
    """A vision model with random weights whose batch-norm running statistics are those of
    random images (momentum None: the plain average over the batches), so that no layer's
    output collapses to its bias; then in eval mode."""

    def make():
        torch.manual_seed(seed)
        model = factory()
        norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        for norm in norms:
            norm.momentum = None
            norm.reset_running_stats()
        model.train()
        with torch.no_grad():
            for index in range(batches):
                model(_randn(4, *shape, seed=100 + index))
        return model.eval()

    return make


def _torchvision(name):
    def factory():
        import torchvision

        return getattr(torchvision.models, name)(weights=None)

    return factory


class ViTLogits(nn.Module):
    """transformers' ViT image classifier (its patch embedding is a convolution), logits only."""

    def __init__(self, image_size=32, patch_size=8):
        super().__init__()
        from transformers import ViTConfig, ViTForImageClassification

        config = ViTConfig(image_size=image_size, patch_size=patch_size, num_channels=3, hidden_size=64,
                           num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                           num_labels=10, attn_implementation="eager")
        self.vit = ViTForImageClassification(config)

    def forward(self, pixels):
        return self.vit(pixel_values=pixels).logits


def _images(size, batch=2):
    return lambda: (_randn(batch, 3, size, size, seed=7),)


# Each is one Kiln blob holding all compute; inputs small enough for the CPU engine in CI.
CNN_ZOO = [
    ZooModel("resnet18", _calibrated(_torchvision("resnet18"), (3, 64, 64)), _images(64), F32_TOLERANCE),
    ZooModel("resnet50", _calibrated(_torchvision("resnet50"), (3, 32, 32)), _images(32), F32_TOLERANCE),
    ZooModel("mobilenet_v3_small", _calibrated(_torchvision("mobilenet_v3_small"), (3, 64, 64)),
             _images(64), F32_TOLERANCE),
    ZooModel("mobilenet_v3_large", _calibrated(_torchvision("mobilenet_v3_large"), (3, 64, 64)),
             _images(64), F32_TOLERANCE),
    ZooModel("convnext_tiny", _calibrated(_torchvision("convnext_tiny"), (3, 32, 32)), _images(32),
             F32_TOLERANCE),
    ZooModel("vit", _seeded(ViTLogits), _images(32), F32_TOLERANCE),
    # Its dense blocks join up to 33 feature maps in one cat.
    ZooModel("densenet121", _calibrated(_torchvision("densenet121"), (3, 32, 32)), _images(32), F32_TOLERANCE),
]

CNN_BY_NAME = {model.name: model for model in CNN_ZOO}

# The same architectures at 3x224x224 for the GPU (tests/gpu), batch-norm statistics from images
# of that size; ViT with 16x16 patches.
CNN_ZOO_224 = [
    ZooModel(m.name, _calibrated(_torchvision(m.name), (3, 224, 224), batches=1), _images(224), m.tolerance)
    for m in CNN_ZOO if m.name != "vit"
] + [ZooModel("vit", _seeded(lambda: ViTLogits(image_size=224, patch_size=16)), _images(224), F32_TOLERANCE)]
