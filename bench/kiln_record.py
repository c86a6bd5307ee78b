"""Record Kiln graphs at export time, replay them on the device with regenerated weights.

Why: a Kiln engine exported with ``external_data`` is a small ``.pte`` (the engine structure) and
a large ``.ptd`` (its weights, e.g. 217 MB for BERT-base in fp16); the device call may carry only
64 MiB and the device has no executorch to export with. The weights themselves are a
deterministic function of the model code (bench/models.py), so they can be regenerated there;
but the ``.ptd`` holds them *after* Kiln's builder transformed them (fp16 conversion, BN folding,
layout changes), keyed by the sha256 of the transformed bytes. The only code that reproduces
those bytes exactly is the builder itself. So:

1. here, while ``kiln.executorch.save`` runs, every call that KilnBackend.preprocess makes on
   ``kiln._graph.Graph`` (add_input, add_constant, add_node, mark_output, build) is recorded, in
   C terms (op ids, typed attribute values, build options); a constant is recorded as a reference
   to the model tensor it came from (matched by content hash), or inline if it is small;
2. on the device, :func:`replay` feeds the same calls to the same libkiln through its public C
   API (bench/kiln_capi.py) with the regenerated tensors, and gets the same engine bytes (the
   builder is deterministic) and the same external weights. The engine's sha256 is checked
   against the one recorded here, so the carried ``.pte`` (which embeds that engine) is known to
   match the weights written into the device-side ``.ptd``;
3. the ``.ptd`` file itself is rebuilt from a skeleton carried from here (the exported ``.ptd``
   up to its first weight segment: FlatTensor header and flatbuffer, gzip-compressed, a few KB)
   by writing each weight back at its recorded offset (everything else is zero padding); its
   sha256 is checked against the exported file's.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import inspect
import json
import math
import struct

import torch

FORMAT = "kiln-bench-graph/1"
# Constants up to this size that match no model tensor are carried inline: index tables a model
# computes in its forward (BEiT's [197, 197] relative position index, 310 KB as int64) compress
# well; a larger one would be a weight the lowering transformed, which the device must regenerate.
INLINE_MAX = 1024 * 1024
INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
DTYPE_ID = {
    torch.float32: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.int32: 4,
    torch.int64: 5,
    torch.bool: 6,
}


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def tree_sha256(b: bytes) -> str:
    """An external weight's key digest (src/core/sha256.h): SHA-256 of the byte count and the
    digests of its 4 MiB leaves."""
    h = hashlib.sha256(struct.pack("<Q", len(b)))
    for o in range(0, len(b), 4 << 20):
        h.update(hashlib.sha256(b[o : o + (4 << 20)]).digest())
    return h.hexdigest()


def tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().to("cpu").contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


# --- recording (export side; needs the kiln package)


class Recorder:
    """Patches ``kiln._graph.Graph`` while active and collects the graphs that were built."""

    def __init__(self):
        self.built: list[dict] = []  # recording dicts, in build order
        self.engines: list[bytes] = []
        self.weights: list[list[tuple[str, bytes]]] = []
        self.blobs: dict[str, bytes] = {}  # sha256 -> bytes of small constants
        self._orig = {}

    def __enter__(self):
        from kiln import _graph, _ops

        G = _graph.Graph
        rec = self
        names = (
            "__init__",
            "add_input",
            "add_constant",
            "add_state",
            "update_state",
            "add_node",
            "mark_output",
            "build",
        )
        self._orig = {n: getattr(G, n) for n in names}
        sig = {n: inspect.signature(self._orig[n]) for n in names}
        orig = self._orig

        def args(name, self_, a, k):
            b = sig[name].bind(self_, *a, **k)
            b.apply_defaults()
            return b.arguments

        def __init__(self_, *a, **k):
            orig["__init__"](self_, *a, **k)
            self_._bench_calls = []

        def add_input(self_, *a, **k):
            v = orig["add_input"](self_, *a, **k)
            x = args("add_input", self_, a, k)
            self_._bench_calls.append(
                [
                    "input",
                    x["name"],
                    int(x["dtype"]),
                    [int(d) for d in x["dim_min"]],
                    [int(d) for d in x["dim_max"]],
                    v,
                ]
            )
            return v

        def add_constant(self_, *a, **k):
            v = orig["add_constant"](self_, *a, **k)
            x = args("add_constant", self_, a, k)
            t = x["tensor"].detach().to("cpu").contiguous()
            data = tensor_bytes(t)
            h = sha256(data)
            if len(data) <= INLINE_MAX:
                rec.blobs[h] = data
            self_._bench_calls.append(
                ["const", x["name"], DTYPE_ID[t.dtype], list(t.shape), h, len(data), v]
            )
            return v

        def add_state(self_, *a, **k):
            v = orig["add_state"](self_, *a, **k)
            x = args("add_state", self_, a, k)
            dt = x["dtype"]
            dt = DTYPE_ID[dt] if isinstance(dt, torch.dtype) else int(dt)
            h, n = None, 0
            if x["initial"] is not None:
                data = tensor_bytes(x["initial"])
                h, n = sha256(data), len(data)
                if n <= INLINE_MAX:
                    rec.blobs[h] = data
            self_._bench_calls.append(
                ["state", x["name"], dt, [int(d) for d in x["shape"]], h, n, v]
            )
            return v

        def update_state(self_, *a, **k):
            orig["update_state"](self_, *a, **k)
            x = args("update_state", self_, a, k)
            self_._bench_calls.append(["update", int(x["state"]), int(x["new_value"])])

        def add_node(self_, *a, **k):
            outs = orig["add_node"](self_, *a, **k)
            x = args("add_node", self_, a, k)
            schema = _ops.get(x["op"])
            attrs = []
            for name, value in (x["attrs"] or {}).items():
                vals = list(value) if isinstance(value, (list, tuple)) else [value]
                if schema.attr(name).is_float:
                    attrs.append([name, "f", [math.nan if v is None else float(v) for v in vals]])
                else:
                    attrs.append(
                        [name, "i", [min(max(int(v), INT64_MIN), INT64_MAX) for v in vals]]
                    )
            ins = [-1 if v is None else int(v) for v in x["inputs"]]
            self_._bench_calls.append(["node", x["op"], schema.id, ins, attrs, list(outs)])
            return outs

        def mark_output(self_, *a, **k):
            orig["mark_output"](self_, *a, **k)
            x = args("mark_output", self_, a, k)
            self_._bench_calls.append(["output", int(x["value"]), x["name"]])

        def build(self_, *a, **k):
            built = orig["build"](self_, *a, **k)
            x = args("build", self_, a, k)
            precision = {"fp32": 0, "fp16": 1, "bf16": 2}[x["precision"]]
            rec.built.append(
                {
                    "calls": self_._bench_calls,
                    "build": {
                        "precision": precision,
                        "external_weights": bool(x["external_weights"]),
                        "optimize": bool(x["optimize"]),
                        "min_external_nbytes": int(x["min_external_nbytes"]),
                    },
                    "engine_sha256": sha256(built.engine),
                    "engine_nbytes": len(built.engine),
                    "weights": [[key, len(d)] for key, d in built.weights],
                }
            )
            rec.engines.append(built.engine)
            rec.weights.append(list(built.weights))
            return built

        for n, fn in (
            ("__init__", __init__),
            ("add_input", add_input),
            ("add_constant", add_constant),
            ("add_state", add_state),
            ("update_state", update_state),
            ("add_node", add_node),
            ("mark_output", mark_output),
            ("build", build),
        ):
            setattr(G, n, fn)
        return self

    def __exit__(self, *exc):
        from kiln import _graph

        for n, fn in self._orig.items():
            setattr(_graph.Graph, n, fn)
        return False


def named_tensors(model: torch.nn.Module, rename=None) -> dict[str, torch.Tensor]:
    """The model's parameters and buffers by qualified name, mapped through ``rename`` (the
    family's canonical names across library versions, models.canonical_names) when given."""
    rename = rename or (lambda n: n)
    out = {rename(n): t for n, t in model.named_parameters()}
    out.update({rename(n): t for n, t in model.named_buffers()})
    return out


