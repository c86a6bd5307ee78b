"""Links between Kiln delegates (docs/runtime.md, "Between delegates"): a tensor one Kiln delegate
passes straight to another stays in the producing engine's memory; an edge through an op left
to ExecuTorch goes through host memory as before; damaged link records fail the load with a
clear message, records that do not fit fall back to host copies, never to wrong values."""

from __future__ import annotations

import struct
import zlib

import kiln
import pytest
import torch
from conftest import assert_close, delegation_summary
from kiln.executorch import _links as links
from kiln.executorch import export
from kiln_test_models import WithAtanLinked

rt = pytest.importorskip("kiln_executorch_runtime")


BATCH = torch.export.Dim("batch", min=1, max=8)


def _export(tmp_path, name="m.pte"):
    model = WithAtanLinked().eval()
    prog = export(model, (torch.randn(4, 16),), dynamic_shapes=({0: BATCH},), quiet=True)
    path = tmp_path / name
    path.write_bytes(prog.buffer)
    return model, prog, path


@pytest.fixture
def stats():
    rt.reset_link_stats()
    yield rt.link_stats
    rt.reset_link_stats()


def _inputs_of(prog, delegate: int):
    """The graph nodes a Kiln delegate call reads, in input order."""
    return [a.name for a in delegation_summary(prog)["delegate_args"][delegate][1]]


def test_records_name_the_direct_edges_only(tmp_path):
    _model, prog, _path = _export(tmp_path)
    s = delegation_summary(prog)
    assert s["kiln"] == 2 and any("atan" in op for op in s["ops"])
    recs = links.program_links(prog)["forward"]
    producer, consumer = recs[0], recs[1]
    assert producer.group == consumer.group and (producer.delegate, consumer.delegate) == (0, 1)
    # h: read by the second delegate only; a: by the atan too (its host buffer is needed).
    assert producer.outputs == [(0, 1, False), (1, 1, True)] and producer.inputs == []
    names = _inputs_of(prog, 1)
    linked = {i for i, _p, _o in consumer.inputs}
    assert consumer.outputs == []
    assert sorted(consumer.inputs) == [
        (names.index("getitem"), 0, 0),
        (names.index("getitem_1"), 0, 1),
    ]
    # The input that comes from the atan is not linked.
    atan_input = [i for i, n in enumerate(names) if "atan" in n]
    assert atan_input and not (set(atan_input) & linked)
    assert prog.kiln_report.links == {"forward": 2}
    assert "2 tensor(s) passed between Kiln delegates" in str(prog.kiln_report)


def test_linked_program_matches_eager_on_fresh_inputs(tmp_path, stats):
    model, _prog, path = _export(tmp_path)
    program = kiln.load(path)
    runs = [3, 8, 1, 8, 5]
    for b in runs:
        x = torch.randn(b, 16)
        assert_close(program.forward(x), [model(x)])
    s = stats()
    n = len(runs)
    # Both direct edges read the producer's memory every run; the atan's edge is not linked.
    assert s["inputs_linked"] == 2 * n and s["inputs_host"] == 0
    # h stays in the engine's memory from the second run on (its reader took the link in the
    # first); a, which the atan reads, is copied to its host buffer every run.
    assert s["outputs_kept"] == n - 1
    assert s["outputs_copied"] == n + 1
    assert s["outputs_materialized"] == 0


def test_two_loads_keep_their_own_links(tmp_path, stats):
    """Two loaded instances of one program, run in turn: each reader finds its own producer (the
    host buffers of the two tell them apart)."""
    model, _prog, path = _export(tmp_path)
    p1, p2 = kiln.load(path), kiln.load(path)
    for _ in range(3):
        x1, x2 = torch.randn(2, 16), torch.randn(6, 16)
        y1 = p1.forward(x1)
        y2 = p2.forward(x2)
        assert_close(y1, [model(x1)])
        assert_close(y2, [model(x2)])
    s = stats()
    assert s["inputs_linked"] == 12 and s["inputs_host"] == 0 and s["outputs_materialized"] == 0


