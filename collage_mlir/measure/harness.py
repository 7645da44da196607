"""The harness: measures regions on backends (``RegionKey``) and records every result in the cost database.

    extract each region → skip regions the DB already holds → capture reference values (IREE alone, once)
    → in batches: build candidates in parallel worker processes, then time them one at a time in a
    timing worker (validated against the reference first) → one DB row per region, written as it finishes

Builds run in parallel because compiling is the slow part; timing runs alone so candidates do not
disturb each other's timings. A build or run that fails, crashes or hangs becomes a row (error, crash,
timeout) and the run goes on.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from . import HARNESS_VERSION
from ..backends import PLATFORM_DEFAULTS, Backend, Platform, Precision, RegionKey, get_backend
from ..dialects import collage
from ..dialects import stablehlo as sh
from ..errors import CollageError
from ..graph import Graph, public_funcs
from ..ir import ir
from .cluster import RayPool
from .db import CostDB, Measurement
from .device import device_fingerprint
from .extract import DEAD_CODE, HASH_VERSION, QUANTIZED_BOUNDARY, ExtractedRegion, ValueRef, extract_region
from .pool import Artifact, LocalPool, TaskPool, build_by
from .reference import capture, holds_bf16, model_inputs
from .tasks import EXACT, INPUT, REFERENCE
from .timing import TimingOptions
from .validate import QUANT_RTOL
from .worker import Outcome


@dataclass
class MeasureOptions:
    """How to measure: timing rule, parallel builds, per-task time limits, whether to redo DB hits."""

    timing: TimingOptions = field(default_factory=TimingOptions)
    jobs: int = field(default_factory=lambda: max(1, len(os.sched_getaffinity(0))))
    build_timeout_s: float = 600.0
    run_timeout_s: float = 300.0
    remeasure: bool = False
    #: Candidates built before the timing worker takes them (builds and timing never overlap).
    batch: int = 16
    seed: int = 0
    #: Where region files, data and artifacts go (a temporary directory when None; kept when given).
    work_dir: Path | None = None
    #: ``time.monotonic()`` after which no new build starts (regions not built get no row: a budgeted
    #: search asks for them again next time). None: measure everything asked.
    deadline: float | None = None
    #: Expected seconds of the reference capture (one whole-model IREE compile): with a deadline, a
    #: capture starts only if it would end before it (on a large model it is the longest unit of work).
    capture_s: float = 0.0
    #: The platform of the programs measured (their default backend, the device their rows are keyed by).
    platform: Platform = Platform.CPU
    #: The Ray cluster (``ray.init`` address) that builds and times, or None: worker processes here.
    cluster: str | None = None

    @property
    def default_backend(self) -> str:
        """The default backend of the programs measured (the platform's IREE codegen)."""
        return PLATFORM_DEFAULTS[self.platform]

    def spent(self, ahead: float = 0.0) -> bool:
        """Whether the deadline is past (or would be, ``ahead`` seconds from now)."""
        return self.deadline is not None and time.monotonic() + ahead > self.deadline


@dataclass
class Progress:
    total: int
    done: int = 0
    cache_hits: int = 0
    failures: int = 0
    started: float = field(default_factory=time.perf_counter)
    current: str = ""

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started


#: Why a region where only constants flow in is not posed (as the region-hash cache stores it).
FOLDED = "only constants flow in: nothing to run (compilers fold it at compile time)"


@dataclass(frozen=True)
class NotPosed:
    """Why the harness posed no measurement for a region: only constants flow in, or nothing uses its results
    (``folded``: the compiler folds or drops it, it costs nothing), or it cannot be extracted as a
    standalone function (``why`` says why)."""

    why: str

    @property
    def folded(self) -> bool:
        return self.why == FOLDED or self.why.endswith(DEAD_CODE)

    @property
    def with_neighbours(self) -> bool:
        """Quantized tensors cross its boundary: it has a cost only with its neighbours (unknown alone)."""
        return self.why.startswith(QUANTIZED_BOUNDARY)


@dataclass
class Summary:
    """Every region's row (from the DB or just measured), why each region that could not be posed could
    not, how many regions were DB hits and how many were measured now (regions with one structural hash
    share one row)."""

    rows: dict[RegionKey, Measurement]
    skipped: dict[RegionKey, NotPosed]
    cache_hits: int
    measured: int
    elapsed_s: float

    @property
    def failures(self) -> int:
        return sum(1 for m in self.rows.values() if not m.usable)


@dataclass
class _Job:
    region: ExtractedRegion | None
    backend: Backend
    key: tuple
    #: The regions (one backend, one structural hash) this job's row answers.
    regions: list[RegionKey]
    #: The DB held its row when first asked (``region`` is None then: never extracted).
    hit: bool = False


def module_digest(module: ir.Module) -> str:
    """SHA-256 of the numbered module's bytecode: what the DB's cache of region hashes is keyed by."""
    buf = io.BytesIO()
    module.operation.write_bytecode(buf)
    return hashlib.sha256(buf.getvalue()).hexdigest()


def open_pool(options: MeasureOptions, work: Path, prefix: str = "", builders: int | None = None) -> TaskPool:
    """Where builds and timings run: ``builders`` (default ``options.jobs``) build workers and a timing
    worker here, or the nodes of ``options.cluster``."""
    if options.cluster is not None:
        return RayPool(options.cluster, options.platform)
    return LocalPool(work, builders or options.jobs, prefix)


def _ops_key(ops: frozenset[int], precision: Precision = Precision.MODEL) -> str:
    """The DB's key of a region's hash in a module: its op ids (and its precision where not the model's)."""
    key = ",".join(map(str, sorted(ops)))
    return key if precision is Precision.MODEL else f"{key}/{precision.value}"


#: Region hashes found by extraction are written to the DB in chunks of this many (one transaction each:
#: a row per commit would fsync thousands of times).
_HASH_CHUNK = 512


def measure_regions(module: ir.Module, regions: Iterable[RegionKey], db: CostDB, *,
                    examples: Mapping[str, Sequence[np.ndarray]] | None = None,
                    options: MeasureOptions | None = None,
                    on_progress: Callable[[Progress], None] | None = None,
                    digest: str | None = None) -> Summary:
    """Measures each region of ``module`` (numbered with ``collage-number-ops``) on its backend unless
    ``db`` holds it; ``examples`` are the model's inputs per public function; ``digest`` is
    ``module_digest(module)`` when the caller has it.

    Lazily, in the order given: each region's structural hash comes from the DB's cache (keyed by the
    module's digest and the op set) or, failing that, from extracting the region (then cached); its row
    from the DB; regions the DB lacks are built and timed in batches as they come, so a budget spends
    itself on the first regions and a warm rerun extracts nothing. Past the deadline a region whose hash
    is not cached is not extracted (no row: a later run asks again)."""
    options = options or MeasureOptions()
    device, description = device_fingerprint(options.platform)
    db.record_device(device, description)
    graph = Graph(module)
    digest = digest or module_digest(module)
    cached = db.region_hashes(digest, HASH_VERSION)
    new_hashes: list[tuple[str, str | None, str]] = []
    extracted: dict[tuple[frozenset[int], Precision], ExtractedRegion] = {}
    jobs: dict[tuple, _Job] = {}
    rows: dict[RegionKey, Measurement] = {}
    skipped: dict[RegionKey, NotPosed] = {}
    pending: list[_Job] = []
    started = time.perf_counter()
    regions = list(dict.fromkeys(regions))
    progress = Progress(total=len(regions))
    stats = {"hits": 0, "measured": 0}

    def region_of(asked: RegionKey) -> ExtractedRegion | str:
        at = (asked.ops, asked.precision)
        if at not in extracted:
            try:
                extracted[at] = extract_region(graph, asked.ops, asked.precision)
            except CollageError as exc:
                return str(exc)
        return extracted[at]

    def hash_of(asked: RegionKey) -> tuple[str | None, str] | None:
        """(structural hash, or None and why the region cannot be posed); None: unknown (past the deadline)."""
        key = _ops_key(asked.ops, asked.precision)
        if key not in cached:
            if options.spent():
                return None
            region = region_of(asked)
            if isinstance(region, str):
                cached[key] = (None, region)
            elif not region.inputs:
                cached[key] = (None, FOLDED)
            else:
                cached[key] = (region.hash, "")
            new_hashes.append((key, *cached[key]))
            if len(new_hashes) >= _HASH_CHUNK:
                flush_hashes()
        return cached[key]

    def flush_hashes() -> None:
        db.put_region_hashes(digest, HASH_VERSION, new_hashes)
        new_hashes.clear()

    def answered(region: RegionKey, m: Measurement) -> None:
        rows[region] = m
        progress.done += 1
        progress.failures += not m.usable

    with ExitStack() as stack:
        session: list[_Session] = []  # workers and reference values, started at the first build

        def run_pending() -> None:
            batch = [j for j in pending if j.regions[0] not in rows]
            pending.clear()
            if not batch or options.spent():
                return
            if not session:
                # Past the deadline, or too close to it for the capture the builds need: DB answers only.
                capture_s = 0.0 if _captured(module, graph, batch, examples or {}, options.seed) else options.capture_s
                if options.spent(capture_s):
                    return
                work = options.work_dir or Path(stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="collage-measure-")))
                session.append(stack.enter_context(_Session(module, graph, work, examples or {}, options)))
            flush_hashes()  # a build takes seconds: keep what extraction found even if the run is killed
            stats["measured"] += session[0].measure(batch, db, rows, progress, on_progress)

        for k, asked in enumerate(regions):
            if on_progress and k % 256 == 0:
                progress.cache_hits = stats["hits"]
                on_progress(progress)
            found = hash_of(asked)
            if found is None:
                continue  # past the deadline and never extracted: no row
            region_hash, why = found
            if region_hash is None:
                skipped[asked] = NotPosed(why)
                progress.done += 1
                continue
            backend = get_backend(asked.backend)
            key = (region_hash, backend.name, backend.version(), device, HARNESS_VERSION)
            job = jobs.get(key)
            if job is not None:  # structurally equal to a region seen in this call: one row for both
                job.regions.append(asked)
                if job.regions[0] in rows:
                    answered(asked, rows[job.regions[0]])
                    stats["hits" if job.hit else "measured"] += 1
                continue
            found_row = None if options.remeasure else db.get(*key)
            if found_row is not None:
                jobs[key] = _Job(None, backend, key, [asked], hit=True)
                answered(asked, found_row)
                stats["hits"] += 1
                continue
            if options.spent():
                continue  # no build starts past the deadline: no extraction for it either
            region = region_of(asked)
            if isinstance(region, str):  # extraction cannot fail where it gave a hash; keep it honest
                skipped[asked] = NotPosed(region)
                continue
            jobs[key] = job = _Job(region, backend, key, [asked])
            pending.append(job)
            if len(pending) >= max(options.batch, session[0].pool.build_slots if session else 0):
                progress.cache_hits = stats["hits"]
                run_pending()
        run_pending()
        flush_hashes()
    progress.cache_hits = stats["hits"]
    if on_progress:
        on_progress(progress)
    return Summary(rows, skipped, stats["hits"], stats["measured"], time.perf_counter() - started)


