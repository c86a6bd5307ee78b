# SPDX-License-Identifier: Apache-2.0
"""Kiln's tiny tensor file format, read by ``kiln_runner`` (examples/cpp) for inputs and expected
outputs.

Layout (all integers little-endian)::

    bytes 0..3   magic "KLNT"
    u32          version (1)
    u32          count: number of tensors
    then count times:
        u32      dtype: Kiln's dtype code (1 float32, 2 float16, 3 bfloat16, 4 int32, 5 int64,
                 6 bool)
        u32      rank (0..8)
        i64      dims[rank]
        bytes    data: prod(dims) elements, row-major (C-contiguous), element size 4/2/2/4/8/1
                 (bool: one byte, 0 or 1)

Nothing follows the last tensor. Use :func:`write` and :func:`read` with torch tensors.
"""

from __future__ import annotations

import struct
from pathlib import Path

import torch

MAGIC = b"KLNT"
VERSION = 1
MAX_RANK = 8
DTYPES = {
    torch.float32: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.int32: 4,
    torch.int64: 5,
    torch.bool: 6,
}
_BY_CODE = {code: dt for dt, code in DTYPES.items()}


def _raw(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous().reshape(-1)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    elif t.dtype in (torch.float16, torch.bfloat16):
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def write(path, tensors) -> None:
    """Writes a sequence of tensors to ``path``."""
    tensors = list(tensors)
    out = bytearray(MAGIC + struct.pack("<II", VERSION, len(tensors)))
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensor {i} is a {type(t).__name__}, not a torch.Tensor")
        if t.dtype not in DTYPES:
            raise TypeError(
                f"tensor {i} has dtype {t.dtype}; the format holds "
                f"{', '.join(str(d) for d in DTYPES)}"
            )
        if t.dim() > MAX_RANK:
            raise ValueError(f"tensor {i} has rank {t.dim()} > {MAX_RANK}")
        out += struct.pack("<II", DTYPES[t.dtype], t.dim())
        out += struct.pack(f"<{t.dim()}q", *t.shape)
        out += _raw(t)
    Path(path).write_bytes(bytes(out))


def read(path) -> list[torch.Tensor]:
    """Reads the tensors written by :func:`write` (or by any writer of this format)."""
    data = Path(path).read_bytes()
    pos = 0

    def take(n: int, what: str) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise ValueError(f"{path} is truncated (reading {what} at byte {pos})")
        chunk = data[pos : pos + n]
        pos += n
        return chunk

    if take(4, "the magic") != MAGIC:
        raise ValueError(f"{path}: not a Kiln tensor file (magic {data[:4]!r}, expected {MAGIC!r})")
    version, count = struct.unpack("<II", take(8, "the header"))
    if version != VERSION:
        raise ValueError(f"{path}: version {version}, this reader handles {VERSION}")
    out = []
    for i in range(count):
        code, rank = struct.unpack("<II", take(8, f"tensor {i}'s dtype and rank"))
        if code not in _BY_CODE or rank > MAX_RANK:
            raise ValueError(f"{path}: tensor {i}: bad dtype code {code} or rank {rank}")
        dims = struct.unpack(f"<{rank}q", take(8 * rank, f"tensor {i}'s dims"))
        if any(d < 0 for d in dims):
            raise ValueError(f"{path}: tensor {i}: negative dimension in {dims}")
        dt = _BY_CODE[code]
        n = 1
        for d in dims:
            n *= d
        nbytes = n * torch.empty((), dtype=dt).element_size()
        raw = take(nbytes, f"tensor {i}'s data")
        if nbytes == 0:
            out.append(torch.empty(dims, dtype=dt))
            continue
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        t = t.to(torch.bool) if dt == torch.bool else t.view(dt)
        out.append(t.reshape(dims))
    if pos != len(data):
        raise ValueError(f"{path}: {len(data) - pos} trailing bytes after {count} tensors")
    return out
