# SPDX-License-Identifier: Apache-2.0
"""The kernels of Kiln's last execute from an Nsight Compute CSV (bench/kernels_device.sh).

    python3 bench/kernels_table.py NCU_CSV RUNNER_LOG

NCU_CSV: `ncu --metrics gpu__time_duration.sum[,dram__bytes_read.sum] --csv` over kiln_runner
(every kernel of the process: cuBLASLt's timing runs, warm-up and executes); with the DRAM
metric each kernel's bytes read from HBM are printed too (what the L2 did not hold).
RUNNER_LOG: the runner's stderr at KILN_LOG_LEVEL=info, whose "CUDA graph instantiated: N nodes
(K kernels, ...)" lines give the kernels per execute (summed over the program's engines); the
last K rows are the last execute.
"""

import csv
import re
import sys


def kernels_per_execute(log_text: str) -> int:
    counts = [
        int(k) for k in re.findall(r"CUDA graph instantiated: \d+ nodes \((\d+) kernels", log_text)
    ]
    if not counts:
        raise SystemExit("kernels_table: no 'CUDA graph instantiated' line in the runner's log")
    # each engine logs its graph once (the first replayed execute records it)
    return sum(counts)


def rows(csv_text: str) -> list[tuple[str, float]]:
    table = [r for r in csv.reader(csv_text.splitlines()) if len(r) > 10]
    if not table:
        raise SystemExit("kernels_table: no rows in the Nsight Compute CSV")
    head = table[0]
    ki, mi, vi = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
    return [
        (r[ki], float(r[vi].replace(",", "")) / 1000.0)
        for r in table[1:]
        if r[mi] == "gpu__time_duration.sum"
    ]


_UNITS = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}


def dram_mb(csv_text: str) -> list[float]:
    """Each kernel's dram__bytes_read.sum in MB (decimal), in order; empty without the metric."""
    table = [r for r in csv.reader(csv_text.splitlines()) if len(r) > 10]
    if not table:
        return []
    head = table[0]
    mi, ui, vi = head.index("Metric Name"), head.index("Metric Unit"), head.index("Metric Value")
    return [
        float(r[vi].replace(",", "")) * _UNITS[r[ui]]
        for r in table[1:]
        if r[mi] == "dram__bytes_read.sum" and r[ui] in _UNITS
    ]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        raise SystemExit(__doc__)
    with open(argv[1]) as f:
        text = f.read()
    ks, mb = rows(text), dram_mb(text)
    with open(argv[2]) as f:
        n = kernels_per_execute(f.read())
    last = ks[-n:]
    last_mb = mb[-n:] if len(mb) == len(ks) else [None] * len(last)
    for (name, us), m in zip(last, last_mb, strict=True):
        dram = f"  {m:7.2f} MB from HBM" if m is not None else ""
        print(f"  {us:8.2f} us{dram}  {name[:110]}")
    total = f", {sum(last_mb):.1f} MB from HBM" if last_mb and last_mb[0] is not None else ""
    print(f"  {sum(us for _, us in last):8.2f} us  in {len(last)} kernels, each alone{total}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
