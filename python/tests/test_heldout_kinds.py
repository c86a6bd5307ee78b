"""Model kinds beyond the basic suite, exported with Kiln, loaded with kiln.load and compared
with eager PyTorch on fresh random inputs: EmbeddingBag (uniform bags, dynamic batch), a
depthwise + transposed-convolution CNN, a GPT-style decoder with a dynamic sequence length, and
ops Kiln leaves to ExecuTorch between Kiln partitions."""

from __future__ import annotations

import math

import kiln
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import assert_close, delegation_summary, engine_layers
from executorch.exir import to_edge_transform_and_lower
from kiln.executorch import KilnExportError, KilnPartitioner, save

VOCAB, WIDTH = 50, 16


def _load_and_compare(tmp_path, model, example, runs, scale=1.0, **options):
    """Saves the model, loads it with kiln.load and compares every run with eager PyTorch;
    returns the program manager."""
    path = tmp_path / "model.pte"
    prog = save(model, path, example, **options)
    program = kiln.load(path)
    for inputs in runs:
        out = program.forward(*inputs)
        with torch.no_grad():
            expected = model(*inputs)
        assert_close(out, expected, scale=scale)
    return prog


# --- EmbeddingBag


class LastHidden(nn.Module):
    """A transformers base model called on token ids, returning its last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).last_hidden_state


class BagClassifier(nn.Module):
    def __init__(self, mode="mean", padding_idx=None):
        super().__init__()
        self.bag = nn.EmbeddingBag(VOCAB, WIDTH, mode=mode, padding_idx=padding_idx)
        self.head = nn.Linear(WIDTH, 5)

    def forward(self, tokens, weights=None):
        return self.head(self.bag(tokens, per_sample_weights=weights))


def _tokens(batch, bag, padding_idx=None):
    t = torch.randint(0, VOCAB, (batch, bag))
    if padding_idx is not None:
        t[0] = padding_idx  # a bag of padding only
        t[1, ::2] = padding_idx  # a bag with some padding
    return t


@pytest.mark.parametrize(
    "mode, padding_idx, frozen",
    [("mean", None, False), ("sum", None, False), ("mean", 3, True), ("max", None, False)],
)
def test_embedding_bag_2d_dynamic_batch(tmp_path, mode, padding_idx, frozen):
    model = BagClassifier(mode, padding_idx).eval()
    if padding_idx is not None:
        # nn.EmbeddingBag zeroes the padding row; make it count if it were not excluded.
        model.bag.weight.data[padding_idx] = torch.randn(WIDTH)
    if frozen:
        # Weights that do not require grad decompose to _embedding_bag_forward_only, which
        # to_edge refuses unless the op is kept whole.
        model.requires_grad_(False)
    batch = torch.export.Dim("batch", min=1, max=16)
    runs = [(_tokens(b, 6, padding_idx),) for b in (3, 11)]
    prog = _load_and_compare(tmp_path, model, (_tokens(4, 6),), runs, dynamic_shapes=({0: batch},))
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s


def test_embedding_bag_per_sample_weights(tmp_path):
    model = BagClassifier("sum").eval()
    runs = [(_tokens(4, 5), torch.rand(4, 5)) for _ in range(2)]
    prog = _load_and_compare(tmp_path, model, runs[0], runs)
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s


def test_embedding_bag_constant_uniform_offsets(tmp_path):
    """1-D indices with offsets made in forward (a constant and an arange of constant step)."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(VOCAB, WIDTH, mode="sum")

        def forward(self, idx):
            a = self.bag(idx, torch.tensor([0, 4, 8]))
            b = self.bag(idx, torch.arange(0, idx.shape[0], 3))
            return a.sum(0) + b.sum(0)

    runs = [(torch.randint(0, VOCAB, (12,)),) for _ in range(2)]
    prog = _load_and_compare(tmp_path, M().eval(), runs[0], runs)
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s


