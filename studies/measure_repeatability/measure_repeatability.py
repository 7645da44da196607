"""Measurement repeatability: the same candidate measured in separate runs; the spread of the medians.

Each candidate is a small torch module (random weights, imported with the torch frontend, so weights are
constants as in a model): a ResNet-50 3x3 conv (64→64 at 56x56), a ResNet-50 1x1 conv (256→64 at 56x56),
a BERT-base feed-forward matmul (128x768 @ 768x3072) + bias + GELU, an elementwise add (1x256x56x56),
a BERT attention softmax (1x12x128x128) and a BERT layernorm (1x128x768), each on 2–3 backends. The
region is every non-constant op of the module when the backend takes that set, else the backend's largest
candidate containing the anchor op (a conv, a matmul...); the table gives its size.

Every run calls ``measure_regions`` on a fresh cost database, so every run rebuilds the candidate and
times it in new worker processes; runs go round-robin over the candidates (run 1 of every candidate,
then run 2, ...) so slow drift of the machine spreads over all of them. Per (candidate, backend) the
table gives the medians of the runs, their range relative to their mean, and what the harness itself
recorded per run: the samples' relative inter-quartile spread and the median's predicted ~95%
uncertainty, 1.57 * IQR / sqrt(n) / median (``timing.median_uncertainty``), which is what the timing
loop stops on.

    python -m studies.measure_repeatability.measure_repeatability [--runs 5] [--candidates NAME,...] [--budget 1.0]
                                                                  [--out studies/measure_repeatability] [--quick]

Writes OUT/measure_repeatability.json and OUT/measure_repeatability.md. Not run in CI.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from studies.common.report import header, write_report

from collage_mlir.backends import RegionKey, get_backend
from collage_mlir.graph import Graph
from collage_mlir.ir import new_context
from collage_mlir.measure.db import CostDB
from collage_mlir.measure.harness import MeasureOptions, measure_regions
from collage_mlir.measure.timing import TimingOptions
from collage_mlir.passes.number_ops import NumberOpsPass
from collage_mlir.search import available_backends
from collage_mlir.search.candidates import enumerate_candidates

NAME = "measure_repeatability"
_CONSTANTS = ("stablehlo.constant", "arith.constant")


@dataclass(frozen=True)
class Spec:
    name: str
    what: str
    anchor: str  # the op a partial region must contain
    backends: tuple[str, ...]


SPECS = [
    Spec("conv3x3_64_56", "ResNet-50 conv 3x3 64→64, 1x64x56x56", "stablehlo.convolution",
         ("onednn", "ort", "openvino")),
    Spec("conv1x1_256to64_56", "ResNet-50 conv 1x1 256→64, 1x256x56x56", "stablehlo.convolution",
         ("iree-cpu-dt", "onednn", "ort")),
    Spec("matmul_bias_gelu", "BERT-base FFN 128x768 @ 768x3072 + bias + GELU", "stablehlo.dot_general",
         ("iree-cpu", "iree-cpu-dt", "onednn")),
    Spec("add_256x56x56", "elementwise add 1x256x56x56", "stablehlo.add", ("iree-cpu", "ort", "openvino")),
    Spec("softmax_12x128x128", "BERT attention softmax 1x12x128x128", "stablehlo.exponential",
         ("iree-cpu", "openvino")),
    Spec("layernorm_128x768", "BERT layernorm 1x128x768", "stablehlo.rsqrt", ("iree-cpu", "ort")),
]
QUICK = {"conv1x1_256to64_56": ("onednn", "ort"), "add_256x56x56": ("iree-cpu", "ort")}


def build(name: str):
    """(model, example inputs) of a candidate."""
    import torch
    from torch import nn

    class Add(nn.Module):
        def forward(self, x, y):
            return x + y

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)

    def x(*shape):
        return torch.randn(*shape, generator=g)

    return {
        "conv3x3_64_56": lambda: (nn.Conv2d(64, 64, 3, padding=1, bias=False), [x(1, 64, 56, 56)]),
        "conv1x1_256to64_56": lambda: (nn.Conv2d(256, 64, 1, bias=False), [x(1, 256, 56, 56)]),
        "matmul_bias_gelu": lambda: (nn.Sequential(nn.Linear(768, 3072), nn.GELU()), [x(128, 768)]),
        "add_256x56x56": lambda: (Add(), [x(1, 256, 56, 56), x(1, 256, 56, 56)]),
        "softmax_12x128x128": lambda: (nn.Softmax(-1), [x(1, 12, 128, 128)]),
        "layernorm_128x768": lambda: (nn.LayerNorm(768), [x(1, 128, 768)]),
    }[name]()


def region_for(graph: Graph, spec: Spec, backend: str, candidates) -> frozenset[int] | None:
    """Every non-constant op if ``backend`` takes that set, else its largest candidate with the anchor op."""
    whole = frozenset(i for i, n in graph.nodes.items() if n.name not in _CONSTANTS)
    if get_backend(backend).accepts(graph, whole) is None:
        return whole
    mine = [c.ops for c in candidates if c.backend == backend
            and any(graph.nodes[i].name == spec.anchor for i in c.ops)]
    return max(mine, key=len) if mine else None


def run(args: argparse.Namespace) -> dict:
    from collage_mlir.frontends.torch import import_torch

    available = {b.name for b in available_backends()}
    wanted = [s for s in SPECS if not args.candidates or s.name in args.candidates.split(",")]
    if args.quick:
        wanted = [Spec(s.name, s.what, s.anchor, QUICK[s.name]) for s in SPECS if s.name in QUICK]
    jobs = []  # (spec, module, examples, [(backend, ops)])
    for spec in wanted:
        model, xs = build(spec.name)
        module = import_torch(model, xs, new_context())
        NumberOpsPass().run(module)
        graph = Graph(module)
        names = [b for b in spec.backends if b in available]
        candidates = enumerate_candidates(graph, [get_backend(b) for b in names])
        pairs = []
        for b in names:
            ops = region_for(graph, spec, b, candidates)
            if ops is None:
                print(f"{spec.name}: {b} has no candidate with {spec.anchor}; skipped", file=sys.stderr)
                continue
            pairs.append((b, ops))
        jobs.append((spec, module, {"main": [x.numpy() for x in xs]}, pairs, len(graph)))

    options = MeasureOptions(timing=TimingOptions(budget_s=args.budget))
    results: dict[tuple[str, str], dict] = {}
    for spec, _, _, pairs, n_ops in jobs:
        for b, ops in pairs:
            results[(spec.name, b)] = {"candidate": spec.name, "what": spec.what, "backend": b,
                                       "region_ops": len(ops), "module_ops": n_ops, "runs": []}
    started = time.perf_counter()
    for r in range(args.runs):
        for spec, module, examples, pairs, _ in jobs:
            with tempfile.TemporaryDirectory(prefix="collage-repeat-") as tmp, CostDB(Path(tmp) / "costs.sqlite") as db:
                t0 = time.perf_counter()
                summary = measure_regions(module, [RegionKey(b, ops) for b, ops in pairs], db, examples=examples,
                                          options=options)
                wall = time.perf_counter() - t0
            for b, ops in pairs:
                m = summary.rows.get(RegionKey(b, ops))
                rec = {"run": r, "wall_s": wall}
                if m is None:
                    why = summary.skipped.get(RegionKey(b, ops), "not measured")
                    rec |= {"status": "not posed", "message": why}
                else:
                    rec |= {"status": m.status, "median_s": m.median_s, "min_s": m.min_s, "spread": m.spread,
                            "repeats": m.repeats, "threads": m.threads, "region": m.region, "message": m.message}
                    if m.usable and m.spread is not None and m.repeats:
                        rec["median_uncertainty"] = 1.57 * m.spread / math.sqrt(m.repeats)
                results[(spec.name, b)]["runs"].append(rec)
            print(f"run {r + 1}/{args.runs} {spec.name}: "
                  + ", ".join(f"{b} {_ms(results[(spec.name, b)]['runs'][-1])}" for b, _ in pairs)
                  + f" ({wall:.1f} s)", file=sys.stderr, flush=True)
    total_s = time.perf_counter() - started

    for res in results.values():
        medians = [x["median_s"] for x in res["runs"] if x["status"] == "ok"]
        res["ok_runs"] = len(medians)
        if len(medians) >= 2:
            mean = statistics.fmean(medians)
            res |= {"medians_s": medians, "mean_s": mean, "range_rel": (max(medians) - min(medians)) / mean,
                    "stdev_rel": statistics.stdev(medians) / mean,
                    "harness_spread_mean": statistics.fmean(x["spread"] for x in res["runs"] if x["status"] == "ok"),
                    "harness_uncertainty_mean": statistics.fmean(x["median_uncertainty"] for x in res["runs"]
                                                                 if x["status"] == "ok"),
                    "repeats": [x["repeats"] for x in res["runs"] if x["status"] == "ok"]}
            # Share of pairs of runs whose medians differ by more than the two runs' uncertainties allow.
            ok = [x for x in res["runs"] if x["status"] == "ok"]
            run_pairs = [(a, c) for i, a in enumerate(ok) for c in ok[i + 1:]]
            res["disagreeing_run_pairs"] = sum(
                abs(a["median_s"] - c["median_s"]) > a["median_uncertainty"] * a["median_s"]
                + c["median_uncertainty"] * c["median_s"] for a, c in run_pairs) / len(run_pairs)
    return header(NAME) | {
        "backends": {b: get_backend(b).version() for b in sorted({k[1] for k in results})},
        "timing": options.timing.to_json(),
        "runs": args.runs,
        "total_s": total_s,
        "results": list(results.values()),
    }


def _ms(x: dict) -> str:
    return f"{x['median_s'] * 1e3:.3f} ms" if x.get("median_s") is not None else x["status"]


def markdown(r: dict) -> str:
    t = r["timing"]
    lines = [f"# Measurement repeatability: {r['runs']} separate runs per candidate", "",
             f"Device: {r['device']}. Each run: a fresh cost DB, so new build and timing worker processes. Timing: "
             f"budget {t['budget_s']} s, {t['min_repeats']}–{t['max_repeats']} samples of "
             f"≥{t['min_sample_s'] * 1e3:g} ms, "
             f"stop once the median's uncertainty ≤ {t['rel_spread']}.", "",
             "Columns: the medians of the runs (ms); (max − min) / mean of those medians; their standard deviation / "
             "mean; the harness's own numbers averaged over the runs: samples' IQR / median and the median's "
             "predicted ~95% uncertainty (1.57·IQR/√n/median); samples per run; share of run pairs whose medians "
             "differ by more than their two uncertainties.", "",
             "| candidate | backend | ops | medians, ms | range/mean | sd/mean | harness IQR/median | harness ±median "
             "| samples | pairs disagreeing |",
             "|---|---|---:|---|---:|---:|---:|---:|---|---:|"]
    for x in r["results"]:
        if x["ok_runs"] < 2:
            bad = "; ".join(sorted({f"{y['status']}: {y.get('message', '')[:80]}" for y in x["runs"]
                                    if y["status"] != "ok"}))
            lines.append(f"| {x['candidate']} | {x['backend']} | {x['region_ops']} | {x['ok_runs']} ok runs: {bad} "
                         "| | | | | | |")
            continue
        meds = ", ".join(f"{m * 1e3:.3f}" for m in x["medians_s"])
        lines.append(f"| {x['candidate']} | {x['backend']} | {x['region_ops']}/{x['module_ops']} | {meds} | "
                     f"{100 * x['range_rel']:.1f}% | {100 * x['stdev_rel']:.1f}% | "
                     f"{100 * x['harness_spread_mean']:.1f}% "
                     f"| {100 * x['harness_uncertainty_mean']:.1f}% | {', '.join(map(str, x['repeats']))} | "
                     f"{100 * x['disagreeing_run_pairs']:.0f}% |")
    lines += ["", "ops: the region's ops / the module's ops (constants are cloned into the region as it sees them).",
              "", "Candidates: " + "; ".join(f"{x['candidate']} = {x['what']}" for x in
                                              {x['candidate']: x for x in r["results"]}.values()) + ".", "",
              "Backends: " + ", ".join(f"{b} {v}" for b, v in r["backends"].items()) + ".", "",
              f"Total {r['total_s']:.0f} s.", "", "Command:", "", f"    {r['command']}", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="separate runs per candidate (default 5)")
    p.add_argument("--candidates", default="", help="comma-separated subset of: " + ",".join(s.name for s in SPECS))
    p.add_argument("--budget", type=float, default=1.0, help="timing budget per candidate, s (default 1)")
    p.add_argument("--out", default=str(Path(__file__).parent), help="output directory")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 2 candidates on 2 backends each, 3 runs, 0.2 s budget")
    a = p.parse_args()
    if a.quick:
        a.runs, a.budget = 3, 0.2
    result = run(a)
    write_report(a.out, NAME, result, markdown(result))


if __name__ == "__main__":
    main()
