"""Kiln's ExecuTorch export side: ``KilnPartitioner``, ``KilnBackend``, ``export``, ``save``
(and ``link_delegates``, which ``export`` runs: the tensors one Kiln delegate passes to another).

Importing this module defines the ``KilnBackend`` BackendDetails class, which ExecuTorch finds by
name when lowering. It does not register the runtime delegate (``kiln_executorch_runtime`` does;
``kiln.load`` imports it for you).
"""

from ._export import EXPORT_OPTIONS, KilnExportError, KilnStrictError, export, save
from ._links import link_delegates
from ._options import PRECISIONS
from ._report import ExportReport
from .backend import KilnBackend, KilnPreprocessError
from .partitioner import BACKEND_ID, KilnPartitioner

__all__ = [
    "BACKEND_ID",
    "EXPORT_OPTIONS",
    "ExportReport",
    "PRECISIONS",
    "KilnBackend",
    "KilnExportError",
    "KilnPartitioner",
    "KilnPreprocessError",
    "KilnStrictError",
    "export",
    "link_delegates",
    "save",
]
