"""Tuning wall time (cold DB, then warm DB) and plan quality (DP alone vs the two-level search vs the best
single backend, measured side by side) per model.

For each model: ``tune()`` on a fresh cost DB (cold: nothing measured, transition probes included), then
the same call again on that DB (warm: the finished tune is in the DB, and the plan bytes must be the
same), then a search again on the warm DB (``reuse=False``, budget ``--warm-budget``: it reads what the
DB holds and goes on measuring what the cold budget left out). Plan quality
comes from the cold tune's own finalists: the DP plan, the best evolved plans and the best single-backend
plan, re-timed side by side in interleaved rounds (their builds kept, so only timing); every other
single-backend plan's time is its seed timing. ``--rounds N`` adds N more interleaved rounds of every
plan afterwards (each built once). The load average is recorded before and after each tune: the machine
is shared.

    python -m studies.tune.tune [--models small_cnn,bert_small] [--backends all|iree-cpu,onednn,...]
                                [--budget 600] [--rounds 0] [--name tune] [--keep DIR] [--out studies/tune]

Models: ``small_cnn`` (collage_mlir/zoo/tiny.py), and from ``collage_mlir.zoo`` any name with ``_small``
for its CI variant (``bert_small`` = BERT 2 layers, hidden 128, seq 32) or the full model.
Writes OUT/NAME.json and OUT/NAME.md. Not run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


from studies.common.report import header, write_report  # noqa: E402

from collage_mlir.backends import get_backend  # noqa: E402
from collage_mlir.ir import new_context  # noqa: E402
from collage_mlir.measure.db import CostDB  # noqa: E402
from collage_mlir.measure.harness import MeasureOptions  # noqa: E402
from collage_mlir.measure.plan_timing import PlanTimer  # noqa: E402
from collage_mlir.search.record import TunedPlan  # noqa: E402
from collage_mlir.search.tune import tune  # noqa: E402


def load(name: str):
    """(module, example inputs as numpy) for a model name."""
    from collage_mlir.frontends.torch import import_torch

    if name == "small_cnn":
        import torch

        from collage_mlir.zoo.tiny import small_cnn

        x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
        return import_torch(small_cnn(), [x], new_context()), [x.numpy()]
    from collage_mlir import zoo

    # A zoo name itself first (gpt2_small is the full GPT-2 small), else NAME_small for NAME's CI variant.
    zoo_name, small = (name.removesuffix("_small"), True) if name.endswith("_small") and name not in zoo.MODELS \
        else (name, False)
    zoo_name = {"bert": "bert_base"}.get(zoo_name, zoo_name)
    model, inputs = zoo.build(zoo_name, small)
    return import_torch(model, list(inputs), new_context()), [t.detach().numpy() for t in inputs]


def side_by_side(module, plans: dict, inputs, rounds: int, work: Path) -> dict:
    """Each plan's PlanTimer median in ``rounds`` interleaved rounds (each plan built once)."""
    times: dict[str, list[float]] = {k: [] for k in plans}
    with PlanTimer(work / "side", keep=len(plans)) as timer:
        for _ in range(rounds):
            for name, plan in plans.items():
                out = timer.time(module, plan, inputs)
                if out.ok and out.value.get("status") == "ok":
                    times[name].append(out.value["median_s"])
    return {k: {"median_s": statistics.median(v) if v else None, "rounds_s": v} for k, v in times.items()}


def quality(tuned: TunedPlan) -> dict:
    """From a tune's tuned plan: each plan's median time (finalists: their interleaved rounds; other
    single-backend plans: their one seed timing) and which finalist was which. The best single backend
    is the tune's incumbent (the single-backend finalist, picked by seed timing), compared with the
    tuned and DP plans over the same interleaved rounds."""
    t = tuned.record
    finals: dict[str, dict] = {}
    for f in t.finalists:  # several evolved finalists: "evolved", "evolved 2", ... (one key each)
        name = next(n for k in range(1, len(t.finalists) + 2) if (n := f.source if k == 1 else f"{f.source} {k}")
                    not in finals)
        finals[name] = {"median_s": statistics.median(f.times_s) if f.times_s else None,
                        "rounds_s": list(f.times_s), "regions": f.regions}
    singles = {name: row.measured_s for name, row in t.single_backend.items()}
    return rate({"finalists": finals, "single_backend_s": singles, "tuned_s": t.plan.measured_s,
                 "tuned_from": t.plan.source, "dp_measured_s": t.dp.measured_s})


