"""The subcommands of ``kiln`` (one function each; docs/cli.md)."""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

from .. import _lib
from . import _capi, _doctor
from ._out import emit_json, size, table, text
from ._program import CliError, Opened, UsageError, open_program

# Tolerances (rtol, atol) for --compare, by the program's Kiln precision.
TOLERANCE = {"fp32": (1e-4, 1e-4), "fp16": (2e-2, 2e-2), "bf16": (8e-2, 8e-2)}
# ExecuTorch's own data movement and bookkeeping kernels around delegates.
_ET_PLUMBING = ("_to_dim_order_copy", "_clone_dim_order", "view_copy", "alloc", "copy_")


def _engine_info(engine: bytes) -> dict:
    try:
        return _capi.describe(engine)
    except _lib.KilnError as e:
        raise CliError(f"not a valid Kiln engine ({type(e).__name__}): {e}") from None


def _why_outside(op: str) -> str:
    """Why an ExecuTorch kernel call of a Kiln program is not in Kiln, as far as the .pte tells
    (the reason per node is only known at export: KilnPartitioner's report)."""
    base = op.split(".")[0]
    if any(p in base for p in _ET_PLUMBING):
        return "ExecuTorch's own copy / memory-format kernel around a delegate"
    try:
        from ..executorch import _lowering
    except Exception:  # noqa: BLE001 - torch/executorch not installed: cannot tell
        return "unknown here (the export side, torch + executorch, is not installed)"
    prefix = base.replace("::", ".") + "."
    if not any(k.startswith(prefix) for k in _lowering.HANDLERS):
        return f"Kiln has no translation for {base}"
    return (
        f"Kiln translates {base}, but not this node (a dtype, shape or argument it does not "
        "take, or a partition of data movement only); the export report, or "
        "logging.getLogger('kiln.executorch') at DEBUG during export, names the reason"
    )


def _layers_summary(desc: dict) -> list[dict]:
    out = []
    for la in desc.get("layers", []):
        if la.get("tail"):
            continue
        o = (la.get("outputs") or [{}])[0]
        out.append(
            {
                "index": la["index"],
                "op": la["op"],
                "fused": la.get("fused", []),
                "inputs": [
                    {
                        "dtype": t.get("dtype"),
                        "dim_min": t.get("dim_min"),
                        "dim_max": t.get("dim_max"),
                    }
                    for t in la.get("inputs", [])
                    if t.get("kind") != "weight"
                ],
                "output": {
                    "dtype": o.get("dtype"),
                    "dim_min": o.get("dim_min"),
                    "dim_max": o.get("dim_max"),
                },
                "weight_nbytes": la.get("weight_nbytes", 0),
                "attrs": la.get("attrs", {}),
            }
        )
    return out


def _states(desc: dict) -> list[dict]:
    """The engine's states (mutable buffers such as a KV cache, kept by each context), from the
    tensors its layers read and write: name, dtype, shape, bytes and initial value."""
    found: dict[int, dict] = {}
    for la in desc.get("layers", []):
        for t in list(la.get("inputs", [])) + list(la.get("outputs", [])):
            if t.get("kind") == "state" and t.get("tensor") not in found:
                found[t["tensor"]] = {
                    "name": t.get("name", ""),
                    "dtype": t.get("dtype"),
                    "dim_min": t.get("dim_min"),
                    "dim_max": t.get("dim_max"),
                    "nbytes": t.get("nbytes", 0),
                    "initial": t.get("initial"),
                }
    return [found[k] for k in sorted(found)]


def _print_states(states: list[dict], indent: str) -> None:
    if not states:
        return
    total = sum(st["nbytes"] for st in states)
    print(f"{indent}states: {len(states)}, {size(total)} per context (kept between calls)")
    for st in states:
        print(
            f"{indent}  {text(st['name'])} {st['dtype']} {_shape(st)}, initial "
            f"{text(str(st['initial']))}"
        )


def _shape(t: dict) -> str:
    lo, hi = t.get("dim_min") or [], t.get("dim_max") or []
    return (
        "["
        + ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in zip(lo, hi, strict=False))
        + "]"
    )


# --- inspect