def test_saved_with_external_weights_and_two_methods(tmp_path, stats):
    """save() with a .ptd and two methods: the program is serialized again with the records, the
    .ptd still matches it, and each method links only its own delegates."""
    from kiln.executorch import save

    model = WithAtanLinked().eval()
    path = tmp_path / "two.pte"
    prog = save(
        {"forward": (model, (torch.randn(4, 16),)), "other": (model, (torch.randn(2, 16),))},
        path,
        external_data="w",
        quiet=True,
    )
    recs = links.program_links(prog)
    assert set(recs) == {"forward", "other"}
    assert recs["forward"][0].group != recs["other"][0].group
    program = kiln.load(path, data_path=tmp_path / "w.ptd")
    for _ in range(2):
        for method, b in (("forward", 4), ("other", 2)):
            x = torch.randn(b, 16)
            assert_close(program.run(method, [x]), [model(x)])
    s = stats()
    assert s["inputs_linked"] == 8 and s["inputs_host"] == 0


def test_option_off_passes_through_host_memory(tmp_path, stats):
    model, _prog, path = _export(tmp_path)
    rt.set_option("link_delegates", False)
    try:
        program = kiln.load(path)
    finally:
        rt.set_option("link_delegates", True)
    for _ in range(3):
        x = torch.randn(4, 16)
        assert_close(program.forward(x), [model(x)])
    assert stats() == dict.fromkeys(stats(), 0)


def _with_records(tmp_path, prog, records: dict, name: str):
    """The program with the delegates' link records replaced ({delegate entry: bytes or None})."""
    links.store_records(prog, {"forward": records})
    path = tmp_path / name
    path.write_bytes(prog.buffer)
    return path


def _damage(data: bytes, at: int, fix_crc: bool) -> bytes:
    b = bytearray(data)
    b[at] ^= 0x40
    if fix_crc:
        b[-4:] = struct.pack("<I", zlib.crc32(bytes(b[:-4])))
    return bytes(b)


@pytest.mark.parametrize(
    "at, fix_crc, expect",
    [
        (40, False, "CRC-32"),  # a flipped bit in an entry
        (0, True, "magic"),
        (32, True, "output entry 0 names output 64"),  # an index past the engine's outputs
        (20, True, "do not fit"),  # an entry count that does not match the size
    ],
)
def test_damaged_record_fails_the_load_with_the_remedy(tmp_path, at, fix_crc, expect):
    _model, prog, _path = _export(tmp_path)
    good = links.LinkRecord.encode(links.program_links(prog)["forward"][0])
    path = _with_records(tmp_path, prog, {0: _damage(good, at, fix_crc)}, "bad.pte")
    with pytest.raises(kiln.KilnLoadError) as e:
        kiln.load(path)
    assert e.value.status_name == "KILN_ERR_CORRUPT"
    msg = str(e.value)
    assert "link record" in msg and expect in msg and "link_delegates" in msg


def test_damaged_record_loads_with_the_option_off(tmp_path, stats):
    model, prog, _path = _export(tmp_path)
    good = links.program_links(prog)["forward"][0].encode()
    path = _with_records(tmp_path, prog, {0: _damage(good, 40, False)}, "bad.pte")
    rt.set_option("link_delegates", False)
    try:
        program = kiln.load(path)
    finally:
        rt.set_option("link_delegates", True)
    x = torch.randn(4, 16)
    assert_close(program.forward(x), [model(x)])
    assert stats()["inputs_linked"] == 0


def _run_fallback(tmp_path, records: dict, runs: int = 3):
    model, prog, _path = _export(tmp_path)
    path = _with_records(tmp_path, prog, records(links.program_links(prog)["forward"]), "f.pte")
    program = kiln.load(path)
    for b in range(1, runs + 1):
        x = torch.randn(b, 16)
        assert_close(program.forward(x), [model(x)])


