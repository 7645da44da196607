"""Operator-level optimizer (Collage's first level): dynamic programming over sets of covered ops.

A state is the set of ops covered so far, always closed under producers (every op's producers are
covered before it), plus the backend of each covered op whose results still flow to uncovered ops
(what the next boundaries cost depends on). A step covers one more candidate whose inputs are all
covered; its cost is the region's cost plus one transition per (producer op, region) crossing into it.
States are expanded in order of how many ops they cover, so each is final when expanded.

Collage steps by "the first uncovered op" u; that alone cannot tell a plan whose regions feed each
other in a cycle from a valid one. Here a step takes a *ready* candidate (its inputs all covered, so
every plan reached is acyclic): one at u, or, where a candidate at u is not ready, one at its first
uncovered ancestor outside it, and so on up. That is still complete: if the region holding u in some
acyclic plan is not ready, following first uncovered ancestors climbs that plan's region DAG to a
ready region. Unrelated ready ops (the many constants of a model) are never taken in every order.
Even so the covered sets of a real model are too many (ResNet's small variant: > 300 000 after 40 s
with one graph engine's 8-op candidates), so above ``EXACT_MAX_OPS`` ops the DP takes Collage's rule
with readiness: only ready candidates at u. That misses plans whose region holding u needs an op
placed later in the order; the graph-level search and the maximal-region seeds cover the large
regions it would miss.

Region costs are asked lazily, in one batch (so a measured estimator builds them in parallel): only
for candidates some reachable state can take, found by walking the covered sets first.

Bounds (``DpLimits``). The frontier labels multiply the states: with six backends BERT's small variant
reached 186 000 states (54 s), and the full models more than a budget allows. So above
``EXACT_MAX_OPS`` ops the DP is a beam: per covered set it keeps the ``labels_per_set`` cheapest label
variants, and per size the ``sets_per_size`` covered sets with the cheapest state (the walk that finds
the candidates to cost keeps as many covered sets per size, the first in a fixed order). Past the
deadline both drop to Collage's own DP (one label variant per covered set, a handful of covered sets
per size): every state can still finish (the default backend's op alone at the first uncovered op is
always ready), so a plan always comes out, in time linear in the ops.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable

from ..backends import RegionKey
from ..errors import CollageError
from ..plan import Plan, Region
from .cost import Cost, CostEstimator, CostKind, transition_seconds
from .index import CandidateIndex, SearchCandidate


@dataclass
class DpResult:
    plan: Plan
    cost_s: float  # predicted (additive) cost of the plan
    chosen: list[tuple[SearchCandidate, Cost]]  # the plan's candidates (default-backend ones too)
    states: int
    costs: dict[RegionKey, Cost]  # every region cost asked


#: Up to this many ops the DP is exact (climbs to ancestors); above, it takes Collage's rule.
EXACT_MAX_OPS = 48


@dataclass(frozen=True)
class DpLimits:
    """How much of the state space the DP keeps (see the module docstring); None is unbounded."""

    labels_per_set: int | None = 4  # label variants kept per covered set
    sets_per_size: int | None = 256  # covered sets kept per number of covered ops
    deadline: float | None = None  # time.monotonic() after which the limits drop to ``SPENT``

    def spent(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline


#: The exact DP: no beam (still stops beaming at nothing; its graphs are small).
EXACT = DpLimits(None, None)
#: What the limits drop to once the deadline has passed: Collage's DP, one cost per covered set.
SPENT = DpLimits(1, 8)


def optimize(index: CandidateIndex, estimator: CostEstimator, *, exact: bool | None = None,
             limits: DpLimits | None = None, deadline: float | None = None,
             on_progress: Callable[[int, int], None] | None = None) -> DpResult:
    """The plan of ``index``'s candidates with the lowest additive cost under ``estimator`` (exactly, over
    every acyclic plan, when ``exact``; by default for graphs of at most ``EXACT_MAX_OPS`` ops; else a
    beam bounded by ``limits``); past ``deadline`` (``time.monotonic()``) it finishes as Collage's DP."""
    g = index.graph
    n = len(g.order)
    full = (1 << n) - 1
    bit = {op: 1 << g.pos[op] for op in g.order}
    anc_mask = _ancestor_masks(index)
    trans: dict[tuple[str, str, int], float] = {}

    def transition(src: str, dst: str, nbytes: int) -> float:
        key = (src, dst, nbytes)
        if key not in trans:
            trans[key] = transition_seconds(estimator.transition_cost(src, dst, nbytes))
        return trans[key]

    exact = len(index.graph.order) <= EXACT_MAX_OPS if exact is None else exact
    limits = replace(limits or (EXACT if exact else DpLimits()), deadline=deadline)
    reachable = reachable_candidates(index, exact, limits)
    costs = dict(zip(reachable, estimator.region_costs(reachable)))
    not_posed = Cost.unknown("not reached by the bounded walk")
    # state: (covered mask, frontier labels: ((op, backend), ...)) → (cost, previous state, candidate)
    start = (0, ())
    best: dict[tuple, tuple[float, tuple | None, SearchCandidate | None]] = {start: (0.0, None, None)}
    buckets: dict[int, list[tuple]] = {0: [start]}
    expanded = 0
    for size in range(n + 1):
        states = _beam(buckets.pop(size, []), best, SPENT if limits.spent() else limits)
        for state in states:
            expanded += 1
            base = best[state][0]
            covered, labels = state
            label = dict(labels)
            for c in () if covered == full else _steps(index, covered, bit, anc_mask, exact):
                rc = costs.get(c.key, not_posed)
                if rc.usable:
                    total = base + rc.seconds
                elif rc.kind is CostKind.UNKNOWN and index.is_alone(c):
                    total = base  # not measured (budget spent): an op left where it is, at no predicted cost
                else:
                    continue
                for p in c.inputs:
                    total += transition(label[p], c.backend, g.out_bytes[p])
                if not math.isfinite(total):
                    continue
                new_cov = covered | c.mask
                merged = label | {op: c.backend for op in c.ops}
                frontier = tuple((op, merged[op]) for op in sorted(merged, key=g.pos.__getitem__)
                                 if op not in g.constant and any(not new_cov & bit[u] for u in g.users[op]))
                nxt = (new_cov, frontier)
                if nxt not in best or total < best[nxt][0]:
                    if nxt not in best:
                        buckets.setdefault(bin(new_cov).count("1"), []).append(nxt)
                    best[nxt] = (total, state, c)
        if on_progress:
            on_progress(size, n)
    finals = [s for s in best if s[0] == full]
    if not finals:
        raise CollageError("no plan covers every op with usable costs (the default backend failed on some op)")
    end = min(finals, key=lambda s: (best[s][0], s))
    chosen: list[SearchCandidate] = []
    s = end
    while best[s][1] is not None:
        chosen.append(best[s][2])
        s = best[s][1]
    chosen.reverse()
    return DpResult(to_plan(index, chosen, "dp"), best[end][0],
                    [(c, costs.get(c.key, not_posed)) for c in chosen], expanded, costs)


