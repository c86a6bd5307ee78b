"""kiln.executorch.export / save: one call from a PyTorch model to an ExecuTorch program whose
supported parts run in Kiln."""

from __future__ import annotations

import functools
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path

import torch
from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
from executorch.exir.backend.partitioner import Partitioner
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from . import _report
from ._links import link_delegates
from ._meta import check_not_meta
from ._options import (
    read_tuning_records,
    validate_executorch_ops,
    validate_external_data,
    validate_precision,
)
from .partitioner import BACKEND_ID, KilnPartitioner, executorch_kernels, release_graph_cache

log = logging.getLogger("kiln.executorch")

EXPORT_OPTIONS = (
    "dynamic_shapes",
    "precision",
    "external_data",
    "tuning_records",
    "partitioners",
    "backend_config",
    "strict",
    "quiet",
    "executorch_ops",
)


_REDUCED = (torch.float16, torch.bfloat16)
_THIS_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class KilnExportError(RuntimeError):
    """The model cannot be exported as written (torch.export refused it); the message names the
    model's source line and what to change."""


class KilnStrictError(RuntimeError):
    """``strict=True`` and KilnPartitioner left nodes to ExecuTorch. ``rejected`` lists them
    ({"op", "reason", "source"}); ``report`` is the export report so far."""

    def __init__(self, message: str, rejected: list, report):
        super().__init__(message)
        self.rejected = rejected
        self.report = report


def _as_args(example_inputs, what: str) -> tuple:
    if example_inputs is None:
        raise ValueError(
            f"{what}: example_inputs are required to export an nn.Module (a tuple of tensors "
            "with the shapes and dtypes the model takes)"
        )
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, list):
        return tuple(example_inputs)
    if not isinstance(example_inputs, tuple):
        raise TypeError(
            f"{what}: example_inputs must be a tuple of tensors, got "
            f"{type(example_inputs).__name__}"
        )
    return example_inputs


def _export_module(
    module: torch.nn.Module, example_inputs, dynamic_shapes, what: str, strict: bool = False
):
    if module.training and not strict:
        warnings.warn(
            f"{what}: the model is in training mode (dropout and batch norm behave differently "
            "than at inference, and Kiln cannot take training-mode batch norm); call "
            "model.eval() before exporting",
            stacklevel=6,  # the user's call of export or save
        )
    args = _as_args(example_inputs, what)
    try:
        return torch.export.export(module, args, dynamic_shapes=dynamic_shapes, strict=strict)
    except GuardOnDataDependentSymNode as e:
        raise KilnExportError(_data_dependent_message(e, module, what)) from e


def _user_frame(tb) -> str | None:
    """file:line of the last frame of a traceback outside torch (the model's code)."""
    torch_dir = os.path.dirname(torch.__file__)
    found = None
    for f in traceback.extract_tb(tb):
        if not f.filename.startswith(torch_dir) and not f.filename.startswith(_THIS_PACKAGE):
            found = f"{f.filename}:{f.lineno}"
    return found


def _data_dependent_message(e: Exception, module: torch.nn.Module, what: str) -> str:
    where = _user_frame(e.__traceback__)
    reduced = sorted(
        {str(p.dtype).replace("torch.", "") for p in module.parameters() if p.dtype in _REDUCED}
    )
    msg = (
        f"{what}: torch.export cannot trace the model: "
        + (f"at {where} it " if where else "it ")
        + "branches in Python on a value computed from tensors ("
        + str(e).splitlines()[0].strip()
        + "). Every ExecuTorch export starts with torch.export, which needs control flow that "
        "does not depend on tensor values."
    )
    if reduced:
        msg += (
            f" The model's weights are {' and '.join(reduced)}: model code often checks "
            "reduced-precision activations for overflow that way (transformers' BART and the "
            "models built on its layers). Export the float32 model with precision='fp16' or "
            "'bf16' instead of converting it first: Kiln converts the weights itself, and the "
            "check does not run. Otherwise rewrite the branch with torch.where or torch.cond."
        )
    else:
        msg += " Rewrite the branch with torch.where or torch.cond."
    return msg


