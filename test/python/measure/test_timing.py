"""How many samples a timing takes (``measure.timing.time_repeated``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from collage_mlir.measure.timing import RELOAD_S, TimingOptions, gives_up, time_repeated, timing_wall_s


@pytest.mark.fast
def test_a_slow_call_stops_at_a_few_samples_a_fast_one_takes_the_minimum():
    """A call far slower than the budget is sampled ``slow_repeats`` times once they span ``slow_budgets``
    budgets (a whole-model seed at 1.1 s a call took 12 s of a tune's budget); a fast call still takes
    ``min_repeats`` samples. The median is the calls' time either way."""
    options = TimingOptions(warmup=1, min_repeats=10, budget_s=0.01, rel_spread=0.0, slow_repeats=3, slow_budgets=3.0)
    slow = time_repeated(lambda: time.sleep(0.02), options)
    assert slow.repeats == 3 and 0.02 <= slow.median_s < 0.1
    fast = time_repeated(lambda: time.sleep(0.0005), options)
    assert fast.repeats >= 10 and fast.median_s < 0.02


@pytest.mark.fast
def test_a_call_slower_than_the_give_up_time_is_one_sample():
    """``give_up_s`` (a tune gives it as a few times its fastest plan): a warm call slower than it is the
    timing, one sample; a call faster than it is sampled as usual."""
    options = TimingOptions(warmup=2, min_repeats=5, budget_s=0.01, give_up_s=0.01)
    slow = time_repeated(lambda: time.sleep(0.02), options, warm=True)
    assert slow.repeats == 1 and slow.median_s >= 0.02
    assert time_repeated(lambda: time.sleep(0.001), options, warm=True).repeats >= 5


@pytest.mark.fast
def test_a_slow_cold_call_does_not_give_up():
    """A program's first call after load carries one-time work (on an H100 a plan with one cuBLAS region:
    85 ms cold, ~1 ms warm): it gives up only past ``give_up_s + cold_start_s``; the next call decides."""
    options = TimingOptions(warmup=2, min_repeats=5, budget_s=0.01, give_up_s=0.01, cold_start_s=0.2)
    calls = []

    def cold_then_fast():
        time.sleep(0.05 if not calls else 0.001)
        calls.append(1)

    timing = time_repeated(cold_then_fast, options)
    assert timing.repeats >= 5 and timing.median_s < 0.01
    assert not gives_up(0.085, options, cold=True) and gives_up(0.085, options, cold=False)
    assert gives_up(18.0, options, cold=True)  # R3D-18's 18 s calls: the cold call is the timing


@pytest.mark.fast
def test_a_timings_wall_time_is_estimated_from_the_timing_options():
    """What a finalists' round is budgeted by: a reload, the check and warm-up calls, then the samples as
    the options bound them (at least ``min_time_s``; ``slow_repeats`` samples of a slow call)."""
    t = TimingOptions()
    assert timing_wall_s(1e-4, t) == pytest.approx(RELOAD_S + (t.warmup + 1) * 1e-4 + t.min_time_s)
    assert timing_wall_s(2.0, t) == pytest.approx(RELOAD_S + (t.warmup + 1) * 2.0 + t.slow_repeats * 2.0)
    fast = time.perf_counter()
    time_repeated(lambda: time.sleep(0.002), t, warm=True)
    assert time.perf_counter() - fast <= timing_wall_s(0.002, t)  # the sampling the estimate allows for


@pytest.mark.fast
def test_a_worker_stopped_mid_task_takes_what_it_started_with_it(tmp_path):
    """A task past its timeout kills the worker and the processes it started (a build stopped at a tune's
    deadline left its ``iree-compile`` running, and the seeds timed after it ran 2x slow)."""
    from collage_mlir.measure.status import Status
    from collage_mlir.measure.worker import Worker

    marker = f"sleep {37 + os.getpid() % 1000}.5"  # a command line no other process has
    worker = Worker("stop", tmp_path)
    try:
        outcome = worker.call("subprocess:run", 1.0, args=marker.split())
        assert outcome.status == Status.TIMEOUT
        time.sleep(0.2)
        assert _running(marker) == [], "the worker's child outlived it"
    finally:
        worker.stop()
        for pid in _running(marker):
            os.kill(pid, 9)


def _running(command_line: str) -> list[int]:
    """The processes whose command line is ``command_line`` (Linux's /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().replace(b"\0", b" ").strip() == command_line.encode():
                found.append(int(proc.name))
        except OSError:
            pass
    return found
