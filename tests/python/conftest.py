"""Shared setup of the Python tests: the in-tree packages come first on sys.path, and the
library the kiln package loads must have been built."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(ROOT, "python")
sys.path.insert(0, PYTHON_DIR)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

KILN_LIBRARY = os.environ.get("KILN_LIBRARY") or os.path.join(PYTHON_DIR, "kiln", "libkiln.so")


def pytest_sessionstart(session):
    if not os.path.isfile(KILN_LIBRARY):
        pytest.exit(
            f"{KILN_LIBRARY} is missing: build it with `make build` (CMake copies build/libkiln.so "
            "into python/kiln) or point KILN_LIBRARY at a built libkiln.so",
            returncode=1,
        )


@pytest.fixture(scope="session")
def real_zoo(tmp_path_factory):
    """zoo_models' architectures, each exported once on first use: real_zoo(name) -> ExportedRealModel."""
    import zoo_models

    directory = tmp_path_factory.mktemp("real_zoo")
    exported = {}

    def get(name):
        if name not in exported:
            exported[name] = zoo_models.ExportedRealModel(zoo_models.REAL_BY_NAME[name], directory)
        return exported[name]

    return get
