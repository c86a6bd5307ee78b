"""Decoders whose KV cache is registered buffers updated in place export into ONE Kiln delegate
that owns the cache (a Kiln state, updated inside the engine), with nothing left to ExecuTorch;
the programs run through ExecuTorch match eager PyTorch token for token.

Also: the write forms Kiln takes (index_copy_, index_put with one index tensor, slice assignment
at a constant start, any other update of a buffer), a mutated buffer Kiln cannot own staying with
ExecuTorch (correct as before), positions past the cache refused without damaging it, separate
caches per loaded program, and transformers' LlamaForCausalLM with its StaticCache.
"""

from __future__ import annotations

import copy
import logging
import os
import sys

import kiln
import pytest
import torch
import torch.nn as nn
from conftest import delegation_summary
from executorch.exir import to_edge_transform_and_lower
from kiln._engine import Engine
from kiln.executorch import KilnPartitioner, save
from kiln.executorch.backend import build_engine
from kiln_test_models import RingCounter
from torch.export.graph_signature import InputKind, OutputKind

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "llm"))

from tiny_llama import Config, GreedyHead, TinyLlama, example_inputs  # noqa: E402

PROMPT = 12
DECODE = 64
# Logits: max |kiln - eager| <= TOL * max(1, max |eager|) (fp32 engines; float32 throughout).
TOL = 1e-4


def _lowered_modules(prog, method: str = "forward"):
    from executorch.exir.lowered_backend_module import executorch_call_delegate

    gm = prog.exported_program(method).graph_module
    return [
        getattr(gm, n.args[0].target)
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is executorch_call_delegate
    ]


def _check_whole(prog, n_states: int):
    """One Kiln delegate, no op left to ExecuTorch, no buffer left in the method (the cache is
    the delegate's), and its engine holds n_states states."""
    s = delegation_summary(prog)
    assert s["kiln"] == 1 and s["other"] == 0, s
    assert not s["ops"], f"ops left to ExecuTorch: {s['ops']}"
    report = getattr(prog, "kiln_report", None)
    if report is not None:
        assert not report.rejected, report.rejected
    sig = prog.exported_program().graph_signature
    assert not sig.buffers_to_mutate, sig.buffers_to_mutate
    assert not any(sp.kind == InputKind.BUFFER for sp in sig.input_specs), sig
    assert all(sp.kind == OutputKind.USER_OUTPUT for sp in sig.output_specs), sig
    (lowered,) = _lowered_modules(prog)
    inner = lowered.original_module.graph_signature
    assert len(inner.buffers_to_mutate) == n_states, inner
    built, _, _ = build_engine(lowered.original_module)
    engine = Engine(built.engine, dict(built.weights), device="cpu")
    assert engine.n_states == n_states
    return engine


def _close(got: torch.Tensor, want: torch.Tensor, what: str, tol: float = TOL):
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    err = (got.float() - want.float()).abs().max().item()
    scale = max(1.0, want.float().abs().max().item())
    assert err <= tol * scale, f"{what}: max error {err:.3g} (scale {scale:.3g})"


def _margin(logits: torch.Tensor) -> float:
    top = logits.float().reshape(-1).topk(2).values
    return float(top[0] - top[1])


def _generate(step, prompt: torch.Tensor, n_new: int):
    """Greedy decoding through ``step(tokens, input_pos) -> logits [1, vocab]``: the prompt in
    one call, then one token per call. Returns (new token ids, logits of each call)."""
    n = prompt.shape[1]
    logits = [step(prompt, torch.arange(n))]
    tokens = [int(logits[-1].argmax())]
    for i in range(n_new - 1):
        logits.append(step(torch.tensor([[tokens[-1]]]), torch.tensor([n + i])))
        tokens.append(int(logits[-1].argmax()))
    return tokens, logits


def _eager(module):
    def step(tokens, pos):
        with torch.no_grad():
            return module(tokens, pos)

    return step


def _program(program):
    return lambda tokens, pos: program.forward(tokens, pos)[0]


def _compare(got, want, what: str, tol: float = TOL):
    (k_tokens, k_logits), (e_tokens, e_logits) = got, want
    for i, (a, b) in enumerate(zip(k_logits, e_logits, strict=True)):
        _close(a, b, f"{what}: logits of call {i}", tol)
    margin = min(_margin(x) for x in e_logits)
    assert k_tokens == e_tokens, (
        f"{what}: kiln {k_tokens} != eager {e_tokens} (smallest top-2 margin {margin:.3g})"
    )


def _prompt(seed: int, n: int = PROMPT, vocab: int = Config().vocab) -> torch.Tensor:
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


# --- the tiny Llama-style decoder (examples/llm/tiny_llama.py), exported once


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    model = TinyLlama(seed=3).eval()
    fresh = copy.deepcopy(model)  # its own cache, untouched by the export
    args, dyn = example_inputs(model.c)
    path = tmp_path_factory.mktemp("llm") / "tiny_llama.pte"
    prog = save(model, path, args, dynamic_shapes=dyn, quiet=True)
    return fresh, prog, path


