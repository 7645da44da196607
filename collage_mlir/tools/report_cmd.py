"""``collage report ARTIFACT_OR_PLAN [--model MODEL] [--db PATH] [--input X.npy]... -o report.html``: the
placement, to look at.

One self-contained HTML page (inline SVG and CSS, no scripts, nothing fetched): the model's op graph drawn
in layers with each op coloured by the backend that runs it; per region its ops, the measured cost of
every backend the cost DB holds for it, and the tuning record (cost, runner-up, why) when the plan has one;
the end-to-end figures of the plan, the DP plan and each single-backend plan; for an artifact, the
breakdown of a run of it (each library region's engine time, the boundary around it, the rest of the IREE
program) timed through the runtime's region timer; the provenance (tune seed, budget, DB, versions).
"""

from __future__ import annotations

import argparse
import html
import io
import json
from pathlib import Path


from collage_runtime.manifest import ArtifactError, Manifest
from collage_runtime.profile import Breakdown, profile
from collage_runtime.program import InputError

from ..errors import CollageError
from ..frontends.onnx_calibrate import Agreement
from ..backends import registry
from ..graph import region_precision
from ..plan import Plan
from ..search.record import TunedPlan

PALETTE = {"iree-cpu": "#c8c8c8", "iree-cpu-dt": "#8fb3d9", "onednn": "#f2a65a", "ort": "#7fc97f",
           "openvino": "#beaed4", "xla-cpu": "#f0027f"}
