"""Constant folding before partitioning: what depends only on constants and static shapes
(arange, masks and position ids built from it, rotary cos/sin tables, full) becomes a constant,
never a much larger one than what it reads; constants nothing reads are dropped."""

import pytest
import torch
import torch.nn as nn
from executorch.exir import to_edge

import kiln
from kiln import folding

TOLERANCE = 1e-4
SEQUENCE = 16
WIDTH = 16


class MaskAndRotary(nn.Module):
    """A causal mask, position ids and rotary tables built from arange, as transformers writes them."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, WIDTH, 2).float() / WIDTH))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x):
        positions = torch.arange(x.shape[1])
        causal = positions[None, :] <= positions[:, None]
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        table = torch.cat([freqs, freqs], dim=-1)
        bias = torch.full((x.shape[1], WIDTH), 0.25)
        y = self.proj(x) * table.cos() + x * table.sin() + bias
        return y + causal.float()


def edge_ops(graph_module):
    return {str(node.target) for node in graph_module.graph.nodes if node.op == "call_function"}


def test_arange_masks_rotary_tables_and_full_fold_into_one_blob():
    torch.manual_seed(0)
    model, x = MaskAndRotary().eval(), torch.randn(2, SEQUENCE, WIDTH)
    edge, report = kiln.lower(model, (x,))
    assert report.kiln_blobs == 1 and report.ops_outside == 0, str(report)
    (lowered,) = kiln.lowered_modules(edge)
    inside = edge_ops(lowered.original_module)
    folded = [op for op in ("arange", "aten.le", "aten.cos", "aten.sin", "aten.full") if any(op in o for o in inside)]
    assert not folded, f"not folded, computed in the blob: {folded}"
    (actual,) = kiln.run_blob(lowered.processed_bytes, [x])
    with torch.no_grad():
        expected = model(x)
    assert (actual - expected).abs().max().item() <= TOLERANCE * expected.abs().max().item()


class BroadcastWeight(nn.Module):
    """Adds a 256 KiB weight broadcast over 8 rows: folding the broadcast would write 2 MiB."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(256, 256))

    def forward(self, x):
        return x + self.weight.expand(8, 256, 256) * 2.0


def edge_program(model, inputs):
    return to_edge(torch.export.export(model, inputs)).exported_program()


def constant_bytes(program):
    tensors = list(program.constants.values()) + list(program.state_dict.values())
    return max(t.numel() * t.element_size() for t in tensors)


def test_fold_that_would_grow_a_constant_is_refused():
    inputs = (torch.randn(8, 256, 256),)
    program = edge_program(BroadcastWeight().eval(), inputs)
    refused = kiln.fold_constants(program)  # default limit: 1 MiB
    assert list(refused.values()) == [8 * 256 * 256 * 4], refused
    assert constant_bytes(program) == 256 * 256 * 4
    assert any("expand" in op for op in edge_ops(program.graph_module))


def test_the_size_guard_is_what_keeps_the_broadcast():
    inputs = (torch.randn(8, 256, 256),)
    program = edge_program(BroadcastWeight().eval(), inputs)
    assert kiln.fold_constants(program, limit_bytes=4 << 20) == {}
    assert constant_bytes(program) == 8 * 256 * 256 * 4
    small = edge_program(BroadcastWeight().eval(), inputs)
    assert len(kiln.fold_constants(small, limit_bytes=1024)) == 1


def test_fold_that_keeps_the_size_of_what_it_reads_is_allowed_past_the_limit():
    inputs = (torch.randn(256, 256),)
    program = edge_program(TransposedWeight().eval(), inputs)
    assert kiln.fold_constants(program, limit_bytes=1024) == {}
    assert not any("permute" in op or "transpose" in op for op in edge_ops(program.graph_module))


class TransposedWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(256, 256))

    def forward(self, x):
        return x + self.weight.t() * 0.5


class UnusedEmptyConstant(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("unused", torch.empty(0))  # kept by torch.export though nothing reads it

    def forward(self, x):
        return self.fc(x)


def test_unread_constants_are_dropped():
    program = edge_program(UnusedEmptyConstant().eval(), (torch.randn(2, 8),))
    lifted = [s.target for s in program.graph_signature.input_specs if s.kind.name == "BUFFER"]
    assert lifted == ["unused"], program.graph_signature.input_specs
    assert folding.drop_unused_constants(program) == lifted
    assert "unused" not in program.state_dict and "unused" not in program.constants
    assert [n.name for n in program.graph.find_nodes(op="placeholder")] == [
        s.arg.name for s in program.graph_signature.input_specs]
    assert folding.drop_unused_constants(program) == []


@pytest.mark.parametrize("limit", [-1, "1"])
def test_bad_fold_limit_is_refused(limit):
    with pytest.raises((TypeError, ValueError), match="fold_limit_bytes"):
        kiln.lower(UnusedEmptyConstant().eval(), (torch.randn(2, 8),), fold_limit_bytes=limit)


def test_program_whose_weights_all_went_to_kiln_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    model, x = UnusedEmptyConstant().eval(), torch.randn(2, 8)
    path = str(tmp_path / "unused.pte")
    kiln.export(model, (x,), path)
    (actual,) = Runtime.get().load_program(path).load_method("forward").execute([x])
    with torch.no_grad():
        assert (actual - model(x)).abs().max().item() <= TOLERANCE * model(x).abs().max().item()
