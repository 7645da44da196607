"""The headroom bound of studies/headroom/headroom.py for whole segments instead of single compute nodes: could
another engine run a block of layers (a bottleneck, a transformer layer) faster than OpenVINO runs it
inside the whole graph, where no single node is faster?

A model's ONNX graph is cut where a single tensor is live (besides weights and tensors computed from
constants alone: the attention masks), so each segment takes one activation and gives one; adjacent
segments are merged until each holds at least ``--share`` of OpenVINO's in-graph time. Each segment is
extracted (``onnx.utils.extract_model``) and timed alone on ORT and OpenVINO, warm and cold, against
the in-graph time of the OpenVINO nodes it covers (a node goes to the segment of the first ONNX layer
fused into it; nodes fused from no ONNX layer, such as layout reorders, count for none).

    python -m studies.headroom.headroom_segments [--models ...] [--share 0.05] [--name headroom_segments]

Writes studies/headroom/NAME.{json,md}.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from studies.headroom.headroom import _export, profile_openvino, run, time_cut  # noqa: E402


def cut_points(model: onnx.ModelProto) -> tuple[list[onnx.NodeProto], list[str], dict[int, str]]:
    """The nodes in graph order, the graph's activation inputs, and each position after which exactly one
    activation is live, with that activation."""
    graph = model.graph
    nodes = list(graph.node)
    initializers = {i.name for i in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in initializers]
    constant = set(initializers) | {""}
    for n in nodes:  # graph order is topological
        if all(i in constant for i in n.input):
            constant.update(n.output)
    last_use: dict[str, int] = {}
    for k, n in enumerate(nodes):
        for i in n.input:
            last_use[i] = k
    outputs = {o.name for o in graph.output}
    live = set(inputs)
    cuts = {}
    for k, n in enumerate(nodes):
        live.update(o for o in n.output if o not in constant)
        live = {t for t in live if last_use.get(t, -1) > k or t in outputs}
        if len(live) == 1 and not (live & outputs) and k < len(nodes) - 1:
            cuts[k] = next(iter(live))
    return nodes, inputs, cuts


def segments(nodes, cuts, node_ms: list[float], share: float) -> list[tuple[int, int]]:
    """[start, end) node ranges between cuts, merged until each holds ``share`` of the in-graph time."""
    total = sum(node_ms)
    bounds, start = [], 0
    for c in cuts + [len(nodes) - 1]:
        if sum(node_ms[start:c + 1]) >= share * total or c == len(nodes) - 1:
            bounds.append((start, c + 1))
            start = c + 1
    if len(bounds) > 1 and sum(node_ms[bounds[-1][0]:bounds[-1][1]]) < share * total:
        bounds[-2:] = [(bounds[-2][0], bounds[-1][1])]
    return bounds


def study(name: str, work: Path, share: float) -> dict:
    path, example = _export(name, work)
    model = onnx.load(str(path))
    wall, profile, origins = profile_openvino(path, example)
    nodes, graph_inputs, cuts = cut_points(model)
    index = {n.name: k for k, n in enumerate(nodes)}
    node_ms = [0.0] * len(nodes)
    for ov_name, (_, ms) in profile.items():
        names = [n if n in index else n.split("/")[0] for n in origins.get(ov_name, [])]
        positions = [index[n] for n in names if n in index]
        if positions:
            node_ms[min(positions)] += ms
    rows = []
    for start, end in segments(nodes, sorted(cuts), node_ms, share):
        seg_inputs = graph_inputs if start == 0 else [cuts[start - 1]]
        output = model.graph.output[0].name if end == len(nodes) else cuts[end - 1]
        timed = time_cut(path, seg_inputs, [output], work)
        in_graph = sum(node_ms[start:end])
        row = dict(start=start, end=end, first=nodes[start].name, last=nodes[end - 1].name,
                   in_graph_ms=in_graph, alone_ms=timed)
        for state in ("warm", "cold"):
            row[f"saving_{state}_ms"] = max(0.0, in_graph - timed[state]["ort"])
        rows.append(row)
    result = dict(model=name, whole_ms=wall, attributed_ms=sum(node_ms), cuts=len(cuts), rows=rows)
    for state in ("warm", "cold"):
        saving = sum(r[f"saving_{state}_ms"] for r in rows)
        result[f"bound_{state}"] = wall / (wall - saving)
    return result


def report(results: list[dict], command: str) -> str:
    lines = ["# Headroom by segment: could ORT run a block of layers faster than OpenVINO inside its graph?",
             "", f"`{command}`", "",
             "| model | OpenVINO whole ms | segments | ORT faster, warm / cold | bound, warm | bound, cold | "
             "ORT alone / OpenVINO in graph, cold (min-max) |", "|---|---:|---:|---:|---:|---:|---|"]
    for r in results:
        faster = [sum(1 for row in r["rows"] if row[f"saving_{s}_ms"] > 0) for s in ("warm", "cold")]
        ratios = [row["alone_ms"]["cold"]["ort"] / row["in_graph_ms"] for row in r["rows"] if row["in_graph_ms"]]
        lines.append(f"| {r['model']} | {r['whole_ms']:.3f} | {len(r['rows'])} | {faster[0]} / {faster[1]} | "
                     f"{r['bound_warm']:.3f}x | {r['bound_cold']:.3f}x | {min(ratios):.2f}-{max(ratios):.2f} |")
    for r in results:
        lines += ["", f"## {r['model']}", "",
                  "| segment (ONNX nodes) | OpenVINO in graph ms | OpenVINO alone, warm / cold | ORT alone, warm / cold |",
                  "|---|---:|---:|---:|"]
        for row in r["rows"]:
            w, c = row["alone_ms"]["warm"], row["alone_ms"]["cold"]
            lines.append(f"| {row['start']}-{row['end'] - 1} ({row['first']} .. {row['last']}) | "
                         f"{row['in_graph_ms']:.3f} | {w['openvino']:.3f} / {c['openvino']:.3f} | "
                         f"{w['ort']:.3f} / {c['ort']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    run(argv, study, report, "headroom_segments", "headroom_segments.py",
        [("--share", dict(type=float, default=0.05))])


if __name__ == "__main__":
    main()