_EXTRA = ["#ffff99", "#386cb0", "#bf5b17", "#666666"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("report", help="write an HTML page showing a plan's placement and its measured costs")
    r.add_argument("source", help="an artifact (directory or .collage file) or a plan JSON")
    r.add_argument("--model", help="the model the plan is for (default: the artifact's recorded source)")
    r.add_argument("--db", default=None, help="cost database (default: $COLLAGE_DB or the user's)")
    r.add_argument("--input", action="append", default=[],
                   help="input .npy for @main of an artifact's timed run, once per argument (default: random)")
    r.add_argument("--repeats", type=int, default=20, help="timed runs of an artifact (default 20)")
    r.add_argument("--no-run", action="store_true", help="do not run the artifact (no end-to-end breakdown)")
    r.add_argument("-o", "--output", required=True, help="HTML file to write")


def _plan_document(source: Path) -> tuple[TunedPlan, Manifest | None]:
    """(the plan with its tuning record when it has one, manifest or None) from an artifact or a plan file."""
    if source.suffix == ".json":
        try:
            data = json.loads(source.read_text())
        except (OSError, ValueError) as exc:
            raise CollageError(f"cannot read plan: {exc}", where=str(source)) from None
        return TunedPlan.from_json(data, source=str(source)), None
    import collage_runtime

    try:
        with collage_runtime.load(source) as prog:
            if isinstance(prog, collage_runtime.ShapedProgram):  # one program (and plan) per shape bucket
                where = ", ".join(f"{source / b.path} ({b.label})" for b in prog.table.buckets) if source.is_dir() \
                    else "compile to a directory (-o DIR) to report each bucket"
                raise CollageError(f"a shape-bucket artifact holds one program per bucket; report a bucket: {where}",
                                   where=str(source), exit_code=2)
            manifest = prog.manifest
    except ArtifactError as exc:
        raise CollageError(str(exc)) from None
    try:
        tuned = TunedPlan.from_json(dict(manifest.plan), source=str(source))
    except CollageError:  # an artifact's plan as it recorded it, whatever that is: no regions to show
        tuned = TunedPlan(Plan(source=str(source)))
    return tuned, manifest


def _colour(backend: str, seen: dict[str, str]) -> str:
    if backend not in seen:
        seen[backend] = PALETTE.get(backend) or _EXTRA[len(seen) % len(_EXTRA)]
    return seen[backend]


def _graph_svg(graph, owner: dict[int, str], colours: dict[str, str]) -> str:
    """The op graph in topological layers, ops coloured by backend, as an SVG string."""
    try:
        import matplotlib
    except ImportError:
        raise CollageError("drawing the graph needs matplotlib: pip install 'collage-mlir[bench]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    layer = {}
    for oid in graph.topological_order():
        layer[oid] = 1 + max((layer[p] for p in graph.producers(oid)), default=-1)
    rows: dict[int, list[int]] = {}
    for oid, k in layer.items():
        rows.setdefault(k, []).append(oid)
    pos = {oid: (i - len(ids) / 2, -k) for k, ids in rows.items() for i, oid in enumerate(ids)}
    width = max(4.0, min(40.0, 0.6 * max(len(v) for v in rows.values()))) if rows else 4.0
    fig, ax = plt.subplots(figsize=(width, max(3.0, min(200.0, 0.45 * len(rows)))))
    nx.draw_networkx_edges(graph.dag, pos, ax=ax, arrows=False, edge_color="#999999", width=0.6)
    nx.draw_networkx_nodes(graph.dag, pos, ax=ax, node_size=180, linewidths=0.4, edgecolors="#333333",
                           node_color=[colours[owner.get(o, "iree-cpu")] for o in graph.dag.nodes])
    nx.draw_networkx_labels(graph.dag, pos, ax=ax, font_size=5,
                            labels={o: graph.nodes[o].name.split(".")[-1][:10] for o in graph.dag.nodes})
    ax.set_axis_off()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


def _precision(graph, region) -> str:
    """What ``region`` computes in: ``region_precision``, or the number format its backend computes f32 math
    in (``openvino-bf16``: bf16)."""
    shown = region_precision(graph, region.ops, region.precision)
    info = registry().get(region.backend)
    reduced = info.backend.computes_in if info is not None and info.backend is not None else None
    return reduced.value if reduced and shown == "f32" else shown


def _region_costs(graph, regions, db_path) -> dict[str, dict[str, str]]:
    """Region name → backend → its measured cost (or failure status) in the cost DB, for this device."""
    from ..measure.db import CostDB, default_db_path
    from ..measure.device import device_fingerprint
    from ..measure.extract import extract_region

    path = Path(db_path or default_db_path())
    if not path.is_file():
        return {}
    device = device_fingerprint()[0]
    out: dict[str, dict[str, str]] = {}
    with CostDB(path) as db:
        for r in regions:
            try:
                region_hash = extract_region(graph, frozenset(r.ops), r.precision).hash
            except CollageError:
                continue
            rows = db.measurements(region_hash=region_hash, device=device)
            out[r.name] = {m.backend: (f"{m.median_s * 1e6:.1f} µs" if m.usable and m.median_s is not None
                                       else m.status) for m in rows}
    return out


def _ms(seconds) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _breakdown_table(b: Breakdown, inputs: str) -> str:
    rows = [(f"region {r.name} ({r.backend})", r.engine_ms) for r in b.regions]
    rows += [(f"boundary of {r.name} (collage_rt call less the engine)", r.boundary_ms) for r in b.regions]
    rows += [("outside library regions (IREE program: other ops, codegen regions, inputs in, results out)",
              b.outside_ms), ("end to end", b.total_ms)]
    e = html.escape
    return (f"<h2>End-to-end breakdown</h2><p>the median run of {b.repeats} runs of @main ({e(inputs)} inputs), "
            "timed through the runtime's region timer</p><table><tr><th>part</th><th>time</th><th>share</th></tr>"
            + "".join(f"<tr><td>{e(name)}</td><td>{_ms(ms / 1e3)}</td><td>{100 * ms / b.total_ms:.1f} %</td></tr>"
                      for name, ms in rows) + "</table>")


def render(tuned: TunedPlan | dict, manifest: Manifest | None, graph, db_path, breakdown: Breakdown | None = None,
           inputs: str = "random", held_out: dict | None = None) -> str:
    """The report page as HTML text (``tuned``: a plan, with its tuning record when it has one, or its JSON);
    ``held_out``: the plan's program checked on held-out samples (``Agreement.to_json`` and ``max_drop``),
    else what the manifest recorded."""
    if not isinstance(tuned, TunedPlan):
        tuned = TunedPlan.from_json(tuned)
    regions = tuned.plan.regions
    choices = dict(zip((r.name for r in regions), tuned.choices))
    owner = {oid: r.backend for r in regions for oid in r.ops}
    colours: dict[str, str] = {}
    for b in ["iree-cpu", *sorted({r.backend for r in regions})]:
        _colour(b, colours)
    e = html.escape
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>collage placement report</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #bbb;padding:3px 8px;font-size:13px;text-align:left}"
             ".sw{display:inline-block;width:12px;height:12px;border:1px solid #333;margin-right:4px}</style>",
             "</head><body><h1>collage placement report</h1>"]
    parts.append("<p>" + " ".join(f"<span class='sw' style='background:{c}'></span>{e(b)}&nbsp;&nbsp;"
                                  for b, c in colours.items()) + "</p>")
    if graph is not None:
        parts.append("<h2>Graph</h2>" + _graph_svg(graph, owner, colours))
    costs = _region_costs(graph, regions, db_path) if graph is not None else {}
    backends = sorted({b for c in costs.values() for b in c})
    parts.append("<h2>Regions</h2><table><tr><th>region</th><th>backend</th><th>precision</th><th>ops</th><th>cost</th>"
                 "<th>runner-up</th><th>why</th>" + "".join(f"<th>DB: {e(b)}</th>" for b in backends) + "</tr>")
    for r in regions:
        ops = ", ".join(f"{i} {graph.nodes[i].name}" if graph is not None and i in graph.nodes else str(i)
                        for i in sorted(r.ops))
        c = choices.get(r.name)
        runner = f"{e(str(c.runner_up))} ({_ms(c.runner_up_cost_s)})" if c and c.runner_up else "—"
        parts.append(f"<tr><td>{e(r.name)}</td><td><span class='sw' style='background:{colours[r.backend]}'>"
                     f"</span>{e(r.backend)}</td><td>{e(_precision(graph, r) if graph is not None else '—')}"
                     f"</td><td>{e(ops)}</td><td>{_ms(c.cost_s if c else None)}</td><td>{runner}</td>"
                     f"<td>{e(c.why if c else '—')}</td>"
                     + "".join(f"<td>{e(costs.get(r.name, {}).get(b, '—'))}</td>" for b in backends) + "</tr>")
    parts.append("</table>")
    if breakdown is not None:
        parts.append(_breakdown_table(breakdown, inputs))
    recorded = (manifest.provenance if manifest else None) or {}  # written at compile time (collage_mlir.entry)
    held = held_out or recorded.get("held_out")  # checked by the tune or the compile (--held-out, int8's quarter)
    if held:
        bound = f" (bound: --max-drop {held['max_drop']:g})" if held.get("max_drop") is not None else ""
        parts.append(f"<h2>Accuracy</h2><p>{e(Agreement.from_json(held).line() + bound)}</p>")
    rec = tuned.record
    if rec is not None and rec.plan is not None and rec.dp is not None:
        parts.append("<h2>End to end</h2><table><tr><th>plan</th><th>predicted</th><th>measured</th><th>regions</th></tr>")
        rows = [("this plan", rec.plan, len(regions)), ("DP alone", rec.dp, rec.dp.regions)]
        rows += [(f"{name} alone", v, v.regions) for name, v in sorted((rec.single_backend or {}).items())]
        for name, v, n in rows:
            parts.append(f"<tr><td>{e(name)}</td><td>{_ms(v.predicted_s)}</td><td>{_ms(v.measured_s)}"
                         f"</td><td>{n if n is not None else '—'}</td></tr>")
        parts.append("</table>")
    if rec is not None:  # the plan's own record, else the one recorded at compile time
        seed, budget, backends = rec.seed, rec.budget_s, rec.backends
    else:
        seed, budget, backends = recorded.get("seed"), recorded.get("budget_s"), recorded.get("backends")
    prov = {"plan": recorded.get("plan") or "—",
            "tuning seed": "—" if seed is None else seed, "tuning budget (s)": "—" if budget is None else budget,
            "tuning backends": ", ".join(backends) if isinstance(backends, (list, tuple)) else "—",
            "tuning DB": recorded.get("db", "—"), "costs shown from DB": str(db_path or "default")}
    if "module_hash" in recorded:
        prov["module structural hash"] = recorded["module_hash"]
    if manifest:
        prov |= {"artifact source": manifest.source, **{f"version {k}": v for k, v in manifest.versions.items()}}
    parts.append("<h2>Provenance</h2><table>" + "".join(f"<tr><th>{e(str(k))}</th><td>{e(str(v))}</td></tr>"
                                                         for k, v in prov.items()) + "</table></body></html>")
    return "\n".join(parts)


def run(args: argparse.Namespace) -> int:
    from ..frontends import load_model
    from ..graph import Graph, number_ops
    from ..ir import new_context
    from ..shaped import load_bucket

    tuned, manifest = _plan_document(Path(args.source))
    model = args.model or (manifest.source if manifest else None)
    graph = None
    if model and Path(model).is_file():
        bucket = (manifest.provenance or {}).get("bucket") if manifest is not None and not args.model else None
        if isinstance(bucket, dict):
            # One bucket of a shape-bucket artifact: its source has dynamic dims; draw it at the bucket's shape.
            module = load_bucket(model, bucket, new_context(), check_import=False)
        else:
            module = load_model(model, new_context())
            number_ops(module)
        graph = Graph(module)
    elif args.model:
        raise CollageError("no such model file", where=args.model)
    breakdown = None
    if manifest is not None and not args.no_run:
        from . import load_input_arrays

        if args.repeats < 1:
            raise CollageError("--repeats must be at least 1", exit_code=2)
        inputs = load_input_arrays(args.input)
        try:
            breakdown = profile(args.source, inputs or None, repeats=args.repeats)
        except (ArtifactError, InputError) as exc:
            raise CollageError(str(exc), where=args.source) from None
    page = render(tuned, manifest, graph, args.db, breakdown, "given" if args.input else "random")
    try:
        Path(args.output).write_text(page)
    except OSError as exc:
        raise CollageError(f"cannot write the report: {exc.strerror}", where=args.output) from None
    print(f"wrote {args.output}" + ("" if graph is not None else " (no model given: no graph drawn)"))
    return 0
