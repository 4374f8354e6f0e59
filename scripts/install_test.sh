#!/usr/bin/env bash
# The install test: builds and audits the kiln-runtime wheel, installs it into a fresh virtual
# environment with ExecuTorch and PyTorch from PyPI (not the kiln exporter), runs a committed
# program on the CPU reference engine through ExecuTorch's Python runtime, then builds the C++
# example against the installed CMake package and runs it, with decoy libraries of the same name
# planted in parent directories of the package. Prints the time each stage took.
#
# usage: scripts/install_test.sh WORK_DIR
#   KILN_BUILD_DIR  the CMake build directory holding the delegate library (default: build)
#   KILN_PYTHON     the development interpreter that builds the wheel (default: .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:?usage: scripts/install_test.sh WORK_DIR}
BUILD=${KILN_BUILD_DIR:-build}
DEV_PYTHON=${KILN_PYTHON:-.venv/bin/python}
DATA=$ROOT/tests/data
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)

stage_start=$(date +%s)
stage() {
  local now
  now=$(date +%s)
  echo "install_test: $1 ($((now - stage_start)) s)"
  stage_start=$now
}
fail() {
  echo "install_test: FAILED: $*" >&2
  exit 1
}

"$DEV_PYTHON" packaging/build_wheels.py --build-dir "$BUILD" --out "$WORK/dist" --only kiln-runtime
WHEEL=$(ls "$WORK"/dist/kiln_runtime-*.whl)
stage "built and audited $(basename "$WHEEL")"

# A fresh environment that sees nothing of this checkout. PyTorch is the user's choice: take the
# release the development environment uses.
TORCH_VERSION=$("$DEV_PYTHON" -c "import importlib.metadata as m; print(m.version('torch'))")
python3 -m venv "$WORK/venv"
PY=$WORK/venv/bin/python
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")
# The user's PyTorch is already installed: the development environment's, hard-linked in with what
# it requires, so that the fresh environment costs no disk for it. pip installs everything else
# kiln-runtime requires from PyPI.
"$DEV_PYTHON" scripts/link_installed.py "$SITE" torch
"$PY" -m pip install -q "$WHEEL" "torch==$TORCH_VERSION"
"$PY" -m pip show kiln >/dev/null 2>&1 && fail "installing kiln-runtime installed the kiln exporter"
stage "installed kiln-runtime and executorch beside torch==$TORCH_VERSION in a fresh environment"

# Decoys of the library in the package's parent directories: loading one ends the process with
# status 97, so nothing below passes by loading the wrong library.
cc -shared -fPIC "$ROOT/tests/audit/decoy.c" -o "$WORK/decoy.so"
cp "$WORK/decoy.so" "$SITE/libexecutorch_backend_kiln.so"
cp "$WORK/decoy.so" "$(dirname "$SITE")/libexecutorch_backend_kiln.so"

# Python: importing kiln_runtime is all it takes. Without the import the program must not load,
# which proves the program runs on Kiln and not on a fallback.
cd "$WORK"
KILN_DEVICE=cpu "$PY" - "$DATA" "$SITE" <<'EOF'
import os
import sys

import numpy as np
from executorch.runtime import Runtime

data, site = sys.argv[1], sys.argv[2]
program = Runtime.get().load_program(os.path.join(data, "install_model.pte"))
try:
    program.load_method("forward")
except Exception:
    pass
else:
    sys.exit("install_model.pte loaded without kiln_runtime: it does not run on Kiln")

import kiln_runtime  # noqa: E402

if not os.path.realpath(kiln_runtime.__file__).startswith(os.path.realpath(site)):
    sys.exit(f"kiln_runtime came from {kiln_runtime.__file__}, not from the fresh environment")
import torch  # noqa: E402

x = torch.from_numpy(np.fromfile(os.path.join(data, "install_model.input.bin"), dtype="<f4").reshape(2, 8))
expected = np.fromfile(os.path.join(data, "install_model.expected.bin"), dtype="<f4").reshape(2, 4)
method = Runtime.get().load_program(os.path.join(data, "install_model.pte")).load_method("forward")
out = method.execute([x])[0].numpy()
np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
print("install_test: Python output matches PyTorch")
EOF
stage "ran install_model.pte through executorch.runtime"

# C++: the example finds the package inside the installed wheel, past the decoys.
cmake -S "$ROOT/examples/run_pte" -B "$WORK/run_pte" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -Dexecutorch_DIR="$SITE/executorch/lib/cmake/executorch" \
  -Dexecutorch_backend_kiln_DIR="$SITE/kiln_runtime/cmake" >"$WORK/configure.log" 2>&1 ||
  { cat "$WORK/configure.log"; fail "configuring the example against the installed package"; }
cmake --build "$WORK/run_pte" -j2 >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; fail "building the example"; }
loaded=$(ldd "$WORK/run_pte/run_pte" | awk '$1 == "libexecutorch_backend_kiln.so" {print $3}')
[ "$(realpath "$loaded")" = "$(realpath "$SITE/kiln_runtime/libexecutorch_backend_kiln.so")" ] ||
  fail "the example resolves libexecutorch_backend_kiln.so to '$loaded', not the installed package's"
KILN_DEVICE=cpu "$WORK/run_pte/run_pte" "$DATA/install_model.pte" --input "$DATA/install_model.input.bin" \
  --output "$WORK/run_pte.out.bin" --runs 3 --device cpu
[ -s "$WORK/run_pte.out.bin" ] || fail "the example wrote no output"
"$PY" - "$WORK/run_pte.out.bin" "$DATA/install_model.expected.bin" <<'EOF'
import sys

import numpy as np

out, expected = (np.fromfile(path, dtype="<f4") for path in sys.argv[1:])
np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
print("install_test: C++ output matches PyTorch")
EOF
stage "built the C++ example against the installed CMake package and ran it"

# A package directory without its library, with a decoy in its parent, must not configure.
mkdir -p "$WORK/decoy/package"
cp -r "$SITE/kiln_runtime/cmake" "$WORK/decoy/package/"
cp "$WORK/decoy.so" "$WORK/decoy/libexecutorch_backend_kiln.so"
if cmake -S "$ROOT/examples/run_pte" -B "$WORK/decoy/build" -G Ninja \
  -Dexecutorch_DIR="$SITE/executorch/lib/cmake/executorch" \
  -Dexecutorch_backend_kiln_DIR="$WORK/decoy/package/cmake" >"$WORK/decoy.log" 2>&1; then
  fail "the CMake package configured with its library missing and a decoy in the parent directory"
fi
# CMake wraps the message: compare it with the whitespace collapsed.
tr -s ' \n' '  ' <"$WORK/decoy.log" | grep -qF "libexecutorch_backend_kiln.so is missing from $WORK/decoy/package" ||
  { cat "$WORK/decoy.log"; fail "configuring without the library failed for another reason"; }
stage "a package without its library refused the decoy in its parent directory"
echo "install_test: passed"
