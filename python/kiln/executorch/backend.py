"""KilnBackend: ExecuTorch's ahead-of-time side of the delegate. ``preprocess`` turns one edge
partition into a Kiln engine through the C graph/builder API.

Contract with the C++ delegate (adapter/executorch/kiln_executorch.cpp):

- processed bytes = one Kiln engine;
- the engine's input bindings are the partition's user-input placeholders in graph order,
  which is the order ExecuTorch passes the delegate's input arguments (the emitter builds the
  ``executorch_call_delegate`` arguments from the lowered module's placeholders);
- its output bindings are the lowered module's user outputs in order (ExecuTorch passes the
  delegate only those);
- a mutated buffer the partition owns (KilnPartitioner tags it into the partition with every
  node reading it and its update) is a Kiln state: its initial value is the buffer's data, its
  BUFFER_MUTATION output becomes the state's update, and each context (each loaded program)
  keeps its own copy from one execute to the next; ExecuTorch never sees it;
- external weights are named data under the keys kiln_built_weight returns, in the .pte or in
  ``<external_data>.ptd``; the delegate reads them through the NamedDataMap at init.
"""

from __future__ import annotations

import logging
import time
from typing import final

import torch
from executorch.exir._serialize._named_data_store import NamedDataStore
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from .. import _graph
from . import _lowering as low
from . import _report
from ._options import TUNING_IMAGES, parse_compile_specs, tuning_key_of, write_only_of

log = logging.getLogger("kiln.executorch")

# Constants smaller than this stay inside the engine instead of becoming named data: 1 KiB when
# weights live in the .pte (tiny blobs are not worth a named entry), 64 bytes when the user asked
# for a .ptd (so that the weights really are in it).
MIN_EXTERNAL_NBYTES = 1024
MIN_EXTERNAL_NBYTES_PTD = 64
# Alignment requested for each weight blob in the .pte / .ptd.
WEIGHT_ALIGNMENT = 64
# The named data entry of a program whose delegates have states (preprocess).
PROGRAM_STATES_KEY = "kiln-program-states"


class KilnPreprocessError(RuntimeError):
    """A partition the KilnPartitioner claimed could not be built (a Kiln bug: please report)."""


def build_engine(
    edge_program: ExportedProgram,
    precision: str = "fp32",
    min_external_nbytes: int = MIN_EXTERNAL_NBYTES,
    reporter=None,
    write_only: frozenset[str] = frozenset(),
):
    """Describes an edge (sub)program as a Kiln graph and builds it.

    ``reporter`` (an export's ``_report.ExportProgress``) is told about each node lowered and
    each step of the build. ``write_only``: buffers no method of the program reads (export's
    analysis): their updates are dropped, and the builder removes what only served them (the
    nodes computing the new value, and the state when nothing reads it: every method's engine
    drops it alike, so the states they share still match). Returns (Built, input placeholder
    names, output count).
    """
    gm = edge_program.graph_module
    if reporter is not None:
        reporter.engine_start(sum(1 for n in gm.graph.nodes if n.op == "call_function"))
    t0 = time.perf_counter()
    sig = edge_program.graph_signature
    spec_by_name = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
    # Buffers the program mutates that this partition owns (KilnPartitioner gives a mutated
    # buffer to the delegate only with every reader and its update): Kiln states.
    mutated = set(sig.buffers_to_mutate.values())
    ranges = low.Ranges(edge_program.range_constraints)
    g = _graph.Graph()
    try:
        L = low.Lowerer(g, ranges, check=False)
        inputs = []
        states: dict[str, int] = {}  # buffer target -> Kiln state value
        for node in gm.graph.nodes:
            if node.op != "placeholder":
                continue
            spec = spec_by_name.get(node.name)
            if spec is not None and spec.kind == InputKind.BUFFER and spec.target in mutated:
                data = _constant_data(edge_program, spec)
                states[spec.target] = _try(
                    lambda n=node, d=data: L.add_state(n, d), f"state '{node.name}'"
                )
            elif spec is None or spec.kind == InputKind.USER_INPUT:
                val = node.meta.get("val")
                if not isinstance(val, torch.Tensor):
                    raise KilnPreprocessError(
                        f"KilnBackend: delegate input '{node.name}' is {type(val).__name__}, not "
                        "a tensor (a symbolic size crossed the partition boundary)"
                    )
                _try(lambda n=node: L.add_input(n), f"input '{node.name}'")
                inputs.append(node.name)
            else:
                data = _constant_data(edge_program, spec)
                _try(lambda n=node, d=data: L.add_constant(n, d), f"constant '{node.name}'")
        out_node = None
        for node in gm.graph.nodes:
            if node.op == "call_function":
                _try(lambda n=node: L.lower(n), f"node '{node.name}' ({low.target_name(node)})")
                if reporter is not None:
                    reporter.node_lowered(node.name)
            elif node.op == "output":
                out_node = node
        results = list(out_node.args[0]) if out_node is not None else []
        out_specs = list(sig.output_specs)
        if len(out_specs) != len(results):
            raise KilnPreprocessError(
                f"KilnBackend: the partition has {len(results)} outputs but its signature "
                f"{len(out_specs)}"
            )
        outs = []
        for spec, o in zip(out_specs, results, strict=True):
            if spec.kind == OutputKind.USER_OUTPUT:
                outs.append(o)
            elif spec.kind == OutputKind.BUFFER_MUTATION and spec.target in write_only:
                pass  # a write-only buffer's update: dead
            elif spec.kind == OutputKind.BUFFER_MUTATION and spec.target in states:
                _update_state(g, L, states[spec.target], spec.target, o)
            else:
                raise KilnPreprocessError(
                    f"KilnBackend: partition output '{spec.arg.name}' is a {spec.kind.name}"
                    + (f" of '{spec.target}'" if spec.target else "")
                    + "; Kiln delegates produce user outputs and update the buffers they own"
                )
        input_values = {L.env[n][0] for n in gm.graph.nodes if n.op == "placeholder" and n in L.env}
        marked: set[int] = set()
        for i, o in enumerate(outs):
            v = L.env.get(o, [None])[0] if o is not None else None
            if v is None:
                raise KilnPreprocessError(f"KilnBackend: output {i} ('{o}') has no Kiln value")
            if v in marked or v in input_values or v in L.constant_values:
                # An output that is an input, a constant or another output: give it its own copy.
                v = _try(lambda v=v: L.op("copy", [v]), f"output {i}")
            marked.add(v)
            _try(lambda v=v, i=i: g.mark_output(v, f"output{i}"), f"output {i}")
        t1 = time.perf_counter()
        if reporter is not None:
            reporter.build_started()
        built = _try(
            lambda: g.build(
                precision=precision,
                external_weights=True,
                min_external_nbytes=min_external_nbytes,
                progress=reporter.build_step if reporter is not None else None,
            ),
            "kiln_build",
        )
        if reporter is not None:
            reporter.engine_done(
                len(built.engine), built.weights, t1 - t0, time.perf_counter() - t1
            )
        return built, inputs, len(outs)
    finally:
        g.close()


