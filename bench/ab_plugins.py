"""A/B of CUDA plugins on the H200: the same engines (rebuilt once per model from the recording,
weights regenerated, as bench/startup_device.py does), each plugin in fresh processes, the
plugins' order reversed every other round; steady state is the median of graph replays with
device I/O bound once. Round 0 also records every layer's decision (kiln_context_layer_info),
so that two plugins that decide differently show it; --profile adds one run per plugin with the
option profile (each layer timed alone); --trace records round 0's graph replays with CUPTI
(torch.profiler): each kernel's time as it ran inside the replay, per name and in order.

    python3 bench/ab_plugins.py --bench-dir .dev/zooA --models zoo_resnet50_b1,... \\
        --variants "old=/tmp/old.so,new=$PWD/.dev/zooA/lib/libkiln_cuda.so" --rounds 3 --out $OUT

A variant is NAME=PLUGIN[|OPTION=VALUE...]: the options are set in its processes (the option
use_cuda_graphs=false runs the layers directly). KILN_LIBRARY must name the libkiln to use;
KILN_CUDA_PLUGIN is set per variant. Writes ab.json and prints a table (ms per execute, each
round, and each variant against the first).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_variants(text: str) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """'a=/p1.so,b=/p2.so|cuda.x=1' -> [(name, plugin, [(option, value)])]; names unique."""
    out, seen = [], set()
    for item in (t for t in text.split(",") if t.strip()):
        if "=" not in item:
            raise ValueError(f"variant {item!r}: expected NAME=PLUGIN[|OPTION=VALUE...]")
        name, rest = item.split("=", 1)
        plugin, *opts = rest.split("|")
        pairs = []
        for o in opts:
            if "=" not in o:
                raise ValueError(f"variant {name!r}: option {o!r} is not OPTION=VALUE")
            k, v = o.split("=", 1)
            pairs.append((k.strip(), v.strip()))
        name = name.strip()
        if not name or name in seen or not plugin.strip():
            raise ValueError(f"variant {item!r}: a new name and a plugin path are needed")
        seen.add(name)
        out.append((name, plugin.strip(), pairs))
    if len(out) < 1:
        raise ValueError("no variants")
    return out


def round_order(variants: list, r: int) -> list:
    """The variants in round r: as given in even rounds, reversed in odd ones (a slow first or
    last slot costs every variant alike over two rounds)."""
    return list(variants) if r % 2 == 0 else list(reversed(variants))


def layer_diffs(a: list[dict], b: list[dict]) -> list[dict]:
    """Layers whose kernel, decision or fusion differ between two layer_info lists."""
    out = []
    for x, y in zip(a, b, strict=False):
        if (x.get("kernel"), x.get("detail"), x.get("n_fused")) != (
            y.get("kernel"),
            y.get("detail"),
            y.get("n_fused"),
        ):
            out.append({"layer": x.get("layer"), "op": x.get("op"), "a": x, "b": y})
    if len(a) != len(b):
        out.append({"layer": None, "op": "count", "a": len(a), "b": len(b)})
    return out


def table(res: dict, names: list[str]) -> str:
    """Markdown: per model and variant the steady ms of each round, the median, and the median
    against the first variant's."""
    lines = ["| model | variant | ms per round | median | / first |", "|---|---|---|---|---|"]
    for model, d in res["models"].items():
        base = None
        for name in names:
            vals = [rw[name]["steady_ms"] for rw in d["rounds"] if "steady_ms" in rw.get(name, {})]
            if not vals:
                lines.append(f"| {model} | {name} | failed | - | - |")
                continue
            med = statistics.median(vals)
            base = med if base is None else base
            rounds = " / ".join(f"{v:.4f}" for v in vals)
            lines.append(f"| {model} | {name} | {rounds} | {med:.4f} | {med / base:.3f} |")
    return "\n".join(lines)


# --- the child: one plugin, one model, in its own process


def set_option(lib, name: str, value: str) -> None:
    """Sets a process option from text, as a bool, an int or a string (whichever it takes)."""
    lib.kiln_set_option_string.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.kiln_set_option_bool.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.kiln_set_option_int.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    lib.kiln_last_error.restype = ctypes.c_char_p
    low = value.lower()
    if low in ("true", "false", "on", "off", "1", "0"):
        if lib.kiln_set_option_bool(name.encode(), int(low in ("true", "on", "1"))) == 0:
            return
    try:
        if lib.kiln_set_option_int(name.encode(), int(value)) == 0:
            return
    except ValueError:
        pass
    if lib.kiln_set_option_string(name.encode(), value.encode()) != 0:
        raise RuntimeError(f"option {name}={value}: {lib.kiln_last_error().decode()}")


def child(args) -> dict:
    sys.path.insert(0, str(HERE))
    import pickle

    import kiln_capi as C
    import models as M
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")
    lib = C.load()
    graphs = True
    for kv in ["tuning_cache=off", *(args.opt or [])]:
        k, v = kv.split("=", 1)
        if k == "use_cuda_graphs":
            graphs = v.lower() in ("1", "true", "on")
            continue
        set_option(lib, k, v)
    with open(args.engines, "rb") as f:
        engines = pickle.load(f)
    if len(engines) != 1:
        raise RuntimeError(f"{args.model}: {len(engines)} engines (this script runs one)")
    cfg = M.CONFIG_BY_NAME[args.model]
    x = [(t.half() if t.is_floating_point() else t).cuda().contiguous() for t in M.make_inputs(cfg)]
    eng_bytes, weights = engines[0]
    e = C.Engine(
        eng_bytes, dict(weights), device="cuda:0", use_cuda_graphs=graphs, profile=args.profile
    )
    y = torch.empty(args.numel, dtype=torch.float16, device="cuda")
    e.bind([(t.data_ptr(), list(t.shape)) for t in x], [(y.data_ptr(), y.numel() * 2)], None)
    for _ in range(20):
        e.execute()
    times = []
    for _ in range(30 if args.profile else args.iters):
        t0 = time.perf_counter()
        e.execute()
        times.append(time.perf_counter() - t0)
    ref = torch.load(args.ref).flatten().float()
    got = y.float().cpu()
    out = {
        "steady_ms": statistics.median(times) * 1e3,
        "min_ms": min(times) * 1e3,
        "rel_err": float((got - ref).norm() / ref.norm()),
    }
    if args.profile or args.layers:
        out["layers"] = e.layers()
    if args.trace:
        out["trace"] = trace(e, y)
    return out


