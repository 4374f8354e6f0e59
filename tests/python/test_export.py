"""The exporter: partitioning, preprocess through the C builder, blobs on the CPU engine,
atomic writes, and what stays on ExecuTorch's CPU kernels."""

import importlib
import logging
import operator
import os
import subprocess
import sys
import warnings
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.dialects.edge._ops import EdgeOpOverload

import kiln
import models
from kiln import _lib, lowering, lowering_composed
from kiln.backend import parse_compile_specs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN_CLI = os.environ.get("KILN_CLI") or os.path.join(ROOT, "build", "kiln")
DELEGATE_CALL = torch.ops.higher_order.executorch_call_delegate

# Ops each model must hand to Kiln (ATen names of the nodes inside its blobs).
KILN_OPS = {
    "mlp": {"aten.linear", "aten.relu", "aten.gelu"},
    "encoder": {"aten.linear", "aten.scaled_dot_product_attention", "aten.layer_norm", "aten.gelu"},
    "gpt_block": {"aten.linear", "aten.scaled_dot_product_attention", "aten.layer_norm",
                  "aten.select_copy", "aten.permute_copy", "aten.gelu"},
    "masked_attention": {"aten.bmm", "aten.where", "aten._softmax", "aten.div"},
    "token_head": {"aten.embedding", "aten.layer_norm", "aten.linear"},
    "residual_stack": {"aten.pow", "aten.mean", "aten.rsqrt", "aten.silu", "aten.rms_norm"},
    "norm_chain": {"aten.layer_norm", "aten.gelu", "aten.sigmoid", "aten.tanh", "aten.exp",
                   "aten.sqrt", "aten.neg", "aten._log_softmax", "aten._softmax"},
    "op_mix": {"aten.addmm", "aten.cat", "aten.expand_copy", "aten.slice_copy", "aten.where",
               "aten.index_select", "aten.bmm", "aten.amax", "aten.sum", "aten.mean",
               "aten.select_copy", "aten.permute_copy", "dim_order_ops._to_dim_order_copy"},
    "mixed": {"aten.linear", "aten.relu"},
    "half_mlp": {"aten.linear", "aten.layer_norm", "aten.gelu"},
    "llama_block": {"aten.linear", "aten.scaled_dot_product_attention", "aten.expand_copy",
                    "aten.cat", "aten.neg", "aten.slice_copy", "aten.silu", "aten.rsqrt"},
    "llama_block_gqa_half": {"aten.linear", "aten.scaled_dot_product_attention", "aten.cat",
                             "aten.neg", "aten.silu", "dim_order_ops._to_dim_order_copy"},
}


def op_name(target):
    if isinstance(target, EdgeOpOverload):
        target = target._op
    schema = getattr(target, "_schema", None)
    return schema.name.replace("::", ".") if schema is not None else None


def flat(values):
    if isinstance(values, torch.Tensor):
        return [values]
    out = []
    for value in values:
        out.extend(flat(value))
    return out


def assert_close(actual, expected, tolerance, what):
    assert len(actual) == len(expected), f"{what}: {len(actual)} outputs, expected {len(expected)}"
    for index, (a, e) in enumerate(zip(actual, expected)):
        assert a.dtype == e.dtype and a.shape == e.shape, (
            f"{what} output {index}: {a.dtype}{list(a.shape)} vs {e.dtype}{list(e.shape)}"
        )
        if e.dtype.is_floating_point:  # NaN and infinities where expected, the rest within tolerance
            a, e = a.float(), e.float()
            finite = torch.isfinite(e)
            assert torch.equal(torch.isnan(a), torch.isnan(e)), f"{what} output {index}: NaN elsewhere"
            assert torch.equal(a[torch.isinf(e)], e[torch.isinf(e)]), f"{what} output {index}: infinities differ"
            scale = max(e[finite].abs().max().item(), 1e-6) if finite.any() else 1.0
            diff = (a[finite] - e[finite]).abs().max().item() if finite.any() else 0.0
            assert diff <= tolerance * scale, f"{what} output {index}: max diff {diff:g} > {tolerance:g} * {scale:g}"
        else:
            assert torch.equal(a, e), f"{what} output {index} differs"


class KilnInterpreter(torch.fx.Interpreter):
    """Runs a lowered program in Python with every Kiln delegate call served by run_blob
    on the CPU engine, and records, for each call, Kiln's outputs and those of the
    subgraph the blob was built from, on the same inputs."""

    def __init__(self, program):
        super().__init__(program.exported_program().module())
        self.calls = []

    def call_function(self, target, args, kwargs):
        if target is DELEGATE_CALL and args[0].backend_id == "KilnBackend":
            lowered, inputs = args[0], list(args[1:])
            outputs = kiln.run_blob(lowered.processed_bytes, inputs)
            reference = flat(lowered.original_module.module()(*inputs))
            self.calls.append((lowered, outputs, reference))
            return tuple(outputs)
        return super().call_function(target, args, kwargs)


def cpu_ops(program):
    """ATen names of the ops ExecuTorch runs itself (outside every delegate)."""
    names = set()
    for node in program.exported_program().graph.nodes:
        name = op_name(node.target) if node.op == "call_function" else None
        if name is not None:
            names.add(name)
    return names


def delegated_ops(lowered):
    return {
        op_name(node.target)
        for node in lowered.original_module.graph.nodes
        if node.op == "call_function" and op_name(node.target) is not None
    }


