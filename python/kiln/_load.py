"""kiln.load: run an ExecuTorch program (.pte, optionally with its .ptd) through the stock
ExecuTorch runtime with the KilnBackend delegate registered."""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from pathlib import Path

_PIP_HINT = (
    "Kiln's runtime package (kiln_executorch_runtime, distribution kiln-executorch-runtime) is "
    'not installed: pip install "kiln[executorch]" (or `make install` in a Kiln checkout)'
)

# ExecuTorch runtime::Error values (runtime/core/error.h) seen when loading or running.
_ET_ERRORS = {
    0x01: "Internal",
    0x02: "InvalidState",
    0x04: "AlreadyLoaded",
    0x10: "NotSupported",
    0x11: "NotImplemented",
    0x12: "InvalidArgument",
    0x13: "InvalidType",
    0x14: "OperatorMissing",
    0x20: "NotFound",
    0x21: "MemoryAllocationFailed",
    0x22: "AccessFailed",
    0x23: "InvalidProgram",
    0x24: "InvalidExternalData",
    0x25: "OutOfResources",
    0x30: "DelegateInvalidCompatibility",
    0x31: "DelegateMemoryAllocationFailed",
    0x32: "DelegateInvalidHandle",
}


# ExecuTorch ScalarType values (MethodMeta's TensorInfo.dtype()).
_ET_SCALAR_TYPES = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "float16",
    6: "float32",
    7: "float64",
    11: "bool",
    15: "bfloat16",
}


class KilnLoadError(RuntimeError):
    """A program could not be loaded or run (the message names the cause and the fix).

    When Kiln found the cause (a damaged engine, weight or .ptd file, a missing GPU, a shape
    outside an engine's range), ``status`` is its kiln_status value, ``status_name`` its name
    ("KILN_ERR_CORRUPT", ...) and the message carries Kiln's whole diagnosis; otherwise both are
    None and the message is ExecuTorch's.
    """

    def __init__(self, message: str, status: int | None = None, status_name: str | None = None):
        super().__init__(message)
        self.status = status
        self.status_name = status_name


def _error_code(msg: str) -> int | None:
    # pybind messages read "... error: 0x:24" (ExecuTorch 1.5) or "... error 0x24".
    m = re.search(r"(?:error|Error)\W*0x:?([0-9a-fA-F]+)", msg)
    if m:
        return int(m.group(1), 16)
    for code, name in _ET_ERRORS.items():
        if name in msg:
            return code
    return None


def _runtime():
    try:
        return importlib.import_module("kiln_executorch_runtime")
    except ModuleNotFoundError as e:
        if e.name == "kiln_executorch_runtime":
            raise ImportError(_PIP_HINT) from None
        raise


def _register_kiln() -> None:
    _runtime().register()


def _kiln_failure(rt) -> tuple[int, str, str] | None:
    """KilnBackend's last failure on this thread: (status, status name, whole message)."""
    err = rt.last_error()
    if err is None:
        return None
    return rt.last_status(), err[0], err[1]


