"""What the optimizers search over: a compiler-free view of the op graph (topological order,
producers, bytes each op produces) and the candidate index by op, as TVM Collage's
``CandidatePartitionIndex``: ``candidates_at(op)`` (every candidate containing the op) and
``starting_at(op)`` (those whose first op in topological order it is), built once in linear time."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

import networkx as nx

from ..backends import DEFAULT_BACKEND, Backend, Candidate, Precision, RegionKey, pinned_backend
from ..dialects import collage
from ..dialects import stablehlo as sh
from ..graph import Graph, external_operands, producer
from ..ir import ir
from .candidates import enumerate_candidates
from .regions import MAXIMAL, maximal_regions


@dataclass
class SearchGraph:
    """Ops in topological order, each op's producers and the bytes of its results."""

    order: list[int]
    producers: dict[int, tuple[int, ...]]
    out_bytes: dict[int, int]
    #: Constant expressions (no function argument flows in): a region they feed gets its own copy, so
    #: no boundary is paid for them and the DP needs no backend for them.
    constant: frozenset[int] = frozenset()
    #: Ops only one backend runs (``backends.pinned_backend``: an ONNX node kept as ONNX), alone on it
    #: rather than on the default backend.
    pinned: Mapping[int, str] = field(default_factory=dict)
    #: The ``uniform_dequantize`` ops: a region holding one has a float form (``Precision.FLOAT``).
    dequantizing: frozenset[int] = frozenset()
    #: The ops whose results are quantized tensors (no region boundary may carry one).
    quantized: frozenset[int] = frozenset()
    users: dict[int, tuple[int, ...]] = field(init=False)
    pos: dict[int, int] = field(init=False)

    def __post_init__(self) -> None:
        users: dict[int, list[int]] = {i: [] for i in self.order}
        for q, ps in self.producers.items():
            for p in ps:
                users[p].append(q)
        self.users = {i: tuple(sorted(u)) for i, u in users.items()}
        self.pos = {op: k for k, op in enumerate(self.order)}

    @classmethod
    def from_graph(cls, graph: Graph) -> "SearchGraph":
        """The module's ops in an as-late-as-possible topological order: each op right before its first
        use, so a weight sits beside its conv, not with every other constant at the top of the function
        (the DP climbs to first uncovered ancestors; far-away constants would make it branch on them)."""
        ids = graph.topological_order()
        rank = {op: k for k, op in enumerate(ids)}
        late = list(nx.lexicographical_topological_sort(graph.dag.reverse(copy=False), key=lambda op: -rank[op]))
        constant: set[int] = set()
        for op in ids:
            node = graph.nodes[op]
            if all(producer(v) is not None and collage.op_id(producer(v)) in constant
                   for v in external_operands([node.op])):
                constant.add(op)
        pinned = {i: b for i, n in graph.nodes.items() if (b := pinned_backend(n.op)) is not None}
        quantized = frozenset(i for i, n in graph.nodes.items() if any("!quant." in str(r.type) for r in n.op.results))
        return cls(late[::-1], {i: tuple(graph.producers(i)) for i in graph.nodes},
                   {i: _result_bytes(n.op) for i, n in graph.nodes.items()}, frozenset(constant), pinned,
                   graph.dequantizing, quantized)

    def has_float_form(self, ops: frozenset[int]) -> bool:
        """Whether a region of ``ops`` may be named in float (``Precision.FLOAT``): it dequantizes, and no
        quantized tensor crosses its edge (``backends.base.crossing_type_problem``'s rule, which a region on
        the default backend meets only once it is named)."""
        if not ops & self.dequantizing:
            return False
        return not any(p in self.quantized and p not in ops for q in ops for p in self.producers[q]) and \
            not any(u not in ops for q in ops & self.quantized for u in self.users[q])

    def mask(self, ops: Iterable[int]) -> int:
        m = 0
        for op in ops:
            m |= 1 << self.pos[op]
        return m

    def external_producers(self, ops: frozenset[int]) -> tuple[int, ...]:
        """Ops outside ``ops`` whose results flow in, in topological order."""
        return tuple(sorted({p for q in ops for p in self.producers[q] if p not in ops}, key=self.pos.__getitem__))

    def is_convex(self, ops: frozenset[int]) -> bool:
        hi = max(self.pos[i] for i in ops)
        frontier = [u for i in ops for u in self.users[i] if u not in ops]
        seen = set(frontier)
        while frontier:
            n = frontier.pop()
            if n in ops:
                return False
            for u in self.users[n]:
                if u not in seen and self.pos[u] <= hi:
                    seen.add(u)
                    frontier.append(u)
        return True

    def acyclic(self, regions: Iterable[frozenset[int]]) -> bool:
        """No two regions feed each other (collapsing each to one node leaves a DAG)."""
        label: dict[int, object] = {}
        for k, r in enumerate(regions):
            for i in r:
                label[i] = ("r", k)
        q = nx.DiGraph()
        for b, ps in self.producers.items():
            for a in ps:
                la, lb = label.get(a, a), label.get(b, b)
                if la != lb:
                    q.add_edge(la, lb)
        return nx.is_directed_acyclic_graph(q)


