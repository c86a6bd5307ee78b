"""KilnPartitioner: tags the nodes of an edge program that Kiln supports."""

from __future__ import annotations

import functools
import logging
import operator
import warnings
from collections.abc import Callable

import torch
from executorch.exir.backend import utils as _backend_utils
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx import Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from . import _lowering as low
from ._options import (
    compile_specs_for,
    read_tuning_records,
    validate_executorch_ops,
    validate_external_data,
    validate_precision,
)

log = logging.getLogger("kiln.executorch")

BACKEND_ID = "KilnBackend"
# Re-partitioning rounds after a partition turned out invalid (SymInts crossing its boundary).
_MAX_ROUNDS = 8
# Kiln ops that only move data: a partition made of nothing else is left to ExecuTorch (a
# delegate call costs more than the copy it would save).
_DATA_MOVEMENT = {"reshape", "permute", "expand", "squeeze", "unsqueeze", "copy", "slice", "select"}


class _Support(OperatorSupportBase):
    def __init__(self, supported: set[Node]):
        super().__init__()
        self.supported = supported

    def is_node_supported(self, submodules, node: Node) -> bool:
        return node in self.supported


def release_graph_cache() -> None:
    """Drops what two process-wide memos keep of programs already lowered. ExecuTorch's check
    that a partitioner left the graph alone (``exir.backend.utils.is_same_node``, an
    ``lru_cache`` without a size limit) holds every fx node it compared, and torch's fake-tensor
    dispatch cache (``FakeTensorMode.cache``) holds the arguments of the ops it cached, among them
    the lowered delegate modules with their named data: each export's weight bytes stayed
    referenced for the life of the process (measured: about 530 MB more per export of a
    one-layer Llama, with or without keeping the program). Both are caches; clearing them loses
    only their speed-up."""
    clear = getattr(getattr(_backend_utils, "is_same_node", None), "cache_clear", None)
    if clear is not None:
        clear()
    FakeTensorMode.cache_clear()


def _ranges(ep: ExportedProgram) -> low.Ranges:
    return low.Ranges(getattr(ep, "range_constraints", None))


def constant_tensors(ep: ExportedProgram) -> dict[Node, torch.Tensor | None]:
    """The data of the program's constant placeholders (parameters, buffers, lifted
    constants), for handlers that read constant arguments; None where the program holds no
    data (ExecuTorch hands partitioners fake parameters and buffers)."""
    sig = ep.graph_signature
    targets = {
        **sig.inputs_to_parameters,
        **sig.inputs_to_buffers,
        **sig.inputs_to_lifted_tensor_constants,
    }
    # A buffer the program mutates is not a constant: its value changes from one run to the
    # next (nothing may be folded from it).
    mutated = set(sig.buffers_to_mutate.values())
    out = {}
    for n in ep.graph.nodes:
        target = targets.get(n.name) if n.op == "placeholder" else None
        if target is None or (n.name in sig.inputs_to_buffers and target in mutated):
            continue
        out[n] = None
        for source in (ep.state_dict, ep.constants):
            t = source.get(target)
            if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor):
                out[n] = t.detach()
                break
    return out


def tag_dead_constants(ep: ExportedProgram, tag: str) -> None:
    """Gives a Kiln partition the constant inputs no node reads (parameters, lifted constants,
    buffers the program does not update), so that lowering moves them out of the program left
    to ExecuTorch. Edge passes leave such inputs behind (a cache's lazily created empty tensor
    concatenated with the first keys: the concatenation drops it); once Kiln takes every weight
    they can be the only constants left, and ExecuTorch writes a program its runtime refuses to
    load (one whose constants are all empty). A partitioner may not change the graph: tagging is
    what it can do."""
    sig = ep.graph_signature
    updated = {s.target for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION}
    constant = {
        s.arg.name
        for s in sig.input_specs
        if s.kind in (InputKind.PARAMETER, InputKind.CONSTANT_TENSOR, InputKind.BUFFER)
        and s.target not in updated
    }
    for n in ep.graph.nodes:
        if n.op == "placeholder" and n.name in constant and not n.users:
            n.meta.setdefault("delegation_tag", tag)


