"""Opening what the ``kiln`` command is given: a ``.pte`` (its Kiln engines, their external
weights from the ``.pte`` or a ``.ptd``) or a raw Kiln engine."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .. import _pte

KILN = "KilnBackend"


class CliError(Exception):
    """A failure the command reports (exit status 1) with a message naming the remedy."""


class UsageError(CliError):
    """Bad arguments (exit status 2)."""


def read(path: str) -> bytes:
    p = Path(path)
    if not p.exists():
        raise CliError(f"{path}: no such file")
    if p.is_dir():
        raise CliError(f"{path} is a directory: pass a .pte program or a Kiln engine file")
    try:
        return p.read_bytes()
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror or e}") from None


@dataclasses.dataclass
class KilnEngine:
    method: str
    delegate: int  # index in the method's delegates table
    call: int  # position among the method's Kiln delegate calls (execution order)
    data: bytes
    precision: str | None
    external_data: str | None  # the .ptd stem its compile specs name


@dataclasses.dataclass
class Opened:
    path: str
    kind: str  # "pte" or "engine"
    data: bytes
    program: _pte.Program | None
    engines: list[KilnEngine]
    ptd_paths: list[str]  # .ptd files read
    ptd: dict[str, bytes]  # named data from them
    ptd_problems: list[str]  # expected .ptd files that are missing or unreadable

    def weights(self) -> dict[str, bytes]:
        """Every named data blob the engines may ask for: the .pte's own, then the .ptd's."""
        out = dict(self.ptd)
        if self.program is not None:
            for key in self.program.named_data:
                out.setdefault(key, self.program.named(key))
        return out


def open_program(path: str, data_paths: list[str] | None = None) -> Opened:
    """Reads a .pte or an engine; for a .pte, the .ptd files given, else those its Kiln
    delegates name (``<stem>.ptd`` beside the .pte) when they exist."""
    data = read(path)
    kind = _pte.file_kind(data)
    if kind == "engine":
        return Opened(
            path, "engine", data, None, [KilnEngine("-", 0, 0, data, None, None)], [], {}, []
        )
    if kind != "pte":
        what = "an ExecuTorch data file (.ptd), not a program" if kind == "ptd" else None
        raise CliError(
            f"{path} is {what or 'neither an ExecuTorch program (.pte) nor a Kiln engine'} "
            f"({len(data)} bytes; a .pte has 'ET12' at byte 4, an engine starts with "
            "\\x89KLN\\r\\n\\x1a\\n)"
        )
    try:
        prog = _pte.read_program(data, path)
    except _pte.PteError as e:
        raise CliError(str(e)) from None
    engines = []
    for m in prog.methods:
        order = [d for k, d in m.calls if k == "delegate"]
        order += [d.index for d in m.delegates if d.index not in order]
        n = 0
        for di in order:
            if not 0 <= di < len(m.delegates):
                raise CliError(
                    f"{path}: method {m.name!r} calls delegate {di}, but it has "
                    f"{len(m.delegates)}: the program is corrupt"
                )
            d = m.delegates[di]
            if d.backend != KILN:
                continue
            specs = d.compile_specs
            engines.append(
                KilnEngine(
                    m.name,
                    di,
                    n,
                    d.data or b"",
                    _spec(specs.get("kiln.precision")),
                    _spec(specs.get("kiln.external_data")),
                )
            )
            n += 1
    ptd_paths, problems = [], []
    if data_paths:
        ptd_paths = list(data_paths)
    else:
        for stem in sorted({e.external_data for e in engines if e.external_data}):
            cand = Path(path).parent / f"{stem}.ptd"
            if cand.is_file():
                ptd_paths.append(str(cand))
            else:
                problems.append(
                    f"{cand} (named by the Kiln delegates' compile specs) does not exist: pass "
                    "the .ptd written with the program with --data FILE.ptd"
                )
    named: dict[str, bytes] = {}
    for dp in ptd_paths:
        try:
            named.update(_pte.read_ptd(read(dp), dp))
        except (_pte.PteError, CliError) as e:
            problems.append(str(e))
    return Opened(path, "pte", data, prog, engines, ptd_paths, named, problems)


def _spec(v: bytes | None) -> str | None:
    return None if v is None else v.decode("utf-8", "surrogateescape")
