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

import io
import os
import sys

import kiln
import pytest
import torch
from conftest import delegation_summary, engine_layers
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
    ("segformer_b0", 1),  # efficient attention (spatial reduction), Mix-FFN, bilinear decode head
    ("falcon_rw", 1),  # ALiBi over a fused QKV
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


# --- reduced precision on the CPU reference (fp16 and bf16 engines)

PRECISION_FAST = [("efficientnet_b0", None), ("bert", 1), ("llama", 1)]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("name,depth", PRECISION_FAST, ids=[n for n, _ in PRECISION_FAST])
def test_zoo_reduced_precision(tmp_path, name, depth, precision):
    _zoo_case(tmp_path, name, depth, precision)


@pytest.mark.zoo
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("name", zoo.names())
def test_zoo_reduced_precision_all(tmp_path, name, precision):
    _zoo_case(tmp_path, name, 1, precision)


def _layer_ops(tmp_path, name, prog):
    """The engine's layers as (op, fused ops) pairs, read back from the written program."""
    return [(la["op"], tuple(la["fused"])) for la in _engine_layers(tmp_path, name, prog)]


def _engine_layers(tmp_path, name, prog):
    """The engines' layers of prog (written to tmp_path first)."""
    path = tmp_path / f"{name}.pte"
    with open(path, "wb") as f:
        prog.write_to_file(f)
    return engine_layers(path)


@pytest.mark.parametrize("name", ["mpnet", "beit_base"])
def test_zoo_eager_attention_becomes_sdpa(tmp_path, name):
    """MPNet's (position bias and padding mask, a divide) and BEiT's (relative-position bias,
    a multiply) attention written as matmul, softmax, matmul: at 16 bits the builder takes it as
    sdpa (docs/builder.md), no softmax or matmul left, and the values still match eager."""
    module, inputs, prog, part = export_zoo(name, 1, "fp16")
    check_whole(prog, part)
    ops = [op for op, _ in _layer_ops(tmp_path, name, prog)]
    assert ops.count("sdpa") == 1, ops
    assert "softmax" not in ops and "matmul" not in ops, ops
    fresh = zoo.make_inputs(name, module, seed=11)
    run_and_compare(tmp_path, name, module, prog, fresh, "fp16")


def _ops(layers, op):
    return sum(1 for o, _ in layers if o == op)


def _first(layers, op):
    return next((i for i, (o, _) in enumerate(layers) if o == op), len(layers))


