"""Whole models: export with Kiln, save, load through kiln.load or ExecuTorch's Runtime, compare
with eager PyTorch on fresh random inputs."""

from __future__ import annotations

import kiln
import pytest
import torch
from conftest import assert_close, delegation_summary
from kiln.executorch import export, save
from kiln_test_models import MLP, EncoderBlock, MHABlock, ResNet18, WithAtan


def _roundtrip(tmp_path, model, example, fresh, **options):
    path = tmp_path / "model.pte"
    prog = save(model, path, example, **options)
    program = kiln.load(path)
    out = program.forward(*fresh)
    with torch.no_grad():
        expected = model(*fresh)
    return prog, out, expected


def test_mlp(tmp_path):
    model = MLP().eval()
    prog, out, expected = _roundtrip(tmp_path, model, (torch.randn(4, 32),), (torch.randn(4, 32),))
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s
    assert_close(out, expected)


def test_resnet18_shaped_cnn(tmp_path):
    model = ResNet18().eval()
    prog, out, expected = _roundtrip(
        tmp_path, model, (torch.randn(1, 3, 64, 64),), (torch.randn(1, 3, 64, 64),)
    )
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s
    assert_close(out, expected, scale=10)


def test_transformer_encoder_block(tmp_path):
    model = EncoderBlock().eval()
    prog, out, expected = _roundtrip(
        tmp_path, model, (torch.randn(2, 16, 32),), (torch.randn(2, 16, 32),)
    )
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s
    assert_close(out, expected, scale=10)


def test_causal_encoder_block_fp16(tmp_path):
    model = EncoderBlock(causal=True).eval()
    prog, out, expected = _roundtrip(
        tmp_path, model, (torch.randn(2, 8, 32),), (torch.randn(2, 8, 32),), precision="fp16"
    )
    assert delegation_summary(prog)["kiln"] == 1
    assert_close(out, expected, precision="fp16", scale=5)


def test_multihead_attention_module(tmp_path):
    model = MHABlock().eval()
    prog, out, expected = _roundtrip(
        tmp_path, model, (torch.randn(2, 8, 32),), (torch.randn(2, 8, 32),)
    )
    s = delegation_summary(prog)
    assert s["kiln"] >= 1, s
    assert_close(out, expected, scale=10)


def test_partial_delegation(tmp_path):
    model = WithAtan().eval()
    prog, out, expected = _roundtrip(tmp_path, model, (torch.randn(3, 16),), (torch.randn(3, 16),))
    s = delegation_summary(prog)
    assert s["kiln"] == 2, s
    assert any("atan" in op for op in s["ops"]), s
    assert_close(out, expected)


def test_argument_permutation_is_caught(tmp_path):
    """Two inputs of the same shape reach a partition in an order that is not the method's:
    a swapped binding would give a different result."""

    class M(torch.nn.Module):
        def forward(self, a, b):
            c = torch.atan(a)
            return b * 3.0 - c + 2 * a, c - b

    model = M()
    fresh = (torch.randn(4, 5), torch.randn(4, 5))
    prog, out, expected = _roundtrip(tmp_path, model, (torch.randn(4, 5), torch.randn(4, 5)), fresh)
    assert delegation_summary(prog)["kiln"] >= 1
    assert_close(out, expected)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision(tmp_path, precision):
    model = MLP().eval()
    prog, out, expected = _roundtrip(
        tmp_path, model, (torch.randn(4, 32),), (torch.randn(4, 32),), precision=precision
    )
    assert out[0].dtype == torch.float32  # inputs and outputs keep their dtypes
    assert_close(out, expected, precision=precision)
    # The engine really computes in reduced precision: not bit-identical to fp32.
    assert not torch.equal(out[0], expected)


def test_half_model(tmp_path):
    model = MLP().eval().half()
    x = torch.randn(4, 32).half()
    prog, out, expected = _roundtrip(tmp_path, model, (x,), (torch.randn(4, 32).half(),))
    assert out[0].dtype == torch.float16
    assert_close(out, expected)


def test_dynamic_batch(tmp_path):
    model = MLP().eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    path = tmp_path / "dyn.pte"
    save(model, path, (torch.randn(4, 32),), dynamic_shapes=({0: batch},))
    program = kiln.load(path)
    for n in (1, 5, 16):
        x = torch.randn(n, 32)
        with torch.no_grad():
            assert_close(program.forward(x), [model(x)])
    with pytest.raises(ValueError, match="dimension 0 is 17, above the largest size"):
        program.forward(torch.randn(17, 32))
    # Below the upper bound but outside the engine's range: Kiln refuses it at run time.
    with pytest.raises(kiln.KilnLoadError, match="ranges"):
        program.forward(torch.randn(4, 31))
    with pytest.raises(TypeError, match="must be torch.float32"):
        program.forward(torch.randn(4, 32).half())
    # The program still works after a refused call.
    x = torch.randn(3, 32)
    with torch.no_grad():
        assert_close(program.forward(x), [model(x)])


