"""Reads ExecuTorch programs (``.pte``) and data files (``.ptd``) without ExecuTorch: the methods,
their inputs and outputs, operators, instructions and delegates (with each delegate's processed
bytes, e.g. a Kiln engine), and named data. For ``kiln inspect``, ``kiln profile`` and ``kiln
bench``, which must also run where only libkiln is installed (no executorch, no torch).

The files are untrusted: every offset, length and count is checked against the buffer before it
is used, and a malformed file raises :class:`PteError` naming the field (``execution_plan[0]
.delegates[1].id``), the offset and what was wrong. Only the fields Kiln reports are read.

Layouts (ExecuTorch 1.5.1): ``executorch/exir/_serialize/program.fbs`` (file identifier
``ET12``; an optional extended header ``eh00`` at byte 8 gives the flatbuffer's size and where
the segments start) and ``extension/flat_tensor/serialize/flat_tensor.fbs`` (identifier
``FT01``; header ``FH01`` at byte 8). FlatBuffers tables are read through their vtables, so
fields absent from a file take their schema defaults.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

__all__ = [
    "Delegate",
    "Method",
    "Program",
    "PteError",
    "ValueInfo",
    "file_kind",
    "read_program",
    "read_ptd",
]

PTE_IDENTIFIER = b"ET12"
PTD_IDENTIFIER = b"FT01"
ENGINE_MAGIC = b"\x89KLN\r\n\x1a\n"

# ExecuTorch ScalarType (schema/scalar_type.fbs).
SCALAR_TYPES = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "float16",
    6: "float32",
    7: "float64",
    8: "complex32",
    9: "complex64",
    10: "complex128",
    11: "bool",
    12: "qint8",
    13: "quint8",
    14: "qint32",
    15: "bfloat16",
    16: "quint4x2",
    17: "quint2x4",
    18: "bits1x8",
    19: "bits2x4",
    20: "bits4x2",
    21: "bits8",
    22: "bits16",
    23: "float8_e5m2",
    24: "float8_e4m3fn",
    25: "float8_e5m2fnuz",
    26: "float8_e4m3fnuz",
    27: "uint16",
    28: "uint32",
    29: "uint64",
}
_KERNEL_TYPES = {
    0: "none",
    1: "null",
    2: "int",
    3: "bool",
    4: "double",
    5: "tensor",
    6: "string",
    7: "int_list",
    8: "double_list",
    9: "bool_list",
    10: "tensor_list",
    11: "optional_tensor_list",
}
_DYNAMISM = {0: "static", 1: "dynamic_bound", 2: "dynamic_unbound"}
# Vectors longer than this are refused (a corrupt count must not make a reader loop for long).
_MAX_ITEMS = 1 << 24


class PteError(ValueError):
    """A .pte / .ptd file is malformed or not of the expected kind (the message says where)."""


def file_kind(data: bytes) -> str:
    """ "pte", "ptd", "engine" (a raw Kiln engine) or "unknown", from the first bytes."""
    if data[:8] == ENGINE_MAGIC:
        return "engine"
    if len(data) >= 8 and data[4:8] == PTE_IDENTIFIER:
        return "pte"
    if len(data) >= 8 and data[4:8] == PTD_IDENTIFIER:
        return "ptd"
    return "unknown"


class _Buf:
    """Bounds-checked little-endian reads of a FlatBuffer in ``data[0:end]``."""

    def __init__(self, data: bytes, end: int, what: str):
        self.data = data
        self.end = end
        self.what = what

    def fail(self, path: str, msg: str):
        raise PteError(f"{self.what}: {path}: {msg} (the file is corrupt or truncated)")

    def read(self, fmt: str, pos: int, path: str):
        n = struct.calcsize(fmt)
        if pos < 0 or pos + n > self.end:
            self.fail(path, f"{n} bytes at offset {pos} run past the end ({self.end} bytes)")
        return struct.unpack_from("<" + fmt, self.data, pos)[0]

    def table(self, pos: int, path: str) -> _Table:
        if pos % 4 or pos < 0 or pos + 4 > self.end:
            self.fail(path, f"table offset {pos} is outside the buffer or misaligned")
        vt = pos - self.read("i", pos, path)
        vt_size = self.read("H", vt, path + " (vtable)") if 0 <= vt < self.end else None
        if vt_size is None or vt_size < 4 or vt_size % 2 or vt + vt_size > self.end:
            self.fail(path, f"vtable at offset {vt} is outside the buffer or malformed")
        tbl_size = self.read("H", vt + 2, path + " (vtable)")
        if pos + tbl_size > self.end:
            self.fail(path, f"table at offset {pos} of {tbl_size} bytes runs past the end")
        return _Table(self, pos, vt, vt_size, tbl_size, path)

    def root(self) -> _Table:
        return self.table(self.read("I", 0, "root"), "root")


class _Table:
    def __init__(self, buf: _Buf, pos: int, vt: int, vt_size: int, tbl_size: int, path: str):
        self.buf, self.pos, self.vt, self.vt_size, self.tbl_size, self.path = (
            buf,
            pos,
            vt,
            vt_size,
            tbl_size,
            path,
        )

    def _field(self, i: int, name: str) -> int:
        """Offset of field i's value in the buffer, or 0 when absent."""
        o = 4 + 2 * i
        if o + 2 > self.vt_size:
            return 0
        off = self.buf.read("H", self.vt + o, f"{self.path}.{name}")
        if off == 0:
            return 0
        if off >= self.tbl_size:
            self.buf.fail(f"{self.path}.{name}", f"field offset {off} outside its table")
        return self.pos + off

    def scalar(self, i: int, name: str, fmt: str, default=0):
        at = self._field(i, name)
        return default if at == 0 else self.buf.read(fmt, at, f"{self.path}.{name}")

    def _target(self, i: int, name: str) -> int:
        at = self._field(i, name)
        if at == 0:
            return 0
        return at + self.buf.read("I", at, f"{self.path}.{name}")

    def table(self, i: int, name: str) -> _Table | None:
        t = self._target(i, name)
        return None if t == 0 else self.buf.table(t, f"{self.path}.{name}")

    def string(self, i: int, name: str) -> str | None:
        raw = self.bytes_(i, name)
        return None if raw is None else raw.decode("utf-8", "surrogateescape")

    def bytes_(self, i: int, name: str, elem: int = 1) -> bytes | None:
        t = self._target(i, name)
        if t == 0:
            return None
        n = self._length(t, elem, f"{self.path}.{name}")
        return self.buf.data[t + 4 : t + 4 + n * elem]

    def _length(self, t: int, elem: int, path: str) -> int:
        n = self.buf.read("I", t, path)
        if n > _MAX_ITEMS or t + 4 + n * elem > self.buf.end:
            self.buf.fail(path, f"a vector of {n} items at offset {t} runs past the end")
        return n

    def scalars(self, i: int, name: str, fmt: str) -> list:
        size = struct.calcsize(fmt)
        raw = self.bytes_(i, name, size)
        if raw is None:
            return []
        return list(struct.unpack_from(f"<{len(raw) // size}{fmt}", raw))

    def tables(self, i: int, name: str) -> list[_Table]:
        t = self._target(i, name)
        if t == 0:
            return []
        path = f"{self.path}.{name}"
        n = self._length(t, 4, path)
        out = []
        for k in range(n):
            at = t + 4 + 4 * k
            out.append(self.buf.table(at + self.buf.read("I", at, path), f"{path}[{k}]"))
        return out


