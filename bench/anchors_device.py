"""The H200 side of Kiln's benchmark: PyTorch anchors and Kiln through its C API, side by side in
one process, on the same weights, inputs and device tensors (docs/benchmarks.md; method from
shared/reference/gpu-performance.md §5).

    python3 bench/anchors_device.py --out $OUT [--models all]
        [--systems eager,graph,compile,kiln | eager,graph,compile,autotune,kiln]
        [--bench-dir .dev/bench] [--workdir /tmp/kiln_bench] [--budget-s 380] [--rounds 5]
        [--calls 40] [--warmup 20] [--no-compile | --compile-models NAMES] [--dry-run]

Per config (bench/models.py), fp16, CNNs channels-last for the PyTorch systems:

- weights and inputs are regenerated from bench/models.py and their checksums compared with the
  ones recorded at export (``<bench-dir>/manifest.json``);
- reference: the same model in float64 on the GPU; every system's output must be within the
  family's relative-error bound (||y - ref|| / ||ref||) or its timings are flagged and it cannot
  be the best anchor;
- systems: ``eager``; ``graph`` (eager captured in a manual torch.cuda.CUDAGraph);
  ``compile`` (torch.compile mode="reduce-overhead"; inductor freezing for CNNs; compile time
  reported separately, skipped when the time budget would not allow it); ``autotune`` (asked
  for in ``--systems``: torch.compile mode="max-autotune", which times Triton templates for
  the GEMMs and convolutions and replays CUDA graphs, on a copy of the model, under the same
  rules; its compile takes several times reduce-overhead's); ``kiln`` (the engine
  rebuilt from the recorded graph with bench/kiln_record.py, loaded on cuda:0 through libkiln's
  C API with CUDA graphs on, bound once to the same device input values, on its own stream);
- synchronous latency: CUDA event, call, event, synchronize; ``--rounds`` interleaved rounds
  (system order rotated per round) of ``--calls`` timed calls after ``--warmup`` warm-up calls
  (compile: 3 more); median, p10, p90 over all calls, and the median per round;
- pipelined GPU time: 20 back-to-back calls between two events, 7 repetitions, median;
- ratio: per round, Kiln's median over the best anchor's median (the anchor with the lowest
  overall median among those that passed the check); the median of those ratios is reported;
- ``nvidia-smi`` clocks, power and temperature before, after each config and at the end.

For the ExecuTorch path (kiln_runner, run afterwards by bench/run_device.sh) it writes into
``--workdir``: ``<cfg>.ptd`` (rebuilt from the skeleton; sha256 checked), ``<cfg>.inputs.bin``,
``<cfg>.expected.bin`` (kiln_tensors format) and ``<cfg>.ref.pt`` (the float64 reference).

Results: ``<out>/anchors.json`` (rewritten after every config) and a table on stdout.
``--dry-run`` runs here without a GPU: eager fp32 and Kiln on its CPU backend, a few calls,
host timers; it exercises everything except CUDA graphs and torch.compile.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "examples" / "cpp"))  # kiln_tensors: kiln_runner's file format

import models as M  # noqa: E402
import torch  # noqa: E402

# Order of work: where torch.compile is the best anchor (gpu-performance.md §1.4: ResNet-50,
# BERT b8) first, so that a tight budget drops the compiles that matter least (where the manual
# CUDA graph wins by far).
WORK_ORDER = ["resnet50", "bert", "vit_b16", "encoder", "mlp"]
# Rough torch.compile(reduce-overhead) times on the H200 box (seconds, for the budget only;
# anchors.json records the measured ones: update these from it).
COMPILE_EST_S = {"mlp": 15, "encoder": 25, "bert": 50, "vit_b16": 50, "resnet50": 100}
# The zoo's, from the H200 runs of 2026-12-03 (compile build_s in anchors.json, x1.3, rounded up;
# resnet26d, vit_b_16, maxvit_t and deit_small were not compiled there: guesses from their kin).
COMPILE_EST_S.update(
    {
        "zoo_" + k: v
        for k, v in {
            "efficientnet_b0": 38,
            "resnet50": 15,
            "mobilenet_v2": 18,
            "mobilevitv2_050": 36,
            "wav2vec2": 22,
            "mobilenet_v3": 22,
            "convnext_tiny": 17,
            "swin_t": 40,
            "regnet_y_400mf": 26,
            "densenet121": 65,
            "lraspp_mobilenet_v3": 21,
            "resnet50_fpn": 16,
            "bert": 20,
            "gpt2": 11,
            "llama8": 13,
            "whisper_encoder": 9,
            "hf_vit": 14,
            "clip_vision": 13,
            "roberta": 10,
            "distilbert": 6,
            "qwen2": 33,
            "mistral4": 10,
            "gemma_l3": 10,
            "resnet26d": 15,
            "vit_b_16": 20,
            "maxvit_t": 45,
            "deit_small": 15,
            # not compiled on the H200 yet: guesses from their kin
            "dinov2_small": 15,
            "swinv2_tiny": 40,
            "convnextv2_tiny": 17,
            "segformer_b0": 25,
            "gpt_neox": 11,
            "opt": 11,
            "beit_base": 20,
            "levit_128s": 25,
            "albert": 10,
            "electra": 10,
            "mpnet": 10,
            "falcon_rw8": 13,
            "stablelm4": 13,
        }.items()
    }
)
# The held-out models (bench/heldout.py), not compiled on the H200 yet: guesses from their kin.
COMPILE_EST_S.update({f"ho_{n}": 30 if n in M.CNN_HELDOUT else 20 for n in M.HELDOUT_BENCH})
# Everything but the compile, per config (model build, reference, capture, Kiln rebuild, timing).
OTHER_EST_S = {"mlp": 6, "encoder": 6, "bert": 15, "vit_b16": 15, "resnet50": 12}
ANCHORS = ("eager", "graph", "compile", "autotune")
# max-autotune's compile against reduce-overhead's, for the budget only (a guess until the H200
# runs record build_s for it in anchors.json).
AUTOTUNE_EST_FACTOR = 8
COMPILE_MODES = {"compile": "reduce-overhead", "autotune": "max-autotune"}
RUNNER_TOLERANCE = 5e-2  # kiln_runner's elementwise check: |y - e| <= t + t |e|


def log(msg: str) -> None:
    print(msg, flush=True)


# --- environment


def smi() -> dict | None:
    """nvidia-smi's SM and memory clocks (MHz), power (W), temperature (C); None if absent."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    q = "clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu"
    try:
        out = (
            subprocess.run(
                [exe, f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            .stdout.strip()
            .splitlines()[0]
        )
        vals = [v.strip() for v in out.split(",")]
        keys = ["sm_mhz", "mem_mhz", "power_w", "temp_c", "util_pct"]
        return {k: _num(v) for k, v in zip(keys, vals, strict=False)}
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)}


