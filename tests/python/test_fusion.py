"""Fusion seen from outside: `kiln inspect` names the fused steps of a pointwise chain and of a
norm, and a fused blob computes on the reference engine what the unfused one does."""

import os
import subprocess

import torch

from kiln import _lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.environ.get("KILN_CLI") or os.path.join(ROOT, "build", "kiln")


def chain_blob(fuse):
    """The chain pow(gelu_tanh(z - x * y), 2) over x[2,3,4], y[4], z[2,3,4]."""
    with _lib.Builder() as b:
        x = b.add_input("x", _lib.F32, (2, 3, 4))
        y = b.add_input("y", _lib.F32, (4,))
        z = b.add_input("z", _lib.F32, (2, 3, 4))
        a = b.add_op("mul", [x, y])
        c = b.add_op("sub", [z, a])
        d = b.add_op("gelu", [c], [1])
        b.mark_output(b.add_op("pow", [d], (), [2.0]), "out")
        return b.build(fuse=fuse)


def inspect(tmp_path, blob):
    path = tmp_path / "chain.blob"
    path.write_bytes(blob)
    assert os.path.isfile(KILN), f"{KILN} is missing: build the kiln command line (make build)"
    r = subprocess.run([KILN, "inspect", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [line.strip() for line in r.stdout.splitlines() if line.strip().startswith("op ")]


def test_inspect_shows_the_fused_steps(tmp_path):
    ops = inspect(tmp_path, chain_blob(True))
    assert ops == [
        "op 0: pointwise(t0 [2, 3, 4], t1 [4], t2 [2, 3, 4]) -> t3 [2, 3, 4]; "
        "fused [mul(in1) -> rsub(in2) -> gelu_tanh -> pow(2)]"
    ]
    unfused = inspect(tmp_path, chain_blob(False))
    assert [line.split(":")[1].split("(")[0].strip() for line in unfused] == [
        "mul", "sub", "gelu", "pow"
    ]


def test_fused_blob_matches_the_unfused_one():
    torch.manual_seed(0)
    inputs = [torch.randn(2, 3, 4), torch.randn(4), torch.randn(2, 3, 4)]
    results = []
    for fuse in (True, False):
        out = torch.empty(2, 3, 4)
        with _lib.Engine(chain_blob(fuse), device="cpu") as engine:
            engine.execute(inputs, [out])
        results.append(out)
    assert torch.equal(results[0], results[1])
    want = torch.nn.functional.gelu(inputs[2] - inputs[0] * inputs[1], approximate="tanh") ** 2
    torch.testing.assert_close(results[0], want, rtol=1e-5, atol=1e-6)


def norm_blob(fuse):
    """layer_norm(h + r) over the last dim with weight and bias, then gelu: a post-norm's
    residual add before the norm, an activation after it."""
    with _lib.Builder() as b:
        h = b.add_input("h", _lib.F32, (2, 5, 16))
        r = b.add_input("r", _lib.F32, (2, 5, 16))
        w = b.add_input("w", _lib.F32, (16,))
        bias = b.add_input("b", _lib.F32, (16,))
        n = b.add_op("layer_norm", [b.add_op("add", [h, r]), w, bias], [1, 3], [1e-5])
        b.mark_output(b.add_op("gelu", [n]), "out")
        return b.build(fuse=fuse)


def test_inspect_shows_the_steps_fused_into_a_norm(tmp_path):
    ops = inspect(tmp_path, norm_blob(True))
    assert ops == [
        "op 0: layer_norm(t0 [2, 5, 16], t2 [16], t3 [16], t1 [2, 5, 16]) -> t4 [2, 5, 16]; "
        "iattr [1, 3]; fused [add(in3) -> layer_norm -> gelu_erf]; fattr [1e-05, 0]"
    ]
    unfused = inspect(tmp_path, norm_blob(False))
    assert [line.split(":")[1].split("(")[0].strip() for line in unfused] == [
        "add", "layer_norm", "gelu"
    ]


def test_fused_norm_matches_the_unfused_one_and_eager():
    torch.manual_seed(0)
    inputs = [torch.randn(2, 5, 16), torch.randn(2, 5, 16), torch.rand(16) + 0.5,
              torch.randn(16)]
    results = []
    for fuse in (True, False):
        out = torch.empty(2, 5, 16)
        with _lib.Engine(norm_blob(fuse), device="cpu") as engine:
            engine.execute(inputs, [out])
        results.append(out)
    assert torch.equal(results[0], results[1])
    h, r, w, bias = inputs
    want = torch.nn.functional.gelu(torch.nn.functional.layer_norm(h + r, (16,), w, bias))
    torch.testing.assert_close(results[0], want, rtol=1e-5, atol=1e-5)


def rotary_blob(fuse):
    """transformers' rotary embedding of x[1,4,16] as two heads of 8: q * cos + rotate_half(q) * sin."""
    with _lib.Builder() as b:
        x = b.add_input("x", _lib.F32, (1, 4, 16))
        cos = b.add_input("cos", _lib.F32, (4, 8))
        sin = b.add_input("sin", _lib.F32, (4, 8))
        q = b.add_op("permute", [b.add_op("reshape", [x], [1, 4, 2, 8])], [0, 2, 1, 3])
        hi = b.add_op("slice", [q], [3, 4, 8, 1])
        lo = b.add_op("slice", [q], [3, 0, 4, 1])
        rot = b.add_op("cat", [b.add_op("neg", [hi]), lo], [3])
        out = b.add_op("add", [b.add_op("mul", [q, cos]), b.add_op("mul", [rot, sin])], (), [1.0])
        b.mark_output(out, "q")
        return b.build(fuse=fuse)


def test_inspect_shows_a_fused_group(tmp_path):
    ops = inspect(tmp_path, rotary_blob(True))
    assert ops == [
        "op 0: fused(t0 [1, 4, 16], t1 [4, 8], t2 [4, 8]) -> t3 [1, 2, 4, 8]; group ["
        "r0=in0[0;64,8,16,1] -> r1=in1[0;0,0,8,1] -> r0=mul(r0,r1) -> r1=in0[4;0,8,16,1 boxed] -> "
        "r1=neg(r1) -> r2=in0[-4;0,8,16,1 boxed] -> r1=d3<4?r1:r2 -> r2=in2[0;0,0,8,1] -> "
        "r1=mul(r1,r2) -> r0=add(r0,r1) -> store r0]"
    ]
    assert len(inspect(tmp_path, rotary_blob(False))) == 9


def test_fused_group_matches_the_unfused_plan_and_eager():
    torch.manual_seed(0)
    inputs = [torch.randn(1, 4, 16), torch.randn(4, 8), torch.randn(4, 8)]
    results = []
    for fuse in (True, False):
        out = torch.empty(1, 2, 4, 8)
        with _lib.Engine(rotary_blob(fuse), device="cpu") as engine:
            engine.execute(inputs, [out])
        results.append(out)
    assert torch.equal(results[0], results[1])
    q = inputs[0].view(1, 4, 2, 8).transpose(1, 2)
    want = q * inputs[1] + torch.cat((-q[..., 4:], q[..., :4]), dim=-1) * inputs[2]
    torch.testing.assert_close(results[0], want, rtol=1e-6, atol=1e-6)


def op_kinds(tmp_path, blob):
    """The kind of each op of blob's plan, in order, as `kiln inspect` names them."""
    return [line.split(":")[1].split("(")[0].strip() for line in inspect(tmp_path, blob)]


def head_view(b, src, start, heads):
    """src[..., start:start + 16 * heads] of src [1, 1, N] as heads of 16: [1, heads, 1, 16]."""
    t = b.add_op("slice", [src], [2, start, start + heads * 16, 1])
    return b.add_op("permute", [b.add_op("reshape", [t], [1, 1, heads, 16])], [0, 2, 1, 3])


def rotate_half(b, t):
    """cat(-t[..., 8:], t[..., :8]) of heads of 16."""
    hi, lo = b.add_op("slice", [t], [3, 8, 16, 1]), b.add_op("slice", [t], [3, 0, 8, 1])
    return b.add_op("cat", [b.add_op("neg", [hi]), lo], [3])


def qk_rotary_blob(fuse, k_at=64):
    """A decode step's rotary embedding of q (4 heads of 16) and k (2 heads) read from one
    projection's columns x[1,1,128] (k's from column k_at), each then read by a softmax: two
    groups of one program, k's continuing q's along the heads where k_at is 64."""
    with _lib.Builder() as b:
        x = b.add_input("x", _lib.F32, (1, 1, 128))
        cos = b.add_input("cos", _lib.F32, (1, 16))
        sin = b.add_input("sin", _lib.F32, (1, 16))

        def rotary(start, heads):
            t = head_view(b, x, start, heads)
            terms = [b.add_op("mul", [t, cos]), b.add_op("mul", [rotate_half(b, t), sin])]
            return b.add_op("add", terms, (), [1.0])

        b.mark_output(b.add_op("softmax", [rotary(0, 4)], [3]), "q")
        b.mark_output(b.add_op("softmax", [rotary(k_at, 2)], [3]), "k")
        return b.build(fuse=fuse)


def test_sibling_groups_run_as_one_kernel(tmp_path):
    """q's and k's rotary groups, the same program over adjacent heads of one input, are one
    FUSED op whose output q and k are slices of; where k's columns do not follow q's, two."""
    assert op_kinds(tmp_path, qk_rotary_blob(True)) == ["fused", "slice", "slice", "softmax", "softmax"]
    assert op_kinds(tmp_path, qk_rotary_blob(True, k_at=80)) == ["fused", "softmax", "fused", "softmax"]


def test_joined_siblings_match_eager():
    torch.manual_seed(0)
    inputs = [torch.randn(1, 1, 128), torch.randn(1, 16), torch.randn(1, 16)]
    for k_at in (64, 80, 96):
        results = []
        for fuse in (True, False):
            outs = [torch.empty(1, 4, 1, 16), torch.empty(1, 2, 1, 16)]
            with _lib.Engine(qk_rotary_blob(fuse, k_at), device="cpu") as engine:
                engine.execute(inputs, outs)
            results.append(outs)
        x, cos, sin = inputs
        for out, unfused, (start, heads) in zip(results[0], results[1], ((0, 4), (k_at, 2))):
            t = x[..., start:start + heads * 16].reshape(1, 1, heads, 16).transpose(1, 2)
            rot = torch.cat((-t[..., 8:], t[..., :8]), dim=-1)
            want = torch.softmax(t * cos + rot * sin, dim=-1)
            assert torch.equal(out, unfused)
            torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)


def test_sibling_groups_reading_a_state_stay_apart(tmp_path):
    """Groups that read a state (whose buffer its write changes during the run) are not joined:
    the second would run where the first does, before or after the write as the first is."""
    torch.manual_seed(0)
    with _lib.Builder() as b:
        s = b.add_state(torch.randn(1, 1, 128))
        x = b.add_input("x", _lib.F32, (1, 1, 128))
        cos = b.add_input("cos", _lib.F32, (1, 16))

        def rotary(start, heads):
            t = head_view(b, s, start, heads)
            moved = b.add_op("add", [b.add_op("mul", [t, cos]), rotate_half(b, t)], (), [1.0])
            return b.add_op("softmax", [moved], [3])

        b.mark_output(rotary(0, 4), "q")
        b.mark_output(rotary(64, 2), "k")
        b.write_state(s, b.add_op("softmax", [x], [2]))
        blob = b.build()
    ops = op_kinds(tmp_path, blob)
    assert ops.count("fused") == 2 and "slice" not in ops, ops


def computed_from_state_blob(initial, fuse):
    """q's and k's rotary groups over softmax(state), the state then written from x: as a decoder
    layer past its first attention reads values computed from a cache, not the cache's bytes."""
    with _lib.Builder() as b:
        s = b.add_state(initial)
        x = b.add_input("x", _lib.F32, (1, 1, 128))
        cos = b.add_input("cos", _lib.F32, (1, 16))
        sin = b.add_input("sin", _lib.F32, (1, 16))
        y = b.add_op("softmax", [s], [2])

        def rotary(start, heads):
            t = head_view(b, y, start, heads)
            terms = [b.add_op("mul", [t, cos]), b.add_op("mul", [rotate_half(b, t), sin])]
            return b.add_op("add", terms, (), [1.0])

        b.mark_output(b.add_op("softmax", [rotary(0, 4)], [3]), "q")
        b.mark_output(b.add_op("softmax", [rotary(64, 2)], [3]), "k")
        b.write_state(s, b.add_op("softmax", [x], [2]))
        return b.build(fuse=fuse)


def test_sibling_groups_computed_from_a_state_join(tmp_path):
    """Groups reading an op's output computed from a state (its own bytes, which no state write
    changes) are joined, and over two runs (the second reading the state the first wrote) match
    the unfused plan bit for bit and eager."""
    torch.manual_seed(0)
    initial = torch.randn(1, 1, 128)
    assert op_kinds(tmp_path, computed_from_state_blob(initial, True)) == [
        "softmax", "fused", "slice", "slice", "softmax", "softmax", "softmax", "copy"]
    runs = [[torch.randn(1, 1, 128), torch.randn(1, 16), torch.randn(1, 16)] for _ in range(2)]
    results = []
    for fuse in (True, False):
        with _lib.Engine(computed_from_state_blob(initial, fuse), device="cpu") as engine:
            outs = []
            for inputs in runs:
                outs.append([torch.empty(1, 4, 1, 16), torch.empty(1, 2, 1, 16)])
                engine.execute(inputs, outs[-1])
        results.append(outs)
    state = initial
    for run, inputs in enumerate(runs):
        x, cos, sin = inputs
        y = torch.softmax(state, dim=2)
        for out, unfused, (start, heads) in zip(results[0][run], results[1][run], ((0, 4), (64, 2))):
            t = y[..., start:start + heads * 16].reshape(1, 1, heads, 16).transpose(1, 2)
            rot = torch.cat((-t[..., 8:], t[..., :8]), dim=-1)
            assert torch.equal(out, unfused)
            torch.testing.assert_close(out, torch.softmax(t * cos + rot * sin, dim=-1), rtol=1e-6, atol=1e-6)
        state = torch.softmax(x, dim=2)


def cat_heads_blob():
    """Two groups of one program over x[1,1,128]'s halves, each a cat along the heads of two
    heads and two negated heads, then a softmax: the second's loads continue the first's along
    the heads, but a cat's pieces are boxed along them, so a join there would be wrong."""
    with _lib.Builder() as b:
        x = b.add_input("x", _lib.F32, (1, 1, 128))

        def heads(start):
            negated = b.add_op("neg", [head_view(b, x, start + 32, 2)])
            t = b.add_op("cat", [head_view(b, x, start, 2), negated], [1])
            return b.add_op("softmax", [b.add_op("exp", [t])], [3])

        b.mark_output(heads(0), "a")
        b.mark_output(heads(64), "b")
        return b.build()


def test_groups_with_a_cat_along_the_join_stay_apart(tmp_path):
    blob = cat_heads_blob()
    assert op_kinds(tmp_path, blob).count("fused") == 2
    x = torch.randn(1, 1, 128)
    outs = [torch.empty(1, 4, 1, 16), torch.empty(1, 4, 1, 16)]
    with _lib.Engine(blob, device="cpu") as engine:
        engine.execute([x], outs)
    for out, start in zip(outs, (0, 64)):
        p = x[..., start:start + 64].reshape(1, 4, 1, 16)
        want = torch.softmax(torch.exp(torch.cat((p[:, :2], -p[:, 2:]), dim=1)), dim=-1)
        torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
