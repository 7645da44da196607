"""The headroom bound of bench/headroom.py for whole segments instead of single compute nodes: could
another engine run a block of layers (a bottleneck, a transformer layer) faster than OpenVINO runs it
inside the whole graph, where no single node is faster?

A model's ONNX graph is cut where a single tensor is live (besides weights and tensors computed from
constants alone: the attention masks), so each segment takes one activation and gives one; adjacent
segments are merged until each holds at least ``--share`` of OpenVINO's in-graph time. Each segment is
extracted (``onnx.utils.extract_model``) and timed alone on ORT and OpenVINO, warm and cold, against
the in-graph time of the OpenVINO nodes it covers (a node goes to the segment of the first ONNX layer
fused into it; nodes fused from no ONNX layer, such as layout reorders, count for none).

    python bench/headroom_segments.py [--models ...] [--share 0.05] [--name headroom_segments]

Writes bench/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx.utils

sys.path.insert(0, str(Path(__file__).parent))
from headroom import RESULTS, THREADS, _export, _median_ms, profile_openvino  # noqa: E402

from collage_runtime.engines import Engines  # noqa: E402
from collage_runtime.telemetry import disable_engine_telemetry  # noqa: E402


def cut_points(model: onnx.ModelProto) -> tuple[list[onnx.NodeProto], list[int]]:
    """The nodes in graph order and the positions after which exactly one activation is live."""
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
    live = {i for i in inputs}
    cuts = []
    for k, n in enumerate(nodes):
        live.update(o for o in n.output if o not in constant)
        live = {t for t in live if last_use.get(t, -1) > k or t in outputs}
        if len(live) == 1 and not (live & outputs) and k < len(nodes) - 1:
            cuts.append(k)
    return nodes, cuts


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


def _live_in(nodes, start: int, constant: set[str], graph_inputs: list[str]) -> str:
    produced_before = {o for n in nodes[:start] for o in n.output} | set(graph_inputs)
    used = [i for n in nodes[start:] for i in n.input if i in produced_before and i not in constant]
    return used[0]


def time_segment(path: Path, work: Path, inputs: list[str], output: str) -> dict[str, dict[str, float]]:
    import onnxruntime as ort
    import openvino as ov

    cut = work / "segment.onnx"
    onnx.utils.extract_model(str(path), str(cut), inputs, [output])
    graph = onnx.load(str(cut)).graph
    rng = np.random.default_rng(0)
    feeds = {}
    for inp in graph.input:
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        if inp.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            feeds[inp.name] = rng.integers(0, 100, shape).astype(np.int64)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    engines = Engines(THREADS)
    session = ort.InferenceSession(str(cut), sess_options=engines.ort_session_options(),
                                   providers=["CPUExecutionProvider"])
    request = ov.Core().compile_model(str(cut), "CPU", engines.openvino_config()).create_infer_request()
    ov_inputs = [feeds[i.name] for i in graph.input]
    runs = {"ort": lambda: session.run(None, feeds), "openvino": lambda: request.infer(ov_inputs)}
    for run in runs.values():
        run()
    samples = collections.defaultdict(list)
    for _ in range(5):
        for engine, run in runs.items():
            samples[("warm", engine)].append(_median_ms(run, min_calls=5, seconds=0.05))
            samples[("cold", engine)].append(_median_ms(run, min_calls=5, seconds=0.05, cold=True))
    timed: dict[str, dict[str, float]] = {"warm": {}, "cold": {}}
    for (state, engine), v in samples.items():
        timed[state][engine] = statistics.median(v)
    return timed


def study(name: str, work: Path, share: float) -> dict:
    path, example = _export(name, work)
    model = onnx.load(str(path))
    wall, profile, origins = profile_openvino(path, example)
    nodes, cuts = cut_points(model)
    index = {n.name: k for k, n in enumerate(nodes)}
    node_ms = [0.0] * len(nodes)
    for ov_name, (_, ms) in profile.items():
        names = [n if n in index else n.split("/")[0] for n in origins.get(ov_name, [])]
        positions = [index[n] for n in names if n in index]
        if positions:
            node_ms[min(positions)] += ms
    initializers = {i.name for i in model.graph.initializer}
    graph_inputs = [i.name for i in model.graph.input if i.name not in initializers]
    constant = set(initializers) | {""}
    for n in nodes:
        if all(i in constant for i in n.input):
            constant.update(n.output)
    rows = []
    for start, end in segments(nodes, cuts, node_ms, share):
        seg_inputs = graph_inputs if start == 0 else [_live_in(nodes, start, constant, graph_inputs)]
        output = model.graph.output[0].name if end == len(nodes) else \
            next(o for n in nodes[:end] for o in n.output if o not in constant and o in
                 {i for m in nodes[end:] for i in m.input})
        timed = time_segment(path, work, seg_inputs, output)
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="dcgan,mobilenet_v2,resnet50,resnext50_32x4d,bert_base,gpt2_small,"
                        "r3d_18")
    parser.add_argument("--share", type=float, default=0.05)
    parser.add_argument("--name", default="headroom_segments")
    args = parser.parse_args(argv)
    disable_engine_telemetry()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            r = study(name, Path(tmp), args.share)
            print(f"{name}: {len(r['rows'])} segments, bound warm {r['bound_warm']:.3f}x, "
                  f"cold {r['bound_cold']:.3f}x", flush=True)
            results.append(r)
    command = "python bench/headroom_segments.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (RESULTS / f"{args.name}.json").write_text(json.dumps(results, indent=1))
    (RESULTS / f"{args.name}.md").write_text(report(results, command.strip()))


if __name__ == "__main__":
    main()