def test_llama_cache_is_owned_by_one_delegate_and_decodes_like_eager(llama):
    fresh, prog, path = llama
    _check_whole(prog, n_states=2 * fresh.c.n_layers)
    program = kiln.load(path)
    prompt = _prompt(11)
    want = _generate(_eager(copy.deepcopy(fresh)), prompt, DECODE)
    got = _generate(_program(program), prompt, DECODE)
    _compare(got, want, "tiny llama")


def test_greedy_head_returns_token_ids_computed_in_the_engine(tmp_path):
    """The step exported with its argmax: the engine's output is the int64 token id, and the ids
    of 24 greedy steps equal eager's argmax of the logits."""
    model = TinyLlama(seed=5).eval()
    fresh = copy.deepcopy(model)
    args, dyn = example_inputs(model.c)
    path = tmp_path / "greedy.pte"
    prog = save(GreedyHead(model), path, args, dynamic_shapes=dyn, quiet=True)
    _check_whole(prog, n_states=2 * model.c.n_layers)
    program = kiln.load(path)
    prompt = _prompt(13)
    want, _ = _generate(_eager(fresh), prompt, 24)
    n = prompt.shape[1]
    out = program.forward(prompt, torch.arange(n))[0]
    assert out.dtype == torch.int64 and out.numel() == 1
    got = [int(out)]
    for i in range(23):
        got.append(int(program.forward(torch.tensor([[got[-1]]]), torch.tensor([n + i]))[0]))
    assert got == want


def test_llama_bad_token_and_long_prompt_are_refused_naming_the_limit(llama):
    """A token id outside the vocabulary and a prompt longer than the exported maximum are
    refused with the limit in the message; the cache keeps its contents (decoding afterwards
    matches eager), and the last position of the cache works."""
    fresh, _prog, path = llama
    program = kiln.load(path)
    eager = copy.deepcopy(fresh)
    c = fresh.c
    prompt = _prompt(21, 5)
    _close(_program(program)(prompt, torch.arange(5)), _eager(eager)(prompt, torch.arange(5)), "p")
    with pytest.raises(kiln.KilnLoadError) as e:
        program.forward(torch.tensor([[c.vocab]]), torch.tensor([5]))
    assert "out of range" in str(e.value) and str(c.vocab) in str(e.value), str(e.value)
    # refused by the runtime before anything ran (every backend), not by the CPU kernel
    assert f"outside the vocabulary of {c.vocab} rows); nothing ran" in str(e.value), str(e.value)
    with pytest.raises(ValueError) as e:  # checked by kiln.load before ExecuTorch runs
        program.forward(
            torch.zeros(1, c.max_seq + 1, dtype=torch.int64), torch.arange(c.max_seq + 1)
        )
    assert f"above the largest size the program was exported for ({c.max_seq}" in str(e.value)
    tok = torch.tensor([[7]])
    _close(
        _program(program)(tok, torch.tensor([5])),
        _eager(eager)(tok, torch.tensor([5])),
        "after the refused calls",
    )
    fill = torch.arange(6, c.max_seq - 1)  # every row before the last (no row left unwritten)
    toks = _prompt(22, len(fill))
    _close(_program(program)(toks, fill), _eager(eager)(toks, fill), "the rows before the last")
    last = torch.tensor([c.max_seq - 1])
    _close(_program(program)(tok, last), _eager(eager)(tok, last), "the last position")


def test_llama_position_past_the_cache_is_refused_and_the_cache_kept(llama):
    fresh, _prog, path = llama
    program = kiln.load(path)
    eager = copy.deepcopy(fresh)
    max_seq = fresh.c.max_seq
    prompt = _prompt(12, 6)
    _close(_program(program)(prompt, torch.arange(6)), _eager(eager)(prompt, torch.arange(6)), "p")
    for bad in ([max_seq], [2, max_seq], [-max_seq - 1]):
        toks = torch.full((1, len(bad)), 5)
        with pytest.raises(kiln.KilnLoadError) as e:
            program.forward(toks, torch.tensor(bad))
        assert e.value.status_name == "KILN_ERR_INVALID_ARG", str(e.value)
        assert f"index {bad[-1]}" in str(e.value) and "out of range" in str(e.value), str(e.value)
        with pytest.raises(IndexError):  # eager refuses it too (after writing position 2)
            _eager(copy.deepcopy(eager))(toks, torch.tensor(bad))
    # Kiln checks every position before it writes: the refused calls wrote nothing (position 2
    # above included), and decoding goes on as eager without them.
    tok = torch.tensor([[7]])
    for i in range(6, 10):
        _close(
            _program(program)(tok, torch.tensor([i])),
            _eager(eager)(tok, torch.tensor([i])),
            f"decode at {i} after the refused calls",
        )


def test_llama_decode_before_prefill_is_refused_and_the_cache_kept(llama):
    """A decode whose earlier cache rows no call wrote (before its prefill, or past a skipped
    position) is refused naming the position and the row; nothing is written, and the sequence
    then runs as eager."""
    fresh, _prog, path = llama
    program = kiln.load(path)
    eager = copy.deepcopy(fresh)
    tok = torch.tensor([[7]])
    with pytest.raises(kiln.KilnLoadError) as e:
        program.forward(tok, torch.tensor([5]))
    assert e.value.status_name == "KILN_ERR_INVALID_ARG", str(e.value)
    assert "position 5 would leave row 0" in str(e.value), str(e.value)
    assert "before its prefill" in str(e.value), str(e.value)
    prompt = _prompt(13, 6)
    _close(_program(program)(prompt, torch.arange(6)), _eager(eager)(prompt, torch.arange(6)), "p")
    with pytest.raises(kiln.KilnLoadError) as e:  # position 6 skipped
        program.forward(tok, torch.tensor([7]))
    assert "position 7 would leave row 6" in str(e.value), str(e.value)
    for i in range(6, 10):
        _close(
            _program(program)(tok, torch.tensor([i])),
            _eager(eager)(tok, torch.tensor([i])),
            f"decode at {i} after the refused calls",
        )


