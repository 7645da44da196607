"""Plans that need no measurement: random placement (a fuzzer for the whole pipeline) and
"prefer these backends" placement (the demo's mixed plan)."""

from __future__ import annotations

import random
from typing import Callable

from ..backends import DEFAULT_BACKEND, Backend
from ..graph import Graph
from ..plan import Plan, Region
from .candidates import Candidate, enumerate_candidates


def _greedy_plan(graph: Graph, backends: list[Backend], choose: Callable[[list[Candidate]], Candidate | None],
                 source: str) -> Plan:
    """Walks ops in topological order; for each op not yet placed, ``choose`` picks one of the candidates
    that contain it and overlap nothing placed so far (None leaves the op on the default backend)."""
    candidates = enumerate_candidates(graph, backends)
    taken: set[int] = set()
    regions: list[Region] = []
    for oid in graph.topological_order():
        if oid in taken:
            continue
        options = [c for c in candidates if oid in c.ops and not (c.ops & taken)]
        pick = choose(options) if options else None
        if pick is None:
            continue
        taken |= pick.ops
        regions.append(Region(f"region_{len(regions)}", pick.backend, pick.ops))
    return Plan(regions, DEFAULT_BACKEND, source)


def random_plan(graph: Graph, backends: list[Backend], seed: int) -> Plan:
    """Puts each op group on a random backend that accepts it, uniformly among the candidates
    (of any backend) containing the op. Deterministic for a seed."""
    rng = random.Random(seed)
    return _greedy_plan(graph, backends, rng.choice, f"random:{seed}")


def preferred_plan(graph: Graph, backends: list[Backend]) -> Plan:
    """Gives each op to the first backend in ``backends`` with a candidate for it, taking the largest
    such candidate; ops nobody (or only the default backend) takes stay on the default backend."""
    rank = {b.name: k for k, b in enumerate(backends)}

    def choose(options: list[Candidate]) -> Candidate | None:
        pick = min(options, key=lambda c: (rank[c.backend], -len(c.ops)))
        return None if pick.backend == DEFAULT_BACKEND else pick

    return _greedy_plan(graph, backends, choose, "preferred:" + ",".join(b.name for b in backends))
