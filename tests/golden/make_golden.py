# SPDX-License-Identifier: Apache-2.0
"""Writes the PyTorch golden files for tests/golden_test.c.

Every case builds random inputs from a fixed seed, runs PyTorch eager, and records the op, its
attributes (in the schema order of src/core/ops.c), the inputs, an optional fused tail and the
expected output. Run from the repository root with the project's venv:

    VENV=$(tools/setup_env.sh) && "$VENV/bin/python" tests/golden/make_golden.py

It rewrites tests/golden/<op>.kgold and tests/golden/MANIFEST; the output is deterministic for a
given torch version (the version used is written into MANIFEST).

File format (all little-endian), one file per op:

    file    := magic "KGOLD001" (8 bytes), u32 n_cases, case * n_cases
    case    := u32 name_len, name (utf-8, no NUL), u32 op (kiln op id),
               attrs, u32 n_inputs, opt_tensor * n_inputs,
               u32 n_tail, tail * n_tail, tensor (expected output), f64 tol_scale
    attrs   := u32 n_attrs, attr * n_attrs          (schema order; every attribute present)
    attr    := u32 kind (1 = int64 list, 2 = float64 list), u32 n, n values (i64 or f64)
    tail    := u32 op, attrs, u32 running_is_lhs, opt_tensor (operand; absent for unary ops)
    opt_tensor := u32 present (0 or 1), tensor if present
    tensor  := u32 dtype (kiln_dtype: 1 f32, 2 f16, 3 bf16, 4 i32, 5 i64, 6 bool), u32 rank,
               i64 dims[rank], raw row-major data (numel * dtype size bytes)

The C side compares with per-dtype tolerances (golden_test.c) multiplied by tol_scale.
"""

import os
import struct
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20240601

# kiln op ids (include/kiln/kiln_ops.h)
OP = {
    "linear": 1,
    "matmul": 2,
    "conv2d": 3,
    "conv_transpose2d": 4,
    "batch_norm": 5,
    "relu": 10,
    "gelu": 11,
    "silu": 12,
    "sigmoid": 13,
    "tanh": 14,
    "hardswish": 15,
    "hardsigmoid": 16,
    "neg": 17,
    "sqrt": 18,
    "rsqrt": 19,
    "exp": 20,
    "log": 21,
    "copy": 22,
    "cast": 23,
    "clamp": 24,
    "cos": 25,
    "sin": 26,
    "add": 30,
    "sub": 31,
    "mul": 32,
    "div": 33,
    "pow": 34,
    "where": 35,
    "softmax": 40,
    "log_softmax": 41,
    "layer_norm": 42,
    "group_norm": 43,
    "max_pool2d": 50,
    "avg_pool2d": 51,
    "adaptive_avg_pool2d": 52,
    "upsample_nearest2d": 53,
    "upsample_bilinear2d": 54,
    "mean": 60,
    "sum": 61,
    "cumsum": 62,
    "reshape": 70,
    "permute": 71,
    "expand": 72,
    "cat": 73,
    "slice": 74,
    "select": 75,
    "squeeze": 76,
    "unsqueeze": 77,
    "pad": 78,
    "embedding": 80,
    "index": 81,
    "gather": 82,
    "sdpa": 90,
    "eq": 100,
    "ne": 101,
    "lt": 102,
    "le": 103,
    "gt": 104,
    "ge": 105,
    "bitwise_and": 106,
    "bitwise_or": 107,
    "bitwise_xor": 108,
    "bitwise_not": 109,
}

DTYPE = {
    torch.float32: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.int32: 4,
    torch.int64: 5,
    torch.bool: 6,
}

NAN = float("nan")


def Ai(*v):  # an int64 attribute list
    return (1, [int(x) for x in v])


def Af(v):  # a float64 attribute (one value)
    return (2, [float(v)])


# Attribute lists in schema order (src/core/ops.c), from keyword arguments with ops.c defaults.
def conv_attrs(stride=1, padding=0, dilation=1, groups=1):
    p2 = lambda v: v if isinstance(v, (tuple, list)) else (v, v)  # noqa: E731
    return [Ai(*p2(stride)), Ai(*p2(padding)), Ai(*p2(dilation)), Ai(groups)]


