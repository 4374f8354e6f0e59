"""End to end through ExecuTorch's own runtime: programs exported with kiln.export run with the
delegate library (Python after `import kiln_runtime`, C++ through the CMake package) on the CPU
reference engine and match PyTorch eager; damaged blobs are refused with the right ExecuTorch
error and Kiln's message; the library and the CMake package keep their packaging rules.

The delegate library and the CMake package come from the build directory $KILN_BUILD_DIR
(default build/), which CMake also copies the library from into python/kiln_runtime."""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
import models
import zoo_models

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(ROOT, "python")
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
BUILD_DIR = os.path.abspath(os.environ.get("KILN_BUILD_DIR") or os.path.join(ROOT, "build"))
PACKAGE_DIR = os.path.join(BUILD_DIR, "kiln_runtime")
LIBRARY_NAME = "libexecutorch_backend_kiln.so"
BLOB_MAGIC = b"KILNBLOB"
DELEGATE = os.path.join(PYTHON_DIR, "kiln_runtime", LIBRARY_NAME)

# ExecuTorch's error codes (runtime/core/error.h) for each refusal the adapter maps.
INVALID_PROGRAM = 0x23
INCOMPATIBLE = 0x30
INVALID_ARGUMENT = 0x12
MEMORY_ALLOCATION_FAILED = 0x21
NOT_SUPPORTED = 0x10
ERROR_NAMES = {
    INVALID_PROGRAM: "InvalidProgram",
    INCOMPATIBLE: "DelegateInvalidCompatibility",
    INVALID_ARGUMENT: "InvalidArgument",
    MEMORY_ALLOCATION_FAILED: "MemoryAllocationFailed",
    NOT_SUPPORTED: "NotSupported",
}


def executorch_cmake_dir():
    import executorch

    return os.path.join(list(executorch.__path__)[0], "lib", "cmake", "executorch")


def child_env(device="cpu"):
    """The environment of a child process: the in-tree packages, KILN_DEVICE set or removed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PYTHON_DIR, TESTS_DIR, env.get("PYTHONPATH", "")])
    env.pop("KILN_DEVICE", None)
    if device is not None:
        env["KILN_DEVICE"] = device
    return env


def run(command, device="cpu", timeout=600, cwd=None):
    return subprocess.run(
        command, env=child_env(device), capture_output=True, text=True, timeout=timeout, cwd=cwd,
        errors="replace",
    )


def run_python(code, device="cpu"):
    return run([sys.executable, "-c", textwrap.dedent(code)], device=device)


# Runs named actions in one child Python and returns, per action, its outcome ("ok" or the
# RuntimeError's text) and what ExecuTorch logged meanwhile (its Python log handler writes to
# sys.stderr, so each action's log is captured on its own).
CHILD_CASES = """
import contextlib, io, json, sys
import torch, kiln_runtime
from executorch.runtime import Runtime

def attempt(action):
    log = io.StringIO()
    with contextlib.redirect_stderr(log):
        try:
            action()
            outcome = "ok"
        except RuntimeError as error:
            outcome = str(error)
    return {"outcome": outcome, "log": log.getvalue()}

