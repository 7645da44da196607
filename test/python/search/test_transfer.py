"""A plan carried between shape buckets (``search.transfer``): ops matched across a fold that happens at one
shape only, regions kept where still valid; a carried plan seeds a tune beside the single-backend plans
and stands as a challenger, not as the incumbent it must beat."""

from __future__ import annotations

import pytest

from collage_mlir.graph import Graph, number_ops
from collage_mlir.ir import new_context
from collage_mlir.plan import Plan, Region

jax = pytest.importorskip("jax")
jnp = jax.numpy


MLP = """func.func @main(%x: tensor<64x64xf32>, %w: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  %1 = stablehlo.logistic %0 : tensor<64x64xf32>
  %2 = stablehlo.dot_general %1, %w, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  return %2 : tensor<64x64xf32>
}
"""


def centred(x, w):
    """At batch 1 the broadcast of the batch mean back to the batch is the identity, and is folded."""
    h = jnp.tanh(x @ w)
    return jax.nn.relu(h - jnp.broadcast_to(h.mean(0, keepdims=True), h.shape)) @ w


def bucket_graphs(tmp_path) -> dict[int, Graph]:
    from collage_mlir.frontends.refine import load

    b, = jax.export.symbolic_shape("b")
    exported = jax.export.export(jax.jit(centred))(jax.ShapeDtypeStruct((b, 16), jnp.float32),
                                                   jax.ShapeDtypeStruct((16, 16), jnp.float32))
    (tmp_path / "centred.mlir").write_text(exported.mlir_module())
    graphs = {}
    for batch in (1, 4):
        module = load(tmp_path / "centred.mlir", new_context(), {"b": batch})
        number_ops(module)
        graphs[batch] = Graph(module)
    return graphs


def names(graph: Graph, ops) -> list[str]:
    return [graph.nodes[i].name.removeprefix("stablehlo.") for i in sorted(ops)]


@pytest.mark.fast
def test_a_plan_carried_across_a_fold_keeps_its_regions(tmp_path):
    from collage_mlir.search.transfer import op_sequence, transfer

    graphs = bucket_graphs(tmp_path)
    four, one = graphs[4], graphs[1]
    assert len(four.nodes) == len(one.nodes) + 1  # the batch broadcast
    head = next(i for i in sorted(four.nodes) if four.nodes[i].name == "stablehlo.subtract") - 1
    tail = frozenset(i for i in four.nodes if i >= head)
    assert names(four, tail) == ["broadcast_in_dim", "subtract", "broadcast_in_dim", "maximum", "dot_general"]
    plan = Plan([Region("mm", "ort", frozenset({2, 3})), Region("tail", "openvino", tail),
                 Region("bcast", "ort", frozenset({head}))], source="batch=4")
    carried = transfer(plan, op_sequence(four), one)
    carried.validate(one)
    # The tail lost the broadcast that batch 1 folds; the region of that broadcast alone is gone.
    assert [(r.name, r.backend, names(one, r.ops)) for r in carried.regions] == [
        ("mm", "ort", ["dot_general", "tanh"]),
        ("tail", "openvino", ["subtract", "broadcast_in_dim", "maximum", "dot_general"])]
    assert carried.source == "carried from batch=4"


def test_a_carried_plan_seeds_the_tune_as_a_challenger(tmp_path):
    from collage_mlir.backends import get_backend
    from collage_mlir.ir import parse_module
    from collage_mlir.measure.db import CostDB
    from collage_mlir.search.evolve import EvolveOptions
    from collage_mlir.search.tune import tune

    carried = Plan([Region("first", "ort", frozenset({0, 1}))], source="carried from x=1")
    with CostDB(tmp_path / "costs.sqlite") as db:
        result = tune(parse_module(MLP, new_context()), [get_backend("iree-cpu"), get_backend("ort")], db,
                      tmp_path / "work", budget_s=60, evolve_options=EvolveOptions(population=1, max_generations=0),
                      carried=[carried])
    finalists = {f.name: f for f in result.evolved.finalists}
    assert finalists["carried"].plan.key == carried.key
    assert result.evolved.incumbent.name in ("iree-cpu", "ort")
