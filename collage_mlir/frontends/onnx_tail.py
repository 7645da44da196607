"""ONNX nodes whose output shapes depend on their data (``NonZero``, ``NonMaxSuppression``, ``Unique``,
``Compress``), and every node after them, as the model's *tail*: run by ONNX Runtime after the program.

    model ──► head: every other node; its outputs the model's own it gives, then each value the tail reads
         └──► tail: those nodes as an ONNX model, reading head results and the model's inputs

No static program holds such a node, and what follows it (a detection head's gathers after NMS) has
shapes only its data tells. An ``If`` whose branches give different shapes is such a node too; a node whose
subgraphs read a tail value from around it (AffineGrid's expansion) is after it. The head is imported and placed as any model; the tail rides on the module
(``collage.OnnxTail``), the compile driver writes it beside the program (``Manifest.tail``) and
``Program.invoke`` runs it on ``main``'s results. The model's inputs must have static shapes (a dynamic
dim is ``collage compile --dim``'s business).
"""

from __future__ import annotations

from pathlib import Path

from ..dialects.collage import OnnxTail
from .onnx_kept import graph_facts, outer_names


def split(path: Path, head_path: Path) -> OnnxTail | None:
    """Writes the head of the model at ``path`` to ``head_path`` and returns its tail; None where no node's
    output shape depends on its data, an input's shape is not static, or ONNX Runtime cannot load the tail."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    model = onnx.load(str(path))
    graph = model.graph
    types, _ = graph_facts(model)
    inputs = [v.name for v in graph.input]
    initializers = {t.name: t for t in graph.initializer}
    if not all(name in types for name in inputs if name not in initializers):
        return None
    # What each node reads: its inputs and what its subgraphs read from around it.
    reads_of = [[x for x in [*node.input, *outer_names(node)] if x] for node in graph.node]
    in_tail, given = [], set()
    for node, reads in zip(graph.node, reads_of):
        tail = any(o and o not in types for o in node.output) or any(x in given for x in reads)
        in_tail.append(tail)
        if tail:
            given |= {o for o in node.output if o}
    if not any(in_tail):
        return None
    head_nodes = [n for n, t in zip(graph.node, in_tail) if not t]
    tail_nodes = [n for n, t in zip(graph.node, in_tail) if t]
    reads = list(dict.fromkeys(x for r, t in zip(reads_of, in_tail) if t for x in r if x not in given))
    feeds = [x for x in reads if x not in initializers]
    if not all(x in types for x in feeds):
        return None
    outputs = [v.name for v in graph.output]
    head_out = [o for o in outputs if o not in given]
    head_out += [x for x in feeds if x not in inputs and x not in head_out]
    tail_out = [o for o in outputs if o in given]
    sources = tuple(("arg", inputs.index(x)) if x in inputs else ("result", head_out.index(x)) for x in feeds)
    placed = tuple(("tail", tail_out.index(o)) if o in given else ("result", head_out.index(o)) for o in outputs)

    declared = {v.name: v for v in graph.output}
    tail_graph = helper.make_graph(
        tail_nodes, f"{graph.name}_tail", [helper.make_value_info(x, types[x]) for x in feeds],
        [declared[o] for o in tail_out], initializer=[initializers[x] for x in reads if x in initializers])
    tail_model = helper.make_model(tail_graph, opset_imports=model.opset_import, functions=model.functions)
    tail_model.ir_version = model.ir_version
    data = tail_model.SerializeToString()
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001  (ORT raises its own exception types: the importer's error stands)
        return None

    del graph.node[:]
    graph.node.extend(head_nodes)
    if not head_out:  # nothing but the tail: the program hands on its first input
        graph.node.append(helper.make_node("Identity", [inputs[0]], ["collage_head_out"]))
        graph.value_info.append(helper.make_value_info("collage_head_out", types[inputs[0]]))
        head_out = ["collage_head_out"]
    del graph.output[:]
    graph.output.extend(declared[o] if o in declared else helper.make_value_info(o, types[o]) for o in head_out)
    kept_info = [v for v in graph.value_info if v.name not in given]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    onnx.save(model, str(head_path))
    return OnnxTail(data, sources, placed)
