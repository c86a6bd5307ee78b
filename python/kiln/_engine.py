"""Runs Kiln engine bytes directly through libkiln's C runtime (kiln_engine_load, kiln_context_*),
without ExecuTorch. For tests and tools: it checks what preprocess built independently of the
delegate."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

import torch

from . import _lib
from ._graph import KILN_TO_TORCH, kiln_dtype

_OPTION_STRING = 3
_MISSING_DATA = 8


class Engine:
    """A loaded Kiln engine with one execution context.

    ``weights`` maps external weight keys to their bytes (engines built with external weights).
    ``device`` is the per-load ``device`` option ("cpu", "auto", "cuda:0"; None keeps the
    process-wide value).
    """

    def __init__(
        self,
        engine: bytes,
        weights: Mapping[str, bytes] | None = None,
        device: str | None = "cpu",
    ):
        self._lib = _lib.library()
        self._weights = {k: bytes(v) for k, v in (weights or {}).items()}
        self._engine = ctypes.c_void_p()
        self._ctx = ctypes.c_void_p()

        def resolve(_ud, key, out_data, out_nbytes):
            blob = self._weights.get(key.decode())
            if blob is None:
                return _MISSING_DATA
            out_data[0] = ctypes.cast(ctypes.c_char_p(blob), ctypes.c_void_p).value
            out_nbytes[0] = len(blob)
            return 0

        self._resolver = _lib.WeightResolver(resolve)
        opts = _lib.LoadOptions()
        self._lib.kiln_load_options_init(ctypes.byref(opts))
        opts.resolve = self._resolver
        settings = None
        if device is not None:
            settings = (_lib.OptionSetting * 1)()
            settings[0].name = b"device"
            settings[0].type = _OPTION_STRING
            settings[0].string_value = device.encode()
            opts.settings = settings
            opts.n_settings = 1
        buf = ctypes.create_string_buffer(bytes(engine), len(engine))
        _lib.check(
            self._lib.kiln_engine_load(
                buf, len(engine), ctypes.byref(opts), ctypes.byref(self._engine)
            ),
            "kiln_engine_load",
        )
        _lib.check(
            self._lib.kiln_context_new(self._engine, ctypes.byref(self._ctx)), "kiln_context_new"
        )
        self.inputs = [
            self._binding(1, i) for i in range(self._lib.kiln_engine_n_inputs(self._engine))
        ]
        self.outputs = [
            self._binding(0, i) for i in range(self._lib.kiln_engine_n_outputs(self._engine))
        ]

    def _binding(self, is_input: int, i: int) -> dict:
        b = _lib.BindingInfo()
        _lib.check(self._lib.kiln_engine_binding(self._engine, is_input, i, ctypes.byref(b)))
        return {
            "name": b.name.decode(),
            "dtype": KILN_TO_TORCH[b.dtype],
            "dim_min": list(b.dim_min[: b.rank]),
            "dim_max": list(b.dim_max[: b.rank]),
            "max_nbytes": b.max_nbytes,
        }

    @property
    def n_states(self) -> int:
        """The engine's states (a model's mutable buffers, such as a KV cache)."""
        return int(_lib.require("kiln_engine_n_states").kiln_engine_n_states(self._engine))

    def reset_states(self) -> None:
        """Sets every state of the context back to its initial value (a new sequence)."""
        lib = _lib.require("kiln_context_reset_states")
        _lib.check(lib.kiln_context_reset_states(self._ctx), "kiln_context_reset_states")

    @property
    def device(self) -> str:
        return self._lib.kiln_engine_device(self._engine).decode()

    def close(self) -> None:
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        if getattr(self, "_ctx", None) is not None and self._ctx.value:
            lib.kiln_context_free(self._ctx)
        if getattr(self, "_engine", None) is not None and self._engine.value:
            lib.kiln_engine_free(self._engine)
        self._ctx = self._engine = None

    def __del__(self):
        self.close()

    def run(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        """Executes on CPU tensors; returns the outputs as new tensors."""
        if len(inputs) != len(self.inputs):
            raise ValueError(f"the engine takes {len(self.inputs)} inputs, got {len(inputs)}")
        keep = []
        for i, (t, b) in enumerate(zip(inputs, self.inputs, strict=True)):
            if kiln_dtype(t.dtype) != kiln_dtype(b["dtype"]):
                raise TypeError(f"input {i} ('{b['name']}') must be {b['dtype']}, got {t.dtype}")
            t = t.detach().to("cpu").contiguous()
            keep.append(t)
            dims = (ctypes.c_int64 * max(1, t.dim()))(*t.shape)
            _lib.check(
                self._lib.kiln_context_set_input(
                    self._ctx, i, t.dim(), dims, ctypes.c_void_p(t.data_ptr())
                ),
                f"input {i} ('{b['name']}')",
            )
        _lib.check(self._lib.kiln_context_infer_shapes(self._ctx), "kiln_context_infer_shapes")
        outs = []
        for o, b in enumerate(self.outputs):
            rank = ctypes.c_uint32()
            dims = (ctypes.c_int64 * _lib.KILN_MAX_RANK)()
            _lib.check(self._lib.kiln_context_output_shape(self._ctx, o, ctypes.byref(rank), dims))
            t = torch.empty(list(dims[: rank.value]), dtype=b["dtype"])
            outs.append(t)
            _lib.check(
                self._lib.kiln_context_set_output(
                    self._ctx, o, ctypes.c_void_p(t.data_ptr()), t.numel() * t.element_size()
                ),
                f"output {o}",
            )
        _lib.check(self._lib.kiln_context_execute(self._ctx), "kiln_context_execute")
        return outs
