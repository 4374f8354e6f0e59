"""Real architectures from transformers (zoo_models.py) run whole on Kiln: each is exported with
kiln.export as one Kiln blob holding all of its compute, loads in ExecuTorch's Python runtime on
the CPU reference engine, and matches eager (fp32, 1e-4 of the largest reference magnitude).
The C++ Module path runs the same files in test_executorch_e2e.py."""

import pytest
import torch

import kiln
import zoo_models
from kiln import _lib

NAMES = [spec.name for spec in zoo_models.REAL_ZOO]
TOLERANCE = 1e-4


def assert_close(actual, expected, what):
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, \
        f"{what}: {actual.dtype}{list(actual.shape)}, expected {expected.dtype}{list(expected.shape)}"
    error = (actual.double() - expected.double()).abs().max().item()
    allowed = TOLERANCE * expected.abs().max().item()
    assert error <= allowed, f"{what}: max error {error:.3g}, allowed {allowed:.3g}"


@pytest.mark.parametrize("name", NAMES)
def test_weights_give_outputs_that_depend_on_the_input(name):
    spec = zoo_models.REAL_BY_NAME[name]
    model = spec.make()
    with torch.no_grad():
        first, second = model(*spec.inputs(1)), model(*spec.inputs(2))
    assert first.dtype == torch.float32 and first.dim() == 3, f"{name}: {first.dtype}{list(first.shape)}"
    spread = first.std().item()
    assert spread > 0.05, f"{name}: output std {spread:.3g}: degenerate weights make any result pass"
    assert (first - second).abs().max().item() > 0.5 * spread, f"{name}: two batches give the same output"


@pytest.mark.parametrize("name", NAMES)
def test_exports_as_one_kiln_blob_holding_all_compute(name, real_zoo):
    exported = real_zoo(name)
    print(f"{name}: export {exported.export_seconds:.1f} s\n{exported.report}")
    report = exported.report
    assert report.kiln_blobs == 1 and report.ops_outside == 0, str(report)
    assert len(kiln.blobs(exported.program)) == 1
    assert not exported.warnings, exported.warnings
    # ExecuTorch hands the blob the program's inputs and nothing else: the weights live inside.
    with _lib.Engine(kiln.blobs(exported.program)[0], "cpu") as engine:
        kinds = [kind for _, kind, _, _ in engine.bindings()]
    assert kinds.count(_lib.IO_INPUT) == len(exported.inputs), kinds


# Plan ops with one fusion pass per pattern (pointwise chains, norm steps), then with the general
# fused groups (the rotary embeddings, GELU's halves and the head split copies each one op),
# RMSNorm written out made one RMS_NORM, what each layer computes again from the same inputs
# (positions, masks) computed once, copies of what nothing writes dropped, and attention's q, k
# and v projections one GEMM whose column slices the head split groups read in place (33, 33 and
# 39 before). BERT's small ops left are its mask's cast to bool and the head merge after SDPA;
# the gather and AND that built its [B,1,L,S] mask are gone (29 with them). GPT-2's q, k and v
# head split copies are one group whose output four slices view (32 ops with a group each: two
# kernels fewer, two views more).
OPS_BEFORE_GROUPS = {"gpt2": 68, "llama": 87, "qwen2": 87, "bert": 42}
OPS_WITH_GROUPS = {"gpt2": 36, "llama": 27, "qwen2": 27, "bert": 28}


@pytest.mark.parametrize("name", sorted(OPS_WITH_GROUPS))
def test_fused_groups_cut_the_plan(name, real_zoo):
    ops = real_zoo(name).report.kiln_ops
    assert ops <= OPS_WITH_GROUPS[name], f"{name}: {ops} plan ops, {OPS_WITH_GROUPS[name]} measured"
    assert ops < OPS_BEFORE_GROUPS[name]


@pytest.mark.parametrize("name", NAMES)
def test_warns_exactly_when_compute_stays_outside(name, real_zoo):
    exported = real_zoo(name)
    expected = [] if exported.report.whole else [str(exported.report)]
    assert exported.warnings == expected


@pytest.fixture(scope="module")
def runtime():
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    return Runtime.get()


@pytest.mark.parametrize("name", NAMES)
def test_runs_in_executorch_and_matches_eager(name, real_zoo, runtime, monkeypatch):
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    exported = real_zoo(name)
    program = runtime.load_program(exported.path)
    method = program.load_method("forward")
    for _ in range(2):
        (output,) = method.execute(list(exported.inputs))
        assert_close(output, exported.expected, name)
