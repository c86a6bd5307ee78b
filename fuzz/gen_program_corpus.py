"""Writes the seed corpus of fuzz/fuzz_program.c: programs exported with Kiln from small models
with deterministic random weights, each as one seed file `seed-<name>.bin`, and damaged copies
that crashed ExecuTorch before Kiln checked programs (`regress-<name>.bin`):

    u32 little-endian length of the .pte, the .pte, then the .ptd (absent for inline weights)

The same seeds drive the program-API thread test (tests/program_threads.c).

    python fuzz/gen_program_corpus.py fuzz/corpus/fuzz_program
"""

from __future__ import annotations

import struct
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests"))
from kiln_test_models import (  # noqa: E402
    MLP,
    EncoderBlock,
    ResNet18,
    RingCounter,
    WithAtanLinked,
)


def models():
    torch.manual_seed(0)
    mlp = MLP(16, 32, 8).eval()
    x = torch.randn(4, 16)
    yield "mlp-ext", mlp, (x,), {"external_data": "w"}
    yield "mlp-inline", mlp, (x,), {}
    yield "mlp-fp16", mlp, (x,), {"precision": "fp16"}
    batch = torch.export.Dim("batch", min=1, max=8)
    yield "mlp-dynamic", mlp, (x,), {"dynamic_shapes": ({0: batch},)}
    torch.manual_seed(1)
    yield "resnet-w4", ResNet18(width=4).eval(), (torch.randn(1, 3, 32, 32),), {}
    torch.manual_seed(2)
    yield (
        "encoder-ext",
        EncoderBlock(16, 2, 32).eval(),
        (torch.randn(1, 8, 16),),
        {"external_data": "enc"},
    )
    torch.manual_seed(3)
    # Two Kiln delegates around an atan, one passing tensors straight to the other (linked:
    # docs/runtime.md, "Between delegates").
    yield (
        "linked",
        WithAtanLinked().eval(),
        (torch.randn(4, 16),),
        {"dynamic_shapes": ({0: batch},)},
    )
    torch.manual_seed(4)
    ring = RingCounter().eval()
    # two methods over one module (save's dict form): states shared between them
    yield (
        "states-ring",
        {"fill": (ring, (torch.randn(3, 4),)), "step": (ring, (torch.randn(1, 4),))},
        None,
        {},
    )


# --- regression inputs: damaged programs that crashed ExecuTorch's loader (found by fuzzing;
# Kiln's .pte check refuses them now). Derived from the seeds by a small flatbuffer walk.


def _u32(b, at):
    return struct.unpack_from("<I", b, at)[0]


def _field(b, table, slot):
    """Position of field `slot` of the table at `table`, or 0 when absent."""
    vt = table - struct.unpack_from("<i", b, table)[0]
    vsize = struct.unpack_from("<H", b, vt)[0]
    if 4 + 2 * slot + 2 > vsize:
        return 0
    off = struct.unpack_from("<H", b, vt + 4 + 2 * slot)[0]
    return table + off if off else 0


def _ref(b, at):
    return at + _u32(b, at)


def _first_plan(b):
    program = _u32(b, 0)
    plans = _ref(b, _field(b, program, 1))  # Program.execution_plan
    return _ref(b, plans + 4)


def regressions(seeds: dict[str, bytes]):
    """(name, seed bytes) pairs of damaged programs (u32 length + .pte + .ptd, as seeds)."""

    def split(seed):
        n = _u32(seed, 0)
        return bytearray(seed[4 : 4 + n]), seed[4 + n :]

    def join(pte, ptd):
        return struct.pack("<I", len(pte)) + bytes(pte) + ptd

    # ExecutionPlan.outputs[0] out of range: ExecuTorch's Method::get_outputs aborts on it.
    pte, ptd = split(seeds["mlp-inline"])
    outputs = _ref(pte, _field(pte, _first_plan(pte), 4))
    struct.pack_into("<i", pte, outputs + 4, -589823)
    yield "output-index", join(pte, ptd)
    # A planned buffer of 2.9e17 bytes: Module::make_planned_memory allocates it.
    pte, ptd = split(seeds["mlp-inline"])
    sizes = _ref(pte, _field(pte, _first_plan(pte), 8))
    struct.pack_into("<q", pte, sizes + 4 + 8 * (_u32(pte, sizes) - 1), 0x4004000002D8000)
    yield "planned-size", join(pte, ptd)
    # A compile spec whose vtable reference points 66 bytes on, at a vtable without its key
    # (what one changed byte did in fuzzing): BackendDelegate::Init dereferences the key.
    pte, ptd = split(seeds["encoder-ext"])
    delegates = _ref(pte, _field(pte, _first_plan(pte), 7))
    delegate = _ref(pte, delegates + 4)
    specs = _ref(pte, _field(pte, delegate, 2))
    spec = _ref(pte, specs + 4 + 4 * (_u32(pte, specs) - 1))
    struct.pack_into("<i", pte, spec, struct.unpack_from("<i", pte, spec)[0] + 66)
    yield "compile-spec-key", join(pte, ptd)


def main(out: str) -> None:
    from kiln.executorch import save

    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    seeds = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, args, kw in models():
            pte = Path(tmp) / f"{name}.pte"
            if args is None:  # a dict of methods
                save(model, pte, quiet=True, **kw)
            else:
                save(model, pte, args, **kw)
            ptd = b""
            if "external_data" in kw:
                ptd = (Path(tmp) / f"{kw['external_data']}.ptd").read_bytes()
            p = pte.read_bytes()
            seeds[name] = struct.pack("<I", len(p)) + p + ptd
            (outdir / f"seed-{name}.bin").write_bytes(seeds[name])
            print(f"seed-{name}.bin: {len(p)} + {len(ptd)} bytes")
    for name, data in regressions(seeds):
        (outdir / f"regress-{name}.bin").write_bytes(data)
        print(f"regress-{name}.bin: {len(data)} bytes")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus/fuzz_program")
