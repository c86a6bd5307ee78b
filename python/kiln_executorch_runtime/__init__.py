"""Kiln's ExecuTorch runtime (the ``kiln-executorch-runtime`` distribution): registers the
``KilnBackend`` delegate into the ExecuTorch runtime of the installed ``executorch`` wheel.

Importing this package loads ``libkiln_executorch.so``, whose static initializer registers
``KilnBackend`` in ExecuTorch's backend registry (the one in the wheel's ``libexecutorch.so``, so
there is one runtime per process). Import order relative to ``executorch.runtime`` does not
matter. Set ``KILN_SKIP_DELEGATE_REGISTRATION`` to a true value (1, true, yes, on; any case) to
import without loading the library (for path queries and tooling); call :func:`register` later.
"""

from __future__ import annotations

import ctypes
import os
import threading
from importlib import metadata
from pathlib import Path

from ._pins import EXECUTORCH_VERSION, RUNTIME_VERSION

__version__ = RUNTIME_VERSION
__all__ = [
    "KilnRegistrationError",
    "KilnRuntimeError",
    "backend_info",
    "check_data_file",
    "check_program_file",
    "clear_error",
    "cmake_prefix_path",
    "get_option",
    "last_error",
    "last_status",
    "library_path",
    "link_stats",
    "register",
    "reset_link_stats",
    "set_option",
]

BACKEND_NAME = "KilnBackend"
_TRUE_VALUES = {"1", "true", "yes", "on"}
_lock = threading.Lock()
_delegate = None  # ctypes.CDLL of libkiln_executorch.so once registered
_kiln = None  # ctypes.CDLL of libkiln.so


class KilnRegistrationError(RuntimeError):
    """KilnBackend could not be registered with ExecuTorch (the message says what to do)."""


class KilnRuntimeError(RuntimeError):
    """A Kiln failure: ``status`` (the kiln_status value), ``status_name`` ("KILN_ERR_CORRUPT",
    ...) and the whole message, which names the field, the value and the remedy."""

    def __init__(self, message: str, status: int | None = None, status_name: str | None = None):
        super().__init__(message)
        self.status = status
        self.status_name = status_name


DISTRIBUTION = "kiln-executorch-runtime"
_lib_dir_cache: Path | None = None


