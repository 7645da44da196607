"""How much could any placement win over OpenVINO running the whole model? An upper bound, per model.

OpenVINO (the best peer on every zoo model on this machine) runs the model exported by torch.onnx with
per-node profiling on, so each of its compute nodes (convolutions, fully connected layers, matmuls,
transposed convolutions) has its time *inside the whole graph*, fused post-ops and all. Each such ONNX
node is then cut out alone (``onnx.utils.extract_model``: its initializers kept, its activations random
inputs) and timed, interleaved, on ONNX Runtime, OpenVINO alone and torch (oneDNN). A placement can at
best replace a node's in-graph time with the fastest engine's time alone, so

    headroom = sum over nodes of max(0, in-graph time - best other engine's time alone) / whole-model time

is an upper bound on what moving single compute nodes to another engine could save. It is generous to
the other engines: their node runs alone (no boundary, no layout conversion, no post-ops that OpenVINO
fused into the node), which a region in a program never gets. Each engine is timed twice: *warm*
(called back to back: its weights stay in the 32 MB L3) and *cold* (a 64 MB buffer written before each
call evicts them, as the rest of a model does between two calls of a layer in a program); the cold
bound is the realistic one for layers whose weights are megabytes.

    python -m studies.headroom.headroom [--models resnet50,bert_base,...] [--name headroom]

Writes studies/headroom/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.shape_inference
import onnx.utils

from collage_runtime.engines import Engines
from collage_runtime.telemetry import disable_engine_telemetry
from collage_mlir import zoo

COMPUTE = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
RESULTS = Path(__file__).parent
THREADS = 2


def _export(name: str, work: Path) -> tuple[Path, list[np.ndarray]]:
    import torch

    model, inputs = zoo.build(name, False)
    path = work / f"{name}.onnx"
    with torch.no_grad():
        torch.onnx.export(model, inputs, str(path), verbose=False)
    inferred = work / f"{name}.inferred.onnx"
    onnx.shape_inference.infer_shapes_path(str(path), str(inferred))
    return inferred, [x.numpy() for x in inputs]


_EVICT = np.zeros(16 << 20, dtype=np.float32)  # 64 MB: twice the L3


def _median_ms(fn, min_calls: int = 20, seconds: float = 0.3, cold: bool = False) -> float:
    times, start = [], time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - start < seconds:
        if cold:
            np.add(_EVICT, 1.0, out=_EVICT)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def profile_openvino(path: Path, inputs, rounds: int = 20,
                     precision: str = "f32") -> tuple[float, dict[str, tuple[str, float]], dict]:
    """Whole-model median ms; per OpenVINO node, (node type, median ms inside the graph); and per node the
    original (ONNX) layers OpenVINO fused into it. ``precision``: OpenVINO's inference precision."""
    import openvino as ov
    import openvino.properties as props

    config = Engines(THREADS).openvino_config(precision=precision) | {props.enable_profiling: True}
    compiled = ov.Core().compile_model(str(path), "CPU", config)
    origins = {op.get_friendly_name(): op.get_rt_info()["originalLayersNames"].astype(str).split(",")
               for op in compiled.get_runtime_model().get_ordered_ops()}
    request = compiled.create_infer_request()
    for _ in range(5):
        request.infer(inputs)
    walls, per_node = [], collections.defaultdict(list)
    kinds = {}
    for _ in range(rounds):
        t0 = time.perf_counter()
        request.infer(inputs)
        walls.append(time.perf_counter() - t0)
        for info in request.profiling_info:
            per_node[info.node_name].append(info.real_time.total_seconds() * 1e3)
            kinds[info.node_name] = info.node_type
    profile = {n: (kinds[n], statistics.median(v)) for n, v in per_node.items()}
    return statistics.median(walls) * 1e3, profile, origins


def _onnx_node(origins: list[str], nodes: dict) -> onnx.NodeProto | None:
    """The ONNX compute node among the layers OpenVINO fused into one of its nodes (OpenVINO may append
    '/WithoutBiases' to a layer's name when it splits off the bias)."""
    names = [n if n in nodes else n.split("/")[0] for n in origins]
    found = [nodes[n] for n in names if n in nodes and nodes[n].op_type in COMPUTE]
    return found[0] if found else None