# The builder's patterns on real library code (docs/builder.md), each a check that fails without
# its rewrite: (model, check of the float16 engine's layers, what it shows).
BUILDER_PATTERNS = {
    # F.normalize of q and k in every block: one rms_norm each, no pow/sum/clamp/div chain; the
    # cosine attention (heads of 32, the per-head logit scale, the relative-position bias and the
    # shifted windows' mask added in a [B, nW, H, L, L] view) as sdpa, the scale multiplying q
    "swinv2_tiny": (
        lambda ls: (
            _ops(ls, "rms_norm") == 2 * _ops(ls, "sdpa") > 0
            and _ops(ls, "mul") == _ops(ls, "sdpa")
            and _ops(ls, "pow") == _ops(ls, "clamp") == _ops(ls, "div") == 0
            and _ops(ls, "softmax") == _ops(ls, "matmul") == 0
        ),
        "cosine attention's L2 normalization as rms_norm, the attention as sdpa",
    ),
    # windowed attention (heads of 32, q scaled before the matmul, the relative-position bias,
    # the shifted windows' mask in a [B, nW, H, L, L] view): one sdpa per block, the scale its
    # own, the bias and mask one constant; the patch merging's four strided slices and their cat
    # one transpose; a shifted block's roll (an index per dim) and window partition one row
    # gather, its window reverse and roll back another (at most 2 index layers for every second
    # block, 4 before)
    "swin_t": (
        lambda ls: (
            _ops(ls, "sdpa") > 0
            and _ops(ls, "softmax") == _ops(ls, "matmul") == _ops(ls, "mul") == 0
            and _ops(ls, "slice") == _ops(ls, "cat") == 0
            and 0 < _ops(ls, "index") <= _ops(ls, "sdpa")
        ),
        "shifted-window attention as sdpa, patch merging as one transpose, rolls as row gathers",
    ),
    # the global response norm's x.norm(p=2, dim=(1, 2)): one vector_norm per block, no pow,
    # sum or root left
    "convnextv2_tiny": (
        lambda ls: _ops(ls, "vector_norm") > 0 and _ops(ls, "pow") == _ops(ls, "sum") == 0,
        "the response norm's 2-norm as vector_norm",
    ),
    # torch.einsum attention over windows and grid cells, k scaled before it: every one an
    # sdpa over the [B, G, H, L, E] heads, no batched matmul, softmax or scale left
    # ... and the block attention's window tokens to the grid attention's tokens (three
    # permutes that move whole rows of channels) as one row gather
    "maxvit_t": (
        lambda ls: (
            _ops(ls, "sdpa") > 0
            and _ops(ls, "softmax") == _ops(ls, "matmul") == 0
            and _ops(ls, "index") > 0
        ),
        "einsum attention as sdpa, window to grid tokens as a row gather",
    ),
    # Linear, flatten(0, 1), BatchNorm1d after every projection: folded, no multiply-add left
    "levit_128s": (
        lambda ls: _ops(ls, "mul") == 0 and _ops(ls, "batch_norm") == 0 and _ops(ls, "linear") > 0,
        "batch norms folded into the linears through reshapes",
    ),
    # k_proj has no bias: the three projections still merge into one linear and three selects
    "whisper_encoder": (
        lambda ls: _ops(ls, "select") == 3 * _ops(ls, "sdpa") > 0,
        "q/k/v merged with a zero bias for k",
    ),
    # rotary over the first 20 of each head's 80 dims: one rotary layer per operand, no cat
    # around it (the only slices are the heads of the merged projection); both run before the
    # head split (their tables are constants at static shapes), which then feeds sdpa as a view;
    # q, k and v one linear (the rotaries between head split and permute keep 2. from it: the
    # head projections merge, five linears a layer)
    "stablelm": (
        lambda ls: (
            _ops(ls, "rotary") == 2 * _ops(ls, "sdpa") > 0
            and _ops(ls, "slice") == 3 * _ops(ls, "sdpa")
            and _ops(ls, "cat") == 0
            and _ops(ls, "linear") == 5 * _ops(ls, "sdpa")
            and _first(ls, "rotary") < _first(ls, "permute")
        ),
        "partial rotary as one rotary layer, before the head split; q, k, v one linear",
    ),
    # apply_rotary_pos_emb after the head split, grouped-query attention: the rotaries of q and
    # k run on [B, L, H, E] before their permutes (the key's then a view of sdpa's operand); q,
    # k and v of grouped-query widths one linear, its heads sliced (five linears a layer)
    "llama": (
        lambda ls: (
            _ops(ls, "rotary") == 2 * _ops(ls, "sdpa") > 0
            and _ops(ls, "slice") == 3 * _ops(ls, "sdpa")
            and _ops(ls, "linear") == 5 * _ops(ls, "sdpa")
            and _first(ls, "rotary") < _first(ls, "permute")
        ),
        "rotary before the head split; q, k, v one linear",
    ),
    # baddbmm over heads flattened into the batch, the alibi added there, the scores viewed as
    # [B, H, L, S] for the causal mask and back: one sdpa per layer
    "bloom": (
        lambda ls: _ops(ls, "sdpa") > 0 and _ops(ls, "softmax") == _ops(ls, "matmul") == 0,
        "eager attention over flattened heads as sdpa",
    ),
    # efficient self-attention with heads of 32 and no mask: sdpa, no scores materialized
    "segformer_b0": (
        lambda ls: _ops(ls, "sdpa") > 0 and _ops(ls, "softmax") == 0,
        "unmasked heads of 32 as sdpa",
    ),
    # the packed per-head projection [B, L, H, 3E] chunked into q, k and v after the head
    # transpose: the slices read the projection, each then permuted on its own (q and k after
    # their rotaries)
    "gpt_neox": (
        lambda ls: (
            _ops(ls, "sdpa") > 0
            and _first(ls, "slice") < _first(ls, "rotary") < _first(ls, "permute")
        ),
        "q, k, v slices before the head transpose",
    ),
    # the transitions' 1x1 conv, then a 2x2 average pool: the pool runs first (a quarter of the
    # pixels for the conv)
    "densenet121": (
        lambda ls: (
            _ops(ls, "avg_pool2d") > 0
            and all(ls[i + 1][0] == "conv2d" for i, (o, _) in enumerate(ls) if o == "avg_pool2d")
        ),
        "average pools before their pointwise convs",
    ),
}


