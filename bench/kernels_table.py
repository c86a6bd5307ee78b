# SPDX-License-Identifier: Apache-2.0
"""The kernels of Kiln's last execute from an Nsight Compute CSV (bench/kernels_device.sh).

    python3 bench/kernels_table.py NCU_CSV RUNNER_LOG

NCU_CSV: `ncu --metrics gpu__time_duration.sum --csv` over kiln_runner (every kernel of the
process: cuBLASLt's timing runs, warm-up and executes). RUNNER_LOG: the runner's stderr at
KILN_LOG_LEVEL=info, whose "CUDA graph instantiated: N nodes (K kernels, ...)" lines give the
kernels per execute (summed over the program's engines); the last K rows are the last execute.
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


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        raise SystemExit(__doc__)
    with open(argv[1]) as f:
        ks = rows(f.read())
    with open(argv[2]) as f:
        n = kernels_per_execute(f.read())
    last = ks[-n:]
    for name, us in last:
        print(f"  {us:8.2f} us  {name[:110]}")
    print(f"  {sum(us for _, us in last):8.2f} us  in {len(last)} kernels, each alone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
