"""Plans that need no measurement: random placement (a fuzzer for the whole pipeline) and
"prefer these backends" placement (the demo's mixed plan)."""

from __future__ import annotations

import random

from ..backends import DEFAULT_BACKEND, Backend
from ..graph import Graph
from ..plan import Plan, Region
from .candidates import enumerate_candidates


def _region_name(k: int) -> str:
    return f"region_{k}"


def random_plan(graph: Graph, backends: list[Backend], seed: int) -> Plan:
    """Puts each op group on a random backend that accepts it.

    Walks ops in topological order; for each op not yet placed, picks uniformly among the candidates
    (of any backend) that contain it and overlap nothing placed so far. Deterministic for a seed.
    """
    rng = random.Random(seed)
    candidates = enumerate_candidates(graph, backends)
    taken: set[int] = set()
    regions: list[Region] = []
    for oid in graph.topological_order():
        if oid in taken:
            continue
        options = [c for c in candidates if oid in c.ops and not (c.ops & taken)]
        if not options:
            continue
        pick = rng.choice(options)
        taken |= pick.ops
        regions.append(Region(_region_name(len(regions)), pick.backend, pick.ops))
    return Plan(regions, DEFAULT_BACKEND, f"random:{seed}")


def preferred_plan(graph: Graph, backends: list[Backend]) -> Plan:
    """Gives each op to the first backend in ``backends`` with a candidate for it, taking the largest
    such candidate; ops nobody takes stay on the default backend."""
    candidates = enumerate_candidates(graph, backends)
    rank = {b.name: k for k, b in enumerate(backends)}
    taken: set[int] = set()
    regions: list[Region] = []
    for oid in graph.topological_order():
        options = [c for c in candidates if oid in c.ops and not (c.ops & taken)]
        if oid in taken or not options:
            continue
        pick = min(options, key=lambda c: (rank[c.backend], -len(c.ops)))
        if pick.backend == DEFAULT_BACKEND:
            continue
        taken |= pick.ops
        regions.append(Region(_region_name(len(regions)), pick.backend, pick.ops))
    return Plan(regions, DEFAULT_BACKEND, "preferred:" + ",".join(b.name for b in backends))