def _beam(states: list[tuple], best: dict, limits: DpLimits) -> list[tuple]:
    """The states of one size to expand, in a fixed order: per covered set its ``labels_per_set``
    cheapest label variants, of the ``sets_per_size`` covered sets with the cheapest state."""
    by_set: dict[int, list[tuple]] = {}
    for s in sorted(states, key=lambda s: (best[s][0], s)):
        by_set.setdefault(s[0], []).append(s)
    sets = sorted(by_set.values(), key=lambda v: (best[v[0]][0], v[0]))[:limits.sets_per_size]
    return sorted(s for v in sets for s in v[:limits.labels_per_set])


def reachable_candidates(index: CandidateIndex, exact: bool, limits: DpLimits | None = None) -> list[RegionKey]:
    """Every region some state of the DP can take, in index order: what must be costed (found
    from the states' covered sets alone, so the costs can be asked in one batch). Visits covered sets by
    size, at most ``limits.sets_per_size`` of them per size (the first by mask; past the deadline as
    many as ``SPENT`` keeps)."""
    g = index.graph
    limits = limits or (EXACT if exact else DpLimits())
    full = (1 << len(g.order)) - 1
    bit = {op: 1 << g.pos[op] for op in g.order}
    anc_mask = _ancestor_masks(index)
    buckets: dict[int, set[int]] = {0: {0}}
    found: set[int] = set()
    for size in range(len(g.order)):
        cap = (SPENT if limits.spent() else limits).sets_per_size
        for covered in sorted(buckets.pop(size, ()))[:cap]:
            for c in _steps(index, covered, bit, anc_mask, exact):
                found.add(id(c))
                nxt = covered | c.mask
                if nxt != full:
                    buckets.setdefault(bin(nxt).count("1"), set()).add(nxt)
    return [c.key for c in index.candidates if id(c) in found]


def _ancestor_masks(index: CandidateIndex) -> dict[int, int]:
    """id(candidate) → mask of the transitive producers of its ops."""
    g = index.graph
    anc: dict[int, int] = {}
    for op in g.order:
        m = 0
        for p in g.producers[op]:
            m |= anc[p] | (1 << g.pos[p])
        anc[op] = m
    out = {}
    for c in index.candidates:
        m = 0
        for op in c.ops:
            m |= anc[op]
        out[id(c)] = m
    return out


def _steps(index: CandidateIndex, covered: int, bit: dict[int, int], anc_mask: dict[int, int], exact: bool):
    """The candidates a state may take next (see the module docstring), in index order: the ready ones
    at the first uncovered op u, and for each candidate that is not ready, recursively, those at its
    first uncovered ancestor outside it (an op whose producers are all covered)."""
    g = index.graph
    u = next(op for op in g.order if not covered & bit[op])
    visited, stack, found = {u}, [u], {}
    if not exact:
        found = {id(c): c for c in index.candidates_at(u) if not c.mask & covered and not c.inputs_mask & ~covered}
        stack = []
    while stack:
        w = stack.pop()
        for c in index.candidates_at(w):
            if c.mask & covered:
                continue
            if not c.inputs_mask & ~covered:
                found[id(c)] = c
                continue
            above = anc_mask[id(c)] & ~covered & ~c.mask
            nxt = g.order[(above & -above).bit_length() - 1]
            if nxt not in visited:
                visited.add(nxt)
                stack.append(nxt)
    return sorted(found.values(), key=lambda c: index.rank[id(c)])


def to_plan(index: CandidateIndex, chosen: list[SearchCandidate], source: str) -> Plan:
    """A plan of the non-default candidates, named in topological order of their first op."""
    regions = sorted((c for c in chosen if index.named(c)), key=lambda c: index.graph.pos[c.first])
    return Plan([Region(f"region_{k}", c.backend, c.ops, c.key.precision) for k, c in enumerate(regions)],
                index.default_backend, source)
