# SPDX-License-Identifier: Apache-2.0
"""Per-model kernel report from graph replays traced on the GPU (bench/ab_plugins.py --trace) and
the export's manifest (bench/export_here.py): what each model's execute launches and where its
time goes, by kernel family, with the math and weight-stream rates the GEMMs reach.

    python3 bench/kernel_report.py OUT/ab/ab.json .dev/zooP/manifest.json [--variant new] \\
        [--hbm-tbs 3.35] [--json report.json]

Per model (one ab.json variant, round 0): kernels per execute and per Kiln layer that runs
(layers from the round's layer information), the replay's span and idle time (CUPTI, median of
20 replays), the time of each family (GEMM: cuBLASLt's nvjet/xmma kernels, Kiln's GEMV, small-M
wgmma and K-split kernels; conv; attention with eager attention's softmax; norm; reduce;
elementwise; layout: copies, permutes, concatenations, resizes; other), the model's analytic
FLOPs over the GEMM, conv and attention time (TFLOP/s), and its weight bytes over the GEMM and
conv time (TB/s; the HBM's peak given by --hbm-tbs, 3.35 for the H100 SXM, 4.8 for the H200):
each weight is read once per execute, so this is the weight stream's rate, a lower bound on what
those kernels moved.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

# first match wins: convolution kernels before GEMMs (cuDNN's implicit GEMMs name both)
FAMILIES = [
    ("conv", r"conv|convolve|fprop|dgrad|stem_kernel|nchwToNhwc|tensorTransform"),
    ("gemm", r"nvjet|gemm|xmma|cutlass|wg_linear|sk_reduce|gemv|sm90_|sm80_"),
    ("attention", r"sdpa|flash|fmha|attn|wsum|softmax"),
    ("norm", r"norm|gn_"),
    ("reduce", r"reduce|argmax|cumsum"),
    ("elementwise", r"ew_|rotary|rope|logic|where|act|embedding|gather|index"),
    ("layout", r"copy|permute|transpose|cat_|pad_|resize"),
]


def family(name: str) -> str:
    low = name.lower()
    for fam, pat in FAMILIES:
        if re.search(pat, low):
            return fam
    return "other"


def model_report(entry: dict, counts: dict, hbm_tbs: float) -> dict:
    """One model's report from its ab.json variant entry (trace, layers) and manifest counts."""
    t = entry.get("trace") or {}
    per_name = t.get("per_name") or []
    if not per_name:
        raise ValueError("no trace in this entry (run bench/ab_plugins.py with --trace)")
    fams: dict = {}
    for r in per_name:
        f = fams.setdefault(family(r["name"]), [0.0, 0.0])
        f[0] += r["per_step"]
        f[1] += r["us_per_step"]
    busy = sum(v[1] for v in fams.values())
    # layers that launch work: not views ("none") nor tails run by their head ("fused")
    layers = [
        x for x in entry.get("layers") or [] if x.get("kernel") not in (None, "none", "fused")
    ]
    math_us = sum(fams.get(k, [0, 0])[1] for k in ("gemm", "conv", "attention"))
    weight_us = sum(fams.get(k, [0, 0])[1] for k in ("gemm", "conv"))
    flops, wbytes = counts.get("flops"), counts.get("weight_bytes")
    rep = {
        "kernels": t.get("kernels_per_step"),
        "layers_run": len(layers) or None,
        "span_us": t.get("span_us"),
        "idle_us": t.get("idle_us"),
        "busy_us": busy,
        "families": {k: {"kernels": v[0], "us": v[1]} for k, v in sorted(fams.items())},
        "math_tflops": flops / math_us / 1e6 if flops and math_us > 0 else None,
        "weight_tbs": wbytes / weight_us / 1e6 if wbytes and weight_us > 0 else None,
    }
    if rep["weight_tbs"] is not None and hbm_tbs > 0:
        rep["weight_of_peak"] = rep["weight_tbs"] / hbm_tbs
    if rep["kernels"] and rep["layers_run"]:
        rep["kernels_per_layer"] = rep["kernels"] / rep["layers_run"]
    return rep


def report(ab: dict, manifest: dict, variant: str | None, hbm_tbs: float) -> dict:
    out = {}
    for m, d in ab.get("models", {}).items():
        rounds = d.get("rounds") or []
        if not rounds:
            continue
        row = rounds[0]
        name = variant or next(iter(row))
        if name not in row:
            raise SystemExit(f"kernel_report: {m} has no variant {name!r} (has {sorted(row)})")
        counts = (manifest.get("models", {}).get(m) or {}).get("counts") or {}
        try:
            out[m] = model_report(row[name], counts, hbm_tbs)
        except ValueError as e:
            out[m] = {"error": str(e)}
    return out


def table(rep: dict) -> str:
    fams = [f for f, _ in FAMILIES] + ["other"]
    head = "| model | kernels | per layer | span us | idle us | "
    head += " | ".join(f"{f} us" for f in fams) + " | math TFLOP/s | weights TB/s |"
    lines = [head, "|" + "---|" * (7 + len(fams))]

    def num(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    for m, r in rep.items():
        if "error" in r:
            lines.append(f"| {m} | {r['error']} |")
            continue
        cells = [num(r["families"].get(f, {}).get("us"), ".0f") for f in fams]
        peak = f" ({r['weight_of_peak']:.0%})" if "weight_of_peak" in r else ""
        lines.append(
            f"| {m} | {num(r['kernels'], '.0f')} | {num(r.get('kernels_per_layer'), '.2f')} | "
            f"{num(r['span_us'], '.0f')} | {num(r['idle_us'], '.0f')} | "
            + " | ".join(cells)
            + " | "
            f"{num(r['math_tflops'], '.0f')} | {num(r['weight_tbs'], '.2f')}{peak} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ab_json")
    ap.add_argument("manifest")
    ap.add_argument("--variant", help="the ab.json variant to report (default: the first)")
    ap.add_argument("--hbm-tbs", type=float, default=3.35, help="the card's HBM peak, TB/s")
    ap.add_argument("--json", help="also write the report as JSON here")
    a = ap.parse_args(argv)
    with open(a.ab_json) as f:
        ab = json.load(f)
    with open(a.manifest) as f:
        manifest = json.load(f)
    rep = report(ab, manifest, a.variant, a.hbm_tbs)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1)
    print(table(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
