"""Maximal regions of a backend that takes any convex set of the ops it supports (graph-level
engines): grown along dataflow without the per-candidate op cap, so a model one engine runs well can
be one region instead of hundreds of slices."""

from __future__ import annotations

from ..backends import Backend, BackendKind
from ..backends.base import OpSetBackend
from ..graph import Graph


def maximal_regions(graph: Graph, backend: Backend) -> list[frozenset[int]]:
    """Disjoint convex regions covering the ops ``backend`` supports, each grown from its first op in
    topological order by the first neighbour (producer or user) that keeps it convex, until none does;
    regions the backend refuses as a whole, or that would feed another region in a cycle, are dropped.
    Empty for backends that are not graph-level engines."""
    if not isinstance(backend, OpSetBackend) or backend.kind != BackendKind.GRAPH:
        return []
    order = graph.topological_order()
    pos = {op: k for k, op in enumerate(order)}
    ok = {i for i, n in graph.nodes.items() if backend.supports(n.op) is None}
    taken: set[int] = set()
    regions: list[frozenset[int]] = []
    for anchor in order:
        if anchor not in ok or anchor in taken:
            continue
        region = {anchor}
        while True:
            frontier = sorted({n for i in region for n in (*graph.users(i), *graph.producers(i))
                               if n in ok and n not in taken} - region, key=pos.__getitem__)
            nxt = next((n for n in frontier if graph.is_convex(region | {n})), None)
            if nxt is None:
                break
            region.add(nxt)
        region_f = frozenset(region)
        if len(region_f) < 2 or backend.accepts(graph, region_f) is not None:
            continue
        if not graph.regions_acyclic([*regions, region_f]):
            continue
        regions.append(region_f)
        taken |= region_f
    return regions
