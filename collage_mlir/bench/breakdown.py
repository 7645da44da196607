"""Where a collage artifact's time goes, from real runs of it: each library region's engine time and the
boundary around it (the runtime's region timer), and the time outside library regions, split by where it
falls between those calls.

The runtime tells, per ``collage_rt`` call, the seconds of the whole call and of the engine inside it; a
call's end is stamped here, so the gaps between consecutive calls are known too. A gap is IREE's own
work (ops on the default backend, iree-cpu/iree-cpu-dt regions, copies) plus the VM's transition into
and out of the region call: the program waits for the IREE work a region reads before calling it, so
many small library regions between IREE ops serialize the two.

    b = measure(artifact_dir, inputs, threads=2, repeats=20)
    b.total_ms, b.regions[0].engine_ms, b.outside_ms
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Sequence

import numpy as np


@dataclass
class RegionTime:
    """One library region: medians over the timed runs (a region called more than once per run sums)."""

    name: str
    backend: str
    ops: int
    engine_ms: float
    boundary_ms: float  # its collage_rt call less the engine: mapping inputs, allocating results
    gap_before_ms: float  # from the previous region call's end (or the run's start) to this call's start


@dataclass
class Breakdown:
    """Medians over ``repeats`` runs of ``@main`` with the region timer on. The totals (engines,
    boundaries, outside) are medians of each run's sums, so they come from the same runs as the total
    (per-region medians do not add up to it on a noisy machine). ``codegen`` lists the plan's
    IREE-compiled regions (backend, ops) and ``default_ops`` the ops left on the default backend: their
    time is inside the gaps, not timed apart."""

    repeats: int
    total_ms: float
    regions: list[RegionTime] = field(default_factory=list)
    tail_ms: float = 0.0  # from the last region call's end to the run's end (IREE work, results out)
    codegen: list[tuple[str, int]] = field(default_factory=list)
    default_ops: int = 0
    engine_ms: float = 0.0  # all library regions' engines
    boundary_ms: float = 0.0  # all their boundaries
    outside_ms: float = 0.0  # the rest: IREE's work and the VM's transitions (the gaps and the tail)

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(doc: dict) -> "Breakdown":
        regions = [RegionTime(**r) for r in doc["regions"]]
        return Breakdown(doc["repeats"], doc["total_ms"], regions, doc["tail_ms"],
                         [tuple(c) for c in doc["codegen"]], doc["default_ops"], doc["engine_ms"],
                         doc["boundary_ms"], doc["outside_ms"])


def _plan_layout(manifest: dict) -> tuple[dict[str, tuple[str, int]], list[tuple[str, int]], int]:
    """From the artifact's recorded plan: region name -> (backend, ops), the codegen (not library)
    regions as (backend, ops), and how many ops the regions hold."""
    plan = manifest.get("plan") or {}
    library = {r["name"] for r in manifest.get("regions", [])}
    sizes = {r["name"]: (r["backend"], len(r.get("ops", ()))) for r in plan.get("regions", [])}
    for r in manifest.get("regions", []):
        sizes.setdefault(r["name"], (str(r.get("backend")), 0))
    codegen = [sizes[n] for n in sizes if n not in library]
    return sizes, codegen, sum(n for _, n in sizes.values())


def measure(artifact: str | Path, inputs: Sequence[np.ndarray], threads: int, op_count: int | None = None,
            repeats: int = 20, max_seconds: float = 30.0) -> Breakdown:
    """Runs ``@main`` of ``artifact`` (after two warm-up runs) ``repeats`` times, or fewer once
    ``max_seconds`` are spent (at least 3), with the runtime's region timer on. ``op_count``: the
    model's ops (those outside every region are counted as on the default backend)."""
    import collage_runtime

    manifest = json.loads((Path(artifact) / "manifest.json").read_text())
    sizes, codegen, placed = _plan_layout(manifest)
    stamps: list[tuple[str, float, float, float]] = []  # region, call s, engine s, end of call
    totals, tails, sums = [], [], []  # sums: per run (engines, boundaries, outside)
    per: dict[str, list[tuple[float, float, float]]] = {}  # region -> per run (engine, boundary, gap before)
    with collage_runtime.load(artifact, threads=threads,
                              region_timer=lambda r, call_s, run_s: stamps.append((r, call_s, run_s, perf_counter()))
                              ) as program:
        started = perf_counter()
        for k in range(repeats + 2):
            if k >= 5 and perf_counter() - started > max_seconds:
                break
            stamps.clear()
            t0 = perf_counter()
            program.invoke("main", *inputs)
            t1 = perf_counter()
            if k < 2:
                continue  # warm-up: first-call allocations, engines' own lazy setup
            totals.append(t1 - t0)
            previous_end = t0
            run: dict[str, list[float]] = {}
            for region, call_s, run_s, end in stamps:
                acc = run.setdefault(region, [0.0, 0.0, 0.0])
                acc[0] += run_s
                acc[1] += call_s - run_s
                acc[2] += max(end - call_s - previous_end, 0.0)
                previous_end = end
            tails.append(t1 - previous_end)
            engines, boundaries = sum(a[0] for a in run.values()), sum(a[1] for a in run.values())
            sums.append((engines, boundaries, t1 - t0 - engines - boundaries))
            for region, acc in run.items():
                per.setdefault(region, []).append(tuple(acc))
    order = list(dict.fromkeys(r for r, *_ in stamps))  # the order of the last run's calls
    median = statistics.median
    regions = [RegionTime(name, *sizes.get(name, ("?", 0)), *(1e3 * median(v[i] for v in per[name]) for i in range(3)))
               for name in order]
    engines, boundaries, outside = (1e3 * median(v[i] for v in sums) for i in range(3))
    return Breakdown(len(totals), 1e3 * median(totals), regions, 1e3 * median(tails), codegen,
                     max((op_count or placed) - placed, 0), engines, boundaries, outside)