def test_embedding_bag_runtime_offsets_is_refused(tmp_path):
    model = BagClassifier("sum").eval()

    class Ragged(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, idx, offsets):
            return self.m.head(self.m.bag(idx, offsets))

    example = (torch.randint(0, VOCAB, (10,)), torch.tensor([0, 3, 7]))
    with pytest.raises(NotImplementedError, match="EmbeddingBag with runtime offsets.*2-D"):
        save(Ragged().eval(), tmp_path / "ragged.pte", example)


# --- a batch norm over a transposed sequence


def test_patchtst_batch_norm_over_transposed_rows(tmp_path):
    """transformers' PatchTST normalizes [B * C, L, D] rows with BatchNorm1d between two
    transposes: the norm is split into a multiply and an add sharing one emission key, and the
    multiply moves in front of the transpose; the build failed ("value ... is read before any
    layer writes it") until the node order kept every node after what it reads."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.PatchTSTConfig(
        num_input_channels=3,
        context_length=64,
        patch_length=8,
        patch_stride=8,
        num_hidden_layers=2,
        d_model=32,
        num_attention_heads=4,
        ffn_dim=64,
    )
    model = transformers.PatchTSTModel(cfg).eval()
    for mod in model.modules():
        if isinstance(mod, nn.BatchNorm1d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)

    class Hidden(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(past_values=x).last_hidden_state

    series = lambda: torch.randn(1, 64, 3)  # noqa: E731
    prog = _load_and_compare(tmp_path, Hidden(model).eval(), (series(),), [(series(),)])
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s


# --- 3-D convolutions (video models)


def test_video_resnet_with_a_dynamic_batch_is_one_delegate(tmp_path):
    """torchvision's R3D-18 (Conv3d, BatchNorm3d, AdaptiveAvgPool3d): its 3-D convolutions run
    as 2-D ones over the output frames, in one Kiln delegate, at batch 2 and 1."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.video.r3d_18(weights=None, num_classes=10).eval()
    for mod in model.modules():
        if isinstance(mod, nn.BatchNorm3d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    clip = lambda b: torch.randn(b, 3, 4, 32, 32)  # noqa: E731
    batch = torch.export.Dim("batch", min=1, max=4)
    prog = _load_and_compare(
        tmp_path, model, (clip(2),), [(clip(2),), (clip(1),)], dynamic_shapes=({0: batch},)
    )
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s


def test_a_3d_convolution_kiln_cannot_take_fails_the_export(tmp_path):
    """ExecuTorch's convolution kernel runs 1-D and 2-D ones only: a transposed 3-D one, which
    Kiln does not take, must fail the export with the reason, not the program's first run."""
    model = nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), nn.ConvTranspose3d(4, 2, 2, stride=2))
    with pytest.raises(NotImplementedError, match="3-D convolution .*3-D transposed"):
        save(model.eval(), tmp_path / "t3d.pte", (torch.randn(1, 3, 4, 8, 8),))


# --- depthwise + transposed-convolution CNN


