"""Kiln's main job, end to end: export a PyTorch model with Kiln, run it through the stock
ExecuTorch runtime, and compare with eager PyTorch.

    python examples/export_and_run.py                       # ResNet-18 (reduced width), fp32
    python examples/export_and_run.py --model transformer --precision fp16
    python examples/export_and_run.py --external-data weights --out /tmp/kiln-demo

Prints what was delegated, the max abs error against eager PyTorch and the time per run.
Kiln runs on the GPU when one is present and on its CPU reference backend otherwise (the
``device`` runtime option, default ``auto``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import kiln
import torch
import torch.nn as nn
import torch.nn.functional as F
from kiln.executorch import save


class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """ResNet-18 (torchvision's layout) with a configurable width (64 is the original)."""

    def __init__(self, width=16, n_classes=100):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, 2, 3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks, c = [], width
        for i, c_out in enumerate([width, 2 * width, 4 * width, 8 * width]):
            blocks += [BasicBlock(c, c_out, 1 if i == 0 else 2), BasicBlock(c_out, c_out, 1)]
            c = c_out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, n_classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Transformer(nn.Module):
    """A small pre-norm transformer encoder (token embedding, 2 blocks, classifier)."""

    def __init__(self, vocab=1000, d=128, heads=4, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.heads = heads
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "ln1": nn.LayerNorm(d),
                    "qkv": nn.Linear(d, 3 * d),
                    "out": nn.Linear(d, d),
                    "ln2": nn.LayerNorm(d),
                    "fc1": nn.Linear(d, 4 * d),
                    "fc2": nn.Linear(4 * d, d),
                }
            )
            for _ in range(layers)
        )
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        b, s, d = x.shape
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).split(d, dim=-1)
            q, k, v = (
                t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v)
            )
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk["out"](a.transpose(1, 2).reshape(b, s, d))
            x = x + blk["fc2"](F.gelu(blk["fc1"](blk["ln2"](x))))
        return self.head(self.ln(x))


def make(name: str):
    torch.manual_seed(0)
    if name == "resnet18":
        model = ResNet18().eval()
        return model, lambda: (torch.randn(1, 3, 96, 96),)
    if name == "transformer":
        model = Transformer().eval()
        return model, lambda: (torch.randint(0, 1000, (1, 32)),)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 10)).eval()
    return model, lambda: (torch.randn(8, 256),)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", choices=["resnet18", "transformer", "mlp"], default="resnet18")
    ap.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32")
    ap.add_argument("--external-data", default=None, help="write weights to NAME.ptd")
    ap.add_argument("--out", default=None, help="folder for the .pte (default: a temp folder)")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()

    model, inputs = make(args.model)
    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="kiln-demo-"))
    pte = out_dir / f"{args.model}.pte"

    t0 = time.perf_counter()
    prog = save(model, pte, inputs(), precision=args.precision, external_data=args.external_data)
    export_s = time.perf_counter() - t0
    kiln_calls, other = 0, []
    gm = prog.exported_program().graph_module
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if "executorch_call_delegate" in str(n.target):
            kiln_calls += getattr(gm, n.args[0].target).backend_id == "KilnBackend"
        elif "getitem" not in str(n.target) and "memory" not in str(n.target):
            other.append(str(n.target))
    ptd = out_dir / f"{args.external_data}.ptd" if args.external_data else None
    print(f"exported {args.model} ({args.precision}) in {export_s:.1f} s -> {pte}")
    print(
        f"  {pte.stat().st_size / 1e6:.2f} MB .pte"
        + (f" + {ptd.stat().st_size / 1e6:.2f} MB {ptd.name}" if ptd else "")
        + f"; {kiln_calls} Kiln delegate call(s), {len(other)} ExecuTorch op(s) outside Kiln"
    )

    program = kiln.load(pte, data_path=ptd)
    import kiln_executorch_runtime as rt

    x = inputs()
    out = program.forward(*x)[0]
    with torch.no_grad():
        ref = model(*x)
    err = (out.float() - ref.float()).abs().max().item()
    for _ in range(3):
        program.forward(*x)
    t0 = time.perf_counter()
    for _ in range(args.runs):
        program.forward(*x)
    ms = (time.perf_counter() - t0) * 1e3 / args.runs
    print(f"ran through ExecuTorch with KilnBackend (device option: {rt.get_option('device')})")
    print(f"  max abs error vs eager PyTorch: {err:.3g}")
    print(f"  {ms:.2f} ms per run (mean of {args.runs})")
    tol = 1e-3 if args.precision == "fp32" else 5e-2
    scale = max(1.0, ref.abs().max().item())
    if err > tol * scale:
        raise SystemExit(f"error {err:.3g} is above the tolerance {tol * scale:.3g}")


if __name__ == "__main__":
    main()
