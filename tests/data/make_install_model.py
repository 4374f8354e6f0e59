"""Writes the program the install test runs, with its input and expected output:

    install_model.pte           a small MLP exported with kiln.export (every op on Kiln)
    install_model.input.bin     its input, raw little-endian float32, shape [2, 8]
    install_model.expected.bin  PyTorch's output for that input, raw float32, shape [2, 4]

Run from the repository root with the development environment: .venv/bin/python tests/data/make_install_model.py
"""

import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))

import kiln  # noqa: E402


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(2, 8)
    kiln.export(model, (x,), os.path.join(HERE, "install_model.pte"))
    with torch.no_grad():
        expected = model(x)
    with open(os.path.join(HERE, "install_model.input.bin"), "wb") as f:
        f.write(x.numpy().astype("<f4").tobytes())
    with open(os.path.join(HERE, "install_model.expected.bin"), "wb") as f:
        f.write(expected.numpy().astype("<f4").tobytes())


if __name__ == "__main__":
    main()
