"""Python wrapper of the Kiln graph/builder API (include/kiln/kiln_graph.h): describe a graph with
inputs (per-dimension [min, max]), constants, nodes and outputs, then build engine bytes."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import _lib, _ops

TORCH_TO_KILN = {
    torch.float32: _ops.DTYPE_F32,
    torch.float16: _ops.DTYPE_F16,
    torch.bfloat16: _ops.DTYPE_BF16,
    torch.int32: _ops.DTYPE_I32,
    torch.int64: _ops.DTYPE_I64,
    torch.bool: _ops.DTYPE_BOOL,
}
KILN_TO_TORCH = {v: k for k, v in TORCH_TO_KILN.items()}

PRECISIONS = {"fp32": 0, "fp16": 1, "bf16": 2}

INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)

_GRAPH_FNS = (
    "kiln_graph_new",
    "kiln_graph_free",
    "kiln_graph_add_input",
    "kiln_graph_add_constant",
    "kiln_graph_add_node",
    "kiln_graph_mark_output",
    "kiln_graph_value_info",
)
_BUILD_FNS = (
    "kiln_build_options_init",
    "kiln_build",
    "kiln_built_free",
    "kiln_built_engine",
    "kiln_built_n_weights",
    "kiln_built_weight",
)
# States (a model's mutable buffers): looked up when first used, so that a libkiln without them
# still builds graphs that have none.
_STATE_FNS = ("kiln_graph_add_state", "kiln_graph_update_state")


def kiln_dtype(dtype: torch.dtype) -> int:
    """The kiln_dtype of a torch dtype; KeyError for dtypes Kiln does not have (float64, ...)."""
    try:
        return TORCH_TO_KILN[dtype]
    except KeyError:
        raise KeyError(f"Kiln has no dtype for {dtype}") from None


def _i64_array(values: Sequence[int]):
    return (ctypes.c_int64 * max(1, len(values)))(*[int(v) for v in values])


def _clamp_i64(v: int) -> int:
    return INT64_MAX if v > INT64_MAX else INT64_MIN if v < INT64_MIN else v


@dataclass
class Built:
    """The result of kiln_build: engine bytes and, with external weights, (key, bytes) pairs."""

    engine: bytes
    weights: list[tuple[str, bytes]]


class Graph:
    """A kiln_graph. Values are int ids; optional node inputs are None."""

    def __init__(self):
        self._lib = _lib.require(*_GRAPH_FNS)
        h = ctypes.c_void_p()
        _lib.check(self._lib.kiln_graph_new(ctypes.byref(h)), "kiln_graph_new")
        self._h = h

    def close(self) -> None:
        if getattr(self, "_h", None) is not None and self._h.value:
            self._lib.kiln_graph_free(self._h)
        self._h = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def add_input(
        self, name: str, dtype: int, dim_min: Sequence[int], dim_max: Sequence[int]
    ) -> int:
        out = ctypes.c_int32()
        _lib.check(
            self._lib.kiln_graph_add_input(
                self._h,
                name.encode(),
                dtype,
                len(dim_min),
                _i64_array(dim_min),
                _i64_array(dim_max),
                ctypes.byref(out),
            ),
            f"input {name!r}",
        )
        return out.value

    def add_constant(self, name: str | None, tensor: torch.Tensor) -> int:
        t = tensor.detach().to("cpu").contiguous()
        dt = kiln_dtype(t.dtype)
        nbytes = t.numel() * t.element_size()
        out = ctypes.c_int32()
        ptr = ctypes.c_void_p(t.data_ptr()) if nbytes else None
        _lib.check(
            self._lib.kiln_graph_add_constant(
                self._h,
                name.encode() if name else None,
                dt,
                t.dim(),
                _i64_array(t.shape),
                ptr,
                nbytes,
                ctypes.byref(out),
            ),
            f"constant {name!r}",
        )
        return out.value

    def add_state(
        self,
        name: str,
        dtype: int | torch.dtype,
        shape: Sequence[int],
        initial: torch.Tensor | None = None,
    ) -> int:
        """Adds a state (kiln_graph_add_state): a tensor of static shape the engine keeps from
        one execute to the next, every context holding its own copy. ``initial`` is its value
        when a context is created (copied; its dtype and shape must match); None starts it at
        zeros, and the engine then stores no data for it. The value returned reads the state as
        it was when execute began; :meth:`update_state` says what it becomes."""
        _lib.require(*_STATE_FNS)
        dt = kiln_dtype(dtype) if isinstance(dtype, torch.dtype) else int(dtype)
        shape = [int(d) for d in shape]
        keep = None
        ptr, nbytes = None, 0
        if initial is not None:
            keep = initial.detach().to("cpu").contiguous()
            if kiln_dtype(keep.dtype) != dt or list(keep.shape) != shape:
                raise ValueError(
                    f"state {name!r}: the initial value is {keep.dtype} {list(keep.shape)}, the "
                    f"state kiln dtype {dt} {shape}"
                )
            nbytes = keep.numel() * keep.element_size()
            ptr = ctypes.c_void_p(keep.data_ptr()) if nbytes else None
        out = ctypes.c_int32()
        _lib.check(
            self._lib.kiln_graph_add_state(
                self._h,
                name.encode(),
                dt,
                len(shape),
                _i64_array(shape),
                ptr,
                nbytes,
                ctypes.byref(out),
            ),
            f"state {name!r}",
        )
        return out.value

    def update_state(self, state: int, new_value: int, what: str = "") -> None:
        """Declares that at the end of each execute the state takes new_value
        (kiln_graph_update_state)."""
        _lib.require(*_STATE_FNS)
        _lib.check(
            self._lib.kiln_graph_update_state(self._h, state, new_value),
            what or f"update of state value {state}",
        )

    def add_node(
        self,
        op: str,
        inputs: Sequence[int | None],
        attrs: dict | None = None,
        what: str = "",
    ) -> list[int]:
        schema = _ops.get(op)
        ins = (ctypes.c_int32 * max(1, len(inputs)))(*[-1 if v is None else v for v in inputs])
        keep = []  # keeps the ctypes arrays alive during the call
        cattrs = (_lib.Attr * max(1, len(attrs or {})))()
        for i, (name, value) in enumerate((attrs or {}).items()):
            a = schema.attr(name)
            vals = list(value) if isinstance(value, (list, tuple)) else [value]
            cattrs[i].name = name.encode()
            cattrs[i].n = len(vals)
            if a.is_float:
                arr = (ctypes.c_double * max(1, len(vals)))(
                    *[math.nan if v is None else float(v) for v in vals]
                )
                cattrs[i].floats = arr
            else:
                arr = (ctypes.c_int64 * max(1, len(vals)))(*[_clamp_i64(int(v)) for v in vals])
                cattrs[i].ints = arr
            keep.append(arr)
        outs = (ctypes.c_int32 * max(1, schema.n_outputs))()
        _lib.check(
            self._lib.kiln_graph_add_node(
                self._h,
                schema.id,
                ins,
                len(inputs),
                cattrs,
                len(attrs or {}),
                outs,
                schema.n_outputs,
            ),
            what or f"node '{op}'",
        )
        return [outs[i] for i in range(schema.n_outputs)]

    def mark_output(self, value: int, name: str) -> None:
        _lib.check(
            self._lib.kiln_graph_mark_output(self._h, value, name.encode()), f"output {name!r}"
        )

    def value_info(self, value: int) -> tuple[int, list[int], list[int]]:
        """(kiln dtype, dim_min, dim_max) inferred for a value."""
        dt = ctypes.c_int()
        rank = ctypes.c_uint32()
        lo = (ctypes.c_int64 * _lib.KILN_MAX_RANK)()
        hi = (ctypes.c_int64 * _lib.KILN_MAX_RANK)()
        _lib.check(
            self._lib.kiln_graph_value_info(
                self._h, value, ctypes.byref(dt), ctypes.byref(rank), lo, hi
            ),
            f"value {value}",
        )
        r = rank.value
        return dt.value, list(lo[:r]), list(hi[:r])

    def build(
        self,
        precision: str = "fp32",
        external_weights: bool = False,
        optimize: bool = True,
        min_external_nbytes: int = 0,
        progress=None,
    ) -> Built:
        """Builds the graph (kiln_build). ``progress(phase, name, step, n_steps)`` is called
        after each step the builder reports (phase "pass", "layer", "tune" or "output"); an
        exception it raises (KeyboardInterrupt included) stops the build and is raised here."""
        _lib.require(*_BUILD_FNS)
        opts = _lib.BuildOptions()
        self._lib.kiln_build_options_init(ctypes.byref(opts))
        if precision not in PRECISIONS:
            raise ValueError(
                f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}"
            )
        opts.precision = PRECISIONS[precision]
        opts.external_weights = 1 if external_weights else 0
        opts.optimize = 1 if optimize else 0
        opts.min_external_nbytes = int(min_external_nbytes)
        raised: list[BaseException] = []
        if progress is not None:

            def report(_ud, p):
                try:
                    q = p.contents
                    name = q.name.decode("utf-8", "replace") if q.name else ""
                    progress(_lib.BUILD_PHASES.get(q.phase, str(q.phase)), name, q.step, q.n_steps)
                    return 0
                except BaseException as e:  # noqa: BLE001 - re-raised after kiln_build returns
                    raised.append(e)
                    return 1

            opts.progress = _lib.BuildProgressFn(report)
        b = ctypes.c_void_p()
        st = self._lib.kiln_build(self._h, ctypes.byref(opts), ctypes.byref(b))
        if raised:
            raise raised[0]
        _lib.check(st, "kiln_build")
        try:
            data = ctypes.c_void_p()
            n = ctypes.c_size_t()
            _lib.check(
                self._lib.kiln_built_engine(b, ctypes.byref(data), ctypes.byref(n)),
                "kiln_built_engine",
            )
            engine = ctypes.string_at(data, n.value)
            weights = []
            for i in range(self._lib.kiln_built_n_weights(b)):
                key = ctypes.c_char_p()
                _lib.check(
                    self._lib.kiln_built_weight(
                        b, i, ctypes.byref(key), ctypes.byref(data), ctypes.byref(n)
                    ),
                    "kiln_built_weight",
                )
                weights.append((key.value.decode(), ctypes.string_at(data, n.value)))
            return Built(engine, weights)
        finally:
            self._lib.kiln_built_free(b)