def convt_attrs(stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    p2 = lambda v: v if isinstance(v, (tuple, list)) else (v, v)  # noqa: E731
    return [
        Ai(*p2(stride)),
        Ai(*p2(padding)),
        Ai(*p2(output_padding)),
        Ai(*p2(dilation)),
        Ai(groups),
    ]


def pool_attrs(
    op,
    kernel,
    stride,
    padding=0,
    dilation=1,
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
):
    p2 = lambda v: v if isinstance(v, (tuple, list)) else (v, v)  # noqa: E731
    if op == "max_pool2d":
        return [
            Ai(*p2(kernel)),
            Ai(*p2(stride)),
            Ai(*p2(padding)),
            Ai(*p2(dilation)),
            Ai(int(ceil_mode)),
        ]
    return [
        Ai(*p2(kernel)),
        Ai(*p2(stride)),
        Ai(*p2(padding)),
        Ai(int(ceil_mode)),
        Ai(int(count_include_pad)),
        Ai(divisor_override or 0),
    ]


UNARY_ATTRS = {"gelu": lambda approx="none": [Ai(1 if approx == "tanh" else 0)]}


class Writer:
    def __init__(self):
        self.files = {}  # op name -> list of case bytes

    def tensor(self, t):
        t = t.detach().contiguous().cpu()
        out = struct.pack("<II", DTYPE[t.dtype], t.dim())
        out += struct.pack(f"<{t.dim()}q", *t.shape) if t.dim() else b""
        if t.dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().tobytes()
        elif t.dtype == torch.bool:
            raw = t.to(torch.uint8).numpy().tobytes()
        else:
            raw = t.numpy().tobytes()
        return out + raw

    def opt_tensor(self, t):
        return struct.pack("<I", 0) if t is None else struct.pack("<I", 1) + self.tensor(t)

    @staticmethod
    def attrs(attrs):
        out = struct.pack("<I", len(attrs))
        for kind, vals in attrs:
            out += struct.pack("<II", kind, len(vals))
            out += struct.pack(f"<{len(vals)}{'q' if kind == 1 else 'd'}", *vals)
        return out

    def case(self, name, op, attrs, inputs, expected, tail=(), tol=1.0):
        name_b = name.encode()
        out = struct.pack("<I", len(name_b)) + name_b + struct.pack("<I", OP[op])
        out += self.attrs(attrs)
        out += struct.pack("<I", len(inputs)) + b"".join(self.opt_tensor(t) for t in inputs)
        out += struct.pack("<I", len(tail))
        for t_op, t_attrs, lhs, operand in tail:
            out += struct.pack("<I", OP[t_op]) + self.attrs(t_attrs)
            out += struct.pack("<I", int(lhs)) + self.opt_tensor(operand)
        out += self.tensor(expected) + struct.pack("<d", tol)
        self.files.setdefault(op, []).append(out)

    def save(self):
        names = []
        for op, cases in sorted(self.files.items()):
            path = os.path.join(HERE, op + ".kgold")
            with open(path, "wb") as f:
                f.write(b"KGOLD001" + struct.pack("<I", len(cases)) + b"".join(cases))
            names.append(op + ".kgold")
        with open(os.path.join(HERE, "MANIFEST"), "w") as f:
            version = torch.__version__
            f.write(
                f"# written by tests/golden/make_golden.py with torch {version}; one per line\n"
            )
            f.write("".join(n + "\n" for n in names))
        total = sum(os.path.getsize(os.path.join(HERE, n)) for n in names)
        print(
            f"wrote {len(names)} files, {sum(len(c) for c in self.files.values())} cases, "
            f"{total} bytes"
        )


FLOATS = (torch.float32, torch.float16, torch.bfloat16)
DT_NAME = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.bool: "bool",
}


