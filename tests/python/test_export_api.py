"""kiln.export takes what torch.export takes (an nn.Module with example inputs, kwargs=, strict=,
dynamic_shapes=, or an ExportedProgram), refuses an unbounded dynamic dimension naming it and anything else
clearly, and reports what stays on ExecuTorch: a warning, or NotWholeError with require_whole."""

import os
import subprocess
import warnings

import pytest
import torch
import torch.nn as nn

import kiln
import models


class Float64Middle(nn.Module):
    """A linear, then arithmetic in float64 (which Kiln refuses), then a linear."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.second((self.first(x).double() * 3.0).float())


class ScaledByKeyword(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, *, scale):
        return self.fc(x) * scale


def mlp():
    entry = models.BY_NAME["mlp"]
    return entry.make(), entry.inputs()


def test_exported_program_is_accepted(tmp_path):
    model, inputs = mlp()
    exported = torch.export.export(model, inputs)
    program = kiln.export(exported, path=tmp_path / "mlp.pte")
    assert len(kiln.blobs(program)) == 1 and program.kiln_report.whole
    assert (tmp_path / "mlp.pte").read_bytes() == program.buffer


def test_strict_kwargs_and_dynamic_shapes_reach_torch_export(monkeypatch):
    seen = {}
    original = torch.export.export

    def spy(model, args, **options):
        seen.update(options)
        return original(model, args, **options)

    monkeypatch.setattr(torch.export, "export", spy)
    x, scale = torch.randn(2, 8), torch.tensor(0.5)
    static = {"x": {0: None}, "scale": None}
    program = kiln.to_executorch(ScaledByKeyword().eval(), (x,), kwargs={"scale": scale}, strict=True,
                                 dynamic_shapes=static)
    assert seen == {"kwargs": {"scale": scale}, "dynamic_shapes": static, "strict": True}
    assert len(kiln.blobs(program)) == 1


def test_unbounded_dynamic_dimension_is_refused_naming_it():
    model, inputs = mlp()
    batch = torch.export.Dim("batch", min=2)
    with pytest.raises(ValueError, match=r"input 'x' dimension 0 is dynamic \(.* in \[2, int_oo\]\) without an "
                                         r"upper bound.*Dim\(name, max=N\)"):
        kiln.to_executorch(model, inputs, dynamic_shapes={"x": {0: batch}})
    exported = torch.export.export(model, inputs, dynamic_shapes={"x": {0: batch}})
    with pytest.raises(ValueError, match="input 'x' dimension 0 is dynamic"):
        kiln.to_executorch(exported)
    bounded = torch.export.Dim("batch", min=2, max=16)
    assert len(kiln.blobs(kiln.to_executorch(model, inputs, dynamic_shapes={"x": {0: bounded}}))) == 1


def test_a_parameter_written_in_forward_is_refused_naming_it():
    """RWKV rescales its weights in place at its first call in eval mode, which ExecuTorch cannot
    lower (its verifier's error names a node of its own); called once, it exports."""
    from test_architectures import ARCHITECTURES

    make, inputs = ARCHITECTURES["rwkv"]
    model = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"kiln: forward writes its parameter 'model\.rwkv\.blocks\.0\.attention"
                                             r"\.output\.weight' in place, which ExecuTorch cannot lower; make that "
                                             r"write before exporting"):
            kiln.to_executorch(model, inputs(1))
        with torch.no_grad():
            model(*inputs(1))
        assert len(kiln.blobs(kiln.to_executorch(model, inputs(1)))) == 1


@pytest.mark.parametrize("model, example_inputs, options, message", [
    ("not a module", (torch.randn(1),), {}, "cannot export a str; pass a torch.nn.Module or"),
    ("mlp", 3, {}, "example_inputs is a int; pass a tuple"),
    ("mlp", None, {"kwargs": [1]}, "kwargs is a list; pass a dict"),
    ("exported", (torch.randn(4, 16),), {}, "example_inputs given with an ExportedProgram"),
    ("exported", None, {"strict": True}, "strict given with an ExportedProgram"),
])
def test_anything_else_is_refused(model, example_inputs, options, message):
    if model == "mlp":
        model = mlp()[0]
    elif model == "exported":
        model = torch.export.export(*mlp())
    with pytest.raises(TypeError, match=message):
        kiln.to_executorch(model, example_inputs, **options)


def test_compute_left_outside_is_a_warning_with_the_report():
    torch.manual_seed(0)
    with pytest.warns(UserWarning) as caught:
        program = kiln.to_executorch(Float64Middle().eval(), (torch.randn(2, 8),))
    report = program.kiln_report
    texts = [str(w.message) for w in caught if str(w.message).startswith("kiln:")]
    assert texts == [str(report)]
    assert not report.whole and report.kiln_blobs == 2
    assert report.first_compute[1] == "aten.mul.Tensor", report
    assert "aten.mul.Tensor x1: " in str(report) and "float64" in str(report), str(report)


def test_require_whole_raises_naming_the_first_op_left_out(tmp_path):
    path = tmp_path / "model.pte"
    path.write_bytes(b"previous")
    with pytest.raises(kiln.NotWholeError, match=r"^kiln: aten\.mul\.Tensor \(node ") as raised:
        kiln.export(Float64Middle().eval(), (torch.randn(2, 8),), path, require_whole=True)
    assert "stays on ExecuTorch" in str(raised.value) and "require_whole=True" in str(raised.value)
    assert path.read_bytes() == b"previous"


def test_whole_program_gives_no_warning_and_passes_require_whole():
    model, inputs = mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        program = kiln.to_executorch(model, inputs, require_whole=True)
    report = program.kiln_report
    assert report.whole and report.kiln_blobs == 1 and report.ops_outside == 0 and report.kiln_ops == 3  # three linears, activations fused
    assert str(report).startswith("kiln: 1 Kiln blob with ")


KILN_CLI = os.environ.get("KILN_CLI") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "build", "kiln")


@pytest.mark.parametrize("name", ["mlp", "mixed"])
def test_kiln_inspect_prints_the_report_counts(name, tmp_path):
    entry = models.BY_NAME[name]
    path = tmp_path / f"{name}.pte"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = kiln.export(entry.make(), entry.inputs(), path).kiln_report
    assert report.kiln_blobs == entry.kiln_blobs and report.ops_outside == len(entry.cpu_ops)
    result = subprocess.run([KILN_CLI, "inspect", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    blobs = "blob" if report.kiln_blobs == 1 else "blobs"
    outside = "op" if report.ops_outside == 1 else "ops"
    line = (f"  delegation: {report.kiln_blobs} Kiln {blobs} with {report.kiln_ops} ops; "
            f"{report.ops_outside} {outside} on ExecuTorch; {report.kiln_blobs} delegate calls")
    assert line in result.stdout.splitlines(), result.stdout
    assert result.stdout.count("backend KilnBackend") == report.kiln_blobs
