"""Exports the benchmark models with Kiln on the development machine and prepares the small,
carried folder the H200 run needs (``.dev/bench`` by default; ignored by git, carried to the
device). See docs/benchmarks.md for the why.

    PYTHONPATH=python KILN_LIBRARY=build-gpu/libkiln.so \\
      python bench/export_here.py [--models all|NAMES] [--out .dev/bench] \\
        [--kiln-dir build-gpu] [--runner-dir build-runner/bundle] [--cpu-check mlp_b1,...]

Per config (mlp_b1, resnet50_b32, ...; bench/models.py), fp16 model, static shapes:

- ``models/<cfg>.pte``: the program exported for host I/O (ExecuTorch plans input and output
  memory), ``models/<cfg>.devio.pte``: the same with ``alloc_graph_input/output=False`` so
  ``kiln_runner --device-io`` binds CUDA buffers. Both hold only the engine structure: every
  weight is external (``<cfg>.ptd``), which is *not* carried;
- ``models/<cfg>.graph.json.gz``: the recorded Kiln graph(s) (bench/kiln_record.py), from
  which the device rebuilds the identical engine and its weights;
- ``models/<cfg>.ptd.skel.gz``: the exported ``.ptd`` up to its first weight (header and
  flatbuffer, a few KB), plus its layout in the manifest, from which the device writes the
  identical ``.ptd``;
- ``manifest.json``: checksums (weights, inputs, engines, .ptd, libkiln), analytic counts
  (FLOPs, weight bytes, floors), delegation summary, sizes.

Checks done here: the replay of each recording through libkiln's C API gives the exported
engine byte for byte, and the rebuilt ``.ptd`` equals the exported one byte for byte;
optionally (``--cpu-check``) the rebuilt engine runs on Kiln's CPU backend and is compared with
PyTorch.

With ``--io-dir DIR``, kiln_runner's ``<cfg>.inputs.bin`` and ``<cfg>.expected.bin`` are written
there too (not needed for the H200: the device run regenerates the same inputs, by checksum, and
takes the expected outputs from a float64 reference there).

With ``--kiln-dir`` the libkiln used for the export (and its CUDA plugin, if beside it) is
copied to ``<out>/lib``; with ``--runner-dir`` the kiln_runner bundle (examples/cpp, built with
-DKILN_RUNNER_BUNDLE=ON) is copied to ``<out>/runner``.

Several model families are exported by one child process each (the manifest merges them through
its file), so each family's memory is returned before the next: the zoo's large decoders after
the other models in one process exceeded the 24 GiB of this machine. ``--in-process`` exports
them all in this process.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import kiln_record as R  # noqa: E402
import models as M  # noqa: E402
import torch  # noqa: E402


def file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def half_inputs(cfg):
    return [t.half() if t.is_floating_point() else t for t in M.make_inputs(cfg)]


def delegation_summary(prog) -> dict:
    from executorch.exir.lowered_backend_module import executorch_call_delegate

    gm = prog.exported_program().graph_module
    n_delegates, ops = 0, []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is executorch_call_delegate:
            n_delegates += 1
        elif "getitem" not in str(n.target):
            ops.append(str(n.target))
    return {"kiln_delegates": n_delegates, "other_ops": ops}


def export_config(cfg, model16, out: Path, tmp: Path) -> dict:
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass
    from kiln.executorch import KilnPartitioner
    from kiln.executorch._export import _export_experts_as_batched, _restore_experts

    x16 = tuple(half_inputs(cfg))
    t0 = time.time()
    with R.Recorder() as rec, warnings.catch_warnings():
        # An unused, unbounded symbol in the edge program's range constraints makes Kiln warn
        # about a dynamic dimension; every shape here is static.
        warnings.filterwarnings("ignore", message=".*dynamic dimension.*no upper bound.*")
        # transformers' mixture-of-experts layers exported as kiln.executorch.save exports them
        # (batched_mm: grouped_mm's histc has no ExecuTorch form); PyTorch's anchors keep theirs
        warnings.filterwarnings("ignore", message=".*experts_implementation.*")
        switched = _export_experts_as_batched(model16)
        try:
            ep = torch.export.export(model16, x16)
        finally:
            _restore_experts(switched)
        edge = to_edge_transform_and_lower(
            ep, partitioner=[KilnPartitioner(precision="fp16", external_data=cfg.name)]
        )
    t_lower = time.time() - t0
    # to_executorch mutates the edge program: each variant lowers from its own copy.
    edge_devio = copy.deepcopy(edge)
    progs = {
        "host": edge.to_executorch(),
        "devio": edge_devio.to_executorch(
            ExecutorchBackendConfig(
                memory_planning_pass=MemoryPlanningPass(
                    alloc_graph_input=False, alloc_graph_output=False
                )
            )
        ),
    }
    mdir = out / "models"
    files = {}
    for kind, prog in progs.items():
        pte = mdir / (f"{cfg.name}.pte" if kind == "host" else f"{cfg.name}.devio.pte")
        with open(pte, "wb") as f:
            prog.write_to_file(f)
        d = tmp / kind
        d.mkdir(parents=True, exist_ok=True)
        prog.write_tensor_data_to_file(str(d))
        files[kind] = (pte, d / f"{cfg.name}.ptd")
    ptd = files["host"][1].read_bytes()
    if files["devio"][1].read_bytes() != ptd:
        raise RuntimeError(f"{cfg.name}: the two programs wrote different .ptd files")
    summary = delegation_summary(progs["host"])

    # Every engine must be inside both .pte files, and the recording must cover them.
    if len(rec.built) != summary["kiln_delegates"]:
        raise RuntimeError(
            f"{cfg.name}: {len(rec.built)} Kiln builds recorded, "
            f"{summary['kiln_delegates']} delegate calls in the program"
        )
    for pte, _ in files.values():
        blob = pte.read_bytes()
        for i, eng in enumerate(rec.engines):
            if blob.find(eng) < 0:
                raise RuntimeError(f"{cfg.name}: engine {i} is not inside {pte.name}")

    consts = R.resolve_constants(rec.built, rec.blobs, model16, M.canonical_names(cfg.family))
    layout = R.ptd_layout(ptd)
    all_weights = {k: d for ws in rec.weights for k, d in ws}
    if set(layout) != set(all_weights):
        raise RuntimeError(f"{cfg.name}: the .ptd keys differ from the engines' weight keys")
    for k, (off, size) in layout.items():
        if ptd[off : off + size] != all_weights[k]:
            raise RuntimeError(f"{cfg.name}: .ptd blob {k} is not the engine's weight")
    skel = R.make_skeleton(ptd, layout)
    (mdir / f"{cfg.name}.ptd.skel.gz").write_bytes(skel)
    meta = {
        "model": cfg.name,
        "family": cfg.family,
        "batch": cfg.batch,
        "state_checksum_fp16": M.state_checksum(model16, cfg.family),
        "input_checksum_fp16": M.tensors_checksum(x16),
    }
    graph_nbytes = R.save_recording(mdir / f"{cfg.name}.graph.json.gz", meta, rec.built, consts)
    return {
        **meta,
        "lower_s": round(t_lower, 1),
        "delegation": summary,
        "capi_ok": summary["kiln_delegates"] == 1 and not summary["other_ops"],
        "engines": [
            {
                "sha256": g["engine_sha256"],
                "nbytes": g["engine_nbytes"],
                "n_weights": len(g["weights"]),
            }
            for g in rec.built
        ],
        "ptd": {
            "name": f"{cfg.name}.ptd",
            "sha256": hashlib.sha256(ptd).hexdigest(),
            "nbytes": len(ptd),
            "layout": {k: list(v) for k, v in sorted(layout.items())},
        },
        "files": {
            "pte": f"models/{cfg.name}.pte",
            "devio_pte": f"models/{cfg.name}.devio.pte",
            "graph": f"models/{cfg.name}.graph.json.gz",
            "ptd_skeleton": f"models/{cfg.name}.ptd.skel.gz",
        },
        "sizes": {
            "pte": files["host"][0].stat().st_size,
            "devio_pte": files["devio"][0].stat().st_size,
            "graph": graph_nbytes,
            "ptd_skeleton": len(skel),
            "inline_constants": consts["inline_nbytes"],
        },
        "_ptd_bytes": ptd,  # for the replay check below; not written
    }


def verify_replay(entry: dict, out: Path, model16) -> float:
    """Replays the saved recording with freshly regenerated weights, as the device will."""
    t0 = time.time()
    doc = R.load_recording(out / entry["files"]["graph"])
    fresh = M.build_model(entry["family"]).half()
    if M.state_checksum(fresh, entry["family"]) != entry["state_checksum_fp16"]:
        raise RuntimeError(f"{entry['model']}: regenerated weights differ")
    results = R.replay(doc, R.named_tensors(fresh, M.canonical_names(entry["family"])), verify=True)
    weights = {k: d for _, ws in results for k, d in ws}
    skel = (out / entry["files"]["ptd_skeleton"]).read_bytes()
    ptd = R.fill_skeleton(skel, entry["ptd"]["nbytes"], entry["ptd"]["layout"], weights)
    if ptd != entry["_ptd_bytes"]:
        raise RuntimeError(f"{entry['model']}: the .ptd rebuilt from the skeleton differs")
    return time.time() - t0


def cpu_check(entry: dict, out: Path) -> float:
    """Runs the replayed engine on Kiln's CPU backend; relative error against fp32 PyTorch."""
    import kiln_capi as C

    cfg = M.CONFIG_BY_NAME[entry["model"]]
    m32 = M.build_model(cfg.family)
    doc = R.load_recording(out / entry["files"]["graph"])
    m16 = M.build_model(cfg.family).half()
    ((engine, weights),) = R.replay(doc, R.named_tensors(m16, M.canonical_names(cfg.family)))
    x16 = half_inputs(cfg)
    with torch.no_grad():
        ref = m32(*[t.float() if t.is_floating_point() else t for t in x16]).double()
    eng = C.Engine(engine, dict(weights), device="cpu", use_cuda_graphs=False)
    y = torch.empty(ref.shape, dtype=torch.float16)
    eng.bind([(t.data_ptr(), list(t.shape)) for t in x16], [(y.data_ptr(), y.numel() * 2)])
    eng.execute()
    eng.close()
    return float((y.double() - ref).norm() / ref.norm())