def _result_bytes(op: ir.Operation) -> int:
    total = 0
    for r in op.results:
        t = r.type
        if isinstance(t, ir.RankedTensorType):
            if t.has_static_shape:
                total += math.prod(t.shape) * max(1, sh.element_bits(t.element_type) // 8)
    return total


#: The pattern name of an op alone on the default backend.
ALONE = "alone"


@dataclass(frozen=True, eq=False)
class SearchCandidate:
    """A candidate as the search sees it: ``mask`` has bit ``pos[op]`` set per op; ``inputs`` are the ops
    outside it whose results flow in across a boundary (constant expressions are copied in, not passed);
    ``inputs_mask`` has every op outside it that flows in; ``first`` is its first op in topological order;
    ``maximal``: one of its backend's maximal regions."""

    candidate: Candidate
    mask: int
    first: int
    inputs: tuple[int, ...]
    inputs_mask: int
    maximal: bool = False

    @property
    def key(self) -> RegionKey:
        return self.candidate.key

    @property
    def backend(self) -> str:
        return self.candidate.backend

    @property
    def ops(self) -> frozenset[int]:
        return self.candidate.ops


class CandidateIndex:
    """Candidates by the ops they contain and by their first op: every op alone on the default backend (a
    pinned op on its own),
    then ``candidates``, then each backend's ``maximal`` regions (a region found twice is kept once, as
    found first); with ``float_regions``, each candidate of several ops that dequantizes also in its float
    form (``Precision.FLOAT``: precision is then a placement dimension)."""

    def __init__(self, graph: SearchGraph, candidates: Iterable[Candidate],
                 maximal: Mapping[str, Sequence[frozenset[int]]] | None = None,
                 default_backend: str = DEFAULT_BACKEND, float_regions: bool = False):
        self.graph = graph
        self.default_backend = default_backend
        self.float_regions = float_regions
        seen: dict[RegionKey, SearchCandidate] = {}
        singles = [(self._alone_candidate(op), False) for op in graph.order]
        grown = [(Candidate(b, MAXIMAL, ops), True) for b, regions in (maximal or {}).items() for ops in regions]
        found = [*singles, *((c, False) for c in candidates), *grown]
        if float_regions:
            found += [(replace(c, precision=Precision.FLOAT), m) for c, m in found
                      if len(c.ops) > 1 and graph.has_float_form(c.ops)]
        for c, is_maximal in found:
            if c.key in seen:
                continue
            inputs = graph.external_producers(c.ops)
            charged = tuple(p for p in inputs if p not in graph.constant)
            seen[c.key] = SearchCandidate(c, graph.mask(c.ops), min(c.ops, key=graph.pos.__getitem__), charged,
                                          graph.mask(inputs), is_maximal)
        self.candidates = sorted(seen.values(), key=lambda c: (graph.pos[c.first], -len(c.ops), c.backend,
                                                                sorted(c.ops)))
        self.rank = {id(c): k for k, c in enumerate(self.candidates)}  # deterministic order of steps
        self._at: dict[int, list[SearchCandidate]] = {op: [] for op in graph.order}
        self._start: dict[int, list[SearchCandidate]] = {op: [] for op in graph.order}
        for c in self.candidates:
            self._start[c.first].append(c)
            for op in c.ops:
                self._at[op].append(c)

    def candidates_at(self, op: int) -> list[SearchCandidate]:
        return self._at[op]

    def starting_at(self, op: int) -> list[SearchCandidate]:
        return self._start[op]

    def _alone_candidate(self, op: int) -> Candidate:
        return Candidate(self.graph.pinned.get(op, self.default_backend), ALONE, frozenset({op}))

    def named(self, c: SearchCandidate) -> bool:
        """Whether a plan names ``c`` as a region: the default backend runs its ops at the model's precision
        without one."""
        return c.backend != self.default_backend or c.key.precision is not Precision.MODEL

    def is_alone(self, c: SearchCandidate) -> bool:
        """Whether ``c`` is its op alone on the backend every plan may leave it to (``alone``)."""
        return len(c.ops) == 1 and c.backend == self.graph.pinned.get(c.first, self.default_backend)

    def alone(self, op: int) -> SearchCandidate:
        """``op`` alone on the default backend (a pinned op on its own backend): what every plan may fall back to."""
        key = self._alone_candidate(op).key
        return next(c for c in self._start[op] if c.key == key)

    def __len__(self) -> int:
        return len(self.candidates)

    @classmethod
    def build(cls, graph: Graph, backends: Sequence[Backend], *,
              maximal: Mapping[str, Sequence[frozenset[int]]] | None = None,
              float_regions: bool = False) -> "CandidateIndex":
        """Every candidate of ``backends`` in ``graph`` plus, for each graph-level backend, its maximal
        regions (grown without the per-candidate op cap; ``maximal`` when the caller has them, by backend
        name), plus every op alone on the default backend (and float forms: ``float_regions``)."""
        if maximal is None:
            maximal = {b.name: maximal_regions(graph, b) for b in backends}
        return cls(SearchGraph.from_graph(graph), enumerate_candidates(graph, list(backends)), maximal,
                   float_regions=float_regions)