class Program:
    """A loaded ExecuTorch program. ``forward(*tensors)`` and ``run(method, inputs)`` return
    lists of output tensors."""

    def __init__(self, program, path: Path, data_path: Path | None, runtime=None):
        self._program = program
        self._rt = runtime if runtime is not None else _runtime()
        self.path = path
        self.data_path = data_path
        names = list(program.method_names)
        self.method_names = sorted(names, key=lambda n: (n != "forward", n))
        self._methods = {}
        for name in self.method_names:
            self._methods[name] = self._load_method(name)

    def _load_method(self, name: str):
        self._rt.clear_error()
        try:
            return self._program.load_method(name)
        except Exception as e:  # noqa: BLE001 - pybind raises RuntimeError/ValueError
            failure = _kiln_failure(self._rt)
            status, status_name = (failure[0], failure[1]) if failure else (None, None)
            raise KilnLoadError(self._explain_load(name, e, failure), status, status_name) from e

    def _explain_load(self, name: str, e: Exception, failure=None) -> str:
        msg = str(e)
        code = _error_code(msg)
        if code in _ET_ERRORS:
            msg = f"{msg.strip()} = {_ET_ERRORS[code]}"
        base = f"loading method '{name}' of {self.path} failed ({msg.strip()})"
        if failure is not None and failure[1] != "KILN_ERR_MISSING_DATA":
            # Kiln's diagnosis, whole: it names the field or weight and the remedy.
            files = str(self.path) + (f" with {self.data_path}" if self.data_path else "")
            return f"{base}: {failure[2]} [files: {files}]"
        cause = f" ({failure[2]})" if failure is not None else ""
        if code == 0x24 or "external" in msg.lower() or failure is not None:
            if self.data_path is None:
                return (
                    f"{base}: the program keeps weights in a separate .ptd file (it was exported "
                    "with external_data=...). Load it with kiln.load(pte_path, "
                    f"data_path='<external_data>.ptd'){cause}"
                )
            return (
                f"{base}: {self.data_path} does not hold this program's weights; pass the .ptd "
                f"file written together with this .pte{cause}"
            )
        if code == 0x20 or "backend" in msg.lower():
            return (
                f"{base}: a delegate the program uses is not registered in this process. For "
                "Kiln, import kiln_executorch_runtime (or use kiln.load) and check that "
                "KILN_SKIP_DELEGATE_REGISTRATION is not set"
            )
        if code == 0x14:
            missing = self._missing_operators(name)
            which = f" ({', '.join(missing)})" if missing else ""
            return (
                f"{base}: an operator outside the Kiln delegate has no kernel in this ExecuTorch "
                f"runtime{which}. Kiln did not take it at export (the export report says why); "
                "change the model code that makes it, or use a runtime built with that kernel"
            )
        return f"{base}: see the ExecuTorch/Kiln log lines above for the cause"

    def _missing_operators(self, method: str) -> list[str]:
        """The operators the method calls that this runtime has no kernel for ([] when it cannot
        tell)."""
        try:
            from executorch.extension.pybindings import portable_lib

            from ._pte import read_program

            kernels = set(portable_lib._get_operator_names())
            prog = read_program(Path(self.path).read_bytes(), str(self.path))
            ops = next((m.operators for m in prog.methods if m.name == method), [])
            return sorted({o for o in ops if o not in kernels})
        except Exception:  # noqa: BLE001 - the message stays useful without the names
            return []

    def run(self, method: str, inputs: Sequence) -> list:
        """Runs a method on a sequence of inputs (tensors); returns its outputs as tensors."""
        import torch

        m = self._methods.get(method)
        if m is None:
            raise ValueError(
                f"the program has no method {method!r}; its methods: {', '.join(self.method_names)}"
            )
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        if not isinstance(inputs, (list, tuple)):
            raise TypeError(
                f"inputs must be a list or tuple of tensors, got {type(inputs).__name__}"
            )
        meta = m.metadata
        n_in = meta.num_inputs()
        if len(inputs) != n_in:
            raise ValueError(f"method {method!r} takes {n_in} inputs, got {len(inputs)}")
        args = [t.contiguous() if isinstance(t, torch.Tensor) else t for t in inputs]
        _check_inputs(method, meta, args)
        self._rt.clear_error()
        try:
            outs = m.execute(args)
        except Exception as e:  # noqa: BLE001 - pybind raises RuntimeError
            failure = _kiln_failure(self._rt)
            status, status_name = (failure[0], failure[1]) if failure else (None, None)
            raise KilnLoadError(
                self._explain_run(method, args, e, failure), status, status_name
            ) from e
        return list(outs)

    def _explain_run(self, method: str, args, e: Exception, failure=None) -> str:
        msg = str(e).strip()
        code = _error_code(msg)
        if code in _ET_ERRORS:
            msg += f" = {_ET_ERRORS[code]}"
        shapes = ", ".join(
            str(tuple(a.shape)) + f" {a.dtype}" if hasattr(a, "shape") else repr(a) for a in args
        )
        if failure is not None:
            hint = ""
            if failure[1] == "KILN_ERR_SHAPE":
                hint = (
                    " (every input must have the dtype and rank the program was exported with, "
                    "and dynamic dimensions must lie within the ranges given to torch.export)"
                )
            return (
                f"running method '{method}' failed ({msg}) with inputs {shapes}: {failure[2]}{hint}"
            )
        return (
            f"running method '{method}' failed ({msg}) with inputs {shapes}: check that every "
            "input has the dtype and rank the program was exported with and that dynamic "
            "dimensions are within the ranges given to torch.export (the log lines above name "
            "the input and the allowed range)"
        )

    def forward(self, *inputs) -> list:
        """Runs the ``forward`` method."""
        return self.run("forward", inputs)

    def __call__(self, *inputs) -> list:
        return self.forward(*inputs)

    def __repr__(self) -> str:
        return f"kiln.Program({str(self.path)!r}, methods={self.method_names})"


