"""Kiln: a GPU inference engine and ExecuTorch delegate.

- ``kiln.executorch``: export (``KilnPartitioner``, ``KilnBackend``, ``export``, ``save``).
- ``kiln.load(path, data_path=None)``: run a program through ExecuTorch with Kiln registered.
- ``kiln.KilnError`` and its subclasses: failures reported by libkiln.

``import kiln`` is light: torch and executorch are imported by the submodules that need them.
"""

from __future__ import annotations

from ._lib import (
    KilnBusyError,
    KilnCorruptError,
    KilnDeviceError,
    KilnError,
    KilnInternalError,
    KilnInvalidArgError,
    KilnInvalidStateError,
    KilnIOError,
    KilnMissingDataError,
    KilnNoMemoryError,
    KilnNotEngineError,
    KilnShapeError,
    KilnUnsupportedError,
    KilnVersionError,
)
from ._load import KilnLoadError, Program, load

__version__ = "0.1.0"

__all__ = [
    "KilnBusyError",
    "KilnCorruptError",
    "KilnDeviceError",
    "KilnError",
    "KilnIOError",
    "KilnInternalError",
    "KilnInvalidArgError",
    "KilnInvalidStateError",
    "KilnLoadError",
    "KilnMissingDataError",
    "KilnNoMemoryError",
    "KilnNotEngineError",
    "KilnShapeError",
    "KilnUnsupportedError",
    "KilnVersionError",
    "Program",
    "library_version",
    "load",
]


def library_version() -> str:
    """The version of the libkiln in use."""
    from ._lib import version

    return version()
