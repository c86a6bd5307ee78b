"""The export side against libkiln's C runtime alone (no ExecuTorch delegate): the graph that
preprocess describes, built and run through kiln_engine_load / kiln_context_*."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close
from executorch.exir import to_edge_transform_and_lower
from kiln import _graph, _ops
from kiln._engine import Engine
from kiln.executorch import KilnPartitioner
from kiln.executorch.backend import build_engine
from kiln_test_models import MLP, EncoderBlock, ResNet18


def _edge(model, args, dynamic_shapes=None):
    """The edge program of the single partition KilnPartitioner makes of a fully supported
    model (with Kiln's ops_to_not_decompose applied), as preprocess receives it."""
    import kiln.executorch.backend as backend

    seen = []
    real = backend.KilnBackend.preprocess

    def capture(edge_program, compile_specs):
        seen.append(edge_program)
        return real(edge_program, compile_specs)

    ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
    backend.KilnBackend.preprocess = staticmethod(capture)
    try:
        to_edge_transform_and_lower(ep, partitioner=[KilnPartitioner()])
    finally:
        backend.KilnBackend.preprocess = staticmethod(real)
    assert len(seen) == 1, f"{len(seen)} partitions"
    return seen[0]


@pytest.mark.parametrize(
    "make, shape, scale",
    [(MLP, (4, 32), 1), (EncoderBlock, (2, 8, 32), 10), (ResNet18, (1, 3, 32, 32), 10)],
)
def test_preprocess_graph_runs_in_c_runtime(make, shape, scale):
    model = make().eval()
    built, inputs, n_out = build_engine(_edge(model, (torch.randn(*shape),)))
    assert inputs == ["x"] and n_out == 1
    assert built.weights, "weights should be external named data"
    assert all(k.startswith("kiln-t-") for k, _ in built.weights)
    eng = Engine(built.engine, dict(built.weights), device="cpu")
    assert eng.device == "cpu"
    x = torch.randn(*shape)
    with torch.no_grad():
        assert_close(eng.run(x), [model(x)], scale=scale)


def test_builds_are_deterministic():
    model = MLP().eval()
    edge = _edge(model, (torch.randn(2, 32),))
    a, _, _ = build_engine(edge)
    b, _, _ = build_engine(edge)
    assert a.engine == b.engine and a.weights == b.weights


def test_missing_external_weight_is_a_kiln_error():
    model = MLP().eval()
    built, _, _ = build_engine(_edge(model, (torch.randn(2, 32),)))
    import kiln

    with pytest.raises(kiln.KilnMissingDataError):
        Engine(built.engine, {}, device="cpu")


def test_dynamic_ranges_reach_the_engine():
    model = MLP().eval()
    b = torch.export.Dim("b", min=1, max=9)
    built, _, _ = build_engine(_edge(model, (torch.randn(3, 32),), ({0: b},)))
    eng = Engine(built.engine, dict(built.weights))
    assert eng.inputs[0]["dim_min"] == [1, 32] and eng.inputs[0]["dim_max"] == [9, 32]
    for n in (1, 9):
        x = torch.randn(n, 32)
        with torch.no_grad():
            assert_close(eng.run(x), [model(x)])
    import kiln

    with pytest.raises(kiln.KilnShapeError):
        eng.run(torch.randn(10, 32))


def test_graph_wrapper_reports_kiln_errors():
    g = _graph.Graph()
    x = g.add_input("x", _ops.DTYPE_F32, [2, 3], [2, 3])
    w = g.add_constant("w", torch.randn(4, 5))
    import kiln

    with pytest.raises(kiln.KilnError, match="linear"):
        g.add_node("linear", [x, w])
    (y,) = g.add_node("relu", [x])
    assert g.value_info(y) == (_ops.DTYPE_F32, [2, 3], [2, 3])
    with pytest.raises(KeyError, match="no attribute 'bogus'"):
        g.add_node("softmax", [x], {"bogus": 1})
    g.close()
