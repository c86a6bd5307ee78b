"""The ``kiln`` command (python/kiln/_cli; docs/cli.md) on programs exported here: inspect
(against ExecuTorch's own deserializer and the model's parameters), run (against eager
PyTorch), bench, profile (the trace), doctor, and every subcommand on malformed files (truncated,
bit flips, not a program): no crash, a clear error, valid JSON with --json."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_bytes import fix_crcs
from kiln._cli import main
from kiln.executorch import save

ROOT = Path(__file__).resolve().parents[2]


class Net(torch.nn.Module):
    """Linear + ReLU (one Kiln engine), atan (left to ExecuTorch), Linear (a second engine)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x):
        y = torch.relu(self.a(x))
        y = torch.atan(y)
        return self.b(y)


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    torch.manual_seed(1)
    net = Net().eval()
    x = torch.randn(4, 16)
    save(net, d / "net.pte", (x,), external_data="netw", quiet=True)
    save(net, d / "inline.pte", (x,), quiet=True)
    return {
        "dir": d,
        "net": net,
        "x": x,
        "pte": d / "net.pte",
        "ptd": d / "netw.ptd",
        "inline": d / "inline.pte",
    }


def kiln(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def kiln_json(*args) -> tuple[int, dict]:
    rc, out, _err = kiln(*args, "--json")
    return rc, json.loads(out)


# --- inspect


def test_inspect_matches_executorch_and_the_model(programs):
    from executorch.exir._serialize._program import deserialize_pte_binary

    rc, doc = kiln_json("inspect", programs["pte"])
    assert rc == 0, doc
    data = programs["pte"].read_bytes()
    ref = deserialize_pte_binary(data).program
    (plan,) = ref.execution_plan
    (m,) = doc["methods"]
    assert m["name"] == plan.name == "forward"
    assert [d["backend"] for d in m["delegates"]] == [d.id for d in plan.delegates]
    assert [d["backend"] for d in m["delegates"]] == ["KilnBackend", "KilnBackend"]
    ops = [f"{o.name}.{o.overload}" for o in plan.operators]
    assert [o["op"] for o in m["outside"]] == ops == ["aten::atan.out"]
    assert "no translation for aten::atan" in m["outside"][0]["why"]
    assert m["calls"] == [
        "delegate 0 (KilnBackend)",
        "aten::atan.out",
        "delegate 1 (KilnBackend)",
    ]
    assert m["inputs"][0]["sizes"] == [4, 16] and m["inputs"][0]["dtype"] == "float32"
    assert m["outputs"][0]["sizes"] == [4, 8]
    e0, e1 = doc["engines"]
    net = programs["net"]
    # the engines' weights are the model's parameters, byte for byte in count
    a_bytes = (net.a.weight.numel() + net.a.bias.numel()) * 4
    assert e0["external_weight_nbytes"] + e0["inline_weight_nbytes"] == a_bytes
    (l0,) = e0["layers"]
    assert l0["op"] == "linear" and l0["fused"] == ["relu"] and l0["weight_nbytes"] == a_bytes
    assert l0["output"]["dim_max"] == [4, 32] and l0["output"]["dtype"] == "float32"
    assert e1["layers"][0]["op"] == "linear" and e1["outputs"][0]["dim_max"] == [4, 8]
    assert e0["missing_weights"] == [] and e1["missing_weights"] == []
    assert doc["ptd"]["expected"][0]["file"] == "netw.ptd"
    assert doc["ptd"]["read"] == [str(programs["ptd"])]
    assert doc["problems"] == []


def test_inspect_engine_bytes_and_text(programs, tmp_path):
    from kiln import _pte

    prog = _pte.read_program(programs["inline"].read_bytes())
    engine = prog.methods[0].delegates[0].data
    (tmp_path / "e.kln").write_bytes(engine)
    rc, doc = kiln_json("inspect", tmp_path / "e.kln")
    assert rc == 0 and doc["kind"] == "engine" and doc["nbytes"] == len(engine)
    assert [la["op"] for la in doc["layers"]] == ["linear", "relu"]
    rc, out, _ = kiln("inspect", programs["pte"], "--layers")
    assert rc == 0
    assert "left to ExecuTorch" in out and "aten::atan.out x1" in out
    assert "linear + relu" in out and "expects netw.ptd" in out


def test_inspect_without_the_ptd_says_what_is_missing(programs, tmp_path):
    lone = tmp_path / "net.pte"
    lone.write_bytes(programs["pte"].read_bytes())
    rc, doc = kiln_json("inspect", lone)
    assert rc == 1
    assert any("netw.ptd" in p and "does not exist" in p for p in doc["problems"]), doc
    assert any("external weights are in neither" in p for p in doc["problems"]), doc
    rc, doc = kiln_json("inspect", lone, "--data", programs["ptd"])
    assert rc == 0 and doc["problems"] == []


def _engine_with_names(names: dict[bytes, bytes]) -> bytes:
    """A one-relu engine whose input and output names are replaced in its bytes (each
    placeholder by a name of the same length), with every CRC recomputed (docs/format.md §2)."""
    from kiln import _graph, _ops

    g = _graph.Graph()
    ph = list(names)
    x = g.add_input(ph[0].decode(), _ops.DTYPE_F32, [2, 3], [2, 3])
    (y,) = g.add_node("relu", [x])
    g.mark_output(y, ph[1].decode())
    e = bytearray(g.build().engine)
    g.close()
    for old, new in names.items():
        at = e.find(old + b"\0")
        assert at >= 0 and len(old) == len(new)
        e[at : at + len(new)] = new
    fix_crcs(e)
    return bytes(e)


def test_names_with_control_bytes_are_escaped(tmp_path):
    """Names holding an escape sequence and a bell: the builder refuses them, and an engine that
    carries them anyway (CRCs recomputed) is refused by inspect; every message shows the bytes
    escaped, human output and --json alike (valid JSON), for the Python and the C tool."""
    from kiln import _graph, _lib, _ops

    evil_in, evil_out = b"x\x1b[31m\x07", b"out\x1b]0;pwned\x07"
    g = _graph.Graph()
    with pytest.raises(_lib.KilnInvalidArgError) as ei:
        g.add_input(evil_in.decode(), _ops.DTYPE_F32, [2, 3], [2, 3])
    g.close()
    msg = str(ei.value)
    assert "\x1b" not in msg and "\x07" not in msg and "x\\x1b[31m\\x07" in msg, msg
    assert "control character" in msg

    p = tmp_path / "evil.kln"
    p.write_bytes(_engine_with_names({b"xAAAAAA": evil_in, b"outBBBBBBBBBB": evil_out}))
    rc, out, err = kiln("inspect", p)
    text = out + err
    assert rc == 1 and "\x1b" not in text and "\x07" not in text, text
    assert "x\\x1b[31m\\x07" in text and "not UTF-8 text" in text and "control character" in text
    rc, doc = kiln_json("inspect", p)
    assert rc == 1 and "x\\x1b[31m\\x07" in doc["error"]["message"]
    c_tool = ROOT / "build" / "kiln"
    if c_tool.exists():  # the C tool of `make` (built before the Python tests in make test)
        r = subprocess.run([c_tool, "inspect", p], capture_output=True)
        assert r.returncode == 1 and b"\x1b" not in r.stdout + r.stderr
        assert b"x\\x1b[31m\\x07" in r.stderr
        r = subprocess.run([c_tool, "inspect", p, "--json"], capture_output=True)
        assert r.returncode == 1
        assert "x\\x1b[31m\\x07" in json.loads(r.stdout)["error"]["message"]


# --- malformed files


def _malformed(programs, tmp_path) -> list[Path]:
    data = programs["pte"].read_bytes()
    rng = random.Random(25)
    cases = []
    cuts = sorted(
        {0, 1, 4, 7, 8, 15, 16, 40, 100, len(data) // 2, len(data) - 1}
        | {rng.randrange(len(data)) for _ in range(25)}
    )
    for n in cuts:
        cases.append((f"cut{n}", data[:n]))
    for k in range(60):
        b = bytearray(data)
        pos = rng.randrange(len(b))
        b[pos] ^= 1 << rng.randrange(8)
        cases.append((f"flip{k}_{pos}", bytes(b)))
    cases.append(("text", b"hello, this is not a program\n" * 3))
    cases.append(("random", bytes(rng.randrange(256) for _ in range(4096))))
    cases.append(("ptd_as_program", programs["ptd"].read_bytes()))
    engine_cut = bytearray(programs["inline"].read_bytes())
    cases.append(("empty", b""))
    out = []
    for name, blob in cases:
        p = tmp_path / f"{name}.pte"
        p.write_bytes(blob)
        out.append(p)
    del engine_cut
    return out


def test_malformed_files_never_crash(programs, tmp_path):
    truncated_ok = 0
    for p in _malformed(programs, tmp_path):
        for cmd in (
            ["inspect"],
            ["profile", "--iters", "1", "--warmup", "0"],
            ["bench", "--engines", "--iters", "1", "--warmup", "0"],
        ):
            rc, out, err = kiln(*cmd, p, "--json")
            doc = json.loads(out)  # valid JSON whatever the input
            assert rc in (0, 1), (p.name, cmd, rc, out, err)
            if rc == 1:
                msg = json.dumps(doc)
                assert "error" in doc or doc.get("problems"), (p.name, doc)
                assert "Traceback" not in msg
            rc_h, out_h, err_h = kiln(*cmd, p)
            assert rc_h == rc, (p.name, cmd, rc, rc_h)
            if rc_h == 1 and "error" in doc:
                assert err_h.startswith(f"kiln {cmd[0]}: error: "), err_h
        if p.name.startswith("cut"):
            truncated_ok += kiln("inspect", p)[0] == 1
    n_cut = sum(1 for p in tmp_path.glob("cut*.pte"))
    assert truncated_ok == n_cut  # every truncation is refused


def test_not_a_program_messages(programs, tmp_path):
    rc, doc = kiln_json("inspect", tmp_path / "missing.pte")
    assert rc == 1 and "no such file" in doc["error"]["message"]
    rc, doc = kiln_json("inspect", tmp_path)
    assert rc == 1 and "is a directory" in doc["error"]["message"]
    (tmp_path / "t.pte").write_bytes(b"not a program at all")
    rc, doc = kiln_json("inspect", tmp_path / "t.pte")
    assert (
        rc == 1
        and "neither an ExecuTorch program (.pte) nor a Kiln engine" in doc["error"]["message"]
    )
    rc, doc = kiln_json("inspect", programs["ptd"])
    assert rc == 1 and "data file (.ptd), not a program" in doc["error"]["message"]
    data = programs["pte"].read_bytes()
    (tmp_path / "cut.pte").write_bytes(data[: len(data) - 10])
    rc, doc = kiln_json("inspect", tmp_path / "cut.pte")
    assert rc == 1 and "truncated" in doc["error"]["message"], doc


def test_usage_errors_exit_2():
    assert kiln()[0] == 2
    rc, out, err = kiln("inspect")
    assert rc == 2 and "usage" in err
    rc, out, _ = kiln("inspect", "--json", "--bogus", "x")
    assert rc == 2 and json.loads(out)["error"]["kind"] == "usage"
    assert kiln("frobnicate")[0] == 2
    rc, out, _ = kiln("bench", "x.pte", "--iters", "0", "--json")
    assert rc == 2 and "--iters" in json.loads(out)["error"]["message"]


# --- run


def test_run_against_eager(programs, tmp_path):
    net, x = programs["net"], programs["x"]
    np.savez(tmp_path / "in.npz", x.numpy())
    with torch.no_grad():
        ref = net(x).numpy()
    np.savez(tmp_path / "ref.npz", ref)
    rc, doc = kiln_json(
        "run", programs["pte"], "--inputs", tmp_path / "in.npz", "--device", "cpu",
        "--compare", tmp_path / "ref.npz", "--save", tmp_path / "out.npz",
    )  # fmt: skip
    assert rc == 0, doc
    (c,) = doc["compare"]["outputs"]
    assert c["ok"] and c["max_abs_err"] < 1e-4
    assert doc["kiln_devices"] == ["cpu"]
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["arr_0"], ref, rtol=1e-4, atol=1e-4)
    np.savez(tmp_path / "bad.npz", ref + 0.5)
    rc, out, _ = kiln(
        "run", programs["pte"], "--inputs", tmp_path / "in.npz", "--compare", tmp_path / "bad.npz"
    )
    assert rc == 1 and "MISMATCH" in out
    rc, doc = kiln_json("run", programs["pte"], "--seed", "3")
    assert rc == 0 and doc["outputs"][0]["shape"] == [4, 8]
    np.savez(tmp_path / "two.npz", x.numpy(), x.numpy())
    rc, doc = kiln_json("run", programs["pte"], "--inputs", tmp_path / "two.npz")
    assert rc == 1 and "2 arrays, the method takes 1" in doc["error"]["message"]
    rc, doc = kiln_json("run", programs["pte"], "--device", "tpu:0")
    assert rc == 2 and "device" in doc["error"]["message"]


# --- bench


def test_bench_percentiles_and_side_by_side(programs):
    rc, doc = kiln_json(
        "bench",
        programs["pte"],
        programs["inline"],
        "--iters",
        "7",
        "--warmup",
        "1",
        "--device",
        "cpu",
    )
    assert rc == 0, doc
    a, b = doc["results"]
    for r in (a, b):
        assert (
            r["n"] == 7 and r["min_ms"] <= r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] <= r["max_ms"]
        )
        assert r["throughput_per_s"] == pytest.approx(1e3 / r["mean_ms"])
        assert r["path"] == "executorch" and r["io"] == "host" and r["device"] == "cpu"
        assert r["cuda_graphs"] == "n/a" and r["batch"] == 4
    assert a["p50_vs_first"] == 1.0 and b["p50_vs_first"] == pytest.approx(
        b["p50_ms"] / a["p50_ms"]
    )
    rc, doc = kiln_json("bench", programs["pte"], "--engines", "--iters", "5", "--warmup", "0")
    assert rc == 0 and [e["delegate"] for e in doc["results"][0]["engines"]] == [0, 1]
    rc, doc = kiln_json(
        "bench", programs["pte"], "--engines", "--io", "device", "--device", "cpu", "--iters", "1"
    )
    assert rc == 1 and "--io device needs an engine on a CUDA device" in doc["error"]["message"]
    rc, out, _ = kiln("bench", programs["pte"], "--iters", "3", "--warmup", "0")
    assert rc == 0 and "p50 ms" in out and "p99 ms" in out


