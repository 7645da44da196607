"""The translator's entry point: ``translate`` a region function into an ``onnx.ModelProto`` (opset 18,
``ir_version`` 10), its graph inputs ``in0..`` and outputs ``out0..``, simplified by ``optimize``."""

from __future__ import annotations

from ..dialects import stablehlo as sh
from ..errors import CollageError
from ..graph import nested_ops
from ..ir import ir
from .builder import _block_results, _Builder
from .constants import CONSTANT_OPS, _read_constants
from .op_ids import _carry_op_ids
from .optimize import optimize
from .values import BOUNDARY_DTYPES, DTYPES, WIDENED


OPSET = 18
IR_VERSION = 10


def translate(func: ir.Operation, *, simplify: bool = True, ties_by_index: bool = True, dynamic: bool = False):
    """The ``onnx.ModelProto`` equal to the region function ``func`` (a ``func.func`` with a body),
    simplified by ``optimize`` unless ``simplify`` is False (the op-by-op translation).
    ``ties_by_index``: whether the engine's ``TopK`` orders equal values by index (``_Builder``).
    ``dynamic``: values may have dynamic dims (a whole model with its ``?`` dims kept, for an engine that
    takes dynamic shapes): an input's dynamic dim becomes the ``dim_param`` ``ARG.AXIS``, and each op with
    one needs a rule that takes them (``OnnxOp.dynamic``)."""
    import onnx
    from onnx import helper

    func = func.operation
    block = func.regions[0].blocks[0]
    b = _Builder(ties_by_index, dynamic)
    graph_inputs, graph_outputs, args = [], [], []
    for i, arg in enumerate(block.arguments):
        shape, dtype = _spec(arg, func, dynamic)
        shape = [f"{i}.{a}" if n is None else n for a, n in enumerate(shape)]
        graph_inputs.append(helper.make_tensor_value_info(f"in{i}", BOUNDARY_DTYPES[dtype][1], shape))
        args.append(b.node("Cast", [f"in{i}"], to=DTYPES[dtype][1]) if dtype in WIDENED else f"in{i}")
    b.constants = _read_constants([o for o in nested_ops(func) if o.name in CONSTANT_OPS])
    results = _block_results(b, block, args)
    for k, (v, name) in enumerate(zip(sh.returned(block), results)):
        shape, dtype = _spec(v, func, dynamic)
        edge = ("Cast", {"to": WIDENED[dtype]}) if dtype in WIDENED else ("Identity", {})
        b.nodes.append(helper.make_node(edge[0], [name], [f"out{k}"], name=f"out{k}", **edge[1]))
        graph_outputs.append(helper.make_tensor_value_info(f"out{k}", BOUNDARY_DTYPES[dtype][1], shape))
    graph = helper.make_graph(b.nodes, str(func.attributes["sym_name"]).strip('"'), graph_inputs, graph_outputs,
                              initializer=b.initializers)
    opsets = {**b.opsets, "": b.opsets.get("", OPSET)}
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(opsets.items())],
                              producer_name="collage-mlir")
    model.ir_version = max(IR_VERSION, b.ir_version)
    if simplify:
        original = list(model.graph.node)
        model = optimize(model)
        _carry_op_ids(original, model.graph)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:  # e.g. a kept node that is no op at the region's opset
        raise CollageError(f"{func.location}: cannot export to ONNX: {' '.join(str(exc).split())[:200]}") from None
    return model


def _spec(v: ir.Value, func: ir.Operation, dynamic: bool = False) -> tuple[list[int | None], str]:
    """(shape, element type) of a graph input or output; None for a dynamic dim (a dynamic translation's)."""
    tt = sh.ranked_type(v)
    if tt is None or tt[1] not in BOUNDARY_DTYPES or (None in tt[0] and not dynamic):
        raise CollageError(f"{func.location}: region value of type {v.type} cannot cross into ONNX")
    return list(tt[0]), tt[1]
