"""`kiln audit` on purpose-made libraries and wheels: one test per rule that accepts and one per
rule that refuses, each asserting the message. The libraries are compiled here from
tests/audit/ with the system compilers; the wheels are written here."""

import importlib.metadata
import os
import random
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "audit")
sys.path.insert(0, os.path.join(ROOT, "packaging"))

import build_wheels  # noqa: E402

KILN = os.environ.get("KILN_CLI") or os.path.join(ROOT, "build", "kiln")
SANITIZED_KILN = os.path.join(ROOT, "build-sanitize", "kiln")
REGISTER = "executorch::runtime::register_backend"
# A sanitizer report must not pass for a refusal (exit status 1): give it its own status.
SANITIZER_EXIT = 86
SANITIZER_ENV = dict(os.environ, ASAN_OPTIONS=f"exitcode={SANITIZER_EXIT}", UBSAN_OPTIONS=f"exitcode={SANITIZER_EXIT}")


def audit(*args, kiln=KILN):
    """Runs kiln audit; returns (exit status, stdout, stderr lines). Every line fits 255 bytes."""
    result = subprocess.run([kiln, "audit", *map(str, args)], capture_output=True, text=True, env=SANITIZER_ENV)
    assert result.returncode >= 0, f"kiln audit died of signal {-result.returncode}: {result.stderr}"
    assert result.returncode != SANITIZER_EXIT, result.stderr
    lines = result.stderr.splitlines()
    for line in lines + result.stdout.splitlines():
        assert len(line.encode()) <= 255, line
    return result.returncode, result.stdout, lines


def refused(*args):
    """The refusal lines of an audit that must fail."""
    rc, out, lines = audit(*args)
    assert rc == 1, f"expected a refusal, got {rc}: {out}"
    assert lines
    return lines


def passes(*args):
    rc, out, lines = audit(*args)
    assert rc == 0, "\n".join(lines)
    assert lines == []
    return out


def one_refusal(*args):
    lines = refused(*args)
    assert len(lines) == 1, lines
    return lines[0]


class Builder:
    """Compiles fixture libraries into one directory; stub libraries are linked by name."""

    def __init__(self, directory):
        self.dir = directory

    def path(self, name):
        return os.path.join(self.dir, name)

    def compile(self, name, source, *flags, compiler="cc"):
        cmd = [compiler, "-shared", "-fPIC", "-o", self.path(name), os.path.join(FIXTURES, source),
               "-Wl,--no-as-needed", "-L", self.dir, *flags]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        return self.path(name)

    def stub(self, soname, *flags):
        return self.compile(soname, "stub.c", f"-Wl,-soname,{soname}", *flags)

    def delegate(self, name, *flags):
        return self.compile(name, "delegate.c", *flags)


@pytest.fixture(scope="session")
def libs(tmp_path_factory):
    assert os.path.isfile(KILN), f"{KILN} is missing: build the kiln command line (make build)"
    b = Builder(str(tmp_path_factory.mktemp("audit-libs")))
    b.stub("libexecutorch.so", "-DSTUB_EXECUTORCH")
    for soname in ("libtorch.so", "libc10.so", "libpython3.11.so.1.0", "libcudart.so.13", "libcublas.so.13",
                   "libcudnn_graph.so.9", "libcudnn.so.9"):
        b.stub(soname)
    return b


def delegate(libs, name, *flags):
    """A delegate linking the stub ExecuTorch, plus flags."""
    return libs.delegate(name, "-lexecutorch", *flags)


# ---------------------------------------------------------------- what a library links


def test_delegate_importing_registration_passes(libs):
    lib = delegate(libs, "libexecutorch_backend_good.so")
    assert passes(lib) == "kiln audit: libexecutorch_backend_good.so passes (manylinux_2_17_x86_64)\n"


@pytest.mark.parametrize("forbidden", ["libtorch.so", "libc10.so", "libpython3.11.so.1.0"])
def test_linking_pytorch_or_python_is_refused(libs, forbidden):
    lib = delegate(libs, "libexecutorch_backend_links.so", "-DNEEDS_STUB", f"-l:{forbidden}")
    line = one_refusal(lib)
    assert line.startswith(f"libexecutorch_backend_links.so links {forbidden}, which a Kiln library must not")
    assert line.endswith("remove it from the link")


def test_linking_cuda_runtime_and_math_libraries_passes(libs):
    lib = delegate(libs, "libexecutorch_backend_cuda.so", "-DNEEDS_STUB", "-l:libcudart.so.13", "-l:libcublas.so.13")
    passes(lib)


def test_linking_cudnn_itself_passes(libs):
    # The engine's convolutions link libcudnn.so.9, the library the cuDNN parts hang from.
    lib = delegate(libs, "libexecutorch_backend_cudnn.so", "-DNEEDS_STUB", "-l:libcudnn.so.9", "-l:libcudnn_graph.so.9")
    passes(lib)


# ---------------------------------------------------------------- RUNPATH and RPATH


def test_origin_relative_runpath_passes(libs):
    passes(delegate(libs, "libexecutorch_backend_origin.so", "-Wl,-rpath,$ORIGIN/../x:${ORIGIN}:$ORIGIN/lib"))


