"""Self-test of the benchmark's model code, CPU only (about a minute on 2 cores):

    python bench/selftest.py            # here (torch 2.14) and on the H200 (torch 2.11)

1. the counter hash (numpy uint32) against a pure-Python implementation of the same hash, on
   the first indices and a spread of large ones;
2. ``uniform``'s values are exactly the 24-bit lattice points mapped affinely into [lo, hi);
3. the weights and inputs of every config hash to the golden checksums recorded on the
   development machine (so running this on the H200 proves both sides hold identical weights,
   independently of any export);
4. every model's forward at batch 1 in fp32 runs, is finite and has the expected shape;
5. the analytic FLOP counts equal torch's FlopCounterMode plus attention's two matmuls (which the
   counter does not see through the CPU SDPA kernel);
6. bench/report.py's parser on a synthetic kiln_runner log;
7. bench/kernels_table.py on a synthetic Nsight Compute CSV and runner log (two engines).

Exit status 0 when everything passes.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import models as M  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

# sha256 prefixes of the fp16 weights (per family) and fp16 inputs (per config), recorded with
# torch 2.14 / numpy 2 on the development machine. A change of bench/models.py that changes
# them must update these (and re-export: the manifest records them too).
GOLDEN_WEIGHTS = {
    "mlp": "dc17b9a5e8e4f6c9",
    "resnet50": "d8ee947c0bbd0144",
    "vit_b16": "6d9ce5338e1d27c2",
    "bert": "4f862aa53e1fb88e",
    "encoder": "6d81df350ce7760c",
}
GOLDEN_INPUTS = {
    "mlp_b1": "9c6018dbed46f0f0",
    "mlp_b64": "8c9b5aff78aa117f",
    "resnet50_b1": "8a3e0a37e406d92a",
    "resnet50_b32": "b626323b1d554c89",
    "vit_b16_b1": "9f1b78f5c9bc11ab",
    "bert_b1": "09ad0af3404114a7",
    "bert_b8": "90f09aee3fedbf70",
    "encoder_b1": "e6739b53f0ee2c12",
}
OUT_SHAPES = {
    "mlp": (1, 1024),
    "resnet50": (1, 1000),
    "vit_b16": (1, 1000),
    "bert": (1, 128, 768),
    "encoder": (1, 256, 1024),
}

failures: list[str] = []


def check(cond: bool, what: str) -> None:
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def py_hash(name: str, i: int) -> int:
    """The same counter hash in Python integers (an independent reference)."""
    m = 0xFFFFFFFF

    def fmix(h):
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & m
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & m
        return h ^ (h >> 16)

    h = fmix(((i * 0x9E3779B1) & m) ^ zlib.crc32(name.encode()))
    return fmix(h ^ zlib.crc32(("2/" + name).encode()))


def test_hash() -> None:
    n = 1 << 20
    got = M.hash_u32("bert/layers.0.output.weight", n)
    idx = list(range(64)) + [n - 1, n // 3, 12345, 999_983]
    want = [py_hash("bert/layers.0.output.weight", i) for i in idx]
    check([int(got[i]) for i in idx] == want, "hash_u32 equals the pure-Python hash")
    check(got.dtype == np.uint32 and len(np.unique(got[:4096])) > 4090, "hash_u32 spreads values")


def test_uniform() -> None:
    lo, hi = -0.25, 0.75
    u = M.uniform("t/x", (4096,), lo, hi).double()
    k = (torch.from_numpy(M.hash_u32("t/x", 4096) >> np.uint32(8)).double() - 2**23) / 2**23
    exact = k * (hi - lo) / 2 + (hi + lo) / 2
    check(bool(((u - exact).abs() <= 2**-24 * 2).all()), "uniform = affine map of the hash bits")
    check(float(u.min()) >= lo and float(u.max()) < hi, "uniform stays in [lo, hi)")


def test_models() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    for fam in M.FAMILIES:
        m = M.build_model(fam)
        ck = M.state_checksum(m.half())
        check(ck == GOLDEN_WEIGHTS[fam], f"{fam}: fp16 weights checksum {ck}")
        m = m.float()
        for cfg in (c for c in M.CONFIGS if c.family == fam):
            x = [t.half() if t.is_floating_point() else t for t in M.make_inputs(cfg)]
            ck = M.tensors_checksum(x)
            check(ck == GOLDEN_INPUTS[cfg.name], f"{cfg.name}: fp16 inputs checksum {ck}")
        cfg = next(c for c in M.CONFIGS if c.family == fam and c.batch == 1)
        x = M.make_inputs(cfg)
        fc = FlopCounterMode(display=False)
        with torch.no_grad(), fc:
            y = m(*x)
        check(
            tuple(y.shape) == OUT_SHAPES[fam] and bool(torch.isfinite(y).all()),
            f"{fam}: forward {tuple(y.shape)}, finite, |y|max {float(y.abs().max()):.3g}",
        )
        attn = {
            "vit_b16": 12 * 4 * 197 * 197 * 768,
            "bert": 12 * 4 * 128 * 128 * 768,
            "encoder": 4 * 256 * 256 * 1024,
        }.get(fam, 0)
        counted = fc.get_total_flops() + attn
        check(
            counted == cfg.fam.flops(1),
            f"{fam}: analytic FLOPs {cfg.fam.flops(1):.4g} = counted {counted:.4g}",
        )
    check(M.FAMILIES["mlp"].flops(64) == 64 * M.FAMILIES["mlp"].flops(1), "FLOPs scale with batch")


def test_report_parser() -> None:
    import report

    log = "\n".join(
        [
            "=== runner bert_b1 devio",
            "I 00:00:00.1 executorch:kiln_executorch.cpp:209] KilnBackend: engine ready for method "
            "'forward' on cuda:0 (1 inputs, 1 outputs)",
            "output 0: matches expected (max |err| 0.00391, tolerance 0.05)",
            "latency over 200 iterations (warmup 20): median 0.5120 ms, min 0.5000 ms, "
            "p90 0.5300 ms, mean 0.5150 ms",
            "kiln_runner: OK median_ms=0.5120",
            "=== end rc=0 s=3",
            "=== runner bert_b1 host",
            "kiln_runner: error: execute failed",
            "=== end rc=1 s=1",
        ]
    )
    r = report.parse_runner_log(log)
    a, b = r.get(("bert_b1", "devio"), {}), r.get(("bert_b1", "host"), {})
    check(
        a.get("median_ms") == 0.512
        and a.get("device") == "cuda:0"
        and a.get("expected_ok")
        and a.get("p90_ms") == 0.53,
        "report parses a kiln_runner section",
    )
    check(b.get("rc") == 1 and "median_ms" not in b and "error" in b, "report keeps a failure")


def test_kernels_table() -> None:
    import kernels_table as K

    head = '"ID","PID","Process","Host","Kernel Name","Ctx","Stream","Block","Grid","Dev","CC",'
    head += '"Section","Metric Name","Metric Unit","Metric Value"'
    names = ["tuning_a", "tuning_b", "ln", "gemm", "sdpa", "ln", "gemm", "sdpa", "tail"]
    lines = [head, "kiln_runner: OK median_ms=0.1"]
    for i, n in enumerate(names):
        v = f"{1000 * (i + 1):,}"
        for metric, unit, val in (
            ("dram__bytes_read.sum", "Kbyte", f"{1.5 * (i + 1):,}"),
            ("gpu__time_duration.sum", "ns", v),
        ):
            lines.append(
                f'"{i}","1","kiln_runner","h","{n}","1","13","(128, 1, 1)","(8, 1, 1)","0","9.0",'
                f'"Command line profiler metrics","{metric}","{unit}","{val}"'
            )
    log = (
        "Kiln: CUDA graph instantiated: 2 nodes (2 kernels, 0 memcpy, 0 memset, 0 other)\n"
        "Kiln: CUDA graph instantiated: 3 nodes (1 kernels, 2 memcpy, 0 memset, 0 other)\n"
    )
    rows = K.rows("\n".join(lines))
    mb = K.dram_mb("\n".join(lines))
    n = K.kernels_per_execute(log)
    last = rows[-n:]
    check(
        n == 3 and [r[0] for r in last] == ["gemm", "sdpa", "tail"] and last[0][1] == 7.0,
        "kernels_table takes the last execute's kernels",
    )
    check(
        len(mb) == len(rows) and abs(mb[-n] - 0.0105) < 1e-12,
        "kernels_table reads each kernel's DRAM bytes (Kbyte -> MB)",
    )


def test_kernel_report() -> None:
    import kernel_report as R

    names = {
        "nvjet_sm90_hsh_64x64_64x13_4x2_h_bz_TNT": "gemm",
        "void sk_reduce_kernel<__half, 4>(float4 const*)": "gemm",
        "void implicit_convolve_sgemm<__half, __half, 128>": "conv",
        "void sdpa_tc_kernel<__half, 80, 4>(sdpa_params)": "attention",
        "void norm_rows_kernel<__half, false>(__half const*)": "norm",
        "void reduce_cols_kernel<double>(red_params)": "reduce",
        "void ew_vec_kernel<__half, false>(ew_params, long)": "elementwise",
        "void copy_strided_kernel<unsigned short, int>(unsigned short*)": "layout",
        "memcpy32_post": "other",
    }
    got = {n: R.family(n) for n in names}
    check(got == names, f"kernel_report families: {got}")
    entry = {
        "trace": {
            "kernels_per_step": 5.0,
            "span_us": 30.0,
            "idle_us": 2.0,
            "per_name": [
                {"name": "nvjet_a", "per_step": 2.0, "us_per_step": 20.0},
                {"name": "void sdpa_tc_kernel<>", "per_step": 1.0, "us_per_step": 5.0},
                {"name": "void ew_vec_kernel<>", "per_step": 2.0, "us_per_step": 3.0},
            ],
        },
        "layers": [{"kernel": k} for k in ("cublaslt", "none", "fused", "sdpa_tc", "kiln")],
    }
    r = R.model_report(entry, {"flops": 5e9, "weight_bytes": 4e7}, 4.0)
    check(
        r["layers_run"] == 3
        and abs(r["kernels_per_layer"] - 5 / 3) < 1e-12
        and abs(r["math_tflops"] - 200.0) < 1e-9  # 5 GFLOP over 25 us
        and abs(r["weight_tbs"] - 2.0) < 1e-12  # 40 MB over 20 us
        and abs(r["weight_of_peak"] - 0.5) < 1e-12
        and r["families"]["elementwise"] == {"kernels": 2.0, "us": 3.0},
        f"kernel_report sums a model: {r}",
    )


def main() -> int:
    torch.set_num_threads(2)
    print(f"selftest: torch {torch.__version__}, numpy {np.__version__}")
    test_hash()
    test_uniform()
    test_report_parser()
    test_kernels_table()
    test_kernel_report()
    test_models()
    print(
        f"selftest: {len(failures)} failure(s)" + (": " + "; ".join(failures) if failures else "")
    )
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
