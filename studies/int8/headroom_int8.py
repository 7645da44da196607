"""How much could any placement win over OpenVINO running a whole int8 model? The f32 headroom study
(``studies.headroom.headroom``) on the int8 zoo's models.

Each model is exported and quantized as ``int8_zoo`` does it (``quantize_static``, QDQ, per-channel int8).
OpenVINO runs it with per-node profiling: each compute node has its time inside the int8 graph (its
quantize/dequantize fused in). Each compute node is then cut out with its quantization, from the int8
tensor its activation ``DequantizeLinear`` reads to the int8 tensor its output ``QuantizeLinear`` writes
(or its float output where none follows), and timed alone on ONNX Runtime and OpenVINO, warm and cold,
interleaved; with ``--torch``, torch's own int8 kernels too (``torch.backends.quantized.engine = "x86"``:
oneDNN or FBGEMM per op, as PyTorch's X86 quantizer runs them; ``torch.ao.nn.quantized`` Conv2d/Linear of
the node's shape on uint8 activations, per-channel int8 weights). The bound is ``whole / (whole - sum of
max(0, in-graph - fastest other engine alone))``.

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


def _torch_int8(node: onnx.NodeProto, producers: dict, inits: dict, shapes: dict):
    """``extra`` for ``time_cut``: the node as torch's quantized Conv2d/Linear (x86 engine), or None."""
    import torch
    import torch.ao.nn.quantized as nnq

    wdq = producers.get(node.input[1]) if len(node.input) > 1 else None
    if wdq is None or wdq.op_type != "DequantizeLinear" or wdq.input[0] not in inits:
        return None
    w = inits[wdq.input[0]]
    shape = shapes.get(node.input[0])
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    torch.backends.quantized.engine = "x86"
    if node.op_type == "Conv" and w.ndim == 4 and shape is not None:
        groups = attrs.get("group", 1)
        module = nnq.Conv2d(w.shape[1] * groups, w.shape[0], tuple(w.shape[2:]), stride=tuple(attrs.get("strides", [1, 1])),
                            padding=tuple(attrs.get("pads", [0, 0, 0, 0])[:2]), dilation=tuple(attrs.get("dilations", [1, 1])),
                            groups=groups)
        wq = torch.quantize_per_channel(torch.randn(*w.shape), torch.full((w.shape[0],), 0.01), torch.zeros(w.shape[0], dtype=torch.long),
                                        0, torch.qint8)
        module.set_weight_bias(wq, torch.zeros(w.shape[0]))
    elif node.op_type in ("Gemm", "MatMul") and w.ndim == 2 and shape is not None:
        out_f, in_f = (w.shape[0], w.shape[1]) if node.op_type == "Gemm" and attrs.get("transB", 0) else (w.shape[1], w.shape[0])
        module = nnq.Linear(in_f, out_f)
        wq = torch.quantize_per_channel(torch.randn(out_f, in_f), torch.full((out_f,), 0.01), torch.zeros(out_f, dtype=torch.long),
                                        0, torch.qint8)
        module.set_weight_bias(wq, torch.zeros(out_f))
    else:
        return None
    module.scale, module.zero_point = 0.05, 128
    x = torch.quantize_per_tensor(torch.rand(*shape) * 10, 0.05, 128, torch.quint8)

    def extra(feeds, initializers):
        return {"torch": lambda: torch.inference_mode()(module)(x)}

    return extra


def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    inferred = onnx.shape_inference.infer_shapes(model)
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (*inferred.graph.value_info, *inferred.graph.input)}


def study(name: str, work: Path, torch: bool = False) -> dict:
    f32, int8, x = export(name, work)
    model = onnx.load(str(int8))
    nodes = {n.name: n for n in model.graph.node}
    producers = {o: n for n in model.graph.node for o in n.output}
    users: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    shapes = _shapes(model) if torch else {}
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
        extra = _torch_int8(node, producers, inits, shapes) if torch else None
        alone = h.time_cut(int8, *group, work, extra)
        row = dict(node=node.name, op=node.op_type, ov_node=ov_name, ov_kind=kind, in_graph_ms=ms, alone_ms=alone)
        for state, times in alone.items():
            best = min((e for e in times if e != "openvino"), key=times.__getitem__)
            row[f"best_other_{state}"] = best
            row[f"saving_{state}_ms"] = max(0.0, ms - times[best])
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
          results_dir=Path(__file__).parent,
          extra_args=[("--torch", dict(action="store_true", help="time torch's x86 int8 kernels too"))])


if __name__ == "__main__":
    main(sys.argv[1:])
