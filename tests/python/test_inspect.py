"""`kiln inspect` on real ExecuTorch programs and Kiln blobs, and on damaged copies of them.

The .pte files come from ExecuTorch's own exporter (XNNPACK partitioner) and serializer, so the
test does not depend on Kiln's exporter. A damaged file must give exit status 1 and exactly one
line of at most 255 bytes on stderr, never a crash; the sanitizer build's binary runs too when
it has been built.
"""

import os
import random
import re
import struct
import subprocess

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.environ.get("KILN_CLI") or os.path.join(ROOT, "build", "kiln")
SANITIZED_KILN = os.environ.get("KILN_SANITIZED_CLI") or os.path.join(ROOT, "build-sanitize", "kiln")
# A sanitizer report exits with this status, so it can never pass for a clean refusal.
SANITIZER_ENV = {
    "ASAN_OPTIONS": "exitcode=86:detect_leaks=1",
    "UBSAN_OPTIONS": "exitcode=86:halt_on_error=1:print_stacktrace=1",
}


def kilns():
    found = [KILN]
    if os.path.isfile(SANITIZED_KILN):
        found.append(SANITIZED_KILN)
    return found


def run(kiln, *args):
    assert os.path.isfile(kiln), f"{kiln} is missing: build the kiln command line (make build)"
    env = dict(os.environ, **SANITIZER_ENV)
    return subprocess.run([kiln, *args], capture_output=True, text=True, errors="replace", env=env,
                          timeout=60)


def refusal(kiln, path):
    """Runs inspect on a file that must be refused; returns its one line."""
    r = run(kiln, "inspect", str(path))
    assert r.returncode == 1, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert r.stdout == ""
    lines = r.stderr.split("\n")
    assert len(lines) == 2 and lines[1] == "", r.stderr[-2000:]
    assert 0 < len(lines[0].encode()) <= 255, lines[0]
    return lines[0]


def survives(kiln, path):
    """Any bytes: a clean listing (0) or one refusal line (1), nothing else."""
    r = run(kiln, "inspect", str(path))
    assert r.returncode in (0, 1), (path, r.returncode, r.stderr[-2000:])
    if r.returncode == 1:
        assert r.stdout == "" and r.stderr.count("\n") == 1, (path, r.stderr[-2000:])
        assert len(r.stderr.encode()) <= 256, r.stderr
    return r.returncode


# ---------------------------------------------------------------- files made by ExecuTorch


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 8)

    def forward(self, x):
        return torch.relu(self.fc(x))


