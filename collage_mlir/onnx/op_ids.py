"""Which StableHLO ops each ONNX node computes, named in its ``doc_string`` (``collage.id 14 17``: their
``collage.id``), so an engine's per-node profile can be charged to the model's ops
(``collage_mlir.measure.profile``); kept through the simplification (``_carry_op_ids``)."""

from __future__ import annotations


#: How a node's ``doc_string`` names the StableHLO ops it computes: ``collage.id 14 17``.
OP_IDS_DOC = "collage.id"


def _ids_doc(ids) -> str:
    return " ".join([OP_IDS_DOC, *(str(i) for i in sorted(set(ids)))]) if ids else ""


def op_ids(node) -> tuple[int, ...]:
    """The ``collage.id`` of the StableHLO ops an exported ONNX node computes (none for glue the export
    added: the results' ``Identity``)."""
    words = node.doc_string.split()
    return tuple(int(w) for w in words[1:]) if words[:1] == [OP_IDS_DOC] else ()


def _carry_op_ids(original: list, graph) -> None:
    """Names in each simplified node's ``doc_string`` the ops of the translation it replaces: walking back
    from its outputs through the op-by-op graph's producers until a value the simplified graph still has
    (another node's output, a graph input, an initializer). So a ``Gemm`` that took a matmul, a scale and
    a bias add names all three, and a convolution its folded bias add; a constant folded away is charged
    to no node."""
    producer = {o: n for n in original for o in n.output}
    kept = {o for n in graph.node for o in n.output} | {i.name for i in graph.input} | {i.name for i in graph.initializer}
    for node in graph.node:
        ids: set[int] = set(op_ids(node))
        seen: set[str] = set()
        todo = [o for o in node.output if o]
        first = set(todo)
        while todo:
            name = todo.pop()
            if name in seen or (name in kept and name not in first) or name not in producer:
                continue
            seen.add(name)
            p = producer[name]
            ids.update(op_ids(p))
            todo.extend(i for i in p.input if i)
        node.doc_string = _ids_doc(ids)