def cmd_inspect(args) -> int:
    op = open_program(args.file, args.data)
    if op.kind == "engine":
        desc = _engine_info(op.data)
        if args.json:
            emit_json({"file": args.file, "nbytes": len(op.data), **desc})
        else:
            _print_engine(args.file, desc, layers=True)
        return 0
    doc = _inspect_pte(op)
    if args.json:
        emit_json(doc)
    else:
        _print_pte(doc, args.layers)
    return 1 if doc["problems"] else 0


def _inspect_pte(op: Opened) -> dict:
    prog = op.program
    weights = op.weights()
    methods, engines, problems = [], [], list(op.ptd_problems)
    for m in prog.methods:
        calls, outside = [], {}
        for kind, i in m.calls:
            if kind == "delegate":
                d = m.delegates[i] if 0 <= i < len(m.delegates) else None
                calls.append(f"delegate {i} ({d.backend if d else '?'})")
            else:
                name = m.operators[i] if 0 <= i < len(m.operators) else f"operator {i}"
                calls.append(name)
                outside[name] = outside.get(name, 0) + 1
        methods.append(
            {
                "name": m.name,
                "inputs": m.io("inputs"),
                "outputs": m.io("outputs"),
                "delegates": [
                    {
                        "index": d.index,
                        "backend": d.backend,
                        "location": d.location,
                        "nbytes": len(d.data or b""),
                        "compile_specs": {
                            # kiln.link is binary (docs/runtime.md, "Between delegates"): hex
                            k: v.hex() if k == "kiln.link" else v.decode("utf-8", "surrogateescape")
                            for k, v in d.compile_specs.items()
                        },
                    }
                    for d in m.delegates
                ],
                "calls": calls,
                "outside": [
                    {"op": k, "count": n, "why": _why_outside(k)} for k, n in outside.items()
                ],
            }
        )
    expected: dict[str, dict] = {}
    for e in op.engines:
        entry = {
            "method": e.method,
            "delegate": e.delegate,
            "call": e.call,
            "precision": e.precision,
            "nbytes": len(e.data),
        }
        try:
            desc = _engine_info(e.data)
        except CliError as err:
            entry["error"] = str(err)
            problems.append(f"method {e.method!r} delegate {e.delegate}: {err}")
            engines.append(entry)
            continue
        ext = desc["weights"]["external"]
        missing = [w["key"] for w in ext if w["key"] not in weights]
        where = f"{e.external_data}.ptd" if e.external_data else "the .pte"
        if e.external_data:
            expected.setdefault(where, {"file": where, "keys": 0, "nbytes": 0})
            expected[where]["keys"] += len(ext)
            expected[where]["nbytes"] += sum(w["nbytes"] for w in ext)
        if missing:
            problems.append(
                f"method {e.method!r} delegate {e.delegate}: {len(missing)} of its "
                f"{len(ext)} external weights are in neither the .pte nor a .ptd read "
                f"(expected in {where}; pass it with --data)"
            )
        entry.update(
            n_layers=len(desc["layers"]),
            n_kernels=sum(1 for la in desc["layers"] if not la["tail"]),
            arena_nbytes=desc["memory_plan"]["arena_nbytes"],
            inline_weight_nbytes=desc["weights"]["inline_nbytes"],
            external_weight_nbytes=desc["weights"]["external_nbytes"],
            n_external_weights=len(ext),
            missing_weights=missing,
            inputs=desc["inputs"],
            outputs=desc["outputs"],
            layers=_layers_summary(desc),
            states=_states(desc),
        )
        engines.append(entry)
    return {
        "file": op.path,
        "kind": "pte",
        "nbytes": len(op.data),
        "version": prog.version,
        "methods": methods,
        "engines": engines,
        "named_data": {
            "n": len(prog.named_data),
            "nbytes": sum(prog.segments[i][1] for i in prog.named_data.values()),
        },
        "ptd": {"expected": list(expected.values()), "read": op.ptd_paths},
        "problems": problems,
    }


