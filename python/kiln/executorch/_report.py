"""Progress and the export report of :func:`kiln.executorch.export` / :func:`save`.

While a program exports, an :class:`ExportProgress` is the current reporter (a context
variable): ``KilnBackend.preprocess`` tells it about each engine it lowers and builds, and the
C builder's progress callback (``kiln_build_options.progress``) reaches it through
``Graph.build(progress=...)``. It draws one tqdm bar on the terminal (stderr) when asked to
and collects what the report prints at the end: the delegates of each method in order, the ops
left to ExecuTorch (with the partitioner's reasons where it records them), each engine's size
and the time of each phase.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import sys
import time
from collections import Counter

_current: contextvars.ContextVar[ExportProgress | None] = contextvars.ContextVar(
    "kiln_export_progress", default=None
)

# Edge-dialect nodes that are memory bookkeeping, not computation: never "left to ExecuTorch".
_BOOKKEEPING = ("getitem", "alloc", "sym_size", "_local_scalar_dense", "executorch_call_delegate")


def current() -> ExportProgress | None:
    """The reporter of the export running in this context, or None."""
    return _current.get()


def _tqdm_bar(stream):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is optional: no bar without it
        return None
    return tqdm(
        total=1,
        file=stream,
        leave=False,
        mininterval=0.1,
        dynamic_ncols=True,
        bar_format="{desc} {bar} {n_fmt}/{total_fmt} {postfix}",
    )


@dataclasses.dataclass
class EngineReport:
    """One Kiln engine built during the export."""

    index: int
    n_nodes: int  # edge nodes of the partition
    n_layers: int = 0  # plan layers laid out by the builder (heads of fused groups)
    engine_nbytes: int = 0
    n_external_weights: int = 0
    external_nbytes: int = 0  # weight bytes stored as named data (.pte or .ptd)
    lower_s: float = 0.0  # translating the partition through the graph API
    build_s: float = 0.0  # kiln_build


@dataclasses.dataclass
class ExportReport:
    """What an export did. ``str(report)`` is the text the export prints at the end."""

    methods: dict = dataclasses.field(default_factory=dict)  # name -> {"delegates", "outside"}
    engines: list = dataclasses.field(default_factory=list)  # EngineReport, in build order
    rejected: list = dataclasses.field(default_factory=list)  # {"op", "reason", "source"}
    phases: dict = dataclasses.field(default_factory=dict)  # phase -> seconds
    files: dict = dataclasses.field(default_factory=dict)  # path -> bytes written
    # method -> Kiln delegate inputs read in the producing delegate's memory (docs/runtime.md,
    # "Between delegates"); methods without such an edge are absent
    links: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "methods": self.methods,
            "engines": [dataclasses.asdict(e) for e in self.engines],
            "rejected": self.rejected,
            "phases_s": self.phases,
            "files": self.files,
            "links": self.links,
        }

    def __str__(self) -> str:
        lines = ["Kiln export report"]
        for name, m in self.methods.items():
            dels = m["delegates"]
            kiln = sum(1 for d in dels if d["backend"] == "KilnBackend")
            lines.append(
                f"  method {name}: {len(dels)} delegate call(s) ({kiln} Kiln), "
                f"{m['n_outside']} op(s) left to ExecuTorch"
            )
            if self.links.get(name):
                lines.append(
                    f"    {self.links[name]} tensor(s) passed between Kiln delegates in the "
                    "engines' memory (no copy through host memory)"
                )
            for i, d in enumerate(dels):
                extra = f", {d['n_nodes']} nodes" if d.get("n_nodes") is not None else ""
                lines.append(f"    delegate {i}: {d['backend']}{extra}")
            if m["outside"]:
                ops = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in m["outside"].items())
                lines.append(f"    outside: {ops}")
        if self.rejected:
            lines.append(f"  left to ExecuTorch by KilnPartitioner ({len(self.rejected)}):")
            for r in self.rejected:
                src = f" at {r['source']}" if r.get("source") else ""
                lines.append(f"    {r['op']}{src}: {r['reason']}")
        for e in self.engines:
            ext = (
                f", {e.n_external_weights} weights ({_size(e.external_nbytes)}) as named data"
                if e.n_external_weights
                else ""
            )
            lines.append(
                f"  engine {e.index}: {e.n_nodes} nodes -> {e.n_layers} layers, "
                f"{_size(e.engine_nbytes)}{ext}; lowered in {e.lower_s:.2f} s, built in "
                f"{e.build_s:.2f} s"
            )
        if self.phases:
            lines.append("  time: " + ", ".join(f"{k} {v:.2f} s" for k, v in self.phases.items()))
        for path, n in self.files.items():
            lines.append(f"  wrote {path} ({_size(n)})")
        return "\n".join(lines)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


class ExportProgress:
    """Times the phases of an export, draws the bar (``show_bar``) and fills an ExportReport."""

    def __init__(self, show_bar: bool, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.report = ExportReport()
        self._bar = _tqdm_bar(self.stream) if show_bar else None
        self._engine: EngineReport | None = None
        self._token = None

    # --- lifetime

    def __enter__(self):
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc):
        _current.reset(self._token)
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        return False

    @contextlib.contextmanager
    def phase(self, name: str):
        """Times one phase of the export (phases of the same name add up)."""
        self._stage(name, 1)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self.report.phases[name] = self.report.phases.get(name, 0.0) + dt
            self._step(1)

    # --- engines (called by KilnBackend.preprocess)

    def engine_start(self, n_nodes: int) -> None:
        self._engine = EngineReport(index=len(self.report.engines), n_nodes=n_nodes)
        self._stage(f"Kiln engine {self._engine.index}: lowering", max(1, n_nodes))

    def node_lowered(self, name: str) -> None:
        self._step(1, name)

    def build_started(self) -> None:
        if self._engine is not None:
            self._stage(f"Kiln engine {self._engine.index}: kiln_build", 1)

    def build_step(self, phase: str, name: str, step: int, n_steps: int) -> None:
        """The C builder's progress callback (Graph.build(progress=...))."""
        e = self._engine
        if e is not None and phase == "layer":
            e.n_layers = max(e.n_layers, n_steps)
        if self._bar is None:
            return
        label = f"Kiln engine {e.index if e else '?'}: {phase}"
        if self._bar.desc != label:
            self._stage(label, max(1, n_steps))
        self._bar.n = step
        self._bar.set_postfix_str(name, refresh=False)
        self._bar.update(0)

    def engine_done(self, engine_nbytes: int, weights, lower_s: float, build_s: float) -> None:
        e = self._engine
        if e is None:
            return
        e.engine_nbytes = engine_nbytes
        e.n_external_weights = len(weights)
        e.external_nbytes = sum(len(d) for _, d in weights)
        e.lower_s, e.build_s = lower_s, build_s
        self.report.engines.append(e)
        self._engine = None

    # --- the bar

    def _stage(self, desc: str, total: int) -> None:
        if self._bar is None:
            return
        self._bar.reset(total=total)
        self._bar.set_description_str(desc, refresh=False)
        self._bar.set_postfix_str("", refresh=False)
        self._bar.refresh()

    def _step(self, n: int, postfix: str | None = None) -> None:
        if self._bar is None:
            return
        if postfix is not None:
            self._bar.set_postfix_str(postfix, refresh=False)
        self._bar.update(n)


