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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

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
    costs: dict[tuple[frozenset[int], str], Cost]  # every region cost asked


#: Up to this many ops the DP is exact (climbs to ancestors); above, it takes Collage's rule.
EXACT_MAX_OPS = 48


def optimize(index: CandidateIndex, estimator: CostEstimator, *, exact: bool | None = None,
             on_progress: Callable[[int, int], None] | None = None) -> DpResult:
    """The plan of ``index``'s candidates with the lowest additive cost under ``estimator`` (exactly, over
    every acyclic plan, when ``exact``; by default for graphs of at most ``EXACT_MAX_OPS`` ops)."""
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
    reachable = reachable_candidates(index, exact)
    costs = dict(zip(reachable, estimator.region_costs(reachable)))
    # state: (covered mask, frontier labels: ((op, backend), ...)) → (cost, previous state, candidate)
    start = (0, ())
    best: dict[tuple, tuple[float, tuple | None, SearchCandidate | None]] = {start: (0.0, None, None)}
    buckets: dict[int, list[tuple]] = {0: [start]}
    expanded = 0
    for size in range(n + 1):
        states = sorted(buckets.pop(size, []))
        for state in states:
            expanded += 1
            base = best[state][0]
            covered, labels = state
            label = dict(labels)
            for c in () if covered == full else _steps(index, covered, bit, anc_mask, exact):
                rc = costs[(c.ops, c.backend)]
                if rc.usable:
                    total = base + rc.seconds
                elif rc.kind is CostKind.UNKNOWN and c.backend == index.default_backend and len(c.ops) == 1:
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
                    [(c, costs[(c.ops, c.backend)]) for c in chosen], expanded, costs)


def reachable_candidates(index: CandidateIndex, exact: bool) -> list[tuple[frozenset[int], str]]:
    """Every (ops, backend) some state of the DP can take, in index order: what must be costed (found
    from the states' covered sets alone, so the costs can be asked in one batch)."""
    g = index.graph
    full = (1 << len(g.order)) - 1
    bit = {op: 1 << g.pos[op] for op in g.order}
    anc_mask = _ancestor_masks(index)
    seen_states, stack, found = {0}, [0], set()
    while stack:
        covered = stack.pop()
        if covered == full:
            continue
        for c in _steps(index, covered, bit, anc_mask, exact):
            found.add(id(c))
            nxt = covered | c.mask
            if nxt not in seen_states:
                seen_states.add(nxt)
                stack.append(nxt)
    return [(c.ops, c.backend) for c in index.candidates if id(c) in found]


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
    regions = sorted((c for c in chosen if c.backend != index.default_backend),
                     key=lambda c: index.graph.pos[c.first])
    return Plan([Region(f"region_{k}", c.backend, c.ops) for k, c in enumerate(regions)], index.default_backend, source)