def rate(q: dict) -> dict:
    finals, singles = q["finalists"], q["single_backend_s"]
    incumbent = [n for n in finals if n in singles]
    best = incumbent[0] if incumbent else min((n for n, v in singles.items() if v), key=singles.__getitem__)
    best_s = finals[best]["median_s"] if best in finals else singles[best]
    dp_s = finals["dp"]["median_s"] if "dp" in finals else q.get("dp_measured_s", q.get("dp_s"))
    return q | {"best_single": best, "best_single_s": best_s, "dp_s": dp_s,
                "tuned_vs_best_single": best_s / q["tuned_s"] if q["tuned_s"] else None,
                "dp_vs_best_single": best_s / dp_s if dp_s else None}


def main() -> None:
    from collage_mlir.search import available_backends

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="small_cnn,bert_small")
    ap.add_argument("--backends", default="all")
    ap.add_argument("--budget", type=float, default=600.0)
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--warm-budget", type=float, default=None,
                    help="budget of the search again on the warm DB (default: --budget); where the cold run was cut "
                         "short by its budget that search goes on measuring, so a short one shows what a search "
                         "costs besides")
    ap.add_argument("--name", default="tune")
    ap.add_argument("--keep", default=None,
                    help="keep each model's cost DB and work files in KEEP/MODEL (to rerun or profile the warm tune)")
    ap.add_argument("--out", default=str(Path(__file__).parent))
    ap.add_argument("--render", default=None, help="rewrite OUT/NAME.md from this result JSON and stop")
    args = ap.parse_args()
    if args.render:
        result = json.loads(Path(args.render).read_text())
        args.budget, args.warm_budget = result["budget_s"], result.get("warm_budget_s")
        rows = [(name, e | {"quality": rate(e["quality"])}) for name, e in result["models"].items()]
        _write(args, result | {"models": dict(rows)}, rows)
        return
    backends = available_backends() if args.backends == "all" else [get_backend(n) for n in args.backends.split(",")]
    result = header(args.name) | {"backends": [b.name for b in backends], "budget_s": args.budget,
                                  "warm_budget_s": args.warm_budget, "models": {}}
    rows = []
    for name in args.models.split(","):
        module, inputs = load(name)
        with tempfile.TemporaryDirectory(prefix="collage-bench-tune-") as tmp:
            work = Path(args.keep) / name if args.keep else Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            runs = []
            with CostDB(work / "costs.sqlite") as db:
                # cold: a fresh DB; warm: the same call again (the finished tune is in the DB); again: a
                # search on the warm DB (reuse=False, --warm-budget), which goes on measuring what it lacks.
                for kind in ("cold", "warm", "again"):
                    t0 = time.perf_counter()
                    stages: list[tuple[str, float]] = []

                    def show(stage, done, total, note, t0=t0, stages=stages, kind=kind):
                        if not stages or stages[-1][0] != stage:
                            stages.append((stage, round(time.perf_counter() - t0, 1)))
                            print(f"  {name} {kind}: {stage} at {stages[-1][1]:.0f} s", flush=True)

                    load_before = os.getloadavg()
                    budget = args.warm_budget if kind == "again" and args.warm_budget else args.budget
                    r = tune(module, backends, db, work / kind, budget_s=budget, examples={"main": inputs},
                             measure=MeasureOptions(), on_progress=show, reuse=kind != "again")
                    wall = time.perf_counter() - t0
                    runs.append({"kind": kind, "budget_s": budget, "wall_s": wall, "result": r, "stages": stages,
                                 "load": [round(x, 1) for x in (*load_before, *os.getloadavg())],
                                 "measured": r.measured, "db_hits": r.cache_hits,
                                 "reused": r.reused})
                    print(f"{name}: {kind} tune {wall:.1f} s (budget {budget:.0f} s), {r.candidates} candidates, "
                          f"{r.measured} measured now, {r.cache_hits} DB hits{' (reused)' if r.reused else ''}, load "
                          f"{runs[-1]['load']}", flush=True)
            cold, warm = runs[0]["result"], runs[1]["result"]
            extra = side_by_side(module, {"tuned": cold.plan, "dp": cold.dp_plan,
                                          **{f"{b} alone": p for b, p in cold.single.items()}},
                                 inputs, args.rounds, work) if args.rounds else None
        entry = {"candidates": cold.candidates, "same_plan_warm": cold.tuned.to_json() == warm.tuned.to_json(),
                 "tuned_regions": len(cold.plan.regions), "dp_regions": len(cold.dp_plan.regions),
                 "why": cold.tuned.record.why,
                 "runs": [{k: v for k, v in run.items() if k != "result"} for run in runs],
                 "quality": quality(cold.tuned), "extra_rounds": extra}
        result["models"][name] = entry
        rows.append((name, entry))
        _write(args, result, rows)  # after each model: a long run keeps what it finished


