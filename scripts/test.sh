#!/usr/bin/env bash
# Every test: C unit tests, the sanitizer build with its fuzzing, Python and end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build --output-on-failure -j2

cmake -S . -B build-sanitize -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DKILN_SANITIZE=ON -DKILN_FUZZ=ON -DKILN_WITH_EXECUTORCH=OFF >/dev/null
cmake --build build-sanitize
ctest --test-dir build-sanitize --output-on-failure -j2

.venv/bin/python -m pytest -q tests/python