def test_absolute_runpath_is_refused(libs):
    line = one_refusal(delegate(libs, "libexecutorch_backend_abs.so", "-Wl,-rpath,$ORIGIN/../x:/opt/abs"))
    assert line.startswith("libexecutorch_backend_abs.so has RUNPATH entry '/opt/abs', which is not $ORIGIN-relative")


@pytest.mark.parametrize("entry", ["lib", "$ORIGINAL/lib"])
def test_runpath_relative_to_the_working_directory_is_refused(libs, entry):
    line = one_refusal(delegate(libs, "libexecutorch_backend_cwd.so", f"-Wl,-rpath,{entry}"))
    assert f"has RUNPATH entry '{entry}', which is not $ORIGIN-relative" in line


@pytest.mark.parametrize("runpath", ["$ORIGIN/a::$ORIGIN/b", "$ORIGIN/a:", ":$ORIGIN/a"])
def test_empty_runpath_entry_is_refused(libs, runpath):
    line = one_refusal(delegate(libs, "libexecutorch_backend_empty.so", f"-Wl,-rpath,{runpath}"))
    assert line == (
        f"libexecutorch_backend_empty.so has an empty RUNPATH entry in '{runpath}', which makes the "
        "loader search the current directory; remove the stray ':'"
    )


def test_absolute_rpath_is_refused(libs):
    lib = delegate(libs, "libexecutorch_backend_rpath.so", "-Wl,--disable-new-dtags", "-Wl,-rpath,/usr/lib/abs")
    line = one_refusal(lib)
    assert line.startswith("libexecutorch_backend_rpath.so has RPATH entry '/usr/lib/abs', which is not")


# ---------------------------------------------------------------- registration with ExecuTorch


def test_defining_the_registration_symbol_is_refused(libs):
    line = one_refusal(libs.delegate("libexecutorch_backend_defines.so", "-DDEFINE_REGISTER"))
    assert line.startswith(f"libexecutorch_backend_defines.so defines {REGISTER}, so it registers into a private registry")


def test_delegate_that_never_registers_is_refused(libs):
    line = one_refusal(delegate(libs, "libexecutorch_backend_silent.so", "-DNO_REGISTER"))
    assert line.startswith(f"libexecutorch_backend_silent.so does not import {REGISTER}, so loading it registers no backend")


def test_delegate_without_initializer_is_refused(libs):
    lib = delegate(libs, "libexecutorch_backend_noinit.so", "-DNO_INITIALIZER", "-nostartfiles")
    line = one_refusal(lib)
    assert line.startswith("libexecutorch_backend_noinit.so has no .init_array initializer")


def test_hidden_definition_of_the_registration_symbol_is_refused(libs):
    lib = libs.delegate("libexecutorch_backend_hides.so", "-DDEFINE_REGISTER", "-fvisibility=hidden")
    line = one_refusal(lib)
    assert line.startswith(f"libexecutorch_backend_hides.so defines {REGISTER}, so it registers into a private registry")


def elf_sections(data):
    """{name: (offset, size)} of an ELF64 little-endian file's sections."""
    shoff = int.from_bytes(data[40:48], "little")
    shnum, shstrndx = (int.from_bytes(data[i:i + 2], "little") for i in (60, 62))
    headers = [data[shoff + 64 * i:shoff + 64 * (i + 1)] for i in range(shnum)]
    field = lambda h, at, width: int.from_bytes(h[at:at + width], "little")  # noqa: E731
    names = field(headers[shstrndx], 24, 8)
    out = {}
    for h in headers:
        start = names + field(h, 0, 4)
        out[data[start:data.index(b"\0", start)].decode()] = (field(h, 24, 8), field(h, 32, 8))
    return out


def test_empty_init_array_is_refused(libs, tmp_path):
    data = bytearray(open(delegate(libs, "libexecutorch_backend_good.so"), "rb").read())
    offset, size = elf_sections(data)[".dynamic"]
    for at in range(offset, offset + size, 16):
        if int.from_bytes(data[at:at + 8], "little") == 27:  # DT_INIT_ARRAYSZ
            data[at + 8:at + 16] = bytes(8)
    path = tmp_path / "libexecutorch_backend_zero.so"
    path.write_bytes(bytes(data))
    assert one_refusal(path).startswith("libexecutorch_backend_zero.so has no .init_array initializer")


def test_unterminated_string_table_is_refused(libs, tmp_path):
    data = bytearray(open(delegate(libs, "libexecutorch_backend_good.so"), "rb").read())
    offset, size = elf_sections(data)[".dynstr"]
    data[offset + size - 1] = ord("X")
    path = tmp_path / "libexecutorch_backend_unterminated.so"
    path.write_bytes(bytes(data))
    line = one_refusal(path)
    assert line.startswith("libexecutorch_backend_unterminated.so is corrupt: ") and "outside" in line


# ---------------------------------------------------------------- exported entry points


def test_default_visible_export_passes(libs):
    lib = delegate(libs, "libexecutorch_backend_api.so", '-DEXPORT_VISIBILITY="default"')
    passes(lib, "--export", "kiln_engine_load")


