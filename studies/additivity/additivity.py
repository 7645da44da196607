"""Additivity: the sum of a plan's measured region costs vs the measured end-to-end time of the same plan.

Three models built in code (random weights): ``small_cnn`` and ``mlp`` of test/python/models.py and a
small transformer encoder layer (``nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256,
batch_first=True)`` on 1x32x128; a hand-written attention block of nn.Linear + softmax + layernorm when
torch-mlir cannot import it). Plans per model: ``default`` (every op on iree-cpu) and ``random_plan`` for
a few seeds over the CPU backends.

The prediction, what a search adding up cost-DB rows would believe, for a plan:

    regions      each region of the plan measured alone on its backend (``measure_regions``)
    + default    every op no region takes, measured as a single-op region on the default backend
                 (iree-cpu); constant expressions cost nothing (extraction clones them into their users)
    + transitions  per boundary: each (producer op, consuming region) whose producer and consumer lie in
                 different placement units (a region, or the default backend's ops taken together) adds
                 the measured transition cost of (producer's backend → consumer's backend)
                 (``measure_transitions``, its 256x256 f32 probe)

A second prediction, "grouped", measures the default backend's ops as maximal connected groups (a
group that is not convex falls back to single ops) instead of one op at a time: for the ``default`` plan
that is the whole model as one iree-cpu region, so its ratio checks the harness against ``PlanTimer``.

Measured: ``PlanTimer.time(module, plan, inputs)`` median (the plan compiled as ``collage compile`` builds
it, timed like a candidate).

    python -m studies.additivity.additivity [--models small_cnn,mlp,transformer] [--seeds 0,1,2] [--backends ...]
                                            [--budget 1.0] [--db PATH] [--out studies/additivity] [--quick]

Writes OUT/additivity.json and OUT/additivity.md. Not run in CI.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

from studies.common.report import header, write_report


from collage_mlir.backends import DEFAULT_BACKEND, RegionKey, get_backend  # noqa: E402
from collage_mlir.dialects import stablehlo as sh  # noqa: E402
from collage_mlir.graph import Graph  # noqa: E402
from collage_mlir.ir import new_context  # noqa: E402
from collage_mlir.measure.db import CostDB  # noqa: E402
from collage_mlir.measure.harness import MeasureOptions, measure_regions  # noqa: E402
from collage_mlir.measure.plan_timing import PlanTimer  # noqa: E402
from collage_mlir.measure.timing import TimingOptions  # noqa: E402
from collage_mlir.measure.transitions import PROBE_SIZE, measure_transitions  # noqa: E402
from collage_mlir.passes.number_ops import NumberOpsPass  # noqa: E402
from collage_mlir.plan import Plan  # noqa: E402
from collage_mlir.search import available_backends  # noqa: E402
from collage_mlir.search.simple_plans import random_plan  # noqa: E402
from collage_mlir.zoo.tiny import mlp, small_cnn  # noqa: E402

NAME = "additivity"
DEFAULT_UNIT = "<default>"


def attention_block():
    """Fallback transformer layer: single-head-split self-attention + FFN with residuals and layernorms."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d: int = 128, heads: int = 4, ff: int = 256):
            super().__init__()
            self.h, self.dk = heads, d // heads
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.qkv(x).reshape(b, s, 3, self.h, self.dk).permute(2, 0, 3, 1, 4)
            att = torch.softmax(q @ k.transpose(-1, -2) / self.dk ** 0.5, dim=-1)
            y = self.ln1(x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d)))
            return self.ln2(y + self.ff2(torch.relu(self.ff1(y))))

    torch.manual_seed(0)
    return Block().eval()


def build(name: str):
    """(model, example input, description) of a model."""
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(7)
    if name == "small_cnn":
        return small_cnn(), torch.randn(1, 3, 64, 64, generator=g), "test/python/models.py small_cnn, 1x3x64x64"
    if name == "mlp":
        return mlp(), torch.randn(16, 32, generator=g), "test/python/models.py mlp, 16x32"
    if name == "transformer":
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256, batch_first=True).eval()
        return layer, torch.randn(1, 32, 128, generator=g), "nn.TransformerEncoderLayer(128, 4, ff 256), 1x32x128"
    raise SystemExit(f"unknown model {name!r}")