def _torch_fn(node: onnx.NodeProto, arrays: list[np.ndarray]):
    """The node as torch runs it (oneDNN/MKL), or None where this study does not translate it."""
    import torch
    import torch.nn.functional as F

    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    ts = [torch.from_numpy(np.array(a)) for a in arrays]
    if node.op_type == "MatMul":
        return lambda: torch.matmul(ts[0], ts[1])
    if node.op_type == "Gemm" and attrs.get("transB", 0) == 1 and not attrs.get("transA", 0):
        bias = ts[2] if len(ts) > 2 else None
        return lambda: F.linear(ts[0], ts[1], bias)
    if node.op_type in ("Conv", "ConvTranspose") and attrs.get("auto_pad", b"NOTSET") == b"NOTSET":
        spatial = ts[1].dim() - 2
        pads = attrs.get("pads", [0] * 2 * spatial)
        if pads[:spatial] != pads[spatial:]:
            return None
        kw = dict(stride=attrs.get("strides", 1), padding=pads[:spatial], dilation=attrs.get("dilations", 1),
                  groups=attrs.get("group", 1))
        bias = ts[2] if len(ts) > 2 else None
        if node.op_type == "Conv":
            conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[spatial]
        else:
            conv = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[spatial]
            kw["output_padding"] = attrs.get("output_padding", 0)
        return lambda: conv(ts[0], ts[1], bias, **kw)
    return None


def time_cut(model_path: Path, inputs: list[str], outputs: list[str], work: Path,
             extra=None) -> dict[str, dict[str, float]]:
    """The subgraph of the model between ``inputs`` and ``outputs``, cut out (its initializers kept,
    random activations in) and timed alone on ORT and OpenVINO, plus ``extra(feeds, initializers)`` ->
    {engine: callable} where given, warm and cold: {"warm"|"cold": {engine: median ms}}, interleaved."""
    import onnxruntime as ort
    import openvino as ov

    cut = work / "cut.onnx"
    onnx.utils.extract_model(str(model_path), str(cut), inputs, outputs)
    graph = onnx.load(str(cut)).graph
    rng = np.random.default_rng(0)
    feeds = {}
    for inp in graph.input:
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
        if dtype == np.int64:
            feeds[inp.name] = rng.integers(0, 100, shape)
        elif dtype.kind in "iu":  # a quantized activation: its whole storage range
            feeds[inp.name] = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    engines = Engines(THREADS)
    session = ort.InferenceSession(str(cut), sess_options=engines.ort_session_options(),
                                   providers=["CPUExecutionProvider"])
    request = ov.Core().compile_model(str(cut), "CPU", engines.openvino_config()).create_infer_request()
    ov_inputs = [feeds[i.name] for i in graph.input]
    runs = {"ort": lambda: session.run(None, feeds), "openvino": lambda: request.infer(ov_inputs)}
    if extra is not None:
        runs |= extra(feeds, {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer})
    for run in runs.values():
        run()
    samples = collections.defaultdict(list)
    for _ in range(5):  # interleaved rounds
        for engine, run in runs.items():
            samples[("warm", engine)].append(_median_ms(run, min_calls=5, seconds=0.05))
            samples[("cold", engine)].append(_median_ms(run, min_calls=5, seconds=0.05, cold=True))
    timed: dict[str, dict[str, float]] = {"warm": {}, "cold": {}}
    for (state, engine), v in samples.items():
        timed[state][engine] = statistics.median(v)
    return timed


def time_alone(model_path: Path, node: onnx.NodeProto, work: Path, activations: set[str]) -> dict[str, dict[str, float]]:
    """The node cut out of the model, timed alone on each engine (torch too where it translates)."""
    import torch

    def with_torch(feeds, inits):
        fn = _torch_fn(node, [feeds[i] if i in feeds else inits[i] for i in node.input if i])
        return {} if fn is None else {"torch": lambda: torch.inference_mode()(fn)()}

    return time_cut(model_path, [i for i in node.input if i in activations], list(node.output), work, with_torch)


