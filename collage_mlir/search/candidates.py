"""Candidate regions: every (backend, convex op set) a registered backend's patterns can take."""

from __future__ import annotations

from dataclasses import dataclass

from ..backends import Backend
from ..graph import Graph


@dataclass(frozen=True)
class Candidate:
    backend: str
    pattern: str
    ops: frozenset[int]


def enumerate_candidates(graph: Graph, backends: list[Backend]) -> list[Candidate]:
    """All candidates of ``backends`` in ``graph``, in op order then backend order (deterministic)."""
    found: list[Candidate] = []
    for backend in backends:
        for pattern, ops in backend.candidates(graph):
            found.append(Candidate(backend.name, pattern, ops))
    order = {oid: k for k, oid in enumerate(graph.topological_order())}
    return sorted(found, key=lambda c: (min(order[i] for i in c.ops), -len(c.ops), c.backend))
