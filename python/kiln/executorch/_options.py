"""Export options: validation, and their encoding as compile specs in the .pte.

Compile specs written by KilnPartitioner and read by KilnBackend.preprocess (and carried in
the .pte, where the C++ delegate ignores them):

| key | value |
|---|---|
| ``kiln.precision`` | ``b"fp32"``, ``b"fp16"`` or ``b"bf16"`` |
| ``kiln.external_data`` | the .ptd file stem (absent: weights live in the .pte) |
"""

from __future__ import annotations

from executorch.exir.backend.compile_spec_schema import CompileSpec

PRECISIONS = ("fp32", "fp16", "bf16")
SPEC_PRECISION = "kiln.precision"
SPEC_EXTERNAL_DATA = "kiln.external_data"
KNOWN_SPECS = (SPEC_PRECISION, SPEC_EXTERNAL_DATA)
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


def compile_specs_for(precision: str, external_data: str | None) -> list[CompileSpec]:
    specs = [CompileSpec(SPEC_PRECISION, precision.encode())]
    if external_data is not None:
        specs.append(CompileSpec(SPEC_EXTERNAL_DATA, external_data.encode()))
    return specs


def parse_compile_specs(specs) -> tuple[str, str | None]:
    """(precision, external_data) from a delegate's compile specs; unknown ``kiln.*`` keys and
    duplicates are refused."""
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
        else:
            raise ValueError(
                f"KilnBackend: unknown compile spec {key!r} (known: {', '.join(KNOWN_SPECS)}); "
                "use KilnPartitioner(precision=..., external_data=...)"
            )
    return precision, external