def test_hidden_export_is_refused(libs):
    lib = delegate(libs, "libexecutorch_backend_hidden.so", '-DEXPORT_VISIBILITY="hidden"')
    line = one_refusal(lib, "--export", "kiln_engine_load")
    assert line.startswith("libexecutorch_backend_hidden.so: kiln_engine_load is present but hidden")


def test_missing_export_is_refused(libs):
    line = one_refusal(delegate(libs, "libexecutorch_backend_good.so"), "--export", "kiln_engine_load")
    assert line.startswith("libexecutorch_backend_good.so does not define kiln_engine_load")


# ---------------------------------------------------------------- the C++ runtime


def test_shared_libstdcxx_passes(libs):
    passes(libs.compile("libcxx_shared.so", "cxx_runtime.cpp", compiler="c++"))


def test_static_libstdcxx_is_refused(libs):
    lib = libs.compile("libcxx_static.so", "cxx_runtime.cpp", "-static-libstdc++", compiler="c++")
    line = one_refusal(lib)
    assert line.startswith("libcxx_static.so carries a private copy of the C++ runtime (defines ")
    assert line.endswith("link libstdc++ as a shared library (drop -static-libstdc++)")


# ---------------------------------------------------------------- glibc and libstdc++ versions


def test_glibc_newer_than_the_tag_is_refused(libs):
    lib = delegate(libs, "libexecutorch_backend_glibc.so", "-DNEEDS_GLIBC_2_34")
    line = one_refusal(lib, "--platform", "manylinux_2_28_x86_64")
    assert line == (
        "libexecutorch_backend_glibc.so needs GLIBC_2.34 (pthread_create) but manylinux_2_28_x86_64 "
        "allows up to GLIBC_2.28; build in that manylinux container or with an older toolchain"
    )


def test_glibc_within_the_tag_passes(libs):
    lib = delegate(libs, "libexecutorch_backend_glibc.so", "-DNEEDS_GLIBC_2_34")
    assert passes(lib, "--platform", "manylinux_2_35_x86_64").endswith("(manylinux_2_35_x86_64)\n")


def test_min_platform_is_the_lowest_tag_allowing_every_version(libs):
    assert passes(delegate(libs, "libexecutorch_backend_glibc.so", "-DNEEDS_GLIBC_2_34"), "--min-platform") == (
        "manylinux_2_34_x86_64\n"
    )
    assert passes(delegate(libs, "libexecutorch_backend_good.so"), "--min-platform") == "manylinux_2_17_x86_64\n"


def test_glibcxx_and_cxxabi_newer_than_the_tag_are_refused(libs):
    lib = libs.compile("libcxx_shared.so", "cxx_runtime.cpp", compiler="c++")
    glibcxx, cxxabi = refused(lib, "--platform", "manylinux_2_17_x86_64")
    assert glibcxx.startswith("libcxx_shared.so needs GLIBCXX_3.4.21 (")
    assert "but manylinux_2_17_x86_64 allows up to GLIBCXX_3.4.19; build in that manylinux container" in glibcxx
    assert cxxabi.startswith("libcxx_shared.so needs CXXABI_1.3.9 (_ZdlPvm) but manylinux_2_17_x86_64 allows up to "
                             "CXXABI_1.3.7;")


def patched_version(libs, tmp_path, old, new):
    """The glibc fixture with its version need old renamed new (same length) in .dynstr."""
    data = bytearray(open(delegate(libs, "libexecutorch_backend_glibc.so", "-DNEEDS_GLIBC_2_34"), "rb").read())
    offset, size = elf_sections(data)[".dynstr"]
    at = data.index(b"\0" + old.encode() + b"\0", offset, offset + size) + 1
    data[at:at + len(new)] = new.encode()
    path = tmp_path / "libexecutorch_backend_glibc.so"
    path.write_bytes(bytes(data))
    return path


def test_private_glibc_version_is_refused(libs, tmp_path):
    line = one_refusal(patched_version(libs, tmp_path, "GLIBC_2.34", "GLIBC_PRIV"))
    assert line == ("libexecutorch_backend_glibc.so needs GLIBC_PRIV (pthread_create), which no manylinux policy "
                    "allows; stop using that private glibc interface")


def test_version_newer_than_every_tag_is_refused(libs, tmp_path):
    path = patched_version(libs, tmp_path, "GLIBC_2.34", "GLIBC_2.99")
    expected = ("libexecutorch_backend_glibc.so needs GLIBC_2.99 (pthread_create), which no supported tag allows "
                "(newest manylinux_2_39_x86_64); build in a manylinux container or with an older toolchain")
    assert one_refusal(path) == expected
    assert one_refusal(path, "--min-platform") == expected


def test_named_version_counts_as_the_release_that_added_it(libs):
    lib = delegate(libs, "libexecutorch_backend_relr.so", "-Wl,-z,pack-relative-relocs")
    assert passes(lib, "--min-platform") == "manylinux_2_39_x86_64\n"
    line = one_refusal(lib, "--platform", "manylinux_2_35_x86_64")
    assert line.startswith("libexecutorch_backend_relr.so needs GLIBC_ABI_DT_RELR (no symbol named) but "
                           "manylinux_2_35_x86_64 allows up to GLIBC_2.35;")


