"""The bench run: per model, every contender is set up in its own worker process (its compile time
measured), checked against the model's framework run as its users run it (PyTorch eager, ``jax.jit``),
warmed up, then timed round-robin (A B C A B C ...) in
slices while the others' processes wait, so slow drifts of a shared machine hit all alike."""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import CollageError
from ..measure.tasks import load_arrays
from ..measure.validate import compare
from ..measure.worker import Worker
from . import round_order, settle
from .contenders import COLLAGE, CONTENDERS, REFERENCES

TASKS = "collage_mlir.bench.tasks"


class Status(str, Enum):
    OK = "ok"
    WRONG = "wrong"    # timed, but its outputs differ from the reference's: flagged, never ranked
    FAILED = "failed"  # could not be set up or run; ``message`` says why in one line


@dataclass(frozen=True)
class BenchOptions:
    """Thread count for every contender; seconds of timing per model (all contenders together, after
    warm-up); the length of one timing slice; warm-up seconds per contender; the tolerance against
    reference (PyTorch eager or ``jax.jit``, relative to each output's largest magnitude); the collage
    contender's plan."""

    threads: int = 2
    seconds: float = 20.0
    slice_s: float = 0.25
    min_rounds: int = 5
    warmup_s: float = 1.0
    rtol: float = 1e-3
    plan: str = "default"
    small: bool = False
    setup_timeout_s: float = 1800.0
    breakdown_repeats: int = 20  # runs of the collage artifact with the region timer on, after the timing


@dataclass
class ContenderResult:
    name: str
    status: Status
    message: str = ""
    compile_s: float | None = None
    median_ms: float | None = None
    p25_ms: float | None = None
    p75_ms: float | None = None
    calls: int = 0
    max_rel_err: float | None = None
    rss_mb: float | None = None       # its worker's resident memory once set up (held while others run)
    peak_rss_mb: float | None = None  # and its peak (the compile itself runs in a child, not counted)

    @property
    def spread(self) -> float | None:
        """(p75 - p25) / median."""
        return None if self.median_ms is None else (self.p75_ms - self.p25_ms) / self.median_ms


@dataclass
class ModelResult:
    model: str
    description: str
    gflop: float
    contenders: list[ContenderResult]
    load_avg: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before and after the timing
    import_s: float | None = None  # torch-mlir import (~0 from the cache), not in any compile time
    timed_at: str = ""  # UTC time the interleaved timing started
    breakdown: dict | None = None  # the collage contender's time per region (collage_runtime.profile.Breakdown JSON)
    plan: str = ""  # the collage contender's plan on this model

    def result(self, name: str) -> ContenderResult | None:
        return next((c for c in self.contenders if c.name == name), None)

    def best(self, names: Sequence[str]) -> ContenderResult | None:
        """The fastest of ``names`` whose outputs are right."""
        ok = [c for c in self.contenders if c.name in names and c.status is Status.OK]
        return min(ok, key=lambda c: c.median_ms, default=None)

    def ratio(self, collage: str, peers: Sequence[str]) -> float | None:
        """Speedup of ``collage`` over the best right peer (best peer's median / collage's); >1 is faster."""
        mine, best = self.result(collage), self.best(peers)
        if mine is None or mine.status is not Status.OK or best is None:
            return None
        return best.median_ms / mine.median_ms


@dataclass
class BenchResult:
    options: BenchOptions
    contenders: list[str]
    models: list[ModelResult] = field(default_factory=list)