@dataclass
class ValueInfo:
    """One EValue of a method: kind ("tensor", "int", "int_list", ...) and, for tensors, the
    dtype and sizes (the largest sizes for dynamic shapes)."""

    kind: str
    dtype: str | None = None
    sizes: list[int] | None = None
    dynamism: str | None = None
    value: object = None

    def to_dict(self) -> dict:
        d = {"kind": self.kind}
        if self.kind == "tensor":
            d.update(dtype=self.dtype, sizes=self.sizes, dynamism=self.dynamism)
        elif self.value is not None:
            d["value"] = self.value
        return d


@dataclass
class Delegate:
    """A delegate of a method, in the order of the method's delegates table."""

    index: int
    backend: str
    location: str  # "inline" or "segment"
    data_index: int
    compile_specs: dict[str, bytes]
    data: bytes | None = None  # the processed bytes, once resolved


@dataclass
class Method:
    name: str
    inputs: list[int]  # value indices
    outputs: list[int]
    values: list[ValueInfo]
    operators: list[str]  # "aten::add.out"
    delegates: list[Delegate]
    calls: list[tuple[str, int]]  # ("kernel", operator index) / ("delegate", delegate index)

    def io(self, which: str) -> list[dict]:
        idx = self.inputs if which == "inputs" else self.outputs
        out = []
        for i in idx:
            v = self.values[i] if 0 <= i < len(self.values) else ValueInfo("invalid")
            out.append({"value": i, **v.to_dict()})
        return out


