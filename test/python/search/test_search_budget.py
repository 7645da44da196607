"""The search at scale, without compilers: the DP stays bounded on a graph whose frontier labels used to
multiply its states, and finishes as Collage's DP once the deadline has passed; structurally equal
regions of one model share one cost-DB row; a spent deadline measures nothing; maximal regions grown
with bit sets equal the rule spelled out; transitions between two engines are priced through the
default backend from the DB's probes."""

from __future__ import annotations

import time

import pytest

from collage_mlir.backends import Candidate, RegionKey, get_backend
from collage_mlir.graph import Graph
from collage_mlir.ir import new_context
from collage_mlir.measure import HARNESS_VERSION
from collage_mlir.measure.db import CostDB, Measurement, Transition
from collage_mlir.measure.device import device_fingerprint
from collage_mlir.measure.extract import extract_region
from collage_mlir.measure import harness
from collage_mlir.measure.harness import MeasureOptions, measure_regions
from collage_mlir.passes.number_ops import NumberOpsPass
from collage_mlir.search.cost import Cost, MockEstimator, plan_cost
from collage_mlir.search.dp import EXACT_MAX_OPS, SPENT, DpLimits, optimize
from collage_mlir.search.index import CandidateIndex, SearchGraph
from collage_mlir.search.measured import PROBE_SIZES, MeasuredEstimator
from collage_mlir.search.regions import maximal_regions

from models import two_blocks

pytestmark = pytest.mark.fast  # no compiler, engine or worker process: `pytest -m fast`

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
            regions += [Candidate(b, "test", ops) for b in BACKENDS
                        for ops in (frozenset({x}), frozenset({y}), frozenset({x, y}))]
        j = len(ids)
        producers[j] = tuple(outs)
        ids.append(j)
        regions += [Candidate(b, "test", frozenset({j})) for b in BACKENDS]
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


def test_repeated_blocks_share_one_row_by_structure(tmp_path):
    module, graph, blocks = two_blocks()
    first, second = (extract_region(graph, b) for b in blocks)
    assert first.hash == second.hash  # weights are not in the key: a region's time does not depend on them
    db = CostDB(tmp_path / "costs.sqlite")
    backend = get_backend("iree-cpu")
    device, _ = device_fingerprint()
    db.put(Measurement(first.hash, backend.name, backend.version(), device, HARNESS_VERSION, "ok", median_s=1e-5))
    summary = measure_regions(module, [RegionKey("iree-cpu", b) for b in blocks], db)
    assert summary.cache_hits == 2 and summary.measured == 0
    assert {k: m.median_s for k, m in summary.rows.items()} == {RegionKey("iree-cpu", b): 1e-5 for b in blocks}


def test_spent_deadline_measures_nothing_and_records_nothing(tmp_path, monkeypatch):
    module, _, blocks = two_blocks()
    # No values captured yet (another test may have measured this very module in this process, and a
    # capture already done would rightly let the second case build).
    monkeypatch.setattr(harness, "_CAPTURED", {"key": None, "values": {}, "exact": {}})
    db = CostDB(tmp_path / "costs.sqlite")
    # Past the deadline; and before it, but too close for the whole-model capture the builds need.
    for options in (MeasureOptions(deadline=time.monotonic() - 1),
                    MeasureOptions(deadline=time.monotonic() + 600, capture_s=3600)):
        summary = measure_regions(module, [RegionKey("iree-cpu", b) for b in blocks], db, options=options)
        assert summary.rows == {} and summary.measured == 0
        assert db.measurements() == []  # a budget-skipped pair is no failure row: a later tune measures it


def _naive_maximal(graph: Graph, backend) -> list[frozenset[int]]:
    """The maximal-region rule spelled out with ``Graph.is_convex`` on every try (what the bit-set
    growth in ``regions.py`` must equal)."""
    order = graph.topological_order()
    pos = {op: k for k, op in enumerate(order)}
    ok = {i for i, n in graph.nodes.items() if backend.supports(n.op) is None}
    taken, regions = set(), []
    for anchor in order:
        if anchor not in ok or anchor in taken:
            continue
        region = {anchor}
        while True:
            near = sorted({n for i in region for n in (*graph.users(i), *graph.producers(i))
                           if n in ok and n not in taken} - region, key=pos.__getitem__)
            nxt = next((n for n in near if graph.is_convex(region | {n})), None)
            if nxt is None:
                break
            region.add(nxt)
        r = frozenset(region)
        if len(r) >= 2 and backend.accepts(graph, r) is None and graph.regions_acyclic([*regions, r]):
            regions.append(r)
            taken |= r
    return regions


def test_maximal_regions_equal_the_rule_spelled_out():
    from collage_mlir import zoo

    module = zoo.import_stablehlo("dcgan", new_context(), small=True)
    NumberOpsPass().run(module)
    graph = Graph(module)
    for name in ("ort", "openvino"):
        backend = get_backend(name)
        assert maximal_regions(graph, backend) == _naive_maximal(graph, backend)