def write_io(cfg, io_dir: Path) -> None:
    """kiln_runner's input and expected-output files (examples/cpp/kiln_tensors.py format), the
    expected output from the fp32 model on the CPU, rounded to fp16. The device run writes its
    own (same inputs, expected from a float64 reference): these are for runs elsewhere."""
    sys.path.insert(0, str(ROOT / "examples" / "cpp"))
    import kiln_tensors

    io_dir.mkdir(parents=True, exist_ok=True)
    x16 = half_inputs(cfg)
    with torch.no_grad():
        ref = M.build_model(cfg.family)(*[t.float() if t.is_floating_point() else t for t in x16])
    kiln_tensors.write(io_dir / f"{cfg.name}.inputs.bin", x16)
    kiln_tensors.write(io_dir / f"{cfg.name}.expected.bin", [ref.half()])


def copy_libs(src: Path, dst: Path, names) -> list[str]:
    dst.mkdir(parents=True, exist_ok=True)
    copied = []
    for pattern in names:
        for f in sorted(src.glob(pattern)):
            if f.is_file():
                shutil.copy2(f, dst / f.name, follow_symlinks=True)
                copied.append(f.name)
    return copied


def export_in_children(args, families: list[str], argv: list[str]) -> int:
    """Each family's configs exported by a child process (the manifest, merged through its file,
    collects them); then the libraries and the runner copied once, as one process would."""
    names = {f: [c.name for c in M.select(args.models) if c.family == f] for f in families}
    base, skip = [], False
    for a in argv:  # the same arguments, but the models, and no library or runner copies
        if skip:
            skip = False
            continue
        if a in ("--models", "--runner-dir", "--carry-libs"):
            skip = True
            continue
        if a.startswith(("--models=", "--runner-dir=", "--carry-libs=")):
            continue
        base.append(a)
    failed = []
    for f in families:
        cmd = [sys.executable, str(Path(__file__).resolve()), *base, "--in-process"]
        cmd += ["--models", ",".join(names[f])]
        if subprocess.run(cmd).returncode != 0:
            failed.append(f)
    out = Path(args.out)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    finish(args, out, manifest, manifest_path)
    if failed:
        print(f"export_here: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def download_libs(names: str, dst: Path) -> list[str]:
    """Wheels (no dependencies) of the model libraries NAMES at this machine's versions, into
    dst: bench/run_device.sh installs them on the device ahead of its own, so that the weights are
    regenerated from the same parameter names (another timm named EVA-02's rotary buffer
    otherwise)."""
    versions = M.library_versions()
    wanted = []
    for n in (x.strip() for x in names.split(",") if x.strip()):
        if n not in versions:
            raise SystemExit(f"--carry-libs: {n!r} is not one of {', '.join(versions)}")
        if versions[n] == "none":
            raise SystemExit(f"--carry-libs: {n} is not installed here")
        wanted.append(f"{n}=={versions[n].split('+')[0]}")
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
         "-d", str(dst), *wanted],
        check=True,
    )  # fmt: skip
    return sorted(p.name for p in dst.glob("*.whl"))


