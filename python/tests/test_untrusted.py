"""Untrusted files, end to end: damaged .ptd files, weights, engine strings and versions through
every public surface (``kiln.load``, ``executorch.runtime.Runtime`` with Kiln's .ptd check, the C
program API), each case in a child process so that a signal fails the test.

The battery: every single-bit flip of the first 512 bytes of a .ptd; bit flips spread over every
weight in the .pte's named data and in the .ptd (and over the padding between them); bytes that
are not UTF-8 text in every kind of engine string (input, output and weight names, weight keys;
the engine's CRCs recomputed); a damaged engine format_version, a newer one; a missing, a
truncated and a foreign .ptd; a GPU asked for where there is none. Result: no crash, no hang, no
silently different output (a case that loads gives the pristine output bit for bit), and every
refusal carries Kiln's status and a message naming the cause and the remedy.

The Python surfaces run a group of cases in one child process (faulthandler names the case that
crashed); the C program API forks one child per case (tests/consumer/files/check_files.c).
``KILN_UNTRUSTED_FULL=1`` also flips every bit of every weight, on every surface.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from engine_bytes import fix_crcs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BIN = Path(sys.executable).parent
FULL = os.environ.get("KILN_UNTRUSTED_FULL", "") == "1"
KILN_MAGIC = b"\x89KLN\r\n\x1a\n"
CHILD_TIMEOUT = 1800


class Mlp(torch.nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, width)
        self.fc2 = torch.nn.Linear(width, 8)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


# --- the pristine files


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    import kiln
    from kiln.executorch import save

    d = tmp_path_factory.mktemp("untrusted")
    torch.manual_seed(0)
    m = Mlp().eval()
    x = torch.randn(4, 16)
    save(m, d / "ext.pte", (x,), external_data="ext")  # weights in ext.ptd
    save(m, d / "inl.pte", (x,))  # weights in the .pte's named data
    torch.manual_seed(1)
    save(Mlp().eval(), d / "other.pte", (x,), external_data="other")  # another export
    (d / "x.bin").write_bytes(x.numpy().tobytes())
    y = kiln.load(d / "ext.pte", data_path=d / "ext.ptd").forward(x)[0]
    with torch.no_grad():
        torch.testing.assert_close(y, m(x), rtol=1e-4, atol=1e-4)
    assert torch.equal(kiln.load(d / "inl.pte").forward(x)[0], y)
    (d / "ref.bin").write_bytes(y.numpy().tobytes())
    return {
        "dir": d,
        "ext.pte": (d / "ext.pte").read_bytes(),
        "ext.ptd": (d / "ext.ptd").read_bytes(),
        "inl.pte": (d / "inl.pte").read_bytes(),
    }


# --- the engine inside a .pte, and its weights


def _engine_span(pte: bytes) -> tuple[int, int]:
    at = pte.find(KILN_MAGIC)
    assert at >= 0 and pte.find(KILN_MAGIC, at + 1) < 0, "one Kiln engine expected"
    return at, struct.unpack_from("<Q", pte, at + 24)[0]


def _sections(e) -> dict:
    out = {}
    for i in range(struct.unpack_from("<I", e, 20)[0]):
        kind, _, off, nb = struct.unpack_from("<IIQQ", e, 40 + 32 * i)
        out[kind] = (i, off, nb)
    return out


def _strings(e) -> list[tuple[int, int, str]]:
    """(offset, length, kind) of every string the engine's tensors name."""
    secs = _sections(e)
    _, s_off, s_nb = secs[3]
    _, t_off, t_nb = secs[4]
    kinds = {1: "input name", 2: "output name", 3: "activation name", 4: "weight name"}
    found = {}
    for r in range(t_off, t_off + t_nb, 168):
        kind, _, _, name, _, key = struct.unpack_from("<IIIIII", e, r)
        if name != 0:
            found.setdefault(name, kinds[kind])
        if kind == 4 and key != 0xFFFFFFFF:
            found.setdefault(key, "weight key")
    out = []
    for at, kind in sorted(found.items()):
        n = e[s_off + at :].index(b"\0")
        out.append((s_off + at, n, kind))
    return out


