"""Kiln engines through libkiln's C API alone (ctypes; no torch, no ExecuTorch): load with
per-load options, bind random inputs of the bindings' largest shapes (host memory, or device
memory through the CUDA runtime the plugin loaded), execute, time, read the per-layer info.
``kiln bench --engines`` and ``kiln profile`` use it, so both run where only libkiln (and
libkiln_cuda.so) are installed."""

from __future__ import annotations

import ctypes
import random
import struct
import time

from .. import _lib

_DTYPES = {1: "float32", 2: "float16", 3: "bfloat16", 4: "int32", 5: "int64", 6: "bool"}
_SIZES = {1: 4, 2: 2, 3: 2, 4: 4, 5: 8, 6: 1}
_OPTION_BOOL, _OPTION_INT, _OPTION_STRING = 1, 2, 3
_MISSING_DATA = 8
LAYER_TAIL = 0x1
LAYER_TIMED = 0x8  # KILN_LAYER_INFO_TIMED


def dtype_name(code: int) -> str:
    return _DTYPES.get(code, f"dtype {code}")


def random_bytes(dtype: int, numel: int, rng: random.Random) -> bytes:
    """numel random elements: floats in N(0, 1), integers in [0, 10), bools."""
    try:
        import numpy as np

        g = np.random.default_rng(rng.getrandbits(63))
        if dtype in (1, 2, 3):
            x = g.standard_normal(numel, dtype=np.float32)
            if dtype == 1:
                return x.tobytes()
            if dtype == 2:
                return x.astype(np.float16).tobytes()
            return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        if dtype == 6:
            return (g.random(numel) > 0.5).astype(np.uint8).tobytes()
        return g.integers(0, 10, numel, dtype=np.int32 if dtype == 4 else np.int64).tobytes()
    except ImportError:  # numpy is optional here: the same values, slower
        if dtype in (1, 2, 3):
            vals = [rng.gauss(0.0, 1.0) for _ in range(numel)]
            if dtype == 1:
                return struct.pack(f"<{numel}f", *vals)
            if dtype == 2:
                return struct.pack(f"<{numel}e", *vals)
            raw = struct.unpack(f"<{numel}I", struct.pack(f"<{numel}f", *vals))
            return struct.pack(f"<{numel}H", *[r >> 16 for r in raw])
        if dtype == 6:
            return bytes(rng.random() > 0.5 for _ in range(numel))
        fmt = "i" if dtype == 4 else "q"
        return struct.pack(f"<{numel}{fmt}", *[rng.randrange(10) for _ in range(numel)])


def _setting(name: str, value) -> _lib.OptionSetting:
    s = _lib.OptionSetting()
    s.name = name.encode()
    if isinstance(value, bool):
        s.type, s.int_value = _OPTION_BOOL, int(value)
    elif isinstance(value, int):
        s.type, s.int_value = _OPTION_INT, value
    else:
        s.type, s.string_value = _OPTION_STRING, str(value).encode()
    return s


def describe(engine: bytes) -> dict:
    """kiln_engine_describe as a dict (validates the bytes like a load; raises KilnError)."""
    import json

    lib = _lib.require("kiln_engine_describe")
    n = ctypes.c_size_t()
    _lib.check(lib.kiln_engine_describe(engine, len(engine), None, 0, ctypes.byref(n)))
    buf = ctypes.create_string_buffer(n.value + 1)
    _lib.check(lib.kiln_engine_describe(engine, len(engine), buf, len(buf), ctypes.byref(n)))
    return json.loads(buf.raw[: n.value].decode("utf-8"))


class _Cuda:
    """The CUDA runtime already in the process (the plugin loaded it): device memory for
    device I/O."""

    def __init__(self):
        last = None
        for name in ("libcudart.so.13", "libcudart.so"):
            try:
                self.rt = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
                break
            except OSError as e:
                last = e
        else:
            raise RuntimeError(f"device I/O needs the CUDA runtime (libcudart.so.13): {last}")
        self.rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.rt.cudaFree.argtypes = [ctypes.c_void_p]
        self.rt.cudaMemcpy.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
        ]
        self.rt.cudaSetDevice.argtypes = [ctypes.c_int]

    def alloc(self, nbytes: int) -> ctypes.c_void_p:
        p = ctypes.c_void_p()
        err = self.rt.cudaMalloc(ctypes.byref(p), max(1, nbytes))
        if err != 0:
            raise RuntimeError(f"cudaMalloc({nbytes}) failed with CUDA error {err}")
        return p

    def upload(self, dst: ctypes.c_void_p, data: bytes) -> None:
        err = self.rt.cudaMemcpy(dst, data, len(data), 1)  # cudaMemcpyHostToDevice
        if err != 0:
            raise RuntimeError(f"cudaMemcpy to the device failed with CUDA error {err}")

    def free(self, p: ctypes.c_void_p) -> None:
        self.rt.cudaFree(p)


