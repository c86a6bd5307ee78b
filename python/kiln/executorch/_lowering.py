"""Edge/ATen op -> Kiln op translation, shared by the partitioner and KilnBackend.preprocess.

The table below holds, per ATen op, only the Kiln op name(s) it becomes and how its arguments
translate. Everything else (op ids, attribute schemas, supported dtypes, shape rules) is read
from libkiln: the partitioner decides whether Kiln supports a node by translating it into a
one-node scratch graph through the real C graph API (kiln_graph_add_node runs the same shape and
dtype inference as the builder), so Python and C cannot disagree.

Dynamic dimensions: symbolic sizes in ``node.meta["val"]`` are bounded with the program's range
constraints (see :class:`Ranges`); reshape/expand sizes given as SymInts become Kiln shape codes
(-1 infer/keep, <= -2 copy a dimension of x or of a ``like`` input); a size that cannot be
expressed that way makes the node unsupported.
"""

from __future__ import annotations

import logging
import math
import operator
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sympy
import torch
from torch.fx import Node

from .. import _graph, _lib, _ops

log = logging.getLogger("kiln.executorch")

# Upper bound used for a dynamic dimension the export left unbounded (torch's int_oo). Kiln plans
# memory for the largest shapes, so an unbounded dimension needs a cap: declare
# torch.export.Dim(..., max=N) to choose it yourself.
DEFAULT_DIM_MAX = 4096
# Kiln's largest dimension (src/ir/shape.h: KILN_SHAPE_MAX_DIM).
KILN_SHAPE_MAX_DIM = 1 << 40
# aten.full constants larger than this are left to ExecuTorch.
MAX_FOLDED_FULL_NUMEL = 1 << 16
# A value computed from constants alone (position ids, masks and rotary tables of static shapes,
# window indices) that Kiln has no op for is evaluated with PyTorch at lowering time and becomes
# a Kiln constant when it has at most this many elements (16 MiB of float32).
MAX_FOLDED_NUMEL = 1 << 22
# Ops never folded: their results are not a function of their arguments.
_NOT_FOLDABLE = ("rand", "dropout", "bernoulli", "normal", "uniform", "empty", "multinomial")


class Unsupported(Exception):
    """The node cannot be translated into Kiln (the message says why)."""


# --- dynamic dimension ranges


class Ranges:
    """Bounds of symbolic dimensions, from an ExportedProgram's range constraints.

    A symbol's lower bound is raised to at least 1, and a lower bound of 2 is lowered to 1:
    torch.export reports 2 for a dimension declared with ``min`` 0 or 1 (its 0/1
    specialization), and ExecuTorch runs such programs at size 1. An unbounded upper bound
    becomes :data:`DEFAULT_DIM_MAX` (with a warning).
    """

    def __init__(self, range_constraints=None, dim_max_default: int = DEFAULT_DIM_MAX):
        from torch.utils._sympy.value_ranges import ValueRanges

        self._cap = dim_max_default
        self._warned: set = set()
        self._vr = {}
        self._raw = dict(range_constraints or {})
        for sym, vr in self._raw.items():
            self._vr[sym] = ValueRanges(*self._adjust(sym, vr.lower, vr.upper))

    def _adjust(self, sym, lo, hi) -> tuple[int, int]:
        lo_i = _to_int(lo, 0)
        lo_i = 1 if lo_i <= 2 else lo_i
        hi_i = _to_int(hi, None)
        if hi_i is None:
            if sym not in self._warned:
                self._warned.add(sym)
                warnings.warn(
                    f"Kiln: dynamic dimension {sym} has no upper bound; Kiln plans it for at "
                    f"most {self._cap}. Declare torch.export.Dim(..., max=N) to choose the bound.",
                    stacklevel=4,
                )
            hi_i = self._cap
        hi_i = min(hi_i, KILN_SHAPE_MAX_DIM)
        return lo_i, max(lo_i, hi_i)

    def bounds(self, dim) -> tuple[int, int]:
        """[min, max] of one dimension (an int, a SymInt or a sympy expression)."""
        if isinstance(dim, int):
            return dim, dim
        expr = dim.node.expr if isinstance(dim, torch.SymInt) else dim
        if isinstance(expr, sympy.Integer) or getattr(expr, "is_number", False):
            v = int(expr)
            return v, v
        from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

        ranges = dict(self._vr)
        for s in expr.free_symbols:
            if s not in ranges:
                vr = None
                if isinstance(dim, torch.SymInt):
                    vr = dim.node.shape_env.var_to_range.get(s)
                lo, hi = (vr.lower, vr.upper) if vr is not None else (0, None)
                ranges[s] = ValueRanges(*self._adjust(s, lo, hi))
        vr = bound_sympy(expr, ranges)
        lo = max(0, _to_int(vr.lower, 0))
        hi = _to_int(vr.upper, None)
        hi = KILN_SHAPE_MAX_DIM if hi is None else min(hi, KILN_SHAPE_MAX_DIM)
        return lo, max(lo, hi)


def _to_int(v, default):
    try:
        if v is None:
            return default
        if isinstance(v, int):
            return v
        if v in (sympy.oo, -sympy.oo) or str(v) in ("int_oo", "-int_oo", "oo", "-oo"):
            return default
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return default


def sym_expr(v):
    """The sympy expression of a SymInt (or an int as sympy.Integer)."""
    if isinstance(v, torch.SymInt):
        return v.node.expr
    if isinstance(v, int):
        return sympy.Integer(v)
    return None


# --- node helpers


def op_overload(node: Node):
    """The ATen OpOverload behind an fx node (edge ops unwrapped), or None."""
    t = node.target
    inner = getattr(t, "_op", None)
    if isinstance(inner, torch._ops.OpOverload):
        return inner
    if isinstance(t, torch._ops.OpOverload):
        return t
    return None


def target_name(node: Node) -> str:
    op = op_overload(node)
    if op is not None:
        return str(op)
    t = node.target
    return getattr(t, "__name__", str(t))


def is_tensor_node(n) -> bool:
    return isinstance(n, Node) and isinstance(n.meta.get("val"), torch.Tensor)


_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_sym_node(n) -> bool:
    """A node computing a symbolic scalar (sym_size, SymInt arithmetic)."""
    return (
        isinstance(n, Node)
        and n.op == "call_function"
        and isinstance(n.meta.get("val"), _SYM_TYPES)
    )


def bind_args(node: Node) -> dict:
    """Arguments of a node by schema name, defaults filled in."""
    op = op_overload(node)
    if op is None:
        raise Unsupported(f"{node.target} is not an ATen operator")
    out = {}
    args = list(node.args)
    for i, a in enumerate(op._schema.arguments):
        if not a.kwarg_only and i < len(args):
            out[a.name] = args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            out[a.name] = None
    return out


def _meta(n):
    v = n.meta.get("val") if isinstance(n, Node) else None
    if not isinstance(v, torch.Tensor):
        raise Unsupported(f"'{getattr(n, 'name', n)}' is not a tensor")
    return v


def _ints(v, n: int | None = None, what: str = "argument") -> list[int]:
    """A list of Python ints (a scalar is repeated to n entries); SymInts are unsupported."""
    if isinstance(v, (list, tuple)):
        vals = list(v)
    else:
        vals = [v]
    out = []
    for x in vals:
        if isinstance(x, bool) or not isinstance(x, int):
            if isinstance(x, torch.SymInt) or isinstance(x, Node):
                raise Unsupported(f"{what} is symbolic ({x}); Kiln needs a constant")
            raise Unsupported(f"{what} = {x!r} is not an integer")
        out.append(int(x))
    if n is not None and len(out) == 1 and n > 1:
        out = out * n
    if n is not None and len(out) != n:
        raise Unsupported(f"{what} has {len(out)} values; expected {n}")
    return out


def _static_int(v, what: str) -> int:
    if isinstance(v, Node):
        val = v.meta.get("val")
        e = sym_expr(val)
        if e is not None and e.is_number:
            return int(e)
        raise Unsupported(f"{what} is symbolic ({val}); Kiln needs a constant")
    if isinstance(v, torch.SymInt):
        e = v.node.expr
        if e.is_number:
            return int(e)
        raise Unsupported(f"{what} is symbolic ({v}); Kiln needs a constant")
    if isinstance(v, bool) or not isinstance(v, int):
        raise Unsupported(f"{what} = {v!r} is not an integer")
    return int(v)


# --- the lowerer


class Lowerer:
    """Translates fx nodes into nodes of a Kiln graph.

    In check mode (the partitioner) every tensor argument that has no Kiln value yet becomes a
    graph input with the shape range from its ``meta["val"]``, so one node can be checked
    alone. In build mode (preprocess) every argument must have been lowered or added first.

    ``constants`` maps placeholder nodes of the program's constants (parameters, buffers, lifted
    constants) to their data (None: not available), for handlers that read constant arguments
    (embedding bag offsets) in check mode; in build mode :meth:`add_constant` records them.
    """

    def __init__(
        self,
        graph: _graph.Graph,
        ranges: Ranges,
        check: bool = False,
        constants: dict[Node, torch.Tensor | None] | None = None,
        foldable: set[Node] | None = None,
    ):
        self.g = graph
        # Nodes computed from constants alone (see foldable_nodes); in build mode (foldable None)
        # found from the constants added so far.
        self.foldable = foldable
        self._fold_cache: dict[Node, object] = {}
        self.folded_nodes: set[Node] = set()
        self.ranges = ranges
        self.check = check
        self.env: dict[Node, list] = {}
        self.const_data: dict[Node, torch.Tensor | None] = dict(constants or {})
        self._scalars: dict = {}
        self._n_auto = 0
        self.constant_values: set[int] = set()  # ids of Kiln constants (weights, scalars)
        self.state_values: dict[Node, int] = {}  # placeholders of mutated buffers -> states

    # values

    def dim_bounds(self, t: torch.Tensor) -> tuple[list[int], list[int]]:
        lo, hi = [], []
        for d in t.shape:
            a, b = self.ranges.bounds(d)
            lo.append(a)
            hi.append(b)
        return lo, hi

    def add_input(self, node: Node, name: str | None = None) -> int:
        t = _meta(node)
        if t.dim() > _lib.KILN_MAX_RANK:
            raise Unsupported(f"'{node.name}' has rank {t.dim()} > {_lib.KILN_MAX_RANK}")
        try:
            dt = _graph.kiln_dtype(t.dtype)
        except KeyError as e:
            raise Unsupported(str(e)) from None
        lo, hi = self.dim_bounds(t)
        v = self._call(lambda: self.g.add_input(name or node.name, dt, lo, hi))
        self.env[node] = [v]
        return v

    def add_constant(self, node: Node, tensor: torch.Tensor) -> int | None:
        """A program constant as a Kiln constant; one of a dtype Kiln has no tensors for
        (float64) gets no Kiln value and serves only values folded from it."""
        self.const_data[node] = tensor
        try:
            _graph.kiln_dtype(tensor.dtype)
        except KeyError:
            self.env[node] = [None]
            return None
        v = self._call(lambda: self.g.add_constant(node.name, tensor))
        self.constant_values.add(v)
        self.const_data[node] = tensor
        self.env[node] = [v]
        return v

    def add_state(self, node: Node, initial: torch.Tensor) -> int:
        """A mutated buffer as a Kiln state (kept by each context from one execute to the
        next), starting from ``initial``; an all-zero buffer is given no data (the engine
        starts it at zeros)."""
        t = initial.detach()
        if t.dim() > _lib.KILN_MAX_RANK:
            raise Unsupported(f"buffer '{node.name}' has rank {t.dim()} > {_lib.KILN_MAX_RANK}")
        try:
            dt = _graph.kiln_dtype(t.dtype)
        except KeyError as e:
            raise Unsupported(str(e)) from None
        data = t if t.numel() and bool(t.ne(0).any()) else None
        v = self._call(lambda: self.g.add_state(node.name, dt, list(t.shape), data))
        self.env[node] = [v]
        self.state_values[node] = v
        return v

    def value(self, arg) -> int:
        if not isinstance(arg, Node):
            raise Unsupported(f"expected a tensor, got {arg!r}")
        vals = self.env.get(arg)
        if vals is None:
            if not self.check:
                raise Unsupported(f"'{arg.name}' has no Kiln value (it is outside the partition)")
            _meta(arg)
            return self.add_input(arg, f"in{len(self.env)}_{arg.name}"[:200])
        if len(vals) != 1 or vals[0] is None:
            raise Unsupported(f"'{arg.name}' has several outputs")
        return vals[0]

    def dtype(self, arg) -> torch.dtype:
        return _meta(arg).dtype

    def rank(self, arg) -> int:
        return _meta(arg).dim()

    def scalar(self, value, dtype: torch.dtype) -> int:
        """A 0-d constant of the given dtype (scalars of binary ops, clamp bounds, ...)."""
        if isinstance(value, (Node, torch.SymInt, torch.SymFloat)):
            raise Unsupported(f"scalar {value} is symbolic")
        if not isinstance(value, (bool, int, float)):
            raise Unsupported(f"scalar {value!r} is not a number")
        if dtype not in _graph.TORCH_TO_KILN:
            raise Unsupported(f"Kiln has no dtype for {dtype}")
        if not dtype.is_floating_point and dtype != torch.bool:
            if isinstance(value, float) and not float(value).is_integer():
                raise Unsupported(f"scalar {value} does not fit {dtype}")
        key = (repr(value), type(value).__name__, dtype)
        if key not in self._scalars:
            t = torch.tensor(value, dtype=dtype)
            self._n_auto += 1
            name = f"scalar{self._n_auto}"
            self._scalars[key] = self._call(lambda: self.g.add_constant(name, t))
            self.constant_values.add(self._scalars[key])
        return self._scalars[key]

    def const_tensor(self, t: torch.Tensor, name: str) -> int:
        if t.dtype not in _graph.TORCH_TO_KILN:
            raise Unsupported(f"Kiln has no dtype for {t.dtype}")
        v = self._call(lambda: self.g.add_constant(name, t))
        self.constant_values.add(v)
        return v

    def op(self, name: str, inputs: Sequence[int | None], attrs: dict | None = None) -> int:
        outs = self._call(lambda: self.g.add_node(name, list(inputs), attrs or {}, what=name))
        return outs[0]

    def cast(self, v: int, src: torch.dtype, dst: torch.dtype) -> int:
        if src == dst:
            return v
        if dst not in _graph.TORCH_TO_KILN:
            raise Unsupported(f"Kiln has no dtype for {dst}")
        return self.op("cast", [v], {"dtype": _graph.TORCH_TO_KILN[dst]})

    def operand(self, arg, dtype: torch.dtype) -> int:
        """A tensor argument cast to dtype, or a scalar as a 0-d constant of dtype."""
        if isinstance(arg, Node):
            return self.cast(self.value(arg), self.dtype(arg), dtype)
        return self.scalar(arg, dtype)

    def _call(self, fn):
        try:
            return fn()
        except _lib.KilnError as e:
            raise Unsupported(str(e)) from None
        except KeyError as e:
            raise Unsupported(str(e).strip("'\"")) from None

    # nodes

    def lower(self, node: Node) -> list:
        """Adds the Kiln nodes of one fx node; records and returns its values (one per output,
        None for outputs Kiln does not produce)."""
        if node.target is operator.getitem:
            src, idx = node.args
            vals = self.env.get(src)
            if vals is None:
                raise Unsupported(f"getitem of '{getattr(src, 'name', src)}' outside Kiln")
            if not isinstance(idx, int) or idx >= len(vals) or vals[idx] is None:
                raise Unsupported(f"output {idx} of '{src.name}' is not produced by Kiln")
            self.env[node] = [vals[idx]]
            return self.env[node]
        if is_sym_node(node):
            self.env[node] = [None]
            return self.env[node]
        name = target_name(node)
        handler = HANDLERS.get(name)
        try:
            if handler is None:
                raise Unsupported(f"{name} has no Kiln translation")
            out = handler.fn(self, node, bind_args(node))
        except Unsupported as e:
            if not self.is_foldable(node):
                raise
            out = self.fold(node, e)
            self.folded_nodes.add(node)
        vals = out if isinstance(out, list) else [out]
        self.env[node] = vals
        return vals

    # constant folding at lowering time (values computed from constants alone)

    def is_foldable(self, node: Node) -> bool:
        if self.foldable is not None:
            return node in self.foldable
        if node not in self._fold_cache:
            self._fold_cache[node] = None  # a cycle guard; replaced below
            ok = _fold_candidate(node) and all(
                (a.op == "placeholder" and self.const_data.get(a) is not None)
                or (a.op == "call_function" and self.is_foldable(a))
                for a in node.all_input_nodes
            )
            self._fold_cache[node] = ok
        return bool(self._fold_cache[node])

    def folded_value(self, node: Node):
        """The value of a node computed from constants alone, by PyTorch eager."""
        key = ("value", node)
        if key in self._fold_cache:
            return self._fold_cache[key]
        if node.op == "placeholder":
            t = self.const_data.get(node)
            if t is None:
                raise Unsupported(f"constant '{node.name}' has no data to fold with")
            v = t
        else:
            args = torch.fx.node.map_arg(node.args, self.folded_value)
            kwargs = torch.fx.node.map_arg(node.kwargs, self.folded_value)
            with torch.no_grad():
                v = node.target(*args, **kwargs)
        self._fold_cache[key] = v
        return v

    def fold(self, node: Node, why: Exception):
        """A node Kiln cannot translate whose value depends on constants only: its value as Kiln
        constants (one per output). An output Kiln cannot hold (float64, too large) gives None:
        the node is then taken only together with its users, which fold through it."""
        vals = node.meta.get("val")
        metas = list(vals) if isinstance(vals, (list, tuple)) else [vals]
        out: list = []
        for i, m in enumerate(metas):
            if (
                not isinstance(m, torch.Tensor)
                or m.dtype not in _graph.TORCH_TO_KILN
                or m.numel() > MAX_FOLDED_NUMEL
            ):
                out.append(None)
                continue
            if self.check:
                t = torch.zeros(m.shape, dtype=m.dtype)
            else:
                v = self.folded_value(node)
                t = v[i] if isinstance(vals, (list, tuple)) else v
                if not isinstance(t, torch.Tensor) or t.dtype != m.dtype or t.shape != m.shape:
                    raise Unsupported(f"folding '{node.name}' gave {t!r}, not {m.dtype} {m.shape}")
                t = t.contiguous()
            self._n_auto += 1
            out.append(self.const_tensor(t, f"folded{self._n_auto}_{node.name}"[:200]))
        if all(o is None for o in out) and not node.users:
            raise Unsupported(f"{why} (and its value cannot be folded)")
        return out if isinstance(vals, (list, tuple)) else out[0]


