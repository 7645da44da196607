"""An exact placement solver beside the DP: the plan as a set partition with boundary costs, solved as an
integer program (``scipy.optimize.milp``, HiGHS) over windows of the graph.

Model (one window; the whole graph when it fits in one, and then it is exact):

- ``x_c`` in {0, 1} per candidate starting at one of the window's ops and holding no op placed already;
  each window op is covered by exactly one chosen candidate, an op past the window by at most one. Costs
  are the DP's (``dp.py``): a known region cost; an unknown one bars the candidate except an op alone
  on the default backend, which is free; an invalid one bars it. A default-backend candidate of several
  ops is left out: a ``Plan`` cannot say it (``to_plan`` drops default-backend regions: its ops run
  alone there), so its plan would not cost what the solver said.
- Boundaries as ``plan_cost`` counts them: one transition per (producer op p outside the region, the
  region), none from a constant expression. ``z_pB = sum of x_d over candidates d on backend B holding
  p`` is p's label; the charge of candidate c for its input p is ``sum_B t(B, c.backend, bytes_p) x_c
  z_pB``. Its cheapest term ``min_B t`` goes onto ``x_c`` (exactly one z_pB is 1), the rest onto
  ``w_cpB >= x_c + z_pB - 1`` (continuous, >= 0, its cost >= 0, so it is the product at the optimum).
  An invalid boundary forbids the pair (``x_c + z_pB <= 1``). Where p or the consuming region was placed
  by an earlier window, the boundary is a plain coefficient on the other's ``x``; a boundary from an op
  past the window is charged when that op is placed.
- Acyclic regions, by lazy cuts: solve, collapse the chosen regions (with the earlier windows' ones;
  every op not placed yet is its own node) and while that graph has a cycle, forbid the cycle's
  candidates together (``sum x <= k - 1``; any plan holding all of them has that cycle) and solve
  again. Exact: every cut removes only cyclic plans, and the loop ends on an acyclic optimum.

Tractability: a graph of more than ``MilpOptions.window`` ops is solved in windows along the topological
order (a rolling horizon): the next ``window`` unplaced ops, everything placed before fixed, and the
candidates starting at them (of any size: a backend's maximal region over the whole model is one
column of the first window). The chosen candidates starting at the first ``window - overlap`` of them
are kept (with all their ops), the rest is solved again in the next window. A window does not see the
boundaries its placements cause past it, nor a cheaper choice a later window would have, so windows are
a heuristic: ``exact_plan`` returns the better of the windowed plan and the DP's. Each solve gets what
is left of ``time_limit_s``; a window that runs out keeps HiGHS's best feasible answer (not proved),
or, without one, its ops alone on the default backend, as does every window after the clock has run out.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import networkx as nx
import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from ..backends import RegionKey
from ..plan import Plan
from .cost import Cost, CostEstimator, CostKind, transition_seconds
from .dp import DpResult, optimize, to_plan
from .index import CandidateIndex, SearchCandidate


@dataclass(frozen=True)
class MilpOptions:
    """``window``: most ops per integer program (the whole graph when it has no more); ``overlap``: ops at
    a window's end solved again in the next one; ``max_cuts``: acyclicity cuts per window before its
    answer is taken as not proved (then it falls back as a window out of time does)."""

    window: int = 2048  # ResNet-50 (1 500 ops, 33 889 candidates) is one program: 66 s, proved (studies/milp)
    overlap: int = 256
    max_cuts: int = 200

    def __post_init__(self) -> None:
        if not 0 <= self.overlap < self.window:
            raise ValueError(f"overlap ({self.overlap}) must be in [0, window={self.window})")


@dataclass(frozen=True)
class MilpResult:
    """``plan``/``cost_s``/``chosen``: the better of the integer program's plan and the DP's (``source``:
    'milp' or 'dp'); ``milp_cost_s`` and ``dp_cost_s`` both predictions (the DP's inf when none was
    given or run); ``proved``: the integer program's plan is optimal over every acyclic plan of the
    candidates costed (one window, every solve optimal); ``windows``, ``solves``, ``cuts`` and
    ``seconds``: what it took; ``costs``: every region cost it used."""

    plan: Plan
    cost_s: float
    chosen: tuple[tuple[SearchCandidate, Cost], ...]
    source: str
    milp_cost_s: float
    dp_cost_s: float
    proved: bool
    windows: int
    solves: int
    cuts: int
    seconds: float
    costs: Mapping[RegionKey, Cost] = field(repr=False)


def exact_plan(index: CandidateIndex, estimator: CostEstimator, time_limit_s: float, *,
               dp: DpResult | None = None, costs: Mapping[RegionKey, Cost] | None = None,
               options: MilpOptions = MilpOptions()) -> MilpResult:
    """The lowest-cost plan the integer program finds within ``time_limit_s`` (s, wall clock), or ``dp``'s
    plan where that is cheaper (``dp``: the DP's result on the same index and estimator; run here with
    its default limits when not given). ``costs``: the region costs to use (e.g. ``dp.costs``: then no
    new region is asked, and a candidate it lacks counts as unknown); without it every candidate's cost
    is asked of ``estimator`` in one batch (a measured estimator measures what its DB lacks). Both plans
    are priced as plans (``plan_cost``'s way): a default-backend region of several ops the DP took is
    its ops alone there, which is what its plan builds."""
    start = time.monotonic()
    if dp is None:
        dp = optimize(index, estimator)
    solved = solve(index, estimator, start + time_limit_s, costs=costs, options=options)
    singles = {c.key: c for c in index.candidates if c.backend == index.default_backend and len(c.ops) == 1}
    as_plan = [c for c, _ in dp.chosen if index.named(c)]
    as_plan += [singles[RegionKey(index.default_backend, frozenset({op}))]
                for c, _ in dp.chosen if not index.named(c) for op in c.ops]
    region_s = {id(c): s for c in as_plan if (s := _region_seconds(index, c, {**dp.costs, **solved.costs}))
                is not None}
    dp_cost_s = _chosen_cost(index, estimator, as_plan, region_s) if len(region_s) == len(as_plan) else math.inf
    seconds = time.monotonic() - start
    if solved.cost_s <= dp_cost_s:
        return MilpResult(solved.plan, solved.cost_s, solved.chosen, "milp", solved.cost_s, dp_cost_s, solved.proved,
                          solved.windows, solved.solves, solved.cuts, seconds, solved.costs)
    chosen = tuple((c, solved.costs.get(c.key, dp.costs.get(c.key, _NOT_POSED))) for c in as_plan)
    return MilpResult(dp.plan, dp_cost_s, chosen, "dp", solved.cost_s, dp_cost_s, solved.proved,
                      solved.windows, solved.solves, solved.cuts, seconds, solved.costs)


def solve(index: CandidateIndex, estimator: CostEstimator, deadline: float, *,
          costs: Mapping[RegionKey, Cost] | None = None, options: MilpOptions = MilpOptions()) -> MilpResult:
    """The integer program alone (no DP to fall back on: ``source`` is 'milp', ``dp_cost_s`` inf), windows
    solved until ``deadline`` (``time.monotonic()``), the rest alone on the default backend."""
    start = time.monotonic()
    g = index.graph
    eligible = [c for c in index.candidates if index.named(c) or len(c.ops) == 1]
    if costs is None:
        costs = dict(zip((c.key for c in eligible), estimator.region_costs([c.key for c in eligible])))
    region_s = {id(c): s for c in eligible if (s := _region_seconds(index, c, costs)) is not None}
    window = _Window(index, estimator, region_s, options)
    placed: dict[int, SearchCandidate] = {}  # op → the candidate placed there
    chosen: list[SearchCandidate] = []
    all_optimal, windows, solves, cuts = True, 0, 0, 0
    whole = len(g.order) <= options.window  # one window holds every op: the program is the whole problem
    while len(placed) < len(g.order):
        free = [op for op in g.order if op not in placed][:options.window]
        last = len(placed) + len(free) == len(g.order)
        windows += 1
        picked, optimal, n_solves, n_cuts = window.solve(free, placed, deadline)
        all_optimal &= optimal
        solves, cuts = solves + n_solves, cuts + n_cuts
        keep_before = len(free) if last else len(free) - options.overlap
        kept = {g.pos[op] for op in free[:keep_before]}
        for c in picked:
            if g.pos[c.first] in kept:
                chosen.append(c)
                placed.update((op, c) for op in c.ops)
    chosen.sort(key=lambda c: index.rank[id(c)])
    cost_s = _chosen_cost(index, estimator, chosen, region_s)
    return MilpResult(to_plan(index, chosen, "milp"), cost_s,
                      tuple((c, costs.get(c.key, _NOT_POSED)) for c in chosen), "milp", cost_s, math.inf,
                      all_optimal and whole, windows, solves, cuts, time.monotonic() - start, costs)


_NOT_POSED = Cost.unknown("not among the costs given")


def _region_seconds(index: CandidateIndex, c: SearchCandidate, costs: Mapping[RegionKey, Cost]) -> float | None:
    """A candidate's region cost as the DP takes it; None where it may not be chosen."""
    cost = costs.get(c.key, _NOT_POSED)
    if cost.usable:
        return cost.seconds
    if cost.kind is CostKind.UNKNOWN and index.is_alone(c):
        return 0.0  # not measured: an op left where it is, at no predicted cost (as the DP)
    return None


def _chosen_cost(index: CandidateIndex, estimator: CostEstimator, chosen: Sequence[SearchCandidate],
                 region_s: Mapping[int, float]) -> float:
    """The plan's predicted cost as the DP adds it up: its regions, and one boundary per (producer op,
    consuming region) (``plan_cost`` on the plan where every region cost is known)."""
    g = index.graph
    label = {op: c.backend for c in chosen for op in c.ops}
    total = sum(region_s[id(c)] for c in chosen)
    for c in chosen:
        total += sum(transition_seconds(estimator.transition_cost(label[p], c.backend, g.out_bytes[p]))
                     for p in c.inputs)
    return total


class _Window:
    """Builds and solves one window's integer program (module docstring)."""

    def __init__(self, index: CandidateIndex, estimator: CostEstimator, region_s: Mapping[int, float],
                 options: MilpOptions):
        self.index = index
        self.estimator = estimator
        self.region_s = region_s
        self.options = options
        self._trans: dict[tuple[str, str, int], float] = {}

    def transition(self, src: str, dst: str, nbytes: int) -> float:
        key = (src, dst, nbytes)
        if key not in self._trans:
            self._trans[key] = transition_seconds(self.estimator.transition_cost(src, dst, nbytes))
        return self._trans[key]

    def solve(self, free: Sequence[int], placed: Mapping[int, SearchCandidate],
              deadline: float) -> tuple[list[SearchCandidate], bool, int, int]:
        """The chosen candidates starting at ``free`` ops (with ``placed`` fixed), whether proved optimal,
        solves, cuts."""
        g, index = self.index.graph, self.index
        cands = [c for op in free for c in index.starting_at(op)
                 if id(c) in self.region_s and not any(o in placed for o in c.ops)]
        col = {id(c): k for k, c in enumerate(cands)}
        holders: dict[int, dict[str, list[int]]] = {}  # op → backend → columns of candidates holding it
        for k, c in enumerate(cands):
            for op in c.ops:
                holders.setdefault(op, {}).setdefault(c.backend, []).append(k)
        cost = [self.region_s[id(c)] for c in cands]
        rows: list[tuple[list[int], list[float] | None, float, float]] = []  # (columns, values, lb, ub)
        free_set = set(free)
        for op, by_backend in holders.items():  # each window op once; an op past it at most once
            cols = [k for ks in by_backend.values() for k in ks]
            if op in free_set or len(cols) > 1:
                rows.append((cols, None, 1.0 if op in free_set else -math.inf, 1.0))
        w_cost: list[float] = []
        for k, c in enumerate(cands):
            self._charge_placed_consumers(k, c, placed, cost)
            for p in c.inputs:
                if p in placed:
                    cost[k] += self.transition(placed[p].backend, c.backend, g.out_bytes[p])
                elif p in free_set:
                    self._charge_free_producer(k, c, p, holders.get(p, {}), cost, w_cost, rows, len(cands))
                # else p is placed by a later window, which charges this boundary to p's candidates
        n_x = len(cands)
        c_vec = np.array(cost + w_cost)
        # Seconds are tiny numbers: HiGHS's absolute gap (1e-6) would stop it short of the optimum, so the
        # objective is scaled to a largest coefficient of 1e4, and the relative gap set to ~0.
        c_vec *= 1e4 / max(float(np.abs(c_vec[np.isfinite(c_vec)]).max(initial=0.0)), 1e-300)
        barred = [k for k in range(n_x) if not math.isfinite(c_vec[k])]
        c_vec[barred] = 0.0
        integrality = np.r_[np.ones(n_x), np.zeros(len(w_cost))]
        upper = np.r_[np.ones(n_x), np.full(len(w_cost), np.inf)]
        upper[barred] = 0.0
        bounds = Bounds(np.zeros(n_x + len(w_cost)), upper)
        singles = [index.alone(op) for op in free]
        solves, cuts, optimal = 0, 0, True
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or cuts > self.options.max_cuts:
                return self._fallback(singles), False, solves, cuts
            res = milp(c_vec, constraints=_constraint(rows, n_x + len(w_cost)), integrality=integrality,
                       bounds=bounds, options={"time_limit": left, "disp": False, "mip_rel_gap": 1e-9})
            solves += 1
            if res.x is None:
                return self._fallback(singles), False, solves, cuts
            optimal &= res.status == 0
            picked = [cands[k] for k in range(n_x) if res.x[k] > 0.5]
            cycle = _cycle(self.index, picked, placed)
            if cycle is None:
                return picked, optimal, solves, cuts
            if not cycle:
                raise AssertionError("the regions placed by earlier windows feed each other in a cycle")
            rows.append(([col[id(c)] for c in cycle], None, -math.inf, len(cycle) - 1.0))
            cuts += 1

    def _charge_placed_consumers(self, k: int, c: SearchCandidate, placed: Mapping[int, SearchCandidate],
                                 cost: list[float]) -> None:
        """Onto ``x_c``: the boundaries from c's ops into regions placed already (placed ahead of this window
        by a candidate that started earlier): one per (op of c, consuming region)."""
        g = self.index.graph
        for p in c.ops:
            if p in g.constant:
                continue
            for r in {id(placed[q]): placed[q] for q in g.users[p] if q in placed and q not in c.ops}.values():
                cost[k] += self.transition(c.backend, r.backend, g.out_bytes[p])

    def _charge_free_producer(self, k: int, c: SearchCandidate, p: int, by_backend: Mapping[str, list[int]],
                              cost: list[float], w_cost: list[float], rows: list, n_x: int) -> None:
        """The boundary from ``p`` (placed in this window) into ``c``: its cheapest label's price onto ``x_c``,
        each dearer label's extra onto ``w >= x_c + z_pB - 1``, an invalid one as ``x_c + z_pB <= 1``."""
        g = self.index.graph
        t = {b: self.transition(b, c.backend, g.out_bytes[p]) for b in by_backend}
        low = min(t.values(), default=math.inf)
        cost[k] += low  # inf: c cannot take p from any backend (barred)
        if not math.isfinite(low):
            return
        for b, tb in t.items():
            if tb == low:
                continue
            if math.isinf(tb):
                rows.append(([k, *by_backend[b]], None, -math.inf, 1.0))
                continue
            rows.append(([k, *by_backend[b], n_x + len(w_cost)], [1.0] * (1 + len(by_backend[b])) + [-1.0],
                         -math.inf, 1.0))
            w_cost.append(tb - low)

    def _fallback(self, singles: list[SearchCandidate]) -> list[SearchCandidate]:
        """The window's ops alone on the default backend (always acyclic: no convex region can feed an op
        alone that feeds it back)."""
        if any(id(c) not in self.region_s for c in singles):
            raise ValueError("the default backend's op alone is invalid, so no plan covers every op")
        return singles


def _constraint(rows: list[tuple[list[int], list[float] | None, float, float]], n: int) -> LinearConstraint:
    r, cidx, vals = [], [], []
    for i, (cols, values, _, _) in enumerate(rows):
        r += [i] * len(cols)
        cidx += cols
        vals += values if values is not None else [1.0] * len(cols)
    a = coo_array((vals, (r, cidx)), shape=(len(rows), n)).tocsr()
    return LinearConstraint(a, np.array([row[2] for row in rows]), np.array([row[3] for row in rows]))


def _cycle(index: CandidateIndex, picked: Sequence[SearchCandidate],
           placed: Mapping[int, SearchCandidate]) -> list[SearchCandidate] | None:
    """The picked candidates on a cycle of the graph with every placed and picked region collapsed to one
    node and every other op its own (None when it is acyclic); regions placed earlier are fixed, so the
    cycle is cut on the picked."""
    g = index.graph
    region: dict[int, int] = {op: id(c) for op, c in placed.items()}
    region.update((op, id(c)) for c in picked for op in c.ops)
    q = nx.DiGraph()
    for b in g.order:
        rb = region.get(b, -b - 1)
        for a in g.producers[b]:
            ra = region.get(a, -a - 1)
            if ra != rb:
                q.add_edge(ra, rb)
    try:
        edges = nx.find_cycle(q)
    except nx.NetworkXNoCycle:
        return None
    by_id = {id(c): c for c in picked}
    return [by_id[a] for a, _ in edges if a in by_id]