class DepthwiseUpsampler(nn.Module):
    """Stem conv, depthwise-separable blocks (BN, relu6, hardswish), a stride-2 transposed
    convolution back up (BN, relu6) and a 1x1 head."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, 2, 1, bias=False)
        self.bn0 = nn.BatchNorm2d(c)
        self.dw = nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.pw = nn.Conv2d(c, 2 * c, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(2 * c)
        self.dw2 = nn.Conv2d(2 * c, 2 * c, 5, 2, 2, groups=2 * c)
        self.up = nn.ConvTranspose2d(2 * c, c, 4, 2, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)
        self.up2 = nn.ConvTranspose2d(c, c, 3, 2, 1, output_padding=1, groups=c)
        self.head = nn.Conv2d(c, 4, 1)
        g = torch.Generator().manual_seed(3)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)

    def forward(self, x):
        x = F.relu6(self.bn0(self.stem(x)))
        x = F.hardswish(self.bn1(self.dw(x)))
        x = F.relu6(self.bn2(self.pw(x)))
        x = F.hardswish(self.dw2(x))
        x = F.relu6(self.bn3(self.up(x)))
        x = self.up2(x)
        return self.head(x)


def test_depthwise_transposed_cnn(tmp_path):
    model = DepthwiseUpsampler().eval()
    runs = [(torch.randn(2, 3, 32, 32),) for _ in range(2)]
    prog = _load_and_compare(tmp_path, model, runs[0], runs, scale=10)
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s


# --- GPT-style decoder


class DecoderBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln1(x)

        def split(y):
            return y.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        a = F.scaled_dot_product_attention(
            split(self.q(h)), split(self.k(h)), split(self.v(h)), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class TinyGPT(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, layers=2, max_len=32):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(DecoderBlock(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(t))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def test_gpt_decoder_dynamic_sequence(tmp_path):
    torch.manual_seed(0)
    model = TinyGPT().eval()
    seq = torch.export.Dim("seq", min=1, max=32)
    runs = [(torch.randint(0, 64, (2, t)),) for t in (5, 23)]
    prog = _load_and_compare(
        tmp_path,
        model,
        (torch.randint(0, 64, (2, 8)),),
        runs,
        scale=10,
        dynamic_shapes=({1: seq},),
    )
    s = delegation_summary(prog)
    # The position ids (an arange of the dynamic length) are ExecuTorch's, everything else is
    # Kiln's. The length's sym_size then stays outside Kiln too, so the head reshapes that read
    # it run as ExecuTorch views between several Kiln partitions.
    assert s["kiln"] >= 1, s
    assert {op.split(".")[1] for op in s["ops"]} <= {"arange", "sym_size"}, s


# --- ops Kiln leaves to ExecuTorch between Kiln partitions


class AtanProd(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(12, 12)
        self.b = nn.Linear(12, 12)
        self.c = nn.Linear(12, 6)

    def forward(self, x):
        y = F.silu(self.a(x))
        y = torch.atan(y * 8.0 / 3.0)  # ExecuTorch kernel
        y = torch.tanh(self.b(y)) * 0.5 + y
        y = torch.prod(y, dim=0, keepdim=True)  # ExecuTorch kernel
        return self.c(F.layer_norm(y, (12,))) + math.pi


def test_executorch_ops_between_kiln_partitions(tmp_path):
    model = AtanProd().eval()
    runs = [(torch.randn(5, 12),) for _ in range(2)]
    prog = _load_and_compare(tmp_path, model, runs[0], runs)
    s = delegation_summary(prog)
    assert s["kiln"] == 3, s
    assert any("atan" in op for op in s["ops"]) and any("prod" in op for op in s["ops"]), s


# --- constants no node reads


class LazyCacheStep(nn.Module):
    """A decoder step whose key cache starts as an empty tensor, as transformers' DynamicCache
    creates it, concatenated with the new keys (edge passes drop the empty operand and leave its
    constant unread), beside a registered table the forward never reads."""

    def __init__(self):
        super().__init__()
        self.k = nn.Linear(WIDTH, WIDTH)
        self.register_buffer("unused_table", torch.randn(50_000))

    def forward(self, x):
        past = torch.tensor([], dtype=x.dtype)
        keys = torch.cat([past, self.k(x)], dim=-2)
        return torch.softmax(x @ keys.transpose(-1, -2), dim=-1) @ keys


def test_constants_no_node_reads_leave_the_program(tmp_path):
    """Before, the empty constant stayed outside the engine as the program's only constant,
    and ExecuTorch's runtime refused the program ("InvalidProgram"); the unread table was
    stored in it."""
    model = LazyCacheStep().eval()
    x = torch.randn(2, 5, WIDTH)
    runs = [(torch.randn(2, 5, WIDTH),)]
    prog = _load_and_compare(tmp_path, model, (x,), runs)  # kiln.executorch.save
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s
    assert (tmp_path / "model.pte").stat().st_size < 50_000 * 4, "the unread table is stored"
    # the partitioner alone (to_edge_transform_and_lower, then to_executorch)
    ep = torch.export.export(model, (x,))
    direct = to_edge_transform_and_lower(ep, partitioner=[KilnPartitioner()]).to_executorch()
    path = tmp_path / "direct.pte"
    path.write_bytes(direct.buffer)
    out = kiln.load(path).forward(*runs[0])
    with torch.no_grad():
        assert_close(out, model(*runs[0]))


def test_transformers_decoder_with_its_default_cache(tmp_path):
    """transformers' CodeGen (codegen-350M-mono widths: GPT-J's attention, interleaved rotary on
    32 of 64 head dims, parallel residual) called as a user calls it, with its default cache:
    it builds a DynamicCache whose lazily created empty tensors are concatenated with the keys."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.CodeGenConfig(
        vocab_size=VOCAB * 20, n_embd=1024, n_head=16, rotary_dim=32, n_layer=1, n_positions=2048
    )
    cfg._attn_implementation = "eager"  # CodeGen has no sdpa form in transformers

    model = LastHidden(transformers.CodeGenModel(cfg)).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 48))
    runs = [(torch.randint(0, cfg.vocab_size, (1, 48)),)]
    prog = _load_and_compare(tmp_path, model, (ids,), runs)
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s