def _update_state(g: _graph.Graph, L: low.Lowerer, state: int, target: str, node) -> None:
    """The state of buffer ``target`` takes the value of ``node`` at the end of each execute."""
    v = L.env.get(node, [None])[0] if node is not None else None
    if v is None:
        raise KilnPreprocessError(
            f"KilnBackend: the update of buffer '{target}' ('{node}') has no Kiln value"
        )
    if v == state:
        return  # written back unchanged
    _try(
        lambda: L._call(lambda: g.update_state(state, v, f"update of buffer '{target}'")),
        f"buffer '{target}'",
    )


def _try(fn, what: str):
    try:
        return fn()
    except low.Unsupported as e:
        raise KilnPreprocessError(
            f"KilnBackend: cannot build {what}: {e}. This node was claimed by KilnPartitioner "
            "but does not build: please report it; meanwhile export without Kiln for this model"
        ) from None


def _constant_data(ep: ExportedProgram, spec) -> torch.Tensor:
    target = spec.target
    for source in (ep.state_dict, ep.constants):
        if target in source:
            t = source[target]
            if isinstance(t, torch.nn.Parameter):
                t = t.data
            if not isinstance(t, torch.Tensor):
                break
            return t.detach()
    raise KilnPreprocessError(
        f"KilnBackend: constant '{spec.arg.name}' ({target}) has no data in the program"
    )


@final
class KilnBackend(BackendDetails):
    """The ``KilnBackend`` delegate's preprocess: edge partition -> Kiln engine bytes."""

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs) -> PreprocessResult:
        precision, external_data = parse_compile_specs(compile_specs)
        built, _inputs, _n_out = build_engine(
            edge_program,
            precision,
            MIN_EXTERNAL_NBYTES_PTD if external_data else MIN_EXTERNAL_NBYTES,
            reporter=_report.current(),
            write_only=write_only_of(compile_specs),
        )
        store = NamedDataStore()
        for key, data in built.weights:
            store.add_named_data(key, data, alignment=WEIGHT_ALIGNMENT, external_tag=external_data)
        tuning = tuning_key_of(compile_specs)
        if tuning is not None:  # the records travel with the weights (one copy per program)
            if tuning not in TUNING_IMAGES:
                raise ValueError(
                    f"KilnBackend: compile spec kiln.tuning names {tuning!r}, which this process "
                    "did not read; pass tuning_records= to KilnPartitioner, export or save"
                )
            store.add_named_data(
                tuning, TUNING_IMAGES[tuning], alignment=16, external_tag=external_data
            )
        # A delegate with states shares them with the program's other methods at run time, keyed
        # by the named data map ExecuTorch gives it (one per loaded program: two loads keep two
        # sets of states); ExecuTorch gives no map to a program without named data, so one with
        # states always has an entry (the same for every delegate, stored once, beside the
        # weights: in the .ptd when there is one, so that the methods see the one map).
        has_states = bool(edge_program.graph_signature.buffers_to_mutate)
        if has_states:
            store.add_named_data(
                PROGRAM_STATES_KEY, b"kiln", alignment=1, external_tag=external_data
            )
        log.debug(
            "KilnBackend: engine of %d bytes, %d external weights (%s)",
            len(built.engine),
            len(built.weights),
            f"{external_data}.ptd" if external_data else ".pte",
        )
        return PreprocessResult(
            processed_bytes=built.engine,
            data_store_output=store.get_named_data_store_output()
            if built.weights or tuning is not None or has_states
            else None,
        )
