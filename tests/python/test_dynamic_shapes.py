"""Bounded dynamic dims end to end on the CPU engine: kiln.export with torch.export.Dim gives one
Kiln blob planned for the upper bound, ExecuTorch's Python runtime runs it at any size within the
bounds matching eager (outputs resized to this call's shape), and a size outside is refused with
a message naming the input, the dim, the value and the bound, leaving the program usable."""

import contextlib
import io
import os
import re
import subprocess
import sys

import pytest
import torch

import kiln
import kiln_runtime  # noqa: F401  (registers KilnBackend)
import models
import zoo_models
from executorch.runtime import Runtime
from test_architectures import ARCHITECTURES

from kiln._lib import KilnError

TOLERANCE = 1e-4
KILN_CLI = os.environ.get("KILN_CLI") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "build", "kiln")


@pytest.fixture(scope="module", autouse=True)
def cpu_engine():
    """ExecuTorch's runtime loads the blobs on the CPU reference engine (CI has no GPU)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KILN_DEVICE", "cpu")
        yield


class Exported:
    """A model exported once with dynamic_shapes, its program loaded in ExecuTorch's runtime."""

    def __init__(self, model, example, dynamic_shapes, path):
        self.model = model
        with torch.no_grad():
            self.program = kiln.export(model, example, str(path), dynamic_shapes=dynamic_shapes)
        self.path = path
        self.report = self.program.kiln_report
        self.blobs = kiln.blobs(self.program)
        self.et_program = Runtime.get().load_program(str(path))  # a Method does not keep it alive
        self.method = self.et_program.load_method("forward")

    def check(self, inputs):
        with torch.no_grad():
            expected = self.model(*inputs)
        got = self.method.execute(list(inputs))[0]
        assert got.shape == expected.shape
        error = (got - expected).abs().max().item() / expected.abs().max().item()
        assert error < TOLERANCE, f"error {error} at shape {tuple(inputs[0].shape)}"


def bert_inputs(batch):
    ids = zoo_models.token_ids(batch, batch=batch)
    mask = torch.ones(batch, zoo_models.SEQUENCE, dtype=torch.long)
    mask[-1, zoo_models.SEQUENCE - zoo_models.PADDING:] = 0
    return ids, mask


def gpt2_inputs(time):
    return (torch.randint(0, zoo_models.VOCAB, (1, time), generator=torch.Generator().manual_seed(time)),)


def llama_inputs(time):
    x = torch.randn(1, time, 64, generator=torch.Generator().manual_seed(time))
    return (x, *models._rotary(1, time, 16))


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    batch = torch.export.Dim("batch", min=1, max=6)
    return Exported(zoo_models.REAL_BY_NAME["bert"].make(), bert_inputs(2), ({0: batch}, {0: batch}),
                    tmp_path_factory.mktemp("bert") / "bert.pte")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    time = torch.export.Dim("time", min=2, max=zoo_models.POSITIONS)
    return Exported(zoo_models.REAL_BY_NAME["gpt2"].make(), gpt2_inputs(16), ({1: time},),
                    tmp_path_factory.mktemp("gpt2") / "gpt2.pte")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    torch.manual_seed(0)
    time = torch.export.Dim("time", min=1, max=16)
    return Exported(models.LlamaBlock().eval(), llama_inputs(8), ({1: time}, {1: time}, {1: time}),
                    tmp_path_factory.mktemp("llama") / "llama.pte")


def test_encoder_with_a_dynamic_batch_runs_every_size_within_bounds(bert):
    assert len(bert.blobs) == 1 and bert.report.whole, bert.report
    for batch in (1, 3, 6, 2):
        bert.check(bert_inputs(batch))


def test_decoder_with_a_dynamic_sequence_runs_every_size_within_bounds(gpt2):
    assert len(gpt2.blobs) == 1 and gpt2.report.whole, gpt2.report
    for time in (2, 7, zoo_models.POSITIONS, 13):
        gpt2.check(gpt2_inputs(time))


