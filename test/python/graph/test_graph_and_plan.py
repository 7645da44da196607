"""Graph ids and convexity, plan validation, candidate enumeration and the backend registry."""

from __future__ import annotations

import numpy as np
import pytest

from collage_mlir import backends
from collage_mlir.backends import Backend, BackendKind, Candidate, RegionKey, get_backend
from collage_mlir.errors import CollageError
from collage_mlir.graph import Graph
from collage_mlir.ir import load_module, new_context, parse_module
from collage_mlir.passes.number_ops import NumberOpsPass
from collage_mlir.plan import Plan, Region
from collage_mlir.search.candidates import enumerate_candidates

from helpers import LIT_INPUTS

pytestmark = pytest.mark.fast  # no compiler, engine or worker process: `pytest -m fast`

MLP = LIT_INPUTS / "mlp.mlir"

DIAMOND = """
func.func @d(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.negate %a : tensor<4xf32>
  %1 = stablehlo.abs %0 : tensor<4xf32>
  %2 = stablehlo.exponential %0 : tensor<4xf32>
  %3 = stablehlo.add %1, %2 : tensor<4xf32>
  return %3 : tensor<4xf32>
}
"""


def numbered(text: str | None = None) -> Graph:
    module = load_module(MLP, new_context()) if text is None else parse_module(text, new_context())
    NumberOpsPass().run(module)
    return Graph(module)  # the graph keeps its module alive


def test_ids_are_deterministic():
    a, b = numbered(), numbered()
    assert [(n.id, n.name) for n in a.nodes.values()] == [(n.id, n.name) for n in b.nodes.values()]
    assert a.topological_order() == list(range(7))
    assert a.producers(3) == [1, 2] and a.users(3) == [4]


def test_convexity():
    g = numbered(DIAMOND)
    assert g.is_convex({0, 1, 2, 3})
    assert g.is_convex({1, 2, 3})
    assert g.is_convex({0, 1})
    assert not g.is_convex({0, 3})  # 0 → 1 → 3 leaves and re-enters
    assert not g.is_convex(set())


def test_regions_acyclic_agrees_with_the_quotient_graph():
    """Collapsing regions to nodes: A → B → A between two regions is a cycle, whatever the split; checked
    against networkx's quotient on every pair of disjoint regions of the MLP and the diamond."""
    import itertools

    import networkx as nx

    g = numbered(DIAMOND)
    assert g.regions_acyclic([{0}, {1, 2, 3}]) and g.regions_acyclic([{0, 1}, {2, 3}])
    assert not g.regions_acyclic([{0, 3}, {1}])  # 0 → 1 → 3: the region feeds 1, which feeds it
    for graph in (g, numbered()):
        ops = sorted(graph.nodes)
        subsets = [set(c) for k in (1, 2, 3) for c in itertools.combinations(ops, k)]
        for a, b in itertools.combinations(subsets, 2):
            if a & b:
                continue
            label = {i: ("r", k) for k, r in enumerate((a, b)) for i in r}
            quotient = nx.DiGraph()
            quotient.add_nodes_from(label.get(i, i) for i in ops)
            quotient.add_edges_from((label.get(x, x), label.get(y, y)) for x, y in graph.dag.edges
                                    if label.get(x, x) != label.get(y, y))
            assert graph.regions_acyclic([a, b]) == nx.is_directed_acyclic_graph(quotient), (a, b)


def test_candidates_cover_onednn_chain():
    g = numbered()
    found = {(c.backend, c.pattern, c.ops) for c in enumerate_candidates(g, [get_backend("onednn")])}
    assert ("onednn", "matmul", frozenset({1})) in found
    assert ("onednn", "matmul", frozenset({1, 2, 3})) in found  # + bias (with its broadcast)
    assert ("onednn", "matmul", frozenset({1, 2, 3, 4})) in found  # + relu
    assert ("onednn", "matmul", frozenset({5})) in found


