"""Greedy text generation through a Kiln program whose KV cache lives in the Kiln engine.

    python examples/llm/generate.py                      # the tiny Llama-style decoder
    python examples/llm/generate.py --model hf           # transformers' LlamaForCausalLM
    python examples/llm/generate.py --tokens 128 --prompt "the kiln"

Steps: a byte-level BPE tokenizer is trained on a short built-in text (the ``tokenizers``
package, no download); a small decoder with deterministic random weights is exported with
``kiln.executorch.save`` (its cache buffers become state of the one Kiln delegate); the program
is loaded with ``kiln.load``; the prompt is run in one call (prefill), then one token per call
(decode), each choosing the most likely next token. Prints the time to the first token, decode
milliseconds per token and tokens per second.

The weights are random, so the text is noise; ``--check`` compares every token with eager
PyTorch.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tiny_llama import Config, GreedyHead, TinyLlama, example_inputs  # noqa: E402

TEXT = """\
A kiln is a thermally insulated chamber, a type of oven, that produces temperatures
sufficient to complete some process, such as hardening, drying, or chemical changes. Kilns
have been used for millennia to turn objects made from clay into pottery, tiles and bricks.
Various industries use rotary kilns for pyroprocessing: to calcinate ores, to calcinate
limestone to lime for cement, and to transform many other materials. The earliest known
kilns were pits dug into the ground; later kilns held the fire in one chamber and the ware in
another, so that the heat could be controlled. A language model reads a sequence of tokens
and predicts the next one; generating text means predicting a token, appending it, and
predicting again. Each step attends to every earlier position, so the keys and values of
earlier positions are kept in a cache instead of being computed again.
"""


def train_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer trained on TEXT (every byte is a token, then the merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT], trainer)
    return tok


def tiny_model(vocab: int, max_seq: int):
    """(model, example inputs, dynamic shapes) of the tiny Llama-style decoder."""
    model = TinyLlama(Config(vocab=vocab, max_seq=max_seq), seed=0).eval()
    args, dyn = example_inputs(model.c)
    return model, args, dyn


def hf_model(vocab: int, max_seq: int):
    """transformers' LlamaForCausalLM (random weights, seeded) with a StaticCache, exported by
    transformers' own wrapper (a strict trace: its default non-strict one does not lower)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_seq,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.cache_implementation = "static"
    wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=max_seq)
    seq = torch.export.Dim("seq", max=max_seq // 2)
    with torch.no_grad():
        ep = wrapper.export(
            input_ids=torch.zeros(1, 4, dtype=torch.int64),
            cache_position=torch.arange(4),
            dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}},
            strict=True,
        )
    return model, ep


def last_logits(out: torch.Tensor) -> torch.Tensor:
    """The logits of the last position: [1, vocab] (the tiny model returns only those)."""
    return out[:, -1] if out.dim() == 3 else out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("tiny", "hf"), default="tiny")
    ap.add_argument("--prompt", default="A kiln is a chamber that")
    ap.add_argument("--tokens", type=int, default=64, help="tokens to generate")
    ap.add_argument("--max-seq", type=int, default=256, help="the cache's length")
    ap.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp32")
    ap.add_argument("--out", help="folder for the .pte (default: a temporary one)")
    ap.add_argument("--check", action="store_true", help="compare every token with eager")
    ap.add_argument(
        "--greedy-head",
        action="store_true",
        help="export the step with its argmax (the tiny model): each call returns the token id",
    )
    a = ap.parse_args(argv)

    import kiln
    from kiln.executorch import save

    tok = train_tokenizer(384)
    vocab = tok.get_vocab_size()
    prompt = tok.encode(a.prompt).ids
    if len(prompt) + a.tokens > a.max_seq:
        ap.error(f"the prompt ({len(prompt)} tokens) and --tokens {a.tokens} exceed --max-seq")

    out_dir = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="kiln-llm-"))
    pte = out_dir / f"{a.model}_llm.pte"
    t0 = time.perf_counter()
    if a.greedy_head and a.model != "tiny":
        ap.error("--greedy-head wraps the tiny model (transformers' wrapper exports the logits)")
    if a.model == "tiny":
        model, args, dyn = tiny_model(vocab, a.max_seq)
        eager = copy.deepcopy(model)  # its own cache
        exported = GreedyHead(model) if a.greedy_head else model
        save(exported, pte, args, dynamic_shapes=dyn, precision=a.precision, quiet=True)

        def eager_step(ids, pos):
            return eager(ids, pos)
    else:
        model, ep = hf_model(vocab, a.max_seq)
        save(ep, pte, precision=a.precision, quiet=True)
        eager_cache = {}

        def eager_step(ids, pos):
            from transformers import StaticCache

            if "c" not in eager_cache:
                eager_cache["c"] = StaticCache(config=model.config, max_cache_len=a.max_seq)
            out = model(ids, past_key_values=eager_cache["c"], cache_position=pos, use_cache=True)
            return out.logits

    print(f"exported {pte} ({pte.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f}s")

    program = kiln.load(pte)
    ids = torch.tensor([prompt], dtype=torch.int64)

    def next_token(out: torch.Tensor) -> int:
        """The token a call chose: its id (--greedy-head), or the argmax of its last logits."""
        return int(out.reshape(-1)[0]) if a.greedy_head else int(last_logits(out).argmax())

    # Prefill: the whole prompt in one call; its last logits give the first new token.
    t0 = time.perf_counter()
    first = next_token(program.forward(ids, torch.arange(len(prompt)))[0])
    ttft = time.perf_counter() - t0
    generated = [first]
    expected = None
    if a.check:
        with torch.no_grad():
            expected = [int(last_logits(eager_step(ids, torch.arange(len(prompt)))).argmax())]

    # Decode: one token per call, at the next position of the cache.
    step_times = []
    for i in range(a.tokens - 1):
        pos = torch.tensor([len(prompt) + i])
        t = time.perf_counter()
        generated.append(next_token(program.forward(torch.tensor([[generated[-1]]]), pos)[0]))
        step_times.append(time.perf_counter() - t)
        if expected is not None:
            with torch.no_grad():
                e = eager_step(torch.tensor([[expected[-1]]]), pos)
            expected.append(int(last_logits(e).argmax()))

    decode = sum(step_times)
    print(f"prompt: {a.prompt!r} ({len(prompt)} tokens)")
    print(f"generated ({len(generated)} tokens): {tok.decode(generated)!r}")
    print(f"time to first token: {ttft * 1e3:.2f} ms (prefill of {len(prompt)} tokens)")
    if step_times:
        print(
            f"decode: {decode / len(step_times) * 1e3:.3f} ms/token, "
            f"{len(step_times) / decode:.1f} tokens/s ({len(step_times)} steps)"
        )
    total = ttft + decode
    print(f"overall: {len(generated) / total:.1f} tokens/s ({total * 1e3:.1f} ms)")
    if expected is not None:
        same = generated == expected
        print("eager PyTorch gives " + ("the same tokens" if same else f"other tokens: {expected}"))
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