_EXCLUDED = "named in the executorch_ops option: left to ExecuTorch as asked"


def excluded_op(n: Node, executorch_ops: frozenset[str]) -> bool:
    """Whether node n's op is one the user named in ``executorch_ops`` (its overload, or its
    packet: "aten.softmax.default" or "aten.softmax")."""
    if not executorch_ops:
        return False
    name = low.target_name(n)
    return name in executorch_ops or name.rsplit(".", 1)[0] in executorch_ops


def analyze(
    gm: torch.fx.GraphModule,
    ranges: low.Ranges,
    constants: dict[Node, torch.Tensor | None] | None = None,
    executorch_ops: frozenset[str] = frozenset(),
) -> tuple[set[Node], dict[Node, low.Check]]:
    """The set of call_function nodes Kiln can take, and the per-node check results.

    Tensor nodes are checked one by one against libkiln. A getitem is supported when its source
    produces that output; a multi-output node only when every output used is produced. Symbolic
    scalar nodes (sym_size, SymInt arithmetic) produce no Kiln value: they are taken only when
    every user is, so no SymInt ever crosses a partition boundary. Virtual nodes (taken without
    a Kiln value, see :attr:`low.Check.virtual`) follow the same rule, and a node that reads a
    virtual node is taken only with it.
    """
    checks: dict[Node, low.Check] = {}
    supported: set[Node] = set()
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    foldable = low.foldable_nodes(gm.graph, constants or {})
    for n in nodes:
        if n.target is operator.getitem or low.is_sym_node(n):
            continue
        if excluded_op(n, executorch_ops):
            c = low.Check(False, _EXCLUDED)
        else:
            c = low.check_node(n, ranges, constants, foldable)
        checks[n] = c
        if c.ok:
            supported.add(n)
        else:
            log.debug("Kiln does not take %s: %s", n.name, c.reason)
    for n in nodes:
        if n.target is operator.getitem:
            src, idx = n.args
            c = checks.get(src)
            if (
                c is not None
                and c.ok
                and isinstance(idx, int)
                and idx < len(c.outputs)
                and c.outputs[idx]
            ):
                supported.add(n)
    # Multi-output nodes: every user must be a supported getitem.
    for n, c in checks.items():
        if c.ok and len(c.outputs) > 1 and not all(u in supported for u in n.users):
            supported.discard(n)
            for u in n.users:
                supported.discard(u)
    _settle_symbolic(nodes, supported, _virtual(checks))
    return supported, checks


def _virtual(checks: dict[Node, low.Check]) -> set[Node]:
    return {n for n, c in checks.items() if c.virtual}


def _settle_symbolic(nodes: list[Node], supported: set[Node], virtual: set[Node]) -> None:
    """Adds symbolic scalar nodes whose users are all supported, and drops tensor nodes that need
    a symbolic argument Kiln cannot take; drops virtual nodes with an unsupported user and nodes
    reading an unsupported virtual node; repeats to a fixed point."""
    sym = [n for n in nodes if low.is_sym_node(n)]
    changed = True
    while changed:
        changed = False
        for n in virtual:
            if n in supported and not (n.users and all(u in supported for u in n.users)):
                supported.discard(n)
                changed = True
        for n in nodes:
            if n in supported and any(
                a in virtual and a not in supported for a in n.all_input_nodes
            ):
                supported.discard(n)
                changed = True
        for n in reversed(sym):
            ok = bool(n.users) and all(u in supported for u in n.users)
            ok = ok and all(low.is_sym_node(a) or low.is_tensor_node(a) for a in n.all_input_nodes)
            if ok and n not in supported:
                supported.add(n)
                changed = True
            elif not ok and n in supported:
                supported.discard(n)
                changed = True
        for n in nodes:
            if n in supported and not low.is_sym_node(n):
                for a in n.all_input_nodes:
                    if isinstance(a.meta.get("val"), low._SYM_TYPES) and a not in supported:
                        if a.op == "call_function":
                            supported.discard(n)
                            changed = True
                            break