@pytest.fixture(scope="module")
def xnnpack(tmp_path_factory):
    """A .pte lowered by ExecuTorch's XNNPACK partitioner, and the delegate payload it holds."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    exported = torch.export.export(Linear().eval(), (torch.randn(1, 4),))
    edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
    lowered = [m for _, m in edge.exported_program().graph_module.named_children()
               if getattr(m, "backend_id", None) == "XnnpackBackend"]
    assert len(lowered) == 1
    path = tmp_path_factory.mktemp("xnnpack") / "linear.pte"
    path.write_bytes(edge.to_executorch().buffer)
    return path, bytes(lowered[0].processed_bytes)


@pytest.fixture(scope="module")
def demo_blob(tmp_path_factory):
    path = tmp_path_factory.mktemp("blob") / "demo.blob"
    r = run(KILN, "demo-blob", str(path))
    assert r.returncode == 0, r.stderr
    return path


def with_kiln_delegate(pte_path, blob, out, segment):
    """Rewrites a program's delegate into a KilnBackend delegate holding blob, with ExecuTorch's
    own serializer: inline in the flatbuffer, or in a segment after it."""
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary
    from executorch.exir.schema import BackendDelegateInlineData

    pte = deserialize_pte_binary(pte_path.read_bytes())
    delegate = pte.program.execution_plan[0].delegates[0]
    delegate.id = "KilnBackend"
    pte.program.backend_delegate_data[delegate.processed.index] = BackendDelegateInlineData(data=blob)
    out.write_bytes(bytes(serialize_pte_binary(pte, extract_delegate_segments=segment)))
    return out


DELEGATE_LINE = re.compile(
    r"^    delegate (\d+): backend (\S+), (inline data|segment) (\d+) at byte (\d+), (\d+) bytes, "
    r"(\d+) compile specs$", re.M)


@pytest.mark.parametrize("kiln", kilns())
def test_lists_the_xnnpack_delegate_with_its_size_and_bytes(kiln, xnnpack):
    path, payload = xnnpack
    r = run(kiln, "inspect", str(path))
    assert r.returncode == 0, r.stderr
    data = path.read_bytes()
    assert r.stdout.startswith(f"ExecuTorch program: {len(data)} bytes, identifier ET12")
    assert '  plan 0 "forward":' in r.stdout
    found = DELEGATE_LINE.findall(r.stdout)
    assert len(found) == 1
    index, backend, where, _, at, size, _ = found[0]
    assert (index, backend) == ("0", "XnnpackBackend")
    assert int(size) == len(payload)
    assert data[int(at):int(at) + int(size)] == payload  # the bytes it points at are the payload
    assert "Kiln blob:" not in r.stdout  # no blob printed
    assert "  delegation: 0 Kiln blobs with 0 ops; 0 ops on ExecuTorch; 1 delegate calls\n" in r.stdout


def blob_header(data):
    magic, version, header = struct.unpack_from("<8sII", data, 0)
    sections = struct.unpack_from("<6Q", data, 16)
    return magic, version, header, sections, struct.unpack_from("<Q", data, 64)[0]


@pytest.mark.parametrize("kiln", kilns())
def test_prints_a_blob_header_metadata_and_plan(kiln, demo_blob):
    data = demo_blob.read_bytes()
    magic, version, header, s, total = blob_header(data)
    assert (magic, version, header, total) == (b"KILNBLOB", 1, 72, len(data))
    r = run(kiln, "inspect", str(demo_blob))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"Kiln blob: {len(data)} bytes, container version 1, header 72 bytes")
    assert f"  metadata section: offset {s[0]}, size {s[1]}\n" in out
    assert f"  plan section:     offset {s[2]}, size {s[3]}\n" in out
    assert f"  weights section:  offset {s[4]}, size {s[5]}\n" in out
    metadata = data[s[0]:s[0] + s[1]].decode()
    assert '"device_id": 0' in metadata
    for line in ["  producer: kiln 0.1.0", "  device_id: 0", "  allow_tf32: false",
                 '    input 0 "x": f32 [2, 16]', '    output 0 "y": f32 [2, 8]', "  aliases: none"]:
        assert line + "\n" in out, line
    plan = re.search(r"^plan: version 2, (\d+) tensors, (\d+) ops, 1 inputs, 1 outputs, 0 states, arena (\d+) bytes$",
                     out, re.M)
    assert plan, out
    n_tensors, n_ops = int(plan.group(1)), int(plan.group(2))
    assert len(re.findall(r"^    t\d+: ", out, re.M)) == n_tensors
    ops = re.findall(r"^    op \d+: (\w+)\((.*)\) -> t\d+ \[[\d, ]*\](.*)$", out, re.M)
    assert len(ops) == n_ops >= 2
    assert ops[0][0] == "linear" and ops[0][2] == "; epilogue: bias, relu"
    assert ops[-1][0] == "linear" and ops[-1][2] == "; epilogue: bias, none"
    assert ops[0][1].startswith("t0 [2, 16], ")


@pytest.mark.parametrize("segment", [False, True], ids=["inline", "segment"])
@pytest.mark.parametrize("kiln", kilns())
def test_inspects_a_kiln_blob_inside_a_pte(kiln, xnnpack, demo_blob, tmp_path, segment):
    blob = demo_blob.read_bytes()
    path = with_kiln_delegate(xnnpack[0], blob, tmp_path / "kiln.pte", segment)
    r = run(kiln, "inspect", str(path))
    assert r.returncode == 0, r.stderr
    found = DELEGATE_LINE.findall(r.stdout)
    assert len(found) == 1
    _, backend, where, _, at, size, _ = found[0]
    assert backend == "KilnBackend"
    assert where == ("segment" if segment else "inline data")
    assert int(size) == len(blob) and path.read_bytes()[int(at):int(at) + len(blob)] == blob
    assert f"      Kiln blob: {len(blob)} bytes, container version 1" in r.stdout
    assert '          input 0 "x": f32 [2, 16]\n' in r.stdout
    assert re.search(r"^      plan: version 2, \d+ tensors", r.stdout, re.M)


# ---------------------------------------------------------------- refusals


def blob_version_7(blob):
    return blob[:8] + struct.pack("<I", 7) + blob[12:]


@pytest.mark.parametrize("kiln", kilns())
def test_refuses_a_newer_blob_naming_both_versions(kiln, demo_blob, tmp_path):
    path = tmp_path / "v7.blob"
    path.write_bytes(blob_version_7(demo_blob.read_bytes()))
    assert refusal(kiln, path) == (
        "blob container version 7 is newer than this runtime understands (1): re-export the "
        "program with this Kiln release or upgrade the Kiln runtime")


@pytest.mark.parametrize("kiln", kilns())
def test_refuses_a_bad_kiln_blob_inside_a_pte_naming_the_delegate(kiln, xnnpack, demo_blob, tmp_path):
    bad = blob_version_7(demo_blob.read_bytes())
    path = with_kiln_delegate(xnnpack[0], bad, tmp_path / "bad.pte", True)
    assert refusal(kiln, path) == (
        "ExecuTorch program delegate 0 of plan 0 (KilnBackend): blob container version 7 is newer "
        "than this runtime understands (1): re-export the program with this Kiln release or "
        "upgrade the Kiln runtime")
    blob = demo_blob.read_bytes()
    metadata_offset = struct.unpack_from("<Q", blob, 16)[0]
    broken = bytearray(blob)
    broken[metadata_offset:metadata_offset + 1] = b"["
    path = with_kiln_delegate(xnnpack[0], bytes(broken), tmp_path / "meta.pte", False)
    assert refusal(kiln, path) == (
        "ExecuTorch program delegate 0 of plan 0 (KilnBackend): metadata at byte 0 is not a JSON "
        "object: re-export the program")


def retyped_input(blob):
    """The blob with its metadata declaring input x f16 while the plan's tensor stays f32."""
    metadata_offset, metadata_size = struct.unpack_from("<QQ", blob, 16)
    json = blob[metadata_offset:metadata_offset + metadata_size]
    assert json.count(b'"dtype": "f32"') == 2
    return blob.replace(json, json.replace(b'"dtype": "f32"', b'"dtype": "f16"', 1))