#: The last model's captured reference values (and, for a model computing in bf16, those of its exact
#: arithmetic), reused while the same module, inputs and seed come back (a search measures one model in many
#: calls; the capture compiles the whole model).
_CAPTURED: dict = {"key": None, "values": {}, "exact": {}}


def _every_value(graph: Graph) -> set[ValueRef]:
    """Every argument of a public function and every result of an op of ``graph`` that is not a constant
    expression (weights included: extraction clones them into a region) nor quantized (``!quant.uniform``:
    no region takes or gives one, and no program returns one): what any region of it can take or give."""
    args = {ValueRef(collage.symbol_name(f), None, k)
            for f in public_funcs(graph.module) for k in range(len(f.regions[0].blocks[0].arguments))}
    return args | {ValueRef(n.func, oid, k) for oid, n in graph.nodes.items() for k, r in enumerate(n.op.results)
                   if sh.const_expr_ops(r, readable=False) is None and "!quant." not in str(r.type)}


def _constant_values(graph: Graph, refs: set[ValueRef]) -> dict[ValueRef, np.ndarray]:
    """The values of the constant expressions among ``refs`` (op results only)."""
    found = {}
    for r in refs:
        if r.op is None or r.op not in graph.nodes:
            continue
        result = graph.nodes[r.op].op.results[r.index]
        value, tt = sh.const_expr_value(result), sh.tensor_type(result)
        dtype = sh.byte_dtype(tt[1]) if tt is not None else None
        if value is not None and dtype is not None:
            found[r] = np.require(np.asarray(value, dtype), requirements="C")  # keeps rank 0
    return found


