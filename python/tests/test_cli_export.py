"""Progress while exporting (the builder's C callback through Graph.build, the tqdm bar on a
terminal, nothing otherwise), the export report, strict=, and bench/report.py's plot."""

from __future__ import annotations

import copy
import importlib.util
import io
import sys
from pathlib import Path

import pytest
import torch
from kiln import _graph, _ops
from kiln.executorch import ExportReport, KilnStrictError, export, save

ROOT = Path(__file__).resolve().parents[2]


class Partial(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        y = torch.atan(torch.relu(self.a(x)))  # atan: left to ExecuTorch
        return self.b(y)


def _graph_relu_linear():
    g = _graph.Graph()
    x = g.add_input("x", _ops.DTYPE_F32, [2, 8], [2, 8])
    w = g.add_constant("w", torch.randn(4, 8))
    (y,) = g.add_node("linear", [x, w, None])
    (z,) = g.add_node("relu", [y])
    (t,) = g.add_node("tanh", [x])
    g.mark_output(z, "z")
    g.mark_output(t, "t")
    return g


def test_build_progress_events():
    g = _graph_relu_linear()
    events = []
    plain = g.build()
    reported = g.build(progress=lambda *e: events.append(e))
    assert reported.engine == plain.engine  # reporting changes nothing
    passes = [e for e in events if e[0] == "pass"]
    assert [p[1] for p in passes][:2] == ["verify", "dce"] and passes[-1][1] == "check"
    assert [p[2] for p in passes] == list(range(1, len(passes) + 1))
    assert {p[3] for p in passes} == {len(passes)}
    layers = [e for e in events if e[0] == "layer"]
    # linear + relu fuse into one group; tanh is another
    assert sorted(la[1] for la in layers) == ["linear", "tanh"]
    assert [la[2] for la in layers] == [1, 2] and {la[3] for la in layers} == {2}
    assert [e[1] for e in events if e[0] == "output"] == ["memory plan", "serialize", "self-check"]
    assert [e[0] for e in events] == ["pass"] * len(passes) + ["layer"] * 2 + ["output"] * 3
    g.close()


def test_an_exception_in_the_callback_stops_the_build():
    g = _graph_relu_linear()
    seen = []

    class Stop(Exception):
        pass

    def cb(phase, name, step, n):
        seen.append(name)
        if phase == "layer":
            raise Stop("user pressed Ctrl-C")

    with pytest.raises(Stop, match="Ctrl-C"):
        g.build(progress=cb)
    assert seen[-1] in ("linear", "tanh") and "serialize" not in seen
    assert g.build().engine  # the graph still builds afterwards
    g.close()


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_bar_and_report_on_a_terminal_only(tmp_path, monkeypatch, capsys):
    pytest.importorskip("tqdm")  # the bar is drawn only where tqdm is installed
    model = Partial().eval()
    x = torch.randn(3, 8)
    term = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", term)
    prog = save(model, tmp_path / "a.pte", (x,), external_data="aw")
    shown = term.getvalue()
    assert "Kiln engine 0" in shown and "Kiln export report" in shown
    assert "atan" in shown and "wrote " in shown
    # quiet: nothing, even on a terminal
    term2 = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", term2)
    save(model, tmp_path / "b.pte", (x,), quiet=True)
    assert term2.getvalue() == ""
    monkeypatch.undo()
    # not a terminal (pytest's capture): nothing either
    save(model, tmp_path / "c.pte", (x,))
    assert capsys.readouterr().err == ""
    rep = prog.kiln_report
    assert isinstance(rep, ExportReport)
    (m,) = rep.methods.values()
    assert [d["backend"] for d in m["delegates"]] == ["KilnBackend", "KilnBackend"]
    assert m["outside"] == {"aten.atan.default": 1}
    e0, e1 = rep.engines
    assert e0.n_layers == 1 and e0.engine_nbytes > 0  # linear + relu: one kernel group
    # weights of 64 bytes or more go to aw.ptd (the 16-byte bias of b stays inline)
    assert (e0.external_nbytes, e1.external_nbytes) == (16 * 8 * 4 + 16 * 4, 4 * 16 * 4)
    assert rep.files[str(tmp_path / "aw.ptd")] == (tmp_path / "aw.ptd").stat().st_size
    assert set(rep.phases) == {"torch.export", "partition + lower", "to_executorch", "write"}
    assert rep.files[str(tmp_path / "a.pte")] == (tmp_path / "a.pte").stat().st_size
    d = rep.to_dict()
    assert d["rejected"][0]["op"] == "aten.atan.default"


def test_strict_lists_what_was_left_out(tmp_path):
    model = Partial().eval()
    with pytest.raises(KilnStrictError) as ei:
        save(model, tmp_path / "s.pte", (torch.randn(3, 8),), strict=True, quiet=True)
    msg = str(ei.value)
    assert "strict=True: KilnPartitioner left 1 node(s) to ExecuTorch" in msg
    assert "aten.atan.default" in msg
    assert f"{Path(__file__).name}:" in msg  # the model's file:line
    (r,) = ei.value.rejected
    assert r["source"].endswith(f"{Path(__file__).name}:{_line_of('torch.atan')}")
    assert not (tmp_path / "s.pte").exists()  # nothing written
    # a model Kiln takes whole passes strict
    full = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    prog = export(full, (torch.randn(2, 8),), strict=True, quiet=True)
    assert prog.kiln_report.rejected == []
    with pytest.raises(TypeError, match="strict must be a bool"):
        export(full, (torch.randn(2, 8),), strict="yes")
    with pytest.raises(TypeError, match="quiet must be a bool"):
        export(full, (torch.randn(2, 8),), quiet=1)


def _line_of(text: str) -> int:
    for i, line in enumerate(Path(__file__).read_text().splitlines(), start=1):
        if text in line and "def " not in line and "_line_of" not in line:
            return i
    raise AssertionError(text)


def _net_file(tmp_path: Path, returned: str) -> Path:
    """m.py holding Net: one Linear(4, 4) ``self.l``, forward returning ``returned`` (line 6)."""
    src = tmp_path / "m.py"
    src.write_text(
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.l = torch.nn.Linear(4, 4)\n"
        "    def forward(self, x):\n"
        f"        return {returned}\n"
    )
    return src


class SoftmaxBetween(Partial):
    """Partial's layers around a softmax: a model Kiln takes whole."""

    def forward(self, x):
        return self.b(torch.softmax(self.a(x), dim=-1) * 3.0)


@pytest.mark.parametrize("name", ["aten._softmax.default", "aten._softmax"])
def test_executorch_ops_leaves_the_named_op_to_executorch(tmp_path, name, capsys):
    """An op Kiln takes, named in executorch_ops: a Kiln delegate on each side of it, the node
    in the report with that reason, the program's values those of eager PyTorch."""
    import kiln_executorch_runtime  # noqa: F401 - registers KilnBackend
    from conftest import assert_close
    from executorch.runtime import Runtime

    model = SoftmaxBetween().eval()
    x = torch.randn(3, 8)
    whole = export(model, (x,), quiet=True)
    assert whole.kiln_report.rejected == []
    prog = export(model, (x,), quiet=True, executorch_ops=[name])
    (m,) = prog.kiln_report.methods.values()
    assert [d["backend"] for d in m["delegates"]] == ["KilnBackend", "KilnBackend"]
    assert m["outside"] == {"aten._softmax.default": 1}
    (r,) = prog.kiln_report.rejected
    assert "executorch_ops" in r["reason"]
    assert r["source"].endswith(f"{Path(__file__).name}:{_line_of('torch.softmax(self.a(x)')}")
    fresh = torch.randn(3, 8)
    method = Runtime.get().load_program(prog.buffer).load_method("forward")
    assert_close(method.execute([fresh]), [model(fresh)])
    # save() takes it too, and kiln-export's --executorch-op
    save(model, tmp_path / "s.pte", (x,), quiet=True, executorch_ops=[name])
    from kiln.cli import main

    src = _net_file(tmp_path, "self.l(torch.softmax(self.l(x), -1))")
    out = tmp_path / "c.pte"
    assert main([f"{src}:Net", str(out), "--input", "2x4", "--executorch-op", name]) == 0
    assert "2 Kiln delegate call(s)" in capsys.readouterr().out


def test_executorch_ops_names_are_checked():
    model = SoftmaxBetween().eval()
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match="'aten.sofmax' is no ATen op"):
        export(model, (x,), quiet=True, executorch_ops=["aten.sofmax"])
    with pytest.raises(ValueError, match="is no ATen op"):
        export(model, (x,), quiet=True, executorch_ops=["softmax"])
    with pytest.raises(TypeError, match="executorch_ops must be a list of op names"):
        export(model, (x,), quiet=True, executorch_ops="aten._softmax.default")


