"""Small models for the tests (torchvision is not installed: ResNet is written out by hand)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in=32, d_hidden=64, d_out=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.fc3 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.gelu(self.fc2(x))
        return self.fc3(x)


class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        skip = x if self.down is None else self.down(x)
        return F.relu(y + skip)


class ResNet18(nn.Module):
    """ResNet-18's structure (7x7/2 stem, 3x3/2 max pool, 4 stages of 2 basic blocks, adaptive
    average pool, fc), at a reduced width so the CPU reference backend runs it quickly."""

    def __init__(self, width=8, n_classes=10):
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(3, w, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.pool = nn.MaxPool2d(3, 2, 1)
        layers, c = [], w
        for i, c_out in enumerate([w, 2 * w, 4 * w, 8 * w]):
            stride = 1 if i == 0 else 2
            layers += [BasicBlock(c, c_out, stride), BasicBlock(c_out, c_out, 1)]
            c = c_out
        self.layers = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, n_classes)
        # Non-trivial batch-norm statistics, so folding and inference-mode BN are exercised.
        g = torch.Generator().manual_seed(1)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.layers(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


class EncoderBlock(nn.Module):
    """Pre-norm transformer encoder block: layer norm, multi-head attention through
    F.scaled_dot_product_attention, GELU MLP, residuals."""

    def __init__(self, d=32, heads=4, mlp=64, causal=False):
        super().__init__()
        self.heads = heads
        self.causal = causal
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, mlp)
        self.fc2 = nn.Linear(mlp, d)

    def forward(self, x):
        b, s, d = x.shape
        h = self.ln1(x)
        q, k, v = self.qkv(h).split(d, dim=-1)
        q = q.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
        k = k.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
        v = v.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        a = a.transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class MHABlock(nn.Module):
    """Encoder block built on nn.MultiheadAttention."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        h = self.ln(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        return x + F.gelu(self.fc(a))


class WithAtanLinked(nn.Module):
    """Two Kiln delegates around an op Kiln lacks (atan): the first delegate's output ``h`` goes
    straight to the second (only Kiln reads it), ``a`` goes to the atan and to the second
    delegate (a reader outside Kiln too), and the atan's result reaches the second delegate
    through ExecuTorch (never linked: docs/runtime.md, "Between delegates")."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.fc1 = nn.Linear(16, width)
        self.fc2 = nn.Linear(width, width)
        self.fc3 = nn.Linear(width, 8)

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        a = self.fc2(h)
        f = torch.atan(a)
        return self.fc3(F.silu(f) + h + a)


class WithAtan(nn.Module):
    """Kiln ops, an op Kiln lacks (atan), then Kiln ops again: partial delegation."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        y = torch.tanh(self.fc1(x))
        y = torch.atan(y)
        return self.fc2(F.silu(y))


class RingCounter(nn.Module):
    """Rows written into a ring buffer at a counter the module keeps: each call writes its rows
    into `cache` (which Kiln's engine owns) at `n`, `n + 1`, ... modulo 8 and advances `n`. The
    counter is read through a product over its one element (the identity), an op Kiln leaves to
    ExecuTorch, so ExecuTorch owns `n`.
    Exported as two methods (a few rows, one row), both update both buffers."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(8, 4))
        self.register_buffer("n", torch.zeros(1, dtype=torch.int64))

    def forward(self, x):
        h = self.lin(x)
        i = torch.prod(self.n, 0, keepdim=True) + torch.arange(x.shape[0])
        pos = i % 8
        self.cache.index_copy_(0, pos, h)
        self.n.add_(x.shape[0])
        return self.cache.sum(0, keepdim=True) * h.sum(0, keepdim=True)