def _capture_key(module: ir.Module, examples, seed: int) -> tuple[tuple[str, int], bytes]:
    buf = io.BytesIO()
    module.operation.write_bytecode(buf)
    digest = hashlib.sha256(buf.getvalue())
    for name in sorted(examples):
        for arr in examples[name]:
            digest.update(np.ascontiguousarray(arr).tobytes())
    return (digest.hexdigest(), seed), buf.getvalue()


def _captured(module: ir.Module, graph: Graph, jobs, examples, seed: int) -> bool:
    """Whether every value ``jobs`` need is captured already or a constant expression (no whole-model
    compile to wait for)."""
    values = _CAPTURED["values"] if _CAPTURED["key"] == _capture_key(module, examples, seed)[0] else {}
    missing = {r for j in jobs for r in (*j.region.inputs, *j.region.outputs)} - values.keys()
    return missing <= _constant_values(graph, missing).keys()


def _reference_values(module: ir.Module, wanted: set, examples, seed: int, graph: Graph) -> tuple[dict, dict]:
    """The reference values ``wanted`` (and more), and those of the model's exact arithmetic where it computes in
    bf16 (else none)."""
    key, bytecode = _capture_key(module, examples, seed)
    if _CAPTURED["key"] != key:
        _CAPTURED.update(key=key, values={}, exact={})
    values = _CAPTURED["values"]
    missing = wanted - values.keys()
    # A region may hand on a constant expression it holds (a reshaped scalar other ops broadcast too):
    # its value is read off the IR, as the capture leaves such values out.
    values.update(_constant_values(graph, missing))
    missing -= values.keys()
    if missing:
        # All at once: each capture compiles the whole model, and a search asks chunk after chunk.
        missing |= _every_value(graph) - values.keys()
        inputs = model_inputs(module, examples, seed)
        values.update(capture(bytecode, missing, inputs))
        if holds_bf16(module):
            _CAPTURED["exact"].update(capture(bytecode, missing, inputs, exact=True))
    return values, _CAPTURED["exact"]


