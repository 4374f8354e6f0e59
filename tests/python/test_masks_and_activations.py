"""Models built from comparisons, boolean ops, clamps, the hard activations, constant padding and
group norms run whole on Kiln and match eager: a transformer's padding and causal masks, rotary
tables, the gates of a mobile network, a window pad and a speech encoder's norm; refusals of what
the ops cannot take."""

import os
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
import models
from kiln import _lib, lowering
from test_export import KilnInterpreter, _node, _placeholder, assert_close, cpu_ops, delegated_ops, flat

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN_CLI = os.environ.get("KILN_CLI") or os.path.join(ROOT, "build", "kiln")


class MaskedAttention(nn.Module):
    """Masks as transformers writes them: padding from the ids and the attention mask, causal
    from positions, combined with & and ~, then used by attention and to zero padded rows."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(32, 16)
        self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, ids, attention_mask, positions):
        keep = (ids != 0) & attention_mask.bool()  # [B, L]
        causal = positions[None, :] <= positions[:, None]  # [L, L], on i64
        allowed = causal[None] & keep[:, None, :]
        allowed = allowed | (positions[None, :] == positions[:, None])  # no empty rows
        x = self.emb(ids)
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = (q @ k.transpose(1, 2)).masked_fill(~allowed, float("-inf"))
        out = torch.softmax(scores, -1) @ v
        gate = torch.logical_xor(positions >= 2, positions.eq(5))
        return out * keep[..., None] * gate[None, :, None]


class Rotary(nn.Module):
    """cos and sin of position * frequency, applied as Llama's rotary embedding."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)))

    def forward(self, x, positions):
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * emb.cos() + rotated * emb.sin()


class MobileGates(nn.Module):
    """The activations of MobileNetV3 and friends on linear layers: hardswish, a squeeze and
    excite gate through hardsigmoid, relu6, clamp, and erf, abs, log, minimum and maximum."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(12, 24)
        self.fc2 = nn.Linear(24, 24)
        self.act = nn.Hardswish()
        self.gate = nn.Hardsigmoid()
        self.relu6 = nn.ReLU6()
        self.register_buffer("cap", torch.linspace(0.1, 0.5, 24))
        self.register_buffer("low", -torch.linspace(0.1, 0.5, 24))

    def forward(self, x):
        h = self.act(self.fc1(x) * 3.0)
        h = h * self.gate(self.fc2(h))
        h = self.relu6(h * 4.0) + torch.clamp(h, min=-0.1, max=0.2) + F.hardtanh(h, -0.5, 0.5)
        h = torch.maximum(h, torch.erf(h)) - torch.minimum(h.abs(), self.cap)
        h = torch.clamp(h, self.low, self.cap + 1.0)
        return torch.log(h.abs() + 1.0)


class PadsAndGroupNorms(nn.Module):
    """Constant padding growing and cropping dims with a fill value (Swin pads to its windows),
    and group norms with and without their affine weights (wav2vec2's feature encoder)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.GroupNorm(4, 8)
        nn.init.normal_(self.norm.weight)
        nn.init.normal_(self.norm.bias)
        self.plain = nn.GroupNorm(2, 8, affine=False)

    def forward(self, x):
        h = self.norm(F.pad(x * 2.0, (1, 2, 0, 1), value=0.5))  # [2, 8, 6, 8]
        h = F.pad(h, (-1, 1, 2, -2, 0, 0), value=-3.0) + 1.0  # crops and grows at once
        return self.plain(h.reshape(2, 8, -1) * 1.5)


class SoftplusAndIntegerNeg(nn.Module):
    """Mamba's softplus (through log1p) and T5's relative position buckets (neg of integers)."""

    def forward(self, x, positions):
        relative = positions[None, :] - positions[:, None]
        buckets = -torch.minimum(relative, torch.zeros_like(relative))
        return F.softplus(x * 4.0) + torch.log1p(x.abs()), buckets


class TopK(nn.Module):
    """An MoE router's top-2 of its expert logits, the smallest along another dim, and a top-1."""

    def forward(self, x):
        weights, experts = torch.topk(torch.softmax(x, dim=-1), 2, dim=-1)
        low, where = torch.topk(x, 3, dim=0, largest=False)
        best, at = torch.topk(x * 2.0, 1)
        return weights / weights.sum(-1, keepdim=True), experts, low, where, best, at


def ids_and_mask():
    ids = torch.tensor([[3, 7, 1, 0, 0, 9], [5, 2, 8, 4, 6, 1]])
    mask = torch.tensor([[1, 1, 1, 0, 0, 1], [1, 1, 1, 1, 1, 0]])
    return ids, mask, torch.arange(6)


CASES = [
    ("masked_attention", MaskedAttention, lambda: ids_and_mask(),
     {"aten.ne", "aten.bitwise_and", "aten.le", "aten.bitwise_or", "aten.bitwise_not",
      "aten.logical_xor", "aten.ge", "aten.eq"}),
    ("rotary", Rotary, lambda: (torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(1)),
                                torch.arange(6)),
     {"aten.cos", "aten.sin"}),
    ("mobile_gates", MobileGates,
     lambda: (torch.randn(5, 12, generator=torch.Generator().manual_seed(2)),),
     {"aten.hardswish", "aten.hardsigmoid", "aten.hardtanh", "aten.clamp", "aten.maximum",
      "aten.minimum", "aten.erf", "aten.abs", "aten.log"}),
    ("pads_and_group_norms", PadsAndGroupNorms,
     lambda: (torch.randn(2, 8, 5, 5, generator=torch.Generator().manual_seed(3)) * 3.0 + 1.0,),
     {"aten.constant_pad_nd", "aten.native_group_norm"}),
    ("softplus_and_integer_neg", SoftplusAndIntegerNeg,
     lambda: (torch.randn(3, 10, generator=torch.Generator().manual_seed(4)) * 2.0, torch.arange(6)),
     {"aten.log1p", "aten.neg"}),
    ("topk", TopK, lambda: (torch.randn(5, 8, generator=torch.Generator().manual_seed(5)),), {"aten.topk"}),
]