def test_a_new_sequence_starts_at_position_0_without_a_reset(llama):
    """Positions past the current one are masked, so a new prompt written from position 0
    over an old sequence decodes like a fresh model."""
    fresh, _prog, path = llama
    program = kiln.load(path)
    _generate(_program(program), _prompt(51, 20), 30)  # fills positions 0..49
    prompt = _prompt(52, 7)
    want = _generate(_eager(copy.deepcopy(fresh)), prompt, 16)
    _compare(_generate(_program(program), prompt, 16), want, "second sequence")


def test_inspect_lists_the_cache_states(llama):
    import io
    import json
    from contextlib import redirect_stdout

    from kiln._cli import main

    fresh, _prog, path = llama
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["inspect", str(path), "--json"]) == 0
    (engine,) = json.loads(out.getvalue())["engines"]
    c = fresh.c
    states = engine["states"]
    assert len(states) == 2 * c.n_layers, states
    for st in states:
        assert st["dtype"] == "float32" and st["initial"] == "zeros", st
        assert st["dim_max"] == [1, c.n_kv_heads, c.max_seq, c.head_dim], st
        assert st["nbytes"] == c.n_kv_heads * c.max_seq * c.head_dim * 4, st


def test_two_loaded_programs_keep_separate_caches(llama):
    fresh, _prog, path = llama
    a, b = kiln.load(path), kiln.load(path)
    ea, eb = copy.deepcopy(fresh), copy.deepcopy(fresh)
    pa, pb = _prompt(21, 8), _prompt(22, 5)
    steps = [(a, ea, pa), (b, eb, pb)]
    state = []
    for prog, eager, prompt in steps:
        n = prompt.shape[1]
        got = _program(prog)(prompt, torch.arange(n))
        _close(got, _eager(eager)(prompt, torch.arange(n)), "prefill")
        state.append([int(got.argmax()), n])
    for i in range(12):  # interleaved decoding
        for j, (prog, eager, _) in enumerate(steps):
            tok, n = state[j]
            args = (torch.tensor([[tok]]), torch.tensor([n]))
            got = _program(prog)(*args)
            _close(got, _eager(eager)(*args), f"program {j} step {i}")
            state[j] = [int(got.argmax()), n + 1]


def test_prefill_and_decode_methods_share_one_cache(tmp_path):
    """Two methods of one program, ``prefill`` (a prompt of up to max_seq tokens) and ``decode``
    (one token), exported from the same module: one set of weights in the program, one cache
    that both methods update (the delegate shares the states of the methods of a loaded
    program), decoding like eager. Two loads keep two caches."""
    model = TinyLlama(seed=5).eval()
    fresh = copy.deepcopy(model)
    args, dyn = example_inputs(model.c)
    one = (torch.zeros(1, 1, dtype=torch.int64), torch.tensor([0]))
    path = tmp_path / "two_methods.pte"
    prog = save(
        {"prefill": (model, args, dyn), "decode": (model, one)},
        path,
        external_data="two_methods",
        quiet=True,
    )
    for method in ("prefill", "decode"):
        s = delegation_summary(prog, method)
        assert s["kiln"] == 1 and s["other"] == 0 and not s["ops"], (method, s)
    # The weights are stored once: the .ptd holds each distinct weight a single time.
    ptd = (tmp_path / "two_methods.ptd").stat().st_size
    n_weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert ptd < 1.5 * n_weights, (ptd, n_weights)
    ptd_path = tmp_path / "two_methods.ptd"
    a, b = kiln.load(path, data_path=ptd_path), kiln.load(path, data_path=ptd_path)
    runs = [(a, copy.deepcopy(fresh), _prompt(31, 9)), (b, copy.deepcopy(fresh), _prompt(32, 6))]
    state = []
    for program, eager, prompt in runs:  # both prompts first: a shared cache would mix them
        n = prompt.shape[1]
        got = program.run("prefill", [prompt, torch.arange(n)])[0]
        _close(got, _eager(eager)(prompt, torch.arange(n)), "prefill")
        state.append([int(got.argmax()), n])
    for i in range(16):  # then one token at a time, alternating between the loads
        for j, (program, eager, _) in enumerate(runs):
            tok, n = state[j]
            args = (torch.tensor([[tok]]), torch.tensor([n]))
            got = program.run("decode", list(args))[0]
            want = _eager(eager)(*args)
            _close(got, want, f"load {j}: decode step {i}")
            assert int(got.argmax()) == int(want.argmax()), (j, i)
            state[j] = [int(want.argmax()), n + 1]