def finish(args, out: Path, manifest: dict, manifest_path: Path) -> None:
    """Copies the libraries and the runner into out (what the device call carries)."""
    if args.kiln_dir:
        manifest["lib"] = copy_libs(
            Path(args.kiln_dir), out / "lib", ["libkiln.so*", "libkiln_cuda.so"]
        )
    if args.runner_dir:
        src = Path(args.runner_dir)
        dst = out / "runner"
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst, symlinks=False)
        manifest["runner"] = sorted(p.name for p in dst.iterdir())
    if getattr(args, "carry_libs", ""):
        manifest["pylibs"] = download_libs(args.carry_libs, out / "pylibs")
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"export_here: {out} holds {total / 2**20:.1f} MiB (carry limit 64 MiB with the tree)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="all", help="configs or families, comma-separated")
    ap.add_argument("--out", default=str(ROOT / ".dev" / "bench"))
    ap.add_argument(
        "--kiln-dir", help="folder of the libkiln.so (+ libkiln_cuda.so) to use and carry"
    )
    ap.add_argument("--runner-dir", help="kiln_runner bundle folder to carry")
    ap.add_argument(
        "--carry-libs",
        default="",
        help="model libraries (e.g. timm,transformers) whose wheels at this machine's versions "
        "to carry and install on the device (no other files, no dependencies)",
    )
    ap.add_argument("--cpu-check", default="", help="configs to run on Kiln's CPU backend here")
    ap.add_argument("--no-verify", action="store_true", help="skip the replay check")
    ap.add_argument("--io-dir", help="also write kiln_runner inputs/expected files here")
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="export every family in this process (default with several families: one child "
        "process per family, so that each returns its memory: the large decoders in one process "
        "after the others exceeded 24 GiB)",
    )
    args = ap.parse_args(argv if argv is not None else sys.argv[1:])
    if not args.in_process:
        families = list(dict.fromkeys(c.family for c in M.select(args.models)))
        if len(families) > 1:
            return export_in_children(args, families, argv if argv is not None else sys.argv[1:])

    out = Path(args.out)
    (out / "models").mkdir(parents=True, exist_ok=True)
    if args.kiln_dir:
        os.environ["KILN_LIBRARY"] = str(Path(args.kiln_dir).resolve() / "libkiln.so")
    lib = os.environ.get("KILN_LIBRARY")
    if not lib or not Path(lib).is_file():
        raise SystemExit("set KILN_LIBRARY (or --kiln-dir) to the libkiln.so to export with")
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    import kiln_capi as C

    C.load(lib)
    import executorch

    configs = M.select(args.models)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest.update(
        {
            "format": "kiln-bench/1",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "torch": torch.__version__,
            "executorch": getattr(executorch, "__version__", "unknown"),
            "kiln_version": C.version(),
            "libkiln_sha256": file_sha256(lib),
            "libraries": M.library_versions(),
        }
    )
    manifest.setdefault("models", {})
    cpu = {n for n in args.cpu_check.split(",") if n}
    print(f"export_here: libkiln {C.version()} ({lib}), torch {torch.__version__}")
    print(
        f"{'config':<14} {'lower s':>7} {'pte':>9} {'graph':>8} {'skel':>7} {'ptd MB':>8} "
        f"{'delegates':>9} {'replay s':>8}  state"
    )
    with tempfile.TemporaryDirectory() as td:
        models16 = {}
        for cfg in configs:
            if cfg.family not in models16:
                models16 = {cfg.family: M.build_model(cfg.family).half()}  # one family at a time
            model16 = models16[cfg.family]
            e = export_config(cfg, model16, out, Path(td) / cfg.name)
            e["counts"] = M.counts(cfg, model16)
            rt = "-" if args.no_verify else f"{verify_replay(e, out, model16):.1f}"
            if args.io_dir:
                write_io(cfg, Path(args.io_dir))
            if cfg.name in cpu:
                e["cpu_check_rel_err"] = cpu_check(e, out)
            del e["_ptd_bytes"]
            manifest["models"][cfg.name] = e
            # after every model: an export stopped later (out of memory on a large model) keeps
            # the models it finished
            manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
            s = e["sizes"]
            print(
                f"{cfg.name:<14} {e['lower_s']:>7.1f} {s['devio_pte'] + s['pte']:>9} "
                f"{s['graph']:>8} {s['ptd_skeleton']:>7} {e['ptd']['nbytes'] / 1e6:>8.1f} "
                f"{e['delegation']['kiln_delegates']:>9} {rt:>8}  {e['state_checksum_fp16']}"
                + (
                    f"  cpu rel err {e['cpu_check_rel_err']:.2e}"
                    if "cpu_check_rel_err" in e
                    else ""
                )
            )
            if e["delegation"]["other_ops"]:
                print(
                    f"  note: ops left to ExecuTorch: {sorted(set(e['delegation']['other_ops']))}"
                )
    finish(args, out, manifest, manifest_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