def _write(args, result: dict, rows: list) -> None:
    def ms(v) -> str:
        return f"{v * 1e3:.3f}" if v else "-"

    md = [f"# Tuning: wall time and plan quality\n\n`{result['command']}`\n\n{result['device']}; backends "
          f"{', '.join(result['backends'])}; budget {args.budget:.0f} s"
          + (f" (search again on the warm DB: {args.warm_budget:.0f} s)" if args.warm_budget else "") + ".\n",
          "| model | candidates | cold tune s | warm tune s | same plan warm | search again on the warm DB s | "
          "load (1/5/15 min, before) | tuned ms | DP ms | best single | its ms | best single / tuned | best single / DP |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, e in rows:
        q, cold, warm = e["quality"], e["runs"][0], e["runs"][1]
        ratio = lambda v: f"{v:.2f}x" if v else "-"  # noqa: E731
        again = f"{e['runs'][2]['wall_s']:.1f}" if len(e["runs"]) > 2 else "-"
        md.append(f"| {name} | {e['candidates']} | {cold['wall_s']:.0f} | {warm['wall_s']:.1f} | {e['same_plan_warm']} | "
                  f"{again} | "
                  f"{'/'.join(str(x) for x in cold['load'][:3])} | {ms(q['tuned_s'])} | {ms(q['dp_s'])} | "
                  f"{q['best_single']} | {ms(q['best_single_s'])} | {ratio(q['tuned_vs_best_single'])} | "
                  f"{ratio(q['dp_vs_best_single'])} |")
    md.append("\nPer model: stages of the cold tune (start, s), the finalists' interleaved rounds (ms), the other "
              "single-backend plans (seed timing, ms), why the plan was chosen:\n")
    for name, e in rows:
        q, cold = e["quality"], e["runs"][0]
        md.append(f"- {name}: cold stages " + ", ".join(f"{s} {t:.0f}" for s, t in cold["stages"])
                  + f"; {cold['measured']} measured; load before/after {cold['load']}")
        if len(e["runs"]) > 2:
            a = e["runs"][2]
            md.append(f"  - search again on the warm DB ({a['budget_s']:.0f} s budget): {a['wall_s']:.1f} s, stages "
                      + ", ".join(f"{s} {t:.0f}" for s, t in a["stages"])
                      + f"; {a['measured']} measured, {a['db_hits']} DB hits")
        md.append("  - finalists: " + "; ".join(f"{k} ({v['regions']} regions) " + ", ".join(ms(x) for x in v["rounds_s"])
                                                for k, v in q["finalists"].items()))
        md.append("  - single backends: " + ", ".join(f"{k} {ms(v)}" for k, v in q["single_backend_s"].items()))
        md.append(f"  - tuned plan ({e['tuned_regions']} regions, from {q['tuned_from']}): {e['why']}")
        if e["extra_rounds"]:
            md.append("  - extra rounds (median ms): " + ", ".join(f"{k} {ms(v['median_s'])}"
                                                              for k, v in e["extra_rounds"].items()))
    write_report(args.out, args.name, result, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