class _Inputs:
    """The reference values every job needs (captured once), written as one data file per region hash
    when a batch first needs it: a budgeted search may pose thousands of regions and build a few."""

    def __init__(self, module: ir.Module, work: Path, examples, seed: int, graph: Graph):
        self.values: dict[ValueRef, np.ndarray] = {}
        self.exact: dict[ValueRef, np.ndarray] = {}
        self.module, self.examples, self.seed, self.graph = module, examples, seed, graph
        self.work = work
        self.files: dict[str, Path] = {}
        (work / "data").mkdir(parents=True, exist_ok=True)
        (work / "regions").mkdir(parents=True, exist_ok=True)

    def write(self, region: ExtractedRegion) -> Path:
        if region.hash not in self.files:
            # The first region captures every value at once; a later one may still need a constant
            # expression it hands on (the capture leaves those out), read off the IR.
            need = {*region.inputs, *region.outputs} - self.values.keys()
            if need:
                self.values.update(_constant_values(self.graph, need))
            if need - self.values.keys():
                self.values, self.exact = _reference_values(self.module, need, self.examples, self.seed, self.graph)
            arrays = {f"{INPUT}{k}": self.values[r] for k, r in enumerate(region.inputs)}
            arrays |= {f"{REFERENCE}{k}": self.values[r] for k, r in enumerate(region.outputs)}
            if self.exact:  # a constant expression handed on is its own exact value
                arrays |= {f"{EXACT}{k}": self.exact.get(r, self.values[r]) for k, r in enumerate(region.outputs)}
            np.savez(self.work / "data" / f"{region.hash}.npz", **arrays)
            (self.work / "regions" / f"{region.hash}.mlirbc").write_bytes(region.bytecode)
            self.files[region.hash] = self.work / "data" / f"{region.hash}.npz"
        return self.files[region.hash]


