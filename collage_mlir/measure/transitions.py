"""Transition costs: what a region boundary between two backends adds, per ordered backend pair.

The probe is two chained matmuls ``(x @ w) @ w`` on NxN f32 tensors, which every CPU backend takes.
With the first on backend A and the second on B, the program's measured time minus each matmul's own
cost (measured alone, through the same harness and cost database) is the cost of the A → B boundary:
the hand-over of one NxN tensor plus whatever each side pays to enter and leave. It may be negative
(IREE keeps two codegen regions in one dispatch stream). The search adds it per boundary a plan makes.
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from . import HARNESS_VERSION
from ..backends import Backend, RegionKey
from ..graph import number_ops
from ..ir import new_context, parse_module
from ..plan import Plan, Region
from .db import CostDB, Transition
from .device import device_fingerprint
from .harness import MeasureOptions, measure_regions
from .plan_timing import PlanTimer
from .status import Status

#: Side of the probe's square f32 tensors: 256 → 256 KiB cross each boundary.
PROBE_SIZE = 256


def probe_module(n: int = PROBE_SIZE) -> str:
    t = f"tensor<{n}x{n}xf32>"
    return (f"func.func @main(%x: {t}, %w: {t}) -> {t} {{\n"
            f"  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : ({t}, {t}) -> {t}\n"
            f"  %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : ({t}, {t}) -> {t}\n"
            f"  return %1 : {t}\n}}\n")


def measure_transitions(backends: Sequence[Backend], db: CostDB, options: MeasureOptions | None = None, *,
                        n: int = PROBE_SIZE, pairs: Sequence[tuple[Backend, Backend]] | None = None,
                        on_progress: Callable[[int, int], None] | None = None) -> list[Transition]:
    """The transition cost of each ordered pair of ``pairs`` (default: every pair of ``backends``), from
    the DB where it holds them (they are facts of the machine, not of a model: any tune reuses them).
    Past ``options.deadline`` no new probe starts; the pairs not probed are left out of the answer."""
    options = options or MeasureOptions()
    device, _ = device_fingerprint(options.platform)
    pairs = list(pairs) if pairs is not None else list(itertools.product(backends, repeat=2))
    keys = [(a.name, b.name, a.version(), b.version(), device, HARNESS_VERSION, n * n * 4) for a, b in pairs]
    stored = [None if options.remeasure else db.get_transition(*key) for key in keys]
    found: list[Transition] = [t for t in stored if t is not None]
    todo = [(k, a, b) for k, ((a, b), t) in enumerate(zip(pairs, stored)) if t is None]
    if on_progress:
        on_progress(len(found), len(pairs))
    if not todo or options.spent():
        return found
    module = parse_module(probe_module(n), new_context())
    number_ops(module)
    used = list({b.name: b for _, a, b2 in todo for b in (a, b2)}.values())
    alone = measure_regions(module, [RegionKey(b.name, frozenset({0})) for b in used], db, options=options).rows
    rng = np.random.default_rng(options.seed)
    x, w = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32), (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    expected = (x.astype(np.float64) @ w @ w).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="collage-transitions-") as tmp, PlanTimer(Path(tmp), options) as timer:
        for k, a, b in todo:
            if options.spent():
                break
            if RegionKey(a.name, frozenset({0})) not in alone or RegionKey(b.name, frozenset({0})) not in alone:
                continue  # a side not measured within the budget: nothing to store, ask again next time
            t = _measure_pair(module, a, b, keys[k], alone, timer, [x, w], expected, options.default_backend)
            db.put_transition(t)
            found.append(t)
            if on_progress:
                on_progress(len(found), len(pairs))
    return found


def _measure_pair(module, a: Backend, b: Backend, key: tuple, alone: dict, timer: PlanTimer, inputs, expected,
                  default_backend: str) -> Transition:
    cost_a, cost_b = alone.get(RegionKey(a.name, frozenset({0}))), alone.get(RegionKey(b.name, frozenset({0})))
    for backend, m in ((a, cost_a), (b, cost_b)):
        if m is None or not m.usable:
            why = m.message if m is not None else "not measured"
            return Transition(*key, status=Status.ERROR, message=f"{backend.name} cannot run the probe alone: {why}")
    plan = Plan([Region("first", a.name, frozenset({0})), Region("second", b.name, frozenset({1}))],
                default_backend, f"transition {a.name} -> {b.name}")
    # Two chained matmuls on two backends: allow ten times the looser tolerance of the two.
    rtol = 10 * max(a.tolerance.rtol, b.tolerance.rtol)
    atol = 10 * max(a.tolerance.atol, b.tolerance.atol)
    outcome = timer.time(module, plan, inputs, [expected], rtol, atol)
    if not outcome.ok:
        return Transition(*key, status=outcome.status, message=outcome.message)
    t = outcome.value
    if t.status != Status.OK:
        return Transition(*key, status=t.status, message=t.message)
    return Transition(*key, status=Status.OK, cost_s=t.median_s - cost_a.median_s - cost_b.median_s,
                      message=f"pair {t.median_s * 1e6:.1f} us, alone {cost_a.median_s * 1e6:.1f} + "
                              f"{cost_b.median_s * 1e6:.1f} us")