def _partition_problems(
    partition_nodes: set[Node],
    virtual: set[Node],
    folded: set[Node] = frozenset(),
    constants: dict[Node, object] | None = None,
) -> set[Node]:
    """Nodes that make a partition invalid: a symbolic scalar or a virtual node entering or
    leaving it, a tensor with a non-default memory layout (e.g. channels-last) entering or
    leaving it, or a folded node whose constants would not all be in it (a constant is moved
    into a partition only when every user of it is there)."""
    constants = constants or {}
    bad = set()

    def layout_matters(a: Node) -> bool:
        # Constants are copied into the engine (made contiguous on the way): their layout is free.
        return not (a.op == "placeholder" and a in constants)

    for n in partition_nodes & folded:
        for a in n.all_input_nodes:
            if a.op == "call_function" and a not in partition_nodes:
                bad.add(n)
            if a.op == "placeholder" and any(u not in partition_nodes for u in a.users):
                bad.add(n)
    for n in partition_nodes:
        for a in n.all_input_nodes:
            if a in partition_nodes:
                continue
            if a in virtual or not low.is_tensor_node(a):
                bad.add(n)
            elif not low.is_contiguous(a.meta["val"]) and layout_matters(a):
                bad.add(n)
        if any(u not in partition_nodes for u in n.users):
            if n in virtual or not low.is_tensor_node(n) or not low.is_contiguous(n.meta["val"]):
                if n.target is operator.getitem:
                    bad.add(n.args[0])
                bad.add(n)
    return bad


def tag_owned_buffers(ep: ExportedProgram, kiln_tags) -> list[dict]:
    """Gives each mutated buffer (a KV cache) to the Kiln partition that reads and updates it:
    tags its placeholder with the partition's tag when every node reading the buffer and the
    node computing its new value are in that partition, and the new value has no other use
    outside it. KilnBackend then makes the buffer a Kiln state updated inside the engine.

    A mutated buffer that fails these conditions stays with ExecuTorch, as for any delegate:
    the partitions read it as an input and ExecuTorch writes the new value back. Returns one
    record {"buffer", "reason"} per mutated buffer left to ExecuTorch whose old or new value a
    Kiln partition reads or computes.
    """
    sig = ep.graph_signature
    out_node = next((n for n in ep.graph.nodes if n.op == "output"), None)
    results = list(out_node.args[0]) if out_node is not None else []
    new_value: dict[str, Node] = {}
    uses: dict[Node, int] = {}
    for spec, r in zip(sig.output_specs, results, strict=False):
        if isinstance(r, Node):
            uses[r] = uses.get(r, 0) + 1
            if spec.kind == OutputKind.BUFFER_MUTATION and spec.target is not None:
                new_value[spec.target] = r
    left = []
    for n in ep.graph.nodes:
        if n.op != "placeholder":
            continue
        target = sig.inputs_to_buffers.get(n.name)
        m = new_value.get(target) if target is not None else None
        if m is None:
            continue
        tag = m.meta.get("delegation_tag") if m.op == "call_function" else None
        readers = {u.meta.get("delegation_tag") for u in n.users}
        if tag is None:
            new_readers = {u.meta.get("delegation_tag") for u in m.users}
            if (readers | new_readers) & set(kiln_tags):
                left.append({"buffer": target, "reason": _UPDATE_OUTSIDE})
            continue
        if tag not in kiln_tags:
            continue
        why = None
        if readers - {tag}:
            why = "a node outside the Kiln partition reads it"
        elif uses.get(m, 0) != 1:
            why = "its new value is also an output of the program"
        elif any(u is not out_node and u.meta.get("delegation_tag") != tag for u in m.users):
            why = "a node outside the Kiln partition reads its new value"
        if why is None:
            n.meta["delegation_tag"] = tag
        else:
            log.debug("Kiln leaves buffer %s to ExecuTorch: %s", target, why)
            left.append({"buffer": target, "reason": why})
    return left


