"""`collage bench`: a collage-compiled model side by side with what a user would pick instead (PyTorch
eager, torch.compile, ONNX Runtime, OpenVINO, IREE alone, XLA), each in its own worker process, timed
interleaved in one run, checked against PyTorch eager (`jax.jit` for JAX models).

    contenders/   one file per contender: how its users set it up (worker side)
    tasks.py      what the worker processes run: reference, prepare, sample
    session.py    the orchestration: compile each contender, warm up, time round-robin
    report.py     JSON, markdown table, PNG chart
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

#: The pause before each contender's slice of interleaved timing: ONNX Runtime's default session (a user's)
#: spins its idle workers for ~35 ms after its last call, so whichever contender was timed next ran beside it on
#: 2 cores: a 4-layer BERT through two ORT sessions without spinning, interleaved with ORT's default session
#: in 50 ms slices, measured 9.0-9.3 ms per call without this pause and 8.3-8.6 with it (2026-11-29, Zen 5).
SETTLE_S = 0.05


def round_order(labels: Sequence[str], r: int) -> list[str]:
    """The order of round ``r`` of interleaved timing: a shuffle seeded by ``r``. Whatever a contender leaves
    behind when it stops (threads still spinning, caches swept by a large model) slows the next one, so no
    contender may always follow the same one; a rotation keeps every contender's predecessor (an int8
    BERT-base program timed right after Inductor's f32 BERT each round measured 1.085x the same program timed
    after another, 2026-11-29)."""
    return random.Random(r).sample(list(labels), len(labels))


def settle() -> None:
    """Waits ``SETTLE_S`` so the previous contender's threads are idle before the next one is timed."""
    time.sleep(SETTLE_S)