def inspect(path):
    if not os.path.isfile(KILN_CLI):
        pytest.fail(f"{KILN_CLI} is missing: build it with `make build` or set KILN_CLI to a built kiln tool")
    return subprocess.run([KILN_CLI, "inspect", str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("entry", models.ZOO, ids=[m.name for m in models.ZOO])
def test_zoo_model_exports_and_matches_eager(entry, tmp_path):
    model, inputs = entry.make(), entry.inputs()
    with torch.no_grad():
        expected = flat(model(*inputs))
    path = tmp_path / f"{entry.name}.pte"
    program = kiln.export(model, inputs, path)
    assert path.read_bytes() == program.buffer

    lowered = kiln.lowered_modules(program)
    assert len(lowered) == entry.kiln_blobs
    assert kiln.blobs(program) == [bytes(m.processed_bytes) for m in lowered]
    in_kiln = set().union(*(delegated_ops(m) for m in lowered))
    assert KILN_OPS[entry.name] <= in_kiln, f"missing from Kiln: {KILN_OPS[entry.name] - in_kiln}"
    assert cpu_ops(program) == set(entry.cpu_ops)

    if entry.kiln_blobs == 1:  # the weights live in the blob: its inputs are the model's
        with _lib.Engine(lowered[0].processed_bytes, "cpu") as engine:
            kinds = [kind for _, kind, _, _ in engine.bindings()]
        assert kinds.count(_lib.IO_INPUT) == len(inputs)

    interpreter = KilnInterpreter(program)
    with torch.no_grad():
        actual = flat(interpreter.run(*inputs))
    assert len(interpreter.calls) == entry.kiln_blobs
    for index, (_, outputs, reference) in enumerate(interpreter.calls):
        assert_close(outputs, reference, entry.tolerance, f"{entry.name} blob {index}")
    assert_close(actual, expected, entry.tolerance, entry.name)

    result = inspect(path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("backend KilnBackend") == entry.kiln_blobs, result.stdout


@pytest.fixture(scope="module")
def mlp_blob():
    entry = models.BY_NAME["mlp"]
    (blob,) = kiln.blobs(kiln.to_executorch(entry.make(), entry.inputs()))
    return blob


def test_fully_lowered_model_runs_as_one_blob(mlp_blob):
    entry = models.BY_NAME["mlp"]
    model, inputs = entry.make(), entry.inputs()
    with torch.no_grad():
        expected = [model(*inputs)]
    assert_close(kiln.run_blob(mlp_blob, inputs), expected, entry.tolerance, "mlp blob")


# ------------------------------------------------------------------ atomic writes


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # torch.export cannot trace a branch on a tensor's value
            return x * 2
        return x


def test_refused_export_keeps_previous_file(tmp_path):
    path = tmp_path / "model.pte"
    path.write_bytes(b"previous program")
    with pytest.raises(Exception):
        kiln.export(DataDependent(), (torch.randn(3),), path)
    assert path.read_bytes() == b"previous program"
    assert os.listdir(tmp_path) == ["model.pte"]


def test_refusal_in_preprocess_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "model.pte"
    path.write_bytes(b"previous program")

    def refuse(ctx, node):  # a builder op the C builder refuses: relu of two inputs
        return ctx.op("relu", [ctx.tensor(node.args[0])] * 2)

    # The partitioner takes every op; preprocess then meets the C builder's refusal.
    monkeypatch.setattr(lowering, "refusal", lambda node: None)
    monkeypatch.setitem(lowering.LOWERINGS, torch.ops.aten.relu.default, lowering.Lowering(refuse))
    with pytest.raises(kiln.KilnError, match="relu"):
        kiln.export(Rank9(), (torch.randn(2, 3),), path)
    assert path.read_bytes() == b"previous program"
    assert os.listdir(tmp_path) == ["model.pte"]


def test_failed_write_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "model.pte"
    path.write_bytes(b"previous program")

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    entry = models.BY_NAME["mlp"]
    with pytest.raises(OSError, match="disk full"):
        kiln.export(entry.make(), entry.inputs(), path)
    assert path.read_bytes() == b"previous program"
    assert os.listdir(tmp_path) == ["model.pte"]


def test_export_into_missing_directory_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        kiln.export(models.MLP(), (torch.randn(2, 16),), tmp_path / "missing" / "model.pte")


def test_lone_tensor_input_and_training_mode_warning():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 4), nn.ReLU())  # still in training mode
    with pytest.warns(UserWarning, match="model.eval"):
        program = kiln.to_executorch(model, torch.randn(3, 16))
    (blob,) = kiln.blobs(program)
    with _lib.Engine(blob, "cpu") as engine:
        assert [shape for _, kind, _, shape in engine.bindings() if kind == _lib.IO_INPUT] == [(3, 16)]


# ------------------------------------------------------------------ what stays on the CPU


def lower(model, inputs, partitioner=None, dynamic_shapes=None):
    partitioner = partitioner or kiln.KilnPartitioner()
    exported = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    edge = to_edge_transform_and_lower(exported, partitioner=[partitioner])
    return edge, partitioner


def edge_blobs(edge):
    return kiln.lowered_modules(edge.exported_program())


def refusals_of(partitioner, op):
    return [reason for name, reason in partitioner.refusals.items() if name.startswith(op)]


class Float64Middle(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x).double() * 3.0
        return h.float().relu()


def test_float64_stays_on_cpu():
    torch.manual_seed(0)
    model, x = Float64Middle().eval(), torch.randn(2, 8)
    edge, partitioner = lower(model, (x,))
    blobs = edge_blobs(edge)
    assert len(blobs) == 2
    for blob in blobs:
        for node in blob.original_module.graph.nodes:
            if node.op == "call_function":
                assert node.meta["val"].dtype != torch.float64, node.name
    assert any("float64" in reason for reason in partitioner.refusals.values())


def test_float64_linear_is_decomposed_not_preserved():
    torch.manual_seed(0)
    model = nn.Linear(4, 4).double().eval()
    edge, _ = lower(model, (torch.randn(2, 4, dtype=torch.float64),))
    assert edge_blobs(edge) == []


def test_bounded_dynamic_batch_lowers_to_kiln():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    batch = torch.export.Dim("batch", min=2, max=16)
    edge, partitioner = lower(model, (torch.randn(4, 8),), dynamic_shapes=({0: batch},))
    assert len(edge_blobs(edge)) == 1
    assert partitioner.refusals == {}


class SquareFlatten(nn.Module):
    def forward(self, x):
        return torch.relu(x).reshape(-1) * 2


def test_dynamic_size_not_affine_in_its_symbol_stays_on_cpu():
    side = torch.export.Dim("side", min=2, max=8)
    edge, partitioner = lower(SquareFlatten(), (torch.randn(4, 4),), dynamic_shapes=({0: side, 1: side},))
    assert any("is not a*s+b of one symbol" in reason for reason in partitioner.refusals.values()), \
        partitioner.refusals


class InstanceNormed(nn.Module):
    def forward(self, x):
        return F.instance_norm(x, eps=1e-5) * 2.0


def test_instance_norm_of_a_dynamic_batch_stays_on_cpu_with_its_reason():
    batch = torch.export.Dim("batch", min=1, max=4)
    edge, partitioner = lower(InstanceNormed(), (torch.randn(2, 3, 4, 4),), dynamic_shapes=({0: batch},))
    assert any("no_stats of a dynamic shape (Kiln counts each channel's elements at export)" in reason
               for reason in refusals_of(partitioner, "aten__native_batch_norm_legit")), partitioner.refusals


class Rank9(nn.Module):
    def forward(self, x):
        return (x * 2.0).relu()


def test_rank_above_limit_stays_on_cpu():
    edge, partitioner = lower(Rank9(), (torch.randn(*([2] * 9)),))
    assert edge_blobs(edge) == []
    assert any("rank 9" in reason for reason in partitioner.refusals.values())


class IntegerRelu(nn.Module):
    def forward(self, x):
        return torch.relu(x * 3)


def test_builder_refusal_keeps_node_on_cpu_with_its_message():
    edge, partitioner = lower(IntegerRelu(), (torch.arange(6).reshape(2, 3),))
    reasons = refusals_of(partitioner, "aten_relu")
    assert reasons, partitioner.refusals
    # The message is the C builder's own, which names the op and the remedy.
    assert "relu" in reasons[0] and "i64" in reasons[0] and "cast it first" in reasons[0]
    assert "aten.relu" in cpu_ops_of_edge(edge)


def cpu_ops_of_edge(edge):
    return {
        op_name(node.target)
        for node in edge.exported_program().graph.nodes
        if node.op == "call_function" and op_name(node.target) is not None
    }


class LayoutBetweenCpuOps(nn.Module):
    def forward(self, x):
        return torch.atan(torch.atan(x).view(4, 3))


def test_partition_that_only_moves_data_is_not_delegated():
    edge, _ = lower(LayoutBetweenCpuOps(), (torch.randn(3, 4),))
    assert edge_blobs(edge) == []


class SplitAndArangeBetweenCpuOps(nn.Module):
    def forward(self, x):
        a, b = torch.atan(x).split(2)
        return torch.atan(a), torch.atan(b), torch.atan(torch.arange(4.0))


def test_partition_that_only_splits_or_creates_is_not_delegated():
    edge, partitioner = lower(SplitAndArangeBetweenCpuOps(), (torch.randn(4, 4),))
    assert edge_blobs(edge) == []
    assert {"aten.split_with_sizes_copy", "aten.arange"} <= cpu_ops_of_edge(edge)
    assert not any(name.startswith(("aten_split", "aten_arange")) for name in partitioner.refusals)


class AddmmScaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.b = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.addmm(self.b, x, self.w, beta=0.5).relu()


def test_addmm_with_beta_stays_on_cpu():
    torch.manual_seed(0)
    edge, partitioner = lower(AddmmScaled(), (torch.randn(2, 4),))
    assert "aten.addmm" in cpu_ops_of_edge(edge)
    assert any("beta=0.5" in r for r in refusals_of(partitioner, "aten_addmm"))


class ChannelsLast(nn.Module):
    def forward(self, x):
        return (x * 2.0).contiguous(memory_format=torch.channels_last)


def test_copy_to_other_dim_order_stays_on_cpu():
    edge, partitioner = lower(ChannelsLast(), (torch.randn(1, 2, 3, 4),))
    assert any("dim order" in reason for reason in partitioner.refusals.values())
    for blob in edge_blobs(edge):
        assert "dim_order_ops._clone_dim_order" not in delegated_ops(blob)


def test_clone_to_another_memory_format_leaving_kiln_is_refused():
    graph = torch.fx.Graph()
    x = _placeholder(graph, "x", torch.randn(1, 2, 3, 4))
    node = _node(graph, torch.ops.aten.clone.default, (x,), torch.randn(1, 2, 3, 4),
                 {"memory_format": torch.channels_last})
    graph.output((node,))
    assert "memory format torch.channels_last read outside Kiln" in lowering.refusal(node)


class PermutedClone(nn.Module):
    """A clone of a permuted tensor: a copy into dim order [0, 2, 3, 1] in the edge dialect."""

    def forward(self, x):
        return (x.permute(0, 2, 3, 1).clone() * 2).permute(0, 3, 1, 2).relu()


def test_clone_to_another_dim_order_read_by_kiln_is_a_copy():
    x = torch.randn(2, 3, 4, 5)
    edge, partitioner = lower(PermutedClone(), (x,))
    (blob,) = edge_blobs(edge)
    assert "dim_order_ops._clone_dim_order" in delegated_ops(blob), delegated_ops(blob)
    assert cpu_ops_of_edge(edge) == set(), partitioner.refusals
    assert_close(kiln.run_blob(blob.processed_bytes, [x]), [PermutedClone()(x)], models.F32_TOLERANCE, "clone")


class MaskProduct(nn.Module):
    """Two masks multiplied and added (RT-DETR's valid anchors): and, or."""

    def forward(self, x):
        inside, positive = x.abs() < 1, x > 0
        both, either = inside * positive, inside + positive
        return torch.where(both, x, 0.0) + torch.where(either, 1.0, -1.0)


def test_product_and_sum_of_masks_are_and_and_or():
    x = torch.randn(4, 6)
    edge, partitioner = lower(MaskProduct(), (x,))
    (blob,) = edge_blobs(edge)
    assert cpu_ops_of_edge(edge) == set(), partitioner.refusals
    assert_close(kiln.run_blob(blob.processed_bytes, [x]), [MaskProduct()(x)], models.F32_TOLERANCE, "masks")


def test_remainder_kiln_cannot_take_is_refused_with_its_reason():
    def node_of(x, other):
        graph = torch.fx.Graph()
        return _node(graph, torch.ops.aten.remainder.Scalar, (_placeholder(graph, "x", x), other),
                     torch.remainder(x, other))

    assert lowering.refusal(node_of(torch.arange(8), 16)) is None
    assert "remainder by 10 (Kiln takes the remainder by a positive power of two" in \
        lowering.refusal(node_of(torch.arange(8), 10))
    assert "remainder by -4" in lowering.refusal(node_of(torch.arange(8), -4))
    assert "remainder of torch.float32" in lowering.refusal(node_of(torch.randn(8), 4))


class Histogram(nn.Module):
    """torch.histc, as transformers' grouped MoE experts count their tokens: not in ExecuTorch's
    Core ATen op set, whose verifier refuses it with options of its own API."""

    def forward(self, x):
        return torch.histc(x, bins=4, min=0, max=3) * 2.0


def test_an_op_outside_core_aten_is_refused_naming_it_and_its_line(tmp_path):
    with pytest.raises(ValueError) as refused:
        kiln.export(Histogram().eval(), (torch.tensor([0.0, 1.0, 1.0, 3.0]),), str(tmp_path / "m.pte"))
    message = str(refused.value)
    assert message.startswith("kiln: aten.histc.default (in forward, test_export.py:")
    assert "not in ExecuTorch's Core ATen op set" in message and "EdgeCompileConfig" not in message
    assert not (tmp_path / "m.pte").exists()
    assert message.endswith("change that code or pick a model option that avoids it")


def test_transformers_grouped_experts_are_refused_naming_the_option_that_exports(tmp_path):
    """transformers' default MoE experts count their tokens with histc; the refusal names the
    experts option that exports (the architecture tests run Mixtral, Qwen2-MoE and PhiMoE with
    it), so a caller need not read transformers to find it."""
    import transformers as hf
    from zoo_models import LogitsOf, _decoder_sizes

    torch.manual_seed(0)
    model = LogitsOf(hf.OlmoeForCausalLM(hf.OlmoeConfig(**_decoder_sizes(), num_experts=4, num_experts_per_tok=2)))
    with pytest.raises(ValueError) as refused:
        kiln.export(model.eval(), (torch.randint(0, 64, (1, 8)),), str(tmp_path / "m.pte"))
    message = str(refused.value)
    assert message.startswith("kiln: aten.histc.default (in forward, moe.py:") and len(message.encode()) <= 255
    assert message.endswith('; load the model with experts_implementation="batched_mm"')


class BucketizedPositions(nn.Module):
    """Position ids bucketized from a grid of static shape, as SmolVLM's vision embeddings compute
    theirs: bucketize is outside ExecuTorch's Core ATen set, but it reads only constants."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(16, 8)

    def forward(self, x):
        grid = torch.ones(x.shape[1] // 4, 4, dtype=torch.bool, device=x.device)
        fractions = torch.arange(grid.shape[0], device=x.device) / grid[:, 0].sum()
        edges = torch.arange(0.25, 1.0, 0.25, device=x.device)
        rows = torch.bucketize(fractions, edges, right=True)
        ids = (rows[:, None] * 4 + torch.arange(4, device=x.device)).flatten()
        return x + self.table(ids)


def test_an_op_outside_core_aten_reading_only_constants_is_folded(tmp_path, monkeypatch):
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    torch.manual_seed(0)
    model, x, path = BucketizedPositions().eval(), torch.randn(2, 16, 8), str(tmp_path / "m.pte")
    program = kiln.export(model, (x,), path)
    assert program.kiln_report.kiln_blobs == 1 and program.kiln_report.ops_outside == 0
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    (actual,) = Runtime.get().load_program(path).load_method("forward").execute([x])
    assert_close([actual], [model(x)], models.F32_TOLERANCE, "bucketized positions")


class MaskSelectedPositions(nn.Module):
    """SmolVLM's vision embeddings as transformers 5.17 writes them: position ids bucketized from
    a patch mask and written through it as a boolean index, a selection whose size depends on
    data (here constants: a mask of static shape with its last row of patches off)."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(16, 8)

    def forward(self, x):
        mask = torch.ones(1, 4, 4, dtype=torch.bool, device=x.device)
        mask[:, 3, :] = False
        fractions = torch.arange(4, device=x.device)[None, :] / mask[:, :, 0].sum(dim=1)[:, None]
        edges = torch.arange(0.25, 1.0, 0.25, device=x.device)
        rows = torch.bucketize(fractions.clamp(max=1 - 1e-6), edges, right=True)
        positions = (rows[:, :, None] * 4 + torch.arange(4, device=x.device)).reshape(1, -1)
        ids, keep = torch.zeros(1, 16, dtype=torch.long, device=x.device), mask.view(1, -1)
        ids[keep] = positions[keep]
        return x + self.table(ids)


def test_a_constant_selection_of_data_dependent_size_is_folded(tmp_path, monkeypatch):
    """The first lowering fails on bucketize (outside Core ATen) and leaves the selection's sizes
    pending in the program's shape environment; the retry forgets them, and the fold evaluates
    the selection, the sizes read from it and the checks on them, so the program is one blob."""
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    torch.manual_seed(0)
    model, x, path = MaskSelectedPositions().eval(), torch.randn(2, 16, 8), str(tmp_path / "m.pte")
    program = kiln.export(model, (x,), path, require_whole=True)
    assert program.kiln_report.kiln_blobs == 1 and program.kiln_report.ops_outside == 0
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    (actual,) = Runtime.get().load_program(path).load_method("forward").execute([x])
    expected = model(x)
    assert not torch.allclose(expected, x + model.table.weight[0]), "degenerate positions"
    assert_close([actual], [expected], models.F32_TOLERANCE, "positions selected by a mask")


class PickedFromConstants(nn.Module):
    """A selection of data-dependent size from a constant: the indices of a mask's cells."""

    def forward(self, x):
        picked = torch.nonzero(torch.ones(16, 16, dtype=torch.bool, device=x.device))
        return x * picked.sum().to(x.dtype)


def test_a_data_dependent_selection_is_folded_within_the_size_limit():
    model, x = PickedFromConstants().eval(), torch.randn(8)
    folded = kiln.to_executorch(model, (x,))
    assert folded.kiln_report.kiln_blobs == 1 and folded.kiln_report.ops_outside == 0
    (blob,) = kiln.blobs(folded)
    assert_close(kiln.run_blob(blob, [x], device="cpu"), [model(x)], models.F32_TOLERANCE, "picked cells")
    capped = kiln.to_executorch(model, (x,), fold_limit_bytes=1024)  # 256 cells' indices: 4096 bytes
    assert "aten.nonzero.out" in [str(n.target) for n in capped.exported_program().graph.nodes]


def assert_whole_and_eager(model, inputs, label):
    """model exports as one Kiln blob, and the CPU engine running it matches eager (whose output
    is not degenerate)."""
    (blob,) = kiln.blobs(kiln.to_executorch(model, inputs, require_whole=True))
    expected = model(*inputs)
    assert expected.std().item() > 1e-3
    assert_close(kiln.run_blob(blob, list(inputs), device="cpu"), [expected], models.F32_TOLERANCE, label)


class RelativeRange(nn.Module):
    """Funnel's relative positions as transformers 5.17 writes them: an arange whose ends are
    tensors computed from constants, so its length is data-dependent to the tracer, then sliced."""

    def forward(self, x):
        pos = torch.arange(0, x.shape[1], dtype=torch.int64, device=x.device)
        rel = torch.arange(pos[-1] - pos[0], pos[0] - pos[-1] - 1, -1, dtype=torch.long, device=x.device)
        return x * rel[1:].to(x.dtype)[: x.shape[1]]


def test_a_view_whose_size_constants_decide_is_folded():
    """ExecuTorch's first lowering retraces the slice and cannot decide its size (a guard on a
    data-dependent expression); the retry folds the arange in the functional form, and the
    program is one blob matching eager."""
    assert_whole_and_eager(RelativeRange().eval(), (torch.randn(2, 8),), "relative range")


def test_a_retried_lowering_logs_no_error():
    """The first lowering's failure, which the retry recovers from, leaves no error in the log."""
    logged = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = logged.append
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    logger.addHandler(handler)
    try:
        kiln.to_executorch(RelativeRange().eval(), (torch.randn(2, 8),), require_whole=True)
    finally:
        logger.removeHandler(handler)
    assert logged == []


class OutlookMixing(nn.Module):
    """VOLO's outlook attention in miniature: each pixel's 3x3 neighbourhood (unfold) mixed by
    weights computed from the pixel, then the blocks added back where they overlap (fold), with a
    stride of 2 as VOLO pools its attention."""

    def __init__(self, channels=8):
        super().__init__()
        self.weights = nn.Linear(channels, 9 * 9)
        self.unfold = nn.Unfold(3, padding=1, stride=2)
        self.fold = nn.Fold((8, 8), 3, padding=1, stride=2)

    def forward(self, x):
        n, c, h, w = x.shape
        blocks = self.unfold(x).reshape(n, c, 9, -1).permute(0, 3, 2, 1)  # n, L, 9, c
        pooled = F.avg_pool2d(x, 2).flatten(2).transpose(1, 2)  # n, L, c
        mix = self.weights(pooled).reshape(n, -1, 9, 9).softmax(-1)
        out = (mix @ blocks).permute(0, 3, 2, 1).reshape(n, c * 9, -1)
        return self.fold(out)


def test_an_overlap_add_of_blocks_runs_whole(tmp_path, monkeypatch):
    """nn.Fold is col2im, which ExecuTorch would decompose into an index_put that accumulates;
    Kiln keeps it whole and composes it, so the model is one blob matching eager."""
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    torch.manual_seed(0)
    model, x, path = OutlookMixing().eval(), torch.randn(2, 8, 8, 8), str(tmp_path / "m.pte")
    program = kiln.export(model, (x,), path, require_whole=True)
    assert program.kiln_report.kiln_blobs == 1 and program.kiln_report.ops_outside == 0
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    (actual,) = Runtime.get().load_program(path).load_method("forward").execute([x])
    expected = model(x)
    assert expected.std().item() > 1e-2
    assert_close([actual], [expected], models.F32_TOLERANCE, "outlook mixing")


class BucketizedState(nn.Module):
    """bucketize of a buffer the program writes after reading it: the read sees the last call's
    value, so it is not a constant, whatever the buffer's initial value."""

    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(4))
        self.register_buffer("edges", torch.tensor([0.5, 1.5, 2.5]))

    def forward(self, x):
        bucket = torch.bucketize(self.seen, self.edges)
        self.seen.add_(1.0)
        return x * bucket.to(x.dtype)