@pytest.mark.parametrize("kiln", kilns())
def test_refuses_what_the_loader_refuses(kiln, xnnpack, demo_blob, tmp_path):
    """inspect runs the loader's checks: bindings that disagree with the plan are refused with
    the loader's own message, alone and inside a program."""
    loader_says = ('metadata input 0 ("x") is f16 [2,16] but the plan\'s tensor is f32 [2,16]; '
                   're-export the program')
    bad = retyped_input(demo_blob.read_bytes())
    path = tmp_path / "retyped.blob"
    path.write_bytes(bad)
    assert refusal(kiln, path) == loader_says
    path = with_kiln_delegate(xnnpack[0], bad, tmp_path / "retyped.pte", True)
    assert refusal(kiln, path) == (
        "ExecuTorch program delegate 0 of plan 0 (KilnBackend): " + loader_says)


@pytest.mark.parametrize("kiln", kilns())
def test_refuses_named_faults_of_a_pte(kiln, xnnpack, tmp_path):
    data = xnnpack[0].read_bytes()
    size = len(data)
    program_size = struct.unpack_from("<Q", data, 16)[0]

    def refused(name, content):
        path = tmp_path / name
        path.write_bytes(bytes(content))
        return refusal(kiln, path)

    ident = bytearray(data)
    ident[4:8] = b"ET99"
    assert refused("ident.pte", ident) == (
        'ExecuTorch program identifier is "ET99", not "ET12": this kiln reads ExecuTorch 1.x '
        "programs; re-export the program or use a matching kiln")
    root = bytearray(data)
    root[0:4] = struct.pack("<I", 0xFFFFFF00)
    assert refused("root.pte", root) == (
        f"ExecuTorch program is malformed: the Program table at byte {0xFFFFFF00} lies outside the "
        f"{program_size}-byte program; the file is corrupt or truncated")
    vtable = bytearray(data)
    table = struct.unpack_from("<I", data, 0)[0]
    vt = table - struct.unpack_from("<i", data, table)[0]
    table_size = struct.unpack_from("<H", data, vt + 2)[0]
    vtable[vt:vt + 2] = struct.pack("<H", 3)
    assert refused("vtable.pte", vtable) == (
        f"ExecuTorch program is malformed: the Program table at byte {table} has a bad vtable "
        f"(size 3, table size {table_size}); the file is corrupt")
    segment_base = struct.unpack_from("<Q", data, 24)[0]
    segment_bytes = struct.unpack_from("<Q", data, 32)[0]
    assert refused("short.pte", data[:size - 1]) == (
        f"ExecuTorch program header says {program_size} program bytes and {segment_bytes} segment "
        f"bytes from byte {segment_base}, but the file has {size - 1}: the file is truncated or "
        "corrupt")
    assert refused("tiny.pte", data[:7]) == (
        f"{tmp_path / 'tiny.pte'} is neither a Kiln blob (magic KILNBLOB) nor an ExecuTorch "
        "program (identifier ET12): pass a blob or a .pte file")
    assert refused("empty", b"").endswith(
        "empty is neither a Kiln blob (magic KILNBLOB) nor an ExecuTorch program (identifier "
        "ET12): pass a blob or a .pte file")
    assert refusal(kiln, tmp_path / "absent.pte") == (
        f"cannot open {tmp_path / 'absent.pte'}: No such file or directory")
    assert refusal(kiln, tmp_path) == (
        f"{tmp_path} is not a regular file: pass a blob or a .pte file")


