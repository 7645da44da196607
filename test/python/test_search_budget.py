"""The search's bounds, without compilers: the DP stays bounded on a graph whose frontier labels used to
multiply its states, and finishes as Collage's DP once the deadline has passed; structurally equal
regions of one model share one cost-DB row; a spent deadline measures nothing."""

from __future__ import annotations

import time

from collage_mlir.backends import get_backend
from collage_mlir.graph import Graph
from collage_mlir.ir import new_context, parse_module
from collage_mlir.measure import HARNESS_VERSION
from collage_mlir.measure.db import CostDB, Measurement
from collage_mlir.measure.device import device_fingerprint
from collage_mlir.measure.extract import extract_region
from collage_mlir.measure.harness import MeasureOptions, measure_regions
from collage_mlir.passes.number_ops import NumberOpsPass
from collage_mlir.search.cost import MockEstimator
from collage_mlir.search.dp import EXACT_MAX_OPS, SPENT, DpLimits, optimize
from collage_mlir.search.index import CandidateIndex, SearchGraph, plan_cost

BACKENDS = ("a", "b", "c", "d", "e")


def wide_graph(layers: int, width: int):
    """``layers`` times: ``width`` parallel two-op branches from one op, joined by the next (an attention
    layer's shape). Every branch output is on the frontier at once with one of six backends as its
    label: 6**width label variants per covered set, which is what exploded BERT's states."""
    ids, producers, regions = [0], {0: ()}, []
    prev = 0
    for _ in range(layers):
        outs = []
        for _ in range(width):
            x, y = len(ids), len(ids) + 1
            producers[x], producers[y] = (prev,), (x,)
            ids += [x, y]
            outs.append(y)
            regions += [(b, ops, False) for b in BACKENDS for ops in (frozenset({x}), frozenset({y}), frozenset({x, y}))]
        j = len(ids)
        producers[j] = tuple(outs)
        ids.append(j)
        regions += [(b, frozenset({j}), False) for b in BACKENDS]
        prev = j
    graph = SearchGraph(ids, producers, {i: 4096 for i in ids})
    return graph, CandidateIndex(graph, regions)


def test_dp_is_bounded_where_labels_exploded_and_degrades_past_the_deadline():
    graph, index = wide_graph(layers=6, width=4)
    n = len(graph.order)
    assert n > EXACT_MAX_OPS
    unbounded = optimize(index, MockEstimator(1, graph.order, graph.out_bytes, producers=graph.producers),
                         limits=DpLimits(None, None))
    limits = DpLimits(labels_per_set=4, sets_per_size=16)
    results = [optimize(index, MockEstimator(1, graph.order, graph.out_bytes, producers=graph.producers), limits=limits),
               optimize(index, MockEstimator(1, graph.order, graph.out_bytes, producers=graph.producers),
                        limits=limits, deadline=time.monotonic() - 1)]  # spent before it starts
    bounds = [4 * 16 * (n + 1), SPENT.labels_per_set * SPENT.sets_per_size * (n + 1)]
    assert unbounded.states > bounds[0]  # what the beam is for: the states multiply without it
    est = MockEstimator(1, graph.order, graph.out_bytes, producers=graph.producers)
    for result, bound in zip(results, bounds):
        assert result.states <= bound
        assert result.cost_s >= unbounded.cost_s * (1 - 1e-9)  # a beam never finds below the full DP
        # A valid plan that costs what it says.
        assert graph.acyclic(r.ops for r in result.plan.regions)
        assert abs(plan_cost(result.plan, graph.order, graph.producers, graph.out_bytes, est) - result.cost_s) \
            <= 1e-9 * result.cost_s


TWO_BLOCKS = """func.func @main(%x: tensor<16x16xf32>) -> tensor<16x16xf32> {
  %w0 = stablehlo.constant dense<%W0%> : tensor<16x16xf32>
  %w1 = stablehlo.constant dense<%W1%> : tensor<16x16xf32>
  %0 = stablehlo.dot_general %x, %w0, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %1 = stablehlo.tanh %0 : tensor<16x16xf32>
  %2 = stablehlo.dot_general %1, %w1, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %3 = stablehlo.tanh %2 : tensor<16x16xf32>
  return %3 : tensor<16x16xf32>
}
"""


def _two_blocks():
    """A model with two matmul+tanh blocks that differ only in their weights (256 elements each, beyond
    the structural hash's small-constant limit)."""
    def dense(f) -> str:
        return "[" + ", ".join("[" + ", ".join(f"{f(i, j):.4f}" for j in range(16)) + "]" for i in range(16)) + "]"

    w0, w1 = dense(lambda i, j: (i * 16 + j) / 256), dense(lambda i, j: -(i + j) / 32)
    module = parse_module(TWO_BLOCKS.replace("%W0%", w0).replace("%W1%", w1), new_context())
    NumberOpsPass().run(module)
    graph = Graph(module)
    by_name = lambda name: sorted(i for i, n in graph.nodes.items() if n.name == name)
    dots, tanhs = by_name("stablehlo.dot_general"), by_name("stablehlo.tanh")
    return module, graph, [frozenset({d, t}) for d, t in zip(dots, tanhs)]


def test_repeated_blocks_share_one_row_by_structure(tmp_path):
    module, graph, blocks = _two_blocks()
    first, second = (extract_region(graph, b) for b in blocks)
    assert first.hash == second.hash  # weights are not in the key: a region's time does not depend on them
    db = CostDB(tmp_path / "costs.sqlite")
    backend = get_backend("iree-cpu")
    device, _ = device_fingerprint()
    db.put(Measurement(first.hash, backend.name, backend.version(), device, HARNESS_VERSION, "ok", median_s=1e-5))
    summary = measure_regions(module, [(b, "iree-cpu") for b in blocks], db)
    assert summary.cache_hits == 2 and summary.measured == 0
    assert {k: m.median_s for k, m in summary.rows.items()} == {(b, "iree-cpu"): 1e-5 for b in blocks}


def test_spent_deadline_measures_nothing_and_records_nothing(tmp_path):
    module, _, blocks = _two_blocks()
    db = CostDB(tmp_path / "costs.sqlite")
    summary = measure_regions(module, [(b, "iree-cpu") for b in blocks], db,
                              options=MeasureOptions(deadline=time.monotonic() - 1))
    assert summary.rows == {} and summary.measured == 0
    assert db.measurements() == []  # a budget-skipped pair is no failure row: a later tune measures it