def test_an_op_outside_core_aten_reading_a_written_buffer_is_not_folded(tmp_path):
    with pytest.raises(ValueError) as refused:
        kiln.export(BucketizedState().eval(), (torch.randn(4),), str(tmp_path / "m.pte"))
    assert str(refused.value).startswith("kiln: aten.bucketize.Tensor (in forward, test_export.py:")
    assert not (tmp_path / "m.pte").exists()


def test_the_core_aten_refusal_fits_255_bytes_at_its_longest():
    class Node:
        op, target = "call_function", "aten." + "é" * 80 + ".default"
        meta = {"stack_trace": f'File "/{"d" * 90}/{"ü" * 90}.py", line 12345678, in {"f" * 90}\n'}

    class Program:
        graph = type("Graph", (), {"nodes": [Node()]})()

    error = RuntimeError(f"Operator torch._ops.{Node.target} is not in Core ATen opset")
    message = importlib.import_module("kiln.export")._outside_core_aten(Program(), error)
    assert len(message.encode()) <= 255, len(message.encode())
    assert message.startswith("kiln: aten.") and message.endswith("pick a model option that avoids it")


def test_repeat_kiln_cannot_view_is_refused_with_its_reason():
    graph, x = torch.fx.Graph(), torch.randn(2, 2, 2, 2)
    node = _node(graph, torch.ops.aten.repeat.default, (_placeholder(graph, "x", x), [2, 2, 2, 2, 2]),
                 x.repeat(2, 2, 2, 2, 2))
    assert "repeat of a rank-4 tensor by 5 counts, 5 of them tiling" in lowering.refusal(node)
    fits = _node(graph, torch.ops.aten.repeat.default, (_placeholder(graph, "y", x), [2, 1, 1, 2]),
                 x.repeat(2, 1, 1, 2))
    assert lowering.refusal(fits) is None


def test_slice_scatter_with_a_step_is_refused():
    graph = torch.fx.Graph()
    x, src = torch.randn(2, 8), torch.randn(2, 4)
    node = _node(graph, torch.ops.aten.slice_scatter.default,
                 (_placeholder(graph, "x", x), _placeholder(graph, "src", src), 1, 0, 8, 2),
                 torch.slice_scatter(x, src, 1, 0, 8, 2))
    assert "slice_scatter with step 2" in lowering.refusal(node)


