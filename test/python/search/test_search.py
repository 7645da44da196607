"""The placement search without compilers: candidate index, operator-level DP against brute force on
random graphs (mock costs), evolutionary search determinism and its never-worse guarantee."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collage_mlir.backends import RegionKey
from collage_mlir.plan import Plan, Region
from collage_mlir.search.cost import Cost, CostKind, MockEstimator, TransitionFit, plan_cost
from collage_mlir.search.dp import optimize
from collage_mlir.search.index import CandidateIndex, SearchGraph

from models import brute_force_cost, random_search_case

pytestmark = pytest.mark.fast  # no compiler, engine or worker process: `pytest -m fast`

BACKENDS = ("lib", "engine")


def random_case(seed: int, n: int):
    """A random DAG of ``n`` ops and random convex connected candidates of up to 4 ops on two backends."""
    return random_search_case(seed, n, BACKENDS)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(1, 12))
def test_dp_equals_brute_force_cost(seed, n):
    graph, index = random_case(seed, n)
    est = MockEstimator(seed, graph.order, graph.out_bytes, producers=graph.producers)
    result = optimize(index, est)
    expected = brute_force_cost(index, est)
    assert math.isclose(result.cost_s, expected, rel_tol=1e-9), (result.cost_s, expected)
    # The plan it returns costs what it says, and is a valid plan (acyclic, each region a candidate).
    assert math.isclose(plan_cost(result.plan, graph.order, graph.producers, graph.out_bytes, est, graph.constant), expected,
                        rel_tol=1e-9)
    assert graph.acyclic(r.ops for r in result.plan.regions)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(1, 12))
def test_collage_rule_dp_is_valid_and_never_below_the_exact_one(seed, n):
    graph, index = random_case(seed, n)
    est = MockEstimator(seed, graph.order, graph.out_bytes, producers=graph.producers)
    exact, restricted = optimize(index, est, exact=True), optimize(index, est, exact=False)
    assert restricted.cost_s >= exact.cost_s * (1 - 1e-9)
    assert math.isclose(plan_cost(restricted.plan, graph.order, graph.producers, graph.out_bytes, est, graph.constant),
                        restricted.cost_s, rel_tol=1e-9)
    assert graph.acyclic(r.ops for r in restricted.plan.regions)


def test_dp_asks_costs_lazily_once():
    graph, index = random_case(7, 12)
    est = MockEstimator(7, graph.order, graph.out_bytes, producers=graph.producers)
    optimize(index, est)
    assert len(est.asked) == len(set(est.asked)) <= len(index)


def test_index_by_op():
    graph, index = random_case(3, 10)
    for op in graph.order:
        assert {c.key for c in index.candidates_at(op)} == {c.key for c in index.candidates if op in c.ops}
        assert all(c.first == op for c in index.starting_at(op))
        assert any(c.backend == index.default_backend and c.ops == {op} for c in index.candidates_at(op))


def test_cost_kinds_and_transition_fit():
    assert Cost.known(1.0).usable and not Cost.unknown("budget").usable
    assert Cost.invalid("wrong").kind is CostKind.INVALID and Cost.invalid("wrong").seconds == math.inf
    fit = TransitionFit.fit([(1000, 2e-6 + 1000 * 3e-10), (4000, 2e-6 + 4000 * 3e-10), (16000, 2e-6 + 16000 * 3e-10)])
    assert math.isclose(fit.fixed_s, 2e-6, rel_tol=1e-6) and math.isclose(fit.per_byte_s, 3e-10, rel_tol=1e-6)
    assert math.isclose(fit.at(8000), 2e-6 + 8000 * 3e-10, rel_tol=1e-6)
    # Probes that measured a pair faster than its two halves alone price no boundary below zero.
    negative = TransitionFit.fit([(16384, -55e-6), (262144, -80e-6)])
    assert negative.fixed_s < 0 and negative.at(16384) == 0.0 and negative.at(1 << 20) == 0.0


def _single_plans(index: CandidateIndex) -> list[tuple[str, Plan]]:
    """Per backend: the largest candidate at each op in topological order (disjoint, acyclic)."""
    g = index.graph
    plans = [("iree-cpu", Plan(source="iree-cpu"))]
    for backend in BACKENDS:
        taken: set[int] = set()
        regions: list[frozenset[int]] = []
        for op in g.order:
            for c in sorted(index.candidates_at(op), key=lambda c: -len(c.ops)):
                if c.backend == backend and not c.ops & taken and g.acyclic([*regions, c.ops]):
                    regions.append(c.ops)
                    taken |= c.ops
                    break
        plans.append((backend, Plan([Region(f"r{k}", backend, r) for k, r in enumerate(regions)], source=backend)))
    return plans


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_evolve_is_deterministic_and_never_worse_than_a_single_backend(seed):
    from collage_mlir.search.evolve import EvolveOptions, evolve

    graph, index = random_case(seed, 12)
    allowed = {c.key for c in index.candidates}
    accepts = lambda b, ops: b == index.default_backend or RegionKey(b, ops) in allowed  # noqa: E731
    docs, results = [], []
    for _ in range(2):
        est = MockEstimator(seed, graph.order, graph.out_bytes, producers=graph.producers, nonadditive=0.5)
        seeds = [*_single_plans(index), ("dp", optimize(index, est).plan)]
        result = evolve(graph, seeds, ["iree-cpu", *BACKENDS], accepts, est,
                        EvolveOptions(seed=seed, population=16, max_generations=6))
        docs.append(repr(result.plan.to_json()))
        results.append(result)
    assert docs[0] == docs[1]
    result = results[0]
    singles = [est.plan_time(p).seconds for name, p in _single_plans(index)]
    assert result.chosen.median_s <= min(singles)
    assert graph.acyclic(r.ops for r in result.plan.regions)
    assert all(accepts(r.backend, r.ops) for r in result.plan.regions)


def test_near_tied_single_backends_are_settled_over_the_rounds():
    """Two single-backend seeds 2 % apart in their one seed timing are both re-timed in the finalists'
    rounds, and the incumbent is the faster over those rounds, not the faster seed; a backend 50 %
    behind is not re-timed."""
    from collage_mlir.search.evolve import EvolveOptions, evolve

    graph = SearchGraph([0, 1], {0: (), 1: (0,)}, {0: 64, 1: 64})
    seeds = [(b, Plan([Region("region_0", b, frozenset({0, 1}))], source=b)) for b in ("a", "b", "c")]
    seed_s = {"a": 1.00, "b": 1.02, "c": 1.5}
    round_s = {"a": 1.2, "b": 1.0, "c": 1.5}

    class Rounds(MockEstimator):
        def plan_time(self, plan, tag=""):
            self.plans_timed += 1
            backend = plan.regions[0].backend if plan.regions else "iree-cpu"
            if backend == "iree-cpu":
                return Cost.known(9.0, spread=0.01)
            self.tags.append((backend, tag))
            return Cost.known((seed_s if tag == "seed" else round_s)[backend], spread=0.01)

    est = Rounds(0, graph.order, graph.out_bytes, producers=graph.producers)
    est.tags = []
    result = evolve(graph, seeds, ["iree-cpu", "a", "b", "c"], lambda b, ops: True, est,
                    EvolveOptions(population=3, max_generations=0))
    assert result.incumbent.name == "b" and result.plan.regions[0].backend == "b"
    assert {b for b, tag in est.tags if tag.startswith("final")} == {"a", "b"}


def test_the_runner_up_single_backend_is_always_re_timed():
    """The second-fastest single-backend seed is a finalist even when its seed timing is outside the
    "close" band: a fastest seed's one timing can be luck (a JAX text CNN: OpenVINO 0.96 ms as a seed,
    2.14 ms over the rounds; ORT 1.16 ms, 21 % behind, never re-timed). The third is not."""
    from collage_mlir.search.evolve import EvolveOptions, evolve

    graph = SearchGraph([0, 1], {0: (), 1: (0,)}, {0: 64, 1: 64})
    seeds = [(b, Plan([Region("region_0", b, frozenset({0, 1}))], source=b)) for b in ("a", "b", "c")]
    seed_s, round_s = {"a": 0.96, "b": 1.16, "c": 1.5}, {"a": 2.14, "b": 1.16, "c": 1.5}
    timed = []

    class Rounds(MockEstimator):
        def plan_time(self, plan, tag=""):
            backend = plan.regions[0].backend if plan.regions else "iree-cpu"
            if backend == "iree-cpu":
                return Cost.known(9.0, spread=0.01)
            timed.append((backend, tag))
            return Cost.known((seed_s if tag == "seed" else round_s)[backend], spread=0.01)

    est = Rounds(0, graph.order, graph.out_bytes, producers=graph.producers)
    result = evolve(graph, seeds, ["iree-cpu", "a", "b", "c"], lambda b, ops: True, est,
                    EvolveOptions(population=3, max_generations=0))
    assert {b for b, tag in timed if tag.startswith("final")} == {"a", "b"}
    assert result.incumbent.name == "b" and result.plan.regions[0].backend == "b"


def test_a_finalists_round_that_would_end_past_the_budget_does_not_start():
    """The estimator's guess of a round (``retime_s`` per finalist) past ``final_deadline``: no round starts
    and the seed timings decide; with time for it, rounds run."""
    from collage_mlir.search.evolve import EvolveOptions, evolve

    graph = SearchGraph([0, 1], {0: (), 1: (0,)}, {0: 64, 1: 64})
    seeds = [(b, Plan([Region("region_0", b, frozenset({0, 1}))], source=b)) for b in ("a", "b")]
    tags = []

    class Tagged(MockEstimator):
        def plan_time(self, plan, tag=""):
            tags.append(tag)
            return Cost.known(1.0 if plan.regions and plan.regions[0].backend == "a" else 2.0, spread=0.01)

        def retime_s(self, seconds, plan=None):
            return 10 * seconds

    est = Tagged(0, graph.order, graph.out_bytes, producers=graph.producers)
    late = EvolveOptions(population=2, max_generations=0, final_deadline=time.monotonic() + 25.0)
    result = evolve(graph, seeds, ["iree-cpu", "a", "b"], lambda b, ops: True, est, late)
    assert not [t for t in tags if t.startswith("final")] and result.plan.regions[0].backend == "a"
    soon = EvolveOptions(population=2, max_generations=0, final_deadline=time.monotonic() + 60.0)
    evolve(graph, seeds, ["iree-cpu", "a", "b"], lambda b, ops: True, est, soon)
    assert [t for t in tags if t.startswith("final")]