def test_transformers_encoder_decoder(tmp_path):
    """transformers' T5Model (t5-small widths: d 512, 8 heads of 64, FFN 2048) with its six
    decoder layers: the cross-attention k and v of every layer project the encoder's output, 12
    linears of one x that the builder merges into one GEMM (it failed to build with more than 8)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.T5Config(
        vocab_size=VOCAB * 20,
        d_model=512,
        d_ff=2048,
        num_heads=8,
        d_kv=64,
        num_layers=1,
        num_decoder_layers=6,
    )
    cfg._attn_implementation = "sdpa"

    class Hidden(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = transformers.T5Model(cfg)

        def forward(self, ids, decoder_ids):
            return self.model(input_ids=ids, decoder_input_ids=decoder_ids).last_hidden_state

    model = Hidden().eval()

    def ids():
        return (
            torch.randint(0, cfg.vocab_size, (1, 40)),
            torch.randint(0, cfg.vocab_size, (1, 12)),
        )

    prog = _load_and_compare(tmp_path, model, ids(), [ids()])
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s


# --- a branch on tensor values


class OverflowCheck(nn.Module):
    """The float16 overflow check of transformers' BART encoder layer: a Python branch on a
    value computed from the activations, which torch.export cannot trace."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        h = self.lin(x)
        if h.dtype == torch.float16 and not torch.isfinite(h).all():
            h = torch.clamp(h, -1000.0, 1000.0)
        return torch.relu(h)


def test_value_dependent_branch_names_the_line_and_the_remedy(tmp_path):
    import inspect

    lines, first = inspect.getsourcelines(OverflowCheck.forward)
    branch = first + next(i for i, s in enumerate(lines) if "isfinite" in s)
    model = OverflowCheck().eval()
    x = torch.randn(3, WIDTH)
    with pytest.raises(KilnExportError) as e:
        save(model.half(), tmp_path / "half.pte", (x.half(),), precision="fp16")
    msg = str(e.value)
    assert f"test_heldout_kinds.py:{branch}" in msg, msg
    assert "float16" in msg and "precision='fp16'" in msg, msg
    # the remedy the message gives: the float32 model, exported at fp16
    model = model.float()
    prog = save(model, tmp_path / "model.pte", (x,), precision="fp16")
    fresh = torch.randn(3, WIDTH)
    out = kiln.load(tmp_path / "model.pte").forward(fresh)
    with torch.no_grad():
        assert_close(out, model(fresh), precision="fp16")
    assert delegation_summary(prog)["kiln"] == 1


# --- a constant broadcast to sizes of two tensors


class TwoLengthBias(nn.Module):
    """T5's zero position bias of a layer without relative attention: zeros of [1, 1, query
    length, key length], two dynamic sizes read from two inputs."""

    def forward(self, q, k):
        bias = torch.zeros((1, 1, q.shape[1], k.shape[1]), dtype=q.dtype)
        scores = q.unsqueeze(1) @ k.unsqueeze(1).transpose(-1, -2) + bias
        return torch.softmax(scores, dim=-1) @ k.unsqueeze(1)