def _programs(
    model, example_inputs, dynamic_shapes, strict: bool = False
) -> dict[str, ExportedProgram]:
    if isinstance(model, ExportedProgram):
        if example_inputs is not None or dynamic_shapes is not None:
            raise ValueError(
                "example_inputs and dynamic_shapes apply only to an nn.Module; an "
                "ExportedProgram already carries its inputs and dynamic shapes"
            )
        return {"forward": model}
    if isinstance(model, torch.nn.Module):
        return {"forward": _export_module(model, example_inputs, dynamic_shapes, "forward", strict)}
    if isinstance(model, Mapping):
        if example_inputs is not None or dynamic_shapes is not None:
            raise ValueError(
                "with several methods, give each method's inputs in the dict: "
                "{name: ExportedProgram or (module, example_inputs[, dynamic_shapes])}"
            )
        if not model:
            raise ValueError("the dict of methods is empty")
        out = {}
        for name, item in model.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"method name {name!r} must be a non-empty identifier string")
            if isinstance(item, ExportedProgram):
                out[name] = item
            elif isinstance(item, (tuple, list)) and len(item) in (2, 3):
                mod = item[0]
                if not isinstance(mod, torch.nn.Module):
                    raise TypeError(
                        f"method {name!r}: expected (nn.Module, example_inputs[, dynamic_shapes]), "
                        f"got a {type(mod).__name__} first"
                    )
                dyn = item[2] if len(item) == 3 else None
                out[name] = _export_module(mod, item[1], dyn, f"method {name!r}", strict)
            else:
                raise TypeError(
                    f"method {name!r}: expected an ExportedProgram or a tuple "
                    f"(nn.Module, example_inputs[, dynamic_shapes]), got {type(item).__name__}"
                )
        return out
    raise TypeError(
        "model must be an nn.Module, a torch.export ExportedProgram, or a dict "
        f"{{method_name: ExportedProgram or (module, example_inputs[, dynamic_shapes])}}; got "
        f"{type(model).__name__}"
    )


def _check_partitioners(partitioners) -> list[Partitioner]:
    if partitioners is None:
        return []
    if not isinstance(partitioners, (list, tuple)):
        raise TypeError(
            "partitioners must be a list of ExecuTorch Partitioner objects (run after Kiln's), "
            f"got {type(partitioners).__name__}"
        )
    for p in partitioners:
        if isinstance(p, KilnPartitioner):
            raise ValueError(
                "partitioners: KilnPartitioner is added by export itself; pass its options "
                "(precision=, external_data=) to export instead"
            )
        if not isinstance(p, Partitioner):
            raise TypeError(f"partitioners: {type(p).__name__} is not an ExecuTorch Partitioner")
    return list(partitioners)