def test_llama_fp16_model(tmp_path):
    """model.half(): an fp16 cache, fp16 compute; compared with eager fp16 teacher-forced (the
    two round differently, so greedy paths may part at a near tie)."""
    c = Config(n_layers=1, max_seq=32)
    model = TinyLlama(c, seed=5).eval().half()
    fresh = copy.deepcopy(model)
    args, dyn = example_inputs(c)
    prog = save(model, tmp_path / "fp16.pte", args, dynamic_shapes=dyn, quiet=True)
    _check_whole(prog, n_states=2)
    program = kiln.load(tmp_path / "fp16.pte")
    prompt = _prompt(31, 6, c.vocab)
    step_k, step_e = _program(program), _eager(fresh)
    got, want = step_k(prompt, torch.arange(6)), step_e(prompt, torch.arange(6))
    _close(got, want, "fp16 prefill", tol=5e-3)
    assert got.dtype == torch.float16
    tok = int(want.argmax())
    for i in range(6, 20):
        args = (torch.tensor([[tok]]), torch.tensor([i]))
        got, want = step_k(*args), step_e(*args)
        _close(got, want, f"fp16 decode at {i}", tol=5e-3)
        tok = int(want.argmax())


# --- the write forms, and other updates of buffers


class Writes(nn.Module):
    """Buffers updated every way Kiln takes, some read before their update."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(4)
        self.register_buffer("heads", torch.zeros(1, 3, 16, 4))  # index_copy_ at dim 2
        self.register_buffer("rows", torch.randn(16, 4, generator=g))  # buf[pos] = v (dim 0)
        self.register_buffer("bcast", torch.zeros(2, 16, 4))  # values broadcast over dim 0
        self.register_buffer("vec", torch.zeros(2, 16, 4))  # values of rank 1, broadcast
        self.register_buffer("ones", torch.ones(16, 4))  # buf[pos] = 0.0: a scalar value
        self.register_buffer("window", torch.zeros(1, 8, 4))  # slice assignment at 2
        self.register_buffer("last", torch.zeros(16, 4))  # buf[-1] = v: select_scatter
        self.register_buffer("acc", torch.ones(4))  # acc += ...: not a row write
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))  # a counter

    def forward(self, x, pos):  # x [L, 4], pos [L]
        before = self.acc * 2.0 + self.rows.sum(0)  # the old values, read before the writes
        rows = torch.where(pos < 0, pos + 16, pos)  # index_copy_ takes no negative index
        self.heads.index_copy_(2, rows, x[None, None].expand(1, 3, -1, 4) * 0.5)
        self.rows[pos] = x
        self.bcast[:, pos] = x[None] + 1.0
        self.vec[:, pos] = x[0]
        self.ones[pos] = 0.0
        self.window[:, 2 : 2 + x.shape[0]] = x[None] * 3.0
        self.last[-1] = x[0]
        self.acc.add_(x.sum(0))
        self.calls.add_(1)
        total = (
            self.heads.sum((0, 1))
            + self.rows
            + self.bcast.sum(0)
            + self.vec.sum(0) * self.ones
            + self.last
            + self.window.sum(1)[:, None, :].sum(0)
        )
        return total + before, self.calls * 1


def test_write_forms_are_owned_and_match_eager(tmp_path):
    model = Writes().eval()
    eager = copy.deepcopy(model)
    seq = torch.export.Dim("seq", min=1, max=6)
    args = (torch.randn(3, 4), torch.tensor([1, 4, 7]))
    prog = save(model, tmp_path / "w.pte", args, dynamic_shapes=({0: seq}, {0: seq}), quiet=True)
    engine = _check_whole(prog, n_states=9)
    program = kiln.load(tmp_path / "w.pte")
    g = torch.Generator().manual_seed(9)
    calls = [
        (torch.randn(3, 4, generator=g), torch.tensor([1, 4, 7])),
        (torch.randn(1, 4, generator=g), torch.tensor([-2])),  # negative: from the end
        (torch.randn(5, 4, generator=g), torch.tensor([0, 15, 3, 9, 2])),
        (torch.randn(2, 4, generator=g), torch.tensor([6, 8])),
    ]
    for i, (x, pos) in enumerate(calls):
        with torch.no_grad():
            want = eager(x, pos)
        got = program.forward(x, pos)
        _close(got[0], want[0], f"call {i}", tol=1e-5)
        assert torch.equal(got[1], want[1]), (i, got[1], want[1])
    # The engine alone: states persist across executes and reset to their initial values.
    x, pos = calls[0]
    first = engine.run(x, pos)
    engine.run(x, pos)
    assert not torch.equal(engine.run(x, pos)[0], first[0])
    engine.reset_states()
    again = engine.run(x, pos)
    assert torch.equal(again[0], first[0]) and int(again[1]) == 1


class AddRows(nn.Module):
    def __init__(self, read_outside: bool):
        super().__init__()
        self.read_outside = read_outside
        self.register_buffer("cache", torch.zeros(8, 4))
        self.lin = nn.Linear(4, 4)

    def forward(self, x, pos):
        old = torch.atan(self.cache) if self.read_outside else None  # atan: not Kiln
        if self.read_outside:
            self.cache.index_copy_(0, pos, self.lin(x))
        else:
            self.cache.index_put_((pos,), self.lin(x), accumulate=True)  # a scatter-add
        out = torch.relu(self.cache) * 2.0
        return out if old is None else out + old


@pytest.mark.parametrize("read_outside", [False, True], ids=["update_not_kiln", "read_outside"])
def test_buffer_kiln_cannot_own_stays_with_executorch(tmp_path, read_outside):
    model = AddRows(read_outside).eval()
    eager = copy.deepcopy(model)
    args = (torch.randn(2, 4), torch.tensor([1, 5]))
    with torch.no_grad():  # ExecuTorch's write-back of a buffer refuses a traced autograd graph
        ep = torch.export.export(model, args)
    part = KilnPartitioner()
    prog = to_edge_transform_and_lower(ep, partitioner=[part]).to_executorch()
    s = delegation_summary(prog)
    assert s["kiln"] >= 1, s
    assert [b["buffer"] for b in part.buffers_left] == ["cache"], part.buffers_left
    reason = part.buffers_left[0]["reason"]
    assert ("outside the Kiln partition reads it" if read_outside else "left to ExecuTorch") in (
        reason
    ), reason
    assert "cache" in prog.exported_program().graph_signature.buffers_to_mutate.values()
    path = tmp_path / "m.pte"
    with open(path, "wb") as f:
        prog.write_to_file(f)
    program = kiln.load(path)
    g = torch.Generator().manual_seed(2)
    for i in range(3):
        x, pos = torch.randn(2, 4, generator=g), torch.tensor([i, 7 - i])
        with torch.no_grad():
            want = eager(x, pos)
        _close(program.forward(x, pos)[0], want, f"call {i}", tol=1e-5)


def test_symbolic_slice_start_is_refused_with_the_remedy():
    from kiln.executorch import _lowering as low
    from kiln.executorch.partitioner import constant_tensors

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c", torch.zeros(8, 4))

        def forward(self, x, start):
            s = start.item()
            torch._check(s >= 0)
            torch._check(s + x.shape[0] <= 8)
            self.c[s : s + x.shape[0]] = x
            return self.c * 1.0

    seq = torch.export.Dim("seq", max=4)
    args = (torch.randn(2, 4), torch.tensor(1))
    ep = torch.export.export(M(), args, dynamic_shapes=({0: seq}, None))
    edge = to_edge_transform_and_lower(ep).exported_program()
    (n,) = [x for x in edge.graph.nodes if low.target_name(x) == "aten.slice_scatter.default"]
    c = low.check_node(n, low.Ranges(edge.range_constraints), constant_tensors(edge))
    assert not c.ok and "symbolic start" in c.reason and "index_copy_" in c.reason, c.reason


# --- transformers' LlamaForCausalLM with StaticCache


def _hf_llama(seed: int):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("transformers.integrations.executorch")
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # weights large enough that the logits are not near ties
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5)
    model.generation_config.cache_implementation = "static"
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _hf_generate(model, prompt, n_new):
    """transformers' own greedy generate: token ids and the logits of each step."""
    with torch.no_grad():
        out = model.generate(
            prompt,
            max_new_tokens=n_new,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[0, prompt.shape[1] :].tolist(), [x for x in out.logits]


def test_transformers_llama_static_cache(tmp_path):
    """transformers' export wrapper (strict trace, as it defaults to) -> one Kiln delegate owning
    the StaticCache; greedy tokens and logits equal to transformers' generate."""
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model = _hf_llama(5)
    wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=96)
    seq = torch.export.Dim("seq", max=64)
    with torch.no_grad():
        ep = wrapper.export(
            input_ids=torch.zeros(1, 4, dtype=torch.int64),
            cache_position=torch.arange(4),
            dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}},
            strict=True,
        )
    prog = save(ep, tmp_path / "hf.pte", quiet=True)
    # Per layer keys, values and the cache's length counter; no method reads the counter, so
    # the engine's layers write only the keys and values (the counter's updates are dropped).
    _check_whole(prog, n_states=3 * model.config.num_hidden_layers)
    uses = _state_uses(prog, "forward")
    assert len(uses) == 2 * model.config.num_hidden_layers, uses
    assert not any("cumulative" in n for n in uses), uses
    program = kiln.load(tmp_path / "hf.pte")
    prompt = _prompt(41, 10)
    want = _hf_generate(model, prompt, DECODE)
    got = _generate(lambda t, p: program.forward(t, p)[0][:, -1], prompt, DECODE)
    _compare(got, want, "transformers llama")


