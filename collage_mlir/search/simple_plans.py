"""Plans that need no measurement: random placement (a fuzzer for the whole pipeline), "prefer these
backends" placement (the demo's mixed plan) and one backend taking all it can (``whole:B``, the seeds of
a tune)."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Callable, Mapping, Sequence

from ..backends import DEFAULT_BACKEND, PLATFORM_DEFAULTS, Backend, BackendKind, Candidate, Platform, Precision
from ..graph import Graph
from ..plan import Plan, Region
from .candidates import enumerate_candidates
from .regions import MAXIMAL, maximal_regions


def _greedy_plan(graph: Graph, backends: list[Backend], choose: Callable[[list[Candidate]], Candidate | None],
                 source: str, order: list[int] | None = None, extra: Sequence[Candidate] = (),
                 default: str = DEFAULT_BACKEND) -> Plan:
    """Visits ops in ``order`` (default: topological); for each op not yet placed, ``choose`` picks one of
    the candidates (``backends``' own and ``extra``) that contain it, overlap nothing placed so far and
    form no cycle with the regions already placed (None leaves the op on the ``default`` backend)."""
    candidates = [*enumerate_candidates(graph, backends), *extra]
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
    return Plan(regions, default, source)


def on_platform(backends: Sequence[Backend], platform: Platform) -> list[Backend]:
    """The backends that can run regions in a program on ``platform``."""
    return [b for b in backends if platform in b.platforms]


def random_plan(graph: Graph, backends: list[Backend], seed: int, platform: Platform = Platform.CPU) -> Plan:
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
    return _greedy_plan(graph, on_platform(backends, platform), choose, f"random:{seed}", order,
                        default=PLATFORM_DEFAULTS[platform])


def preferred_plan(graph: Graph, backends: list[Backend], source: str | None = None,
                   maximal: Mapping[str, Sequence[frozenset[int]]] | None = None,
                   platform: Platform = Platform.CPU) -> Plan:
    """Gives each op to the first backend in ``backends`` with a candidate for it, taking the largest
    such candidate (a graph-level engine's maximal regions among them, ``maximal`` when the caller has
    them, so a preferred engine gets the regions a tune would give it, not pattern-sized slices); ops
    nobody (or only the default backend) takes stay on the default backend (``platform``'s)."""
    default = PLATFORM_DEFAULTS[platform]
    rank = {b.name: k for k, b in enumerate(backends)}
    grown = [Candidate(b.name, MAXIMAL, ops) for b in backends
             for ops in (maximal[b.name] if maximal is not None else maximal_regions(graph, b))]

    def choose(options: list[Candidate]) -> Candidate | None:
        pick = min(options, key=lambda c: (rank[c.backend], -len(c.ops)))
        return None if pick.backend == default else pick

    return _greedy_plan(graph, backends, choose, source or "preferred:" + ",".join(b.name for b in backends),
                        extra=grown, default=default)


def whole_plan(graph: Graph, backend: Backend, maximal: Sequence[frozenset[int]] | None = None,
               platform: Platform = Platform.CPU) -> Plan:
    """``backend`` alone, taking all it can: a graph-level engine its maximal regions (``maximal`` when
    the caller has them) and any op it takes outside them, a library or codegen backend the largest
    candidate at each op; the default backend of ``platform`` is the empty plan."""
    default = PLATFORM_DEFAULTS[platform]
    if backend.name == default:
        return Plan([], default, backend.name)
    regions = maximal if maximal is not None else maximal_regions(graph, backend)
    placed = frozenset().union(*regions)
    # Ops it takes outside its maximal regions (an op with no neighbour it takes: a region of one);
    # operand-free ops (constants) are copied into the regions that read them.
    if regions and not any(i not in placed and len(n.op.operands) and backend.supports(n.op) is None
                           for i, n in graph.nodes.items()):
        return Plan([Region(f"region_{k}", backend.name, r) for k, r in enumerate(regions)], default, backend.name)
    return preferred_plan(graph, [backend], source=backend.name, maximal={backend.name: regions}, platform=platform)
def single_backend_plans(graph: Graph, backends: Sequence[Backend],
                         maximal: Mapping[str, Sequence[frozenset[int]]] | None = None,
                         platform: Platform = Platform.CPU) -> dict[str, Plan]:
    """``whole_plan`` of each backend in a ``platform`` program, for those that place anything (the
    platform's default backend always)."""
    plans = {b.name: whole_plan(graph, b, None if maximal is None else maximal[b.name], platform) for b in backends}
    return {name: p for name, p in plans.items() if p.regions or name == PLATFORM_DEFAULTS[platform]}


#: ``float_plans`` names the float form of seed ``B`` ``B:float``.
FLOAT_SEED = "{}:float"


def float_plans(graph: Graph, single: Mapping[str, Plan], backends: Sequence[Backend]) -> dict[str, Plan]:
    """Each graph engine's single-backend plan (in ``single``) in float: its regions that dequantize with
    ``Precision.FLOAT`` (the engine on the model without its quantization: what its float peer runs),
    named ``B:float``; none for an engine none of whose regions dequantizes."""
    out = {}
    for b in backends:
        plan = single.get(b.name)
        if b.kind is not BackendKind.GRAPH or plan is None or not any(r.ops & graph.dequantizing for r in plan.regions):
            continue
        regions = [replace(r, precision=Precision.FLOAT) if r.ops & graph.dequantizing else r for r in plan.regions]
        out[FLOAT_SEED.format(b.name)] = Plan(regions, plan.default_backend, FLOAT_SEED.format(b.name))
    return out