def test_slice_scatter_over_a_dynamic_dim_stays_on_executorch_with_its_reason(tmp_path):
    x, z = torch.randn(2, 9, 5), torch.randn(2, 3, 5)
    seq = torch.export.Dim("seq", min=5, max=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = kiln.export(SliceAssigned().eval(), (x, z), str(tmp_path / "m.pte"),
                              dynamic_shapes={"x": {1: seq}, "z": None})
    report = program.kiln_report
    assert report.ops_outside >= 1
    assert "slice_scatter over a dynamic dim or at a dynamic position" in str(report)


class SliceAssigned(nn.Module):
    """Writes into slices of a copy, as Funnel's relative attention does: export turns each
    write into a slice_scatter."""

    def forward(self, x, z):
        y = x.clone()
        y[:, 1:4] = z * 2.0
        y[:, -2:] = y[:, :2] + 1.0
        return torch.tanh(y)


def test_slice_assignment_runs_whole_on_kiln():
    x, z = torch.randn(2, 9, 5), torch.randn(2, 3, 5)
    edge, _ = lower(SliceAssigned(), (x, z), kiln.KilnPartitioner())
    (blob,) = edge_blobs(edge)
    assert "aten.slice_scatter.default" not in str(edge.exported_program().graph)
    assert_close(kiln.run_blob(blob.processed_bytes, [x, z]), [SliceAssigned()(x, z)], models.F32_TOLERANCE,
                 "slice assignment")


def test_slice_assignment_with_a_dynamic_batch_runs_at_each_size(tmp_path, monkeypatch):
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    x, z, path = torch.randn(2, 9, 5), torch.randn(2, 3, 5), str(tmp_path / "m.pte")
    batch = torch.export.Dim("batch", min=1, max=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = kiln.export(SliceAssigned().eval(), (x, z), path,
                              dynamic_shapes={"x": {0: batch}, "z": {0: batch}})
    assert program.kiln_report.kiln_blobs == 1 and program.kiln_report.ops_outside == 0
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    method = Runtime.get().load_program(path).load_method("forward")
    for n in (1, 5, 8):
        x, z = torch.randn(n, 9, 5), torch.randn(n, 3, 5)
        (actual,) = method.execute([x, z])
        assert_close([actual], [SliceAssigned()(x, z)], models.F32_TOLERANCE, f"batch {n}")


class SliceWrittenBuffer(nn.Module):
    """A buffer updated through a slice each call: the write is a slice_scatter into state."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(2, 6))

    def forward(self, x):
        self.total[:, 1:3] = self.total[:, 1:3] + x
        return self.total * 2.0


def test_a_buffer_written_through_a_slice_keeps_its_state_across_calls(tmp_path, monkeypatch):
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    x, path = torch.randn(2, 2), str(tmp_path / "m.pte")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = kiln.export(SliceWrittenBuffer().eval(), (x,), path)
    assert program.kiln_report.kiln_blobs == 1 and program.kiln_report.ops_outside == 0
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    method, eager = Runtime.get().load_program(path).load_method("forward"), SliceWrittenBuffer().eval()
    for call in range(3):  # the slots grow by x each call; the others stay zero
        (actual,) = method.execute([x])
        assert_close([actual], [eager(x)], models.F32_TOLERANCE, f"call {call}")


class LayerNormStatistics(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))
        self.b = nn.Parameter(torch.zeros(8))

    def forward(self, x):
        out, mean, _ = torch.native_layer_norm(x, [8], self.w, self.b, 1e-5)
        return out * 2.0, mean


def test_native_layer_norm_with_used_statistics_stays_on_cpu():
    edge, partitioner = lower(LayerNormStatistics(), (torch.randn(3, 8),))
    assert "aten.native_layer_norm" in cpu_ops_of_edge(edge)
    assert any("mean or rstd" in r for r in refusals_of(partitioner, "aten_native_layer_norm"))


class LayerNormOutput(nn.Module):
    def forward(self, x):
        out, _, _ = torch.native_layer_norm(x, [8], None, None, 1e-5)
        return out * 2.0


def test_as_strided_out_of_order_is_refused():
    graph = torch.fx.Graph()
    x = _placeholder(graph, "x", torch.randn(3, 4))
    op = torch.ops.aten.as_strided_copy.default
    transposed = _node(graph, op, (x, [4, 3], [1, 4]), torch.empty(4, 3))
    offset = _node(graph, op, (x, [2, 4], [4, 1], 4), torch.empty(2, 4))
    assert "only in-order views" in lowering.refusal(transposed)
    assert "only in-order views" in lowering.refusal(offset)


def test_native_layer_norm_output_is_delegated():
    x = torch.randn(3, 8)
    edge, _ = lower(LayerNormOutput(), (x,))
    (blob,) = edge_blobs(edge)
    assert "aten.native_layer_norm" in delegated_ops(blob)
    expected = [LayerNormOutput()(x)]
    assert_close(kiln.run_blob(blob.processed_bytes, [x]), expected, models.F32_TOLERANCE, "layer norm")


class PoolIndices(nn.Module):
    def forward(self, x):
        values, indices = F.max_pool2d(x, 2, return_indices=True)
        return values * 2.0, indices


def test_max_pool_with_used_indices_stays_on_cpu():
    edge, partitioner = lower(PoolIndices(), (torch.randn(1, 2, 4, 4),))
    assert "aten.max_pool2d_with_indices" in cpu_ops_of_edge(edge)
    assert any("indices output is used" in r for r in refusals_of(partitioner, "aten_max_pool2d"))


class TransposedConv3d(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose3d(2, 3, 2)

    def forward(self, x):
        return self.up(x).relu()


def test_convolution_kiln_cannot_run_is_refused_with_its_reason():
    edge, partitioner = lower(TransposedConv3d(), (torch.randn(1, 2, 3, 3, 3),))
    assert "aten.convolution" in cpu_ops_of_edge(edge)
    assert any("a transposed 3-d convolution" in r for r in refusals_of(partitioner, "aten_convolution"))


class VideoBlock(nn.Module):
    """Two 3-d convolutions, each with a batch norm and a ReLU (R3D's block without the residual)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.norm1 = nn.Conv3d(3, 4, 3, padding=1, bias=False), nn.BatchNorm3d(4)
        self.conv2, self.norm2 = nn.Conv3d(4, 5, (1, 3, 3), padding=(0, 1, 1)), nn.BatchNorm3d(5)
        generator = torch.Generator().manual_seed(3)
        for norm in (self.norm1, self.norm2):
            for tensor in (norm.weight, norm.bias, norm.running_mean):
                tensor.data = torch.randn(tensor.shape, generator=generator)
            norm.running_var.data = torch.rand(norm.running_var.shape, generator=generator) + 0.5

    def forward(self, x):
        return self.norm2(self.conv2(self.norm1(self.conv1(x)).relu())).relu()


def test_batch_norm_of_a_3d_convolution_folds_into_its_2d_one(tmp_path):
    torch.manual_seed(0)
    model, x = VideoBlock().eval(), torch.randn(2, 3, 4, 6, 6)
    edge, partitioner = lower(model, (x,))
    (blob,) = edge_blobs(edge)
    path = tmp_path / "video.blob"
    path.write_bytes(blob.processed_bytes)
    result = inspect(path)
    assert result.returncode == 0, result.stderr
    ops = [line.split(":")[1].split("(")[0].strip() for line in result.stdout.splitlines()
           if line.strip().startswith("op ")]
    assert ops.count("conv") == 2 and "batch_norm" not in ops, ops
    with torch.no_grad():
        expected = model(x)
    assert_close(kiln.run_blob(blob.processed_bytes, [x]), [expected], models.F32_TOLERANCE, "video block")


@pytest.mark.parametrize("mode, padding, reason", [(2, 0, "with mode bicubic"), (0, 2, "with padding reflection")])
def test_grid_sample_kiln_cannot_take_is_refused_with_its_reason(mode, padding, reason):
    graph = torch.fx.Graph()
    x, grid = _placeholder(graph, "x", rand(1, 2, 4, 4)), _placeholder(graph, "grid", SAMPLES[:1])
    node = _node(graph, aten.grid_sampler_2d.default, (x, grid, mode, padding, False), torch.empty(1, 2, 4, 7))
    assert reason in lowering.refusal(node)


class PooledVideo(nn.Module):
    """VideoBlock, 3-d max and average pools, then grid_sample of the clip's mean frame."""

    def __init__(self):
        super().__init__()
        self.block = VideoBlock()
        self.max = nn.MaxPool3d(3, 2, 1)
        self.avg = nn.AvgPool3d((2, 3, 3), 1, 1, count_include_pad=False)

    def forward(self, x, grid):
        y = self.avg(self.max(self.block(x)))
        return y.flatten(1), F.grid_sample(y.mean(2), grid, align_corners=False)


def test_video_ops_with_a_dynamic_batch_run_at_each_size(tmp_path, monkeypatch):
    """The composed 3-d convolutions, pools and grid_sample with the batch a bounded dynamic dim."""
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    torch.manual_seed(0)
    model, path = PooledVideo().eval(), str(tmp_path / "video.pte")
    batch = torch.export.Dim("batch", min=1, max=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = kiln.export(model, (torch.randn(2, 3, 4, 6, 6), torch.rand(2, 3, 5, 2) * 2 - 1), path,
                              dynamic_shapes={"x": {0: batch}, "grid": {0: batch}})
    assert program.kiln_report.kiln_blobs == 1 and program.kiln_report.ops_outside == 0, program.kiln_report
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    method = Runtime.get().load_program(path).load_method("forward")
    for n in (1, 3, 8):
        x, grid = torch.randn(n, 3, 4, 6, 6), torch.rand(n, 3, 5, 2) * 2.2 - 1.1
        with torch.no_grad():
            expected = list(model(x, grid))
        assert_close(list(method.execute([x, grid])), expected, models.F32_TOLERANCE, f"batch {n}")


class WideOutputPadding(nn.Module):
    """Output padding 1 with stride 1, which PyTorch allows below the dilation 2."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(2, 3, 3, stride=1, dilation=2, output_padding=1)

    def forward(self, x):
        return self.up(x).relu()


def test_transposed_convolution_cudnn_cannot_size_is_refused_with_its_reason():
    edge, partitioner = lower(WideOutputPadding(), (torch.randn(1, 2, 4, 4),))
    assert "aten.convolution" in cpu_ops_of_edge(edge)
    assert any("output padding [1, 1] not below its stride [1, 1]" in r
               for r in refusals_of(partitioner, "aten_convolution"))


def test_convolution_attributes_the_builder_refuses_name_the_fault():
    graph = torch.fx.Graph()
    x = _placeholder(graph, "x", torch.randn(1, 2, 5, 5))
    w = _placeholder(graph, "w", torch.randn(3, 2, 3, 3))
    conv = torch.ops.aten.convolution.default
    fits = _node(graph, conv, (x, w, None, [1, 1], [0, 0], [2, 2], False, [0, 0], 1), torch.empty(1, 3, 1, 1))
    spans_past = _node(graph, conv, (x, w, None, [1, 1], [0, 0], [3, 3], False, [0, 0], 1), torch.empty(1, 3, 1, 1))
    assert lowering.refusal(fits) is None
    assert "too small for its kernel, padding and dilation" in lowering.refusal(spans_past)


class SplitProjection(nn.Module):
    """GPT-2's attention projection: one linear split into three pieces, one of them unused,
    one handed out of the blob to an op Kiln lacks."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        q, k, _ = self.qkv(x).split(8, dim=-1)
        return torch.atan(k), (q * k).softmax(-1) + q


def test_split_pieces_are_delegated_with_their_users():
    torch.manual_seed(0)
    model, x = SplitProjection().eval(), torch.randn(2, 5, 8)
    edge, partitioner = lower(model, (x,))
    (blob,) = edge_blobs(edge)
    assert "aten.split_with_sizes_copy" in delegated_ops(blob)
    assert cpu_ops_of_edge(edge) == {"aten.atan"}, partitioner.refusals
    reference = flat(blob.original_module.module()(x))
    assert_close(kiln.run_blob(blob.processed_bytes, [x]), reference, models.F32_TOLERANCE, "split")


class Positions(nn.Module):
    """transformers' position and token-type code: a cumsum of the attention mask, a gather
    from a buffer of type ids, rows picked by two broadcasting index tensors, and a greedy
    argmax over the head."""

    def __init__(self):
        super().__init__()
        self.tok, self.pos, self.typ = nn.Embedding(32, 8), nn.Embedding(8, 8), nn.Embedding(3, 8)
        self.register_buffer("types", (torch.arange(8) % 3)[None])
        self.head = nn.Linear(8, 32)

    def forward(self, ids, mask):
        positions = mask.cumsum(-1) * mask
        types = self.types.expand(ids.shape[0], -1).gather(1, positions)
        h = self.tok(ids) + self.pos(positions) + self.typ(types)
        rows = torch.arange(ids.shape[0])[:, None]
        logits = self.head(h[rows, positions])
        return logits, logits.argmax(-1)


def test_position_code_runs_whole_on_kiln():
    torch.manual_seed(0)
    model = Positions().eval()
    ids = torch.randint(0, 32, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1]])
    edge, partitioner = lower(model, (ids, mask))
    (blob,) = edge_blobs(edge)
    assert cpu_ops_of_edge(edge) == set(), partitioner.refusals
    assert {"aten.cumsum", "aten.gather", "aten.index", "aten.argmax"} <= delegated_ops(blob)
    interpreter = KilnInterpreter(edge)
    with torch.no_grad():
        actual, expected = flat(interpreter.run(ids, mask)), flat(model(ids, mask))
    assert_close(actual, expected, models.F32_TOLERANCE, "positions")


class MaskedRows(nn.Module):
    def forward(self, x, keep):
        return x[keep] * 2.0


def test_bool_mask_index_stays_on_cpu_with_its_reason():
    x, keep = torch.randn(4, 3), torch.tensor([True, False, True, True])
    edge, partitioner = lower(MaskedRows(), (x, keep))
    assert "aten.index" in cpu_ops_of_edge(edge)
    reasons = refusals_of(partitioner, "aten_index")
    assert reasons and all("bool mask" in r and "depends on the mask" in r for r in reasons), reasons


class ConstantOutput(nn.Module):
    def forward(self, x):
        s = torch.full((4,), 2.0)
        return x * s, torch.cumsum(s, 0)


def test_constant_handed_out_by_a_blob_is_copied():
    x = torch.randn(3, 4)
    edge, _ = lower(ConstantOutput(), (x,))
    (blob,) = edge_blobs(edge)
    outputs = kiln.run_blob(blob.processed_bytes, [x])
    reference = flat(blob.original_module.module()(x))
    assert_close(outputs, reference, models.F32_TOLERANCE, "constant output")


def _node(graph, target, args, val, kwargs=None):
    node = graph.call_function(target, args, kwargs or {})
    node.meta["val"] = val
    return node


def _placeholder(graph, name, val):
    node = graph.placeholder(name)
    node.meta["val"] = val
    return node


def test_sdpa_refusals():
    graph = torch.fx.Graph()
    q = _placeholder(graph, "q", torch.randn(1, 2, 4, 8))
    kv = _placeholder(graph, "kv", torch.randn(1, 1, 4, 8))
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    val = torch.randn(1, 2, 4, 8)
    plain = _node(graph, sdpa, (q, q, q), val)
    dropout = _node(graph, sdpa, (q, q, q, None, 0.1), val)
    gqa = _node(graph, sdpa, (q, kv, kv), val, {"enable_gqa": True})
    kv3 = _placeholder(graph, "kv3", torch.randn(1, 3, 4, 8))
    uneven = _node(graph, sdpa, (q, kv3, kv3), val, {"enable_gqa": True})
    assert lowering.refusal(plain) is None
    assert "dropout_p=0.1" in lowering.refusal(dropout)
    assert lowering.refusal(gqa) is None  # grouped-query heads: 2 query heads share 1 k,v head
    assert "k,v heads (dim -3) may divide q's" in lowering.refusal(uneven)


def test_softmax_to_another_dtype_is_refused_by_the_inferred_dtype():
    graph = torch.fx.Graph()
    x = _placeholder(graph, "x", torch.randn(2, 4).half())
    node = _node(graph, torch.ops.aten._softmax.default, (x, -1, True), torch.randn(2, 4))
    assert "PyTorch computed f32" in lowering.refusal(node)


def test_preprocess_refuses_a_lowering_that_disagrees_with_pytorch(monkeypatch):
    # A lowering that loses the output's shape must fail loudly, not build a wrong plan.
    wrong = lowering.Lowering(lambda ctx, node: ctx.tensor(node.args[0]))
    monkeypatch.setitem(lowering.LOWERINGS, torch.ops.aten.sum.dim_IntList, wrong)
    graph = torch.fx.Graph()
    x = _placeholder(graph, "x", torch.randn(2, 4))
    node = _node(graph, torch.ops.aten.sum.dim_IntList, (x, [1]), torch.randn(2))
    assert "PyTorch computed f32[2]" in lowering.refusal(node)


# ------------------------------------------------------------------ every op, alone

aten = torch.ops.aten
dim_order_ops = torch.ops.dim_order_ops
INT64_MAX = 2**63 - 1


def rand(*shape, seed=0, dtype=torch.float32, positive=False):
    values = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    return (values.abs() + 0.1 if positive else values).to(dtype)


def ids(*shape, high, seed=0):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def causal_mask(length):
    return torch.ones(length, length, dtype=torch.bool).tril()


ROUNDING = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.7, 2.7, -0.0, 3.0, 1e-3, float("nan"), float("inf"),
                         -float("inf")])
HUGE = torch.tensor([9e6 + 0.5, -1e10, 1e20, 3e38, -3e38])  # integers already; past i64 too

# grid_sample's grid [2, 4, 7, 2]: points within and past [-1, 1], a row of zeros (a tie between
# two cells for nearest, align_corners=False over 6 columns) and two exact corners
SAMPLES = torch.rand(2, 4, 7, 2, generator=torch.Generator().manual_seed(7)) * 2.4 - 1.2
SAMPLES[0, 0, :3] = 0.0
SAMPLES[1, 1, 2] = torch.tensor([1.0, -1.0])

