"""The integer-program placement solver (``search/milp.py``) without compilers, on mock costs: equal to a
brute force over every acyclic exact cover on small random graphs, never worse than the DP, acyclic by
its cuts, the DP's reading of unknown and invalid costs, windows on a 200-op chain, the time limit."""

from __future__ import annotations

import math
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collage_mlir.backends import Candidate
from collage_mlir.plan import Plan
from collage_mlir.search.cost import Cost, MockEstimator, _unit, plan_cost
from collage_mlir.search.dp import optimize
from collage_mlir.search.index import CandidateIndex, SearchGraph
from collage_mlir.search.milp import MilpOptions, exact_plan, solve

from models import brute_force_cost, random_search_case

pytestmark = pytest.mark.fast  # no compiler, engine or worker process: `pytest -m fast`

BACKENDS = ("lib", "engine", "gpu")
FAR = 1e9  # a deadline that is never reached


def random_case(seed: int, n: int, backends: tuple[str, ...] = BACKENDS, default_regions: bool = True):
    """A random DAG of ``n`` ops and random convex candidates of up to 5 ops on ``backends``, some of two
    disconnected pieces (what makes cycles possible), a few on the default backend where ``default_regions``
    (a plan cannot hold those as regions: its ops run alone there)."""
    return random_search_case(seed, n, backends, first_id=200, density=0.35, candidates_per_op=4, max_grow=5,
                              disconnected=0.2, default_backend="iree-cpu" if default_regions else None)


def estimator(graph: SearchGraph, seed: int, **kw) -> MockEstimator:
    return MockEstimator(seed, graph.order, graph.out_bytes, producers=graph.producers, **kw)


def cost_of(plan: Plan, graph: SearchGraph, est) -> float:
    return plan_cost(plan, graph.order, graph.producers, graph.out_bytes, est, graph.constant)


def assert_valid(result, graph: SearchGraph) -> None:
    """Acyclic, every op covered exactly once by the chosen candidates, regions = the non-default ones."""
    ops = [op for c, _ in result.chosen for op in c.ops]
    assert sorted(ops) == sorted(graph.order)
    assert graph.acyclic(r.ops for r in result.plan.regions)
    assert {r.key for r in result.plan.regions} == {c.key for c, _ in result.chosen if c.backend != "iree-cpu"}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(6, 10), backends=st.integers(2, 3))
def test_milp_equals_brute_force_cost(seed, n, backends):
    graph, index = random_case(seed, n, BACKENDS[:backends])
    est = estimator(graph, seed)
    result = solve(index, est, FAR)
    expected = brute_force_cost(index, est)
    assert result.proved and result.windows == 1
    assert math.isclose(result.cost_s, expected, rel_tol=1e-9), (result.cost_s, expected)
    assert math.isclose(cost_of(result.plan, graph, est), expected, rel_tol=1e-9)
    assert_valid(result, graph)


@pytest.mark.parametrize("seed", range(12))
def test_never_worse_than_the_dp(seed):
    graph, index = random_case(seed, 14)  # above what the brute force enumerates quickly
    est = estimator(graph, seed)
    for dp in (optimize(index, est), optimize(index, est, exact=False)):
        result = exact_plan(index, est, 30.0, dp=dp)
        assert result.milp_cost_s <= cost_of(dp.plan, graph, est) * (1 + 1e-9)
        # The DP's plan priced as a plan (a default-backend region it took is its ops alone there).
        assert math.isclose(result.dp_cost_s, cost_of(dp.plan, graph, est), rel_tol=1e-9)
        assert result.cost_s == min(result.milp_cost_s, result.dp_cost_s) and result.proved
        assert math.isclose(cost_of(result.plan, graph, est), result.cost_s, rel_tol=1e-9)
        assert_valid(result, graph)


class Table(MockEstimator):
    """Region costs from a table (default: an op alone on iree-cpu costs 1), transitions 0."""

    def __init__(self, graph: SearchGraph, table: dict):
        super().__init__(0, graph.order, graph.out_bytes, producers=graph.producers)
        self.table = table

    def region_costs(self, regions):
        return [self.table.get((r.backend, r.ops), Cost.known(1.0) if r.backend == "iree-cpu" else
                               Cost.invalid("not in the table")) for r in regions]

    def transition_cost(self, src, dst, nbytes):
        return Cost.known(0.0)


