"""Every CUDA kernel waits for the kernels ahead of it before it touches their data.

The CUDA engine launches its kernels early (src/cuda/cuda_early_launch.c): a kernel may be
scheduled while the one ahead of it on the stream still runs, so a kernel that reads or writes
before kcu_begin_early races with it, and a wrong answer comes only on a GPU, now and then. The
test reads every __global__ function under src/cuda and requires kcu_begin_early (or
kcu_wait_early, the wait without the early release) before any other statement (shared-memory
declarations aside); a kernel whose body is one call to a device function (the GEMV's) requires
it in that function. Every launch goes through kcu_launch_early
or, for the GEMV, its own configuration: no <<<...>>> launch is left to start a kernel without
the attribute's bookkeeping.
"""

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The collector must find at least this many kernels, so it cannot pass on nothing.
MIN_KERNELS = 35
# The waits a kernel may begin with: kcu_wait_early also keeps the next kernel from launching early.
WAITS = ("kcu_begin_early()", "kcu_wait_early()")
# Files that may call cudaLaunchKernelEx themselves: the launcher and the GEMV's launch.
OWN_LAUNCHES = {"cuda_device.cuh", "cuda_gemv.cu"}


def without_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def cuda_sources():
    files = sorted(glob.glob(os.path.join(ROOT, "src", "cuda", "*.cu")))
    return [(os.path.basename(f), without_comments(open(f).read()).replace("\\\n", "\n"))
            for f in files]


def body_at(text, brace):
    """The text between the brace at `brace` and its match."""
    depth = 0
    for i in range(brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[brace + 1:i]
    raise AssertionError("unbalanced braces")


def statements(body):
    return [s.strip() for s in body.split(";") if s.strip()]


def device_function(text, name):
    m = re.search(r"\b%s\s*\([^;{]*\)\s*\{" % re.escape(name), text)
    return body_at(text, m.end() - 1) if m else ""


def kernels(text):
    """(name, body) of each __global__ function in text."""
    for m in re.finditer(r"__global__", text):
        brace = text.index("{", m.end())
        head = re.sub(r"__launch_bounds__\s*\([^)]*\)", "", text[m.end():brace])
        name = re.search(r"(\w+)\s*\(", head).group(1)
        yield name, body_at(text, brace)


def waits_first(text, body):
    shared = set()
    for s in statements(body):
        if s.startswith(WAITS):
            return True
        if "__shared__" in s:
            shared.update(re.findall(r"(\w+)\s*\[", s))
            continue
        alias = re.fullmatch(r"[\w\s\*]+=\s*\([\w\s\*]+\)\s*(\w+)", s)
        if alias and alias.group(1) in shared:
            continue
        call = re.fullmatch(r"(\w+)\s*\(.*\)", s, flags=re.S)
        return bool(call) and any(w in device_function(text, call.group(1)) for w in WAITS)
    return False


def test_every_kernel_waits_before_it_touches_data():
    found, late = 0, []
    for name, text in cuda_sources():
        for kernel, body in kernels(text):
            found += 1
            if not waits_first(text, body):
                late.append(f"{name}: {kernel}")
    assert found >= MIN_KERNELS, f"only {found} kernels found"
    assert not late, "kernels that do not begin with kcu_begin_early or kcu_wait_early: " + ", ".join(late)


def test_every_launch_is_an_early_launch():
    bad = []
    for name, text in cuda_sources():
        if "<<<" in text:
            bad.append(f"{name}: a <<<...>>> launch")
        if "cudaLaunchKernelEx" in text and name not in OWN_LAUNCHES:
            bad.append(f"{name}: its own cudaLaunchKernelEx")
    assert not bad, "; ".join(bad)
