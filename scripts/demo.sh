#!/usr/bin/env bash
# The main job: write a demo blob and inspect it.
set -euo pipefail
cd "$(dirname "$0")/.."
build/kiln demo-blob build/demo.kiln
build/kiln inspect build/demo.kiln