def test_llama_block_with_a_dynamic_sequence_runs_every_size_within_bounds(llama):
    assert len(llama.blobs) == 1 and llama.report.whole, llama.report
    for time in (1, 5, 16, 11):
        llama.check(llama_inputs(time))


def test_a_size_below_the_bound_is_refused_and_the_program_stays_usable(gpt2):
    log = io.StringIO()
    with contextlib.redirect_stderr(log), pytest.raises(RuntimeError):
        gpt2.method.execute(list(gpt2_inputs(1)))
    assert ('input 0 ("input_ids") dim 1 is 1, below its bound 2 (dynamic size s' in log.getvalue()
            and "pass at least that or re-export with a smaller min" in log.getvalue()), log.getvalue()
    gpt2.check(gpt2_inputs(9))


def test_a_size_above_the_bound_is_refused_naming_input_dim_value_and_bound(llama):
    with pytest.raises(KilnError, match=r'input 0 \("x"\) dim 1 is 17, above its bound 16 \(dynamic size s\w+\); '
                                        r"pass at most that or re-export with a larger max"):
        kiln.run_blob(llama.blobs[0], llama_inputs(17))
    x, cos, sin = llama_inputs(6)
    with pytest.raises(KilnError, match=r'input 1 \("cos"\) dim 1 is 5, giving s\w+ = 5 where an earlier input '
                                        r"gave 6; pass inputs of matching sizes"):
        kiln.run_blob(llama.blobs[0], (x, cos[:, :5], sin[:, :5]))
    got = kiln.run_blob(llama.blobs[0], llama_inputs(6))[0]
    with torch.no_grad():
        assert (got - llama.model(*llama_inputs(6))).abs().max() < 1e-4
    assert llama.method.execute(list(llama_inputs(16)))[0].shape == (1, 16, 64)


