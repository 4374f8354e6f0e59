"""Kiln's delegate for the ExecuTorch runtime: importing this package registers KilnBackend.

    import kiln_runtime  # noqa: F401
    from executorch.runtime import Runtime

    method = Runtime.get().load_program("model.pte").load_method("forward")
    outputs = method.execute(inputs)

Nothing else is called. Without a CUDA GPU, set KILN_DEVICE=cpu to run the CPU reference engine.
"""

import ctypes
import os
import re

LIBRARY_NAME = "libexecutorch_backend_kiln.so"
BACKEND_ID = "KilnBackend"

# What to install when the loader cannot find a library the delegate needs: the versions
# kiln-runtime requires, pinned exactly (a test holds them equal to the wheel's requirements).
_REMEDIES = (
    ("libexecutorch.so", "executorch==1.5.1"),
    ("libcudart", "nvidia-cuda-runtime==13.0.96"),
    ("libcublas", "nvidia-cublas==13.1.1.3"),
    ("libcudnn", "nvidia-cudnn-cu13==9.24.0.43"),
)


def _missing_library_message(error):
    text = str(error)
    missing = re.search(r"([\w.+-]+\.so[\w.]*): cannot open shared object file", text)
    if missing is None:
        return f"{LIBRARY_NAME} failed to load ({text}): reinstall kiln-runtime"
    name = missing.group(1)
    for prefix, remedy in _REMEDIES:
        if name.startswith(prefix):
            return f"{LIBRARY_NAME} needs {name}, which the loader did not find: pip install {remedy}"
    return f"{LIBRARY_NAME} needs {name}, which the loader did not find: install the package that provides it"


def _load():
    # ExecuTorch's runtime first: the delegate registers into the libexecutorch.so already loaded.
    try:
        from executorch.extension.pybindings import portable_lib
    except ImportError as error:
        raise ImportError(
            f"kiln_runtime needs ExecuTorch's Python runtime, which failed to import ({error}): "
            "pip install executorch==1.5.1"
        ) from error
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)
    if not os.path.isfile(path):
        raise ImportError(f"{LIBRARY_NAME} is missing from {os.path.dirname(path)}: reinstall kiln-runtime")
    try:
        library = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        raise ImportError(_missing_library_message(error)) from error
    if BACKEND_ID not in portable_lib._get_registered_backend_names():
        raise ImportError(
            f"{LIBRARY_NAME} loaded but {BACKEND_ID} is not in ExecuTorch's registry: the library was "
            "built against another ExecuTorch; install the executorch version kiln-runtime requires"
        )
    return library


_library = _load()