def _print_engine(path: str, d: dict, layers: bool) -> None:
    w = d["weights"]
    print(
        f"engine: {text(path)} ({d['header']['file_nbytes']} bytes), format "
        f"{d['header']['format_version']}, precision {d['precision']}"
    )
    for which in ("inputs", "outputs"):
        print(f"  {which}:")
        for t in d[which]:
            print(f"    {text(t['name'] or t['tensor'])} {t['dtype']} {_shape(t)}")
    print(f"  memory plan: arena {size(d['memory_plan']['arena_nbytes'])}")
    _print_states(_states(d), "  ")
    print(
        f"  weights: {w['n_inline']} inline ({size(w['inline_nbytes'])}), {w['n_external']} "
        f"external ({size(w['external_nbytes'])})"
    )
    heads = _layers_summary(d)
    print(
        f"  layers: {len(d['layers'])} ({len(heads)} kernels; fused tails listed with their head)"
    )
    if layers:
        rows = [
            [
                la["index"],
                la["op"] + "".join(f" + {f}" for f in la["fused"]),
                la["output"]["dtype"],
                _shape(la["output"]),
                size(la["weight_nbytes"]) if la["weight_nbytes"] else "-",
            ]
            for la in heads
        ]
        table(["#", "op (+ fused)", "dtype", "output shape", "weights"], rows)


def _print_pte(doc: dict, layers: bool) -> None:
    print(
        f"program: {text(doc['file'])} ({doc['nbytes']} bytes, ExecuTorch program version "
        f"{doc['version']})"
    )
    for m in doc["methods"]:
        print(f"method {text(m['name'])}:")
        for which in ("inputs", "outputs"):
            items = []
            for v in m[which]:
                if v["kind"] == "tensor":
                    items.append(f"{v['dtype']}{v['sizes']}")
                else:
                    items.append(f"{v['kind']}={v.get('value')}")
            print(f"  {which}: {text(', '.join(items)) or '-'}")
        print(f"  runs, in order: {text('; '.join(m['calls'])) or '-'}")
        for d in m["delegates"]:
            specs = ", ".join(
                f"{k}=<{len(v) // 2} bytes: links to other Kiln delegates>"
                if k == "kiln.link"
                else f"{k}={v}"
                for k, v in d["compile_specs"].items()
            )
            print(
                f"  delegate {d['index']}: {text(d['backend'])}, {size(d['nbytes'])} "
                f"({d['location']}){' ' + text(specs) if specs else ''}"
            )
        if m["outside"]:
            print("  left to ExecuTorch:")
            for o in m["outside"]:
                print(f"    {text(o['op'])} x{o['count']}: {text(o['why'])}")
    for e in doc["engines"]:
        head = f"Kiln engine: method {text(e['method'])}, delegate {e['delegate']}"
        if "error" in e:
            print(f"{head}: {text(e['error'])}")
            continue
        ins = ", ".join(f"{t['dtype']}{_shape(t)}" for t in e["inputs"])
        outs = ", ".join(f"{t['dtype']}{_shape(t)}" for t in e["outputs"])
        print(
            f"{head}: {size(e['nbytes'])}, precision {e['precision']}, {e['n_kernels']} kernels "
            f"({e['n_layers']} layers), arena {size(e['arena_nbytes'])}, weights "
            f"{size(e['inline_weight_nbytes'])} inline + {size(e['external_weight_nbytes'])} "
            f"external ({e['n_external_weights']} keys)"
        )
        print(f"  {ins} -> {outs}")
        _print_states(e.get("states", []), "  ")
        if layers:
            rows = [
                [
                    la["index"],
                    la["op"] + "".join(f" + {f}" for f in la["fused"]),
                    la["output"]["dtype"],
                    _shape(la["output"]),
                    size(la["weight_nbytes"]) if la["weight_nbytes"] else "-",
                ]
                for la in e["layers"]
            ]
            table(["#", "op (+ fused)", "dtype", "output shape", "weights"], rows)
    nd = doc["named_data"]
    print(f"named data in the .pte: {nd['n']} blobs, {size(nd['nbytes'])}")
    for x in doc["ptd"]["expected"]:
        print(f"expects {text(x['file'])}: {x['keys']} weights, {size(x['nbytes'])}")
    for p in doc["ptd"]["read"]:
        print(f"read {text(p)}")
    for p in doc["problems"]:
        print(f"problem: {text(p)}")