def import_model(name: str):
    from collage_mlir.frontends.torch import import_torch

    model, x, what = build(name)
    try:
        module = import_torch(model, [x], new_context())
    except Exception as exc:  # torch-mlir cannot take the fused fast path: use the hand-written block
        if name != "transformer":
            raise
        print(f"transformer: import failed ({type(exc).__name__}: {str(exc)[:200]}); using the hand-written "
              "attention block", file=sys.stderr)
        model, what = attention_block(), "hand-written attention block (Linear + softmax + LayerNorm), 1x32x128"
        module = import_torch(model, [x], new_context())
    NumberOpsPass().run(module)
    return module, x.numpy(), what


def const_ops(graph: Graph) -> set[int]:
    """Ops all of whose results are constant expressions (extraction clones them into their users)."""
    return {i for i, n in graph.nodes.items()
            if n.op.results and all(sh.const_expr_ops(r) is not None for r in n.op.results)}


def default_groups(graph: Graph, ops: set[int]) -> list[frozenset[int]]:
    """The weakly connected components of ``ops`` in the dataflow graph; a non-convex one as single ops."""
    sub = graph.dag.subgraph(ops).to_undirected()
    import networkx as nx

    groups = []
    for comp in nx.connected_components(sub):
        comp = frozenset(comp)
        groups.extend([comp] if graph.is_convex(comp) else [frozenset({i}) for i in sorted(comp)])
    return groups


def boundaries(graph: Graph, plan: Plan, consts: set[int]) -> list[tuple[str, str]]:
    """(src backend, dst backend) per (producer op, consuming unit) crossing between placement units."""
    where = plan.backend_of()
    unit = {i: where[i] if i in where else (DEFAULT_UNIT, plan.default_backend) for i in graph.nodes}
    seen = set()
    out = []
    for a, b in graph.dag.edges:
        if a in consts or unit[a][0] == unit[b][0] or (a, unit[b][0]) in seen:
            continue
        seen.add((a, unit[b][0]))
        out.append((unit[a][1], unit[b][1]))
    return out