def _check_inputs(method: str, meta, args) -> None:
    """Refuses inputs whose dtype, rank or size cannot fit the method, before ExecuTorch does
    (its message only says 'error 0x10'). Sizes are checked against the program's upper bounds
    (the largest shapes the program was exported for); Kiln checks the rest at run time."""
    import torch

    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            continue
        try:
            info = meta.input_tensor_meta(i)
        except Exception:  # noqa: BLE001 - not a tensor input
            continue
        want = _ET_SCALAR_TYPES.get(info.dtype())
        if want is not None and str(a.dtype).removeprefix("torch.") != want:
            raise TypeError(f"method {method!r} input {i} must be torch.{want}, got {a.dtype}")
        sizes = list(info.sizes())
        if a.dim() != len(sizes):
            raise ValueError(
                f"method {method!r} input {i} must have rank {len(sizes)} (shape up to "
                f"{tuple(sizes)}), got shape {tuple(a.shape)}"
            )
        for d, (got, most) in enumerate(zip(a.shape, sizes, strict=True)):
            if got > most:
                raise ValueError(
                    f"method {method!r} input {i} dimension {d} is {got}, above the largest "
                    f"size the program was exported for ({most}; shape up to {tuple(sizes)}); "
                    "export with a larger torch.export.Dim max to accept it"
                )


def load(path, data_path=None) -> Program:
    """Loads a .pte program (and its .ptd weights) for ExecuTorch's runtime with KilnBackend
    registered, and loads every method.

    Raises FileNotFoundError for a missing file, ImportError if Kiln's runtime package is not
    installed, KilnLoadError (naming the cause and the fix; ``status_name`` is Kiln's status when
    Kiln found it) if the program, its .ptd or a method cannot be loaded: a program exported
    with external_data loaded without its .ptd, a damaged .ptd (checked by Kiln before
    ExecuTorch reads it), a damaged engine or weight (every weight is checked against its
    SHA-256 key; option ``verify_weights``), a GPU asked for that is not available.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no program file at {p}")
    d = None
    if data_path is not None:
        d = Path(data_path)
        if not d.is_file():
            raise FileNotFoundError(f"no data file at {d} (the .ptd written with the .pte)")
    _register_kiln()
    rt = _runtime()
    from executorch.runtime import Runtime

    # ExecuTorch trusts parts of the files it reads (every offset of a .ptd, the presence of
    # fields in a .pte's flatbuffer): Kiln checks both first.
    try:
        rt.check_program_file(p)
    except rt.KilnRuntimeError as e:
        raise KilnLoadError(
            f"{p} is not a loadable ExecuTorch program: {e}", e.status, e.status_name
        ) from None
    if d is not None:
        try:
            rt.check_data_file(d)
        except rt.KilnRuntimeError as e:
            raise KilnLoadError(
                f"{d} is not a usable .ptd for {p}: {e}", e.status, e.status_name
            ) from None
    try:
        prog = Runtime.get().load_program(str(p), data_path=str(d) if d is not None else None)
    except Exception as e:  # noqa: BLE001 - pybind raises RuntimeError
        if d is not None and "data map" in str(e):
            raise KilnLoadError(
                f"{d} is not an ExecuTorch data file ({str(e).strip()}): pass the .ptd written "
                "together with the .pte"
            ) from e
        raise KilnLoadError(
            f"{p} is not a loadable ExecuTorch program ({str(e).strip()}): pass a .pte file "
            "written by kiln.executorch.save or ExecutorchProgramManager.write_to_file"
        ) from e
    return Program(prog, p, d, rt)