def test_transformers_wrapper_module_exports_with_a_strict_retry(tmp_path, caplog):
    """The wrapper module given to kiln's save: torch.export's default non-strict trace of it
    does not lower; kiln says so, gives the module its buffers back and exports it strictly."""
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    model = _hf_llama(4)
    wrapper = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=32)
    seq = torch.export.Dim("seq", max=16)
    args = (torch.zeros(1, 4, dtype=torch.int64), None, torch.arange(4))
    with caplog.at_level(logging.WARNING, logger="kiln.executorch"):
        prog = save(
            wrapper, tmp_path / "w.pte", args, dynamic_shapes=({1: seq}, None, {0: seq}), quiet=True
        )
    retried = [r for r in caplog.records if "strict=True" in r.getMessage()]
    if retried:  # a torch whose non-strict trace of the wrapper lowers needs no retry
        assert "non-strict" in retried[0].getMessage()
    for name, b in wrapper.named_buffers():
        assert b.grad_fn is None and not b.requires_grad, name
        if "cache" in name:
            assert not b.any(), f"{name} was left modified by the export"
    _check_whole(prog, n_states=3 * model.config.num_hidden_layers)
    program = kiln.load(tmp_path / "w.pte")
    prompt = _prompt(42, 6)
    step = lambda t, p: program.forward(t, None, p)[0][:, -1]  # noqa: E731
    _compare(_generate(step, prompt, 16), _hf_generate(model, prompt, 16), "wrapper module")


