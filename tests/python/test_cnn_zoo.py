"""The convolutional zoo (torchvision ResNet-18/50, MobileNetV3 small/large, ConvNeXt-tiny and
transformers' ViT, random weights with batch-norm statistics from data): each model exports as
one Kiln blob holding all of its compute, and runs through ExecuTorch's own Python runtime on
the CPU reference engine, matching eager.

Eager is run in float64 for the reference: Kiln's CPU engine accumulates in double, and over
ResNet-50's depth eager float32 itself drifts by about 9e-5 of the output's range, so only
float64 leaves the 1e-4 tolerance measuring Kiln."""

import copy
import os
import time

import pytest
import torch

import kiln
import models

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DELEGATE = os.path.join(ROOT, "python", "kiln_runtime", "libexecutorch_backend_kiln.so")
NAMES = [spec.name for spec in models.CNN_ZOO]


class ExportedCNN:
    def __init__(self, spec, directory):
        self.spec = spec
        self.inputs = list(spec.inputs())
        model = spec.make()
        with torch.no_grad():
            wide = copy.deepcopy(model).double()
            self.expected = [wide(*[x.double() for x in self.inputs]).float()]
        self.path = os.path.join(directory, f"{spec.name}.pte")
        started = time.perf_counter()
        self.program = kiln.export(model, tuple(self.inputs), self.path)
        self.export_seconds = time.perf_counter() - started


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("cnn_zoo"))
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = ExportedCNN(models.CNN_BY_NAME[name], directory)
        return cache[name]

    return get


@pytest.fixture(scope="module")
def runtime():
    if not os.path.isfile(DELEGATE):
        pytest.fail(f"{DELEGATE} is missing: build the delegate library with `make build`")
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    return Runtime.get()


def ops_outside_kiln(program):
    return sorted(
        str(node.target)
        for node in program.exported_program().graph.nodes
        if node.op == "call_function" and "executorch_call_delegate" not in str(node.target)
        and "getitem" not in str(node.target)
    )


@pytest.mark.parametrize("name", NAMES)
def test_cnn_is_one_blob_holding_all_compute(name, exported):
    model = exported(name)
    lowered = kiln.lowered_modules(model.program)
    assert len(lowered) == 1, f"{name}: {len(lowered)} Kiln blobs"
    assert ops_outside_kiln(model.program) == []
    with kiln._lib.Engine(lowered[0].processed_bytes, "cpu") as engine:
        kinds = [kind for _, kind, _, _ in engine.bindings()]
    assert kinds.count(kiln._lib.IO_INPUT) == len(model.inputs)  # the weights live in the blob


@pytest.mark.parametrize("name", NAMES)
def test_cnn_matches_eager_through_executorch(name, exported, runtime, monkeypatch):
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    model = exported(name)
    (expected,) = model.expected
    # not degenerate: the two images give different outputs, and the outputs spread
    assert (expected[0] - expected[1]).abs().max() > 1e-2 * expected.abs().max()
    assert expected.std() > 1e-3
    program = runtime.load_program(model.path)
    method = program.load_method("forward")
    started = time.perf_counter()
    (actual,) = method.execute(model.inputs)
    seconds = time.perf_counter() - started
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    error = (actual - expected).abs().max().item()
    scale = expected.abs().max().item()
    print(f"{name}: export {model.export_seconds:.1f} s, CPU engine run {seconds:.2f} s, "
          f"max error {error / scale:.2e} of {scale:.3g}")
    assert error <= models.F32_TOLERANCE * scale, f"{name}: max error {error:.3g} of {scale:.3g}"


def plan_op_records(blob):
    """(op name, integer attributes) of each op of a version 2 plan (160-byte op records)."""
    import struct

    from kiln import report

    plan = struct.unpack_from(report._BLOB_HEADER, blob)[report._PLAN_OFFSET_FIELD]
    version, n_tensors, n_ops = struct.unpack_from("<III", blob, plan + 4)
    assert version == 2
    records = []
    for i in range(n_ops):
        at = plan + 32 + 96 * n_tensors + 160 * i
        kind, n_iattr = struct.unpack_from("<I", blob, at)[0], struct.unpack_from("<I", blob, at + 44)[0]
        records.append((kiln._lib.OP_NAMES[kind], list(struct.unpack_from(f"<{n_iattr}q", blob, at + 48))))
    return records


def test_resnet18_residual_blocks_fuse_into_their_convolutions(exported):
    # ResNet-18: 20 convolutions (3 of them downsampling), 17 ReLUs, 8 residual adds. Each
    # ReLU and each add runs inside the convolution before it, so none is an op of its own.
    model = exported("resnet18")
    ops = plan_op_records(bytes(kiln.lowered_modules(model.program)[0].processed_bytes))
    convs = [iattr for name, iattr in ops if name == "conv"]
    assert len(convs) == 20
    assert sum(len(a) > 6 and a[6] == 1 for a in convs) == 17  # ReLU (KILN_ACT_RELU)
    assert sum(len(a) > 7 and a[7] == 1 for a in convs) == 8  # the residual
    names = [name for name, _ in ops]
    assert "relu" not in names and "add" not in names and "pointwise" not in names, names


def test_resnet18_runs_channels_last_from_its_first_conv_to_its_global_pool(exported):
    # One permute into NHWC before the stem and one back after the last block.
    model = exported("resnet18")
    ops = plan_op_records(bytes(kiln.lowered_modules(model.program)[0].processed_bytes))
    names = [name for name, _ in ops]
    assert names.count("permute") == 2, names
    assert names.index("permute") < names.index("conv")
    last_conv = len(names) - 1 - names[::-1].index("conv")
    assert last_conv < len(names) - 1 - names[::-1].index("permute"), names
    assert all(a[5] == 1 for name, a in ops if name == "conv")  # channels_last
    assert [a[-1] for name, a in ops if name == "max_pool2d"] == [1], names