# (id, op, args, kwargs): each tensor argument becomes a blob input.
OP_CASES = [
    ("linear", aten.linear.default, (rand(2, 3, 4), rand(5, 4, seed=1), rand(5, seed=2)), {}),
    ("linear_no_bias", aten.linear.default, (rand(3, 4), rand(5, 4, seed=1)), {}),
    ("addmm", aten.addmm.default, (rand(5), rand(3, 4, seed=1), rand(4, 5, seed=2)), {}),
    ("mm", aten.mm.default, (rand(3, 4), rand(4, 5, seed=1)), {}),
    ("bmm", aten.bmm.default, (rand(2, 3, 4), rand(2, 4, 5, seed=1)), {}),
    ("matmul", aten.matmul.default, (rand(2, 3, 4), rand(2, 4, 5, seed=1)), {}),
    ("add", aten.add.Tensor, (rand(2, 3), rand(3, seed=1)), {"alpha": 2}),
    ("add_number", aten.add.Tensor, (rand(2, 3), 2), {}),
    ("add_scalar", aten.add.Scalar, (rand(2, 3), 2.5, 3), {}),
    ("sub", aten.sub.Tensor, (rand(2, 3), rand(2, 1, seed=1)), {"alpha": 0.5}),
    ("sub_scalar", aten.sub.Scalar, (rand(2, 3), 1.5), {}),
    ("mul", aten.mul.Tensor, (rand(2, 3), rand(2, 3, seed=1)), {}),
    ("mul_scalar", aten.mul.Scalar, (rand(2, 3), -3.0), {}),
    ("div", aten.div.Tensor, (rand(2, 3), rand(2, 3, seed=1, positive=True)), {}),
    ("div_scalar", aten.div.Scalar, (rand(2, 3), 4.0), {}),
    ("promoted", aten.mul.Tensor, (rand(2, 3, dtype=torch.float16), rand(seed=1)), {}),
    ("add_int", aten.add.Tensor, (ids(2, 3, high=9), ids(3, high=9, seed=1)), {"alpha": 3}),
    ("add_int_to_float", aten.add.Tensor, (ids(2, 3, high=9), 0.5), {}),
    ("sub_int32", aten.sub.Tensor, (ids(2, 3, high=9).int(), 1), {}),
    ("mul_int", aten.mul.Tensor, (ids(2, 3, high=9) - 4, ids(2, 1, high=9, seed=1)), {}),
    ("div_int", aten.div.Tensor, (ids(2, 3, high=9), ids(2, 3, high=9, seed=1) + 1), {}),
    ("div_int_scalar", aten.div.Tensor, (ids(2, 3, high=9).int(), 4), {}),
    ("relu", aten.relu.default, (rand(2, 3),), {}),
    ("gelu", aten.gelu.default, (rand(2, 3),), {}),
    ("gelu_tanh", aten.gelu.default, (rand(2, 3),), {"approximate": "tanh"}),
    ("silu", aten.silu.default, (rand(2, 3),), {}),
    ("sigmoid", aten.sigmoid.default, (rand(2, 3),), {}),
    ("tanh", aten.tanh.default, (rand(2, 3),), {}),
    ("exp", aten.exp.default, (rand(2, 3),), {}),
    ("sqrt", aten.sqrt.default, (rand(2, 3, positive=True),), {}),
    ("rsqrt", aten.rsqrt.default, (rand(2, 3, positive=True),), {}),
    ("neg", aten.neg.default, (rand(2, 3),), {}),
    ("pow", aten.pow.Tensor_Scalar, (rand(2, 3, positive=True), 1.5), {}),
    ("abs", aten.abs.default, (rand(2, 3),), {}),
    ("abs_int", aten.abs.default, (ids(2, 3, high=9) - 4,), {}),
    ("log", aten.log.default, (rand(2, 3, positive=True),), {}),
    ("log_int", aten.log.default, (ids(2, 3, high=9) + 1,), {}),
    ("cos", aten.cos.default, (rand(2, 3) * 4,), {}),
    ("sin", aten.sin.default, (rand(2, 3, dtype=torch.float16) * 4,), {}),
    ("erf", aten.erf.default, (rand(2, 3),), {}),
    ("hardswish", aten.hardswish.default, (rand(4, 5) * 4,), {}),
    ("hardsigmoid", aten.hardsigmoid.default, (rand(4, 5) * 4,), {}),
    ("hardtanh", aten.hardtanh.default, (rand(4, 5) * 4, 0.0, 6.0), {}),
    ("minimum", aten.minimum.default, (rand(2, 3), rand(3, seed=1)), {}),
    ("minimum_int", aten.minimum.default, (ids(2, 3, high=9), ids(2, 1, high=9, seed=1)), {}),
    ("maximum", aten.maximum.default, (rand(2, 1), rand(2, 3, seed=1)), {}),
    ("maximum_promoted", aten.maximum.default, (ids(2, 3, high=9), rand(3, seed=1) * 5), {}),
    ("clamp", aten.clamp.default, (rand(3, 4), -0.5, 0.5), {}),
    ("clamp_min", aten.clamp.default, (rand(3, 4), -0.5), {}),
    ("clamp_max", aten.clamp.default, (rand(3, 4),), {"max": 0.25}),
    ("clamp_min_above_max", aten.clamp.default, (rand(3, 4), 0.5, -0.5), {}),
    ("clamp_int_to_float", aten.clamp.default, (ids(3, 4, high=9), 2.5), {}),
    ("clamp_tensor", aten.clamp.Tensor, (rand(3, 4), rand(4, seed=1) - 1, rand(3, 1, seed=2) + 1), {}),
    ("clamp_tensor_max", aten.clamp.Tensor, (rand(3, 4), None, rand(4, seed=1)), {}),
    ("eq", aten.eq.Tensor, (ids(2, 3, high=3), ids(3, high=3, seed=1)), {}),
    ("eq_scalar", aten.eq.Scalar, (ids(2, 3, high=3).int(), 1), {}),
    ("ne", aten.ne.Tensor, (rand(2, 3) > 0, rand(2, 1, seed=1) > 0), {}),
    ("ne_scalar", aten.ne.Scalar, (ids(2, 3, high=3), 0), {}),
    ("lt", aten.lt.Tensor, (rand(2, 3), rand(2, 1, seed=1)), {}),
    ("lt_scalar", aten.lt.Scalar, (torch.arange(6).view(2, 3), 2.5), {}),  # 2 < 2.5, not < 2
    ("le", aten.le.Tensor, (ids(4, 1, high=4), ids(4, high=4, seed=1)), {}),
    ("le_scalar", aten.le.Scalar, (rand(2, 3, dtype=torch.float16), 0.1), {}),
    ("gt", aten.gt.Tensor, (rand(2, 3, dtype=torch.float16), rand(seed=1)), {}),  # stays f16
    ("gt_scalar", aten.gt.Scalar, (rand(2, 3, dtype=torch.bfloat16), -0.25), {}),
    ("ge", aten.ge.Tensor, (torch.arange(6).view(2, 3), torch.tensor([0.5, 1.5, 2.5])), {}),  # in f32
    # a 0-dim f32 operand promotes like a number: compared in f16, where 0.1 rounds down
    ("ge_zero_dim", aten.ge.Tensor, (torch.tensor([0.1, 0.2], dtype=torch.float16), torch.tensor(0.1)), {}),
    ("ge_scalar", aten.ge.Scalar, (ids(2, 3, high=5).int(), 2), {}),
    ("logical_and", aten.logical_and.default, (rand(2, 3) > 0, ids(3, high=2)), {}),
    ("logical_or", aten.logical_or.default, (rand(2, 3), rand(2, 1, seed=1) > 0), {}),
    ("logical_xor", aten.logical_xor.default, (rand(2, 3) > 0, rand(2, 3, seed=1) > 0), {}),
    ("logical_not", aten.logical_not.default, (ids(2, 3, high=3),), {}),
    ("bitwise_and", aten.bitwise_and.Tensor, (rand(2, 3) > 0, rand(3, seed=1) > 0), {}),
    ("bitwise_and_scalar", aten.bitwise_and.Scalar, (ids(2, 3, high=16), 6), {}),
    ("bitwise_or", aten.bitwise_or.Tensor, (ids(2, 3, high=16).int(), ids(2, 3, high=16, seed=1).int()), {}),
    ("bitwise_or_scalar", aten.bitwise_or.Scalar, (rand(2, 3) > 0, True), {}),
    ("bitwise_xor", aten.bitwise_xor.Tensor, (rand(2, 3) > 0, ids(2, 3, high=4)), {}),
    ("bitwise_xor_scalar", aten.bitwise_xor.Scalar, (ids(2, 3, high=16), 5), {}),
    ("bitwise_not", aten.bitwise_not.default, (rand(2, 3) > 0,), {}),
    ("bitwise_not_int", aten.bitwise_not.default, (ids(2, 3, high=16) - 8,), {}),
    ("_softmax", aten._softmax.default, (rand(2, 3, 4), -1, False), {}),
    ("softmax", aten.softmax.int, (rand(2, 3, 4), 1), {}),
    ("_log_softmax", aten._log_softmax.default, (rand(2, 5), 1, False), {}),
    ("log_softmax", aten.log_softmax.int, (rand(2, 5), -1), {}),
    ("layer_norm", aten.layer_norm.default, (rand(2, 3, 4), [3, 4], rand(3, 4, seed=1), rand(3, 4, seed=2), 1e-5), {}),
    ("layer_norm_bare", aten.layer_norm.default, (rand(2, 4), [4]), {}),
    ("native_layer_norm", aten.native_layer_norm.default, (rand(2, 4), [4], None, rand(4, seed=1), 1e-3), {}),
    ("rms_norm", aten.rms_norm.default, (rand(2, 4), [4], rand(4, seed=1)), {}),
    ("rms_norm_eps", aten.rms_norm.default, (rand(2, 3, 4), [3, 4], None, 1e-2), {}),
    ("mean", aten.mean.dim, (rand(2, 3, 4), [-1], True), {}),
    ("mean_all", aten.mean.dim, (rand(2, 3), None), {}),
    ("sum", aten.sum.dim_IntList, (rand(2, 3, 4), [0, 2]), {}),
    ("sum_all", aten.sum.dim_IntList, (rand(2, 3), []), {}),
    # a dtype asked for is the input's before the sum; bools are counted (in f32, exact below 2^24)
    ("sum_f16_into_f32", aten.sum.dim_IntList, (rand(2, 3, 40, dtype=torch.float16), [-1]), {"dtype": torch.float32}),
    ("sum_int_into_f32", aten.sum.dim_IntList, (ids(3, 5, high=9) - 4, [1], True), {"dtype": torch.float32}),
    ("sum_bool_count", aten.sum.dim_IntList, (rand(3, 50) > 0.3, [1]), {}),
    ("sum_bool_count_all", aten.sum.dim_IntList, (rand(2, 3, 4) > 0, []), {}),
    ("sum_bool_into_i32", aten.sum.dim_IntList, (rand(4, 6) < 0, [0], True), {"dtype": torch.int32}),
    ("mean_f16_into_f32", aten.mean.dim, (rand(2, 3, 40, dtype=torch.float16), [1]), {"dtype": torch.float32}),
    ("amax", aten.amax.default, (rand(2, 3, 4), [1]), {}),
    ("view_copy", aten.view_copy.default, (rand(2, 3, 4), [6, -1]), {}),
    ("view", aten.view.default, (rand(2, 3, 4), [4, 6]), {}),
    ("reshape", aten.reshape.default, (rand(2, 3, 4), [24]), {}),
    ("_unsafe_view", aten._unsafe_view.default, (rand(2, 3, 4), [2, 12]), {}),
    ("squeeze_copy_dims", aten.squeeze_copy.dims, (rand(2, 1, 3, 1), [1, -1]), {}),
    ("squeeze_copy_dim", aten.squeeze_copy.dim, (rand(2, 1, 3), 1), {}),
    ("squeeze_copy", aten.squeeze_copy.default, (rand(1, 3, 1),), {}),
    ("squeeze_dims", aten.squeeze.dims, (rand(2, 1, 3, 1), [3]), {}),
    ("squeeze_dim", aten.squeeze.dim, (rand(1, 3), 0), {}),
    ("squeeze", aten.squeeze.default, (rand(1, 3, 1),), {}),
    ("unsqueeze_copy", aten.unsqueeze_copy.default, (rand(2, 3), -1), {}),
    ("unsqueeze", aten.unsqueeze.default, (rand(2, 3), 0), {}),
    ("permute_copy", aten.permute_copy.default, (rand(2, 3, 4), [2, 0, -2]), {}),
    ("permute", aten.permute.default, (rand(2, 3, 4), [1, 2, 0]), {}),
    ("transpose_copy", aten.transpose_copy.int, (rand(2, 3, 4), 0, -1), {}),
    ("transpose", aten.transpose.int, (rand(2, 3, 4), 1, 2), {}),
    ("t_copy", aten.t_copy.default, (rand(3, 4),), {}),
    ("t", aten.t.default, (rand(4, 3),), {}),
    ("expand_copy", aten.expand_copy.default, (rand(1, 4), [3, -1]), {}),
    ("expand", aten.expand.default, (rand(3, 1), [2, 3, 5]), {}),
    ("cat", aten.cat.default, ([rand(2, 3), rand(2, 1, seed=1), rand(2, 2, seed=2)], -1), {}),
    ("slice_copy", aten.slice_copy.Tensor, (rand(3, 8), 1, -3, INT64_MAX), {}),
    ("slice_copy_step", aten.slice_copy.Tensor, (rand(3, 8), 1, 1, 7, 2), {}),
    ("slice", aten.slice.Tensor, (rand(6, 2), 0, None, 4), {}),
    ("select_copy", aten.select_copy.int, (rand(2, 3, 4), 1, -1), {}),
    ("select", aten.select.int, (rand(2, 3, 4), -1, 2), {}),
    ("clone", aten.clone.default, (rand(2, 3),), {}),
    ("_to_copy", aten._to_copy.default, (rand(2, 3),), {"dtype": torch.float16}),
    ("_to_copy_int", aten._to_copy.default, (ids(2, 3, high=9),), {"dtype": torch.float32}),
    ("_clone_dim_order", dim_order_ops._clone_dim_order.default, (rand(2, 3),), {"dim_order": [0, 1]}),
    ("_to_dim_order_copy", dim_order_ops._to_dim_order_copy.default, (rand(2, 3),), {"dtype": torch.bfloat16}),
    ("as_strided_copy", aten.as_strided_copy.default, (rand(2, 6, 1, 1), [2, 6, 1, 1], [6, 1, 6, 6]), {}),
    ("as_strided", aten.as_strided.default, (rand(3, 4), [2, 6]), {"stride": [6, 1]}),
    ("embedding", aten.embedding.default, (rand(10, 4), ids(2, 3, high=10)), {}),
    ("embedding_i32", aten.embedding.default, (rand(10, 4), ids(5, high=10).int()), {}),
    ("index_select", aten.index_select.default, (rand(2, 5), -1, ids(3, high=5)), {}),
    ("where", aten.where.self, (rand(2, 3) > 0, rand(2, 3, seed=1), rand(3, seed=2)), {}),
    ("masked_fill", aten.masked_fill.Scalar, (rand(2, 3), rand(2, 3, seed=1) > 0, -1.5), {}),
    ("sdpa", aten.scaled_dot_product_attention.default,
     (rand(1, 2, 4, 8), rand(1, 2, 4, 8, seed=1), rand(1, 2, 4, 8, seed=2)), {}),
    ("sdpa_causal", aten.scaled_dot_product_attention.default,
     (rand(2, 5, 8), rand(2, 5, 8, seed=1), rand(2, 5, 8, seed=2)), {"is_causal": True}),
    ("sdpa_bool_mask", aten.scaled_dot_product_attention.default,
     (rand(2, 4, 8), rand(2, 4, 8, seed=1), rand(2, 4, 8, seed=2), causal_mask(4)), {"scale": 0.3}),
    ("sdpa_float_mask", aten.scaled_dot_product_attention.default,
     (rand(2, 4, 8), rand(2, 6, 8, seed=1), rand(2, 6, 4, seed=2), rand(4, 6, seed=3)), {}),
    ("conv2d", aten.convolution.default,
     (rand(2, 4, 7, 6), rand(6, 2, 3, 2, seed=1), rand(6, seed=2), [2, 1], [1, 1], [2, 1], False, [0, 0], 2), {}),
    ("conv2d_depthwise", aten.convolution.default,
     (rand(1, 3, 5, 5), rand(3, 1, 3, 3, seed=1), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 3), {}),
    ("conv1d", aten.convolution.default,
     (rand(2, 3, 9), rand(4, 3, 3, seed=1), rand(4, seed=2), [2], [1], [2], False, [0], 1), {}),
    ("conv_transpose2d", aten.convolution.default,
     (rand(1, 4, 3, 4), rand(4, 3, 3, 3, seed=1), rand(6, seed=2), [2, 2], [1, 1], [1, 1], True, [1, 1], 2), {}),
    ("conv_transpose1d", aten.convolution.default,
     (rand(1, 2, 5), rand(2, 3, 4, seed=1), None, [3], [1], [1], True, [2], 1), {}),
    # a 3-d patch (tubelet) embedding, as a linear: sizes not whole patches drop their rest
    ("conv3d_patches", aten.convolution.default,
     (rand(2, 3, 5, 18, 17), rand(8, 3, 2, 4, 4, seed=1), rand(8, seed=2), [2, 4, 4], [0, 0, 0], [1, 1, 1],
      False, [0, 0, 0], 1), {}),
    ("conv3d_patches_no_bias", aten.convolution.default,
     (rand(1, 2, 4, 6, 6), rand(5, 2, 2, 3, 3, seed=1), None, [2, 3, 3], [0], [1], False, [0], 1), {}),
    ("batch_norm", aten._native_batch_norm_legit_no_training.default,
     (rand(2, 3, 4, 5), rand(3, seed=1), rand(3, seed=2), rand(3, seed=3), rand(3, seed=4, positive=True), 0.1, 1e-5), {}),
    ("batch_norm_bare", aten._native_batch_norm_legit_no_training.default,
     (rand(2, 3, 4), None, None, rand(3, seed=3), rand(3, seed=4, positive=True), 0.1, 1e-3), {}),
    ("max_pool2d_with_indices", aten.max_pool2d_with_indices.default, (rand(2, 3, 9, 8), [3, 3], [2, 2], [1, 1]), {}),
    ("max_pool2d_ceil", aten.max_pool2d_with_indices.default,
     (rand(1, 2, 8, 7), [3, 2], [2, 2], [0, 1], [1, 2], True), {}),
    ("max_pool2d", aten.max_pool2d.default, (rand(1, 2, 6, 6), [2, 2]), {}),
    ("avg_pool2d", aten.avg_pool2d.default, (rand(2, 3, 7, 7), [3, 3], [2, 2], [1, 1]), {}),
    ("avg_pool2d_exclude_pad_ceil", aten.avg_pool2d.default,
     (rand(1, 2, 8, 7), [3, 3], [2, 2], [1, 1], True, False), {}),
    ("avg_pool2d_ceil_last_window_dropped", aten.avg_pool2d.default, (rand(1, 1, 5, 5), [2, 2], [2, 2], [1, 1], True), {}),
    ("avg_pool2d_divisor", aten.avg_pool2d.default, (rand(1, 2, 6, 6), [2, 3], [], [0, 1], False, True, 5), {}),
    ("_adaptive_avg_pool2d", aten._adaptive_avg_pool2d.default, (rand(2, 3, 7, 5), [3, 4]), {}),
    ("adaptive_avg_pool2d_global", aten.adaptive_avg_pool2d.default, (rand(2, 3, 7, 5), [1, 1]), {}),
    ("upsample_nearest2d_vec", aten.upsample_nearest2d.vec, (rand(1, 2, 3, 5), None, [2.0, 1.7]), {}),
    ("upsample_nearest2d", aten.upsample_nearest2d.default, (rand(1, 2, 3, 5), [7, 9]), {}),
    ("upsample_bilinear2d_vec", aten.upsample_bilinear2d.vec, (rand(1, 2, 3, 5), [6, 7], False, None), {}),
    ("upsample_bilinear2d_align", aten.upsample_bilinear2d.vec, (rand(1, 2, 3, 5), None, True, [2.0, 1.5]), {}),
    ("upsample_bilinear2d", aten.upsample_bilinear2d.default, (rand(1, 2, 4, 3), [5, 8], False), {}),
    ("full", aten.full.default, ([2, 3], 1.5), {"dtype": torch.float32}),
    ("scalar_tensor", aten.scalar_tensor.default, (-2.0,), {"dtype": torch.float32}),
    ("cumsum", aten.cumsum.default, (rand(2, 5), 1), {}),
    ("cumsum_bool", aten.cumsum.default, (rand(1, 16) > 0, -1), {}),
    ("cumsum_i32", aten.cumsum.default, (ids(2, 6, high=5).int(), 1), {"dtype": torch.int32}),
    ("cumsum_to_float", aten.cumsum.default, (ids(3, 4, high=9), 0), {"dtype": torch.float32}),
    ("cumsum_f16", aten.cumsum.default, (rand(4, 3), 0), {"dtype": torch.float16}),
    ("gather", aten.gather.default, (rand(3, 5), 1, ids(3, 4, high=5)), {}),
    ("gather_dim0_i32", aten.gather.default, (rand(4, 3), 0, ids(2, 3, high=4).int()), {}),
    ("index", aten.index.Tensor, (rand(4, 5), [ids(3, high=4)]), {}),
    ("index_second_dim", aten.index.Tensor, (rand(2, 4, 5), [None, ids(2, 3, high=4)]), {}),
    ("index_broadcast", aten.index.Tensor,
     (ids(1, 16, high=9) > 4, [ids(1, 1, 1, 1, high=1), ids(1, 1, 16, 1, high=16)]), {}),
    ("index_apart", aten.index.Tensor, (rand(3, 4, 5), [ids(2, high=3), None, ids(2, high=5, seed=1)]), {}),
    ("index_apart_inner", aten.index.Tensor,
     (rand(2, 3, 4, 5), [None, ids(2, high=3), None, ids(1, high=5, seed=1)]), {}),
    ("index_negative", aten.index.Tensor, (rand(4, 5), [torch.tensor([-1, 0, -4])]), {}),
    ("argmax", aten.argmax.default, (rand(3, 7), 1), {}),
    ("argmax_keepdim", aten.argmax.default, (rand(3, 4, 5), 0, True), {}),
    ("argmax_all", aten.argmax.default, (rand(3, 4),), {}),
    ("argmax_all_keepdim", aten.argmax.default, (rand(3, 4), None, True), {}),
    ("argmax_ties", aten.argmax.default, (ids(4, 6, high=3), -1), {}),
    # A KV-cache write: whole slots along one dim at given positions (functional here; a state's
    # write in place is tests/python/test_generation.py's).
    ("index_put_slots", aten.index_put.default, (rand(1, 2, 6, 4), [None, None, torch.tensor([4, 1])],
                                                 rand(1, 2, 2, 4, seed=1)), {}),
    ("index_copy", aten.index_copy.default, (rand(5, 3), 0, torch.tensor([3, 0]), rand(2, 3, seed=1)), {}),
    # slice_scatter (what `y[:, 2:5] = z` on a copy becomes): a run inside, at the start, to the
    # end from a negative start, and the whole dim
    ("slice_scatter", aten.slice_scatter.default, (rand(2, 7, 3), rand(2, 3, 3, seed=1), 1, 2, 5), {}),
    ("slice_scatter_head", aten.slice_scatter.default, (rand(4, 5), rand(2, 5, seed=1), 0, None, 2), {}),
    ("slice_scatter_tail", aten.slice_scatter.default, (rand(3, 6), rand(3, 2, seed=1), -1, -2), {}),
    ("slice_scatter_whole", aten.slice_scatter.default, (rand(2, 3), rand(2, 3, seed=1)), {}),
    ("copy_broadcast", aten.copy.default, (rand(2, 3), rand(3, seed=1)), {}),
    ("copy_cast", aten.copy.default, (ids(1, high=9), rand(1, seed=1) * 9), {}),
    ("split_with_sizes_copy", aten.split_with_sizes_copy.default, (rand(1, 4, 12), [3, 4, 5], 2), {}),
    ("split_with_sizes", aten.split_with_sizes.default, (rand(6, 2), [2, 4]), {}),
    ("split_copy", aten.split_copy.Tensor, (rand(2, 7), 3, -1), {}),
    ("split", aten.split.Tensor, (rand(5, 3), 2), {}),
    ("alias_copy", aten.alias_copy.default, (rand(2, 3),), {}),
    ("alias", aten.alias.default, (rand(2, 3),), {}),
    ("full_like", aten.full_like.default, (rand(2, 3), 7.0), {}),
    ("full_like_int", aten.full_like.default, (rand(2, 3), 3), {"dtype": torch.int64}),
    ("zeros_like", aten.zeros_like.default, (rand(2, 3, dtype=torch.float16),), {}),
    ("ones_like", aten.ones_like.default, (ids(4, high=3),), {}),
    ("zeros", aten.zeros.default, ([2, 3],), {}),
    ("ones", aten.ones.default, ([4],), {"dtype": torch.int32}),
    ("arange", aten.arange.default, (5,), {}),
    ("arange_start", aten.arange.start, (2, 9), {}),
    ("arange_start_step", aten.arange.start_step, (0, 16, 3), {"dtype": torch.float32}),
    ("arange_fractional", aten.arange.start_step, (0.5, 2.0, 0.25), {}),
    ("cat_many", aten.cat.default, ([rand(2, k + 1, seed=k) for k in range(11)], 1), {}),
    # repeat: tiled dims, unit ones, and more repeats than the tensor has dims
    ("repeat", aten.repeat.default, (rand(2, 1, 3), [1, 4, 2]), {}),
    ("repeat_more_dims", aten.repeat.default, (rand(3, 2), [2, 1, 3]), {}),
    ("constant_pad", aten.constant_pad_nd.default, (rand(2, 3, 4), [1, 2, -1, 1], 0.5), {}),
    ("group_norm", aten.native_group_norm.default,
     (rand(2, 6, 5), rand(6, seed=1), rand(6, seed=2), 2, 6, 5, 3, 1e-5), {}),
    # batch statistics: instance norm's (the batch folded into the channels) and several samples'
    ("batch_norm_stats_instance", aten._native_batch_norm_legit.no_stats,
     (rand(1, 6, 5, 4) * 3 + 2, rand(6, seed=1), rand(6, seed=2), True, 0.1, 1e-5), {}),
    ("batch_norm_stats_batch", aten._native_batch_norm_legit.no_stats,
     (rand(3, 4, 5) * 2 - 1, None, None, True, 0.1, 1e-3), {}),
    ("log1p", aten.log1p.default, (rand(3, 4, positive=True),), {}),
    ("neg_int", aten.neg.default, (ids(3, 4, high=9),), {}),
    # remainder by a power of two, negative dividends too (Python's sign: the divisor's)
    ("remainder_pow2", aten.remainder.Scalar, (ids(3, 5, high=100000) - 50000, 1024), {}),
    ("remainder_pow2_i32", aten.remainder.Scalar, ((ids(4, 4, high=64, seed=1) - 32).int(), 8), {}),
    ("topk", aten.topk.default, (rand(3, 7), 2), {}),
    # 3-d convolutions as 2-d ones over frames: time padding, stride and dilation, groups;
    # frames alone (kernel 1 in time), time alone (1 x 1 cells), depthwise
    ("conv3d", aten.convolution.default,
     (rand(2, 4, 5, 6, 7), rand(6, 2, 3, 3, 2, seed=1), rand(6, seed=2), [2, 1, 2], [1, 1, 0], [1, 2, 1], False,
      [0, 0, 0], 2), {}),
    ("conv3d_frames", aten.convolution.default,
     (rand(1, 3, 4, 6, 6), rand(5, 3, 1, 3, 3, seed=1), None, [1], [0, 1, 1], [1], False, [0], 1), {}),
    ("conv3d_time", aten.convolution.default,
     (rand(1, 3, 6, 4, 4), rand(5, 3, 3, 1, 1, seed=1), rand(5, seed=2), [2, 1, 1], [1, 0, 0], [1], False, [0], 1), {}),
    ("conv3d_depthwise", aten.convolution.default,
     (rand(2, 4, 5, 6, 6), rand(4, 1, 3, 3, 3, seed=1), rand(4, seed=2), [1, 2, 2], [1], [1], False, [0], 4), {}),
    ("max_pool3d", aten.max_pool3d_with_indices.default, (rand(2, 3, 5, 7, 6), [3, 3, 3], [2, 2, 2], [1, 1, 1]), {}),
    ("max_pool3d_ceil_dilated", aten.max_pool3d_with_indices.default,
     (rand(1, 2, 6, 7, 8), [2, 3, 2], [2, 2, 3], [1, 1, 0], [2, 1, 1], True), {}),
    ("avg_pool3d", aten.avg_pool3d.default, (rand(2, 3, 5, 7, 6), [3, 3, 3], [2, 2, 2], [1, 1, 1]), {}),
    ("avg_pool3d_exclude_pad_ceil", aten.avg_pool3d.default,
     (rand(1, 2, 6, 7, 8), [2, 3, 3], [2, 2, 2], [1, 1, 1], True, False), {}),
    ("avg_pool3d_divisor", aten.avg_pool3d.default, (rand(1, 2, 4, 6, 6), [2, 2, 3], [], [0, 1, 1], False, True, 5), {}),
    ("_adaptive_avg_pool3d", aten._adaptive_avg_pool3d.default, (rand(2, 3, 4, 6, 6), [2, 3, 1]), {}),
    ("adaptive_avg_pool3d_global", aten.adaptive_avg_pool3d.default, (rand(1, 3, 4, 5, 6), [1, 1, 1]), {}),
    ("avg_pool1d", aten.avg_pool1d.default, (rand(2, 3, 9), [3], [2], [1]), {}),
    ("avg_pool1d_unbatched_ceil", aten.avg_pool1d.default, (rand(3, 8), [3], [2], [1], True, False), {}),
    ("adaptive_avg_pool1d", aten.adaptive_avg_pool1d.default, (rand(2, 3, 10), [4]), {}),
    # reductions composed of amax, argmax, mean and sum
    ("argmin", aten.argmin.default, (rand(3, 7), 1), {}),
    ("argmin_all_ties", aten.argmin.default, (ids(4, 6, high=3),), {}),
    ("amin", aten.amin.default, (rand(2, 3, 4), [0, 2], True), {}),
    ("max_dim", aten.max.dim, (rand(3, 5, 4), 1), {}),
    ("min_dim", aten.min.dim, (rand(3, 5), -1, True), {}),
    ("mean_default", aten.mean.default, (rand(2, 3, 4),), {}),
    ("mean_default_dtype", aten.mean.default, (rand(2, 3, dtype=torch.float16),), {"dtype": torch.float32}),
    ("var_correction", aten.var.correction, (rand(2, 5, 4) * 3 + 1, [1]), {"correction": 0, "keepdim": True}),
    ("var_correction_all", aten.var.correction, (rand(3, 4) * 2 + 5,), {}),
    ("var_dim", aten.var.dim, (rand(4, 6), [0, 1], True), {}),
    ("any", aten.any.default, (torch.tensor([[0.0, 0.0], [0.0, float("nan")]]),), {}),
    ("any_dim", aten.any.dim, (torch.tensor([[0.0, -2.0, 0.0], [0.0, 0.0, 0.0], [1.5, 0.0, 0.0]]), 1), {}),
    ("any_dim_int", aten.any.dim, (ids(3, 4, high=3) * (ids(3, 1, high=2, seed=1)), 1), {}),
    ("any_dims_bool", aten.any.dims, (rand(2, 3, 4) > 1.0, [0, 2], True), {}),
    # pointwise ops composed of Kiln's
    ("leaky_relu", aten.leaky_relu.default, (rand(3, 4), 0.2), {}),
    ("elu", aten.elu.default, (rand(3, 4) * 3, 0.7, 1.2, 0.5), {}),
    ("reciprocal", aten.reciprocal.default, (rand(3, 4, positive=True),), {}),
    ("isnan", aten.isnan.default, (torch.tensor([1.0, float("nan"), float("inf"), -0.0]),), {}),
    ("isinf", aten.isinf.default, (torch.tensor([1.0, float("nan"), float("inf"), -float("inf")]),), {}),
    ("log2", aten.log2.default, (rand(3, 4, positive=True) * 10,), {}),
    ("log10", aten.log10.default, (rand(3, 4, positive=True) * 100,), {}),
    ("expm1", aten.expm1.default, (torch.tensor([-100.0, -1.0, -1e-9, 0.0, 3e-8, 1e-3, 2.0, 80.0, 100.0]),), {}),
    ("pow_scalar", aten.pow.Scalar, (10000.0, rand(3, 4)), {}),
    # index remaps by constant indices
    ("flip", aten.flip.default, (rand(2, 3, 4), [0, -1]), {}),
    ("reflection_pad1d", aten.reflection_pad1d.default, (rand(2, 3, 5), [2, 3]), {}),
    ("reflection_pad2d", aten.reflection_pad2d.default, (rand(1, 2, 4, 5), [1, 2, 3, 0]), {}),
    ("reflection_pad3d", aten.reflection_pad3d.default, (rand(1, 1, 3, 4, 3), [1, 1, 0, 2, 2, 1]), {}),
    ("replication_pad1d", aten.replication_pad1d.default, (rand(2, 3, 4), [3, 1]), {}),
    ("replication_pad2d", aten.replication_pad2d.default, (rand(1, 2, 3, 4), [2, 0, 1, 3]), {}),
    ("replication_pad3d", aten.replication_pad3d.default, (rand(1, 2, 2, 3, 3), [1, 1, 1, 1, 2, 0]), {}),
    ("select_scatter", aten.select_scatter.default, (rand(2, 5, 3), rand(2, 3, seed=1), 1, -2), {}),
    ("select_scatter_first", aten.select_scatter.default, (rand(3, 4), rand(4, seed=1), 0, 0), {}),
    # scatter of a value: a router's chosen experts masked to -inf (a repeated index too), along dim 0
    # overlap-add of sliding blocks (nn.Fold): borders, strides and dilation leave pixels fewer blocks
    ("col2im", aten.col2im.default, (rand(2, 4 * 9, 9), [6, 6], [3, 3], [1, 1], [1, 1], [2, 2]), {}),
    ("col2im_dilated_unbatched", aten.col2im.default, (rand(3 * 6, 14), [7, 5], [2, 3], [2, 1], [1, 0], [1, 2]), {}),
    ("col2im_half", aten.col2im.default, (rand(1, 2 * 4, 9).half(), [4, 4], [2, 2], [1, 1], [0, 0], [1, 1]), {}),
    # unfold: windows along the last dim, a middle one (their slots moved last), a step leaving a
    # tail out, integers, one window as long as the dim
    ("unfold", aten.unfold_copy.default, (rand(2, 3, 10), 2, 4, 3), {}),
    ("unfold_middle_dim", aten.unfold_copy.default, (rand(2, 11, 5), 1, 3, 2), {}),
    ("unfold_step_past_the_tail", aten.unfold_copy.default, (rand(9, 4), 0, 2, 4), {}),
    ("unfold_int", aten.unfold_copy.default, (ids(3, 8, high=9), -1, 3, 1), {}),
    ("unfold_view_whole", aten.unfold.default, (rand(6, 4), 0, 6, 1), {}),
    ("scatter_value", aten.scatter.value, (rand(3, 6), -1, torch.tensor([[1, 4], [0, 0], [5, 2]]), float("-inf")), {}),
    ("scatter_value_dim0", aten.scatter.value, (rand(4, 3), 0, ids(2, 3, high=4, seed=3), 2.5), {}),
    ("scatter_value_int", aten.scatter.value, (ids(3, 5, high=9), 1, ids(3, 2, high=5, seed=4), 1), {}),
    # rounding: ties, negatives, -0.5, NaN and infinities, and values past 2^23 and past i64
    ("floor", aten.floor.default, (ROUNDING,), {}),
    ("ceil", aten.ceil.default, (ROUNDING,), {}),
    ("trunc", aten.trunc.default, (ROUNDING,), {}),
    ("round", aten.round.default, (ROUNDING,), {}),
    ("round_f16", aten.round.default, (ROUNDING.half(),), {}),
    ("floor_huge", aten.floor.default, (HUGE,), {}),
    ("round_huge", aten.round.default, (HUGE,), {}),
    ("floor_int", aten.floor.default, (ids(2, 3, high=9) - 4,), {}),
    ("sign", aten.sign.default, (ROUNDING,), {}),
    ("sign_int", aten.sign.default, (ids(2, 3, high=9) - 4,), {}),
    # grid_sample: samples inside, past the edges and (the grid's zeros) at ties between cells
    ("grid_sample_bilinear", aten.grid_sampler_2d.default, (rand(2, 3, 5, 6), SAMPLES, 0, 0, False), {}),
    ("grid_sample_bilinear_aligned", aten.grid_sampler_2d.default, (rand(2, 3, 5, 6), SAMPLES, 0, 0, True), {}),
    ("grid_sample_bilinear_border", aten.grid_sampler_2d.default, (rand(2, 3, 5, 6), SAMPLES, 0, 1, False), {}),
    ("grid_sample_bilinear_f16", aten.grid_sampler_2d.default,
     (rand(2, 3, 5, 6, dtype=torch.float16), SAMPLES.half(), 0, 0, True), {}),
    ("grid_sample_nearest", aten.grid_sampler_2d.default, (rand(2, 3, 5, 6), SAMPLES, 1, 0, False), {}),
    ("grid_sample_nearest_border_aligned", aten.grid_sampler_2d.default, (rand(2, 3, 5, 6), SAMPLES, 1, 1, True), {}),
]