# --- run


def _load_inputs(spec: str, meta, seed: int):
    import numpy as np
    import torch

    n = meta.num_inputs()
    infos = []
    for i in range(n):
        try:
            info = meta.input_tensor_meta(i)
        except Exception:  # noqa: BLE001 - not a tensor input
            raise CliError(
                f"input {i} is not a tensor: kiln run takes tensor inputs only"
            ) from None
        infos.append(info)
    from .._load import _ET_SCALAR_TYPES

    if spec == "random":
        g = torch.Generator().manual_seed(seed)
        out = []
        for info in infos:
            dt = getattr(torch, _ET_SCALAR_TYPES.get(info.dtype(), "float32"))
            shape = list(info.sizes())
            if dt.is_floating_point:
                out.append(torch.randn(shape, generator=g).to(dt))
            elif dt == torch.bool:
                out.append(torch.rand(shape, generator=g) > 0.5)
            else:
                out.append(torch.randint(0, 10, shape, generator=g, dtype=dt))
        return out
    p = Path(spec)
    if not p.is_file():
        raise CliError(f"--inputs {spec}: no such file (give an .npz, or 'random')")
    try:
        z = np.load(p, allow_pickle=False)
        arrays = [z[k] for k in z.files] if hasattr(z, "files") else [z]
    except Exception as e:  # noqa: BLE001 - numpy raises several kinds
        raise CliError(f"--inputs {spec}: not a readable .npz ({type(e).__name__}: {e})") from None
    if len(arrays) != n:
        raise CliError(f"--inputs {spec}: {len(arrays)} arrays, the method takes {n} inputs")
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]


def _set_device(device: str) -> None:
    import kiln_executorch_runtime as rt

    try:
        rt.set_option("device", device)
    except (ValueError, TypeError) as e:
        raise UsageError(f"--device {device}: {e}") from None


def _precision_of(op: Opened) -> str:
    precs = {e.precision for e in op.engines if e.precision}
    order = ["bf16", "fp16", "fp32"]
    return next((p for p in order if p in precs), "fp32")


