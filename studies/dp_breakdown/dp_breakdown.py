"""Why a tune's DP plan is slower than its prediction: the DP plan a tune stored in the cost DB, compiled
and run with the runtime's region timer, each library region's engine time inside the program against
its DB row (the same region measured alone, what the DP priced it at), and the time left to IREE (its
regions and the glue between library regions).

    python -m studies.dp_breakdown.dp_breakdown MODEL --db COSTS.sqlite [--runs 20] [--name dp_breakdown_MODEL]

MODEL is a zoo model a ``collage tune`` / ``collage bench --tune`` run tuned on that DB (its latest
stored tune result whose plans name this model's ops is taken).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
from studies.common.report import header, write_report

import collage_runtime
from collage_mlir import zoo
from collage_mlir.graph import Graph, number_ops
from collage_mlir.ir import new_context
from collage_mlir.iree import compile_module
from collage_mlir.measure.db import CostDB
from collage_mlir.measure.extract import extract_region
from collage_mlir.plan import Plan
from collage_mlir.search.record import TunedPlan
from collage_mlir.search.tune import TUNE_RESULT


def stored_dp_plan(db_path: str, graph: Graph) -> tuple[Plan, float | None]:
    """The DP plan of the latest stored tune result whose single-backend plans lie within ``graph``'s
    ops and reach its last op (the results of other models in the same DB do not), and the seconds the
    DP predicted for it."""
    last = max(graph.nodes)
    for doc in CostDB(db_path).cached_documents(TUNE_RESULT):
        record = json.loads(doc)
        ops = {o for p in record["single"].values() for r in p["regions"] for o in r["ops"]}
        if ops and ops <= graph.nodes.keys() and last in ops:
            tuning = TunedPlan.from_json(record["document"], source="tune").record
            predicted = tuning.dp.predicted_s if tuning is not None and tuning.dp is not None else None
            return Plan.from_json(record["dp_plan"], source="dp"), predicted
    raise SystemExit(f"no stored tune result for this model in {db_path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--db", required=True)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--name", default=None)
    p.add_argument("--out", default=str(Path(__file__).parent))
    args = p.parse_args()
    module = zoo.import_stablehlo(args.model, new_context(), False)
    number_ops(module)
    graph = Graph(module)
    plan, predicted_s = stored_dp_plan(args.db, graph)
    # Before the compile, which outlines the module in place.
    hashes = {r.name: extract_region(graph, r.ops).hash for r in plan.regions}
    kinds = {r.name: sorted({graph.nodes[o].name.removeprefix("stablehlo.") for o in r.ops}) for r in plan.regions}
    placed = {o for r in plan.regions for o in r.ops}
    outside = Counter(n.name.removeprefix("stablehlo.") for o, n in graph.nodes.items() if o not in placed)
    artifact = Path(tempfile.mkdtemp(prefix="dp-breakdown-")) / "artifact"
    compile_module(module, plan, artifact, source=args.model)
    del graph, module

    calls: dict[str, list[tuple[float, float]]] = {}
    program = collage_runtime.load(artifact, threads=2,
                                   region_timer=lambda r, call, ex: calls.setdefault(r, []).append((call, ex)))
    _, inputs = zoo.build(args.model, False)
    fn = program.device_function("main")
    device_args = [program.to_device(np.require(x.numpy(), requirements="C")) for x in inputs]
    for _ in range(3):
        fn(*device_args)
    calls.clear()
    walls = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        fn(*device_args)
        walls.append(time.perf_counter() - t0)
    wall_ms = statistics.median(walls) * 1e3

    alone = {(m.region_hash, m.backend): m for m in CostDB(args.db).measurements() if m.median_s}
    rows = []
    for region in plan.regions:
        m = alone.get((hashes[region.name], region.backend))
        timed = calls.get(region.name)
        rows.append({"region": region.name, "backend": region.backend, "ops": len(region.ops),
                     "kinds": kinds[region.name],
                     "alone_ms": m.median_s * 1e3 if m else None,
                     "engine_ms": statistics.median(e for _, e in timed) * 1e3 if timed else None,
                     "call_ms": statistics.median(c for c, _ in timed) * 1e3 if timed else None})
    library = [r for r in rows if r["call_ms"] is not None]
    calls_ms = sum(r["call_ms"] for r in library)
    alone_ms = sum(r["alone_ms"] or 0.0 for r in library)
    engine_ms = sum(r["engine_ms"] for r in library)
    predicted = f"{predicted_s * 1e3:.2f} ms" if predicted_s else "nothing"
    summary = (f"**{args.model}**, DP plan of {len(plan.regions)} regions: the DP predicted {predicted}; a call takes "
               f"{wall_ms:.2f} ms (median of {args.runs}, region timer on). Library regions: {len(library)}, measured alone {alone_ms:.2f} ms in "
               f"all, inside the program {engine_ms:.2f} ms in their engines ({engine_ms / max(alone_ms, 1e-9):.2f}x) "
               f"and {calls_ms:.2f} ms with their boundaries; IREE (its regions and the {outside.total()} ops outside any "
               f"region: {', '.join(f'{k} {n}' for k, n in outside.most_common(8))}) {wall_ms - calls_ms:.2f} ms.")
    fmt = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
    md = "\n".join([summary, "", "| region | backend | ops | kinds | alone ms (DB) | engine ms in program | call ms |",
                    "|---|---|---:|---|---:|---:|---:|"]
                   + [f"| {r['region']} | {r['backend']} | {r['ops']} | {', '.join(r['kinds'])} | {fmt(r['alone_ms'])} | "
                      f"{fmt(r['engine_ms'])} | {fmt(r['call_ms'])} |" for r in rows]) + "\n"
    name = args.name or f"dp_breakdown_{args.model}"
    write_report(args.out, name, {**header(name), "wall_ms": wall_ms, "regions": rows}, md)


if __name__ == "__main__":
    main()
