"""kiln-export: export a PyTorch model to an ExecuTorch program with Kiln from the command line.

    kiln-export model.pt2 out.pte                           # a torch.export.save'd program
    kiln-export mypkg.models:make_model out.pte --input 1x3x224x224
    kiln-export models.py:Net out.pte --input 8x64 --dynamic 0.0=1:32 --precision fp16
    kiln-export models.py:Net out.pte --input 4x16:int64 --external-data weights

MODEL is a ``.pt2`` file (torch.export.save), or ``MODULE:NAME`` / ``FILE.py:NAME`` naming an
nn.Module, or a callable returning one (built with no arguments). ``--input`` gives one example
input per model argument: ``SHAPE[:DTYPE]`` with SHAPE like ``1x3x224x224`` (integer inputs are
drawn from [0, 10)). ``--dynamic I.D=MIN:MAX`` makes dimension D of input I dynamic.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path

_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "int32": "int32",
    "int64": "int64",
    "long": "int64",
    "bool": "bool",
}


class CliError(Exception):
    pass


def _parse_input(spec: str):
    import torch

    shape_s, _, dtype_s = spec.partition(":")
    try:
        shape = [int(d) for d in shape_s.lower().split("x")] if shape_s else []
    except ValueError:
        raise CliError(f"--input {spec!r}: SHAPE must look like 1x3x224x224") from None
    if any(d < 0 for d in shape):
        raise CliError(f"--input {spec!r}: dimensions must be >= 0")
    name = _DTYPES.get((dtype_s or "float32").lower())
    if name is None:
        raise CliError(f"--input {spec!r}: unknown dtype; use one of {', '.join(sorted(_DTYPES))}")
    dtype = getattr(torch, name)
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    return torch.randint(0, 10, shape, dtype=dtype)


def _parse_dynamic(specs: list[str], n_inputs: int):
    import torch

    if not specs:
        return None
    shapes: list[dict] = [{} for _ in range(n_inputs)]
    for k, spec in enumerate(specs):
        try:
            where, rng = spec.split("=")
            i_s, d_s = where.split(".")
            lo_s, hi_s = rng.split(":")
            i, d, lo, hi = int(i_s), int(d_s), int(lo_s), int(hi_s)
        except ValueError:
            raise CliError(f"--dynamic {spec!r}: use INPUT.DIM=MIN:MAX, e.g. 0.0=1:32") from None
        if not 0 <= i < n_inputs:
            raise CliError(f"--dynamic {spec!r}: input {i} does not exist ({n_inputs} inputs)")
        if lo < 0 or hi < lo:
            raise CliError(f"--dynamic {spec!r}: need 0 <= MIN <= MAX")
        shapes[i][d] = torch.export.Dim(f"d{k}_{i}_{d}", min=lo, max=hi)
    return tuple(s or None for s in shapes)


def _load_model(spec: str):
    import torch

    if spec.endswith(".pt2"):
        p = Path(spec)
        if not p.is_file():
            raise CliError(f"no file {p}")
        return torch.export.load(str(p))
    mod_s, sep, name = spec.rpartition(":")
    if not sep or not mod_s or not name:
        raise CliError(f"MODEL {spec!r}: use a .pt2 file, MODULE:NAME or FILE.py:NAME")
    if mod_s.endswith(".py"):
        p = Path(mod_s)
        if not p.is_file():
            raise CliError(f"no file {p}")
        s = importlib.util.spec_from_file_location(p.stem, p)
        module = importlib.util.module_from_spec(s)
        sys.modules[p.stem] = module
        try:
            s.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - the user's file
            raise CliError(f"running {p} failed ({type(e).__name__}: {e})") from None
    else:
        try:
            module = importlib.import_module(mod_s)
        except ImportError as e:
            raise CliError(
                f"MODEL {spec!r}: cannot import {mod_s!r} ({e}); give an importable module "
                "(on sys.path), a FILE.py path or a .pt2 file"
            ) from None
    obj = getattr(module, name, None)
    if obj is None:
        raise CliError(f"{mod_s} has no attribute {name!r}")
    if not isinstance(obj, torch.nn.Module) and callable(obj):
        try:
            obj = obj()
        except Exception as e:  # noqa: BLE001 - the user's constructor
            raise CliError(
                f"{spec}() failed ({type(e).__name__}: {e}); MODEL must be an nn.Module or a "
                "callable that builds one with no arguments"
            ) from None
    if not isinstance(obj, torch.nn.Module):
        raise CliError(f"{spec} is not an nn.Module (nor a callable returning one)")
    return obj.eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="kiln-export",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("model", help=".pt2 file, MODULE:NAME or FILE.py:NAME")
    ap.add_argument("output", help="the .pte file to write")
    ap.add_argument("--input", action="append", default=[], metavar="SHAPE[:DTYPE]")
    ap.add_argument("--dynamic", action="append", default=[], metavar="I.D=MIN:MAX")
    ap.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32")
    ap.add_argument("--external-data", default=None, metavar="NAME", help="weights to NAME.ptd")
    ap.add_argument(
        "--tuning-records",
        default=None,
        metavar="FILE",
        help="store the records of a tuning cache (kiln tune --cache FILE) in the program",
    )
    ap.add_argument(
        "--strict", action="store_true", help="fail if Kiln leaves any node to ExecuTorch"
    )
    ap.add_argument(
        "--executorch-op",
        action="append",
        default=None,
        metavar="OP",
        help="leave OP (e.g. aten.softmax.default, or aten.softmax) to ExecuTorch; repeatable",
    )
    ap.add_argument("--quiet", action="store_true", help="no progress bar and no report")
    args = ap.parse_args(argv)
    try:
        import torch

        from .executorch import KilnStrictError, save
    except ImportError as e:
        print(
            f"kiln-export: error: {e} (exporting needs torch and executorch: pip install kiln)",
            file=sys.stderr,
        )
        return 1
    try:
        model = _load_model(args.model)
        if isinstance(model, torch.export.ExportedProgram):
            if args.input or args.dynamic:
                raise CliError("--input/--dynamic do not apply to a .pt2 program")
            inputs, dyn = None, None
        else:
            if not args.input:
                raise CliError("an nn.Module needs --input SHAPE[:DTYPE] for each argument")
            inputs = tuple(_parse_input(s) for s in args.input)
            dyn = _parse_dynamic(args.dynamic, len(inputs))
        prog = save(
            model,
            args.output,
            inputs,
            dynamic_shapes=dyn,
            precision=args.precision,
            external_data=args.external_data,
            tuning_records=args.tuning_records,
            strict=args.strict,
            quiet=args.quiet,
            executorch_ops=args.executorch_op,
        )
    except KilnStrictError as e:
        print(f"kiln-export: error: {e}", file=sys.stderr)
        return 1
    except (CliError, ValueError, TypeError, FileNotFoundError) as e:
        print(f"kiln-export: error: {e}", file=sys.stderr)
        return 2
    kiln_calls = 0
    for method in prog.methods:
        gm = prog.exported_program(method).graph_module
        for n in gm.graph.nodes:
            if n.op == "call_function" and "executorch_call_delegate" in str(n.target):
                kiln_calls += getattr(gm, n.args[0].target).backend_id == "KilnBackend"
    out = Path(args.output)
    msg = f"wrote {out} ({out.stat().st_size} bytes, {kiln_calls} Kiln delegate call(s))"
    if args.external_data:
        ptd = out.parent / f"{args.external_data}.ptd"
        msg += f" and {ptd} ({ptd.stat().st_size} bytes)"
    print(msg)
    report = getattr(prog, "kiln_report", None)
    if not args.quiet and report is not None and not sys.stderr.isatty():
        print(report)  # on a terminal, save() printed it already
    return 0


if __name__ == "__main__":
    sys.exit(main())