def cmd_run(args) -> int:
    import numpy as np

    import kiln

    op = open_program(args.program, [args.data] if args.data else None)
    if op.kind != "pte":
        raise UsageError(f"{args.program} is a raw Kiln engine: kiln run takes a .pte program")
    data_path = args.data or (op.ptd_paths[0] if op.ptd_paths else None)
    _set_device(args.device)
    try:
        program = kiln.load(args.program, data_path=data_path)
    except Exception as e:  # noqa: BLE001 - KilnLoadError, registration errors, ...
        raise CliError(str(e)) from None
    if args.method not in program.method_names:
        raise UsageError(
            f"--method {args.method}: the program's methods are {', '.join(program.method_names)}"
        )
    meta = program._methods[args.method].metadata
    inputs = _load_inputs(args.inputs, meta, args.seed)
    t0 = time.perf_counter()
    try:
        outs = program.run(args.method, inputs)
    except Exception as e:  # noqa: BLE001
        raise CliError(str(e)) from None
    dt = time.perf_counter() - t0
    devices = sorted({e["device"] for e in _engine_devices(op, args.device)})
    res = {
        "program": args.program,
        "method": args.method,
        "device_option": args.device,
        "kiln_devices": devices,
        "seconds": dt,
        "inputs": [
            {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for t in inputs
        ],
        "outputs": [],
    }
    for o in outs:
        a = o.detach().float() if o.dtype.is_floating_point else o
        res["outputs"].append(
            {
                "dtype": str(o.dtype).removeprefix("torch."),
                "shape": list(o.shape),
                "min": float(a.min()) if o.numel() else None,
                "max": float(a.max()) if o.numel() else None,
                "mean": float(a.float().mean()) if o.numel() else None,
            }
        )
    rc = 0
    if args.compare:
        rtol, atol = TOLERANCE[_precision_of(op)]
        rtol = args.rtol if args.rtol is not None else rtol
        atol = args.atol if args.atol is not None else atol
        p = Path(args.compare)
        if not p.is_file():
            raise CliError(f"--compare {args.compare}: no such file")
        try:
            z = np.load(p, allow_pickle=False)
            refs = [z[k] for k in z.files] if hasattr(z, "files") else [z]
        except Exception as e:  # noqa: BLE001
            raise CliError(f"--compare {args.compare}: not a readable .npz ({e})") from None
        cmp = []
        if len(refs) != len(outs):
            raise CliError(
                f"--compare: {len(refs)} reference arrays, the method gave {len(outs)} outputs"
            )
        for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
            got = o.detach().float().numpy() if o.dtype.is_floating_point else o.numpy()
            entry = {"output": i, "shape_ok": list(got.shape) == list(r.shape)}
            if entry["shape_ok"]:
                diff = np.abs(got.astype(np.float64) - r.astype(np.float64))
                bound = atol + rtol * np.abs(r.astype(np.float64))
                entry["max_abs_err"] = float(diff.max()) if diff.size else 0.0
                entry["max_rel_err"] = (
                    float((diff / np.maximum(np.abs(r), 1e-12)).max()) if diff.size else 0.0
                )
                entry["ok"] = bool(
                    (diff <= bound).all() and np.isfinite(got).all() == np.isfinite(r).all()
                )
            else:
                entry["ok"] = False
                entry["detail"] = f"shape {list(got.shape)}, reference {list(r.shape)}"
            cmp.append(entry)
        res["compare"] = {"reference": args.compare, "rtol": rtol, "atol": atol, "outputs": cmp}
        rc = 0 if all(c["ok"] for c in cmp) else 1
    if args.save:
        # numpy has no bfloat16: those outputs are saved as float32
        np.savez(
            args.save, *[o.detach().float().numpy() if _is_bf16(o) else o.numpy() for o in outs]
        )
        res["saved"] = args.save
    if args.json:
        emit_json(res)
    else:
        print(
            f"ran {text(args.program)} {text(args.method)} in {dt * 1e3:.2f} ms (Kiln on "
            f"{', '.join(devices) or '-'})"
        )
        for i, o in enumerate(res["outputs"]):
            print(
                f"  output {i}: {o['dtype']}{o['shape']} min {o['min']} max {o['max']} "
                f"mean {o['mean']}"
            )
        if "compare" in res:
            c = res["compare"]
            for e in c["outputs"]:
                state = "ok" if e["ok"] else "MISMATCH"
                errs = (
                    f"max abs err {e['max_abs_err']:.3g}, max rel err {e['max_rel_err']:.3g}"
                    if e["shape_ok"]
                    else e["detail"]
                )
                print(
                    f"  compare output {e['output']}: {state} ({errs}; rtol {c['rtol']}, "
                    f"atol {c['atol']})"
                )
        if args.save:
            print(f"  wrote {text(args.save)}")
    return rc


def _is_bf16(t) -> bool:
    return str(t.dtype) == "torch.bfloat16"


def _engine_devices(op: Opened, device: str) -> list[dict]:
    """Where each Kiln engine of the program runs under the option `device` (loads each
    engine through the C API; cheap next to the program itself)."""
    out = []
    weights = op.weights()
    for e in op.engines:
        try:
            eng = _capi.Engine(e.data, weights, {"device": device})
            out.append({"method": e.method, "delegate": e.delegate, "device": eng.device})
            eng.close()
        except Exception as err:  # noqa: BLE001 - reported, not fatal here
            out.append({"method": e.method, "delegate": e.delegate, "device": f"error: {err}"})
    return out


# --- bench


def _stats(times: list[float]) -> dict:
    ts = sorted(times)

    def pct(q):
        k = (len(ts) - 1) * q
        lo, hi = math.floor(k), math.ceil(k)
        return ts[lo] + (ts[hi] - ts[lo]) * (k - lo)

    mean = statistics.fmean(ts)
    return {
        "n": len(ts),
        "min_ms": ts[0] * 1e3,
        "p50_ms": pct(0.5) * 1e3,
        "p90_ms": pct(0.9) * 1e3,
        "p99_ms": pct(0.99) * 1e3,
        "mean_ms": mean * 1e3,
        "max_ms": ts[-1] * 1e3,
        "throughput_per_s": 1.0 / mean if mean > 0 else None,
    }


def _bench_program(path: str, args, data: list[str] | None) -> dict:
    op = open_program(path, data)
    res = {"program": path, "method": args.method, "warmup": args.warmup, "iters": args.iters}
    if args.engines or op.kind == "engine":
        return {**res, **_bench_engines(op, args)}
    if args.io == "device":
        raise UsageError(
            "--io device needs --engines: ExecuTorch's Python runtime takes host tensors (device "
            "inputs and outputs are a C++ caller's: examples/cpp/kiln_runner --device-io)"
        )
    import kiln

    _set_device(args.device)
    import kiln_executorch_runtime as rt

    rt.set_option("use_cuda_graphs", args.cuda_graphs == "on")
    data_path = op.ptd_paths[0] if op.ptd_paths else None
    try:
        program = kiln.load(path, data_path=data_path)
    except Exception as e:  # noqa: BLE001
        raise CliError(str(e)) from None
    if args.method not in program.method_names:
        raise UsageError(f"--method {args.method}: {path} has {', '.join(program.method_names)}")
    meta = program._methods[args.method].metadata
    inputs = _load_inputs("random", meta, args.seed)
    batch = inputs[0].shape[0] if inputs and inputs[0].dim() else 1
    for _ in range(args.warmup):
        program.run(args.method, inputs)
    times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        program.run(args.method, inputs)
        times.append(time.perf_counter() - t0)
    st = _stats(times)
    st["items_per_s"] = st["throughput_per_s"] * batch if st["throughput_per_s"] else None
    devs = sorted({e["device"] for e in _engine_devices(op, args.device)})
    return {
        **res,
        "path": "executorch",
        "io": "host",
        "device": ", ".join(devs) or "-",
        "cuda_graphs": args.cuda_graphs if any(d.startswith("cuda") for d in devs) else "n/a",
        "batch": batch,
        **st,
    }


def _bench_engines(op: Opened, args) -> dict:
    weights = op.weights()
    engines, total = [], None
    opts = {"device": args.device, "use_cuda_graphs": args.cuda_graphs == "on"}
    loaded = []
    for e in op.engines:
        try:
            loaded.append((e, _capi.Engine(e.data, weights, opts, io=args.io, seed=args.seed)))
        except _lib.KilnError as err:
            raise CliError(f"method {e.method!r} delegate {e.delegate}: {err}") from None
        except RuntimeError as err:
            raise CliError(str(err)) from None
    if not loaded:
        raise CliError(f"{op.path} has no Kiln engine to time")
    for _ in range(args.warmup):
        for _e, eng in loaded:
            eng.execute()
    per = {i: [] for i in range(len(loaded))}
    total = []
    for _ in range(args.iters):
        t = 0.0
        for i, (_e, eng) in enumerate(loaded):
            dt = eng.execute()
            per[i].append(dt)
            t += dt
        total.append(t)
    for i, (e, eng) in enumerate(loaded):
        engines.append(
            {"method": e.method, "delegate": e.delegate, "device": eng.device, **_stats(per[i])}
        )
        eng.close()
    devs = sorted({x["device"] for x in engines})
    st = _stats(total)
    b0 = loaded[0][1].inputs[0]["dims"] if loaded[0][1].inputs else []
    batch = b0[0] if b0 else 1
    st["items_per_s"] = st["throughput_per_s"] * batch if st["throughput_per_s"] else None
    return {
        "path": "engines (C API)",
        "io": args.io,
        "device": ", ".join(devs),
        "cuda_graphs": args.cuda_graphs if any(d.startswith("cuda") for d in devs) else "n/a",
        "batch": batch,
        "engines": engines,
        **st,
    }


def cmd_bench(args) -> int:
    if args.iters < 1 or args.warmup < 0:
        raise UsageError("--iters must be >= 1 and --warmup >= 0")
    results = [
        _bench_program(p, args, args.data if i == 0 else None) for i, p in enumerate(args.programs)
    ]
    base = results[0]["p50_ms"]
    for r in results:
        r["p50_vs_first"] = r["p50_ms"] / base if base else None
    if args.json:
        emit_json({"results": results})
        return 0
    print(
        f"{args.warmup} warm-up runs, {args.iters} timed runs each; host wall clock per run "
        "(the call returns with the work finished)"
    )
    rows = [
        [
            r["program"],
            r["path"],
            r["device"],
            r["cuda_graphs"],
            r["io"],
            f"{r['p50_ms']:.3f}",
            f"{r['p90_ms']:.3f}",
            f"{r['p99_ms']:.3f}",
            f"{r['mean_ms']:.3f}",
            f"{r['throughput_per_s']:.1f}",
            f"{r['p50_vs_first']:.2f}",
        ]
        for r in results
    ]
    table(
        [
            "program",
            "path",
            "device",
            "graphs",
            "I/O",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "mean ms",
            "runs/s",
            "p50 vs 1st",
        ],
        rows,
    )
    return 0


def _engines_and_weights(args, verb: str):
    """The program's Kiln engines (at least one) and the weights its .ptd files hold."""
    op = open_program(args.program, args.data)
    if not op.engines:
        raise CliError(f"{args.program} has no Kiln engine to {verb}")
    return op, op.weights()


# --- tune


def cmd_tune(args) -> int:
    if not args.device.startswith("cuda:"):
        raise UsageError("kiln tune makes GPU choices: --device must be cuda:N")
    if args.cache == "off":
        raise UsageError("--cache off keeps nothing: give a file, or auto")
    op, weights = _engines_and_weights(args, "tune")
    done = []
    for e in op.engines:
        t0 = time.perf_counter()
        try:
            eng = _capi.Engine(
                e.data, weights, {"device": args.device, "tuning_cache": args.cache}, seed=args.seed
            )
        except _lib.KilnError as err:
            raise CliError(f"method {e.method!r} delegate {e.delegate}: {err}") from None
        setup_s = time.perf_counter() - t0
        if not eng.device.startswith("cuda"):
            eng.close()
            raise CliError(f"the engine loaded on {eng.device}, not a GPU: nothing to tune")
        eng.execute()
        layers = [la for la in eng.layers() if not la["tail"]]
        timed = sum(1 for la in layers if la["timed"])
        cached = sum(1 for la in layers if "from the tuning cache" in la["detail"])
        done.append(
            {
                "method": e.method,
                "delegate": e.delegate,
                "device": eng.device,
                "load_and_context_s": setup_s,
                "timed_layers": timed,
                "from_cache": cached,
            }
        )
        eng.close()
    doc = {"program": args.program, "cache": args.cache, "engines": done}
    if args.json:
        emit_json(doc)
        return 0
    for d in done:
        print(
            f"method {text(d['method'])}, delegate {d['delegate']} on {d['device']}: "
            f"{d['timed_layers']} layers chosen by timing ({d['from_cache']} of them from the "
            f"cache already), load and context {d['load_and_context_s'] * 1e3:.0f} ms"
        )
    print(
        f"the choices are in the tuning cache {text(args.cache)}: a process that sets the option "
        "tuning_cache to it starts without timing on this GPU"
    )
    return 0


# --- profile


def cmd_profile(args) -> int:
    if args.iters < 1 or args.warmup < 0:
        raise UsageError("--iters must be >= 1 and --warmup >= 0")
    op, weights = _engines_and_weights(args, "profile")
    profiles = []
    for e in op.engines:
        try:
            eng = _capi.Engine(
                e.data, weights, {"device": args.device, "profile": True}, seed=args.seed
            )
        except _lib.KilnError as err:
            raise CliError(f"method {e.method!r} delegate {e.delegate}: {err}") from None
        for _ in range(args.warmup):
            eng.execute()
        walls = [eng.execute() for _ in range(args.iters)]
        layers = eng.layers()
        desc = _engine_info(e.data)
        for la, d in zip(layers, desc["layers"], strict=False):
            o = (d.get("outputs") or [{}])[0]
            la["output"] = {"dtype": o.get("dtype"), "dim_max": o.get("dim_max")}
        profiles.append(
            {
                "method": e.method,
                "delegate": e.delegate,
                "device": eng.device,
                "inputs": [
                    {"name": b["name"], "dtype": b["dtype"], "shape": b["dims"]} for b in eng.inputs
                ],
                "execute_ms": statistics.fmean(walls) * 1e3,
                "layers": layers,
            }
        )
        eng.close()
    doc = {
        "program": args.program,
        "warmup": args.warmup,
        "iters": args.iters,
        "engines": profiles,
    }
    if args.trace:
        trace = chrome_trace(args.program, profiles)
        try:
            Path(args.trace).write_text(json.dumps(trace, indent=0))
        except OSError as err:
            raise CliError(f"cannot write {args.trace}: {err.strerror or err}") from None
        doc["trace"] = args.trace
    if args.json:
        emit_json(doc)
        return 0
    for p in profiles:
        print(
            f"engine: method {text(p['method'])}, delegate {p['delegate']} on {p['device']}: "
            f"{p['execute_ms']:.3f} ms per execute (host, profiled), inputs "
            + ", ".join(f"{b['dtype']}{b['shape']}" for b in p["inputs"])
        )
        rows = []
        for la in p["layers"]:
            if la["tail"]:
                continue
            tails = [t["op"] for t in p["layers"] if t["tail"] and t["head"] == la["layer"]]
            rows.append(
                [
                    la["layer"],
                    la["op"] + "".join(f" + {t}" for t in tails),
                    la["kernel"],
                    "-" if la["device_us"] is None else f"{la['device_us']:.1f}",
                    "-" if la["host_us"] is None else f"{la['host_us']:.1f}",
                    la["n_profiled"],
                    la["detail"][:60],
                ]
            )
        table(["#", "op", "kernel", "device us", "host us", "runs", "decision"], rows)
    if args.trace:
        print(f"wrote {text(args.trace)} (open it in https://ui.perfetto.dev or chrome://tracing)")
    return 0


def chrome_trace(program: str, profiles: list[dict]) -> dict:
    """A Chrome JSON trace (Perfetto reads it): one process per engine, a host track and one
    track for the engine's stream, each layer one complete event ("X", microseconds) laid end
    to end with its mean time (layers run in order on the stream)."""
    events = []
    for pid, p in enumerate(profiles, start=1):
        name = f"{program} {p['method']} delegate {p['delegate']} ({p['device']})"
        events.append(
            {"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": name}}
        )
        stream = (
            "stream (CPU: the calling thread)" if p["device"] == "cpu" else f"{p['device']} stream"
        )
        for tid, tname in ((1, "host"), (2, stream)):
            events.append(
                {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": tname}}
            )
        t_host = t_dev = 0.0
        for la in p["layers"]:
            if la["tail"]:
                continue
            args = {k: la[k] for k in ("layer", "op", "kernel", "detail", "n_profiled", "n_fused")}
            if la["host_us"] is not None:
                events.append(
                    {
                        "ph": "X",
                        "pid": pid,
                        "tid": 1,
                        "ts": t_host,
                        "dur": la["host_us"],
                        "name": la["op"],
                        "cat": "host",
                        "args": args,
                    }
                )
                t_host += la["host_us"]
            if la["device_us"] is not None:
                events.append(
                    {
                        "ph": "X",
                        "pid": pid,
                        "tid": 2,
                        "ts": t_dev,
                        "dur": la["device_us"],
                        "name": la["op"],
                        "cat": "device",
                        "args": args,
                    }
                )
                t_dev += la["device_us"]
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"program": program, "times": "mean per execute, microseconds"},
    }


# --- doctor


def cmd_doctor(args) -> int:
    rep = _doctor.collect()
    if args.install_hint:
        hint = _doctor.install_hint(rep)
        if args.json:
            emit_json({"install_hint": hint})
        else:
            print(hint["command"] if hint["command"] else "")
            for n in hint["notes"]:
                print(f"# {n}", file=sys.stderr)
        return 0 if hint["command"] else 1
    if args.json:
        emit_json(rep)
    else:
        _doctor.print_report(rep)
    return 0 if rep["ok"] else 1
