"""Quantized ONNX models in the form torch-mlir lowers to StableHLO's ``!quant.uniform`` ops.

torch-mlir lowers ``QuantizeLinear → DequantizeLinear`` on activations to ``stablehlo.uniform_quantize`` /
``uniform_dequantize``, but a ``DequantizeLinear`` of an integer initializer (every weight and int32 bias of
a QDQ model, as ``onnxruntime.quantization.quantize_static`` writes them) becomes a ``uniform_dequantize`` of a
plain integer tensor, which StableHLO's verifier refuses. And the QOperator form (``QLinearConv``,
``QLinearMatMul``, ``com.microsoft`` ``QLinearAdd``...) has no torch-mlir conversion beyond the first two.

Two rewrites of the ONNX graph, before the import, that keep the model's arithmetic:

- **quantized initializers:** ``DequantizeLinear(Wq, s, zp)`` becomes ``DequantizeLinear(QuantizeLinear(W, s,
  zp), s, zp)`` with ``W = (Wq - zp) * s`` in f32: the pair lowers like an activation's, and quantizing ``W``
  gives ``Wq`` back exactly (checked here; an initializer whose round trip is not exact is dequantized in
  place instead). The StableHLO→ONNX translation folds the quantize of a constant back into an integer
  initializer (``onnx.quant``), so the engines see the model's own int8 weights.
- **QOperator ops** become their QDQ form: ``QLinearConv(x, xs, xz, w, ws, wz, ys, yz, B)`` is
  ``Q(Conv(DQ(x), DQ(w), DQ(B, xs*ws)), ys, yz)``, and so on for each op in ``QOPERATORS``.
"""

from __future__ import annotations

import numpy as np

from ..errors import CollageError

#: QOperator ops with their float op, the (value, scale, zero point) input triples it dequantizes, and where
#: its output's scale and zero point are (absent: a float output). A bias (``QLinearConv``'s input 8,
#: ``QGemm``'s 6) is int32 at the product of the first two scales: ``BIAS``.
QOPERATORS: dict[str, tuple[str, tuple[tuple[int, int, int], ...], tuple[int, int]]] = {
    "QLinearConv": ("Conv", ((0, 1, 2), (3, 4, 5)), (6, 7)),
    "QGemm": ("Gemm", ((0, 1, 2), (3, 4, 5)), (7, 8)),
    "QLinearMatMul": ("MatMul", ((0, 1, 2), (3, 4, 5)), (6, 7)),
    "QLinearAdd": ("Add", ((0, 1, 2), (3, 4, 5)), (6, 7)),
    "QLinearMul": ("Mul", ((0, 1, 2), (3, 4, 5)), (6, 7)),
    "QLinearGlobalAveragePool": ("GlobalAveragePool", ((0, 1, 2),), (3, 4)),
    "QLinearAveragePool": ("AveragePool", ((0, 1, 2),), (3, 4)),
    "QLinearSigmoid": ("Sigmoid", ((0, 1, 2),), (3, 4)),
    "QLinearLeakyRelu": ("LeakyRelu", ((0, 1, 2),), (3, 4)),
    "QLinearSoftmax": ("Softmax", ((0, 1, 2),), (3, 4)),
}

BIAS = {"QLinearConv": 8, "QGemm": 6}

#: Ops that move or select 8-bit values between QOperator ops (``Flatten`` before a ``QGemm``): run on
#: their dequantized values, then quantized again at the same scale, which is exact (torch-mlir cannot
#: lower them on quantized tensors).
MOVES = frozenset({"Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "MaxPool", "Identity", "Slice",
                   "Gather", "Expand", "Tile", "DepthToSpace", "SpaceToDepth"})

#: Attributes of ``com.microsoft`` QOperator ops that are not their float op's.
_NOT_FLOAT_ATTRIBUTES = {"channels_last", "opset"}


def normalize_quantized(model) -> int:
    """Rewrites ``model`` (an ``onnx.ModelProto``, in place) as described above; returns how many nodes changed."""
    graph = model.graph
    changed = _qoperators_as_qdq(graph)
    changed += _initializers_through_quantize(graph)
    return changed


def _constant_values(graph) -> dict:
    """Initializers and ``Constant`` nodes' values, by name."""
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _initializers_through_quantize(graph) -> int:
    from onnx import helper, numpy_helper

    values = _constant_values(graph)
    nodes, changed = [], 0
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in values and len(node.input) >= 2 \
                and node.input[1] in values:
            q = values[node.input[0]]
            scale = values[node.input[1]].astype(np.float32)
            zero = values[node.input[2]] if len(node.input) > 2 and node.input[2] else np.zeros((), q.dtype)
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            if q.dtype.kind not in "iu" or any(a.name == "block_size" and a.i for a in node.attribute):
                nodes.append(node)
                continue
            shape = [1] * q.ndim
            if scale.ndim == 1 and q.ndim:
                shape[axis % q.ndim] = scale.size
            real = ((q.astype(np.float64) - zero.astype(np.float64).reshape(shape if zero.ndim else ()))
                    * scale.astype(np.float64).reshape(shape if scale.ndim else ())).astype(np.float32)
            back = np.rint(real.astype(np.float64) / scale.astype(np.float64).reshape(shape if scale.ndim else ())) \
                + zero.astype(np.float64).reshape(shape if zero.ndim else ())
            name = f"{node.input[0]}__real"
            graph.initializer.append(numpy_helper.from_array(real, name))
            if np.array_equal(back, q.astype(np.float64)):
                quantized = f"{node.input[0]}__requantized"
                nodes.append(helper.make_node("QuantizeLinear", [name, *node.input[1:]], [quantized],
                                              name=f"{node.name}__quantize",
                                              **({"axis": axis} if scale.ndim == 1 else {})))
                nodes.append(helper.make_node("DequantizeLinear", [quantized, *node.input[1:]], list(node.output),
                                              name=node.name, **({"axis": axis} if scale.ndim == 1 else {})))
            else:
                nodes.append(helper.make_node("Identity", [name], list(node.output), name=node.name))
            changed += 1
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return changed