def export(
    model,
    example_inputs: Sequence | None = None,
    *,
    dynamic_shapes=None,
    precision: str = "fp32",
    external_data: str | None = None,
    tuning_records=None,
    partitioners: Sequence[Partitioner] | None = None,
    backend_config=None,
    strict: bool = False,
    quiet: bool = False,
    executorch_ops: Sequence[str] | None = None,
):
    """Exports a model to an ExecuTorch program whose supported parts run in Kiln.

    Args:
        model: an ``nn.Module`` (exported with ``torch.export.export(model, example_inputs,
            dynamic_shapes=...)``), an ``ExportedProgram``, or a dict ``{method_name:
            ExportedProgram or (module, example_inputs[, dynamic_shapes])}`` for a program with
            several methods. Modules are exported in torch.export's non-strict mode; one whose
            non-strict trace does not lower (AOT autograd's "expected compiled_fn to be
            GraphModule", as transformers' StaticCache wrappers give) is exported again with
            ``strict=True``, with a warning in the ``kiln.executorch`` log. A module's
            registered buffers that it updates in place (a KV cache: ``index_copy_``,
            ``x[:, :, positions] = ...``, slice assignment at a constant start) become state
            owned by the Kiln engine when Kiln computes their every use: each loaded program
            keeps its own copy from one call to the next.
        example_inputs: a tuple of tensors (for an nn.Module).
        dynamic_shapes: as for ``torch.export.export`` (for an nn.Module); dynamic dimensions
            need a ``max`` (Kiln plans memory for the largest shapes).
        precision: "fp32", "fp16" or "bf16": Kiln's compute precision for heavy ops and
            activations; inputs and outputs keep their dtypes.
        external_data: None to keep weights in the .pte, or a file stem: weights go to
            ``<external_data>.ptd`` (written by :func:`save`, or by the returned program's
            ``write_tensor_data_to_file(dir)``).
        tuning_records: None, or the path of a tuning cache file written on the target GPU
            (``kiln tune PROGRAM.pte --cache FILE``): its records are stored in the program
            beside the weights, and a context created on that GPU applies them instead of
            timing (one made for another GPU, driver or Kiln version is ignored there).
        partitioners: further ExecuTorch partitioners, applied after Kiln's to what Kiln does
            not take (e.g. XNNPACK or CUDA); anything left runs on ExecuTorch's kernels.
        backend_config: an ``ExecutorchBackendConfig`` for ``to_executorch`` (memory planning,
            e.g. ``MemoryPlanningPass(alloc_graph_input=False)`` for caller-owned inputs).
        strict: True raises :class:`KilnStrictError`, listing each node KilnPartitioner left to
            ExecuTorch (op, reason, the model's file:line), instead of exporting a program that
            runs part of the model outside Kiln.
        executorch_ops: ATen op names Kiln leaves to ExecuTorch even where it could take them
            (to compare an op's values, or to keep it with another partitioner), each an
            overload as the export report names it ("aten.softmax.default") or a packet
            ("aten.softmax"); an unknown name raises ValueError. The program then holds a Kiln
            delegate on each side of such a node.
        quiet: True draws no progress bar and prints no report. Otherwise, when stderr is a
            terminal, a progress bar (tqdm, if installed) shows the phase, the engine being
            lowered and built and the builder's pass and layer, and the export report is
            printed at the end.

    Returns:
        ExecuTorch's ``ExecutorchProgramManager`` (``.buffer``, ``.write_to_file(f)``,
        ``.write_tensor_data_to_file(dir)``, ``.exported_program(name)``), with the export
        report as ``.kiln_report`` (an ``ExportReport``: ``str()`` for text, ``.to_dict()``).
    """
    with _progress(quiet) as rep:
        prog = _export(
            rep,
            model,
            example_inputs,
            dynamic_shapes,
            precision,
            external_data,
            partitioners,
            backend_config,
            strict,
            tuning_records,
            executorch_ops,
        )
    _print_report(rep, quiet)
    return prog


def _progress(quiet: bool) -> _report.ExportProgress:
    if not isinstance(quiet, bool):
        raise TypeError(f"quiet must be a bool, got {type(quiet).__name__}")
    return _report.ExportProgress(show_bar=not quiet and _is_terminal(sys.stderr))


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _print_report(rep: _report.ExportProgress, quiet: bool) -> None:
    if not quiet and _is_terminal(rep.stream):
        print(rep.report, file=rep.stream)


def _with_exportable_experts(fn):
    """Runs an export with transformers' grouped_mm experts switched to batched_mm (see
    _export_experts_as_batched), switched back whatever happens."""

    @functools.wraps(fn)
    def wrapped(rep, model, *args, **kwargs):
        switched = _export_experts_as_batched(model)
        try:
            return fn(rep, model, *args, **kwargs)
        finally:
            _restore_experts(switched)

    return wrapped