# --- profile


def test_profile_layers_and_trace(programs, tmp_path):
    trace = tmp_path / "t.json"
    rc, doc = kiln_json(
        "profile",
        programs["pte"],
        "--iters",
        "4",
        "--warmup",
        "2",
        "--trace",
        trace,
        "--device",
        "cpu",
    )
    assert rc == 0, doc
    e0, e1 = doc["engines"]
    heads = [la for la in e0["layers"] if not la["tail"]]
    assert [la["op"] for la in e0["layers"]] == ["linear", "relu"]
    assert e0["layers"][1]["kernel"] == "fused"
    for la in heads + e1["layers"]:
        assert la["n_profiled"] == 6 and la["host_us"] > 0 and la["device_us"] > 0
    t = json.loads(trace.read_text())
    xs = [ev for ev in t["traceEvents"] if ev["ph"] == "X"]
    assert len(xs) == 2 * (len(heads) + len(e1["layers"]))  # one host and one stream event each
    names = {
        ev["args"]["name"]
        for ev in t["traceEvents"]
        if ev["ph"] == "M" and ev["name"] == "thread_name"
    }
    assert names == {"host", "stream (CPU: the calling thread)"}
    for ev in xs:
        assert ev["dur"] > 0 and ev["ts"] >= 0
    rc, out, _ = kiln("profile", programs["pte"], "--iters", "2")
    assert rc == 0 and "device us" in out and "host us" in out