class Flat:
    """Just enough FlatBuffers reading to find a field's bytes in a .pte, so a test can damage
    one field (field numbers from ExecuTorch's schema/program.fbs)."""

    def __init__(self, data):
        self.data = data

    def deref(self, pos):
        return pos + struct.unpack_from("<I", self.data, pos)[0]

    def field(self, table, index):
        vtable = table - struct.unpack_from("<i", self.data, table)[0]
        vtable_size = struct.unpack_from("<H", self.data, vtable)[0]
        if 4 + 2 * index + 2 > vtable_size:
            return None
        offset = struct.unpack_from("<H", self.data, vtable + 4 + 2 * index)[0]
        return table + offset if offset else None

    def element(self, table, index, i):
        vector = self.deref(self.field(table, index))
        return self.deref(vector + 4 + 4 * i)

    def first_delegate(self):
        program = self.deref(0)
        plan = self.element(program, 1, 0)  # Program.execution_plan[0]
        return program, self.element(plan, 7, 0)  # ExecutionPlan.delegates[0]


@pytest.mark.parametrize("kiln", kilns())
def test_refuses_a_delegate_pointing_outside_the_file(kiln, xnnpack, tmp_path):
    data = xnnpack[0].read_bytes()
    flat = Flat(data)
    program, delegate = flat.first_delegate()
    reference = flat.deref(flat.field(delegate, 1))  # BackendDelegate.processed
    location_at, index_at = flat.field(reference, 0), flat.field(reference, 1)
    assert data[location_at] == 1  # SEGMENT
    segment_index = struct.unpack_from("<I", data, index_at)[0]
    n_segments = struct.unpack_from("<I", data, flat.deref(flat.field(program, 4)))[0]
    segment = flat.element(program, 4, segment_index)
    offset_at, size_at = flat.field(segment, 0), flat.field(segment, 1)
    offset = struct.unpack_from("<Q", data, offset_at)[0] if offset_at else 0  # 0 may be omitted
    size = struct.unpack_from("<Q", data, size_at)[0]
    base = struct.unpack_from("<Q", data, 24)[0]

    def refused(name, patches):
        content = bytearray(data)
        for at, value in patches:
            content[at:at + len(value)] = value
        path = tmp_path / name
        path.write_bytes(bytes(content))
        return refusal(kiln, path)

    for bad_size in [len(data) - base - offset + 1, 2**64 - 16]:  # one byte too many; a wrap
        assert refused("size.pte", [(size_at, struct.pack("<Q", bad_size))]) == (
            f"ExecuTorch program segment {segment_index} (offset {offset}, size {bad_size}, base "
            f"{base}) ends past the file end ({len(data)} bytes): the file is truncated or corrupt")
    assert size == len(xnnpack[1])
    assert refused("index.pte", [(index_at, struct.pack("<I", 9))]) == (
        f"ExecuTorch program delegate 0 of plan 0 refers to segment 9 but the program has "
        f"{n_segments}: the file is corrupt")
    assert refused("location.pte", [(location_at, b"\x05")]) == (
        "ExecuTorch program delegate 0 of plan 0 stores its data in location 5, which this kiln does "
        "not know: upgrade kiln")
    assert refused("inline.pte", [(location_at, b"\x00"), (index_at, struct.pack("<I", 3))]) == (
        "ExecuTorch program delegate 0 of plan 0 refers to inline data 3 but the program has 0: the "
        "file is corrupt")
    id_string = flat.deref(flat.field(delegate, 0))
    id_length = struct.unpack_from("<I", data, id_string)[0]
    assert data[id_string + 4:id_string + 4 + id_length] == b"XnnpackBackend"
    assert refused("id.pte", [(id_string + 4 + id_length, b"X")]) == (
        f"ExecuTorch program is malformed: the delegate id string at byte {id_string} is not "
        "terminated; the file is corrupt")
    assert refused("idlength.pte", [(id_string, struct.pack("<I", 0x7FFFFFFF))]) == (
        f"ExecuTorch program is malformed: the delegate id at byte {id_string} lies outside the "
        f"{struct.unpack_from('<Q', data, 16)[0]}-byte program; the file is corrupt or truncated")


