"""Builds Kiln's two wheels from a CMake build directory, offline, and audits them.

    .venv/bin/python packaging/build_wheels.py [--build-dir build] [--out dist] [--only kiln-runtime|kiln]

kiln-runtime carries the delegate library, the kiln_runtime package that loads it and the CMake
package; kiln carries the exporter and libkiln.so. Both are tagged py3-none-manylinux_2_NN_x86_64
with NN from `kiln audit --min-platform` on their library. The pins come from the environment
running this script, the one the libraries were built against. Each wheel is written into a
staging directory beside its target, audited with `kiln audit`, and moved into place only when
every check passes, so a refused build never replaces a good wheel.
"""

import argparse
import base64
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DELEGATE_LIBRARY = "libexecutorch_backend_kiln.so"
CMAKE_PACKAGE_FILES = ("executorch_backend_kiln-config.cmake", "executorch_backend_kiln-config-version.cmake")
# What a user downloads to run Kiln: the delegate library with every kernel stays within this.
RUNTIME_WHEEL_BUDGET = 1_500_000
# A fixed timestamp keeps the archives reproducible.
ZIP_DATE = (1980, 1, 1, 0, 0, 0)


class BuildError(Exception):
    """A wheel cannot be built; the message says why and what to do."""


def project_version():
    """KILN_VERSION_STRING, which the exporter's pyproject.toml must repeat."""
    with open(os.path.join(ROOT, "include", "kiln", "kiln.h"), encoding="utf-8") as f:
        match = re.search(r'#define KILN_VERSION_STRING "([^"]+)"', f.read())
    if not match:
        raise BuildError("include/kiln/kiln.h defines no KILN_VERSION_STRING, the version both wheels carry")
    with open(os.path.join(ROOT, "python", "pyproject.toml"), "rb") as f:
        declared = tomllib.load(f)["project"]["version"]
    if declared != match.group(1):
        raise BuildError(
            f"python/pyproject.toml says version {declared} but include/kiln/kiln.h says {match.group(1)}: "
            "make them equal"
        )
    return match.group(1)


def exported_api():
    """Every function include/kiln/kiln.h declares with KILN_API: libkiln.so must export each."""
    with open(os.path.join(ROOT, "include", "kiln", "kiln.h"), encoding="utf-8") as f:
        names = re.findall(r"KILN_API\s[^;{]*?\b(kiln_\w+)\s*\(", f.read())
    if not names:
        raise BuildError("found no KILN_API declarations in include/kiln/kiln.h")
    return sorted(set(names))


def installed_version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError as error:
        raise BuildError(
            f"{dist} is not installed in {sys.prefix}: run this script with the environment the "
            "libraries were built against (make setup creates .venv)"
        ) from error


def requirements():
    """kiln-runtime's requirements, exactly: ExecuTorch and the CUDA libraries pinned to what the
    library was built against, PyTorch by name only."""
    return [
        f"executorch=={installed_version('executorch')}",
        "torch",
        f"nvidia-cuda-runtime=={installed_version('nvidia-cuda-runtime')}",
        f"nvidia-cublas=={installed_version('nvidia-cublas')}",
        f"nvidia-cudnn-cu13=={installed_version('nvidia-cudnn-cu13')}",
    ]