def test_inspect_lists_the_symbol_and_each_dynamic_dim(llama):
    out = subprocess.run([KILN_CLI, "inspect", str(llama.path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    symbol = re.search(r"dynamic size (s\w+): 1\.\.16 \(dims shown at the upper bound\)", out.stdout)
    assert symbol, out.stdout[:2000]
    assert re.search(rf"t0: f32 \[1, 16, 64\] as \[1,{symbol.group(1)},64\] input 0", out.stdout), out.stdout[:2000]


def test_inspect_shows_the_fused_groups_of_a_dynamic_plan(llama):
    """The block's RMSNorm pieces, its rotary embeddings of q and k and v's head split (the last
    three reading the columns of the one q/k/v GEMM) are FUSED groups in the dynamic plan too,
    each output following the symbol (its program is valid at every size, which
    test_llama_block_with_a_dynamic_sequence_runs_every_size_within_bounds runs against eager)."""
    out = subprocess.run([KILN_CLI, "inspect", str(llama.path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    symbol = re.search(r"dynamic size (s\w+): ", out.stdout).group(1)
    groups = re.findall(r"op \d+: fused\([^)]*\) -> (t\d+) \[[\d, ]+\]; group \[r0=in0\[", out.stdout)
    assert len(groups) == 4, out.stdout[-3000:]
    for tensor in groups:
        assert re.search(rf"\b{tensor}: f32 \[[\d, ]+\] as \[[^]]*{symbol}[^]]*\]", out.stdout), tensor


class MaskedMeanPool(torch.nn.Module):
    """Mean of the positions whose token is not padding (0): a count of bools over the dynamic
    sequence, which Kiln sums in f32 (exact below 2^24), then divides by."""

    def forward(self, x, ids):
        keep = ids != 0
        count = keep.sum(dim=1, keepdim=True)
        return (x * keep.unsqueeze(-1)).sum(dim=1) / count


def pool_inputs(time):
    generator = torch.Generator().manual_seed(time)
    ids = torch.randint(1, 9, (3, time), generator=generator)
    ids[0, time // 2:] = 0  # a padded row
    return torch.randn(3, time, 8, generator=generator), ids


def test_a_count_of_bools_over_a_dynamic_sequence_runs_whole(tmp_path):
    time = torch.export.Dim("time", min=2, max=40)
    pool = Exported(MaskedMeanPool().eval(), pool_inputs(8), ({1: time}, {1: time}), tmp_path / "pool.pte")
    assert len(pool.blobs) == 1 and pool.report.whole, pool.report
    for length in (2, 17, 40, 5):
        pool.check(pool_inputs(length))


class SplitHeads(torch.nn.Module):
    """A fused projection split three ways (chunk), one third split by sizes (split_with_sizes)
    and another in equal parts (split), the input's halves unbound (unbind): ops returning a list
    of tensors over a dynamic batch. ExecuTorch's verifier sizes such a result by the length of its
    first piece, which would fix the batch at the example's; kiln.export reads each piece as a view."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        a, b = v.split([3, 5], dim=-1)
        c, d = k.split(4, dim=-1)
        first, second = x.view(-1, 2, 4).unbind(1)
        return q * torch.cat([b, a], -1).sigmoid() + torch.cat([c * first, d + second], -1)


def batch_of(size, width=8):
    return (torch.randn(size, width, generator=torch.Generator().manual_seed(size)),)


def whole_over_a_dynamic_batch(model, inputs_of, sizes, path):
    """model exported with dim 0 of each input a batch of 1..max(sizes) (the example inputs_of(2))
    is one blob with nothing left out, matching eager at each size."""
    batch = torch.export.Dim("batch", min=1, max=max(sizes))
    example = inputs_of(2)
    exported = Exported(model.eval(), example, tuple({0: batch} for _ in example), path)
    assert len(exported.blobs) == 1 and not exported.report.left_out, exported.report
    for size in sizes:
        exported.check(inputs_of(size))


def test_splits_over_a_dynamic_batch_keep_it_dynamic(tmp_path):
    whole_over_a_dynamic_batch(SplitHeads(), batch_of, (1, 5, 3, 2), tmp_path / "split.pte")


def test_a_dim_lowering_fixed_is_refused_not_written_static(tmp_path, monkeypatch):
    # Without the rewrite of splits into views, ExecuTorch's lowering fixes the batch at 2.
    monkeypatch.setattr(sys.modules["kiln.export"], "splits_as_views", lambda program: program)
    batch = torch.export.Dim("batch", min=1, max=5)
    with pytest.raises(ValueError, match=r"kiln: input 'x' dim 0 was exported dynamic \(s\w+\) but "
                                         r"lowering fixed it at 2 \(an op guards on its size\); export it static "
                                         r"or change that op \(TORCH_LOGS=\+dynamic names it\)"):
        kiln.export(SplitHeads().eval(), batch_of(2), str(tmp_path / "fixed.pte"), dynamic_shapes=({0: batch},))
    assert not (tmp_path / "fixed.pte").exists()


class KeysIntoEmpty(torch.nn.Module):
    """Keys written into an empty of their whole shape a part at a time, as DeepSeek-V3's latent
    attention builds them: new_empty over the dynamic batch, then a slice write of each part."""

    def forward(self, nope, rope):
        keys = nope.new_empty(nope.shape[0], 4, 8)
        keys[..., :6] = nope
        keys[..., 6:] = rope
        return keys * 2.0


def key_parts_of(size):
    generator = torch.Generator().manual_seed(size)
    return torch.randn(size, 4, 6, generator=generator), torch.randn(size, 4, 2, generator=generator)


def test_an_empty_over_a_dynamic_batch_keeps_it_dynamic(tmp_path):
    # ExecuTorch lowers an empty into an allocation sized by plain ints (the batch fixed at 2);
    # kiln.export makes it a zero fill first.
    whole_over_a_dynamic_batch(KeysIntoEmpty(), key_parts_of, (1, 5, 3), tmp_path / "keys.pte")


class PairedRows(torch.nn.Module):
    """Rows joined in pairs by a reshape to [rows // 2, 16], as ConvBERT's span convolution
    reshapes by a count it divides: the rows' dynamic size divided exactly by a constant."""

    def forward(self, x):
        return torch.softmax(x.reshape(x.shape[0] // 2, 16), dim=-1) * 3.0


def test_a_size_divided_exactly_runs_whole(tmp_path):
    pairs = torch.export.Dim("pairs", min=2, max=4)
    exported = Exported(PairedRows().eval(), batch_of(4), ({0: 2 * pairs},), tmp_path / "pairs.pte")
    assert len(exported.blobs) == 1 and not exported.report.left_out, exported.report
    for rows in (4, 8, 6):
        exported.check(batch_of(rows))


class TopTwoRouting(torch.nn.Module):
    """A mixture-of-experts router's mask as PhiMoE writes it: a tensor of -inf the shape of the
    logits (full_like over the dynamic batch), the two chosen experts set to 0 (a scatter of a
    value), added before the softmax."""

    def forward(self, logits):
        chosen = logits.topk(2, dim=-1).indices
        mask = torch.full_like(logits, float("-inf")).scatter(-1, chosen, 0.0)
        return torch.softmax(logits + mask, dim=-1) + torch.zeros(logits.shape[0], 1)


def test_a_fill_and_a_scatter_over_a_dynamic_batch_run_whole(tmp_path):
    whole_over_a_dynamic_batch(TopTwoRouting(), batch_of, (1, 6, 4), tmp_path / "router.pte")


def test_a_real_decoder_with_fused_projections_runs_a_dynamic_batch(tmp_path):
    """Phi-3 splits its fused q/k/v and gate/up projections with chunk."""
    make, inputs = ARCHITECTURES["phi3"]
    batch = torch.export.Dim("batch", min=1, max=4)
    phi3 = Exported(make(), inputs(1), ({0: batch},), tmp_path / "phi3.pte")
    assert len(phi3.blobs) == 1 and phi3.report.whole, phi3.report
    (ids,) = inputs(2)
    for size in (1, 4, 3):
        phi3.check((ids.repeat(2, 1)[:size],))


class PooledChannelNorm(torch.nn.Module):
    """ConvNeXt's last block and head: a linear over channels last added to its input, an adaptive
    average pool to 1x1, a LayerNorm over channels last, a flatten. The pool's result keeps its
    input's permuted strides, which the edge dialect restores with an as_strided whose size
    follows the batch."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(6, 6)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.norm = torch.nn.LayerNorm(6)

    def forward(self, x):
        x = self.proj(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2) + x
        x = self.pool(x).permute(0, 2, 3, 1)
        return torch.flatten(self.norm(x).permute(0, 3, 1, 2), 1)


def images_of(size):
    return (torch.randn(size, 6, 3, 3, generator=torch.Generator().manual_seed(size)),)


def test_a_flatten_of_a_permuted_tensor_over_a_dynamic_batch_runs_whole(tmp_path):
    whole_over_a_dynamic_batch(PooledChannelNorm(), images_of, (1, 4, 3), tmp_path / "flatten.pte")


class TiledPositions(torch.nn.Module):
    """XCiT's positional encoding: a table repeated over the batch by a count read off the input's
    shape (a repeat by a dynamic count)."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(1, 6, 1, 3))

    def forward(self, x):
        return x * self.table.repeat(x.shape[0], 1, 3, 1)


class RepeatByASize(torch.nn.Module):
    """Rows of x (not a unit dim) tiled by another input's dynamic size: an output of 2*s rows."""

    def forward(self, x, z):
        return x.repeat(z.shape[0], 1) * 2.0


def test_a_repeat_by_a_dynamic_count_runs_whole(tmp_path):
    whole_over_a_dynamic_batch(TiledPositions(), images_of, (1, 4, 3), tmp_path / "tiled.pte")
    rows = torch.export.Dim("rows", min=2, max=8)
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    tiled = Exported(RepeatByASize().eval(), (x, torch.randn(4, 3)), (None, {0: rows}), tmp_path / "rows.pte")
    assert len(tiled.blobs) == 1 and not tiled.report.left_out, tiled.report
    for size in (2, 8, 5):
        tiled.check((x, torch.randn(size, 3)))
