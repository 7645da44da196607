"""Tuning wall time (cold DB, then warm DB) and plan quality (DP alone vs the two-level search vs the best
single backend, measured side by side) per model.

For each model: ``tune()`` on a fresh cost DB (cold; transition probes shared by all models are kept in a
separate run's DB only if ``--db`` is given), then again on the same DB (warm: every answer from the DB,
and the plan bytes must be the same). Then the DP plan, the tuned plan and every single-backend plan are
built once and timed in ``--rounds`` interleaved rounds with ``PlanTimer`` (each round times every plan
once); medians of the rounds are compared.

    python bench/tune.py [--models small_cnn,bert_small] [--backends iree-cpu,onednn,ort,openvino]
                         [--budget 300] [--rounds 5] [--out bench/results]

Models: ``small_cnn`` (test/python/models.py), and from ``collage_mlir.zoo`` any name with ``_small``
for its CI variant (``bert_small`` = BERT 2 layers, hidden 128, seq 32) or the full model.
Writes OUT/tune.json and OUT/tune.md. Not run in CI.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test" / "python"))

from report import header, write_report  # noqa: E402

from collage_mlir.backends import get_backend  # noqa: E402
from collage_mlir.ir import new_context  # noqa: E402
from collage_mlir.measure.db import CostDB  # noqa: E402
from collage_mlir.measure.harness import MeasureOptions  # noqa: E402
from collage_mlir.measure.plan_timing import PlanTimer  # noqa: E402
from collage_mlir.search.tune import tune  # noqa: E402


def load(name: str):
    """(module, example inputs as numpy) for a model name."""
    from collage_mlir.frontends.torch import import_torch

    if name == "small_cnn":
        import torch

        from models import small_cnn

        x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
        return import_torch(small_cnn(), [x], new_context()), [x.numpy()]
    from collage_mlir import zoo

    zoo_name, small = (name.removesuffix("_small"), True) if name.endswith("_small") else (name, False)
    zoo_name = {"bert": "bert_base"}.get(zoo_name, zoo_name)
    model, inputs = zoo.build(zoo_name, small)
    return import_torch(model, list(inputs), new_context()), [t.detach().numpy() for t in inputs]


def side_by_side(module, plans: dict, inputs, rounds: int, work: Path) -> dict:
    """Median over ``rounds`` interleaved rounds of each plan's PlanTimer median."""
    times: dict[str, list[float]] = {k: [] for k in plans}
    with PlanTimer(work / "side") as timer:
        for _ in range(rounds):
            for name, plan in plans.items():
                out = timer.time(module, plan, inputs)
                if out.ok and out.value.get("status") == "ok":
                    times[name].append(out.value["median_s"])
    return {k: {"median_s": statistics.median(v) if v else None, "rounds_s": v} for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="small_cnn,bert_small")
    ap.add_argument("--backends", default="iree-cpu,onednn,ort,openvino")
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    backends = [get_backend(n) for n in args.backends.split(",")]
    result = header("tune") | {"backends": [b.name for b in backends], "budget_s": args.budget, "models": {}}
    rows = []
    for name in args.models.split(","):
        module, inputs = load(name)
        with tempfile.TemporaryDirectory(prefix="collage-bench-tune-") as tmp:
            work = Path(tmp)
            runs = []
            with CostDB(work / "costs.sqlite") as db:
                for kind in ("cold", "warm"):
                    t0 = time.perf_counter()
                    stages: list[str] = []

                    def show(stage, done, total, note, t0=t0, stages=stages):
                        if not stages or stages[-1] != stage:
                            stages.append(stage)
                            print(f"  {name} {kind}: {stage} at {time.perf_counter() - t0:.0f} s", flush=True)

                    r = tune(module, backends, db, work / kind, budget_s=args.budget, examples={"main": inputs},
                             measure=MeasureOptions(), on_progress=show)
                    runs.append((kind, time.perf_counter() - t0, r))
                    print(f"{name}: {kind} tune {runs[-1][1]:.1f} s, {r.candidates} candidates, "
                          f"{r.estimator.measured} measured now, {r.estimator.cache_hits} DB hits", flush=True)
            cold, warm = runs[0][2], runs[1][2]
            singles = {f"{b} alone": p for b, p in cold.single.items()}
            measured = side_by_side(module, {"tuned": cold.plan, "dp": cold.dp_plan, **singles}, inputs,
                                    args.rounds, work)
        best_single = min((k for k in singles if measured[k]["median_s"]), key=lambda k: measured[k]["median_s"])
        m = {k: v["median_s"] for k, v in measured.items()}
        entry = {"candidates": cold.candidates, "cold_s": runs[0][1], "warm_s": runs[1][1],
                 "same_plan_warm": cold.document == warm.document,
                 "tuned_regions": len(cold.plan.regions), "dp_regions": len(cold.dp_plan.regions),
                 "why": cold.document["tuning"]["why"], "side_by_side": measured, "best_single": best_single,
                 "tuned_vs_best_single": m[best_single] / m["tuned"] if m["tuned"] else None,
                 "dp_vs_best_single": m[best_single] / m["dp"] if m["dp"] else None}
        result["models"][name] = entry
        rows.append((name, entry, m))
        _write(args, result, rows)  # after each model: a long run keeps what it finished


def _write(args, result: dict, rows: list) -> None:
    md = [f"# Tuning: wall time and plan quality\n\n`{result['command']}`\n\n{result['device']}; backends "
          f"{', '.join(result['backends'])}; budget {args.budget:.0f} s; {args.rounds} interleaved rounds.\n",
          "| model | candidates | cold tune s | warm tune s | same plan warm | tuned ms | DP ms | best single | "
          "its ms | best single / tuned | best single / DP |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, e, m in rows:
        fmt = lambda v: f"{v * 1e3:.3f}" if v else "-"  # noqa: E731
        md.append(f"| {name} | {e['candidates']} | {e['cold_s']:.0f} | {e['warm_s']:.1f} | {e['same_plan_warm']} | "
                  f"{fmt(m['tuned'])} | {fmt(m['dp'])} | {e['best_single']} | {fmt(m[e['best_single']])} | "
                  f"{e['tuned_vs_best_single']:.2f}x | {e['dp_vs_best_single']:.2f}x |")
    md.append("\nEvery plan, median of the rounds (ms):\n")
    for name, e, m in rows:
        md.append(f"- {name}: " + ", ".join(f"{k} {v * 1e3:.3f}" if v else f"{k} failed" for k, v in m.items())
                  + f" — chosen because: {e['why']}")
    write_report(args.out, "tune", result, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
