#!/usr/bin/env bash
# GPU tests, run on a machine with an NVIDIA GPU (CI has none): the CUDA engine against the
# CPU reference engine op by op, the device-fault check in a process of its own, the model
# zoo and every architecture of the CPU suite against PyTorch eager on the GPU, and the two-GPU
# checks when two devices are present.
# Usage: scripts/gpu_test.sh [build-dir]   (the build must have the CUDA engine)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}

# The CUDA runtime, cuBLASLt and cuDNN: the toolkit's copies, else those of the nvidia pip packages.
for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib \
    $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cu13", "cublas", "cuda_runtime", "cudnn")))' 2>/dev/null); do
  if [ -d "$dir" ]; then LD_LIBRARY_PATH="$dir:${LD_LIBRARY_PATH:-}"; fi
done
export LD_LIBRARY_PATH
export KILN_LIBRARY="$PWD/$BUILD/libkiln.so"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

status=0
summary=()
step() {
  local name=$1
  shift
  echo "== $name: $*"
  if "$@"; then summary+=("PASS $name"); else summary+=("FAIL $name"); status=1; fi
}

nvidia-smi -L
step "cuda ops" timeout 300 "$BUILD/tests/gpu/test_cuda_ops"
step "device fault" timeout 60 "$BUILD/tests/gpu/test_cuda_ops" --fault
step "staging" timeout 300 "$BUILD/tests/gpu/test_cuda_staging"
gpus=$(nvidia-smi -L | grep -c '^GPU')
if [ "$gpus" -ge 2 ]; then
  step "two gpus" timeout 120 "$BUILD/tests/gpu/test_two_gpus"
else
  summary+=("NOT RUN two gpus: $gpus GPU visible")
fi
if [ "${KILN_GPU_MODELS:-1}" = 1 ]; then
  step "models" timeout 1500 python3 -m pytest -q -p no:cacheprovider tests/gpu \
    --ignore=tests/gpu/test_architectures_cuda.py
fi
# Every architecture of tests/python/test_architectures.py in fp32, fp16 and bf16: 240 cases of
# 5 to 20 s (each exported on the CPU, then run on both engines), split among KILN_GPU_JOBS
# pytest processes at once (default 5: on an H100 machine of 16 cores five ran them in about 7.5
# minutes, bench/results/gpu_test_2026-12-06f_h100.log).
architectures() {
  local jobs=${KILN_GPU_JOBS:-5} dir rc=0 part pids=()
  [ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
  dir=$(mktemp -d)
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/gpu/test_architectures_cuda.py |
    grep '::' > "$dir/cases" || { rm -rf "$dir"; return 1; }
  split -n "l/$jobs" "$dir/cases" "$dir/part_"
  for part in "$dir"/part_*; do
    [ -s "$part" ] || continue # fewer cases than processes: pytest given no case runs them all
    OMP_NUM_THREADS=$(( $(nproc) / jobs > 0 ? $(nproc) / jobs : 1 )) \
      timeout 3600 python3 -m pytest -q -p no:cacheprovider $(cat "$part") > "$part.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  echo "$(wc -l < "$dir/cases") cases in ${#pids[@]} processes:"
  for part in "$dir"/part_*.log; do grep -h '^FAILED' "$part"; tail -n 1 "$part"; done
  rm -rf "$dir"
  return $rc
}
if [ "${KILN_GPU_ARCHITECTURES:-1}" = 1 ]; then
  step "architectures" architectures
fi

echo "== summary"
printf '%s\n' "${summary[@]}"
exit $status
