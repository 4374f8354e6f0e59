#!/usr/bin/env bash
# Installs what Kiln's build and tests need: system tools from Debian, Python packages into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for tool in cmake ninja clang gcc g++; do
  command -v "$tool" >/dev/null 2>&1 || need_apt+=("$tool")
done
# zlib's header: `kiln audit` inflates wheel members.
[ -f /usr/include/zlib.h ] || need_apt+=(zlib)
# libFuzzer's runtime ships apart from clang itself.
if command -v clang >/dev/null 2>&1 && [ ! -f "$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a)" ]; then
  need_apt+=(clang)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  pkgs=()
  for t in "${need_apt[@]}"; do
    case "$t" in ninja) pkgs+=(ninja-build) ;; zlib) pkgs+=(zlib1g-dev) ;; clang) pkgs+=(clang libclang-rt-dev) ;; *) pkgs+=("$t") ;; esac
  done
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkgs[@]}"
fi

stamp=.venv/.requirements
if [ ! -f "$stamp" ] || ! cmp -s requirements-dev.txt "$stamp"; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements-dev.txt
  cp requirements-dev.txt "$stamp"
fi

# The README's snippets run in .venv: it imports kiln and kiln_runtime from this tree.
scripts/install_source_tree.sh .venv
