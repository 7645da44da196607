"""ONNX nodes torch-mlir cannot lower, kept as ONNX: the rest of the model imports, and each such node runs
on an ONNX engine inside the program.

    model ──(probe: each distinct node imported alone, in a child)──► the nodes that do not import
      ──► cut: each such node removed; its inputs become extra graph outputs, its outputs extra graph inputs
      ──► torch-mlir import of the rest ──► stitch: each node back as ``stablehlo.custom_call @collage.onnx_node``
          between the values it reads and the values it gives (its one-node ONNX model in ``backend_config``)

This is how ``torch.compile``'s graph breaks and ONNX Runtime's execution-provider fallback work: what one
engine cannot take runs on another inside one program. A kept node needs static shapes for its inputs and
outputs (ONNX's shape inference; a node whose output shape depends on its data, ``NonZero`` or
``NonMaxSuppression``, cannot be kept). A node with subgraphs (``Scan``, ``If``, ``Loop``) is kept with
them: the values its bodies read from the enclosing graph (``outer_names``) become inputs of its one-node
model like its own, and the bodies read them under those names (``rename_outer``).
"""

from __future__ import annotations

import hashlib
import itertools
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..dialects import collage
from ..errors import CollageError
from ..ir import ir, new_context
from ..processes import python_command
from .onnx import import_onnx, stablehlo_bytecode


@dataclass(frozen=True)
class KeptNode:
    """A node kept as ONNX: its one-node model (inputs ``in0..``, outputs ``out0..``), which graph values
    feed those inputs (constants it reads are inside the model) and which values its outputs are."""

    label: str
    model: bytes
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def graph_facts(model) -> tuple[dict, dict]:
    """(static type of every main-graph value shape inference can tell, constant value of each initializer
    and ``Constant`` node output as a TensorProto)."""
    import onnx
    import onnx.reference
    from onnx import numpy_helper

    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001  (no types: no node can be kept)
        inferred = model
    graph = inferred.graph
    types = {}
    for v in [*graph.input, *graph.value_info, *graph.output]:
        tt = v.type.tensor_type
        if v.type.HasField("tensor_type") and tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            types[v.name] = v.type
    consts = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute) == 1:
            try:
                value = onnx.reference.ReferenceEvaluator(
                    onnx.helper.make_model(onnx.helper.make_graph([node], "c", [], [
                        onnx.helper.make_value_info(node.output[0], onnx.TypeProto())]),
                        opset_imports=model.opset_import)).run(None, {})[0]
            except Exception:  # noqa: BLE001  (kept out of the probe: the node is then not kept)
                continue
            consts[node.output[0]] = numpy_helper.from_array(value, node.output[0])
    for name, tensor in consts.items():
        types.setdefault(name, onnx.helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims)))
    return types, consts


def _subgraphs(node):
    """The graphs ``node``'s attributes hold (``If``'s branches, ``Loop``'s and ``Scan``'s bodies)."""
    import onnx

    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def _walk_outer(node, visit) -> None:
    """Calls ``visit(names, ks)`` for each node's input list and each output list in ``node``'s subgraphs
    (nested ones too) with the indices of the names read from outside the subgraph that holds them: not one
    of its inputs, initializers or values defined before (ONNX's nodes are in order; names are never
    redefined)."""
    def walk(graph, defined: frozenset[str]) -> None:
        defined = defined | {i.name for i in graph.input} | {t.name for t in graph.initializer} \
            | {t.values.name for t in graph.sparse_initializer}
        for n in graph.node:
            visit(n.input, [k for k, name in enumerate(n.input) if name and name not in defined])
            for g in _subgraphs(n):
                walk(g, defined)
            defined |= {o for o in n.output if o}
        for k, out in enumerate(graph.output):
            if out.name not in defined:
                visit(_OutputNames(graph.output), [k])

    for g in _subgraphs(node):
        walk(g, frozenset())


class _OutputNames:
    """A graph's output list seen as a list of names (``_walk_outer`` renames them in place)."""

    def __init__(self, outputs):
        self.outputs = outputs

    def __getitem__(self, k: int) -> str:
        return self.outputs[k].name

    def __setitem__(self, k: int, name: str) -> None:
        self.outputs[k].name = name


def outer_names(node) -> list[str]:
    """The values ``node``'s subgraphs read from the graph around ``node``, in order of first use."""
    found: dict[str, None] = {}

    def visit(names, ks):
        for k in ks:
            found.setdefault(names[k])

    _walk_outer(node, visit)
    return list(found)


