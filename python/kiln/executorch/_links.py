"""Links between the Kiln delegates of a method: which tensors one Kiln delegate passes straight
to another, recorded in each delegate's compile spec ``kiln.link`` so that at run time the tensor
stays in the producing engine's memory on its device instead of going through ExecuTorch's host
buffer (docs/runtime.md, "Between delegates"; the C++ side is adapter/executorch/kiln_links.cpp).

The edges are read from the program ExecuTorch emitted (the graph after ``to_executorch``, and
its instructions), so they are exactly the values the runtime passes: a delegate output (a
``getitem`` of an ``executorch_call_delegate``) and every node that reads it. An output is linked
when at least one later Kiln delegate of the same method reads it and every other reader only
reads it (an operator argument without alias information in its schema, or the method's
outputs); such a reader outside Kiln makes the producer still copy the output to its host
buffer. Methods with control flow are left alone. The records go into the emitted program's
delegate entries, and the program is serialized again.
"""

from __future__ import annotations

import hashlib
import logging
import operator
import struct
import zlib
from dataclasses import dataclass, field

import torch

log = logging.getLogger("kiln.executorch")

BACKEND_ID = "KilnBackend"
LINK_SPEC = "kiln.link"
MAGIC = b"KLNK"
VERSION = 1
HEADER_NBYTES = 32
FLAG_HOST = 1
_HEADER = struct.Struct("<4sHHQIIII")
_ENTRY = struct.Struct("<IIII")


@dataclass
class LinkRecord:
    """A delegate's link record (the compile spec ``kiln.link``; byte layout in
    docs/runtime.md).

    ``group`` is the same for every Kiln delegate of a method, ``delegate`` this delegate's id in
    it (its position among the method's Kiln delegates). ``outputs``: (output index, number of
    Kiln inputs that read it, whether a reader outside Kiln needs its host buffer too);
    ``inputs``: (input index, producer delegate id, producer output index)."""

    group: int
    delegate: int
    outputs: list[tuple[int, int, bool]] = field(default_factory=list)
    inputs: list[tuple[int, int, int]] = field(default_factory=list)

    def encode(self) -> bytes:
        body = bytearray(
            _HEADER.pack(
                MAGIC,
                VERSION,
                HEADER_NBYTES,
                self.group,
                self.delegate,
                len(self.outputs),
                len(self.inputs),
                0,
            )
        )
        for o, n, host in self.outputs:
            body += _ENTRY.pack(o, n, FLAG_HOST if host else 0, 0)
        for i, p, po in self.inputs:
            body += _ENTRY.pack(i, p, po, 0)
        return bytes(body) + struct.pack("<I", zlib.crc32(body))

    @classmethod
    def decode(cls, data: bytes) -> LinkRecord:
        """Reads a record (ValueError when it does not check: magic, version, size, CRC)."""
        data = bytes(data)
        if len(data) < HEADER_NBYTES + 4:
            raise ValueError(f"a link record of {len(data)} bytes is too short")
        magic, version, header, group, delegate, n_out, n_in, _ = _HEADER.unpack_from(data)
        if magic != MAGIC or version != VERSION or header != HEADER_NBYTES:
            raise ValueError(f"not a version {VERSION} link record (magic {magic!r}, v{version})")
        if len(data) != HEADER_NBYTES + (n_out + n_in) * _ENTRY.size + 4:
            raise ValueError(f"{n_out} + {n_in} entries do not fit {len(data)} bytes")
        (crc,) = struct.unpack_from("<I", data, len(data) - 4)
        if crc != zlib.crc32(data[:-4]):
            raise ValueError("the link record's CRC-32 does not match")
        rec = cls(group, delegate)
        at = HEADER_NBYTES
        for _ in range(n_out):
            o, n, flags, _r = _ENTRY.unpack_from(data, at)
            rec.outputs.append((o, n, bool(flags & FLAG_HOST)))
            at += _ENTRY.size
        for _ in range(n_in):
            i, p, po, _r = _ENTRY.unpack_from(data, at)
            rec.inputs.append((i, p, po))
            at += _ENTRY.size
        return rec


def _is_delegate_call(node) -> bool:
    from executorch.exir.lowered_backend_module import executorch_call_delegate

    return node.op == "call_function" and node.target is executorch_call_delegate


def _has_control_flow(gm) -> bool:
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator):
            if not _is_delegate_call(n):
                return True
        if n.op == "get_attr" and isinstance(getattr(gm, n.target, None), torch.fx.GraphModule):
            return True
    return False


def _schema(target):
    schema = getattr(target, "_schema", None)
    if schema is None:
        op = getattr(target, "_op", None)  # an edge dialect EdgeOpOverload
        schema = getattr(op, "_schema", None)
    return schema


def _contains(value, node) -> bool:
    if value is node:
        return True
    if isinstance(value, (list, tuple)):
        return any(_contains(v, node) for v in value)
    return False


