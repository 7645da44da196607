"""Where an artifact's time goes, from real runs of it: each library region's engine time and the boundary
around it (the program's region timer), and the time outside library regions, split by where it falls
between those calls. ``collage report`` and ``collage bench`` both show it.

The region timer tells, per ``collage_rt`` call, the seconds of the whole call and of the engine inside it;
a call's end is stamped here, so the gaps between consecutive calls are known too. A gap is IREE's own work
(ops on the default backend, iree-cpu/iree-cpu-dt regions, copies) plus the VM's transition into and out
of the region call: the program waits for the IREE work a region reads before calling it, so many small
library regions between IREE ops serialize the two.

    b = profile("model.collage", inputs, threads=2, repeats=20)
    b.total_ms, b.regions[0].engine_ms, b.outside_ms
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Sequence

import numpy as np

from .manifest import ArtifactError, Manifest
from .program import InputError, Program
from .types import is_float, parse_declaration


@dataclass
class RegionTime:
    """One library region in the profiled run (a region called more than once per run sums)."""

    name: str
    backend: str
    ops: int
    engine_ms: float
    boundary_ms: float  # its collage_rt call less the engine: mapping inputs, allocating results
    gap_before_ms: float  # from the previous region call's end (or the run's start) to this call's start


@dataclass
class Breakdown:
    """One run of ``@main`` with the region timer on: the run whose total is the median of the ``repeats``
    timed runs (the upper one of an even count), so its parts add up to its total. ``codegen`` lists the
    plan's IREE-compiled regions (backend, ops) and ``default_ops`` the ops left on the default backend:
    their time is inside the gaps, not timed apart."""

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


def random_inputs(program: Program, function: str = "main") -> list[np.ndarray]:
    """Inputs for ``function`` from its signature: standard normal floats, zeros elsewhere (valid as any
    index or mask)."""
    decl = program.vm_module.lookup_function(function).reflection.get("iree.abi.declaration", "")
    signature = parse_declaration(decl)
    rng = np.random.default_rng(0)
    arrays = []
    for k, spec in enumerate(signature.inputs if signature is not None else ()):
        if spec is None or spec.dtype is None or any(d is None for d in spec.shape):
            raise InputError(f"input {k} of @{function} is not a static tensor: give the inputs")
        if is_float(spec.dtype):
            arrays.append(rng.standard_normal(spec.shape).astype(spec.dtype))
        else:
            arrays.append(np.zeros(spec.shape, spec.dtype))
    return arrays


def _plan_layout(manifest: Manifest) -> tuple[dict[str, tuple[str, int]], list[tuple[str, int]], int]:
    """From the artifact's recorded plan: region name -> (backend, ops), the codegen (not library)
    regions as (backend, ops), and how many ops the regions hold."""
    library = {r.name for r in manifest.regions}
    sizes = {r["name"]: (r["backend"], len(r.get("ops", ()))) for r in manifest.plan.get("regions", [])}
    for r in manifest.regions:
        sizes.setdefault(r.name, (r.backend, 0))
    codegen = [sizes[n] for n in sizes if n not in library]
    return sizes, codegen, sum(n for _, n in sizes.values())


def profile(artifact: str | Path, inputs: Sequence[np.ndarray] | None = None, *, threads: int | None = None,
            op_count: int | None = None, repeats: int = 20, max_seconds: float = 30.0) -> Breakdown:
    """Runs ``@main`` of ``artifact`` (after two warm-up runs) ``repeats`` times, or fewer once
    ``max_seconds`` are spent (at least 3), with the region timer on. ``inputs``: random ones from the
    signature when None. ``op_count``: the model's ops (those outside every region count as on the
    default backend)."""
    stamps: list[tuple[str, float, float, float]] = []  # region, call s, engine s, end of call
    runs: list[tuple[float, float, list[tuple[str, float, float, float]]]] = []  # start, end, stamps
    with Program(artifact, threads=threads,
                 region_timer=lambda r, call_s, run_s: stamps.append((r, call_s, run_s, perf_counter()))) as program:
        if "main" not in program.functions:
            raise ArtifactError(f"{artifact}: the artifact has no @main to run")
        args = list(inputs) if inputs is not None else random_inputs(program)
        sizes, codegen, placed = _plan_layout(program.manifest)
        started = perf_counter()
        for k in range(repeats + 2):
            if k >= 5 and perf_counter() - started > max_seconds:
                break
            stamps.clear()
            t0 = perf_counter()
            program.invoke("main", *args)
            t1 = perf_counter()
            if k >= 2:  # two warm-up runs: first-call allocations, engines' own lazy setup
                runs.append((t0, t1, list(stamps)))
    t0, t1, calls = sorted(runs, key=lambda r: r[1] - r[0])[len(runs) // 2]
    per: dict[str, list[float]] = {}  # region -> engine, boundary, gap before
    previous_end = t0
    for region, call_s, run_s, end in calls:
        acc = per.setdefault(region, [0.0, 0.0, 0.0])
        acc[0] += run_s
        acc[1] += call_s - run_s
        acc[2] += max(end - call_s - previous_end, 0.0)
        previous_end = end
    regions = [RegionTime(name, *sizes.get(name, ("?", 0)), *(1e3 * v for v in acc)) for name, acc in per.items()]
    engines, boundaries = sum(r.engine_ms for r in regions), sum(r.boundary_ms for r in regions)
    total = 1e3 * (t1 - t0)
    return Breakdown(len(runs), total, regions, 1e3 * (t1 - previous_end), codegen,
                     max((op_count or placed) - placed, 0), engines, boundaries, total - engines - boundaries)
