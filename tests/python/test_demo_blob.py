"""`kiln demo-blob PATH`: a deterministic MLP blob that the engine runs, written so that a failed
write never destroys a file already at PATH."""

import os
import subprocess

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.environ.get("KILN_CLI") or os.path.join(ROOT, "build", "kiln")


def demo_blob(*args):
    assert os.path.isfile(KILN), f"{KILN} is missing: build the kiln command line (make build)"
    return subprocess.run([KILN, "demo-blob", *args], capture_output=True, text=True, timeout=60)


def pattern(n, salt):
    """The weights cmd_demo_blob.c fills in: ((i*7 + salt*3) % 17 - 8) / 64."""
    i = np.arange(n)
    return (((i * 7 + salt * 3) % 17) - 8).astype(np.float32) / 64.0


def test_writes_a_blob_the_engine_runs(tmp_path):
    path = tmp_path / "mlp.blob"
    r = demo_blob(str(path))
    assert r.returncode == 0, r.stderr
    size = path.stat().st_size
    assert r.stdout == (f"wrote {path}: {size} bytes, MLP x f32 [2,16] -> linear 32 + relu -> "
                        f"linear 8 -> y f32 [2,8], arena 256 bytes\n")
    assert not (tmp_path / "mlp.blob.tmp").exists()

    again = tmp_path / "again.blob"
    assert demo_blob(str(again)).returncode == 0
    assert again.read_bytes() == path.read_bytes()

    import kiln

    x = torch.linspace(-1, 1, 32, dtype=torch.float32).reshape(2, 16)
    (y,) = kiln.run_blob(path.read_bytes(), [x], device="cpu")
    w1, b1 = pattern(32 * 16, 1).reshape(32, 16), pattern(32, 2)
    w2, b2 = pattern(8 * 32, 3).reshape(8, 32), pattern(8, 4)
    h = np.maximum(x.numpy().astype(np.float64) @ w1.T + b1, 0)
    want = h @ w2.T + b2
    assert y.shape == (2, 8)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)


def test_failed_write_keeps_the_existing_file(tmp_path):
    path = tmp_path / "mlp.blob"
    path.write_bytes(b"a good program")
    (tmp_path / "mlp.blob.tmp").mkdir()  # the temporary file cannot be created
    r = demo_blob(str(path))
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr == (f"kiln demo-blob: cannot write {path}: check the directory exists and is "
                        "writable\n")
    assert path.read_bytes() == b"a good program"


def test_missing_directory_and_usage(tmp_path):
    r = demo_blob(str(tmp_path / "no" / "such" / "dir.blob"))
    assert r.returncode == 1 and r.stderr.startswith("kiln demo-blob: cannot write ")
    r = demo_blob()
    assert r.returncode == 2 and r.stderr == "usage: kiln demo-blob PATH\n"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
