"""Kiln ahead of time: partition a PyTorch program for ExecuTorch and build Kiln blobs.

    import kiln
    kiln.export(model.eval(), (x,), "model.pte")

Importing kiln loads libkiln.so from this package (or from $KILN_LIBRARY).
"""

from ._lib import KilnError
from .backend import KilnBackend
from .export import export, lower, to_executorch
from .folding import fold_constants
from .partitioner import KilnPartitioner
from .program import blobs, lowered_modules
from .report import DelegationReport, NotWholeError, delegation_report
from .run import run_blob

__version__ = "0.1.0"

__all__ = [
    "DelegationReport",
    "KilnBackend",
    "KilnError",
    "KilnPartitioner",
    "NotWholeError",
    "blobs",
    "delegation_report",
    "export",
    "fold_constants",
    "lower",
    "lowered_modules",
    "run_blob",
    "to_executorch",
]
