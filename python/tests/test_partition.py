"""KilnPartitioner: what it claims, partition validity, delegate argument order."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from executorch.exir import to_edge_transform_and_lower
from kiln.executorch import KilnPartitioner
from kiln.executorch import _lowering as low
from kiln.executorch.partitioner import analyze
from kiln_test_models import WithAtan


class _Probe:
    """Replaces KilnBackend.preprocess to look at the partitions without building engines."""

    def __init__(self, monkeypatch):
        import kiln.executorch.backend as backend
        from executorch.exir.backend.backend_details import PreprocessResult

        self.partitions = []

        def preprocess(edge_program, compile_specs):
            self.partitions.append(edge_program)
            return PreprocessResult(processed_bytes=b"kiln-probe")

        monkeypatch.setattr(backend.KilnBackend, "preprocess", staticmethod(preprocess))


def _lower(model, args, dynamic_shapes=None):
    ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
    return to_edge_transform_and_lower(ep, partitioner=[KilnPartitioner()])


def _user_inputs(ep):
    from torch.export.graph_signature import InputKind

    return [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]


def test_delegate_args_follow_placeholder_order(monkeypatch):
    """ExecuTorch passes delegate inputs in the order of the lowered module's user-input
    placeholders; preprocess binds engine inputs in that order."""
    probe = _Probe(monkeypatch)

    class M(nn.Module):
        def forward(self, a, b):
            c = torch.atan(a)  # not Kiln: splits the graph
            return b * 3.0 - c + a  # partition inputs in a non-signature order

    edge = _lower(M(), (torch.randn(4, 5), torch.randn(4, 5)))
    from executorch.exir.lowered_backend_module import executorch_call_delegate

    gm = edge.exported_program().graph_module
    calls = [n for n in gm.graph.nodes if n.target is executorch_call_delegate]
    assert len(calls) == 1 and len(probe.partitions) == 1
    lowered = getattr(gm, calls[0].args[0].target)
    placeholders = _user_inputs(lowered.original_module)
    arg_names = [a.name for a in calls[0].args[1:]]
    assert len(placeholders) == 3
    # The delegate call's arguments are the method's values for those placeholders, in order.
    assert arg_names == placeholders
    assert _user_inputs(probe.partitions[0]) == placeholders


def test_partial_delegation_leaves_unsupported_ops(monkeypatch):
    _Probe(monkeypatch)
    edge = _lower(WithAtan().eval(), (torch.randn(3, 16),))
    gm = edge.exported_program().graph_module
    targets = [low.target_name(n) for n in gm.graph.nodes if n.op == "call_function"]
    assert "aten.atan.default" in targets
    assert targets.count("executorch_call_delegate") == 2


def test_sym_sizes_never_cross_partitions(monkeypatch):
    probe = _Probe(monkeypatch)

    class M(nn.Module):
        def forward(self, x):
            y = torch.atan(x)
            return (x * 2).reshape(x.shape[0], -1, 2) + y.reshape(x.shape[0], -1, 2)

    b = torch.export.Dim("b", min=1, max=8)
    _lower(M(), (torch.randn(3, 6),), dynamic_shapes=({0: b},))
    for ep in probe.partitions:
        for n in ep.graph.nodes:
            if n.op == "placeholder":
                assert isinstance(n.meta["val"], torch.Tensor), f"{n.name} is {n.meta['val']}"
        out = [n for n in ep.graph.nodes if n.op == "output"][0]
        for o in out.args[0]:
            assert isinstance(o.meta["val"], torch.Tensor)


def test_multi_output_nodes_claimed_only_for_output_0():
    class M(nn.Module):
        def forward(self, x):
            return F.layer_norm(x, (8,)), F.max_pool2d(x.reshape(1, 1, 4, 8), 2)

    ep = torch.export.export(M(), (torch.randn(4, 8),))
    edge = ep.run_decompositions()
    supported, checks = analyze(edge.graph_module, low.Ranges(edge.range_constraints))
    for n in edge.graph.nodes:
        if n.target is operator.getitem:
            assert (n in supported) == (n.args[1] == 0), n.name


def test_dynamic_ranges_from_export():
    r = low.Ranges({})
    assert r.bounds(5) == (5, 5)

    class M(nn.Module):
        def forward(self, x):
            return x.reshape(-1)

    b = torch.export.Dim("b", min=1, max=16)
    ep = torch.export.export(M(), (torch.randn(3, 4),), dynamic_shapes=({0: b},))
    r = low.Ranges(ep.range_constraints)
    x = [n for n in ep.graph.nodes if n.op == "placeholder"][0].meta["val"]
    # torch reports min 2 for a dim declared min=1 (0/1 specialization); Kiln uses 1.
    assert r.bounds(x.shape[0]) == (1, 16)
    out = [n for n in ep.graph.nodes if n.op == "call_function"][-1].meta["val"]
    assert r.bounds(out.shape[0]) == (4, 64)


def test_unbounded_dim_gets_documented_cap():
    class M(nn.Module):
        def forward(self, x):
            return x + 1

    ep = torch.export.export(
        M(), (torch.randn(3, 4),), dynamic_shapes=({0: torch.export.Dim("b")},)
    )
    x = [n for n in ep.graph.nodes if n.op == "placeholder"][0].meta["val"]
    with pytest.warns(UserWarning, match="no upper bound"):
        r = low.Ranges(ep.range_constraints)
    assert r.bounds(x.shape[0]) == (1, low.DEFAULT_DIM_MAX)


def test_unsupported_dtypes_are_left_to_executorch(monkeypatch):
    probe = _Probe(monkeypatch)

    class M(nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    _lower(M(), (torch.randn(4, 4, dtype=torch.float64),))
    assert probe.partitions == []


def test_reshape_shape_codes():
    class M(nn.Module):
        def forward(self, x, y):
            b = x.shape[0]
            return x.reshape(b, 2, -1), x.reshape(-1), y.expand(x.shape[0], 3, 4)

    b = torch.export.Dim("b", min=1, max=8)
    ep = torch.export.export(
        M(), (torch.randn(3, 12), torch.randn(1, 3, 4)), dynamic_shapes=({0: b}, None)
    )
    edge = to_edge_transform_and_lower(ep).exported_program()
    supported, checks = analyze(edge.graph_module, low.Ranges(edge.range_constraints))
    views = [
        n
        for n in edge.graph.nodes
        if "view_copy" in low.target_name(n) or "expand" in low.target_name(n)
    ]
    assert views
    for n in views:
        assert n in supported, checks[n].reason


def test_channels_last_values_do_not_cross_into_kiln(monkeypatch):
    """ExecuTorch derives a tensor's dim order from its strides: Kiln (contiguous engine I/O)
    must not take a channels-last value across a partition boundary. A channels-last method
    input read by nodes Kiln takes is refused with the remedy; channels-last values inside the
    model (weights, activations of a model converted to channels_last) stay inside Kiln."""
    probe = _Probe(monkeypatch)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8).to(memory_format=torch.channels_last)
    with pytest.raises(
        ValueError, match="input '.*' has a non-contiguous memory layout.*contiguous"
    ):
        _lower(model, (x,))
    with pytest.raises(ValueError, match="output '.*' has a non-contiguous memory layout"):
        _lower(model.to(memory_format=torch.channels_last), (torch.randn(1, 3, 8, 8),))
    probe.partitions.clear()
    model = nn.Sequential(model, nn.Flatten()).to(memory_format=torch.channels_last)
    _lower(model, (torch.randn(1, 3, 8, 8),))
    assert len(probe.partitions) == 1
    for ep in probe.partitions:
        for n in ep.graph.nodes:
            if n.op in ("placeholder", "output"):
                vals = n.meta.get("val")
                for v in vals if isinstance(vals, (list, tuple)) else [vals]:
                    if isinstance(v, torch.Tensor) and n.op == "placeholder":
                        is_const = n.name not in ep.graph_signature.user_inputs
                        assert is_const or v.is_contiguous(), n.name


def _live_lowered_modules(exclude=()) -> int:
    import gc

    from executorch.exir.lowered_backend_module import LoweredBackendModule

    gc.collect()
    return sum(
        1 for o in gc.get_objects() if isinstance(o, LoweredBackendModule) and o not in exclude
    )


class _TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_lowered_programs_are_not_kept_alive_by_the_process():
    """Torch's fake-tensor dispatch cache and ExecuTorch's graph check memoize the lowered
    delegate modules (and with them every engine's weight bytes) for the life of the process;
    the partitioner and kiln.executorch.export release them, so exporting one model after
    another does not accumulate memory (a test suite or a notebook exporting many models)."""
    import gc
    import weakref

    import kiln.executorch
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    x = (torch.randn(4, 64),)
    gc.collect()
    # delegates other tests' fixtures hold on purpose are not this test's
    held = weakref.WeakSet(o for o in gc.get_objects() if isinstance(o, LoweredBackendModule))
    for _ in range(3):  # the raw flow: each lowering releases what the previous one left
        prog = _lower(_TwoLinears().eval(), x).to_executorch()
        del prog
    # at most the last lowering's delegate is still cached (released by the next partition;
    # the first of these released what earlier lowerings in the process left)
    assert _live_lowered_modules(held) <= 1
    for _ in range(3):  # kiln.executorch.export releases its own before it returns
        prog = kiln.executorch.export(_TwoLinears().eval(), x)
        del prog
    assert _live_lowered_modules(held) == 0


class _SortsThenScales(nn.Module):
    """torch.sort's values between two ops Kiln takes, over lines longer than Kiln sorts
    (_lowering.SORT_MAX_LEN): left to ExecuTorch."""

    def forward(self, x):
        v, _ = torch.sort(x * 2.0, dim=-1)
        return torch.relu(v) + 1.0


def test_an_op_no_runtime_runs_is_named_at_export_and_at_load(tmp_path):
    """A node Kiln leaves to ExecuTorch that the installed ExecuTorch runtime has no kernel for:
    the export warns naming the operator and the model's line (the program would not load), and
    kiln.load's error names the operator too, not just OperatorMissing."""
    import kiln
    from kiln.executorch import save
    from kiln.executorch.partitioner import executorch_kernels

    kernels = executorch_kernels()
    if kernels is None or "aten::sort.values" in kernels:
        pytest.skip("this ExecuTorch runtime runs aten::sort.values: nothing to refuse")
    path = tmp_path / "sort.pte"
    with pytest.warns(UserWarning, match=r"aten::sort\.values.*OperatorMissing") as rec:
        save(_SortsThenScales().eval(), path, (torch.randn(2, low.SORT_MAX_LEN + 1),), quiet=True)
    msg = str(next(w.message for w in rec if "OperatorMissing" in str(w.message)))
    assert "test_partition.py" in msg  # the model's line that made it
    with pytest.raises(kiln.KilnLoadError, match=r"OperatorMissing.*aten::sort\.values"):
        kiln.load(path)