def test_transformers_llama_fuses_rms_norm_and_rotary(tmp_path):
    """The builder's LLM patterns on a real export: every LlamaRMSNorm becomes one rms_norm layer
    and every rotate-half rotary one rotary layer (none of their small ops left), and the
    program still generates what transformers does."""
    from kiln._cli._capi import describe
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model = _hf_llama(6)
    wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=64)
    seq = torch.export.Dim("seq", max=32)
    with torch.no_grad():
        ep = wrapper.export(
            input_ids=torch.zeros(1, 4, dtype=torch.int64),
            cache_position=torch.arange(4),
            dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}},
            strict=True,
        )
    prog = save(ep, tmp_path / "fused.pte", quiet=True)
    n = model.config.num_hidden_layers
    (lowered,) = _lowered_modules(prog)
    built, _, _ = build_engine(lowered.original_module)
    ops = [la["op"] for la in describe(built.engine)["layers"]]
    # two norms per decoder layer and the final one; rotary for q and k in every layer
    assert ops.count("rms_norm") == 2 * n + 1, ops
    assert ops.count("rotary") == 2 * n, ops
    for gone in ("rsqrt", "pow", "neg", "slice"):
        assert gone not in ops, (gone, ops)
    program = kiln.load(tmp_path / "fused.pte")
    prompt = _prompt(43, 8)
    want = _hf_generate(model, prompt, 12)
    got = _generate(lambda t, p: program.forward(t, p)[0][:, -1], prompt, 12)
    _compare(got, want, "transformers llama, fused norms and rotary")


class _Encode(nn.Module):
    """Writes a memory another method reads (an encoder's cross-attention cache) and keeps a
    counter of its own."""

    def __init__(self):
        super().__init__()
        self.register_buffer("memory", torch.zeros(2, 4))
        self.register_buffer("encodes", torch.zeros(1))
        self.lin = nn.Linear(4, 4)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(4, 4, generator=torch.Generator().manual_seed(3)))

    def forward(self, x):
        self.memory.copy_(self.lin(x))
        self.encodes.add_(1)
        return self.memory * self.encodes


class _Decode(nn.Module):
    """Reads and decays the encoder's memory (the same buffer) beside a cache of its own."""

    def __init__(self, enc: _Encode):
        super().__init__()
        self.register_buffer("memory", enc.memory)
        self.register_buffer("cache", torch.zeros(8, 4))

    def forward(self, y, pos):
        self.cache.index_copy_(0, pos, y + self.memory[1:])
        self.memory.mul_(0.5)
        return self.cache.sum(0, keepdim=True) + self.memory.sum(0, keepdim=True)


def test_methods_share_the_states_they_have_in_common(tmp_path):
    """Two methods whose states differ (encode: memory and its own counter; decode: memory and
    its own cache) share the one they have in common, whichever runs first: decode reads what
    encode wrote and encode what decode left, each keeps its own, and both match eager call
    after call."""
    enc = _Encode().eval()
    dec = _Decode(enc).eval()
    fresh_enc, fresh_dec = copy.deepcopy((enc, dec))  # (one memory tensor, as in the modules)
    prog = save(
        {
            "encode": (enc, (torch.randn(2, 4),)),
            "decode": (dec, (torch.randn(1, 4), torch.tensor([0]))),
        },
        tmp_path / "enc_dec.pte",
        quiet=True,
    )
    for method in ("encode", "decode"):
        s = delegation_summary(prog, method)
        assert s["kiln"] == 1 and s["other"] == 0, (method, s)
    for first in ("encode", "decode"):
        program = kiln.load(tmp_path / "enc_dec.pte")
        e_ref, d_ref = copy.deepcopy((fresh_enc, fresh_dec))
        g = torch.Generator().manual_seed(17)
        calls = ["encode", "decode", "decode", "encode", "decode", "encode", "decode"]
        if first == "decode":
            calls = ["decode", *calls]
        for i, method in enumerate(calls):
            if method == "encode":
                args = [torch.randn(2, 4, generator=g)]
                ref = e_ref
            else:
                args = [torch.randn(1, 4, generator=g), torch.tensor([i % 8])]
                ref = d_ref
            got = program.run(method, args)[0]
            with torch.no_grad():
                want = ref(*args)
            _close(got, want, f"{first} first: call {i} ({method})", 1e-5)
    # two loads alive at once keep two sets of states: p2 does not see p1's encode
    p1, p2 = kiln.load(tmp_path / "enc_dec.pte"), kiln.load(tmp_path / "enc_dec.pte")
    e1, d1 = copy.deepcopy((fresh_enc, fresh_dec))
    _, d2 = copy.deepcopy((fresh_enc, fresh_dec))
    x, y, pos = torch.randn(2, 4), torch.randn(1, 4), torch.tensor([3])
    with torch.no_grad():
        _close(p1.run("encode", [x])[0], e1(x), "load 1: encode", 1e-5)
        _close(p2.run("decode", [y, pos])[0], d2(y, pos), "load 2: decode", 1e-5)
        _close(p1.run("decode", [y, pos])[0], d1(y, pos), "load 1: decode", 1e-5)


