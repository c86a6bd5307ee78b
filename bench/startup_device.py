"""Start-up on the H200: how long a fresh process takes from a loaded program to its first answer,
and how much device memory the engine holds (docs/benchmarks.md, "Start-up").

    python3 bench/startup_device.py --bench-dir .dev/bench --out $OUT [--models bert_b1,...]

It expects ``--bench-dir`` as ``bench/export_here.py`` leaves it (the recordings, ``lib/``) and
``KILN_LIBRARY`` / ``KILN_CUDA_PLUGIN`` set as ``bench/run_device.sh`` sets them. Per model the
parent rebuilds the engine(s) from the recording (weights regenerated here) once, then measures
each case in a fresh process (nothing loaded, nothing cached in memory):

- ``kiln`` cases, each after CUDA is initialised (``torch.cuda.init`` and one allocation, so that
  the driver's context creation is not counted against any system), through libkiln's C API:
  ``load`` (``kiln_engine_load``: validation, the weights to the device, the plugin's first load
  included), ``context`` (``kiln_context_new``: planning, with ``cuda.tune`` the timing), ``first``
  (bind, first execute, synchronized), ``steady`` (median of 50 executes), and device memory in
  use (``cudaMemGetInfo`` deltas) after the context and after the first execute, beside the
  engine's weight and arena bytes. Cases: ``notune`` (``cuda.tune`` = false, ``tuning_cache`` =
  off), ``nocache`` (``tuning_cache`` = off: every start tunes), ``cold`` (an empty cache
  directory: tunes and writes the cache) and ``warm`` (the same directory again).
- ``torch`` cases, the same fresh-process rule: the fp16 model to the device, then the first
  eager call, the capture of a CUDA graph and its first replay, and (``--compile-models``) the
  first call of ``torch.compile(mode="reduce-overhead")``.

Writes ``startup.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

KILN_CASES = ("notune", "nocache", "cold", "warm")


def _sync(torch):
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _mem_used(torch) -> int:
    free, total = torch.cuda.mem_get_info()
    return total - free


# --- child: one measurement in a fresh process


def child_kiln(args) -> dict:
    t_import = time.perf_counter()
    import kiln_capi as C
    import models as M
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")
    _sync(torch)
    lib = C.load()
    lib.kiln_set_option_string.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.kiln_last_error.restype = ctypes.c_char_p
    ignored = []
    lib.kiln_set_option_bool.argtypes = [ctypes.c_char_p, ctypes.c_int]
    for name, value in json.loads(args.options).items():
        if isinstance(value, bool):
            st = lib.kiln_set_option_bool(name.encode(), int(value))
        else:
            st = lib.kiln_set_option_string(name.encode(), str(value).encode())
        if st != 0:
            msg = lib.kiln_last_error().decode()
            if "unknown" not in msg:
                raise RuntimeError(f"option {name}={value}: {msg}")
            ignored.append(name)  # a libkiln without it (an A/B against an older build)
    # every log line with its time: where the start-up goes (the longest gaps are reported)
    log: list[tuple[float, str]] = []
    log_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)(
        lambda _ud, _lvl, msg: log.append((time.perf_counter(), msg.decode(errors="replace")))
    )
    lib.kiln_log_set.argtypes = [log_fn.__class__, ctypes.c_void_p, ctypes.c_int]
    lib.kiln_log_set(log_fn, None, 1 if args.log else 2)  # INFO, or WARN
    with open(args.engines, "rb") as f:
        engines = pickle.load(f)
    cfg = M.CONFIG_BY_NAME[args.model]
    x = [(t.half() if t.is_floating_point() else t).cuda().contiguous() for t in M.make_inputs(cfg)]
    _sync(torch)
    mem0 = _mem_used(torch)
    t_load = t_ctx = 0.0
    t_start = time.perf_counter()
    engs = []
    for eng_bytes, weights in engines:
        e = C.Engine(eng_bytes, dict(weights), device="cuda:0", use_cuda_graphs=True)
        t_load += e.t_load
        t_ctx += e.t_ctx
        engs.append(e)
    mem_ctx = _mem_used(torch)
    if len(engs) != 1:
        raise RuntimeError(f"{args.model}: {len(engs)} engines (this script runs one)")
    eng = engs[0]
    y = torch.empty(args.out_numel, dtype=torch.float16, device="cuda")
    t0 = time.perf_counter()
    eng.bind([(t.data_ptr(), list(t.shape)) for t in x], [(y.data_ptr(), y.numel() * 2)], None)
    eng.execute()
    t_first = time.perf_counter() - t0
    mem_first = _mem_used(torch)
    ref = torch.load(args.ref).flatten().float()
    got = y.float().cpu()
    rel_err = float((got - ref).norm() / ref.norm())
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        eng.execute()
        times.append(time.perf_counter() - t0)
    gaps = []
    prev = t_start
    for t, msg in log:
        gaps.append((t - prev, msg))
        prev = t
    gaps.sort(key=lambda g: -g[0])
    return {
        "ignored_options": ignored,
        "slowest_log_gaps": [[round(g * 1e3, 2), m[:200]] for g, m in gaps[:12]],
        "n_log_lines": len(log),
        "rel_err": rel_err,
        "load_ms": t_load * 1e3,
        "context_ms": t_ctx * 1e3,
        "first_ms": t_first * 1e3,
        "steady_ms": statistics.median(times) * 1e3,
        "second_ms": times[0] * 1e3,
        "weight_bytes": eng.weight_nbytes,
        "arena_bytes": eng.arena_nbytes,
        "mem_after_context": mem_ctx - mem0,
        "mem_after_first": mem_first - mem0,
        "process_s": time.perf_counter() - t_import,
    }


def child_torch(args) -> dict:
    import models as M
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")
    _sync(torch)
    cfg = M.CONFIG_BY_NAME[args.model]
    m = M.build_model(cfg.family).half().eval()
    x = [(t.half() if t.is_floating_point() else t).cuda() for t in M.make_inputs(cfg)]
    out = {}
    t0 = time.perf_counter()
    m = m.cuda()
    _sync(torch)
    out["to_device_ms"] = (time.perf_counter() - t0) * 1e3
    with torch.no_grad():
        t0 = time.perf_counter()
        m(*x)
        _sync(torch)
        out["eager_first_ms"] = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                m(*x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            m(*x)
        g.replay()
        _sync(torch)
        out["graph_first_ms"] = (time.perf_counter() - t0) * 1e3
        times = []
        for _ in range(50):
            t0 = time.perf_counter()
            g.replay()
            _sync(torch)
            times.append(time.perf_counter() - t0)
        out["graph_steady_ms"] = statistics.median(times) * 1e3
        if args.compile:
            t0 = time.perf_counter()
            cm = torch.compile(m, mode="reduce-overhead")
            cm(*x)
            _sync(torch)
            out["compile_first_ms"] = (time.perf_counter() - t0) * 1e3
    return out


# --- parent


def rebuild(cfg_name: str, bench_dir: Path, manifest: dict, path: Path, ref_path: Path) -> int:
    import kiln_record as R
    import models as M

    cfg = M.CONFIG_BY_NAME[cfg_name]
    entry = manifest["models"][cfg_name]
    m16 = copy.deepcopy(M.build_model(cfg.family)).half()
    doc = R.load_recording(bench_dir / entry["files"]["graph"])
    results = R.replay(doc, R.named_tensors(m16, M.canonical_names(cfg.family)), verify=True)
    with open(path, "wb") as f:
        pickle.dump(results, f)
    import torch

    with torch.no_grad():
        y = m16.float()(*M.make_inputs(cfg))
    y = y[0] if isinstance(y, (tuple, list)) else y
    torch.save(y.flatten(), ref_path)
    return y.numel()


def run_child(argv: list[str], env: dict, timeout: float) -> dict:
    p = subprocess.run(
        [sys.executable, "-X", "faulthandler", __file__, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout)[-2000:]}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "no result: " + (p.stderr or p.stdout)[-2000:]}


def summary(r: dict) -> str:
    """One line of a case's numbers (the log's gaps stay in startup.json)."""
    if "error" in r:
        return "ERROR " + r["error"][-600:].replace("\n", " | ")
    return ", ".join(
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
        for k, v in r.items()
        if k not in ("slowest_log_gaps", "ignored_options")
    )


def fmt(v, unit="") -> str:
    if v is None:
        return "-"
    return f"{v:.1f}{unit}" if v < 100 else f"{v:.0f}{unit}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench-dir", default=".dev/bench")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/kiln_startup"))
    ap.add_argument("--models", default="all")
    ap.add_argument("--cases", default=",".join(KILN_CASES))
    ap.add_argument(
        "--compile-models", default="", help="models whose torch.compile start is timed"
    )
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--torch-models", default="", help="only these models' torch cases")
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--child", choices=("kiln", "torch", "rebuild"))
    ap.add_argument("--model")
    ap.add_argument("--engines")
    ap.add_argument("--options", default="{}")
    ap.add_argument("--out-numel", type=int, default=0)
    ap.add_argument("--ref", help="the fp32 reference output (torch.save)")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--log", action="store_true", help="Kiln's INFO log timed (slowest gaps)")
    ap.add_argument("--extra-options", default="{}", help="options (JSON) added to every case's")
    args = ap.parse_args()
    if args.child == "rebuild":
        bench_dir = Path(args.bench_dir)
        manifest = json.loads((bench_dir / "manifest.json").read_text())
        numel = rebuild(args.model, bench_dir, manifest, Path(args.engines), Path(args.ref))
        print(json.dumps({"numel": numel}))
        return 0
    if args.child:
        res = child_kiln(args) if args.child == "kiln" else child_torch(args)
        print(json.dumps(res))
        return 0

    bench_dir = Path(args.bench_dir)
    manifest = json.loads((bench_dir / "manifest.json").read_text())
    names = list(manifest["models"]) if args.models == "all" else args.models.split(",")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kiln_startup_"))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    results: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "models": {}}
    cases = [c for c in args.cases.split(",") if c]
    for name in names:
        r: dict = {}
        results["models"][name] = r
        eng_path = work / f"{name}.engines.pkl"
        # the rebuild in its own process too: whatever it loads or leaves does not reach the rest
        print(f"{name}: rebuilding the engine", flush=True)
        argv = ["--child", "rebuild", "--model", name, "--engines", str(eng_path)]
        argv += ["--bench-dir", str(bench_dir), "--ref", str(work / f"{name}.ref.pt")]
        got = run_child(argv, env, args.timeout)
        if "error" in got:
            r["error"] = "rebuild: " + got["error"]
            print(f"{name}: rebuild failed: {got['error'][-800:]}", flush=True)
            continue
        numel = got["numel"]
        cache_dir = work / f"{name}.cache"
        for case in cases:
            opts = {"tuning_cache": "off", **json.loads(args.extra_options)}
            if case == "notune":
                opts["cuda.tune"] = False
            elif case in ("cold", "warm"):
                opts["tuning_cache"] = str(cache_dir / "tuning.kilncache")
            base = ["--child", "kiln", "--model", name, "--engines", str(eng_path)]
            argv = [*base, "--options", json.dumps(opts), "--out-numel", str(numel)]
            argv += ["--ref", str(work / f"{name}.ref.pt")]
            if args.log:
                argv.append("--log")
            r[case] = run_child(argv, env, args.timeout)
            print(f"{name} {case}: {summary(r[case])}", flush=True)
        if not args.no_torch and (not args.torch_models or name in args.torch_models.split(",")):
            argv = ["--child", "torch", "--model", name]
            if name in args.compile_models.split(","):
                argv.append("--compile")
            r["torch"] = run_child(argv, env, args.timeout * 2)
            print(f"{name} torch: {summary(r['torch'])}", flush=True)
        (out_dir / "startup.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    return 0


def table(results: dict) -> str:
    head = (
        "| model | load ms | context ms: no tune / tuned, no cache / cold / warm | first ms (warm) "
        "| steady ms | memory after first / weights + arena | torch: eager first / graph first "
        "/ compile first ms |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    for name, r in results["models"].items():
        w = r.get("warm") or r.get("nocache") or {}
        ctx = " / ".join(fmt((r.get(c) or {}).get("context_ms")) for c in KILN_CASES)
        mem = "-"
        if "mem_after_first" in w:
            planned = w["weight_bytes"] + w["arena_bytes"]
            mem = f"{w['mem_after_first'] / 2**20:.0f} / {planned / 2**20:.0f} MiB"
        t = r.get("torch") or {}
        torch_s = " / ".join(
            fmt(t.get(k)) for k in ("eager_first_ms", "graph_first_ms", "compile_first_ms")
        )
        lines.append(
            f"| {name} | {fmt(w.get('load_ms'))} | {ctx} | {fmt(w.get('first_ms'))} | "
            f"{fmt(w.get('steady_ms'))} | {mem} | {torch_s} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