_UPDATE_OUTSIDE = "Kiln does not compute its update (the node writing it is left to ExecuTorch)"


def _has_compute(partition_nodes: set[Node], checks: dict[Node, low.Check]) -> bool:
    for n in partition_nodes:
        c = checks.get(n)
        if c is not None and any(k not in _DATA_MOVEMENT for k in c.kiln_ops):
            return True
    return False


def propose(
    ep: ExportedProgram,
    dropped: dict[Node, str] | None = None,
    executorch_ops: frozenset[str] = frozenset(),
) -> list[set[Node]]:
    """Convex partitions of the nodes Kiln takes (each a set of fx nodes). ``dropped``, when
    given, receives the nodes Kiln could compute but left out of every partition, with why;
    ``executorch_ops``: op names Kiln leaves out (the export option)."""
    gm = ep.graph_module
    ranges = _ranges(ep)
    constants = constant_tensors(ep)
    supported, checks = analyze(gm, ranges, constants, executorch_ops)
    _refuse_strided_boundaries(ep, supported)
    virtual = _virtual(checks)
    folded = {n for n, c in checks.items() if c.folded}
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    dropped = {} if dropped is None else dropped
    for _ in range(_MAX_ROUNDS):
        parts = CapabilityBasedPartitioner(
            gm, _Support(supported), allows_single_node_partition=True
        ).propose_partitions()
        result, changed = [], False
        for p in parts:
            pn = set(p.nodes)
            bad = _partition_problems(pn, virtual, folded, constants)
            if bad:
                log.debug(
                    "Kiln drops %s: a symbolic or non-contiguous value crosses the partition",
                    sorted(b.name for b in bad),
                )
                for b in bad:
                    dropped.setdefault(b, _CROSSING)
                supported -= bad
                changed = True
            elif not _has_compute(pn, checks):
                for b in pn:
                    dropped.setdefault(b, _NO_COMPUTE)
                supported -= pn
                changed = True
            else:
                result.append(pn)
        if not changed:
            return result
        _settle_symbolic(nodes, supported, virtual)
    return result