def damaged_copies(data, seed, count):
    """Truncations at a stride and single-byte and multi-byte corruptions at random places."""
    rng = random.Random(seed)
    for n in range(0, len(data), max(1, len(data) // 97)):
        yield f"cut{n}", data[:n]
    for i in range(count):
        copy = bytearray(data)
        for _ in range(rng.choice([1, 1, 2, 4])):
            pos = rng.randrange(len(copy))
            copy[pos] = rng.choice([0x00, 0xFF, 0x7F, 0x80, rng.randrange(256)])
        yield f"flip{i}", bytes(copy)


@pytest.mark.parametrize("kiln", kilns())
def test_damaged_programs_are_refused_in_one_line_never_a_crash(kiln, xnnpack, demo_blob, tmp_path):
    kiln_pte = with_kiln_delegate(xnnpack[0], demo_blob.read_bytes(), tmp_path / "k.pte", True)
    outcomes = {0: 0, 1: 0}
    for source in (xnnpack[0], kiln_pte, demo_blob):
        for name, content in damaged_copies(source.read_bytes(), 7, 120):
            path = tmp_path / f"{source.stem}-{name}"
            path.write_bytes(content)
            outcomes[survives(kiln, path)] += 1
            path.unlink()
    assert outcomes[1] > 200  # most damage is detected


def test_help_lists_every_subcommand():
    r = run(KILN, "--help")
    assert r.returncode == 0
    for command in ["kiln inspect FILE", "kiln demo-blob PATH", "kiln audit", "kiln --help"]:
        assert command in r.stdout
    r = run(KILN, "frobnicate")
    assert r.returncode == 2
    assert r.stderr == 'kiln: unknown command "frobnicate": run kiln --help for the commands\n'
    assert run(KILN, "inspect").returncode == 2
    assert run(KILN).returncode == 2


def test_profile_needs_a_gpu_and_a_kiln_blob(xnnpack, demo_blob):
    """Without a GPU, `kiln profile` says so in one line; a program with no Kiln blob is refused
    as such; a bad command line gets the usage."""
    r = run(KILN, "profile", str(demo_blob))
    if r.returncode == 0:  # a machine with a GPU: one timed line per op
        assert re.search(r"^blob on cuda:\d+: \d+ ops", r.stdout, re.M), r.stdout
    else:
        assert r.returncode == 1 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
        assert re.fullmatch(r"kiln profile needs a CUDA GPU and found none \(.+\): run it on a "
                            r"machine with a GPU\n", r.stderr), r.stderr
        # The CPU engine is no remedy here, whatever KILN_DEVICE says.
        env = dict(os.environ, KILN_DEVICE="cpu")
        cpu = subprocess.run([KILN, "profile", str(demo_blob)], capture_output=True, text=True,
                             env=env, timeout=60)
        assert cpu.returncode == 1 and cpu.stderr == r.stderr, cpu.stderr
    r = run(KILN, "profile", str(xnnpack[0]))
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == "the program holds no KilnBackend blob: export it with Kiln's partitioner " \
                       "first\n"
    assert run(KILN, "profile", str(demo_blob), "--reps", "0").returncode == 2
    assert run(KILN, "profile").returncode == 2