@pytest.mark.parametrize("name", sorted(BUILDER_PATTERNS))
def test_zoo_builder_patterns(tmp_path, name):
    """Each pattern is found in the real model's code at float16, and the values still match
    eager PyTorch."""
    check, what = BUILDER_PATTERNS[name]
    module, inputs, prog, part = export_zoo(name, 1, "fp16")
    check_whole(prog, part)
    layers = _layer_ops(tmp_path, name, prog)
    assert check(layers), f"{name}: {what}: {layers}"
    fresh = zoo.make_inputs(name, module, seed=13)
    run_and_compare(tmp_path, name, module, prog, fresh, "fp16")


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral", "gemma"])
def test_zoo_grouped_query_attention(tmp_path, name):
    """transformers' repeat_kv before a causal sdpa (query heads over fewer key/value heads, the
    causal mask a constant at the exported length): each layer's sdpa reads the key/value heads
    themselves, broadcast over the query heads of their group ([B, G, 1, S, E] against q's [B,
    G, R, L, E]), with is_causal and no mask, and no repeat or mask copy runs; the values still
    match eager."""
    module, inputs, prog, part = export_zoo(name, 1, "fp16")
    check_whole(prog, part)
    layers = _engine_layers(tmp_path, name, prog)
    sdpas = [la for la in layers if la["op"] == "sdpa"]
    assert sdpas and not [la for la in layers if la["op"] == "expand"], layers
    for la in sdpas:
        q, k, v = (t["dim_max"] for t in la["inputs"])
        assert len(la["inputs"]) == 3 and la["attrs"]["is_causal"] == [1], la
        assert len(q) == len(k) == 5 and k[2] == v[2] == 1 and q[2] > 1, la
    fresh = zoo.make_inputs(name, module, seed=13)
    run_and_compare(tmp_path, name, module, prog, fresh, "fp16")


def _export_built_in_float16(name):
    """The zoo model built in float16 (its own code's float16 paths), exported whole at fp16."""
    module, inputs, _ = zoo.build(name, depth=1, vocab=VOCAB, dtype=torch.float16)
    with torch.no_grad():
        ep = torch.export.export(module, inputs)
    part = KilnPartitioner(precision="fp16")
    prog = to_edge_transform_and_lower(ep, partitioner=[part]).to_executorch()
    check_whole(prog, part)
    return prog


def _matches_float32_eager(tmp_path, name, prog):
    """The float16 program's output against the float32 model's eager one, fresh inputs (float
    inputs rounded to float16 for both)."""
    ref, _, _ = zoo.build(name, depth=1, vocab=VOCAB)
    fresh = zoo.make_inputs(name, ref, seed=7)
    fresh16 = [t.half() if t.is_floating_point() else t for t in fresh]
    fresh = [t.float() if t.is_floating_point() else t for t in fresh16]
    path = tmp_path / f"{name}_fp16.pte"
    path.write_bytes(prog.buffer)
    got = kiln.load(path).forward(*fresh16)[0]
    with torch.no_grad():
        want = ref(*fresh)[0]
    assert got.dtype == torch.float16 and got.shape == want.shape
    err = (got.float() - want).abs().max().item()
    assert err <= TOL["fp16"] * max(1.0, want.abs().max().item()), err


FOLD_TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "build", "cuda_fold_test")


def _cuda_plan(tmp_path, name, prog):
    """Each Kiln engine of prog planned as the CUDA backend plans it at load (its layout and
    folds), on the CPU: (op, runs a kernel, the line) per head layer, from the CPU build's
    cuda_fold_test --layers (`make build`; `make test` builds it first)."""
    import subprocess

    from kiln._pte import read_program

    assert os.path.exists(FOLD_TOOL), f"{FOLD_TOOL} is missing: run `make build` first"
    buf = io.BytesIO()
    prog.write_to_file(buf)
    paths = []
    for m in read_program(buf.getvalue()).methods:
        for i, dl in enumerate(m.delegates):
            if dl.backend == "KilnBackend" and dl.data is not None:
                paths.append(tmp_path / f"{name}_{m.name}_{i}.kiln")
                paths[-1].write_bytes(dl.data)
    out = subprocess.run(
        [FOLD_TOOL, "--layers", *map(str, paths)], capture_output=True, text=True, check=True
    ).stdout
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 2 and f[0].isdigit():
            rows.append((f[1], "(no kernel)" not in line, line))
    return rows


