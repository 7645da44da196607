"""An ONNX node kept as ONNX (``stablehlo.custom_call @collage.onnx_node``: an op the importer could not
lower) back into the graph: its one-node model's node and constants, renamed into the region's graph.

Its definition is the one of the source model's opset. Where the op's definition changed after the
translator's opset (``OPSET``), the region's model takes the newer opset (``_Builder.opsets``; a node of
another domain, ONNX Runtime's ``com.microsoft``, adds that domain): ONNX's later
opsets keep what earlier ones define for the ops the translator writes, adding types and options."""

from __future__ import annotations

from ..dialects import collage
from ..dialects import stablehlo as sh
from ..frontends.onnx_kept import rename_outer
from ..ir import ir
from .builder import _Builder
from .op_ids import _ids_doc
from .export import OPSET
from .registry import register
from .values import DTYPES, WIDENED


def _widened(v: ir.Value) -> str | None:
    """``v``'s element type where the graph computes it in a wider one (``WIDENED``: bf16), else None."""
    tt = sh.ranked_type(v)
    return tt[1] if tt is not None and tt[1] in WIDENED else None


def onnx_node(op: ir.Operation) -> str | None:
    """an ONNX node kept as ONNX (@collage.onnx_node)"""
    return None if collage.onnx_node_model(op) is not None else "a custom call other than @collage.onnx_node"


@register("stablehlo.custom_call", when=(onnx_node,))
def _kept_node(b: _Builder, op, ins):
    import onnx
    from onnx import defs

    model = onnx.ModelProto.FromString(collage.onnx_node_model(op))
    # The node reads and writes its own types: a widened value (bf16, f32 in the graph) is cast around it.
    names = {f"in{k}": name if (t := _widened(v)) is None else b.node("Cast", [name], to=WIDENED[t])
             for k, (name, v) in enumerate(zip(ins, op.operands))}
    for init in model.graph.initializer:
        tensor = onnx.TensorProto()
        tensor.CopyFrom(init)
        tensor.name = names[init.name] = b.fresh("kept")
        b.initializers.append(tensor)
    for node in model.graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        del copy.input[:], copy.output[:]
        copy.input.extend(names.get(name, name) if name else "" for name in node.input)
        rename_outer(copy, names)  # what its subgraphs read from around it
        for name in node.output:
            names[name] = b.fresh(node.op_type.lower())
        copy.output.extend(names[name] for name in node.output)
        copy.name = names[node.output[0]]
        copy.doc_string = _ids_doc(() if b.op_id is None else (b.op_id,))
        b.nodes.append(copy)
        opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain == "" and opsets.get(""):
            since = defs.get_schema(node.op_type, opsets[""], "").since_version
            try:  # the same definition at the translator's opset: that opset reads it
                same = defs.get_schema(node.op_type, OPSET, "").since_version == since
            except defs.SchemaError:
                same = False
            if not same:  # the region's model reads it at its own opset (the translated ops may then not be)
                b.opsets[""] = opsets[""]
        else:
            b.opsets[domain] = max(b.opsets.get(domain, 0), opsets.get(domain, 1))
    b.ir_version = max(b.ir_version, model.ir_version)
    return [names[o.name] if (t := _widened(r)) is None else b.node("Cast", [names[o.name]], to=DTYPES[t][1])
            for o, r in zip(model.graph.output, op.results)]