def rename_outer(node, names: dict[str, str]) -> None:
    """Renames, in place, what ``node``'s subgraphs read from the enclosing graph by ``names`` (the names
    of a node copied into another graph: its one-node model, or the region it is inlined into)."""
    def visit(refs, ks):
        for k in ks:
            if refs[k] in names:
                refs[k] = names[refs[k]]

    _walk_outer(node, visit)


def _defined_inside(graph) -> set[str]:
    """Every name a subgraph (and the subgraphs in it) defines."""
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    for n in graph.node:
        names |= set(n.output)
        for g in _subgraphs(n):
            names |= _defined_inside(g)
    return names


def node_model(model, node, types: dict, consts: dict):
    """``node`` alone as a model (non-constant inputs ``in0..`` in order, then the values its subgraphs read
    from around it; outputs it gives ``out0..``; the constants it reads as initializers ``c0..``) and the
    graph values feeding its inputs; None where a value's type is not static (or a subgraph defines one of
    the model's own names)."""
    import onnx
    from onnx import helper

    inputs, initializers, names, feeds = [], [], [], []

    def bind(name: str) -> str | None:
        if name in consts:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(consts[name])
            tensor.name = f"c{len(initializers)}"
            initializers.append(tensor)
            return tensor.name
        if name in types:
            inputs.append(helper.make_value_info(f"in{len(inputs)}", types[name]))
            feeds.append(name)
            return inputs[-1].name
        return None

    for name in node.input:
        names.append(bind(name) if name else "")
        if names[-1] is None:
            return None
    outer = {}
    for name in outer_names(node):
        outer[name] = bind(name)
        if outer[name] is None:
            return None
    if not all(out in types for out in node.output if out):
        return None
    given = [out for out in node.output if out]  # an optional output left out stays out
    own = {i.name for i in inputs} | {t.name for t in initializers} | {f"out{k}" for k in range(len(given))}
    if any(own & _defined_inside(g) for g in _subgraphs(node)):
        return None
    outputs = [helper.make_value_info(f"out{k}", types[out]) for k, out in enumerate(given)]
    renamed = iter(f"out{k}" for k in range(len(given)))
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    del copy.input[:], copy.output[:]
    copy.input.extend(names)
    copy.output.extend(next(renamed) if out else "" for out in node.output)
    rename_outer(copy, outer)
    copy.name = copy.name or node.op_type
    one = helper.make_model(helper.make_graph([copy], node.op_type, inputs, outputs, initializer=initializers),
                            opset_imports=model.opset_import)
    one.ir_version = model.ir_version
    return one, tuple(feeds)


#: Integer kernels ONNX engines run in 8 bits, kept as ONNX wherever they appear: torch-mlir lowers
#: ``MatMulInteger`` and ``ConvInteger`` to 32-bit integer arithmetic (each 8-bit operand converted to i32, a
#: 32-bit ``dot_general``), which no engine runs on its int8 kernels and ONNX regions cannot take, so an
#: ``onnxruntime.quantization.quantize_dynamic`` model ran its matmuls in i32 on IREE between 18 ONNX
#: Runtime regions.
INTEGER_KERNELS = frozenset({"MatMulInteger", "ConvInteger"})


def integer_kernel_outputs(path: Path) -> frozenset[str]:
    """The outputs of the ``INTEGER_KERNELS`` nodes of the main graph of the ONNX model at ``path`` (none where
    it cannot be read: the import says why)."""
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # noqa: BLE001  (a missing or malformed file: protobuf and onnx raise their own types)
        return frozenset()
    return frozenset(o for n in graph.node if n.op_type in INTEGER_KERNELS for o in n.output if o)


def refused_nodes(path: Path) -> list[int]:
    """Indices of the main-graph nodes of the model at ``path`` that torch-mlir's importer refuses alone
    (each distinct node imported once, in a child process; a node that crashes the child is refused)."""
    refused: list[int] = []
    start = 0
    while True:
        with tempfile.TemporaryDirectory(prefix="collage-probe-") as tmp:
            log = Path(tmp) / "probe.log"
            proc = subprocess.run(python_command(__name__, str(path), str(start), str(log)), stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True)
            lines = log.read_text().split() if log.is_file() else []
        for word in lines:
            if word.startswith("-"):
                refused.append(int(word[1:]))
        if proc.returncode == 0:
            return refused
        started = [int(w[1:]) for w in lines if w.startswith("?")]
        if not started:  # died before probing anything: no verdict
            raise CollageError("cannot probe the ONNX model's nodes: the probe "
                               f"{' '.join(proc.stderr.split())[-200:] or 'died'}", where=str(path))
        refused.append(started[-1])  # the node it died on
        start = started[-1] + 1