def resolve_constants(
    graphs: list[dict], blobs: dict[str, bytes], model: torch.nn.Module, rename=None
) -> dict:
    """Maps every recorded constant to a model tensor (by content) or to inline bytes.

    Returns {"refs": {sha: {"param": name} | {"inline": base64}}, "inline_nbytes": n}; raises
    if a large constant matches no model tensor (it could not be regenerated on the device).
    """
    table: dict[str, str] = {}
    for name, t in sorted(named_tensors(model, rename).items()):
        table.setdefault(sha256(tensor_bytes(t)), name)
    refs, inline = {}, 0
    for g in graphs:
        for c in g["calls"]:
            if c[0] not in ("const", "state") or c[4] is None or c[4] in refs:
                continue
            h, n = c[4], c[5]
            if h in table:
                refs[h] = {"param": table[h]}
            elif h in blobs:
                refs[h] = {"inline": base64.b64encode(blobs[h]).decode()}
                inline += n
            else:
                raise RuntimeError(
                    f"constant '{c[1]}' ({n} bytes, shape {c[3]}) matches no model tensor and is "
                    f"larger than {INLINE_MAX} bytes: it cannot be regenerated on the device"
                )
    return {"refs": refs, "inline_nbytes": inline}


def save_recording(path, meta: dict, graphs: list[dict], consts: dict) -> int:
    doc = {"format": FORMAT, **meta, "graphs": graphs, "constants": consts["refs"]}
    raw = json.dumps(doc, separators=(",", ":")).encode()
    data = gzip.compress(raw, compresslevel=9, mtime=0)
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def load_recording(path) -> dict:
    with open(path, "rb") as f:
        doc = json.loads(gzip.decompress(f.read()))
    if doc.get("format") != FORMAT:
        raise RuntimeError(f"{path}: format {doc.get('format')!r}, expected {FORMAT!r}")
    return doc


