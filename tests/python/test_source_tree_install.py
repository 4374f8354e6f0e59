"""scripts/install_source_tree.sh (run by scripts/setup.sh, so by `make demo`) makes a virtualenv's
Python import kiln and kiln_runtime from this tree, as the README's snippets expect. It is tried
on a throwaway virtualenv that sees the test environment's packages through a .pth file."""

import os
import subprocess
import sys
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_setup_installs_the_source_tree():
    with open(os.path.join(ROOT, "scripts", "setup.sh")) as f:
        assert "scripts/install_source_tree.sh .venv" in f.read().split("\n")


def test_venv_imports_kiln_and_kiln_runtime_from_the_tree(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "test-environment.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")  # torch and executorch, nothing of kiln
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import kiln, kiln_runtime; print(kiln.__file__); print(kiln_runtime.__file__)"
    before = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                            timeout=300)
    assert before.returncode != 0 and "No module named 'kiln" in before.stderr, before.stdout + before.stderr

    result = subprocess.run([os.path.join(ROOT, "scripts", "install_source_tree.sh"), str(venv)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    after = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                           timeout=300)
    assert after.returncode == 0, after.stderr[-3000:]
    assert after.stdout.split() == [os.path.join(ROOT, "python", "kiln", "__init__.py"),
                                    os.path.join(ROOT, "python", "kiln_runtime", "__init__.py")]