def test_partitioner_record_is_used_when_present(tmp_path, monkeypatch):
    """KilnPartitioner.rejected, when the partitioner keeps it, is the report's list."""
    from kiln.executorch import partitioner as part

    recorded = [
        {"op": "aten.cumsum.default", "reason": "no Kiln op for cumsum", "source": "m.py:3"}
    ]
    # the partitioner's record of one program (it accumulates them over the methods)
    monkeypatch.setattr(part, "rejections", lambda *args: list(recorded))
    with pytest.raises(KilnStrictError, match="m.py:3: no Kiln op for cumsum"):
        export(Partial().eval(), (torch.randn(3, 8),), strict=True, quiet=True)
    prog = export(Partial().eval(), (torch.randn(3, 8),), quiet=True)
    assert prog.kiln_report.rejected == recorded
    assert "m.py:3: no Kiln op for cumsum" in str(prog.kiln_report)


def test_kiln_export_reports_and_refuses_a_missing_module(tmp_path, capsys):
    from kiln.cli import main

    assert main(["no_such_module:Net", str(tmp_path / "a.pte")]) == 2
    err = capsys.readouterr().err
    assert "kiln-export: error:" in err and "cannot import 'no_such_module'" in err
    assert "Traceback" not in err
    src = _net_file(tmp_path, "torch.atan(self.l(x))")
    assert main([f"{src}:Net", str(tmp_path / "b.pte"), "--input", "2x4"]) == 0
    out = capsys.readouterr().out
    assert "Kiln export report" in out and "aten.atan.default" in out
    assert main([f"{src}:Net", str(tmp_path / "c.pte"), "--input", "2x4", "--strict"]) == 1
    assert f"{src}:6" in capsys.readouterr().err
    assert main([f"{src}:Net", str(tmp_path / "d.pte"), "--input", "2x4", "--quiet"]) == 0
    assert "Kiln export report" not in capsys.readouterr().out