@_with_exportable_experts
def _export(
    rep,
    model,
    example_inputs,
    dynamic_shapes,
    precision,
    external_data,
    partitioners,
    backend_config,
    strict,
    tuning_records=None,
    executorch_ops=None,
):
    precision = validate_precision(precision)
    executorch_ops = validate_executorch_ops(executorch_ops)
    external_data = validate_external_data(external_data)
    read_tuning_records(tuning_records)  # refused before any tracing when it does not check
    extra = _check_partitioners(partitioners)
    if backend_config is not None and not isinstance(backend_config, ExecutorchBackendConfig):
        raise TypeError(
            "backend_config must be an executorch.exir.ExecutorchBackendConfig, got "
            f"{type(backend_config).__name__}"
        )
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be a bool, got {type(strict).__name__}")
    check_not_meta(model, example_inputs)
    # torch.export's non-strict trace runs the module's in-place updates of tensors it does not
    # see as module state on the real tensors; kept to undo that before a strict retry.
    saved = _buffer_values(model)
    with rep.phase("torch.export"):
        programs = _programs(model, example_inputs, dynamic_shapes)

    def partitioner(programs):
        return KilnPartitioner(
            precision=precision,
            external_data=external_data,
            tuning_records=tuning_records,
            write_only_buffers=_write_only_buffers(programs),
            executorch_ops=executorch_ops,
        )

    kiln = partitioner(programs)
    _warn_read_only_buffers(programs)
    declared = _dynamic_input_dims(programs)
    strict_trace = False
    with rep.phase("partition + lower"):
        try:
            edge = to_edge_transform_and_lower(programs, partitioner=[kiln, *extra])
        except AssertionError as e:
            if _NON_STRICT_FAILURE not in str(e) or not _exports_modules(model):
                raise
            log.warning(_STRICT_RETRY, str(e).strip())
            del programs
            _restore_buffers(saved)
            # Under no_grad, as transformers' own convert_and_export_with_cache: a strict trace
            # with autograd on lifts tensors that require grad, which ExecuTorch cannot copy.
            with rep.phase("torch.export"), torch.no_grad():
                programs = _programs(model, example_inputs, dynamic_shapes, strict=True)
            kiln = partitioner(programs)
            edge = to_edge_transform_and_lower(programs, partitioner=[kiln, *extra])
            strict_trace = True
        finally:
            release_graph_cache()  # this lowering's nodes, kept by ExecuTorch's check
    fixed = _specialized_dims(edge, declared)
    if fixed and not extra and _all_modules(model):
        # ExecuTorch's edge verifier fixed a dynamic size (its argument check takes len() of the
        # first tensor a Tensor[] op returns: a split's batch). Lowered again without the check,
        # kept only when Kiln then takes every op: the check guards what ExecuTorch would run.
        _restore_buffers(saved)
        with rep.phase("torch.export"), torch.no_grad() if strict_trace else nullcontext():
            again = _programs(model, example_inputs, dynamic_shapes, strict=strict_trace)
        kiln2 = partitioner(again)
        with rep.phase("partition + lower"):
            try:
                edge2 = to_edge_transform_and_lower(
                    again,
                    partitioner=[kiln2],
                    compile_config=EdgeCompileConfig(_check_ir_validity=False),
                )
            finally:
                release_graph_cache()
        if not _specialized_dims(edge2, declared) and _whole_in_kiln(edge2, kiln2):
            edge, kiln, fixed = edge2, kiln2, []
        del again, edge2
    _warn_specialized_dims(fixed)
    methods, derived = _report.describe_methods(edge)
    rep.report.methods = methods
    # The partitioner's own record of what it left and why, when it keeps one; otherwise the
    # compute nodes left outside every delegate, found in the lowered program.
    recorded = getattr(kiln, "rejected", None)
    rep.report.rejected = list(recorded) if recorded is not None else derived
    if strict and rep.report.rejected:
        raise KilnStrictError(_strict_message(rep.report.rejected), rep.report.rejected, rep.report)
    backend_config = _share_executorch_buffers(edge, backend_config, kiln)
    with rep.phase("to_executorch"):
        prog = edge.to_executorch(backend_config)
        release_graph_cache()  # what the emitter's passes cached of the lowered modules
        # Tensors one Kiln delegate passes straight to another stay on its device at run time.
        links = link_delegates(prog, backend_config)
    rep.report.links = {m: sum(len(r.inputs) for r in recs.values()) for m, recs in links.items()}
    _warn_missing_kernels(prog, rep.report.rejected)
    try:
        prog.kiln_report = rep.report
    except AttributeError:  # a manager class that refuses new attributes
        pass
    return prog


def _missing_kernels(prog) -> dict[str, list[str]]:
    """Per method, the operators the program calls outside its delegates that the ExecuTorch
    runtime installed here has no kernel for ({} when it cannot tell)."""
    kernels = executorch_kernels()
    if kernels is None:
        return {}
    out = {}
    try:
        plans = prog.executorch_program.execution_plan
    except AttributeError:
        return {}
    for plan in plans:
        names = {f"{o.name}.{o.overload}" if o.overload else o.name for o in plan.operators}
        missing = sorted(n for n in names if n not in kernels)
        if missing:
            out[plan.name] = missing
    return out


