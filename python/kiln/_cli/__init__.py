"""The ``kiln`` command: inspect, run, bench, profile and doctor for ExecuTorch programs (``.pte``)
and Kiln engines. docs/cli.md describes every subcommand, its JSON and its exit codes.

    kiln inspect PROGRAM.pte|ENGINE [--data FILE.ptd] [--json]
    kiln run PROGRAM.pte [--inputs FILE.npz|random] [--device auto|cpu|cuda:N] [--compare REF.npz]
    kiln bench PROGRAM.pte [OTHER.pte ...] [--warmup N] [--iters N] [--engines] [--io host|device]
    kiln profile PROGRAM.pte|ENGINE [--trace out.json] [--device ...] [--iters N]
    kiln doctor [--install-hint]

Exit status: 0 ok, 1 failure (unreadable or invalid file, a run that fails or does not match
the reference, a broken installation), 2 usage error. With ``--json`` everything, errors
included, goes to stdout as one JSON document.
"""

from __future__ import annotations

import argparse
import sys

from . import _commands
from ._out import emit_json, text
from ._program import CliError, UsageError

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as JSON when --json was asked for."""

    json_mode = False

    def error(self, message):
        if _Parser.json_mode:
            emit_json({"error": {"kind": "usage", "message": message}})
            raise SystemExit(EXIT_USAGE)
        super().error(message)


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="kiln",
        description="Inspect, run, benchmark and profile ExecuTorch programs with Kiln engines.",
        epilog="exit status: 0 ok, 1 failure, 2 usage error. docs/cli.md has the details.",
    )
    from .. import __version__

    ap.add_argument("--version", action="version", version=f"kiln {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def add(name, help_):
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--json", action="store_true", help="print one JSON document to stdout")
        return p

    p = add("inspect", "what a .pte program or a Kiln engine holds")
    p.add_argument("file", help="a .pte program or raw Kiln engine bytes")
    p.add_argument("--data", action="append", metavar="FILE.ptd", help="the program's .ptd")
    p.add_argument("--layers", action="store_true", help="list every layer of every engine")

    p = add("run", "run a program through ExecuTorch with Kiln registered")
    p.add_argument("program")
    p.add_argument("--data", metavar="FILE.ptd", help="the program's .ptd (weights)")
    p.add_argument("--method", default="forward")
    p.add_argument("--inputs", default="random", metavar="FILE.npz|random")
    p.add_argument("--seed", type=int, default=0, help="for random inputs")
    p.add_argument("--device", default="auto", metavar="auto|cpu|cuda:N")
    p.add_argument("--compare", metavar="REF.npz", help="reference outputs to compare with")
    p.add_argument("--rtol", type=float, help="default: by the program's Kiln precision")
    p.add_argument("--atol", type=float, help="default: by the program's Kiln precision")
    p.add_argument("--save", metavar="OUT.npz", help="write the outputs")

    p = add("bench", "latency and throughput of one or more programs")
    p.add_argument("programs", nargs="+", metavar="PROGRAM.pte")
    p.add_argument("--data", action="append", metavar="FILE.ptd")
    p.add_argument("--method", default="forward")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--device", default="auto", metavar="auto|cpu|cuda:N")
    p.add_argument("--cuda-graphs", choices=["on", "off"], default="on")
    p.add_argument(
        "--engines",
        action="store_true",
        help="time each Kiln engine through the C API instead of the whole program through "
        "ExecuTorch (no executorch or torch needed)",
    )
    p.add_argument("--io", choices=["host", "device"], default="host", help="with --engines")
    p.add_argument("--seed", type=int, default=0)

    p = add("profile", "per-layer host and device time of each Kiln engine")
    p.add_argument("program", metavar="PROGRAM.pte|ENGINE")
    p.add_argument("--data", action="append", metavar="FILE.ptd")
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome/Perfetto trace")
    p.add_argument("--device", default="auto", metavar="auto|cpu|cuda:N")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)

    p = add("tune", "make the GPU choices of a program's Kiln engines once and keep them")
    p.add_argument("program", metavar="PROGRAM.pte|ENGINE")
    p.add_argument("--data", action="append", metavar="FILE.ptd")
    p.add_argument("--device", default="cuda:0", metavar="cuda:N")
    p.add_argument(
        "--cache",
        default="auto",
        metavar="FILE|auto",
        help="the tuning cache to write (the option tuning_cache; auto: the user's cache "
        "directory)",
    )
    p.add_argument("--seed", type=int, default=0)

    p = add("doctor", "what Kiln finds on this machine: GPU, driver, CUDA libraries, ExecuTorch")
    p.add_argument(
        "--install-hint", action="store_true", help="print the pip line for this machine"
    )
    return ap


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _Parser.json_mode = "--json" in argv
    ap = _parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else EXIT_USAGE
    if args.command is None:
        ap.print_help(sys.stderr)
        return EXIT_USAGE
    as_json = getattr(args, "json", False)
    try:
        return getattr(_commands, f"cmd_{args.command}")(args)
    except UsageError as e:
        return _fail(args, "usage", str(e), EXIT_USAGE, as_json)
    except CliError as e:
        return _fail(args, "error", str(e), EXIT_FAIL, as_json)
    except KeyboardInterrupt:
        return _fail(args, "interrupted", "interrupted", 130, as_json)
    except Exception as e:  # noqa: BLE001 - the command reports, never a traceback
        kind = type(e).__name__
        return _fail(args, kind, f"{kind}: {e}", EXIT_FAIL, as_json)


def _fail(args, kind: str, message: str, code: int, as_json: bool) -> int:
    if as_json:
        doc = {"command": args.command, "error": {"kind": kind, "message": message}}
        for k in ("file", "program", "programs"):
            if hasattr(args, k):
                doc[k] = getattr(args, k)
        emit_json(doc)
    else:
        print(f"kiln {args.command}: error: {text(message)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
