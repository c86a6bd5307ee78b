"""Tuning records carried by a program (export option ``tuning_records``): stored beside the
weights as named data, added to the process by the delegate at load (``kiln_add_tuning_records``),
checked whole (a damaged image is not used and never fails the load), and refused at export when
the file given is not a tuning cache.

The records here are synthetic (a GPU's records need a GPU): on the CPU they are added and never
applied, which is what a program tuned for one GPU does on any other device."""

from __future__ import annotations

import hashlib
import os
import re
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest
import torch
from kiln._pte import read_ptd
from kiln.executorch import save


def _image(records: list[tuple[bytes, bytes]], version: int = 1) -> bytes:
    """A tuning cache file (src/core/tune_cache.c's format) holding records."""
    body = b"".join(struct.pack("<HH", len(k), len(v)) + k + v for k, v in records)
    head = b"KILNTUNE" + struct.pack("<IIQI", version, len(records), len(body), zlib.crc32(body))
    return head + struct.pack("<I", zlib.crc32(head)) + body


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(11)
        self.a = torch.nn.Linear(64, 256)
        self.b = torch.nn.Linear(256, 64)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.rand(p.shape, generator=g) * 0.2 - 0.1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


RECORDS = [(b"gpu X|linear 4x64x256", b"\x01\x02\x03"), (b"gpu X|linear 4x256x64", b"\x04")]


def _export(tmp_path: Path, records_file: Path):
    model = _Mlp().eval()
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(5))
    pte = tmp_path / "mlp.pte"
    save(model, pte, (x,), external_data="w", tuning_records=records_file, quiet=True)
    return model, x, pte, tmp_path / "w.ptd"


def _run_child(pte: Path, ptd: Path, x: torch.Tensor, ref: torch.Tensor, tmp: Path) -> str:
    """Loads and runs the program in a fresh process (Kiln's INFO log on); returns its stderr
    after checking the output against ref."""
    torch.save({"x": x, "ref": ref}, tmp / "io.pt")
    code = textwrap.dedent(
        f"""
        import torch, kiln
        io = torch.load({str(tmp / "io.pt")!r})
        prog = kiln.load({str(pte)!r}, data_path={str(ptd)!r})
        y = prog.forward(io["x"])[0]
        err = float((y - io["ref"]).abs().max())
        assert err <= 1e-4 * max(1.0, float(io["ref"].abs().max())), err
        print("ok", err)
        """
    )
    env = dict(os.environ, KILN_LOG_LEVEL="info")
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr
    return p.stderr


def test_records_stored_and_added(tmp_path):
    img = _image(RECORDS)
    f = tmp_path / "tune.kilncache"
    f.write_bytes(img)
    model, x, pte, ptd = _export(tmp_path, f)
    data = read_ptd(ptd.read_bytes())
    key = "kiln-tuning-" + hashlib.sha256(img).hexdigest()
    assert data.get(key) == img, sorted(data)
    with torch.no_grad():
        ref = model(x)
    log = _run_child(pte, ptd, x, ref, tmp_path)
    assert "tuning records: 2 added from a program" in log, log


def test_damaged_records_in_the_program_are_not_used(tmp_path):
    img = _image(RECORDS)
    f = tmp_path / "tune.kilncache"
    f.write_bytes(img)
    model, x, pte, ptd = _export(tmp_path, f)
    raw = bytearray(ptd.read_bytes())
    at = raw.find(img)
    assert at > 0
    raw[at + len(img) - 1] ^= 0x40  # a byte of the last record's value: the body CRC fails
    ptd.write_bytes(bytes(raw))
    with torch.no_grad():
        ref = model(x)
    log = _run_child(pte, ptd, x, ref, tmp_path)
    assert "tuning records are not used" in log and "body CRC mismatch" in log, log
    assert "added from a program" not in log, log


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b[:20], "shorter than its header"),
        (lambda b: b"KILNTUNX" + b[8:], "magic"),
        (lambda b: b[:-1], "header CRC|body size|body CRC"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "body CRC mismatch"),
        (lambda b: _image(RECORDS, version=2), "another format version"),
    ],
)
def test_export_refuses_a_file_that_is_not_a_tuning_cache(tmp_path, damage, message):
    f = tmp_path / "tune.kilncache"
    f.write_bytes(damage(_image(RECORDS)))
    with pytest.raises(ValueError, match="not a Kiln tuning cache") as e:
        _export(tmp_path, f)
    assert re.search(message, str(e.value)), str(e.value)


def test_export_refuses_a_missing_file_or_a_wrong_type(tmp_path):
    with pytest.raises(FileNotFoundError, match="kiln tune"):
        _export(tmp_path, tmp_path / "absent.kilncache")
    with pytest.raises(TypeError, match="tuning_records"):
        _export(tmp_path, 42)
