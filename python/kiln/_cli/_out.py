"""Output of the ``kiln`` command: JSON that is valid for any input, and human text that shows
untrusted strings (names read from a file) escaped instead of sending their bytes to the
terminal."""

from __future__ import annotations

import json
import math
import sys


def text(s) -> str:
    """``s`` with control characters, DEL, C1 controls and bytes that were not UTF-8 (decoded
    with surrogateescape) written as escapes: safe to print to a terminal."""
    s = str(s)
    out = []
    for ch in s:
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:  # a byte that was not UTF-8
            out.append(f"\\x{o - 0xDC00:02x}")
        elif o < 0x20 or o == 0x7F or 0x80 <= o < 0xA0 or 0xD800 <= o <= 0xDFFF:
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}")
        else:
            out.append(ch)
    return "".join(out)


def clean(obj):
    """A JSON-safe copy: strings without lone surrogates (bytes that were not UTF-8 become
    ``\\xNN`` text), non-finite floats as None, bytes as hex, tuples as lists."""
    if isinstance(obj, str):
        if any(0xD800 <= ord(c) <= 0xDFFF for c in obj):
            return "".join(
                f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else c
                for c in obj
                if not (0xD800 <= ord(c) <= 0xDC7F or 0xDD00 <= ord(c) <= 0xDFFF)
            )
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, bool | int) or obj is None:
        return obj
    if isinstance(obj, bytes | bytearray):
        return obj.hex()
    if isinstance(obj, dict):
        return {str(clean(k)): clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set):
        return [clean(v) for v in obj]
    return clean(str(obj))


def emit_json(obj, stream=None) -> None:
    print(
        json.dumps(clean(obj), indent=1, ensure_ascii=True, allow_nan=False),
        file=stream or sys.stdout,
    )


def size(n) -> str:
    if not isinstance(n, int | float):
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def table(head: list[str], rows: list[list], stream=None) -> None:
    """A plain aligned table (first column left, the others right-aligned)."""
    data = [head, *[[text(c) for c in r] for r in rows]]
    w = [max(len(str(r[i])) for r in data) for i in range(len(head))]
    for r in data:
        print(
            "  "
            + "  ".join(
                str(c).ljust(w[i]) if i == 0 else str(c).rjust(w[i]) for i, c in enumerate(r)
            ),
            file=stream or sys.stdout,
        )
