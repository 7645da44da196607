"""How much could any placement win over OpenVINO running a whole int8 model? The f32 headroom study
(``studies.headroom.headroom``) on the int8 zoo's models.

Each model is exported and quantized as ``int8_zoo`` does it (``quantize_static``, QDQ, per-channel int8).
OpenVINO runs it with per-node profiling: each compute node has its time inside the int8 graph (its
quantize/dequantize fused in). Each compute node is then cut out with its quantization, from the int8
tensor its activation ``DequantizeLinear`` reads to the int8 tensor its output ``QuantizeLinear`` writes
(or its float output where none follows), and timed alone on ONNX Runtime and OpenVINO, warm and cold,
interleaved; the bound is ``whole / (whole - sum of max(0, in-graph - ORT alone))``.

    python -m studies.int8.headroom_int8 --models resnet50,mobilenet_v2    # ~6 min; headroom_int8.{json,md}
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx

from studies.headroom import headroom as h
from studies.int8.int8_zoo import export



def _group(node: onnx.NodeProto, producers: dict, users: dict) -> tuple[list[str], list[str]] | None:
    """(int8 inputs, outputs) of ``node`` with its activation's dequantize and its output's quantize."""
    dq = producers.get(node.input[0])
    if dq is None or dq.op_type != "DequantizeLinear":
        return None
    after = users.get(node.output[0], [])
    outputs = [after[0].output[0]] if len(after) == 1 and after[0].op_type == "QuantizeLinear" else list(node.output)
    return [dq.input[0]], outputs


def study(name: str, work: Path) -> dict:
    f32, int8, x = export(name, work)
    model = onnx.load(str(int8))
    nodes = {n.name: n for n in model.graph.node}
    producers = {o: n for n in model.graph.node for o in n.output}
    users: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    wall, profile, origins = h.profile_openvino(int8, [x])
    rows, seen, by_type = [], set(), {}
    for ov_name, (kind, ms) in profile.items():
        by_type[kind] = by_type.get(kind, 0.0) + ms
        node = h._onnx_node(origins.get(ov_name, []), nodes)
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        group = _group(node, producers, users)
        if group is None:
            continue
        alone = h.time_cut(int8, *group, work)
        row = dict(node=node.name, op=node.op_type, ov_node=ov_name, ov_kind=kind, in_graph_ms=ms, alone_ms=alone)
        for state, times in alone.items():
            row[f"best_other_{state}"] = "ort"
            row[f"saving_{state}_ms"] = max(0.0, ms - times["ort"])
        rows.append(row)
    result = dict(model=name, whole_ms=wall, nodes_sum_ms=sum(by_type.values()),
                  compute_ms=sum(r["in_graph_ms"] for r in rows), by_type=by_type, rows=rows)
    for state in ("warm", "cold"):
        saving = sum(r[f"saving_{state}_ms"] for r in rows)
        result[f"headroom_{state}_ms"] = saving
        result[f"bound_{state}"] = wall / (wall - saving)
    return result


def main(argv=None) -> None:
    h.run(argv, study, h.report, "headroom_int8", "headroom_int8.py", package="studies.int8",
          results_dir=Path(__file__).parent)


if __name__ == "__main__":
    main(sys.argv[1:])
