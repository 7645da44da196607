"""Timing: warm-up, then repeated samples until the median is stable or the budget is spent."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class TimingOptions:
    """When to stop sampling: after at least ``min_repeats`` samples spanning ``min_time_s``, once the
    median is stable (the relative half-width of its ~95% confidence interval, ``median_uncertainty``,
    is at most ``rel_spread``), or when ``budget_s`` or ``max_repeats`` is reached. A sample averages
    enough calls to last ``min_sample_s`` (so sub-millisecond calls are not timer noise). The minimum
    span matters on a shared machine: five quick samples can agree with each other and not with the
    next run (studies/measure_repeatability/measure_repeatability.md)."""

    warmup: int = 2
    min_repeats: int = 10
    #: A slow call needs fewer samples: once ``slow_repeats`` samples span ``slow_budgets`` budgets, sampling
    #: stops (ResNet-50 on IREE alone, 1.1 s a call: 3 samples, not 10; its 12 s timing was a tune's overrun,
    #: and nothing that slow is a near tie of the plan a tune keeps).
    slow_repeats: int = 3
    slow_budgets: float = 3.0
    #: A first call slower than this is the timing, one sample (``None``: never): a plan several times slower
    #: than the fastest one known cannot win, and R3D-18's 18 s-a-call seeds took a 120 s tune to 350 s.
    give_up_s: float | None = None
    #: The one-time work a program's first call after load may carry (lazy library and handle creation,
    #: cuDNN's algorithm search, a JIT): a cold call gives up only past ``give_up_s`` plus this. On an H100
    #: a plan with one cuBLAS region took 85 ms cold and ~1 ms warm, and judged by its cold call every
    #: library and host-engine plan of a tune looked 100x slower than it is.
    cold_start_s: float = 2.0
    min_time_s: float = 0.25
    max_repeats: int = 500
    rel_spread: float = 0.02
    budget_s: float = 1.0
    min_sample_s: float = 1e-3

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median and min over samples, relative inter-quartile spread, sample count."""

    median_s: float
    min_s: float
    spread: float
    repeats: int
    calls_per_sample: int


def relative_spread(samples: list[float]) -> float:
    """(p75 - p25) / median of ``samples``."""
    q25, q50, q75 = np.percentile(samples, [25, 50, 75])
    return float((q75 - q25) / q50) if q50 > 0 else math.inf


def median_uncertainty(samples: list[float]) -> float:
    """Relative half-width of the median's ~95% confidence interval, 1.57 * IQR / sqrt(n) / median
    (McGill, Tukey and Larsen's notch): how far another run's median is likely to be."""
    return 1.57 * relative_spread(samples) / math.sqrt(len(samples))


#: Loading a kept whole-plan build again: the IREE program and its engines' compiled models (OpenVINO and
#: ORT compile theirs at load: 0.3-1.5 s on the zoo here).
RELOAD_S = 1.0


def timing_wall_s(seconds: float, options: TimingOptions) -> float:
    """Wall seconds a timing of a built program taking ``seconds`` a call costs: a reload (``RELOAD_S``),
    the check and warm-up calls, then the samples as ``time_repeated`` bounds them by ``options``."""
    if options.slow_repeats * seconds >= options.slow_budgets * options.budget_s:
        sampling = options.slow_repeats * seconds
    else:
        sampling = min(max(options.min_time_s, options.min_repeats * seconds), options.slow_budgets * options.budget_s)
    return RELOAD_S + (options.warmup + 1) * seconds + sampling


def gives_up(call_s: float, options: TimingOptions, cold: bool) -> bool:
    """Whether a call of ``call_s`` seconds is the timing (``options.give_up_s``); a ``cold`` call, the first
    after the program's load, only past the one-time work it may carry (``options.cold_start_s``)."""
    if options.give_up_s is None:
        return False
    return call_s > options.give_up_s + (options.cold_start_s if cold else 0.0)


def time_repeated(call: Callable[[], object], options: TimingOptions = TimingOptions(),
                  warm: bool = False) -> Timing:
    """Times ``call()`` (which must finish its work before returning) by ``options``; ``warm``: whether it ran
    before (its first call here is then no cold start, and may give up at once)."""
    last = 0.0
    for k in range(max(options.warmup, 1)):
        t0 = time.perf_counter()
        call()
        last = time.perf_counter() - t0
        if gives_up(last, options, cold=k == 0 and not warm):
            return Timing(last, last, 0.0, 1, 1)
    inner = max(1, min(1000, math.ceil(options.min_sample_s / max(last, 1e-7))))
    samples: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        for _ in range(inner):
            call()
        samples.append((time.perf_counter() - t0) / inner)
        n = len(samples)
        if n >= options.max_repeats:
            break
        spent = time.perf_counter() - start
        if n >= options.min_repeats and spent >= min(options.min_time_s, options.budget_s) and (
                median_uncertainty(samples) <= options.rel_spread or spent >= options.budget_s):
            break
        if n >= options.slow_repeats and spent >= options.slow_budgets * options.budget_s:
            break
    return Timing(float(np.median(samples)), float(min(samples)), relative_spread(samples), len(samples), inner)