def test_transitions_between_two_engines_are_priced_through_the_default(tmp_path):
    """Only the default backend's pairs are in the DB and the budget is spent: the fit reads them, probes
    nothing, and prices engine → engine as leaving through the default backend and entering from it."""
    module, _, _ = two_blocks()
    db = CostDB(tmp_path / "costs.sqlite")
    device, _ = device_fingerprint()
    backends = [get_backend(n) for n in ("iree-cpu", "onednn", "ort")]
    line = {("iree-cpu", "onednn"): (2e-6, 1e-10), ("onednn", "iree-cpu"): (3e-6, 2e-10),
            ("iree-cpu", "ort"): (5e-6, 4e-10), ("ort", "iree-cpu"): (7e-6, 8e-10)}
    for (a, b), (fixed, per_byte) in line.items():
        for n in PROBE_SIZES:
            nbytes = n * n * 4
            db.put_transition(Transition(a, b, get_backend(a).version(), get_backend(b).version(), device,
                                         HARNESS_VERSION, nbytes, "ok", fixed + per_byte * nbytes))
    est = MeasuredEstimator(module, backends, db, tmp_path, deadline=time.monotonic() - 1)
    est.fit_transitions()
    assert db.measurements() == []  # nothing measured: every probe came from the DB or was skipped
    for (a, b), (fixed, per_byte) in line.items():
        assert abs(est.transition_cost(a, b, 1000).seconds - (fixed + per_byte * 1000)) < 1e-12
    through = est.transition_cost("onednn", "ort", 1000)
    assert through.usable and abs(through.seconds - (3e-6 + 2e-10 * 1000 + 5e-6 + 4e-10 * 1000)) < 1e-12


class _SeedEstimator:
    """What ``_time_seeds`` asks of a MeasuredEstimator: seeds ``built`` by the prebuild, ``known`` in the DB."""

    default_backend = "iree-cpu"

    def __init__(self, built: set[str], known: set[str]):
        self.built, self.known, self.timed = built, known, []

    def prebuild(self, plans, tag, deadline, required=()):
        self.required = [p.default_backend for p in required if not p.regions]
        return {p.key: 1.0 for p in plans if (p.regions[0].backend if p.regions else p.default_backend) in self.built}

    def plan_known(self, plan, tag=""):
        return any(r.backend in self.known for r in plan.regions)

    def plan_time(self, plan, tag=""):
        self.timed.append(plan.regions[0].backend if plan.regions else plan.default_backend)
        return Cost.known(1e-3)


@pytest.mark.fast
def test_seeds_built_or_known_are_timed_past_the_deadline():
    """The seeds' builds ran past the deadline: every engine's seed that was built or is in the DB is still
    timed (the anytime plan: a ResNet-50 tune of 120 s returned IREE alone, 25x slower than OpenVINO alone,
    whose seed was built); a seed neither built nor known is not built. The default seed is timed last, and
    past the deadline only where no other seed was timed (IREE alone on ResNet-50: 13 s of timing)."""
    from collage_mlir.plan import Plan, Region
    from collage_mlir.search.tune import _build_seeds, _time_seeds

    def _seeds(single, backends, est, deadline, fallback=True):
        return _time_seeds(single, backends, est, deadline, lambda *a: None,
                           _build_seeds(single, backends, est, time.monotonic(), deadline, lambda *a: None, fallback),
                           fallback)

    names = ["iree-cpu", "openvino", "ort", "onednn"]
    single = {n: Plan([] if n == "iree-cpu" else [Region(n, n, frozenset({0}))], "iree-cpu") for n in names}
    est = _SeedEstimator(built={"iree-cpu", "openvino"}, known={"onednn"})
    walls, costs = _seeds(single, [get_backend(n) for n in names], est, time.monotonic() - 1)
    # The default seed last: past the deadline it is left untimed where another seed was timed.
    assert est.timed == ["openvino", "onednn"] and set(costs) == {"openvino", "onednn"}
    assert est.required == ["iree-cpu"]  # the reference's build is never stopped by the deadline
    # Before the deadline too, a seed the builds did not reach is not built now (one whole-model build
    # started then ran a 120 s tune of BERT-base to 172 s).
    est = _SeedEstimator(built={"iree-cpu"}, known=set())
    _seeds(single, [get_backend(n) for n in names], est, time.monotonic() + 600)
    assert est.timed == ["iree-cpu"]
    est = _SeedEstimator(built={"iree-cpu"}, known=set())  # past the deadline, nothing else: the default
    _seeds(single, [get_backend(n) for n in names], est, time.monotonic() - 1)
    assert est.timed == ["iree-cpu"]
    # Where the DB holds a usable seed the default is no fallback: its build stops at the deadline like
    # the others', and unbuilt it is not built to be timed (a search again of MobileNetV2 with 10 s built
    # IREE alone for 45 s with OpenVINO's plan in the DB).
    est = _SeedEstimator(built=set(), known={"openvino"})
    _seeds(single, [get_backend(n) for n in names], est, time.monotonic() + 600, fallback=False)
    assert est.required == [] and est.timed == ["openvino"]


DEAD = """func.func @main(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %c = stablehlo.constant dense<true> : tensor<i1>
  %0 = stablehlo.tanh %x : tensor<8x8xf32>
  %1 = stablehlo.exponential %0 : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
"""


def test_dead_ops_cost_nothing(tmp_path):
    """An op nothing uses (a constant refinement left, an unused exponential) is dropped by every compiler:
    alone it costs 0, as a folded constant does, so the DP can cover it (it was invalid, and a 3-bucket tune
    of a jax.export CNN ended in "no plan covers every op")."""
    from collage_mlir.graph import number_ops
    from collage_mlir.ir import parse_module

    module = parse_module(DEAD, new_context())
    number_ops(module)
    names = {n.op.name: i for i, n in Graph(module).nodes.items()}
    est = MeasuredEstimator(module, [get_backend("iree-cpu")], CostDB(tmp_path / "costs.sqlite"), tmp_path)
    dead = [RegionKey("iree-cpu", frozenset({names[n]})) for n in ("stablehlo.constant", "stablehlo.exponential")]
    assert [(c.usable, c.seconds) for c in est.region_costs(dead)] == [(True, 0.0), (True, 0.0)]