def _row(job: _Job, outcome: Outcome, phase: str) -> Measurement:
    region_hash, backend, version, device, harness = job.key
    base = dict(region_hash=region_hash, backend=backend, backend_version=version, device=device,
                harness_version=harness, region=job.region.summary)
    if not outcome.ok:
        return Measurement(status=outcome.status, message=f"{phase}: {outcome.message}", **base)
    return outcome.value.measurement(**base)


class _Session:
    """The task pool (build workers and the timing worker, or a cluster) and the reference values of one
    ``measure_regions`` call, started when its first build is due (a call the DB answers starts nothing)."""

    def __init__(self, module, graph: Graph, work: Path, examples, options: MeasureOptions):
        self.module, self.graph, self.work, self.examples, self.options = module, graph, work, examples, options
        self.data: _Inputs | None = None

    def __enter__(self) -> "_Session":
        self.pool = open_pool(self.options, self.work)
        self.builds = ThreadPoolExecutor(max_workers=self.pool.build_slots)
        self.timings = ThreadPoolExecutor(max_workers=self.pool.time_slots)
        return self

    def __exit__(self, *exc) -> None:
        self.builds.shutdown()
        self.timings.shutdown()
        self.pool.close()

    def _build(self, job: _Job) -> Outcome | None:
        """The job's build, stopped at the deadline (a transition probe started just before a warm 10 s
        search's stayed 4-6 s past it): None there, not built and no row."""
        return build_by(self.pool, self.work / "regions" / f"{job.region.hash}.mlirbc",
                        job.region.plan(job.backend.name, self.options.default_backend).to_json(),
                        self.options.build_timeout_s, self.options.deadline)

    def _time(self, job: _Job, artifact: Artifact) -> Outcome:
        try:
            tol = job.backend.tolerance
            rtol = max(tol.rtol, QUANT_RTOL) if job.region.quantized else tol.rtol
            return self.pool.time(artifact, self.data.write(job.region), self.options.run_timeout_s,
                                  timing=self.options.timing, rtol=rtol, atol=tol.atol)
        finally:
            self.pool.discard(artifact)

    def measure(self, batch: list[_Job], db: CostDB, rows: dict, progress: Progress, on_progress) -> int:
        """Builds ``batch`` in parallel, then times each built job (as many at once as the pool has timing
        machines: one here); returns how many regions got a row."""
        if self.data is None:  # the first region written captures every value at once (one whole-model compile)
            self.data = _Inputs(self.module, self.work, self.examples, self.options.seed, self.graph)
        recorded = 0

        def record(job: _Job, m: Measurement) -> None:
            nonlocal recorded
            db.put(m)  # committed before anything else happens: a killed run keeps every finished row
            for region in job.regions:
                rows[region] = m
                progress.done += 1
                progress.failures += not m.usable
                recorded += 1
            if on_progress:
                on_progress(progress)

        for job in batch:
            self.data.write(job.region)
        progress.current = f"building {len(batch)}"
        if on_progress:
            on_progress(progress)
        if self.options.spent():
            return 0
        timed = {}
        for job, outcome in zip(batch, list(self.builds.map(self._build, batch))):
            if outcome is None:
                continue
            if not outcome.ok:
                record(job, _row(job, outcome, "build"))
                continue
            timed[self.timings.submit(self._time, job, outcome.value)] = job
        # Rows in the order they finish; shown: the oldest timing not finished (here: the one running).
        self._show(timed, progress, on_progress)
        for future in as_completed(timed):
            record(timed[future], _row(timed[future], future.result(), "run"))
            self._show(timed, progress, on_progress)
        return recorded

    @staticmethod
    def _show(timed: dict, progress: Progress, on_progress) -> None:
        job = next((job for f, job in timed.items() if not f.done()), None)
        if job is not None:
            progress.current = f"{job.backend.name}: {job.region.summary[:40]}"
            if on_progress:
                on_progress(progress)
