"""ctypes bindings for libkiln's C API (include/kiln/*.h): graph and builder, op table, engine
runtime (for tests and tools), errors, versions.

Which libkiln is loaded (once per process; :func:`library_path` says which, docs/packaging.md
explains why):

1. ``$KILN_LIBRARY``, a path to a libkiln build (development; its SONAME decides what a delegate
   loaded later in the same process binds to, so prefer ``libkiln_export.so``, the CMake target
   ``kiln_export``, when the process also registers the delegate).
2. The installed ``kiln-executorch-runtime``'s ``lib/libkiln.so`` when that distribution is
   exactly :data:`RUNTIME_VERSION` (the release this kiln's ``executorch`` extra pins). The
   delegate NEEDs that very file, so a process that exports and then runs holds one libkiln.
   The package is located without importing it: importing it registers the delegate, which the
   export side does not need.
3. Otherwise kiln's own copy, ``kiln/lib/libkiln_export.so`` (a distinct file name and SONAME,
   so the delegate's ``NEEDED libkiln.so`` can never bind to it). A runtime of another version
   is reported with a :class:`RuntimeWarning`.

Every non-OK status raises a :class:`KilnError` subclass whose message is ``kiln_last_error()``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import threading
import warnings
from importlib import metadata
from pathlib import Path

__all__ = [
    "KILN_MAX_RANK",
    "KilnBusyError",
    "KilnCorruptError",
    "KilnDeviceError",
    "KilnError",
    "KilnInternalError",
    "KilnInvalidArgError",
    "KilnInvalidStateError",
    "KilnIOError",
    "KilnMissingDataError",
    "KilnNoMemoryError",
    "KilnNotEngineError",
    "KilnShapeError",
    "KilnUnsupportedError",
    "KilnVersionError",
    "RUNTIME_VERSION",
    "library",
    "library_path",
]

KILN_MAX_RANK = 8

# The kiln-executorch-runtime release this kiln pins (pyproject.toml's `executorch` extra; a test
# checks the two agree). Only that release's libkiln.so is used for exporting (see above).
RUNTIME_DISTRIBUTION = "kiln-executorch-runtime"
RUNTIME_VERSION = "0.1.0"
# kiln's own copy, in the kiln package's lib/ folder.
OWN_LIBRARY = "libkiln_export.so"

# --- errors (one class per kiln_status; values are ABI)


# kiln_status identifiers (kiln_status_name), by value.
STATUS_NAMES = (
    "KILN_OK",
    "KILN_ERR_INVALID_ARG",
    "KILN_ERR_NO_MEMORY",
    "KILN_ERR_NOT_ENGINE",
    "KILN_ERR_CORRUPT",
    "KILN_ERR_VERSION",
    "KILN_ERR_UNSUPPORTED",
    "KILN_ERR_SHAPE",
    "KILN_ERR_MISSING_DATA",
    "KILN_ERR_DEVICE",
    "KILN_ERR_IO",
    "KILN_ERR_BUSY",
    "KILN_ERR_INVALID_STATE",
    "KILN_ERR_INTERNAL",
)


class KilnError(RuntimeError):
    """A libkiln call failed. ``status`` is the kiln_status value, ``status_name`` its identifier
    ("KILN_ERR_CORRUPT"), the message kiln_last_error()."""

    status = -1

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status

    @property
    def status_name(self) -> str:
        if 0 <= self.status < len(STATUS_NAMES):
            return STATUS_NAMES[self.status]
        return "KILN_ERR_UNKNOWN"


class KilnInvalidArgError(KilnError, ValueError):
    status = 1


class KilnNoMemoryError(KilnError, MemoryError):
    status = 2


class KilnNotEngineError(KilnError):
    status = 3


class KilnCorruptError(KilnError):
    status = 4


class KilnVersionError(KilnError):
    status = 5


class KilnUnsupportedError(KilnError):
    status = 6


class KilnShapeError(KilnError, ValueError):
    status = 7


class KilnMissingDataError(KilnError):
    status = 8


class KilnDeviceError(KilnError):
    status = 9


class KilnIOError(KilnError, OSError):
    status = 10


class KilnBusyError(KilnError):
    status = 11


class KilnInvalidStateError(KilnError):
    status = 12


class KilnInternalError(KilnError):
    status = 13


_ERRORS = {
    c.status: c
    for c in (
        KilnInvalidArgError,
        KilnNoMemoryError,
        KilnNotEngineError,
        KilnCorruptError,
        KilnVersionError,
        KilnUnsupportedError,
        KilnShapeError,
        KilnMissingDataError,
        KilnDeviceError,
        KilnIOError,
        KilnBusyError,
        KilnInvalidStateError,
        KilnInternalError,
    )
}

# --- C structs (include/kiln/kiln_graph.h, kiln_ops.h, kiln_engine.h)


class Attr(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("ints", ctypes.POINTER(ctypes.c_int64)),
        ("floats", ctypes.POINTER(ctypes.c_double)),
        ("n", ctypes.c_uint32),
    ]


class BuildProgress(ctypes.Structure):
    _fields_ = [
        ("struct_nbytes", ctypes.c_uint32),
        ("phase", ctypes.c_int),
        ("name", ctypes.c_char_p),
        ("step", ctypes.c_uint32),
        ("n_steps", ctypes.c_uint32),
    ]


# kiln_build_phase values (include/kiln/kiln_graph.h).
BUILD_PHASES = {1: "pass", 2: "layer", 3: "tune", 4: "output"}

BuildProgressFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(BuildProgress))


class BuildOptions(ctypes.Structure):
    _fields_ = [
        ("struct_nbytes", ctypes.c_uint32),
        ("precision", ctypes.c_int),
        ("external_weights", ctypes.c_int32),
        ("optimize", ctypes.c_int32),
        ("min_external_nbytes", ctypes.c_uint64),
        ("progress", BuildProgressFn),
        ("progress_user_data", ctypes.c_void_p),
    ]


class OpInfo(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
        ("min_inputs", ctypes.c_uint32),
        ("max_inputs", ctypes.c_uint32),
        ("optional_mask", ctypes.c_uint32),
        ("n_outputs", ctypes.c_uint32),
        ("n_attrs", ctypes.c_uint32),
        ("dtype_mask", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
    ]


class AttrInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("kind", ctypes.c_int),
        ("count", ctypes.c_int32),
        ("n_default", ctypes.c_uint32),
        ("default_ints", ctypes.c_int64 * KILN_MAX_RANK),
        ("default_floats", ctypes.c_double * KILN_MAX_RANK),
    ]


WeightResolver = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_char_p,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_size_t),
)


class OptionSetting(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("type", ctypes.c_int),
        ("int_value", ctypes.c_int64),
        ("string_value", ctypes.c_char_p),
    ]


class LoadOptions(ctypes.Structure):
    _fields_ = [
        ("struct_nbytes", ctypes.c_uint32),
        ("resolve", WeightResolver),
        ("resolve_user_data", ctypes.c_void_p),
        ("settings", ctypes.POINTER(OptionSetting)),
        ("n_settings", ctypes.c_uint32),
    ]


class BindingInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_uint32),
        ("dim_min", ctypes.c_int64 * KILN_MAX_RANK),
        ("dim_max", ctypes.c_int64 * KILN_MAX_RANK),
        ("is_input", ctypes.c_int32),
        ("max_nbytes", ctypes.c_uint64),
    ]


class LayerInfo(ctypes.Structure):
    _fields_ = [
        ("op", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("head", ctypes.c_uint32),
        ("n_fused", ctypes.c_uint32),
        ("kernel", ctypes.c_char * 32),
        ("detail", ctypes.c_char * 224),
        ("workspace_nbytes", ctypes.c_uint64),
        ("l2_keep_nbytes", ctypes.c_int64),
        ("n_profiled", ctypes.c_uint64),
        ("device_us", ctypes.c_double),
        ("host_us", ctypes.c_double),
    ]


LogFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)

_P = ctypes.c_void_p
_I32P = ctypes.POINTER(ctypes.c_int32)
_I64P = ctypes.POINTER(ctypes.c_int64)
_U32 = ctypes.c_uint32
_SIG = {
    # name: (restype, argtypes); restype int = kiln_status
    "kiln_version": (_U32, []),
    "kiln_version_string": (ctypes.c_char_p, []),
    "kiln_status_str": (ctypes.c_char_p, [ctypes.c_int]),
    "kiln_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "kiln_ptd_check": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]),
    "kiln_pte_check": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]),
    "kiln_last_error": (ctypes.c_char_p, []),
    "kiln_clear_error": (None, []),
    "kiln_dtype_size": (ctypes.c_size_t, [ctypes.c_int]),
    "kiln_dtype_name": (ctypes.c_char_p, [ctypes.c_int]),
    # op table
    "kiln_op_count": (_U32, []),
    "kiln_op_id_at": (_U32, [_U32]),
    "kiln_op_get_info": (ctypes.c_int, [_U32, ctypes.POINTER(OpInfo)]),
    "kiln_op_get_attr_info": (ctypes.c_int, [_U32, _U32, ctypes.POINTER(AttrInfo)]),
    "kiln_op_lookup": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(_U32)]),
    "kiln_op_name": (ctypes.c_char_p, [_U32]),
    # graph and builder
    "kiln_graph_new": (ctypes.c_int, [ctypes.POINTER(_P)]),
    "kiln_graph_free": (None, [_P]),
    "kiln_graph_add_input": (
        ctypes.c_int,
        [_P, ctypes.c_char_p, ctypes.c_int, _U32, _I64P, _I64P, _I32P],
    ),
    "kiln_graph_add_constant": (
        ctypes.c_int,
        [_P, ctypes.c_char_p, ctypes.c_int, _U32, _I64P, _P, ctypes.c_size_t, _I32P],
    ),
    "kiln_graph_add_state": (
        ctypes.c_int,
        [_P, ctypes.c_char_p, ctypes.c_int, _U32, _I64P, _P, ctypes.c_size_t, _I32P],
    ),
    "kiln_graph_update_state": (ctypes.c_int, [_P, ctypes.c_int32, ctypes.c_int32]),
    "kiln_graph_add_node": (
        ctypes.c_int,
        [_P, _U32, _I32P, _U32, ctypes.POINTER(Attr), _U32, _I32P, _U32],
    ),
    "kiln_graph_mark_output": (ctypes.c_int, [_P, ctypes.c_int32, ctypes.c_char_p]),
    "kiln_graph_value_info": (
        ctypes.c_int,
        [_P, ctypes.c_int32, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(_U32), _I64P, _I64P],
    ),
    "kiln_build_options_init": (None, [ctypes.POINTER(BuildOptions)]),
    "kiln_build": (ctypes.c_int, [_P, ctypes.POINTER(BuildOptions), ctypes.POINTER(_P)]),
    "kiln_built_free": (None, [_P]),
    "kiln_built_engine": (
        ctypes.c_int,
        [_P, ctypes.POINTER(_P), ctypes.POINTER(ctypes.c_size_t)],
    ),
    "kiln_built_n_weights": (_U32, [_P]),
    "kiln_built_weight": (
        ctypes.c_int,
        [
            _P,
            _U32,
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.POINTER(_P),
            ctypes.POINTER(ctypes.c_size_t),
        ],
    ),
    # engine runtime
    "kiln_load_options_init": (None, [ctypes.POINTER(LoadOptions)]),
    "kiln_engine_load": (
        ctypes.c_int,
        [_P, ctypes.c_size_t, ctypes.POINTER(LoadOptions), ctypes.POINTER(_P)],
    ),
    "kiln_engine_free": (None, [_P]),
    "kiln_engine_n_inputs": (_U32, [_P]),
    "kiln_engine_n_outputs": (_U32, [_P]),
    "kiln_engine_binding": (ctypes.c_int, [_P, ctypes.c_int32, _U32, ctypes.POINTER(BindingInfo)]),
    "kiln_engine_device": (ctypes.c_char_p, [_P]),
    "kiln_engine_arena_nbytes": (ctypes.c_uint64, [_P]),
    "kiln_engine_weight_nbytes": (ctypes.c_uint64, [_P]),
    "kiln_context_new": (ctypes.c_int, [_P, ctypes.POINTER(_P)]),
    "kiln_context_free": (None, [_P]),
    "kiln_engine_n_states": (_U32, [_P]),
    "kiln_context_reset_states": (ctypes.c_int, [_P]),
    "kiln_context_set_input": (ctypes.c_int, [_P, _U32, _U32, _I64P, _P]),
    "kiln_context_set_output": (ctypes.c_int, [_P, _U32, _P, ctypes.c_size_t]),
    "kiln_context_infer_shapes": (ctypes.c_int, [_P]),
    "kiln_context_execute": (ctypes.c_int, [_P]),
    "kiln_context_output_shape": (ctypes.c_int, [_P, _U32, ctypes.POINTER(_U32), _I64P]),
    "kiln_context_set_stream": (ctypes.c_int, [_P, _P]),
    "kiln_engine_n_layers": (_U32, [_P]),
    "kiln_context_layer_info": (ctypes.c_int, [_P, _U32, ctypes.POINTER(LayerInfo)]),
    "kiln_engine_describe": (
        ctypes.c_int,
        [_P, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    ),
    # process-wide options and the log hook
    "kiln_set_option_bool": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int]),
    "kiln_set_option_int": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int64]),
    "kiln_set_option_string": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p]),
    "kiln_get_option": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
    "kiln_log_set": (None, [LogFn, _P, ctypes.c_int]),
    "kiln_log_get_level": (ctypes.c_int, []),
}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_path: Path | None = None
_missing: set[str] = set()


def _package_file(package: str, search: list[str], distribution: str, *rel: str) -> Path | None:
    """``<package>/<rel...>`` of an installed package, or None.

    Looked for along the package's search locations first (``__path__``, which is what
    ``importlib.resources`` reads: in an editable install it lists the checkout's folder AND the
    site-packages folder holding the built files, so ``Path(__file__).parent`` is not enough),
    then in the distribution's file list (``importlib.metadata``).
    """
    for d in search:
        p = Path(d).joinpath(*rel)
        if p.is_file():
            return p.resolve()
    try:
        files = metadata.files(distribution) or []
    except metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.parts == (package, *rel):
            p = Path(f.locate())
            if p.is_file():
                return p.resolve()
    return None


def _runtime_library() -> tuple[Path | None, str]:
    """The installed runtime's lib/libkiln.so if it is RUNTIME_VERSION, else (None, why not)."""
    try:
        spec = importlib.util.find_spec("kiln_executorch_runtime")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None, ""
    try:
        installed = metadata.version(RUNTIME_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None, ""  # a source folder on sys.path, not an installed distribution
    if installed != RUNTIME_VERSION:
        return None, (
            f"{RUNTIME_DISTRIBUTION} {installed} is installed, but this kiln pins "
            f"{RUNTIME_VERSION}: exporting with kiln's own libkiln ({OWN_LIBRARY}); programs may "
            f'not load in that runtime. pip install "kiln[executorch]" installs the matching pair'
        )
    path = _package_file(
        "kiln_executorch_runtime",
        list(spec.submodule_search_locations),
        RUNTIME_DISTRIBUTION,
        "lib",
        "libkiln.so",
    )
    if path is None:
        return None, (
            f"{RUNTIME_DISTRIBUTION} {installed} is installed without lib/libkiln.so (an "
            f"incomplete installation): exporting with kiln's own libkiln ({OWN_LIBRARY}); "
            f"reinstall it with pip install --force-reinstall {RUNTIME_DISTRIBUTION}=={installed}"
        )
    return path, ""


def _own_library() -> Path | None:
    """kiln's own copy, lib/libkiln_export.so in the kiln package."""
    pkg = sys.modules[__package__]
    return _package_file(__package__, list(pkg.__path__), "kiln", "lib", OWN_LIBRARY)


def _resolve() -> tuple[Path, str]:
    """(the library to load, a warning to give when loading it, or "")."""
    env = os.environ.get("KILN_LIBRARY", "").strip()
    if env:
        p = Path(env).expanduser()
        if not p.is_file():
            raise FileNotFoundError(
                f"KILN_LIBRARY={env!r} does not name a file: point it at a built libkiln "
                "(cmake --build <dir> --target kiln_export) or unset it to use the installed "
                "package"
            )
        return p, ""
    path, why = _runtime_library()
    if path is not None:
        return path, ""
    own = _own_library()
    if own is None:
        raise ImportError(
            f"libkiln not found: {OWN_LIBRARY} is missing from the kiln package (an incomplete "
            "installation) and no matching kiln-executorch-runtime is installed. Reinstall "
            'Kiln (pip install --force-reinstall "kiln[executorch]", or `make install` in a '
            "Kiln checkout) or set KILN_LIBRARY=/path/to/libkiln_export.so"
        )
    return own, why


def library_path() -> Path:
    """The libkiln this process uses for exporting (the rules are in this module's docstring)."""
    if _lib_path is not None:
        return _lib_path
    return _resolve()[0]


def library() -> ctypes.CDLL:
    """The loaded libkiln (loaded once per process, with every signature declared)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        path, why = _resolve()
        if why:
            warnings.warn(why, RuntimeWarning, stacklevel=2)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise ImportError(f"cannot load {path}: {e}") from e
        missing = []
        for name, (restype, argtypes) in _SIG.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                missing.append(name)
                continue
            fn.restype = restype
            fn.argtypes = argtypes
        _missing.update(missing)
        _lib, _lib_path = lib, path
        return lib


def require(*names: str) -> ctypes.CDLL:
    """The library, checked to export every function in ``names``."""
    lib = library()
    missing = [n for n in names if n in _missing]
    if missing:
        raise ImportError(
            f"{_lib_path} does not export {', '.join(missing)}: it is an older or incomplete "
            "libkiln; rebuild it or reinstall Kiln"
        )
    return lib


def last_error() -> str:
    msg = library().kiln_last_error()
    return msg.decode("utf-8", errors="replace") if msg else ""


def status_str(status: int) -> str:
    return library().kiln_status_str(status).decode("utf-8", errors="replace")


def check(status: int, what: str = "") -> None:
    """Raises the KilnError subclass for a non-OK status, with kiln_last_error() as message."""
    if status == 0:
        return
    msg = last_error() or status_str(status)
    if what:
        msg = f"{what}: {msg}"
    raise _ERRORS.get(status, KilnError)(msg, status)


def version() -> str:
    """libkiln's version string ("0.1.0")."""
    return library().kiln_version_string().decode()