def _static_meta(v) -> bool:
    if isinstance(v, torch.Tensor):
        return all(sym_expr(d) is not None and sym_expr(d).is_number for d in v.shape)
    if isinstance(v, (list, tuple)):
        return bool(v) and all(x is None or _static_meta(x) for x in v)
    return False


def _fold_candidate(node: Node) -> bool:
    """An op whose value is a function of its arguments with static-shape tensor outputs."""
    if node.op != "call_function" or node.target is operator.getitem or is_sym_node(node):
        return False
    name = target_name(node)
    if any(k in name for k in _NOT_FOLDABLE):
        return False
    return _static_meta(node.meta.get("val"))


def foldable_nodes(graph: torch.fx.Graph, constants: dict[Node, object]) -> set[Node]:
    """The call_function nodes computed from constants alone (program constants, literals,
    shapes that are static): Kiln can take them as constants folded at lowering time."""
    out: set[Node] = set()
    for n in graph.nodes:
        if _fold_candidate(n) and all(
            a in out or (a.op == "placeholder" and a in constants) for a in n.all_input_nodes
        ):
            out.add(n)
    return out


# --- the translation table


@dataclass(frozen=True)
class Handler:
    aten: str
    kiln_ops: tuple[str, ...]  # the Kiln ops it may emit (checked against the library)
    fn: Callable


HANDLERS: dict[str, Handler] = {}


def _handles(*aten_names: str, kiln: Sequence[str] | str):
    kops = (kiln,) if isinstance(kiln, str) else tuple(kiln)

    def deco(fn):
        for a in aten_names:
            HANDLERS[a] = Handler(a, kops, fn)
        return fn

    return deco


def _out_dtype(node: Node) -> torch.dtype:
    v = node.meta.get("val")
    if isinstance(v, (list, tuple)):
        v = v[0]
    if not isinstance(v, torch.Tensor):
        raise Unsupported(f"'{node.name}' does not produce a tensor")
    return v.dtype


def _unary(kop: str):
    def fn(L: Lowerer, node: Node, a: dict):
        x = a["self"] if "self" in a else a["input"]
        out = _out_dtype(node)
        return L.op(kop, [L.cast(L.value(x), L.dtype(x), out)])

    return fn


for _aten, _kop in [
    ("relu", "relu"),
    ("silu", "silu"),
    ("sigmoid", "sigmoid"),
    ("tanh", "tanh"),
    ("hardswish", "hardswish"),
    ("hardsigmoid", "hardsigmoid"),
    ("neg", "neg"),
    ("sqrt", "sqrt"),
    ("rsqrt", "rsqrt"),
    ("exp", "exp"),
    ("log", "log"),
    ("log1p", "log1p"),
    ("erf", "erf"),
    ("cos", "cos"),
    ("sin", "sin"),
    ("abs", "abs"),
    ("sign", "sign"),
    ("ceil", "ceil"),
    ("floor", "floor"),
    ("trunc", "trunc"),
    ("round", "round"),
]:
    _handles(f"aten.{_aten}.default", kiln=_kop)(_unary(_kop))


@_handles("aten.gelu.default", kiln=("gelu", "cast"))
def _gelu(L, node, a):
    approx = {"none": 0, "tanh": 1}.get(a["approximate"])
    if approx is None:
        raise Unsupported(f"gelu approximate={a['approximate']!r}")
    x = a["self"]
    return L.op("gelu", [L.cast(L.value(x), L.dtype(x), _out_dtype(node))], {"approximate": approx})


def _clamp_bound(v, what):
    if v is None:
        return None
    if isinstance(v, (Node, torch.SymInt, torch.SymFloat)):
        raise Unsupported(f"clamp {what} is symbolic")
    return float(v)


@_handles("aten.clamp.default", kiln=("clamp", "cast"))
def _clamp(L, node, a):
    x = a["self"]
    lo, hi = _clamp_bound(a["min"], "min"), _clamp_bound(a["max"], "max")
    return L.op("clamp", [L.cast(L.value(x), L.dtype(x), _out_dtype(node))], {"min": lo, "max": hi})


@_handles("aten.clamp.Tensor", kiln=("maximum", "minimum", "cast"))
def _clamp_tensor(L, node, a):
    """clamp with tensor bounds (T5's float16 overflow guard) as minimum(maximum(x, min), max):
    NaN in x stays NaN, and min > max gives max, as torch.clamp."""
    out = _out_dtype(node)
    v = L.operand(a["self"], out)
    if a.get("min") is not None:
        v = L.op("maximum", [v, L.operand(a["min"], out)])
    if a.get("max") is not None:
        v = L.op("minimum", [v, L.operand(a["max"], out)])
    return v


@_handles("aten.hardtanh.default", kiln="clamp")
def _hardtanh(L, node, a):
    lo, hi = _clamp_bound(a["min_val"], "min"), _clamp_bound(a["max_val"], "max")
    return L.op("clamp", [L.value(a["self"])], {"min": lo, "max": hi})


@_handles("aten.relu6.default", kiln="clamp")
def _relu6(L, node, a):
    return L.op("clamp", [L.value(a["self"])], {"min": 0.0, "max": 6.0})


def _static_float(v, what: str) -> float:
    if isinstance(v, (Node, torch.SymInt, torch.SymFloat)):
        raise Unsupported(f"{what} is symbolic")
    return float(v)


@_handles("aten.leaky_relu.default", kiln=("maximum", "minimum", "mul", "where", "gt", "cast"))
def _leaky_relu(L, node, a):
    """leaky_relu(x, slope) is x where x > 0, else x * slope. With 0 < slope <= 1 that is
    max(x, x * slope), with slope > 1 min(x, x * slope): the same values, signed zeros, NaN and
    infinities included (x * slope, rounded, cannot pass x); a slope of 0 (inf * 0 is NaN) or
    below takes where(x > 0, x, x * slope)."""
    out = _out_dtype(node)
    slope = _static_float(a["negative_slope"], "leaky_relu's negative_slope")
    x = L.operand(a["self"], out)
    sx = L.op("mul", [x, L.scalar(slope, out)])
    if 0.0 < slope <= 1.0:
        return L.op("maximum", [x, sx])
    if slope > 1.0:
        return L.op("minimum", [x, sx])
    return L.op("where", [L.op("gt", [x, L.scalar(0.0, out)]), x, sx])


@_handles("aten.elu.default", kiln=("exp", "sub", "mul", "where", "gt", "cast"))
def _elu(L, node, a):
    """elu(x, alpha, scale, input_scale) (ELU; SELU is one with its constants) as
    where(x > 0, x * scale, (exp(x * input_scale) - 1) * alpha * scale). exp(v) - 1 stands for
    PyTorch's expm1: within one float32 rounding of 1 (about 6e-8) of it, absolutely."""
    out = _out_dtype(node)
    if not out.is_floating_point:
        raise Unsupported(f"elu of {out}")
    alpha = _static_float(a["alpha"], "elu's alpha")
    scale = _static_float(a["scale"], "elu's scale")
    in_scale = _static_float(a["input_scale"], "elu's input_scale")
    x = L.operand(a["self"], out)
    pos = x if scale == 1.0 else L.op("mul", [x, L.scalar(scale, out)])
    e = x if in_scale == 1.0 else L.op("mul", [x, L.scalar(in_scale, out)])
    neg = L.op("sub", [L.op("exp", [e]), L.scalar(1.0, out)])
    neg = L.op("mul", [neg, L.scalar(alpha * scale, out)])
    return L.op("where", [L.op("gt", [x, L.scalar(0.0, out)]), pos, neg])


@_handles("aten.reciprocal.default", kiln=("div", "cast"))
def _reciprocal(L, node, a):
    """1 / x (the same IEEE division PyTorch does)."""
    out = _out_dtype(node)
    return L.op("div", [L.scalar(1.0, out), L.operand(a["self"], out)])


def _log_base(base: float):
    def fn(L, node, a):
        out = _out_dtype(node)
        v = L.op("log", [L.operand(a["self"], out)])
        return L.op("mul", [v, L.scalar(1.0 / math.log(base), out)])

    return fn


# log2 and log10 as log(x) / log(base): within a float32 rounding or two of PyTorch's
_handles("aten.log2.default", kiln=("log", "mul", "cast"))(_log_base(2.0))
_handles("aten.log10.default", kiln=("log", "mul", "cast"))(_log_base(10.0))


@_handles("aten.isnan.default", kiln="ne")
def _isnan(L, node, a):
    """isnan(x) as x != x (true for NaN only; integer and bool tensors never are)."""
    x = L.value(a["self"])
    return L.op("ne", [x, x])


def _binary(kop: str, has_alpha: bool = False):
    def fn(L: Lowerer, node: Node, a: dict):
        out = _out_dtype(node)
        op = kop
        mode = a.get("rounding_mode") if kop == "div" else None
        if mode == "floor":
            op = "floor_divide"
        elif mode not in (None, "trunc"):
            raise Unsupported(f"div rounding_mode={mode!r}")
        lhs = L.operand(a["self"], out)
        rhs = L.operand(a["other"], out)
        if mode == "trunc":
            if out.is_floating_point:
                return L.op("trunc", [L.op("div", [lhs, rhs])])
            # integers: sign(a) sign(b) (|a| // |b|), exact (C's / without its UB cases)
            q = L.op("floor_divide", [L.op("abs", [lhs]), L.op("abs", [rhs])])
            return L.op("mul", [L.op("mul", [L.op("sign", [lhs]), L.op("sign", [rhs])]), q])
        alpha = a.get("alpha", 1) if has_alpha else 1
        if isinstance(alpha, (Node, torch.SymInt, torch.SymFloat)):
            raise Unsupported("alpha is symbolic")
        if alpha != 1:
            if isinstance(a["other"], Node):
                rhs = L.op("mul", [rhs, L.scalar(alpha, out)])
            else:
                rhs = L.scalar(a["other"] * alpha, out)
        return L.op(op, [lhs, rhs])

    return fn


for _name, _kop, _alpha in [
    ("add", "add", True),
    ("sub", "sub", True),
    ("mul", "mul", False),
    ("div", "div", False),
]:
    _overloads = [f"aten.{_name}.Tensor", f"aten.{_name}.Scalar"]
    if _name == "div":
        _overloads += ["aten.div.Tensor_mode", "aten.div.Scalar_mode"]
    _ks = (_kop, "cast", "mul") if _alpha else (_kop, "cast")
    if _name == "div":
        _ks += ("floor_divide", "trunc", "abs", "sign", "mul")
    _handles(*_overloads, kiln=_ks)(_binary(_kop, _alpha))

# Python's % (the divisor's sign), C's fmod (the dividend's sign) and //, any float or int dtype
for _name, _overloads in [
    (
        "remainder",
        ["aten.remainder.Tensor", "aten.remainder.Scalar", "aten.remainder.Scalar_Tensor"],
    ),
    ("fmod", ["aten.fmod.Tensor", "aten.fmod.Scalar"]),
    ("floor_divide", ["aten.floor_divide.default", "aten.floor_divide.Scalar"]),
    ("maximum", ["aten.maximum.default"]),
    ("minimum", ["aten.minimum.default"]),
]:
    _handles(*_overloads, kiln=(_name, "cast"))(_binary(_name))


@_handles("aten.rsub.Scalar", "aten.rsub.Tensor", kiln=("sub", "mul", "cast"))
def _rsub(L, node, a):
    out = _out_dtype(node)
    alpha = a.get("alpha", 1)
    if isinstance(alpha, (Node, torch.SymInt, torch.SymFloat)):
        raise Unsupported("alpha is symbolic")
    x = L.operand(a["self"], out)
    if alpha != 1:
        x = L.op("mul", [x, L.scalar(alpha, out)])
    return L.op("sub", [L.operand(a["other"], out), x])


@_handles("aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar", kiln=("pow", "cast"))
def _pow(L, node, a):
    out = _out_dtype(node)
    return L.op("pow", [L.operand(a["self"], out), L.operand(a["exponent"], out)])


@_handles("aten.pow.Scalar", kiln=("pow", "cast"))
def _pow_scalar(L, node, a):
    out = _out_dtype(node)
    return L.op("pow", [L.operand(a["self"], out), L.operand(a["exponent"], out)])


@_handles(
    "aten.where.self",
    "aten.where.ScalarSelf",
    "aten.where.ScalarOther",
    "aten.where.Scalar",
    kiln=("where", "cast"),
)
def _where(L, node, a):
    out = _out_dtype(node)
    cond = a["condition"]
    if not isinstance(cond, Node) or L.dtype(cond) != torch.bool:
        raise Unsupported("where needs a bool tensor condition")
    return L.op("where", [L.value(cond), L.operand(a["self"], out), L.operand(a["other"], out)])


# comparisons and logical / bitwise ops (bool results; int or bool operands)


