"""Candidate regions: every (backend, convex op set) a registered backend's patterns can take."""

from __future__ import annotations

from ..backends import Backend, Candidate
from ..graph import Graph


def enumerate_candidates(graph: Graph, backends: list[Backend]) -> list[Candidate]:
    """All candidates of ``backends`` in ``graph``, in op order then backend order (deterministic)."""
    found = [c for backend in backends for c in backend.candidates(graph)]
    order = {oid: k for k, oid in enumerate(graph.topological_order())}
    return sorted(found, key=lambda c: (min(order[i] for i in c.ops), -len(c.ops), c.backend))