def _warn_missing_kernels(prog, rejected) -> None:
    """A program that would export fine but not load (OperatorMissing) is said at export time,
    with the ops and the lines of the model that made them."""
    for method, missing in _missing_kernels(prog).items():
        short = {m.split("::")[-1].split(".")[0] for m in missing}
        lines = sorted(
            {
                r["source"]
                for r in rejected or []
                if r.get("source") and any(s in r["op"] for s in short)
            }
        )
        warnings.warn(
            f"method {method!r} calls {', '.join(missing)} outside Kiln's delegates, and the "
            "ExecuTorch runtime installed here has no kernel for "
            + ("it" if len(missing) == 1 else "them")
            + ": kiln.load will refuse the program (OperatorMissing). "
            + (f"The model makes them at {', '.join(lines)}. " if lines else "")
            + "Change that code (Kiln's export report says why it did not take them), or run the "
            "program with an ExecuTorch runtime built with those kernels",
            stacklevel=5,  # the user's call of export or save
        )


# What AOT autograd raises when ExecuTorch decomposes a non-strict export of a module that
# mutates tensors held outside its registered state (transformers' StaticCache wrappers:
# TorchExportableModuleWithStaticCache keeps the cache tensors in a StaticCache object and
# registers the same tensors as buffers); torch.export's strict (dynamo) trace of the same
# module lowers.
_NON_STRICT_FAILURE = "expected compiled_fn to be GraphModule"
_STRICT_RETRY = (
    "kiln: the model traced by torch.export in non-strict mode (the default) does not lower "
    "(%s): it mutates tensors outside its registered state, as transformers' StaticCache "
    "wrappers do. Exporting it again with torch.export.export(..., strict=True) under "
    "torch.no_grad(); to skip this retry, export so yourself and pass the ExportedProgram"
)


def _user_inputs(ep: ExportedProgram) -> list:
    """The placeholders of an exported program's user inputs, in order."""
    kinds = {s.arg.name: s.kind for s in ep.graph_signature.input_specs}
    return [
        n
        for n in ep.graph.nodes
        if n.op == "placeholder" and kinds.get(n.name) == InputKind.USER_INPUT
    ]


def _dynamic_input_dims(programs: dict[str, ExportedProgram]) -> dict[str, list[tuple]]:
    """Per method, (input index, input name, dim, range) of every user input dimension that
    torch.export left symbolic, recorded before lowering (which may specialize them)."""
    out = {}
    for name, ep in programs.items():
        dims = []
        for i, n in enumerate(_user_inputs(ep)):
            v = n.meta.get("val")
            for d, size in enumerate(getattr(v, "shape", ())):
                if isinstance(size, torch.SymInt):
                    vr = ep.range_constraints.get(size.node.expr)
                    rng = f"{vr.lower}..{vr.upper}" if vr is not None else "dynamic"
                    dims.append((i, n.name, d, rng))
        out[name] = dims
    return out


def _specialized_dims(edge, declared: dict[str, list[tuple]]) -> list[tuple]:
    """(method, input index, input name, dim, range, size) of each dimension torch.export left
    dynamic that came out of ExecuTorch's lowering as a fixed size."""
    out = []
    for name, dims in declared.items():
        if not dims:
            continue
        inputs = _user_inputs(edge.exported_program(name))
        for i, input_name, d, rng in dims:
            v = inputs[i].meta.get("val") if i < len(inputs) else None
            size = v.shape[d] if v is not None and d < len(v.shape) else None
            if isinstance(size, torch.SymInt):  # a symbol the lowering replaced by a number
                size = size.node.maybe_as_int()
            if isinstance(size, int):
                out.append((name, i, input_name, d, rng, size))
    return out


def _warn_specialized_dims(fixed: list[tuple]) -> None:
    """The program accepts only the fixed sizes (and says so when called with another), while
    the export seemed to succeed: said at export time."""
    for name, i, input_name, d, rng, size in fixed:
        warnings.warn(
            f"method {name!r}: input {i} ('{input_name}') dimension {d} was exported as dynamic "
            f"({rng}) but ExecuTorch's to_edge fixed it at {size}: the program accepts only "
            "that size. ExecuTorch's edge verifier does this to the batch of a tensor split or "
            "chunked along another dimension; Kiln lowers such a model again without that check "
            "when it then takes the whole model, which it could not here (an op left to "
            "ExecuTorch, another partitioner, or an ExportedProgram given); export one program "
            "per size you need",
            stacklevel=5,  # the user's call of export or save
        )