class _OtherMemory(nn.Module):
    """A buffer of the encoder's name ("memory") but another shape, updated."""

    def __init__(self):
        super().__init__()
        self.register_buffer("memory", torch.zeros(3, 4))

    def forward(self, y):
        self.memory.add_(y)
        return self.memory.sum(0, keepdim=True)


def test_same_named_buffers_of_other_shapes_are_not_shared_and_say_so(tmp_path, capfd):
    """Two methods whose buffers share a name but not a shape keep separate buffers (each as in
    eager), and the delegate's warning names the buffer and both shapes."""
    enc, other = _Encode().eval(), _OtherMemory().eval()
    e_ref, o_ref = copy.deepcopy(enc), copy.deepcopy(other)
    save(
        {"encode": (enc, (torch.randn(2, 4),)), "other": (other, (torch.randn(1, 4),))},
        tmp_path / "clash.pte",
        quiet=True,
    )
    program = kiln.load(tmp_path / "clash.pte")
    g = torch.Generator().manual_seed(19)
    for i in range(3):
        x, y = torch.randn(2, 4, generator=g), torch.randn(1, 4, generator=g)
        with torch.no_grad():
            _close(program.run("encode", [x])[0], e_ref(x), f"encode {i}", 1e-5)
            _close(program.run("other", [y])[0], o_ref(y), f"other {i}", 1e-5)
    err = capfd.readouterr().err
    assert "shares no state with an earlier method" in err and "'b_memory'" in err, err[-2000:]
    assert "one dtype and shape" in err, err[-2000:]


class _ReadMemory(nn.Module):
    """Reads the encoder's memory without updating it."""

    def __init__(self, enc: _Encode):
        super().__init__()
        self.register_buffer("memory", enc.memory)

    def forward(self, y):
        return y + self.memory.sum(0, keepdim=True)


def test_buffer_read_only_by_a_method_another_updates_is_warned_about(tmp_path, caplog):
    """torch.export makes a buffer the method only reads a constant of that method: export
    says so, naming the buffer, both methods and the remedy."""
    enc = _Encode().eval()
    with caplog.at_level(logging.WARNING, logger="kiln.executorch"):
        save(
            {
                "encode": (enc, (torch.randn(2, 4),)),
                "read": (_ReadMemory(enc), (torch.randn(1, 4),)),
            },
            tmp_path / "ro.pte",
            quiet=True,
        )
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "method 'read' reads buffer 'memory'" in text and "'encode'" in text, text
    assert "output and an input" in text, text


# --- buffers the program writes and never reads


class _Counted(nn.Module):
    """A cache the output reads, and a step counter the forward overwrites and never reads (as
    transformers' StaticCache keeps one per layer)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(8, 4))
        self.register_buffer("count", torch.zeros(1))
        self.lin = nn.Linear(4, 4)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(4, 4, generator=torch.Generator().manual_seed(7)))

    def forward(self, x, pos):
        self.cache.index_copy_(0, pos, self.lin(x))
        self.count.copy_(pos.float() + 1)
        # the new value, read in the same call: no earlier call's value is needed
        return self.cache.sum(0, keepdim=True) + self.count


class _Accum(_Counted):
    """The counter advanced from its stored value: read, so its updates stay."""

    def forward(self, x, pos):
        self.cache.index_copy_(0, pos, self.lin(x))
        self.count.copy_(self.count + pos.float())
        return self.cache.sum(0, keepdim=True) * self.count


class _Bump(nn.Module):
    """Reads and advances the same counter (the same buffer name: the methods share the state)."""

    def __init__(self, owner: _Counted):
        super().__init__()
        self.register_buffer("count", owner.count)

    def forward(self, x):
        self.count.add_(1)
        return x * self.count


def _state_uses(prog, method: str) -> dict[str, int]:
    """Per state name, how many layers of the method's Kiln engine read or write it."""
    from kiln._cli import _capi

    uses: dict[str, int] = {}
    for lowered in _lowered_modules(prog, method):
        desc = _capi.describe(bytes(lowered.processed_bytes))
        for la in desc["layers"]:
            for t in list(la.get("inputs", [])) + list(la.get("outputs", [])):
                if t.get("kind") == "state":
                    uses[t["name"]] = uses.get(t["name"], 0) + 1
    return uses


def test_write_only_buffer_is_dropped_and_the_program_matches_eager(tmp_path):
    """The counter no method reads costs no layer; the cache keeps working."""
    from kiln.executorch._options import write_only_of

    model = _Counted().eval()
    fresh = copy.deepcopy(model)
    prog = save(model, tmp_path / "c.pte", (torch.randn(1, 4), torch.tensor([0])), quiet=True)
    (lowered,) = _lowered_modules(prog)
    assert write_only_of(lowered.compile_specs) == {"count"}
    uses = _state_uses(prog, "forward")
    assert not any("count" in n for n in uses), uses
    assert any("cache" in n for n in uses), uses
    program = kiln.load(tmp_path / "c.pte")
    g = torch.Generator().manual_seed(11)
    for i in range(6):
        x, pos = torch.randn(1, 4, generator=g), torch.tensor([(3 * i) % 8])
        got = program.forward(x, pos)[0]
        with torch.no_grad():
            want = fresh(x, pos)
        _close(got, want, f"step {i}", 1e-5)