# --- replay (device side; needs only libkiln through bench/kiln_capi.py)


def replay(doc: dict, tensors: dict[str, torch.Tensor], verify: bool = True):
    """Rebuilds every recorded graph with the given model tensors.

    Returns a list of (engine bytes, [(key, bytes)]) per graph. With ``verify``, each constant's
    bytes and the engine bytes must hash to the recorded values (RuntimeError naming the first
    mismatch otherwise).
    """
    import kiln_capi as C

    cache: dict[str, bytes] = {}

    def const_bytes(h: str, name: str) -> bytes:
        if h in cache:
            return cache[h]
        ref = doc["constants"][h]
        if "inline" in ref:
            data = base64.b64decode(ref["inline"])
        else:
            t = tensors.get(ref["param"])
            if t is None:
                raise RuntimeError(f"constant '{name}': the model has no tensor '{ref['param']}'")
            data = tensor_bytes(t)
        if verify and sha256(data) != h:
            raise RuntimeError(
                f"constant '{name}' (model tensor {ref.get('param', 'inline')}): its bytes differ "
                "from the exported ones: the weights regenerated here are not those of the export"
            )
        cache[h] = data
        return data

    results = []
    for gi, g in enumerate(doc["graphs"]):
        graph = C.Graph()
        try:
            ids: dict[int, int] = {}
            for c in g["calls"]:
                kind = c[0]
                if kind == "input":
                    ids[c[5]] = graph.add_input(c[1], c[2], c[3], c[4])
                elif kind == "const":
                    ids[c[6]] = graph.add_constant(c[1], c[2], c[3], const_bytes(c[4], c[1]))
                elif kind == "node":
                    ins = [-1 if v < 0 else ids[v] for v in c[3]]
                    outs = graph.add_node(c[2], ins, c[4], len(c[5]))
                    for a, b in zip(c[5], outs, strict=True):
                        ids[a] = b
                elif kind == "output":
                    graph.mark_output(ids[c[1]], c[2])
                elif kind == "state":
                    data = None if c[4] is None else const_bytes(c[4], c[1])
                    ids[c[6]] = graph.add_state(c[1], c[2], c[3], data)
                elif kind == "update":
                    graph.update_state(ids[c[1]], ids[c[2]])
                else:
                    raise RuntimeError(f"graph {gi}: unknown recorded call {kind!r}")
            b = g["build"]
            engine, weights = graph.build(
                b["precision"], b["external_weights"], b["optimize"], b["min_external_nbytes"]
            )
        finally:
            graph.close()
        if verify:
            if sha256(engine) != g["engine_sha256"]:
                raise RuntimeError(
                    f"graph {gi}: the rebuilt engine differs from the exported one "
                    f"({len(engine)} vs {g['engine_nbytes']} bytes): libkiln or the weights differ"
                )
            got = [[k, len(d)] for k, d in weights]
            if got != g["weights"]:
                raise RuntimeError(f"graph {gi}: the rebuilt external weights differ")
            for k, d in weights:
                # (kiln-w-: the plain digest of engines built before the tree digest)
                want = (
                    "kiln-w-" + sha256(d) if k.startswith("kiln-w-") else "kiln-t-" + tree_sha256(d)
                )
                if k != want:
                    raise RuntimeError(f"graph {gi}: weight {k} does not hash to its key")
        results.append((engine, weights))
    return results


