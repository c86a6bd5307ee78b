"""LLM generation on the H200: a Llama-3.2-1B-shaped decoder (transformers' LlamaForCausalLM,
16 layers, d 2048, FFN 8192, 32 query and 8 KV heads, vocabulary 128256, tied embeddings) with
deterministic random weights, bf16, its KV cache inside the Kiln engine (docs/benchmarks.md,
"LLM generation").

Export here (records the Kiln graphs; weights are regenerated on the device, bench/kiln_record.py):

    PYTHONPATH=python KILN_LIBRARY=build-gpu/libkiln.so python bench/llm.py export \\
        [--layers 16] [--out .dev/llm]

Run on the device (libkiln and its CUDA plugin through bench/kiln_capi.py):

    KILN_LIBRARY=... KILN_CUDA_PLUGIN=... python3 bench/llm.py run --dir .dev/llm --out $OUT

The program has two methods over one cache, exported from transformers' own export wrapper
(``TorchExportableModuleWithStaticCache``): ``prefill`` (512 tokens) and ``decode`` (one token at a
position). On the device the two engines are built from the recording, loaded, and the decode
context shares the prefill context's states (``kiln_context_share_states``, what the ExecuTorch
delegate does for the methods of one program). Measured, side by side in one process:

- Kiln: prefill of 512 tokens; decode ms/token at context 128, 1024 and 4096 (the time of one
  execute of ``decode``: bind nothing new but the token and position, run, logits back);
- PyTorch, the same wrapper and weights on the GPU: eager decode captured in a CUDA graph, and
  ``torch.compile(mode="reduce-overhead")``; prefill eager, in a CUDA graph and compiled;
- the bandwidth floor: weight bytes + the KV cache bytes read at that context over 4.26 TB/s.

Correctness on the device: Kiln's prefill logits and 16 teacher-forced decode steps against the
eager model (bf16 on the GPU), and greedy tokens compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

HBM_BYTES_PER_S = 4.26e12  # the H200's HBM3e bandwidth (the floor's denominator)
PREFILL = 512
CONTEXTS = (128, 1024, 4096)
MAX_CACHE = 4224  # a decode at position 4096 + a few steps fits
TAG = "llm-llama1b"


def config(layers: int, tiny: bool = False):
    from transformers import LlamaConfig

    if tiny:  # the flow on the CPU, in seconds
        return LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=256,
            tie_word_embeddings=True,
            rope_theta=500000.0,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
        )
    return LlamaConfig(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        tie_word_embeddings=True,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
    )


class Step(torch.nn.Module):
    """transformers' StaticCache export wrapper, called with (input_ids, cache_position)."""

    def __init__(self, wrapper):
        super().__init__()
        self.w = wrapper

    def forward(self, input_ids, cache_position):
        return self.w(input_ids=input_ids, cache_position=cache_position)


def build(layers: int, max_cache: int, tiny: bool = False, device: str = "cpu"):
    """The bf16 LlamaForCausalLM with version-independent weights, wrapped for export."""
    import models as M
    from transformers import LlamaForCausalLM
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    cfg = config(layers, tiny)
    cfg._attn_implementation = "sdpa"
    with torch.device("cpu"):
        model = LlamaForCausalLM(cfg)
    M.zoo_init_(model, TAG)
    model = model.to(torch.bfloat16).eval()
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    model = model.to(device)
    wrapper = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=max_cache)
    return Step(wrapper).eval(), model


def tokens(n: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, n), generator=g, dtype=torch.int64)


# --- export (here)


def _delegation(prog) -> dict:
    """Per method: Kiln delegates and the ops left to ExecuTorch."""
    from executorch.exir.lowered_backend_module import executorch_call_delegate

    out = {}
    for name in prog.methods:
        gm = prog.exported_program(name).graph_module
        n_del, left = 0, []
        for n in gm.graph.nodes:
            if n.op != "call_function":
                continue
            if n.target is executorch_call_delegate:
                n_del += 1
            elif "getitem" not in str(n.target):
                left.append(str(n.target))
        out[name] = {"delegates": n_del, "left": left}
    return out