def test_candidate_region_and_plan_keys_are_values():
    c = Candidate("onednn", "matmul", frozenset({1, 2}))
    assert c.key == RegionKey("onednn", frozenset({2, 1})) == Region("r", "onednn", frozenset({1, 2})).key
    # One order everywhere: by backend, then by sorted op ids.
    keys = [RegionKey("ort", frozenset({1})), RegionKey("onednn", frozenset({2, 3})),
            RegionKey("onednn", frozenset({1, 5}))]
    assert sorted(keys) == [keys[2], keys[1], keys[0]]
    # A plan's key is its default backend and regions: not their names, order or the plan's source.
    a = Plan([Region("r0", "onednn", frozenset({3, 4})), Region("r1", "ort", frozenset({7}))])
    b = Plan([Region("x", "ort", frozenset({7})), Region("y", "onednn", frozenset({4, 3}))], source="other")
    assert a.key == b.key and len({a.key, b.key}) == 1
    assert a.key != Plan(a.regions[:1]).key and a.key != Plan(a.regions, default_backend="other").key
    assert sorted([a.key, Plan().key]) == [Plan().key, a.key]


def test_validate_accepts_and_rejects():
    g = numbered()
    Plan([Region("a", "onednn", frozenset({1, 2, 3, 4})), Region("b", "iree-cpu", frozenset({5, 6}))]).validate(g)
    with pytest.raises(CollageError, match="cannot take it"):
        Plan([Region("a", "onednn", frozenset({1, 3}))]).validate(g)
    with pytest.raises(CollageError, match="duplicate region name"):
        Plan([Region("a", "iree-cpu", frozenset({5})), Region("a", "iree-cpu", frozenset({6}))]).validate(g)
    with pytest.raises(CollageError, match="not a collage plan"):
        Plan.from_json({"regions": []})


def test_registry_takes_plugins_from_entry_points(monkeypatch):
    class FakeEntryPoint:
        name, value = "toy", "toy_pkg:ToyBackend"

        def load(self):
            class ToyBackend(Backend):
                name = "toy"
                kind = BackendKind.LIBRARY

            return ToyBackend

    real = backends.entry_points
    monkeypatch.setattr(backends, "entry_points", lambda group: [*real(group=group), FakeEntryPoint()])
    backends.registry.cache_clear()
    try:
        assert get_backend("toy").kind is BackendKind.LIBRARY
        assert "onednn" in backends.registry()
    finally:
        backends.registry.cache_clear()


def test_constant_values_keep_the_ir_element_type():
    """A splat constant reads back with its tensor's dtype (was float64/int64 whatever the type), also
    through a constant expression's convert and broadcast."""
    from collage_mlir.dialects import stablehlo as sh

    text = """func.func @main() -> (tensor<2xf32>, tensor<i32>, tensor<2x3xf16>) {
      %a = stablehlo.constant dense<1.5> : tensor<2xf32>
      %b = stablehlo.constant dense<3> : tensor<i32>
      %c = stablehlo.constant dense<0.25> : tensor<f32>
      %d = stablehlo.convert %c : (tensor<f32>) -> tensor<f16>
      %e = stablehlo.broadcast_in_dim %d, dims = [] : (tensor<f16>) -> tensor<2x3xf16>
      return %a, %b, %e : tensor<2xf32>, tensor<i32>, tensor<2x3xf16>
    }"""
    with new_context() as ctx:
        module = parse_module(text, ctx)
        ops = list(module.body.operations[0].regions[0].blocks[0].operations)
        a, b = sh.constant_value(ops[0]), sh.constant_value(ops[1])
        e = sh.const_expr_value(ops[4].results[0])
    assert (a.dtype, a.tolist()) == (np.float32, [1.5, 1.5])
    assert (b.dtype, b.tolist()) == (np.int32, 3)
    assert (e.dtype, e.shape, float(e[1, 2])) == (np.float16, (2, 3), 0.25)