# --- doctor


def test_tune_needs_a_gpu(programs):
    """kiln tune makes GPU choices: a CPU device is a usage error, "off" keeps nothing, and on a
    machine without a GPU the load's own message says so (the GPU suite runs it on the H200)."""
    rc, doc = kiln_json("tune", programs["pte"], "--data", programs["ptd"], "--device", "cpu")
    assert rc == 2 and "cuda:N" in doc["error"]["message"]
    rc, doc = kiln_json("tune", programs["pte"], "--data", programs["ptd"], "--cache", "off")
    assert rc == 2 and "keeps nothing" in doc["error"]["message"]
    rc, out, err = kiln("tune", programs["pte"], "--data", programs["ptd"])
    if rc != 0:  # no GPU here: the engine cannot load on cuda:0
        assert rc == 1 and "cuda" in err.lower(), err
    else:
        assert "tuning cache" in out


def test_doctor_here():
    rc, doc = kiln_json("doctor")
    assert rc == 0, doc
    assert doc["ok"] and doc["problems"] == []
    da = doc["device_auto"]
    assert da["execute_ok"] is True
    if not doc["driver"]["found"]:  # this machine: no GPU
        assert da["device"] == "cpu" and da["why"]
    assert doc["executorch"]["registered"] is True
    assert doc["kiln"]["library_version"] == "0.1.0"
    rc, doc = kiln_json("doctor", "--install-hint")
    assert rc == 0 and doc["install_hint"]["command"].startswith('pip install "kiln[executorch')
    rc, out, _ = kiln("doctor", "--install-hint")
    assert rc == 0 and out.strip() == doc["install_hint"]["command"]


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "kiln"
    r = subprocess.run([exe, "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("kiln 0.1.0")
