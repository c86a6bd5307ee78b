"""Merges the H200 run's results: ``anchors.json`` (PyTorch anchors and Kiln's C API path, from
bench/anchors_device.py) and ``runner.log`` (kiln_runner through ExecuTorch, from
bench/run_device.sh) into ``results.json`` and a table: each system's median synchronous latency,
Kiln's ratio to the best PyTorch configuration, and the floor. ``--plot`` draws the ratios as a
bar chart (matplotlib, PNG), from that run or from a table already written down.

    python3 bench/report.py --out $OUT [--workdir /tmp/kiln_bench] [--markdown] [--plot PNG]
    python3 bench/report.py --plot docs/benchmarks.png [--from docs/benchmarks.md|results.json]

Ratios: ``kiln C/best`` is the median over interleaved rounds of Kiln's median over the best
anchor's (same process); ``ET/best`` divides kiln_runner's median (a separate process, run after
the anchors, host-clock timed) by the best anchor's overall median.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples" / "cpp"))

ANCHORS = ("eager", "graph", "compile", "autotune")
LOW_CLOCK_MHZ = 1900


def parse_runner_log(text: str) -> dict:
    """{(cfg, variant): {...}} from the sections run_device.sh writes:
    ``=== runner CFG VARIANT`` ... ``=== end rc=N s=S``."""
    out = {}
    cur, body = None, []
    for line in text.splitlines():
        m = re.match(r"=== runner (\S+) (\S+)", line)
        if m:
            cur, body = (m.group(1), m.group(2)), []
            continue
        m = re.match(r"=== end rc=(-?\d+)", line)
        if m and cur:
            out[cur] = _runner_section("\n".join(body), int(m.group(1)))
            cur = None
            continue
        if cur:
            body.append(line)
    return out


def _runner_section(text: str, rc: int) -> dict:
    d: dict = {"rc": rc}
    m = re.search(r"median_ms=([0-9.]+)", text)
    if m:
        d["median_ms"] = float(m.group(1))
    m = re.search(
        r"median ([0-9.]+) ms, min ([0-9.]+) ms, p90 ([0-9.]+) ms, mean ([0-9.]+) ms", text
    )
    if m:
        d.update(min_ms=float(m.group(2)), p90_ms=float(m.group(3)), mean_ms=float(m.group(4)))
    m = re.search(r"engine ready .* on (\S+)", text)
    if m:
        d["device"] = m.group(1)
    m = re.search(r"matches expected \(max \|err\| ([0-9.eE+-]+)", text)
    if m:
        d["expected_ok"], d["max_abs_err"] = True, float(m.group(1))
    elif "MISMATCH" in text:
        d["expected_ok"] = False
    errs = [ln for ln in text.splitlines() if "error" in ln.lower()]
    if errs and rc != 0:
        d["error"] = errs[-1][:300]
    return d


def saved_rel_err(workdir: Path, cfg: str, variant: str) -> float | None:
    out_p = workdir / f"{cfg}.et_{variant}.bin"
    ref_p = workdir / f"{cfg}.ref.pt"
    if not (out_p.exists() and ref_p.exists()):
        return None
    import kiln_tensors
    import torch

    y = kiln_tensors.read(out_p)[0].to(torch.float64)
    ref = torch.load(ref_p).to(torch.float64)
    if y.shape != ref.shape or not torch.isfinite(y).all():
        return math.inf
    return float((y - ref).norm() / ref.norm())


def merge(anchors: dict, runner: dict, workdir: Path) -> dict:
    import models as M  # torch: only for merging a run, not for plotting a table

    models = {}
    for cfg in M.ALL_CONFIGS:
        a = anchors.get("models", {}).get(cfg.name)
        runs = {v: r for (c, v), r in runner.items() if c == cfg.name}
        if a is None and not runs:
            continue
        counts = (a or {}).get("counts") or M.counts(cfg)
        r = {"counts": counts, "systems": {}}
        for name, s in ((a or {}).get("systems") or {}).items():
            r["systems"]["kiln_capi" if name == "kiln" else name] = s
        for variant, d in runs.items():
            d = dict(d)
            d["rel_err"] = saved_rel_err(workdir, cfg.name, variant)
            d["ok"] = (
                d.get("rc") == 0
                and d["rel_err"] is not None
                and d["rel_err"] <= cfg.fam.tol
                and str(d.get("device", "")).startswith("cuda")
            )
            r["systems"][f"kiln_et_{variant}"] = d
        best = None
        for n in ANCHORS:
            s = r["systems"].get(n)
            if s and s.get("ok") and "median_ms" in s:
                if best is None or s["median_ms"] < r["systems"][best]["median_ms"]:
                    best = n
        if best:
            r["best_anchor"] = best
            r["best_anchor_ms"] = r["systems"][best]["median_ms"]
            if a and "kiln_ratio" in a:
                r["ratio_kiln_capi"] = a["kiln_ratio"]["median"]
            for variant in ("devio", "host"):
                s = r["systems"].get(f"kiln_et_{variant}")
                if s and "median_ms" in s:
                    r[f"ratio_kiln_et_{variant}"] = s["median_ms"] / r["best_anchor_ms"]
        clk = (a or {}).get("smi_after") or {}
        if isinstance(clk.get("sm_mhz"), float) and clk["sm_mhz"] < LOW_CLOCK_MHZ:
            r["clock_flag"] = (
                f"SM clock {clk['sm_mhz']:.0f} MHz after the timing (< {LOW_CLOCK_MHZ})"
            )
        r["smi_after"] = clk or None
        models[cfg.name] = r
    return models


def _ms(s: dict | None) -> str:
    if not s:
        return "-"
    if "median_ms" not in s:
        return "skip" if str(s.get("error", "")).startswith("skipped") else "FAIL"
    v = s["median_ms"]
    txt = f"{v * 1e3:.1f}us" if v < 1 else f"{v:.3f}"
    return txt if s.get("ok") else txt + "!"


def _ratio(v) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else "-"


COLUMNS = [
    ("eager", "eager"),
    ("graph", "graph"),
    ("compile", "compile"),
    ("autotune", "autotune"),
    ("kiln_capi", "Kiln C"),
    ("kiln_et_devio", "Kiln ET"),
    ("kiln_et_host", "ET host"),
]


def rows(models: dict):
    for name, r in models.items():
        sy = r["systems"]
        kerr = (sy.get("kiln_capi") or {}).get("rel_err")
        yield [
            name,
            f"{r['counts']['floor_us']:.1f}us",
            *[_ms(sy.get(k)) for k, _ in COLUMNS],
            r.get("best_anchor", "-"),
            _ratio(r.get("ratio_kiln_capi")),
            _ratio(r.get("ratio_kiln_et_devio")),
            f"{kerr:.1e}" if isinstance(kerr, float) and not math.isnan(kerr) else "-",
        ]


HEAD = ["model", "floor", *[h for _, h in COLUMNS], "best", "C/best", "ET/best", "Kiln err"]


def text_table(models: dict) -> str:
    data = [HEAD, *rows(models)]
    w = [max(len(str(row[i])) for row in data) for i in range(len(HEAD))]
    lines = [
        " ".join(str(c).rjust(w[i]) if i else str(c).ljust(w[i]) for i, c in enumerate(row))
        for row in data
    ]
    lines.append(
        "median synchronous latency, ms unless marked; '!' failed the accuracy check; floor = "
        "max(FLOPs / 790 TFLOP/s, fp16 weight bytes / 4.26 TB/s); C = Kiln's C API in the "
        "anchors' process (interleaved); ET = kiln_runner through ExecuTorch (--device-io; "
        "'ET host' with host I/O)"
    )
    for name, r in models.items():
        if "clock_flag" in r:
            lines.append(f"  {name}: {r['clock_flag']}")
    return "\n".join(lines)


def markdown_table(models: dict) -> str:
    out = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows(models)]
    return "\n".join(out)


# --- the plot: Kiln's latency over the best PyTorch configuration's, per model

# The ratio columns drawn, as (results.json key, docs/benchmarks.md column, legend label).
RATIOS = [
    ("ratio_kiln_capi", "C/best", "Kiln through the C API"),
    ("ratio_kiln_et_devio", "ET/best", "Kiln through ExecuTorch (kiln_runner)"),
]


def _cell_number(cell: str) -> float | None:
    m = re.search(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", cell.replace("*", ""))
    return float(m.group(0)) if m else None


def ratios_from_markdown(text: str) -> tuple[str, list[dict]]:
    """(the heading above it, one row per model) from the first results table after
    ``## Results`` (the latest round: docs/benchmarks.md puts the newest first). A row is
    {"model", "best", label: ratio or None for each of RATIOS}."""
    lines = text.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip() == "## Results")
    except StopIteration:
        raise ValueError("no '## Results' section") from None
    heading = ""
    for i in range(start + 1, len(lines)):
        ln = lines[i].strip()
        if ln.startswith("### "):
            heading = ln[4:]
        if not (ln.startswith("| model |") and "C/best" in ln):
            continue
        head = [c.strip() for c in ln.strip("|").split("|")]
        rows = []
        for row in lines[i + 2 :]:
            if not row.strip().startswith("|"):
                break
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            if len(cells) != len(head):
                raise ValueError(f"table row has {len(cells)} cells, the header {len(head)}: {row}")
            d = dict(zip(head, cells, strict=True))
            r = {"model": d["model"], "best": d.get("best", "-")}
            for _key, col, _label in RATIOS:
                r[col] = _cell_number(d.get(col, ""))
            rows.append(r)
        if not rows:
            raise ValueError("the results table has no rows")
        return heading, rows
    raise ValueError("no table with a 'C/best' column after '## Results'")


def ratios_from_models(models: dict) -> list[dict]:
    """The same rows from results.json's (or merge()'s) models."""
    rows = []
    for name, r in models.items():
        row = {"model": name, "best": r.get("best_anchor", "-")}
        for key, col, _label in RATIOS:
            v = r.get(key)
            row[col] = float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None
        rows.append(row)
    return rows


def plot(rows: list[dict], path: Path, title: str = "") -> Path:
    """A grouped bar chart of each model's ratios (below 1: faster than the best PyTorch)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError("nothing to plot")
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 2), 4.6), dpi=110)
    width = 0.8 / len(RATIOS)
    colors = ["#4c72b0", "#dd8452"]
    for k, (_key, col, label) in enumerate(RATIOS):
        xs = [i + (k - (len(RATIOS) - 1) / 2) * width for i in range(len(rows))]
        vals = [r[col] if r[col] is not None else 0.0 for r in rows]
        bars = ax.bar(xs, vals, width, label=label, color=colors[k % len(colors)])
        for b, r in zip(bars, rows, strict=True):
            txt = "n/a" if r[col] is None else f"{r[col]:.2f}"
            ax.annotate(
                txt,
                (b.get_x() + b.get_width() / 2, b.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="best PyTorch (= 1)")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r['model']}\n(vs {r['best']})" for r in rows], fontsize=8)
    ax.set_ylabel("Kiln latency / best PyTorch latency\n(lower is better)")
    top = max([r[c] for r in rows for _k, c, _l in RATIOS if r[c] is not None] + [1.0])
    ax.set_ylim(0, top * 1.12)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=len(RATIOS) + 1)
    ax.set_title(
        "Kiln on the H200: median latency over the best PyTorch configuration's"
        + (f" ({title})" if title else ""),
        fontsize=9,
    )
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="folder with anchors.json and runner.log")
    ap.add_argument("--workdir", default="/tmp/kiln_bench")
    ap.add_argument("--markdown", action="store_true", help="also print a markdown table")
    ap.add_argument("--plot", metavar="PNG", help="draw the ratios to the best PyTorch")
    ap.add_argument(
        "--from",
        dest="source",
        metavar="FILE",
        help="with --plot and no --out: docs/benchmarks.md (its latest results table) or a "
        "results.json (default: docs/benchmarks.md)",
    )
    args = ap.parse_args(argv)
    if args.out is None:
        if args.plot is None:
            ap.error("give --out DIR (merge a run) or --plot PNG (draw a table)")
        src = Path(args.source or HERE.parent / "docs" / "benchmarks.md")
        try:
            if src.suffix == ".json":
                title, rows = src.name, ratios_from_models(json.loads(src.read_text())["models"])
            else:
                title, rows = ratios_from_markdown(src.read_text())
        except (OSError, ValueError, KeyError) as e:
            print(f"report.py: cannot read the results from {src}: {e}", file=sys.stderr)
            return 1
        # The heading's date and round; the rest of it describes the round's work.
        print(f"wrote {plot(rows, Path(args.plot), title.split(':')[0])}")
        return 0
    out = Path(args.out)
    anchors = {}
    if (out / "anchors.json").exists():
        anchors = json.loads((out / "anchors.json").read_text())
    runner = {}
    if (out / "runner.log").exists():
        runner = parse_runner_log((out / "runner.log").read_text(errors="replace"))
    models = merge(anchors, runner, Path(args.workdir))
    doc = {
        "env": anchors.get("env"),
        "export": anchors.get("export"),
        "smi_before": anchors.get("smi_before"),
        "smi_after": anchors.get("smi_after"),
        "models": models,
    }
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    print(text_table(models))
    if args.markdown:
        print()
        print(markdown_table(models))
    if args.plot:
        print(f"wrote {plot(ratios_from_models(models), Path(args.plot), out.name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