def test_full_of_sizes_from_two_tensors_dynamic(tmp_path):
    model = TwoLengthBias().eval()
    batch = torch.export.Dim("batch", min=1, max=4)
    lq = torch.export.Dim("lq", min=2, max=64)
    lk = torch.export.Dim("lk", min=2, max=64)
    example = (torch.randn(2, 5, WIDTH), torch.randn(2, 7, WIDTH))
    runs = [(torch.randn(3, 9, WIDTH), torch.randn(3, 4, WIDTH)), example]
    prog = _load_and_compare(
        tmp_path, model, example, runs, dynamic_shapes=({0: batch, 1: lq}, {0: batch, 1: lk})
    )
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s


class ChunkChannels(nn.Module):
    """Two halves of the channels (torchvision's ShuffleNetV2 block, EVA-02's SwiGLU): ExecuTorch's
    edge verifier fixes a dynamic batch of such a model at the example's size."""

    def forward(self, x):
        a, b = x.chunk(2, dim=1)
        return torch.relu(a) * 2 + b


def test_dynamic_batch_of_a_chunked_model(tmp_path, recwarn):
    """save lowers the model again without ExecuTorch's verifier, which fixed the batch; given
    an ExportedProgram (nothing to export again), it warns instead."""
    model = ChunkChannels().eval()
    batch = torch.export.Dim("batch", min=1, max=8)
    x = torch.randn(2, 4, 3, 3)
    runs = [(torch.randn(b, 4, 3, 3),) for b in (1, 3, 8)]
    prog = _load_and_compare(tmp_path, model, (x,), runs, dynamic_shapes=({0: batch},))
    assert delegation_summary(prog)["kiln"] == 1
    assert not [w for w in recwarn if "fixed it" in str(w.message)]
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    with pytest.warns(UserWarning, match=r"input 0 \('x'\) dimension 0 .*fixed it at 2"):
        save(ep, tmp_path / "ep.pte")
    program = kiln.load(tmp_path / "ep.pte")
    fresh = torch.randn(2, 4, 3, 3)
    assert_close(program.forward(fresh), model(fresh))
    with pytest.raises(ValueError, match="dimension 0 is 3"):
        program.forward(torch.randn(3, 4, 3, 3))


@pytest.mark.parametrize("family", ["gptj", "roformer"])
def test_transformers_interleaved_rotary_is_one_layer(tmp_path, family):
    """transformers' GPT-J (rotate_every_two over the first 32 of each head's 64 dims, the rest
    passed) and RoFormer (sinusoidal positions, every dim rotated in pairs): each q and k rotation
    is one rotary layer with interleaved = 1, none of the chain's slices, negs or stacks left,
    and the outputs match eager."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    layers = 2
    if family == "gptj":
        cfg = transformers.GPTJConfig(
            vocab_size=VOCAB * 20, n_embd=256, n_head=4, rotary_dim=32, n_layer=layers
        )
        model = transformers.GPTJModel(cfg)
    else:
        cfg = transformers.RoFormerConfig(
            vocab_size=VOCAB * 20,
            hidden_size=256,
            num_attention_heads=4,
            intermediate_size=512,
            num_hidden_layers=layers,
        )
        model = transformers.RoFormerModel(cfg)

    module = LastHidden(model).eval()
    ids = torch.randint(0, VOCAB * 20, (1, 40))
    runs = [(torch.randint(0, VOCAB * 20, (1, 40)),)]
    prog = _load_and_compare(tmp_path, module, (ids,), runs)
    assert delegation_summary(prog)["kiln"] == 1
    ls = engine_layers(tmp_path / "model.pte")
    rot = [la for la in ls if la["op"] == "rotary"]
    assert len(rot) == 2 * layers, [la["op"] for la in ls]
    assert all(la["attrs"]["interleaved"] == [1] for la in rot), rot[0]
    ops = [la["op"] for la in ls]
    assert "neg" not in ops and "cat" not in ops, ops
    # the slices left are the merged projection's q, k and v: none of step 2
    assert all(la["attrs"].get("step", [1]) == [1] for la in ls if la["op"] == "slice")


def test_transformers_mamba_is_one_delegate(tmp_path):
    """transformers' Mamba (selective state space: a causal depthwise conv1d, softplus exported as
    log1p(exp(x)), the scan unrolled over the tokens) as one Kiln delegate, nothing left to
    ExecuTorch (log1p was), each layer's unrolled scan one selective_scan layer (the per-token
    selects, multiply-adds and matmuls gone), and the outputs match eager."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(
        vocab_size=VOCAB * 20, hidden_size=64, state_size=8, num_hidden_layers=2
    )
    model = transformers.MambaModel(cfg)

    module = LastHidden(model).eval()
    ids = torch.randint(0, VOCAB * 20, (1, 16))
    runs = [(torch.randint(0, VOCAB * 20, (1, 16)),)]
    prog = _load_and_compare(tmp_path, module, (ids,), runs)
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s
    ops = [la["op"] for la in engine_layers(tmp_path / "model.pte")]
    assert "log1p" in ops, ops
    assert ops.count("selective_scan") == cfg.num_hidden_layers, ops
    assert "select" not in ops and len(ops) < 40 * cfg.num_hidden_layers, ops


