#!/usr/bin/env bash
# The main job: export a demo model with Kiln, inspect it, run it through ExecuTorch, compare.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
.venv/bin/python scripts/demo.py