def _qoperators_as_qdq(graph) -> int:
    from onnx import helper, numpy_helper

    values = _constant_values(graph)
    nodes, changed = [], 0
    quantized: dict[str, tuple[str, str]] = {}  # an 8-bit value's scale and zero point
    for node in graph.node:
        form = QOPERATORS.get(node.op_type)
        if node.op_type == "QuantizeLinear" and len(node.input) == 3:
            quantized[node.output[0]] = (node.input[1], node.input[2])
        if node.op_type in MOVES and node.input and node.input[0] in quantized:
            scale, zero = quantized[node.input[0]]
            prefix = node.name or node.output[0]
            nodes.append(helper.make_node("DequantizeLinear", [node.input[0], scale, zero], [f"{prefix}__dq"],
                                          name=f"{prefix}__dq"))
            moved = helper.make_node(node.op_type, [f"{prefix}__dq", *node.input[1:]], [f"{prefix}__real"],
                                     name=f"{prefix}__float", domain=node.domain)
            moved.attribute.extend(node.attribute)
            nodes.append(moved)
            nodes.append(helper.make_node("QuantizeLinear", [f"{prefix}__real", scale, zero], [node.output[0]],
                                          name=prefix))
            quantized[node.output[0]] = (scale, zero)
            changed += 1
            continue
        if form is None:
            if node.op_type.startswith("QLinear"):
                raise CollageError(f"cannot import the ONNX model: its {node.op_type} node {node.name!r} has no "
                                   f"QDQ form here (QOperator ops taken: {', '.join(sorted(QOPERATORS))})")
            nodes.append(node)
            continue
        float_op, triples, (ys, yz) = form
        prefix = node.name or node.output[0]
        inputs = []
        if node.op_type == "QLinearGlobalAveragePool" and any(a.name == "channels_last" and a.i for a in node.attribute):
            raise CollageError(f"cannot import the ONNX model: QLinearGlobalAveragePool {node.name!r} is channels-last")
        for k, (v, s, z) in enumerate(triples):
            out = f"{prefix}__dq{k}"
            scale = values.get(node.input[s])
            # A weight's per-channel scales: a convolution's output channels, a matmul's columns.
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            axis = {} if scale is None or np.asarray(scale).size <= 1 else \
                {"axis": 0 if float_op == "Conv" or trans_b else -1}
            nodes.append(helper.make_node("DequantizeLinear", [node.input[v], node.input[s], node.input[z]], [out],
                                          name=f"{prefix}__dq{k}", **axis))
            inputs.append(out)
        bias = BIAS.get(node.op_type)
        if bias is not None and len(node.input) > bias and node.input[bias]:
            xs, ws = (values.get(node.input[i]) for i in (1, 4))
            if xs is None or ws is None:
                raise CollageError(f"cannot import the ONNX model: {node.op_type} {node.name!r} has a bias but its "
                                   "input or weight scale is not a constant")
            bias_scale = (np.asarray(xs, np.float32) * np.asarray(ws, np.float32)).astype(np.float32)
            scale_name, zero_name = f"{prefix}__bias_scale", f"{prefix}__bias_zero"
            graph.initializer.append(numpy_helper.from_array(bias_scale.reshape(bias_scale.shape), scale_name))
            graph.initializer.append(numpy_helper.from_array(np.zeros(bias_scale.shape, np.int32), zero_name))
            out = f"{prefix}__dq_bias"
            nodes.append(helper.make_node("DequantizeLinear", [node.input[bias], scale_name, zero_name], [out],
                                          name=out, **({"axis": 0} if bias_scale.ndim == 1 else {})))
            inputs.append(out)
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute
                      if a.name not in _NOT_FLOAT_ATTRIBUTES}
        if len(node.input) <= ys or not node.input[ys]:  # a float output (QGemm without y_scale)
            nodes.append(helper.make_node(float_op, inputs, list(node.output), name=prefix, **attributes))
        else:
            real = f"{prefix}__real"
            nodes.append(helper.make_node(float_op, inputs, [real], name=f"{prefix}__float", **attributes))
            zero = [node.input[yz]] if len(node.input) > yz and node.input[yz] else []
            nodes.append(helper.make_node("QuantizeLinear", [real, node.input[ys], *zero], list(node.output),
                                          name=prefix))
            if zero:
                quantized[node.output[0]] = (node.input[ys], zero[0])
        changed += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return changed
