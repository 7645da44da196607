"""Interleaved timing for the studies: each runner called in turn, round after round, so that a machine's
drift (another tenant, clock changes) falls on every runner alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

from collage_mlir.bench import round_order, settle


def interleaved_ms(runners: Mapping[str, Callable[[], object]], rounds: int, min_time: float = 0.2,
                   warmup: int = 1) -> dict[str, float]:
    """Median ms per call of each runner over ``rounds`` rounds, interleaved across runners; a round calls a
    runner until ``min_time`` seconds have passed. ``warmup`` untimed calls each first. Each round in its own
    order (``round_order``: no runner always follows the same one)."""
    for fn in runners.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in runners}
    for r in range(rounds):
        for label in round_order(runners, r):
            fn = runners[label]
            settle()
            n, start = 0, time.perf_counter()
            while True:
                fn()
                n += 1
                elapsed = time.perf_counter() - start
                if elapsed >= min_time:
                    break
            samples[label].append(elapsed / n * 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}


def call_costs(fn: Callable[[], object], calls: int, idle_s: float = 0.05) -> dict[str, float]:
    """One warm-up call, then ``calls`` timed calls of ``fn``: median wall and process CPU ms per call (all
    threads), and the process CPU ms burnt while it sleeps ``idle_s`` right after (spinning workers)."""
    fn()
    wall, cpu = [], []
    for _ in range(calls):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    c0 = time.process_time()
    time.sleep(idle_s)
    return {"wall_ms": statistics.median(wall) * 1e3, "cpu_ms": statistics.median(cpu) * 1e3,
            "idle_cpu_ms": (time.process_time() - c0) * 1e3}