def _graph_of(op, args, kwargs):
    """A graph holding op alone, its tensor arguments as placeholders (real tensors as meta)."""
    graph, inputs = torch.fx.Graph(), []

    def place(value):
        if isinstance(value, torch.Tensor):
            inputs.append(value)
            return _placeholder(graph, f"in{len(inputs)}", value)
        if isinstance(value, (list, tuple)):
            return type(value)(place(v) for v in value)
        return value

    fx_args, fx_kwargs = place(args), {k: place(v) for k, v in kwargs.items()}
    expected = op(*args, **kwargs)
    node = _node(graph, op, fx_args, expected, fx_kwargs)
    if isinstance(expected, list):  # a split: every piece is an output, read through getitem
        graph.output(tuple(_node(graph, operator.getitem, (node, i), piece)
                           for i, piece in enumerate(expected)))
        return graph, node, inputs, expected
    if isinstance(expected, tuple):  # native_layer_norm: only its first output is read
        expected = expected[0]
        node = _node(graph, operator.getitem, (node, 0), expected)
    graph.output((node,))
    return graph, node, inputs, [expected]


@pytest.mark.parametrize("name, op, args, kwargs", OP_CASES, ids=[c[0] for c in OP_CASES])
def test_each_op_alone_matches_pytorch(name, op, args, kwargs):
    graph, node, inputs, expected = _graph_of(op, args, kwargs)
    assert lowering.refusal(node) is None
    blob = lowering.build_graph(graph, lambda n: None)
    half = any(e.dtype == torch.float16 for e in expected)
    tolerance = models.F16_TOLERANCE if half else models.F32_TOLERANCE
    assert_close(kiln.run_blob(blob, inputs), expected, tolerance, name)