@dataclass
class Program:
    nbytes: int
    version: int
    methods: list[Method]
    segments: list[tuple[int, int]]  # (offset from segment_base, size)
    segment_base: int
    named_data: dict[str, int]  # key -> segment index (data inside the .pte)
    _data: bytes = field(repr=False, default=b"")

    def segment(self, index: int) -> bytes:
        off, size = self.segments[index]
        start = self.segment_base + off
        return self._data[start : start + size]

    def named(self, key: str) -> bytes | None:
        i = self.named_data.get(key)
        return None if i is None else self.segment(i)


def _check_segments(segs, base: int, data_len: int, what: str, data_size: int | None):
    for k, (off, size) in enumerate(segs):
        if base + off + size > data_len:
            raise PteError(
                f"{what}: segments[{k}] (offset {off}, {size} bytes after the segment base "
                f"{base}) runs past the end of the file ({data_len} bytes): the file is "
                "truncated or corrupt"
            )
    if data_size and base + data_size > data_len:
        raise PteError(
            f"{what}: the header says {data_size} bytes of segments from byte {base}, but the "
            f"file has {data_len} bytes: it is truncated"
        )


def read_program(data: bytes, what: str = "program") -> Program:
    """Parses a .pte. Raises PteError for anything that is not a well-formed ExecuTorch
    program."""
    if len(data) < 8 or data[4:8] != PTE_IDENTIFIER:
        got = data[4:8] if len(data) >= 8 else data[:8]
        raise PteError(
            f"{what} is not an ExecuTorch program: its bytes 4-8 are {got!r}, a .pte has "
            f"{PTE_IDENTIFIER!r} there ({len(data)} bytes)"
        )
    program_size, base, seg_size = len(data), 0, 0
    if len(data) >= 16 and data[8:12] == b"eh00":
        length = struct.unpack_from("<I", data, 12)[0]
        if length < 24 or 8 + length > len(data):
            raise PteError(f"{what}: extended header at byte 8 has a bad length {length}")
        program_size, base = struct.unpack_from("<QQ", data, 16)
        seg_size = struct.unpack_from("<Q", data, 32)[0] if length >= 32 else 0
        if program_size > len(data) or program_size < 16:
            raise PteError(
                f"{what}: the extended header says the program is {program_size} bytes, the "
                f"file has {len(data)}: it is truncated or corrupt"
            )
        if base and (base < program_size or base > len(data)):
            raise PteError(
                f"{what}: the extended header's segment base {base} is outside the file "
                f"({len(data)} bytes, program {program_size})"
            )
    buf = _Buf(data, program_size, what)
    root = buf.root()
    root.path = "program"
    version = root.scalar(0, "version", "I")
    segs = [
        (s.scalar(0, "offset", "Q"), s.scalar(1, "size", "Q")) for s in root.tables(4, "segments")
    ]
    if segs and base == 0:
        raise PteError(f"{what}: the program lists {len(segs)} segments but has no segment base")
    _check_segments(segs, base, len(data), what, seg_size)
    inline = root.tables(3, "backend_delegate_data")
    named = {}
    for nd in root.tables(7, "named_data"):
        key = nd.string(0, "key") or ""
        idx = nd.scalar(1, "segment_index", "I")
        if idx >= len(segs):
            buf.fail(f"{nd.path}.segment_index", f"{idx} is not a segment ({len(segs)} segments)")
        named[key] = idx
    prog = Program(len(data), version, [], segs, base, named, data)
    for p in root.tables(1, "execution_plan"):
        prog.methods.append(_method(p, buf, prog, inline))
    return prog


