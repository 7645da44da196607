"""ONNX ops torch-mlir cannot lower, written as the ONNX ops their schema defines them by.

Many ONNX ops are *functions*: their schema defines them as a graph of other ONNX ops (``Attention`` and
``RMSNormalization`` in opset 23, ``ReduceSumSquare``, ``Mish``...), the way ONNX Runtime runs them where it
has no kernel. Where torch-mlir's ONNX importer has no lowering for such an op, its node is replaced by its
schema's body before import (``expand_functions``): ONNX's own definition, so what is imported computes what
the op computes, and every op of it is placed like any other.

Only the ops of ``EXPANDED`` are expanded: those torch-mlir does not lower (ONNX's node tests of each were
refused at import, ``studies/onnx_import``). The ops it lowers keep their node: a whole ``LayerNormalization``
lowers to fewer, fused ops than its body.
"""

from __future__ import annotations

import itertools

import onnx
from onnx import defs, inliner, shape_inference

#: Function ops of the default domain torch-mlir's ONNX importer cannot lower (their node tests refused at
#: import, "failed to legalize operation 'torch.operator'"), expanded into their schema's body.
EXPANDED = frozenset({
    "Attention", "RMSNormalization", "SwiGLU", "Swish", "Mish", "LinearAttention",
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "Shrink", "AffineGrid",
    "CenterCropPad", "MeanVarianceNormalization", "GroupNormalization", "ThresholdedRelu", "Softsign",
})

#: The domain the expanded nodes' functions get while they are inlined.
_DOMAIN = "collage.expanded"


def expand_functions(model: onnx.ModelProto, ops: frozenset[str] = EXPANDED) -> int:
    """Replaces each node of ``model``'s main graph whose op is in ``ops`` by its schema's function body
    (at the model's opset; a context-dependent body built for the node's attributes and input types);
    returns how many nodes were replaced. A node whose schema has no body at the model's opset is kept."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or not any(n.op_type in ops and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return 0
    types = _value_types(model)
    marked = onnx.ModelProto()
    marked.CopyFrom(model)
    # The inliner converts each body to the model's opset, which needs every value's type stated.
    del marked.graph.value_info[:]
    stated = {v.name for v in [*marked.graph.input, *marked.graph.output]}
    marked.graph.value_info.extend(onnx.helper.make_value_info(name, t) for name, t in types.items()
                                   if name not in stated)
    names = itertools.count()
    functions: list[onnx.FunctionProto] = []
    for node in marked.graph.node:
        if node.op_type not in ops or node.domain not in ("", "ai.onnx"):
            continue
        body = _body(node, opset, types)
        if body is None:
            continue
        body.domain, body.name = _DOMAIN, f"{node.op_type}_{next(names)}"
        functions.append(body)
        node.domain, node.op_type = _DOMAIN, body.name
    if not functions:
        return 0
    marked.functions.extend(functions)
    marked.opset_import.append(onnx.helper.make_opsetid(_DOMAIN, 1))
    try:
        expanded = inliner.inline_local_functions(marked, convert_version=True)
    except Exception:  # noqa: BLE001  (the inliner asserts on a value whose type it cannot tell)
        return 0
    model.CopyFrom(expanded)
    del model.graph.value_info[:]  # the inliner's renamed values: shape inference states them again
    del model.opset_import[:]
    model.opset_import.extend(o for o in expanded.opset_import if o.domain != _DOMAIN)
    return len(functions)


def _body(node: onnx.NodeProto, opset: int, types: dict[str, onnx.TypeProto]) -> onnx.FunctionProto | None:
    try:
        schema = defs.get_schema(node.op_type, opset, "")
    except defs.SchemaError:
        return None
    given = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():  # a schema body refers to defaults the node does not state
        if name not in given and attr.default_value.type != onnx.AttributeProto.UNDEFINED:
            node.attribute.append(attr.default_value)
    if schema.has_function:
        versions = [v for v in schema.function_opset_versions if v <= opset]
        if versions:
            return onnx.FunctionProto.FromString(schema.get_function_with_opset_version(max(versions)))
    if schema.has_context_dependent_function:
        versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
        if not versions or any(name and name not in types for name in node.input):
            return None
        inputs = [types[name].SerializeToString() if name else onnx.TypeProto().SerializeToString()
                  for name in node.input]
        raw = schema.get_context_dependent_function_with_opset_version(max(versions), node.SerializeToString(),
                                                                       inputs)
        return onnx.FunctionProto.FromString(raw) if raw else None
    return None


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Every main-graph value's type, shape inference's where the model does not state it."""
    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001  (the importer's own shape inference reports a bad model)
        inferred = model
    graph = inferred.graph
    types = {v.name: v.type for v in [*graph.input, *graph.value_info, *graph.output]}
    for t in graph.initializer:
        types.setdefault(t.name, onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims)))
    return types