@pytest.mark.parametrize("name, make, inputs, ops", CASES, ids=[c[0] for c in CASES])
def test_model_runs_whole_on_kiln_and_matches_eager(name, make, inputs, ops, tmp_path):
    model, args = make().eval(), inputs()
    with torch.no_grad():
        expected = flat(model(*args))
    program = kiln.export(model, args, tmp_path / f"{name}.pte")
    (blob,) = kiln.lowered_modules(program)
    assert ops <= delegated_ops(blob), f"left out of Kiln: {ops - delegated_ops(blob)}"
    assert cpu_ops(program) == set(), f"stayed on ExecuTorch: {cpu_ops(program)}"
    interpreter = KilnInterpreter(program)
    with torch.no_grad():
        actual = flat(interpreter.run(*args))
    assert_close(actual, expected, models.F32_TOLERANCE, name)


def test_topk_takes_each_index_once_where_only_minus_infinity_is_left(tmp_path):
    """A row with fewer finite values than k: the rounds after them take -inf elements not taken
    yet (torch leaves the order of ties open, so the test asks distinct indices of the values)."""
    x = torch.full((3, 6), float("-inf"))
    x[0, 4], x[1] = 2.0, torch.arange(6.0)
    x[2, 1], x[2, 5] = 1.0, 1.0
    program = kiln.export(_Top3().eval(), (x,), tmp_path / "top3.pte")
    assert cpu_ops(program) == set()
    values, indices = flat(KilnInterpreter(program).run(x))
    expected, _ = torch.topk(x, 3)
    assert torch.equal(values, expected)
    assert torch.equal(torch.gather(x, 1, indices), values)
    assert all(len(set(row)) == 3 for row in indices.tolist()), indices