def _tree_digest(b: bytes) -> str:
    """The key's digest (src/core/sha256.h): SHA-256 of the length and the 4 MiB leaves' digests."""
    leaf = 4 << 20
    h = hashlib.sha256(struct.pack("<Q", len(b)))
    for o in range(0, len(b), leaf):
        h.update(hashlib.sha256(b[o : o + leaf]).digest())
    return h.hexdigest()


def _weight_spans(data: bytes, pte: bytes) -> list[tuple[int, int]]:
    """Where the engine's external weights lie in `data` (found by their SHA-256 keys; in a .pte
    the engine itself is skipped)."""
    at, n = _engine_span(pte)
    e = pte[at : at + n]
    secs = _sections(e)
    _, s_off, _ = secs[3]
    _, t_off, t_nb = secs[4]
    skip = range(at, at + n) if data is pte else range(0)
    spans = set()
    for r in range(t_off, t_off + t_nb, 168):
        kind, key = struct.unpack_from("<I", e, r)[0], struct.unpack_from("<I", e, r + 20)[0]
        if kind != 4 or key == 0xFFFFFFFF:
            continue
        nb = struct.unpack_from("<Q", e, r + 32)[0]
        digest = e[s_off + key :].split(b"\0", 1)[0].decode().removeprefix("kiln-t-")
        hits = [
            o
            for o in range(0, len(data) - nb + 1, 16)
            if o not in skip and _tree_digest(data[o : o + nb]) == digest
        ]
        assert hits, f"weight kiln-t-{digest} not found"
        spans.update((o, nb) for o in hits)
    return sorted(spans)


