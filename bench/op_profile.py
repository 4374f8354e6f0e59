"""Where a benchmark case's time goes: exports one case of bench.py and prints `kiln profile`
for it, each op of the Kiln plan timed alone on the GPU.

usage: python3 bench/op_profile.py CASE BATCH DTYPE [--reps N]   e.g. gpt_block 32 float16
"""

import argparse
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (sets KILN_LIBRARY to the CUDA build)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=sorted(bench.CASES))
    parser.add_argument("batch", type=int)
    parser.add_argument("dtype", choices=["float16", "float32", "bfloat16"])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    factory, make_inputs = bench.CASES[args.case]
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = factory().eval().to(dtype)
    inputs = make_inputs(args.batch, dtype)
    kiln_cli = os.environ.get("KILN_CLI", os.path.join(bench.ROOT, "build-gpu", "kiln"))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{args.case}.pte")
        bench.kiln.export(model, inputs, path)
        sys.stdout.flush()
        rc = subprocess.run([kiln_cli, "profile", path, "--reps", str(args.reps)]).returncode
    sys.exit(rc)


if __name__ == "__main__":
    main()