def test_buffer_read_before_its_overwrite_keeps_its_updates(tmp_path):
    """count.copy_(count + x) reads the value the previous call stored: kept, and the
    program matches eager call after call."""
    from kiln.executorch._options import write_only_of

    model = _Accum().eval()
    fresh = copy.deepcopy(model)
    prog = save(model, tmp_path / "a.pte", (torch.randn(1, 4), torch.tensor([0])), quiet=True)
    (lowered,) = _lowered_modules(prog)
    assert write_only_of(lowered.compile_specs) == set()
    assert any("count" in n for n in _state_uses(prog, "forward"))
    program = kiln.load(tmp_path / "a.pte")
    g = torch.Generator().manual_seed(13)
    for i in range(5):
        x, pos = torch.randn(1, 4, generator=g), torch.tensor([i + 1])
        got = program.forward(x, pos)[0]
        with torch.no_grad():
            want = fresh(x, pos)
        _close(got, want, f"step {i}", 1e-5)


def test_buffer_another_method_reads_keeps_its_updates(tmp_path):
    """The same counter read (and advanced) by a second method of the program is not
    write-only: the first method's engine still writes it, and both methods match eager."""
    from kiln.executorch._options import write_only_of

    model = _Counted().eval()
    bump = _Bump(model).eval()
    fresh = copy.deepcopy(model)
    prog = save(
        {
            "step": (model, (torch.randn(1, 4), torch.tensor([0]))),
            "bump": (bump, (torch.randn(1, 4),)),
        },
        tmp_path / "two.pte",
        quiet=True,
    )
    for method in ("step", "bump"):
        for lowered in _lowered_modules(prog, method):
            assert write_only_of(lowered.compile_specs) == set()
    assert any("count" in n for n in _state_uses(prog, "step")), _state_uses(prog, "step")
    program = kiln.load(tmp_path / "two.pte")
    g = torch.Generator().manual_seed(12)
    for i in range(4):
        x, pos = torch.randn(1, 4, generator=g), torch.tensor([i + 2])
        got = program.run("step", [x, pos])[0]
        with torch.no_grad():
            want = fresh(x, pos)
        _close(got, want, f"step {i}", 1e-5)


def _ring_methods(model):
    return {"fill": (model, (torch.randn(3, 4),)), "step": (model, (torch.randn(1, 4),))}


def test_buffer_several_methods_update_outside_kiln_is_shared_like_eager(tmp_path, caplog):
    """A buffer that two methods update and that stays with ExecuTorch (here a counter whose
    use Kiln cannot take) is planned in ExecuTorch's shared arena: each method sees the other's
    updates, as in eager PyTorch, call after call; two loads keep their own. Without that
    (each method its own copy) the second call already differs from eager."""
    torch.manual_seed(4)
    model = RingCounter().eval()
    fresh = copy.deepcopy(model)
    with caplog.at_level(logging.INFO, logger="kiln.executorch"):
        save(_ring_methods(model), tmp_path / "ring.pte", quiet=True)
    said = [r.getMessage() for r in caplog.records if "share_mutable_buffers" in r.getMessage()]
    assert len(said) == 1 and "'n'" in said[0] and "'fill'" in said[0], said
    assert "div" in said[0] or "outside" in said[0], said
    p1, p2 = kiln.load(tmp_path / "ring.pte"), kiln.load(tmp_path / "ring.pte")
    ref1, ref2 = copy.deepcopy(fresh), copy.deepcopy(fresh)
    g = torch.Generator().manual_seed(9)
    for i, method in enumerate(["fill", "step", "step", "fill", "step", "step", "step"]):
        x = torch.randn(3 if method == "fill" else 1, 4, generator=g)
        with torch.no_grad():
            want = ref1(x)
        _close(p1.run(method, [x])[0], want, f"load 1, call {i} ({method})", 1e-5)
        if i < 3:  # the second load follows the first three calls: its own states
            with torch.no_grad():
                want2 = ref2(x)
            _close(p2.run(method, [x])[0], want2, f"load 2, call {i} ({method})", 1e-5)


def test_buffer_left_outside_with_a_backend_config_that_does_not_share_is_warned_about(
    tmp_path, caplog
):
    from executorch.exir import ExecutorchBackendConfig

    torch.manual_seed(4)
    with caplog.at_level(logging.WARNING, logger="kiln.executorch"):
        save(
            _ring_methods(RingCounter().eval()),
            tmp_path / "ring.pte",
            quiet=True,
            backend_config=ExecutorchBackendConfig(),
        )
    said = [r.getMessage() for r in caplog.records if "keeps its own copy" in r.getMessage()]
    assert len(said) == 1 and "'n'" in said[0], [r.getMessage() for r in caplog.records]
    assert "MemoryPlanningPass(share_mutable_buffers=True)" in said[0]
