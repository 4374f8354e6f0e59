#!/usr/bin/env bash
# Makes the in-tree packages (python/kiln, python/kiln_runtime) importable by a virtualenv's
# Python, the way an editable install does: a .pth file in its site-packages names python/.
# The build copies libkiln.so and the delegate library into those packages.
# Usage: scripts/install_source_tree.sh [VENV]   (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
printf '%s\n' "$PWD/python" > "$site/kiln-source-tree.pth"
echo "install_source_tree: $venv imports kiln and kiln_runtime from $PWD/python"