def cmd_export(a):
    import kiln_record as R
    from kiln.executorch import export

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    step, model = build(a.layers, a.max_cache, a.tiny)
    vocab = model.config.vocab_size
    methods = {
        "prefill": (step, (tokens(a.prefill, vocab, 1), torch.arange(a.prefill))),
        "decode": (step, (tokens(1, vocab, 2), torch.tensor([a.prefill]))),
    }
    t0 = time.perf_counter()
    with R.Recorder() as rec, torch.no_grad():
        prog = export(methods, precision="bf16", external_data="llm", quiet=True)
    t_export = time.perf_counter() - t0
    deleg = _delegation(prog)
    for name, d in deleg.items():
        if d["delegates"] != 1 or d["left"]:
            raise SystemExit(f"method {name}: {d['delegates']} Kiln delegates, left {d['left']}")
    if len(rec.built) != 2:
        raise SystemExit(f"expected 2 Kiln engines, recorded {len(rec.built)}")
    consts = R.resolve_constants(rec.built, rec.blobs, step)
    meta = {
        "meta": {
            "layers": a.layers,
            "max_cache": a.max_cache,
            "prefill": a.prefill,
            "tiny": a.tiny,
            "methods": list(methods),
            "export_s": round(t_export, 1),
            "delegation": deleg,
            "engine_nbytes": [len(e) for e in rec.engines],
            "weights_nbytes": [sum(len(d) for _, d in w) for w in rec.weights],
        }
    }
    n = R.save_recording(out / "llm.graph.json.gz", meta, rec.built, consts)
    if a.verify:  # the replay here gives the exported engines (what the device relies on)
        doc = R.load_recording(out / "llm.graph.json.gz")
        R.replay(doc, R.named_tensors(step))
    print(
        f"llm: exported {len(rec.built)} engines in {t_export:.0f} s "
        f"({', '.join(f'{k}: {v}' for k, v in deleg.items())}); recording {n} bytes, "
        f"{consts['inline_nbytes']} inline"
    )