# --- .ptd skeletons


def ptd_layout(ptd: bytes) -> dict[str, tuple[int, int]]:
    """key -> (absolute offset, size) of each named blob of a FlatTensor (.ptd) file
    (export side: uses executorch's deserializer)."""
    from executorch.extension.flat_tensor.serialize.serialize import (
        FlatTensorHeader,
        _deserialize_to_flat_tensor,
    )

    h = FlatTensorHeader.from_bytes(ptd[8:])
    if not h.is_valid():
        raise RuntimeError("not a FlatTensor (.ptd) file")
    ft = _deserialize_to_flat_tensor(ptd)
    out = {}
    for nd in ft.named_data:
        seg = ft.segments[nd.segment_index]
        out[nd.key] = (h.segment_base_offset + seg.offset, seg.size)
    return out


def make_skeleton(ptd: bytes, layout: dict[str, tuple[int, int]]) -> bytes:
    """The .ptd with its weight segments removed: everything before the first segment (header
    and flatbuffer), gzip-compressed. Raises unless every byte after that is weight data or zero
    padding, so that :func:`fill_skeleton` can rebuild the file exactly."""
    first = min((off for off, _ in layout.values()), default=len(ptd))
    buf = bytearray(ptd)
    for off, size in layout.values():
        buf[off : off + size] = bytes(size)
    if buf[first:].count(0) != len(buf) - first:
        raise RuntimeError(".ptd: non-zero bytes between or after the weight segments")
    return gzip.compress(bytes(buf[:first]), compresslevel=9, mtime=0)


def fill_skeleton(
    skeleton_gz: bytes, nbytes: int, layout: dict, weights: dict[str, bytes]
) -> bytes:
    """Rebuilds a .ptd of ``nbytes`` bytes from its skeleton and the weights by key."""
    head = gzip.decompress(skeleton_gz)
    buf = bytearray(nbytes)
    buf[: len(head)] = head
    for key, (off, size) in layout.items():
        data = weights.get(key)
        if data is None or len(data) != size:
            raise RuntimeError(f".ptd key {key}: no rebuilt weight of {size} bytes")
        buf[off : off + size] = data
    return bytes(buf)
