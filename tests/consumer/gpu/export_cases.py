# SPDX-License-Identifier: Apache-2.0
"""Exports the programs check_program_cuda runs (tests/consumer/gpu/prepare.sh calls this).

    python tests/consumer/gpu/export_cases.py OUT_DIR

For each case OUT_DIR/<case>/ holds model.pte, inputs.bin and expected.bin (eager PyTorch
outputs at export time, Kiln's tensor file format) written by examples/cpp/export_for_runner.py;
OUT_DIR/cases.txt lists one case a line:

    <case> <devio 0|1> <tolerance> <ops outside the delegates>

devio=1: exported with MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False)
(inputs and outputs may be bound in place, in device memory); 0: ExecuTorch's default plan.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "examples" / "cpp"))
import export_for_runner  # noqa: E402

TOL = {"fp32": 1e-4, "fp16": 2e-2}


def main(argv) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for model_name, batch in (("mlp", 8), ("convnet", 4)):
        for precision in ("fp32", "fp16"):
            for devio in (True, False):
                model, inputs = export_for_runner._demo_model(model_name, batch)
                case = f"{model_name}_{precision}_{'devio' if devio else 'planned'}"
                paths = export_for_runner.save_for_runner(
                    model, inputs, out / case, precision=precision, device_io=devio
                )
                outside = paths["ops_outside_delegates"]
                lines.append(
                    f"{case} {int(devio)} {TOL[precision]:g} {','.join(outside) or '-'}"
                )
    # Half-precision inputs and outputs (the other cases take and give float32).
    for devio in (True, False):
        model, inputs = export_for_runner._demo_model("mlp", 8)
        model = model.half()
        inputs = tuple(x.half() for x in inputs)
        case = f"mlp_f16io_{'devio' if devio else 'planned'}"
        paths = export_for_runner.save_for_runner(
            model, inputs, out / case, precision="fp16", device_io=devio
        )
        outside = paths["ops_outside_delegates"]
        lines.append(f"{case} {int(devio)} 2e-2 {','.join(outside) or '-'}")
    (out / "cases.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    torch.set_num_threads(2)
    raise SystemExit(main(sys.argv))
