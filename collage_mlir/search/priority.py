"""The order region costs are measured in, so a budget that cannot pay for every candidate spends
itself where the plan is decided: first every op alone on the default backend (the incumbent's costs,
and what the DP falls back on), then the candidates holding the ops that are most expensive there
(convolutions and large matmuls before glue), smaller regions before larger ones at the same op. The
graph engines' maximal regions come last: the single-backend seed plans, timed whole before any region,
already measured them (a whole-model region costs a whole-model build). Where a graph engine's seed was
profiled per node, the estimator answers its sub-regions in context and leaves unmeasured the other
backends' regions whose ops are too cheap in its graph to win (``MeasuredEstimator.price_in_context``), so
the order here only decides among what is still measured."""

from __future__ import annotations

from typing import Sequence

from ..backends import RegionKey
from .cost import CostEstimator
from .index import CandidateIndex


def measure_by_priority(index: CandidateIndex, estimator: CostEstimator, regions: Sequence[RegionKey]
                        ) -> list[RegionKey]:
    """Asks ``estimator`` for every region's cost, in priority order (a measured estimator measures them
    in that order until its deadline); returns the order."""
    default = estimator.default_backend
    first = [r for r in regions if r.backend == default and len(r.ops) == 1]
    base = {next(iter(r.ops)): c.seconds for r, c in zip(first, estimator.region_costs(first)) if c.usable}
    maximal = {c.key for c in index.candidates if c.maximal}
    rank = {r: k for k, r in enumerate(regions)}
    chosen = set(first)

    def key(r: RegionKey) -> tuple:
        return (r in maximal, -max(base.get(op, 0.0) for op in r.ops), len(r.ops), rank[r])

    rest = sorted((r for r in regions if r not in chosen), key=key)
    estimator.region_costs(rest)
    return first + rest