def record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def write_wheel(path, name, version, tag, files, requires, summary):
    """Writes a wheel at path: files is a list of (archive name, bytes); the dist-info files
    (METADATA, WHEEL, RECORD with sha256 hashes) are added. Returns the archive names."""
    dist = re.sub(r"[-_.]+", "_", name)
    dist_info = f"{dist}-{version}.dist-info"
    metadata = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        f"Summary: {summary}",
        "Requires-Python: >=3.10",
    ] + [f"Requires-Dist: {r}" for r in requires]
    wheel = ["Wheel-Version: 1.0", "Generator: kiln build_wheels", "Root-Is-Purelib: false", f"Tag: {tag}"]
    members = list(files) + [
        (f"{dist_info}/METADATA", ("\n".join(metadata) + "\n").encode()),
        (f"{dist_info}/WHEEL", ("\n".join(wheel) + "\n").encode()),
    ]
    record = "".join(f"{arcname},{record_hash(data)},{len(data)}\n" for arcname, data in members)
    record += f"{dist_info}/RECORD,,\n"
    members.append((f"{dist_info}/RECORD", record.encode()))
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for arcname, data in members:
            info = zipfile.ZipInfo(arcname, date_time=ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            mode = 0o755 if re.search(r"\.so(\.[0-9.]+)?$", arcname) else 0o644
            info.external_attr = (0o100000 | mode) << 16
            archive.writestr(info, data)
    return [arcname for arcname, _ in members]


def run_audit(kiln, path, *args):
    """Runs `kiln audit`; returns its stdout, or raises with its refusals."""
    result = subprocess.run([kiln, "audit", path, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"kiln audit refused {os.path.basename(path)}:\n{result.stderr.rstrip()}")
    return result.stdout


def stripped_copy(library, staging):
    """The copy that ships: debug information stripped, symbols and dynamic section kept."""
    if not os.path.isfile(library):
        raise BuildError(f"{library} is missing: build it first (make build)")
    strip = shutil.which("strip")
    if strip is None:
        raise BuildError("strip (binutils) is missing: install binutils")
    target = os.path.join(staging, os.path.basename(library))
    subprocess.run([strip, "--strip-debug", "-o", target, library], check=True)
    return target


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def python_files(package_dir, package):
    """(archive name, bytes) of every .py file of a package directory, sorted."""
    if not os.path.isdir(package_dir):
        raise BuildError(f"{package_dir} is missing: the {package} package is part of the wheel")
    out = []
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for filename in sorted(filenames):
            if filename.endswith(".py"):
                full = os.path.join(dirpath, filename)
                rel = os.path.relpath(full, os.path.dirname(package_dir)).replace(os.sep, "/")
                out.append((rel, read_bytes(full)))
    return out


def build_wheel(kiln, out_dir, name, library, library_member, files, summary, exports=(),
                budget=None):
    """Audits the library, writes the wheel (files plus the library's shipped copy as
    library_member) into a staging directory inside out_dir, audits the wheel, checks it is at
    most budget bytes, then moves it into place. Returns (wheel path, wheel bytes, unpacked
    bytes)."""
    os.makedirs(out_dir, exist_ok=True)
    export_args = [arg for symbol in exports for arg in ("--export", symbol)]
    staging = tempfile.mkdtemp(prefix=".staging-", dir=out_dir)
    try:
        shipped = stripped_copy(library, staging)
        tag = "py3-none-" + run_audit(kiln, shipped, "--min-platform", *export_args).strip()
        run_audit(kiln, shipped, "--platform", tag.split("-", 2)[2], *export_args)
        files = files + [(library_member, read_bytes(shipped))]
        version = project_version()
        filename = f"{re.sub(r'[-_.]+', '_', name)}-{version}-{tag}.whl"
        staged = os.path.join(staging, filename)
        write_wheel(staged, name, version, tag, files, requirements(), summary)
        run_audit(kiln, staged, *export_args)
        with zipfile.ZipFile(staged) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
        size = os.path.getsize(staged)
        if budget is not None and size > budget:
            raise BuildError(f"the {name} wheel is {size:,} bytes, over its budget of {budget:,}: "
                             "find what grew (size -A on the shipped library) before shipping it")
        target = os.path.join(out_dir, filename)
        os.replace(staged, target)
        return target, os.path.getsize(target), unpacked
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def runtime_wheel(kiln, build_dir, out_dir):
    package_dir = os.path.join(build_dir, "kiln_runtime")
    files = python_files(os.path.join(ROOT, "python", "kiln_runtime"), "kiln_runtime")
    for cmake_file in CMAKE_PACKAGE_FILES:
        path = os.path.join(package_dir, "cmake", cmake_file)
        if not os.path.isfile(path):
            raise BuildError(f"{path} is missing: build the delegate library first (make build)")
        files.append((f"kiln_runtime/cmake/{cmake_file}", read_bytes(path)))
    return build_wheel(
        kiln, out_dir, "kiln-runtime", os.path.join(package_dir, DELEGATE_LIBRARY),
        f"kiln_runtime/{DELEGATE_LIBRARY}", files,
        "Kiln's ExecuTorch delegate library, its registration package and its CMake package",
        budget=RUNTIME_WHEEL_BUDGET,
    )


def exporter_wheel(kiln, build_dir, out_dir):
    files = python_files(os.path.join(ROOT, "python", "kiln"), "kiln")
    return build_wheel(
        kiln, out_dir, "kiln", os.path.join(build_dir, "libkiln.so"), "kiln/libkiln.so", files,
        "Kiln's ahead-of-time exporter: lowers PyTorch models to ExecuTorch programs that run on Kiln",
        exports=exported_api(),
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build"), help="the CMake build directory")
    parser.add_argument("--out", default=os.path.join(ROOT, "dist"), help="where the wheels go")
    parser.add_argument("--only", choices=("kiln-runtime", "kiln"), help="build one wheel")
    args = parser.parse_args(argv)
    kiln = os.path.join(args.build_dir, "kiln")
    try:
        if not os.path.isfile(kiln):
            raise BuildError(f"{kiln} is missing: build the kiln command line first (make build)")
        builders = {"kiln-runtime": runtime_wheel, "kiln": exporter_wheel}
        for name, builder in builders.items():
            if args.only in (None, name):
                path, size, unpacked = builder(kiln, args.build_dir, args.out)
                print(f"{path}: {size} bytes, {unpacked} bytes unpacked")
    except BuildError as error:
        print(f"build_wheels: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
