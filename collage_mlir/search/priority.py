"""The order region costs are measured in, so a budget that cannot pay for every candidate spends
itself where the plan is decided: first every op alone on the default backend (the incumbent's costs,
and what the DP falls back on), then the candidates holding the ops that are most expensive there
(convolutions and large matmuls before glue), smaller regions before larger ones at the same op. The
graph engines' maximal regions come last: the single-backend seed plans, timed whole before any region,
already measured them (a whole-model region costs a whole-model build)."""

from __future__ import annotations

from typing import Sequence

from .cost import CostEstimator
from .index import CandidateIndex

Pair = tuple[frozenset[int], str]


def measure_by_priority(index: CandidateIndex, estimator: CostEstimator, pairs: Sequence[Pair]) -> list[Pair]:
    """Asks ``estimator`` for every pair's cost, in priority order (a measured estimator measures them in
    that order until its deadline); returns the order."""
    default = estimator.default_backend
    first = [p for p in pairs if p[1] == default and len(p[0]) == 1]
    base = {next(iter(ops)): c.seconds for (ops, _), c in zip(first, estimator.region_costs(first)) if c.usable}
    maximal = {(c.ops, c.backend) for c in index.candidates if c.maximal}
    rank = {p: k for k, p in enumerate(pairs)}
    chosen = set(first)

    def key(p: Pair) -> tuple:
        return (p in maximal, -max(base.get(op, 0.0) for op in p[0]), len(p[0]), rank[p])

    rest = sorted((p for p in pairs if p not in chosen), key=key)
    estimator.region_costs(rest)
    return first + rest
