"""Editing Kiln engine bytes in tests: after a change, the CRCs are made valid again so that the
loader's semantic checks, not its CRC check, see the change (docs/format.md §2)."""

from __future__ import annotations

import struct
import zlib


def fix_crcs(e: bytearray) -> None:
    """Recomputes every section CRC and the header CRC of the engine ``e`` in place."""
    ns = struct.unpack_from("<I", e, 20)[0]
    for i in range(ns):
        _, _, off, nb = struct.unpack_from("<IIQQ", e, 40 + 32 * i)
        struct.pack_into("<I", e, 40 + 32 * i + 24, zlib.crc32(e[off : off + nb]))
    struct.pack_into("<I", e, 36, 0)
    struct.pack_into("<I", e, 36, zlib.crc32(e[: 40 + 32 * ns]))
