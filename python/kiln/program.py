"""Finding the Kiln blobs inside a lowered ExecuTorch program."""

import torch
from executorch.exir.lowered_backend_module import LoweredBackendModule

from .backend import KilnBackend


def _graph_module(program):
    if isinstance(program, torch.fx.GraphModule):
        return program
    if isinstance(program, torch.export.ExportedProgram):
        return program.graph_module
    if hasattr(program, "exported_program"):  # Edge or Executorch program manager
        return program.exported_program().graph_module
    raise TypeError(
        f"kiln: cannot find blobs in a {type(program).__name__}; pass an ExportedProgram, "
        "a GraphModule, or an Edge or Executorch program manager"
    )


def lowered_modules(program):
    """The Kiln LoweredBackendModules of program's graph (and nested graphs), in graph order."""
    found = []

    def visit(graph_module):
        for node in graph_module.graph.nodes:
            if node.op != "get_attr":
                continue
            attr = getattr(graph_module, node.target)
            if isinstance(attr, LoweredBackendModule) and attr.backend_id == KilnBackend.__name__:
                found.append(attr)
            elif isinstance(attr, torch.fx.GraphModule):
                visit(attr)

    visit(_graph_module(program))
    return found


def blobs(program):
    """The bytes of each Kiln blob in program, in graph order."""
    return [bytes(module.processed_bytes) for module in lowered_modules(program)]
