"""The pooling and resize ops with their channels_last attribute against PyTorch eager.

Each case builds one op with the C builder twice: NCHW (attribute 0), and channels_last (1) on
the input permuted to [N,H,W,C]; both run on the CPU engine and must match eager, the second
against eager's result permuted the same way.
"""

import pytest
import torch
import torch.nn.functional as F

import kiln
import models
from kiln import _lib
from kiln.lowering import pair


def _x(shape, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(dtype)


# name, kiln op, iattr (without channels_last), fattr, eager on NCHW, input shape
CASES = [
    ("max_pool2d_stem", "max_pool2d", [pair(3, 3), pair(2, 2), pair(1, 1), pair(1, 1), 0], [],
     lambda x: F.max_pool2d(x, 3, 2, 1), (2, 5, 9, 8)),
    ("max_pool2d_dilated_ceil", "max_pool2d", [pair(2, 3), pair(2, 1), pair(1, 0), pair(2, 2), 1], [],
     lambda x: F.max_pool2d(x, (2, 3), (2, 1), (1, 0), (2, 2), ceil_mode=True), (1, 3, 7, 9)),
    ("avg_pool2d_exclude_pad_ceil", "avg_pool2d", [pair(3, 3), pair(2, 2), pair(1, 1), 1, 0, 0], [],
     lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), (2, 4, 8, 7)),
    ("avg_pool2d_divisor", "avg_pool2d", [pair(2, 3), pair(2, 3), pair(0, 1), 0, 1, 5], [],
     lambda x: F.avg_pool2d(x, (2, 3), (2, 3), (0, 1), divisor_override=5), (1, 3, 6, 6)),
    ("adaptive_avg_pool2d", "adaptive_avg_pool2d", [pair(3, 4)], [],
     lambda x: F.adaptive_avg_pool2d(x, (3, 4)), (2, 5, 7, 5)),
    ("adaptive_avg_pool2d_global", "adaptive_avg_pool2d", [pair(1, 1)], [],
     lambda x: F.adaptive_avg_pool2d(x, 1), (2, 16, 7, 7)),
    ("upsample_nearest2d", "upsample_nearest2d", [pair(7, 9)], [0.0, 0.0],
     lambda x: F.interpolate(x, size=(7, 9), mode="nearest"), (1, 3, 3, 5)),
    ("upsample_nearest2d_scale", "upsample_nearest2d", [pair(6, 8)], [2.0, 1.7],
     lambda x: F.interpolate(x, scale_factor=(2.0, 1.7), mode="nearest"), (1, 2, 3, 5)),
    ("upsample_bilinear2d", "upsample_bilinear2d", [pair(8, 10), 0], [0.0, 0.0],
     lambda x: F.interpolate(x, size=(8, 10), mode="bilinear", align_corners=False), (2, 3, 4, 5)),
    ("upsample_bilinear2d_align", "upsample_bilinear2d", [pair(6, 7), 1], [0.0, 0.0],
     lambda x: F.interpolate(x, size=(6, 7), mode="bilinear", align_corners=True), (1, 4, 3, 5)),
]


def _blob(op, iattr, fattr, dtype, shape):
    with _lib.Builder() as builder:
        x = builder.add_input("x", _lib.kiln_dtype(dtype), shape)
        y = builder.add_op(op, [x], iattr, fattr)
        builder.mark_output(y, "y")
        return builder.build(), builder.get_shape(y)[1]


def _close(got, want, tolerance, what):
    assert got.shape == want.shape, what
    scale = max(want.float().abs().max().item(), 1e-6)
    error = (got.float() - want.float()).abs().max().item()
    assert error <= tolerance * scale, f"{what}: max error {error} over scale {scale}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("name, op, iattr, fattr, eager, shape", CASES, ids=[c[0] for c in CASES])
def test_layouts_match_eager(name, op, iattr, fattr, eager, shape, dtype):
    x = _x(shape, dtype)
    want = eager(x.float()).to(dtype)
    tolerance = models.F32_TOLERANCE if dtype == torch.float32 else models.F16_TOLERANCE
    nhwc = tuple(x.permute(0, 2, 3, 1).shape)

    nchw_blob, nchw_shape = _blob(op, iattr, fattr, dtype, shape)
    assert nchw_shape == tuple(want.shape)
    (nchw,) = kiln.run_blob(nchw_blob, [x])
    _close(nchw, want, tolerance, f"{name} NCHW")

    last_blob, last_shape = _blob(op, iattr + [1], fattr, dtype, nhwc)
    assert last_shape == tuple(want.permute(0, 2, 3, 1).shape)
    (last,) = kiln.run_blob(last_blob, [x.permute(0, 2, 3, 1).contiguous()])
    _close(last, want.permute(0, 2, 3, 1), tolerance, f"{name} channels_last")
    # the same sums in the same order: the layouts agree to the bit
    assert torch.equal(last, nchw.permute(0, 2, 3, 1)), name


@pytest.mark.parametrize("value", [2, -1])
def test_channels_last_other_than_0_or_1_is_refused(value):
    with pytest.raises(_lib.KilnError, match=rf"iattr5 \(channels_last\) is {value} but must be 0 or 1"):
        _blob("max_pool2d", [pair(2, 2), pair(2, 2), pair(0, 0), pair(1, 1), 0, value], [],
              torch.float32, (1, 4, 4, 3))


def test_channels_last_needs_rank_4():
    with pytest.raises(_lib.KilnError, match=r"rank 3 but channels_last needs \[N,H,W,C\]"):
        _blob("upsample_nearest2d", [pair(8, 8), 1], [0.0, 0.0], torch.float32, (4, 4, 3))