def _all_modules(model) -> bool:
    """Whether kiln exports every method of ``model`` (none given as an ExportedProgram)."""
    if isinstance(model, torch.nn.Module):
        return True
    return isinstance(model, Mapping) and all(
        not isinstance(v, ExportedProgram) for v in model.values()
    )


def _whole_in_kiln(edge, kiln) -> bool:
    methods, _ = _report.describe_methods(edge)
    return not kiln.rejected and all(
        m["n_outside"] == 0 and all(d["backend"] == BACKEND_ID for d in m["delegates"])
        for m in methods.values()
    )


def _modules(model) -> list[torch.nn.Module]:
    if isinstance(model, torch.nn.Module):
        return [model]
    if isinstance(model, Mapping):
        return [
            v[0]
            for v in model.values()
            if isinstance(v, (tuple, list)) and v and isinstance(v[0], torch.nn.Module)
        ]
    return []


def _write_only_buffers(programs: dict[str, ExportedProgram]) -> tuple[str, ...]:
    """The buffers some method overwrites and no method reads the stored value of: in every
    method, the buffer is the destination of a whole copy (``buffer.copy_(value)``, or the
    functional ``aten.copy`` whose result only the update takes), and nothing reads it before
    that copy (after an in-place copy, the graph's reads of the buffer or of the copy's result
    see the new value). Such a value never reaches a later call, so its updates are dropped
    (transformers' StaticCache keeps such a length counter per layer)."""
    written: set[str] = set()
    read: set[str] = set()
    for ep in programs.values():
        sig = ep.graph_signature
        written.update(sig.buffers_to_mutate.values())
        order = {n: i for i, n in enumerate(ep.graph.nodes)}
        for node in ep.graph.nodes:
            if node.op != "placeholder" or node.name not in sig.inputs_to_buffers:
                continue
            name = sig.inputs_to_buffers[node.name]

            def whole_copy(u, target, node=node):
                return (
                    u.op == "call_function"
                    and str(u.target) == target
                    and u.args[:1] == (node,)
                    and node not in u.args[1:]
                )

            inplace = [order[u] for u in node.users if whole_copy(u, "aten.copy_.default")]
            first = min(inplace) if inplace else None
            for user in node.users:
                if whole_copy(user, "aten.copy_.default") or whole_copy(user, "aten.copy.default"):
                    written.add(name)
                elif first is None or order[user] < first:
                    read.add(name)  # the value stored by an earlier call
    return tuple(sorted(written - read))


def _read_only_buffers(programs: dict[str, ExportedProgram]) -> list[tuple[str, str, list[str]]]:
    """(buffer, method, the methods that update it) for each buffer a method reads without
    updating it while another method of the program updates it. torch.export makes such a
    buffer a constant of the reading method: it reads the value the buffer had at export, never
    what the other method wrote."""
    updated: dict[str, set[str]] = {}
    for method, ep in programs.items():
        for name in _updated_buffers(ep):
            updated.setdefault(name, set()).add(method)
    out = []
    for method, ep in programs.items():
        mine = _updated_buffers(ep)
        for name in sorted(set(ep.graph_signature.inputs_to_buffers.values())):
            if name in updated and name not in mine:
                out.append((name, method, sorted(updated[name])))
    return out


def _updated_buffers(ep: ExportedProgram) -> set[str]:
    """The buffers the program updates: functionalized updates (the signature's mutations), or
    in the graph torch.export gives before decomposition, in-place ops on the buffer
    (``copy_``, ``add_``, ``index_copy_``, ...: an overload packet whose name ends in ``_``)."""
    sig = ep.graph_signature
    out = set(sig.buffers_to_mutate.values())
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in sig.inputs_to_buffers:
            continue
        for user in node.users:
            packet = getattr(user.target, "_overloadpacket", None)
            name = getattr(packet, "__name__", "")
            if user.op == "call_function" and name.endswith("_") and user.args[:1] == (node,):
                out.add(sig.inputs_to_buffers[node.name])
    return out


