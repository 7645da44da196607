"""Plans that need no measurement: random placement (a fuzzer for the whole pipeline) and
"prefer these backends" placement (the demo's mixed plan)."""

from __future__ import annotations

import random
from typing import Callable

from ..backends import DEFAULT_BACKEND, Backend, Candidate
from ..graph import Graph
from ..plan import Plan, Region
from .candidates import enumerate_candidates


def _greedy_plan(graph: Graph, backends: list[Backend], choose: Callable[[list[Candidate]], Candidate | None],
                 source: str, order: list[int] | None = None) -> Plan:
    """Visits ops in ``order`` (default: topological); for each op not yet placed, ``choose`` picks one of
    the candidates that contain it, overlap nothing placed so far and form no cycle with the regions
    already placed (None leaves the op on the default backend)."""
    candidates = enumerate_candidates(graph, backends)
    taken: set[int] = set()
    regions: list[Region] = []
    for oid in order or graph.topological_order():
        if oid in taken:
            continue
        options = [c for c in candidates if oid in c.ops and not (c.ops & taken)]
        while options:
            pick = choose(options)
            if pick is None:
                break
            if graph.regions_acyclic([r.ops for r in regions] + [pick.ops]):
                taken |= pick.ops
                regions.append(Region(f"region_{len(regions)}", pick.backend, pick.ops))
                break
            options.remove(pick)
    order_of = {oid: k for k, oid in enumerate(graph.topological_order())}
    regions.sort(key=lambda r: min(order_of[i] for i in r.ops))
    regions = [Region(f"region_{k}", r.backend, r.ops) for k, r in enumerate(regions)]
    return Plan(regions, DEFAULT_BACKEND, source)


def random_plan(graph: Graph, backends: list[Backend], seed: int) -> Plan:
    """Puts each op group on a random backend that accepts it: a backend uniformly among those with a
    candidate containing the op, then one of its candidates uniformly (graph-level backends have many
    more candidates than library ones; picking per candidate would starve the latter). Deterministic
    for a seed."""
    rng = random.Random(seed)

    def choose(options: list[Candidate]) -> Candidate:
        backend = rng.choice(sorted({c.backend for c in options}))
        return rng.choice([c for c in options if c.backend == backend])

    # A random visiting order, so ops late in the graph (a conv after its weights) get a fair chance.
    order = graph.topological_order()
    rng.shuffle(order)
    return _greedy_plan(graph, backends, choose, f"random:{seed}", order)


def preferred_plan(graph: Graph, backends: list[Backend]) -> Plan:
    """Gives each op to the first backend in ``backends`` with a candidate for it, taking the largest
    such candidate; ops nobody (or only the default backend) takes stay on the default backend."""
    rank = {b.name: k for k, b in enumerate(backends)}

    def choose(options: list[Candidate]) -> Candidate | None:
        pick = min(options, key=lambda c: (rank[c.backend], -len(c.ops)))
        return None if pick.backend == DEFAULT_BACKEND else pick

    return _greedy_plan(graph, backends, choose, "preferred:" + ",".join(b.name for b in backends))
