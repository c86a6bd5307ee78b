"""Minimal ctypes bindings of libkiln's public C API (include/kiln/*.h) for the benchmark.

The benchmark does not import the ``kiln`` Python package on the H200 (it needs executorch
there for nothing, and its internals move); it uses only the stable C API:

- the graph/builder API (kiln_graph.h), to rebuild an engine from a recorded graph
  (bench/kiln_record.py) with weights regenerated on the device;
- the engine API (kiln_engine.h), to run an engine on device pointers owned by PyTorch, on
  PyTorch's stream, in the same process as the PyTorch anchors.

The library is ``$KILN_LIBRARY`` or the path given to :func:`load`.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Mapping

KILN_MAX_RANK = 8
KILN_OPTION_BOOL = 1
KILN_OPTION_STRING = 3
KILN_ERR_MISSING_DATA = 8


class KilnCallError(RuntimeError):
    pass


class _Attr(ctypes.Structure):  # kiln_attr
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("ints", ctypes.POINTER(ctypes.c_int64)),
        ("floats", ctypes.POINTER(ctypes.c_double)),
        ("n", ctypes.c_uint32),
    ]


class _BuildOptions(ctypes.Structure):  # kiln_build_options
    _fields_ = [
        ("struct_nbytes", ctypes.c_uint32),
        ("precision", ctypes.c_int),
        ("external_weights", ctypes.c_int32),
        ("optimize", ctypes.c_int32),
        ("min_external_nbytes", ctypes.c_uint64),
        # kiln_build_options_init writes the whole struct: without these two fields it would
        # write 16 bytes past this one
        ("progress", ctypes.c_void_p),
        ("progress_user_data", ctypes.c_void_p),
    ]


_Resolver = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_char_p,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_size_t),
)


class _OptionSetting(ctypes.Structure):  # kiln_option_setting
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("type", ctypes.c_int),
        ("int_value", ctypes.c_int64),
        ("string_value", ctypes.c_char_p),
    ]


class _LayerInfo(ctypes.Structure):  # kiln_layer_info
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


class _LoadOptions(ctypes.Structure):  # kiln_load_options
    _fields_ = [
        ("struct_nbytes", ctypes.c_uint32),
        ("resolve", _Resolver),
        ("resolve_user_data", ctypes.c_void_p),
        ("settings", ctypes.POINTER(_OptionSetting)),
        ("n_settings", ctypes.c_uint32),
    ]


_lib = None


def load(path: str | None = None):
    """Loads libkiln (once). ``path`` or ``$KILN_LIBRARY``."""
    global _lib
    if _lib is not None:
        return _lib
    path = path or os.environ.get("KILN_LIBRARY")
    if not path:
        raise KilnCallError("set KILN_LIBRARY to the libkiln.so to use (bench/kiln_capi.py)")
    lib = ctypes.CDLL(path)
    st = ctypes.c_int
    p = ctypes.c_void_p
    sig = {
        "kiln_version_string": (ctypes.c_char_p, []),
        "kiln_last_error": (ctypes.c_char_p, []),
        "kiln_status_str": (ctypes.c_char_p, [st]),
        "kiln_set_option_string": (st, [ctypes.c_char_p, ctypes.c_char_p]),
        "kiln_graph_new": (st, [ctypes.POINTER(p)]),
        "kiln_graph_free": (None, [p]),
        "kiln_graph_add_input": (
            st,
            [
                p,
                ctypes.c_char_p,
                ctypes.c_int,
                ctypes.c_uint32,
                p,
                p,
                ctypes.POINTER(ctypes.c_int32),
            ],
        ),
        "kiln_graph_add_constant": (
            st,
            [
                p,
                ctypes.c_char_p,
                ctypes.c_int,
                ctypes.c_uint32,
                p,
                p,
                ctypes.c_size_t,
                ctypes.POINTER(ctypes.c_int32),
            ],
        ),
        "kiln_graph_add_node": (
            st,
            [p, ctypes.c_uint32, p, ctypes.c_uint32, p, ctypes.c_uint32, p, ctypes.c_uint32],
        ),
        "kiln_graph_mark_output": (st, [p, ctypes.c_int32, ctypes.c_char_p]),
        "kiln_graph_add_state": (
            st,
            [
                p,
                ctypes.c_char_p,
                ctypes.c_int,
                ctypes.c_uint32,
                p,
                p,
                ctypes.c_size_t,
                ctypes.POINTER(ctypes.c_int32),
            ],
        ),
        "kiln_graph_update_state": (st, [p, ctypes.c_int32, ctypes.c_int32]),
        "kiln_engine_n_states": (ctypes.c_uint32, [p]),
        "kiln_context_reset_states": (st, [p]),
        "kiln_context_share_states": (st, [p, p]),
        "kiln_engine_n_layers": (ctypes.c_uint32, [p]),
        "kiln_context_layer_info": (st, [p, ctypes.c_uint32, ctypes.POINTER(_LayerInfo)]),
        "kiln_op_name": (ctypes.c_char_p, [ctypes.c_uint32]),
        "kiln_build_options_init": (None, [ctypes.POINTER(_BuildOptions)]),
        "kiln_build": (st, [p, ctypes.POINTER(_BuildOptions), ctypes.POINTER(p)]),
        "kiln_built_free": (None, [p]),
        "kiln_built_engine": (st, [p, ctypes.POINTER(p), ctypes.POINTER(ctypes.c_size_t)]),
        "kiln_built_n_weights": (ctypes.c_uint32, [p]),
        "kiln_built_weight": (
            st,
            [
                p,
                ctypes.c_uint32,
                ctypes.POINTER(ctypes.c_char_p),
                ctypes.POINTER(p),
                ctypes.POINTER(ctypes.c_size_t),
            ],
        ),
        "kiln_load_options_init": (None, [ctypes.POINTER(_LoadOptions)]),
        "kiln_engine_load": (
            st,
            [p, ctypes.c_size_t, ctypes.POINTER(_LoadOptions), ctypes.POINTER(p)],
        ),
        "kiln_engine_free": (None, [p]),
        "kiln_engine_device": (ctypes.c_char_p, [p]),
        "kiln_engine_n_inputs": (ctypes.c_uint32, [p]),
        "kiln_engine_n_outputs": (ctypes.c_uint32, [p]),
        "kiln_engine_arena_nbytes": (ctypes.c_uint64, [p]),
        "kiln_engine_weight_nbytes": (ctypes.c_uint64, [p]),
        "kiln_context_new": (st, [p, ctypes.POINTER(p)]),
        "kiln_context_free": (None, [p]),
        "kiln_context_set_input": (st, [p, ctypes.c_uint32, ctypes.c_uint32, p, p]),
        "kiln_context_set_output": (st, [p, ctypes.c_uint32, p, ctypes.c_size_t]),
        "kiln_context_set_stream": (st, [p, p]),
        "kiln_context_execute": (st, [p]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    _lib = lib
    return lib


def check(status: int, what: str) -> None:
    if status != 0:
        lib = load()
        msg = (lib.kiln_last_error() or b"").decode(errors="replace")
        raise KilnCallError(f"{what}: {lib.kiln_status_str(status).decode()}: {msg}")


def version() -> str:
    return load().kiln_version_string().decode()


def _i64(values) -> ctypes.Array:
    return (ctypes.c_int64 * max(1, len(values)))(*[int(v) for v in values])


class Graph:
    """A kiln_graph, driven with already-resolved C arguments (op ids, typed attributes)."""

    def __init__(self):
        self.lib = load()
        self.h = ctypes.c_void_p()
        check(self.lib.kiln_graph_new(ctypes.byref(self.h)), "kiln_graph_new")

    def close(self):
        if self.h:
            self.lib.kiln_graph_free(self.h)
            self.h = None

    def add_input(self, name: str, dtype: int, lo, hi) -> int:
        out = ctypes.c_int32()
        check(
            self.lib.kiln_graph_add_input(
                self.h, name.encode(), dtype, len(lo), _i64(lo), _i64(hi), ctypes.byref(out)
            ),
            f"input '{name}'",
        )
        return out.value

    def add_constant(self, name: str | None, dtype: int, shape, data: bytes) -> int:
        out = ctypes.c_int32()
        buf = ctypes.create_string_buffer(data, len(data)) if data else None
        check(
            self.lib.kiln_graph_add_constant(
                self.h,
                name.encode() if name else None,
                dtype,
                len(shape),
                _i64(shape),
                buf,
                len(data),
                ctypes.byref(out),
            ),
            f"constant '{name}'",
        )
        return out.value

    def add_node(self, op_id: int, inputs, attrs, n_outputs: int) -> list[int]:
        """attrs: list of (name, "i" | "f", values) in the recorded order."""
        ins = (ctypes.c_int32 * max(1, len(inputs)))(*inputs)
        cattrs = (_Attr * max(1, len(attrs)))()
        keep = []
        for i, (name, kind, values) in enumerate(attrs):
            cattrs[i].name = name.encode()
            cattrs[i].n = len(values)
            if kind == "f":
                arr = (ctypes.c_double * max(1, len(values)))(*[float(v) for v in values])
                cattrs[i].floats = arr
            else:
                arr = (ctypes.c_int64 * max(1, len(values)))(*[int(v) for v in values])
                cattrs[i].ints = arr
            keep.append(arr)
        outs = (ctypes.c_int32 * max(1, n_outputs))()
        check(
            self.lib.kiln_graph_add_node(
                self.h, op_id, ins, len(inputs), cattrs, len(attrs), outs, n_outputs
            ),
            f"node op {op_id}",
        )
        return [outs[i] for i in range(n_outputs)]

    def mark_output(self, value: int, name: str) -> None:
        check(self.lib.kiln_graph_mark_output(self.h, value, name.encode()), f"output '{name}'")

    def add_state(self, name: str, dtype: int, shape, data: bytes | None) -> int:
        out = ctypes.c_int32()
        buf = ctypes.create_string_buffer(data, len(data)) if data else None
        check(
            self.lib.kiln_graph_add_state(
                self.h,
                name.encode(),
                dtype,
                len(shape),
                _i64(shape),
                buf,
                len(data) if data else 0,
                ctypes.byref(out),
            ),
            f"state '{name}'",
        )
        return out.value

    def update_state(self, state: int, value: int) -> None:
        check(self.lib.kiln_graph_update_state(self.h, state, value), f"update of state {state}")

    def build(
        self, precision: int, external_weights: bool, optimize: bool, min_external_nbytes: int
    ) -> tuple[bytes, list[tuple[str, bytes]]]:
        opts = _BuildOptions()
        self.lib.kiln_build_options_init(ctypes.byref(opts))
        opts.precision = precision
        opts.external_weights = 1 if external_weights else 0
        opts.optimize = 1 if optimize else 0
        opts.min_external_nbytes = int(min_external_nbytes)
        b = ctypes.c_void_p()
        check(self.lib.kiln_build(self.h, ctypes.byref(opts), ctypes.byref(b)), "kiln_build")
        try:
            data = ctypes.c_void_p()
            n = ctypes.c_size_t()
            check(self.lib.kiln_built_engine(b, ctypes.byref(data), ctypes.byref(n)), "engine")
            engine = ctypes.string_at(data, n.value)
            weights = []
            for i in range(self.lib.kiln_built_n_weights(b)):
                key = ctypes.c_char_p()
                check(
                    self.lib.kiln_built_weight(
                        b, i, ctypes.byref(key), ctypes.byref(data), ctypes.byref(n)
                    ),
                    "kiln_built_weight",
                )
                weights.append((key.value.decode(), ctypes.string_at(data, n.value)))
            return engine, weights
        finally:
            self.lib.kiln_built_free(b)


class Engine:
    """A loaded engine with one context, bound once to fixed device (or host) buffers.

    ``bind`` takes (data_ptr, shape) per input and (data_ptr, nbytes) per output, and an optional
    cudaStream_t (an int); ``execute`` then runs with a single C call (it returns with the work
    finished: Kiln synchronizes its stream).
    """

    def __init__(
        self,
        engine: bytes,
        weights: Mapping[str, bytes],
        device: str = "cuda:0",
        use_cuda_graphs: bool = True,
        profile: bool = False,
    ):
        self.lib = load()
        self._weights = dict(weights)

        def resolve(_ud, key, out_data, out_nbytes):
            blob = self._weights.get(key.decode())
            if blob is None:
                return KILN_ERR_MISSING_DATA
            out_data[0] = ctypes.cast(ctypes.c_char_p(blob), ctypes.c_void_p).value
            out_nbytes[0] = len(blob)
            return 0

        self._resolver = _Resolver(resolve)
        opts = _LoadOptions()
        self.lib.kiln_load_options_init(ctypes.byref(opts))
        opts.resolve = self._resolver
        settings = (_OptionSetting * 3)()
        settings[0].name = b"device"
        settings[0].type = KILN_OPTION_STRING
        settings[0].string_value = device.encode()
        settings[1].name = b"use_cuda_graphs"
        settings[1].type = KILN_OPTION_BOOL
        settings[1].int_value = 1 if use_cuda_graphs else 0
        settings[2].name = b"profile"
        settings[2].type = KILN_OPTION_BOOL
        settings[2].int_value = 1 if profile else 0
        opts.settings = settings
        opts.n_settings = 3
        self.h = ctypes.c_void_p()
        self.ctx = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(engine, len(engine))
        t0 = time.perf_counter()
        check(
            self.lib.kiln_engine_load(buf, len(engine), ctypes.byref(opts), ctypes.byref(self.h)),
            "kiln_engine_load",
        )
        t1 = time.perf_counter()
        self._weights = {}  # uploaded or copied by the load
        check(self.lib.kiln_context_new(self.h, ctypes.byref(self.ctx)), "kiln_context_new")
        # seconds spent in kiln_engine_load and kiln_context_new (bench/startup_device.py)
        self.t_load, self.t_ctx = t1 - t0, time.perf_counter() - t1
        self.device = self.lib.kiln_engine_device(self.h).decode()
        self.n_inputs = self.lib.kiln_engine_n_inputs(self.h)
        self.n_outputs = self.lib.kiln_engine_n_outputs(self.h)
        self.arena_nbytes = self.lib.kiln_engine_arena_nbytes(self.h)
        self.weight_nbytes = self.lib.kiln_engine_weight_nbytes(self.h)
        self._execute = self.lib.kiln_context_execute
        self._keep = []

    def bind(self, inputs, outputs, stream: int | None = None) -> None:
        self._keep = []
        for i, (ptr, shape) in enumerate(inputs):
            dims = _i64(shape)
            self._keep.append(dims)
            check(
                self.lib.kiln_context_set_input(
                    self.ctx, i, len(shape), dims, ctypes.c_void_p(ptr)
                ),
                f"input {i}",
            )
        for i, (ptr, nbytes) in enumerate(outputs):
            check(
                self.lib.kiln_context_set_output(self.ctx, i, ctypes.c_void_p(ptr), nbytes),
                f"output {i}",
            )
        check(
            self.lib.kiln_context_set_stream(self.ctx, ctypes.c_void_p(stream or 0)), "set_stream"
        )

    def execute(self) -> None:
        st = self._execute(self.ctx)
        if st != 0:
            check(st, "kiln_context_execute")

    def layers(self) -> list[dict]:
        """Every plan layer as this context runs it (kiln_context_layer_info)."""
        out = []
        for i in range(self.lib.kiln_engine_n_layers(self.h)):
            info = _LayerInfo()
            check(self.lib.kiln_context_layer_info(self.ctx, i, ctypes.byref(info)), "layer_info")
            out.append(
                {
                    "layer": i,
                    "op": self.lib.kiln_op_name(info.op).decode(),
                    "head": info.head,
                    "n_fused": info.n_fused,
                    "kernel": info.kernel.decode(errors="replace"),
                    "detail": info.detail.decode(errors="replace"),
                    "device_us": info.device_us,
                }
            )
        return out

    @property
    def n_states(self) -> int:
        return int(self.lib.kiln_engine_n_states(self.h))

    def reset_states(self) -> None:
        check(self.lib.kiln_context_reset_states(self.ctx), "kiln_context_reset_states")

    def share_states(self, owner: Engine) -> None:
        """This engine's context uses owner's states (two methods over one KV cache)."""
        check(self.lib.kiln_context_share_states(self.ctx, owner.ctx), "share_states")

    def close(self) -> None:
        if getattr(self, "ctx", None):
            self.lib.kiln_context_free(self.ctx)
            self.ctx = None
        if getattr(self, "h", None):
            self.lib.kiln_engine_free(self.h)
            self.h = None

    def __del__(self):
        self.close()
