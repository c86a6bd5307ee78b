"""How much of each zoo model Kiln takes: exports every model of bench/zoo.py through
``to_edge_transform_and_lower`` with ``KilnPartitioner`` (on the CPU, no GPU needed) and
prints, per model, the number of Kiln delegates and the ops left to ExecuTorch (with the
partitioner's reason for each kind of op it refused).

    python bench/zoo_delegation.py                       # every model, depth 2, vocab 4096
    python bench/zoo_delegation.py --models bert,gpt2 --dynamic --json out.json
    python bench/zoo_delegation.py --precision fp16 --kernels   # + each engine's layers/kernels
    python bench/zoo_delegation.py --precision fp16 --cuda-plan build/cuda_fold_test

With ``--kernels`` the program is written and read back (``kiln inspect``): the Kiln layers and
the kernels they launch (fused tails share their head's), summed over the engines, and the
layers by op. Counting needs no GPU: it is how a builder change is judged here before the H200
measures its time. ``--cuda-plan BIN`` (BIN the CPU build's ``cuda_fold_test``) also plans each
engine as the CUDA backend does at load (its NHWC layout and its folds: views that alias, layout
permutes) and records what it would launch: the layers that run a kernel and the layout copies
(transposes) it adds.

The markdown table it prints is the one in docs/benchmarks.md ("Real-model zoo: delegation on
the CPU").
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zoo  # noqa: E402

# Edge ops that are memory bookkeeping, not compute left to ExecuTorch.
_IGNORED = ("getitem", "sym_size", "_local_scalar_dense")


def summarize(edge_program) -> dict:
    """Kiln delegates, other delegates and the ops outside them, in an edge program."""
    from executorch.exir.lowered_backend_module import executorch_call_delegate

    gm = edge_program.graph_module
    out = {"kiln": 0, "other": 0, "outside": collections.Counter()}
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is executorch_call_delegate:
            lowered = getattr(gm, n.args[0].target)
            out["kiln" if lowered.backend_id == "KilnBackend" else "other"] += 1
            continue
        name = getattr(n.target, "__name__", str(n.target))
        if any(name.startswith(i) or name == i for i in _IGNORED):
            continue
        parts = str(getattr(n.target, "_op", n.target)).split(".")  # aten.eq.Scalar
        out["outside"][parts[-2] if len(parts) >= 3 else parts[-1]] += 1
    return out


def cuda_plan_counts(buffer: bytes, tool: str) -> dict:
    """What the CUDA backend would launch for the Kiln engines of a program (tool: the CPU
    build's cuda_fold_test, given the engines' bytes): layers run and layout copies, summed."""
    import re
    import subprocess
    import tempfile

    from kiln._pte import read_program

    prog = read_program(buffer)
    run = copies = 0
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for m in prog.methods:
            for i, dl in enumerate(m.delegates):
                if dl.backend != "KilnBackend" or dl.data is None:
                    continue
                path = os.path.join(d, f"{m.name}_{i}.kiln")
                with open(path, "wb") as f:
                    f.write(dl.data)
                paths.append(path)
        if paths:
            out = subprocess.run([tool, *paths], capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                g = re.search(r"(\d+) layers run \(\+(\d+) layout copies\)", line)
                if g:
                    run += int(g.group(1))
                    copies += int(g.group(2))
    return {"cuda_run": run, "cuda_copies": copies}


def engine_counts(edge, cuda_plan: str | None = None) -> dict:
    """Layers, kernels and layers by op over the Kiln engines of a lowered program."""
    import io
    import tempfile
    from contextlib import redirect_stdout

    from kiln._cli import main as kiln_main

    buffer = edge.to_executorch().buffer
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.pte")
        with open(path, "wb") as f:
            f.write(buffer)
        out = io.StringIO()
        with redirect_stdout(out):
            if kiln_main(["inspect", "--json", path]) != 0:
                raise RuntimeError("kiln inspect failed")
    engines = json.loads(out.getvalue())["engines"]
    ops = collections.Counter(la["op"] for e in engines for la in e["layers"])
    rec = {
        "layers": sum(e["n_layers"] for e in engines),
        "kernels": sum(e["n_kernels"] for e in engines),
        "ops": dict(ops),
    }
    if cuda_plan:
        rec.update(cuda_plan_counts(buffer, cuda_plan))
    return rec


def measure(
    name: str,
    depth,
    vocab,
    dynamic: bool,
    precision: str,
    batch: int,
    kernels: bool = False,
    cuda_plan: str | None = None,
) -> dict:
    from executorch.exir import to_edge_transform_and_lower
    from kiln.executorch import KilnPartitioner

    t0 = time.time()
    module, inputs, dyn = zoo.build(name, depth=depth, batch=batch, vocab=vocab)
    rec = {"model": name, "dynamic": dynamic, "precision": precision}
    try:
        with torch.no_grad():
            ep = torch.export.export(module, inputs, dynamic_shapes=dyn if dynamic else None)
        part = KilnPartitioner(precision=precision)
        edge = to_edge_transform_and_lower(ep, partitioner=[part])
        s = summarize(edge.exported_program())
        rec.update(kiln=s["kiln"], other=s["other"], outside=dict(s["outside"]))
        rejected = getattr(part, "rejected", None) or []
        reasons = {}
        for r in rejected:
            reasons.setdefault(r["op"], r["reason"])
        rec["reasons"] = reasons
        if kernels or cuda_plan:
            rec.update(engine_counts(edge, cuda_plan))
    except Exception as e:  # noqa: BLE001 - recorded per model
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        rec["traceback"] = traceback.format_exc(limit=4)
    rec["seconds"] = round(time.time() - t0, 1)
    return rec


def table(records: list[dict]) -> str:
    counted = any("kernels" in r for r in records)
    planned = any("cuda_run" in r for r in records)
    head = "| model | delegates | ops left to ExecuTorch |"
    lines = [head + (" layers | kernels |" if counted else ""), "|---|---:|---|"]
    lines[1] += "---:|---:|" if counted else ""
    if planned:
        lines[0] += " CUDA kernels | layout copies |"
        lines[1] += "---:|---:|"
    for r in records:
        if "error" in r:
            lines.append(
                f"| {r['model']} | – | export failed: {r['error']} |"
                + (" | |" if counted else "")
                + (" | |" if planned else "")
            )
            continue
        outside = ", ".join(f"{k} ×{v}" if v > 1 else k for k, v in sorted(r["outside"].items()))
        row = f"| {r['model']} | {r['kiln']} | {outside or 'none'} |"
        if counted:
            row += f" {r.get('layers', '–')} | {r.get('kernels', '–')} |"
        if planned:
            row += f" {r.get('cuda_run', '–')} | {r.get('cuda_copies', '–')} |"
        lines.append(row)
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    p.add_argument("--depth", type=int, default=2, help="layers / blocks per stage (0: full)")
    p.add_argument("--vocab", type=int, default=4096, help="vocabulary cap (0: full)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dynamic", action="store_true", help="export with dynamic batch/sequence")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--json", default=None, help="write the records here")
    p.add_argument("--reasons", action="store_true", help="print the partitioner's reasons")
    p.add_argument(
        "--kernels", action="store_true", help="count each engine's layers and kernels (inspect)"
    )
    p.add_argument(
        "--cuda-plan",
        default=None,
        metavar="BIN",
        help="also count what the CUDA backend would launch (BIN: the CPU build's cuda_fold_test)",
    )
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m] or zoo.names()
    records = []
    for m in models:
        r = measure(
            m,
            args.depth or None,
            args.vocab or None,
            args.dynamic,
            args.precision,
            args.batch,
            args.kernels,
            args.cuda_plan,
        )
        records.append(r)
        status = r.get("error") or f"{r['kiln']} delegate(s), outside {r['outside'] or 'none'}"
        print(f"{m}: {status} ({r['seconds']} s)", file=sys.stderr, flush=True)
        if args.reasons:
            for op, why in r.get("reasons", {}).items():
                print(f"    {op}: {why}", file=sys.stderr)
        gc.collect()
    print(table(records))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
