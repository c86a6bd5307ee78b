"""Kiln's op table, read from libkiln (kiln_op_count / kiln_op_get_info / kiln_op_get_attr_info),
so Python and C cannot disagree on op ids, names, arities, attribute schemas and dtypes."""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

from . import _lib

# kiln_dtype values (include/kiln/kiln.h; file-format ABI)
DTYPE_F32 = 1
DTYPE_F16 = 2
DTYPE_BF16 = 3
DTYPE_I32 = 4
DTYPE_I64 = 5
DTYPE_BOOL = 6

ATTR_INTS = 1
ATTR_FLOATS = 2

OPF_UNARY = 0x1
OPF_BINARY = 0x2
OPF_TAIL = 0x4
OPF_FUSE_HEAD = 0x8
OPF_HEAVY = 0x10
OPF_VIEW = 0x20
OPF_EW_HEAD = 0x40


@dataclass(frozen=True)
class AttrSchema:
    name: str
    kind: int  # ATTR_INTS or ATTR_FLOATS
    count: int  # required number of values, -1 for any
    default: tuple | None  # None: required

    @property
    def is_float(self) -> bool:
        return self.kind == ATTR_FLOATS


@dataclass(frozen=True)
class OpSchema:
    id: int
    name: str
    min_inputs: int
    max_inputs: int
    optional_mask: int
    n_outputs: int
    dtype_mask: int
    flags: int
    attrs: tuple[AttrSchema, ...]

    def supports_dtype(self, kiln_dtype: int) -> bool:
        return bool(self.dtype_mask & (1 << kiln_dtype))

    def attr(self, name: str) -> AttrSchema:
        for a in self.attrs:
            if a.name == name:
                return a
        valid = ", ".join(a.name for a in self.attrs) or "none"
        raise KeyError(f"Kiln op '{self.name}' has no attribute '{name}' (valid: {valid})")


@functools.lru_cache(maxsize=1)
def table() -> dict[str, OpSchema]:
    """Every op libkiln knows, by name."""
    lib = _lib.library()
    out: dict[str, OpSchema] = {}
    for i in range(lib.kiln_op_count()):
        op = lib.kiln_op_id_at(i)
        info = _lib.OpInfo()
        _lib.check(lib.kiln_op_get_info(op, ctypes.byref(info)), "kiln_op_get_info")
        attrs = []
        for j in range(info.n_attrs):
            ai = _lib.AttrInfo()
            _lib.check(lib.kiln_op_get_attr_info(op, j, ctypes.byref(ai)), "kiln_op_get_attr_info")
            if ai.n_default:
                src = ai.default_floats if ai.kind == ATTR_FLOATS else ai.default_ints
                default = tuple(src[k] for k in range(ai.n_default))
            else:
                default = None
            attrs.append(AttrSchema(ai.name.decode(), ai.kind, ai.count, default))
        name = info.name.decode()
        out[name] = OpSchema(
            id=info.id,
            name=name,
            min_inputs=info.min_inputs,
            max_inputs=info.max_inputs,
            optional_mask=info.optional_mask,
            n_outputs=info.n_outputs,
            dtype_mask=info.dtype_mask,
            flags=info.flags,
            attrs=tuple(attrs),
        )
    return out


def get(name: str) -> OpSchema:
    """The schema of a Kiln op by name; KeyError naming the known ops if it does not exist."""
    t = table()
    try:
        return t[name]
    except KeyError:
        raise KeyError(
            f"libkiln has no op named '{name}' (it has: {', '.join(sorted(t))})"
        ) from None


def lookup_id(name: str) -> int:
    """The op id by name through kiln_op_lookup (KilnInvalidArgError if unknown)."""
    lib = _lib.library()
    out = ctypes.c_uint32()
    _lib.check(lib.kiln_op_lookup(name.encode(), ctypes.byref(out)), f"op '{name}'")
    return out.value
