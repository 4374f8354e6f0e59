"""The install test (scripts/install_test.sh): the kiln-runtime wheel, installed into a fresh
virtual environment from PyPI, runs a committed program from Python and from the C++ example
built against the installed CMake package. It downloads ExecuTorch and PyTorch the first time
(pip's cache serves later runs) and needs the delegate library built (make build)."""

import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_installed_wheel_runs_from_python_and_cxx(tmp_path):
    work = tmp_path / "install"
    try:
        result = subprocess.run(
            [os.path.join(ROOT, "scripts", "install_test.sh"), str(work)],
            capture_output=True, text=True, timeout=3600,
        )
        log = result.stdout + result.stderr
        assert result.returncode == 0, log
        assert result.stdout.rstrip().endswith("install_test: passed"), log
        assert "install_test: Python output matches PyTorch" in result.stdout
        assert "install_test: C++ output matches PyTorch" in result.stdout
    finally:
        # The environment holds PyTorch and the CUDA wheels: several GB.
        shutil.rmtree(work, ignore_errors=True)