# --- bench/report.py's plot


def _report_module():
    spec = importlib.util.spec_from_file_location("kiln_bench_report", ROOT / "bench" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


HEAD = (
    "| model | floor | eager | graph | compile | Kiln C | Kiln ET | ET host | best | C/best "
    "| ET/best | Kiln err |"
)
TABLE = """# Benchmarks

## Results

### 2031-01-02, round 99: newest

HEAD
|---|---|---|---|---|---|---|---|---|---|---|---|
| a_b1 | 1 µs | 2 | 1 | 3 | 1.1 | **0.5** | 1 | graph | 1.10 | **0.50** | 1e-4 |
| b_b8 | 1 µs | 2 | 1 | 3 | 0.8 | FAIL | 1 | compile | 0.80 | - | 1e-4 |

### 2030-12-01, round 98: older

HEAD
|---|---|---|---|---|---|---|---|---|---|---|---|
| a_b1 | 1 µs | 2 | 1 | 3 | 9 | 9 | 9 | graph | 9.00 | 9.00 | 1e-4 |
""".replace("HEAD", HEAD)


def test_report_reads_the_latest_table_and_plots(tmp_path):
    rep = _report_module()
    title, rows = rep.ratios_from_markdown(TABLE)
    assert title.startswith("2031-01-02, round 99")
    assert rows == [
        {"model": "a_b1", "best": "graph", "C/best": 1.10, "ET/best": 0.50},
        {"model": "b_b8", "best": "compile", "C/best": 0.80, "ET/best": None},
    ]
    models = {"a_b1": {"best_anchor": "graph", "ratio_kiln_capi": 1.1, "ratio_kiln_et_devio": 0.5}}
    assert rep.ratios_from_models(models)[0] == rows[0]
    with pytest.raises(ValueError, match="Results"):
        rep.ratios_from_markdown("# nothing here\n")
    # the real docs/benchmarks.md: its latest table has a row per model of bench/models.py
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    _title, doc_rows = rep.ratios_from_markdown(text)
    assert doc_rows and all(r["C/best"] is not None for r in doc_rows)
    pytest.importorskip("matplotlib")  # drawing needs matplotlib (reading the table does not)
    png = rep.plot(rows, tmp_path / "r.png", "test")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    import matplotlib.image

    h, w, _ = matplotlib.image.imread(str(png)).shape
    assert w > h > 200


# --- bench/anchors_device.py: which torch.compile anchors a config gets


def _anchors_module():
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(
            "kiln_bench_anchors", ROOT / "bench" / "anchors_device.py"
        )
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return mod


def test_anchors_compile_modes_within_the_budget():
    import time
    import types

    anc = _anchors_module()
    cfg = types.SimpleNamespace(name="resnet50_b1", family="resnet50")
    est = anc.COMPILE_EST_S["resnet50"]

    def args(systems, budget, **kw):
        a = dict(systems=systems, budget_s=budget, no_compile=False, compile_models="")
        a.update(kw)
        a = types.SimpleNamespace(**a)
        a._rest_est = {cfg.name: 10}
        return a

    now = time.time()
    both = "eager,graph,compile,autotune,kiln"
    # max-autotune only where asked for, and only where its longer compile fits the budget
    assert anc.compile_allowed(cfg, args("eager,compile", 1e4), now, "autotune") == (
        False,
        "not asked",
    )
    assert anc.compile_allowed(cfg, args(both, 1e4), now, "autotune") == (True, "")
    tight = est + 10 + 5  # reduce-overhead's estimate fits, max-autotune's does not
    assert anc.compile_allowed(cfg, args(both, tight), now, "compile") == (True, "")
    ok, why = anc.compile_allowed(cfg, args(both, tight), now, "autotune")
    assert not ok and why.startswith("budget: ~") and str(est * anc.AUTOTUNE_EST_FACTOR + 10) in why
    # --no-compile and --compile-models hold for both modes
    for name in anc.COMPILE_MODES:
        assert anc.compile_allowed(cfg, args(both, 1e4, no_compile=True), now, name) == (
            False,
            "--no-compile",
        )
        assert not anc.compile_allowed(cfg, args(both, 1e4, compile_models="bert"), now, name)[0]
    assert anc.COMPILE_MODES == {"compile": "reduce-overhead", "autotune": "max-autotune"}
    assert set(anc.COMPILE_MODES) <= set(anc.ANCHORS)


# --- bench/ab_plugins.py: the A/B's variants, order, decision diff and table


def _ab_module():
    spec = importlib.util.spec_from_file_location("kiln_bench_ab", ROOT / "bench" / "ab_plugins.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ab_plugins_variants_order_diffs_and_table():
    ab = _ab_module()
    v = ab.parse_variants("old=/a/old.so, new=/b/new.so|use_cuda_graphs=false|cuda.gemv=0")
    assert v == [
        ("old", "/a/old.so", []),
        ("new", "/b/new.so", [("use_cuda_graphs", "false"), ("cuda.gemv", "0")]),
    ]
    for bad in ("old", "a=/x.so,a=/y.so", "a=", "a=/x.so|nokey"):
        with pytest.raises(ValueError):
            ab.parse_variants(bad)
    # every other round reversed
    assert [n for n, _, _ in ab.round_order(v, 0)] == ["old", "new"]
    assert [n for n, _, _ in ab.round_order(v, 1)] == ["new", "old"]
    la = [{"layer": 0, "op": "conv2d", "kernel": "cudnn", "detail": "algo 1", "n_fused": 1}]
    lb = [{"layer": 0, "op": "conv2d", "kernel": "cudnn", "detail": "algo 2", "n_fused": 1}]
    assert ab.layer_diffs(la, la) == []
    d = ab.layer_diffs(la, lb)
    assert len(d) == 1 and d[0]["layer"] == 0
    assert ab.layer_diffs(la, la + lb)[-1]["op"] == "count"
    res = {
        "models": {
            "m": {
                "rounds": [
                    {"old": {"steady_ms": 1.0}, "new": {"steady_ms": 1.1}},
                    {"old": {"steady_ms": 1.0}, "new": {"error": "x"}},
                    {"old": {"steady_ms": 2.0}, "new": {"steady_ms": 1.2}},
                ]
            }
        }
    }
    rows = ab.table(res, ["old", "new"]).splitlines()
    assert rows[2] == "| m | old | 1.0000 / 1.0000 / 2.0000 | 1.0000 | 1.000 |"
    assert rows[3] == "| m | new | 1.1000 / 1.2000 | 1.1500 | 1.150 |"


def test_ab_plugins_sets_options_of_each_type():
    import ctypes

    from kiln import _lib

    ab = _ab_module()
    lib = ctypes.CDLL(_lib.library_path())
    buf = ctypes.create_string_buffer(4096)
    lib.kiln_get_option.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]

    def get(name):
        assert lib.kiln_get_option(name.encode(), buf, len(buf)) == 0
        return buf.value.decode()

    names = ("cuda.gemv", "cuda.profile_delay_us", "tuning_cache")
    before = {n: get(n) for n in names}
    try:
        ab.set_option(lib, "cuda.gemv", "false")  # bool
        ab.set_option(lib, "cuda.profile_delay_us", "250")  # int
        ab.set_option(lib, "tuning_cache", "off")  # string
        assert [get(n) for n in names] == ["false", "250", "off"]
        with pytest.raises(RuntimeError, match="cuda.nothing"):
            ab.set_option(lib, "cuda.nothing", "1")
    finally:
        for n, v in before.items():
            ab.set_option(lib, n, v)
    assert {n: get(n) for n in names} == before


# --- bench/llm.py: the decode trace's summary


def test_llm_trace_summary_by_hand():
    spec = importlib.util.spec_from_file_location("kiln_bench_llm", ROOT / "bench" / "llm.py")
    llm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(llm)

    def k(name, ts, dur):
        return {"cat": "kernel", "name": name, "ts": ts, "dur": dur}

    def step(t0):
        # 12 kernels: a, then b overlapping a by 1 us (PDL), a 2 us gap, then ten c's back to back
        ev = [k("gemv_a", t0, 5.0), k("sdpa_b", t0 + 4.0, 3.0)]
        ev += [k("merge_c", t0 + 9.0 + i, 1.0) for i in range(10)]
        return ev

    fill = {"cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<FillFunctor>"}
    events = [dict(fill, ts=0.0, dur=0.5), dict(fill, ts=1.0, dur=0.5)] + step(10.0)
    events += [dict(fill, ts=100.0, dur=0.5), dict(fill, ts=101.0, dur=0.5)] + step(110.0)
    events += [{"cat": "cpu_op", "name": "x", "ts": 50.0, "dur": 1.0}]  # not a kernel
    events += [k("short_run", 200.0 + i, 0.5) for i in range(3)]  # after a fill-less gap
    summary, first = llm.summarize_trace(events)
    # the third run (15 kernels: 12 of step 2 plus the 3 after it) merges with step 2: two steps
    assert summary["steps"] == 2
    # step 1: span 10 .. 29 = 19 us; busy a 5 + b 2 (its first us overlaps a) + 10 c's = 17
    assert first[0]["name"] == "gemv_a" and first[0]["start_us"] == 0.0
    assert len(first) == 12 and first[-1]["start_us"] == 18.0
    spans = sorted([19.0, 202.5 - 110.0])
    assert summary["span_us"] == pytest.approx(sum(spans) / 2)
    names = {r["name"]: r for r in summary["per_name"]}
    assert names["merge_c"]["per_step"] == 10 and names["merge_c"]["mean_us"] == 1.0
    assert names["gemv_a"]["us_per_step"] == 5.0
    assert summary["per_name"][0]["name"] == "merge_c"  # the most device time first


def test_bench_names_a_model_library_version_mismatch():
    """The device route regenerates weights by parameter name: a rebuild that fails on another
    transformers/timm/torchvision version says which (bench/models.py)."""
    anc = _anchors_module()
    M = anc.M
    here = M.library_versions()
    assert set(here) == set(M.MODEL_LIBRARIES) and all(isinstance(v, str) for v in here.values())
    assert M.library_mismatch(None, here) == "" and M.library_mismatch({}, here) == ""
    assert M.library_mismatch(dict(here), here) == ""
    other = dict(here, transformers="0.0.1")
    why = M.library_mismatch(other, here)
    assert f"transformers 0.0.1 at export, {here['transformers']} here" in why
    assert "timm" not in why and "export with the same versions" in why


def test_bench_weights_survive_a_parameter_rename():
    """transformers renamed DINOv2's attention projections (attention.attention.query ->
    attention.q_proj); the device route keys weights, checksum and recording by the renamed
    name, so a model built with either version gets the same weights and rebuilds the engine."""
    import torch.nn as nn

    anc = _anchors_module()
    M = anc.M
    spec = importlib.util.spec_from_file_location(
        "kiln_bench_record", ROOT / "bench" / "kiln_record.py"
    )
    R = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(R)

    def tree(old: bool) -> nn.Module:
        att = nn.Module()
        if old:
            att.attention = nn.Module()
            for n in ("query", "key", "value"):
                setattr(att.attention, n, nn.Linear(8, 8))
            att.output = nn.Module()
            att.output.dense = nn.Linear(8, 8)
        else:
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                setattr(att, n, nn.Linear(8, 8))
        layer = nn.Module()
        layer.attention, layer.norm1 = att, nn.LayerNorm(8)
        enc = nn.Module()
        enc.layer = nn.ModuleList([layer, copy.deepcopy(layer)])
        root = nn.Module()
        root.encoder = enc
        return root

    fam = "zoo_dinov2_small"
    old, new = M.zoo_init_(tree(True), fam), M.zoo_init_(tree(False), fam)
    canon = M.canonical_names(fam)
    assert (
        canon("encoder.layer.1.attention.attention.key.bias")
        == "encoder.layer.1.attention.k_proj.bias"
    )
    assert (
        canon("encoder.layer.1.attention.output.dense.weight")
        == "encoder.layer.1.attention.o_proj.weight"
    )
    t_old, t_new = R.named_tensors(old, canon), R.named_tensors(new, canon)
    assert sorted(t_old) == sorted(t_new) and len(t_new) == 2 * (4 * 2 + 2)
    for k in t_new:
        assert torch.equal(t_old[k], t_new[k]), k
    assert M.state_checksum(old, fam) == M.state_checksum(new, fam)
    # without the family's renames the two trees differ (the check can fail)
    assert M.state_checksum(old) != M.state_checksum(new)
    assert M.canonical_names("zoo_bert") is None


def test_bench_heldout_configs_build_the_heldout_models():
    """bench/models.py's held-out configs are bench/heldout.py's models at the GPU sizes: the
    inputs they generate have the kinds and shapes of heldout's own example, the weights are
    the same on every build, and the model runs on them."""
    anc = _anchors_module()
    M = anc.M
    import heldout

    configs = M.select("heldout")
    assert [c.name for c in configs] == [f"ho_{n}_b1" for n in M.HELDOUT_BENCH]
    assert all(n in heldout.MODELS for n in M.HELDOUT_BENCH)
    cfg = M.CONFIG_BY_NAME["ho_xlm_roberta_b1"]
    _, example = M._heldout_make("xlm_roberta")
    assert heldout.SEQ == 128 and heldout.LAYERS == 6
    xs = M.make_inputs(cfg)
    assert [tuple(t.shape) for t in xs] == [tuple(t.shape) for t in example] == [(1, 128)] * 2
    assert xs[0].dtype == torch.int64 and 0 <= int(xs[0].min()) and int(xs[0].max()) < 1024
    assert set(xs[1].unique().tolist()) == {0, 1}  # the mask, its last quarter padded
    m1, m2 = M.build_model(cfg.family), M.build_model(cfg.family)
    assert len(m1.m.m.encoder.layer) == 6
    assert M.state_checksum(m1, cfg.family) == M.state_checksum(m2, cfg.family)
    with torch.no_grad():
        y = m1(*xs)
    assert y.shape == (1, 128, 768) and torch.isfinite(y).all() and float(y.std()) > 0.1
    # the CNN flag picks channels-last PyTorch anchors
    assert M.family_by_name("ho_resnext50_32x4d").cnn and not M.family_by_name("ho_t5").cnn
