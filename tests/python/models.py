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
    """Kiln ops split by two ops Kiln lacks (flip, topk): three blobs, two CPU ops between."""

    def __init__(self, width=16):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)
        self.fc3 = nn.Linear(4, 8)

    def forward(self, x):
        h = torch.flip(self.fc1(x).relu(), dims=[-1])
        values, _ = torch.topk(self.fc2(h), 4, dim=-1)
        return self.fc3(values.relu())


class HalfMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(F.gelu(self.norm(self.fc1(x))) * 0.5 + 1)


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
        cpu_ops=("aten.flip", "aten.topk"),
    ),
    ZooModel(
        "half_mlp",
        _seeded(_half(HalfMLP)),
        lambda: (_randn(4, 16, dtype=torch.float16),),
        F16_TOLERANCE,
    ),
]

BY_NAME = {model.name: model for model in ZOO}