def test_glibcxx_within_the_tag_passes(libs):
    passes(libs.compile("libcxx_shared.so", "cxx_runtime.cpp", compiler="c++"), "--platform", "manylinux_2_24_x86_64")


def test_unknown_platform_is_a_usage_error(libs):
    rc, _, lines = audit(delegate(libs, "libexecutorch_backend_good.so"), "--platform", "manylinux_2_99_x86_64")
    assert rc == 2
    assert lines[0].startswith("kiln audit: unknown platform tag 'manylinux_2_99_x86_64'")


def test_other_architecture_is_refused(libs, tmp_path):
    data = bytearray(open(delegate(libs, "libexecutorch_backend_good.so"), "rb").read())
    data[18:20] = (183).to_bytes(2, "little")  # EM_AARCH64
    path = tmp_path / "libexecutorch_backend_arm.so"
    path.write_bytes(bytes(data))
    line = one_refusal(path)
    assert line.startswith("libexecutorch_backend_arm.so is built for ELF machine 183, not x86_64")


# ---------------------------------------------------------------- damaged input


def test_file_that_is_not_elf_is_refused(tmp_path):
    path = tmp_path / "notes.so"
    path.write_text("not a library\n" * 10)
    assert one_refusal(path).startswith("notes.so is not an ELF file (140 bytes, no ELF magic)")


def test_missing_file_is_refused(tmp_path):
    line = one_refusal(tmp_path / "absent.so")
    assert line.startswith("cannot open ") and "(No such file or directory)" in line


def kilns():
    return [KILN] + ([SANITIZED_KILN] if os.path.isfile(SANITIZED_KILN) else [])