def _source_of(node) -> str | None:
    """The user's file:line of an fx node, from the last frame of its stack trace."""
    trace = node.meta.get("stack_trace") if hasattr(node, "meta") else None
    if not trace:
        return None
    last = None
    for line in trace.splitlines():
        line = line.strip()
        if line.startswith('File "'):
            last = line
    if last is None:
        return None
    try:
        path = last.split('"')[1]
        lineno = last.split(", line ")[1].split(",")[0]
    except IndexError:
        return None
    return f"{path}:{lineno}"


def describe_methods(edge) -> tuple[dict, list]:
    """Per method of a lowered edge program (EdgeProgramManager): its delegate calls in order
    and the compute ops left outside, and those ops as "rejected" entries ({"op", "reason",
    "source"}) for when the partitioner records none itself."""
    from executorch.exir.lowered_backend_module import executorch_call_delegate

    methods, outside_nodes = {}, []
    for name in edge.methods:
        gm = edge.exported_program(name).graph_module
        delegates, outside = [], Counter()
        for n in gm.graph.nodes:
            if n.op != "call_function":
                continue
            if n.target is executorch_call_delegate:
                lowered = getattr(gm, n.args[0].target)
                inner = getattr(lowered, "original_module", None)
                n_nodes = None
                if inner is not None:
                    n_nodes = sum(1 for x in inner.graph.nodes if x.op == "call_function")
                delegates.append({"backend": lowered.backend_id, "n_nodes": n_nodes})
                continue
            op = _op_name(n)
            if any(b in op for b in _BOOKKEEPING):
                continue
            outside[op] += 1
            outside_nodes.append((name, n, op))
        methods[name] = {
            "delegates": delegates,
            "outside": dict(outside),
            "n_outside": sum(outside.values()),
        }
    rejected = [
        {
            "op": op,
            "reason": "not taken by KilnPartitioner (logging.getLogger('kiln.executorch') at "
            "DEBUG says why)",
            "source": _source_of(n),
            "method": method,
        }
        for method, n, op in outside_nodes
    ]
    return methods, rejected


def _op_name(n) -> str:
    t = n.target
    name = getattr(t, "__name__", None)
    op = getattr(t, "_op", None) or t
    schema = getattr(op, "_schema", None)
    if schema is not None:  # "aten.cumsum.default", as the edge program prints it
        return f"{schema.name.replace('::', '.')}.{schema.overload_name or 'default'}"
    return str(name or t)