def _warn_read_only_buffers(programs: dict[str, ExportedProgram]) -> None:
    for name, method, writers in _read_only_buffers(programs):
        log.warning(
            "kiln: method %r reads buffer %r, which %s updates, without updating it: "
            "torch.export makes it a constant of %r (its value at export), so %r will not see "
            "what %s writes. Pass the value between the methods as an output and an input, or "
            "have %r update the buffer too (then the methods share it)",
            method,
            name,
            "method " + ", ".join(repr(w) for w in writers),
            method,
            method,
            " and ".join(repr(w) for w in writers),
            method,
        )


def _executorch_buffers_of_several_methods(edge) -> dict[str, list[str]]:
    """The buffers that stay with ExecuTorch (outside every Kiln delegate) and that two or more
    methods of the lowered program update: buffer name -> the methods."""
    by_buffer: dict[str, list[str]] = {}
    for method in edge.methods:
        sig = edge.exported_program(method).graph_signature
        for name in sorted(set(sig.buffers_to_mutate.values())):
            by_buffer.setdefault(name, []).append(method)
    return {b: ms for b, ms in by_buffer.items() if len(ms) > 1}


def _share_executorch_buffers(edge, backend_config, kiln):
    """ExecuTorch plans each method's mutable buffers on its own unless the program is built
    with share_mutable_buffers, so two methods that update a buffer Kiln could not own would
    each see their own copy, where eager PyTorch has one. Such a program gets ExecuTorch's shared
    mutable-buffer arena (when the caller passed no backend_config; otherwise a warning says
    what to set)."""
    shared = _executorch_buffers_of_several_methods(edge)
    if not shared:
        return backend_config
    left = {d["buffer"]: d["reason"] for d in getattr(kiln, "buffers_left", [])}
    what = "; ".join(
        f"{b!r} (methods {', '.join(repr(m) for m in ms)}"
        + (f": {left[b]}" if b in left else "")
        + ")"
        for b, ms in sorted(shared.items())
    )
    if backend_config is None:
        from executorch.exir.passes import MemoryPlanningPass

        log.info(
            "kiln: buffers updated by several methods stay with ExecuTorch: %s; they are "
            "planned in one arena the methods share (share_mutable_buffers), so each method "
            "sees the others' updates, as in eager PyTorch",
            what,
        )
        return ExecutorchBackendConfig(
            memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True)
        )
    plan = backend_config.memory_planning_pass
    passes = plan.values() if isinstance(plan, dict) else [plan]
    if not all(getattr(p, "share_mutable_buffers", False) for p in passes):
        log.warning(
            "kiln: buffers updated by several methods stay with ExecuTorch: %s; with this "
            "backend_config each method keeps its own copy (eager PyTorch has one). Pass "
            "memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True) in the "
            "ExecutorchBackendConfig so that the methods share them",
            what,
        )
    return backend_config


# transformers' mixture-of-experts layers run by default on "grouped_mm" (torch.histc to count
# the tokens per expert, then torch._grouped_mm or a custom op over them): ExecuTorch's edge
# verifier refuses histc and has no kernel for the rest. "batched_mm" gathers each token's
# experts' weights and runs batched matmuls: core ATen ops that Kiln takes (topk, index, bmm).
_EXPERTS_EXPORTABLE = "batched_mm"


def _grouped_experts(model) -> list:
    """The transformers models among the modules kiln exports whose experts run on grouped_mm."""
    out = []
    for mod in _modules(model):
        has_experts = any(
            hasattr(m, "num_experts") and hasattr(m, "has_gate") for m in mod.modules()
        )
        if not has_experts:
            continue
        for m in mod.modules():
            cfg = getattr(m, "config", None)
            if (
                hasattr(m, "set_experts_implementation")
                and getattr(cfg, "_experts_implementation", None) == "grouped_mm"
            ):
                out.append(m)
    return out


def _export_experts_as_batched(model) -> list:
    """Switches grouped_mm experts to batched_mm for the export, with a warning saying why;
    returns what to switch back (the user's model is left as it was)."""
    switched = _grouped_experts(model)
    if switched:
        warnings.warn(
            "the model's mixture-of-experts layers run on transformers' experts_implementation="
            "'grouped_mm' (torch.histc and grouped matmuls, which ExecuTorch cannot run); they are "
            f"exported with experts_implementation='{_EXPERTS_EXPORTABLE}' (the same values; the "
            "model itself is left as it was). To choose yourself, call "
            "model.set_experts_implementation(...) before exporting",
            stacklevel=4,
        )
        for m in switched:
            m.set_experts_implementation(_EXPERTS_EXPORTABLE)
    return switched