def test_topk_refusals_name_their_cause():
    from test_export import _graph_of

    aten = torch.ops.aten
    for args, cause in (((torch.randn(3, 12), 9), "k = 9"), ((torch.arange(6), 2), "torch.int64"),
                        ((torch.tensor(2.5), 1), "0-d")):
        _, node, _, _ = _graph_of(aten.topk.default, args, {})
        reason = lowering.refusal(node)
        assert reason is not None and cause in reason, reason


class _Top3(nn.Module):
    def forward(self, x):
        values, indices = torch.topk(x, 3)
        return values, indices


class _Log1p(nn.Module):
    def forward(self, x):
        return torch.log1p(x)


def test_log1p_keeps_full_precision_near_zero(tmp_path):
    """log(1 + x) rounds 1 + x and loses x's digits near zero; Kiln's log1p must not."""
    x = torch.tensor([1e-10, -3e-9, 2e-7, -5e-6, 1e-4, 0.0, 0.75, -0.5, 1e5])
    model = _Log1p().eval()
    program = kiln.export(model, (x,), tmp_path / "log1p.pte")
    assert cpu_ops(program) == set()
    (actual,) = flat(KilnInterpreter(program).run(x))
    expected = torch.log1p(x.double())
    relative = ((actual.double() - expected).abs() / expected.abs().clamp_min(1e-300))[expected != 0]
    assert relative.max().item() < 1e-6, relative
    assert actual[x == 0].eq(0).all()


def test_hard_activations_fuse_into_one_pointwise_op(tmp_path):
    model = nn.Sequential(nn.Linear(8, 8), nn.Hardswish(), nn.Hardsigmoid(), nn.ReLU6()).eval()
    program = kiln.export(model, (torch.randn(3, 8),), tmp_path / "gates.pte")
    (blob,) = kiln.blobs(program)
    path = tmp_path / "gates.blob"
    path.write_bytes(blob)
    assert os.path.isfile(KILN_CLI), f"{KILN_CLI} is missing: build it with `make build`"
    result = subprocess.run([KILN_CLI, "inspect", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    fused = [line for line in result.stdout.splitlines() if "fused [" in line]
    assert len(fused) == 1, result.stdout
    assert "fused [hardswish -> hardsigmoid -> maximum(in1) -> minimum(in2)]" in fused[0], fused[0]


# ------------------------------------------------------------------ refusals


def test_clamp_without_bounds_is_refused():
    graph = torch.fx.Graph()
    x = _placeholder(graph, "x", torch.randn(2, 3))
    node = _node(graph, torch.ops.aten.clamp.default, (x,), torch.randn(2, 3))
    assert lowering.refusal(node) == "clamp with neither min nor max"


def test_bitwise_on_floats_is_refused_by_the_builder():
    graph = torch.fx.Graph()
    x = _placeholder(graph, "x", torch.randn(2, 3))
    node = _node(graph, torch.ops.aten.bitwise_and.Tensor, (x, x), torch.randn(2, 3))
    assert lowering.refusal(node) == (
        "builder op 0 (bitwise): input 0 is f32 but the op needs bool, i32 or i64; cast it first"
    )


def test_builder_refuses_bad_operators_with_their_message():
    with _lib.Builder() as b:
        x = b.add_input("x", _lib.I64, (3,))
        with pytest.raises(kiln.KilnError) as refused:
            b.add_op("compare", [x, x], [len(_lib.COMPARE)])
        assert refused.value.message == "builder op 0 (compare): attribute iattr0 is 6 but must be 0..5"
        with pytest.raises(kiln.KilnError) as refused:
            b.add_op("logical", [x], [_lib.BOOL_OPS["and"]])
        assert refused.value.message == (
            "builder op 0 (logical): iattr0 0 (0 and, 1 or, 2 xor, 3 not) takes 2 inputs but the "
            "op has 1"
        )
        assert b.get_shape(b.add_op("compare", [x, x], [_lib.COMPARE["ge"]])) == (_lib.BOOL, (3,))