def _lib_dir() -> Path:
    """The package's ``lib/`` folder (the native libraries and ``lib/cmake/Kiln``).

    Not ``Path(__file__).parent``: in an editable install (scikit-build-core's redirect mode) the
    Python files are the checkout's while the built files are installed in site-packages. The
    package's ``__path__`` (what ``importlib.resources`` reads) lists both folders; the
    distribution's file list (``importlib.metadata``) is the fallback.
    """
    global _lib_dir_cache
    if _lib_dir_cache is not None:
        return _lib_dir_cache
    marker = "libkiln_executorch.so"
    for d in __path__:
        if (Path(d) / "lib" / marker).is_file():
            _lib_dir_cache = Path(d).resolve() / "lib"
            return _lib_dir_cache
    try:
        files = metadata.files(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.parts == (__name__, "lib", marker):
            path = Path(f.locate())
            if path.is_file():
                _lib_dir_cache = path.resolve().parent
                return _lib_dir_cache
    # Not found: where it should be (the error messages name this path).
    return Path(list(__path__)[0]).resolve() / "lib"


def library_path() -> Path:
    """Path of the delegate library, ``libkiln_executorch.so``."""
    return _lib_dir() / "libkiln_executorch.so"


def cmake_prefix_path() -> str:
    """What to pass to CMake as CMAKE_PREFIX_PATH to find Kiln and ExecuTorch."""
    et = metadata.distribution("executorch").locate_file("executorch")
    return ";".join([str(_lib_dir() / "cmake"), str(Path(et) / "share" / "cmake")])


def _skip_requested() -> bool:
    return os.environ.get("KILN_SKIP_DELEGATE_REGISTRATION", "").strip().lower() in _TRUE_VALUES


def _check_executorch_version() -> None:
    try:
        installed = metadata.version("executorch")
    except metadata.PackageNotFoundError:
        raise KilnRegistrationError(
            "executorch is not installed; Kiln's runtime needs exactly executorch=="
            f"{EXECUTORCH_VERSION}: pip install executorch=={EXECUTORCH_VERSION}"
        ) from None
    public = installed.split("+", 1)[0]
    if public != EXECUTORCH_VERSION:
        raise KilnRegistrationError(
            f"executorch {installed} is installed, but kiln-executorch-runtime {RUNTIME_VERSION} "
            f"was built against executorch {EXECUTORCH_VERSION} (ExecuTorch has no ABI promise "
            f"across releases): pip install executorch=={EXECUTORCH_VERSION}"
        )


def _load_kiln() -> ctypes.CDLL:
    global _kiln
    if _kiln is None:
        path = _lib_dir() / "libkiln.so"
        if not path.exists():
            raise KilnRegistrationError(
                f"{path} is missing: the package is incomplete; reinstall it with "
                f"pip install --force-reinstall {DISTRIBUTION}=={RUNTIME_VERSION}"
            )
        lib = ctypes.CDLL(str(path))
        lib.kiln_set_option_bool.argtypes = [ctypes.c_char_p, ctypes.c_int]
        lib.kiln_set_option_int.argtypes = [ctypes.c_char_p, ctypes.c_int64]
        lib.kiln_set_option_string.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        lib.kiln_get_option.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.kiln_last_error.restype = ctypes.c_char_p
        lib.kiln_version_string.restype = ctypes.c_char_p
        lib.kiln_status_name.restype = ctypes.c_char_p
        lib.kiln_status_name.argtypes = [ctypes.c_int]
        lib.kiln_ptd_check_file.restype = ctypes.c_int
        lib.kiln_ptd_check_file.argtypes = [ctypes.c_char_p]
        lib.kiln_pte_check_file.restype = ctypes.c_int
        lib.kiln_pte_check_file.argtypes = [ctypes.c_char_p]
        _kiln = lib
    return _kiln


def register() -> None:
    """Registers KilnBackend with ExecuTorch (idempotent).

    Raises KilnRegistrationError if the library cannot load, if the installed executorch is not
    the one Kiln was built against, or if another library registered ``KilnBackend`` first.
    """
    global _delegate
    with _lock:
        if _delegate is not None:
            return
        _check_executorch_version()
        path = library_path()
        if not path.exists():
            raise KilnRegistrationError(
                f"{path} is missing: the package is incomplete; reinstall it with "
                f"pip install --force-reinstall {DISTRIBUTION}=={RUNTIME_VERSION}"
            )
        _load_kiln()
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise KilnRegistrationError(
                f"cannot load {path}: {e}. Is executorch=={EXECUTORCH_VERSION} installed in this "
                "environment?"
            ) from e
        lib.kiln_executorch_registration_error.restype = ctypes.c_uint32
        lib.kiln_executorch_owns_registration.restype = ctypes.c_int
        lib.kiln_executorch_built_against.restype = ctypes.c_char_p
        lib.kiln_executorch_last_status.restype = ctypes.c_int
        lib.kiln_executorch_last_error.restype = ctypes.c_char_p
        lib.kiln_executorch_clear_error.restype = None
        lib.kiln_executorch_link_stats_get.restype = None
        lib.kiln_executorch_link_stats_get.argtypes = [ctypes.POINTER(_LinkStats)]
        lib.kiln_executorch_link_stats_reset.restype = None
        err = lib.kiln_executorch_registration_error()
        if err != 0 or lib.kiln_executorch_owns_registration() != 1:
            raise KilnRegistrationError(
                f"ExecuTorch's '{BACKEND_NAME}' is not this library's (registration error "
                f"0x{err:x}): another library registered a backend named '{BACKEND_NAME}' first. "
                "Load only one Kiln runtime per process (check for a second copy of "
                "libkiln_executorch.so, e.g. from another virtual environment)."
            )
        _delegate = lib


def set_option(name: str, value) -> None:
    """Sets a process-wide Kiln runtime option (see docs/options.md): bool, int or str values.

    Unknown names and wrongly typed values raise ValueError/TypeError naming the valid options.
    """
    lib = _load_kiln()
    if not isinstance(name, str):
        raise TypeError(f"option name must be a str, got {type(name).__name__}")
    if isinstance(value, bool):
        st = lib.kiln_set_option_bool(name.encode(), int(value))
    elif isinstance(value, int):
        st = lib.kiln_set_option_int(name.encode(), value)
    elif isinstance(value, str):
        st = lib.kiln_set_option_string(name.encode(), value.encode())
    else:
        raise TypeError(
            f"option {name!r}: value must be a bool, int or str, got {type(value).__name__}"
        )
    if st != 0:
        raise ValueError(lib.kiln_last_error().decode(errors="replace"))


def get_option(name: str) -> str:
    """The current process-wide value of an option, as text."""
    lib = _load_kiln()
    buf = ctypes.create_string_buffer(256)
    if lib.kiln_get_option(name.encode(), buf, len(buf)) != 0:
        raise ValueError(lib.kiln_last_error().decode(errors="replace"))
    return buf.value.decode()


def _text(b: bytes | None) -> str:
    return b.decode("utf-8", errors="backslashreplace") if b else ""


def check_data_file(path) -> None:
    """Checks an ExecuTorch .ptd data file completely (header, flatbuffer, every segment and key)
    with Kiln's validator, without reading its tensor data.

    ExecuTorch's own .ptd reader trusts the offsets in the file and can crash the process on a
    damaged one; ``kiln.load`` runs this check before handing the file to ExecuTorch. Call it
    yourself before ``executorch.runtime.Runtime.load_program(..., data_path=path)`` when the
    file may be damaged. Raises KilnRuntimeError (status KILN_ERR_CORRUPT or KILN_ERR_IO) with
    the field, the offset and the remedy.
    """
    lib = _load_kiln()
    st = lib.kiln_ptd_check_file(os.fsencode(path))
    if st != 0:
        raise KilnRuntimeError(_text(lib.kiln_last_error()), st, _text(lib.kiln_status_name(st)))


def check_program_file(path) -> None:
    """Checks an ExecuTorch program (.pte) before ExecuTorch loads it: its header and its whole
    flatbuffer, with every field ExecuTorch's writer always writes present (ExecuTorch's method
    loader dereferences those without checking, and crashes on a damaged one). The segments (Kiln
    engines, weights) are not read: they are checked when a method loads. ``kiln.load`` runs
    this check; call it before ``executorch.runtime.Runtime.load_program`` for files that may be
    damaged. Raises KilnRuntimeError (KILN_ERR_CORRUPT, KILN_ERR_IO) naming the field.
    """
    lib = _load_kiln()
    st = lib.kiln_pte_check_file(os.fsencode(path))
    if st != 0:
        raise KilnRuntimeError(_text(lib.kiln_last_error()), st, _text(lib.kiln_status_name(st)))


def last_error() -> tuple[str, str] | None:
    """The last failure of KilnBackend on this thread as (status name, whole message), or None.

    ExecuTorch reports a delegate failure only as an error code ("error 0x23" through
    ``executorch.runtime``); this is its cause, as KilnBackend recorded it (it also goes to
    ExecuTorch's log). Cleared by :func:`clear_error`. None too while KilnBackend is not
    registered (nothing can have failed in it).
    """
    if _delegate is None:
        return None
    st = _delegate.kiln_executorch_last_status()
    if st == 0:
        return None
    return _text(_load_kiln().kiln_status_name(st)), _text(_delegate.kiln_executorch_last_error())


def last_status() -> int:
    """The kiln_status of :func:`last_error` (0 when there is none)."""
    return 0 if _delegate is None else int(_delegate.kiln_executorch_last_status())


def clear_error() -> None:
    """Forgets this thread's last KilnBackend failure (see :func:`last_error`)."""
    if _delegate is not None:
        _delegate.kiln_executorch_clear_error()


class _LinkStats(ctypes.Structure):  # kiln_executorch_link_stats (kiln/kiln_program.h)
    _fields_ = [
        ("inputs_linked", ctypes.c_uint64),
        ("inputs_host", ctypes.c_uint64),
        ("outputs_kept", ctypes.c_uint64),
        ("outputs_copied", ctypes.c_uint64),
        ("outputs_materialized", ctypes.c_uint64),
    ]


def link_stats() -> dict:
    """What the links between Kiln delegates did in this process since the last
    :func:`reset_link_stats` (docs/runtime.md, "Between delegates"; option ``link_delegates``):
    ``inputs_linked`` (delegate inputs bound to the producing engine's memory, no copy),
    ``inputs_host`` (linked inputs that read the host buffer instead; the reason is logged at
    DEBUG), ``outputs_kept`` (linked outputs left in the engine's memory only),
    ``outputs_copied`` (linked outputs also copied to their host buffer), and
    ``outputs_materialized`` (host copies made later for a reader that could not take the
    link). Registers Kiln if needed."""
    register()
    s = _LinkStats()
    _delegate.kiln_executorch_link_stats_get(ctypes.byref(s))
    return {name: int(getattr(s, name)) for name, _ in _LinkStats._fields_}


def reset_link_stats() -> None:
    """Sets the counts of :func:`link_stats` back to zero."""
    register()
    _delegate.kiln_executorch_link_stats_reset()


def backend_info() -> dict:
    """Versions and the device in use (registers Kiln if needed)."""
    register()
    lib = _load_kiln()
    return {
        "kiln": lib.kiln_version_string().decode(),
        "kiln_executorch_runtime": RUNTIME_VERSION,
        "executorch_built_against": _delegate.kiln_executorch_built_against().decode(),
        "executorch_installed": metadata.version("executorch"),
        "device_option": get_option("device"),
        "library": str(library_path()),
    }


if not _skip_requested():
    register()