def test_esm_gelu_written_with_erf(tmp_path):
    """transformers' ESM writes GELU as x * 0.5 * (1 + erf(x / sqrt(2))): erf is a Kiln op, and
    the builder recognizes the formula as gelu (one op fused after its linear, no erf left)."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.EsmConfig(
        vocab_size=33,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        position_embedding_type="rotary",
        pad_token_id=1,
        mask_token_id=32,
    )
    cfg._attn_implementation = "sdpa"
    module = LastHidden(transformers.EsmModel(cfg, add_pooling_layer=False)).eval()
    ids = lambda: torch.randint(4, 30, (1, 24))  # noqa: E731
    prog = _load_and_compare(tmp_path, module, (ids(),), [(ids(),)])
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s
    ops = [la["op"] for la in engine_layers(tmp_path / "model.pte")]
    assert "erf" not in ops and "gelu" in str(engine_layers(tmp_path / "model.pte")), ops


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_transformers_mixture_of_experts(tmp_path, family):
    """transformers' mixture-of-experts decoders (Mixtral: 4 experts, 2 per token; Qwen2-MoE with
    its shared expert) as a user builds them: their experts default to grouped_mm (torch.histc,
    which ExecuTorch's verifier refuses), so export switches them to batched_mm for the trace,
    says so, and leaves the model as it was; the router's topk runs in Kiln (one delegate), each
    expert projection is one gather_matmul reading the experts' weights in place (no index
    gathering a [tokens x 2, M, K] copy of them), and the outputs match eager."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    common = dict(
        vocab_size=VOCAB * 20,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        num_experts_per_tok=2,
    )
    if family == "mixtral":
        model = transformers.MixtralModel(transformers.MixtralConfig(num_local_experts=4, **common))
    else:
        model = transformers.Qwen2MoeModel(
            transformers.Qwen2MoeConfig(
                num_experts=4,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=64,
                **common,
            )
        )
    assert model.config._experts_implementation == "grouped_mm"

    module = LastHidden(model).eval()
    ids = torch.randint(0, VOCAB * 20, (1, 12))
    runs = [(torch.randint(0, VOCAB * 20, (1, 12)),)]
    with pytest.warns(UserWarning, match="batched_mm"):
        prog = _load_and_compare(tmp_path, module, (ids,), runs)
    assert model.config._experts_implementation == "grouped_mm"  # given back
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s
    ops = [la["op"] for la in engine_layers(tmp_path / "model.pte")]
    assert "topk" in ops, ops
    # gate_up and down of each layer's experts
    assert ops.count("gather_matmul") == 2 * common["num_hidden_layers"], ops
    assert "index" not in ops, ops


# --- bidirectional recurrent layers (the reversed direction is a flip of the sequence)


class BiRNN(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.rnn = getattr(nn, kind)(12, 16, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_bidirectional_rnn_is_one_delegate(tmp_path, kind):
    """nn.LSTM / nn.GRU with bidirectional=True export unrolled over the steps, the backward
    direction reading the sequence through torch.flip: one Kiln delegate, eager's values."""
    torch.manual_seed(7)
    model = BiRNN(kind).eval()
    runs = [(torch.randn(2, 6, 12),) for _ in range(2)]
    prog = _load_and_compare(tmp_path, model, runs[0], runs)
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and not s["ops"], s
