"""Transition costs: what a region boundary between two backends adds, per ordered backend pair.

The probe is two chained matmuls ``(x @ w) @ w`` on NxN f32 tensors, which every CPU backend takes, or,
for a pair of which one side takes convolutions but not matmuls (cuDNN), two chained 1x1 convolutions
whose activations hold as many bytes (1x64x(N/8)x(N/8)). With the first op on backend A and the second
on B, the program's measured time minus each op's own cost (measured alone, through the same harness
and cost database) is the cost of the A → B boundary: the hand-over of one tensor of N·N floats plus
whatever each side pays to enter and leave. It may be negative (IREE keeps two codegen regions in one
dispatch stream). The search adds it per boundary a plan makes. A pair with no probe both sides take
(cuDNN and cuBLAS) is not probed: the search prices it through the default backend.
"""

from __future__ import annotations

import itertools
import tempfile
from enum import Enum
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from . import HARNESS_VERSION
from ..backends import Backend, RegionKey
from ..graph import Graph, number_ops
from ..ir import new_context, parse_module
from ..plan import Plan, Region
from .db import CostDB, Transition
from .device import device_fingerprint
from .harness import MeasureOptions, measure_regions
from .plan_timing import PlanTimer
from .status import Status

#: Side of the probe's square f32 tensors: 256 → 256 KiB cross each boundary.
PROBE_SIZE = 256


class Probe(str, Enum):
    """The two chained ops a transition probe times on two backends."""

    MATMUL = "matmul"  # (x @ w) @ w, x and w NxN
    CONV = "conv"      # two 1x1 convolutions, 64 channels, (N/8)x(N/8) pixels: N·N floats cross


def probe_module(n: int = PROBE_SIZE, probe: Probe = Probe.MATMUL) -> str:
    if probe is Probe.MATMUL:
        t = f"tensor<{n}x{n}xf32>"
        return (f"func.func @main(%x: {t}, %w: {t}) -> {t} {{\n"
                f"  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : ({t}, {t}) -> {t}\n"
                f"  %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : ({t}, {t}) -> {t}\n"
                f"  return %1 : {t}\n}}\n")
    t, w = f"tensor<1x64x{n // 8}x{n // 8}xf32>", "tensor<64x64x1x1xf32>"
    def conv(a: str) -> str:
        return (f"stablehlo.convolution({a}, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = "
                "{stride = [1, 1], pad = [[0, 0], [0, 0]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, "
                f"feature_group_count = 1 : i64}} : ({t}, {w}) -> {t}")
    return (f"func.func @main(%x: {t}, %w: {w}) -> {t} {{\n  %0 = {conv('%x')}\n"
            f"  %1 = {conv('%0')}\n  return %1 : {t}\n}}\n")


def _probe_inputs(n: int, probe: Probe, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """The probe's f32 inputs (unit-scale outputs) and its expected result, computed from them in float64."""
    rng = np.random.default_rng(seed)
    if probe is Probe.MATMUL:
        x, w = ((rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32) for _ in range(2))
        expected = x.astype(np.float64) @ w @ w
    else:
        x = rng.standard_normal((1, 64, n // 8, n // 8)).astype(np.float32)
        w = (rng.standard_normal((64, 64, 1, 1)) / 8.0).astype(np.float32)
        mix = w[:, :, 0, 0].astype(np.float64)
        expected = np.einsum("oi,bihw->bohw", mix, np.einsum("oi,bihw->bohw", mix, x.astype(np.float64)))
    return [x, w], expected.astype(np.float32)


def probe_for(a: Backend, b: Backend, graphs: dict[Probe, Graph]) -> Probe | None:
    """The first probe both backends take each op of (None: no probe for this pair)."""
    return next((p for p, g in graphs.items()
                 if all(x.accepts(g, frozenset({i})) is None for x in (a, b) for i in (0, 1))), None)


def measure_transitions(backends: Sequence[Backend], db: CostDB, options: MeasureOptions | None = None, *,
                        n: int = PROBE_SIZE, pairs: Sequence[tuple[Backend, Backend]] | None = None,
                        on_progress: Callable[[int, int], None] | None = None) -> list[Transition]:
    """The transition cost of each ordered pair of ``pairs`` (default: every pair of ``backends``), from
    the DB where it holds them (they are facts of the machine, not of a model: any tune reuses them).
    Past ``options.deadline`` no new probe starts; the pairs not probed (also those with no probe both
    sides take) are left out of the answer."""
    options = options or MeasureOptions()
    device, _ = device_fingerprint(options.platform)
    pairs = list(pairs) if pairs is not None else list(itertools.product(backends, repeat=2))
    keys = [(a.name, b.name, a.version(), b.version(), device, HARNESS_VERSION, n * n * 4) for a, b in pairs]
    stored = [None if options.remeasure else db.get_transition(*key) for key in keys]
    found: list[Transition] = [t for t in stored if t is not None]
    if on_progress:
        on_progress(len(found), len(pairs))
    if all(t is not None for t in stored) or options.spent():
        return found
    modules = {p: parse_module(probe_module(n, p), new_context()) for p in Probe}
    for module in modules.values():
        number_ops(module)
    graphs = {p: Graph(m) for p, m in modules.items()}
    todo: dict[Probe, list[tuple[int, Backend, Backend]]] = {}
    for k, ((a, b), t) in enumerate(zip(pairs, stored)):
        probe = probe_for(a, b, graphs) if t is None else None
        if probe is not None:
            todo.setdefault(probe, []).append((k, a, b))
    with tempfile.TemporaryDirectory(prefix="collage-transitions-") as tmp, PlanTimer(Path(tmp), options) as timer:
        for probe, work in todo.items():
            if options.spent():
                break
            module = modules[probe]
            used = list({b.name: b for _, a, b2 in work for b in (a, b2)}.values())
            alone = measure_regions(module, [RegionKey(b.name, frozenset({0})) for b in used], db,
                                    options=options).rows
            inputs, expected = _probe_inputs(n, probe, options.seed)
            for k, a, b in work:
                if options.spent():
                    break
                if RegionKey(a.name, frozenset({0})) not in alone or RegionKey(b.name, frozenset({0})) not in alone:
                    continue  # a side not measured within the budget: nothing to store, ask again next time
                t = _measure_pair(module, a, b, keys[k], alone, timer, inputs, expected, options.default_backend)
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
    # Two chained ops on two backends: allow ten times the looser tolerance of the two.
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
