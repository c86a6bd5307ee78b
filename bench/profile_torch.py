# SPDX-License-Identifier: Apache-2.0
"""Per-kernel GPU times of PyTorch's eager + CUDA-graph run of one transformer layer (H200 only).

The comparison column for Kiln's per-layer profile (the option profile, KILN_PROFILE=1; docs/options.md): which
kernels PyTorch launches for the same layer and how long each runs inside a graph replay.

    python3 bench/profile_torch.py [--model encoder|bert_layer|bert_layer_b8|mlp_b1|mlp_b64]
                                   [--replays 20]
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
    else:
        raise SystemExit(f"unknown model {name!r}")
    M.deterministic_init_(m, name.split("_")[0] if name.startswith("mlp") else name)
    return m.eval().half().cuda(), x.half().cuda()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="encoder")
    ap.add_argument("--replays", type=int, default=20)
    a = ap.parse_args()
    m, x = build(a.model)
    with torch.no_grad():
        for _ in range(3):
            m(x)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = m(x)
        for _ in range(10):
            g.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(a.replays):
                g.replay()
            torch.cuda.synchronize()
    del y
    rows = {}
    for e in p.events():
        if e.device_type.name != "CUDA":
            continue
        r = rows.setdefault(e.name, [0, 0.0])
        r[0] += 1
        r[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    total = sum(v[1] for v in rows.values()) / a.replays
    print(f"== torch graph replay {a.model}: {total:.1f} us of kernel time per replay")
    for name, (n, t) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        print(f"  {t / a.replays:8.2f} us  x{n / a.replays:4.1f}  {name[:110]}")
    # wall time per replay (events)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(100):
        g.replay()
    e.record()
    torch.cuda.synchronize()
    print(f"  pipelined replay: {s.elapsed_time(e) * 10:.1f} us per replay")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
