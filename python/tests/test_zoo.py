"""The real-model zoo (bench/zoo.py) through Kiln on the CPU: each model exports into ONE Kiln
delegate with nothing left to ExecuTorch (and nothing in KilnPartitioner.rejected), and the
program run through ExecuTorch matches eager PyTorch on fresh inputs.

The default run takes a fast subset at cut depth; the whole zoo is behind the ``zoo`` marker:

    $VENV/bin/python -m pytest python/tests/test_zoo.py -m zoo

Tolerances: outputs are compared relative to the largest magnitude of the reference,
max|kiln - eager| <= tol * max(1, max|eager|), with tol 1e-3 for fp32 engines (float32
throughout, other summation orders), 3e-2 for fp16 and 1e-1 for bf16 engines (activations and
weights rounded to 11 or 8 significant bits, layer after layer).
"""

from __future__ import annotations

import os
import sys

import kiln
import pytest
import torch
from conftest import delegation_summary
from executorch.exir import to_edge_transform_and_lower
from kiln.executorch import KilnPartitioner

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import zoo  # noqa: E402

TOL = {"fp32": 1e-3, "fp16": 3e-2, "bf16": 1e-1}
VOCAB = 1024  # the embedding table's rows (not a width): keeps the CPU run small

# (model, depth) of the default run: one of each family, cut to few layers.
FAST = [
    ("mobilenet_v3_large", None),
    ("vit_b_16", 1),
    ("bert", 1),
    ("gpt2", 1),
    ("llama", 1),
]


def export_zoo(name, depth, precision="fp32", dynamic=False, batch=1, seq=None):
    module, inputs, dyn = zoo.build(name, depth=depth, batch=batch, vocab=VOCAB, seq=seq)
    with torch.no_grad():
        ep = torch.export.export(module, inputs, dynamic_shapes=dyn if dynamic else None)
    part = KilnPartitioner(precision=precision)
    prog = to_edge_transform_and_lower(ep, partitioner=[part]).to_executorch()
    return module, inputs, prog, part


def run_and_compare(tmp_path, name, module, prog, fresh, precision):
    path = tmp_path / f"{name}.pte"
    with open(path, "wb") as f:
        prog.write_to_file(f)
    program = kiln.load(path)
    got = program.forward(*fresh)
    with torch.no_grad():
        want = module(*fresh)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape and g.dtype == w.dtype, (i, g.shape, w.shape, g.dtype)
        err = (g.float() - w.float()).abs().max().item()
        scale = max(1.0, w.float().abs().max().item())
        assert err <= TOL[precision] * scale, (
            f"{name} output {i}: max error {err:.3g} (scale {scale:.3g})"
        )


def check_whole(prog, part):
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and s["other"] == 0, s
    assert not s["ops"], f"ops left to ExecuTorch: {s['ops']}"
    assert not part.rejected, part.rejected


def _zoo_case(tmp_path, name, depth, precision="fp32"):
    module, inputs, prog, part = export_zoo(name, depth, precision)
    check_whole(prog, part)
    fresh = zoo.make_inputs(name, module, seed=7)
    run_and_compare(tmp_path, name, module, prog, fresh, precision)


@pytest.mark.parametrize("name,depth", FAST, ids=[n for n, _ in FAST])
def test_zoo_fast(tmp_path, name, depth):
    _zoo_case(tmp_path, name, depth)


@pytest.mark.zoo
@pytest.mark.parametrize("name", zoo.names())
def test_zoo_fp32(tmp_path, name):
    _zoo_case(tmp_path, name, 2)


def test_zoo_has_the_required_architectures():
    got = set(zoo.names())
    assert len(got) >= 24
    for need in (
        "resnet50",
        "mobilenet_v2",
        "mobilenet_v3_large",
        "efficientnet_b0",
        "regnet_y_400mf",
        "convnext_tiny",
        "densenet121",
        "vit_b_16",
        "deit_small",
        "swin_t",
        "maxvit_t",
        "bert",
        "roberta",
        "distilbert",
        "hf_vit",
        "clip_vision",
        "whisper_encoder",
        "wav2vec2",
        "gpt2",
        "llama",
        "qwen2",
        "mistral",
        "gemma",
    ):
        assert need in got, need
    families = {zoo.entry(n).family for n in got}
    assert {"cnn", "vit", "seg", "det", "encoder", "decoder", "audio"} <= families
    assert "timm" in {zoo.entry(n).library for n in got}


def test_zoo_weights_are_deterministic():
    a, ia, _ = zoo.build("bert", depth=1, vocab=VOCAB)
    b, ib, _ = zoo.build("bert", depth=1, vocab=VOCAB)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb), ka
    assert all(torch.equal(x, y) for x, y in zip(ia, ib, strict=True))
    c, _, _ = zoo.build("bert", depth=1, vocab=VOCAB, seed=1)
    assert not torch.equal(
        a.state_dict()["model.encoder.layer.0.attention.self.query.weight"],
        c.state_dict()["model.encoder.layer.0.attention.self.query.weight"],
    )


def test_zoo_widths_are_the_published_ones():
    m, _, _ = zoo.build("llama", depth=1, vocab=VOCAB)
    assert m.config.hidden_size == 2048 and m.config.num_key_value_heads == 8
    m, _, _ = zoo.build("bert", depth=1, vocab=VOCAB)
    assert m.config.hidden_size == 768 and m.config.num_attention_heads == 12
    with pytest.raises(KeyError, match="no zoo model 'nope'"):
        zoo.build("nope")
