"""The Python side reads Kiln's op table from libkiln; these tests check the two agree."""

from __future__ import annotations

import ctypes

import pytest
from kiln import _lib, _ops
from kiln.executorch import _lowering


def test_every_mapped_kiln_op_exists_in_the_library():
    table = _ops.table()
    missing = sorted(_lowering.kiln_op_names() - set(table))
    assert not missing, f"the translation table emits ops libkiln does not have: {missing}"


def test_lookup_and_table_agree():
    lib = _lib.library()
    table = _ops.table()
    assert len(table) == lib.kiln_op_count()
    ids = set()
    for name, s in table.items():
        assert _ops.lookup_id(name) == s.id
        assert lib.kiln_op_name(s.id).decode() == name
        assert 0 < s.id < 128
        ids.add(s.id)
        assert s.min_inputs <= s.max_inputs
        assert s.n_outputs >= 1
        assert s.dtype_mask != 0
        for a in s.attrs:
            assert a.kind in (_ops.ATTR_INTS, _ops.ATTR_FLOATS)
            assert a.default is None or (a.count < 0 or len(a.default) == a.count)
    assert len(ids) == len(table)


def test_unknown_op_lookup_raises_kiln_error():
    with pytest.raises(_lib.KilnInvalidArgError, match="unknown op name"):
        _ops.lookup_id("no_such_op")
    with pytest.raises(KeyError, match="has no op named"):
        _ops.get("no_such_op")


def test_attribute_names_used_by_the_translation_exist():
    # The attributes the handlers pass, per Kiln op (checked against the library's schemas).
    used = {
        "conv2d": {"stride", "padding", "dilation", "groups"},
        "conv_transpose2d": {"stride", "padding", "output_padding", "dilation", "groups"},
        "batch_norm": {"eps"},
        "gelu": {"approximate"},
        "cast": {"dtype"},
        "clamp": {"min", "max"},
        "softmax": {"dim"},
        "log_softmax": {"dim"},
        "layer_norm": {"normalized_ndim", "eps"},
        "max_pool2d": {"kernel", "stride", "padding", "dilation", "ceil_mode"},
        "avg_pool2d": {
            "kernel",
            "stride",
            "padding",
            "ceil_mode",
            "count_include_pad",
            "divisor_override",
        },
        "adaptive_avg_pool2d": {"output_size"},
        "mean": {"dims", "keepdim"},
        "sum": {"dims", "keepdim"},
        "reshape": {"shape"},
        "expand": {"shape"},
        "permute": {"dims"},
        "cat": {"dim"},
        "slice": {"dim", "start", "end", "step"},
        "select": {"dim", "index"},
        "squeeze": {"dims"},
        "unsqueeze": {"dim"},
        "sdpa": {"is_causal", "scale"},
        "group_norm": {"groups", "eps"},
        "upsample_nearest2d": {"output_size", "scales"},
        "upsample_bilinear2d": {"output_size", "scales", "align_corners"},
        "cumsum": {"dim"},
        "pad": {"pads", "value"},
        "arange": {"dim", "start", "step", "dtype"},
        "index": {"dim", "wrap"},
        "gather": {"dim"},
    }
    for op, names in used.items():
        have = {a.name for a in _ops.get(op).attrs}
        assert names <= have, f"{op}: {sorted(names - have)} not in the library schema {have}"


def test_errors_carry_status_and_message():
    lib = _lib.library()
    out = _lib.OpInfo()
    st = lib.kiln_op_get_info(999, ctypes.byref(out))
    with pytest.raises(_lib.KilnInvalidArgError) as e:
        _lib.check(st, "probe")
    assert e.value.status == 1
    assert "999" in str(e.value) and str(e.value).startswith("probe: ")
    assert isinstance(e.value, ValueError) and isinstance(e.value, _lib.KilnError)


def test_version():
    import kiln

    v = kiln.library_version()
    assert v.count(".") == 2