def _one_line(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def bench_model(model: str, names: Sequence[str], options: BenchOptions, work: Path,
                log: Callable[[str], None] = print, plan: str | None = None) -> ModelResult:
    """Sets up, checks and times ``names`` on the zoo model ``model`` (the collage contender by ``plan``,
    else ``options.plan``); workers are stopped at the end."""
    from .. import zoo

    entry = zoo.get(model)
    reference = REFERENCES[entry.framework]
    skipped = [n for n in names if entry.framework not in CONTENDERS[n].frameworks]
    if skipped:
        log(f"{model}: a {entry.framework.value} model: not for {', '.join(skipped)}")
    names = [n for n in names if n not in skipped]
    work.mkdir(parents=True, exist_ok=True)
    workers: dict[str, Worker] = {}
    results = {n: ContenderResult(n, Status.OK) for n in names}
    try:
        ref_file, exact_file = work / "reference.npz", work / "exact.npz"
        # A throwaway process: the import (BERT-base: ~1.8 GB at peak) is not held by any contender's worker.
        exact_file.unlink(missing_ok=True)
        with Worker(f"bench-{model}-info", work) as info_worker:
            info = info_worker.call(f"{TASKS}:model_info", options.setup_timeout_s, model=model, small=options.small,
                                    stablehlo=any(CONTENDERS[n].compiles_stablehlo for n in names),
                                    exact_file=str(exact_file))
        if not info.ok:
            raise CollageError(f"{model}: {reference} reference failed: {_one_line(info.message)}")
        gflop, import_s = info.value["flop"] / 1e9, info.value["import_s"]
        exact = load_arrays(str(exact_file), "out") if exact_file.exists() else None
        for n in [reference] + [n for n in names if n != reference]:
            worker = workers.setdefault(n, Worker(f"bench-{model}-{n}", work))
            out_file = ref_file if n == reference else work / f"{n}.npz"
            log(f"{model}: setting up {n} ...")
            outcome = worker.call(f"{TASKS}:prepare", options.setup_timeout_s, contender=n, model=model,
                                  small=options.small, threads=options.threads, work_dir=str(work / n),
                                  plan=plan or options.plan, outputs_file=str(out_file))
            if n == reference and not outcome.ok:
                raise CollageError(f"{model}: {reference} reference failed: {_one_line(outcome.message)}")
            if n not in results:
                continue
            res = results[n]
            if not outcome.ok:
                res.status, res.message = Status.FAILED, _one_line(f"{outcome.status}: {outcome.message}")
                worker.stop()
                continue
            res.compile_s = outcome.value["compile_s"]
            res.rss_mb, res.peak_rss_mb = outcome.value.get("rss_mb"), outcome.value.get("peak_rss_mb")
            check = compare(load_arrays(str(out_file), "out"), load_arrays(str(ref_file), "out"), options.rtol, 0.0,
                            exact=exact)
            res.max_rel_err = check.max_rel
            if not check.ok:
                res.status, res.message = Status.WRONG, _one_line(f"differs from {reference}: {check.message}")
        if reference not in names:
            workers.pop(reference).stop()
        live = [n for n in names if results[n].status is not Status.FAILED]
        samples, load_avg, timed_at = _time_interleaved(live, workers, results, options, model, log)
        for n, times in samples.items():
            res = results[n]
            if res.status is Status.FAILED or not times:
                continue
            q25, q50, q75 = np.percentile(np.asarray(times) * 1e3, [25, 50, 75])
            res.median_ms, res.p25_ms, res.p75_ms, res.calls = float(q50), float(q25), float(q75), len(times)
        breakdown = None
        if COLLAGE in live and results[COLLAGE].status is not Status.FAILED and options.breakdown_repeats > 0:
            # After the timing, so the region timer's few µs per call are in no timed figure.
            log(f"{model}: breakdown of collage's time per region ...")
            out = workers[COLLAGE].call(f"{TASKS}:breakdown", options.setup_timeout_s, threads=options.threads,
                                        repeats=options.breakdown_repeats, max_seconds=max(options.seconds, 10.0))
            breakdown = out.value if out.ok else {"error": _one_line(f"{out.status}: {out.message}")}
        return ModelResult(model, entry.small_description if options.small else entry.description, gflop,
                           [results[n] for n in names], load_avg, import_s, timed_at, breakdown, plan or options.plan)
    finally:
        for w in workers.values():
            w.stop()
        shutil.rmtree(work, ignore_errors=True)


def _time_interleaved(live: list[str], workers: dict[str, Worker], results: dict[str, ContenderResult],
                      options: BenchOptions, model: str, log: Callable[[str], None]
                      ) -> tuple[dict[str, list[float]], tuple[float, float], str]:
    """Warm-up, then rounds of one slice per contender, in an order shuffled each round (``round_order``),
    each after a pause that lets the previous one's threads go idle (``settle``), until the time is spent.
    Returns seconds per call of each contender, the 1-minute load average before and after, and when
    the timing started."""
    samples: dict[str, list[float]] = {n: [] for n in live}

    def take(n: str, seconds: float, min_calls: int) -> list[float]:
        if results[n].status is Status.FAILED:
            return []
        out = workers[n].call(f"{TASKS}:sample", options.setup_timeout_s, seconds=seconds, min_calls=min_calls)
        if not out.ok:
            results[n].status, results[n].message = Status.FAILED, _one_line(f"{out.status} while timing: {out.message}")
            return []
        return out.value

    for n in live:
        take(n, options.warmup_s, 2)
    load0, started = os.getloadavg()[0], time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    rounds = max(options.min_rounds, math.ceil(options.seconds / max(len(live), 1) / options.slice_s))
    log(f"{model}: timing {', '.join(live)} interleaved, {rounds} rounds")
    start = time.perf_counter()
    for r in range(rounds):
        for n in round_order(live, r):
            settle()
            samples[n] += take(n, options.slice_s, 1)
        if r + 1 >= options.min_rounds and time.perf_counter() - start > 3 * options.seconds:
            break  # slow contenders (one call longer than a slice) stretch rounds: keep the run bounded
    return samples, (load0, os.getloadavg()[0]), started


def run_bench(models: Sequence[str], names: Sequence[str], options: BenchOptions, work_dir: str | Path,
              log: Callable[[str], None] = print, plans: dict[str, str] | None = None,
              on_model: Callable[[BenchResult], None] | None = None) -> BenchResult:
    """Benchmarks each zoo model against the contenders ``names`` (collage among them, or not); the
    collage contender runs ``plans[model]`` where given, else ``options.plan``. ``on_model`` sees the
    result so far after each model (a long run keeps what it measured if stopped)."""
    from .. import zoo

    for m in models:
        zoo.get(m)  # an unknown name fails before anything starts
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown:
        raise CollageError(f"unknown contender '{unknown[0]}' (known: {', '.join(CONTENDERS)})", where="--vs")
    result = BenchResult(options, list(names))
    for m in models:
        result.models.append(bench_model(m, names, options, Path(work_dir) / m, log, (plans or {}).get(m)))
        if on_model:
            on_model(result)
    return result
