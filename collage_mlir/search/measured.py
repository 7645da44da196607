"""The measured cost estimator: region costs from the harness and cost DB (measured when the DB does
not hold them, committed row by row), transition costs fitted over probes of several sizes, and
whole-plan times from ``PlanTimer``, validated against IREE alone and stored in the same DB (so a rerun
on the same DB gets the same answers and the same plan)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from ..backends import PLATFORM_DEFAULTS, Backend, Platform, Precision, RegionKey, get_backend
from ..dialects import stablehlo as sh
from ..errors import CollageError
from ..ir import ir
from ..measure import HARNESS_VERSION
from ..measure.db import KEY_FIELDS, CostDB, Measurement
from ..measure.device import device_fingerprint
from ..measure.harness import MeasureOptions, Progress, measure_regions
from ..measure.plan_timing import PlanTimer
from ..measure.pool import time_left
from ..measure.profile import IN_CONTEXT, PROFILE, PROFILED_BACKENDS, InContextCosts, profile_key
from ..measure.reference import holds_bf16, invoke_alone, model_inputs
from ..measure.status import Status
from ..measure.tasks import EXACT, INPUT, REFERENCE, TASKS, load_arrays
from ..measure.timing import timing_wall_s
from ..measure.validate import QUANT_RTOL
from ..measure.worker import Worker
from ..measure.transitions import measure_transitions
from ..plan import Plan, PlanKey
from .cost import Cost, CostEstimator, TransitionFit

log = logging.getLogger(__name__)

#: The backend whose whole-model results every plan is checked against, whatever the platform.
CPU_REFERENCE = PLATFORM_DEFAULTS[Platform.CPU]
#: The DB's derived documents holding a model's reference results (an ``.npz``, base64), and the largest kept.
REFERENCE_OUTPUTS = "reference-outputs"
REFERENCE_CACHE_BYTES = 16 << 20
#: A whole plan whose first call takes this many times the fastest plan known is timed by that call alone:
#: it cannot win (R3D-18's data-tiled IREE and oneDNN seeds, 18-20 s a call against ORT's 0.7 s, took a
#: 120 s tune to 350 s with their full timings).
GIVE_UP = 3.0

#: Probe sides for the transition fit: 16 KiB, 64 KiB and 256 KiB of f32 cross each boundary.
PROBE_SIZES = (64, 128, 256)
#: What the whole-plan rows are filed under in the cost DB.
PLAN_ROW = "collage-plan"

#: A region on another backend is measured only where its ops cost more than this inside the fastest
#: seed engine's graph (its per-node profile): the larger of ``MIN_GAIN_S`` and ``MIN_GAIN_SHARE`` of that
#: engine's whole-model time. Moving ops that cost less cannot pay for the boundaries a move adds (the
#: transition probes fit 20 µs and more per boundary here), so measuring them buys nothing.
MIN_GAIN_S = 10e-6
MIN_GAIN_SHARE = 0.02
#: Profiled calls of an engine's whole-model plan (after 3 warm-up calls).
PROFILE_ROUNDS = 20
#: An engine's profile prices no region where its nodes that name no op (layout reorders, and nodes the
#: engine made of several ONNX nodes under a name of its own: OpenVINO's ``LSTMSequence``) hold more than
#: this share of its whole-model time: the ops they compute would cost nothing in context (a JAX LSTM's
#: loops on OpenVINO were priced at 0 ms: 5.1 of its 5.3 ms unattributed).
UNATTRIBUTED_SHARE = 0.25


@dataclass(frozen=True)
class _Context:
    """An engine's in-context profile as the estimator uses it: its maximal regions (constants left out)
    and the op groups it fused (constants left out)."""

    costs: InContextCosts
    regions: tuple[frozenset[int], ...]
    fused: tuple[frozenset[int], ...]
    seconds: dict[int, float]


def _earliest(*deadlines: float | None) -> float | None:
    given = [d for d in deadlines if d is not None]
    return min(given) if given else None


class MeasuredEstimator(CostEstimator):
    """Costs of one numbered module on this machine. After ``deadline`` (``time.monotonic()``) no new
    region or untagged plan is measured (questions the DB cannot answer are ``unknown``); tagged plan
    timings (the seeds, the finalists' rounds) are always taken, so a plan can always be chosen."""

    def __init__(self, module: ir.Module, backends: Sequence[Backend], db: CostDB, work_dir: str | Path, *,
                 examples: Mapping[str, Sequence[np.ndarray]] | None = None, options: MeasureOptions | None = None,
                 deadline: float | None = None, on_progress: Callable[[str, Progress], None] | None = None):
        self.module = module
        self.backends = list(backends)
        #: Whether the model quantizes: its plans are validated with ``QUANT_RTOL``.
        self._quantizes = sh.quantizes(module)
        self.db = db
        self.work = Path(work_dir)
        self.examples = dict(examples or {})
        self.options = options or MeasureOptions()
        self.deadline = deadline
        #: About how long a whole-plan build takes here (the tune sets it: its slowest seed's build).
        self.build_s = 0.0
        self.on_progress = on_progress
        #: The default backend of the programs measured: the platform's IREE codegen.
        self.default_backend = self.options.default_backend
        self.device, _ = device_fingerprint(self.options.platform)
        self._regions: dict[RegionKey, Cost] = {}
        self._fits: dict[tuple[str, str], TransitionFit | str] = {}
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
        self._bytecode = buf.getvalue()
        self.inputs = model_inputs(module, self.examples, self.options.seed).get("main", [])
        self._module_hash = hashlib.sha256(self._bytecode).hexdigest()  # = harness.module_digest(module)
        digest = hashlib.sha256(self._bytecode)
        for a in self.inputs:
            digest.update(np.ascontiguousarray(a).tobytes())
        self._model_digest = digest.hexdigest()
        self._reference: list[np.ndarray] | None = None
        self._exact: list[np.ndarray] | None = None
        self._timer: PlanTimer | None = None
        #: The fastest plan whose whole-plan time is known (measured now or read from the DB), its cost and
        #: tag: what an interrupted tune returns.
        self.fastest: tuple[Plan, Cost, str] | None = None
        self.measured = 0  # rows measured now (not DB hits): regions and plans
        self.cache_hits = 0
        #: Per profiled engine, its in-context profile (``price_in_context``).
        self._context: dict[str, _Context] = {}
        #: The engine whose in-context times bound what other backends' regions could save, and that bound.
        self._bound: tuple[str, float] | None = None
        self._constant: frozenset[int] = frozenset()
        self.in_context = 0  # regions priced in context
        self.not_worth = 0  # regions left unmeasured: too cheap in context to win
        self._profiler: Worker | None = None
        #: Whether ``price_in_context`` profiles at all (``tune(in_context=False)``: every region measured).
        self.use_in_context = True

    def _spent(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    # -- regions ----------------------------------------------------------------------------------
    def timed_whole(self, region: RegionKey, cost: Cost) -> None:
        """Takes ``cost`` as the region's: a single-backend plan that is this one region over the whole
        model was timed whole (a seed), which is that region's cost, so it is not built again alone."""
        self._regions[region] = cost

    def region_costs(self, regions):
        regions = list(regions)
        todo = [r for r in regions if r not in self._regions]
        if todo and self._spent():
            for r in todo:
                self._regions[r] = Cost.unknown("tuning budget spent before it was measured")
            todo = []
        todo = self._from_context(todo)
        # One call: the harness looks up and builds the regions lazily in the order given (hashes from the
        # DB's cache where a run saw the region before) and starts no build past the deadline (the regions
        # it did not reach stay unknown).
        if todo:
            summary = measure_regions(self.module, todo, self.db, examples=self.examples,
                                      options=replace(self.options, deadline=self.deadline),
                                      on_progress=self._region_progress(0, len(todo)), digest=self._module_hash)
            self.measured += summary.measured
            self.cache_hits += summary.cache_hits
            for region, skip in summary.skipped.items():
                # A region where only constants flow in, or whose results nothing uses, is folded or dropped
                # by the compiler: it costs nothing.
                self._regions[region] = (Cost.known(0.0, "folded or dropped at compile time") if skip.folded
                                         else Cost.unknown(skip.why) if skip.with_neighbours
                                         else Cost.invalid(skip.why))
            for key, m in summary.rows.items():
                self._regions[key] = (Cost.known(m.median_s, spread=m.spread or 0.0) if m.usable
                                      else Cost.invalid(f"{m.status}: {m.message}"[:200]))
            for r in todo:
                self._regions.setdefault(r, Cost.unknown("tuning budget spent before it was measured"))
        return [self._regions.get(r, Cost.unknown("not measured")) for r in regions]

    # -- costs in context ---------------------------------------------------------------------------
    def price_in_context(self, single: Mapping[str, Plan], maximal: Mapping[str, Sequence[frozenset[int]]],
                         seeds: Mapping[str, Cost], heavy: frozenset[int], constant: frozenset[int],
                         expected_s: Mapping[str, float] | None = None) -> None:
        """For each engine with a per-node profiler (``measure.profile``) whose single-backend plan
        ``single[name]`` was timed (``seeds``), reads (or measures: one build and one profiled run) its
        in-context profile; from then on a region on that engine inside one of its ``maximal`` regions that
        splits none of its fused nodes costs the sum of its ops' in-context times (``Cost.in_context``)
        unless the DB holds a measured row for it. If the fastest seed is such an engine, a region on any
        other backend whose ops cost at most ``max(MIN_GAIN_S, MIN_GAIN_SHARE * seed)`` in its graph is
        left unmeasured (unknown). ``heavy``: the convolutions and matmuls (a fused node's anchor);
        ``constant``: the constant expressions (in no engine node of their own). ``expected_s``: about how long
        each engine's profile would take to build and run; one that would end past the deadline is not
        started (the DB's profiles are still read)."""
        if not self.use_in_context:
            return
        self._constant = frozenset(constant)
        for name in sorted(single):
            cost = seeds.get(name)
            if name not in PROFILED_BACKENDS or cost is None or not cost.usable or name not in maximal:
                continue
            costs = self._profile(name, single[name], heavy, (expected_s or {}).get(name, 0.0))
            if costs is None or costs.unattributed_s > UNATTRIBUTED_SHARE * costs.whole_s:
                continue
            regions = tuple(frozenset(r) - self._constant for r in maximal[name])
            fused = tuple(g - self._constant for g in costs.fused())
            self._context[name] = _Context(costs, regions, tuple(g for g in fused if len(g) > 1), costs.op_seconds())
        usable = {n: c.seconds for n, c in seeds.items() if c.usable}
        if usable:
            best = min(usable, key=lambda n: (usable[n], n))
            if best in self._context:
                self._bound = (best, max(MIN_GAIN_S, MIN_GAIN_SHARE * usable[best]))

    def in_context_costs(self, backend: str) -> InContextCosts | None:
        """The in-context profile ``price_in_context`` found for ``backend``."""
        ctx = self._context.get(backend)
        return ctx.costs if ctx else None

    def _profile(self, backend: str, plan: Plan, heavy: frozenset[int], expected_s: float = 0.0
                 ) -> InContextCosts | None:
        """The engine's profile of ``plan`` from the DB, or built and profiled now, both stopped at the
        deadline (None past it or where that fails: a warm DB's 10 s search again built and profiled an
        engine's whole-model plan for 15 s)."""
        version = get_backend(backend).version()
        key = profile_key(self._model_digest, backend, version, self.device, HARNESS_VERSION, plan.to_json())
        if (stored := self.db.get_cached(IN_CONTEXT, key)) is not None:
            self.cache_hits += 1
            return InContextCosts.from_json(json.loads(stored))
        if self._spent() or (self.deadline is not None and time.monotonic() + expected_s > self.deadline):
            return None
        work = self.work / "profile"
        work.mkdir(parents=True, exist_ok=True)
        module_file, data_file, out = work / "model.mlirbc", work / "inputs.npz", work / f"artifact-{backend}"
        module_file.write_bytes(self._bytecode)
        np.savez(data_file, **{f"{INPUT}{i}": a for i, a in enumerate(self.inputs)})
        if self._profiler is None:
            self._profiler = Worker("profile", work)
        built = self._profiler.call(f"{TASKS}:build_plan", time_left(self.options.build_timeout_s, self.deadline),
                                    module_file=str(module_file), plan=plan.to_json(), out_dir=str(out))
        if not built.ok or self._spent():
            return None
        done = self._profiler.call(f"{PROFILE}:profile_artifact", time_left(self.options.run_timeout_s, self.deadline),
                                   artifact_dir=str(out),
                                   data_file=str(data_file), backend=backend, version=version, heavy=sorted(heavy),
                                   rounds=PROFILE_ROUNDS)
        if not done.ok:
            return None
        self.db.put_cached(IN_CONTEXT, key, json.dumps(done.value.to_json(), sort_keys=True))
        return done.value

    def _in_context_cost(self, region: RegionKey) -> Cost | None:
        ctx = self._context.get(region.backend)
        if ctx is None or region.precision is not Precision.MODEL:  # a profile is of the model's precision
            return None
        ops = region.ops - self._constant
        if not ops or not any(ops <= r for r in ctx.regions):
            return None
        if any(g & ops and not g <= ops for g in ctx.fused):
            return None  # it splits a node the engine fused: its ops' share of that node is not known
        return Cost.in_context(sum(ctx.seconds.get(i, 0.0) for i in ops),
                               f"in context: {region.backend}'s profile of its whole-model plan")

    def _not_worth(self, region: RegionKey) -> Cost | None:
        if self._bound is None or region.backend == self._bound[0]:
            return None
        if region.backend == self.default_backend and len(region.ops) == 1:
            return None  # the DP's fallback for every op: always measured
        engine, bound = self._bound
        ctx = self._context[engine]
        ops = region.ops - self._constant
        if not ops or not any(ops <= r for r in ctx.regions):
            return None  # no evidence: some op is outside the engine's regions
        t = sum(ctx.seconds.get(i, 0.0) for i in ops)
        if t > bound:
            return None
        return Cost.unknown(f"not measured: its ops cost {t * 1e6:.1f} µs inside {engine}'s graph, "
                            f"at most {bound * 1e6:.1f} µs could be saved")

    def _from_context(self, todo: list[RegionKey]) -> list[RegionKey]:
        """Prices what the in-context profiles answer (a measured row the DB holds wins; it is looked up
        without extracting or building anything) and marks regions not worth measuring; returns the rest."""
        if not self._context:
            return todo
        answered = {r: c for r in todo if (c := self._in_context_cost(r) or self._not_worth(r)) is not None}
        if not answered:
            return todo
        past = replace(self.options, deadline=time.monotonic() - 1.0)  # DB answers only: nothing extracted or built
        summary = measure_regions(self.module, list(answered), self.db, examples=self.examples, options=past,
                                  digest=self._module_hash)
        self.cache_hits += summary.cache_hits
        for key, m in summary.rows.items():
            self._regions[key] = (Cost.known(m.median_s, spread=m.spread or 0.0) if m.usable
                                  else Cost.invalid(f"{m.status}: {m.message}"[:200]))
        for r, c in answered.items():
            if r not in self._regions:
                self._regions[r] = c
                if c.usable:
                    self.in_context += 1
                else:
                    self.not_worth += 1
        return [r for r in todo if r not in self._regions]

    def _region_progress(self, offset: int, total: int):
        if self.on_progress is None:
            return None

        def show(p: Progress) -> None:
            self.on_progress("regions", Progress(total=total, done=offset + p.done, cache_hits=self.cache_hits + p.cache_hits,
                                                 failures=p.failures, current=p.current))
        return show

    # -- transitions ------------------------------------------------------------------------------
    def fit_transitions(self, deadline: float | None = None,
                        on_progress: Callable[[int, int], None] | None = None) -> None:
        """Measures (or reads from the DB, where any earlier tune on this machine left them) the probe of
        each ordered backend pair at each probe size and fits cost = fixed + per-byte · bytes per pair.
        Pairs with the default backend come first (glue stays there, so those boundaries are the common
        ones), sizes smallest and largest first (two give a line); no probe starts after ``deadline``. A
        pair of two other backends without a fit of its own is priced as leaving through the default
        backend and entering from it (A → default + default → B): backends² probes become 2·backends."""
        if [b.name for b in self.backends] == [self.default_backend]:
            return  # no boundary but default → default, which costs nothing
        default = next(b for b in self.backends if b.name == self.default_backend)
        others = [b for b in self.backends if b is not default]
        pairs = [p for b in others for p in ((default, b), (b, default))]
        pairs += [(a, b) for a in others for b in others]
        sizes = sorted(PROBE_SIZES)
        sizes = [sizes[0], sizes[-1], *sizes[1:-1]]
        options = replace(self.options, deadline=_earliest(deadline, self.deadline))
        points: dict[tuple[str, str], list[tuple[int, float]]] = {}
        failed: dict[tuple[str, str], str] = {}
        total = len(pairs) * len(sizes)
        for k, n in enumerate(sizes):
            wanted = pairs if k < 2 else [p for p in pairs if len(points.get((p[0].name, p[1].name), [])) >= 2]
            progress = (lambda i, _n, k=k: on_progress(k * len(pairs) + i, total)) if on_progress else None
            for t in measure_transitions(self.backends, self.db, options, n=n, pairs=wanted, on_progress=progress):
                if t.usable:
                    points.setdefault((t.src, t.dst), []).append((t.nbytes, t.cost_s))
                else:
                    failed[(t.src, t.dst)] = f"{t.status}: {t.message}"[:200]
        for a in self.backends:
            for b in self.backends:
                key = (a.name, b.name)
                pts = points.get(key, [])
                if len(pts) >= 2:
                    self._fits[key] = TransitionFit.fit(pts)
                elif key in failed:
                    self._fits[key] = failed[key]
        for a in others:  # the rest through the default backend, where both halves were fitted
            for b in others:
                out, into = self._fits.get((a.name, default.name)), self._fits.get((default.name, b.name))
                if (a.name, b.name) not in self._fits and isinstance(out, TransitionFit) and isinstance(into, TransitionFit):
                    self._fits[(a.name, b.name)] = TransitionFit(out.fixed_s + into.fixed_s,
                                                                 out.per_byte_s + into.per_byte_s)

    def transition_fits(self) -> dict[tuple[str, str], TransitionFit | str]:
        return dict(self._fits)

    def transition_cost(self, src, dst, nbytes):
        if src == dst == self.default_backend:
            return Cost.known(0.0, "one IREE dispatch stream")
        fit = self._fits.get((src, dst))
        if fit is None:
            return Cost.unknown("transition probes not measured")
        if isinstance(fit, str):
            return Cost.invalid(fit)
        return Cost.known(fit.at(nbytes))

    # -- whole plans ------------------------------------------------------------------------------
    def _plan_key(self, plan: Plan, tag: str) -> tuple:
        text = json.dumps({"model": self._model_digest, "plan": plan.to_json(), "tag": tag}, sort_keys=True)
        names = sorted({plan.default_backend, *(r.backend for r in plan.regions)})
        versions = ",".join(f"{n}={get_backend(n).version()}" for n in names)
        return (hashlib.sha256(text.encode()).hexdigest(), PLAN_ROW, versions, self.device, HARNESS_VERSION)

    def _plan_timer(self) -> PlanTimer:
        if self._timer is None:
            # Keeps the last few builds: the finalists' rounds re-time plans the search built.
            self._timer = PlanTimer(self.work / "plans", self.options, keep=16)
        return self._timer

    def reference(self) -> list[np.ndarray]:
        """``@main``'s results with IREE CPU alone: what every plan's results are checked against. On the CPU
        it is the default seed's own build; on a device platform a CPU build apart, so that the platform's own
        program is checked like any other plan (IREE's CUDA codegen once computed ResNet-50's head wrong, and
        differently on every call: studies/gpu)."""
        if self._reference is None:
            self._run_reference()
        return self._reference

    def _run_reference(self) -> None:
        """Builds IREE CPU alone and runs it once, keeping its results as the reference; not timed here (on
        the CPU the build is kept, and the default seed's timing is that build's: the seeds can then be timed
        graph engines first, the slow reference last). The results are kept in the DB under the model, its
        inputs and the compiler's version: a search again reads them instead of a whole-model build (a warm
        10 s search again of MobileNetV2 spent 20 s on it)."""
        key = f"{self._model_digest}/{CPU_REFERENCE}={get_backend(CPU_REFERENCE).version()}"
        if (stored := self.db.get_cached(REFERENCE_OUTPUTS, key)) is not None:
            self._reference = load_arrays(io.BytesIO(base64.b64decode(stored)), REFERENCE)
            return
        out = self.work / "plans" / "reference.npz"
        plan = Plan([], CPU_REFERENCE, "reference")
        outcome = self._plan_timer().time(self._bytecode, plan, self.inputs, outputs_to=out, timed=False)
        if not outcome.ok or outcome.value.status != Status.OK:
            why = outcome.message if not outcome.ok else outcome.value.message
            raise CollageError(f"the reference run ({plan.default_backend} alone) failed: {why}"[:500])
        self._reference = load_arrays(out, REFERENCE)
        if out.stat().st_size <= REFERENCE_CACHE_BYTES:
            self.db.put_cached(REFERENCE_OUTPUTS, key, base64.b64encode(out.read_bytes()).decode())

    def exact(self) -> list[np.ndarray] | None:
        """``@main``'s results in the model's exact arithmetic (IREE CPU alone, bf16 computed in f32), for a model
        computing in bf16, else None: a plan is also right within what its bf16 rounding allows
        (``validate.compare``). Kept in the DB as the reference is; where that run fails, the plans are checked
        against the reference alone."""
        if self._exact is None:
            self._exact = self._run_exact() if holds_bf16(self.module) else []
        return self._exact or None

    def _run_exact(self) -> list[np.ndarray]:
        key = f"{self._model_digest}/exact/{CPU_REFERENCE}={get_backend(CPU_REFERENCE).version()}"
        if (stored := self.db.get_cached(REFERENCE_OUTPUTS, key)) is not None:
            return load_arrays(io.BytesIO(base64.b64decode(stored)), EXACT)
        try:
            (outputs,) = invoke_alone(self.module, {"main": self.inputs}, exact=True).values()
        except (CollageError, RuntimeError, ValueError) as exc:
            log.warning("the exact reference run failed; plans are checked against the reference alone: %s",
                        str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
            return []
        buf = io.BytesIO()
        np.savez(buf, **{f"{EXACT}{k}": a for k, a in enumerate(outputs)})
        if buf.tell() <= REFERENCE_CACHE_BYTES:
            self.db.put_cached(REFERENCE_OUTPUTS, key, base64.b64encode(buf.getvalue()).decode())
        return outputs

    def prebuild(self, plans: Sequence[Plan], tag: str, deadline: float | None = None,
                 required: Sequence[Plan] = ()) -> dict[PlanKey, float]:
        """Builds the ``plans`` the DB cannot answer for ``tag`` side by side (``PlanTimer.prebuild``: as
        many at once as ``options.jobs``; a build but the ``required`` plans' stopped at ``deadline``), so
        their ``plan_time`` only times them; each built plan's build seconds."""
        todo = [p for p in plans if self.db.get(*self._plan_key(p, tag)) is None]
        built = self._plan_timer().prebuild(self._bytecode, todo, deadline, required) if todo else []
        return {p.key: s for p, s in zip(todo, built) if s is not None}

    def retime_s(self, seconds: float, plan: Plan | None = None) -> float:
        # A plan this run did not build (a search again's seeds come from the DB) is built again first:
        # about as long as the slowest seed's build (a warm 10 s search again of MobileNetV2 rebuilt IREE
        # alone in its finalists' round: 61 s).
        build = 0.0 if plan is None or self._plan_timer().holds(self._bytecode, plan) else self.build_s
        return timing_wall_s(seconds, self.options.timing) + build

    def plan_known(self, plan: Plan, tag: str = "") -> bool:
        """Whether the DB holds ``plan``'s whole-plan timing under ``tag`` (``plan_time`` answers at once)."""
        return self.db.get(*self._plan_key(plan, tag)) is not None

    def plan_time(self, plan, tag=""):
        key = self._plan_key(plan, tag)
        row = self.db.get(*key)
        if row is not None:
            self.cache_hits += 1
        elif self._spent() and not tag:
            return Cost.unknown("tuning budget spent before it was measured")
        else:
            used = [get_backend(n) for n in {plan.default_backend, *(r.backend for r in plan.regions)}]
            # A whole model through several backends: ten times the loosest tolerance, as the transition probe.
            rtol = 10 * max(b.tolerance.rtol for b in used)
            atol = 10 * max(b.tolerance.atol for b in used)
            if self._quantizes:
                rtol = max(rtol, QUANT_RTOL)
            # A search's plan (untagged) is not built past the deadline: a whole-model build started
            # just before it was a warm 10 s search's minute (a tagged plan, a seed or a finalist, is).
            # A plan far slower than the fastest one known is timed by its first call.
            give_up = GIVE_UP * self.fastest[1].seconds if self.fastest else None
            # Once a plan is known, a seed's or a search plan's run is stopped at the deadline too (left
            # untimed); a finalist's is not.
            run_by = self.deadline if self.fastest and tag in ("", "seed") else None
            outcome = self._plan_timer().time(self._bytecode, plan, self.inputs, self.reference(), rtol, atol,
                                              build_by=None if tag else self.deadline, give_up_s=give_up,
                                              run_by=run_by, exact=self.exact())
            if outcome is None:
                return Cost.unknown("tuning budget spent before it was built or timed")
            summary = f"plan {tag} of {len(plan.regions)} regions"
            fields = dict(zip(KEY_FIELDS, key))
            if outcome.ok:
                t = outcome.value
                row = replace(t, message=t.message[:500]).measurement(region=summary, **fields)
            else:
                row = Measurement(status=outcome.status, message=outcome.message[:500], region=summary, **fields)
            self.db.put(row)
            self.measured += 1
        if not row.usable:
            return Cost.invalid(f"{row.status}: {row.message}"[:200])
        if self.fastest is None or row.median_s < self.fastest[1].seconds:
            self.fastest = (plan, Cost.known(row.median_s, spread=row.spread or 0.0), tag)
        return Cost.known(row.median_s, spread=row.spread or 0.0)

    def close(self) -> None:
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None
        if self._timer is not None:
            self._timer.close()
            self._timer = None