results = {}
"""


def run_cases(body, device="cpu"):
    result = run_python(CHILD_CASES + textwrap.dedent(body) + "\nprint(json.dumps(results))\n", device=device)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def check_refusals(results, expected):
    """expected: {case: (ExecuTorch error, text of Kiln's message, "init" or "execute")}."""
    problems = []
    for case, (code, message, call) in expected.items():
        outcome, log = results[case]["outcome"], results[case]["log"]
        if outcome == "ok":
            problems.append(f"{case}: not refused")
        elif error_code(outcome) != code:
            problems.append(f"{case}: {outcome}, expected error 0x{code:x}\n{log}")
        elif f"KilnBackend {call} failed with" not in log or message not in log:
            problems.append(f"{case}: the log lacks {message!r}:\n{log}")
    assert not problems, "\n".join(problems)


def raw_bytes(tensors):
    return b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in tensors)


def from_raw(data, like):
    """Splits raw bytes into tensors shaped and typed like the tensors of `like`."""
    out, offset = [], 0
    for t in like:
        size = t.numel() * t.element_size()
        chunk = bytearray(data[offset:offset + size])
        out.append(torch.frombuffer(chunk, dtype=torch.uint8).view(t.dtype).reshape(t.shape))
        offset += size
    assert offset == len(data), f"{len(data)} bytes of outputs, expected {offset}"
    return out


def flat(values):
    if isinstance(values, torch.Tensor):
        return [values]
    return [t for value in values for t in flat(value)]


def assert_close(actual, expected, tolerance, what):
    """max |kiln - eager| <= tolerance * max |eager| for each output (models.py's measure)."""
    assert len(actual) == len(expected), f"{what}: {len(actual)} outputs, expected {len(expected)}"
    for index, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape and a.dtype == e.dtype, f"{what} output {index}: {a.dtype}{list(a.shape)}, expected {e.dtype}{list(e.shape)}"
        a, e = a.double(), e.double()
        error = (a - e).abs().max().item()
        scale = max(e.abs().max().item(), 1e-30)
        assert error <= tolerance * scale, f"{what} output {index}: max error {error:.3g}, allowed {tolerance * scale:.3g}"


def error_code(text):
    """The ExecuTorch error code in a load or execute failure raised by the Python runtime."""
    match = re.search(r"error:? 0x:?([0-9a-fA-F]+)", text)
    assert match, f"no ExecuTorch error code in: {text}"
    return int(match.group(1), 16)


class Exported:
    def __init__(self, spec, directory):
        self.spec = spec
        self.path = os.path.join(directory, f"{spec.name}.pte")
        self.input_path = os.path.join(directory, f"{spec.name}.in")  # raw bytes, for C++
        self.torch_input_path = os.path.join(directory, f"{spec.name}.pt")  # for child Pythons
        self.inputs = list(spec.inputs())
        model = spec.make()
        with torch.no_grad():
            self.expected = flat(model(*self.inputs))
        self.program = kiln.export(model, tuple(self.inputs), self.path)
        with open(self.input_path, "wb") as f:
            f.write(raw_bytes(self.inputs))
        torch.save(self.inputs, self.torch_input_path)


@pytest.fixture(scope="session")
def delegate_library():
    if not os.path.isfile(DELEGATE) or not os.path.isfile(os.path.join(PACKAGE_DIR, LIBRARY_NAME)):
        pytest.fail(f"{DELEGATE} or {PACKAGE_DIR}/{LIBRARY_NAME} is missing: build the delegate library "
                    f"(make build, or set KILN_BUILD_DIR to the build directory)")
    return DELEGATE


@pytest.fixture(scope="session")
def zoo(tmp_path_factory, delegate_library):
    directory = str(tmp_path_factory.mktemp("zoo"))
    return {spec.name: Exported(spec, directory) for spec in models.ZOO}


@pytest.fixture(scope="session")
def runtime(delegate_library):
    import kiln_runtime  # noqa: F401  (registers KilnBackend)
    from executorch.runtime import Runtime

    return Runtime.get()


def configure_and_build(source, build, package_dir):
    for command in (
        ["cmake", "-S", source, "-B", build, "-G", "Ninja", f"-Dexecutorch_DIR={executorch_cmake_dir()}",
         f"-Dexecutorch_backend_kiln_DIR={package_dir}"],
        ["cmake", "--build", build, "-j2"],
    ):
        result = run(command)
        assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"


@pytest.fixture(scope="session")
def install_prefix(tmp_path_factory, delegate_library):
    """The runtime component installed with cmake --install, as an application would get it."""
    prefix = str(tmp_path_factory.mktemp("prefix"))
    result = run(["cmake", "--install", BUILD_DIR, "--component", "runtime", "--prefix", prefix])
    assert result.returncode == 0, result.stdout + result.stderr
    return prefix


@pytest.fixture(scope="session")
def run_pte(tmp_path_factory, install_prefix):
    """examples/run_pte built against the installed CMake package."""
    build = str(tmp_path_factory.mktemp("run_pte"))
    configure_and_build(os.path.join(ROOT, "examples", "run_pte"), build,
                        os.path.join(install_prefix, "lib", "cmake"))
    return os.path.join(build, "run_pte")


@pytest.fixture(scope="session")
def cpp_tests(tmp_path_factory, delegate_library):
    """tests/executorch built against the build tree's CMake package."""
    build = str(tmp_path_factory.mktemp("cpp_tests"))
    configure_and_build(os.path.join(ROOT, "tests", "executorch"), build, os.path.join(PACKAGE_DIR, "cmake"))
    return build


# ---------------------------------------------------------------- Python runtime


def test_import_registers_the_backend(delegate_library):
    result = run_python("""
        from executorch.runtime import Runtime
        registry = Runtime.get().backend_registry
        print("before", "KilnBackend" in registry.registered_backend_names)
        import kiln_runtime
        print("after", "KilnBackend" in registry.registered_backend_names, registry.is_available("KilnBackend"))
    """)
    assert result.returncode == 0, result.stderr
    assert "before False" in result.stdout and "after True True" in result.stdout, result.stdout


@pytest.mark.parametrize("name", [spec.name for spec in models.ZOO])
def test_zoo_matches_eager(name, zoo, runtime, monkeypatch):
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    exported = zoo[name]
    assert len(kiln.blobs(exported.program)) == exported.spec.kiln_blobs
    program = runtime.load_program(exported.path)  # a method does not keep its program alive
    method = program.load_method("forward")
    for _ in range(2):  # a second run on the same handle gives the same answer
        outputs = flat(method.execute(exported.inputs))
        assert_close(outputs, exported.expected, exported.spec.tolerance, name)


def test_split_program_has_several_kiln_blobs(zoo):
    with open(zoo["mixed"].path, "rb") as f:
        data = f.read()
    assert data.count(BLOB_MAGIC) == 3


def test_two_programs_loaded_at_once(zoo, runtime, monkeypatch):
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    first, second = zoo["gpt_block"], zoo["token_head"]
    programs = [runtime.load_program(e.path) for e in (first, second)]
    methods = [program.load_method("forward") for program in programs]
    for _ in range(3):
        for method, exported in zip(methods, (first, second)):
            assert_close(flat(method.execute(exported.inputs)), exported.expected, exported.spec.tolerance,
                         exported.spec.name)


# ---------------------------------------------------------------- C++ through the CMake package


@pytest.mark.parametrize("name", [spec.name for spec in models.ZOO])
def test_cpp_example_matches_eager(name, zoo, run_pte, tmp_path):
    exported = zoo[name]
    output = str(tmp_path / "out.bin")
    result = run([run_pte, exported.path, "--input", exported.input_path, "--output", output, "--runs", "5",
                  "--device", "cpu"], device=None)
    assert result.returncode == 0, result.stderr
    assert re.search(r"forward: median [0-9.]+ ms over 5 runs", result.stdout), result.stdout
    print(result.stdout)
    with open(output, "rb") as f:
        assert_close(from_raw(f.read(), exported.expected), exported.expected, exported.spec.tolerance, name)


@pytest.mark.parametrize("name", [spec.name for spec in zoo_models.REAL_ZOO])
def test_cpp_module_runs_real_models(name, real_zoo, run_pte, tmp_path):
    exported = real_zoo(name)  # test_model_zoo.py checks the same files in the Python runtime
    output = str(tmp_path / "out.bin")
    result = run([run_pte, exported.path, "--input", exported.input_path, "--output", output, "--runs", "2",
                  "--device", "cpu"], device=None)
    assert result.returncode == 0, result.stderr
    with open(output, "rb") as f:
        assert_close(from_raw(f.read(), [exported.expected]), [exported.expected], models.F32_TOLERANCE, name)


def test_cpp_example_reads_kiln_device(zoo, run_pte):
    result = run([run_pte, zoo["mlp"].path, "--runs", "2"], device="cpu")
    assert result.returncode == 0, result.stderr
    assert "output 0: Float [4, 8]:" in result.stdout, result.stdout


def test_cpp_four_threads(zoo, cpp_tests, tmp_path):
    for name in ("mlp", "gpt_block"):
        exported = zoo[name]
        output = str(tmp_path / f"{name}.out")
        result = run([os.path.join(cpp_tests, "kiln_threads"), exported.path, exported.input_path,
                      "--threads", "4", "--runs", "25", "--output", output])
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.strip() == "4 threads x 25 runs: all equal", result.stdout
        print(name, result.stdout.strip())
        with open(output, "rb") as f:
            assert_close(from_raw(f.read(), exported.expected), exported.expected, exported.spec.tolerance, name)


def test_cpp_two_programs_at_once(zoo, cpp_tests, tmp_path):
    a, b = zoo["mixed"], zoo["op_mix"]
    out_a, out_b = str(tmp_path / "a.out"), str(tmp_path / "b.out")
    result = run([os.path.join(cpp_tests, "kiln_two_programs"), a.path, a.input_path, b.path, b.input_path,
                  "--runs", "10", "--output-a", out_a, "--output-b", out_b])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "two programs at once x 10 runs each: all equal", result.stdout
    print(result.stdout.strip())
    for path, exported in ((out_a, a), (out_b, b)):
        with open(path, "rb") as f:
            assert_close(from_raw(f.read(), exported.expected), exported.expected, exported.spec.tolerance,
                         exported.spec.name)


def test_cpp_backend_options(zoo, cpp_tests):
    result = run([os.path.join(cpp_tests, "kiln_options"), zoo["mlp"].path], device=None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^16 passed, 0 failed$", result.stdout, re.M), result.stdout
    # Among the allocators too small, some had room for ExecuTorch's structures but not Kiln's.
    assert "KilnBackend init failed with out of memory:" in result.stderr, result.stderr[-3000:]
    assert "runtime allocator has no room for the handle of 2 bindings" in result.stderr, result.stderr[-3000:]
    if not torch.cuda.is_available():
        assert "load device=cuda: Error::NotSupported (0x10)" in result.stdout, result.stdout
        assert "load device=auto: Error::NotSupported (0x10)" in result.stdout, result.stdout
        assert "no CUDA GPU found" in result.stderr, result.stderr


# ---------------------------------------------------------------- refusals, each a real case


def blob_header(data):
    at = data.find(BLOB_MAGIC)
    assert at >= 0, "no Kiln blob in the program"
    fields = struct.unpack_from("<8sII7Q", data, at)
    names = ("magic", "version", "header_size", "metadata_offset", "metadata_size", "plan_offset",
             "plan_size", "weights_offset", "weights_size", "total_size")
    return at, dict(zip(names, fields))


def damage(data, how):
    """A copy of the program bytes with its first Kiln blob damaged in one way."""
    data = bytearray(data)
    at, header = blob_header(data)
    metadata = at + header["metadata_offset"]
    plan = at + header["plan_offset"]
    if how == "header":
        data[at] ^= 0xFF
    elif how == "header_sizes":
        struct.pack_into("<Q", data, at + 24, header["total_size"] * 2)
    elif how == "metadata":
        assert data[metadata] == ord("{")
        data[metadata] = ord("[")
    elif how == "metadata_not_utf8":
        where = data.find(b'"f32"', metadata, metadata + header["metadata_size"])
        assert where >= 0
        data[where + 2] = 0xB3
    elif how == "plan":
        assert data[plan:plan + 4] == b"KPLN"
        data[plan + 1] ^= 0xFF
    elif how == "plan_op_input":
        n_tensors = struct.unpack_from("<I", data, plan + 8)[0]
        struct.pack_into("<I", data, plan + 32 + 96 * n_tensors + 8, 0xFFFFFF)
    elif how == "version":
        struct.pack_into("<I", data, at + 8, header["version"] + 1)
    elif how == "arena":
        struct.pack_into("<Q", data, plan + 24, 1 << 50)
    else:
        raise ValueError(how)
    return bytes(data)


# (damage, ExecuTorch error, what the Kiln message says)
REFUSALS = [
    ("header", INVALID_PROGRAM, "blob magic"),
    ("header_sizes", INVALID_PROGRAM, "metadata"),
    ("metadata", INVALID_PROGRAM, "metadata"),
    ("metadata_not_utf8", INVALID_PROGRAM, "is not UTF-8"),
    ("plan", INVALID_PROGRAM, "KPLN"),
    ("plan_op_input", INVALID_PROGRAM, "op 0"),
    ("version", INCOMPATIBLE, "container version 2"),
    # The plan's tensors reach far less than 2^50 bytes: refused before anything is allocated.
    ("arena", INVALID_PROGRAM, "plan arena size 1125899906842624 exceeds"),
]


def test_damaged_blobs_are_refused_at_load_in_python(zoo, tmp_path):
    paths = {}
    with open(zoo["mlp"].path, "rb") as f:
        original = f.read()
    for how, _, _ in REFUSALS:
        paths[how] = str(tmp_path / f"{how}.pte")
        with open(paths[how], "wb") as f:
            f.write(damage(original, how))
    results = run_cases(f"""
        for case, path in {paths!r}.items():
            program = Runtime.get().load_program(path)
            results[case] = attempt(lambda: program.load_method("forward"))
    """)
    check_refusals(results, {how: (code, message, "init") for how, code, message in REFUSALS})


@pytest.mark.parametrize("how,code,message", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_damaged_blob_is_refused_at_load_in_cpp(how, code, message, zoo, run_pte, tmp_path):
    path = str(tmp_path / f"{how}.pte")
    with open(zoo["mlp"].path, "rb") as f:
        damaged = damage(f.read(), how)
    with open(path, "wb") as f:
        f.write(damaged)
    result = run([run_pte, path, "--device", "cpu"], device=None)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"load_method forward failed: Error::{ERROR_NAMES[code]} (0x{code:x})" in result.stderr, result.stderr
    assert message in result.stderr, result.stderr


def test_no_gpu_without_cpu_request_is_not_supported(zoo, run_pte):
    # A device number no machine has: refused on machines with and without a GPU.
    result = run([run_pte, zoo["mlp"].path, "--device", "cuda", "--device-id", "99"], device=None)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "load_method forward failed: Error::NotSupported (0x10)" in result.stderr, result.stderr
    python = run_python(f"""
        import kiln_runtime
        from executorch.runtime import Runtime
        try:
            Runtime.get().load_program({zoo["mlp"].path!r}).load_method("forward")
            print("loaded")
        except RuntimeError as error:
            print("refused:", error)
    """, device=None)
    assert python.returncode == 0, python.stderr
    if torch.cuda.is_available():
        assert "loaded" in python.stdout, python.stdout + python.stderr
    else:
        assert error_code(python.stdout) == NOT_SUPPORTED, python.stdout
        assert "KILN_DEVICE=cpu" in python.stderr, python.stderr


def test_bad_load_option_is_invalid_argument(zoo, run_pte):
    for option in (["--device-id", "-7"], ["--device", "tpu"]):
        result = run([run_pte, zoo["mlp"].path, "--device", "cpu", *option], device=None)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "load_method forward failed: Error::InvalidArgument (0x12)" in result.stderr, result.stderr
        assert "backend option \"device" in result.stderr, result.stderr


def test_bad_input_at_execute_is_invalid_argument(zoo):
    exported = zoo["token_head"]
    result = run_python(f"""
        import torch, kiln_runtime
        from executorch.runtime import Runtime
        program = Runtime.get().load_program({exported.path!r})
        method = program.load_method("forward")
        ids = torch.load({exported.torch_input_path!r})[0]
        ids[0, 0] = 99  # the embedding has 50 rows
        try:
            method.execute([ids])
            print("ran")
        except RuntimeError as error:
            print("refused:", error)
    """)
    assert result.returncode == 0, result.stderr
    assert error_code(result.stdout) == INVALID_ARGUMENT, result.stdout + result.stderr
    assert "KilnBackend execute failed with invalid argument" in result.stderr, result.stderr
    assert "index 99" in result.stderr, result.stderr


class Everything:
    """A partitioner handing every op to KilnBackend, whatever Kiln supports."""

    def __new__(cls):
        from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult

        class _Everything(Partitioner):
            def partition(self, program):
                for node in program.graph_module.graph.nodes:
                    if node.op == "call_function":
                        node.meta["delegation_tag"] = "kiln"
                return PartitionResult(tagged_exported_program=program,
                                       partition_tags={"kiln": DelegationSpec("KilnBackend", [])})

        return _Everything()


def export_with_blob(model, inputs, blob, path, monkeypatch):
    """A program whose one delegate call carries `blob`, built for another graph."""
    from executorch.exir import to_edge_transform_and_lower
    from kiln import lowering

    monkeypatch.setattr(lowering, "build_blob", lambda program, **options: blob)
    exported = torch.export.export(model, inputs)
    program = to_edge_transform_and_lower(exported, partitioner=[Everything()]).to_executorch()
    with open(path, "wb") as f:
        f.write(program.buffer)


class Negate(torch.nn.Module):
    def forward(self, x):
        return -x


class Sum(torch.nn.Module):
    def forward(self, x, y):
        return x + y


class Three(torch.nn.Module):
    def forward(self, x, y):
        return -x, -y, x.relu()


# (case, the zoo model whose blob the call carries, model, inputs, ExecuTorch error, message).
# mlp's blob takes x f32[4,16]; op_mix's takes x f32[4,8] and y f32[1,8] and gives 3 outputs.
MISMATCHES = [
    ("arity", "mlp", Sum(), (torch.ones(4, 16), torch.ones(4, 16)), INVALID_PROGRAM,
     "the delegate call passes 3 values but its Kiln blob has 1 inputs and 1 outputs"),
    ("dtype", "mlp", Negate(), (torch.ones(4, 16, dtype=torch.float64),), INVALID_ARGUMENT,
     "input x has ExecuTorch dtype 7, which Kiln does not run"),
    ("second_input", "op_mix", Three(), (torch.ones(4, 8), torch.ones(1, 8, dtype=torch.int8)), INVALID_ARGUMENT,
     "input y has ExecuTorch dtype 1, which Kiln does not run"),
    ("rank", "mlp", Negate(), (torch.ones([1] * 9 + [4, 16]),), INVALID_ARGUMENT,
     "input x has rank 11, above Kiln's limit of 8"),
    ("shape", "mlp", Negate(), (torch.ones(4, 32),), INVALID_ARGUMENT,
     "input 0 (\"x\") has shape [4,32] but the program takes [4,16]"),
]


def test_delegate_calls_not_matching_their_blob_are_refused(zoo, tmp_path, monkeypatch):
    cases = {}
    for case, blob_of, model, inputs, _, _ in MISMATCHES:
        path, inputs_path = str(tmp_path / f"{case}.pte"), str(tmp_path / f"{case}.pt")
        export_with_blob(model, inputs, kiln.blobs(zoo[blob_of].program)[0], path, monkeypatch)
        torch.save(list(inputs), inputs_path)
        cases[case] = (path, inputs_path)
    results = run_cases(f"""
        for case, (path, inputs_path) in {cases!r}.items():
            program = Runtime.get().load_program(path)
            method = program.load_method("forward")
            results[case] = attempt(lambda: method.execute(torch.load(inputs_path)))
    """)
    check_refusals(results, {case: (code, message, "execute") for case, _, _, _, code, message in MISMATCHES})


def test_random_damage_never_crashes(zoo):
    """Bit flips all over a blob: each load and run succeeds or is refused with a mapped error."""
    exported = zoo["mlp"]
    result = run_python(f"""
        import random, struct, torch
        import kiln_runtime
        from executorch.runtime import Runtime
        data = open({exported.path!r}, "rb").read()
        at = data.find(b"KILNBLOB")
        size = struct.unpack_from("<Q", data, at + 64)[0]
        inputs = torch.load({exported.torch_input_path!r})
        runtime = Runtime.get()
        rng = random.Random(1)
        counts = {{}}
        for _ in range(400):
            damaged = bytearray(data)
            damaged[at + rng.randrange(size)] ^= 1 << rng.randrange(8)
            try:
                program = runtime.load_program(bytes(damaged))
                program.load_method("forward").execute(inputs)
                outcome = "ran"
            except RuntimeError as error:
                outcome = str(error).rsplit(" ", 1)[-1]
            counts[outcome] = counts.get(outcome, 0) + 1
        print(sorted(counts.items()))
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    outcomes = dict(eval(result.stdout.strip()))
    assert sum(outcomes.values()) == 400
    assert outcomes.get("0x:23", 0) > 0, outcomes  # the damage did reach the parsers
    assert set(outcomes) <= {"ran", "0x:23", "0x:30", "0x:21", "0x:12"}, outcomes


def test_second_copy_of_the_library_is_not_registered(tmp_path, delegate_library):
    copy = str(tmp_path / LIBRARY_NAME)
    shutil.copy(delegate_library, copy)
    result = run_python(f"""
        import ctypes, kiln_runtime
        ctypes.CDLL({copy!r}, mode=ctypes.RTLD_GLOBAL)
        print("loaded")
    """)
    assert result.returncode == 0 and "loaded" in result.stdout, result.stderr
    assert "KilnBackend was not registered (error 0x12)" in result.stderr, result.stderr


def test_import_error_names_what_is_missing():
    import kiln_runtime

    message = kiln_runtime._missing_library_message(OSError("libcudart.so.13: cannot open shared object file: No such file or directory"))
    assert "libcudart.so.13" in message and "nvidia-cuda-runtime" in message
    message = kiln_runtime._missing_library_message(OSError("libexecutorch.so: cannot open shared object file"))
    assert "pip install executorch==1.5.1" in message


def test_import_error_remedies_are_the_wheels_pinned_requirements():
    import kiln_runtime

    sys.path.insert(0, os.path.join(ROOT, "packaging"))
    import build_wheels

    pinned = {r.split("==")[0]: r for r in build_wheels.requirements() if "==" in r}
    remedies = [remedy for _, remedy in kiln_runtime._REMEDIES]
    assert len(remedies) == 4 and sorted(r.split("==")[0] for r in remedies) == sorted(pinned)
    assert [pinned[r.split("==")[0]] for r in remedies] == remedies
    message = kiln_runtime._missing_library_message(OSError("libcudnn_graph.so.9: cannot open shared object file"))
    assert message.endswith(f"needs libcudnn_graph.so.9, which the loader did not find: pip install {pinned['nvidia-cudnn-cu13']}")


def test_import_fails_without_the_library(tmp_path):
    package = tmp_path / "kiln_runtime"
    package.mkdir()
    shutil.copy(os.path.join(PYTHON_DIR, "kiln_runtime", "__init__.py"), package / "__init__.py")
    result = subprocess.run(
        [sys.executable, "-c", "import kiln_runtime"], env={**child_env(), "PYTHONPATH": str(tmp_path)},
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0
    assert f"ImportError: {LIBRARY_NAME} is missing from {package}" in result.stderr, result.stderr


def test_import_fails_when_the_library_registers_nothing(tmp_path):
    # A library built against another ExecuTorch registers into a registry the runtime never reads.
    package = tmp_path / "kiln_runtime"
    package.mkdir()
    shutil.copy(os.path.join(PYTHON_DIR, "kiln_runtime", "__init__.py"), package / "__init__.py")
    (tmp_path / "empty.c").write_text("int kiln_runtime_test_placeholder;\n")
    built = run(["cc", "-shared", "-fPIC", str(tmp_path / "empty.c"), "-o", str(package / LIBRARY_NAME)])
    assert built.returncode == 0, built.stderr
    result = subprocess.run(
        [sys.executable, "-c", "import kiln_runtime"], env={**child_env(), "PYTHONPATH": str(tmp_path)},
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0
    assert f"ImportError: {LIBRARY_NAME} loaded but KilnBackend is not in ExecuTorch's registry" in result.stderr, result.stderr


# ---------------------------------------------------------------- the library and the CMake package


def elf_dynamic(path):
    result = run(["readelf", "-d", "-W", path])
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_library_links_only_the_runtime_it_registers_into(delegate_library):
    dynamic = elf_dynamic(delegate_library)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    assert "libexecutorch.so" in needed, needed
    allowed = re.compile(r"^(libexecutorch\.so|libcudart\.so\.\d+|libcublas(Lt)?\.so\.\d+|libcudnn[\w]*\.so\.\d+"
                         r"|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libm\.so\.6|libc\.so\.6|libpthread\.so\.0|libdl\.so\.2)$")
    assert [name for name in needed if not allowed.match(name)] == [], needed


def test_library_runpath_is_origin_relative(delegate_library):
    dynamic = elf_dynamic(delegate_library)
    runpath = re.findall(r"\((RUNPATH|RPATH)\)\s+Library \w+: \[([^\]]*)\]", dynamic)
    assert [kind for kind, _ in runpath] == ["RUNPATH"], runpath
    entries = runpath[0][1].split(":")
    assert "$ORIGIN/../executorch/lib" in entries, entries
    assert [e for e in entries if not e.startswith("$ORIGIN/")] == [], entries


def test_library_imports_registration_and_exports_nothing(delegate_library):
    undefined = run(["nm", "-D", "-C", "--undefined-only", delegate_library]).stdout
    assert "executorch::runtime::register_backend(" in undefined, undefined
    defined = run(["nm", "-D", "--defined-only", delegate_library]).stdout.split("\n")
    # Only the ELF version node may remain; no function or object is exported.
    assert [line for line in defined if line.strip() and " A " not in line] == [], defined


CONSUMER = """
cmake_minimum_required(VERSION 3.24)
project(consumer NONE)
find_package(executorch_backend_kiln REQUIRED)
get_target_property(location executorch::backend_kiln IMPORTED_LOCATION)
message(STATUS "kiln library: ${location}")
"""


def configure_consumer(tmp_path, package_cmake_dir):
    source = tmp_path / "consumer"
    source.mkdir(exist_ok=True)
    (source / "CMakeLists.txt").write_text(CONSUMER)
    return run(["cmake", "-S", str(source), "-B", str(tmp_path / "consumer-build"),
                f"-Dexecutorch_backend_kiln_DIR={package_cmake_dir}"])


def test_cmake_package_uses_its_own_library(tmp_path, delegate_library):
    package = tmp_path / "a" / "b" / "kiln_runtime"
    (package / "cmake").mkdir(parents=True)
    shutil.copy(os.path.join(PACKAGE_DIR, "cmake", "executorch_backend_kiln-config.cmake"), package / "cmake")
    shutil.copy(os.path.join(PACKAGE_DIR, LIBRARY_NAME), package)
    result = configure_consumer(tmp_path, package / "cmake")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"kiln library: {package}/{LIBRARY_NAME}" in result.stdout, result.stdout


def test_cmake_package_ignores_a_decoy_in_a_parent_directory(tmp_path, delegate_library):
    package = tmp_path / "a" / "b" / "kiln_runtime"
    (package / "cmake").mkdir(parents=True)
    shutil.copy(os.path.join(PACKAGE_DIR, "cmake", "executorch_backend_kiln-config.cmake"), package / "cmake")
    for decoy_dir in (tmp_path, tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "lib"):
        decoy_dir.mkdir(exist_ok=True)
        shutil.copy(os.path.join(PACKAGE_DIR, LIBRARY_NAME), decoy_dir / LIBRARY_NAME)
    result = configure_consumer(tmp_path, package / "cmake")
    assert result.returncode != 0, result.stdout
    assert "libexecutorch_backend_kiln.so is missing from" in result.stderr, result.stderr


# ---------------------------------------------------------------- caller buffers reach the engine


class AtanFirst(torch.nn.Module):
    """An input that ExecuTorch's own kernel reads first (Kiln has no atan), then Kiln."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.fc(torch.atan(x))


def planned(path, runtime):
    meta = runtime.load_program(path).load_method("forward").metadata
    return ([meta.input_tensor_meta(i).is_memory_planned() for i in range(meta.num_inputs())],
            [meta.output_tensor_meta(i).is_memory_planned() for i in range(meta.num_outputs())])


def test_kiln_io_is_left_out_of_the_memory_plan(zoo, runtime, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    for name, exported in zoo.items():
        inputs, outputs = planned(exported.path, runtime)
        assert not any(inputs) and not any(outputs), f"{name}: planned inputs {inputs}, outputs {outputs}"
    # An input an ExecuTorch kernel reads keeps its planned buffer; the output from Kiln does not.
    path = str(tmp_path / "atan_first.pte")
    kiln.export(AtanFirst().eval(), (torch.randn(4, 16),), path)
    assert planned(path, runtime) == ([True], [False])


def test_engine_reads_the_callers_input_buffer(zoo, runtime, monkeypatch):
    """The input set before execute and changed in place afterwards: the output is that of the
    changed values, so the engine read the caller's buffer at execute, not a copy set_input made."""
    monkeypatch.setenv("KILN_DEVICE", "cpu")
    exported = zoo["mlp"]
    model = exported.spec.make()
    method = runtime.load_program(exported.path).load_method("forward")
    x = exported.inputs[0].clone()
    method._method.set_inputs([x])
    x.mul_(-2.0)
    method._method.execute()
    got = flat(method._method.get_outputs())
    with torch.no_grad():
        changed, original = flat(model(x)), flat(model(x / -2.0))
    assert_close(got, changed, exported.spec.tolerance, "mlp on the changed input")
    assert (got[0] - original[0]).abs().max().item() > 1e-3, "the output is that of the values at set_input"


def test_output_without_a_buffer_is_refused_in_cpp(zoo, cpp_tests):
    result = run([os.path.join(cpp_tests, "kiln_unbound_output"), zoo["mlp"].path])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "forward without output buffers: Error::InvalidArgument (0x12)" in result.stdout, result.stdout
    assert "output aten_linear_default_2 has no buffer: the program leaves it to the caller" in result.stderr, result.stderr