def _only_reads(user, node) -> bool:
    """Whether ``user`` (not a Kiln delegate call) only reads ``node``: the method's output, or
    an operator that takes it in arguments whose schema gives no alias information (the operator
    neither writes it nor returns a view of it)."""
    if user.op == "output":
        return True
    if user.op != "call_function":
        return False
    schema = _schema(user.target)
    if schema is None:  # a Python callable (a memory view, another delegate): unknown
        return False
    args = schema.arguments
    for k, a in enumerate(user.args):
        if _contains(a, node) and (k >= len(args) or args[k].alias_info is not None):
            return False
    by_name = {a.name: a for a in args}
    for name, a in user.kwargs.items():
        if _contains(a, node) and (name not in by_name or by_name[name].alias_info is not None):
            return False
    return True


@dataclass
class _Edge:
    producer: int  # Kiln delegate id
    output: int
    consumer: int
    input: int


def _method_links(gm, plan, method: str) -> dict[int, LinkRecord]:
    """The link records of one method, keyed by the index of the delegate entry in the emitted
    execution plan; empty when the method has fewer than two Kiln delegates or none pass a
    tensor to another."""
    if _has_control_flow(gm):
        log.debug("kiln links: method %r has control flow: its delegates are not linked", method)
        return {}
    calls = [n for n in gm.graph.nodes if _is_delegate_call(n)]
    backends = [getattr(gm, c.args[0].target).backend_id for c in calls]
    kiln_calls = [c for c, b in zip(calls, backends, strict=True) if b == BACKEND_ID]
    if len(kiln_calls) < 2:
        return {}
    # The emitted delegate calls, in the order of the graph's (the emitter walks the graph).
    instrs = []
    if len(plan.chains) == 1:
        instrs = [i.instr_args for i in plan.chains[0].instructions]
    dcalls = [i for i in instrs if type(i).__name__ == "DelegateCall"]
    if len(dcalls) != len(calls) or any(
        plan.delegates[d.delegate_index].id != b for d, b in zip(dcalls, backends, strict=True)
    ):
        log.debug(
            "kiln links: method %r: the emitted delegate calls do not match the graph's", method
        )
        return {}
    ids = {c: k for k, c in enumerate(kiln_calls)}
    emitted = {c: d for c, d in zip(calls, dcalls, strict=True)}
    edges: list[_Edge] = []
    host: dict[tuple[int, int], bool] = {}
    for p in kiln_calls:
        for g in p.users:
            if g.target is not operator.getitem or not isinstance(g.args[1], int):
                continue  # a delegate result used whole: not one output's tensor
            readers, outside, ok = [], False, True
            for u in g.users:
                if u in ids:
                    if _contains(list(u.kwargs.values()), g):
                        ok = False
                    readers += [(u, i) for i, a in enumerate(u.args[1:]) if a is g]
                elif _only_reads(u, g):
                    outside = True
                else:
                    ok = False
            if ok and readers:
                host[(ids[p], g.args[1])] = outside
                edges += [_Edge(ids[p], g.args[1], ids[u], i) for u, i in readers]
    edges = _check_emitted(edges, host, kiln_calls, emitted, instrs, plan, method)
    if not edges:
        return {}
    digest = hashlib.sha256(method.encode())
    for c in kiln_calls:
        digest.update(hashlib.sha256(getattr(gm, c.args[0].target).processed_bytes).digest())
    group = int.from_bytes(digest.digest()[:8], "little")
    records: dict[int, LinkRecord] = {}

    def record(k: int) -> LinkRecord:
        idx = emitted[kiln_calls[k]].delegate_index
        return records.setdefault(idx, LinkRecord(group, k))

    readers_of: dict[tuple[int, int], int] = {}
    for e in edges:
        readers_of[(e.producer, e.output)] = readers_of.get((e.producer, e.output), 0) + 1
        record(e.consumer).inputs.append((e.input, e.producer, e.output))
    for (p, o), n in sorted(readers_of.items()):
        record(p).outputs.append((o, n, host[(p, o)]))
    return records