def to_markdown(model: str, b: Breakdown, top: int = 12) -> list[str]:
    """The breakdown as markdown lines: a summary line, then the ``top`` largest library regions."""
    def share(ms: float) -> str:
        return f"{100 * ms / b.total_ms:.0f} %" if b.total_ms else "—"

    codegen = ", ".join(f"{n} ops on {backend}" for backend, n in b.codegen) or "none"
    lines = [f"**{model}**: a run of the collage artifact takes {b.total_ms:.3g} ms (median of {b.repeats}, region "
             f"timer on): {len(b.regions)} library region call(s), engines {b.engine_ms:.3g} ms ({share(b.engine_ms)}), "
             f"their boundaries {b.boundary_ms:.3g} ms ({share(b.boundary_ms)}), outside library regions "
             f"{b.outside_ms:.3g} ms ({share(b.outside_ms)}: IREE's work and the VM's transitions, of which "
             f"{b.tail_ms:.3g} ms after the last region). IREE-compiled regions: {codegen}; "
             f"{b.default_ops} ops on the default backend outside any region.", ""]
    by_backend: dict[str, list[float]] = {}
    for r in b.regions:
        acc = by_backend.setdefault(r.backend, [0, 0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += r.ops
        acc[2] += r.engine_ms
        acc[3] += r.boundary_ms
    if len(b.regions) > 1:
        lines += ["Per backend (sums of per-region medians): " + "; ".join(
            f"{name}: {n} regions, {ops} ops, engines {e:.3g} ms, boundaries {bd:.3g} ms"
            for name, (n, ops, e, bd) in by_backend.items()) + ".", ""]
    if b.regions:
        lines += ["| region | backend | ops | engine ms | share | boundary ms | gap before ms (IREE work + transition) |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        shown = sorted(b.regions, key=lambda r: -(r.engine_ms + r.boundary_ms + r.gap_before_ms))[:top]
        for r in shown:
            lines.append(f"| {r.name} | {r.backend} | {r.ops} | {r.engine_ms:.3f} | {share(r.engine_ms)} | "
                         f"{r.boundary_ms:.3f} | {r.gap_before_ms:.3f} |")
        if len(b.regions) > top:
            rest = [r for r in b.regions if r not in shown]
            lines.append(f"| {len(rest)} more | | {sum(r.ops for r in rest)} | {sum(r.engine_ms for r in rest):.3f} | "
                         f"{share(sum(r.engine_ms for r in rest))} | {sum(r.boundary_ms for r in rest):.3f} | "
                         f"{sum(r.gap_before_ms for r in rest):.3f} |")
        lines.append("")
    return lines
