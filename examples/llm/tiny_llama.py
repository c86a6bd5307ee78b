"""A small Llama-style decoder written as a plain nn.Module, with its KV cache held in
registered buffers and updated in place: what Kiln exports into one delegate that owns the cache.

Per layer: RMSNorm, rotary position embeddings computed from the positions given as input,
grouped-query attention over the whole cache (positions after the current one masked), a
SiLU-gated MLP. ``forward(tokens [1, L], input_pos [L])`` writes the L new keys and values at
``input_pos`` (``index_copy_``) and returns the logits of the last position, [1, vocab].

The weights are random and deterministic (``seed``): the model predicts nothing useful, but
every export and run of it gives the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    vocab: int = 256
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    hidden: int = 128
    max_seq: int = 128
    rope_theta: float = 10000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    """Rotary embedding (rotate-half form): x [1, H, L, D], cos and sin [L, D/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        hd = c.head_dim
        self.wq = nn.Linear(c.dim, c.n_heads * hd, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(c.n_heads * hd, c.dim, bias=False)
        # The KV cache: [1, n_kv_heads, max_seq, head_dim], updated in place at input_pos.
        self.register_buffer("k_cache", torch.zeros(1, c.n_kv_heads, c.max_seq, hd))
        self.register_buffer("v_cache", torch.zeros(1, c.n_kv_heads, c.max_seq, hd))

    def forward(self, x, input_pos, cos, sin, mask):
        c = self.c
        hd = c.head_dim
        q = self.wq(x).view(1, -1, c.n_heads, hd).transpose(1, 2)
        k = self.wk(x).view(1, -1, c.n_kv_heads, hd).transpose(1, 2)
        v = self.wv(x).view(1, -1, c.n_kv_heads, hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)
        # Grouped-query attention: each cached head serves n_heads / n_kv_heads query heads.
        rep = c.n_heads // c.n_kv_heads
        shape = (1, c.n_kv_heads, rep, c.max_seq, hd)
        keys = self.k_cache[:, :, None].expand(shape).reshape(1, c.n_heads, c.max_seq, hd)
        values = self.v_cache[:, :, None].expand(shape).reshape(1, c.n_heads, c.max_seq, hd)
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.wo(o.transpose(1, 2).reshape(1, -1, c.n_heads * hd))


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.attn_norm = RMSNorm(c.dim, c.eps)
        self.attn = Attention(c)
        self.mlp_norm = RMSNorm(c.dim, c.eps)
        self.gate = nn.Linear(c.dim, c.hidden, bias=False)
        self.up = nn.Linear(c.dim, c.hidden, bias=False)
        self.down = nn.Linear(c.hidden, c.dim, bias=False)

    def forward(self, x, input_pos, cos, sin, mask):
        x = x + self.attn(self.attn_norm(x), input_pos, cos, sin, mask)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyLlama(nn.Module):
    def __init__(self, c: Config = Config(), seed: int = 0):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList([Block(c) for _ in range(c.n_layers)])
        self.norm = RMSNorm(c.dim, c.eps)
        self.lm_head = nn.Linear(c.dim, c.vocab, bias=False)
        hd = c.head_dim
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("cache_pos", torch.arange(c.max_seq), persistent=False)
        self.init_weights(seed)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Deterministic random weights (norm gains near 1, so every part of the model counts)."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        self.embed.weight.mul_(self.c.dim**0.5)

    def forward(self, tokens, input_pos):
        x = self.embed(tokens)
        freqs = input_pos[:, None].float() * self.inv_freq[None, :].float()  # [L, head_dim / 2]
        cos, sin = freqs.cos().to(x.dtype), freqs.sin().to(x.dtype)
        # Query i (at position input_pos[i]) sees the cached positions up to its own.
        mask = self.cache_pos[None, :] <= input_pos[:, None]  # [L, max_seq]
        for layer in self.layers:
            x = layer(x, input_pos, cos, sin, mask)
        return self.lm_head(self.norm(x[:, -1, :]))


class GreedyHead(nn.Module):
    """A decoder whose step returns the next token id (int64 [1]) instead of the logits: the
    argmax over the vocabulary runs inside the Kiln engine, so a greedy step moves 8 bytes back,
    not the vocabulary's logits. The cache stays the wrapped decoder's buffers."""

    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.decoder = decoder

    def forward(self, tokens, input_pos):
        logits = self.decoder(tokens, input_pos)
        if logits.dim() == 3:  # [1, L, vocab]: the last position's
            logits = logits[:, -1]
        return torch.argmax(logits, dim=-1)


def example_inputs(c: Config = Config(), length: int = 4):
    """(tokens [1, length], input_pos [length]) and the dynamic shapes for torch.export: the
    sequence length from 1 to max_seq."""
    seq = torch.export.Dim("seq", min=1, max=c.max_seq)
    tokens = torch.zeros(1, length, dtype=torch.int64)
    input_pos = torch.arange(length, dtype=torch.int64)
    return (tokens, input_pos), ({1: seq}, {0: seq})