def _promoted(a: dict, x: str, y: str) -> torch.dtype:
    """PyTorch's result dtype of a binary op over arguments x and y (tensors or scalars)."""
    vals = []
    for k in (x, y):
        v = a[k]
        vals.append(_meta(v) if isinstance(v, Node) else v)
    if not isinstance(vals[0], torch.Tensor):
        vals.reverse()
    if isinstance(vals[1], (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Unsupported("a symbolic scalar operand")
    return torch.result_type(*vals)


def _compare(kop: str):
    def fn(L: Lowerer, node: Node, a: dict):
        dt = _promoted(a, "self", "other")
        return L.op(kop, [L.operand(a["self"], dt), L.operand(a["other"], dt)])

    return fn


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _handles(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar", kiln=(_name, "cast"))(_compare(_name))


def _bitwise(kop: str):
    def fn(L: Lowerer, node: Node, a: dict):
        out = _out_dtype(node)
        return L.op(kop, [L.operand(a["self"], out), L.operand(a["other"], out)])

    return fn


for _name in ("and", "or", "xor"):
    _handles(
        f"aten.bitwise_{_name}.Tensor",
        f"aten.bitwise_{_name}.Scalar",
        kiln=(f"bitwise_{_name}", "cast"),
    )(_bitwise(f"bitwise_{_name}"))


def _truth(L: Lowerer, arg) -> int:
    """A bool value: the tensor itself if bool, else ``arg != 0``."""
    if isinstance(arg, Node) and L.dtype(arg) == torch.bool:
        return L.value(arg)
    if not isinstance(arg, Node):
        return L.scalar(bool(arg), torch.bool)
    dt = L.dtype(arg)
    return L.op("ne", [L.value(arg), L.scalar(0, dt)])


@_handles("aten.isinf.default", kiln=("abs", "eq"))
def _isinf(L, node, a):
    """isinf(x) as abs(x) == inf (integer and bool tensors are never infinite)."""
    x = a["self"]
    dt = L.dtype(x)
    if not dt.is_floating_point:
        return L.op("ne", [L.value(x), L.value(x)])  # all false, x's shape
    return L.op("eq", [L.op("abs", [L.value(x)]), L.scalar(float("inf"), dt)])


@_handles("aten.any.default", "aten.any.dim", "aten.any.dims", kiln=("ne", "cast", "sum", "gt"))
def _any(L, node, a):
    """any(x[, dim, keepdim]) as sum(cast(x != 0, float32)) > 0 over the dims (all without one):
    every term is 0 or 1, so the sum is positive exactly when one is true, in any precision."""
    x = a["self"]
    dims = a.get("dim")
    if dims is None:
        dims = []
    elif isinstance(dims, int):
        dims = [dims]
    dims = _ints(dims, None, "dim")
    keep = bool(a.get("keepdim", False))
    v = L.cast(_truth(L, x), torch.bool, torch.float32)
    if not dims and L.rank(x) == 0:
        s = L.op("copy", [v])
    else:
        s = L.op("sum", [v], {"dims": dims, "keepdim": int(keep)})
    return L.op("gt", [s, L.scalar(0.0, torch.float32)])


def _logical(kop: str):
    def fn(L: Lowerer, node: Node, a: dict):
        if _out_dtype(node) != torch.bool:
            raise Unsupported(f"logical op with output {_out_dtype(node)}")
        return L.op(kop, [_truth(L, a["self"]), _truth(L, a["other"])])

    return fn


for _name in ("and", "or", "xor"):
    _handles(f"aten.logical_{_name}.default", kiln=(f"bitwise_{_name}", "ne"))(
        _logical(f"bitwise_{_name}")
    )


@_handles("aten.bitwise_not.default", kiln="bitwise_not")
def _bitwise_not(L, node, a):
    return L.op("bitwise_not", [L.value(a["self"])])


@_handles("aten.logical_not.default", kiln=("bitwise_not", "ne", "cast"))
def _logical_not(L, node, a):
    out = _out_dtype(node)
    return L.cast(L.op("bitwise_not", [_truth(L, a["self"])]), torch.bool, out)


# matmul family


@_handles("aten.linear.default", kiln="linear")
def _linear(L, node, a):
    ins = [L.value(a["input"]), L.value(a["weight"])]
    if a["bias"] is not None:
        ins.append(L.value(a["bias"]))
    return L.op("linear", ins)


@_handles("aten.mm.default", "aten.bmm.default", kiln="matmul")
def _mm(L, node, a):
    return L.op("matmul", [L.value(a["self"]), L.value(a["mat2"])])


@_handles("aten.matmul.default", kiln="matmul")
def _matmul(L, node, a):
    if L.rank(a["self"]) < 2 or L.rank(a["other"]) < 2:
        raise Unsupported("matmul with a 1-D operand")
    return L.op("matmul", [L.value(a["self"]), L.value(a["other"])])


def _is_one(v) -> bool:
    return not isinstance(v, (Node, torch.SymInt, torch.SymFloat)) and v == 1


@_handles("aten.addmm.default", kiln=("matmul", "add", "mul", "cast"))
def _addmm(L, node, a):
    out = _out_dtype(node)
    mm = L.op("matmul", [L.value(a["mat1"]), L.value(a["mat2"])])
    if not _is_one(a["alpha"]):
        mm = L.op("mul", [mm, L.scalar(a["alpha"], out)])
    bias = L.operand(a["self"], out)
    if not _is_one(a["beta"]):
        bias = L.op("mul", [bias, L.scalar(a["beta"], out)])
    return L.op("add", [mm, bias])


# convolution, normalization, pooling


def _conv1d(L, node, a):
    """A 1-D convolution as a 2-D one of unit height: [N, C, L] -> [N, C, 1, L]."""
    if a["transposed"]:
        raise Unsupported("1-D transposed convolution")
    if any(_ints(a["output_padding"], None, "output_padding")):
        raise Unsupported("output_padding on a forward convolution")
    x = L.op("unsqueeze", [L.value(a["input"])], {"dim": 2})
    w = L.op("unsqueeze", [L.value(a["weight"])], {"dim": 2})
    ins = [x, w]
    if a["bias"] is not None:
        ins.append(L.value(a["bias"]))
    attrs = {
        "stride": [1] + _ints(a["stride"], 1, "stride"),
        "padding": [0] + _ints(a["padding"], 1, "padding"),
        "dilation": [1] + _ints(a["dilation"], 1, "dilation"),
        "groups": _static_int(a["groups"], "groups"),
    }
    return L.op("squeeze", [L.op("conv2d", ins, attrs)], {"dims": [2]})


def _conv3d(L, node, a):
    """A 3-D convolution as a 2-D one over (batch x output frame): the kt temporal taps of each
    output frame (strided slices of the time-padded input) are stacked after the channels, so
    [N, C, T, H, W] becomes [N * To, C * kt, H, W] (channel c, tap i at c * kt + i: each group's
    channels stay contiguous) and the weight [O, C/g, kt, kh, kw] is read as [O, C/g * kt, kh,
    kw]; the output [N * To, O, Ho, Wo] is put back as [N, O, To, Ho, Wo]."""
    if a["transposed"]:
        raise Unsupported("3-D transposed convolution")
    if any(_ints(a["output_padding"], None, "output_padding")):
        raise Unsupported("output_padding on a forward convolution")
    x, w = a["input"], a["weight"]
    st, pd, dl = (_ints(a[k], 3, k) for k in ("stride", "padding", "dilation"))
    t_in = _static_count(x, [2], "a 3-D convolution")
    c = _static_count(x, [1], "a 3-D convolution")
    ws = [_static_count(w, [i], "a 3-D convolution's weight") for i in range(5)]
    kt = ws[2]
    t_out = (t_in + 2 * pd[0] - dl[0] * (kt - 1) - 1) // st[0] + 1
    if t_out <= 0:
        raise Unsupported("3-D convolution with no output frame")
    if kt > 64:
        raise Unsupported("3-D convolution of more than 64 temporal taps")
    v = L.value(x)
    if pd[0]:
        v = L.op("pad", [v], {"pads": [0, 0, 0, 0, pd[0], pd[0]], "value": 0.0})
    taps = []
    for i in range(kt):
        start = i * dl[0]
        sl = L.op(
            "slice",
            [v],
            {"dim": 2, "start": start, "end": start + (t_out - 1) * st[0] + 1, "step": st[0]},
        )
        taps.append(L.op("unsqueeze", [sl], {"dim": 2}))
    u = taps[0] if kt == 1 else L.op("cat", taps, {"dim": 2})  # [N, C, kt, To, H, W]
    u = L.op("permute", [u], {"dims": [0, 3, 1, 2, 4, 5]})  # [N, To, C, kt, H, W]
    u = L.op("reshape", [u], {"shape": [-1, c * kt, -6, -7]})
    w2 = L.op("reshape", [L.value(w)], {"shape": [ws[0], ws[1] * kt, ws[3], ws[4]]})
    ins = [u, w2]
    if a["bias"] is not None:
        ins.append(L.value(a["bias"]))
    y = L.op(
        "conv2d",
        ins,
        {
            "stride": st[1:],
            "padding": pd[1:],
            "dilation": dl[1:],
            "groups": _static_int(a["groups"], "groups"),
        },
    )
    y = L.op("reshape", [y], {"shape": [-1, t_out, ws[0], -4, -5]})  # [N, To, O, Ho, Wo]
    return L.op("permute", [y], {"dims": [0, 2, 1, 3, 4]})


@_handles(
    "aten.convolution.default",
    kiln=(
        "conv2d",
        "conv_transpose2d",
        "unsqueeze",
        "squeeze",
        "pad",
        "slice",
        "cat",
        "permute",
        "reshape",
    ),
)
def _convolution(L, node, a):
    if L.rank(a["input"]) == 3 and L.rank(a["weight"]) == 3:
        return _conv1d(L, node, a)
    if L.rank(a["input"]) == 5 and L.rank(a["weight"]) == 5:
        return _conv3d(L, node, a)
    if L.rank(a["input"]) != 4 or L.rank(a["weight"]) != 4:
        raise Unsupported("only 1-D, 2-D and 3-D convolutions (3-D, 4-D or 5-D input and weight)")
    ins = [L.value(a["input"]), L.value(a["weight"])]
    if a["bias"] is not None:
        ins.append(L.value(a["bias"]))
    attrs = {
        "stride": _ints(a["stride"], 2, "stride"),
        "padding": _ints(a["padding"], 2, "padding"),
        "dilation": _ints(a["dilation"], 2, "dilation"),
        "groups": _static_int(a["groups"], "groups"),
    }
    if a["transposed"]:
        attrs["output_padding"] = _ints(a["output_padding"], 2, "output_padding")
        return L.op("conv_transpose2d", ins, attrs)
    if any(_ints(a["output_padding"], None, "output_padding")):
        raise Unsupported("output_padding on a forward convolution")
    return L.op("conv2d", ins, attrs)


@_handles("aten.col2im.default", kiln=("conv_transpose2d", "reshape"))
def _col2im(L, node, a):
    """F.fold (col2im: every column's kh x kw values added back at their window's positions)
    as a transposed convolution of groups C whose [C * kh * kw, 1, kh, kw] weight is one-hot
    (channel (c, i, j) to tap (i, j) of channel c), the blocks laid out [N, C * kh * kw, Lh, Lw].
    The transposed convolution crops the padding at both ends, fold only at the start: its
    output_padding (at most stride - 1) gives back the last rows and columns."""
    x = a["self"]
    t = _meta(x)
    if t.dim() != 3:
        raise Unsupported("col2im of an unbatched input")
    h, w = _ints(a["output_size"], 2, "output_size")
    kh, kw = _ints(a["kernel_size"], 2, "kernel_size")
    dh, dw = _ints(a["dilation"], 2, "dilation")
    ph, pw = _ints(a["padding"], 2, "padding")
    sh, sw = _ints(a["stride"], 2, "stride")
    ckk = _static_count(x, [1], "col2im")
    if ckk % (kh * kw):
        raise Unsupported("col2im channels are no multiple of the kernel's taps")
    c = ckk // (kh * kw)
    lh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    lw = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if lh <= 0 or lw <= 0 or _static_count(x, [2], "col2im") != lh * lw:
        raise Unsupported("col2im blocks do not match the output size")
    dt = L.dtype(x)
    if not dt.is_floating_point:
        raise Unsupported(f"col2im of {dt}")
    one_hot = torch.zeros(ckk, 1, kh, kw, dtype=dt)
    for k in range(ckk):
        one_hot[k, 0, (k % (kh * kw)) // kw, k % kw] = 1
    v = L.op("reshape", [L.value(x)], {"shape": [-2, ckk, lh, lw]})
    # without output_padding it gives (L - 1) * s - 2 p + d (k - 1) + 1 rows and columns
    oph = h - ((lh - 1) * sh - 2 * ph + dh * (kh - 1) + 1)
    opw = w - ((lw - 1) * sw - 2 * pw + dw * (kw - 1) + 1)
    if not (0 <= oph < max(sh, dh) and 0 <= opw < max(sw, dw)):
        raise Unsupported(f"col2im to {h}x{w} from {lh}x{lw} blocks")
    return L.op(
        "conv_transpose2d",
        [v, L.const_tensor(one_hot, f"{node.name}_taps")],
        {
            "stride": [sh, sw],
            "padding": [ph, pw],
            "dilation": [dh, dw],
            "groups": c,
            "output_padding": [oph, opw],
        },
    )


@_handles("aten.conv2d.default", kiln="conv2d")
def _conv2d(L, node, a):
    if isinstance(a["padding"], str):
        raise Unsupported(f"conv2d padding={a['padding']!r}")
    if L.rank(a["input"]) != 4:
        raise Unsupported("conv2d on a 3-D (unbatched) input")
    ins = [L.value(a["input"]), L.value(a["weight"])]
    if a["bias"] is not None:
        ins.append(L.value(a["bias"]))
    return L.op(
        "conv2d",
        ins,
        {
            "stride": _ints(a["stride"], 2, "stride"),
            "padding": _ints(a["padding"], 2, "padding"),
            "dilation": _ints(a["dilation"], 2, "dilation"),
            "groups": _static_int(a["groups"], "groups"),
        },
    )


def _bn(L, a):
    if a["running_mean"] is None or a["running_var"] is None:
        raise Unsupported("batch norm without running statistics")
    ins = [
        L.value(a["input"]),
        None if a["weight"] is None else L.value(a["weight"]),
        None if a["bias"] is None else L.value(a["bias"]),
        L.value(a["running_mean"]),
        L.value(a["running_var"]),
    ]
    return L.op("batch_norm", ins, {"eps": float(a["eps"])})


@_handles("aten._native_batch_norm_legit_no_training.default", kiln="batch_norm")
def _bn_no_training(L, node, a):
    return [_bn(L, a), None, None]


@_handles("aten._native_batch_norm_legit.no_stats", kiln="group_norm")
def _bn_input_stats(L, node, a):
    """Batch norm over the input's own statistics, as InstanceNorm runs it (F.instance_norm
    views [N, C, ...] as [1, N * C, ...]): with a batch of 1 each channel is normalized over its
    own positions, which is group_norm with one channel per group."""
    x = a["input"]
    t = _meta(x)
    if t.dim() < 3:
        raise Unsupported("batch norm over the input's statistics on fewer than 3 dims")
    n, c = sym_expr(t.shape[0]), sym_expr(t.shape[1])
    if n is None or not n.is_number or int(n) != 1:
        raise Unsupported(
            "batch norm over the batch's own statistics (training mode) with a batch other "
            "than 1; call model.eval() before exporting (instance norm is taken)"
        )
    if c is None or not c.is_number:
        raise Unsupported("instance norm over a symbolic number of channels")
    ins = [
        L.value(x),
        None if a["weight"] is None else L.value(a["weight"]),
        None if a["bias"] is None else L.value(a["bias"]),
    ]
    out = L.op("group_norm", ins, {"groups": int(c), "eps": float(a["eps"])})
    return [out, None, None]


@_handles("aten.native_batch_norm.default", kiln="batch_norm")
def _native_bn(L, node, a):
    if a["training"]:
        raise Unsupported("batch norm in training mode: call model.eval() before exporting")
    return [_bn(L, a), None, None]


@_handles("aten.batch_norm.default", kiln="batch_norm")
def _batch_norm(L, node, a):
    if a["training"]:
        raise Unsupported("batch norm in training mode: call model.eval() before exporting")
    return _bn(L, a)


def _ln(L, a):
    ins = [L.value(a["input"])]
    w, b = a["weight"], a["bias"]
    ins.append(None if w is None else L.value(w))
    ins.append(None if b is None else L.value(b))
    nd = len(_ints(a["normalized_shape"], None, "normalized_shape"))
    return L.op("layer_norm", ins, {"normalized_ndim": nd, "eps": float(a["eps"])})


@_handles("aten.layer_norm.default", kiln="layer_norm")
def _layer_norm(L, node, a):
    return _ln(L, a)


@_handles("aten.native_layer_norm.default", kiln="layer_norm")
def _native_layer_norm(L, node, a):
    return [_ln(L, a), None, None]


@_handles("aten.native_group_norm.default", kiln="group_norm")
def _native_group_norm(L, node, a):
    w, b = a["weight"], a["bias"]
    ins = [
        L.value(a["input"]),
        None if w is None else L.value(w),
        None if b is None else L.value(b),
    ]
    attrs = {"groups": _static_int(a["group"], "group"), "eps": float(a["eps"])}
    return [L.op("group_norm", ins, attrs), None, None]


@_handles("aten.group_norm.default", kiln="group_norm")
def _group_norm(L, node, a):
    w, b = a["weight"], a["bias"]
    ins = [
        L.value(a["input"]),
        None if w is None else L.value(w),
        None if b is None else L.value(b),
    ]
    attrs = {"groups": _static_int(a["num_groups"], "num_groups"), "eps": float(a["eps"])}
    return L.op("group_norm", ins, attrs)


def _softmax_fn(kop: str, legacy: bool):
    def fn(L, node, a):
        x = a["self"]
        if legacy:
            if a["half_to_float"]:
                raise Unsupported("softmax with half_to_float")
        elif a["dtype"] is not None and a["dtype"] != L.dtype(x):
            raise Unsupported(f"softmax with dtype={a['dtype']}")
        return L.op(kop, [L.value(x)], {"dim": _static_int(a["dim"], "dim")})

    return fn


_handles("aten._softmax.default", kiln="softmax")(_softmax_fn("softmax", True))
_handles("aten.softmax.int", kiln="softmax")(_softmax_fn("softmax", False))
_handles("aten._log_softmax.default", kiln="log_softmax")(_softmax_fn("log_softmax", True))
_handles("aten.log_softmax.int", kiln="log_softmax")(_softmax_fn("log_softmax", False))


def _pool_common(a):
    kernel = _ints(a["kernel_size"], 2, "kernel_size")
    stride = a["stride"]
    stride = (
        kernel
        if stride is None or (isinstance(stride, (list, tuple)) and not stride)
        else _ints(stride, 2, "stride")
    )
    return kernel, stride, _ints(a["padding"], 2, "padding")


def _max_pool(L, a):
    if L.rank(a["self"]) != 4:
        raise Unsupported("max_pool2d on a 3-D (unbatched) input")
    kernel, stride, padding = _pool_common(a)
    return L.op(
        "max_pool2d",
        [L.value(a["self"])],
        {
            "kernel": kernel,
            "stride": stride,
            "padding": padding,
            "dilation": _ints(a["dilation"], 2, "dilation"),
            "ceil_mode": int(bool(a["ceil_mode"])),
        },
    )


def _pool_len(n: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """PyTorch's pooled length: a last window of ceil_mode must start inside the input or its
    left padding."""
    span = n + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil else 0)) // s + 1
    if ceil and (out - 1) * s >= n + p:
        out -= 1
    return out


def _pool3d_args(L: Lowerer, a: dict, what: str):
    """A 3-D pool's kernel, stride (the kernel when none), padding, and its input's static
    channels and frames."""
    x = a["self"]
    if L.rank(x) != 5:
        raise Unsupported(f"{what} on a 4-D (unbatched) input")
    kernel = _ints(a["kernel_size"], 3, "kernel_size")
    stride = a["stride"]
    if stride is None or (isinstance(stride, (list, tuple)) and not stride):
        stride = kernel
    else:
        stride = _ints(stride, 3, "stride")
    c, t = _static_count(x, [1], what), _static_count(x, [2], what)
    return kernel, stride, _ints(a["padding"], 3, "padding"), c, t


def _pool_frames(L: Lowerer, x, c: int, t: int, op: str, attrs: dict) -> int:
    """The 2-D pool `op` over each frame's (H, W) of x [N, C, T, H, W]: [N, C, T, Ho, Wo]."""
    v = L.op("reshape", [L.value(x)], {"shape": [-2, c * t, -5, -6]})
    v = L.op(op, [v], attrs)
    return L.op("reshape", [v], {"shape": [-2, c, t, -4, -5]})


@_handles(
    "aten.max_pool3d_with_indices.default",
    kiln=("max_pool2d", "reshape", "pad", "slice", "maximum", "copy"),
)
def _max_pool3d(L, node, a):
    """A 3-D max pool (MViT's skip pooling) as a 2-D one over each frame's (H, W) ([N, C * T, H,
    W]) and then the maximum of the kt temporal taps (strided slices of the frames padded with
    -inf): the same window maximum, NaN propagating. The indices output is not computed."""
    x = a["self"]
    (kt, kh, kw), (st, sh, sw), (pt, ph, pw), c, t = _pool3d_args(L, a, "max_pool3d")
    dt, dh, dw = _ints(a["dilation"], 3, "dilation")
    ceil = bool(a["ceil_mode"])
    t_out = _pool_len(t, kt, st, pt, dt, ceil)
    if t_out <= 0:
        raise Unsupported("max_pool3d with no output frame")
    pool = {"kernel": [kh, kw], "stride": [sh, sw], "padding": [ph, pw]}
    pool.update({"dilation": [dh, dw], "ceil_mode": int(ceil)})
    v = _pool_frames(L, x, c, t, "max_pool2d", pool)
    # frames padded with -inf: pt before, and after as far as the last window reaches
    after = max(pt, (t_out - 1) * st + dt * (kt - 1) + 1 - (t + pt))
    if pt or after:
        v = L.op("pad", [v], {"pads": [0, 0, 0, 0, pt, after], "value": float("-inf")})
    out = None
    for i in range(kt):
        start = i * dt
        tap = v
        if not (start == 0 and st == 1 and t_out == t + pt + after):
            tap = L.op(
                "slice",
                [v],
                {"dim": 2, "start": start, "end": start + (t_out - 1) * st + 1, "step": st},
            )
        out = tap if out is None else L.op("maximum", [out, tap])
    if out is v:
        out = L.op("copy", [v])
    return [out, None]


@_handles(
    "aten.avg_pool3d.default",
    kiln=("avg_pool2d", "reshape", "pad", "slice", "add", "mul", "copy"),
)
def _avg_pool3d(L, node, a):
    """A 3-D average pool (S3D) as a 2-D one over each frame's (H, W) and then the mean of the
    kt temporal taps: the window's divisor is the product of its frames' and its (H, W) part's
    counts, padding counted or not (count_include_pad), so the two averages compose exactly.
    ceil_mode windows past the input (other divisors) and divisor_override are not taken."""
    x = a["self"]
    if a["divisor_override"] is not None:
        raise Unsupported("avg_pool3d with divisor_override")
    (kt, kh, kw), (st, sh, sw), (pt, ph, pw), c, t = _pool3d_args(L, a, "avg_pool3d")
    h = _static_count(x, [3], "avg_pool3d")
    w = _static_count(x, [4], "avg_pool3d")
    floor = [
        _pool_len(n, k, s_, p, 1, False)
        for n, k, s_, p in ((t, kt, st, pt), (h, kh, sh, ph), (w, kw, sw, pw))
    ]
    if a["ceil_mode"] and floor != [
        _pool_len(n, k, s_, p, 1, True)
        for n, k, s_, p in ((t, kt, st, pt), (h, kh, sh, ph), (w, kw, sw, pw))
    ]:
        raise Unsupported("avg_pool3d whose ceil_mode windows reach past the input")
    t_out = floor[0]
    if t_out <= 0:
        raise Unsupported("avg_pool3d with no output frame")
    include = bool(a["count_include_pad"])
    pool = {"kernel": [kh, kw], "stride": [sh, sw], "padding": [ph, pw], "ceil_mode": 0}
    pool.update({"count_include_pad": int(include), "divisor_override": 0})
    v = _pool_frames(L, x, c, t, "avg_pool2d", pool)
    if pt:
        v = L.op("pad", [v], {"pads": [0, 0, 0, 0, pt, pt], "value": 0.0})
    total = None
    for i in range(kt):
        tap = v
        if not (i == 0 and st == 1 and t_out == t + 2 * pt):
            tap = L.op(
                "slice", [v], {"dim": 2, "start": i, "end": i + (t_out - 1) * st + 1, "step": st}
            )
        total = tap if total is None else L.op("add", [total, tap])
    # each output frame's count of frames: kt, or those inside the input without padding counted
    counts = [
        kt if include else sum(1 for i in range(kt) if 0 <= j * st + i - pt < t)
        for j in range(t_out)
    ]
    dt = L.dtype(x)
    inv = torch.tensor([1.0 / n for n in counts], dtype=dt).reshape(1, 1, t_out, 1, 1)
    return L.op("mul", [total, L.const_tensor(inv, f"{node.name}_frames")])


@_handles("aten.max_pool2d_with_indices.default", kiln="max_pool2d")
def _max_pool_wi(L, node, a):
    return [_max_pool(L, a), None]


@_handles("aten.max_pool2d.default", kiln="max_pool2d")
def _max_pool2d(L, node, a):
    return _max_pool(L, a)


@_handles("aten.avg_pool2d.default", kiln="avg_pool2d")
def _avg_pool2d(L, node, a):
    if L.rank(a["self"]) != 4:
        raise Unsupported("avg_pool2d on a 3-D (unbatched) input")
    kernel, stride, padding = _pool_common(a)
    div = a["divisor_override"]
    return L.op(
        "avg_pool2d",
        [L.value(a["self"])],
        {
            "kernel": kernel,
            "stride": stride,
            "padding": padding,
            "ceil_mode": int(bool(a["ceil_mode"])),
            "count_include_pad": int(bool(a["count_include_pad"])),
            "divisor_override": 0 if div is None else _static_int(div, "divisor_override"),
        },
    )


@_handles(
    "aten.adaptive_avg_pool2d.default",
    "aten._adaptive_avg_pool2d.default",
    kiln="adaptive_avg_pool2d",
)
def _adaptive_avg_pool2d(L, node, a):
    if L.rank(a["self"]) != 4:
        raise Unsupported("adaptive_avg_pool2d on a 3-D (unbatched) input")
    size = a["output_size"]
    if isinstance(size, (list, tuple)) and any(s is None for s in size):
        raise Unsupported("adaptive_avg_pool2d with a None output size")
    return L.op(
        "adaptive_avg_pool2d", [L.value(a["self"])], {"output_size": _ints(size, 2, "output_size")}
    )


def _upsample_sizes(L, node, a, scales_key):
    m = _meta(node)
    if m.dim() != 4 or L.rank(a["input"]) != 4:
        raise Unsupported("resizing other than [N, C, H, W]")
    size = []
    for d in m.shape[2:]:
        e = sym_expr(d)
        if not e.is_number:
            raise Unsupported("resize to a symbolic size")
        size.append(int(e))
    scales = [math.nan, math.nan]
    if a.get("output_size") is None and scales_key is not None:
        given = a.get(scales_key)
        if isinstance(given, (list, tuple)) and len(given) == 2:
            scales = [float(v) for v in given]
    for k, i in (("scales_h", 0), ("scales_w", 1)):
        if a.get(k) is not None:
            scales[i] = float(a[k])
    return size, scales


@_handles(
    "aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default", kiln="upsample_nearest2d"
)
def _upsample_nearest(L, node, a):
    size, scales = _upsample_sizes(L, node, a, "scale_factors")
    return L.op(
        "upsample_nearest2d", [L.value(a["input"])], {"output_size": size, "scales": scales}
    )


@_handles(
    "aten.upsample_bilinear2d.vec", "aten.upsample_bilinear2d.default", kiln="upsample_bilinear2d"
)
def _upsample_bilinear(L, node, a):
    size, scales = _upsample_sizes(L, node, a, "scale_factors")
    return L.op(
        "upsample_bilinear2d",
        [L.value(a["input"])],
        {"output_size": size, "scales": scales, "align_corners": int(bool(a["align_corners"]))},
    )


@_handles("aten.constant_pad_nd.default", kiln="pad")
def _constant_pad(L, node, a):
    pads = _ints(a["pad"], None, "pad")
    v = a["value"]
    if isinstance(v, (Node, torch.SymInt, torch.SymFloat)):
        raise Unsupported("pad value is symbolic")
    return L.op("pad", [L.value(a["self"])], {"pads": pads, "value": float(v)})


@_handles("aten.flip.default", kiln=("arange", "index"))
def _flip(L, node, a):
    """torch.flip(x, dims): per dim, an index by the positions -1, -2, ..., -n (a Kiln arange of
    the dim's run-time length, negative indices counting from the end): a bidirectional RNN's
    reversed sequence, with static or dynamic lengths."""
    x = a["self"]
    r = L.rank(x)
    v = L.value(x)
    for d in sorted({_static_int(d, "dim") % max(r, 1) for d in a["dims"]}):
        if r == 0:
            break
        pos = L.op(
            "arange",
            [v],
            {"dim": d, "start": -1.0, "step": -1.0, "dtype": _graph.TORCH_TO_KILN[torch.int64]},
        )
        v = L.op("index", [v, pos], {"dim": d, "wrap": 1})
    return v if r and a["dims"] else L.op("copy", [v])


def _pad_positions(n: int, lo: int, hi: int, mode: str) -> list[int]:
    """The source position of each of lo + n + hi output positions along a padded dim."""
    if mode == "reflect":
        if lo >= n or hi >= n:
            raise Unsupported(f"reflection padding of {lo}, {hi} over a dim of {n} (each < {n})")
        return list(range(lo, 0, -1)) + list(range(n)) + list(range(n - 2, n - 2 - hi, -1))
    return [0] * lo + list(range(n)) + [n - 1] * hi


def _edge_pad(mode: str):
    def fn(L, node, a):
        """reflection_pad{1,2,3}d / replication_pad{1,2,3}d (F.pad's reflect and replicate
        modes, a conv's padding_mode): each padded dim an index by the constant table of its
        source positions."""
        x = a["self"]
        pads = _ints(a["padding"], None, "padding")
        if any(p < 0 for p in pads):
            raise Unsupported(f"{mode} padding by a negative amount ({pads})")
        r = L.rank(x)
        v = L.value(x)
        for i in range(len(pads) // 2):
            lo, hi = pads[2 * i], pads[2 * i + 1]
            if lo == hi == 0:
                continue
            d = r - 1 - i
            n = _static_count(x, [d], f"{mode} padding")
            pos = torch.tensor(_pad_positions(n, lo, hi, mode), dtype=torch.int64)
            v = L.op(
                "index", [v, L.const_tensor(pos, f"{node.name}_pad{d}")], {"dim": d, "wrap": 0}
            )
        return v if v != L.value(x) else L.op("copy", [v])

    return fn


for _k in (1, 2, 3):
    _handles(f"aten.reflection_pad{_k}d.default", kiln=("index", "copy"))(_edge_pad("reflect"))
    _handles(f"aten.replication_pad{_k}d.default", kiln=("index", "copy"))(_edge_pad("replicate"))


@_handles("aten.index.Tensor", kiln="index")
def _index(L, node, a):
    idx = list(a["indices"])
    first = next((i for i, t in enumerate(idx) if t is not None), None)
    if first is None:
        raise Unsupported("index without index tensors")
    run = []
    for t in idx[first:]:
        if t is None:
            break
        run.append(t)
    if any(t is not None for t in idx[first + len(run) :]):
        raise Unsupported("index tensors separated by a full slice")
    for t in run:
        if not isinstance(t, Node) or L.dtype(t) not in (torch.int32, torch.int64):
            raise Unsupported("index by a bool mask or a non-integer tensor")
    ins = [L.value(a["self"])] + [L.value(t) for t in run]
    return L.op("index", ins, {"dim": first, "wrap": 1})


@_handles("aten.index_select.default", kiln="index")
def _index_select(L, node, a):
    x = a["self"]
    r = L.rank(x)
    dim = _static_int(a["dim"], "dim")
    dim = dim % r if r else 0
    ix = a["index"]
    if L.dtype(ix) not in (torch.int32, torch.int64) or L.rank(ix) > 1:
        raise Unsupported("index_select needs a 0-D or 1-D integer index")
    v = L.value(ix)
    if L.rank(ix) == 0:
        v = L.op("reshape", [v], {"shape": [1]})
    return L.op("index", [L.value(x), v], {"dim": dim, "wrap": 0})


@_handles("aten.topk.default", kiln=("topk", "gather"))
def _topk(L, node, a):
    """torch.topk(x, k, dim, largest, sorted): Kiln's topk gives the indices (best first, equal
    values in index order: an order sorted=False allows too), the values are gathered with
    them."""
    x = a["self"]
    if L.dtype(x) == torch.bool:
        raise Unsupported("topk of a bool tensor")
    dim = _static_int(a.get("dim", -1), "dim")
    k = _static_int(a["k"], "k")
    largest = bool(a.get("largest", True))
    idx = L.op("topk", [L.value(x)], {"dim": dim, "k": k, "largest": int(largest)})
    return [L.op("gather", [L.value(x), idx], {"dim": dim}), idx]


# A sort runs as a topk of the whole line: k passes over it, fine for the short lines models sort
# (ViT-MAE's patch order: 196), not for long ones, which stay with ExecuTorch.
SORT_MAX_LEN = 4096


@_handles("aten.sort.default", "aten.sort.stable", kiln=("topk", "gather"))
def _sort(L, node, a):
    """torch.sort(x, dim, descending[, stable]) (torch.argsort exports as it): the indices of a
    topk of the whole dimension (equal values in index order: a stable sort; NaN last ascending,
    first descending, as PyTorch), the values gathered with them."""
    x = a["self"]
    if L.dtype(x) == torch.bool:
        raise Unsupported("sort of a bool tensor")
    rank = L.rank(x)
    if rank == 0:
        raise Unsupported("sort of a 0-d tensor")
    dim = _static_int(a.get("dim", -1), "dim")
    e = sym_expr(_meta(x).shape[dim])
    if not e.is_number:
        raise Unsupported("sort along a symbolic dimension")
    n = int(e)
    if n > SORT_MAX_LEN:
        raise Unsupported(f"sort of {n} elements a line (Kiln sorts at most {SORT_MAX_LEN})")
    descending = bool(a.get("descending", False))
    idx = L.op("topk", [L.value(x)], {"dim": dim, "k": n, "largest": int(descending)})
    return [L.op("gather", [L.value(x), idx], {"dim": dim}), idx]


@_handles("aten.gather.default", kiln="gather")
def _gather(L, node, a):
    if a.get("sparse_grad"):
        raise Unsupported("gather with sparse_grad")
    return L.op(
        "gather", [L.value(a["self"]), L.value(a["index"])], {"dim": _static_int(a["dim"], "dim")}
    )


# grid_sample's modes as aten numbers them
_GRID_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
_GRID_PADDINGS = {0: "zeros", 1: "border", 2: "reflection"}


@_handles("aten.grid_sampler_2d.default", "aten.grid_sampler.default", kiln="grid_sample")
def _grid_sampler(L, node, a):
    """F.grid_sample of a 4-D input, bilinear or nearest, zeros or border padding: Kiln's
    grid_sample (RAFT's correlation lookup, deformable attention: Deformable DETR, RT-DETR;
    spatial transformers). Bicubic, reflection padding and 5-D inputs stay with ExecuTorch."""
    x, grid = a["input"], a["grid"]
    mode = _GRID_MODES.get(_static_int(a["interpolation_mode"], "interpolation_mode"))
    padding = _GRID_PADDINGS.get(_static_int(a["padding_mode"], "padding_mode"))
    if L.rank(x) != 4 or L.rank(grid) != 4:
        raise Unsupported("grid_sample of a 5-D (volumetric) input")
    if mode not in ("bilinear", "nearest"):
        raise Unsupported(f"grid_sample's {mode} mode (Kiln takes bilinear and nearest)")
    if padding not in ("zeros", "border"):
        raise Unsupported(f"grid_sample's {padding} padding (Kiln takes zeros and border)")
    attrs = {
        "mode": int(mode == "nearest"),
        "padding_mode": int(padding == "border"),
        "align_corners": int(bool(a["align_corners"])),
    }
    return L.op("grid_sample", [L.value(x), L.value(grid)], attrs)


# writes into a tensor (a KV cache's update): index_put with one index tensor, index_copy and
# slice assignment (slice_scatter) all become Kiln's index_copy, which the engine runs in place
# when it updates a state (a mutated buffer the delegate owns).


def _dims_equal(a, b) -> bool:
    return _same(sym_expr(a), sym_expr(b))


def _broadcast_to(L: Lowerer, v: int, vm: torch.Tensor, target: list, likes: dict, what: str):
    """Value v (metadata vm) broadcast to the sizes ``target`` (ints or SymInts), as PyTorch
    broadcasts: missing leading dimensions are added, size-1 dimensions are expanded. A
    symbolic target size that v does not already have is read from a ``likes`` entry
    {dim: (tensor node, its dim)}; sizes read from several tensors (a query length and a key
    length: T5's zero position bias of a layer without one) take one expand per tensor."""
    shape = list(vm.shape)
    r = len(target)
    while len(shape) > r:
        e = sym_expr(shape[0])
        if not (e.is_number and int(e) == 1):
            raise Unsupported(f"{what} of shape {list(vm.shape)} does not fit {target}")
        v = L.op("squeeze", [v], {"dims": [0]})
        shape.pop(0)
    if len(shape) < r:
        v = L.op("reshape", [v], {"shape": [1] * (r - len(shape)) + _keep(len(shape))})
        shape = [1] * (r - len(shape)) + shape
    codes: list[int] = []
    by_like: dict[Node, list[tuple[int, int]]] = {}  # like tensor -> [(dim, its dim)]
    changed = False
    for j, (have, want) in enumerate(zip(shape, target, strict=True)):
        codes.append(-1)
        if _dims_equal(have, want):
            continue
        eh = sym_expr(have)
        if not (eh.is_number and int(eh) == 1):
            raise Unsupported(
                f"{what} of shape {list(vm.shape)} cannot be broadcast to {list(target)}"
            )
        changed = True
        ew = sym_expr(want)
        if ew.is_number:
            codes[j] = int(ew)
            continue
        src = likes.get(j)
        if src is None:
            raise Unsupported(
                f"{what} of shape {list(vm.shape)} is broadcast along a symbolic dimension "
                f"of {list(target)} that no tensor's size gives"
            )
        by_like.setdefault(src[0], []).append((j, src[1]))
    if not changed:
        return v
    if not by_like:
        return L.op("expand", [v], {"shape": codes})
    # With a like input, -1 keeps v's own size: the dims of the other likes stay 1 until theirs.
    for like, dims in by_like.items():
        for j, d in dims:
            codes[j] = -(d + 2)
        v = L.op("expand", [v, L.value(like)], {"shape": codes})
        codes = [-1] * r
    return v


def _keep(n: int) -> list[int]:
    """Reshape codes that keep n trailing dimensions of a value as they are."""
    return [-(d + 2) for d in range(n)]


def _index_rows(L: Lowerer, index: Node, what: str) -> tuple[int, bool]:
    """(Kiln value of a 1-D integer index, whether it was 0-D and reshaped to [1])."""
    if not isinstance(index, Node):
        raise Unsupported(f"{what}: the index is not a tensor")
    im = _meta(index)
    if im.dtype == torch.bool:
        raise Unsupported(f"{what} with a bool mask (masked assignment); Kiln takes integer rows")
    if im.dtype not in (torch.int32, torch.int64):
        raise Unsupported(f"{what} with a {im.dtype} index; Kiln takes int32 or int64 indices")
    if im.dim() > 1:
        raise Unsupported(
            f"{what} with a {im.dim()}-D index tensor; Kiln takes a 1-D index (one row per entry)"
        )
    v = L.value(index)
    if im.dim() == 0:
        return L.op("reshape", [v], {"shape": [1]}), True
    return v, False


# Only the functional forms: an edge program's in-place ops (ExecuTorch's write-backs) change
# their argument, which a Kiln value cannot.
@_handles(
    "aten.index_put.default",
    kiln=("index_copy", "expand", "reshape", "squeeze", "unsqueeze", "cast"),
)
def _index_put(L, node, a):
    """x[.., index, ..] = values with one 1-D (or 0-D) integer index tensor: index_copy,
    negative indices counting from the end as in PyTorch (wrap 1)."""
    acc = a["accumulate"]
    if acc is True:
        raise Unsupported("index_put with accumulate=True (a scatter-add); Kiln assigns rows")
    if acc not in (False, None):
        raise Unsupported(f"index_put with accumulate={acc!r}")
    x = a["self"]
    xm = _meta(x)
    idx = list(a["indices"])
    used = [i for i, t in enumerate(idx) if t is not None]
    if len(used) != 1:
        raise Unsupported(
            f"index_put with {len(used)} index tensors; Kiln takes exactly one "
            "(x[:, :, index] = values)"
        )
    p = used[0]
    if p >= xm.dim():
        raise Unsupported(f"index_put indexes dimension {p} of a rank-{xm.dim()} tensor")
    rows, was_scalar = _index_rows(L, idx[p], "index_put")
    out_dtype = xm.dtype
    values = a["values"]
    if not isinstance(values, Node):
        raise Unsupported("index_put with scalar values (a fill); Kiln takes a values tensor")
    vm = _meta(values)
    v = L.cast(L.value(values), vm.dtype, out_dtype)
    target = list(xm.shape)
    if was_scalar:
        # x[.., i, ..] = values: values broadcast to x without dimension p, then a row.
        del target[p]
        likes = {j: (x, j if j < p else j + 1) for j in range(len(target))}
        v = _broadcast_to(L, v, vm, target, likes, "index_put values")
        v = L.op("unsqueeze", [v], {"dim": p})
    else:
        target[p] = _meta(idx[p]).shape[0]
        likes = {j: (x, j) for j in range(len(target)) if j != p}
        likes[p] = (idx[p], 0)
        v = _broadcast_to(L, v, vm, target, likes, "index_put values")
    return L.op("index_copy", [L.value(x), rows, v], {"dim": p, "wrap": 1})


@_handles("aten.index_copy.default", kiln=("index_copy", "reshape", "cast"))
def _index_copy(L, node, a):
    """torch.index_copy: rows of source written at index along dim (indices in [0, size))."""
    x = a["self"]
    xm = _meta(x)
    r = xm.dim()
    if r == 0:
        raise Unsupported("index_copy of a 0-D tensor")
    dim = _static_int(a["dim"], "dim") % r
    rows, _ = _index_rows(L, a["index"], "index_copy")
    src = a["source"]
    sm = _meta(src)
    if sm.dim() != r:
        raise Unsupported(f"index_copy source of rank {sm.dim()}; x has rank {r}")
    v = L.cast(L.value(src), sm.dtype, xm.dtype)
    return L.op("index_copy", [L.value(x), rows, v], {"dim": dim, "wrap": 0})


@_handles("aten.slice_scatter.default", kiln=("index_copy", "arange", "cast"))
def _slice_scatter(L, node, a):
    """x[.., start:end:step, ..] = src (slice assignment) with a constant start and step: src's
    rows written at start, start + step, ... (as many as src has: a symbolic length is read
    from src at run time)."""
    x, src = a["self"], a["src"]
    xm, sm = _meta(x), _meta(src)
    r = xm.dim()
    if r == 0 or sm.dim() != r:
        raise Unsupported(f"slice_scatter of a rank-{sm.dim()} src into a rank-{r} tensor")
    dim = _static_int(a["dim"], "dim") % r
    step = _static_int(a["step"], "slice_scatter step")
    if step <= 0:
        raise Unsupported(f"slice_scatter step {step}")
    start = a["start"]
    if start is None:
        start = 0
    elif isinstance(start, Node) or isinstance(start, torch.SymInt):
        e = sym_expr(start.meta.get("val") if isinstance(start, Node) else start)
        if e is None or not e.is_number:
            raise Unsupported(
                f"slice_scatter with a symbolic start ({e}); Kiln takes a constant start (for "
                "a position given at run time, write the rows with x.index_copy_(dim, "
                "positions, src) or x[:, :, positions] = src, positions being a tensor)"
            )
        start = int(e)
    else:
        start = _static_int(start, "slice_scatter start")
    if start < 0:
        size = sym_expr(xm.shape[dim])
        if not size.is_number:
            raise Unsupported("slice_scatter with a negative start on a symbolic dimension")
        start = max(0, start + int(size))
    rows = L.op(
        "arange",
        [L.value(src)],
        {
            "dim": dim,
            "start": float(start),
            "step": float(step),
            "dtype": _graph.TORCH_TO_KILN[torch.int64],
        },
    )
    v = L.cast(L.value(src), sm.dtype, xm.dtype)
    return L.op("index_copy", [L.value(x), rows, v], {"dim": dim, "wrap": 0})


@_handles("aten.copy.default", kiln=("copy", "cast", "expand", "reshape", "squeeze"))
def _copy_into(L, node, a):
    """aten.copy(self, src): src cast to self's dtype and broadcast to self's shape (what
    ``self.copy_(src)`` writes); self's values are not read."""
    x, src = a["self"], a["src"]
    xm = _meta(x)
    if not isinstance(src, Node):
        raise Unsupported("copy from a scalar")
    sm = _meta(src)
    v = L.cast(L.value(src), sm.dtype, xm.dtype)
    likes = {j: (x, j) for j in range(xm.dim())}
    out = _broadcast_to(L, v, sm, list(xm.shape), likes, "copy source")
    if out == L.value(src):
        out = L.op("copy", [out])
    return out


@_handles("aten.cumsum.default", kiln=("cumsum", "cast"))
def _cumsum(L, node, a):
    out = _out_dtype(node)
    x = L.cast(L.value(a["self"]), L.dtype(a["self"]), out)
    return L.op("cumsum", [x], {"dim": _static_int(a["dim"], "dim")})


@_handles("aten.argmax.default", kiln=("argmax", "reshape"))
def _argmax(L, node, a):
    """torch.argmax(x, dim, keepdim): int64 indices of the first maximum; without a dim, over
    the flattened x (a reshape to one dim first; keepdim then gives x's rank of ones)."""
    x = a["self"]
    if L.dtype(x) == torch.bool:
        raise Unsupported("argmax of a bool tensor")
    dim, keep = a.get("dim"), bool(a.get("keepdim", False))
    if dim is None:
        r = L.rank(x)
        v = L.op("reshape", [L.value(x)], {"shape": [-1]})
        v = L.op("argmax", [v], {"dim": 0, "keepdim": 0})
        return L.op("reshape", [v], {"shape": [1] * r}) if keep and r > 0 else v
    return L.op("argmax", [L.value(x)], {"dim": _static_int(dim, "dim"), "keepdim": int(keep)})


@_handles("aten.argmin.default", kiln=("argmax", "neg", "bitwise_not", "reshape"))
def _argmin(L, node, a):
    """torch.argmin as the argmax of -x (floats: a NaN stays NaN, the first NaN is the answer as
    in PyTorch) or ~x (integers, without overflow)."""
    x = a["self"]
    dt = L.dtype(x)
    key = _extreme_key(L, L.value(x), dt, True)
    dim, keep = a.get("dim"), bool(a.get("keepdim", False))
    if dim is None:
        r = L.rank(x)
        v = L.op("argmax", [L.op("reshape", [key], {"shape": [-1]})], {"dim": 0, "keepdim": 0})
        return L.op("reshape", [v], {"shape": [1] * r}) if keep and r > 0 else v
    return L.op("argmax", [key], {"dim": _static_int(dim, "dim"), "keepdim": int(keep)})


@_handles("aten.logit.default", kiln=("clamp", "sub", "div", "log", "cast"))
def _logit(L, node, a):
    """logit(x, eps) = log(z / (1 - z)), z = x clamped to [eps, 1 - eps] when eps is given."""
    out = _out_dtype(node)
    if not out.is_floating_point:
        raise Unsupported(f"logit of {out}")
    z = L.operand(a["self"], out)
    eps = a.get("eps")
    if eps is not None:
        e = _static_float(eps, "logit's eps")
        z = L.op("clamp", [z], {"min": [e], "max": [1.0 - e]})
    return L.op("log", [L.op("div", [z, L.op("sub", [L.scalar(1.0, out), z])])])


def _reduce_fn(kop: str, has_dims: bool):
    def fn(L, node, a):
        x = a["self"]
        out = _out_dtype(node)
        dims = a.get("dim") if has_dims else None
        dims = [] if dims is None else _ints(dims, None, "dim")
        keep = bool(a.get("keepdim", False)) if has_dims else False
        if not dims and L.rank(x) == 0:
            return L.op("copy", [L.cast(L.value(x), L.dtype(x), out)])
        v = L.cast(L.value(x), L.dtype(x), out)
        return L.op(kop, [v], {"dims": dims, "keepdim": int(keep)})

    return fn


_handles("aten.mean.dim", kiln=("mean", "cast", "copy"))(_reduce_fn("mean", True))
_handles("aten.mean.default", kiln=("mean", "cast", "copy"))(_reduce_fn("mean", False))
_handles("aten.sum.dim_IntList", kiln=("sum", "cast", "copy"))(_reduce_fn("sum", True))
_handles("aten.sum.default", kiln=("sum", "cast", "copy"))(_reduce_fn("sum", False))


def _reduce_dims(L: Lowerer, x, dims) -> list[int]:
    """The dims a reduction names, normalized and sorted; none named (None, []) is every dim."""
    r = L.rank(x)
    if dims is None:
        dims = []
    elif isinstance(dims, int):
        dims = [dims]
    ds = _ints(dims, None, "dim")
    if not ds:
        return list(range(r))
    if r == 0:
        return []
    return sorted({d % r for d in ds})


def _static_count(x, dims: list[int], what: str) -> int:
    n = 1
    for d in dims:
        e = sym_expr(_meta(x).shape[d])
        if e is None or not e.is_number:
            raise Unsupported(f"{what} over a symbolic dimension")
        n *= int(e)
    return n


@_handles("aten.var.correction", kiln=("mean", "sub", "mul", "sum", "div", "copy", "cast"))
def _var(L, node, a):
    """var(x, dims, correction) (std is its square root) as sum((x - mean)^2) /
    max(0, n - correction), the mean kept over the dims: n must be static."""
    x = a["self"]
    out = _out_dtype(node)
    if not out.is_floating_point:
        raise Unsupported(f"variance of {out}")
    dims = _reduce_dims(L, x, a.get("dim"))
    keep = bool(a.get("keepdim", False))
    corr = a.get("correction")
    corr = 1.0 if corr is None else _static_float(corr, "correction")
    n = _static_count(x, dims, "variance")
    v = L.operand(x, out)
    if not dims:  # a 0-d tensor: its own mean, no spread
        m = L.op("copy", [v])
    else:
        m = L.op("mean", [v], {"dims": dims, "keepdim": 1})
    d = L.op("sub", [v, m])
    sq = L.op("mul", [d, d])
    s = sq if not dims else L.op("sum", [sq], {"dims": dims, "keepdim": int(keep)})
    return L.op("div", [s, L.scalar(max(0.0, n - corr), out)])


def _extreme_key(L: Lowerer, v: int, dt: torch.dtype, lowest: bool) -> int:
    """A value whose first maximum is the first maximum (lowest: minimum) of v: v itself, -v for
    floats (a NaN stays NaN, which argmax counts as the maximum), ~v for integers (no overflow)."""
    if dt == torch.bool:
        raise Unsupported("max/min of a bool tensor")
    if not lowest:
        return v
    return L.op("neg", [v]) if dt.is_floating_point else L.op("bitwise_not", [v])


def _extreme_dim(L: Lowerer, v: int, dt: torch.dtype, d: int, lowest: bool) -> tuple[int, int]:
    """(values, indices) of the first maximum (minimum) along d, both with d kept: argmax and a
    gather by its index, so a NaN, first among equals, is the answer as in PyTorch."""
    idx = L.op("argmax", [_extreme_key(L, v, dt, lowest)], {"dim": d, "keepdim": 1})
    return L.op("gather", [v, idx], {"dim": d}), idx


def _amax_fn(lowest: bool):
    def fn(L, node, a):
        x = a["self"]
        dt = L.dtype(x)
        dims = _reduce_dims(L, x, a.get("dim"))
        keep = bool(a.get("keepdim", False))
        v = L.value(x)
        if not dims:
            return L.op("copy", [v])
        for d in dims:
            v, _ = _extreme_dim(L, v, dt, d, lowest)
        return v if keep else L.op("squeeze", [v], {"dims": dims})

    return fn


_EXTREME_OPS = ("argmax", "gather", "neg", "bitwise_not", "squeeze", "copy", "reshape")
_handles("aten.amax.default", kiln=_EXTREME_OPS)(_amax_fn(False))
_handles("aten.amin.default", kiln=_EXTREME_OPS)(_amax_fn(True))


def _max_dim_fn(lowest: bool):
    def fn(L, node, a):
        x = a["self"]
        r = L.rank(x)
        d = _static_int(a["dim"], "dim") % max(r, 1)
        if r == 0:
            raise Unsupported("max/min along a dim of a 0-d tensor")
        vals, idx = _extreme_dim(L, L.value(x), L.dtype(x), d, lowest)
        if not a.get("keepdim", False):
            vals = L.op("squeeze", [vals], {"dims": [d]})
            idx = L.op("squeeze", [idx], {"dims": [d]})
        return [vals, idx]

    return fn


def _max_all_fn(lowest: bool):
    def fn(L, node, a):
        x = a["self"]
        v = L.op("reshape", [L.value(x)], {"shape": [-1]})
        vals, _ = _extreme_dim(L, v, L.dtype(x), 0, lowest)
        return L.op("reshape", [vals], {"shape": []})

    return fn


_handles("aten.max.dim", kiln=_EXTREME_OPS)(_max_dim_fn(False))
_handles("aten.min.dim", kiln=_EXTREME_OPS)(_max_dim_fn(True))
_handles("aten.max.default", kiln=_EXTREME_OPS)(_max_all_fn(False))
_handles("aten.min.default", kiln=_EXTREME_OPS)(_max_all_fn(True))


# shape ops


def _same(a, b) -> bool:
    return a is not None and b is not None and (a == b or sympy.expand(a - b) == 0)


def _shape_codes(L: Lowerer, x: Node, sizes, reshape: bool) -> tuple[list[int], Node | None]:
    """Kiln shape codes for reshape (reshape=True) or expand sizes.

    Entries: a literal stays; -1 stays (infer for reshape, keep for expand); a symbolic size
    equal to dimension d of x becomes -(d + 2); for reshape, a single remaining unknown becomes
    -1; otherwise sizes given as sym_size(t, d) of one other tensor t make t the ``like`` input
    and every copy code then refers to t. Anything else is unsupported.
    """
    exprs = _size_exprs(sizes)

    def codes_against(src: Node, keep_unknown: bool):
        src_exprs = [sym_expr(d) for d in _meta(src).shape]
        out: list[int | None] = []
        used: set[int] = set()
        for e in exprs:
            if e.is_number:
                out.append(int(e))
                continue
            # Each dimension of src is used once where it can be: [L, L] -> copies of dims 0
            # and 1, so that a reshape's copies cancel against x's own factors (bounds stay
            # tight: [12 B, L, L] -> [-1, 12, L, L] gives B, not B * L^2).
            hits = [d for d, se in enumerate(src_exprs) if _same(se, e)]
            hit = next((d for d in hits if d not in used), hits[0] if hits else None)
            if hit is not None:
                used.add(hit)
            out.append(None if hit is None else -(hit + 2))
        return out

    codes = codes_against(x, True)
    unknown = [j for j, c in enumerate(codes) if c is None]
    if not unknown:
        return codes, None
    if reshape and len(unknown) == 1 and -1 not in codes:
        codes[unknown[0]] = -1
        return codes, None
    likes = set()
    for j in unknown:
        s = sizes[j]
        if not (isinstance(s, Node) and target_name(s) == "aten.sym_size.int"):
            raise Unsupported(f"size {list(sizes)} cannot be expressed with Kiln shape codes")
        if not is_tensor_node(s.args[0]):
            raise Unsupported(f"size {list(sizes)} cannot be expressed with Kiln shape codes")
        likes.add(s.args[0])
    if len(likes) != 1:
        raise Unsupported(f"size {list(sizes)} mixes dimensions of several tensors")
    like = likes.pop()
    codes = codes_against(like, True)
    unknown = [j for j, c in enumerate(codes) if c is None]
    if unknown:
        if not reshape or len(unknown) > 1 or -1 in codes:
            raise Unsupported(f"size {list(sizes)} cannot be expressed with Kiln shape codes")
        codes[unknown[0]] = -1
    return codes, like


@_handles(
    "aten.view_copy.default",
    "aten.view.default",
    "aten._unsafe_view.default",
    "aten.reshape.default",
    kiln="reshape",
)
def _reshape(L, node, a):
    x = a["self"]
    # First the output's own sizes against x alone: a -1 the caller wrote is a known size there
    # (BLOOM's view(batch * heads, q_len, -1) of [batch, heads, q_len, kv_len]: the product is
    # then the one inferred entry), and copies of x's dimensions cancel against its factors, so
    # the inferred size keeps a tight bound. Else the sizes as written (a size read from another
    # tensor makes it the `like` input).
    out = [sym_expr(d) for d in _meta(node).shape]
    try:
        if any(e is None for e in out):
            raise Unsupported("the output's sizes are not integers")
        codes, like = _shape_codes(L, x, out, reshape=True)
    except Unsupported:
        codes, like = _shape_codes(L, x, list(a["size"]), reshape=True)
    ins = [L.value(x)]
    if like is not None:
        ins.append(L.value(like))
    return L.op("reshape", ins, {"shape": codes})


@_handles("aten.expand_copy.default", "aten.expand.default", kiln=("expand", "reshape"))
def _expand(L, node, a):
    x = a["self"]
    sizes = list(a["size"])
    try:
        codes, like = _shape_codes(L, x, sizes, reshape=False)
    except Unsupported as e:
        x_exprs = [sym_expr(d) for d in _meta(x).shape]
        out = _expand_symbolic(L, L.value(x), x_exprs, sizes)
        if out is None:
            raise e
        return out
    ins = [L.value(x)]
    if like is not None:
        ins.append(L.value(like))
    return L.op("expand", ins, {"shape": codes})


def _size_exprs(sizes) -> list:
    exprs = []
    for j, s in enumerate(sizes):
        if isinstance(s, sympy.Basic):  # a size already as an expression (repeat's own)
            exprs.append(s)
            continue
        val = s.meta.get("val") if isinstance(s, Node) else s
        e = None if isinstance(s, bool) else sym_expr(val)
        if e is None:
            raise Unsupported(f"size entry {j} = {s!r} is not an integer")
        exprs.append(e)
    return exprs


def _expand_symbolic(L: Lowerer, xv: int, x_exprs: list, sizes: list) -> int | None:
    """An expand whose symbolic sizes are not all dimensions of x or of one tensor they were
    measured on: a size that is an integer multiple c * n of such a dimension n (24 * batch
    after heads were folded into the batch) becomes two axes [n, c] expanded from size 1 and
    merged after. Entries equal to x's own aligned dimension keep it (-1). None when the sizes
    cannot be expressed this way (one merged axis at most, from a size-1 or new dimension)."""
    exprs = _size_exprs(sizes)
    nc, r = len(exprs), len(x_exprs)
    if nc < r:
        return None
    todo = []  # (entry, expr) not given by a literal or by x itself
    codes: list = []
    for j, e in enumerate(exprs):
        xd = j - (nc - r)
        if e.is_number:
            codes.append(int(e))
        elif xd >= 0 and _same(x_exprs[xd], e):
            codes.append(-1)
        else:
            codes.append(None)
            todo.append((j, e))
    if not todo:
        return L.op("expand", [xv], {"shape": codes})
    by_tensor: dict = {}
    for s in sizes:
        for t, d, size in _sym_size_sources(s) if isinstance(s, Node) else ():
            by_tensor.setdefault(t, []).append((d, sym_expr(size)))
    for like, dims in by_tensor.items():
        found = {}
        for j, e in todo:
            hit = next((("copy", d) for d, se in dims if _same(se, e)), None)
            if hit is None:
                for d, se in dims:
                    if se is None or se.is_number:
                        continue
                    ratio = sympy.simplify(e / se)
                    if ratio.is_Integer and int(ratio) > 1:
                        hit = ("split", d, int(ratio))
                        break
            if hit is None:
                break
            found[j] = hit
        else:
            return _expand_with(L, xv, x_exprs, codes, found, L.value(like))
    return None


def _expand_with(L: Lowerer, xv: int, x_exprs: list, codes: list, found: dict, likev: int) -> int:
    nc, r = len(codes), len(x_exprs)
    splits = [j for j, h in found.items() if h[0] == "split"]
    for j, h in found.items():
        if h[0] == "copy":
            codes[j] = -(h[1] + 2)
    if not splits:
        return L.op("expand", [xv, likev], {"shape": codes})
    if len(splits) > 1:
        raise Unsupported("an expand of several sizes that are multiples of symbolic sizes")
    (j,) = splits
    xd = j - (nc - r)
    if xd >= 0 and x_exprs[xd] != 1:
        raise Unsupported(f"expand of dimension {xd} of size {x_exprs[xd]}")
    # x as rank nc + 1 with [1, 1] at the split entry; x's dimensions copied in order.
    pre = []
    for k in range(nc):
        kd = k - (nc - r)
        pre.extend([1, 1] if k == j else [1] if kd < 0 else [-(kd + 2)])
    v = L.op("reshape", [xv], {"shape": pre})
    _, d, ratio = found[j]
    wide = []
    for k, c in enumerate(codes):
        wide.extend([-(d + 2), ratio] if k == j else [c])
    v = L.op("expand", [v, likev], {"shape": wide})
    # Merge the two axes back: every other entry copies its own axis of the expanded value.
    post = [-1 if k == j else -(k + (1 if k > j else 0) + 2) for k in range(nc)]
    return L.op("reshape", [v], {"shape": post})


@_handles("aten.repeat.default", kiln=("reshape", "expand"))
def _repeat(L, node, a):
    """x.repeat(r0, r1, ...): each dimension d of size n gets a new axis of size r before it,
    expanded and merged (r * n): [n0, n1] -> [1, n0, 1, n1] -> [r0, n0, r1, n1]. x's sizes may
    be symbolic (BLOOM's alibi over a dynamic length, repeated per batch) and one count may be
    symbolic (measured on a tensor: a table repeated per batch); the merged sizes must then be
    copies (a count of 1) or at most one product of a symbolic size."""
    x, reps = a["self"], list(a["repeats"])
    r = L.rank(x)
    if len(reps) < r:
        raise Unsupported("repeat with fewer counts than dimensions")
    lead = len(reps) - r
    shape = [sympy.Integer(1)] * lead + [sym_expr(d) for d in _meta(x).shape]
    sym = [i for i, rep in enumerate(reps) if isinstance(rep, (Node, torch.SymInt))]
    if len(sym) > 1:
        raise Unsupported("repeat with several symbolic counts")
    pre = []
    for i, n in enumerate(shape):
        pre += [1, int(n) if n.is_number else -(i - lead + 2)]
    v = L.op("reshape", [L.value(x)], {"shape": pre})
    wide = [e for rep, n in zip(reps, shape, strict=True) for e in (rep, n)]
    if sym or any(not n.is_number for n in shape):
        v = _expand_symbolic(L, v, [e for n in shape for e in (sympy.Integer(1), n)], wide)
        if v is None:
            raise Unsupported("repeat with a symbolic count not measured on a tensor")
    else:
        v = L.op("expand", [v], {"shape": [int(e) for e in wide]})
    merged = []
    for i, (rep, n) in enumerate(zip(reps, shape, strict=True)):
        if i not in sym and int(rep) == 1:
            merged.append(-(2 * i + 1 + 2))  # the expanded value's axis of n, copied
        elif i not in sym and n.is_number:
            merged.append(int(rep) * int(n))
        else:
            merged.append(None)
    unknown = [i for i, m in enumerate(merged) if m is None]
    if len(unknown) > 1:
        raise Unsupported("repeat with several symbolic repeated sizes")
    merged = [-1 if m is None else m for m in merged]
    return L.op("reshape", [v], {"shape": merged})


@_handles(
    "aten.unfold_copy.default",
    "aten.unfold.default",
    kiln=("slice", "reshape", "index", "permute"),
)
def _unfold(L, node, a):
    """Tensor.unfold(dim, size, step): n = (L - size) // step + 1 windows along dim, each a new
    last dim of `size` (PatchTST's patches, audio frames). Windows that do not overlap
    (step == size) are a slice and a reshape; others an index by the constant [n, size] table
    of positions i * step + j. Then the window axis moves to the end."""
    x = a["self"]
    r = L.rank(x)
    d = _static_int(a["dimension"], "dimension") % max(r, 1)
    size, step = _static_int(a["size"], "size"), _static_int(a["step"], "step")
    length = _static_count(x, [d], "unfold") if r > 0 else 1
    if size < 1 or step < 1 or size > length:
        raise Unsupported(f"unfold of size {size} and step {step} over {length}")
    n = (length - size) // step + 1
    v = L.value(x)
    if r == 0:
        raise Unsupported("unfold of a 0-d tensor")
    if step == size:
        if n * size != length:
            v = L.op("slice", [v], {"dim": d, "start": 0, "end": n * size, "step": 1})
        shape = [-(i + 2) for i in range(d)] + [n, size] + [-(i + 2) for i in range(d + 1, r)]
        v = L.op("reshape", [v], {"shape": shape})
    else:
        pos = torch.arange(n, dtype=torch.int64)[:, None] * step + torch.arange(size)[None, :]
        v = L.op("index", [v, L.const_tensor(pos, f"{node.name}_windows")], {"dim": d, "wrap": 0})
    # [.., n, size, rest..] -> [.., n, rest.., size]
    if d + 2 <= r:
        dims = list(range(d + 1)) + list(range(d + 2, r + 1)) + [d + 1]
        v = L.op("permute", [v], {"dims": dims})
    return v


@_handles("aten.permute_copy.default", "aten.permute.default", kiln="permute")
def _permute(L, node, a):
    return L.op("permute", [L.value(a["self"])], {"dims": _ints(a["dims"], None, "dims")})


@_handles("aten.transpose.int", "aten.transpose_copy.int", kiln=("permute", "copy"))
def _transpose(L, node, a):
    x = a["self"]
    r = L.rank(x)
    if r == 0:
        return L.op("copy", [L.value(x)])
    d0, d1 = _static_int(a["dim0"], "dim0") % r, _static_int(a["dim1"], "dim1") % r
    perm = list(range(r))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return L.op("permute", [L.value(x)], {"dims": perm})


@_handles("aten.t.default", "aten.t_copy.default", kiln=("permute", "copy"))
def _t(L, node, a):
    x = a["self"]
    if L.rank(x) < 2:
        return L.op("copy", [L.value(x)])
    return L.op("permute", [L.value(x)], {"dims": [1, 0]})


@_handles("aten.cat.default", kiln="cat")
def _cat(L, node, a):
    ts = list(a["tensors"])
    if not ts:
        raise Unsupported("cat of no tensors")
    dim = _static_int(a["dim"], "dim")
    vals = [L.value(t) for t in ts]
    # more tensors than a Kiln cat takes (Mamba's scan unrolled over 128 steps): cats of chunks,
    # then a cat of those (the same values in the same order)
    most = _ops.get("cat").max_inputs
    while len(vals) > most:
        vals = [
            L.op("cat", vals[i : i + most], {"dim": dim}) if len(vals[i : i + most]) > 1
            else vals[i]
            for i in range(0, len(vals), most)
        ]  # fmt: skip
    return L.op("cat", vals, {"dim": dim})


@_handles("aten.slice_copy.Tensor", "aten.slice.Tensor", kiln=("slice", "arange", "index"))
def _slice(L, node, a):
    if isinstance(a["end"], Node) and not sym_expr(a["end"].meta.get("val")).is_number:
        return _slice_to_symbolic_end(L, node, a)
    start = 0 if a["start"] is None else _static_int(a["start"], "slice start")
    end = _graph.INT64_MAX if a["end"] is None else _static_int(a["end"], "slice end")
    step = _static_int(a["step"], "slice step")
    return L.op(
        "slice",
        [L.value(a["self"])],
        {"dim": _static_int(a["dim"], "dim"), "start": start, "end": end, "step": step},
    )


def _raw_lower_bound(ranges: Ranges, expr) -> int:
    """The least value of expr over the program's symbol ranges (unadjusted lower bounds)."""
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    vr = {}
    for sym in expr.free_symbols:
        r = ranges._raw.get(sym)
        lo = _to_int(r.lower, 0) if r is not None else 0
        hi = _to_int(r.upper, None) if r is not None else None
        vr[sym] = ValueRanges(lo, hi if hi is not None else sympy.oo)
    return _to_int(bound_sympy(expr, vr).lower, -1)


def _slice_to_symbolic_end(L, node, a):
    """x[..., start:end:step] with a symbolic end that never needs clamping (at most x's size):
    the positions as a Kiln arange whose length is read at run time, then index."""
    x = a["self"]
    xm = _meta(x)
    dim = _static_int(a["dim"], "dim") % xm.dim()
    start = 0 if a["start"] is None else _static_int(a["start"], "slice start")
    step = _static_int(a["step"], "slice step")
    if start < 0 or step <= 0:
        raise Unsupported("slice to a symbolic end with a negative start or step")
    slack = sympy.expand(sym_expr(xm.shape[dim]) - sym_expr(a["end"].meta["val"]))
    if not (slack.is_number and int(slack) >= 0) and _raw_lower_bound(L.ranges, slack) < 0:
        raise Unsupported(
            f"slice end {a['end'].meta['val']} may exceed the dimension's size {xm.shape[dim]}"
        )
    pos = _dynamic_range(L, start, a["end"], step, torch.int64, "slice")
    return L.op("index", [L.value(x), pos], {"dim": dim, "wrap": 0})


@_handles("aten.select_copy.int", "aten.select.int", kiln="select")
def _select(L, node, a):
    return L.op(
        "select",
        [L.value(a["self"])],
        {"dim": _static_int(a["dim"], "dim"), "index": _static_int(a["index"], "index")},
    )


def _squeeze(L, node: Node, x: Node, dims):
    """torch.squeeze drops only the listed dimensions of size 1; Kiln's squeeze needs exactly
    those, so they are read from the static shape and checked against the output rank."""
    xm = _meta(x)
    r = xm.dim()
    if dims is None:
        dims = list(range(r))
    drop = set()
    for d in dims:
        d = _static_int(d, "dim")
        if r == 0:
            continue
        e = sym_expr(xm.shape[d % r])
        if e.is_number and int(e) == 1:
            drop.add(d % r)
    if r - len(drop) != _meta(node).dim():
        raise Unsupported("squeeze of a symbolic dimension")
    if not drop:
        return L.op("copy", [L.value(x)])
    return L.op("squeeze", [L.value(x)], {"dims": sorted(drop)})


@_handles("aten.squeeze_copy.dims", "aten.squeeze.dims", kiln=("squeeze", "copy"))
def _squeeze_dims(L, node, a):
    return _squeeze(L, node, a["self"], list(a["dim"]))


@_handles("aten.squeeze_copy.dim", "aten.squeeze.dim", kiln=("squeeze", "copy"))
def _squeeze_dim(L, node, a):
    return _squeeze(L, node, a["self"], [a["dim"]])


@_handles("aten.squeeze_copy.default", "aten.squeeze.default", kiln=("squeeze", "copy"))
def _squeeze_all(L, node, a):
    return _squeeze(L, node, a["self"], None)


@_handles("aten.unsqueeze_copy.default", "aten.unsqueeze.default", kiln="unsqueeze")
def _unsqueeze(L, node, a):
    return L.op("unsqueeze", [L.value(a["self"])], {"dim": _static_int(a["dim"], "dim")})


@_handles(
    "aten.split_with_sizes_copy.default",
    "aten.split_with_sizes.default",
    kiln="slice",
)
def _split_with_sizes(L, node, a):
    x = a["self"]
    dim = _static_int(a["dim"], "dim")
    sizes = [_static_int(s, "split size") for s in a["split_sizes"]]
    outs, start = [], 0
    for s in sizes:
        outs.append(
            L.op("slice", [L.value(x)], {"dim": dim, "start": start, "end": start + s, "step": 1})
        )
        start += s
    return outs


@_handles("aten.split_copy.Tensor", "aten.split.Tensor", kiln="slice")
def _split(L, node, a):
    x = a["self"]
    dim = _static_int(a["dim"], "dim")
    size = _static_int(a["split_size"], "split size")
    e = sym_expr(_meta(x).shape[dim])
    if not e.is_number or size <= 0:
        raise Unsupported("split of a symbolic dimension")
    n = int(e)
    outs = []
    for start in range(0, n, size):
        outs.append(
            L.op(
                "slice", [L.value(x)], {"dim": dim, "start": start, "end": start + size, "step": 1}
            )
        )
    return outs


@_handles("aten.unbind_copy.int", "aten.unbind.int", kiln="select")
def _unbind(L, node, a):
    x = a["self"]
    dim = _static_int(a["dim"], "dim")
    e = sym_expr(_meta(x).shape[dim])
    if not e.is_number:
        raise Unsupported("unbind of a symbolic dimension")
    return [L.op("select", [L.value(x)], {"dim": dim, "index": i}) for i in range(int(e))]


@_handles("aten.embedding.default", kiln="embedding")
def _embedding(L, node, a):
    return L.op("embedding", [L.value(a["weight"]), L.value(a["indices"])])


# embedding bags: only uniform bags (every bag the same size), which is what nn.EmbeddingBag
# makes of 2-D indices: indices.view(-1) with offsets arange(0, numel, bag_size). Kiln computes
# them as reshape(indices, [-1, bag_size]) -> embedding -> sum/mean over the bag (max through a
# [bag_size, 1] max_pool2d). The offsets arange produces no Kiln value: it is taken ("virtual")
# only together with the bags that read it as their offsets.

EMBEDDING_BAG_OPS = (
    "aten._embedding_bag.default",
    "aten._embedding_bag_forward_only.default",
    "aten.embedding_bag.padding_idx",
    "aten.embedding_bag.default",
)
ARANGE_OPS = ("aten.arange.start_step", "aten.arange.start", "aten.arange.default")
# Check reasons starting with this mark a bag whose offsets are only known at run time.
RUNTIME_OFFSETS = "offsets are given at run time"


def _arange_parts(node: Node) -> tuple:
    """(start, end, step) of an aten.arange node, as given (ints, floats or symbolic nodes)."""
    a = bind_args(node)
    name = target_name(node)
    if name == "aten.arange.default":
        return 0, a["end"], 1
    if name == "aten.arange.start":
        return a["start"], a["end"], 1
    return a["start"], a["end"], a["step"]


def _scalar_expr(v):
    """The sympy expression of an int or an int-valued SymInt node; None otherwise."""
    if isinstance(v, Node):
        v = v.meta.get("val")
    if isinstance(v, bool):
        return None
    return sym_expr(v)


# Ops that pass a value through unchanged (a lifted constant reaches its user through a clone).
_COPY_OPS = (
    "aten.clone.default",
    "aten.lift_fresh_copy.default",
    "aten.alias.default",
    "aten.alias_copy.default",
    "aten.detach.default",
    "aten.detach_copy.default",
    "dim_order_ops._clone_dim_order.default",
)


def _through_copies(n: Node) -> Node:
    while n.op == "call_function" and target_name(n) in _COPY_OPS and isinstance(n.args[0], Node):
        n = n.args[0]
    return n


def _uniform_bag_size(L: Lowerer, node: Node, a: dict) -> int:
    """The size of every bag, when the offsets split the 1-D indices into equal bags."""
    if a["include_last_offset"]:
        raise Unsupported("embedding bag with include_last_offset=True")
    indices, offsets = a["indices"], a["offsets"]
    im = _meta(indices)
    if im.dim() != 1:
        raise Unsupported(f"embedding bag indices of rank {im.dim()}; expected 1-D")
    numel = sym_expr(im.shape[0])
    if not isinstance(offsets, Node):
        raise Unsupported("embedding bag offsets are not a tensor")
    src = _through_copies(offsets)
    if target_name(offsets) in ARANGE_OPS:
        start, end, step = (_scalar_expr(v) for v in _arange_parts(offsets))
        if start is None or not start.is_number or int(start) != 0:
            raise Unsupported("embedding bag offsets: arange does not start at 0")
        if step is None or not step.is_number or int(step) <= 0:
            raise Unsupported("embedding bag offsets: arange step is not a positive constant")
        if not _same(end, numel):
            raise Unsupported(
                f"embedding bag offsets: arange ends at {end}, not at the number of indices "
                f"({numel})"
            )
        bag = int(step)
    elif L.const_data.get(src) is not None:
        t = L.const_data[src]
        if not numel.is_number:
            raise Unsupported("embedding bag with constant offsets and a dynamic number of indices")
        n = int(numel)
        nb = t.numel()
        if t.dim() != 1 or nb == 0 or n % nb or n == 0:
            raise Unsupported("embedding bag offsets do not make bags of one size")
        bag = n // nb
        if not torch.equal(t.to(torch.int64), torch.arange(0, n, bag, dtype=torch.int64)):
            raise Unsupported("embedding bag offsets do not make bags of one size")
    elif src in L.const_data and L.check:
        raise Unsupported(
            f"embedding bag offsets '{src.name}' are a parameter or buffer, whose values "
            "ExecuTorch does not show partitioners; make them a tensor created in forward "
            "(torch.tensor or torch.arange), or use 2-D indices"
        )
    elif src.op == "placeholder" and L.check:
        raise Unsupported(
            f"{RUNTIME_OFFSETS} ('{src.name}'); Kiln takes only bags of one size (2-D "
            "indices, or offsets that are an arange or a constant)"
        )
    elif src.op == "placeholder":
        # Build mode: constant offsets the partitioner verified can reach the partition as a
        # delegate input (when they have users outside it); the shapes give the bag size.
        om = _meta(src)
        if om.dim() != 1 or not numel.is_number or not sym_expr(om.shape[0]).is_number:
            raise Unsupported(f"{RUNTIME_OFFSETS} ('{src.name}')")
        nb = int(sym_expr(om.shape[0]))
        if nb == 0 or int(numel) % nb:
            raise Unsupported("embedding bag offsets do not make bags of one size")
        bag = int(numel) // nb
    else:
        raise Unsupported(
            f"{RUNTIME_OFFSETS} (computed by '{offsets.name}'); Kiln takes only bags of one size "
            "(2-D indices, or offsets that are an arange or a constant)"
        )
    vals = node.meta.get("val")
    out = vals[0] if isinstance(vals, (list, tuple)) and vals else None
    if not isinstance(out, torch.Tensor) or out.dim() != 2:
        raise Unsupported("embedding bag output is not a 2-D tensor")
    if not _same(sym_expr(out.shape[0]) * bag, numel):
        raise Unsupported(
            f"embedding bag: {out.shape[0]} bags of {bag} indices do not cover {numel} indices"
        )
    return bag


def _bag_padding_idx(name: str, a: dict, n_rows: int) -> int | None:
    """The padding row of an embedding bag, or None. ``_embedding_bag`` spells "no padding" -1
    (``embedding_bag.padding_idx`` wraps a negative index before calling it);
    ``embedding_bag.padding_idx`` spells it None and wraps negative indices itself."""
    p = a.get("padding_idx")
    if p is None:
        return None
    p = _static_int(p, "padding_idx")
    if name.startswith("aten._embedding_bag"):
        if p == -1:
            return None
    elif p < 0:
        p += n_rows
    if p < 0 or p >= n_rows:
        raise Unsupported(f"embedding bag padding_idx={p} outside [0, {n_rows})")
    return p


_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}


@_handles(
    *EMBEDDING_BAG_OPS,
    kiln=("reshape", "embedding", "sum", "mean", "mul", "div", "clamp", "max_pool2d", "cast"),
)
def _embedding_bag(L, node, a):
    name = target_name(node)
    weight, indices = a["weight"], a["indices"]
    mode = _BAG_MODES.get(_static_int(a["mode"], "mode"))
    if mode is None:
        raise Unsupported(f"embedding bag mode={a['mode']!r}")
    wm = _meta(weight)
    if wm.dim() != 2 or not all(sym_expr(d).is_number for d in wm.shape):
        raise Unsupported("embedding bag weight is not a static 2-D tensor")
    n_rows, width = (int(sym_expr(d)) for d in wm.shape)
    bag = _uniform_bag_size(L, node, a)
    pad = _bag_padding_idx(name, a, n_rows)
    psw = a["per_sample_weights"]
    if psw is not None and mode != "sum":
        raise Unsupported(f"embedding bag per_sample_weights with mode={mode!r}")
    if pad is not None and mode == "max":
        raise Unsupported("embedding bag mode='max' with padding_idx")
    idx = L.op("reshape", [L.value(indices)], {"shape": [-1, bag]})  # [B, bag]
    rows = L.op("embedding", [L.value(weight), idx])  # [B, bag, width]
    if psw is not None:
        if not isinstance(psw, Node):
            raise Unsupported("embedding bag per_sample_weights is not a tensor")
        w = L.op("reshape", [L.operand(psw, wm.dtype)], {"shape": [-1, bag, 1]})
        rows = L.op("mul", [rows, w])
    keep = None
    if pad is not None:
        # 1 for every row but the padding row: its rows drop out of the sum and the count.
        table = torch.ones(n_rows, 1, dtype=wm.dtype)
        table[pad] = 0
        L._n_auto += 1
        keep = L.op("embedding", [L.const_tensor(table, f"bag_keep{L._n_auto}"), idx])
        rows = L.op("mul", [rows, keep])
    if mode == "max":
        x = L.op("reshape", [rows], {"shape": [-1, 1, bag, width]})
        x = L.op("max_pool2d", [x], {"kernel": [bag, 1], "stride": [bag, 1]})
        out = L.op("reshape", [x], {"shape": [-1, width]})
    elif mode == "mean" and keep is not None:
        total = L.op("sum", [rows], {"dims": [1], "keepdim": 0})
        count = L.op("sum", [keep], {"dims": [1], "keepdim": 0})  # [B, 1]
        # A bag of padding only gives 0 (as PyTorch): 0 / max(count, 1).
        out = L.op("div", [total, L.op("clamp", [count], {"min": 1.0})])
    else:
        out = L.op(mode, [rows], {"dims": [1], "keepdim": 0})
    # Only the bags are computed; offset2bag, bag_size and max_indices are left to ExecuTorch,
    # so a node whose other outputs are used is not taken.
    return [out, None, None, None]


def _size_source(v, want) -> tuple[Node, int] | None:
    """(tensor, dim) whose size is the expression want, found through the sym_size nodes the
    symbolic integer v (a SymInt node) is computed from; None when there is none."""
    if not isinstance(v, Node) or want is None:
        return None
    for t, d, size in _sym_size_sources(v):
        if _same(sym_expr(size), want):
            return t, d
    return None


def _sym_size_sources(v):
    """(tensor, dim, size) for every dimension of the tensors whose sym_size nodes the symbolic
    integer v (a SymInt node) is computed from."""
    seen, todo = set(), [v]
    while todo:
        n = todo.pop()
        if n in seen or not isinstance(n, Node):
            continue
        seen.add(n)
        if target_name(n) == "aten.sym_size.int" and is_tensor_node(n.args[0]):
            t = n.args[0]
            for d, size in enumerate(_meta(t).shape):
                yield t, d, size
        if is_sym_node(n):
            todo.extend(n.all_input_nodes)


def _dynamic_range(L: Lowerer, start, end, step, dtype: torch.dtype, what: str) -> int:
    """A Kiln arange of start, start + step, ... < end where end is symbolic: its length is read
    from a dimension of a tensor at run time."""
    if any(isinstance(v, (Node, torch.SymInt, torch.SymFloat)) for v in (start, step)):
        raise Unsupported(f"{what} with a symbolic start or step")
    if not isinstance(step, (int, float)) or step == 0:
        raise Unsupported(f"{what} step {step!r}")
    e = sym_expr(end.meta.get("val")) if isinstance(end, Node) else None
    if e is None:
        raise Unsupported(f"{what} end {end!r} is not an integer")
    length = sympy.simplify(sympy.ceiling((e - start) / step))
    src = _size_source(end, length)
    if src is None:
        raise Unsupported(
            f"{what} of length {length}: no tensor dimension of that size to read it from"
        )
    t, d = src
    if dtype not in _graph.TORCH_TO_KILN or dtype == torch.bool:
        raise Unsupported(f"{what} of dtype {dtype}")
    return L.op(
        "arange",
        [L.value(t)],
        {
            "dim": d,
            "start": float(start),
            "step": float(step),
            "dtype": _graph.TORCH_TO_KILN[dtype],
        },
    )


@_handles(*ARANGE_OPS, kiln=("arange",))
def _arange(L, node, a):
    """A symbolic length becomes a Kiln arange reading it from a tensor's dimension; constant
    ones are folded (Lowerer.fold). As the offsets of embedding bags, which read its arguments
    rather than its values, it produces no Kiln value."""
    users = list(node.users)
    for u in users:
        if target_name(u) not in EMBEDDING_BAG_OPS:
            break
        uses = [k for k, v in bind_args(u).items() if v is node]
        if uses != ["offsets"]:
            break
    else:
        if users:
            return None
    start, end, step = _arange_parts(node)
    if not isinstance(end, Node):
        raise Unsupported("arange of a constant length (folded as a constant)")
    return _dynamic_range(L, start, end, step, _out_dtype(node), "arange")


# as_strided: a view of x's (contiguous) storage. Where the view is x's own elements in order,
# it is a reshape; otherwise, for static shapes, a copy through a constant table of flat
# positions (index over reshape(x, [-1])).
MAX_AS_STRIDED_NUMEL = 1 << 22


def _as_strided_reshape(L, x: Node, a: dict):
    """as_strided that is x's own elements in order (x contiguous, no offset, the strides of
    every dimension larger than 1 the contiguous ones of the new sizes), also with symbolic
    sizes: a reshape. None when it is not one."""
    xm = _meta(x)
    if not is_contiguous(xm) or a["storage_offset"] not in (None, 0):
        return None
    sizes = list(a["size"])
    exprs = []
    for v in list(sizes) + list(a["stride"]):
        e = sym_expr(v.meta.get("val")) if isinstance(v, Node) else sym_expr(v)
        if e is None:
            return None
        exprs.append(e)
    size_e, stride_e = exprs[: len(sizes)], exprs[len(sizes) :]
    acc = sympy.Integer(1)
    for sz, st in zip(reversed(size_e), reversed(stride_e), strict=True):
        if not (sz == 1) and not _same(st, acc):
            return None
        acc = acc * sz
    numel = sympy.Integer(1)
    for d in xm.shape:
        numel = numel * sym_expr(d)
    if not _same(acc, numel):
        return None
    try:
        codes, like = _shape_codes(L, x, sizes, reshape=True)
    except Unsupported:
        return None
    ins = [L.value(x)] + ([L.value(like)] if like is not None else [])
    return L.op("reshape", ins, {"shape": codes})


@_handles("aten.as_strided_copy.default", "aten.as_strided.default", kiln=("reshape", "index"))
def _as_strided(L, node, a):
    x = a["self"]
    xm = _meta(x)
    view = _as_strided_reshape(L, x, a)
    if view is not None:
        return view
    try:
        shape = [_static_int(d, "as_strided input size") for d in xm.shape]
        xstride = [_static_int(d, "as_strided input stride") for d in xm.stride()]
        size = [_static_int(v, "as_strided size") for v in a["size"]]
        stride = [_static_int(v, "as_strided stride") for v in a["stride"]]
        offset = 0 if a["storage_offset"] is None else _static_int(a["storage_offset"], "offset")
    except Unsupported as e:
        raise Unsupported(f"as_strided with a symbolic size ({e})") from None
    numel, n_out = math.prod(shape), math.prod(size)
    if n_out > MAX_AS_STRIDED_NUMEL or numel > MAX_AS_STRIDED_NUMEL:
        raise Unsupported(f"as_strided over {max(numel, n_out)} elements is too large to tabulate")
    # Kiln holds x densely in logical order; x's strides say where each element sits in the
    # storage as_strided reads. storage[p] = the logical index of the element stored at p.
    storage = torch.full((numel,), -1, dtype=torch.int64)
    if numel:
        try:
            torch.as_strided(storage, shape, xstride).copy_(torch.arange(numel).reshape(shape))
        except RuntimeError as e:
            raise Unsupported(f"as_strided of an input with strides {xstride}: {e}") from None
        if int(storage.min()) < 0:
            raise Unsupported(f"as_strided of an input with overlapping strides {xstride}")
    pos = torch.full(size, offset, dtype=torch.int64)
    for d, (sz, st) in enumerate(zip(size, stride, strict=True)):
        shp = [1] * len(size)
        shp[d] = sz
        pos = pos + torch.arange(sz, dtype=torch.int64).reshape(shp) * st
    if n_out and (int(pos.min()) < 0 or int(pos.max()) >= numel):
        raise Unsupported("as_strided reads outside its input")
    table = storage[pos.reshape(-1)].reshape(size) if n_out else pos
    if n_out == numel and torch.equal(table.reshape(-1), torch.arange(numel)):
        return L.op("reshape", [L.value(x)], {"shape": size})
    flat = L.op("reshape", [L.value(x)], {"shape": [numel]})
    L._n_auto += 1
    idx = L.const_tensor(table.contiguous(), f"as_strided{L._n_auto}")
    return L.op("index", [flat, idx], {"dim": 0, "wrap": 0})


# copies and casts


@_handles(
    "aten.clone.default",
    "aten.alias.default",
    "aten.alias_copy.default",
    "aten.lift_fresh_copy.default",
    "aten.detach.default",
    "aten.detach_copy.default",
    kiln="copy",
)
def _copy(L, node, a):
    # A copy to another memory format (channels-last) keeps the values: Kiln's tensors are dense
    # inside an engine, and the partitioner never lets a non-contiguous value cross a boundary.
    return L.op("copy", [L.value(a["self"])])


@_handles("dim_order_ops._clone_dim_order.default", kiln="copy")
def _clone_dim_order(L, node, a):
    return L.op("copy", [L.value(a["self"])])


def _to_copy(L, node, a):
    """A dtype cast or a copy; a target memory format (channels-last) keeps the values."""
    x = a["self"]
    dev = a.get("device")
    if dev is not None and torch.device(dev).type != "cpu":
        raise Unsupported(f"copy to device {dev}")
    out = _out_dtype(node)
    src = L.dtype(x)
    if out == src:
        return L.op("copy", [L.value(x)])
    return L.cast(L.value(x), src, out)


@_handles("aten._to_copy.default", kiln=("cast", "copy"))
def _to_copy_aten(L, node, a):
    return _to_copy(L, node, a)


@_handles("dim_order_ops._to_dim_order_copy.default", kiln=("cast", "copy"))
def _to_dim_order_copy(L, node, a):
    return _to_copy(L, node, a)


# constants


@_handles("aten.scalar_tensor.default", kiln=("arange", "select"))
def _scalar_tensor(L, node, a):
    s = a["s"]
    if isinstance(s, Node) and isinstance(s.meta.get("val"), torch.SymInt):
        return _sym_scalar(L, s, _out_dtype(node), "scalar_tensor")
    return L.scalar(s, _out_dtype(node))


def _sym_scalar(L: Lowerer, v: Node, dtype: torch.dtype, what: str) -> int:
    """A 0-d value holding a symbolic integer known at run time (a sequence length): a tensor
    dimension's size plus a constant, as the last entry of a Kiln arange over that dimension."""
    e = sym_expr(v.meta.get("val"))
    if e is None:
        raise Unsupported(f"{what} of {v.meta.get('val')!r}, not an integer")
    if e.is_number:
        return L.scalar(int(e), dtype)
    if dtype not in _graph.TORCH_TO_KILN or dtype == torch.bool:
        raise Unsupported(f"{what} of dtype {dtype}")
    for t, d, size in _sym_size_sources(v):
        k = sympy.expand(sym_expr(size) - e)
        if k.is_number:
            # arange(start = 1 - k)[-1] = 1 - k + (size - 1) = size - k = e
            ar = L.op(
                "arange",
                [L.value(t)],
                {
                    "dim": d,
                    "start": float(1 - int(k)),
                    "step": 1.0,
                    "dtype": _graph.TORCH_TO_KILN[dtype],
                },
            )
            return L.op("select", [ar], {"dim": 0, "index": -1})
    raise Unsupported(f"{what} of {e}: no tensor dimension of that size to read it from")


@_handles("aten.full.default", kiln=("expand", "reshape", "squeeze"))
def _full(L, node, a):
    m = _meta(node)
    if any(not sym_expr(d).is_number for d in m.shape):
        return _full_symbolic(L, node, a, m)
    if m.numel() > MAX_FOLDED_FULL_NUMEL:
        raise Unsupported("full constant too large to fold")
    v = a["fill_value"]
    if isinstance(v, (Node, torch.SymInt, torch.SymFloat)):
        raise Unsupported("full with a symbolic value")
    t = torch.full([int(sym_expr(d)) for d in m.shape], v, dtype=m.dtype)
    L._n_auto += 1
    return L.const_tensor(t, f"full{L._n_auto}")


def _full_symbolic(L, node, a, m):
    """full of a symbolic size: the value broadcast to it, each symbolic size read from the
    dimension of the tensor it was measured on (DeBERTa's relative positions at a dynamic
    length)."""
    v = a["fill_value"]
    if isinstance(v, (Node, torch.SymInt, torch.SymFloat)):
        raise Unsupported("full with a symbolic value")
    likes = {}
    for j, (size, want) in enumerate(zip(a["size"], m.shape, strict=True)):
        if sym_expr(want).is_number:
            continue
        src = _size_source(size, sym_expr(want))
        if src is None:
            raise Unsupported(f"full of size {list(m.shape)}: no tensor dimension of size {want}")
        likes[j] = src
    s = L.scalar(v, m.dtype)
    return _broadcast_to(L, s, torch.empty(()), list(m.shape), likes, "full")


@_handles("aten.full_like.default", kiln=("expand", "reshape", "squeeze"))
def _full_like(L, node, a):
    """full_like(x, v): the scalar v broadcast to x's shape, its symbolic sizes read from x (a
    full_like of static shape is a constant and folds before it gets here)."""
    v = a["fill_value"]
    if isinstance(v, (Node, torch.SymInt, torch.SymFloat)):
        raise Unsupported("full_like with a symbolic value")
    x = a["self"]
    xm = _meta(x)
    s = L.scalar(v, _out_dtype(node))
    likes = {j: (x, j) for j in range(len(xm.shape))}
    return _broadcast_to(L, s, torch.empty(()), list(xm.shape), likes, "full_like")


# attention


def _gqa_repeat(L, q, kv, x):
    """enable_gqa: k or v [B, Hk, S, E] repeated to q's Hq heads (each kv head serving Hq / Hk
    consecutive query heads) the way transformers' repeat_kv writes it, unsqueeze, expand,
    reshape, which the builder reads back as grouped-query attention over the Hk heads with no
    repeat made (docs/builder.md)."""
    qs, ks = list(_meta(q).shape), list(_meta(kv).shape)
    if len(qs) != 4 or len(ks) != 4:
        raise Unsupported(f"sdpa with enable_gqa=True on rank {len(qs)} (Kiln takes rank 4)")
    hq, hk = sym_expr(qs[1]), sym_expr(ks[1])
    if not (hq.is_number and hk.is_number) or int(hk) <= 0 or int(hq) % int(hk) != 0:
        raise Unsupported(
            f"sdpa with enable_gqa=True: {hq} query heads over {hk} key/value heads (the query "
            "heads must be a static multiple of the key/value heads)"
        )
    r = int(hq) // int(hk)
    if r == 1:
        return x
    u = L.op("unsqueeze", [x], {"dim": 2})
    e = L.op("expand", [u], {"shape": [-1, -1, r, -1, -1]})
    return L.op("reshape", [e], {"shape": [-2, int(hq), -5, -6]})


@_handles(
    "aten.scaled_dot_product_attention.default",
    kiln=("sdpa", "cast", "unsqueeze", "expand", "reshape"),
)
def _sdpa(L, node, a):
    if not (isinstance(a["dropout_p"], (int, float)) and a["dropout_p"] == 0):
        raise Unsupported(f"sdpa with dropout_p={a['dropout_p']}")
    q, k, v = a["query"], a["key"], a["value"]
    ins = [L.value(q), L.value(k), L.value(v)]
    if a.get("enable_gqa"):
        ins[1], ins[2] = _gqa_repeat(L, q, k, ins[1]), _gqa_repeat(L, q, v, ins[2])
    mask = a["attn_mask"]
    if mask is not None:
        if not isinstance(mask, Node):
            raise Unsupported("sdpa mask is not a tensor")
        md = L.dtype(mask)
        ins.append(L.value(mask) if md == torch.bool else L.cast(L.value(mask), md, L.dtype(q)))
    scale = a["scale"]
    if isinstance(scale, (Node, torch.SymFloat)):
        raise Unsupported("sdpa scale is symbolic")
    return L.op(
        "sdpa",
        ins,
        {
            "is_causal": int(bool(a["is_causal"])),
            "scale": math.nan if scale is None else float(scale),
        },
    )


# Non-core ATen ops Kiln keeps whole (ops_to_not_decompose) when it supports every node of
# them. Ops whose default decomposition is a single core op Kiln takes (layer_norm ->
# native_layer_norm, softmax -> _softmax, relu6 -> hardtanh, ...) need no entry.
PRESERVED_OPS = (
    # (core ATen, but torch.export's decomposition turns it into an index_put with accumulate)
    "aten.col2im.default",
    "aten.linear.default",
    "aten.scaled_dot_product_attention.default",
    "aten.hardswish.default",
    "aten.hardsigmoid.default",
    "aten.silu.default",
    "aten.matmul.default",
    # decomposes to _embedding_bag_forward_only (not core ATen) when the weight does not require
    # grad, which to_edge refuses
    "aten.embedding_bag.padding_idx",
    "aten.embedding_bag.default",
)


def kiln_op_names() -> set[str]:
    """Every Kiln op name the translation table may emit."""
    return {k for h in HANDLERS.values() for k in h.kiln_ops}


# --- checking one node (the partitioner's question)


@dataclass
class Check:
    ok: bool
    reason: str = ""
    outputs: tuple[bool, ...] = ()  # which outputs Kiln produces (multi-output ops)
    kiln_ops: tuple[str, ...] = ()
    folded: bool = False  # taken as constants computed at lowering time (Lowerer.fold)

    @property
    def virtual(self) -> bool:
        """A node taken without a Kiln value (an embedding bag's offsets arange): its users
        read its arguments, so it must be in the partition of every user."""
        return self.ok and self.outputs == (False,)


def check_node(
    node: Node,
    ranges: Ranges,
    constants: dict[Node, torch.Tensor | None] | None = None,
    foldable: set[Node] | None = None,
) -> Check:
    """Whether Kiln can compute this node: translates it into a scratch graph whose inputs
    are its tensor arguments, and compares the inferred output dtypes and shapes with
    ``node.meta["val"]``. ``constants``: data of the program's constant placeholders;
    ``foldable``: the nodes computed from constants alone (:func:`foldable_nodes`), which Kiln
    may fold when it has no op for them."""
    name = target_name(node)
    foldable = foldable if foldable is not None else set()
    if name not in HANDLERS and node not in foldable:
        return Check(False, f"{name} has no Kiln translation")
    vals = node.meta.get("val")
    outs = list(vals) if isinstance(vals, (list, tuple)) else [vals]
    for o in outs:
        if o is not None and not isinstance(o, torch.Tensor):
            return Check(False, f"{name} produces a non-tensor")
    g = _graph.Graph()
    try:
        L = Lowerer(g, ranges, check=True, constants=constants, foldable=foldable)
        emitted: list[str] = []
        orig_add_node = g.add_node

        def add_node(op, *args, **kw):
            emitted.append(op)
            return orig_add_node(op, *args, **kw)

        g.add_node = add_node
        got = L.lower(node)
        produced = []
        for i, v in enumerate(got):
            if v is None:
                produced.append(False)
                continue
            if i >= len(outs) or not isinstance(outs[i], torch.Tensor):
                return Check(False, f"{name}: output {i} has no tensor metadata")
            _check_value(g, v, outs[i], ranges, name, i)
            produced.append(True)
        return Check(True, "", tuple(produced), tuple(emitted), node in L.folded_nodes)
    except Unsupported as e:
        return Check(False, f"{name}: {e}")
    finally:
        g.close()


def is_contiguous(t: torch.Tensor) -> bool:
    """Whether a value's memory layout is the default one (layout matters only where a value
    crosses into or out of Kiln: ExecuTorch derives a tensor's dim order from its strides)."""
    try:
        return bool(t.is_contiguous())
    except Exception:  # noqa: BLE001 - symbolic strides may not evaluate
        return True


def _check_value(g: _graph.Graph, v: int, t: torch.Tensor, ranges: Ranges, name: str, i: int):
    dt, lo, hi = g.value_info(v)
    want = _graph.TORCH_TO_KILN.get(t.dtype)
    if dt != want:
        raise Unsupported(f"{name}: Kiln infers dtype {dt} for output {i}, PyTorch {t.dtype}")
    if len(lo) != t.dim():
        raise Unsupported(f"{name}: Kiln infers rank {len(lo)} for output {i}, PyTorch {t.dim()}")
    for d, s in enumerate(t.shape):
        e = sym_expr(s)
        if e.is_number and lo[d] == hi[d] and lo[d] != int(e):
            raise Unsupported(
                f"{name}: Kiln infers size {lo[d]} for output {i} dimension {d}, PyTorch {int(e)}"
            )