class Engine:
    """One engine loaded through kiln_engine_load with one context, inputs bound at the
    bindings' largest shapes (random values), outputs bound to buffers of their largest size."""

    def __init__(
        self,
        data: bytes,
        weights: dict[str, bytes],
        options: dict,
        io: str = "host",
        seed: int = 0,
    ):
        self.lib = _lib.require(
            "kiln_engine_load", "kiln_engine_n_layers", "kiln_context_layer_info"
        )
        self._weights = weights
        self._engine = ctypes.c_void_p()
        self._ctx = ctypes.c_void_p()
        self._device_bufs: list = []
        self._cuda: _Cuda | None = None

        def resolve(_ud, key, out_data, out_nbytes):
            blob = self._weights.get(key.decode("utf-8", "replace"))
            if blob is None:
                return _MISSING_DATA
            out_data[0] = ctypes.cast(ctypes.c_char_p(blob), ctypes.c_void_p).value
            out_nbytes[0] = len(blob)
            return 0

        self._resolver = _lib.WeightResolver(resolve)
        opts = _lib.LoadOptions()
        self.lib.kiln_load_options_init(ctypes.byref(opts))
        opts.resolve = self._resolver
        settings = (_lib.OptionSetting * max(1, len(options)))()
        for i, (k, v) in enumerate(options.items()):
            settings[i] = _setting(k, v)
        opts.settings = settings
        opts.n_settings = len(options)
        self._keep = (settings,)
        buf = ctypes.create_string_buffer(data, len(data))
        _lib.check(
            self.lib.kiln_engine_load(
                buf, len(data), ctypes.byref(opts), ctypes.byref(self._engine)
            ),
            "kiln_engine_load",
        )
        self.device = self.lib.kiln_engine_device(self._engine).decode()
        _lib.check(self.lib.kiln_context_new(self._engine, ctypes.byref(self._ctx)))
        self.inputs = [
            self._binding(1, i) for i in range(self.lib.kiln_engine_n_inputs(self._engine))
        ]
        self.outputs = [
            self._binding(0, i) for i in range(self.lib.kiln_engine_n_outputs(self._engine))
        ]
        self.io = io
        if io == "device":
            if not self.device.startswith("cuda"):
                raise RuntimeError(
                    f"--io device needs an engine on a CUDA device; this one runs on {self.device} "
                    "(use --io host, or --device cuda:N on a machine with a GPU)"
                )
            self._cuda = _Cuda()
        rng = random.Random(seed)
        self._host = []
        self.input_bytes: list[bytes] = []
        self._out_host: list = []
        for i, b in enumerate(self.inputs):
            numel = 1
            for d in b["dims"]:
                numel *= d
            raw = random_bytes(b["code"], numel, rng)
            self.input_bytes.append(raw)
            ptr = self._place(raw)
            dims = (ctypes.c_int64 * max(1, len(b["dims"])))(*b["dims"])
            _lib.check(
                self.lib.kiln_context_set_input(self._ctx, i, len(b["dims"]), dims, ptr),
                f"input {i} ('{b['name']}')",
            )
        for o, b in enumerate(self.outputs):
            ptr = self._place(bytes(b["max_nbytes"])) if io == "device" else None
            if ptr is None:
                host = ctypes.create_string_buffer(max(1, b["max_nbytes"]))
                self._host.append(host)
                self._out_host.append(host)
                ptr = ctypes.cast(host, ctypes.c_void_p)
            _lib.check(
                self.lib.kiln_context_set_output(self._ctx, o, ptr, b["max_nbytes"]),
                f"output {o} ('{b['name']}')",
            )

    def _place(self, raw: bytes):
        if self._cuda is not None:
            p = self._cuda.alloc(len(raw))
            self._device_bufs.append(p)
            self._cuda.upload(p, raw)
            return p
        host = ctypes.create_string_buffer(raw, max(1, len(raw)))
        self._host.append(host)
        return ctypes.cast(host, ctypes.c_void_p)

    def _binding(self, is_input: int, i: int) -> dict:
        b = _lib.BindingInfo()
        _lib.check(self.lib.kiln_engine_binding(self._engine, is_input, i, ctypes.byref(b)))
        return {
            "name": b.name.decode("utf-8", "surrogateescape"),
            "code": b.dtype,
            "dtype": dtype_name(b.dtype),
            "dims": list(b.dim_max[: b.rank]),
            "dim_min": list(b.dim_min[: b.rank]),
            "max_nbytes": b.max_nbytes,
        }

    def execute(self) -> float:
        """Runs once; returns the host wall time in seconds."""
        t0 = time.perf_counter()
        _lib.check(self.lib.kiln_context_execute(self._ctx), "kiln_context_execute")
        return time.perf_counter() - t0

    def output_bytes(self, index: int) -> bytes:
        """Output `index` after an execute (host I/O), at the binding's largest size."""
        return self._out_host[index].raw[: self.outputs[index]["max_nbytes"]]

    def layers(self) -> list[dict]:
        out = []
        for i in range(self.lib.kiln_engine_n_layers(self._engine)):
            info = _lib.LayerInfo()
            _lib.check(self.lib.kiln_context_layer_info(self._ctx, i, ctypes.byref(info)))
            out.append(
                {
                    "layer": i,
                    "op": (self.lib.kiln_op_name(info.op) or b"?").decode(),
                    "head": info.head,
                    "tail": bool(info.flags & LAYER_TAIL),
                    "n_fused": info.n_fused,
                    "timed": bool(info.flags & LAYER_TIMED),
                    "kernel": info.kernel.decode("utf-8", "replace"),
                    "detail": info.detail.decode("utf-8", "replace"),
                    "workspace_nbytes": info.workspace_nbytes,
                    "n_profiled": info.n_profiled,
                    "device_us": info.device_us if info.device_us >= 0 else None,
                    "host_us": info.host_us if info.host_us >= 0 else None,
                }
            )
        return out

    @property
    def arena_nbytes(self) -> int:
        return self.lib.kiln_engine_arena_nbytes(self._engine)

    def close(self) -> None:
        lib = getattr(self, "lib", None)
        if lib is None:
            return
        if getattr(self, "_ctx", None) is not None and self._ctx.value:
            lib.kiln_context_free(self._ctx)
        if getattr(self, "_engine", None) is not None and self._engine.value:
            lib.kiln_engine_free(self._engine)
        self._ctx = self._engine = None
        if self._cuda is not None:
            for p in self._device_bufs:
                self._cuda.free(p)
        self._device_bufs = []

    def __del__(self):
        self.close()