def test_zoo_cuda_folds_eager_attention_and_overflow_clamp(tmp_path):
    """The CUDA backend's folds on real library code, planned on the CPU: timm's LeViT (eager
    attention as batched matmuls: q, k, v sliced from one projection and permuted to heads) reads
    them through strides, no permute runs; transformers' DeBERTa-v2 (bmm over heads
    flattened into the batch, k^T divided by sqrt(d)) runs neither the head permutes around its
    matmuls nor the division; T5 built in float16 runs each overflow guard (abs ... minimum) as
    one launch at its abs."""
    _, _, prog, part = export_zoo("levit_128s", 1, "fp16")
    check_whole(prog, part)
    rows = _cuda_plan(tmp_path, "levit", prog)
    mms = [r for r in rows if r[0] == "matmul"]
    assert mms and all("through views" in r[2] for r in mms), rows
    # (the attention subsampling's strided slices of the token grid, read by linears, run)
    assert not [r for r in rows if r[0] == "permute" and r[1]], rows

    _, _, prog, part = export_zoo("deberta_v2", 1, "fp16")
    check_whole(prog, part)
    rows = _cuda_plan(tmp_path, "deberta", prog)
    assert [r for r in rows if r[0] == "matmul" and "through views" in r[2]], rows
    divs = [r for r in rows if r[0] == "div"]
    assert divs and [r for r in divs if not r[1]], rows  # k^T's scale: the matmul's alpha

    rows = _cuda_plan(tmp_path, "t5", _export_built_in_float16("t5_encoder"))
    guards = [r for r in rows if r[0] in ("eq", "gt", "neg", "maximum", "minimum")]
    assert _count(rows, "abs") >= 2 and guards and not [r for r in guards if r[1]], rows


@pytest.mark.parametrize("name", ["llama", "stablelm", "gemma"])
def test_zoo_cuda_reads_merged_head_projections(tmp_path, name):
    """transformers' Llama (grouped-query widths), StableLM (a partial rotary) and Gemma (one kv
    head): q, k and v are one linear whose heads are sliced (docs/builder.md, head projections);
    planned as the CUDA backend plans it, on the CPU, no slice runs a kernel: the rotaries read
    q's and k's heads through views of the projection, the sdpa v's."""
    _, _, prog, part = export_zoo(name, 1, "fp16")
    check_whole(prog, part)
    rows = _cuda_plan(tmp_path, name, prog)
    slices, rots = [r for r in rows if r[0] == "slice"], [r for r in rows if r[0] == "rotary"]
    assert slices and not [r for r in slices if r[1]], rows
    assert len(rots) == 2 and all("reads x through views" in r[2] for r in rots), rows


def _count(rows, op):
    return sum(1 for r in rows if r[0] == op)


def test_zoo_t5_built_in_float16_is_taken_whole(tmp_path):
    """transformers' T5 run in float16 guards each layer's output against overflow (isinf, any,
    a where of two scalars, clamp with tensor bounds): the model built in float16 is one delegate
    and matches its float32 eager within float16's tolerance."""
    _matches_float32_eager(tmp_path, "t5_encoder", _export_built_in_float16("t5_encoder"))


def test_zoo_bloom_built_in_float16_attention_is_sdpa(tmp_path):
    """BLOOM built in float16 computes its scores in float32 (baddbmm with a float32 alibi,
    the result cast back before the causal mask, the softmax between casts): the builder still
    takes the attention as one sdpa per layer, and the program matches float32 eager within
    float16's tolerance."""
    prog = _export_built_in_float16("bloom")
    layers = _layer_ops(tmp_path, "bloom16", prog)
    assert _ops(layers, "sdpa") == 1 and _ops(layers, "softmax") == _ops(layers, "matmul") == 0, (
        layers
    )
    _matches_float32_eager(tmp_path, "bloom", prog)


def test_zoo_swinv2_built_in_float16_normalize_is_rms_norm(tmp_path):
    """Swin-V2 built in float16 (as `model.half()` gives it) computes F.normalize's norm in
    float32 (q and k cast up, the norm cast back): the builder still takes each normalization
    as one rms_norm, and the program matches float32 eager within float16's tolerance."""
    prog = _export_built_in_float16("swinv2_tiny")
    layers = _layer_ops(tmp_path, "swinv2_16", prog)
    assert _ops(layers, "rms_norm") == 2 * _ops(layers, "sdpa") > 0, layers
    assert _ops(layers, "vector_norm") == _ops(layers, "div") == _ops(layers, "clamp") == 0, layers
    _matches_float32_eager(tmp_path, "swinv2_tiny", prog)


# --- dynamic batch and sequence: one delegate, run at two other sizes

DYNAMIC_FAST = [
    ("gpt_neox", 1),  # rotary on a quarter of each head, parallel residual
    ("bert", 1),
    ("t5_encoder", 1),
    ("deberta_v2", 1),
    ("gpt2", 1),
    ("llama", 1),
    ("resnet50", None),
]


