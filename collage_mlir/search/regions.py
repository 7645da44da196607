"""Maximal regions of a backend that takes any convex set of the ops it supports (graph-level
engines): grown along dataflow without the per-candidate op cap, so a model one engine runs well can
be one region instead of hundreds of slices."""

from __future__ import annotations

from ..backends import Backend, BackendKind
from ..backends.base import OpSetBackend
from ..graph import Graph

#: The pattern name of a candidate that is one of its backend's maximal regions.
MAXIMAL = "maximal"


def maximal_regions(graph: Graph, backend: Backend) -> list[frozenset[int]]:
    """Disjoint convex regions covering the ops ``backend`` supports, each grown from its first op in
    topological order by the first neighbour (producer or user) that keeps it convex, until none does;
    regions the backend refuses as a whole, or that would feed another region in a cycle, are dropped.
    Empty for backends that are not graph-level engines."""
    if not isinstance(backend, OpSetBackend) or backend.kind != BackendKind.GRAPH:
        return []
    order = graph.topological_order()
    pos = {op: k for k, op in enumerate(order)}
    producers = {op: graph.producers(op) for op in order}
    users = {op: graph.users(op) for op in order}
    # Ancestors and descendants as bit sets (bit = topological position): adding one op n to a convex
    # region R keeps it convex unless a path leaves R and reaches n (a producer of n outside R has an
    # ancestor in R) or leaves n and reaches R (a user of n outside R has a descendant in R).
    anc: dict[int, int] = {}
    for op in order:
        m = 0
        for p in producers[op]:
            m |= anc[p] | (1 << pos[p])
        anc[op] = m
    desc: dict[int, int] = {}
    for op in reversed(order):
        m = 0
        for u in users[op]:
            m |= desc[u] | (1 << pos[u])
        desc[op] = m

    def convex_with(mask: int, region: set[int], n: int) -> bool:
        return (not any(anc[p] & mask for p in producers[n] if p not in region)
                and not any(desc[u] & mask for u in users[n] if u not in region))

    ok = {i for i, n in graph.nodes.items() if backend.supports(n.op) is None}
    taken: set[int] = set()
    regions: list[frozenset[int]] = []
    for anchor in order:
        if anchor not in ok or anchor in taken:
            continue
        region, mask = {anchor}, 1 << pos[anchor]
        frontier = {n for n in (*users[anchor], *producers[anchor]) if n in ok and n not in taken}
        while True:
            nxt = next((n for n in sorted(frontier, key=pos.__getitem__) if convex_with(mask, region, n)), None)
            if nxt is None:
                break
            region.add(nxt)
            mask |= 1 << pos[nxt]
            frontier.discard(nxt)
            frontier |= {n for n in (*users[nxt], *producers[nxt]) if n in ok and n not in taken and n not in region}
        region_f = frozenset(region)
        if len(region_f) < 2 or backend.accepts(graph, region_f) is not None:
            continue
        if not graph.regions_acyclic([*regions, region_f]):
            continue
        regions.append(region_f)
        taken |= region_f
    return regions