#: How many nodes ``refused_in_context`` keeps at most before it gives up.
MAX_IN_CONTEXT = 4


def refused_in_context(path: Path, refused: list[int], tmp: Path, keep: frozenset[str] = frozenset()) -> list[int]:
    """``refused`` and the nodes of the model at ``path`` that torch-mlir refuses only among their neighbours
    (each imports alone; the whole does not: ONNX Runtime's inlined ``SoftmaxCrossEntropyLoss`` body), found
    by bisection on prefixes of the graph: the first node whose prefix, with the nodes kept so far cut out,
    does not import is kept too, up to ``MAX_IN_CONTEXT`` of them (nodes giving a ``keep`` output are kept
    throughout). CollageError where that does not make the model import."""
    import onnx

    model = onnx.load(str(path))
    types, _ = graph_facts(model)
    found = list(refused)
    n = len(model.graph.node)

    def imports(k: int) -> bool:
        prefix = write_prefix(model, k, types, tmp / f"prefix{k}.onnx")
        try:
            cut(prefix, [i for i in found if i < k], tmp / "cut.onnx", keep)
            import_onnx(tmp / "cut.onnx", new_context(), isolated=True)
        except CollageError:
            return False
        return True

    # The whole model with ``refused`` cut out does not import (the caller tried it): bisect, keep, retry.
    for _ in range(MAX_IN_CONTEXT):
        last = first_failing_prefix(n, imports) - 1
        if last in found:
            break
        found.append(last)
        if imports(n):
            return found
    raise CollageError("cannot import the ONNX model: keeping the nodes torch-mlir refuses among their "
                       "neighbours as ONNX does not make the rest import", where=str(path))


def first_failing_prefix(n: int, ok) -> int:
    """The least ``k`` whose prefix of ``k`` nodes fails ``ok`` (bisection: the empty prefix passes, the
    whole graph of ``n`` nodes fails); its last node is the one that breaks it."""
    lo, hi = 0, n  # the prefix of lo nodes passes, that of hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return hi


def write_prefix(model, k: int, types: dict, out: Path) -> Path:
    """Writes the model's first ``k`` nodes to ``out``, every value they give (of a static type) an output."""
    import onnx
    from onnx import helper

    prefix = onnx.ModelProto()
    prefix.CopyFrom(model)
    graph = prefix.graph
    del graph.node[k:]
    given = [o for node in graph.node for o in node.output if o and o in types]
    del graph.output[:]
    graph.output.extend(helper.make_value_info(o, types[o]) for o in given)
    onnx.save(prefix, str(out))
    return out


def _probe(path: str, start: int, log: str) -> int:
    """The child: imports each main-graph node from ``start`` alone, logging ``?i`` before node i and
    ``-i`` when it is refused (a distinct node once: its one-node model's digest)."""
    import onnx

    model = onnx.load(path)
    types, consts = graph_facts(model)
    verdicts: dict[str, bool] = {}
    with open(log, "a") as out, tempfile.TemporaryDirectory(prefix="collage-probe-") as tmp:
        for i, node in enumerate(model.graph.node):
            if i < start or node.op_type == "Constant":
                continue
            built = node_model(model, node, types, consts)
            if built is None:
                continue
            data = built[0].SerializeToString()
            digest = hashlib.sha256(data).hexdigest()
            if digest not in verdicts:
                out.write(f"?{i}\n")
                out.flush()
                one = Path(tmp) / "node.onnx"
                one.write_bytes(data)
                try:
                    stablehlo_bytecode(one, "main")
                    verdicts[digest] = True
                except CollageError:
                    verdicts[digest] = False
            if not verdicts[digest]:
                out.write(f"-{i}\n")
                out.flush()
    return 0