def _check_emitted(edges, host, kiln_calls, emitted, instrs, plan, method) -> list[_Edge]:
    """Keeps the edges the emitted instructions confirm: the consumer's argument is the
    producer's output value, and an output no reader outside Kiln needs is referenced by no
    instruction, list or method output other than its Kiln readers."""
    n_in = {k: len(c.args) - 1 for k, c in enumerate(kiln_calls)}
    args = {k: list(emitted[c].args) for k, c in enumerate(kiln_calls)}
    kept = []
    for e in edges:
        outs = args[e.producer][n_in[e.producer] :]
        ins = args[e.consumer][: n_in[e.consumer]]
        if e.output < len(outs) and e.input < len(ins) and ins[e.input] == outs[e.output]:
            kept.append(e)
        else:
            log.debug("kiln links: method %r: edge %s not found in the emitted program", method, e)
    linked_inputs = {(e.consumer, e.input) for e in kept}
    refs: dict[int, int] = {}  # value -> references other than Kiln producer / linked input
    kiln_dcalls = {id(emitted[c]): k for k, c in enumerate(kiln_calls)}
    for ins in instrs:
        k = kiln_dcalls.get(id(ins))
        if k is not None:
            for pos, v in enumerate(ins.args):
                if pos >= n_in[k] or (k, pos) in linked_inputs:
                    continue
                refs[v] = refs.get(v, 0) + 1
            continue
        for name in ("args", "value_index", "move_from", "move_to", "cond_value_index"):
            val = getattr(ins, name, None)
            for v in val if isinstance(val, list) else [val]:
                if isinstance(v, int):
                    refs[v] = refs.get(v, 0) + 1
    for v in plan.outputs:
        refs[v] = refs.get(v, 0) + 1
    for ev in plan.values:
        # Lists of values (not DoubleList / BoolList: their items are numbers, not indices).
        items = getattr(ev.val, "items", None)
        if type(ev.val).__name__ in ("TensorList", "OptionalTensorList", "IntList"):
            for v in items:
                if isinstance(v, int):
                    refs[v] = refs.get(v, 0) + 1
    out = []
    for e in kept:
        v = args[e.producer][n_in[e.producer] + e.output]
        if not host[(e.producer, e.output)] and refs.get(v, 0) > 0:
            log.debug(
                "kiln links: method %r: delegate %d's output %d has readers outside Kiln that the "
                "graph did not show: not linked",
                method,
                e.producer,
                e.output,
            )
            continue
        out.append(e)
    return out


def link_delegates(program, backend_config=None) -> dict[str, dict[int, LinkRecord]]:
    """Records the edges between the Kiln delegates of each method of an
    ``ExecutorchProgramManager`` (from ``to_executorch(backend_config)``) in their compile specs
    and serializes the program again with them. Returns {method: {delegate entry index:
    LinkRecord}} (empty when no method has such an edge, and then the program is unchanged).

    :func:`kiln.executorch.export` and :func:`save` call it; call it yourself, with the same
    ``backend_config``, on a program lowered with ``to_edge_transform_and_lower`` and
    ``to_executorch`` directly."""
    emitter = getattr(program, "_emitter_output", None)
    needed = ("_data_serializer", "_named_data", "_pte_data", "_tensor_data")
    if emitter is None or not all(hasattr(program, a) for a in needed):
        log.debug("kiln links: not an ExecutorchProgramManager this ExecuTorch version emits")
        return {}
    found = {}
    plans = {p.name: p for p in emitter.program.execution_plan}
    for method in sorted(program.methods):
        plan = plans.get(method)
        if plan is None:
            continue
        records = _method_links(program.exported_program(method).graph_module, plan, method)
        if records:
            found[method] = records
    if not found:
        return {}
    store_records(
        program,
        {m: {idx: rec.encode() for idx, rec in recs.items()} for m, recs in found.items()},
        backend_config,
    )
    for method, records in found.items():
        n = sum(len(r.inputs) for r in records.values())
        log.debug("kiln links: method %r: %d delegate inputs read on the device", method, n)
    return found


def store_records(program, records: dict[str, dict[int, bytes]], backend_config=None) -> None:
    """Sets the compile spec ``kiln.link`` of the delegate entries ``records`` names ({method:
    {delegate entry index: record bytes}}; ``None`` bytes remove it) in the emitted program of
    an ``ExecutorchProgramManager`` and serializes the program again (``backend_config`` as
    given to ``to_executorch``)."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir._serialize._serialize import serialize_for_executorch
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    emitter = program._emitter_output
    plans = {p.name: p for p in emitter.program.execution_plan}
    for method, recs in records.items():
        for idx, data in recs.items():
            d = plans[method].delegates[idx]
            # A new list: the lowered modules' delegates may share one compile-spec list.
            specs = [c for c in d.compile_specs if c.key != LINK_SPEC]
            d.compile_specs = specs + ([CompileSpec(LINK_SPEC, data)] if data is not None else [])
    config = backend_config if backend_config is not None else ExecutorchBackendConfig()
    program._pte_data, program._tensor_data = serialize_for_executorch(
        emitter, config, program._data_serializer, program._named_data
    )
    if hasattr(program, "_buffer"):
        program._buffer = None


def program_links(program) -> dict[str, dict[int, LinkRecord]]:
    """The link records of an ``ExecutorchProgramManager``'s emitted program: {method:
    {delegate entry index: LinkRecord}}."""
    out = {}
    for plan in program.executorch_program.execution_plan:
        for idx, d in enumerate(plan.delegates):
            for c in d.compile_specs:
                if c.key == LINK_SPEC:
                    out.setdefault(plan.name, {})[idx] = LinkRecord.decode(c.value)
    return out
