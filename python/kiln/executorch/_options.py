"""Export options: validation, and their encoding as compile specs in the .pte.

Compile specs written by KilnPartitioner and read by KilnBackend.preprocess (and carried in
the .pte, where the C++ delegate ignores them):

| key | value |
|---|---|
| ``kiln.precision`` | ``b"fp32"``, ``b"fp16"`` or ``b"bf16"`` |
| ``kiln.external_data`` | the .ptd file stem (absent: weights live in the .pte) |
| ``kiln.tuning`` | the named-data key of the tuning records the program carries (absent: none) |

The C++ delegate reads ``kiln.tuning`` at init: it adds the records under that key to the process
(``kiln_add_tuning_records``) before the engine loads.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from pathlib import Path

from executorch.exir.backend.compile_spec_schema import CompileSpec

PRECISIONS = ("fp32", "fp16", "bf16")
SPEC_PRECISION = "kiln.precision"
SPEC_EXTERNAL_DATA = "kiln.external_data"
SPEC_TUNING = "kiln.tuning"
# Buffers the program updates and none of its methods reads (export computes them over every
# method): their updates are dead, and Kiln drops them with the state (one name a line).
SPEC_WRITE_ONLY = "kiln.write_only_buffers"
KNOWN_SPECS = (SPEC_PRECISION, SPEC_EXTERNAL_DATA, SPEC_TUNING, SPEC_WRITE_ONLY)
TUNING_KEY_PREFIX = "kiln-tuning-"
# Tuning cache images read by this process, by key: KilnBackend.preprocess stores them as named
# data beside the engines whose compile specs name them.
TUNING_IMAGES: dict[str, bytes] = {}
# The tuning cache file's limits (src/core/tune_cache.h, tune_cache.c).
_TUNE_MAGIC, _TUNE_FORMAT, _TUNE_HEADER = b"KILNTUNE", 1, 32
_TUNE_KEY_MAX = _TUNE_VALUE_MAX = 1024
_TUNE_RECORDS_MAX, _TUNE_FILE_MAX = 65536, 64 << 20
# .ptd names other ExecuTorch components write (a clash would overwrite or merge their file).
_RESERVED_DATA_NAMES = ("aoti_cuda_blob", "_default_external_constant", "native_weights")


def validate_precision(precision) -> str:
    if not isinstance(precision, str):
        raise TypeError(
            f"precision must be a str, one of {', '.join(map(repr, PRECISIONS))}; "
            f"got {type(precision).__name__}"
        )
    if precision not in PRECISIONS:
        raise ValueError(
            f"precision must be one of {', '.join(map(repr, PRECISIONS))}; got {precision!r}"
        )
    return precision


def validate_executorch_ops(ops) -> frozenset[str]:
    """The ``executorch_ops`` option: ATen op names, each an overload ("aten.softmax.default")
    or a packet ("aten.softmax": every overload), that Kiln leaves to ExecuTorch. Each name
    must be an op torch knows."""
    import torch

    if ops is None:
        return frozenset()
    if isinstance(ops, str) or not all(isinstance(o, str) for o in ops):
        raise TypeError(
            "executorch_ops must be a list of op names such as ['aten.softmax.default'], got "
            f"{ops!r}"
        )
    for name in ops:
        parts = name.split(".")
        op = None
        if len(parts) in (2, 3) and all(parts):
            packet = getattr(getattr(torch.ops, parts[0], None), parts[1], None)
            op = packet if len(parts) == 2 else getattr(packet, parts[2], None)
        if op is None:
            raise ValueError(
                f"executorch_ops: {name!r} is no ATen op: give an op as the export report "
                "names it, e.g. 'aten.softmax.default', or its packet 'aten.softmax'"
            )
    return frozenset(ops)


def validate_external_data(name) -> str | None:
    """None, or a .ptd file stem: a non-empty str without path separators or NUL, not "." or
    ".."; the file written is ``<name>.ptd`` beside the .pte."""
    if name is None:
        return None
    if not isinstance(name, str):
        raise TypeError(
            f"external_data must be None or a str (the .ptd file stem); got {type(name).__name__}"
        )
    if name == "":
        raise ValueError('external_data must not be empty: pass a file stem such as "model"')
    if name in (".", ".."):
        raise ValueError(f"external_data must be a file stem, not {name!r}")
    for bad, what in (("/", "'/'"), ("\\", "'\\\\'"), ("\x00", "NUL")):
        if bad in name:
            raise ValueError(
                f"external_data={name!r} contains {what}: pass a plain file stem (the .ptd is "
                "always written beside the .pte)"
            )
    if name.endswith(".ptd"):
        raise ValueError(
            f"external_data={name!r}: pass the stem without '.ptd' ({name[:-4]!r} writes {name!r})"
        )
    if name in _RESERVED_DATA_NAMES:
        raise ValueError(
            f"external_data={name!r} is the name of another ExecuTorch component's data file; "
            "choose another name (e.g. your model's name)"
        )
    return name


def tuning_image_problem(data: bytes) -> str | None:
    """None when data is a well-formed tuning cache image (the rules libkiln applies: header,
    format version, CRC-32s, every record in bounds), else what is wrong with it."""
    n = len(data)
    if n < _TUNE_HEADER:
        return "shorter than its header"
    if n > _TUNE_FILE_MAX:
        return "larger than 64 MiB"
    if data[:8] != _TUNE_MAGIC:
        return "not a Kiln tuning cache (magic)"
    version, n_rec, body_n, body_crc, head_crc = struct.unpack_from("<IIQII", data, 8)
    if zlib.crc32(data[:28]) != head_crc:
        return "header CRC mismatch"
    if version != _TUNE_FORMAT:
        return "another format version"
    if body_n != n - _TUNE_HEADER:
        return "truncated or extended (body size)"
    if n_rec > _TUNE_RECORDS_MAX:
        return "too many records"
    if zlib.crc32(data[_TUNE_HEADER:]) != body_crc:
        return "body CRC mismatch"
    at = _TUNE_HEADER
    for _ in range(n_rec):
        if n - at < 4:
            return "a record out of bounds"
        kn, vn = struct.unpack_from("<HH", data, at)
        if kn == 0 or kn > _TUNE_KEY_MAX or vn > _TUNE_VALUE_MAX or n - at - 4 < kn + vn:
            return "a record out of bounds"
        at += 4 + kn + vn
    return None if at == n else "bytes after the last record"


def read_tuning_records(path) -> str | None:
    """None (path None), or the named-data key of the tuning cache file at path (what
    ``kiln tune PROGRAM.pte --cache FILE`` writes on the target GPU), checked; its bytes are kept
    in TUNING_IMAGES for KilnBackend.preprocess."""
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            "tuning_records must be None or the path of a tuning cache file; got "
            f"{type(path).__name__}"
        )
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(
            f"tuning_records={str(path)!r}: no such file; write one on the target GPU with "
            "`kiln tune PROGRAM.pte --cache FILE`"
        )
    data = p.read_bytes()
    problem = tuning_image_problem(data)
    if problem is not None:
        raise ValueError(
            f"tuning_records={str(path)!r} is not a Kiln tuning cache ({problem}); write one "
            "with `kiln tune PROGRAM.pte --cache FILE`"
        )
    key = TUNING_KEY_PREFIX + hashlib.sha256(data).hexdigest()
    TUNING_IMAGES[key] = data
    return key


def compile_specs_for(
    precision: str,
    external_data: str | None,
    tuning_key: str | None = None,
    write_only: tuple[str, ...] = (),
) -> list[CompileSpec]:
    specs = [CompileSpec(SPEC_PRECISION, precision.encode())]
    if external_data is not None:
        specs.append(CompileSpec(SPEC_EXTERNAL_DATA, external_data.encode()))
    if tuning_key is not None:
        specs.append(CompileSpec(SPEC_TUNING, tuning_key.encode()))
    if write_only:
        specs.append(CompileSpec(SPEC_WRITE_ONLY, "\n".join(write_only).encode()))
    return specs


def parse_compile_specs(specs) -> tuple[str, str | None]:
    """(precision, external_data) from a delegate's compile specs; unknown ``kiln.*`` keys and
    duplicates are refused (``kiln.tuning``: tuning_key_of)."""
    precision, external, seen = "fp32", None, set()
    for s in specs or ():
        key = s.key
        if not key.startswith("kiln."):
            continue
        if key in seen:
            raise ValueError(f"KilnBackend: compile spec {key!r} is given twice")
        seen.add(key)
        value = bytes(s.value).decode("utf-8", errors="replace")
        if key == SPEC_PRECISION:
            precision = validate_precision(value)
        elif key == SPEC_EXTERNAL_DATA:
            external = validate_external_data(value)
        elif key in (SPEC_TUNING, SPEC_WRITE_ONLY):
            pass
        else:
            raise ValueError(
                f"KilnBackend: unknown compile spec {key!r} (known: {', '.join(KNOWN_SPECS)}); "
                "use KilnPartitioner(precision=..., external_data=...)"
            )
    return precision, external


def write_only_of(specs) -> frozenset[str]:
    """The ``kiln.write_only_buffers`` of a delegate's compile specs (empty when absent)."""
    for s in specs or ():
        if s.key == SPEC_WRITE_ONLY:
            text = bytes(s.value).decode("utf-8", errors="replace")
            return frozenset(n for n in text.split("\n") if n)
    return frozenset()


def tuning_key_of(specs) -> str | None:
    """The ``kiln.tuning`` key of a delegate's compile specs, or None."""
    for s in specs or ():
        if s.key == SPEC_TUNING:
            return bytes(s.value).decode("utf-8", errors="replace")
    return None