@pytest.mark.parametrize("op, args", [(aten.max.dim, (rand(3, 5, 4), 1)), (aten.min.dim, (rand(4, 6), -1, True)),
                                      (aten.max.dim, (ids(3, 6, high=3).float(), 0))],
                         ids=["max_dim", "min_dim_keepdim", "max_dim_ties"])
def test_min_and_max_along_a_dim_give_their_indices_too(op, args):
    """Both outputs read: the values and the index of the first extreme, as PyTorch's."""
    graph = torch.fx.Graph()
    x = _placeholder(graph, "x", args[0])
    expected = op(*args)
    node = _node(graph, op, (x,) + args[1:], expected)
    graph.output(tuple(_node(graph, operator.getitem, (node, i), value) for i, value in enumerate(expected)))
    blob = lowering.build_graph(graph, lambda n: None)
    assert_close(kiln.run_blob(blob, [args[0]]), list(expected), models.F32_TOLERANCE, "extremes")


def test_a_scatter_whose_index_is_narrower_than_self_outside_its_dim_is_refused():
    graph, node, _, _ = _graph_of(aten.scatter.value, (rand(3, 6), 1, ids(2, 2, high=6), 0.0), {})
    assert lowering.refusal(node) == ("scatter with an index of shape [2, 2] into [3, 6]: Kiln scatters with an "
                                      "index as large as self in every dim but dim; expand the index to self's "
                                      "shape outside dim")


