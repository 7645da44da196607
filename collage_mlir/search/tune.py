"""`collage tune`: the two-level search end to end. Candidates (with maximal regions) → transition
fit → operator-level DP on measured region costs → evolutionary search on measured whole-plan times,
seeded with the DP plan and every single-backend plan → side-by-side re-measurement of the finalists →
a plan JSON that says, per region, what it costs, what came second and why."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from ..backends import Backend, BackendKind, RegionKey, get_backend
from ..backends.base import crossing_type_problem
from ..errors import CollageError
from ..graph import Graph, number_ops
from ..ir import ir
from ..measure import HARNESS_VERSION
from ..measure.db import CostDB
from ..measure.device import device_fingerprint, platform_problem
from ..measure.harness import MeasureOptions, module_digest
from ..plan import Plan, PlanKey
from .cost import Cost, plan_cost
from .dp import EXACT, EXACT_MAX_OPS, DpLimits, optimize, reachable_candidates
from .evolve import EvolveOptions, EvolveResult, evolve
from .index import CandidateIndex, SearchGraph
from .index_cache import cached_regions, candidate_regions
from .measured import MeasuredEstimator
from .milp import exact_plan
from .priority import measure_by_priority
from .regions import maximal_regions
from .record import ChosenTimes, Finalist, PlanTimes, RegionChoice, TunedPlan, TuneRecord
from .simple_plans import float_plans, single_backend_plans

#: on_progress(stage, done, total, note): stage is "candidates", "seeds", "transitions", "regions", "dp",
#: "evolve", "finalists"; total is None when unknown.
OnProgress = Callable[[str, int, "int | None", str], None]


@dataclass
class TuneResult:
    plan: Plan
    tuned: TunedPlan  # the plan with the tuning record (``tuned.to_json()``: the document written)
    evolved: EvolveResult | None  # None when ``reused``
    dp_plan: Plan
    single: dict[str, Plan]
    candidates: int
    estimator: MeasuredEstimator | None  # None when ``reused``
    #: The search did not run: a finished tune with the same model, inputs, backends (and versions),
    #: seed and budget on this device left this result in the DB.
    reused: bool = False
    #: Ctrl-C stopped the search: ``plan`` is the fastest plan timed by then (nothing kept as a finished
    #: tune; a rerun resumes from the rows measured).
    interrupted: bool = False

    @property
    def measured(self) -> int:
        """Rows measured by this call (regions and plans); 0 when reused."""
        return self.estimator.measured if self.estimator else 0

    @property
    def cache_hits(self) -> int:
        return self.estimator.cache_hits if self.estimator else 0


#: What the DB keeps of a finished tune (``_result_key``): its document and the plans it compared.
TUNE_RESULT = "tune-result"


def accepts_fn(graph: Graph, default_backend: str) -> Callable[[str, frozenset[int]], bool]:
    cache: dict[RegionKey, bool] = {}

    def accepts(backend: str, ops: frozenset[int]) -> bool:
        key = RegionKey(backend, ops)
        if key not in cache:
            cache[key] = backend == default_backend or (get_backend(backend).accepts(graph, ops) is None
                                                        and crossing_type_problem(graph, ops) is None)
        return cache[key]

    return accepts


#: Of the budget, what is kept for the finalists' interleaved rounds (15 s of 600 on ResNet-50).
FINALISTS_SHARE = 0.03
#: At most this share of the budget goes to the integer program beside the DP (it stops at the DP's deadline).
MILP_SHARE = 0.05
#: Share of the budget kept past the finalists' last round, for the tuning record (DB reads) and writing.
RECORD_SHARE = 0.01
#: What the DP and its plan's build and timing are given after the regions, in slowest-seed builds.
DP_BUILDS = 2.0
#: Kept past the stages' deadline for the DP on what was measured and the tuning record (DB reads): 1.0-1.5 s
#: on MobileNetV2's and ResNet-50's 34 000 candidates at load 2-3, a warm 10 s search again's overrun.
TAIL_S = 1.0

#: What the DB keeps (by module digest) of how long the seeds' whole-model builds took.
SEED_BUILDS = "seed-build-seconds"

#: The reference capture's expected length, in default-seed builds (see ``tune``).
CAPTURE_FACTOR = 3.0

#: Of the budget left when they start, what the transition probes may use (a probe is a two-region
#: build; they are facts of the machine, so the DB keeps them for every later tune).
TRANSITION_SHARE = 0.15
#: The shortest window worth starting transition probes in: a probe's build and timing took 2-5 s here (a
#: warm 10 s search again spent 4.4 s starting probes in a 0.7 s window and stopping them).
PROBE_WINDOW_S = 5.0


def tune(module: ir.Module, backends: Sequence[Backend], db: CostDB, work_dir: str | Path, *, budget_s: float,
         seed: int = 0, examples: Mapping[str, Sequence[np.ndarray]] | None = None,
         measure: MeasureOptions | None = None, evolve_options: EvolveOptions | None = None,
         on_progress: OnProgress | None = None, reuse: bool = True, in_context: bool = True,
         started: float | None = None, float_regions: bool = True, carried: Sequence[Plan] = ()) -> TuneResult:
    """Finds the plan of ``module`` with the lowest measured end-to-end time on ``backends`` (the default
    backend is always added) within ``budget_s`` seconds.

    Stages, each starting no new unit of work past the deadline: candidate index, while the single-backend
    seed plans build; the seeds timed whole (graph engines, libraries, codegen, then the default backend's,
    whose build is the reference and the fallback); transition probes (at most ``TRANSITION_SHARE`` of what is
    left); region costs in priority order (``priority.py``), stopping a seed build's time early so the
    DP plan can still be timed; the DP (a beam, Collage's own DP past the deadline); the DP plan's
    timing (skipped where its build would end past the deadline); the evolution (one plan timing at a
    time). Builds still running at the deadline are stopped (the default seed's never); past it only the
    finalists' interleaved re-timing rounds start (their builds are kept: timing only), until the budget's
    end. So a tune ends at most a seed's timing, a batch of region timings or the DP past its budget; the
    default seed is the exception when the budget is shorter than its build.

    A finished tune is kept in the DB under the model (and its example inputs), the backends with their
    versions, the device, the seed, the budget and the search options; with ``reuse`` the same call
    returns it without searching (same bytes, in about the time it takes to read the DB). A tune that
    was interrupted left no result, so its rerun searches, reusing every row it measured; a rerun with
    another budget (or ``reuse=False``) searches again on the DB's rows, measuring what they lack.

    ``in_context``: price the regions inside a graph engine's maximal regions from its per-node profile of
    its seed, and leave unmeasured what that profile says cannot win (``MeasuredEstimator.price_in_context``).
    ``started``: when the user's clock started (``time.monotonic()``; default now), so that what came before
    the call (loading and importing the model) is spent from the budget too.
    ``float_regions``: a region that dequantizes is also a candidate in its float form (its quantize/
    dequantize pairs removed), so each region's precision is chosen with its engine by measured time.
    ``carried``: plans of this module found elsewhere (another shape bucket's tuned plan, ``transfer``), timed
    after the single-backend seeds and seeding the evolution beside them."""
    report = on_progress or (lambda *a: None)
    # Every stage but the finalists' rounds (timing only, on kept builds) keeps to this deadline.
    started = time.monotonic() if started is None else started
    deadline = started + budget_s * (1.0 - FINALISTS_SHARE)
    measure = measure or MeasureOptions()
    measure.seed = seed
    platform, default = measure.platform, measure.default_backend
    if (why := platform_problem(platform)) is not None:
        raise CollageError(why)
    elsewhere = [b.name for b in backends if platform not in b.platforms]
    if elsewhere:
        raise CollageError(f"backends {', '.join(elsewhere)} cannot run regions in a {platform.value} program")
    if default not in {b.name for b in backends}:
        backends = [get_backend(default), *backends]
    names = [b.name for b in backends]
    number_ops(module)
    graph = Graph(module)
    if "main" not in {n.func for n in graph.nodes.values()}:
        raise CollageError("the model has no public @main function to time")
    opts = evolve_options or EvolveOptions()
    digest = module_digest(module)
    result_key = _result_key(digest, backends, examples, seed, budget_s, opts, measure, float_regions, carried)
    if reuse and (stored := db.get_cached(TUNE_RESULT, result_key)) is not None:
        record = json.loads(stored)
        report("reused", 1, 1, "a finished tune with these settings is in the DB")
        tuned = TunedPlan.from_json(record["document"], source="tune")
        return TuneResult(tuned.plan, tuned, None,
                          Plan.from_json(record["dp_plan"], source="dp"),
                          {n: Plan.from_json(p, source=n) for n, p in record["single"].items()},
                          record["candidates"], None, reused=True)
    report("candidates", 0, None, "")
    est = MeasuredEstimator(module, backends, db, work_dir, examples=examples, options=measure, deadline=deadline,
                            on_progress=lambda stage, p: report(stage, p.done, p.total,
                                                                f"hits {p.cache_hits}  failures {p.failures}"))
    est.use_in_context = in_context
    candidates = 0
    try:
        # A rerun on this DB reads the candidates instead of enumerating them (the backends' checks, ~12 s on
        # ResNet-50 idle, 38 s on BERT-base under load). The seeds need only the maximal regions: they build
        # in the workers while this process enumerates (before, no seed build started in a 120 s tune of
        # BERT-base until 39 s had gone, and OpenVINO's seed was not built in time).
        cached = cached_regions(backends, db, digest)
        maximal = cached[1] if cached else {b.name: maximal_regions(graph, b) for b in backends}
        single = single_backend_plans(graph, backends, maximal, measure.platform)
        if float_regions:  # each engine's float form beside it: the float peer a mixed precision must beat
            single |= float_plans(graph, single, backends)
        # The default seed is the fallback plan: built whatever the deadline, unless the DB already holds a
        # usable seed (a search again of MobileNetV2 with 10 s whose DB lacked IREE alone's timing built it
        # for 45 s, with OpenVINO's plan in hand).
        fallback = not any(est.plan_known(p, "seed") and est.plan_time(p, "seed").usable for p in single.values())
        building = ThreadPoolExecutor(1, thread_name_prefix="collage-seeds")
        try:
            seeds = building.submit(_build_seeds, single, backends, est, started, deadline, report, fallback,
                                    carried)
            found, _ = cached or candidate_regions(graph, backends, db, digest, maximal)
            index = CandidateIndex(SearchGraph.from_graph(graph), found, maximal, default_backend=default,
                                   float_regions=float_regions)
            candidates = len(index)
            report("candidates", candidates, candidates, f"{candidates} candidates")
            build_s = seeds.result()
        finally:
            building.shutdown(wait=False)  # Ctrl-C: est.close() below stops the builds
        return _search(graph, backends, names, index, maximal, single, build_s, db, digest, result_key, est, opts,
                       measure, started, deadline, budget_s, seed, report, fallback, carried)
    except KeyboardInterrupt:
        if est.fastest is None:
            raise  # nothing timed yet: nothing to return
        return _interrupted(est, names, seed, budget_s, candidates, time.monotonic() - started)
    finally:
        est.close()


def _search(graph: Graph, backends, names, index, maximal, single: dict[str, Plan], build_s: dict[PlanKey, float],
            db: CostDB, digest: str, result_key: str, est: MeasuredEstimator, opts: EvolveOptions,
            measure: MeasureOptions, started: float, deadline: float, budget_s: float, seed: int,
            report: OnProgress, fallback: bool = True, carried: Sequence[Plan] = ()) -> TuneResult:
    """The stages of ``tune`` after the candidate index and the seeds' builds (``build_s``): the seeds'
    timings, transitions, regions, DP, evolution, finalists; stores the finished result in the DB."""
    default = measure.default_backend
    walls, seed_costs = _time_seeds(single, backends, est, deadline, report, build_s, fallback)
    prebuilt = set(build_s)
    timed, build_s = set(walls), max(walls.values(), default=0.0)
    # A seed that is one region over every op but constants timed that region whole: the DP prices
    # the region by it (else the region, a whole-model build, comes last in the regions stage and
    # the budget rarely reaches it, so the DP could not take the best engine's whole-model plan).
    ops = frozenset(index.graph.order) - index.graph.constant
    for name, c in sorted(seed_costs.items()):
        regions = single[name].regions
        if len(regions) == 1 and ops <= regions[0].ops and c.usable:
            est.timed_whole(regions[0].key, c)
    default_s = walls.get(default, 0.0)
    # A rerun whose seeds were DB hits does not know how long a whole-model build takes here; the run
    # that built them left it in the DB (else a warm rerun would start the capture, a whole-model
    # compile of minutes, whatever its budget).
    if default_s > 1.0:
        db.put_cached(SEED_BUILDS, digest, json.dumps({"default": default_s, "slowest": build_s}))
    elif (stored := db.get_cached(SEED_BUILDS, digest)) is not None:
        known = json.loads(stored)
        default_s, build_s = max(default_s, known["default"]), max(build_s, known["slowest"])
    est.build_s = build_s
    # The finalists' rounds re-time up to 5 plans 3 times, each about as long as the median seed's
    # re-timing (BERT-base under load: 73 s in all, where 3 % of 600 s had been kept; the slowest seed's,
    # IREE alone, would keep 2 minutes of ResNet-50's budget). The same estimate as the rounds' own.
    # After the stages, the DP on what was measured and the record take TAIL_S.
    usable = [c.seconds for c in seed_costs.values() if c.usable]
    finals_s = opts.rounds * (opts.finalists + 1 + opts.close_singles) * (
        est.retime_s(statistics.median(usable)) if usable else 0.0)
    deadline = min(deadline, started + budget_s - finals_s - TAIL_S)
    est.deadline = deadline
    # An engine's in-context profile is a whole-model build and a profiled run: about as long as its seed
    # took where this run built it, else as the slowest seed build known (a warm 10 s search again of
    # MobileNetV2 spent 6 s building OpenVINO's profile, stopped at the deadline).
    expected = {n: walls[n] if walls.get(n, 0.0) > 1.0 else build_s for n in single}
    est.price_in_context(single, maximal, seed_costs, frozenset(i for i, n in graph.nodes.items() if n.op.name in (
        "stablehlo.convolution", "stablehlo.dot_general")), index.graph.constant, expected)
    window = TRANSITION_SHARE * max(0.0, deadline - time.monotonic())
    # A window shorter than a probe's build and timing only starts workers and stops them: the DB's probes.
    est.fit_transitions(deadline=time.monotonic() + (window if window >= PROBE_WINDOW_S else 0.0),
                        on_progress=lambda k, n: report("transitions", k, n, ""))
    exact = len(index.graph.order) <= EXACT_MAX_OPS
    # The DP's beam degrades to Collage's DP one slowest-seed build before the deadline, so its
    # plan can still be built and timed (BERT-base: the beam alone ran 2-3 minutes under load).
    dp_deadline = deadline - build_s
    limits = replace(EXACT if exact else DpLimits(), deadline=dp_deadline)
    # Regions stop early enough to run the DP and build and time its plan within the budget: a
    # whole-plan build takes about as long as the slowest seed's did; on ResNet-50 the DP and its
    # plan (19 regions) took 2x that.
    est.deadline = deadline - DP_BUILDS * build_s
    # The regions' reference capture is one whole-model IREE compile returning every intermediate
    # value: unfused, it took ~3x the default seed's build on ResNet-50 (56 s against 17 s).
    est.options.capture_s = CAPTURE_FACTOR * default_s
    reachable = reachable_candidates(index, exact, limits)
    report("regions", 0, len(reachable), "")
    measure_by_priority(index, est, reachable)
    # The DP prices with what the regions stage measured: a region it poses that nothing measured stays
    # unknown (its region_costs would otherwise build and time those, and the reference capture, up to the
    # deadline and past it: a warm 10 s search again of MobileNetV2 spent 24 s there).
    report("dp", 0, None, "")
    dp = optimize(index, est, exact=exact, limits=limits, deadline=dp_deadline)
    # The integer program beside the DP, on the DP's region costs (it measures nothing): the plan it
    # predicts cheaper goes on as the DP's (on the zoo it proved the DP's plan optimal: studies/milp).
    dp_plan = dp.plan
    milp_s = min(MILP_SHARE * budget_s, dp_deadline - time.monotonic())
    if milp_s > 0:
        best = exact_plan(index, est, milp_s, dp=dp, costs=dp.costs)
        dp_plan = Plan(best.plan.regions, best.plan.default_backend, "dp") if best.source == "milp" else dp.plan
        report("dp", 1, 1, f"{best.source}: {best.cost_s * 1e3:.3f} ms predicted" + (" (proved)" if best.proved else ""))
    est.deadline = deadline
    sg = index.graph
    # Single-backend plans first: where the DP plan is one of them it keeps the backend's name (the
    # incumbent the search must beat is always measured as such). Plans the budget left untimed are
    # not seeds (a seed is timed whatever the deadline).
    seeds: list[tuple[str, Plan]] = []
    seen: set[PlanKey] = set()
    # The DP plan is timed where its build (about the slowest seed's) can end by the deadline: a warm 10 s
    # search again of MobileNetV2 built it for a minute.
    dp_timed = time.monotonic() + build_s <= deadline or dp_plan.key in {single[n].key for n in timed} \
        or est.plan_known(dp_plan, "seed")
    for name, plan in [*((n, single[n]) for n in single if n in timed), *((("dp", dp_plan),) if dp_timed else ())]:
        if plan.key not in seen:
            seen.add(plan.key)
            seeds.append((name, plan))
    # A carried plan is timed where it was built with the seeds (always, unless the build failed), the DB
    # has it or its build can end by the deadline, and seeds the evolution where it runs.
    for k, plan in enumerate(carried):
        if plan.key in seen or not (plan.key in prebuilt or est.plan_known(plan, "seed")
                                    or time.monotonic() + build_s <= deadline):
            continue
        if est.plan_time(plan, tag="seed").usable:
            seen.add(plan.key)
            seeds.append((f"carried{k or ''}", plan))
    opts.seed, opts.deadline = seed, deadline
    # The finalists' rounds past the first stop where the budget ends (what is left is for the record).
    opts.final_deadline = started + budget_s * (1.0 - RECORD_SHARE)
    accepts = accepts_fn(graph, default)
    evolved = evolve(sg, seeds, names, accepts, est, opts,
                     on_progress=lambda stage, k, best: report(stage, k, opts.max_generations if stage == "evolve"
                                                               else opts.rounds, f"best {best * 1e3:.3f} ms"),
                     float_regions=index.float_regions)
    est.deadline = min(deadline, time.monotonic())  # the record measures nothing new: DB and memory only
    tuned = _tuned_plan(evolved, dp_plan, dp_timed, {n: p for n, p in single.items() if n in timed},
                         sg, est, accepts, names, seed, budget_s, len(index),
                         tuple(n for n in single if n not in timed))
    db.put_cached(TUNE_RESULT, result_key, json.dumps({
        "document": tuned.to_json(), "dp_plan": dp_plan.to_json(), "candidates": len(index),
        "single": {n: p.to_json() for n, p in single.items()}}))
    return TuneResult(evolved.plan, tuned, evolved, dp_plan, single, len(index), est)


def _interrupted(est: MeasuredEstimator, names: list[str], seed: int, budget_s: float, candidates: int,
                 elapsed_s: float) -> TuneResult:
    """What a tune stopped by Ctrl-C returns: the fastest plan timed by then (a seed, the DP plan or an
    evolved one), with a record saying so; nothing is stored as a finished tune."""
    plan, cost, tag = est.fastest
    chosen = Plan(plan.regions, plan.default_backend, "tune")
    name = plan.source if tag == "seed" else tag or "plan"
    record = TuneRecord(seed=seed, budget_s=budget_s, backends=tuple(names), candidates=candidates,
                        plans_timed=est.measured,
                        why=f"interrupted after {elapsed_s:.0f} s: the fastest plan timed by then ({name})",
                        plan=ChosenTimes(None, cost.seconds, cost.spread, name),
                        dp=PlanTimes(None, None, 0), single_backend={})
    return TuneResult(chosen, TunedPlan(chosen, (), record), None, Plan([], est.default_backend, "dp"), {},
                      candidates, est, interrupted=True)


def _result_key(module_digest: str, backends: Sequence[Backend], examples, seed: int, budget_s: float,
                opts: EvolveOptions, measure: MeasureOptions, float_regions: bool, carried: Sequence[Plan] = ()) -> str:
    """What a finished tune's result is kept under: the numbered module's digest, the example inputs, the
    backends with their versions, this device, the harness version, the seed, the budget and the search
    options (a deadline is not an option: it comes from the budget)."""
    digest = hashlib.sha256(module_digest.encode())
    for name in sorted(examples or {}):
        for a in examples[name]:
            digest.update(name.encode() + np.ascontiguousarray(a).tobytes())
    search = {k: v for k, v in asdict(replace(opts, deadline=None, final_deadline=None)).items()}
    if not float_regions:  # (a tune stored before the option had none: it searched no float region either)
        search["float_regions"] = False
    if carried:  # (likewise: none before)
        search["carried"] = sorted(json.dumps(p.to_json(), sort_keys=True) for p in carried)
    text = json.dumps({"model": digest.hexdigest(), "backends": sorted(f"{b.name}={b.version()}" for b in backends),
                       "device": device_fingerprint(measure.platform)[0], "harness": HARNESS_VERSION, "seed": seed,
                       "budget_s": budget_s, "search": search}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


#: Seeds in this order: the default backend first (its build is also the reference every plan is checked
#: against), then graph engines (one engine compile; IREE compiles only the glue), libraries, and other
#: codegen backends last (another whole-model IREE compile each).
_SEED_ORDER = (BackendKind.GRAPH, BackendKind.LIBRARY, BackendKind.KERNEL, BackendKind.CODEGEN)
#: About what timing one built seed takes (load, the check run, warm-up, ~1 s of samples: 4.4-8.9 s on
#: ResNet-50 and BERT-base, under 1 s on small models): the seeds' builds stop this much per seed before the
#: deadline, so that every seed built is timed by then.
SEED_TIMING_S = 5.0
#: ... but at most this share of the budget per seed: with 5 s a seed, a 10 s budget (one shape bucket's
#: share of a 40 s tune) built no engine's seed at all, though a MobileNetV2 seed times in about a second;
#: a large model's seeds built in a short budget are then timed past it (while none is usable, as ever).
SEED_TIMING_SHARE = 0.1
#: ... and all of them together at most this share of what is left when the builds start: a tune that had
#: spent its first 18 s of 60 importing a small dynamically quantized BERT kept 40 s for its 8 seeds'
#: timings, so no engine's seed was built (2 s each) and IREE alone, 3.6x slower than ONNX Runtime's, won.
SEED_RESERVE_SHARE = 0.5


def _seed_order(single: dict[str, Plan], backends: Sequence[Backend], default: str) -> list[str]:
    """The seeds' build order: the default backend's first (the longest, and the reference), then by kind."""
    kind = {b.name: b.kind for b in backends}
    return sorted(single, key=lambda n: (n != default, _SEED_ORDER.index(kind[_backend_of(n, single)]), n))


def _backend_of(name: str, single: dict[str, Plan]) -> str:
    """The backend seed ``name`` runs on (a float seed's regions are its engine's)."""
    regions = single[name].regions
    return regions[0].backend if regions else name


def _build_seeds(single: dict[str, Plan], backends: Sequence[Backend], est: MeasuredEstimator, started: float,
                 deadline: float, report: OnProgress, fallback: bool = True,
                 carried: Sequence[Plan] = ()) -> dict[PlanKey, float]:
    """Builds the single-backend plans the DB cannot answer side by side (an engine's compile beside IREE's
    whole-model one), to be timed one by one; each build's seconds. A build still running when the builds'
    time is up is stopped (it would overrun the budget by a whole-model compile: ResNet-50's 120 s tune took
    169 s); the default seed's never is while it is the ``fallback`` (no usable plan known), nor a carried
    plan's (another shape bucket's tuned plan: built right after the default, whatever the budget, so that
    a bucket whose share of a budget is too short to build the engines' seeds still has it)."""
    order = _seed_order(single, backends, est.default_backend)
    report("seeds", 0, len(order), "building")
    first = single[est.default_backend]
    per_seed = min(SEED_TIMING_S, SEED_TIMING_SHARE * max(0.0, deadline - started))
    reserved = min(per_seed * len(order), SEED_RESERVE_SHARE * max(0.0, deadline - time.monotonic()))
    return est.prebuild([first, *carried, *(single[n] for n in order[1:])], "seed",
                        deadline - reserved, required=[*([first] if fallback else []), *carried])


def _time_seeds(single: dict[str, Plan], backends: Sequence[Backend], est: MeasuredEstimator, deadline: float,
                report: OnProgress, build_s: dict[PlanKey, float], fallback: bool = True
                ) -> tuple[dict[str, float], dict[str, Cost]]:
    """Times the single-backend plans whole (tag ``seed``) in ``_SEED_ORDER`` where their builds ended
    (``build_s``, ``_build_seeds``) or the DB has them, then the default backend's (its build is the
    reference, run once before the first timing); returns the wall time each one took, its build
    included (a DB hit: ~0), and its cost."""
    order = _seed_order(single, backends, est.default_backend)
    walls: dict[str, float] = {}
    costs: dict[str, Cost] = {}
    report("seeds", 0, len(order), f"{len(build_s)} builds done")
    # The default seed is timed last: graph engines first, as the likely answer, the default (the slowest
    # to time on a large model: IREE alone on ResNet-50, 2 s a call) after them.
    for k, name in enumerate([*order[1:], order[0]]):
        # A seed is timed where its build ended (built or failed) or the DB knows it, also past the
        # deadline: the fastest engine's whole-model plan is the anytime answer (ResNet-50 with 120 s
        # returned IREE alone, 25x slower than OpenVINO alone, whose seed was built and left untimed). One
        # the builds did not reach is not built now (BERT-base's ORT seed, built here, took 120 s to 172).
        in_db = est.plan_known(single[name], "seed")
        if (name != est.default_backend or not fallback) and not in_db and single[name].key not in build_s:
            continue
        # Past the deadline a seed is timed only while none is usable (R3D-18's oneDNN and data-tiled IREE
        # seeds, 20 s a call, ran its 120 s tune to 159 s after ORT's and OpenVINO's were timed).
        if not in_db and time.monotonic() > deadline and any(c.usable for c in costs.values()):
            continue
        t0 = time.monotonic()
        c = est.plan_time(single[name], tag="seed")
        walls[name], costs[name] = time.monotonic() - t0 + build_s.get(single[name].key, 0.0), c
        report("seeds", k + 1, len(order), f"{name} {c.seconds * 1e3:.3f} ms" if c.usable else f"{name} {c.kind.value}")
    return walls, costs


def _tuned_plan(evolved: EvolveResult, dp_plan: Plan, dp_timed: bool, single: dict[str, Plan], sg: SearchGraph,
                est: MeasuredEstimator, accepts, names: list[str], seed: int, budget_s: float,
                candidates: int, untimed: tuple[str, ...] = ()) -> TunedPlan:
    """The plan with a record of the tuning: per region its cost, runner-up and why; predicted and
    measured end-to-end times of the plan, the DP plan (measured when ``dp_timed``), each
    single-backend plan timed (``single``) and the backends whose seed was not (``untimed``). Holds no
    wall-clock figures, so a rerun on the same DB writes the same bytes."""
    plan = evolved.plan

    def predicted(p: Plan) -> float | None:
        t = plan_cost(p, sg.order, sg.producers, sg.out_bytes, est, sg.constant, sg.pinned)
        return t if math.isfinite(t) else None

    def measured_s(p: Plan) -> float | None:
        f = next((f for f in evolved.finalists if f.plan.key == p.key), None)
        if f is not None:
            return f.median_s
        c = est.plan_time(p, tag="seed")  # every plan here was timed as a seed: a DB answer
        return c.seconds if c.usable else None

    choices = []
    for region in plan.regions:
        others = [b for b in names if b not in (region.backend, est.default_backend) and accepts(b, region.ops)]
        costs = est.region_costs([region.key] + [RegionKey(b, region.ops) for b in others])
        mine, rest = costs[0], list(zip(others, costs[1:]))
        # The default backend runs a region's ops one by one, as the DP prices them.
        alone = est.region_costs([RegionKey(est.default_backend, frozenset({i})) for i in sorted(region.ops)])
        if all(c.usable for c in alone):
            rest.append((est.default_backend, Cost.known(sum(c.seconds for c in alone))))
        rest.sort(key=lambda bc: (bc[1].seconds, bc[0]))
        cost_s = mine.seconds if mine.usable else None
        runner = next(((b, c) for b, c in rest if c.usable), None)
        if cost_s is None:
            why = "not measured alone within the budget: chosen by whole-plan time"
        elif runner is None:
            why = "no other backend takes these ops (or every other fails on them)"
        elif runner[1].seconds >= cost_s:
            why = f"cheapest measured region ({runner[0]} next, {runner[1].seconds / cost_s:.2f}x)"
        else:
            why = (f"{runner[0]} is cheaper alone ({runner[1].seconds / cost_s:.2f}x) but the whole "
                   "plan measured faster this way (boundaries, shared cores)")
        choices.append(RegionChoice(cost_s, runner[0] if runner else None, runner[1].seconds if runner else None, why))
    record = TuneRecord(
        seed=seed,
        budget_s=budget_s,
        backends=tuple(names),
        candidates=candidates,
        generations=evolved.generations,
        plans_timed=evolved.plans_timed,
        why=evolved.why,
        plan=ChosenTimes(predicted(plan), evolved.chosen.median_s, evolved.chosen.spread, evolved.chosen.name),
        dp=PlanTimes(predicted(dp_plan), measured_s(dp_plan) if dp_timed else None, len(dp_plan.regions)),
        single_backend={name: PlanTimes(predicted(p), measured_s(p), len(p.regions)) for name, p in single.items()},
        finalists=tuple(Finalist(f.name, len(f.plan.regions), tuple(f.times), f.spread) for f in evolved.finalists),
        untimed=untimed,
    )
    return TunedPlan(plan, tuple(choices), record)