def cut(path: Path, refused: list[int], out: Path, keep: frozenset[str] = frozenset()) -> list[KeptNode]:
    """Writes to ``out`` the model at ``path`` without its ``refused`` nodes and those giving a ``keep``
    output: each one's non-constant inputs
    become extra graph outputs (through an ``Identity``, after the model's own), its outputs extra graph inputs
    (after the model's own); returns the kept nodes in graph order. CollageError where a refused node cannot
    be kept (a value of no static type)."""
    import onnx
    from onnx import helper

    model = onnx.load(str(path))
    graph = model.graph
    types, consts = graph_facts(model)
    kept: list[KeptNode] = []
    extra_in, extra_out, nodes = [], [], []
    for i, node in enumerate(graph.node):
        if i not in refused and not keep & set(node.output):
            nodes.append(node)
            continue
        label = f"{node.op_type}" + (f" ('{node.name}')" if node.name else "")
        built = node_model(model, node, types, consts)
        if built is None:
            raise CollageError(f"cannot import the ONNX model: torch-mlir cannot lower {label}, and it cannot run "
                               "on an ONNX engine inside the program (its shapes are not static)", where=str(path))
        one, feeds = built
        one, why = _for_onnxruntime(one)
        if why:
            raise CollageError(f"cannot import the ONNX model: torch-mlir cannot lower {label}, and ONNX Runtime "
                               f"cannot run it either ({why})", where=str(path))
        for k, name in enumerate(feeds):
            alias = f"collage_kept{len(kept)}_in{k}"
            nodes.append(helper.make_node("Identity", [name], [alias], name=alias))
            extra_out.append(helper.make_value_info(alias, types[name]))
        given = tuple(o for o in node.output if o)
        extra_in += [helper.make_value_info(o, types[o]) for o in given]
        kept.append(KeptNode(label, one.SerializeToString(), feeds, given))
    del graph.node[:]
    graph.node.extend(nodes)
    graph.input.extend(extra_in)
    graph.output.extend(extra_out)
    # Values that were a kept node's outputs are graph inputs now: their inferred types must not repeat.
    stale = {o for k in kept for o in k.outputs}
    keep_info = [v for v in graph.value_info if v.name not in stale]
    del graph.value_info[:]
    graph.value_info.extend(keep_info)
    _signed_at_boundary(graph)
    onnx.save(model, str(out))
    return kept


#: Unsigned types torch-mlir aborts on (``frontends.onnx``) → the signed type of their width. At the cut's
#: boundary a value of such a type only passes between the graph's signature and kept nodes (every node
#: computing on it is refused), so the cut declares it signed and ``stitch`` gives it its type back.
_SIGNED = {4: 5, 13: 7}  # UINT16 → INT16, UINT64 → INT64
_UNSIGNED_MLIR = {4: "ui16", 13: "ui64"}


def _signed_at_boundary(graph) -> None:
    """Declares ``_SIGNED``'s types signed on ``graph``'s inputs, outputs and value infos; drops initializers
    of those types no node reads any more (their readers are kept nodes, which hold them)."""
    for v in [*graph.input, *graph.output, *graph.value_info]:
        tt = v.type.tensor_type
        if tt.elem_type in _SIGNED:
            tt.elem_type = _SIGNED[tt.elem_type]
    read = {name for node in graph.node for name in node.input}
    unread = [t for t in graph.initializer if t.data_type in _SIGNED and t.name not in read]
    for t in unread:
        graph.initializer.remove(t)


#: How many opsets below its own a one-node model is tried at where ONNX Runtime refuses it.
OLDER_OPSETS = 4


