"""Is precision worth choosing per node? OpenVINO's in-graph time of each compute node in f32 and in int8.

The int8 headroom study (``headroom_int8``) asks whether another engine runs an int8 node faster; this one
asks whether the same engine runs it faster in f32. Each model is exported and quantized as ``int8_zoo``
does it; OpenVINO runs the f32 and the int8 file with per-node profiling, and each ONNX compute node gets
its in-graph time in both (the OpenVINO nodes it was fused into, quantization included). Nodes faster in
f32 by more than 5 % are then left in f32 (``quantize_static``'s ``nodes_to_exclude``) and the mixed file
is timed whole against the f32 and int8 files, interleaved, median of the rounds.

The bound ``int8 whole / (int8 whole - sum of max(0, int8 in-graph - f32 in-graph))`` ignores what a
precision change costs between nodes (a quantize or dequantize); the mixed file pays it.

    python -m studies.int8.precision_headroom --models mobilenet_v2,resnet50   # precision_headroom.{json,md}

``--low bf16`` asks the same of bf16 on the f32 file (OpenVINO's inference precision f32 against bf16): the
nodes faster in f32 and the bound; no mixed file is made (OpenVINO's CPU plugin takes one precision per
compiled model, so a mix is regions on ``openvino`` beside ``openvino-bf16``, each boundary a call).

    python -m studies.int8.precision_headroom --models mobilenet_v2,resnet50 --low bf16 --name precision_headroom_bf16
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
from pathlib import Path

import onnx

from collage_runtime.telemetry import disable_engine_telemetry
from studies.headroom import headroom as h
from studies.int8.int8_zoo import export

RESULTS = Path(__file__).parent
MARGIN = 1.05


def per_node(path: Path, x, precision: str = "f32") -> tuple[float, dict[str, float]]:
    """Whole-model median ms and each ONNX compute node's in-graph ms on OpenVINO (inference ``precision``)."""
    nodes = {n.name: n for n in onnx.load(str(path), load_external_data=False).graph.node}
    wall, profile, origins = h.profile_openvino(path, [x], precision=precision)
    times: dict[str, float] = collections.defaultdict(float)
    for ov_name, (_kind, ms) in profile.items():
        node = h._onnx_node(origins.get(ov_name, []), nodes)
        if node is not None:
            times[node.name] += ms
    return wall, dict(times)


def whole_times(paths: dict[str, Path], x, rounds: int) -> dict[str, float]:
    """Median ms per call of each file on OpenVINO, interleaved."""
    import openvino as ov

    from collage_runtime.engines import Engines

    config = Engines(h.THREADS).openvino_config()
    requests = {k: ov.Core().compile_model(str(p), "CPU", config).create_infer_request() for k, p in paths.items()}
    samples = collections.defaultdict(list)
    for _ in range(rounds):
        for k, r in requests.items():
            samples[k].append(h._median_ms(lambda r=r: r.infer([x])))
    return {k: statistics.median(v) for k, v in samples.items()}


def study(name: str, work: Path, rounds: int, exporter: str, low: str = "int8") -> dict:
    f32, int8, x = export(name, work, exporter)
    f32_whole, f32_nodes = per_node(f32, x)
    if low == "bf16":  # the f32 file in bf16; the "int8" fields hold bf16's figures
        bf16_whole, bf16_nodes = per_node(f32, x, "bf16")
        rows = [dict(node=n, f32_ms=f32_nodes[n], int8_ms=ms) for n, ms in bf16_nodes.items() if n in f32_nodes]
        slower = [r["node"] for r in rows if r["int8_ms"] > MARGIN * r["f32_ms"]]
        saving = sum(max(0.0, r["int8_ms"] - r["f32_ms"]) for r in rows)
        return dict(model=name, low=low, profiled_whole_ms=dict(f32=f32_whole, int8=bf16_whole),
                    whole_ms=dict(f32=f32_whole, int8=bf16_whole), rows=rows, slower_in_int8=slower,
                    saving_ms=saving, bound=bf16_whole / (bf16_whole - saving))
    int8_whole, int8_nodes = per_node(int8, x)
    rows = [dict(node=n, f32_ms=f32_nodes[n], int8_ms=ms) for n, ms in int8_nodes.items() if n in f32_nodes]
    slower = [r["node"] for r in rows if r["int8_ms"] > MARGIN * r["f32_ms"]]
    saving = sum(max(0.0, r["int8_ms"] - r["f32_ms"]) for r in rows)
    paths = {"f32": f32, "int8": int8}
    if slower:
        paths["mixed"] = export(name, work, exporter, exclude=tuple(slower), suffix="mixed")[1]
    whole = whole_times(paths, x, rounds)
    return dict(model=name, profiled_whole_ms=dict(f32=f32_whole, int8=int8_whole), whole_ms=whole, rows=rows,
                slower_in_int8=slower, saving_ms=saving, bound=int8_whole / (int8_whole - saving))


def report(results: list[dict], command: str, low: str = "int8") -> str:
    lines = [f"# Precision headroom: OpenVINO's compute nodes in f32 and in {low}", "", f"`{command}`",
             *([] if low == "int8" else ["", "(profiled whole-model times; columns named int8 hold bf16's)"]), "",
             f"| model | f32 whole ms | {low} whole ms | nodes | slower in {low} | bound | mixed whole ms |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        w = r["whole_ms"]
        mixed = f"{w['mixed']:.3f}" if "mixed" in w else "-"
        lines.append(f"| {r['model']} | {w['f32']:.3f} | {w['int8']:.3f} | {len(r['rows'])} | "
                     f"{len(r['slower_in_int8'])} | {r['bound']:.3f}x | {mixed} |")
    for r in results:
        lines += ["", f"## {r['model']}: the nodes {low} gains least on (faster in f32 where marked)", "",
                  f"| node | f32 ms | {low} ms | faster in f32 |", "|---|---:|---:|---|"]
        for row in sorted(r["rows"], key=lambda row: row["f32_ms"] / max(row["int8_ms"], 1e-9))[:8]:
            mark = "yes" if row["node"] in r["slower_in_int8"] else ""
            lines.append(f"| {row['node']} | {row['f32_ms']:.4f} | {row['int8_ms']:.4f} | {mark} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mobilenet_v2,resnet50")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--name", default="precision_headroom")
    parser.add_argument("--exporter", choices=("torchscript", "dynamo"), default="torchscript")
    parser.add_argument("--low", choices=("int8", "bf16"), default="int8",
                        help="the precision set against f32: the int8 file, or the f32 file in bf16")
    args = parser.parse_args(argv)
    disable_engine_telemetry()
    found = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            r = study(name, Path(tmp), args.rounds, args.exporter, args.low)
            print(f"{name}: {r['whole_ms']}, {len(r['slower_in_int8'])} nodes slower in {args.low}, "
                  f"bound {r['bound']:.3f}x", flush=True)
            found.append(r)
    command = "python -m studies.int8.precision_headroom " + " ".join(argv if argv is not None else sys.argv[1:])
    (RESULTS / f"{args.name}.json").write_text(json.dumps(found, indent=1))
    (RESULTS / f"{args.name}.md").write_text(report(found, command.strip(), args.low))


if __name__ == "__main__":
    main()