@pytest.mark.parametrize("kiln", kilns())
def test_truncated_elf_gives_one_line(libs, tmp_path, kiln):
    data = open(delegate(libs, "libexecutorch_backend_good.so"), "rb").read()
    path = tmp_path / "libexecutorch_backend_cut.so"
    for size in sorted({0, 1, 4, 63, 64, 65, 200} | set(range(0, len(data), max(1, len(data) // 97)))):
        path.write_bytes(data[:size])
        rc, _, lines = audit(path, kiln=kiln)
        assert rc == 1 and len(lines) == 1, (size, lines)


@pytest.mark.parametrize("kiln", kilns())
def test_corrupted_elf_never_crashes(libs, tmp_path, kiln):
    data = open(delegate(libs, "libexecutorch_backend_good.so", "-DNEEDS_GLIBC_2_34"), "rb").read()
    rng = random.Random(1234)
    path = tmp_path / "libexecutorch_backend_flip.so"
    for _ in range(300):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        path.write_bytes(bytes(damaged))
        rc, _, _ = audit(path, kiln=kiln)
        assert rc in (0, 1)


# ---------------------------------------------------------------- wheels


def installed_dir(dist, soname):
    """Where an installed distribution puts soname, relative to site-packages, from its RECORD."""
    for file in importlib.metadata.distribution(dist).files:
        if file.name == soname:
            return os.path.dirname(str(file))
    raise AssertionError(f"{dist} installs no {soname}")


PINS = build_wheels.requirements()


@pytest.fixture(scope="session")
def runtime_runpath():
    """The RUNPATH a delegate in kiln_runtime/ needs, from where the installed wheels put ExecuTorch,
    the CUDA runtime, cuBLAS and cuDNN: the audit must agree with the real distributions."""
    dirs = [installed_dir("executorch", "libexecutorch.so"), installed_dir("nvidia-cuda-runtime", "libcudart.so.13"),
            installed_dir("nvidia-cublas", "libcublas.so.13"), installed_dir("nvidia-cudnn-cu13", "libcudnn.so.9")]
    return ":".join(f"$ORIGIN/../{d}" for d in dict.fromkeys(dirs))


def runtime_library(libs, runpath, *flags):
    return delegate(libs, "libexecutorch_backend_kiln.so", "-DNEEDS_STUB", "-l:libcudart.so.13", "-l:libcublas.so.13",
                    f"-Wl,-rpath,{runpath}", *flags)


def make_wheel(directory, library, requires=PINS, tag="py3-none-manylinux_2_17_x86_64", name="kiln-runtime",
               member="kiln_runtime/libexecutorch_backend_kiln.so", file_tag=None, extra=()):
    dist = name.replace("-", "_")
    path = os.path.join(directory, f"{dist}-0.1.0-{file_tag or tag}.whl")
    files = [(f"{dist}/__init__.py", b"")] + list(extra)
    if library:
        files.append((member, open(library, "rb").read()))
    build_wheels.write_wheel(path, name, "0.1.0", tag, files, requires, "a test wheel")
    return path


@pytest.fixture
def good_library(libs, runtime_runpath):
    return runtime_library(libs, runtime_runpath)


def test_correct_runtime_wheel_passes(good_library, tmp_path):
    path = make_wheel(tmp_path, good_library)
    assert passes(path) == f"kiln audit: {os.path.basename(path)} passes\n"


def test_requirements_are_pinned_to_the_environment():
    assert PINS[0] == f"executorch=={importlib.metadata.version('executorch')}"
    assert PINS[1] == "torch"
    assert PINS[2:] == [f"{dist}=={importlib.metadata.version(dist)}"
                        for dist in ("nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cudnn-cu13")]


def with_requirement(index, requirement):
    requires = list(PINS)
    if requirement is None:
        del requires[index]
    else:
        requires[index] = requirement
    return requires


@pytest.mark.parametrize("requirement", ["executorch", "executorch>=1.5.1", "executorch==1.5.*", "executorch~=1.5.1",
                                         "executorch===1.5.1", "executorch==1.5.1,<2"])
def test_executorch_not_pinned_exactly_is_refused(good_library, tmp_path, requirement):
    line = one_refusal(make_wheel(tmp_path, good_library, with_requirement(0, requirement)))
    assert line == (
        f"kiln_runtime: executorch must be pinned exactly (NAME==X.Y.Z), "
        f"since the library is built against one ABI; found '{requirement}'"
    )


@pytest.mark.parametrize("requirement", ["torch>=2.0", "torch==2.14.1", "torch (<3)"])
def test_torch_with_a_bound_is_refused(good_library, tmp_path, requirement):
    line = one_refusal(make_wheel(tmp_path, good_library, with_requirement(1, requirement)))
    assert "torch must be required by name with no version bound, leaving the choice to the user; found" in line


@pytest.mark.parametrize("requirement", ["kiln", "Kiln==0.1.0"])
def test_requiring_kiln_is_refused(good_library, tmp_path, requirement):
    line = one_refusal(make_wheel(tmp_path, good_library, PINS + [requirement]))
    assert line.endswith("requires kiln, the exporter that builds it: no resolver can satisfy a wheel that depends "
                         "on its parent; drop the requirement")


def test_an_extra_requirement_is_refused(good_library, tmp_path):
    line = one_refusal(make_wheel(tmp_path, good_library, PINS + ["numpy>=1.0"]))
    assert line.endswith("requirement 'numpy>=1.0' is not allowed; kiln-runtime requires only executorch, torch and "
                         "the CUDA runtime and math libraries")


@pytest.mark.parametrize("requirement", ["torch; python_version >= '3.10'", "executorch[vgf]==1.5.1"])
def test_conditional_requirement_is_refused(good_library, tmp_path, requirement):
    index = 1 if requirement.startswith("torch") else 0
    line = one_refusal(make_wheel(tmp_path, good_library, with_requirement(index, requirement)))
    assert "carries extras, a marker or a URL; require the plain package so it always installs" in line


@pytest.mark.parametrize("index, dist", [(2, "nvidia-cuda-runtime"), (3, "nvidia-cublas"), (4, "nvidia-cudnn-cu13")])
def test_cuda_library_unpinned_is_refused(good_library, tmp_path, index, dist):
    line = one_refusal(make_wheel(tmp_path, good_library, with_requirement(index, f"{dist}>=13")))
    assert f"{dist} must be pinned exactly (NAME==X.Y.Z)" in line


@pytest.mark.parametrize("index, dist", [(0, "executorch"), (1, "torch")])
def test_missing_requirement_is_refused(good_library, tmp_path, index, dist):
    lines = refused(make_wheel(tmp_path, good_library, with_requirement(index, None)))
    assert f"does not require {dist}; add it to Requires-Dist" in lines[0]


def test_dropping_the_cuda_runtime_is_refused_twice(good_library, tmp_path):
    lines = refused(make_wheel(tmp_path, good_library, with_requirement(2, None)))
    assert len(lines) == 2
    assert "does not require nvidia-cuda-runtime; add it to Requires-Dist (pinned exactly)" in lines[0]
    assert lines[1].startswith("libexecutorch_backend_kiln.so needs libcudart.so.13 from nvidia-cuda-runtime, which")


def test_duplicate_requirement_is_refused(good_library, tmp_path):
    line = one_refusal(make_wheel(tmp_path, good_library, PINS + ["torch"]))
    assert line.endswith("requires torch more than once; keep one requirement")


@pytest.mark.parametrize("tag", ["py3-none-linux_x86_64", "cp311-cp311-manylinux_2_28_x86_64",
                                 "py3-none-manylinux_2_99_x86_64", "py3-none-manylinux2014_x86_64"])
def test_wrong_tag_is_refused(good_library, tmp_path, tag):
    line = one_refusal(make_wheel(tmp_path, good_library, tag=tag))
    assert line.startswith(f"kiln_runtime-0.1.0-{tag}.whl has tag {tag}; a Kiln wheel is tagged "
                           "py3-none-manylinux_2_NN_x86_64")


def test_wheel_file_tag_differing_from_the_name_is_refused(good_library, tmp_path):
    path = make_wheel(tmp_path, good_library, file_tag="py3-none-manylinux_2_28_x86_64")
    line = one_refusal(path)
    assert line.endswith("WHEEL declares tag py3-none-manylinux_2_17_x86_64 but the file name says "
                         "py3-none-manylinux_2_28_x86_64; write the same tag in both")


def test_bundled_library_is_audited_against_the_wheel_tag(libs, runtime_runpath, tmp_path):
    library = runtime_library(libs, runtime_runpath, "-DNEEDS_GLIBC_2_34")
    line = one_refusal(make_wheel(tmp_path, library, tag="py3-none-manylinux_2_28_x86_64"))
    assert line.startswith("libexecutorch_backend_kiln.so needs GLIBC_2.34 (pthread_create) but manylinux_2_28_x86_64")
    passes(make_wheel(tmp_path, library, tag="py3-none-manylinux_2_34_x86_64"))


def test_bundled_library_breaking_a_rule_is_refused(libs, runtime_runpath, tmp_path):
    library = runtime_library(libs, runtime_runpath, "-DNEEDS_STUB", "-l:libtorch.so")
    line = one_refusal(make_wheel(tmp_path, library))
    assert line.startswith("libexecutorch_backend_kiln.so links libtorch.so")


@pytest.mark.parametrize("entry, resolved", [("$ORIGIN/../torch/lib", "torch/lib"), ("$ORIGIN/lib", "kiln_runtime/lib")])
def test_runpath_where_no_required_wheel_installs_is_refused(libs, runtime_runpath, tmp_path, entry, resolved):
    library = runtime_library(libs, f"{runtime_runpath}:{entry}")
    line = one_refusal(make_wheel(tmp_path, library))
    assert line == (
        f"libexecutorch_backend_kiln.so: RUNPATH entry '{entry}' lands on site-packages/{resolved}, where no "
        "required wheel installs; fix or remove the entry"
    )


def without_cudnn():
    requires = [p for p in PINS if not p.startswith("nvidia-cudnn-cu13==")]
    assert len(requires) == len(PINS) - 1
    return requires


def test_runpath_to_cudnn_is_refused_when_cudnn_is_not_required(good_library, tmp_path):
    assert "$ORIGIN/../nvidia/cudnn/lib" in open(good_library, "rb").read().decode("latin-1")
    lines = refused(make_wheel(tmp_path, good_library, without_cudnn()))
    assert lines == [
        "kiln_runtime does not require nvidia-cudnn-cu13; add it to Requires-Dist (pinned exactly)",
        "libexecutorch_backend_kiln.so: RUNPATH entry '$ORIGIN/../nvidia/cudnn/lib' lands on "
        "site-packages/nvidia/cudnn/lib, where no required wheel installs; fix or remove the entry",
    ]


def test_cudnn_linked_must_be_required_and_reached(libs, runtime_runpath, tmp_path):
    library = runtime_library(libs, runtime_runpath, "-l:libcudnn_graph.so.9")
    passes(make_wheel(tmp_path, library))
    lines = refused(make_wheel(tmp_path, library, without_cudnn()))
    assert lines[-1] == ("libexecutorch_backend_kiln.so needs libcudnn_graph.so.9 from nvidia-cudnn-cu13, which kiln_runtime "
                         "does not require; add it to Requires-Dist, pinned exactly")
    unreached = runtime_library(libs, runtime_runpath.replace(":$ORIGIN/../nvidia/cudnn/lib", ""), "-l:libcudnn_graph.so.9")
    line = one_refusal(make_wheel(tmp_path, unreached))
    assert line == ("libexecutorch_backend_kiln.so needs libcudnn_graph.so.9 but no RUNPATH entry reaches nvidia/cudnn/lib, "
                    "where nvidia-cudnn-cu13 installs it; add that directory, $ORIGIN-relative")


def test_runpath_into_the_wheel_itself_passes(libs, runtime_runpath, tmp_path):
    library = runtime_library(libs, f"{runtime_runpath}:$ORIGIN/cmake")
    passes(make_wheel(tmp_path, library, extra=[("kiln_runtime/cmake/x.cmake", b"")]))


def test_runpath_climbing_out_of_site_packages_is_refused(libs, runtime_runpath, tmp_path):
    library = runtime_library(libs, f"{runtime_runpath}:$ORIGIN/../../lib")
    line = one_refusal(make_wheel(tmp_path, library))
    assert line.startswith("libexecutorch_backend_kiln.so has RUNPATH entry '$ORIGIN/../../lib', which climbs out of "
                           "site-packages once installed")


def test_needed_library_out_of_runpath_reach_is_refused(libs, runtime_runpath, tmp_path):
    executorch_only = runtime_runpath.split(":")[0]
    lines = refused(make_wheel(tmp_path, runtime_library(libs, executorch_only)))
    assert lines == [
        f"libexecutorch_backend_kiln.so needs {soname} but no RUNPATH entry reaches nvidia/cu13/lib, where {dist} "
        "installs it; add that directory, $ORIGIN-relative"
        for soname, dist in (("libcudart.so.13", "nvidia-cuda-runtime"), ("libcublas.so.13", "nvidia-cublas"))
    ]


def test_wheel_without_the_delegate_library_is_refused(tmp_path):
    line = one_refusal(make_wheel(tmp_path, None))
    assert line.endswith("carries no libexecutorch_backend_kiln.so, the library it exists to ship; build the "
                         "library before the wheel")


def test_member_missing_from_record_is_refused(good_library, tmp_path):
    path = make_wheel(tmp_path, good_library)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("kiln_runtime/extra.py", b"")
    line = one_refusal(path)
    assert line.endswith("member 'kiln_runtime/extra.py' is missing from RECORD, so pip cannot verify or uninstall "
                         "it; regenerate RECORD")


def test_renamed_wheel_is_refused(good_library, tmp_path):
    path = make_wheel(tmp_path, good_library)
    os.rename(path, path.replace("kiln_runtime-0.1.0", "kiln_runtime-0.2.0"))
    lines = refused(path.replace("kiln_runtime-0.1.0", "kiln_runtime-0.2.0"))
    assert any(line.startswith("kiln_runtime: the wheel lacks kiln_runtime-0.2.0.dist-info/") for line in lines)


def test_wheel_of_another_project_is_refused(good_library, tmp_path):
    line = one_refusal(make_wheel(tmp_path, good_library, name="other"))
    assert line.endswith("is a wheel of other, not of kiln or kiln_runtime; the audit knows only Kiln's two wheels")


def test_exporter_wheel_rules(libs, runtime_runpath, tmp_path):
    library = libs.compile("libkiln.so", "delegate.c", "-DNO_REGISTER", '-DEXPORT_VISIBILITY="default"', "-DNEEDS_STUB",
                           "-l:libcudart.so.13", f"-Wl,-rpath,{runtime_runpath}")
    exporter = dict(name="kiln", member="kiln/libkiln.so")
    passes(make_wheel(tmp_path, library, PINS + ["numpy"], **exporter), "--export", "kiln_engine_load")
    line = one_refusal(make_wheel(tmp_path, library, PINS + ["kiln"], **exporter))
    assert line.endswith("requires kiln, that is, itself; drop the requirement")
    line = one_refusal(make_wheel(tmp_path, library, PINS, **exporter), "--export", "kiln_engine_execute")
    assert line.startswith("libkiln.so does not define kiln_engine_execute")


def test_platform_flag_on_a_wheel_is_a_usage_error(good_library, tmp_path):
    rc, _, lines = audit(make_wheel(tmp_path, good_library), "--platform", "manylinux_2_28_x86_64")
    assert rc == 2 and "a wheel is audited against its own tag" in lines[0]


def central_entry(data, name):
    """Offset of the central directory record of member name."""
    end = data.rindex(b"PK\x05\x06")
    at = int.from_bytes(data[end + 16:end + 20], "little")
    while True:
        assert data[at:at + 4] == b"PK\x01\x02"
        name_len, extra_len, comment_len = (int.from_bytes(data[at + i:at + i + 2], "little") for i in (28, 30, 32))
        if data[at + 46:at + 46 + name_len] == name.encode():
            return at
        at += 46 + name_len + extra_len + comment_len


def patched(path, offset, value, width):
    data = bytearray(open(path, "rb").read())
    data[offset:offset + width] = value.to_bytes(width, "little")
    open(path, "wb").write(bytes(data))


def test_member_failing_its_crc_is_refused(good_library, tmp_path):
    path = make_wheel(tmp_path, good_library)
    with zipfile.ZipFile(path) as source:
        members = [(info, source.read(info)) for info in source.infolist()]
    with zipfile.ZipFile(path, "w") as stored:
        for info, data in members:
            if info.filename.endswith("METADATA"):
                data = data.replace(b"Requires-Dist: torch", b"Requires-Dist: tOrch")
                info.CRC = None
            info.compress_type = zipfile.ZIP_STORED
            stored.writestr(info, data)
    raw = bytearray(open(path, "rb").read())
    raw[raw.index(b"Requires-Dist: tOrch") + 16] = ord("o")  # the bytes change, the recorded CRC does not
    open(path, "wb").write(bytes(raw))
    line = one_refusal(path)
    assert line.endswith("member 'kiln_runtime-0.1.0.dist-info/METADATA' fails its CRC-32 check; rebuild the archive")


def test_duplicate_member_is_refused(good_library, tmp_path):
    path = make_wheel(tmp_path, good_library)
    with pytest.warns(UserWarning), zipfile.ZipFile(path, "a") as archive:
        archive.writestr("kiln_runtime/__init__.py", b"import os")
    assert one_refusal(path).endswith("holds two members named 'kiln_runtime/__init__.py', so what installs is "
                                      "ambiguous; rebuild the archive")


@pytest.mark.parametrize("name", ["../evil.py", "/abs.py", "kiln_runtime/../../evil.py", "a\\b.py", "a//b.py"])
def test_unsafe_member_name_is_refused(good_library, tmp_path, name):
    path = make_wheel(tmp_path, good_library)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(zipfile.ZipInfo("x" * len(name)), b"")
    raw = open(path, "rb").read().replace(("x" * len(name)).encode(), name.encode())
    open(path, "wb").write(raw)
    assert "with an unsafe name" in one_refusal(path)


@pytest.mark.parametrize("field, offset, value, width, message", [
    ("flags", 8, 1, 2, "is encrypted, which a wheel never is"),
    ("method", 10, 12, 2, "uses compression method 12; write it stored (0) or deflated (8)"),
    ("size", 24, 0xFFFFFFFF, 4, "needs zip64 fields, which the audit does not read"),
    ("local offset", 42, 0x7FFFFFF0, 4, "the local header or data of member"),
    ("compressed size", 20, 0x7FFFFFF0, 4, "the local header or data of member"),
])
def test_damaged_central_directory_entry_is_refused(good_library, tmp_path, field, offset, value, width, message):
    path = make_wheel(tmp_path, good_library)
    patched(path, central_entry(open(path, "rb").read(), "kiln_runtime/__init__.py") + offset, value, width)
    assert message in one_refusal(path)


def local_data(data, name):
    """(local header offset, data offset) of member name."""
    local = int.from_bytes(data[central_entry(data, name) + 42:][:4], "little")
    name_len, extra_len = (int.from_bytes(data[local + i:local + i + 2], "little") for i in (26, 28))
    return local, local + 30 + name_len + extra_len


def test_local_header_naming_another_member_is_refused(good_library, tmp_path):
    path = make_wheel(tmp_path, good_library)
    local, _ = local_data(open(path, "rb").read(), "kiln_runtime/__init__.py")
    patched(path, local + 30, ord("X"), 1)
    assert "the local header or data of member 'kiln_runtime/__init__.py' is missing, mismatched" in one_refusal(path)


def test_member_that_does_not_inflate_is_refused(good_library, tmp_path):
    path = make_wheel(tmp_path, good_library)
    _, start = local_data(open(path, "rb").read(), "kiln_runtime-0.1.0.dist-info/METADATA")
    patched(path, start, 0xFF, 1)  # a final block of the reserved type 3
    line = one_refusal(path)
    assert "member 'kiln_runtime-0.1.0.dist-info/METADATA' does not inflate to its recorded" in line


@pytest.mark.parametrize("offset, value, width, message", [
    (4, 1, 2, "is a multi-disk zip archive"),
    (16, 0xFFFFFFFF, 4, "is a zip64 archive, which the audit does not read"),
    (16, 0x7FFFFFF0, 4, "its central directory"),
])
def test_damaged_end_record_is_refused(good_library, tmp_path, offset, value, width, message):
    path = make_wheel(tmp_path, good_library)
    end = open(path, "rb").read().rindex(b"PK\x05\x06")
    patched(path, end + offset, value, width)
    assert message in one_refusal(path)


@pytest.mark.parametrize("kiln", kilns())
def test_truncated_or_garbage_wheel_gives_one_line(good_library, tmp_path, kiln):
    data = open(make_wheel(tmp_path, good_library), "rb").read()
    path = tmp_path / "kiln_runtime-0.1.0-py3-none-manylinux_2_17_x86_64.whl"
    for size in sorted({0, 10, 21, 22, len(data) - 22, len(data) - 1} | set(range(0, len(data), len(data) // 50))):
        path.write_bytes(data[:size])
        rc, _, lines = audit(path, kiln=kiln)
        assert rc == 1 and len(lines) == 1, (size, lines)
    path.write_bytes(b"PK\x05\x06" + bytes(18))
    assert audit(path, kiln=kiln)[0] == 1


@pytest.mark.parametrize("kiln", kilns())
def test_corrupted_wheel_never_crashes(good_library, tmp_path, kiln):
    data = open(make_wheel(tmp_path, good_library), "rb").read()
    path = tmp_path / "kiln_runtime-0.1.0-py3-none-manylinux_2_17_x86_64.whl"
    rng = random.Random(4321)
    for _ in range(300):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 6)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        path.write_bytes(bytes(damaged))
        assert audit(path, kiln=kiln)[0] in (0, 1)


# ---------------------------------------------------------------- the wheel builder


def test_build_writes_the_wheel_only_after_every_audit_passes(libs, good_library, tmp_path):
    out = tmp_path / "dist"
    files = [("kiln_runtime/__init__.py", b"")]
    member = "kiln_runtime/libexecutorch_backend_kiln.so"
    path, size, unpacked = build_wheels.build_wheel(KILN, str(out), "kiln-runtime", good_library, member, files, "t")
    assert os.path.basename(path) == f"kiln_runtime-{build_wheels.project_version()}-py3-none-manylinux_2_17_x86_64.whl"
    assert sorted(os.listdir(out)) == [os.path.basename(path)]
    assert size == os.path.getsize(path) and unpacked > 0
    good = open(path, "rb").read()
    bad = libs.delegate("libexecutorch_backend_kiln.so", "-DDEFINE_REGISTER")
    with pytest.raises(build_wheels.BuildError, match="defines executorch::runtime::register_backend"):
        build_wheels.build_wheel(KILN, str(out), "kiln-runtime", bad, member, files, "t")
    assert sorted(os.listdir(out)) == [os.path.basename(path)]
    assert open(path, "rb").read() == good