def test_record_reading_a_later_delegate_fails_the_load(tmp_path):
    """Ids follow the order of execution: an input that names a delegate that does not run before
    its own (here itself) is refused."""
    _model, prog, _path = _export(tmp_path)
    r = links.program_links(prog)["forward"][1]
    r.inputs = [(i, 1, o) for i, _p, o in r.inputs]
    path = _with_records(tmp_path, prog, {1: r.encode()}, "bad.pte")
    with pytest.raises(kiln.KilnLoadError, match="does not run before") as e:
        kiln.load(path)
    assert e.value.status_name == "KILN_ERR_CORRUPT"


def test_reader_of_a_missing_delegate_falls_back(tmp_path, stats):
    """A reader whose record names a delegate that publishes nothing (id 7) reads host memory."""

    def records(recs):
        r = recs[1]
        r.delegate = 9
        r.inputs = [(i, 7, o) for i, _p, o in r.inputs]
        return {1: r.encode()}

    _run_fallback(tmp_path, records)
    s = stats()
    assert s["inputs_linked"] == 0 and s["inputs_host"] == 6 and s["outputs_kept"] == 0


def test_producer_without_record_falls_back(tmp_path, stats):
    _run_fallback(tmp_path, lambda recs: {0: None})
    s = stats()
    assert s["inputs_linked"] == 0 and s["inputs_host"] == 6


def test_reader_without_record_keeps_host_copies(tmp_path, stats):
    """The producer keeps an output only on the device after its readers took the link: a reader
    that lost its record never does, so the host buffer is written every run."""
    _run_fallback(tmp_path, lambda recs: {1: None})
    s = stats()
    assert s["inputs_linked"] == 0 and s["outputs_kept"] == 0 and s["outputs_copied"] == 6


def test_reader_of_the_wrong_output_falls_back(tmp_path, stats):
    """A record that pairs an input with another output of its producer finds no publication for
    its buffer: the input reads its host buffer, which the producer writes since no reader took
    the link."""

    def records(recs):
        r = recs[1]
        # Swap which producer output each linked input reads: the host buffers differ.
        r.inputs = [(i, p, 1 - o) for i, p, o in r.inputs]
        return {1: r.encode()}

    _run_fallback(tmp_path, records)
    s = stats()
    assert s["inputs_linked"] == 0 and s["inputs_host"] == 6


def test_newer_record_version_is_not_used(tmp_path, stats):
    def records(recs):
        data = bytearray(recs[1].encode())
        data[4] = 2  # version 2
        data[-4:] = struct.pack("<I", zlib.crc32(bytes(data[:-4])))
        return {1: bytes(data)}

    _run_fallback(tmp_path, records)
    assert stats()["inputs_linked"] == 0


def test_decode_round_trip():
    rec = links.LinkRecord(0x1234_5678_9ABC_DEF0, 3, [(0, 2, False), (5, 1, True)], [(1, 0, 4)])
    data = rec.encode()
    assert len(data) == 32 + 3 * 16 + 4 and data[:4] == b"KLNK"
    assert links.LinkRecord.decode(data) == rec
    with pytest.raises(ValueError, match="CRC"):
        links.LinkRecord.decode(_damage(data, 40, False))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_linked_program_on_the_gpu(tmp_path, stats):
    """On cuda:0 the direct edge never leaves the device: every linked input reads the producer's
    device memory, the output only Kiln reads is never copied to the host after the first run,
    and nothing is copied back on demand. (Without ExecuTorch's Python runtime on the GPU
    machine: examples/cpp/kiln_runner --link-stats --expect-linked, docs/runtime.md.)"""
    model, _prog, path = _export(tmp_path)
    rt.set_option("device", "cuda:0")
    try:
        program = kiln.load(path)
        runs = 5
        for b in [2, 8, 8, 1, 4][:runs]:
            x = torch.randn(b, 16)
            assert_close(program.forward(x), [model(x)])
    finally:
        rt.set_option("device", "auto")
    s = stats()
    assert s["inputs_linked"] == 2 * runs and s["inputs_host"] == 0
    assert s["outputs_kept"] == runs - 1 and s["outputs_materialized"] == 0