def test_dynamic_sequence_attention(tmp_path):
    """Dynamic sequence length through reshape/transpose/causal SDPA (symbolic sizes become
    Kiln shape codes)."""
    model = EncoderBlock(causal=True).eval()
    seq = torch.export.Dim("seq", min=1, max=32)
    path = tmp_path / "enc.pte"
    save(model, path, (torch.randn(2, 8, 32),), dynamic_shapes=({1: seq},))
    program = kiln.load(path)
    for n in (1, 17, 32):
        x = torch.randn(2, n, 32)
        with torch.no_grad():
            assert_close(program.forward(x), [model(x)], scale=10)


def test_dynamic_batch_and_image_size(tmp_path):
    model = ResNet18().eval()
    batch = torch.export.Dim("batch", min=1, max=3)
    hw = 32 * torch.export.Dim("k", min=1, max=2)
    path = tmp_path / "cnn.pte"
    dyn = ({0: batch, 2: hw, 3: hw},)
    prog = save(model, path, (torch.randn(2, 3, 64, 64),), dynamic_shapes=dyn)
    assert delegation_summary(prog)["kiln"] == 1
    program = kiln.load(path)
    for shape in [(1, 3, 32, 32), (3, 3, 64, 64)]:
        x = torch.randn(*shape)
        with torch.no_grad():
            assert_close(program.forward(x), [model(x)], scale=10)


def test_external_data_without_weights_warns(tmp_path):
    model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh())
    with pytest.warns(UserWarning, match="no w.ptd was written"):
        save(model, tmp_path / "m.pte", (torch.randn(2, 3),), external_data="w")
    assert not (tmp_path / "w.ptd").exists()
    x = torch.randn(2, 3)
    assert_close(kiln.load(tmp_path / "m.pte").forward(x), [model(x)])


def test_two_methods(tmp_path):
    mlp = MLP().eval()
    enc = EncoderBlock().eval()
    path = tmp_path / "two.pte"
    save(
        {"forward": (mlp, (torch.randn(2, 32),)), "encode": (enc, (torch.randn(1, 8, 32),))},
        path,
    )
    program = kiln.load(path)
    assert program.method_names == ["forward", "encode"]
    x, y = torch.randn(2, 32), torch.randn(1, 8, 32)
    with torch.no_grad():
        assert_close(program.forward(x), [mlp(x)])
        assert_close(program.run("encode", [y]), [enc(y)], scale=10)
    with pytest.raises(ValueError, match="forward, encode"):
        program.run("decode", [y])


def test_external_weights(tmp_path):
    model = MLP().eval()
    path = tmp_path / "ext.pte"
    save(model, path, (torch.randn(2, 32),), external_data="mlp_weights")
    ptd = tmp_path / "mlp_weights.ptd"
    assert ptd.is_file()
    inline = tmp_path / "inline.pte"
    save(model, inline, (torch.randn(2, 32),))
    # The weights moved out of the .pte.
    assert path.stat().st_size + 16 * 1024 < inline.stat().st_size
    x = torch.randn(2, 32)
    program = kiln.load(path, data_path=ptd)
    with torch.no_grad():
        assert_close(program.forward(x), [model(x)])
    with pytest.raises(kiln.KilnLoadError, match="data_path"):
        kiln.load(path)


def test_external_weights_without_ptd_through_runtime_is_an_exception(tmp_path):
    """Plain ExecuTorch (no kiln.load) must raise, not crash, without the .ptd."""
    model = MLP().eval()
    path = tmp_path / "ext.pte"
    save(model, path, (torch.randn(2, 32),), external_data="w")
    import kiln_executorch_runtime  # noqa: F401
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(str(path))
    with pytest.raises(Exception):  # noqa: B017 - pybind raises RuntimeError (version-dependent)
        program.load_method("forward")


def test_runtime_api_directly():
    model = EncoderBlock().eval()
    prog = export(model, (torch.randn(1, 8, 32),))
    import kiln_executorch_runtime  # noqa: F401 - registers KilnBackend
    from executorch.runtime import Runtime

    rt = Runtime.get()
    assert "KilnBackend" in rt.backend_registry.registered_backend_names
    method = rt.load_program(prog.buffer).load_method("forward")
    x = torch.randn(1, 8, 32)
    with torch.no_grad():
        assert_close(method.execute([x]), [model(x)], scale=10)


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        kiln.load(tmp_path / "missing.pte")
    p = tmp_path / "junk.pte"
    p.write_bytes(b"not a program at all")
    with pytest.raises(kiln.KilnLoadError, match="not a loadable"):
        kiln.load(p)
    model = MLP().eval()
    good = tmp_path / "m.pte"
    save(model, good, (torch.randn(2, 32),))
    with pytest.raises(FileNotFoundError, match=".ptd"):
        kiln.load(good, data_path=tmp_path / "nope.ptd")
    program = kiln.load(good)
    with pytest.raises(ValueError, match="takes 1 inputs"):
        program.forward(torch.randn(2, 32), torch.randn(2, 32))
