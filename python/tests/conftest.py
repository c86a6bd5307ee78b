"""Shared helpers for Kiln's Python tests.

The tests run against the installed packages (``kiln`` and ``kiln_executorch_runtime``, the
two distributions ``make install`` builds and installs; docs/packaging.md). For development
without installing, set ``PYTHONPATH=python`` and ``KILN_LIBRARY=/path/to/libkiln_export.so``
(export-side tests only).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

# Tolerances (rtol, atol) per output dtype, and per export precision for fp32 models.
TOLERANCE = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}
PRECISION_TOLERANCE = {"fp32": (1e-4, 1e-4), "fp16": (2e-2, 2e-2), "bf16": (8e-2, 8e-2)}


def assert_close(actual, expected, precision: str = "fp32", scale: float = 1.0):
    """Compares ExecuTorch+Kiln outputs with eager PyTorch outputs."""
    if isinstance(expected, torch.Tensor):
        expected = [expected]
    expected = list(expected)
    actual = list(actual)
    assert len(actual) == len(expected), f"{len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert isinstance(a, torch.Tensor), f"output {i} is {type(a).__name__}"
        assert a.shape == e.shape, f"output {i}: shape {tuple(a.shape)} != {tuple(e.shape)}"
        assert a.dtype == e.dtype, f"output {i}: dtype {a.dtype} != {e.dtype}"
        if e.dtype.is_floating_point:
            rtol, atol = TOLERANCE[e.dtype]
            if precision != "fp32" or e.dtype != torch.float32:
                p_rtol, p_atol = PRECISION_TOLERANCE[precision]
                rtol, atol = max(rtol, p_rtol), max(atol, p_atol)
            # (a NaN passes only where eager PyTorch has one)
            torch.testing.assert_close(
                a.float(),
                e.float(),
                rtol=rtol * scale,
                atol=atol * scale,
                equal_nan=True,
                msg=f"output {i}",
            )
        else:
            assert torch.equal(a, e), f"output {i} differs"


def delegation_summary(prog, method: str = "forward") -> dict:
    """Counts, in an ExecutorchProgramManager's method: 'kiln' delegate calls, 'other'
    delegate calls and 'ops' (ExecuTorch kernel calls other than memory bookkeeping)."""
    from executorch.exir.lowered_backend_module import executorch_call_delegate

    gm = prog.exported_program(method).graph_module
    out = {"kiln": 0, "other": 0, "ops": [], "delegate_args": []}
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is executorch_call_delegate:
            lowered = getattr(gm, n.args[0].target)
            if lowered.backend_id == "KilnBackend":
                out["kiln"] += 1
            else:
                out["other"] += 1
            out["delegate_args"].append((lowered, list(n.args[1:])))
            continue
        name = str(getattr(n.target, "__name__", n.target))
        if name in (
            "getitem",
            "alloc",
            "sym_size",
            "view",
            "_local_scalar_dense",
        ) or name.startswith("executorch.exir.memory"):
            continue
        if "memory.alloc" in str(n.target) or "memory.view" in str(n.target):
            continue
        out["ops"].append(str(n.target))
    return out


def engine_layers(path) -> list[dict]:
    """The layers of every Kiln engine in the program at path, as `kiln inspect --json` lists
    them (op, fused ops, inputs' dims, attrs)."""
    import io
    import json
    from contextlib import redirect_stdout

    from kiln._cli import main as kiln_main

    out = io.StringIO()
    with redirect_stdout(out):
        assert kiln_main(["inspect", "--json", str(path)]) == 0
    return [la for e in json.loads(out.getvalue())["engines"] for la in e["layers"]]


def run_python(
    code: str, env: dict | None = None, timeout: int = 300
) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter (same Python, same environment plus ``env``)."""
    full_env = dict(os.environ)
    full_env.pop("KILN_SKIP_DELEGATE_REGISTRATION", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