def _composed_refusal(check, args):
    """check's refusal of a node whose arguments are args, shapes standing for values (sizes no
    real tensor could take)."""
    with mock.patch.object(lowering_composed, "node_args", lambda node: args), \
            mock.patch.object(lowering_composed, "node_value", lambda value: value):
        return check(None)


def test_a_scatter_refusal_stays_within_a_message_for_the_largest_shapes():
    shape = [2 ** 40] * 8
    args = {"self": SimpleNamespace(shape=shape), "index": SimpleNamespace(shape=[1] + shape[1:]), "dim": 1}
    reason = _composed_refusal(lowering_composed.check_scatter_value, args)
    assert reason.startswith("scatter with an index of shape [1, ")
    assert len(reason.encode()) <= 255 and reason.endswith("expand the index to self's shape outside dim")


def test_a_col2im_whose_table_would_bloat_the_blob_is_refused():
    args = {"self": SimpleNamespace(shape=[1, 9, 4096 * 4096], dim=lambda: 3), "output_size": [4096, 4096],
            "kernel_size": [3, 3]}
    reason = _composed_refusal(lowering_composed.check_col2im, args)
    assert reason == ("col2im to 4096x4096 with a 3x3 kernel: its gather table could take 1152 MiB of the blob "
                      "(Kiln's limit 64 MiB); fold a smaller output or in tiles")


class CastCounts(nn.Module):
    """Counts written as bools cast to integers and summed (`mask.long().sum(-1)`), beside a
    count_nonzero, scaling x."""

    def forward(self, x, ids):
        above = (ids > 3).long().sum(-1, keepdim=True)
        odd = (ids % 2 == 1).to(torch.int32).sum(-1, keepdim=True)
        return x * above + odd * torch.count_nonzero(ids, dim=1).unsqueeze(-1)


def test_a_count_of_bools_cast_to_integers_runs_whole():
    assert_whole_and_eager(CastCounts().eval(), (rand(3, 4), ids(3, 9, high=7, seed=2)), "cast counts")


def test_a_sum_kiln_cannot_count_exactly_is_refused_with_its_reason():
    graph, node, _, _ = _graph_of(aten.sum.dim_IntList, (ids(2, 5, high=9), [1]), {})
    assert lowering.refusal(node) == ("sum of torch.int64 into torch.int64 (Kiln sums floats, and counts bools or "
                                      "bools cast to integers); cast the input to a float dtype first")
    graph = torch.fx.Graph()
    flags = [_placeholder(graph, f"x{n}", torch.empty(4096, n, dtype=torch.bool, device="meta")) for n in (4096, 4097)]
    counts = [_node(graph, aten.sum.dim_IntList, (x, [0, 1]), torch.empty((), dtype=torch.int64, device="meta"))
              for x in flags]
    assert lowering._check_sum(counts[0]) is None  # 2^24 bools: every count up to it is exact in f32
    assert lowering.refusal(counts[1]) == ("sum of 16781312 bools an output (f32 counts at most 2^24 exactly); "
                                           "sum fewer at a time, or bound the dynamic dims")


class HaloBlocks(nn.Module):
    """HaloNet's local attention in miniature: each 2x2 block of queries attends to its 4x4 window
    (the block with a halo of 1), the windows cut by unfold along height, then width."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Conv2d(4, 12, 1)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=1)  # [1, 4, 8, 8] each
        q = q.reshape(1, 4, 4, 2, 4, 2).permute(0, 2, 4, 3, 5, 1).reshape(1, 16, 4, 4)
        windows = [F.pad(t, [1, 1, 1, 1]).unfold(2, 4, 2).unfold(3, 4, 2) for t in (k, v)]  # [1, 4, 4, 4, 4, 4]
        k, v = (w.reshape(1, 4, 16, 16).permute(0, 2, 3, 1) for w in windows)
        weights = (q @ k.transpose(-1, -2) / 2).softmax(-1)
        return weights @ v


def test_halo_attention_with_unfolded_windows_runs_whole():
    torch.manual_seed(0)
    assert_whole_and_eager(HaloBlocks().eval(), (torch.randn(1, 4, 8, 8),), "halo blocks")


def test_an_unfold_of_a_bloated_table_or_a_0d_input_is_refused():
    args = {"self": SimpleNamespace(shape=[4, 2 ** 20]), "dimension": -1, "size": 16, "step": 1}
    reason = _composed_refusal(lowering_composed.check_unfold, args)
    assert reason == ("unfold of 1048561 windows of 16: its gather table would take 127 MiB of the blob (Kiln's "
                      "limit 64 MiB); unfold a shorter dim or in pieces")
    args = {"self": SimpleNamespace(shape=[]), "dimension": 0, "size": 1, "step": 1}
    assert _composed_refusal(lowering_composed.check_unfold, args) == ("unfold of a 0-d tensor (Kiln unfolds along "
                                                                       "a dim); reshape it to [1] first")


class Frames(nn.Module):
    def forward(self, x):
        return x.unfold(1, 4, 2) * 2


def test_an_unfold_along_a_dynamic_dim_stays_on_executorch_with_its_reason():
    length = torch.export.Dim("length", min=6, max=64)
    program = kiln.to_executorch(Frames().eval(), (torch.randn(2, 16),), dynamic_shapes=({1: length},))
    left_out = [(out.op, out.reason) for out in program.kiln_report.left_out]
    assert ("aten.unfold_copy.default", "unfold along dim 1, whose size is dynamic (Kiln gathers the windows by "
            "a constant table); export that dim static") in left_out


class ScatterAlongTime(nn.Module):
    def forward(self, x, index):
        return x.scatter(1, index, 0.0) * 2.0


def test_a_scatter_along_a_dynamic_dim_stays_on_executorch_with_its_reason():
    time = torch.export.Dim("time", min=4, max=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = kiln.to_executorch(ScatterAlongTime().eval(), (torch.randn(2, 8), torch.tensor([[1], [3]])),
                                     dynamic_shapes=({1: time}, None))
    left_out = [(out.op, out.reason) for out in program.kiln_report.left_out]
    assert ("aten.scatter.value", "scatter of a value along a dynamic dim (Kiln numbers the slots along dim "
            "statically); export that dim static") in left_out


def test_a_scatter_into_a_0d_tensor_is_refused():
    graph, node, _, _ = _graph_of(aten.scatter.value, (torch.tensor(0.5), 0, torch.tensor(0), 1.0), {})
    assert lowering.refusal(node) == "scatter into a 0-d tensor"


def test_every_lowering_has_a_case():
    covered = {op for _, op, _, _ in OP_CASES}
    lowered = set(lowering.LOWERINGS) - {operator.getitem} - set(lowering._SIZE_TARGETS)  # sizes: test_dynamic_shapes
    assert lowered, "the lowering table is empty"
    assert lowered - covered == set()


# ------------------------------------------------------------------ options and bindings


def test_compile_specs_reach_the_blob_metadata():
    torch.manual_seed(0)
    model, x = nn.Linear(4, 4).eval(), torch.randn(2, 4)
    partitioner = kiln.KilnPartitioner(device_id=1, allow_tf32=True, fuse=False)
    assert parse_compile_specs(partitioner.compile_specs) == {
        "device_id": 1, "allow_tf32": True, "fuse": False,
    }
    edge, _ = lower(model, (x,), partitioner)
    (blob,) = edge_blobs(edge)
    with _lib.Engine(blob.processed_bytes, "cpu") as engine:
        metadata = engine.metadata()
    assert metadata["device_id"] == 1 and metadata["allow_tf32"] is True


class FusableChain(nn.Module):
    def forward(self, x):
        return torch.sigmoid(torch.exp(-x) * 0.5 + 1.0).relu()


def test_fuse_option_reaches_the_builder():
    x = torch.randn(4, 8)
    blobs = {}
    for fuse in (True, False):
        edge, _ = lower(FusableChain(), (x,), kiln.KilnPartitioner(fuse=fuse))
        (blob,) = edge_blobs(edge)
        blobs[fuse] = blob.processed_bytes
        assert_close(kiln.run_blob(blobs[fuse], [x]), [FusableChain()(x)], models.F32_TOLERANCE, f"fuse={fuse}")
    assert blobs[True] != blobs[False]


LONG = "an_input_whose_name_is_longer_than_the_sixty_three_bytes_of_a_binding"


class LongNames(nn.Module):
    def forward(self, an_input_whose_name_is_longer_than_the_sixty_three_bytes_of_a_binding_a,
                an_input_whose_name_is_longer_than_the_sixty_three_bytes_of_a_binding_b):
        return (an_input_whose_name_is_longer_than_the_sixty_three_bytes_of_a_binding_a
                - an_input_whose_name_is_longer_than_the_sixty_three_bytes_of_a_binding_b).relu()


def test_long_names_become_unique_binding_names():
    a, b = torch.randn(3), torch.randn(3)
    edge, _ = lower(LongNames(), (a, b))
    (blob,) = edge_blobs(edge)
    with _lib.Engine(blob.processed_bytes, "cpu") as engine:
        names = [name for name, kind, _, _ in engine.bindings() if kind == _lib.IO_INPUT]
    assert len(set(names)) == 2 and all(n.startswith(LONG[:40]) and len(n) < _lib.NAME_MAX for n in names)
    assert_close(kiln.run_blob(blob.processed_bytes, [a, b]), [(a - b).relu()], models.F32_TOLERANCE, "long")


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="device_id"):
        kiln.KilnPartitioner(device_id=4294967299)
    with pytest.raises(ValueError, match="device_id"):
        kiln.KilnPartitioner(device_id=-1)
    with pytest.raises(ValueError, match="device_id"):
        _lib.Builder().build(device_id=4294967299)
    CompileSpec = kiln.KilnPartitioner().compile_specs[0].__class__
    with pytest.raises(ValueError, match="unknown compile spec"):
        parse_compile_specs([CompileSpec("tf32", b"1")])
    with pytest.raises(ValueError, match="not a non-negative integer"):
        parse_compile_specs([CompileSpec("device_id", b"3.5")])
    with pytest.raises(ValueError, match="must be 0 or 1"):
        parse_compile_specs([CompileSpec("fuse", b"2")])


def test_run_blob_refusals(mlp_blob):
    (x,) = models.BY_NAME["mlp"].inputs()
    with pytest.raises(kiln.KilnError, match="got 0 inputs .* program has 1"):
        kiln.run_blob(mlp_blob, [])
    with pytest.raises(kiln.KilnError, match=r"shape \[3,16\]"):
        kiln.run_blob(mlp_blob, [x[:3]])
    with pytest.raises(TypeError, match="not a torch.Tensor"):
        kiln.run_blob(mlp_blob, [[1.0] * 16])
    with pytest.raises(TypeError, match="float64 has no Kiln dtype"):
        kiln.run_blob(mlp_blob, [x.double()])
    with pytest.raises(ValueError, match="CPU engine cannot read"):
        kiln.run_blob(mlp_blob, [torch.empty(4, 16, device="meta")])
    with pytest.raises(ValueError, match="unknown device"):
        kiln.run_blob(mlp_blob, [x], device="tpu")
    with pytest.raises(kiln.KilnError, match="truncated"):
        kiln.run_blob(b"not a blob", [x])


def test_bindings_match_the_header():
    for index, name in enumerate(_lib.OP_NAMES):
        assert _lib.lib.kiln_op_name(index).decode() == name
    assert _lib.lib.kiln_op_name(len(_lib.OP_NAMES)).decode() == "unknown"
    for index, name in enumerate(_lib.DTYPE_NAMES):
        assert _lib.lib.kiln_dtype_name(index).decode() == name
        size = torch.empty(0, dtype=_lib.torch_dtype(index)).element_size()
        assert _lib.lib.kiln_dtype_size(index) == size
    assert _lib.lib.kiln_dtype_size(len(_lib.DTYPE_NAMES)) == 0


def test_backend_id_matches_the_header():
    with open(os.path.join(ROOT, "include", "kiln", "kiln.h")) as header:
        defines = [line.split() for line in header if line.startswith("#define KILN_BACKEND_ID")]
    assert len(defines) == 1
    assert defines[0][2] == f'"{kiln.KilnBackend.__name__}"' == '"KilnBackend"'


def _import_kiln_with(library):
    env = dict(os.environ, KILN_LIBRARY=str(library))
    return subprocess.run(
        [sys.executable, "-c", "import kiln"], env=env, capture_output=True, text=True,
        cwd=os.path.join(ROOT, "python"), timeout=120,
    )


def test_missing_library_names_the_file_and_the_remedy(tmp_path):
    missing = tmp_path / "libkiln.so"
    result = _import_kiln_with(missing)
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert str(missing) in result.stderr and "make build" in result.stderr


def test_library_without_the_api_is_refused():
    # Any loadable library that is not libkiln: the C math library.
    result = _import_kiln_with("libm.so.6")
    assert result.returncode != 0
    assert "ImportError" in result.stderr and "lacks the symbol kiln_" in result.stderr