class LogCapture:
    """Routes libkiln's log to a list while active (restores stderr logging after)."""

    def __init__(self, level: int = 1):
        self.lines: list[tuple[int, str]] = []
        self.level = level
        self._fn = _lib.LogFn(self._log)

    def _log(self, _ud, level, msg):
        self.lines.append((level, (msg or b"").decode("utf-8", "replace")))

    def __enter__(self):
        lib = _lib.library()
        self._prev = lib.kiln_log_get_level() if "kiln_log_get_level" not in _lib._missing else 2
        lib.kiln_log_set(self._fn, None, self.level)
        return self

    def __exit__(self, *exc):
        _lib.library().kiln_log_set(_lib.LogFn(), None, self._prev)
        return False


def tiny_engine() -> bytes:
    """The bytes of a one-layer engine, relu over float32 [2, 8], built through the C graph
    API (for ``kiln doctor``: no torch needed)."""
    lib = _lib.require("kiln_graph_new", "kiln_build", "kiln_op_lookup")
    g = ctypes.c_void_p()
    _lib.check(lib.kiln_graph_new(ctypes.byref(g)))
    built = ctypes.c_void_p()
    try:
        dims = (ctypes.c_int64 * 2)(2, 8)
        x, y = ctypes.c_int32(), (ctypes.c_int32 * 1)()
        _lib.check(lib.kiln_graph_add_input(g, b"x", 1, 2, dims, dims, ctypes.byref(x)))
        op = ctypes.c_uint32()
        _lib.check(lib.kiln_op_lookup(b"relu", ctypes.byref(op)))
        ins = (ctypes.c_int32 * 1)(x.value)
        _lib.check(lib.kiln_graph_add_node(g, op.value, ins, 1, None, 0, y, 1))
        _lib.check(lib.kiln_graph_mark_output(g, y[0], b"y"))
        _lib.check(lib.kiln_build(g, None, ctypes.byref(built)))
        data, n = ctypes.c_void_p(), ctypes.c_size_t()
        _lib.check(lib.kiln_built_engine(built, ctypes.byref(data), ctypes.byref(n)))
        return ctypes.string_at(data, n.value)
    finally:
        lib.kiln_built_free(built)
        lib.kiln_graph_free(g)


def check_tiny(engine: Engine) -> bool:
    """True when the tiny engine's output is relu of its input, exactly."""
    x = struct.unpack("<16f", engine.input_bytes[0])
    y = struct.unpack("<16f", engine.output_bytes(0))
    return all(b == (a if a > 0 else 0.0) for a, b in zip(x, y, strict=True))
