"""Measurement throughput: candidates measured per minute on ResNet-50 with 5 CPU backends, with a cold
cost database (every pair built, validated and timed) and a warm one (every pair a DB hit).

ResNet-50 is built in code (torch.nn, random weights, eval mode; no torchvision), imported with the torch
frontend (cached on disk) and numbered. Its full candidate set (``enumerate_candidates``) is too large for
one sitting, so ``--limit`` pairs are chosen deterministically: the limit is split evenly over the
backends, each backend's candidates (in candidate order) are sampled at evenly spaced positions (so the
sample spans the whole network, not just the first ops), and the picks are interleaved round-robin.

Cold: a fresh DB in a temporary directory, ``measure_regions`` on the chosen pairs. Warm: the same call
again on the same DB (all hits: what remains is region extraction and DB look-ups). The cold run's
wall time is split into phases by watching the harness's progress callbacks: region extraction and DB
look-ups, reference capture (the whole model compiled and run once with IREE), building candidates (in
parallel workers), timing them (one at a time).

    python -m studies.measure_throughput.measure_throughput [--limit 120] [--backends ...] [--blocks 3,4,6,3] [--image 224]
                                                            [--budget 1.0] [--jobs N] [--out studies/measure_throughput] [--quick]

Writes OUT/measure_throughput.json and OUT/measure_throughput.md. Not run in CI.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

from studies.common.report import header, write_report


from collage_mlir.backends import Candidate, get_backend
from collage_mlir.graph import Graph
from collage_mlir.ir import new_context
from collage_mlir.measure.db import STATUSES, CostDB
from collage_mlir.measure.harness import MeasureOptions, Progress, measure_regions
from collage_mlir.measure.timing import TimingOptions
from collage_mlir.passes.number_ops import NumberOpsPass
from collage_mlir.search.candidates import enumerate_candidates

NAME = "measure_throughput"
BACKENDS = "iree-cpu,iree-cpu-dt,onednn,ort,openvino"


def resnet50(blocks=(3, 4, 6, 3)):
    """The zoo's bottleneck ResNet (torchvision's resnet50 layout for the default ``blocks``), seed 0, eval."""
    import torch

    from collage_mlir.zoo.resnet import ResNet

    torch.manual_seed(0)
    return ResNet(blocks).eval()


def choose(candidates: list[Candidate], backends: list[str], limit: int) -> list[Candidate]:
    """``limit`` candidates spread over ``backends`` (even quotas, a short backend's rest going to the
    others) and over the model (evenly spaced in each backend's candidate order), interleaved round-robin."""
    per = {b: [c for c in candidates if c.backend == b] for b in backends}
    quota = {b: 0 for b in backends}
    left = min(limit, sum(len(v) for v in per.values()))
    while left:
        open_ = [b for b in backends if quota[b] < len(per[b])]
        share = max(1, left // len(open_))
        for b in open_:
            take = min(share, len(per[b]) - quota[b], left)
            quota[b] += take
            left -= take
            if not left:
                break
    picks = {b: [per[b][int((k + 0.5) * len(per[b]) / quota[b])] for k in range(quota[b])] for b in backends}
    out: list[Candidate] = []
    for k in range(max(quota.values(), default=0)):
        out.extend(picks[b][k] for b in backends if k < quota[b])
    return out


class PhaseClock:
    """Splits a ``measure_regions`` call's wall time into phases from its progress callbacks: before the
    first callback (extraction, DB look-ups), until the first batch starts building (reference capture),
    building a batch, timing a candidate, and the bookkeeping between."""

    def __init__(self, echo: bool = True):
        self.acc: dict[str, float] = collections.defaultdict(float)
        self.phase, self.last, self.done, self.echo, self.shown = "extract+lookup", time.perf_counter(), -1, echo, 0.0

    def __call__(self, p: Progress) -> None:
        now = time.perf_counter()
        self.acc[self.phase] += now - self.last
        if self.done < 0:
            self.phase = "reference"
        elif p.current.startswith("building"):
            self.phase = "build"
        elif p.done > self.done:
            self.phase = "other"
        elif p.current:
            self.phase = "time"
        self.last, self.done = now, p.done
        if self.echo and (now - self.shown > 10 or p.done == p.total):
            self.shown = now
            print(f"  {p.done}/{p.total} done, {p.cache_hits} hits, {p.failures} failures, "
                  f"{p.elapsed_s:.0f} s  {p.current}", file=sys.stderr, flush=True)

    def finish(self) -> dict[str, float]:
        self.acc[self.phase] += time.perf_counter() - self.last
        return dict(self.acc)


def run(args: argparse.Namespace) -> dict:
    import torch

    blocks = tuple(int(b) for b in args.blocks.split(","))
    names = [n.strip() for n in args.backends.split(",") if n.strip()]
    backends = [get_backend(n, where="--backends") for n in names]

    t0 = time.perf_counter()
    model = resnet50(blocks)
    x = torch.randn(1, 3, args.image, args.image, generator=torch.Generator().manual_seed(0))
    from collage_mlir.frontends.torch import import_torch

    module = import_torch(model, [x], new_context())
    NumberOpsPass().run(module)
    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    graph = Graph(module)
    candidates = enumerate_candidates(graph, backends)
    enumerate_s = time.perf_counter() - t0
    print(f"ResNet blocks {blocks}, {args.image}x{args.image}: {len(graph)} ops, {len(candidates)} candidate pairs "
          f"(import {import_s:.1f} s, enumerate {enumerate_s:.1f} s)", file=sys.stderr)
    chosen = choose(candidates, names, args.limit)
    pairs = [c.key for c in chosen]

    options = MeasureOptions(timing=TimingOptions(budget_s=args.budget))
    if args.jobs:
        options.jobs = args.jobs
    examples = {"main": [x.numpy()]}
    runs = {}
    with tempfile.TemporaryDirectory(prefix="collage-throughput-") as tmp, CostDB(Path(tmp) / "costs.sqlite") as db:
        for label in ("cold", "warm"):
            print(f"{label} DB: measuring {len(pairs)} pairs", file=sys.stderr)
            clock = PhaseClock()
            t0 = time.perf_counter()
            summary = measure_regions(module, pairs, db, examples=examples, options=options, on_progress=clock)
            wall = time.perf_counter() - t0
            phases = clock.finish()
            statuses = collections.Counter(m.status for m in summary.rows.values())
            runs[label] = {
                "pairs": len(pairs),
                "posed": len(summary.rows),
                "not_posed": len(summary.skipped),
                "cache_hits": summary.cache_hits,
                "measured_pairs": summary.measured,
                "unique_rows": len({m.key() for m in summary.rows.values()}),
                "elapsed_s": wall,
                "candidates_per_min": 60 * len(pairs) / wall,
                "status": {s: statuses[s] for s in STATUSES if statuses[s]},
                "phases_s": phases,
            }
        rows = db.measurements()
    per_backend = {}
    for name in names:
        mine = [m for p, m in summary.rows.items() if p.backend == name]
        per_backend[name] = {"pairs": sum(1 for p in pairs if p.backend == name),
                             "candidates_in_model": sum(1 for c in candidates if c.backend == name),
                             "status": dict(collections.Counter(m.status for m in mine)),
                             "not_posed": sum(1 for p in summary.skipped if p.backend == name)}
    sizes = collections.Counter(len(p.ops) for p in pairs)
    measured = [{"backend": p.backend, "ops": len(p.ops), "region": m.region[:160], "status": m.status, "median_s": m.median_s,
                  "spread": m.spread, "repeats": m.repeats}
                 for p, m in summary.rows.items()]
    failures = [{"backend": m.backend, "status": m.status, "region": m.region[:120], "message": m.message[:300]}
                for m in rows if not m.usable]
    return header(NAME) | {
        "model": {"name": "resnet50" if blocks == (3, 4, 6, 3) else f"resnet{blocks}", "blocks": list(blocks),
                  "image": args.image, "ops": len(graph)},
        "backends": {b.name: b.version() for b in backends},
        "timing": options.timing.to_json(),
        "jobs": options.jobs,
        "candidates_in_model": len(candidates),
        "limit": args.limit,
        "chosen_region_sizes": dict(sorted(sizes.items())),
        "one_time_s": {"import_and_number": import_s, "enumerate_candidates": enumerate_s},
        "runs": runs,
        "per_backend": per_backend,
        "pairs": measured,
        "failures": failures,
        "not_posed": [{"backend": p.backend, "ops": len(p.ops), "why": skip.why[:300]}
                      for p, skip in summary.skipped.items()],
    }


def markdown(r: dict) -> str:
    cold, warm = r["runs"]["cold"], r["runs"]["warm"]
    m = r["model"]
    lines = [f"# Measurement throughput: {m['name']} ({m['ops']} ops, 1x3x{m['image']}x{m['image']}), "
             f"{len(r['backends'])} CPU backends", "",
             f"Device: {r['device']}; {r['jobs']} parallel builds; timing budget {r['timing']['budget_s']} s per "
             f"candidate, stop at median uncertainty {r['timing']['rel_spread']}.", "",
             f"The model has **{r['candidates_in_model']}** candidate (region, backend) pairs; {cold['pairs']} were "
             f"measured (evenly spread over backends and over the model), {cold['unique_rows']} distinct DB rows "
             f"(pairs with the same structural hash share one).", "",
             "| DB | pairs | measured rows | hits | elapsed s | candidates/min |",
             "|---|---:|---:|---:|---:|---:|"]
    for label, x in (("cold", cold), ("warm", warm)):
        rows = x["unique_rows"] if label == "cold" else 0
        lines.append(f"| {label} | {x['pairs']} | {rows} | {x['cache_hits']} | {x['elapsed_s']:.1f} | "
                     f"{x['candidates_per_min']:.0f} |")
    lines += ["", "Cold run by phase (from the harness's progress callbacks):", "",
              "| phase | s | share |", "|---|---:|---:|"]
    for phase, s in sorted(cold["phases_s"].items(), key=lambda kv: -kv[1]):
        lines.append(f"| {phase} | {s:.1f} | {100 * s / cold['elapsed_s']:.0f}% |")
    lines += ["", "Per backend (cold):", "",
              "| backend | version | pairs | in model | " + " | ".join(STATUSES) + " | not posed |",
              "|---|---|---:|---:|" + "---:|" * len(STATUSES) + "---:|"]
    for b, x in r["per_backend"].items():
        lines.append(f"| {b} | {r['backends'][b]} | {x['pairs']} | {x['candidates_in_model']} | "
                     + " | ".join(str(x["status"].get(s, "")) for s in STATUSES) + f" | {x['not_posed'] or ''} |")
    lines += ["", f"Region sizes chosen (ops: pairs): {r['chosen_region_sizes']}.", "",
              "One-time costs outside the measured runs: import + numbering "
              f"{r['one_time_s']['import_and_number']:.1f} s "
              f"(the torch import is cached on disk), candidate enumeration "
              f"{r['one_time_s']['enumerate_candidates']:.1f} s. Reference capture (IREE compiles and runs the whole "
              "model once) is inside the cold run, as the `reference` phase.", ""]
    if r["failures"]:
        lines += ["Failures:", ""]
        for f in r["failures"][:30]:
            lines.append(f"- {f['backend']} {f['status']}: {f['region'][:60]} — {f['message'][:160]}")
        lines.append("")
    lines += ["Command:", "", f"    {r['command']}", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default=BACKENDS)
    p.add_argument("--limit", type=int, default=120, help="pairs to measure (default 120)")
    p.add_argument("--blocks", default="3,4,6,3", help="bottleneck blocks per stage (default 3,4,6,3: ResNet-50)")
    p.add_argument("--image", type=int, default=224, help="input height and width (default 224)")
    p.add_argument("--budget", type=float, default=1.0, help="timing budget per candidate, s (default 1)")
    p.add_argument("--jobs", type=int, default=None, help="parallel builds (default: CPU count)")
    p.add_argument("--out", default=str(Path(__file__).parent), help="output directory")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: blocks 1,1,1,1, 64x64 input, 10 pairs, 0.2 s budget")
    a = p.parse_args()
    if a.quick:
        a.blocks, a.image, a.limit, a.budget = "1,1,1,1", 64, 10, 0.2
    result = run(a)
    write_report(a.out, NAME, result, markdown(result))


if __name__ == "__main__":
    main()