def _for_onnxruntime(one):
    """The one-node model ONNX Runtime loads and None, or ``one`` and why ONNX Runtime cannot load it.
    Where it refuses ``one`` (ONNX's newest node tests are written at opset 28 and IR 14, newer than ONNX
    Runtime 1.31 reads), the same node converted to each of the few opsets below (ONNX's version converter;
    most new opsets only add types to an op) at the least IR version for it."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    why = ""
    for model in itertools.chain([one], _older(one)):
        try:
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            return model, None
        except Exception as exc:  # noqa: BLE001  (ORT raises its own exception types)
            why = why or " ".join(str(exc).split())[:200]
    return one, why


def _older(one):
    """``one`` converted to each of the ``OLDER_OPSETS`` opsets below its own, newest first, where ONNX's
    version converter can."""
    from onnx import helper, version_converter

    opset = next((o.version for o in one.opset_import if o.domain in ("", "ai.onnx")), None)
    for target in range(opset - 1, opset - 1 - OLDER_OPSETS, -1) if opset else ():
        try:
            older = version_converter.convert_version(one, target)
        except Exception:  # noqa: BLE001  (no adapter for this op and opset)
            continue
        older.ir_version = helper.find_min_ir_version_for(list(older.opset_import), ignore_unknown=True)
        yield older


def stitch(module: ir.Module, kept: list[KeptNode], func_name: str = "main") -> None:
    """Puts each kept node back into ``@func_name`` of the imported cut model: a ``@collage.onnx_node``
    custom call of the values the cut returned for its inputs, whose results replace the arguments that
    stood for its outputs; the extra arguments and results go, and the body is put in dataflow order."""
    func = next(op.operation for op in module.body.operations
                if op.operation.name == "func.func" and collage.symbol_name(op) == func_name)
    block = func.regions[0].blocks[0]
    ret = block.operations[len(block.operations) - 1]
    returned = list(ret.operands)
    n_in = sum(len(k.inputs) for k in kept)
    n_out = sum(len(k.outputs) for k in kept)
    first_arg, first_res = len(block.arguments) - n_out, len(returned) - n_in
    with module.context, ir.Location.unknown():
        a, r = first_arg, first_res
        for node in kept:
            args = [block.arguments[a + j] for j in range(len(node.outputs))]
            returned = list(ret.operands)  # read again: an earlier node's results replaced arguments in it
            in_types, out_types = _unsigned(node.model)
            operands = returned[r:r + len(node.inputs)]
            for k, v in enumerate(operands):
                if k in in_types and str(v.type) != str(_retyped(v.type, in_types[k])):
                    _give_back(v, _retyped(v.type, in_types[k]), block)
            with ir.InsertionPoint(ret):
                call = ir.Operation.create("stablehlo.custom_call",
                                           results=[_retyped(v.type, out_types.get(j)) for j, v in enumerate(args)],
                                           operands=operands, attributes=collage.onnx_node_attributes(node.model))
            for arg, result in zip(args, call.results):
                arg.replace_all_uses_with(result)
            a, r = a + len(node.outputs), r + len(node.inputs)
        with ir.InsertionPoint(ret):
            ir.Operation.create("func.return", operands=list(ret.operands)[:first_res])
        ret.erase()
        for index in reversed(range(first_arg, len(block.arguments))):
            block.erase_argument(index)
        ret = block.operations[len(block.operations) - 1]
        func.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
            [a.type for a in block.arguments], [v.type for v in ret.operands]))
        for name, count in (("arg_attrs", first_arg), ("res_attrs", first_res)):
            if name in func.attributes:
                func.attributes[name] = ir.ArrayAttr.get(list(ir.ArrayAttr(func.attributes[name]))[:count])
    _dataflow_order(block)


def _unsigned(model: bytes) -> tuple[dict[int, str], dict[int, str]]:
    """The positions of a one-node model's inputs and outputs of a ``_SIGNED`` type, with its MLIR name."""
    import onnx

    graph = onnx.load_from_string(model).graph

    def of(values) -> dict[int, str]:
        return {k: _UNSIGNED_MLIR[v.type.tensor_type.elem_type] for k, v in enumerate(values)
                if v.type.tensor_type.elem_type in _UNSIGNED_MLIR}

    return of([v for v in graph.input if v.name not in {t.name for t in graph.initializer}]), of(graph.output)


def _retyped(type_: ir.Type, element: str | None) -> ir.Type:
    """``type_`` (a ranked tensor) with the element type ``element``, or as it is where None."""
    if element is None:
        return type_
    return ir.RankedTensorType.get(ir.RankedTensorType(type_).shape, ir.Type.parse(element))


def _give_back(value: ir.Value, type_: ir.Type, block: ir.Block) -> None:
    """Gives an argument of ``block`` that the cut declared signed (``_SIGNED``) its unsigned ``type_``;
    it must be read by kept nodes and the return only."""
    users = [u.owner for u in value.uses]
    if not isinstance(value, ir.BlockArgument) or value.owner != block or any(
            not (collage.is_onnx_node(u) or u.name == "func.return") for u in users):
        raise CollageError(f"cannot import the ONNX model: a {type_} value reaches an op torch-mlir lowered")
    value.set_type(type_)


def _dataflow_order(block: ir.Block) -> None:
    """Moves the block's ops (its terminator last) into an order where each follows what it reads, keeping
    the given order wherever it already does (Kahn's algorithm, earliest first)."""
    import heapq

    ops = [op.operation for op in block.operations]
    body, ret = ops[:-1], ops[-1]
    index = {op: k for k, op in enumerate(body)}
    readers: dict[int, list[int]] = {k: [] for k in range(len(body))}
    waits = [0] * len(body)
    for k, op in enumerate(body):
        for p in sorted(_producers(op, index) - {k}):
            readers[p].append(k)
            waits[k] += 1
    ready = [k for k in range(len(body)) if not waits[k]]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for user in readers[k]:
            waits[user] -= 1
            if not waits[user]:
                heapq.heappush(ready, user)
    if order == list(range(len(body))):
        return
    for k in order:
        body[k].move_before(ret)


def _producers(op: ir.Operation, index: dict) -> set[int]:
    """Positions (in ``index``) of the block ops whose results ``op`` or an op nested in it reads."""
    found: set[int] = set()

    def visit(inner: ir.Operation) -> ir.WalkResult:
        for v in inner.operands:
            owner = v.owner
            if not isinstance(owner, ir.Block):
                k = index.get(owner.operation)
                if k is not None:
                    found.add(k)
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return found


if __name__ == "__main__":
    sys.exit(_probe(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