def main():
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    w = Writer()

    def rn(*shape, dtype=torch.float32, scale=1.0):
        return (torch.randn(shape) * scale).to(dtype)

    # --- linear / matmul (+ fused tails)
    for dt in FLOATS:
        n = DT_NAME[dt]
        x, wt, b = rn(5, 24, dtype=dt), rn(17, 24, dtype=dt), rn(17, dtype=dt)
        w.case(f"linear_{n}", "linear", [], [x, wt, b], F.linear(x, wt, b))
    x, wt = rn(2, 3, 40), rn(9, 40)
    w.case("linear_3d_nobias", "linear", [], [x, wt, None], F.linear(x, wt))
    x, wt, b = rn(130, 70), rn(33, 70), rn(33)
    w.case("linear_blocks", "linear", [], [x, wt, b], F.linear(x, wt, b))
    x, wt, b = rn(4, 16), rn(8, 16), rn(8)
    w.case(
        "linear_relu",
        "linear",
        [],
        [x, wt, b],
        F.relu(F.linear(x, wt, b)),
        tail=[("relu", [], 1, None)],
    )
    w.case(
        "linear_gelu_tanh",
        "linear",
        [],
        [x, wt, b],
        F.gelu(F.linear(x, wt, b), approximate="tanh"),
        tail=[("gelu", [Ai(1)], 1, None)],
    )
    res = rn(4, 8)
    w.case(
        "linear_add_relu",
        "linear",
        [],
        [x, wt, b],
        F.relu(F.linear(x, wt, b) + res),
        tail=[("add", [], 1, res), ("relu", [], 1, None)],
    )
    sc = rn(8)
    w.case(
        "linear_rsub_mul",
        "linear",
        [],
        [x, wt, None],
        (sc - F.linear(x, wt)) * sc,
        tail=[("sub", [], 0, sc), ("mul", [], 1, sc)],
    )
    xh, wh, bh = (
        rn(4, 16, dtype=torch.float16),
        rn(8, 16, dtype=torch.float16),
        rn(8, dtype=torch.float16),
    )
    w.case(
        "linear_silu_f16",
        "linear",
        [],
        [xh, wh, bh],
        F.silu(F.linear(xh, wh, bh)),
        tail=[("silu", [], 1, None)],
    )

    mm = [
        ((3, 4), (4, 5)),
        ((2, 3, 4), (4, 5)),
        ((2, 1, 3, 4), (5, 4, 6)),
        ((7,), (7,)),
        ((7,), (2, 7, 3)),
        ((2, 3, 7), (7,)),
        ((3, 4), (2, 4, 5)),
    ]
    for i, (sa, sb) in enumerate(mm):
        a, bb = rn(*sa), rn(*sb)
        w.case(f"matmul_{i}", "matmul", [], [a, bb], torch.matmul(a, bb))
    for dt in (torch.float16, torch.bfloat16):
        a, bb = rn(2, 5, 12, dtype=dt), rn(2, 12, 6, dtype=dt)
        w.case(f"matmul_{DT_NAME[dt]}", "matmul", [], [a, bb], torch.matmul(a, bb))
    a, bb, add = rn(3, 8), rn(8, 5), rn(3, 1)
    w.case(
        "matmul_add_tail",
        "matmul",
        [],
        [a, bb],
        torch.matmul(a, bb) + add,
        tail=[("add", [], 1, add)],
    )

    # --- conv2d / conv_transpose2d
    convs = [  # (N, C, H, W, O, k, kwargs)
        (1, 3, 9, 9, 4, 3, dict(padding=1)),
        (2, 4, 10, 8, 6, 3, dict(stride=2, padding=1)),
        (1, 4, 9, 9, 4, 3, dict(dilation=2, padding=2)),
        (1, 4, 7, 7, 6, 3, dict(groups=2, padding=1)),
        (1, 8, 8, 8, 8, 3, dict(groups=8, padding=1)),
        (1, 8, 9, 9, 8, 3, dict(groups=8, stride=2, padding=1)),
        (1, 16, 6, 6, 12, 1, dict()),
        (1, 3, 16, 16, 8, 7, dict(stride=2, padding=3)),
        (1, 3, 5, 11, 4, (1, 5), dict(padding=(0, 2))),
    ]
    for i, (n_, c, h, wd, o, k, kw) in enumerate(convs):
        g = kw.get("groups", 1)
        ks = k if isinstance(k, tuple) else (k, k)
        for dt in FLOATS if i in (0, 4) else (torch.float32,):
            x, wt, b = rn(n_, c, h, wd, dtype=dt), rn(o, c // g, *ks, dtype=dt), rn(o, dtype=dt)
            w.case(
                f"conv2d_{i}_{DT_NAME[dt]}",
                "conv2d",
                conv_attrs(**kw),
                [x, wt, b],
                F.conv2d(x, wt, b, **kw),
            )
    x, wt, res = rn(2, 4, 6, 6), rn(5, 4, 3, 3), rn(2, 5, 6, 6)
    w.case(
        "conv2d_add_relu",
        "conv2d",
        conv_attrs(padding=1),
        [x, wt, None],
        F.relu(F.conv2d(x, wt, padding=1) + res),
        tail=[("add", [], 1, res), ("relu", [], 1, None)],
    )
    x, wt = rn(4, 6, 6), rn(5, 4, 3, 3)  # unbatched [C, H, W]
    w.case("conv2d_unbatched", "conv2d", conv_attrs(), [x, wt, None], F.conv2d(x, wt))

    convts = [  # (N, C, H, W, O, k, kwargs)
        (1, 4, 5, 5, 3, 3, dict()),
        (2, 4, 4, 5, 6, 3, dict(stride=2, padding=1, output_padding=1)),
        (1, 4, 4, 4, 4, 4, dict(stride=2, padding=1, groups=2)),
        (1, 2, 3, 3, 3, 3, dict(stride=2, dilation=2, output_padding=1)),
    ]
    for i, (n_, c, h, wd, o, k, kw) in enumerate(convts):
        g = kw.get("groups", 1)
        for dt in FLOATS if i == 1 else (torch.float32,):
            x, wt, b = rn(n_, c, h, wd, dtype=dt), rn(c, o // g, k, k, dtype=dt), rn(o, dtype=dt)
            w.case(
                f"conv_transpose2d_{i}_{DT_NAME[dt]}",
                "conv_transpose2d",
                convt_attrs(**kw),
                [x, wt, b],
                F.conv_transpose2d(x, wt, b, **kw),
            )

    # --- batch_norm
    for dt in FLOATS:
        x = rn(2, 5, 4, 3, dtype=dt)
        m, v = rn(5, dtype=dt), (torch.rand(5) + 0.5).to(dt)
        wt, b = rn(5, dtype=dt), rn(5, dtype=dt)
        w.case(
            f"batch_norm_{DT_NAME[dt]}",
            "batch_norm",
            [Af(1e-5)],
            [x, wt, b, m, v],
            F.batch_norm(x, m, v, wt, b, training=False, eps=1e-5),
        )
    x, m, v = rn(3, 4), rn(4), torch.rand(4) + 0.5
    w.case(
        "batch_norm_noaffine_2d",
        "batch_norm",
        [Af(1e-3)],
        [x, None, None, m, v],
        F.batch_norm(x, m, v, training=False, eps=1e-3),
    )

    # --- unary
    unary = {
        "relu": F.relu,
        "silu": F.silu,
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
        "hardswish": F.hardswish,
        "hardsigmoid": F.hardsigmoid,
        "neg": torch.neg,
        "sqrt": torch.sqrt,
        "rsqrt": torch.rsqrt,
        "exp": torch.exp,
        "log": torch.log,
        "copy": torch.clone,
    }
    for name, fn in unary.items():
        for dt in FLOATS:
            x = rn(3, 7, 5, dtype=torch.float32, scale=2.5)
            if name in ("sqrt", "rsqrt", "log"):
                x = x.abs() + 0.05
            x = x.to(dt)
            w.case(f"{name}_{DT_NAME[dt]}", name, [], [x], fn(x))
    for approx in ("none", "tanh"):
        for dt in FLOATS:
            x = rn(4, 33, dtype=dt, scale=3)
            w.case(
                f"gelu_{approx}_{DT_NAME[dt]}",
                "gelu",
                UNARY_ATTRS["gelu"](approx),
                [x],
                F.gelu(x, approximate=approx),
            )
    x = rn(40, scale=3)
    for lo, hi in ((-1.0, 1.0), (0.0, 6.0), (-0.5, NAN), (NAN, 0.25), (NAN, NAN)):
        if lo != lo and hi != hi:
            ref = x.clone()  # no bound at all
        else:
            ref = torch.clamp(x, min=None if lo != lo else lo, max=None if hi != hi else hi)
        w.case(f"clamp_{lo}_{hi}", "clamp", [Af(lo), Af(hi)], [x], ref)
    xi = torch.randint(-20, 20, (30,), dtype=torch.int32)
    w.case("clamp_i32", "clamp", [Af(-5), Af(7)], [xi], torch.clamp(xi, -5, 7))
    w.case("neg_i64", "neg", [], [xi.to(torch.int64)], torch.neg(xi.to(torch.int64)))
    xb = rn(3, 4, dtype=torch.bfloat16)
    w.case("clamp_bf16", "clamp", [Af(-0.5), Af(0.5)], [xb], torch.clamp(xb, -0.5, 0.5))

    # --- cast and copy over dtype pairs
    src = {
        torch.float32: rn(33, scale=40),
        torch.float16: rn(33, dtype=torch.float16, scale=40),
        torch.bfloat16: rn(33, dtype=torch.bfloat16, scale=40),
        torch.int32: torch.randint(-1000, 1000, (33,), dtype=torch.int32),
        torch.int64: torch.randint(-1000, 1000, (33,), dtype=torch.int64),
        torch.bool: torch.rand(33) > 0.5,
    }
    src[torch.float32][:4] = torch.tensor([0.5, -0.5, 0.0, -2.75])
    for a, xa in src.items():
        for b in src:
            w.case(f"cast_{DT_NAME[a]}_{DT_NAME[b]}", "cast", [Ai(DTYPE[b])], [xa], xa.to(b))
        w.case(f"copy_{DT_NAME[a]}", "copy", [], [xa], xa.clone())

    # --- binary with broadcasting
    bshapes = [((4, 5), (4, 5)), ((3, 1, 5), (4, 1)), ((2, 3), ()), ((6,), (2, 1, 6))]
    bins = {
        "add": torch.add,
        "sub": torch.sub,
        "mul": torch.mul,
        "div": torch.div,
        "pow": torch.pow,
    }
    for name, fn in bins.items():
        for i, (sa, sb) in enumerate(bshapes):
            for dt in FLOATS if i == 1 else (torch.float32,):
                a, b = rn(*sa, dtype=dt), rn(*sb, dtype=dt)
                if name == "pow":
                    a = a.abs() + 0.1
                if name == "div":
                    b = b.sign() * (b.abs() + 0.5)
                    b = b.to(dt)
                w.case(f"{name}_{i}_{DT_NAME[dt]}", name, [], [a, b], fn(a, b))
    for name in ("add", "sub", "mul"):
        for dt in (torch.int32, torch.int64):
            a = torch.randint(-100, 100, (3, 1, 4), dtype=dt)
            b = torch.randint(-100, 100, (5, 1), dtype=dt)
            w.case(f"{name}_{DT_NAME[dt]}", name, [], [a, b], bins[name](a, b))
    for dt in FLOATS + (torch.int32, torch.int64, torch.bool):
        c = torch.rand(4, 1) > 0.5
        if dt == torch.bool:
            a, b = torch.rand(2, 1, 5) > 0.5, torch.rand(5) > 0.5
        elif dt in (torch.int32, torch.int64):
            a, b = torch.randint(-9, 9, (2, 1, 5), dtype=dt), torch.randint(-9, 9, (5,), dtype=dt)
        else:
            a, b = rn(2, 1, 5, dtype=dt), rn(5, dtype=dt)
        w.case(f"where_{DT_NAME[dt]}", "where", [], [c, a, b], torch.where(c, a, b))

    # --- softmax, log_softmax, layer_norm
    for name, fn in (("softmax", F.softmax), ("log_softmax", F.log_softmax)):
        for dim in (-1, 1, 0):
            x = rn(3, 5, 7, scale=3)
            w.case(f"{name}_dim{dim}", name, [Ai(dim)], [x], fn(x, dim=dim))
        for dt in (torch.float16, torch.bfloat16):
            x = rn(4, 50, dtype=dt, scale=3)
            w.case(f"{name}_{DT_NAME[dt]}", name, [Ai(-1)], [x], fn(x, dim=-1))
    for dt in FLOATS:
        x = rn(3, 4, 32, dtype=dt, scale=2) + 1
        wt, b = rn(32, dtype=dt), rn(32, dtype=dt)
        w.case(
            f"layer_norm_{DT_NAME[dt]}",
            "layer_norm",
            [Ai(1), Af(1e-5)],
            [x, wt, b],
            F.layer_norm(x, (32,), wt, b, 1e-5),
        )
    x = rn(2, 3, 4, 5)
    wt, b = rn(4, 5), rn(4, 5)
    w.case(
        "layer_norm_2d_affine",
        "layer_norm",
        [Ai(2), Af(1e-6)],
        [x, wt, b],
        F.layer_norm(x, (4, 5), wt, b, 1e-6),
    )
    w.case(
        "layer_norm_3d_plain",
        "layer_norm",
        [Ai(3), Af(1e-5)],
        [x, None, None],
        F.layer_norm(x, (3, 4, 5)),
    )

    # --- pooling
    pools = [
        ("max_pool2d", (1, 3, 12, 12), dict(kernel_size=3, stride=2, padding=1)),
        ("max_pool2d", (2, 2, 7, 7), dict(kernel_size=2, stride=2, ceil_mode=True)),
        ("max_pool2d", (1, 2, 9, 9), dict(kernel_size=3, stride=1, padding=1, dilation=2)),
        ("max_pool2d", (2, 6, 5), dict(kernel_size=(2, 3), stride=(1, 2))),
        ("avg_pool2d", (1, 3, 8, 8), dict(kernel_size=2, stride=2)),
        ("avg_pool2d", (1, 2, 7, 7), dict(kernel_size=3, stride=2, padding=1)),
        (
            "avg_pool2d",
            (1, 2, 7, 7),
            dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
        ),
        ("avg_pool2d", (2, 2, 6, 6), dict(kernel_size=3, stride=3, padding=1, ceil_mode=True)),
        ("avg_pool2d", (1, 2, 6, 7), dict(kernel_size=(3, 2), stride=2, divisor_override=5)),
    ]
    for i, (name, shape, kw) in enumerate(pools):
        for dt in FLOATS if i in (0, 5) else (torch.float32,):
            x = rn(*shape, dtype=dt)
            attrs = pool_attrs(
                name,
                kw["kernel_size"],
                kw["stride"],
                kw.get("padding", 0),
                kw.get("dilation", 1),
                kw.get("ceil_mode", False),
                kw.get("count_include_pad", True),
                kw.get("divisor_override"),
            )
            fn = F.max_pool2d if name == "max_pool2d" else F.avg_pool2d
            w.case(f"{name}_{i}_{DT_NAME[dt]}", name, attrs, [x], fn(x, **kw))
    for i, (shape, out) in enumerate(
        (
            ((1, 4, 7, 7), (1, 1)),
            ((2, 3, 5, 7), (3, 2)),
            ((1, 2, 3, 3), (5, 5)),
            ((2, 10, 4), (3, 4)),
        )
    ):
        for dt in FLOATS if i == 1 else (torch.float32,):
            x = rn(*shape, dtype=dt)
            w.case(
                f"adaptive_avg_pool2d_{i}_{DT_NAME[dt]}",
                "adaptive_avg_pool2d",
                [Ai(*out)],
                [x],
                F.adaptive_avg_pool2d(x, out),
            )

    # --- reductions
    reds = [
        ((2, 3, 4, 5), (2, 3), False),
        ((2, 3, 4, 5), (-1,), True),
        ((2, 3, 4), (), False),
        ((4, 6, 5), (0, 2), True),
        ((3, 200), (1,), False),
    ]
    for name, fn in (("mean", torch.mean), ("sum", torch.sum)):
        for i, (shape, dims, keep) in enumerate(reds):
            for dt in FLOATS if i == 0 else (torch.float32,):
                x = rn(*shape, dtype=dt)
                ref = fn(x, dim=dims, keepdim=keep) if dims else fn(x)
                if keep and not dims:
                    ref = ref.reshape([1] * x.dim())
                w.case(f"{name}_{i}_{DT_NAME[dt]}", name, [Ai(*dims), Ai(int(keep))], [x], ref)
    for dt in (torch.int32, torch.int64):
        x = torch.randint(-50, 50, (3, 4, 5), dtype=dt)
        w.case(f"sum_{DT_NAME[dt]}", "sum", [Ai(1), Ai(0)], [x], torch.sum(x, dim=1))

    # --- data movement (every dtype once somewhere)
    dts = FLOATS + (torch.int32, torch.int64, torch.bool)

    def any_dt(shape, dt):
        if dt == torch.bool:
            return torch.rand(*shape) > 0.5
        if dt in (torch.int32, torch.int64):
            return torch.randint(-99, 99, shape, dtype=dt)
        return rn(*shape, dtype=dt)

    for dt in dts:
        n = DT_NAME[dt]
        x = any_dt((2, 3, 4), dt)
        w.case(f"reshape_{n}", "reshape", [Ai(-1, 4)], [x, None], x.reshape(-1, 4))
        w.case(f"permute_{n}", "permute", [Ai(2, 0, 1)], [x], x.permute(2, 0, 1))
        w.case(
            f"expand_{n}",
            "expand",
            [Ai(2, -1, -1, -1)],
            [x[:, :1, :], None],
            x[:, :1, :].expand(2, 2, 3, 4),
        )
        y = any_dt((2, 5, 4), dt)
        w.case(f"cat_{n}", "cat", [Ai(1)], [x, y, x], torch.cat([x, y, x], dim=1))
        w.case(f"slice_{n}", "slice", [Ai(2), Ai(-3), Ai(2**63 - 1), Ai(2)], [x], x[:, :, -3::2])
        w.case(f"select_{n}", "select", [Ai(1), Ai(-1)], [x], x.select(1, -1))
        s = any_dt((2, 1, 4, 1), dt)
        w.case(f"squeeze_{n}", "squeeze", [Ai(1, 3)], [s], s.squeeze(3).squeeze(1))
        w.case(f"unsqueeze_{n}", "unsqueeze", [Ai(-1)], [x], x.unsqueeze(-1))
    x = rn(4, 6, 5)
    w.case(
        "permute_4d",
        "permute",
        [Ai(0, 2, 3, 1)],
        [x.reshape(2, 2, 6, 5)],
        x.reshape(2, 2, 6, 5).permute(0, 2, 3, 1),
    )
    w.case("slice_dim0_neg", "slice", [Ai(0), Ai(-100), Ai(-1), Ai(1)], [x], x[-100:-1])
    w.case("cat_neg_dim", "cat", [Ai(-1)], [x, x[:, :, :2]], torch.cat([x, x[:, :, :2]], -1))

    # --- embedding
    for dt in FLOATS:
        wt = rn(20, 8, dtype=dt)
        for it in (torch.int32, torch.int64):
            ix = torch.randint(0, 20, (3, 5), dtype=it)
            w.case(
                f"embedding_{DT_NAME[dt]}_{DT_NAME[it]}",
                "embedding",
                [],
                [wt, ix],
                F.embedding(ix, wt),
            )

    # --- sdpa
    def sdpa_case(name, q, k, v, mask=None, causal=False, scale=None, tol=1.0):
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
        w.case(
            name,
            "sdpa",
            [Ai(int(causal)), Af(NAN if scale is None else scale)],
            [q, k, v, mask],
            ref,
            tol=tol,
        )

    for dt in FLOATS:
        q, k, v = rn(2, 3, 5, 8, dtype=dt), rn(2, 3, 7, 8, dtype=dt), rn(2, 3, 7, 6, dtype=dt)
        sdpa_case(f"sdpa_plain_{DT_NAME[dt]}", q, k, v)
        sdpa_case(f"sdpa_causal_{DT_NAME[dt]}", q, k, v, causal=True)
    q, k, v = rn(2, 4, 6), rn(2, 9, 6), rn(2, 9, 5)
    mb = torch.rand(4, 9) > 0.3
    mb[:, 0] = True
    sdpa_case("sdpa_bool_mask", q, k, v, mask=mb)
    mb2 = mb.clone()
    mb2[2, :] = False  # a fully masked row: zeros
    sdpa_case("sdpa_bool_mask_empty_row", q, k, v, mask=mb2)
    mf = rn(2, 1, 9)
    sdpa_case("sdpa_float_mask", q, k, v, mask=mf, scale=0.3)
    q, k, v = rn(2, 1, 4, 8), rn(1, 3, 6, 8), rn(3, 6, 8)
    sdpa_case("sdpa_broadcast_batch", q, k, v)
    q, k, v = rn(6, 8), rn(4, 8), rn(4, 3)
    sdpa_case("sdpa_causal_l_gt_s", q, k, v, causal=True)
    q, k, v = rn(1, 2, 40, 64), rn(1, 2, 40, 64), rn(1, 2, 40, 64)
    mh = rn(1, 1, 40, 40, dtype=torch.float16)
    sdpa_case("sdpa_f16_float_mask", q.half(), k.half(), v.half(), mask=mh)

    # --- the real-model zoo's ops (appended last: earlier cases keep their random streams)
    def Af2(a, b):  # a float64 attribute of two values
        return (2, [float(a), float(b)])

    small = lambda *shape, dt=torch.float32: torch.randint(-2, 3, shape).to(dt)  # noqa: E731
    for name, fn in (
        ("eq", torch.eq),
        ("ne", torch.ne),
        ("lt", torch.lt),
        ("le", torch.le),
        ("gt", torch.gt),
        ("ge", torch.ge),
    ):
        for dt in dts:
            a = small(3, 1, 5, dt=dt)
            b = small(4, 1, dt=dt)
            if dt in FLOATS:
                a[0, 0, 1] = NAN
            w.case(f"{name}_{DT_NAME[dt]}", name, [], [a, b], fn(a, b))
    for name, fn in (
        ("bitwise_and", torch.bitwise_and),
        ("bitwise_or", torch.bitwise_or),
        ("bitwise_xor", torch.bitwise_xor),
    ):
        for dt in (torch.int32, torch.int64, torch.bool):
            a, b = any_dt((2, 7), dt), any_dt((7,), dt)
            if dt != torch.bool:
                a, b = a * 1000 - 7, b * 999
            w.case(f"{name}_{DT_NAME[dt]}", name, [], [a, b], fn(a, b))
    for dt in (torch.int32, torch.int64, torch.bool):
        a = any_dt((3, 5), dt)
        w.case(f"bitwise_not_{DT_NAME[dt]}", "bitwise_not", [], [a], torch.bitwise_not(a))
    for dt in FLOATS:
        x = rn(4, 9, dtype=dt, scale=6.0)
        w.case(f"cos_{DT_NAME[dt]}", "cos", [], [x], torch.cos(x))
        w.case(f"sin_{DT_NAME[dt]}", "sin", [], [x], torch.sin(x))
        x = rn(3, 7, 2, dtype=dt)
        w.case(f"cumsum_{DT_NAME[dt]}", "cumsum", [Ai(1)], [x], torch.cumsum(x, 1), tol=4.0)
        x = rn(2, 6, 5, 4, dtype=dt)
        gw, gb = rn(6, dtype=dt), rn(6, dtype=dt)
        w.case(
            f"group_norm_{DT_NAME[dt]}",
            "group_norm",
            [Ai(3), Af(1e-5)],
            [x, gw, gb],
            F.group_norm(x, 3, gw, gb),
            tol=2.0,
        )
        x = rn(2, 3, 4, 5, dtype=dt)
        for sz, sc in (((8, 10), None), ((7, 3), None), ((12, 10), (3.0, 2.0))):
            kw = {"scale_factor": sc} if sc else {"size": sz}
            scales = Af2(*sc) if sc else Af2(NAN, NAN)
            w.case(
                f"upsample_nearest2d_{sz[0]}x{sz[1]}_{DT_NAME[dt]}",
                "upsample_nearest2d",
                [Ai(*sz), scales],
                [x],
                F.interpolate(x, mode="nearest", **kw),
            )
            for align in (False, True):
                w.case(
                    f"upsample_bilinear2d_{sz[0]}x{sz[1]}_{int(align)}_{DT_NAME[dt]}",
                    "upsample_bilinear2d",
                    [Ai(*sz), scales, Ai(int(align))],
                    [x],
                    F.interpolate(x, mode="bilinear", align_corners=align, **kw),
                    tol=2.0,
                )
    for dt in (torch.int32, torch.int64):
        x = torch.randint(-50, 50, (2, 9), dtype=dt)
        w.case(f"cumsum_{DT_NAME[dt]}", "cumsum", [Ai(-1)], [x], torch.cumsum(x, -1).to(dt))
    for dt in dts:
        x = any_dt((2, 3, 4), dt)
        w.case(
            f"pad_{DT_NAME[dt]}",
            "pad",
            [Ai(1, 2, -1, 2), Af(1.0)],
            [x],
            F.pad(x, (1, 2, -1, 2), value=1.0 if dt != torch.bool else True),
        )
        x = any_dt((2, 5, 6, 3), dt)
        i, j = torch.randint(-5, 5, (4, 1)), torch.randint(-6, 6, (3,), dtype=torch.int32)
        w.case(f"index_{DT_NAME[dt]}", "index", [Ai(1), Ai(1)], [x, i, j], x[:, i, j.long()])
        x = any_dt((3, 5, 4), dt)
        ix = torch.randint(0, 5, (3, 7, 2))
        w.case(f"gather_{DT_NAME[dt]}", "gather", [Ai(1)], [x, ix], torch.gather(x, 1, ix))
    x, ix = rn(3, 8), torch.randint(0, 8, (5,), dtype=torch.int32)
    w.case("index_select_nowrap", "index", [Ai(1), Ai(0)], [x, ix], torch.index_select(x, 1, ix))

    w.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