def _dim_order(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(sorted(range(t.dim()), key=lambda d: -t.stride()[d]))


def _refuse_strided_boundaries(ep: ExportedProgram, supported: set[Node]) -> None:
    """Raises for a method input or output with a non-default memory layout (channels-last) at
    a node Kiln takes: Kiln engines exchange contiguous tensors, and such a boundary would leave
    the model to ExecuTorch's kernels, which refuse channels-last tensors in several ops (batch
    norm among them): the program would export but not run."""
    sig = ep.graph_signature
    user_inputs = set(getattr(sig, "user_inputs", ()))
    for n in ep.graph.nodes:
        if n.op == "placeholder" and n.name in user_inputs and low.is_tensor_node(n):
            t = n.meta["val"]
            if not low.is_contiguous(t) and any(u in supported for u in n.users):
                raise ValueError(
                    f"KilnPartitioner: input '{n.name}' has a non-contiguous memory layout "
                    f"(dim order {_dim_order(t)}, e.g. channels-last); Kiln engines take "
                    "contiguous tensors. Export with a contiguous example input "
                    "(x.contiguous()); a model converted with .to(memory_format="
                    "torch.channels_last) may keep its weights in that layout"
                )
        if n.op == "output":
            for o in n.args[0] if isinstance(n.args[0], (list, tuple)) else [n.args[0]]:
                if isinstance(o, Node) and o in supported and low.is_tensor_node(o):
                    if not low.is_contiguous(o.meta["val"]):
                        raise ValueError(
                            f"KilnPartitioner: output '{o.name}' has a non-contiguous memory "
                            f"layout (dim order {_dim_order(o.meta['val'])}); Kiln engines "
                            "produce contiguous tensors. Return out.contiguous() from forward"
                        )


_CROSSING = (
    "a symbolic size or a non-contiguous (e.g. channels-last) tensor would cross the boundary "
    "of the Kiln partition"
)
_NO_COMPUTE = "only data movement around it: a delegate call would cost more than the copy"


def source_of(node: Node) -> str | None:
    """'/path/to/file.py:123' of the innermost frame of the node's stack trace (where the op
    was called in the model's code), or None when the export recorded none."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    found = None
    for line in str(trace).splitlines():
        line = line.strip()
        if line.startswith('File "') and ", line " in line:
            path = line[len('File "') : line.index('", line ')]
            rest = line[line.index('", line ') + len('", line ') :]
            num = rest.split(",")[0].strip()
            if num.isdigit():
                found = f"{path}:{num}"
    return found


def _op_name(node: Node) -> str:
    """The edge op as the program prints it: "aten.flip.default"."""
    return low.target_name(node)


def rejections(
    ep: ExportedProgram, claimed: set[Node], checks: dict[Node, str], dropped: dict[Node, str]
) -> list[dict]:
    """One record {"op", "reason", "source"} per compute node of the program left to
    ExecuTorch, in graph order."""
    out = []
    for n in ep.graph.nodes:
        if n.op != "call_function" or n in claimed:
            continue
        if n.target is operator.getitem or low.is_sym_node(n):
            continue
        reason = dropped.get(n) or checks.get(n)
        if reason is None:
            reason = "a node it reads or feeds is left out, and it cannot be separated from it"
        out.append({"op": _op_name(n), "reason": reason, "source": source_of(n)})
    return out


@functools.cache
def executorch_kernels() -> frozenset[str] | None:
    """The operator kernels of the installed ExecuTorch runtime, or None if it cannot tell."""
    try:
        from executorch.extension.pybindings import portable_lib

        return frozenset(portable_lib._get_operator_names())
    except Exception:  # noqa: BLE001 - no runtime installed, or an older API
        return None


# The ExecuTorch kernel an unclaimed embedding bag node would need.
_BAG_KERNEL = "aten::_embedding_bag.out"


def _executorch_runs_bags() -> bool:
    kernels = executorch_kernels()
    return kernels is not None and _BAG_KERNEL in kernels


def _refuse_unrunnable_bags(ep: ExportedProgram, claimed: set[Node]) -> None:
    """Raises for an embedding bag Kiln does not take when ExecuTorch has no kernel for it
    either: the program would export but fail to load (OperatorMissing)."""
    bags = [
        n
        for n in ep.graph.nodes
        if n.op == "call_function"
        and n not in claimed
        and low.target_name(n) in low.EMBEDDING_BAG_OPS
    ]
    if not bags:
        return
    if _executorch_runs_bags():
        return
    n = bags[0]
    c = low.check_node(n, _ranges(ep), constant_tensors(ep))
    if c.ok:
        names = ("bags", "offset2bag", "bag_size", "max_indices")
        used = sorted(
            {
                names[u.args[1]]
                for u in n.users
                if u.target is operator.getitem and u.args[1] in (1, 2, 3) and u.users
            }
        )
        why = (
            f"its output(s) {', '.join(used)} are used; Kiln computes only the bags (output 0)"
            if used
            else "it could not be placed in a Kiln partition"
        )
    else:
        why = c.reason
    if low.RUNTIME_OFFSETS in why:
        offsets = low.bind_args(n).get("offsets")
        raise NotImplementedError(
            f"EmbeddingBag with runtime offsets ('{getattr(offsets, 'name', offsets)}' of "
            f"'{n.name}') is not supported by Kiln or the "
            f"ExecuTorch kernels (ExecuTorch has no {_BAG_KERNEL} kernel), so the program "
            "could not load. Give the bags as 2-D indices [num_bags, bag_size] without offsets "
            "(every bag the same size; pad shorter bags with padding_idx in mode 'sum' or "
            "'mean')."
        )
    raise NotImplementedError(
        f"EmbeddingBag node '{n.name}' cannot run: Kiln does not take it ({why}) and ExecuTorch "
        f"has no {_BAG_KERNEL} kernel. Kiln takes modes 'sum' and 'mean' (with padding_idx and, "
        "for 'sum', per_sample_weights) and 'max' (without padding_idx) on 2-D indices "
        "[num_bags, bag_size], using only the bags output."
    )


def _refuse_unrunnable_convolutions(
    ep: ExportedProgram, claimed: set[Node], reasons: dict[Node, low.Check]
) -> None:
    """Raises for a convolution Kiln does not take whose input ExecuTorch's kernel refuses (it
    runs 1-D and 2-D ones only: a 3-D one would export and fail at its first execute)."""
    for n in ep.graph.nodes:
        if (
            n.op != "call_function"
            or n in claimed
            or low.target_name(n) != "aten.convolution.default"
        ):
            continue
        v = n.args[0].meta.get("val") if isinstance(n.args[0], Node) else None
        if not isinstance(v, torch.Tensor) or v.dim() in (3, 4):
            continue
        c = reasons.get(n)
        why = (
            c.reason if c is not None and not c.ok else "it could not be placed in a Kiln partition"
        )
        src = source_of(n)
        raise NotImplementedError(
            f"the {v.dim() - 2}-D convolution '{n.name}'"
            + (f" ({src})" if src else "")
            + f" cannot run: Kiln does not take it ({why}) and ExecuTorch's convolution kernel "
            "takes 1-D and 2-D convolutions only. Kiln takes 3-D forward convolutions (any "
            "stride, padding, dilation and groups) of static channels and frames."
        )


class KilnPartitioner(Partitioner):
    """Claims the nodes of an edge program that Kiln supports for the ``KilnBackend`` delegate.

    Args:
        precision: "fp32" (default), "fp16" or "bf16": the dtype of Kiln's compute-heavy ops and
            activations (inputs and outputs keep their dtypes).
        external_data: None (weights in the .pte) or a file stem: the weights of every Kiln
            engine go to ``<external_data>.ptd`` beside the .pte.
        tuning_records: None, or a tuning cache file (``kiln tune PROGRAM.pte --cache FILE`` on
            the target GPU): its records are stored in the program (named data, beside the
            weights), and contexts on that GPU apply them instead of timing.
        write_only_buffers: names of buffers the program updates and none of its methods reads
            (``kiln.executorch.export`` finds them over every method): their updates are
            dropped with their states (transformers' StaticCache keeps such counters).
        executorch_ops: ATen op names Kiln leaves to ExecuTorch even where it could take them,
            each an overload ("aten.softmax.default") or a packet ("aten.softmax"); their nodes
            are listed in :attr:`rejected` with that reason. An op Kiln would keep whole
            (linear, sdpa, ...) is then not kept: it decomposes, and Kiln may take its parts.
    """

    def __init__(
        self,
        precision: str = "fp32",
        external_data: str | None = None,
        tuning_records=None,
        write_only_buffers=(),
        executorch_ops=None,
    ):
        super().__init__()
        # Every node of the partitioned programs left to ExecuTorch: dicts {"op": edge op
        # name, "reason": why Kiln did not take it, "source": "file.py:123" or None}.
        self.rejected: list[dict] = []
        # Mutated buffers (KV caches) a Kiln partition reads or updates but that stay with
        # ExecuTorch, which writes their new values back: dicts {"buffer": name, "reason"}.
        # Every other mutated buffer a Kiln partition uses is owned by the engine (a state).
        self.buffers_left: list[dict] = []
        self.precision = validate_precision(precision)
        self.external_data = validate_external_data(external_data)
        # a tuning cache file (`kiln tune`): its records go into the program (named data)
        self.tuning_key = read_tuning_records(tuning_records)
        self.write_only_buffers = tuple(sorted(str(n) for n in write_only_buffers))
        self.executorch_ops = validate_executorch_ops(executorch_ops)
        self.delegation_spec = DelegationSpec(
            BACKEND_ID,
            compile_specs_for(
                self.precision, self.external_data, self.tuning_key, self.write_only_buffers
            ),
        )

    @property
    def compile_specs(self) -> list[CompileSpec]:
        return list(self.delegation_spec.compile_specs)

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        # the nodes an earlier lowering left in ExecuTorch's check (release_graph_cache)
        release_graph_cache()
        dropped: dict[Node, str] = {}
        partitions = propose(exported_program, dropped, self.executorch_ops)
        tags = {}
        claimed = set()
        for i, pn in enumerate(partitions):
            tag = f"kiln_{i}"
            for n in pn:
                n.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
            claimed |= pn
        reasons = {
            n: low.Check(False, _EXCLUDED)
            if excluded_op(n, self.executorch_ops)
            else low.check_node(n, _ranges(exported_program), constant_tensors(exported_program))
            for n in exported_program.graph.nodes
            if n.op == "call_function"
            and n not in claimed
            and n not in dropped
            and n.target is not operator.getitem
            and not low.is_sym_node(n)
        }
        self.rejected += rejections(
            exported_program,
            claimed,
            {n: c.reason for n, c in reasons.items() if not c.ok},
            dropped,
        )
        _refuse_unrunnable_bags(exported_program, claimed)
        _refuse_unrunnable_convolutions(exported_program, claimed, reasons)
        kept_whole = set(low.PRESERVED_OPS)
        for n in exported_program.graph.nodes:
            if n.op == "call_function" and n not in claimed and low.target_name(n) in kept_whole:
                # Kept whole for Kiln by ops_to_not_decompose but not claimed after all: the
                # remaining partitioners or ExecuTorch's kernels must handle the non-core op.
                warnings.warn(
                    f"Kiln kept {low.target_name(n)} ('{n.name}') whole but could not take it; "
                    "if no later partitioner takes it, ExecuTorch needs a kernel for it",
                    stacklevel=2,
                )
        tag_constant_data(exported_program)
        if tags:
            tag_dead_constants(exported_program, next(iter(tags)))
        self.buffers_left += tag_owned_buffers(exported_program, tags)
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[Node], bool] | None]:
        """Non-core ops Kiln runs whole (linear, scaled_dot_product_attention, hardswish, ...).

        An op is kept whole only when Kiln supports every node of it in the program (dtypes,
        arguments, shapes). The choice is per op, not per node: ExecuTorch's per-node filter
        (the callable this method may return) re-traces preserved nodes with other strides and
        breaks views after attention (its ``_can_skip_using_EDGE_DO_NOT_DECOMP`` note), so no
        filter is returned.

        Embedding bags (``embedding_bag.padding_idx``) are kept whole as well when ExecuTorch has
        no kernel for them even though Kiln cannot take them: they would otherwise decompose
        into ``_embedding_bag_forward_only`` (weights that do not require grad), which to_edge
        refuses, and :meth:`partition` explains the problem instead.
        """
        from executorch.exir.lowered_backend_module import executorch_call_delegate

        by_op: dict = {}
        names = {
            o
            for o in low.PRESERVED_OPS
            if o not in self.executorch_ops and o.rsplit(".", 1)[0] not in self.executorch_ops
        }
        for n in ep.graph.nodes:
            if n.op != "call_function":
                continue
            if n.target is executorch_call_delegate:
                return ([], None)
            op = low.op_overload(n)
            if op is not None and str(op) in names:
                by_op.setdefault(op, []).append(n)
        if not by_op:
            return ([], None)
        ranges = _ranges(ep)
        constants = constant_tensors(ep)
        keep = []
        for op, nodes in by_op.items():
            bad = None
            for n in nodes:
                c = low.check_node(n, ranges, constants)
                if not c.ok:
                    bad = c.reason
                    break
            if bad is None or (str(op) in low.EMBEDDING_BAG_OPS and not _executorch_runs_bags()):
                # An embedding bag nothing can run is kept whole too: partition() then explains
                # why, instead of to_edge refusing the _embedding_bag_forward_only it decomposes
                # into when the weight does not require grad.
                keep.append(op)
            else:
                log.debug("Kiln lets %s decompose: %s", op, bad)
        return (keep, None)
