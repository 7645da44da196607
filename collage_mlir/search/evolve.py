"""Graph-level optimizer (Collage's second level): an evolutionary search over whole plans judged by
measured end-to-end time, then a side-by-side re-measurement of the finalists.

The genome has one gene per *unit*: the common refinement of the seed plans' regions (ops that every
seed keeps together). A gene is (label choice, join bit): a label is a backend that can take the unit and
a precision (float too where the unit dequantizes and float regions are searched); decoding
labels each unit, joins adjacent units of one label whose join bits are set (a merge; a cleared bit
is a split), keeps a joined group only where it is convex and the backend takes it (else grows it
greedily unit by unit), and splits any region that would close a cycle. Collage's settings are the
defaults: population 50, two-point crossover with probability 0.5, bit-flip mutation, tournament of 5.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..backends import Precision, RegionKey
from ..errors import CollageError
from ..plan import Plan, PlanKey, Region
from .cost import Cost, CostEstimator
from .index import SearchGraph

Accepts = Callable[[str, frozenset[int]], bool]
#: What a unit is given: a backend and a precision.
Label = tuple[str, Precision]


@dataclass
class EvolveOptions:
    population: int = 50
    crossover: float = 0.5
    tournament: int = 5
    max_generations: int = 30
    patience: int = 4  # generations without a better plan before stopping early
    finalists: int = 3  # best evolved plans re-measured beside the seeds
    rounds: int = 3  # interleaved re-measurement rounds
    #: Single-backend seeds within this fraction of the fastest one are all finalists (at most
    #: ``close_singles`` of them; the runner-up always), and the incumbent is the one with the best median
    #: over the rounds: one seed timing cannot tell a near-tie (BERT-base: 121.75 vs 122.11 ms, the bench
    #: then 117 vs 112), and a fastest seed's one timing can be its luck (a JAX text CNN: OpenVINO's seed
    #: 0.96 ms, its rounds 2.14 ms, while ORT's seed, 21 % behind, ran 1.16 ms and was never re-timed).
    close: float = 0.15
    close_singles: int = 3
    seed: int = 0
    deadline: float | None = None  # time.monotonic() after which no generation starts
    #: ``time.monotonic()`` after which no finalists' round starts (none at all past it: the search's timings decide): the
    #: end of the whole budget.
    final_deadline: float | None = None


@dataclass
class Finalist:
    plan: Plan
    name: str  # "evolved", "dp", "carried..." (``tune``'s carried plans), or the single backend's name
    times: list[float] = field(default_factory=list)  # the search's measurement, then each round's
    spread: float = 0.0

    @property
    def median_s(self) -> float:
        return statistics.median(self.times) if self.times else math.inf


@dataclass
class EvolveResult:
    plan: Plan
    chosen: Finalist
    incumbent: Finalist  # the best single-backend plan: what the choice had to beat
    finalists: list[Finalist]
    generations: int
    plans_timed: int
    why: str


class _Decoder:
    def __init__(self, graph: SearchGraph, units: list[frozenset[int]], options: list[list[Label]], accepts: Accepts,
                 default_backend: str):
        self.g, self.units, self.options, self.accepts = graph, units, options, accepts
        self.default: Label = (default_backend, Precision.MODEL)
        unit_of = {op: k for k, u in enumerate(units) for op in u}
        self.adjacent = [sorted({unit_of[p] for op in u for p in graph.producers[op]} - {k}) for k, u in enumerate(units)]
        self._ok: dict[RegionKey, bool] = {}

    def ok(self, label: Label, ops: frozenset[int]) -> bool:
        key = RegionKey(label[0], ops, label[1])
        if key not in self._ok:
            self._ok[key] = self.g.is_convex(ops) and self.accepts(label[0], ops) and (
                label[1] is Precision.MODEL or self.g.has_float_form(ops))
        return self._ok[key]

    def decode(self, genome: list[tuple[int, int]], source: str) -> Plan:
        label = [self.options[k][c] for k, (c, _) in enumerate(genome)]
        parent = list(range(len(self.units)))

        def find(a: int) -> int:
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        for k, preds in enumerate(self.adjacent):
            for p in preds:
                if label[k] == label[p] != self.default and genome[k][1] and genome[p][1]:
                    parent[find(k)] = find(p)
        groups: dict[int, list[int]] = {}
        for k in range(len(self.units)):
            if label[k] != self.default:
                groups.setdefault(find(k), []).append(k)
        proposed: list[tuple[Label, list[int]]] = []
        for members in groups.values():
            backend = label[members[0]]
            if len(members) > 1 and self.ok(backend, frozenset().union(*(self.units[m] for m in members))):
                proposed.append((backend, members))
                continue
            current: list[int] = []
            for m in members:  # units are in topological order
                grown = frozenset().union(*(self.units[x] for x in (*current, m)))
                if current and self.ok(backend, grown):
                    current.append(m)
                    continue
                if current:
                    proposed.append((backend, current))
                current = [m] if self.ok(backend, self.units[m]) else []
            if current:
                proposed.append((backend, current))
        proposed.sort(key=lambda bm: bm[1][0])
        regions: list[RegionKey] = []
        for backend, members in proposed:
            ops = frozenset().union(*(self.units[m] for m in members))
            if self.g.acyclic([r.ops for r in regions] + [ops]):
                regions.append(RegionKey(backend[0], ops, backend[1]))
                continue
            for m in members:  # split what would close a cycle; units that still do stay on the default
                if self.ok(backend, self.units[m]) and self.g.acyclic([r.ops for r in regions] + [self.units[m]]):
                    regions.append(RegionKey(backend[0], self.units[m], backend[1]))
        regions.sort(key=lambda r: min(self.g.pos[i] for i in r.ops))
        return Plan([Region(f"region_{k}", r.backend, r.ops, r.precision) for k, r in enumerate(regions)],
                    self.default[0], source)

    def encode(self, plan: Plan) -> list[tuple[int, int]]:
        owner = {op: r for r in plan.regions for op in r.ops}
        genome = []
        for k, unit in enumerate(self.units):
            r = owner.get(next(iter(unit)))
            label = (r.backend, r.precision) if r is not None else self.default
            choice = self.options[k].index(label) if label in self.options[k] else 0
            genome.append((choice, int(r is not None and len(r.ops) > len(unit))))
        return genome


def refine(graph: SearchGraph, plans: Sequence[Plan]) -> list[frozenset[int]]:
    """The units: ops grouped by the region each plan puts them in, split into connected pieces, in
    topological order of their first op."""
    owner = [{op: k for k, r in enumerate(p.regions) for op in r.ops} for p in plans]
    groups: dict[tuple, set[int]] = {}
    for op in graph.order:
        groups.setdefault(tuple(o.get(op, -1 - op) for o in owner), set()).add(op)
    units: list[frozenset[int]] = []
    for ops in groups.values():
        left = set(ops)
        while left:
            start = min(left, key=graph.pos.__getitem__)
            piece, stack = {start}, [start]
            while stack:
                n = stack.pop()
                for m in (*graph.producers[n], *graph.users[n]):
                    if m in left and m not in piece:
                        piece.add(m)
                        stack.append(m)
            left -= piece
            units.append(frozenset(piece))
    return sorted(units, key=lambda u: min(graph.pos[i] for i in u))


def evolve(graph: SearchGraph, seeds: Sequence[tuple[str, Plan]], backends: Sequence[str], accepts: Accepts,
           estimator: CostEstimator, options: EvolveOptions | None = None,
           on_progress: Callable[[str, int, float], None] | None = None, float_regions: bool = False) -> EvolveResult:
    """The plan with the lowest measured end-to-end time found from ``seeds`` ((name, plan): the DP plan
    and every single-backend plan); never one that loses to the best single-backend seed beyond the
    spread of their side-by-side re-measurement. ``float_regions``: a unit that dequantizes may also be
    labelled float (on any backend that takes it, the default one included)."""
    opt = options or EvolveOptions()
    rng = random.Random(opt.seed)
    default = estimator.default_backend
    # Plans by value (``Plan.key``): a decoded genome equal to a plan timed already is not timed again.
    times: dict[PlanKey, Cost] = {}
    plans: dict[PlanKey, Plan] = {}

    def spent() -> bool:
        return opt.deadline is not None and time.monotonic() > opt.deadline

    for _, plan in seeds:
        if plan.key not in times:
            times[plan.key] = estimator.plan_time(plan, tag="seed")
        plans.setdefault(plan.key, plan)
    if spent():  # no plan would be timed: no units, genomes or acceptance checks (MobileNetV2's: 1.5 s)
        return _final(seeds, times, plans, estimator, opt, 0, on_progress)
    units = refine(graph, [p for _, p in seeds])
    precisions = (Precision.MODEL, Precision.FLOAT) if float_regions else (Precision.MODEL,)
    choices = [[(default, Precision.MODEL)]
               + [(b, p) for b in backends for p in precisions if (b, p) != (default, Precision.MODEL)
                  and accepts(b, u) and (p is Precision.MODEL or graph.has_float_form(u))] for u in units]
    dec = _Decoder(graph, units, choices, accepts, default)

    def fitness(genome) -> float:
        if spent():
            return math.inf  # it would not be timed; decoding a large model's genome alone takes seconds
        plan = dec.decode(genome, "evolved")
        k = plan.key
        if k not in times:
            times[k] = estimator.plan_time(plan)
            plans[k] = plan
        return times[k].seconds if times[k].usable else math.inf

    population = [dec.encode(p) for _, p in seeds]
    n = len(units)

    def mutate(genome, rate: float):
        out = []
        for k, (c, j) in enumerate(genome):
            if len(choices[k]) > 1 and rng.random() < rate:
                c = rng.choice([x for x in range(len(choices[k])) if x != c])
            if rng.random() < rate:
                j = 1 - j
            out.append((c, j))
        return out

    # Past the deadline no plan would be timed: no population to decode (a large model's decoding is
    # minutes of convexity and acceptance checks), straight to the finalists.
    tries = 0
    while len(population) < opt.population and tries < 10 * opt.population and n and not spent():
        tries += 1
        child = mutate(population[tries % len(seeds)], 2.0 / n)
        if child not in population:
            population.append(child)
    scores = [fitness(g) for g in population]
    best = min(scores)
    stale = generation = 0
    if on_progress:
        on_progress("evolve", 0, best)
    while generation < opt.max_generations and stale < opt.patience and n:
        if spent():
            break
        generation += 1

        def pick():
            contenders = [rng.randrange(len(population)) for _ in range(opt.tournament)]
            return population[min(contenders, key=lambda i: (scores[i], i))]

        elite = population[min(range(len(population)), key=lambda i: (scores[i], i))]
        nxt = [elite]
        while len(nxt) < len(population):
            a, b = pick(), pick()
            if rng.random() < opt.crossover and n > 1:
                i, j = sorted(rng.sample(range(n + 1), 2))
                child = a[:i] + b[i:j] + a[j:]
            else:
                child = list(a)
            nxt.append(mutate(child, 1.0 / n))
        population, scores = nxt, [fitness(g) for g in nxt]
        gen_best = min(scores)
        stale = 0 if gen_best < best else stale + 1
        best = min(best, gen_best)
        if on_progress:
            on_progress("evolve", generation, best)
    return _final(seeds, times, plans, estimator, opt, generation, on_progress)


def _single(name: str | None) -> bool:
    """Whether a seed of this name is a single-backend plan (not the DP's, not a carried one)."""
    return name is not None and name != "dp" and not name.startswith("carried")


def _final(seeds, times: dict[PlanKey, Cost], plans: dict[PlanKey, Plan], estimator: CostEstimator,
           opt: EvolveOptions, generations: int, on_progress) -> EvolveResult:
    """Re-measures the best evolved plans, the DP plan and the best single-backend plan side by side,
    interleaved, and keeps the single-backend plan unless another's median wins by more than the larger
    relative spread of the two and it is faster in most rounds."""
    seed_names = {p.key: name for name, p in seeds}
    ranked = sorted((k for k, c in times.items() if c.usable), key=lambda k: (times[k].seconds, k))
    singles = [k for k in ranked if _single(seed_names.get(k))]
    close = [k for k in singles if times[k].seconds <= times[singles[0]].seconds * (1 + opt.close)]
    picks = [k for k in ranked if k not in seed_names][:opt.finalists]
    picks += [k for k in ranked if k in seed_names and not _single(seed_names[k])]  # the DP's and carried plans
    picks += close[:max(1, opt.close_singles)] + singles[:2]
    finalists = [Finalist(plans[k], seed_names.get(k, "evolved"), [times[k].seconds], times[k].spread)
                 for k in dict.fromkeys(picks)]
    # A round that would end past the budget does not start (a warm 10 s search again of ResNet-50 began one
    # at 9.8 s, which took 34 s): the first is the estimator's guess (builds not at hand included), a later
    # one as long as the one before.
    round_s = sum(estimator.retime_s(f.median_s, f.plan) for f in finalists)
    for r in range(opt.rounds):
        began = time.monotonic()
        if opt.final_deadline is not None and began + round_s > opt.final_deadline:
            break  # the budget is spent: the rounds so far decide (none: the search's own timings)
        for f in finalists:  # interleaved: every finalist once per round
            c = estimator.plan_time(f.plan, tag=f"final{r}")
            if c.usable:
                f.times.append(c.seconds)
                f.spread = max(f.spread, c.spread)
        round_s = time.monotonic() - began
        if on_progress:
            on_progress("finalists", r + 1, min((f.median_s for f in finalists), default=math.inf))
    if not finalists:
        raise CollageError("no plan could be measured (every seed failed or the budget was spent)")
    # The best single backend over the same interleaved rounds (ties: the faster seed, listed first).
    incumbent = min((f for f in finalists if f.name != "evolved" and _single(f.name)), key=lambda f: f.median_s,
                    default=finalists[0])
    challenger = min(finalists, key=lambda f: (f.median_s, f.name))
    win = (incumbent.median_s - challenger.median_s) / incumbent.median_s
    margin = max(incumbent.spread, challenger.spread)
    # The rounds were interleaved: a real win also shows in most of them, not only in the medians.
    rounds_won = sum(c < i for c, i in zip(challenger.times[1:], incumbent.times[1:]))
    if challenger is not incumbent and win > margin and rounds_won * 2 > len(incumbent.times[1:]):
        chosen, why = challenger, (f"{challenger.name} plan beat the best single backend ({incumbent.name}) by "
                                   f"{win:.1%}, more than the measured spread {margin:.1%}")
    else:
        chosen = incumbent
        why = (f"best single backend ({incumbent.name}): no plan beat it by more than the measured spread "
               f"{margin:.1%} (best other: {challenger.name}, {win:+.1%})" if challenger is not incumbent
               else f"best single backend ({incumbent.name}) was also the fastest finalist")
    plan = Plan(chosen.plan.regions, chosen.plan.default_backend, "tune")
    return EvolveResult(plan, chosen, incumbent, finalists, generations, len(times), why)