def _dynamic_case(tmp_path, name, depth):
    text = zoo.entry(name).family in ("encoder", "decoder") and zoo.entry(name).default_seq
    module, inputs, prog, part = export_zoo(
        name, depth, dynamic=True, batch=2, seq=16 if text else None
    )
    check_whole(prog, part)
    _, _, dyn = zoo.build(name, depth=1, vocab=VOCAB, batch=2, seq=16)
    batches = (1, 3) if 0 in dyn[0] else (2, 2)
    for batch, seq in zip(batches, (9, 33) if text else (None, None), strict=True):
        fresh = zoo.make_inputs(name, module, batch=batch, seq=seq, seed=batch)
        run_and_compare(tmp_path, name, module, prog, fresh, "fp32")


@pytest.mark.parametrize("name,depth", DYNAMIC_FAST, ids=[n for n, _ in DYNAMIC_FAST])
def test_zoo_dynamic(tmp_path, name, depth):
    _dynamic_case(tmp_path, name, depth)


@pytest.mark.zoo
@pytest.mark.parametrize("name", [n for n in zoo.names() if zoo.entry(n).dynamic is not None])
def test_zoo_dynamic_all(tmp_path, name):
    _dynamic_case(tmp_path, name, 1)


# --- channels-last


def test_zoo_channels_last_model_is_taken_whole(tmp_path):
    module, inputs, _ = zoo.build("resnet50")
    module = module.to(memory_format=torch.channels_last)
    with torch.no_grad():
        ep = torch.export.export(module, inputs)
    part = KilnPartitioner()
    prog = to_edge_transform_and_lower(ep, partitioner=[part]).to_executorch()
    check_whole(prog, part)
    run_and_compare(
        tmp_path, "resnet50_cl", module, prog, zoo.make_inputs("resnet50", module), "fp32"
    )


def test_zoo_channels_last_input_is_refused_with_the_remedy():
    module, inputs, _ = zoo.build("resnet50")
    x = inputs[0].to(memory_format=torch.channels_last)
    with torch.no_grad():
        ep = torch.export.export(module, (x,))
    with pytest.raises(
        ValueError,
        match=r"input 'x' has a non-contiguous memory layout.*\(0, 2, 3, 1\).*x\.contiguous\(\)",
    ):
        to_edge_transform_and_lower(ep, partitioner=[KilnPartitioner()])


# --- what the partitioner leaves out, and why (KilnPartitioner.rejected)


class _AtanInMiddle(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.atan(self.a(x))  # the op Kiln lacks, on this line
        return (self.b(torch.sin(y.double()).float()),)


def test_rejected_names_op_reason_and_source_line():
    import inspect

    m = _AtanInMiddle().eval()
    ep = torch.export.export(m, (torch.randn(2, 8),))
    part = KilnPartitioner()
    to_edge_transform_and_lower(ep, partitioner=[part])
    by_op = {r["op"]: r for r in part.rejected}
    assert "aten.atan.default" in by_op, part.rejected
    atan = by_op["aten.atan.default"]
    assert "no Kiln translation" in atan["reason"]
    line = inspect.getsourcelines(_AtanInMiddle.forward)[1] + 1
    assert atan["source"] == f"{__file__}:{line}", atan
    # float64 stays outside with that reason, never computed in another dtype
    f64 = [r for r in part.rejected if "float64" in r["reason"]]
    assert f64, part.rejected
    for r in part.rejected:
        assert set(r) == {"op", "reason", "source"} and r["reason"]


def test_whole_zoo_model_rejects_nothing():
    _, _, _, part = export_zoo("gpt2", 1)
    assert part.rejected == []


def test_constant_subgraphs_fold_and_match(tmp_path):
    """Values computed from constants alone (an arange and comparisons building a mask, a
    float64 detour) are folded at lowering time: nothing is left out and the values match."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("freq", torch.linspace(0.1, 2.0, 6, dtype=torch.float64))

        def forward(self, x):
            pos = torch.arange(x.shape[1])
            mask = (pos[:, None] >= pos[None, :]) & (pos[None, :] % 2 == 0)
            table = torch.cos(pos[:, None].double() * self.freq[None, :]).float()
            return (torch.where(mask, x @ x.transpose(0, 1), -x.sum()) + table.sum(),)

    m = M().eval()
    x = torch.randn(5, 5)
    ep = torch.export.export(m, (x,))
    part = KilnPartitioner()
    prog = to_edge_transform_and_lower(ep, partitioner=[part]).to_executorch()
    check_whole(prog, part)
    run_and_compare(tmp_path, "folded", m, prog, (torch.randn(5, 5),), "fp32")