# --- run (device)


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _median_ms(fn, reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _capture(fn):
    """fn captured in a CUDA graph after three warm-up calls on a side stream."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    g, w = got.float(), want.float()
    return (g - w).abs().max().item() / max(1.0, w.abs().max().item())


def _decode_ms(step_fn, pos_buf, tok_buf, context: int, n: int) -> float:
    """Mean ms per decode step over n steps from position `context` (token and position
    written into the bound device buffers before each step, as a generate loop does)."""
    for i in range(5):
        pos_buf.fill_(context + i)
        step_fn()
    _sync()
    t0 = time.perf_counter()
    for i in range(n):
        pos_buf.fill_(context + i)
        tok_buf.fill_((i * 7919) % 251)
        step_fn()
    _sync()
    return (time.perf_counter() - t0) * 1e3 / n


def cmd_run(a):
    import kiln_capi as C
    import kiln_record as R

    dev = torch.device(a.device)
    gpu = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
    res: dict = {"device": gpu, "date": time.strftime("%Y-%m-%d")}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    def save():
        (out / "llm.json").write_text(json.dumps(res, indent=1))

    doc = R.load_recording(Path(a.dir) / "llm.graph.json.gz")
    meta = doc["meta"]
    res["meta"] = meta
    t0 = time.perf_counter()
    step, model = build(meta["layers"], meta["max_cache"], meta["tiny"])
    res["t_model_s"] = time.perf_counter() - t0
    cfg = model.config
    t0 = time.perf_counter()
    built = R.replay(doc, R.named_tensors(step))
    res["t_build_s"] = time.perf_counter() - t0
    by_name = {}
    for (engine, weights), g in zip(built, doc["graphs"], strict=True):
        first_input = next(c for c in g["calls"] if c[0] == "input")
        by_name["prefill" if first_input[4][-1] > 1 else "decode"] = (engine, weights)
    t0 = time.perf_counter()
    pre = C.Engine(by_name["prefill"][0], dict(by_name["prefill"][1]), device=a.kiln_device)
    dec = C.Engine(by_name["decode"][0], dict(by_name["decode"][1]), device=a.kiln_device)
    dec.share_states(pre)
    res["t_load_s"] = time.perf_counter() - t0
    profile_engines = dict(by_name) if a.profile else None
    del built, by_name
    res["kiln_weight_bytes"] = [pre.weight_nbytes, dec.weight_nbytes]
    stream = torch.cuda.current_stream().cuda_stream if dev.type == "cuda" else None
    V, P = cfg.vocab_size, meta["prefill"]

    # Kiln buffers (device), bound once.
    ids_p = tokens(P, V, 11).to(dev)
    pos_p = torch.arange(P, device=dev)
    logits_p = torch.empty(1, P, V, dtype=torch.bfloat16, device=dev)
    tok = torch.zeros(1, 1, dtype=torch.int64, device=dev)
    pos = torch.zeros(1, dtype=torch.int64, device=dev)
    logits_d = torch.empty(1, 1, V, dtype=torch.bfloat16, device=dev)
    pre.bind(
        [(ids_p.data_ptr(), [1, P]), (pos_p.data_ptr(), [P])],
        [(logits_p.data_ptr(), logits_p.numel() * 2)],
        stream,
    )
    dec.bind(
        [(tok.data_ptr(), [1, 1]), (pos.data_ptr(), [1])],
        [(logits_d.data_ptr(), logits_d.numel() * 2)],
        stream,
    )

    # Correctness against the eager model on the GPU (bf16).
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    del step  # its cache lives on the CPU; the reference gets its own on the device
    model = model.to(dev)
    ref = Step(
        TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=meta["max_cache"])
    ).eval()
    with torch.no_grad():
        want_p = ref(ids_p, pos_p)
    pre.reset_states()
    pre.execute()
    res["prefill_err"] = _err(logits_p[0, -1], want_p[0, -1])
    agree, errs, margins = 0, [], []
    nxt = int(want_p[0, -1].argmax())
    for i in range(16):
        tok.fill_(nxt)
        pos.fill_(P + i)
        with torch.no_grad():
            want = ref(tok, pos)
        dec.execute()
        errs.append(_err(logits_d[0, -1], want[0, -1]))
        same = int(logits_d[0, -1].argmax()) == int(want[0, -1].argmax())
        agree += same
        if not same:  # the reference's own top-2 margin there, on the error's scale
            w = want[0, -1].float()
            top = w.topk(2).values
            margins.append((top[0] - top[1]).item() / max(1.0, w.abs().max().item()))
        nxt = int(want[0, -1].argmax())
    res["decode_err_max"] = max(errs)
    res["decode_argmax_agree"] = f"{agree}/16"
    res["decode_argmax_margins"] = margins
    print(
        f"llm: prefill err {res['prefill_err']:.3g}, decode err max {max(errs):.3g}, "
        f"argmax agree {agree}/16"
        + (
            " (where they differ, the reference's top-2 margin is "
            + ", ".join(f"{m:.3g}" for m in margins)
            + " of its largest logit)"
            if margins
            else ""
        ),
        flush=True,
    )
    save()

    # Kiln timing.
    res["kiln_prefill_ms"] = _median_ms(lambda: (pre.reset_states(), pre.execute()), 5)
    res["kiln_decode_ms"] = {
        c: _decode_ms(dec.execute, pos, tok, c, a.steps)
        for c in CONTEXTS
        if c + a.steps < meta["max_cache"]
    }
    print(
        f"llm: kiln prefill {res['kiln_prefill_ms']:.2f} ms, decode {res['kiln_decode_ms']}",
        flush=True,
    )
    save()
    if a.trace:
        res["trace"] = _trace(dec.execute, pos, tok, 1024, 20, out)
        save()

    # Floors.
    wbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_row = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 2
    res["weight_bytes"] = wbytes
    res["floor_ms"] = {c: (wbytes + kv_row * c) / HBM_BYTES_PER_S * 1e3 for c in CONTEXTS}
    save()
    pre.close()
    dec.close()
    if profile_engines is not None:
        _profile(res, C, profile_engines, a, V, P, stream)
        del profile_engines
        save()
    if a.no_torch:
        _table(res)
        return

    # PyTorch: eager prefill; eager decode captured in a CUDA graph; torch.compile.
    with torch.no_grad():
        res["torch_prefill_eager_ms"] = _median_ms(lambda: ref(ids_p, pos_p), 5)
        tok_s = torch.zeros(1, 1, dtype=torch.int64, device=dev)
        pos_s = torch.full((1,), P, dtype=torch.int64, device=dev)
        res["torch_decode_eager_ms"] = {
            c: _decode_ms(lambda: ref(tok_s, pos_s), pos_s, tok_s, c, a.steps // 4)
            for c in CONTEXTS
            if c + a.steps < meta["max_cache"]
        }
        save()
        try:
            if dev.type != "cuda":
                raise RuntimeError("no GPU")
            g = _capture(lambda: ref(tok_s, pos_s))
            res["torch_decode_graph_ms"] = {
                c: _decode_ms(g.replay, pos_s, tok_s, c, a.steps)
                for c in CONTEXTS
                if c + a.steps < meta["max_cache"]
            }
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            res["torch_decode_graph_error"] = f"{type(e).__name__}: {e}"[:400]
        print(
            f"llm: torch eager {res.get('torch_decode_eager_ms')}, graph "
            f"{res.get('torch_decode_graph_ms', res.get('torch_decode_graph_error'))}",
            flush=True,
        )
        save()
        try:  # the prefill captured in a CUDA graph (the same cache rows written each replay)
            if dev.type != "cuda":
                raise RuntimeError("no GPU")
            gp = _capture(lambda: ref(ids_p, pos_p))
            res["torch_prefill_graph_ms"] = _median_ms(gp.replay, 10)
            del gp
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            res["torch_prefill_graph_error"] = f"{type(e).__name__}: {e}"[:400]
        save()
        if a.compile:
            try:  # the prefill shape compiled alone (static shapes), then the decode
                t0 = time.perf_counter()
                comp_p = torch.compile(ref, mode="reduce-overhead", dynamic=False)
                res["torch_prefill_compile_ms"] = _median_ms(lambda: comp_p(ids_p, pos_p), 10, 4)
                res["torch_prefill_compile_s"] = time.perf_counter() - t0
                del comp_p
                torch._dynamo.reset()
            except Exception as e:  # noqa: BLE001
                res["torch_prefill_compile_error"] = f"{type(e).__name__}: {e}"[:400]
            save()
            try:
                t0 = time.perf_counter()
                comp = torch.compile(ref, mode="reduce-overhead", fullgraph=False)
                for i in range(4):
                    pos_s.fill_(P + i)
                    comp(tok_s, pos_s)
                _sync()
                res["torch_compile_s"] = time.perf_counter() - t0
                res["torch_decode_compile_ms"] = {
                    c: _decode_ms(lambda: comp(tok_s, pos_s), pos_s, tok_s, c, a.steps)
                    for c in CONTEXTS
                    if c + a.steps < meta["max_cache"]
                }
            except Exception as e:  # noqa: BLE001
                res["torch_decode_compile_error"] = f"{type(e).__name__}: {e}"[:400]
    save()
    _table(res)


def summarize_trace(events: list[dict]) -> tuple[dict, list[dict]]:
    """Chrome-trace events -> (per-step summary, the first step's kernels in order). A step is a
    run of more than 10 kernels between the fill kernels torch runs before each step; its span
    runs from its first kernel's start to its last end, its idle time is the span less the union
    of its kernels' intervals (they may overlap under programmatic dependent launch)."""
    kernels = sorted(
        (e for e in events if e.get("cat") == "kernel" and "dur" in e), key=lambda e: e["ts"]
    )
    steps, cur = [], []
    for e in kernels:
        if "fill" in e["name"].lower():
            if cur:
                steps.append(cur)
                cur = []
            continue
        cur.append(e)
    if cur:
        steps.append(cur)
    steps = [s for s in steps if len(s) > 10]
    spans, idles, per_name = [], [], {}
    for st in steps:
        t0, t1 = st[0]["ts"], max(e["ts"] + e["dur"] for e in st)
        busy, end = 0.0, t0
        for e in st:
            b, f = max(e["ts"], end), e["ts"] + e["dur"]
            if f > b:
                busy += f - b
                end = f
        spans.append(t1 - t0)
        idles.append(t1 - t0 - busy)
        for e in st:
            d = per_name.setdefault(e["name"][:120], [0, 0.0])
            d[0] += 1
            d[1] += e["dur"]
    ns = max(len(steps), 1)
    top = sorted(per_name.items(), key=lambda kv: -kv[1][1])
    summary = {
        "steps": len(steps),
        "kernels_per_step": sum(len(s) for s in steps) / ns,
        "span_us": statistics.median(spans) if spans else None,
        "idle_us": statistics.median(idles) if idles else None,
        "per_name": [
            {"name": k, "per_step": v[0] / ns, "us_per_step": v[1] / ns, "mean_us": v[1] / v[0]}
            for k, v in top
        ],
    }
    first = []
    if steps:
        t0 = steps[0][0]["ts"]
        first = [
            {"name": e["name"][:80], "start_us": e["ts"] - t0, "dur_us": e["dur"]} for e in steps[0]
        ]
    return summary, first


def _trace(step_fn, pos_buf, tok_buf, context: int, n: int, out: Path) -> dict:
    """The kernels of n decode steps as the GPU ran them (CUPTI through torch.profiler: the graph
    replay's kernels with their start and duration), summarized (summarize_trace); the first
    traced step's kernels in order go to decode_trace.json."""
    from torch.profiler import ProfilerActivity, profile

    for i in range(3):
        pos_buf.fill_(context + i)
        step_fn()
    _sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            pos_buf.fill_(context + i)
            tok_buf.fill_((i * 7919) % 251)
            step_fn()
        _sync()
    path = out / "decode_trace.chrome.json"
    prof.export_chrome_trace(str(path))
    summary, first = summarize_trace(json.loads(path.read_text())["traceEvents"])
    (out / "decode_trace.json").write_text(json.dumps(first, indent=0))
    steps = summary["steps"]
    print(
        f"llm: trace of {steps} steps: span {summary['span_us']} us, idle "
        f"{summary['idle_us']} us, {summary['kernels_per_step']:.0f} kernels per step",
        flush=True,
    )
    for r in summary["per_name"][:15]:
        print(
            f"  {r['us_per_step']:8.1f} us  x{r['per_step']:5.1f}  {r['mean_us']:6.2f}  "
            f"{r['name'][:90]}",
            flush=True,
        )
    path.unlink()
    return summary


def _profile(res, C, engines, a, V, P, stream):
    """Per-layer device times of the prefill and decode engines (option profile), grouped by op
    and kernel: the prefill over P tokens from position 0, then the decode over the same cache
    at position 1024 on the GPU (P elsewhere: host positions are checked against the rows
    written)."""
    dev = torch.device(a.device)
    at = 1024 if dev.type == "cuda" else P
    first = None
    for name in ("prefill", "decode"):
        blob, weights = engines[name]
        n = P if name == "prefill" else 1
        eng = C.Engine(blob, dict(weights), device=a.kiln_device, profile=True)
        if first is None:
            first = eng
        else:
            eng.share_states(first)
        tok = tokens(n, V, 5).to(dev)
        pos = torch.arange(n, device=dev) if n > 1 else torch.full((1,), at, device=dev)
        out = torch.empty(1, n, V, dtype=torch.bfloat16, device=dev)
        eng.bind(
            [(tok.data_ptr(), [1, n]), (pos.data_ptr(), [n])],
            [(out.data_ptr(), out.numel() * 2)],
            stream,
        )
        for _ in range(20 if n == 1 else 5):
            eng.execute()
        layers = [x for x in eng.layers() if x["device_us"] is not None and x["device_us"] >= 0]
        if eng is not first:
            eng.close()
        groups: dict = {}
        for x in layers:
            g = groups.setdefault((x["op"], x["kernel"]), [0, 0.0])
            g[0] += 1
            g[1] += x["device_us"]
        total = sum(g[1] for g in groups.values())
        key = "profile" if name == "decode" else f"profile_{name}"
        res[f"{key}_total_us"] = total
        res[f"{key}_groups"] = sorted(
            ([op, kern, k, us] for (op, kern), (k, us) in groups.items()), key=lambda r: -r[3]
        )
        res[f"{key}_top"] = sorted(layers, key=lambda x: -x["device_us"])[:25]
        where = f"at position {at}" if n == 1 else f"of {n} tokens"
        print(f"\nllm: {name} profile {where}: {total:.0f} us of device time per call")
        for op, kern, k, us in res[f"{key}_groups"][:20]:
            print(f"  {op:14s} {kern:22s} x{k:4d} {us:9.1f} us")
        for x in res[f"{key}_top"][:12]:
            print(
                f"  layer {x['layer']:4d} {x['op']:12s} {x['device_us']:8.1f} us  {x['kernel']}: "
                f"{x['detail'][:110]}"
            )
    first.close()


def _table(res):
    print(
        "\n| context | Kiln ms/token | torch eager | eager + CUDA graph | torch.compile | floor "
        "| Kiln / best torch | floor / Kiln |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for c, k in res.get("kiln_decode_ms", {}).items():
        e = res.get("torch_decode_eager_ms", {}).get(c)
        g = res.get("torch_decode_graph_ms", {}).get(c)
        t = res.get("torch_decode_compile_ms", {}).get(c)
        f = res["floor_ms"][c]
        best = min((x for x in (e, g, t) if x is not None), default=None)

        def fmt(x):
            return "-" if x is None else f"{x:.3f}"

        print(
            f"| {c} | {k:.3f} | {fmt(e)} | {fmt(g)} | {fmt(t)} | {f:.3f} "
            f"| {'-' if best is None else f'{k / best:.2f}'} "
            f"| {f / k:.0%} |"
        )
    if "kiln_prefill_ms" in res:
        k = res["kiln_prefill_ms"]
        torch_ms = {
            cfg: res[f"torch_prefill_{cfg}_ms"]
            for cfg in ("eager", "graph", "compile")
            if f"torch_prefill_{cfg}_ms" in res
        }
        best = min(torch_ms.values(), default=None)
        print(
            f"\nprefill {res['meta']['prefill']}: Kiln {k:.2f} ms, torch "
            + ", ".join(f"{cfg} {ms:.2f}" for cfg, ms in torch_ms.items())
            + ("" if best is None else f" ms; Kiln / best torch {k / best:.2f}")
        )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--layers", type=int, default=16)
    e.add_argument("--max-cache", type=int, default=MAX_CACHE)
    e.add_argument("--prefill", type=int, default=PREFILL)
    e.add_argument("--tiny", action="store_true", help="small widths: the flow on the CPU")
    e.add_argument("--verify", action="store_true", help="replay the recording here")
    e.add_argument("--out", default=".dev/llm")
    r = sub.add_parser("run")
    r.add_argument("--dir", default=".dev/llm")
    r.add_argument("--out", default="llm-out")
    r.add_argument("--device", default="cuda:0", help="torch's device")
    r.add_argument("--kiln-device", default="cuda:0")
    r.add_argument("--steps", type=int, default=100)
    r.add_argument("--compile", action="store_true", help="also torch.compile(reduce-overhead)")
    r.add_argument("--profile", action="store_true", help="per-layer times of both engines")
    r.add_argument(
        "--trace", action="store_true", help="the decode step's kernels as the GPU ran them"
    )
    r.add_argument(
        "--no-torch", action="store_true", help="Kiln only (no PyTorch timings): plugin A/B runs"
    )
    a = ap.parse_args(argv)
    {"export": cmd_export, "run": cmd_run}[a.cmd](a)


if __name__ == "__main__":
    main()