def _spread_flips(data: bytes, spans, region: tuple[int, int]):
    """(bit, inside a weight?) pairs: bits spread over every weight (every bit with
    KILN_UNTRUSTED_FULL) and over the bytes of `region` that hold no weight."""
    out = []
    for o, nb in spans:
        step = 1 if FULL else max(1, (8 * nb) // 24)
        out += [(8 * o + b, True) for b in range(0, 8 * nb, step)]
    inside = set()
    for o, nb in spans:
        inside.update(range(o, o + nb))
    pad = [b for b in range(*region) if b not in inside]
    out += [(8 * b + (b % 8), False) for b in pad[:: max(1, len(pad) // 24)]]
    return out


# --- running cases


def _case(d: Path, cid: str, pte: bytes | Path, ptd: bytes | Path | None) -> dict:
    """Writes the files of a case (bytes) or names them (a Path)."""

    def put(data, ext):
        if data is None:
            return None
        if isinstance(data, Path):
            return str(data)
        p = d / "cases" / f"{cid}{ext}"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(data)
        return str(p)

    return {
        "id": cid,
        "pte": put(pte, ".pte"),
        "ptd": put(ptd, ".ptd"),
        "input": str(d / "x.bin"),
        "dims": [4, 16],
        "ref": str(d / "ref.bin"),
    }


def _run_python(d: Path, surface: str, cases: list[dict]) -> dict:
    manifest = d / f"manifest-{surface}-{cases[0]['id']}.json"
    manifest.write_text(json.dumps(cases))
    env = dict(os.environ, KILN_LOG_LEVEL="warn")
    p = subprocess.run(
        [sys.executable, str(HERE / "untrusted_child.py"), str(manifest), surface],
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=CHILD_TIMEOUT,
        env=env,
    )
    results, started = {}, None
    for line in p.stdout.splitlines():
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if "start" in r:
            started = r["start"]
        else:
            results[r["id"]] = r
    assert p.returncode == 0, (
        f"{surface}: the child process died ({p.returncode}) in case {started}:\n{p.stderr[-4000:]}"
    )
    assert len(results) == len(cases), f"{surface}: {len(results)} of {len(cases)} cases ran"
    return results


CMAKE = str(BIN / "cmake") if (BIN / "cmake").exists() else shutil.which("cmake")


@pytest.fixture(scope="module")
def check_files(tmp_path_factory) -> Path | None:
    """tests/consumer/files/check_files, built against the installed package (None when CMake
    >= 3.28 or a C compiler is missing: the C surface is then skipped)."""
    if CMAKE is None or shutil.which("cc") is None:
        return None
    prefix = subprocess.run(
        [sys.executable, "-m", "kiln_executorch_runtime", "--cmake-prefix-path"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    build = tmp_path_factory.mktemp("check_files")
    cmd = [CMAKE, "-S", str(ROOT / "tests" / "consumer" / "files"), "-B", str(build)]
    cmd += [f"-DCMAKE_PREFIX_PATH={prefix}"]
    if (BIN / "ninja").exists():
        cmd += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={BIN / 'ninja'}"]
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    for c in (cmd, [CMAKE, "--build", str(build)]):
        p = subprocess.run(c, capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return build / "check_files"


def test_fuzz_program_corpus(check_files):
    """fuzz/fuzz_program.c over its committed corpus (the seeds and past findings), against the
    installed package: no crash, every failure explained, every run deterministic."""
    if check_files is None:
        pytest.skip("needs CMake >= 3.28 and a C compiler")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["KILN_LOG_LEVEL"] = "none"
    p = subprocess.run(
        [str(check_files.parent / "fuzz_program_replay"), str(ROOT / "fuzz/corpus/fuzz_program")],
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=CHILD_TIMEOUT,
        env=env,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert re.search(r"replayed ([6-9]|\d\d+) files, 0 unreadable", p.stdout), p.stdout


def test_program_threads_tsan():
    """64 threads through the C program API (ExecuTorch's Module), one program each and one
    program shared (kiln_program_share), outputs bit-identical to one thread, under
    ThreadSanitizer: tests/program_threads.c in a KILN_TSAN + KILN_EXECUTORCH build of this
    checkout (kept in build/, so a rerun only rebuilds what changed)."""
    if CMAKE is None or shutil.which("cc") is None or not (BIN / "ninja").exists():
        pytest.skip("needs the venv's CMake and ninja and a C compiler")
    import sysconfig

    build = ROOT / "build" / f"tsan-et-{Path(sys.prefix).name}"
    cmd = [CMAKE, "-S", str(ROOT), "-B", str(build), "-G", "Ninja"]
    cmd += [f"-DCMAKE_MAKE_PROGRAM={BIN / 'ninja'}", "-DKILN_EXECUTORCH=ON", "-DKILN_TSAN=ON"]
    cmd += ["-DKILN_CUDA=OFF", "-DCMAKE_BUILD_TYPE=RelWithDebInfo"]
    cmd += [f"-DCMAKE_PREFIX_PATH={sysconfig.get_paths()['purelib']}"]
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    for c in (cmd, [CMAKE, "--build", str(build), "--target", "kiln_program_threads"]):
        p = subprocess.run(c, capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    env["TSAN_OPTIONS"] = "halt_on_error=1 second_deadlock_stack=1"
    env["KILN_LOG_LEVEL"] = "none"
    exe = build / "adapter" / "executorch" / "kiln_program_threads"
    p = subprocess.run(
        [str(exe), str(ROOT / "fuzz/corpus/fuzz_program"), "64"],
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=CHILD_TIMEOUT,
        env=env,
    )
    assert p.returncode == 0 and "ThreadSanitizer" not in p.stderr, p.stdout + p.stderr[-6000:]
    m = re.search(
        r"(\d+) programs \((\d+) shared\) x 64 threads x \d+ inputs: 0 failures", p.stdout
    )
    assert m and int(m.group(1)) >= 6 and int(m.group(2)) >= 3, p.stdout


def _run_c(exe: Path, d: Path, cases: list[dict]) -> dict:
    manifest = d / f"manifest-c-{cases[0]['id']}.tsv"
    rows = [
        "\t".join(
            [
                c["id"],
                c["pte"],
                c["ptd"] or "-",
                c["input"],
                ",".join(map(str, c["dims"])),
                c["ref"],
            ]
        )
        for c in cases
    ]
    manifest.write_text("\n".join(rows) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["KILN_LOG_LEVEL"] = "none"
    p = subprocess.run(
        [str(exe), str(manifest), "1" if FULL else "64"],
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=CHILD_TIMEOUT,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    results = {}
    for line in p.stdout.splitlines():
        cid, result, status, message = (line.split("\t", 3) + ["", "", ""])[:4]
        results[cid] = {
            "id": cid,
            "result": result,
            "status": status or None,
            "message": message,
        }
    return results


def _surfaces(files, check_files, cases, surfaces=("kiln", "runtime", "c")) -> dict:
    d = files["dir"]
    out = {}
    for s in surfaces:
        if s == "c":
            if check_files is None:
                continue
            out[s] = _run_c(check_files, d, cases)
        else:
            out[s] = _run_python(d, s, cases)
    assert out, "no surface ran"
    return out


def _text(msg: str) -> bool:
    """UTF-8 text without control characters (what Kiln promises for its messages)."""
    return not re.search(r"[\x00-\x1f\x7f-\x9f]", msg) and "\ufffd" not in msg


def _check(results: dict, expect) -> dict:
    """expect(case id, result) -> None raises on a wrong outcome. Returns result counts."""
    counts = {}
    for surface, rs in results.items():
        for cid, r in rs.items():
            assert r["result"] in ("ok", "refused"), f"{surface} {cid}: {r}"
            if r["result"] == "refused":
                assert r["status"], f"{surface} {cid}: refused without Kiln's diagnosis: {r}"
                assert _text(r["message"]), f"{surface} {cid}: message is not text: {r}"
            try:
                expect(cid, r)
            except AssertionError as e:
                raise AssertionError(f"{surface} {cid}: {e}: {r}") from None
            key = (surface, r["result"], r["status"])
            counts[key] = counts.get(key, 0) + 1
    return counts


# --- every single-bit flip of the first 512 bytes of a .ptd


def test_ptd_header_bit_flips(files, check_files):
    base = files["ext.ptd"]
    d = files["dir"]
    cases = []
    for bit in range(8 * 512):
        b = bytearray(base)
        b[bit // 8] ^= 1 << (bit % 8)
        cases.append(_case(d, f"ptd-bit{bit}", d / "ext.pte", bytes(b)))
    surfaces = ("kiln", "runtime", "c") if FULL else ("kiln", "c")
    results = _surfaces(files, check_files, cases, surfaces)

    def expect(cid, r):
        if r["result"] == "refused":
            assert r["status"] in ("KILN_ERR_CORRUPT", "KILN_ERR_MISSING_DATA")
            if r["status"] == "KILN_ERR_CORRUPT":
                assert re.search(r"\.ptd|SHA-256", r["message"])
                assert "re-export" in r["message"] or "pass the .ptd" in r["message"]
            else:
                assert "kiln-t-" in r["message"]

    counts = _check(results, expect)
    for s in results:
        refused = sum(v for (surf, res, _), v in counts.items() if surf == s and res == "refused")
        # Most flips damage something; the rest hit padding or fields nobody reads (same output).
        assert refused > 3000, counts


def test_ptd_header_bit_flips_runtime_sample(files, check_files):
    """executorch.runtime.Runtime after kiln_executorch_runtime.check_data_file (every 7th bit;
    all of them with KILN_UNTRUSTED_FULL)."""
    if FULL:
        pytest.skip("covered by test_ptd_header_bit_flips")
    base = files["ext.ptd"]
    d = files["dir"]
    cases = []
    for bit in range(0, 8 * 512, 7):
        b = bytearray(base)
        b[bit // 8] ^= 1 << (bit % 8)
        cases.append(_case(d, f"rt-ptd-bit{bit}", d / "ext.pte", bytes(b)))
    results = _surfaces(files, check_files, cases, ("runtime",))

    def expect(cid, r):
        if r["result"] == "refused":
            assert r["status"] in ("KILN_ERR_CORRUPT", "KILN_ERR_MISSING_DATA")

    _check(results, expect)


# --- bit flips spread over the weights: in the .ptd and in the .pte's named data


def test_weight_bit_flips_ptd(files, check_files):
    base, pte = files["ext.ptd"], files["ext.pte"]
    d = files["dir"]
    spans = _weight_spans(base, pte)
    seg_base, seg_size = struct.unpack_from("<QQ", base, 32)
    flips = _spread_flips(base, spans, (seg_base, seg_base + seg_size))
    assert sum(w for _, w in flips) >= 4 * 16
    cases, inside = [], {}
    for bit, in_weight in flips:
        b = bytearray(base)
        b[bit // 8] ^= 1 << (bit % 8)
        cid = f"ptdw-bit{bit}"
        inside[cid] = in_weight
        cases.append(_case(d, cid, d / "ext.pte", bytes(b)))
    results = _surfaces(files, check_files, cases)

    def expect(cid, r):
        if inside[cid]:
            assert r["result"] == "refused" and r["status"] == "KILN_ERR_CORRUPT"
            assert "does not match the SHA-256 its key names" in r["message"]
            assert "re-export, or the file was damaged in transit" in r["message"]
            assert "verify_weights" in r["message"]
        else:
            assert r["result"] == "ok", "a flip in padding must change nothing"

    _check(results, expect)


def test_weight_bit_flips_pte_named_data(files, check_files):
    pte = files["inl.pte"]
    d = files["dir"]
    spans = _weight_spans(pte, pte)
    at, n = _engine_span(pte)
    flips = _spread_flips(pte, spans, (at + n, len(pte)))
    cases, inside = [], {}
    for bit, in_weight in flips:
        b = bytearray(pte)
        b[bit // 8] ^= 1 << (bit % 8)
        cid = f"ptew-bit{bit}"
        inside[cid] = in_weight
        cases.append(_case(d, cid, bytes(b), None))
    results = _surfaces(files, check_files, cases)

    def expect(cid, r):
        if inside[cid]:
            assert r["result"] == "refused" and r["status"] == "KILN_ERR_CORRUPT"
            assert "does not match the SHA-256 its key names" in r["message"]
        elif r["result"] == "refused":
            # Outside the weights: padding, or the .pte's own segment table.
            assert r["status"] in ("KILN_ERR_CORRUPT", "KILN_ERR_MISSING_DATA")

    _check(results, expect)


# --- engine strings that are not UTF-8 text (CRCs recomputed)

BAD_TEXT = [
    (b"\xff", "0xff"),
    (b"\x80", "a stray continuation byte"),
    (b"\xc0\xaf", "an overlong form"),
    (b"\xed\xa0\x80", "a surrogate"),
    (b"\x1b[2J", "ESC: clear the screen"),
    (b"\n", "a newline"),
    (b"\x7f", "DEL"),
    (b"\xc2\x9b", "a C1 control (CSI)"),
]


def test_engine_strings_not_text(files, check_files):
    d = files["dir"]
    cases, kinds = [], set()
    for name, ptd in (("ext", d / "ext.ptd"), ("inl", None)):
        pte = files[f"{name}.pte"]
        at, n = _engine_span(pte)
        for off, length, kind in _strings(pte[at : at + n]):
            kinds.add(kind)
            for k, (bad, _) in enumerate(BAD_TEXT):
                if len(bad) > length:
                    continue
                e = bytearray(pte[at : at + n])
                e[off : off + len(bad)] = bad
                fix_crcs(e)
                b = pte[:at] + bytes(e) + pte[at + n :]
                cid = f"str-{name}-{kind.replace(' ', '_')}-{off}-{k}"
                cases.append(_case(d, cid, b, ptd))
    assert {"input name", "output name", "weight name", "weight key"} <= kinds, kinds
    results = _surfaces(files, check_files, cases)

    def expect(cid, r):
        assert r["result"] == "refused" and r["status"] == "KILN_ERR_CORRUPT"
        assert "is not UTF-8 text" in r["message"]
        assert "\\x" in r["message"], "the bad bytes are shown escaped"

    _check(results, expect)


def test_engine_string_valid_utf8_loads(files, check_files):
    """Multi-byte UTF-8 in an engine name is text: it loads and runs unchanged."""
    d = files["dir"]
    pte = files["inl.pte"]
    at, n = _engine_span(pte)
    cases = []
    for off, length, kind in _strings(pte[at : at + n]):
        if kind == "weight name" and length >= 3:
            e = bytearray(pte[at : at + n])
            e[off : off + 3] = "€".encode()
            fix_crcs(e)
            cases.append(_case(d, f"utf8-{off}", pte[:at] + bytes(e) + pte[at + n :], None))
    assert cases

    def expect(cid, r):
        assert r["result"] == "ok", "valid UTF-8 must load and give the same output"

    _check(_surfaces(files, check_files, cases), expect)


# --- versions, missing and foreign files


def test_versions_and_foreign_files(files, check_files):
    d = files["dir"]
    pte = files["ext.pte"]
    at, n = _engine_span(pte)
    ptd = d / "ext.ptd"
    cases, expected = [], {}

    def add(cid, b, p, status, *needles):
        cases.append(_case(d, cid, b, p))
        expected[cid] = (status, needles)

    e = bytearray(pte[at : at + n])
    e[8] ^= 0x02  # format_version 1 -> 3, the CRCs left as they were: damage
    add(
        "version-flip",
        pte[:at] + bytes(e) + pte[at + n :],
        ptd,
        "KILN_ERR_CORRUPT",
        "format_version 3 is not a released version",
        "the header CRC matches format_version 1",
    )
    e = bytearray(pte[at : at + n])
    struct.pack_into("<I", e, 8, 2)  # a well-formed engine of a newer format
    fix_crcs(e)
    add(
        "version-newer",
        pte[:at] + bytes(e) + pte[at + n :],
        ptd,
        "KILN_ERR_VERSION",
        "made by a newer Kiln",
        "upgrade Kiln",
    )
    e = bytearray(pte[at : at + n])
    struct.pack_into("<I", e, 8, 0x01000001)  # beyond any version Kiln will use
    fix_crcs(e)
    add(
        "version-huge",
        pte[:at] + bytes(e) + pte[at + n :],
        ptd,
        "KILN_ERR_CORRUPT",
        "outside every released range",
    )
    add("no-ptd", d / "ext.pte", None, "KILN_ERR_MISSING_DATA", "kiln-t-")
    half_ptd = files["ext.ptd"][: len(files["ext.ptd"]) // 2]
    add("ptd-half", d / "ext.pte", half_ptd, "KILN_ERR_CORRUPT", "runs past")
    add("ptd-empty", d / "ext.pte", b"", "KILN_ERR_CORRUPT", "too short")
    add("ptd-is-pte", d / "ext.pte", d / "ext.pte", "KILN_ERR_CORRUPT", "not an ExecuTorch .ptd")
    add("pte-is-ptd", d / "ext.ptd", None, "KILN_ERR_CORRUPT", "not an ExecuTorch program")
    add("ptd-foreign", d / "ext.pte", d / "other.ptd", "KILN_ERR_MISSING_DATA", "kiln-t-")
    # The two linears' weights of one .ptd swapped: sizes match (16x32 and 32x8 do not), so
    # swap two bias-sized windows of equal length inside the first weight instead.
    spans = _weight_spans(files["ext.ptd"], pte)
    o, nb = max(spans, key=lambda s: s[1])
    b = bytearray(files["ext.ptd"])
    half = nb // 2
    b[o : o + half], b[o + half : o + 2 * half] = b[o + half : o + 2 * half], b[o : o + half]
    add("ptd-shuffled", d / "ext.pte", bytes(b), "KILN_ERR_CORRUPT", "does not match the SHA-256")
    # Programs that crashed ExecuTorch's loader before Kiln checked them (fuzz_program findings,
    # fuzz/gen_program_corpus.py): refused by Kiln's .pte check.
    for name, needle in (
        ("compile-spec-key", "compile_specs[1].key (offset 288) is missing"),
        ("output-index", "outputs 0: index -589823"),
    ):
        seed = (ROOT / "fuzz/corpus/fuzz_program" / f"regress-{name}.bin").read_bytes()
        n = struct.unpack_from("<I", seed)[0]
        add(f"regress-{name}", seed[4 : 4 + n], seed[4 + n :] or None, "KILN_ERR_CORRUPT", needle)
    results = _surfaces(files, check_files, cases)

    def expect(cid, r):
        status, needles = expected[cid]
        assert r["result"] == "refused" and r["status"] == status
        for needle in needles:
            assert needle in r["message"]

    _check(results, expect)


def test_planned_memory_beyond_the_machine(files, check_files):
    """A damaged planned-buffer size (2.9e17 bytes) is refused before ExecuTorch allocates it."""
    seed = (ROOT / "fuzz/corpus/fuzz_program/regress-planned-size.bin").read_bytes()
    n = struct.unpack_from("<I", seed)[0]
    cases = [_case(files["dir"], "planned-size", seed[4 : 4 + n], None)]
    results = _surfaces(files, check_files, cases, ("kiln", "c"))

    def expect(cid, r):
        assert r["result"] == "refused" and r["status"] == "KILN_ERR_NO_MEMORY"
        assert "bytes of memory" in r["message"] and "damaged" in r["message"]

    _check(results, expect)


# --- errors reach the user whole


def test_kiln_load_error_is_whole(files):
    """kiln.load's exception carries Kiln's status name and its whole message (remedy included),
    not "error 0x23 ... see the log lines above"."""
    import kiln

    d = files["dir"]
    b = bytearray(files["ext.ptd"])
    o, nb = _weight_spans(files["ext.ptd"], files["ext.pte"])[0]
    b[o + nb // 2] ^= 0x10
    (d / "one-flip.ptd").write_bytes(b)
    with pytest.raises(kiln.KilnLoadError) as e:
        kiln.load(d / "ext.pte", data_path=d / "one-flip.ptd")
    msg = str(e.value)
    assert e.value.status_name == "KILN_ERR_CORRUPT" and e.value.status == 4
    assert "KILN_ERR_CORRUPT (corrupt engine)" in msg
    assert msg.rstrip().endswith("[files: " + f"{d / 'ext.pte'} with {d / 'one-flip.ptd'}]")
    assert "the option verify_weights = false skips this check" in msg
    assert len(msg) > 400 and "see the" not in msg


def test_runtime_error_is_available(files):
    """Through executorch.runtime directly ExecuTorch raises "error 0x23" only; Kiln's cause is
    kiln_executorch_runtime.last_error(), and ExecuTorch's log has it whole (in lines)."""
    import kiln_executorch_runtime as rt
    from executorch.runtime import Runtime

    d = files["dir"]
    b = bytearray(files["ext.ptd"])
    o, nb = _weight_spans(files["ext.ptd"], files["ext.pte"])[-1]
    b[o] ^= 0x01
    (d / "rt-flip.ptd").write_bytes(b)
    rt.check_data_file(d / "rt-flip.ptd")  # the structure is fine: only a weight is damaged
    rt.clear_error()
    assert rt.last_error() is None
    prog = Runtime.get().load_program(str(d / "ext.pte"), data_path=str(d / "rt-flip.ptd"))
    with pytest.raises(RuntimeError, match="0x:?23"):
        prog.load_method("forward")
    name, msg = rt.last_error()
    assert name == "KILN_ERR_CORRUPT" and rt.last_status() == 4
    assert msg.startswith("loading the Kiln engine failed (method 'forward'): KILN_ERR_CORRUPT")
    assert "re-export, or the file was damaged in transit" in msg
    rt.clear_error()
    assert rt.last_error() is None
    with pytest.raises(rt.KilnRuntimeError, match="file identifier") as e:
        (d / "not.ptd").write_bytes(b"\0" * 100)
        rt.check_data_file(d / "not.ptd")
    assert e.value.status_name == "KILN_ERR_CORRUPT"
    with pytest.raises(rt.KilnRuntimeError, match="cannot open") as e:
        rt.check_data_file(d / "missing.ptd")
    assert e.value.status_name == "KILN_ERR_IO"


def test_missing_gpu_is_not_supported(files):
    """device = cuda:0 without a GPU: KILN_ERR_DEVICE, reported to ExecuTorch as NotSupported
    (0x10), not Internal; the message says the backend is not available."""
    import kiln
    import kiln_executorch_runtime as rt

    if "cuda" in rt.backend_info().get("device_option", "") or torch.cuda.is_available():
        pytest.skip("a GPU is present")
    d = files["dir"]
    rt.set_option("device", "cuda:0")
    try:
        with pytest.raises(kiln.KilnLoadError) as e:
            kiln.load(d / "inl.pte")
    finally:
        rt.set_option("device", "auto")
    msg = str(e.value)
    assert e.value.status_name == "KILN_ERR_DEVICE"
    assert "0x:10" in msg or "0x10" in msg, msg
    assert "NotSupported" in msg and "no CUDA backend is available" in msg
    kiln.load(d / "inl.pte")  # the option is back to auto: loads on the CPU


# --- the smaller cases


def test_meta_device_model_is_refused_up_front(tmp_path):
    from kiln.executorch import save

    with torch.device("meta"):
        m = Mlp().eval()
    with pytest.raises(ValueError, match=r"weights 'fc1.weight' and 3 more are on the meta dev"):
        save(m, tmp_path / "m.pte", (torch.randn(4, 16),))
    with pytest.raises(ValueError, match="to_empty"):
        save(m, tmp_path / "m.pte", (torch.randn(4, 16, device="meta"),))
    ep_model = Mlp().eval()
    with pytest.raises(ValueError, match="example input 0 is a meta tensor"):
        save(ep_model, tmp_path / "m.pte", (torch.randn(4, 16, device="meta"),))
    assert not (tmp_path / "m.pte").exists()


def test_graph_input_whose_size_overflows():
    """kiln_graph_add_input refuses a shape over the engine's 2^62-byte tensor limit at the
    call, naming the limit (the build used to fail later, asking for a bug report)."""
    from kiln import _lib
    from kiln._graph import Graph

    g = Graph()
    f32 = 1  # KILN_DTYPE_F32
    with pytest.raises(_lib.KilnInvalidArgError, match=r"2\^62 bytes, Kiln's limit") as e:
        g.add_input("x", f32, [1, 1], [1 << 40, 1 << 40])
    assert e.value.status_name == "KILN_ERR_INVALID_ARG"
    assert g.add_input("y", f32, [1, 1], [1 << 20, 1 << 20]) >= 0
    with pytest.raises(_lib.KilnInvalidArgError, match="not UTF-8 text"):
        g.add_input("bad\x1b[2J", f32, [1], [1])


def test_status_names_match_the_library():
    from kiln import _lib

    lib = _lib.library()
    for status, name in enumerate(_lib.STATUS_NAMES):
        assert lib.kiln_status_name(status).decode() == name
    assert lib.kiln_status_name(len(_lib.STATUS_NAMES)).decode() == "KILN_ERR_UNKNOWN"
