# SPDX-License-Identifier: Apache-2.0
"""Per-kernel GPU times of PyTorch's eager + CUDA-graph run of a model (H200 only).

The comparison column for Kiln's per-layer profile (the option profile, KILN_PROFILE=1;
docs/options.md): which kernels PyTorch launches for the same layer or model and how long each
runs inside a replay.

    python3 bench/profile_torch.py [--model encoder|bert_layer|bert_layer_b8|mlp_b1|mlp_b64|CONFIG]
                                   [--compile] [--replays 20]

CONFIG: a benchmark or zoo config of bench/models.py (zoo_efficientnet_b0_b1, ...), fp16, the
CNNs channels-last as in bench/anchors_device.py. --compile profiles
torch.compile(mode="reduce-overhead") (Inductor freezing for CNNs) instead of the captured graph.
"""

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models as M  # noqa: E402


def build(name: str):
    if name == "encoder":
        m, x = M.PreNormEncoderLayer(), torch.randn(1, 256, 1024)
    elif name.startswith("bert_layer"):
        b = 8 if name.endswith("b8") else 1
        m, x = M.BertLayer(768, 12, 3072, 1e-12), torch.randn(b, 128, 768)
    elif name in ("mlp_b1", "mlp_b64"):
        m, x = M.MLP(), torch.randn(int(name[5:]), 1024)
    elif name in M.CONFIG_BY_NAME:
        cfg = M.CONFIG_BY_NAME[name]
        m = M.build_model(cfg.family).half().cuda().eval()
        xs = [t.half() if t.is_floating_point() else t for t in M.make_inputs(cfg)]
        xs = [t.cuda() for t in xs]
        if cfg.fam.cnn:
            m = m.to(memory_format=torch.channels_last)
            xs[0] = xs[0].contiguous(memory_format=torch.channels_last)
        return m, xs, cfg.fam.cnn
    else:
        raise SystemExit(f"unknown model {name!r}")
    M.deterministic_init_(m, name.split("_")[0] if name.startswith("mlp") else name)
    return m.eval().half().cuda(), [x.half().cuda()], False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="encoder")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    m, x, cnn = build(a.model)
    with torch.no_grad():
        if a.compile:
            import torch._inductor.config as icfg

            icfg.freezing = cnn
            cm = torch.compile(m, mode="reduce-overhead", fullgraph=True, dynamic=False)
            for _ in range(5):  # compile; cudagraph trees record on a later call
                cm(*x)
            torch.cuda.synchronize()
            replay = lambda: cm(*x)  # noqa: E731
        else:
            for _ in range(3):
                m(*x)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                _out = m(*x)  # the graph's output, kept alive
            replay = g.replay
        for _ in range(10):
            replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(a.replays):
                replay()
            torch.cuda.synchronize()
    rows = {}
    for e in p.events():
        if e.device_type.name != "CUDA":
            continue
        r = rows.setdefault(e.name, [0, 0.0])
        r[0] += 1
        r[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    total = sum(v[1] for v in rows.values()) / a.replays
    kind = "torch.compile" if a.compile else "torch graph replay"
    print(f"== {kind} {a.model}: {total:.1f} us of kernel time per replay")
    for name, (n, t) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        print(f"  {t / a.replays:8.2f} us  x{n / a.replays:4.1f}  {name[:110]}")
    # wall time per replay (events)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(100):
        replay()
    e.record()
    torch.cuda.synchronize()
    print(f"  pipelined replay: {s.elapsed_time(e) * 10:.1f} us per replay")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
