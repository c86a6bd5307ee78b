"""Per-op end to end: each small model is exported with Kiln (everything delegated), run
through ExecuTorch's runtime, and compared with eager PyTorch on fresh random inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import assert_close, delegation_summary
from kiln.executorch import KilnStrictError, export


class Fn(nn.Module):
    def __init__(self, fn, **modules):
        super().__init__()
        self.fn = fn
        for k, v in modules.items():
            setattr(self, k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


def r(*shape):
    return lambda: torch.randn(*shape)


def pos(*shape):
    return lambda: torch.rand(*shape) + 0.5


def ints(high, *shape, dtype=torch.int64):
    return lambda: torch.randint(0, high, shape, dtype=dtype)


def mask(*shape):
    return lambda: torch.rand(*shape) > 0.3


torch.manual_seed(1234)
CASES = {
    # matmul family
    "linear": (Fn(lambda m, x: m.l(x), l=nn.Linear(8, 6)), [r(3, 8)]),
    "linear_nobias_3d": (Fn(lambda m, x: m.l(x), l=nn.Linear(8, 6, bias=False)), [r(2, 3, 8)]),
    "matmul_broadcast": (Fn(lambda m, a, b: a @ b), [r(2, 3, 4, 5), r(3, 5, 6)]),
    "mm": (Fn(lambda m, a, b: torch.mm(a, b)), [r(4, 5), r(5, 3)]),
    "bmm": (Fn(lambda m, a, b: torch.bmm(a, b)), [r(2, 4, 5), r(2, 5, 3)]),
    "addmm": (Fn(lambda m, b, a, c: torch.addmm(b, a, c)), [r(3), r(4, 5), r(5, 3)]),
    # convolution and normalization
    "conv2d": (Fn(lambda m, x: m.c(x), c=nn.Conv2d(4, 6, 3, stride=2, padding=1)), [r(2, 4, 9, 9)]),
    "conv2d_groups_dilation": (
        Fn(lambda m, x: m.c(x), c=nn.Conv2d(4, 8, 3, padding=2, dilation=2, groups=2)),
        [r(1, 4, 8, 8)],
    ),
    "conv_transpose2d": (
        Fn(
            lambda m, x: m.c(x),
            c=nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1),
        ),
        [r(1, 4, 5, 5)],
    ),
    "conv_transpose2d_groups": (
        Fn(lambda m, x: m.c(x), c=nn.ConvTranspose2d(4, 4, 2, stride=2, groups=2, bias=False)),
        [r(2, 4, 3, 3)],
    ),
    "batch_norm": (Fn(lambda m, x: m.bn(x), bn=nn.BatchNorm2d(4).eval()), [r(2, 4, 3, 3)]),
    "layer_norm": (Fn(lambda m, x: m.ln(x), ln=nn.LayerNorm([3, 8])), [r(2, 3, 8)]),
    "layer_norm_plain": (Fn(lambda m, x: F.layer_norm(x, (8,), eps=1e-3)), [r(4, 8)]),
    # comparisons, logical and bitwise ops, integer and bool tensors
    "compare_float": (
        Fn(lambda m, a, b: torch.stack([a == b, a != b, a < b, a <= b, a > b, a >= b]).float()),
        [lambda: torch.randint(-2, 3, (3, 5)).float(), lambda: torch.randint(-2, 3, (5,)).float()],
    ),
    "compare_scalar_int": (
        Fn(lambda m, a: ((a > 1) & (a <= 5)) | (a == -3)),
        [lambda: torch.randint(-5, 9, (4, 6))],
    ),
    "compare_mixed_promotes": (
        Fn(lambda m, a, b: (a.to(torch.int32) < b).to(torch.float32) * b),
        [lambda: torch.randn(2, 7) * 4, r(2, 7)],
    ),
    "logical_ops": (
        Fn(
            lambda m, a, b: torch.stack(
                [
                    torch.logical_and(a, b),
                    torch.logical_or(a, b),
                    torch.logical_xor(a, b),
                    torch.logical_not(a),
                    ~b,
                ]
            )
        ),
        [mask(3, 4), mask(3, 4)],
    ),
    "bitwise_int": (
        Fn(lambda m, a, b: (a & b) + (a | b) * 3 + (a ^ b) - (~a)),
        [ints(1000, 2, 9), ints(1000, 2, 9)],
    ),
    "logical_on_ints": (
        Fn(lambda m, a, b: torch.logical_and(a, b).float() + torch.logical_not(a).float()),
        [ints(3, 4, 4), ints(3, 4, 4)],
    ),
    # Python's % and //, C's fmod: signs of both operands, tensor and scalar divisors
    "remainder_fmod_floordiv_int": (
        Fn(
            lambda m, a, b: torch.stack(
                [a % b, torch.fmod(a, b), a // b, a % 5, a // -3, torch.fmod(a, -4), a - b % 3]
            )
        ),
        [
            lambda: torch.randint(-60, 60, (4, 9)),
            lambda: torch.randint(1, 8, (9,)) * (torch.randint(0, 2, (9,)) * 2 - 1),
        ],
    ),
    "remainder_fmod_floordiv_float": (
        Fn(
            lambda m, a, b: torch.stack(
                [
                    torch.remainder(a, b),
                    torch.fmod(a, b),
                    torch.div(a, b, rounding_mode="floor"),
                    a % 0.75,
                    torch.floor_divide(a, -1.5),
                    b.expand_as(a) % 0.5,
                ]
            )
        ),
        [
            lambda: torch.randn(3, 8) * 10,
            lambda: (torch.rand(8) + 0.25) * (torch.randint(0, 2, (8,)) * 2 - 1),
        ],
    ),
    # div(rounding_mode="trunc") (older transformers' position math): toward zero, both signs
    "div_trunc_int": (
        Fn(
            lambda m, a, b: torch.stack(
                [torch.div(a, b, rounding_mode="trunc"), torch.div(a, -3, rounding_mode="trunc")]
            )
        ),
        [
            lambda: torch.randint(-60, 60, (4, 9)),
            lambda: torch.randint(1, 8, (9,)) * (torch.randint(0, 2, (9,)) * 2 - 1),
        ],
    ),
    "div_trunc_float": (
        Fn(
            lambda m, a, b: (
                torch.div(a, b, rounding_mode="trunc") + torch.div(a, 0.7, rounding_mode="trunc")
            )
        ),
        [
            lambda: torch.randn(3, 8) * 10,
            lambda: (torch.rand(8) + 0.25) * (torch.randint(0, 2, (8,)) * 2 - 1),
        ],
    ),
    # T5's float16 overflow guard: isinf, any (all and per dim), clamp with tensor bounds
    "isinf_any_clamp_tensor": (
        Fn(
            lambda m, x, lo: torch.cat(
                [
                    torch.clamp(
                        x,
                        min=-torch.where(torch.isinf(x).any(), 5.0, 25.0),
                        max=torch.where(torch.isinf(x).any(), 5.0, 25.0),
                    ),
                    torch.isinf(x).any(dim=1, keepdim=True).float().expand(-1, 2),
                    torch.clamp(x[:, :3], min=lo, max=lo + 1.0),
                    torch.isinf(x).any(1, keepdim=True).long().float() * 2,
                ],
                dim=1,
            )
        ),
        [
            lambda: torch.where(
                torch.rand(4, 7) < 0.15,
                float("inf") * torch.sign(torch.randn(4, 7)),
                30 * torch.randn(4, 7),
            ),
            lambda: torch.randn(4, 3),
        ],
    ),
    # activations lowered onto other Kiln ops: every slope form of leaky_relu (NaN and both
    # zeros included), ELU and SELU (exp - 1 for expm1), CELU's expm1 stays out
    "leaky_relu_slopes": (
        Fn(
            lambda m, x: torch.stack(
                [
                    F.leaky_relu(x),
                    F.leaky_relu(x, 0.2),
                    F.leaky_relu(x, 0.0),
                    F.leaky_relu(x, 1.0),
                    F.leaky_relu(x, 3.0),
                    F.leaky_relu(x, -0.5),
                    m.act(x),
                ]
            ),
            act=nn.LeakyReLU(0.1),
        ),
        [
            lambda: torch.where(
                torch.rand(5, 7) < 0.1,
                torch.tensor([float("nan"), -0.0, 0.0, float("-inf"), float("inf")])[
                    torch.randint(0, 5, (5, 7))
                ],
                torch.randn(5, 7) * 3,
            )
        ],
    ),
    "elu_selu": (
        Fn(
            lambda m, x: torch.stack(
                [F.elu(x), F.elu(x, alpha=0.3), F.selu(x), m.elu(x), F.elu(x * 40)]
            ),
            elu=nn.ELU(alpha=2.0),
        ),
        [r(4, 9)],
    ),
    "reciprocal_log2_log10_isnan_erf": (
        Fn(
            lambda m, x, y: torch.stack(
                [
                    torch.reciprocal(x),
                    torch.log2(x),
                    torch.log10(x),
                    torch.isnan(y).float(),
                    torch.nan_to_num(y, nan=0.5),
                    torch.erf(x * 3.0 - 4.0),
                ]
            )
        ),
        [pos(3, 6), lambda: torch.where(torch.rand(3, 6) < 0.3, float("nan"), torch.randn(3, 6))],
    ),
    # variance, extremes (values and the first index, NaN counted as the maximum)
    "var_std": (
        Fn(
            lambda m, x: torch.cat(
                [
                    x.var(dim=-1, keepdim=True),
                    x.std(dim=(1, 2), keepdim=True).expand(-1, 3, 1) * 1.0,
                    torch.var(x, dim=1, correction=0).unsqueeze(-1)[:, :3],
                    x.var(dim=-1, unbiased=False, keepdim=True),
                    torch.var(x, correction=2).view(1, 1, 1).expand(2, 3, 1),
                ],
                dim=-1,
            )
        ),
        [lambda: torch.randn(2, 3, 5) * 4 + 1],
    ),
    "amax_amin_max_min": (
        Fn(
            lambda m, x: torch.cat(
                [
                    x.amax(dim=-1, keepdim=True),
                    x.amin(dim=(0, 2)).view(1, 4, 1).expand(3, 4, 1),
                    x.max(dim=1, keepdim=True).values[..., :1].expand(3, 4, 1),
                    x.min(dim=-1).values.unsqueeze(-1),
                    torch.logsumexp(x, dim=-1, keepdim=True),
                    (x - x.amax(-1, keepdim=True)).exp()[..., :2],
                    x.max().view(1, 1, 1).expand(3, 4, 1),
                    x.min().view(1, 1, 1).expand(3, 4, 1),
                ],
                dim=-1,
            )
        ),
        [lambda: torch.where(torch.rand(3, 4, 6) < 0.05, float("nan"), torch.randn(3, 4, 6))],
    ),
    "max_min_dim_indices": (
        Fn(
            lambda m, x, k: torch.stack(
                [
                    x.max(dim=-1).indices,
                    x.min(dim=0).indices.expand(2, 5)[0],
                    k.max(dim=-1).values,
                    k.min(dim=-1).values,
                    k.amin(dim=-1),
                    k.max(dim=-1).indices,
                ]
            )
        ),
        [
            lambda: torch.randint(-3, 4, (5, 5)).float(),
            lambda: torch.randint(-(2**62), 2**62, (5, 5)) * (torch.rand(5, 5) < 0.7),
        ],
    ),
    # F.fold (col2im: VOLO's outlook attention) as a transposed convolution with one-hot taps:
    # strided, dilated and padded, VOLO's 3x3 of stride 2 and padding 1 (the last row and column
    # reached by the padding at the end), an output larger than the windows cover
    "fold": (
        Fn(
            lambda m, a, b, c: torch.cat(
                [
                    F.fold(a, (8, 9), 3, padding=1).flatten(1),
                    F.fold(b, (11, 10), (2, 3), dilation=(2, 1), padding=(1, 0), stride=2).flatten(
                        1
                    ),
                    F.fold(F.unfold(c, 3, padding=1), (8, 9), 3, padding=1).flatten(1),
                    F.fold(
                        F.unfold(c, 3, padding=1, stride=2), (8, 9), 3, padding=1, stride=2
                    ).flatten(1),
                    F.fold(F.unfold(c, 2, stride=3), (8, 9), 2, stride=3).flatten(1),
                ],
                dim=1,
            )
        ),
        [r(2, 4 * 9, 72), r(2, 3 * 6, 24), r(2, 4, 8, 9)],
    ),
    # Tensor.unfold (sliding windows: PatchTST's patches, audio frames), windows that do and do
    # not overlap, with a remainder, along a middle and the last dim
    "unfold_windows": (
        Fn(
            lambda m, x, y: torch.cat(
                [
                    x.unfold(1, 4, 4).flatten(1),
                    x.unfold(1, 5, 2).flatten(1),
                    x.unfold(-1, 3, 3).flatten(1),
                    y.unfold(0, 3, 1).flatten().unsqueeze(0).expand(2, -1),
                ],
                dim=1,
            )
        ),
        [r(2, 11, 7), r(6)],
    ),
    # F.grid_sample (RAFT's correlation lookup, deformable attention) as gathers: bilinear and
    # nearest, zeros and border padding, with and without align_corners, the grid reaching past
    # the map on every side, an output of another size than the input
    "grid_sample": (
        Fn(
            lambda m, x, g: torch.cat(
                [
                    F.grid_sample(x, g, mode=mode, padding_mode=pad, align_corners=align).flatten(1)
                    for mode in ("bilinear", "nearest")
                    for pad in ("zeros", "border")
                    for align in (False, True)
                ],
                dim=1,
            )
        ),
        [r(2, 3, 5, 7), lambda: torch.rand(2, 4, 6, 2) * 2.6 - 1.3],
    ),
    # torch.flip (a bidirectional RNN's reversed sequence) over one dim, two and a negative one
    "flip": (
        Fn(
            lambda m, x, i: (
                torch.flip(x, [1]) * 2,
                torch.flip(x, [0, -1]) + 1,
                torch.flip(i, [1]) + 3,
            )
        ),
        [r(3, 5, 4), ints(100, 2, 7)],
    ),
    # F.pad's reflect and replicate modes over 1, 2 and 3 dims (a conv's padding_mode), uneven
    "edge_pads": (
        Fn(
            lambda m, a, b, c: (
                F.pad(a, (2, 3), mode="reflect") * 2,
                F.pad(b, (1, 0, 2, 3), mode="reflect") + 1,
                F.pad(b, (3, 1, 0, 2), mode="replicate") - 1,
                F.pad(a, (0, 4), mode="replicate"),
                F.pad(c, (1, 1, 2, 0, 1, 2), mode="reflect"),
                F.pad(c, (1, 2, 0, 1, 2, 2), mode="replicate"),
                m.conv(b),
            ),
            conv=nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"),
        ),
        [r(2, 3, 6), r(1, 3, 5, 6), r(1, 2, 3, 4, 5)],
    ),
    "argmin_logit": (
        Fn(
            lambda m, x, k, p: (
                torch.argmin(x, dim=1),
                torch.argmin(x, dim=-1, keepdim=True),
                torch.argmin(x),
                torch.argmin(k, dim=0),
                torch.logit(p),
                torch.logit(p * 1.2 - 0.1, eps=1e-3),
            )
        ),
        [
            lambda: torch.randint(-3, 4, (4, 6)).float(),
            lambda: torch.randint(-(2**62), 2**62, (5, 3)),
            lambda: torch.rand(3, 4) * 0.98 + 0.01,
        ],
    ),
    # 3-D max pooling (MViT's skip pooling) as a 2-D pool per frame and the maximum of the
    # temporal taps: padded, strided, dilated, ceil_mode, a NaN propagating
    "max_pool3d": (
        Fn(
            lambda m, x: torch.cat(
                [
                    F.max_pool3d(x, (3, 3, 3), (1, 2, 2), (1, 1, 1)).flatten(1),
                    F.max_pool3d(x, 2).flatten(1),
                    F.max_pool3d(x, (2, 3, 1), (2, 1, 1), (1, 1, 0), ceil_mode=True).flatten(1),
                    F.max_pool3d(x, (2, 2, 2), 1, 0, dilation=(2, 1, 2)).flatten(1),
                    F.max_pool3d(x, (1, 3, 3), 1, (0, 1, 1)).flatten(1),
                ],
                dim=1,
            )
        ),
        [
            lambda: torch.where(
                torch.rand(2, 3, 5, 6, 7) < 0.02, float("nan"), torch.randn(2, 3, 5, 6, 7)
            )
        ],
    ),
    "avg_pool3d": (
        Fn(
            lambda m, x: torch.cat(
                [
                    F.avg_pool3d(x, (2, 3, 3), 1).flatten(1),
                    F.avg_pool3d(x, 3, 2, 1).flatten(1),
                    F.avg_pool3d(x, 3, 2, 1, count_include_pad=False).flatten(1),
                    F.avg_pool3d(x, (3, 2, 2), (1, 2, 2), (1, 0, 1), ceil_mode=True).flatten(1),
                    m.lrn(x[:, :, 0]).flatten(1),
                ],
                dim=1,
            ),
            lrn=nn.LocalResponseNorm(3),
        ),
        [r(2, 4, 5, 6, 7)],
    ),
    # InstanceNorm (batch norm over a [1, N * C, ...] view: group_norm, one channel a group)
    "instance_norm": (
        Fn(
            lambda m, x: m.a(x) + F.instance_norm(x * 2.0, eps=1e-3),
            a=nn.InstanceNorm2d(4, affine=True),
        ),
        [lambda: torch.randn(1, 4, 6, 7) * 3 + 2],
    ),
    # 3-D convolutions as 2-D ones over the output frames (video models)
    "conv3d": (
        Fn(lambda m, x: m.c(x), c=nn.Conv3d(3, 8, (3, 7, 7), stride=(1, 2, 2), padding=(1, 3, 3))),
        [r(2, 3, 5, 16, 16)],
    ),
    "conv3d_stride_groups_dilation": (
        Fn(
            lambda m, x: m.b(m.a(x)),
            a=nn.Conv3d(4, 8, 3, stride=2, padding=1, groups=2, bias=False),
            b=nn.Conv3d(8, 6, (2, 1, 3), padding=(2, 0, 1), dilation=(2, 1, 1), groups=2),
        ),
        [r(1, 4, 7, 9, 10)],
    ),
    "conv3d_pointwise": (
        Fn(lambda m, x: m.c(x), c=nn.Conv3d(6, 5, 1, stride=(2, 1, 1))),
        [r(1, 6, 4, 5, 5)],
    ),
    "remainder_int32_ring": (
        Fn(lambda m, p: ((p + 1) % 6) * 2 + torch.fmod(p, 4) - p // 4),
        [lambda: torch.randint(-20, 20, (5,), dtype=torch.int32)],
    ),
    # T5's relative position buckets: abs, minimum, maximum; NaN propagates as in PyTorch
    "abs_minimum_maximum_float": (
        Fn(lambda m, a, b: torch.stack([torch.abs(a), torch.minimum(a, b), torch.maximum(b, a)])),
        [
            lambda: torch.where(torch.rand(4, 6) < 0.1, float("nan"), torch.randn(4, 6)),
            lambda: torch.randn(6),
        ],
    ),
    "abs_minimum_maximum_int": (
        Fn(lambda m, a, b: torch.minimum(torch.abs(a), b) * 3 + torch.maximum(a, b - 5)),
        [lambda: torch.randint(-50, 50, (3, 8)), lambda: torch.randint(-20, 20, (8,))],
    ),
    # DeBERTa's log-bucketed relative positions: sign, ceil, floor, round (half to even), trunc
    "sign_and_roundings_float": (
        Fn(
            lambda m, x: torch.stack(
                [torch.sign(x), torch.ceil(x), torch.floor(x), torch.round(x), torch.trunc(x)]
            )
        ),
        [lambda: torch.cat([torch.randn(12) * 4, torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 0.0])])],
    ),
    "sign_and_roundings_int": (
        Fn(lambda m, x: torch.sign(x) * 7 + torch.ceil(x) - torch.floor(x) + torch.trunc(x)),
        [lambda: torch.randint(-9, 9, (3, 5))],
    ),
    "repeat": (
        Fn(lambda m, x: x.repeat(2, 1, 3) * 2 + x.repeat(1, 1, 1, 2).sum()),
        [r(2, 3, 4)],
    ),
    "cos_sin": (Fn(lambda m, x: torch.cos(x) * 2 + torch.sin(x)), [lambda: torch.randn(3, 7) * 5]),
    "cumsum_float": (Fn(lambda m, x: torch.cumsum(x, dim=1)), [r(3, 9, 2)]),
    # a greedy decoding head: the logits' argmax (int64), a strided dim with ties, the flattened
    # tensor with keepdim
    "argmax_logits": (
        Fn(lambda m, x: torch.argmax(m.head(x), dim=-1), head=nn.Linear(16, 300)),
        [r(2, 3, 16)],
    ),
    "argmax_ties_keepdim": (
        Fn(lambda m, x: torch.argmax(x, dim=1, keepdim=True) * 2),
        [ints(4, 3, 9, 5)],
    ),
    "argmax_flat": (
        Fn(lambda m, x: torch.argmax(x, keepdim=True) + torch.argmax(x)),
        [r(3, 7)],
    ),
    # a mixture-of-experts router's top 2 of 8 (values and indices); the 3 smallest along a
    # strided dim; sort with ties descending (in index order, as PyTorch's); argsort (plain
    # tuples: ExecuTorch cannot serialize torch.return_types outputs). Among equal values
    # PyTorch's topk may return other indices than Kiln's index order: no ties there.
    "topk_router": (
        Fn(lambda m, x: tuple(torch.topk(m.gate(x).softmax(-1), 2, dim=-1)), gate=nn.Linear(16, 8)),
        [r(2, 5, 16)],
    ),
    "topk_smallest_strided": (
        Fn(lambda m, x: tuple(torch.topk(x, 3, dim=1, largest=False))),
        [r(3, 9, 5)],
    ),
    "sort_ties_descending": (
        Fn(lambda m, x: tuple(torch.sort(x.float(), dim=-1, descending=True))),
        [ints(5, 4, 11)],
    ),
    "argsort": (Fn(lambda m, x: torch.argsort(x, dim=0) * 2), [r(7, 6)]),
    "cumsum_int_promotes": (
        Fn(lambda m, x: torch.cumsum(x, dim=-1)),
        [ints(50, 2, 11, dtype=torch.int32)],
    ),
    "gather": (
        Fn(lambda m, x, i: torch.gather(x, 1, i)),
        [r(3, 5, 4), lambda: torch.randint(0, 5, (3, 7, 2))],
    ),
    "index_two_tensors": (
        Fn(lambda m, x, i, j: x[:, i, j]),
        [r(2, 5, 6, 3), ints(5, 4, 1), lambda: torch.randint(-6, 6, (3,))],
    ),
    "index_select": (
        Fn(lambda m, x, i: torch.index_select(x, 2, i)),
        [r(2, 3, 8), ints(8, 5, dtype=torch.int32)],
    ),
    "index_bool_table": (
        Fn(lambda m, t, i: t[i]),
        [mask(6, 3), ints(6, 2, 4)],
    ),
    "as_strided_view": (
        Fn(lambda m, x: torch.as_strided(x + 1, (2, 12), (12, 1)) * 2),
        [r(2, 3, 4)],
    ),
    "as_strided_copy_pattern": (
        Fn(lambda m, x: torch.as_strided(x * 2, (3, 3, 2), (1, 4, 2), 1)),
        [r(4, 5)],
    ),
    "as_strided_of_channels_last": (
        Fn(
            lambda m, x: (
                torch.as_strided(
                    (x * 2).contiguous(memory_format=torch.channels_last), (2, 3, 4), (1, 8, 2)
                )
                + 1
            )
        ),
        [r(2, 3, 2, 2)],
    ),
    "constant_pad": (Fn(lambda m, x: F.pad(x, (1, 2, 0, 3), value=0.5)), [r(2, 3, 4, 5)]),
    "constant_pad_crop": (Fn(lambda m, x: F.pad(x, (-1, 2))), [r(3, 6)]),
    "roll": (Fn(lambda m, x: torch.roll(x, shifts=(2, -1), dims=(1, 2)) * 2), [r(2, 5, 7)]),
    "group_norm": (Fn(lambda m, x: m.gn(x), gn=nn.GroupNorm(3, 6)), [r(2, 6, 5, 4)]),
    "group_norm_1d": (Fn(lambda m, x: F.group_norm(x, 2, eps=1e-3)), [r(3, 4, 10)]),
    "conv1d": (Fn(lambda m, x: m.c(x), c=nn.Conv1d(4, 6, 5, stride=2, padding=2)), [r(2, 4, 17)]),
    "conv1d_groups_dilation": (
        Fn(lambda m, x: m.c(x), c=nn.Conv1d(4, 8, 3, dilation=2, groups=4, bias=False)),
        [r(1, 4, 20)],
    ),
    "upsample_nearest": (
        Fn(lambda m, x: F.interpolate(x, scale_factor=2, mode="nearest") + 1),
        [r(1, 3, 4, 5)],
    ),
    "upsample_nearest_size": (
        Fn(lambda m, x: F.interpolate(x, size=(7, 3), mode="nearest") * 2),
        [r(2, 3, 4, 5)],
    ),
    "upsample_bilinear": (
        Fn(lambda m, x: F.interpolate(x, size=(9, 11), mode="bilinear", align_corners=False) * 2),
        [r(1, 2, 4, 5)],
    ),
    "upsample_bilinear_align": (
        Fn(lambda m, x: F.interpolate(x, scale_factor=3, mode="bilinear", align_corners=True) + 1),
        [r(1, 2, 3, 4)],
    ),
    # elementwise
    "relu": (Fn(lambda m, x: F.relu(x)), [r(3, 7)]),
    "gelu": (Fn(lambda m, x: F.gelu(x)), [r(3, 7)]),
    "gelu_tanh": (Fn(lambda m, x: F.gelu(x, approximate="tanh")), [r(3, 7)]),
    "silu": (Fn(lambda m, x: F.silu(x)), [r(3, 7)]),
    "sigmoid_tanh": (Fn(lambda m, x: torch.sigmoid(x) + torch.tanh(x)), [r(3, 7)]),
    "hardswish": (Fn(lambda m, x: F.hardswish(x)), [lambda: torch.randn(3, 7) * 4]),
    "hardsigmoid": (Fn(lambda m, x: F.hardsigmoid(x)), [lambda: torch.randn(3, 7) * 4]),
    "hardtanh_relu6_clamp": (
        Fn(lambda m, x: F.hardtanh(x, -0.5, 0.5) + F.relu6(x * 4) + x.clamp(min=-0.2)),
        [r(3, 7)],
    ),
    "neg_sqrt_rsqrt_exp_log": (
        Fn(lambda m, x: -torch.sqrt(x) + torch.rsqrt(x) + torch.exp(x) + torch.log(x)),
        [pos(3, 7)],
    ),
    "binary_broadcast": (
        Fn(lambda m, a, b: (a + b) * (a - b) / (b * b + 1)),
        [r(2, 3, 4), r(3, 1)],
    ),
    "binary_scalars_alpha": (
        Fn(
            lambda m, x: torch.add(x, x, alpha=0.5) - 3.0 + 2 * x / 4.0 - torch.sub(x, 1.5, alpha=2)
        ),
        [r(4, 5)],
    ),
    "int_arith": (Fn(lambda m, a, b: a * b + a - 3), [ints(10, 4, 5), ints(10, 4, 5)]),
    "int_div_promotes": (Fn(lambda m, a, b: a / (b + 1)), [ints(10, 4, 5), ints(10, 4, 5)]),
    "pow": (Fn(lambda m, x, y: torch.pow(x, 2) + torch.pow(x, y)), [pos(3, 4), r(3, 4)]),
    "where": (Fn(lambda m, c, a, b: torch.where(c, a, b)), [mask(3, 4), r(3, 4), r(1, 4)]),
    "where_scalar": (Fn(lambda m, c, a: torch.where(c, a, 0.5)), [mask(3, 4), r(3, 4)]),
    "softmax": (Fn(lambda m, x: torch.softmax(x, -1) + torch.softmax(x, 0)), [r(3, 6)]),
    "log_softmax": (Fn(lambda m, x: F.log_softmax(x, dim=1)), [r(3, 6)]),
    # pooling and reductions
    "max_pool2d": (Fn(lambda m, x: F.max_pool2d(x, 3, 2, 1)), [r(2, 3, 9, 9)]),
    "max_pool2d_ceil": (Fn(lambda m, x: F.max_pool2d(x, 2, 2, ceil_mode=True)), [r(1, 3, 7, 7)]),
    "avg_pool2d": (
        Fn(lambda m, x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)),
        [r(2, 3, 8, 8)],
    ),
    "avg_pool2d_divisor": (
        Fn(lambda m, x: F.avg_pool2d(x, 2, divisor_override=3)),
        [r(1, 3, 6, 6)],
    ),
    "adaptive_avg_pool2d": (
        Fn(lambda m, x: F.adaptive_avg_pool2d(x, 1) + F.adaptive_avg_pool2d(x, 3).mean()),
        [r(2, 3, 7, 7)],
    ),
    "mean_sum": (
        Fn(lambda m, x: (x.mean(dim=(2, 3), keepdim=True), x.sum(1), x.sum())),
        [r(2, 3, 4, 5)],
    ),
    # shape ops
    "view_permute_transpose_t": (
        Fn(
            lambda m, x: (x.view(4, 6).t() @ x.reshape(4, 6), x.permute(2, 0, 1), x.transpose(0, 2))
        ),
        [r(2, 3, 4)],
    ),
    "expand_cat": (
        Fn(lambda m, x, y: torch.cat([x.expand(3, 4, 5), y], dim=1)),
        [r(1, 4, 5), r(3, 2, 5)],
    ),
    # more tensors than one Kiln cat takes (Mamba's unrolled scan): chunks, then their cat
    "cat_of_130": (
        Fn(lambda m, x: torch.cat([x[:, i : i + 1] * (i + 1) for i in range(130)], dim=1)),
        [r(2, 130, 3)],
    ),
    "slice_select": (
        Fn(lambda m, x: (x[:, 1:5:2] * 2, x[1] + 1, x[..., -2] - 1, x[:, -3:] * x[:, :3])),
        [r(3, 7, 4)],
    ),
    "squeeze_unsqueeze": (
        Fn(lambda m, x: (x.squeeze(1) * 2, x.unsqueeze(0) + 1, torch.relu(x.squeeze()))),
        [r(3, 1, 4)],
    ),
    "split_chunk": (
        Fn(lambda m, x: tuple(t * (i + 1) for i, t in enumerate(x.split([2, 3, 1], dim=1)))),
        [r(2, 6)],
    ),
    "embedding": (
        Fn(lambda m, i: m.e(i) * 2, e=nn.Embedding(11, 6)),
        [ints(11, 2, 5)],
    ),
    "clone_cast": (
        Fn(lambda m, x: (x.clone() + 1, x.to(torch.float16) * 2, (x * 10).to(torch.int32))),
        [r(3, 4)],
    ),
    # attention
    "sdpa": (
        Fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v)),
        [r(2, 3, 5, 8), r(2, 3, 7, 8), r(2, 3, 7, 4)],
    ),
    "sdpa_causal_scale": (
        Fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)),
        [r(1, 2, 6, 8), r(1, 2, 6, 8), r(1, 2, 6, 8)],
    ),
    "sdpa_float_mask": (
        Fn(lambda m, q, k, v, a: F.scaled_dot_product_attention(q, k, v, attn_mask=a)),
        [r(1, 2, 4, 8), r(1, 2, 6, 8), r(1, 2, 6, 8), r(4, 6)],
    ),
    "sdpa_bool_mask": (
        Fn(lambda m, q, k, v, a: F.scaled_dot_product_attention(q, k, v, attn_mask=a)),
        [r(1, 2, 4, 8), r(1, 2, 6, 8), r(1, 2, 6, 8), lambda: torch.rand(1, 1, 4, 6) > 0.2],
    ),
    # grouped-query attention: 8 query heads over 2 key/value heads (each serves 4 in a row)
    "sdpa_gqa_causal": (
        Fn(
            lambda m, q, k, v: F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True
            )
        ),
        [r(2, 8, 20, 16), r(2, 2, 20, 16), r(2, 2, 20, 16)],
    ),
    "sdpa_gqa_mask_decode": (
        Fn(
            lambda m, q, k, v, a: F.scaled_dot_product_attention(
                q, k, v, attn_mask=a, enable_gqa=True
            )
        ),
        [r(1, 8, 1, 16), r(1, 2, 9, 16), r(1, 2, 9, 16), lambda: torch.rand(1, 1, 1, 9) > 0.3],
    ),
    "sdpa_gqa_float_mask": (
        Fn(
            lambda m, q, k, v, a: F.scaled_dot_product_attention(
                q, k, v, attn_mask=a, enable_gqa=True
            )
        ),
        [r(1, 6, 12, 8), r(1, 3, 10, 8), r(1, 3, 10, 8), r(12, 10)],
    ),
}


def test_full_of_symbolic_size_matches_eager():
    """full and full_like of a dynamic length (T5's and DeBERTa's relative position buckets):
    the value expanded to a size read from an input, one delegate, right at other lengths."""

    class Buckets(nn.Module):
        def forward(self, x):
            n = x.shape[1]
            rel = torch.arange(n)[None, :] - torch.arange(n)[:, None]
            big = torch.full((n, n), 3, dtype=torch.long)
            cap = torch.full_like(rel, 5)
            return x.sum(0) + (torch.minimum(torch.abs(rel), cap) * big).sum(0)

    model = Buckets()
    n = torch.export.Dim("n", min=2, max=64)
    prog = export(model, (torch.randn(4, 8),), dynamic_shapes=({1: n},))
    summary = delegation_summary(prog)
    assert summary["kiln"] == 1 and not summary["ops"], summary
    for length in (5, 17):
        x = torch.randn(4, length)
        out = run_program(prog, "forward", (x,))
        assert out[0].shape == (length,)
        assert_close(out, (model(x),))


def test_heads_folded_into_a_dynamic_batch_match_eager():
    """DeBERTa's disentangled attention at a dynamic batch and length: a static table repeated
    batch times (repeat with a symbolic count), an index expanded to heads * batch (a multiple
    of a measured size) and scores viewed back as [-1, heads, L, L]: one delegate, right at
    other sizes, and the view's leading bound is the batch's (the engine loads)."""
    heads = 3

    class Folded(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(torch.randn(heads, 7, 4))

        def forward(self, q, mask):
            b, n = mask.shape
            qh = q.view(b, n, heads, 4).permute(0, 2, 1, 3).reshape(-1, n, 4)  # [b h, n, 4]
            pos = self.table.repeat(b, 1, 1)  # [b h, 7, 4]
            att = torch.bmm(qh, pos.transpose(-1, -2))  # [b h, n, 7]
            rel = torch.arange(n)[:, None] - torch.arange(n)[None, :]
            idx = torch.clamp(rel + 3, 0, 6).expand([qh.size(0), n, n])
            s = torch.gather(att, -1, idx) + torch.bmm(qh, qh.transpose(-1, -2))
            s = s.view(-1, heads, n, n).masked_fill(~mask.bool()[:, None, None, :], -1e4)
            return s.softmax(-1).sum(1)

    model = Folded()
    b, n = torch.export.Dim("b", min=1, max=8), torch.export.Dim("n", min=2, max=32)
    q, mask = torch.randn(2, 6, heads * 4), torch.ones(2, 6, dtype=torch.long)
    prog = export(model, (q, mask), dynamic_shapes=({0: b, 1: n}, {0: b, 1: n}))
    summary = delegation_summary(prog)
    assert summary["kiln"] == 1 and not summary["ops"], summary
    for bs, length in ((1, 5), (3, 11)):
        q = torch.randn(bs, length, heads * 4)
        mask = (torch.rand(bs, length) > 0.3).long()
        mask[:, 0] = 1
        out = run_program(prog, "forward", (q, mask))
        assert_close(out, (model(q, mask),))


def test_alibi_repeat_and_merged_views_match_eager():
    """BLOOM's ALiBi at a dynamic batch and length: a bias over a symbolic length repeated a
    symbolic number of times (repeat of a symbolic shape and count), and scores viewed as
    [batch, heads, L, -1] and back as [batch * heads, L, -1] (the -1 a known length, the
    product inferred): one delegate, right at other sizes."""

    class Alibi(nn.Module):
        def forward(self, x):
            b, n, _ = x.shape
            slopes = torch.tensor([0.5, 0.25, 0.125])
            alibi = (slopes[:, None, None] * torch.arange(n)).repeat(b, 1, 1)  # [b h, 1, n]
            q = x.view(b, n, 3, 4).permute(0, 2, 1, 3).reshape(b * 3, n, 4)
            s = torch.baddbmm(alibi, q, q.transpose(1, 2), alpha=0.5)  # [b h, n, n]
            p = s.view(b, 3, n, -1).softmax(-1)
            return p.view(b * 3, n, -1).sum(1)

    model = Alibi()
    b, n = torch.export.Dim("b", min=1, max=8), torch.export.Dim("n", min=2, max=32)
    prog = export(model, (torch.randn(2, 5, 12),), dynamic_shapes=({0: b, 1: n},))
    summary = delegation_summary(prog)
    assert summary["kiln"] == 1 and not summary["ops"], summary
    for bs, length in ((1, 7), (3, 19)):
        x = torch.randn(bs, length, 12)
        assert_close(run_program(prog, "forward", (x,)), (model(x),))


def run_program(prog, method, inputs):
    import kiln_executorch_runtime  # noqa: F401 - registers KilnBackend
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(prog.buffer)
    return program.load_method(method).execute(list(inputs))


@pytest.mark.parametrize("causal", [True, False])
def test_sdpa_enable_gqa_reads_the_kv_heads(tmp_path, causal):
    """sdpa(enable_gqa=True) with 8 query heads over 2 key/value heads is one sdpa layer that
    reads the 2 heads broadcast over their groups ([B, 2, 1, S, E] against q's [B, 2, 4, L, E]),
    with no repeat of k or v made, and matches eager."""
    import io
    import json
    from contextlib import redirect_stdout

    from kiln._cli import main as kiln_main

    def attend(m, q, k, v, a):
        if causal:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=a, enable_gqa=True)

    model = Fn(attend).eval()
    makers = [r(2, 8, 20, 16), r(2, 2, 24, 16), r(2, 2, 24, 16), r(20, 24)]
    prog = export(model, tuple(m() for m in makers))
    summary = delegation_summary(prog)
    assert summary["kiln"] == 1 and not summary["ops"], summary
    path = tmp_path / "gqa.pte"
    path.write_bytes(prog.buffer)
    out = io.StringIO()
    with redirect_stdout(out):
        assert kiln_main(["inspect", "--json", str(path)]) == 0
    layers = [la for e in json.loads(out.getvalue())["engines"] for la in e["layers"]]
    ops = [la["op"] for la in layers]
    assert ops.count("sdpa") == 1 and "expand" not in ops and "softmax" not in ops, ops
    (sdpa,) = [la for la in layers if la["op"] == "sdpa"]
    q, k, v = (t["dim_max"] for t in sdpa["inputs"][:3])
    assert q == [2, 2, 4, 20, 16] and k == v == [2, 2, 1, 24, 16], sdpa
    assert sdpa["attrs"]["is_causal"] == [int(causal)], sdpa
    fresh = tuple(m() for m in makers)
    with torch.no_grad():
        expected = model(*fresh)
    assert_close(run_program(prog, "forward", fresh), (expected,))


@pytest.mark.parametrize(
    "mode, padding, why",
    [("bicubic", "zeros", "bicubic mode"), ("bilinear", "reflection", "reflection padding")],
)
def test_grid_sample_modes_kiln_lacks_are_named(mode, padding, why):
    """A grid_sample mode Kiln has no form for stays with ExecuTorch, named with the reason."""
    model = Fn(lambda m, x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding) * 2)
    x, g = torch.randn(1, 2, 5, 6), torch.rand(1, 3, 4, 2) * 2 - 1
    with pytest.raises(KilnStrictError) as ei:
        export(model.eval(), (x, g), strict=True, quiet=True)
    (r,) = ei.value.rejected
    assert "grid_sampler" in r["op"] and why in r["reason"], r


def test_pure_data_movement_stays_in_executorch():
    """A partition that only moves data is not worth a delegate call."""
    model = Fn(lambda m, x: x.transpose(0, 1)[1:].reshape(-1))
    prog = export(model, (torch.randn(3, 4),))
    assert delegation_summary(prog)["kiln"] == 0


@pytest.mark.parametrize("name", sorted(CASES))
def test_op(name):
    model, makers = CASES[name]
    model.eval()
    example = tuple(m() for m in makers)
    prog = export(model, example)
    summary = delegation_summary(prog)
    assert summary["kiln"] >= 1, f"{name}: nothing delegated to Kiln"
    assert not summary["ops"], f"{name}: left to ExecuTorch: {summary['ops']}"
    fresh = tuple(m() for m in makers)
    out = run_program(prog, "forward", fresh)
    with torch.no_grad():
        expected = model(*fresh)
    if isinstance(expected, torch.Tensor):
        expected = (expected,)
    assert_close(out, expected)
