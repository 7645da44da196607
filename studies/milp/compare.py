"""The integer program (``collage_mlir/search/milp.py``) against the operator-level DP (``dp.py``) on the
zoo models' candidate indexes: predicted plan cost (additive, priced as ``plan_cost`` prices a plan) and
solve time, under the mock estimator (``MockEstimator``: deterministic per-op costs, fusion discounts,
invalid pairs, per-byte transitions; no compiler, nothing measured).

Per model: import, number the ops, build the candidate index with every available backend (as ``tune``
does: the backends' candidates, each engine's maximal regions, every op alone), and once more without
the maximal regions (under the mock a model-sized region is 70 % off, so with them every optimum is one
engine over the whole model), then
- ``dp``: ``dp.optimize`` with its default limits (exact up to 48 ops, else the beam), the plan priced as
  a plan (a default-backend region of several ops it took is its ops alone there);
- ``milp (dp's costs)``: ``exact_plan(..., costs=dp.costs)``, what ``tune`` would call (no new costs
  asked: only the candidates the DP's walk reached);
- ``milp (all)``: the integer program over every candidate of the index.

    python -m studies.milp.compare [--models dcgan_small,small_cnn,...] [--time-limit 120] [--seed 0]
                                   [--window 64] [--overlap 16] [--name compare] [--out studies/milp]

Models as in ``studies/tune/tune.py``: ``small_cnn``, ``NAME_small`` for a zoo model's small variant,
or a zoo name. Writes OUT/NAME.json and OUT/NAME.md. Not run in CI.
"""

from __future__ import annotations

import argparse
import math
import os
import time

from studies.common.report import header, write_report

from collage_mlir.graph import Graph
from collage_mlir.passes.number_ops import NumberOpsPass
from collage_mlir.search import available_backends
from collage_mlir.search.cost import MockEstimator, plan_cost
from collage_mlir.search.dp import optimize
from collage_mlir.search.candidates import enumerate_candidates
from collage_mlir.search.index import CandidateIndex, SearchGraph
from collage_mlir.search.regions import maximal_regions
from collage_mlir.search.milp import MilpOptions, exact_plan
from studies.tune.tune import load


def compare(name: str, time_limit_s: float, seed: int, options: MilpOptions) -> list[dict]:
    """Rows for ``name``: the index with the engines' maximal regions (as ``tune`` builds it), and without
    them (the backends' candidates of <= 8 ops and the ops alone: mixed plans, where the beam is not
    exact)."""
    module, _ = load(name)
    NumberOpsPass().run(module)
    graph = Graph(module)
    backends = available_backends()
    t0 = time.monotonic()
    sg, candidates = SearchGraph.from_graph(graph), enumerate_candidates(graph, backends)
    maximal = {b.name: maximal_regions(graph, b) for b in backends}
    index_s = time.monotonic() - t0
    return [row(name, regions, CandidateIndex(sg, candidates, maximal if regions == "maximal" else None),
                index_s, time_limit_s, seed, options) for regions in ("maximal", "no maximal")]


def row(name: str, regions: str, index: CandidateIndex, index_s: float, time_limit_s: float, seed: int,
        options: MilpOptions) -> dict:
    g = index.graph
    est = MockEstimator(seed, g.order, g.out_bytes, producers=g.producers)
    price = lambda plan: plan_cost(plan, g.order, g.producers, g.out_bytes, est, g.constant)
    t0 = time.monotonic()
    dp = optimize(index, est)
    dp_s = time.monotonic() - t0
    out = {"model": name, "regions": regions, "ops": len(g.order), "candidates": len(index), "index_s": index_s,
           "dp": {"cost_s": price(dp.plan), "dp_says_s": dp.cost_s, "seconds": dp_s,
                  "regions": len(dp.plan.regions), "costed": len(dp.costs)}}
    for key, costs in (("milp_dp_costs", dp.costs), ("milp_all", None)):
        r = exact_plan(index, est, time_limit_s, dp=dp, costs=costs, options=options)
        out[key] = {"cost_s": r.milp_cost_s, "checked_s": price(r.plan) if r.source == "milp" else None,
                    "kept": r.source, "proved": r.proved, "windows": r.windows, "solves": r.solves, "cuts": r.cuts,
                    "seconds": r.seconds, "costed": len(r.costs),
                    "regions": len(r.plan.regions) if r.source == "milp" else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="small_cnn,dcgan_small,resnet50_small,mobilenet_v2_small,bert_small,"
                                        "gpt2_small_small,dcgan,mobilenet_v2,resnet50")
    ap.add_argument("--time-limit", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--window", type=int, default=MilpOptions.window)
    ap.add_argument("--overlap", type=int, default=MilpOptions.overlap)
    ap.add_argument("--name", default="compare")
    ap.add_argument("--out", default=os.path.dirname(__file__))
    args = ap.parse_args()
    options = MilpOptions(window=args.window, overlap=args.overlap)
    rows = []
    load0 = os.getloadavg()[0]
    for name in args.models.split(","):
        for r in compare(name, args.time_limit, args.seed, options):
            rows.append(r)
            print(r, flush=True)
    result = {**header("milp_compare"), "time_limit_s": args.time_limit, "seed": args.seed,
              "window": args.window, "overlap": args.overlap, "load_before": load0, "load_after": os.getloadavg()[0],
              "rows": rows}
    write_report(args.out, args.name, result, markdown(result))


def markdown(result: dict) -> str:
    us = lambda s: f"{s * 1e6:,.1f}" if s is not None and math.isfinite(s) else "—"
    lines = [f"# MILP vs DP, predicted cost (mock estimator, seed {result['seed']})", "",
             (f"`{result['command']}` on {result['device']}, load {result['load_before']:.1f} → "
              f"{result['load_after']:.1f}; time limit {result['time_limit_s']:g} s, window {result['window']}, "
              f"overlap {result['overlap']}."), "",
             ("| model | maximal regions | ops | candidates (DP costed) | DP µs (s) | MILP, DP's costs µs (s) | "
              "MILP, all µs (s) | best MILP / DP | windows | solves / cuts | proved (DP's costs / all) |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        d, m, a = r["dp"], r["milp_dp_costs"], r["milp_all"]
        best = min(m["cost_s"], a["cost_s"])
        yes = lambda x: "yes" if x["proved"] else "no"
        lines.append(f"| {r['model']} | {'yes' if r['regions'] == 'maximal' else 'no'} | {r['ops']} | "
                     f"{r['candidates']} ({d['costed']}) | {us(d['cost_s'])} ({d['seconds']:.1f}) | "
                     f"{us(m['cost_s'])} ({m['seconds']:.1f}) | {us(a['cost_s'])} ({a['seconds']:.1f}) | "
                     f"{best / d['cost_s']:.4f} | {a['windows']} | {a['solves']} / {a['cuts']} | {yes(m)} / {yes(a)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