def _method(p: _Table, buf: _Buf, prog: Program, inline: list[_Table]) -> Method:
    name = p.string(0, "name") or ""
    values = [_value(v, buf) for v in p.tables(2, "values")]
    ops = []
    for o in p.tables(6, "operators"):
        n, ov = o.string(0, "name") or "", o.string(1, "overload") or ""
        ops.append(f"{n}.{ov}" if ov else n)
    delegates = []
    for k, d in enumerate(p.tables(7, "delegates")):
        ref = d.table(1, "processed")
        if ref is None:
            buf.fail(f"{d.path}.processed", "missing")
        loc = ref.scalar(0, "location", "B")
        idx = ref.scalar(1, "index", "I")
        specs = {}
        for cs in d.tables(2, "compile_specs"):
            specs[cs.string(0, "key") or ""] = cs.bytes_(1, "value") or b""
        dl = Delegate(k, d.string(0, "id") or "", "inline" if loc == 0 else "segment", idx, specs)
        if loc == 0:
            if idx >= len(inline):
                buf.fail(f"{ref.path}.index", f"{idx} is not inline data ({len(inline)} entries)")
            dl.data = inline[idx].bytes_(0, "data") or b""
        elif loc == 1:
            if idx >= len(prog.segments):
                buf.fail(f"{ref.path}.index", f"{idx} is not a segment ({len(prog.segments)})")
            dl.data = prog.segment(idx)
        else:
            buf.fail(f"{ref.path}.location", f"unknown data location {loc}")
        delegates.append(dl)
    calls = []
    for c in p.tables(5, "chains"):
        for ins in c.tables(2, "instructions"):
            kind = ins.scalar(0, "instr_args_type", "B")
            args = ins.table(1, "instr_args")
            if args is None:
                continue
            if kind == 1:
                calls.append(("kernel", args.scalar(0, "op_index", "i")))
            elif kind == 2:
                calls.append(("delegate", args.scalar(0, "delegate_index", "i")))
    return Method(
        name,
        p.scalars(3, "inputs", "i"),
        p.scalars(4, "outputs", "i"),
        values,
        ops,
        delegates,
        calls,
    )


def _value(v: _Table, buf: _Buf) -> ValueInfo:
    kind = _KERNEL_TYPES.get(v.scalar(0, "val_type", "B"), "unknown")
    t = v.table(1, "val")
    if t is None:
        return ValueInfo(kind)
    if kind == "tensor":
        st = t.scalar(0, "scalar_type", "b")
        return ValueInfo(
            "tensor",
            SCALAR_TYPES.get(st, f"scalar_type {st}"),
            t.scalars(2, "sizes", "i"),
            _DYNAMISM.get(t.scalar(8, "shape_dynamism", "b"), "unknown"),
        )
    if kind == "int":
        return ValueInfo(kind, value=t.scalar(0, "int_val", "q"))
    if kind == "bool":
        return ValueInfo(kind, value=bool(t.scalar(0, "bool_val", "B")))
    if kind == "double":
        return ValueInfo(kind, value=t.scalar(0, "double_val", "d"))
    return ValueInfo(kind)


def read_ptd(data: bytes, what: str = "data file") -> dict[str, bytes]:
    """Parses a .ptd (FlatTensor): named data key -> bytes."""
    if len(data) < 8 or data[4:8] != PTD_IDENTIFIER:
        raise PteError(
            f"{what} is not an ExecuTorch data file (.ptd): its bytes 4-8 are {data[4:8]!r}, a "
            f".ptd has {PTD_IDENTIFIER!r} there"
        )
    if len(data) < 48 or data[8:12] != b"FH01":
        raise PteError(f"{what}: the FH01 header at byte 8 is missing: truncated or corrupt")
    length, fb_off, fb_size, base, seg_size = struct.unpack_from("<IQQQQ", data, 12)
    fb_end = fb_off + fb_size  # the flatbuffer is data[0:fb_end], the header inside it
    if length < 40 or fb_end > len(data) or fb_end < 48 or base > len(data) or base < fb_end:
        raise PteError(
            f"{what}: the FH01 header (length {length}, flatbuffer {fb_off}+{fb_size}, "
            f"segments at {base}) does not fit the file ({len(data)} bytes)"
        )
    buf = _Buf(data, fb_end, what)
    root = buf.root()
    root.path = "flat_tensor"
    segs = [
        (s.scalar(0, "offset", "Q"), s.scalar(1, "size", "Q")) for s in root.tables(1, "segments")
    ]
    _check_segments(segs, base, len(data), what, seg_size)
    out = {}
    for nd in root.tables(2, "named_data"):
        key = nd.string(0, "key") or ""
        idx = nd.scalar(1, "segment_index", "I")
        if idx >= len(segs):
            buf.fail(f"{nd.path}.segment_index", f"{idx} is not a segment ({len(segs)} segments)")
        off, size = segs[idx]
        out[key] = data[base + off : base + off + size]
    return out
