"""KilnBackend: ExecuTorch's preprocess step, turning a delegated subgraph into a Kiln blob."""

from typing import List, final

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec

from . import lowering

_SPEC_KEYS = ("device_id", "allow_tf32", "fuse", "bounds")


def _parse_bounds(text):
    """{symbol name: (min, max)} from the partitioner's "name=min:max;..." spec."""
    bounds = {}
    for item in filter(None, text.split(";")):
        name, _, span = item.partition("=")
        low, _, high = span.partition(":")
        if not name or not low.isdigit() or not high.isdigit():
            raise ValueError(f"kiln: compile spec bounds entry {item!r} is not name=min:max")
        bounds[name] = (int(low), int(high))
    return bounds


def parse_compile_specs(compile_specs: List[CompileSpec]):
    """The build options the partitioner recorded: device_id, allow_tf32, fuse, bounds."""
    options = {"device_id": 0, "allow_tf32": False, "fuse": True}
    for spec in compile_specs:
        if spec.key not in _SPEC_KEYS:
            raise ValueError(f"kiln: unknown compile spec {spec.key!r}; known: {', '.join(_SPEC_KEYS)}")
        text = bytes(spec.value).decode("ascii", "replace")
        if spec.key == "bounds":
            options["bounds"] = _parse_bounds(text)
            continue
        if not text.isdigit():
            raise ValueError(f"kiln: compile spec {spec.key}={text!r} is not a non-negative integer")
        value = int(text)
        if spec.key == "device_id":
            options["device_id"] = value
        elif value in (0, 1):
            options[spec.key] = bool(value)
        else:
            raise ValueError(f"kiln: compile spec {spec.key}={value} must be 0 or 1")
    return options


# The class name is the backend id ExecuTorch records and the runtime looks up.
@final
class KilnBackend(BackendDetails):
    @staticmethod
    def preprocess(edge_program, compile_specs: List[CompileSpec]) -> PreprocessResult:
        options = parse_compile_specs(compile_specs)
        return PreprocessResult(processed_bytes=lowering.build_blob(edge_program, **options))
