"""The main job: export a small transformer block with Kiln, run it through ExecuTorch, compare."""

import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


class DemoBlock(torch.nn.Module):
    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.norm2 = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


def main():
    import kiln

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ["KILN_DEVICE"] = "cpu"
    import kiln_runtime  # noqa: F401  (registers KilnBackend with ExecuTorch)
    from executorch.runtime import Runtime

    torch.manual_seed(0)
    model = DemoBlock().eval()
    x = torch.randn(2, 16, 64)
    path = os.path.join(ROOT, "build", "demo.pte")
    kiln.export(model, (x,), path)
    print(f"exported {path} ({os.path.getsize(path)} bytes)")
    subprocess.run([os.path.join(ROOT, "build", "kiln"), "inspect", path], check=True)

    program = Runtime.get().load_program(path)  # a Method does not keep its Program alive
    method = program.load_method("forward")
    (out,) = method.execute([x])
    with torch.no_grad():
        ref = model(x)
    engine = "the CUDA engine on the GPU" if on_gpu else "the CPU reference engine (no GPU found)"
    print(f"ran through ExecuTorch with Kiln on {engine}")
    print(f"largest difference from PyTorch eager: {(out - ref).abs().max().item():.3e}")


if __name__ == "__main__":
    main()
