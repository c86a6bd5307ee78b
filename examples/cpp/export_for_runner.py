# SPDX-License-Identifier: Apache-2.0
"""Exports a model with Kiln and writes what ``kiln_runner`` needs: ``model.pte`` (and
``model.ptd`` with --external-data), ``inputs.bin`` and ``expected.bin`` (eager PyTorch outputs),
in Kiln's tensor file format (kiln_tensors.py).

    python examples/cpp/export_for_runner.py --out build/runner-demo [--model mlp|convnet|linked]
        [--batch N] [--precision fp32|fp16|bf16] [--external-data] [--device-io] [--no-kiln]

--device-io exports with ExecuTorch's memory planning off for the method's inputs and outputs
(MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False)), so the runner can bind
caller buffers in place (kiln_runner --device-io binds CUDA memory). --no-kiln exports without
the Kiln partitioner (everything on ExecuTorch's CPU kernels), for comparison. --model linked
is an MLP split by an op Kiln lacks (atan) into two Kiln delegates, one of which passes a tensor
straight to the other: run it with kiln_runner --expect-linked to check that this tensor stays
in the engines' memory (docs/runtime.md, "Between delegates").

From Python code: ``save_for_runner(model, example_inputs, out_dir, ...)``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kiln_tensors  # noqa: E402


def _demo_model(name: str, batch: int):
    torch.manual_seed(0)
    if name == "mlp":
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)
        )
        return model.eval(), (torch.randn(batch, 64),)
    if name == "convnet":
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(32, 10),
        )
        return model.eval(), (torch.randn(batch, 3, 32, 32),)
    if name == "linked":
        return _Linked().eval(), (torch.randn(batch, 64),)
    raise SystemExit(f"unknown --model {name!r}: use mlp, convnet or linked")


class _Linked(torch.nn.Module):
    """Two Kiln delegates around torch.atan (not a Kiln op): h goes from the first straight to
    the second (linked: it stays in the engine's memory), a goes to the atan and to the second
    (linked, and copied to host memory for the atan), the atan's result through ExecuTorch."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 256)
        self.fc2 = torch.nn.Linear(256, 256)
        self.fc3 = torch.nn.Linear(256, 10)

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        a = self.fc2(h)
        f = torch.atan(a)
        return self.fc3(torch.nn.functional.silu(f) + h + a)


def save_for_runner(
    model,
    example_inputs,
    out_dir,
    *,
    precision: str = "fp32",
    external_data: bool = False,
    device_io: bool = False,
    kiln: bool = True,
    name: str = "model",
) -> dict:
    """Exports ``model`` and writes ``<name>.pte`` [``<name>.ptd``], ``inputs.bin`` and
    ``expected.bin`` to ``out_dir``. Returns the paths, and under ``ops_outside_delegates`` the
    operators left to ExecuTorch's CPU kernels (empty when the delegates take everything)."""
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    example_inputs = tuple(example_inputs)
    with torch.no_grad():
        expected = model(*example_inputs)
    if isinstance(expected, torch.Tensor):
        expected = (expected,)
    ep = torch.export.export(model, example_inputs)
    partitioner = []
    if kiln:
        from kiln.executorch import KilnPartitioner

        partitioner = [
            KilnPartitioner(precision=precision, external_data=name if external_data else None)
        ]
    edge = to_edge_transform_and_lower(ep, partitioner=partitioner)
    # Operators left outside the delegates (run by ExecuTorch's CPU kernels: these cannot read
    # device memory, so device I/O needs this to be empty).
    outside = sorted(
        {
            str(n.target)
            for n in edge.exported_program().graph.nodes
            if n.op == "call_function"
            and "executorch_call_delegate" not in str(n.target)
            and "getitem" not in str(n.target)
        }
    )
    config = ExecutorchBackendConfig()
    if device_io:
        config = ExecutorchBackendConfig(
            memory_planning_pass=MemoryPlanningPass(
                alloc_graph_input=False, alloc_graph_output=False
            )
        )
    prog = edge.to_executorch(config)
    links = {}
    if kiln:
        from kiln.executorch import link_delegates

        # What kiln.executorch.export does too: tensors between Kiln delegates stay on the device.
        links = link_delegates(prog, config)
    paths = {"pte": out / f"{name}.pte"}
    with open(paths["pte"], "wb") as f:
        prog.write_to_file(f)
    if external_data:
        prog.write_tensor_data_to_file(str(out))
        paths["ptd"] = out / f"{name}.ptd"
    paths["inputs"] = out / "inputs.bin"
    paths["expected"] = out / "expected.bin"
    kiln_tensors.write(paths["inputs"], example_inputs)
    kiln_tensors.write(paths["expected"], list(expected))
    paths["ops_outside_delegates"] = outside
    paths["linked_inputs"] = sum(len(r.inputs) for recs in links.values() for r in recs.values())
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--model", default="mlp", help="mlp (default), convnet or linked")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    ap.add_argument("--external-data", action="store_true", help="weights in model.ptd")
    ap.add_argument("--device-io", action="store_true", help="inputs/outputs not memory-planned")
    ap.add_argument("--no-kiln", action="store_true", help="export without Kiln")
    args = ap.parse_args(argv)
    model, inputs = _demo_model(args.model, args.batch)
    paths = save_for_runner(
        model,
        inputs,
        args.out,
        precision=args.precision,
        external_data=args.external_data,
        device_io=args.device_io,
        kiln=not args.no_kiln,
    )
    tol = {"fp32": "1e-4", "fp16": "2e-2", "bf16": "8e-2"}[args.precision]
    cmd = f"kiln_runner --model {paths['pte']}"
    if "ptd" in paths:
        cmd += f" --data {paths['ptd']}"
    cmd += f" --inputs {paths['inputs']} --expected {paths['expected']} --tolerance {tol}"
    if args.device_io:
        cmd += " --device-io"
    if paths["linked_inputs"]:
        cmd += " --expect-linked"
    print("\n".join(f"{k}: {v}" for k, v in paths.items() if k != "ops_outside_delegates"))
    print(f"run: {cmd} --iterations 100 --warmup 10")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