def run(args: argparse.Namespace) -> dict:
    names = [n.strip() for n in args.backends.split(",") if n.strip()]
    backends = [get_backend(n, where="--backends") for n in names]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    options = MeasureOptions(timing=TimingOptions(budget_s=args.budget))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="collage-additivity-") as tmp:
        db = CostDB(args.db or Path(tmp) / "costs.sqlite")
        # The default backend takes part in every boundary with ops no region takes.
        probe = backends + [get_backend(DEFAULT_BACKEND)] * (DEFAULT_BACKEND not in names)
        print(f"transitions over {len(probe)} backends ({len(probe) ** 2} pairs)", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        trans = {(t.src, t.dst): t for t in measure_transitions(probe, db, options)}
        transitions_s = time.perf_counter() - t0
        models = []
        with PlanTimer(Path(tmp) / "plans", options) as timer:
            for model in args.models.split(","):
                models.append(run_model(model, backends, seeds, db, options, timer, trans))
        db.close()
    return header(NAME) | {
        "backends": {b.name: b.version() for b in backends},
        "timing": options.timing.to_json(),
        "transition_probe_bytes": PROBE_SIZE * PROBE_SIZE * 4,
        "transitions": [{"src": t.src, "dst": t.dst, "status": t.status, "cost_s": t.cost_s, "message": t.message}
                        for t in trans.values()],
        "transitions_measure_s": transitions_s,
        "models": models,
        "total_s": time.perf_counter() - started,
    }


def run_model(name: str, backends, seeds, db: CostDB, options: MeasureOptions, timer: PlanTimer, trans) -> dict:
    t0 = time.perf_counter()
    module, x, what = import_model(name)
    graph = Graph(module)
    consts = const_ops(graph)
    plans = [Plan(source="default")] + [random_plan(graph, backends, s) for s in seeds]
    print(f"{name}: {len(graph)} ops ({len(consts)} constant), plans: "
          + ", ".join(f"{p.source} ({len(p.regions)} regions)" for p in plans), file=sys.stderr, flush=True)
    parts = []  # per plan: regions, default singles, default groups
    pairs = []
    for plan in plans:
        plan.validate(graph)
        placed = {i for r in plan.regions for i in r.ops}
        rest = set(graph.nodes) - placed - consts
        regions = [r.key for r in plan.regions]
        singles = [RegionKey(plan.default_backend, frozenset({i})) for i in sorted(rest)]
        groups = [RegionKey(plan.default_backend, g) for g in default_groups(graph, rest)]
        parts.append((regions, singles, groups))
        pairs += regions + singles + groups
    summary = measure_regions(module, pairs, db, examples={"main": [x]}, options=options,
                              on_progress=_progress(name))
    rows = summary.rows
    skipped = summary.skipped

    def total(ps):
        # A region where only constants flow in is folded by the compiler: it costs nothing.
        ps = [p for p in ps if not (p in skipped and skipped[p].folded)]
        ok = [rows[p].median_s for p in ps if p in rows and rows[p].usable]
        bad = [{"ops": sorted(p.ops), "backend": p.backend, "region": rows[p].region[:100] if p in rows else "",
                "status": rows[p].status if p in rows else "not posed",
                "message": (rows[p].message if p in rows else skipped[p].why if p in skipped else "")[:300]}
               for p in ps if p not in rows or not rows[p].usable]
        return sum(ok), bad

    results = []
    for plan, (regions, singles, groups) in zip(plans, parts):
        regions_s, bad_regions = total(regions)
        singles_s, bad_singles = total(singles)
        groups_s, bad_groups = total(groups)
        edges = boundaries(graph, plan, consts)
        missing_t = [e for e in edges if e not in trans or trans[e].status != "ok"]
        trans_s = sum(trans[e].cost_s for e in edges if e not in missing_t)
        outcome = timer.time(module, plan, [x])
        measured = outcome.value["median_s"] if outcome.ok and outcome.value.get("status") == "ok" else None
        why = "" if measured is not None else (outcome.message or (outcome.value or {}).get("message", ""))
        predicted, grouped = regions_s + singles_s + trans_s, regions_s + groups_s + trans_s
        results.append({
            "plan": plan.source, "regions": len(plan.regions),
            "region_backends": dict(collections.Counter(r.backend for r in plan.regions)),
            "default_ops": len(singles), "default_groups": len(groups), "boundaries": len(edges),
            "boundary_pairs": dict(collections.Counter(f"{a}->{b}" for a, b in edges)),
            "regions_s": regions_s, "default_single_s": singles_s, "default_grouped_s": groups_s,
            "transitions_s": trans_s, "predicted_s": predicted, "predicted_grouped_s": grouped,
            "measured_s": measured,
            "measured_status": outcome.status if not outcome.ok else outcome.value.get("status"),
            "measured_message": why[:300],
            "ratio": predicted / measured if measured else None,
            "ratio_grouped": grouped / measured if measured else None,
            "incomplete": {"regions": bad_regions, "default_single": bad_singles, "default_grouped": bad_groups,
                           "transitions": [f"{a}->{b}" for a, b in dict.fromkeys(missing_t)]},
            "plan_json": plan.to_json(),
        })
        print(f"  {plan.source}: predicted {_ms(predicted)} (grouped {_ms(grouped)}), measured {_ms(measured)}",
              file=sys.stderr, flush=True)
    return {"model": name, "what": what, "ops": len(graph), "constant_ops": len(consts),
            "pairs_measured": len(set(pairs)), "cache_hits": summary.cache_hits, "elapsed_s": time.perf_counter() - t0,
            "plans": results}


def _progress(name: str):
    shown = [0.0]

    def show(p) -> None:
        now = time.perf_counter()
        if now - shown[0] > 10 or p.done == p.total:
            shown[0] = now
            print(f"  {name}: {p.done}/{p.total} regions, {p.cache_hits} hits, {p.failures} failures, "
                  f"{p.elapsed_s:.0f} s", file=sys.stderr, flush=True)
    return show


def _ms(s: float | None) -> str:
    return "–" if s is None else f"{s * 1e3:.3f} ms"


def _cell(s: float | None) -> str:
    return "–" if s is None else f"{s * 1e3:.3f}"


def markdown(r: dict) -> str:
    lines = ["# Additivity: sum of measured region costs vs measured end-to-end time of the plan", "",
             f"Device: {r['device']}. Backends: " + ", ".join(f"{b} {v}" for b, v in r["backends"].items())
             + f". Timing budget {r['timing']['budget_s']} s per region / plan.", "",
             "predicted = regions (each alone on its backend) + default ops (each alone on iree-cpu; constants "
             "free) + transitions (per boundary, the 256x256 probe's cost for that backend pair). grouped = the "
             "same with the default ops measured as connected groups. All times in ms; ratio = predicted / "
             "measured.", ""]
    for m in r["models"]:
        lines += [f"## {m['model']}: {m['what']}", "",
                  f"{m['ops']} ops ({m['constant_ops']} constant expressions).", "",
                  "| plan | regions | boundaries | regions | default ops | transitions | predicted | measured "
                  "| ratio | grouped default | predicted grouped | ratio grouped |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for p in m["plans"]:
            regs = ", ".join(f"{n} {b}" for b, n in p["region_backends"].items()) or "none"
            flag = " *" if any(p["incomplete"].values()) else ""
            measured = _cell(p["measured_s"]) if p["measured_s"] is not None else p["measured_status"]
            ratio = f"{p['ratio']:.2f}" if p["ratio"] else "–"
            ratio_g = f"{p['ratio_grouped']:.2f}" if p["ratio_grouped"] else "–"
            lines.append(f"| {p['plan']}{flag} | {regs} | {p['boundaries']} | {_cell(p['regions_s'])} | "
                         f"{_cell(p['default_single_s'])} ({p['default_ops']}) | {_cell(p['transitions_s'])} | "
                         f"**{_cell(p['predicted_s'])}** | **{measured}** | {ratio} | "
                         f"{_cell(p['default_grouped_s'])} ({p['default_groups']}) | {_cell(p['predicted_grouped_s'])} "
                         f"| {ratio_g} |")
        notes = [(p["plan"], k, x) for p in m["plans"] for k, v in p["incomplete"].items() for x in v]
        if notes:
            lines += ["", "\\* incomplete prediction (these parts have no usable measurement and count 0):", ""]
            for plan, kind, x in notes[:20]:
                lines.append(f"- {plan}, {kind}: " + (x if isinstance(x, str) else
                                                      f"{x['backend']} {x['status']} ({x['region'][:60]}): "
                                                      f"{x['message'][:160]}"))
        for p in m["plans"]:
            if p["measured_s"] is None:
                lines.append(f"- {p['plan']} end-to-end: {p['measured_status']}: {p['measured_message'][:200]}")
        lines.append("")
    ok = [t for t in r["transitions"] if t["status"] == "ok"]
    lines += ["Transition costs used (µs per boundary, 256 KiB probe): "
              + ", ".join(f"{t['src']}→{t['dst']} {t['cost_s'] * 1e6:.0f}" for t in ok)
              + (f"; failed: {', '.join(t['src'] + '→' + t['dst'] for t in r['transitions'] if t['status'] != 'ok')}"
                 if len(ok) < len(r["transitions"]) else "") + ".", "",
              "What the prediction leaves out:", "",
              "- Fusion and scheduling across ops on the default backend: measuring ops alone charges each its own "
              "dispatch and call overhead, and loses fusion (the `grouped` column measures connected default ops "
              "together, which recovers much of it).",
              "- Boundary cost by size: every boundary is charged the probe's cost (one 256x256 f32 tensor), "
              "whatever crosses it; a boundary carrying several values from one op counts once per consuming region.",
              "- Model inputs entering a non-default region and results leaving one (no transition charged), and "
              "the program's own entry/exit.",
              "- Constants: a region measured alone has its weights cloned in as it sees them in the model; "
              "constant expressions left on the default backend count 0.",
              "- Cache and thread-pool effects between regions running back to back (each region is timed alone "
              "with warm caches on its own inputs).", "",
              f"Total {r['total_s']:.0f} s (transitions {r['transitions_measure_s']:.0f} s).", "",
              "Command:", "", f"    {r['command']}", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="small_cnn,mlp,transformer")
    p.add_argument("--seeds", default="0,1,2", help="random plan seeds (default 0,1,2)")
    p.add_argument("--backends", default=None, help="backends of the random plans (default: every available one)")
    p.add_argument("--budget", type=float, default=1.0, help="timing budget per region / plan, s (default 1)")
    p.add_argument("--db", default=None, help="cost database to use (default: a fresh one in a temporary directory)")
    p.add_argument("--out", default=str(Path(__file__).parent), help="output directory")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: mlp only, plans default and random:0 over iree-cpu,ort, 0.2 s budget")
    a = p.parse_args()
    if a.quick:
        a.models, a.seeds, a.backends, a.budget = "mlp", "0", a.backends or "iree-cpu,ort", 0.2
    a.backends = a.backends or ",".join(b.name for b in available_backends())
    result = run(a)
    write_report(a.out, NAME, result, markdown(result))


if __name__ == "__main__":
    main()
