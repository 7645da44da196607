"""How many samples a timing takes (``measure.timing.time_repeated``)."""

from __future__ import annotations

import time

import pytest

from collage_mlir.measure.timing import TimingOptions, time_repeated


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
