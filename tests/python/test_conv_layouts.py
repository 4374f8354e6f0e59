"""CONV and CONV_TRANSPOSE with their optional attributes on the CPU reference engine, against
eager PyTorch: channels-last tensors (compared by permuting eager's NCHW result), the fused
ReLU and the residual added before it, and the plan's refusal of values they do not take."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from kiln import _lib


def pair(h, w):
    return (h << 32) | w


# (name, transposed, x shape, weight shape, stride, padding, dilation, groups, output padding)
CASES = [
    ("conv2d strided grouped", False, (2, 4, 9, 8), (6, 2, 3, 3), 2, 1, 1, 2, 0),
    ("conv2d depthwise dilated", False, (1, 6, 10, 10), (6, 1, 3, 3), 1, 2, 2, 6, 0),
    ("conv1d", False, (2, 3, 17), (5, 3, 4), 2, 1, 1, 1, 0),
    ("conv_transpose2d grouped", True, (2, 4, 5, 6), (4, 3, 3, 3), 2, 1, 1, 2, 1),
    ("conv_transpose1d", True, (1, 3, 7), (3, 2, 5), 3, 2, 1, 1, 2),
]


def eager(case, x, w, b):
    _, transposed, _, wshape, stride, padding, dilation, groups, out_pad = case
    x, w, b = x.double(), w.double(), b.double()
    if len(wshape) == 4:
        if transposed:
            return F.conv_transpose2d(x, w, b, stride, padding, out_pad, groups, dilation)
        return F.conv2d(x, w, b, stride, padding, dilation, groups)
    if transposed:
        return F.conv_transpose1d(x, w, b, stride, padding, out_pad, groups, dilation)
    return F.conv1d(x, w, b, stride, padding, dilation, groups)


def channels_last(t):
    return t.movedim(1, -1).contiguous()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("layout,relu,residual", list(itertools.product((0, 1), repeat=3)))
def test_conv_attributes_match_eager(case, layout, relu, residual):
    name, transposed, xshape, wshape, stride, padding, dilation, groups, out_pad = case
    torch.manual_seed(len(name) + 8 * layout + 2 * relu + residual)
    x, w = torch.randn(xshape), torch.randn(wshape) * 0.5
    outputs = wshape[1] * groups if transposed else wshape[0]
    b = torch.randn(outputs)
    want = eager(case, x, w, b)
    res = torch.randn(want.shape)
    if residual:
        want = want + res.double()
    if relu:
        want = want.relu()
    two = len(xshape) == 4  # a 1-d op's h attributes are stride 1, padding 0, dilation 1
    iattr = [pair(stride if two else 1, stride), pair(padding if two else 0, padding),
             pair(dilation if two else 1, dilation), groups, 1]
    if transposed:
        iattr.append(pair(out_pad if two else 0, out_pad))
    iattr += [layout, relu, residual]
    move = channels_last if layout else (lambda t: t.contiguous())
    with _lib.Builder() as builder:
        xi = builder.add_input("a_x", _lib.F32, tuple(move(x).shape))
        ins = [xi, builder.add_constant(move(w)), builder.add_constant(b)]
        if residual:
            ins.append(builder.add_input("b_residual", _lib.F32, tuple(move(res).shape)))
        y = builder.add_op("conv_transpose" if transposed else "conv", ins, iattr)
        builder.mark_output(y, "y")
        blob = builder.build(fuse=False)
    got = torch.empty(move(want).shape)
    with _lib.Engine(blob, device="cpu") as engine:
        engine.execute([move(x)] + ([move(res)] if residual else []), [got])
    torch.testing.assert_close(got.double(), move(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,slot,value,message", [
    ("conv", 5, 2, "iattr5 (channels_last) is 2 but must be 0 or 1"),
    ("conv", 6, 3, "iattr6 (activation) is 3 but a convolution fuses only 0 (none) or 1 (relu)"),
    ("conv", 7, 5, "iattr7 (residual) is 5 but must be 0 or 1"),
    ("conv_transpose", 7, 2, "iattr7 (activation) is 2 but a convolution fuses only"),
])
def test_bad_conv_attributes_are_refused_with_their_slot(op, slot, value, message):
    iattr = [pair(1, 1), 0, pair(1, 1), 1, 0] + ([0] if op == "conv_transpose" else [])
    iattr += [0] * (slot + 1 - len(iattr))
    iattr[slot] = value
    with _lib.Builder() as builder:
        x = builder.add_input("x", _lib.F32, (1, 2, 4, 4))
        w = builder.add_constant(torch.ones(2, 2, 1, 1))
        with pytest.raises(_lib.KilnError) as refusal:
            builder.add_op(op, [x, w], iattr)
    assert message in str(refusal.value)
    assert len(str(refusal.value).encode()) <= 255