def _restore_experts(switched) -> None:
    for m in switched:
        m.set_experts_implementation("grouped_mm")


def _buffer_values(model) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(buffer, a copy of its value) for every buffer of the modules kiln exports."""
    out, seen = [], set()
    for mod in _modules(model):
        for b in mod.buffers():
            if id(b) not in seen:
                seen.add(id(b))
                out.append((b, b.detach().clone()))
    return out


def _restore_buffers(saved) -> None:
    """Gives every buffer back its value (and drops the autograd history a trace left on it:
    transformers' StaticCache tensors come out of a non-strict trace with a grad_fn)."""
    with torch.no_grad():
        for b, value in saved:
            if b.grad_fn is not None or b.requires_grad:
                try:
                    b.detach_()
                except RuntimeError:  # a view: copy_ below still restores the values
                    pass
            b.copy_(value)


def _exports_modules(model) -> bool:
    """Whether the programs of ``model`` are exported by kiln (not given as ExportedPrograms)."""
    if isinstance(model, torch.nn.Module):
        return True
    if isinstance(model, Mapping):
        return any(not isinstance(v, ExportedProgram) for v in model.values())
    return False


def _strict_message(rejected: list) -> str:
    lines = [
        f"strict=True: KilnPartitioner left {len(rejected)} node(s) to ExecuTorch (export "
        "with strict=False to run them on ExecuTorch's kernels, or change the model):"
    ]
    for r in rejected[:50]:
        src = f" at {r['source']}" if r.get("source") else ""
        lines.append(f"  {r.get('op')}{src}: {r.get('reason')}")
    if len(rejected) > 50:
        lines.append(f"  ... and {len(rejected) - 50} more")
    return "\n".join(lines)


def save(model, path, example_inputs: Sequence | None = None, **options):
    """Exports like :func:`export` and writes the program to ``path`` (a .pte) and, with
    ``external_data="name"``, the weights to ``name.ptd`` in the same folder.

    Options: ``dynamic_shapes``, ``precision``, ``external_data``, ``tuning_records``,
    ``partitioners``,
    ``backend_config``, ``strict``, ``quiet`` (as for :func:`export`). Returns the
    ``ExecutorchProgramManager`` (its ``kiln_report`` also lists the files written).
    """
    unknown = sorted(set(options) - set(EXPORT_OPTIONS))
    if unknown:
        raise TypeError(
            f"save() got unknown option(s) {', '.join(map(repr, unknown))}; valid options: "
            f"{', '.join(EXPORT_OPTIONS)}"
        )
    if not isinstance(path, (str, Path)):
        hint = (
            " (the example inputs come third: save(model, path, example_inputs))"
            if isinstance(path, (tuple, list, torch.Tensor))
            else ""
        )
        raise TypeError(f"path must be a str or Path, got {type(path).__name__}{hint}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory: pass the .pte file path to write")
    quiet = options.pop("quiet", False)
    with _progress(quiet) as rep:
        prog = _export(
            rep,
            model,
            example_inputs,
            options.get("dynamic_shapes"),
            options.get("precision", "fp32"),
            options.get("external_data"),
            options.get("partitioners"),
            options.get("backend_config"),
            options.get("strict", False),
            options.get("tuning_records"),
            options.get("executorch_ops"),
        )
        with rep.phase("write"):
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                prog.write_to_file(f)
            rep.report.files[str(path)] = path.stat().st_size
            # ExecuTorch 1.5's ExecutorchProgramManager has no public accessor for the data
            # files.
            data_files = {
                str(k).removesuffix(".ptd") for k in (getattr(prog, "_tensor_data", None) or {})
            }
            if data_files:
                prog.write_tensor_data_to_file(str(path.parent))
                for stem in sorted(data_files):
                    ptd = path.parent / f"{stem}.ptd"
                    if ptd.is_file():
                        rep.report.files[str(ptd)] = ptd.stat().st_size
    _print_report(rep, quiet)
    external = options.get("external_data")
    if external and external not in data_files:
        warnings.warn(
            f"external_data={external!r}: the program has no weights large enough to move out, "
            f"so no {external}.ptd was written; load the .pte alone",
            stacklevel=2,
        )
    return prog