def test_a_cheaper_cyclic_pair_is_cut():
    """a1 → b2 and a2 → b1: {a1, b1} and {a2, b2} are each convex and cheap, but feed each other; the
    optimum takes one of them and leaves the other two ops alone (cost 0.1 + 2), after a cut."""
    graph = SearchGraph([1, 2, 3, 4], {1: (), 2: (), 3: (2,), 4: (1,)}, {i: 64 for i in range(1, 5)})
    r1, r2 = frozenset({1, 3}), frozenset({2, 4})
    index = CandidateIndex(graph, [Candidate("lib", "test", r1), Candidate("lib", "test", r2)])
    est = Table(graph, {("lib", r1): Cost.known(0.1), ("lib", r2): Cost.known(0.1)})
    assert not graph.acyclic([r1, r2])
    result = solve(index, est, FAR)
    assert result.cuts == 1 and result.solves == 2 and result.proved
    assert math.isclose(result.cost_s, 2.1) and math.isclose(result.cost_s, brute_force_cost(index, est))
    assert_valid(result, graph)


class Partial(MockEstimator):
    """The mock's costs, but a fixed fifth of the regions unknown (budget spent), ops alone included."""

    def region_costs(self, regions):
        known = super().region_costs(regions)
        return [Cost.unknown("budget") if _unit(self.seed, "unknown", sorted(r.ops), r.backend) < 0.2 else c
                for r, c in zip(regions, known)]


@pytest.mark.parametrize("seed", range(8))
def test_unknown_and_invalid_costs_read_as_the_dp_reads_them(seed):
    """Unknown: not chosen, except an op alone on the default backend, free; invalid: not chosen. (No
    default-backend region of several ops: the DP prices one as a region, a plan as its ops alone.)"""
    graph, index = random_case(seed, 12, default_regions=False)
    est = Partial(seed, graph.order, graph.out_bytes, producers=graph.producers, invalid_rate=0.3)
    dp = optimize(index, est, exact=True)
    result = solve(index, est, FAR)
    assert math.isclose(result.cost_s, dp.cost_s, rel_tol=1e-9, abs_tol=1e-15)
    for c, cost in result.chosen:
        assert cost.usable or (c.backend == "iree-cpu" and len(c.ops) == 1 and cost.kind.value == "unknown")
    # Given the DP's costs it asks nothing new.
    before = len(est.asked)
    again = solve(index, est, FAR, costs=dp.costs)
    assert len(est.asked) == before and again.cost_s <= dp.cost_s * (1 + 1e-9)


def chain(n: int, seed: int):
    """``n`` ops in a line, every run of 2-4 ops a candidate on each of three backends."""
    graph = SearchGraph(list(range(n)), {i: (i - 1,) if i else () for i in range(n)},
                        {i: (64, 4096, 65536)[i % 3] for i in range(n)})
    rng = random.Random(seed)
    cands = [Candidate(b, "test", frozenset(range(i, i + k))) for i in range(n) for k in (1, 2, 3, 4)
             for b in BACKENDS if i + k <= n and rng.random() < 0.7]
    return graph, CandidateIndex(graph, cands)


def test_a_200_op_chain_is_solved_in_windows_and_equals_the_exact_dp():
    graph, index = chain(200, 5)
    est = estimator(graph, 5)
    dp = optimize(index, est, exact=True)  # exact on a chain at any length: a covered set is a prefix
    result = solve(index, est, time.monotonic() + 60, options=MilpOptions(window=64, overlap=16))
    assert result.windows > 1 and not result.proved
    assert result.seconds < 20  # a few seconds alone; the bound is for a loaded 2-core machine
    assert math.isclose(result.cost_s, dp.cost_s, rel_tol=1e-9), (result.cost_s, dp.cost_s)
    assert math.isclose(cost_of(result.plan, graph, est), result.cost_s, rel_tol=1e-9)
    assert_valid(result, graph)


def test_the_time_limit_holds_and_a_plan_always_comes_out():
    graph, index = random_case(11, 150)
    est = estimator(graph, 11)
    dp = optimize(index, est)
    for limit in (0.0, 0.5):
        t0 = time.monotonic()
        result = exact_plan(index, est, limit, dp=dp, options=MilpOptions(window=40, overlap=10))
        assert time.monotonic() - t0 < limit + 2.0  # one solve's set-up past the limit at most
        assert result.cost_s == min(result.milp_cost_s, result.dp_cost_s) and math.isfinite(result.cost_s)
        assert math.isclose(cost_of(result.plan, graph, est), result.cost_s, rel_tol=1e-9)
        assert_valid(result, graph)
    # Nothing solved: every op alone on the default backend.
    spent = solve(index, est, time.monotonic() - 1, options=MilpOptions(window=40, overlap=10))
    assert spent.solves == 0 and not spent.plan.regions and not spent.proved