def study(name: str, work: Path) -> dict:
    path, inputs = _export(name, work)
    model = onnx.load(str(path))
    nodes = {n.name: n for n in model.graph.node}
    initializers = {i.name for i in model.graph.initializer}
    produced = {o for n in model.graph.node for o in n.output if n.op_type != "Constant"}
    activations = produced | {i.name for i in model.graph.input if i.name not in initializers}
    wall, profile, origins = profile_openvino(path, inputs)

    rows, seen, by_type = [], set(), collections.Counter()
    for ov_name, (kind, ms) in profile.items():
        by_type[kind] += ms
        node = _onnx_node(origins.get(ov_name, []), nodes)
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        alone = time_alone(path, node, work, activations)
        row = dict(node=node.name, op=node.op_type, ov_node=ov_name, ov_kind=kind, in_graph_ms=ms, alone_ms=alone)
        for state, times in alone.items():
            others = {e: t for e, t in times.items() if e != "openvino"}
            best = min(others, key=others.get)
            row[f"best_other_{state}"] = best
            row[f"saving_{state}_ms"] = max(0.0, ms - others[best])
        rows.append(row)
    result = dict(model=name, whole_ms=wall, nodes_sum_ms=sum(by_type.values()),
                  compute_ms=sum(r["in_graph_ms"] for r in rows), by_type=dict(by_type.most_common()), rows=rows)
    for state in ("warm", "cold"):
        saving = sum(r[f"saving_{state}_ms"] for r in rows)
        result[f"headroom_{state}_ms"] = saving
        result[f"bound_{state}"] = wall / (wall - saving)
    return result


def report(results: list[dict], command: str) -> str:
    lines = ["# Headroom: what moving compute nodes off OpenVINO could save at most", "", f"`{command}`", "",
             "Bound: OpenVINO's whole-model time over that time less the headroom (each compute node's "
             "in-graph time less the fastest other engine's time alone, where that is less).", "",
             "| model | OpenVINO whole ms | in compute nodes | nodes timed | faster elsewhere, warm / cold | "
             "headroom ms, warm | bound, warm | headroom ms, cold | bound, cold |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        faster = [sum(1 for row in r["rows"] if row[f"saving_{s}_ms"] > 0) for s in ("warm", "cold")]
        lines.append(f"| {r['model']} | {r['whole_ms']:.3f} | {r['compute_ms'] / r['whole_ms']:.0%} | "
                     f"{len(r['rows'])} | {faster[0]} / {faster[1]} | {r['headroom_warm_ms']:.3f} | "
                     f"{r['bound_warm']:.3f}x | {r['headroom_cold_ms']:.3f} | {r['bound_cold']:.3f}x |")
    for r in results:
        top = sorted(r["rows"], key=lambda row: -row["saving_warm_ms"])[:6]
        lines += ["", f"## {r['model']}: the nodes with most to gain (warm)", "",
                  "| node | op | OpenVINO in graph ms | OpenVINO alone, warm / cold | ORT alone, warm / cold | "
                  "torch alone, warm / cold | saving ms, warm / cold |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for row in top:
            w, c = row["alone_ms"]["warm"], row["alone_ms"]["cold"]

            def pair(e):
                return f"{w[e]:.3f} / {c[e]:.3f}" if e in w else "—"
            lines.append(f"| {row['node']} | {row['op']} | {row['in_graph_ms']:.3f} | {pair('openvino')} | "
                         f"{pair('ort')} | {pair('torch')} | {row['saving_warm_ms']:.3f} / {row['saving_cold_ms']:.3f} |")
    return "\n".join(lines) + "\n"


def run(argv, study_fn, report_fn, default_name: str, script: str, extra_args=(), package: str = "studies.headroom",
        results_dir: Path = RESULTS) -> None:
    """The command line both headroom studies share: --models, --name (and ``extra_args``: (flag,
    kwargs) pairs passed on to ``study_fn`` by name); writes RESULTS/NAME.{json,md}."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="dcgan,mobilenet_v2,resnet50,resnext50_32x4d,bert_base,gpt2_small,"
                        "r3d_18")
    parser.add_argument("--name", default=default_name)
    for flag, kwargs in extra_args:
        parser.add_argument(flag, **kwargs)
    args = parser.parse_args(argv)
    options = {flag.lstrip("-"): getattr(args, flag.lstrip("-")) for flag, _ in extra_args}
    disable_engine_telemetry()
    import torch

    torch.set_num_threads(THREADS)
    found = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            r = study_fn(name, Path(tmp), **options)
            print(f"{name}: whole {r['whole_ms']:.3f} ms, bound warm {r['bound_warm']:.3f}x, "
                  f"cold {r['bound_cold']:.3f}x", flush=True)
            found.append(r)
    command = f"python -m {package}.{script.removesuffix('.py')} " + " ".join(argv if argv is not None else sys.argv[1:])
    (results_dir / f"{args.name}.json").write_text(json.dumps(found, indent=1))
    (results_dir / f"{args.name}.md").write_text(report_fn(found, command.strip()))


def main(argv=None) -> None:
    run(argv, study, report, "headroom", "headroom.py")


if __name__ == "__main__":
    main()
