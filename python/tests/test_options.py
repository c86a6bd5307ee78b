"""Option validation of kiln.executorch.export / save / KilnPartitioner, and the compile specs."""

from __future__ import annotations

import pytest
import torch
from kiln.executorch import EXPORT_OPTIONS, KilnPartitioner, export, save
from kiln.executorch._options import parse_compile_specs, validate_external_data
from kiln_test_models import MLP


def _mlp():
    return MLP().eval(), (torch.randn(2, 32),)


@pytest.mark.parametrize("bad", ["fp64", "FP16", "half", "", "int8"])
def test_precision_value_refused_listing_valid(bad):
    m, x = _mlp()
    with pytest.raises(ValueError) as e:
        export(m, x, precision=bad)
    msg = str(e.value)
    for valid in ("'fp32'", "'fp16'", "'bf16'"):
        assert valid in msg
    assert repr(bad) in msg


@pytest.mark.parametrize("bad", [16, None, b"fp16", torch.float16])
def test_precision_type_refused(bad):
    m, x = _mlp()
    with pytest.raises(TypeError, match="precision must be a str"):
        export(m, x, precision=bad)


@pytest.mark.parametrize(
    "bad",
    ["", ".", "..", "a/b", "/abs", "a\\b", "nul\x00x", "w.ptd", "aoti_cuda_blob"],
)
def test_external_data_names_refused(bad):
    with pytest.raises(ValueError, match="external_data"):
        validate_external_data(bad)
    with pytest.raises(ValueError, match="external_data"):
        KilnPartitioner(external_data=bad)


@pytest.mark.parametrize("bad", [1, b"weights", ["w"]])
def test_external_data_type_refused(bad):
    with pytest.raises(TypeError, match="external_data"):
        validate_external_data(bad)


@pytest.mark.parametrize("good", ["weights", "model-v1", "m.v2", "My Model_1"])
def test_external_data_names_accepted(good):
    assert validate_external_data(good) == good
    p = KilnPartitioner(external_data=good)
    assert parse_compile_specs(p.compile_specs) == ("fp32", good)


def test_compile_specs_round_trip():
    for prec in ("fp32", "fp16", "bf16"):
        p = KilnPartitioner(precision=prec)
        assert parse_compile_specs(p.compile_specs) == (prec, None)
        assert p.delegation_spec.backend_id == "KilnBackend"


def test_unknown_compile_spec_refused():
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    with pytest.raises(ValueError, match="unknown compile spec 'kiln.bogus'"):
        parse_compile_specs([CompileSpec("kiln.bogus", b"1")])
    with pytest.raises(ValueError, match="given twice"):
        parse_compile_specs([CompileSpec("kiln.precision", b"fp16")] * 2)
    # Other backends' specs are not ours to judge.
    assert parse_compile_specs([CompileSpec("target_device", b"cuda:0")]) == ("fp32", None)


def test_save_unknown_option_lists_valid(tmp_path):
    m, x = _mlp()
    with pytest.raises(TypeError) as e:
        save(m, tmp_path / "m.pte", x, precison="fp16")
    msg = str(e.value)
    assert "'precison'" in msg
    for name in EXPORT_OPTIONS:
        assert name in msg
    assert not (tmp_path / "m.pte").exists()


def test_save_with_the_inputs_in_the_path_says_the_order(tmp_path):
    m, x = _mlp()
    with pytest.raises(TypeError, match=r"got tuple \(the example inputs come third"):
        save(m, x, tmp_path / "m.pte")
    with pytest.raises(TypeError, match=r"got int$"):
        save(m, 3, x)


def test_export_unknown_keyword_is_a_type_error():
    m, x = _mlp()
    with pytest.raises(TypeError):
        export(m, x, precison="fp16")


def test_model_type_refused():
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        export("model.pt", (torch.randn(1),))


def test_module_needs_example_inputs():
    with pytest.raises(ValueError, match="example_inputs are required"):
        export(MLP().eval())


def test_example_inputs_type_refused():
    with pytest.raises(TypeError, match="example_inputs must be a tuple"):
        export(MLP().eval(), {"x": torch.randn(2, 32)})


def test_exported_program_takes_no_inputs():
    m, x = _mlp()
    ep = torch.export.export(m, x)
    with pytest.raises(ValueError, match="already carries"):
        export(ep, x)


def test_methods_dict_validated():
    m, x = _mlp()
    with pytest.raises(ValueError, match="non-empty identifier"):
        export({"": (m, x)})
    with pytest.raises(ValueError, match="empty"):
        export({})
    with pytest.raises(TypeError, match="method 'fwd'"):
        export({"fwd": m})
    with pytest.raises(ValueError, match="give each method's inputs"):
        export({"fwd": (m, x)}, x)


def test_partitioners_validated():
    m, x = _mlp()
    with pytest.raises(TypeError, match="list of ExecuTorch Partitioner"):
        export(m, x, partitioners=KilnPartitioner())
    with pytest.raises(ValueError, match="added by export itself"):
        export(m, x, partitioners=[KilnPartitioner()])
    with pytest.raises(TypeError, match="not an ExecuTorch Partitioner"):
        export(m, x, partitioners=[object()])


def test_save_path_validated(tmp_path):
    m, x = _mlp()
    with pytest.raises(IsADirectoryError):
        save(m, tmp_path, x)
    with pytest.raises(TypeError, match="path must be"):
        save(m, 3, x)


def test_training_mode_warns():
    m = MLP()  # training mode
    with pytest.warns(UserWarning, match=r"model.eval\(\)"):
        export(m, (torch.randn(2, 32),))