def trace(e, y) -> dict:
    """The kernels of 20 graph replays as the GPU ran them (CUPTI through torch.profiler, a fill
    kernel before each execute marks the steps; bench/llm.py's summarize_trace): per step, the
    span, the idle time, and each kernel name's count and time; the first step's kernels in
    order."""
    import torch
    from llm import summarize_trace
    from torch.profiler import ProfilerActivity, profile

    mark = torch.empty(1, dtype=torch.float32, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(20):
            mark.fill_(float(i))
            e.execute()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(Path(f.name).read_text())["traceEvents"]
    summary, first = summarize_trace(events)
    summary["first"] = first
    return summary


def run_child(argv: list[str], env: dict, timeout: float) -> dict:
    p = subprocess.run(
        [sys.executable, __file__, *argv], env=env, capture_output=True, text=True, timeout=timeout
    )
    for line in p.stdout.splitlines():
        if line.startswith("@@"):
            return json.loads(line[2:])
    return {"error": (p.stdout + p.stderr)[-2000:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench-dir", default=".dev/bench")
    ap.add_argument("--models", required=False)
    ap.add_argument("--variants", required=False)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/kiln_ab"))
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--layers", action="store_true")
    ap.add_argument("--trace", action="store_true", help="kernel times of graph replays (CUPTI)")
    ap.add_argument("--model")
    ap.add_argument("--engines")
    ap.add_argument("--ref")
    ap.add_argument("--numel", type=int)
    ap.add_argument("--opt", action="append")
    args = ap.parse_args()
    if args.child:
        print("@@" + json.dumps(child(args), default=str))
        return 0
    if not args.models or not args.variants:
        ap.error("--models and --variants are needed")
    variants = parse_variants(args.variants)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kiln_ab_"))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    res: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "models": {}}
    res["variants"] = [{"name": n, "plugin": p, "options": o} for n, p, o in variants]
    numel = {}

    def rebuild(m: str) -> None:
        """The model's engines rebuilt from its recording (numel[m] set), or a message."""
        argv = [str(HERE / "startup_device.py"), "--child", "rebuild", "--model", m]
        argv += ["--engines", str(work / f"{m}.pkl"), "--bench-dir", args.bench_dir]
        argv += ["--ref", str(work / f"{m}.ref.pt")]
        p = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True)
        try:
            numel[m] = json.loads(p.stdout.strip().splitlines()[-1])["numel"]
        except (ValueError, IndexError, KeyError):
            print(f"{m}: rebuild failed: {(p.stdout + p.stderr)[-800:]}", flush=True)
            return
        res["models"][m] = {"rounds": []}

    def argv_of(m: str, opts, *extra: str) -> list[str]:
        a = ["--child", "--model", m, "--engines", str(work / f"{m}.pkl")]
        a += ["--ref", str(work / f"{m}.ref.pt"), "--numel", str(numel[m]), "--iters"]
        a += [str(args.iters), *extra]
        for k, v in opts:
            a += ["--opt", f"{k}={v}"]
        return a

    # Each model rebuilt just before its first round: a run cut short (a device call's time
    # limit) keeps in ab.json every model it reached.
    for r in range(args.rounds):
        for m in args.models.split(","):
            if r == 0:
                rebuild(m)
            if m not in numel:
                continue
            row = {}
            for name, plugin, opts in round_order(variants, r):
                extra = ["--layers"] if r == 0 else []
                extra += ["--trace"] if args.trace and r == 0 else []
                got = run_child(argv_of(m, opts, *extra), dict(env, KILN_CUDA_PLUGIN=plugin), 240)
                row[name] = got
                shown = {k: v for k, v in got.items() if k != "layers"}
                print(f"{m} round {r} {name}: {shown}", flush=True)
            res["models"][m]["rounds"].append(row)
            (out / "ab.json").write_text(json.dumps(res, indent=1, default=str))
    for m, d in res["models"].items():
        first = d["rounds"][0] if d["rounds"] else {}
        base = variants[0][0]
        for name, _, _ in variants[1:]:
            if "layers" in first.get(base, {}) and "layers" in first.get(name, {}):
                diffs = layer_diffs(first[base]["layers"], first[name]["layers"])
                d.setdefault("decision_diffs", {})[name] = diffs
                print(f"{m}: {len(diffs)} layer decisions differ between {base} and {name}")
        if args.profile:
            d["profile"] = {
                name: run_child(
                    argv_of(m, opts, "--profile"), dict(env, KILN_CUDA_PLUGIN=plugin), 240
                )
                for name, plugin, opts in variants
            }
    (out / "ab.json").write_text(json.dumps(res, indent=1, default=str))
    print(table(res, [n for n, _, _ in variants]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