def _num(v: str):
    try:
        return float(v)
    except ValueError:
        return v


def environment(args) -> dict:
    env = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "args": vars(args),
        "dry_run": args.dry_run,
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(
            gpu=p.name,
            sm_count=p.multi_processor_count,
            cudnn=torch.backends.cudnn.version(),
        )
    env["libraries"] = M.library_versions()
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        pass
    return env


# --- timing


class Timer:
    """Synchronous latency of one call: CUDA events on the current stream (or a host clock in a
    dry run)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        if cuda:
            self.a = torch.cuda.Event(enable_timing=True)
            self.b = torch.cuda.Event(enable_timing=True)

    def sync_ms(self, fn) -> float:
        if self.cuda:
            self.a.record()
            fn()
            self.b.record()
            self.b.synchronize()
            return self.a.elapsed_time(self.b)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def pipelined_ms(self, fn, n: int) -> float:
        if self.cuda:
            self.a.record()
            for _ in range(n):
                fn()
            self.b.record()
            self.b.synchronize()
            return self.a.elapsed_time(self.b) / n
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) * 1e3 / n


def quantile(xs, q: float) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(xs) -> float:
    return quantile(xs, 0.5)


# --- systems


class System:
    def __init__(self, name: str, run, build_s: float = 0.0, note: str = ""):
        self.name = name
        self.run = run  # () -> output tensor
        self.build_s = build_s
        self.note = note
        self.rel_err = math.nan
        self.ok = False
        self.samples: list[float] = []
        self.round_medians: list[float] = []
        self.pipelined: list[float] = []
        self.error = ""
        self.poison = None  # () -> None: fills the output with NaN (systems with a bound output)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    y = y.detach().to(ref.device, torch.float64)
    if y.shape != ref.shape:
        return math.inf
    if not torch.isfinite(y).all():
        return math.inf
    return float((y - ref).norm() / ref.norm())


def make_graph_system(model, x: list) -> System:
    t0 = time.perf_counter()
    stream = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        for _ in range(3):
            model(*x)
    stream.wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = model(*x)
    torch.cuda.synchronize()

    def run():
        g.replay()
        return out

    s = System("graph", run, time.perf_counter() - t0)
    s._keep = (g, out)
    return s


def make_compile_system(model, x: list, cnn: bool, name: str = "compile") -> System:
    import torch._inductor.config as icfg

    mode = COMPILE_MODES[name]
    if name != "compile":  # its own module: dynamo's cache entries guard on the module
        model = copy.deepcopy(model)
    icfg.freezing = bool(cnn)
    t0 = time.perf_counter()
    cm = torch.compile(model, mode=mode, fullgraph=True, dynamic=False)
    cm(*x)  # compile (and the cudagraph tree's first warm-up)
    torch.cuda.synchronize()
    build = time.perf_counter() - t0
    for _ in range(3):  # cudagraph trees record on a later call
        cm(*x)
    torch.cuda.synchronize()
    s = System(name, lambda: cm(*x), build, mode + (", freezing" if cnn else ""))
    s._keep = (cm, model)
    return s


def make_kiln_system(
    engine_bytes, weights, x_list, out_shape, dev: torch.device, out_dtype=torch.float16
) -> System:
    import kiln_capi as C

    t0 = time.perf_counter()
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize()  # the inputs were written on torch's stream
    eng = C.Engine(
        engine_bytes, dict(weights), device="cuda:0" if cuda else "cpu", use_cuda_graphs=cuda
    )
    ins = [t.contiguous() for t in x_list]
    y = torch.full(out_shape, float("nan"), dtype=out_dtype, device=dev)  # poisoned
    eng.bind(
        [(t.data_ptr(), list(t.shape)) for t in ins],
        [(y.data_ptr(), y.numel() * y.element_size())],
        None,  # Kiln's own (non-blocking) stream: graphs are not used on the legacy stream
    )
    eng.execute()  # first execute: warm-up (cuBLASLt set-up), no graph yet
    if cuda:
        torch.cuda.synchronize()

    def run():
        eng.execute()
        return y

    s = System(
        "kiln",
        run,
        time.perf_counter() - t0,
        f"C API via ctypes, {eng.device}, arena {eng.arena_nbytes / 2**20:.1f} MiB",
    )
    s._keep = (eng, ins, y)

    def poison():
        y.fill_(float("nan"))
        if cuda:
            torch.cuda.synchronize()  # Kiln writes y on its own stream

    s.poison = poison
    return s


# --- per config


def load_manifest(bench_dir: Path) -> dict:
    p = bench_dir / "manifest.json"
    return json.loads(p.read_text()) if p.exists() else {}


def kiln_rebuild(cfg, entry: dict, bench_dir: Path, model16_cpu, workdir: Path) -> tuple:
    """Rebuilds the engine(s) from the recording; writes the .ptd for kiln_runner."""
    import hashlib

    import kiln_record as R

    t0 = time.perf_counter()
    doc = R.load_recording(bench_dir / entry["files"]["graph"])
    rename = M.canonical_names(cfg.family)
    results = R.replay(doc, R.named_tensors(model16_cpu, rename), verify=True)
    weights = {k: d for _, ws in results for k, d in ws}
    skel = (bench_dir / entry["files"]["ptd_skeleton"]).read_bytes()
    ptd = R.fill_skeleton(skel, entry["ptd"]["nbytes"], entry["ptd"]["layout"], weights)
    if hashlib.sha256(ptd).hexdigest() != entry["ptd"]["sha256"]:
        raise RuntimeError(f"{cfg.name}: the rebuilt .ptd differs from the exported one")
    (workdir / entry["ptd"]["name"]).write_bytes(ptd)
    return results, time.perf_counter() - t0


def write_runner_io(cfg, x16_cpu, ref, workdir: Path, out_dtype=torch.float16) -> None:
    import kiln_tensors

    kiln_tensors.write(workdir / f"{cfg.name}.inputs.bin", [t.cpu() for t in x16_cpu])
    kiln_tensors.write(workdir / f"{cfg.name}.expected.bin", [ref.to("cpu", out_dtype)])
    torch.save(ref.cpu(), workdir / f"{cfg.name}.ref.pt")


def run_config(cfg, fam_state: dict, args, manifest: dict, workdir: Path, t_start: float) -> dict:
    fam = cfg.fam
    dry = args.dry_run
    dev = torch.device("cpu" if dry else "cuda")
    res: dict = {"model": cfg.name, "family": cfg.family, "batch": cfg.batch}
    res["counts"] = M.counts(cfg, fam_state["m32"])
    entry = manifest.get("models", {}).get(cfg.name)

    x32 = M.make_inputs(cfg)
    x16 = [t.half() if t.is_floating_point() else t for t in x32]
    res["checks"] = {
        "state_checksum_fp16": fam_state["cksum16"],
        "input_checksum_fp16": M.tensors_checksum(x16),
    }
    if entry:
        res["checks"]["weights_match_export"] = entry["state_checksum_fp16"] == fam_state["cksum16"]
        res["checks"]["inputs_match_export"] = (
            entry["input_checksum_fp16"] == res["checks"]["input_checksum_fp16"]
        )

    # fp64 reference
    t0 = time.perf_counter()
    bench_mode = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False  # no autotuning of float64 convolutions
    with torch.no_grad():
        m64 = fam_state["m64"]
        ref = m64(*[t.to(dev, torch.float64) if t.is_floating_point() else t.to(dev) for t in x32])
    torch.backends.cudnn.benchmark = bench_mode
    res["reference_s"] = round(time.perf_counter() - t0, 2)

    systems: list[System] = []
    want = set(args.systems.split(","))

    # inputs on the device: channels-last for the PyTorch CNN systems, contiguous for Kiln
    xd = [t.to(dev) for t in (x32 if dry else x16)]
    x_pt = list(xd)
    if fam.cnn and not dry:
        x_pt[0] = x_pt[0].contiguous(memory_format=torch.channels_last)
    model = fam_state["m_pt"]
    # the output's dtype as the fp16 model gives it (float16, or float32 where the model casts
    # up: Mamba's residual stream): the exported program's
    out_dtype = torch.float16
    if not dry:
        with torch.no_grad():
            y0 = model(*x_pt)
        if isinstance(y0, torch.Tensor) and y0.is_floating_point():
            out_dtype = y0.dtype

    def add(name, factory):
        if name not in want:
            return
        try:
            s = factory()
            systems.append(s)
        except Exception as e:  # noqa: BLE001
            s = System(name, None)
            s.error = f"{type(e).__name__}: {e}"
            systems.append(s)
            log(f"  {cfg.name}: {name} failed to build: {s.error}")
            if args.verbose:
                traceback.print_exc()

    # PyTorch systems run on torch's current (default) stream, as a user calls them; Kiln on its
    # own stream, synchronized inside execute. Events on the current stream around a call give
    # its synchronous latency either way.
    with torch.no_grad():
        add("eager", lambda: System("eager", lambda: model(*x_pt)))
        if not dry:
            add("graph", lambda: make_graph_system(model, x_pt))
            for name in COMPILE_MODES:
                compile_ok, why = compile_allowed(cfg, args, t_start, name)
                if name in want and not compile_ok:
                    s = System(name, None)
                    s.error = f"skipped: {why}"
                    systems.append(s)
                    log(f"  {cfg.name}: {name} skipped ({why})")
                elif compile_ok:
                    add(name, lambda n=name: make_compile_system(model, x_pt, fam.cnn, n))
        if "kiln" in want or args.runner_io:
            if entry is None:
                if "kiln" in want:
                    s = System("kiln", None)
                    s.error = "no export in the manifest"
                    systems.append(s)
            else:
                try:
                    results, rb = kiln_rebuild(
                        cfg, entry, Path(args.bench_dir), fam_state["m16_cpu"], workdir
                    )
                    res["kiln_rebuild_s"] = round(rb, 2)
                    write_runner_io(cfg, x16, ref, workdir, out_dtype)
                    if "kiln" in want:
                        if not entry.get("capi_ok"):
                            s = System("kiln", None)
                            s.error = "several partitions or ops outside Kiln: C API path skipped"
                            systems.append(s)
                        else:
                            ((eng, w),) = results
                            add(
                                "kiln",
                                lambda: make_kiln_system(
                                    eng,
                                    w,
                                    [t.to(dev) for t in x16],
                                    tuple(ref.shape),
                                    dev,
                                    out_dtype,
                                ),
                            )
                except Exception as e:  # noqa: BLE001
                    s = System("kiln", None)
                    s.error = f"rebuild failed: {type(e).__name__}: {e}"
                    why = M.library_mismatch(manifest.get("libraries"), M.library_versions())
                    if why:
                        s.error += f" ({why})"
                    systems.append(s)
                    log(f"  {cfg.name}: {s.error}")
                    if args.verbose:
                        traceback.print_exc()

        live = [s for s in systems if s.run is not None]
        # correctness first
        for s in live:
            try:
                # Kiln: twice on a poisoned output (the call that records its CUDA graph, then
                # a replay): every element must be written, and right.
                errs = []
                for _ in range(2 if s.poison else 1):
                    if s.poison:
                        s.poison()
                    y = s.run()
                    if not dry:
                        torch.cuda.synchronize()
                    errs.append(rel_err(y, ref))
                s.rel_err = max(errs)
                s.ok = s.rel_err <= fam.tol
            except Exception as e:  # noqa: BLE001
                s.error = f"{type(e).__name__}: {e}"
                s.run = None
        live = [s for s in live if s.run is not None]

        timer = Timer(cuda=not dry)
        for s in live:  # warm-up, and an estimate of one call to bound slow systems' time
            t0 = time.perf_counter()
            for _ in range(args.warmup):
                s.run()
            if not dry:
                torch.cuda.synchronize()
            est_ms = max(1e-3, (time.perf_counter() - t0) * 1e3 / max(1, args.warmup))
            s.calls = max(5, min(args.calls, int(args.max_system_s * 1e3 / (args.rounds * est_ms))))
            s.pipe_n = max(2, min(args.pipe_n, int(2e3 / (args.pipe_reps * est_ms))))
        for r in range(args.rounds):
            order = live[r % len(live) :] + live[: r % len(live)] if live else []
            for s in order:
                for _ in range(3):
                    s.run()
                xs = [timer.sync_ms(s.run) for _ in range(s.calls)]
                s.samples += xs
                s.round_medians.append(median(xs))
        for s in live:
            s.pipelined = [timer.pipelined_ms(s.run, s.pipe_n) for _ in range(args.pipe_reps)]

    res["systems"] = {}
    for s in systems:
        d = {"ok": s.ok, "rel_err": s.rel_err, "build_s": round(s.build_s, 2), "note": s.note}
        if s.error:
            d["error"] = s.error
        if s.samples:
            d.update(
                median_ms=median(s.samples),
                p10_ms=quantile(s.samples, 0.1),
                p90_ms=quantile(s.samples, 0.9),
                min_ms=min(s.samples),
                n=len(s.samples),
                round_medians_ms=s.round_medians,
                calls_per_round=s.calls,
                pipelined_ms=median(s.pipelined),
            )
            if cfg.batch >= 8:
                d["items_per_s"] = cfg.batch / (d["median_ms"] / 1e3)
        res["systems"][s.name] = d
    anchors = [s for s in systems if s.name in ANCHORS and s.ok and s.samples]
    if anchors:
        best = min(anchors, key=lambda s: median(s.samples))
        res["best_anchor"] = best.name
        res["best_anchor_ms"] = median(best.samples)
        kiln = next((s for s in systems if s.name == "kiln" and s.samples), None)
        if kiln is not None:
            ratios = [k / b for k, b in zip(kiln.round_medians, best.round_medians, strict=True)]
            res["kiln_ratio"] = {"median": median(ratios), "per_round": ratios, "vs": best.name}
    res["smi_after"] = smi() if not dry else None
    return res


def compile_allowed(cfg, args, t_start: float, name: str = "compile") -> tuple[bool, str]:
    if name not in args.systems.split(","):
        return False, "not asked"
    if args.no_compile:
        return False, "--no-compile"
    if (
        args.compile_models
        and cfg.name not in args.compile_models.split(",")
        and (cfg.family not in args.compile_models.split(","))
    ):
        return False, "not in --compile-models"
    left = args.budget_s - (time.time() - t_start)
    est = COMPILE_EST_S.get(cfg.family, 100) * (AUTOTUNE_EST_FACTOR if name == "autotune" else 1)
    need = est + args._rest_est.get(cfg.name, 0)
    if need > left:
        return False, f"budget: ~{need:.0f} s needed, {left:.0f} s left"
    return True, ""


def family_state(family: str, dry: bool) -> dict:
    dev = torch.device("cpu" if dry else "cuda")
    m32 = M.build_model(family)
    m16_cpu = copy.deepcopy(m32).half()
    st = {"m32": m32, "m16_cpu": m16_cpu, "cksum16": M.state_checksum(m16_cpu, family)}
    st["m64"] = copy.deepcopy(m32).double().to(dev).eval()
    # transformers' grouped_mm experts take no float64: the reference runs batched_mm (the same
    # values) while the PyTorch systems keep the library's default
    for mod in st["m64"].modules():
        if getattr(getattr(mod, "config", None), "_experts_implementation", None) == "grouped_mm":
            mod.set_experts_implementation("batched_mm")
    if dry:
        st["m_pt"] = m32
    else:
        m = copy.deepcopy(m32).half().to(dev).eval()
        if M.family_by_name(family).cnn:
            m = m.to(memory_format=torch.channels_last)
        st["m_pt"] = m
    return st


# --- report


def fmt_ms(d: dict | None) -> str:
    if not d:
        return "-"
    if "median_ms" not in d:
        return "skip" if d.get("error", "").startswith("skipped") else "FAIL"
    v = d["median_ms"]
    s = f"{v * 1e3:.1f}us" if v < 1 else f"{v:.3f}"
    return s if d.get("ok") else s + "!"


def table(results: dict) -> str:
    cols = ["eager", "graph", "compile", "autotune", "kiln"]
    lines = [
        f"{'model':<14} {'floor':>8} "
        + " ".join(f"{c:>9}" for c in cols)
        + f" {'best':>8} {'kiln/best':>9} {'rel err kiln':>12}"
    ]
    for name, r in results.items():
        sy = r.get("systems", {})
        floor = r["counts"]["floor_us"]
        ratio = r.get("kiln_ratio", {}).get("median")
        kerr = sy.get("kiln", {}).get("rel_err")
        lines.append(
            f"{name:<14} {floor:>6.1f}us "
            + " ".join(f"{fmt_ms(sy.get(c)):>9}" for c in cols)
            + f" {r.get('best_anchor', '-'):>8} "
            + (f"{ratio:>9.2f}" if ratio is not None else f"{'-':>9}")
            + (f" {kerr:>12.2e}" if kerr is not None and not math.isnan(kerr) else f" {'-':>12}")
        )
    lines.append("ms unless marked; '!' = failed the accuracy check; kiln = C API in this process")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="all")
    ap.add_argument("--systems", default="eager,graph,compile,kiln")
    ap.add_argument("--bench-dir", default=str(ROOT / ".dev" / "bench"))
    ap.add_argument("--workdir", default="/tmp/kiln_bench")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument(
        "--budget-s",
        type=float,
        default=380.0,
        help="wall-clock budget; compiles that would overrun it are skipped",
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=40, help="timed calls per system per round")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument(
        "--max-system-s",
        type=float,
        default=6.0,
        help="cap on one system's timed calls per config (slow systems get fewer, >= 5 per round)",
    )
    ap.add_argument("--pipe-n", type=int, default=20)
    ap.add_argument("--pipe-reps", type=int, default=7)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--compile-models", default="", help="compile only these configs/families")
    ap.add_argument(
        "--no-runner-io",
        dest="runner_io",
        action="store_false",
        help="do not write the .ptd and tensor files for kiln_runner",
    )
    ap.add_argument("--dry-run", action="store_true", help="no GPU: CPU code paths only")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)

    t_start = time.time()
    if args.dry_run:
        args.systems = ",".join(s for s in args.systems.split(",") if s in ("eager", "kiln"))
        if args.models == "all":
            args.models = "mlp_b1,encoder_b1"
        args.rounds, args.calls, args.warmup = min(args.rounds, 2), min(args.calls, 3), 1
        args.pipe_n, args.pipe_reps = 2, 2
    elif not torch.cuda.is_available():
        raise SystemExit("anchors_device: no CUDA device (use --dry-run to test without one)")
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    bench_dir = Path(args.bench_dir)
    manifest = load_manifest(bench_dir)
    if "kiln" in args.systems.split(",") or args.runner_io:
        if manifest:
            lib = os.environ.get("KILN_LIBRARY") or str(bench_dir / "lib" / "libkiln.so")
            os.environ["KILN_LIBRARY"] = lib
        else:
            log(f"anchors_device: no {bench_dir}/manifest.json: Kiln is not run")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    configs = M.select(args.models)
    missing = [c.name for c in configs if manifest and c.name not in manifest.get("models", {})]
    if missing and "kiln" in args.systems.split(","):
        log(
            f"anchors_device: WARNING: {', '.join(missing)} not exported in {bench_dir} "
            f"(it holds {', '.join(sorted(manifest.get('models', {}))) or 'none'}): Kiln fails "
            "them; export them with bench/export_here.py --models, or leave MODELS unset"
        )
    order = WORK_ORDER + list(M.ZOO_FAMILIES) + list(M.HELDOUT_FAMILIES)
    configs.sort(key=lambda c: (order.index(c.family), -c.batch))
    args._rest_est = {}
    acc = 0.0
    for c in reversed(configs):  # time the configs after this one still need (without compile)
        args._rest_est[c.name] = acc
        acc += OTHER_EST_S.get(c.family, 20)

    doc = {"env": environment(args), "smi_before": None if args.dry_run else smi(), "models": {}}
    doc["env"]["args"] = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    if manifest:
        doc["export"] = {
            k: manifest.get(k)
            for k in ("created", "torch", "executorch", "kiln_version", "libkiln_sha256")
        }
    log(
        f"anchors_device: torch {torch.__version__}, {doc['env'].get('gpu', 'no GPU (dry run)')}, "
        f"smi {doc['smi_before']}"
    )
    fam_cache: dict = {}
    for cfg in configs:
        if cfg.family not in fam_cache:
            fam_cache.clear()
            gc.collect()
            if not args.dry_run:
                torch.cuda.empty_cache()
            t0 = time.perf_counter()
            fam_cache[cfg.family] = family_state(cfg.family, args.dry_run)
            log(
                f"{cfg.family}: weights {fam_cache[cfg.family]['cksum16']} "
                f"({time.perf_counter() - t0:.1f} s)"
            )
        t0 = time.perf_counter()
        try:
            r = run_config(cfg, fam_cache[cfg.family], args, manifest, workdir, t_start)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            r = {
                "model": cfg.name,
                "error": f"{type(e).__name__}: {e}",
                "counts": M.counts(cfg, fam_cache[cfg.family]["m32"]),
                "systems": {},
            }
        r["wall_s"] = round(time.perf_counter() - t0, 1)
        doc["models"][cfg.name] = r
        if not args.dry_run:
            torch._dynamo.reset()
            torch.cuda.synchronize()
        sy = r.get("systems", {})
        log(
            f"{cfg.name}: {r['wall_s']} s; "
            + ", ".join(
                f"{k} {fmt_ms(v)} (err {v.get('rel_err', math.nan):.1e}"
                + (f", build {v['build_s']:.0f} s" if v.get("build_s", 0) >= 1 else "")
                + ")"
                for k, v in sy.items()
            )
            + (f"; kiln/best {r['kiln_ratio']['median']:.2f}" if "kiln_ratio" in r else "")
        )
        for k, v in sy.items():
            if v.get("error"):
                log(f"  {k}: {v['error']}")
        doc["total_s"] = round(time.time() - t_start, 1)
        (out / "anchors.json").write_text(json.dumps(doc, indent=1, default=str))
    doc["smi_after"] = None if args.dry_run else smi()
    doc["total_s"] = round(time.time() - t_start, 1)
    (out / "anchors.json").write_text(json.dumps(doc, indent=1, default=str))
    ordered = {
        c.name: doc["models"][c.name] for c in M.select(args.models) if c.name in doc["models"]
    }
    log("")
    log(table(ordered))
    sm = [doc["smi_before"], doc["smi_after"]]
    log(f"nvidia-smi before {sm[0]} after {sm[1]}; total {doc['total_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
