"""Simplify the ONNX graph ``translate`` (``export``) wrote op by op into what a framework's own exporter
writes, so ONNX Runtime and OpenVINO see the forms their fusions recognise.

StableHLO from torch-mlir spells everything out: batch norm is a chain of broadcast constants,
subtract, multiply and add after the convolution; relu is ``max(x, zeros)`` with a full-size zero
tensor; weights are transposed and reshaped at run time. The rewrites, repeated to a fixed point:

- constants folded: a node whose inputs are all initializers is evaluated now (onnx's reference
  evaluator) — except ``Expand``, which would only make a big constant out of a small one, and
  ``DequantizeLinear``, whose 8-bit weight the engines' int8 kernels take;
- an ``Expand`` (or a ``Reshape`` of one value) feeding a broadcasting op is dropped when broadcasting gives
  the same result shape,
  and a splat constant operand shrinks to a scalar (same rule);
- a ``Cast`` of an i64 value moves before the ``Reshape``/``Transpose`` producing it (so a graph
  input is converted where it enters: OpenVINO reads an i64 input exactly only there);
- a ``Transpose`` read only by an elementwise op moves after it (a constant operand is transposed the
  other way; two operands transposed alike share one): JAX's NHWC graphs transpose around every
  NCHW ``Conv``, and sunk transposes meet and cancel, leaving the per-channel batch norm next to its
  convolution;
- ``x * 1``, ``x + 0``, ``x - 0``, ``x / 1``, ``x and true``, ``x or false``, ``Identity``,
  reshapes to the same shape, identity transposes, chained reshapes and chained transposes collapse;
- a per-channel ``Add``/``Sub``/``Mul``/``Div`` by a constant after a ``Conv`` or ``ConvTranspose``
  with constant weights is folded into the weights and bias (batch norm, bias adds, scales);
- ``Max(x, 0)`` → ``Relu``, ``Min(Relu(x), 6)`` → ``Clip``, ``MatMul`` + bias ``Add`` → ``Gemm``,
  a 2-D ``MatMul`` of rows flattened from leading dims → a batched ``MatMul`` on the unflattened input,
  ``ReduceSum`` divided by the count it summed → ``ReduceMean``, max-subtracted exp over its sum →
  ``Softmax``, and any elementwise subgraph that computes GELU (torch-mlir writes ~30 ops of an erf
  approximation; recognised by evaluation, ``epilogue.classify``) → the erf form both engines fuse,
  and any subgraph that evaluates to a layer norm over the last axis (plus its scale and shift)
  → ``LayerNormalization``; an erf polynomial alone (a quantized GELU, split by a ``QuantizeLinear``)
  → ``Erf``;
- the forms the engines fuse into int8 kernels around ``DequantizeLinear``: a computed per-channel
  bias added after a ``Conv`` → its bias input, a ``MatMul`` rhs reshaped to ``[1, K, N]`` → the 2-D
  value, ``Gemm`` with ``transB`` on a transposed (dequantized) weight and a computed bias, an
  ``Expand`` of a constant moved past elementwise and pooling ops, ``(x * c) / c`` → ``x``, and a pool
  over the whole unpadded image → ``GlobalAveragePool``/``GlobalMaxPool``.

Every rewrite keeps each surviving value's name and shape, so the graph's outputs never change.

A ``Loop``'s body is simplified the same way, as a graph of its own; the values it reads from the
enclosing graph by name count as reads of its ``Loop`` node there (``_reads``), so nothing it needs is
pruned, renamed away or fused into something else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..activations import PROBE, classify

#: Ops whose inputs broadcast numpy-style (multidirectional broadcasting).
BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Where", "Equal", "Less",
                          "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor"})
#: Not folded: ``Expand`` would turn a small constant into a big one (``_through_expand`` moves ops past
#: it instead); ``DequantizeLinear`` of an 8-bit weight is what the engines fuse into their int8 kernels
#: (folded, the weight would be f32 again).
NO_FOLD = frozenset({"Expand", "DequantizeLinear"})


@dataclass
class _Graph:
    nodes: list
    consts: dict[str, np.ndarray]
    shapes: dict[str, tuple[int, ...]]
    outputs: set[str]
    #: ONNX element type (TensorProto number) of each value shape inference typed.
    types: dict[str, int] = field(default_factory=dict)
    #: The shapes with a symbolic dim (a dynamic translation's ``dim_param``, as a string), which ``shapes``
    #: (static, what most rules compute with) lacks: read through ``_dims_of`` where only shapes' equality
    #: matters (the subgraphs layer norm and softmax are found in).
    dims: dict[str, tuple[int | str, ...]] = field(default_factory=dict)
    count: int = field(default=0)
    #: Set in a loop body: its new constants' names must differ from the enclosing graph's.
    scope: str = ""

    def users(self, name: str) -> list:
        return [n for n in self.nodes if name in _reads(n)]

    def producer(self, name: str):
        return next((n for n in self.nodes if name in n.output), None)

    def fresh_const(self, value: np.ndarray, hint: str) -> str:
        self.count += 1
        name = f"{hint}_opt{self.scope}{self.count}"
        self.consts[name] = value
        self.shapes[name] = tuple(value.shape)
        return name

    def rename_uses(self, old: str, new: str) -> None:
        _rename(self.nodes, old, new)


def _graph_attributes(node) -> list:
    """The graphs held by ``node``'s attributes (a ``Loop``'s body)."""
    return [a.g for a in node.attribute if a.HasField("g")] + [g for a in node.attribute for g in a.graphs]


def _reads(node) -> list[str]:
    """The values ``node`` reads: its inputs, and the enclosing graph's values its subgraphs read by name."""
    inputs = [x for x in node.input if x]
    for graph in _graph_attributes(node):
        defined = {i.name for i in graph.input} | {t.name for t in graph.initializer} | \
            {o for n in graph.node for o in n.output}
        inputs += [x for n in graph.node for x in _reads(n) if x not in defined]
    return inputs


def _rename(nodes, old: str, new: str) -> None:
    """Every read of ``old`` by ``nodes`` (and the subgraphs in them) becomes a read of ``new``."""
    for n in nodes:
        for k, x in enumerate(n.input):
            if x == old:
                n.input[k] = new
        for graph in _graph_attributes(n):
            _rename(graph.node, old, new)


def optimize(model):
    """A simplified copy of the ``onnx.ModelProto`` ``model``, computing the same outputs."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    shapes, types, symbolic = {}, {}, {}
    for vi in _value_infos(inferred.graph):
        types[vi.name] = vi.type.tensor_type.elem_type
        dims = vi.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = tuple(d.dim_value for d in dims)
        elif vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") or d.dim_param for d in dims):
            symbolic[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _simplify(out.graph, shapes, types, {}, symbolic)
    return out


def _value_infos(graph) -> list:
    """The typed values of ``graph`` and of the subgraphs in it (names are unique across them)."""
    found = list(graph.value_info) + list(graph.input) + list(graph.output)
    for n in graph.node:
        for sub in _graph_attributes(n):
            found += _value_infos(sub)
    return found


def _simplify(graph, shapes: dict, types: dict, outer: dict[str, np.ndarray], dims: dict | None = None) -> None:
    """Rewrites the ``onnx.GraphProto`` ``graph`` in place to the fixed point of ``RULES``, then its loop
    bodies, which fold the enclosing graphs' constants ``outer`` they read into constants of their own."""
    from onnx import numpy_helper

    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    g = _Graph([_copy(n) for n in graph.node], {**outer, **consts},
               {**shapes, **{k: tuple(v.shape) for k, v in consts.items()}}, {o.name for o in graph.output},
               dict(types), scope=f"_{graph.name}_" if outer else "", dims=dict(dims or {}))
    while any([rule(g) for rule in RULES]):
        pass
    for n in g.nodes:
        for sub in _graph_attributes(n):
            _simplify(sub, shapes, types, {**outer, **{k: v for k, v in g.consts.items() if k not in outer}})
    _prune(g)  # the constants only a body read before folding them into its own
    own = {k: v for k, v in g.consts.items() if k not in outer}
    del graph.node[:]
    graph.node.extend(g.nodes)
    del graph.initializer[:]
    graph.initializer.extend(numpy_helper.from_array(np.require(v, requirements="C"), k) for k, v in own.items())


def _copy(node):
    import onnx

    n = onnx.NodeProto()
    n.CopyFrom(node)
    return n


def _attr(node, name, default=None):
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _fold_constants(g: _Graph) -> bool:
    from onnx.reference import ReferenceEvaluator

    changed = False
    for n in list(g.nodes):
        if n.op_type in NO_FOLD or not all(x in g.consts for x in _reads(n)) or _graph_attributes(n):
            continue
        if any(o in g.outputs for o in n.output):
            continue
        results = ReferenceEvaluator(n).run(None, {x: g.consts[x] for x in n.input if x})
        for name, value in zip(n.output, results):
            g.consts[name] = np.asarray(value)
            g.shapes[name] = tuple(np.shape(value))
        g.nodes.remove(n)
        changed = True
    return changed


def _broadcast_shape(shapes) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _drop_broadcasts(g: _Graph) -> bool:
    """Operands of broadcasting ops that only repeat a smaller tensor become that smaller tensor."""
    changed = False
    producers = {o: n for n in g.nodes for o in n.output}  # this rule rewires inputs only
    for n in g.nodes:
        if n.op_type not in BROADCASTING or n.output[0] not in g.shapes:
            continue
        for k, x in enumerate(n.input):
            others = [g.shapes.get(y) for j, y in enumerate(n.input) if j != k]
            if None in others:
                continue
            smaller = None
            p = producers.get(x)
            if p is not None and p.op_type == "Expand" and p.input[0] in g.shapes:
                smaller = p.input[0]
            elif p is not None and p.op_type == "Reshape" and p.input[0] in g.shapes and \
                    int(np.prod(g.shapes[p.input[0]])) == 1:
                # One value given the others' rank (a dynamically quantized matmul's scale product, which ONNX
                # Runtime's MatMulIntegerToFloat fusion wants straight from its Mul).
                smaller = p.input[0]
            elif x in g.consts and g.consts[x].size > 1 and np.all(g.consts[x] == g.consts[x].flat[0]):
                smaller = g.fresh_const(np.asarray(g.consts[x].flat[0], g.consts[x].dtype), "splat")
            if smaller is not None and _broadcast_shape(others + [g.shapes[smaller]]) == g.shapes[n.output[0]]:
                n.input[k] = smaller
                changed = True
    return changed


#: Nodes that only move elements: a Cast after one computes the same before it.
DATA_MOVEMENT = frozenset({"Reshape", "Transpose"})


def _hoist_casts(g: _Graph) -> bool:
    """``Cast(Reshape(x))`` → ``Reshape(Cast(x))`` for an i64 ``x`` (the Reshape read by the Cast alone)."""
    from onnx import TensorProto

    changed = False
    for cast in list(g.nodes):
        if cast.op_type != "Cast":
            continue
        p = g.producer(cast.input[0])
        if p is None or p.op_type not in DATA_MOVEMENT or g.types.get(p.input[0]) != TensorProto.INT64 or \
                p.output[0] in g.outputs or len(g.users(p.output[0])) != 1 or p.input[0] not in g.shapes:
            continue
        g.count += 1
        moved = f"{cast.output[0]}_hoisted{g.count}"
        g.shapes[moved], g.types[moved] = g.shapes[p.input[0]], _attr(cast, "to")
        cast.input[0], cast.output[0], p.input[0], p.output[0] = p.input[0], moved, moved, cast.output[0]
        g.nodes.remove(cast)
        g.nodes.insert(g.nodes.index(p), cast)
        changed = True
    return changed


def _is_splat(g: _Graph, name: str, value: float) -> bool:
    c = g.consts.get(name)
    return c is not None and c.dtype.kind == "f" and bool(np.all(c == value))


def _bypass(g: _Graph, node, source: str) -> bool:
    """Removes ``node`` whose output equals ``source``; False (kept) when its output is a graph output."""
    if node.output[0] in g.outputs:
        return False
    g.rename_uses(node.output[0], source)
    g.nodes.remove(node)
    return True


#: Elementwise ops a transpose commutes with (inputs beyond the first of ``Clip`` are scalars).
SINK_UNARY = frozenset({"Relu", "Sigmoid", "Tanh", "Exp", "Log", "Neg", "Abs", "Sqrt", "Erf", "Clip",
                        "Reciprocal", "Floor", "Ceil", "Sin", "Cos", "Not"})
SINK_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"})


def _sunk_operand(g: _Graph, name: str, perm: list[int], rank: int) -> str | None:
    """The operand that, transposed by ``perm``, equals the constant ``name`` broadcast to ``rank``."""
    c = g.consts.get(name)
    if c is None or c.ndim > rank:
        return None
    if c.ndim == 0 or c.size == 1:
        return name
    full = c.reshape((1,) * (rank - c.ndim) + c.shape)
    return g.fresh_const(np.ascontiguousarray(np.transpose(full, np.argsort(perm))), "t")


def _sink_transposes(g: _Graph) -> bool:
    from onnx import helper

    changed = False
    for n in list(g.nodes):
        if n.op_type not in SINK_UNARY | SINK_BINARY or len(n.output) != 1 or n.output[0] not in g.shapes:
            continue
        arity = 1 if n.op_type in SINK_UNARY else 2
        ts = [g.producer(x) for x in n.input[:arity]]
        moved = [t for t in ts if t is not None and t.op_type == "Transpose" and t.input[0] in g.shapes
                 and t.output[0] not in g.outputs and all(u is n for u in g.users(t.output[0]))]
        if not moved:
            continue
        perm = list(_attr(moved[0], "perm", []))
        rank = len(perm)
        if any(list(_attr(t, "perm", [])) != perm for t in moved):
            continue
        new_inputs = list(n.input)
        for k in range(arity):
            t = ts[k]
            if t is not None and any(t is m for m in moved):
                new_inputs[k] = t.input[0]
            else:
                sunk = _sunk_operand(g, n.input[k], perm, rank)
                if sunk is None:
                    break
                new_inputs[k] = sunk
        else:
            out = n.output[0]
            inner = f"{out}_sunk{g.count}"
            g.count += 1
            g.shapes[inner] = tuple(g.shapes[out][int(i)] for i in np.argsort(perm))
            if out in g.types:
                g.types[inner] = g.types[out]
            n.input[:] = new_inputs
            n.output[0] = inner
            g.nodes.insert(g.nodes.index(n) + 1, helper.make_node("Transpose", [inner], [out], perm=perm,
                                                                  name=f"{inner}_t"))
            for t in moved:
                if t in g.nodes:
                    g.nodes.remove(t)
            changed = True
    return changed


def _drop_identities(g: _Graph) -> bool:
    from onnx import helper

    changed = False
    neutral = {"Mul": 1.0, "Add": 0.0, "Sub": 0.0, "Div": 1.0}
    for n in list(g.nodes):
        out = g.shapes.get(n.output[0])
        same = None
        if n.op_type == "Identity":
            same = n.input[0]
            p = g.producer(same)
            if n.output[0] in g.outputs and p is not None and same not in g.outputs and len(g.users(same)) == 1:
                p.output[list(p.output).index(same)] = n.output[0]  # the producer writes the output itself
                g.nodes.remove(n)
                changed = True
                continue
        elif n.op_type == "Reshape" and out is not None and g.shapes.get(n.input[0]) == out:
            same = n.input[0]
        elif n.op_type == "Reshape":
            p = g.producer(n.input[0])
            if p is not None and p.op_type == "Reshape" and n.input[1] in g.consts and \
                    not np.any(g.consts[n.input[1]] <= 0):
                n.input[0] = p.input[0]
                changed = True
        elif n.op_type == "Transpose":
            perm = list(_attr(n, "perm", []))
            p = g.producer(n.input[0])
            if perm == sorted(perm):
                same = n.input[0]
            elif p is not None and p.op_type == "Transpose":  # compose: out[i] = in[inner[perm[i]]]
                inner = list(_attr(p, "perm", []))
                del n.attribute[:]
                n.attribute.extend([helper.make_attribute("perm", [inner[k] for k in perm])])
                n.input[0] = p.input[0]
                changed = True
        elif n.op_type in ("And", "Or") and len(n.input) == 2:
            for k in (0, 1):
                c = g.consts.get(n.input[k])
                if c is not None and c.dtype == np.bool_ and np.all(c == (n.op_type == "And")) and \
                        g.shapes.get(n.input[1 - k]) == out:
                    same = n.input[1 - k]
        elif n.op_type in neutral and len(n.input) == 2:
            for k in ((1,) if n.op_type in ("Sub", "Div") else (0, 1)):
                x, other = n.input[k], n.input[1 - k]
                if _is_splat(g, x, neutral[n.op_type]) and g.shapes.get(other) == out:
                    same = other
        if same is not None and _bypass(g, n, same):
            changed = True
    return changed


def _channel_vector(g: _Graph, name: str, rank: int, channels: int) -> np.ndarray | None:
    """The constant ``name`` as a per-channel vector for an N C spatial... tensor, or None."""
    c = g.consts.get(name)
    if c is None or c.ndim > rank or c.dtype.kind != "f":
        return None
    full = c.reshape((1,) * (rank - c.ndim) + c.shape)
    if any(d != 1 for i, d in enumerate(full.shape) if i != 1) or full.shape[1] not in (1, channels):
        return None
    return np.broadcast_to(full.reshape(-1), (channels,))


def _out_channels(conv, w: np.ndarray) -> tuple[int, tuple[int, ...]]:
    """A ``Conv``'s or ``ConvTranspose``'s output channels and the shape of its weights grouped so that a
    per-output-channel column (``_channel_column``) broadcasts against them."""
    if conv.op_type == "Conv":  # (out, in / groups, k...)
        return w.shape[0], w.shape
    g = _attr(conv, "group", 1)  # ConvTranspose: (in, out / groups, k...), out channel = group * (out / g) + o
    return g * w.shape[1], (g, w.shape[0] // g) + w.shape[1:]


def _channel_column(conv, v: np.ndarray, grouped: tuple[int, ...]) -> np.ndarray:
    if conv.op_type == "Conv":
        return v.reshape((-1,) + (1,) * (len(grouped) - 1))
    return v.reshape((grouped[0], 1, grouped[2]) + (1,) * (len(grouped) - 3))


def _fold_into_conv(g: _Graph) -> bool:
    changed = False
    for conv in list(g.nodes):
        if conv.op_type not in ("Conv", "ConvTranspose") or conv.output[0] in g.outputs:
            continue
        users = g.users(conv.output[0])
        if len(users) != 1 or users[0].op_type not in ("Add", "Sub", "Mul", "Div"):
            continue
        user = users[0]
        k = list(user.input).index(conv.output[0])
        # Weights computed at run time (a quantized model's DequantizeLinear): only a bias folds in.
        if conv.input[1] not in g.consts:
            if conv.op_type == "Conv" and (user.op_type == "Add" or user.op_type == "Sub" and k == 0):
                changed = _fold_bias(g, conv, user, k) or changed
            continue
        w = g.consts[conv.input[1]]
        channels, grouped = _out_channels(conv, w)
        bias = g.consts.get(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else np.zeros(channels, w.dtype)
        if bias is None:
            continue
        v = _channel_vector(g, user.input[1 - k], len(g.shapes.get(conv.output[0], ())), channels)
        if v is None or (user.op_type == "Div" and k == 1):
            continue
        col = _channel_column(conv, v, grouped)
        if user.op_type == "Add":
            bias = bias + v
        elif user.op_type == "Sub":
            w, bias = (w, bias - v) if k == 0 else (-w, v - bias)
        elif user.op_type == "Mul":
            w, bias = (w.reshape(grouped) * col).reshape(w.shape), bias * v
        else:
            w, bias = (w.reshape(grouped) / col).reshape(w.shape), bias / v
        conv.input[1] = g.fresh_const(w.astype(g.consts[conv.input[1]].dtype), "w")
        b_name = g.fresh_const(bias.astype(w.dtype), "b")
        if len(conv.input) > 2:
            conv.input[2] = b_name
        else:
            conv.input.append(b_name)
        conv.output[0] = user.output[0]
        g.nodes.remove(user)
        changed = True
    return changed


def _through_expand(g: _Graph) -> bool:
    """An elementwise op on an ``Expand`` of a small constant (its other operands constants) → an ``Expand``
    of the op's value on the small constant; a pooling of an ``Expand`` of one value → an ``Expand`` of
    that value (not where an average takes padding zeros in). (torch-mlir's average pooling divides by a count it computes at run time by pooling a
    broadcast of ones: this folds it to a constant however large the batch.)"""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    changed = False
    for n in list(g.nodes):
        out = g.shapes.get(n.output[0])
        if out is None or n.output[0] in g.outputs or len(n.output) != 1:
            continue
        expands = [(k, g.producer(x)) for k, x in enumerate(n.input) if x and x not in g.consts]
        if len(expands) != 1 or expands[0][1] is None or expands[0][1].op_type != "Expand" or \
                expands[0][1].input[0] not in g.consts:
            continue
        k, expand = expands[0]
        small = g.consts[expand.input[0]]
        if n.op_type in ("AveragePool", "MaxPool") and small.size == 1 and not _averages_padding(n):
            value = small.reshape(())
        elif n.op_type in BROADCASTING or n.op_type in SINK_UNARY:
            inputs = {x: (small if j == k else g.consts[x]) for j, x in enumerate(n.input) if x}
            value = np.asarray(ReferenceEvaluator(n).run(None, inputs)[0])
            if _broadcast_shape([value.shape, g.shapes.get(expand.output[0], ())]) != out:
                continue
        else:
            continue
        shape = g.fresh_const(np.array(out, np.int64), "shape")
        g.nodes[g.nodes.index(n)] = helper.make_node("Expand", [g.fresh_const(value, "splat"), shape], list(n.output),
                                                     name=n.name)
        changed = True
    return changed


def _averages_padding(n) -> bool:
    """Whether the pooling node ``n`` averages padding zeros in (an ``AveragePool`` with ``count_include_pad``
    and padding): its windows at the border then average a constant image to less than the constant."""
    padded = any(_attr(n, "pads", [0])) or _attr(n, "auto_pad", b"NOTSET") in (b"SAME_UPPER", b"SAME_LOWER")
    return n.op_type == "AveragePool" and bool(_attr(n, "count_include_pad", 0)) and padded


def _global_pool(g: _Graph) -> bool:
    """An ``AveragePool``/``MaxPool`` whose window is the whole unpadded image → ``GlobalAveragePool``/
    ``GlobalMaxPool`` (what frameworks export; OpenVINO's int8 pooling rounds the two forms differently)."""
    changed = False
    for n in g.nodes:
        x = g.shapes.get(n.input[0]) if n.op_type in ("AveragePool", "MaxPool") else None
        if x is None or len(n.output) != 1 or list(_attr(n, "kernel_shape", [])) != list(x[2:]) or \
                any(_attr(n, "pads", [0])) or any(d != 1 for d in _attr(n, "dilations", [1])) or \
                _attr(n, "auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID"):
            continue
        n.op_type = "Global" + n.op_type
        del n.attribute[:]
        changed = True
    return changed


def _conv_bias(g: _Graph) -> bool:
    """A bias-less ``Conv`` followed by the add of a computed per-channel vector reshaped to ``[1, C, 1...]``
    → the ``Conv``'s bias (a QDQ model's bias is ``DequantizeLinear`` of int32: the engines fuse
    ``DequantizeLinear → Conv → QuantizeLinear`` into an int8 convolution only when the bias is the
    ``Conv``'s own input)."""
    changed = False
    for conv in list(g.nodes):
        if conv.op_type != "Conv" or len(conv.input) > 2 and conv.input[2] or conv.output[0] in g.outputs:
            continue
        users = g.users(conv.output[0])
        if len(users) != 1 or users[0].op_type != "Add":
            continue
        add = users[0]
        other = add.input[1] if add.input[0] == conv.output[0] else add.input[0]
        reshape = g.producer(other)
        out = g.shapes.get(conv.output[0])
        if reshape is None or reshape.op_type != "Reshape" or out is None or \
                g.shapes.get(other) != (1, out[1]) + (1,) * (len(out) - 2) or g.shapes.get(reshape.input[0]) != (out[1],) \
                or g.shapes.get(add.output[0]) != out:
            continue
        del conv.input[2:]
        conv.input.append(reshape.input[0])
        conv.output[0] = add.output[0]
        g.nodes.remove(add)
        changed = True
    return changed


def _scale_and_unscale(g: _Graph) -> bool:
    """``(x * c) / c`` → ``x`` for a splat ``c`` (average pooling's sum translated back: the window's mean
    times its size over the count, which is that size where nothing is padded)."""
    changed = False
    for div in list(g.nodes):
        c = g.consts.get(div.input[1]) if div.op_type == "Div" else None
        mul = g.producer(div.input[0]) if c is not None else None
        if mul is None or mul.op_type != "Mul" or len(g.users(mul.output[0])) != 1 or c.size == 0 \
                or c.dtype.kind != "f" or not np.all(c == c.reshape(-1)[0]):
            continue
        k = next((k for k in (0, 1) if _is_splat(g, mul.input[k], float(c.reshape(-1)[0]))), None)
        x = None if k is None else mul.input[1 - k]
        if x is None or g.shapes.get(x) is None or g.shapes.get(x) != g.shapes.get(div.output[0]):
            continue
        if _bypass(g, div, x):
            g.nodes.remove(mul)
            changed = True
    return changed


def _fold_bias(g: _Graph, conv, user, k: int) -> bool:
    """``Conv(x, w[, b]) + v`` (or ``- v``) for a constant per-channel ``v`` → ``Conv(x, w, b ± v)``, whatever
    ``w`` is; False where ``v`` or ``b`` is not such a constant or the shapes are unknown."""
    shape = g.shapes.get(conv.output[0])
    if shape is None or len(shape) < 2:
        return False
    v = _channel_vector(g, user.input[1 - k], len(shape), shape[1])
    bias = g.consts.get(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else np.zeros(shape[1], np.float32)
    if v is None or bias is None or g.shapes.get(user.output[0]) != shape:
        return False
    name = g.fresh_const((bias + v if user.op_type == "Add" else bias - v).astype(bias.dtype), "b")
    del conv.input[2:]
    conv.input.append(name)
    conv.output[0] = user.output[0]
    g.nodes.remove(user)
    return True


def _activations(g: _Graph) -> bool:
    from onnx import helper

    changed = False
    for n in list(g.nodes):
        if n.op_type == "Max" and len(n.input) == 2:
            for k in (0, 1):
                if _is_splat(g, n.input[k], 0.0) and g.shapes.get(n.input[1 - k]) == g.shapes.get(n.output[0]):
                    g.nodes[g.nodes.index(n)] = helper.make_node("Relu", [n.input[1 - k]], list(n.output), name=n.name)
                    changed = True
                    break
        elif n.op_type == "Min" and len(n.input) == 2:
            for k in (0, 1):
                p = g.producer(n.input[1 - k])
                c = g.consts.get(n.input[k])
                if p is not None and p.op_type == "Relu" and c is not None and c.size == 1 and \
                        c.dtype.kind == "f" and len(g.users(p.output[0])) == 1 and p.output[0] not in g.outputs \
                        and g.shapes.get(p.output[0]) == g.shapes.get(n.output[0]):
                    lo = g.fresh_const(np.zeros((), c.dtype), "lo")
                    hi = g.fresh_const(c.reshape(()), "hi")
                    clip = helper.make_node("Clip", [p.input[0], lo, hi], list(n.output), name=n.name)
                    g.nodes[g.nodes.index(n)] = clip
                    g.nodes.remove(p)
                    changed = True
                    break
    return changed


def _batched_matmul(g: _Graph) -> bool:
    """``Reshape(MatMul(Reshape(a, [M, K]), b))`` → ``Reshape(MatMul(a, b))`` (a linear layer on a batch
    of rows: ONNX MatMul broadcasts over the leading dims itself)."""
    changed = False
    for mm in list(g.nodes):
        if mm.op_type != "MatMul":
            continue
        before, users = g.producer(mm.input[0]), g.users(mm.output[0])
        b = g.shapes.get(mm.input[1])
        if before is None or before.op_type != "Reshape" or len(users) != 1 or users[0].op_type != "Reshape" or \
                b is None or len(b) != 2 or mm.output[0] in g.outputs:
            continue
        a = g.shapes.get(before.input[0])
        if a is None or len(a) < 3 or a[-1] != b[0] or g.shapes.get(before.output[0]) != (int(np.prod(a[:-1])), a[-1]):
            continue
        # Only a Reshape reads the product, so its new (unflattened) shape changes nothing else; the
        # Reshape then goes when it restores exactly that shape.
        mm.input[0] = before.input[0]
        g.shapes[mm.output[0]] = a[:-1] + (b[1],)
        changed = True
    return changed


def _unbatched_rhs(g: _Graph) -> bool:
    """``MatMul(a, Reshape(w, [1, ..., K, N]))`` of a 2-D ``w`` → ``MatMul(a, w)``: ONNX's MatMul broadcasts
    the leading dims itself (torch-mlir's batched ``dot_general`` reshapes the weight; a quantized weight's
    ``DequantizeLinear`` must feed the ``MatMul`` for the engines to fuse it)."""
    changed = False
    for mm in g.nodes:
        reshape = g.producer(mm.input[1]) if mm.op_type == "MatMul" else None
        if reshape is None or reshape.op_type != "Reshape" or reshape.output[0] in g.outputs:
            continue
        w, out, a = g.shapes.get(reshape.input[0]), g.shapes.get(reshape.output[0]), g.shapes.get(mm.input[0])
        if w is None or out is None or a is None or len(w) != 2 or out[-2:] != w or any(d != 1 for d in out[:-2]) \
                or len(a) < len(out):
            continue
        mm.input[1] = reshape.input[0]
        changed = True
    return changed


def _gemm(g: _Graph) -> bool:
    """MatMul of 2-D operands followed by the add of a row-broadcast bias → Gemm."""
    from onnx import helper

    changed = False
    for mm in list(g.nodes):
        if mm.op_type != "MatMul" or mm.output[0] in g.outputs:
            continue
        a, b = (g.shapes.get(x) for x in mm.input)
        users = g.users(mm.output[0])
        if a is None or b is None or len(a) != 2 or len(b) != 2 or len(users) != 1 or users[0].op_type != "Add":
            continue
        add = users[0]
        bias = add.input[1] if add.input[0] == mm.output[0] else add.input[0]
        bshape = g.shapes.get(bias)
        if bshape is None or len(bshape) > 2 or \
                _broadcast_shape([bshape, (a[0], b[1])]) != (a[0], b[1]) or g.shapes.get(add.output[0]) != (a[0], b[1]):
            continue
        if bias in g.consts and bshape == (1, b[1]):  # a row: one axis, as ONNX Runtime's quantizer takes a bias
            bias = g.fresh_const(g.consts[bias].reshape(-1), "bias")
        elif bias not in g.consts:  # a computed bias (a QDQ model's DequantizeLinear): a row vector only
            reshape = g.producer(bias)
            if not bshape or bshape[-1] != b[1] or any(d != 1 for d in bshape[:-1]):
                continue
            if len(bshape) == 2 and reshape is not None and reshape.op_type == "Reshape" and \
                    g.shapes.get(reshape.input[0]) == (b[1],):
                bias = reshape.input[0]
        # B transposed by a Transpose only this MatMul reads: Gemm's transB (a QDQ model's weight is then
        # the DequantizeLinear the engines fuse, as their exporters write it).
        transpose = g.producer(mm.input[1])
        trans = transpose is not None and transpose.op_type == "Transpose" and \
            list(_attr(transpose, "perm", [1, 0])) == [1, 0] and len(g.users(transpose.output[0])) == 1 and \
            transpose.output[0] not in g.outputs
        rhs = transpose.input[0] if trans else mm.input[1]
        gemm = helper.make_node("Gemm", [mm.input[0], rhs, bias], list(add.output), name=add.name,
                                **({"transB": 1} if trans else {}))
        g.nodes[g.nodes.index(add)] = gemm  # where the add was: after a bias computed after the MatMul
        g.nodes.remove(mm)
        if trans:
            g.nodes.remove(transpose)
        changed = True
    return changed


def _mean(g: _Graph) -> bool:
    """ReduceSum (then maybe a Reshape) divided by the number of elements it summed → ReduceMean."""
    changed = False
    for div in list(g.nodes):
        if div.op_type != "Div" or div.input[1] not in g.consts or g.consts[div.input[1]].size != 1:
            continue
        src = g.producer(div.input[0])
        if src is not None and src.op_type == "Reshape" and len(g.users(src.output[0])) == 1:
            src = g.producer(src.input[0])  # look through a single-use reshape
        if src is None or src.op_type != "ReduceSum" or len(src.input) < 2 or src.input[1] not in g.consts or \
                len(g.users(src.output[0])) != 1 or src.input[0] not in g.shapes:
            continue
        shape = g.shapes[src.input[0]]
        count = np.prod([shape[a] for a in g.consts[src.input[1]].reshape(-1)])
        if float(g.consts[div.input[1]].reshape(())) == float(count) and _bypass(g, div, div.input[0]):
            src.op_type = "ReduceMean"
            changed = True
    return changed


def _users_index(g: _Graph) -> dict[str, list]:
    users: dict[str, list] = {}
    for n in g.nodes:
        for x in set(_reads(n)):
            users.setdefault(x, []).append(n)
    return users


def _softmax(g: _Graph) -> bool:
    """``Div(e, Reshape(ReduceSum(e)))`` with ``e = Exp(Sub(x, Reshape(ReduceMax(x))))`` over one axis (the
    maximum maybe floored at -inf, as jax writes it)."""
    from onnx import helper

    users = _users_index(g)
    changed = False

    def only(name: str, op_type: str):
        n = g.producer(name)
        ok = n is not None and n.op_type == op_type and len(users.get(n.output[0], [])) == 1 and \
            n.output[0] not in g.outputs
        return n if ok else None

    def reduced(name: str, op_type: str, x: str):
        """The reduction axis when ``name`` is Reshape(op_type(x, [axis], keepdims=0)) back to x's rank (or
        the Unsqueeze of the axis: a dynamic translation's)."""
        r = only(name, "Reshape") or only(name, "Unsqueeze")
        floor = r and only(r.input[0], "Max")  # jax's max(x, initial=-inf): a Max with -inf after the ReduceMax
        if floor and op_type == "ReduceMax" and any(_is_splat(g, i, -np.inf) for i in floor.input):
            red = only(next(i for i in floor.input if not _is_splat(g, i, -np.inf)), op_type)
        else:
            red, floor = r and only(r.input[0], op_type), None
        if not red or red.input[0] != x or len(red.input) < 2 or red.input[1] not in g.consts:
            return None
        axes = g.consts[red.input[1]].reshape(-1)
        shape = _dims_of(g, x)
        if shape is None or len(axes) != 1 or _dims_of(g, r.output[0]) != \
                tuple(1 if k == axes[0] % len(shape) else d for k, d in enumerate(shape)):
            return None
        return int(axes[0]) % len(shape), [r, red] + ([floor] if floor else [])

    for div in list(g.nodes):
        if div.op_type != "Div":
            continue
        exp = g.producer(div.input[0])
        if exp is None or exp.op_type != "Exp" or len(users.get(exp.output[0], [])) != 2 or exp.output[0] in g.outputs:
            continue
        sub = only(exp.input[0], "Sub")
        if sub is None:
            continue
        x = sub.input[0]
        total, top = reduced(div.input[1], "ReduceSum", exp.output[0]), reduced(sub.input[1], "ReduceMax", x)
        if not total or not top or total[0] != top[0]:
            continue
        for n in [exp, sub] + total[1] + top[1]:
            g.nodes.remove(n)
        g.nodes[g.nodes.index(div)] = helper.make_node("Softmax", [x], list(div.output), name=div.name, axis=top[0])
        changed = True
    return changed


#: Elementwise ONNX ops an activation subgraph may hold (single input plus scalar constants).
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Clip", "Tanh", "Erf", "Sigmoid",
                         "Exp", "Log", "Neg", "Abs", "Sqrt", "Reciprocal"})
#: erf on ``PROBE``: what an erf approximation evaluates to.
ERF = np.vectorize(math.erf)(PROBE)
#: How many nodes past a value the GELU search looks (torch-mlir's erf approximation is ~30).
WINDOW = 48


#: Ops a layer-norm subgraph may hold besides the elementwise ones.
NORMALIZING = ELEMENTWISE | {"ReduceMean", "ReduceSum", "Reshape", "Unsqueeze", "Cast", "Pow", "Relu"}  # Relu: jax clamps the variance


def _evaluate(g: _Graph, nodes: list, x: str, probe: np.ndarray, scalars: bool) -> np.ndarray | None:
    """The last node's output with ``x`` = ``probe`` (scalar constants as 0-d arrays when ``scalars``)."""
    from onnx.reference import ReferenceEvaluator

    env = {x: probe}
    try:
        with np.errstate(all="ignore"):
            for n in nodes:
                feeds = {i: env[i] if i in env else
                         (g.consts[i].astype(probe.dtype).reshape(()) if scalars else g.consts[i])
                         for i in n.input if i}
                env[n.output[0]] = ReferenceEvaluator(n).run(None, feeds)[0]
    except (KeyError, ValueError, TypeError):
        return None
    return np.asarray(env[nodes[-1].output[0]], dtype=np.float64)


def _subgraphs(g: _Graph, x: str, after: int, allowed: frozenset, users: dict, const_ok):
    """Growing sets of the nodes from ``g.nodes[after]`` on that read only ``x``, each other and constants
    (``const_ok``), yielded (as lists, graph order) whenever exactly one value leaves the set and it has
    ``x``'s shape (``x`` itself may have other readers: a residual connection's)."""
    live, taken = {x}, []
    for n in g.nodes[after:after + WINDOW]:
        ins = [i for i in n.input if i]
        if n.op_type not in allowed or not any(i in live for i in ins) or \
                not all(i in live or (i in g.consts and const_ok(g.consts[i])) for i in ins):
            continue
        taken.append(n)
        live.add(n.output[0])
        inside = {id(t) for t in taken}
        escaping = {v for v in live - {x} if v in g.outputs or any(id(u) not in inside for u in users.get(v, []))}
        if escaping == {n.output[0]} and _dims_of(g, n.output[0]) == _dims_of(g, x):
            yield list(taken)


def _replace(g: _Graph, old: list, new: list) -> None:
    """Puts ``new`` where the last of ``old`` was (it writes the same output) and drops ``old``."""
    at = g.nodes.index(old[-1])
    g.nodes[at:at + 1] = new
    for n in old[:-1]:
        g.nodes.remove(n)


#: The tanh approximation of GELU as ONNX Runtime's FastGeluFusion matches it (its second formula:
#: ``(x * 0.5) * (1 + tanh(0.7978845834732056 * (x + 0.044715 * x ** 3)))``), op by op.
GELU_TANH_OPS = ("Pow", "Mul", "Add", "Mul", "Tanh", "Add", "Mul", "Mul")


def _gelu_tanh_nodes(g: _Graph, x: str, taken: list) -> list:
    """``GELU_TANH_OPS`` computing what ``taken`` computes from ``x``, into its output."""
    from onnx import helper

    dtype = next(g.consts[i].dtype for n in taken for i in n.input if i in g.consts)
    c = {v: g.fresh_const(np.asarray(v, dtype), "gelu") for v in (3.0, 0.044715, 0.7978845834732056, 1.0, 0.5)}
    out = taken[-1].output[0]
    v = [f"{out}_gelu{j}" for j in range(7)] + [out]
    inputs = [[x, c[3.0]], [v[0], c[0.044715]], [x, v[1]], [v[2], c[0.7978845834732056]], [v[3]], [v[4], c[1.0]],
              [x, c[0.5]], [v[6], v[5]]]
    return [helper.make_node(op, ins, [v[j]], name=v[j]) for j, (op, ins) in enumerate(zip(GELU_TANH_OPS, inputs))]


def _gelu(g: _Graph) -> bool:
    """A subgraph of elementwise ops that computes GELU: the erf form → the one ORT fuses to ``Gelu``, the
    tanh approximation → the one it fuses to ``FastGelu`` (OpenVINO fuses either); an erf approximation
    alone → ``Erf``."""
    from onnx import helper

    changed = False
    users = _users_index(g)
    for x in _starts(g):
        after = _after(g, x)
        if after is None or not any(u.op_type in ELEMENTWISE for u in users.get(x, [])):
            continue
        best = erf = tanh = None
        for taken in _subgraphs(g, x, after, ELEMENTWISE, users, lambda c: c.size == 1):
            f = _evaluate(g, taken, x, PROBE, scalars=True) if len(taken) > 5 else None
            act = classify(f) if f is not None else None
            if act is not None and act.name == "gelu" and act.algorithm == "none":
                best = taken
            elif act is not None and act.name == "gelu" and act.algorithm == "tanh" and \
                    [n.op_type for n in taken] != list(GELU_TANH_OPS):
                tanh = taken
            elif best is None and f is not None and np.all(np.abs(f - ERF) <= 2e-6):
                erf = taken
        if best is None and tanh is not None:
            _replace(g, tanh, _gelu_tanh_nodes(g, x, tanh))
            users = _users_index(g)
            changed = True
            continue
        if best is None and erf is not None:
            # An erf approximation alone (a quantized GELU: a QuantizeLinear splits it after the erf) → Erf.
            _replace(g, erf, [helper.make_node("Erf", [x], [erf[-1].output[0]], name=erf[-1].output[0])])
            users = _users_index(g)
            changed = True
            continue
        if best is None:
            continue
        dtype = next(g.consts[i].dtype for n in best for i in n.input if i in g.consts)
        c = {v: g.fresh_const(np.asarray(v, dtype), "gelu") for v in (np.sqrt(2.0), 1.0, 0.5)}
        out = best[-1].output[0]
        names = [f"{out}_gelu{j}" for j in range(4)]
        _replace(g, best, [helper.make_node("Div", [x, c[np.sqrt(2.0)]], [names[0]], name=names[0]),
                           helper.make_node("Erf", [names[0]], [names[1]], name=names[1]),
                           helper.make_node("Add", [names[1], c[1.0]], [names[2]], name=names[2]),
                           helper.make_node("Mul", [x, names[2]], [names[3]], name=names[3]),
                           helper.make_node("Mul", [names[3], c[0.5]], [out], name=out)])
        users = _users_index(g)
        changed = True
    return changed


def _dims_of(g: _Graph, name: str) -> tuple | None:
    """``name``'s shape, static where known (rules keep ``shapes`` up to date as they rewrite), else with
    its symbolic dims (``_Graph.dims``)."""
    return g.shapes.get(name, g.dims.get(name))


def _starts(g: _Graph) -> list[str]:
    """The values a subgraph may start from: the graph's inputs, then each node's first output."""
    produced = {o for n in g.nodes for o in n.output}
    inputs = [i for n in g.nodes for i in _reads(n) if i and i not in produced and i not in g.consts]
    return list(dict.fromkeys(inputs)) + [n.output[0] for n in g.nodes]


def _after(g: _Graph, x: str) -> int | None:
    """Where the nodes that may read ``x`` begin: 0 for a graph input, after its producer; None once a
    rewrite removed its producer."""
    k = next((k for k, n in enumerate(g.nodes) if x in n.output), None)
    if k is not None:
        return k + 1
    return 0 if any(x in _reads(n) for n in g.nodes) else None


def _layer_norm(g: _Graph) -> bool:
    """A subgraph reading one f32 value that evaluates to its layer norm over the last axis (any
    spelling: torch-mlir computes the variance in f64), then an optional per-feature scale and shift,
    → ``LayerNormalization``. The epsilon is the scalar constant the subgraph adds that makes it match."""
    import onnx
    from onnx import helper

    changed = False
    users = _users_index(g)
    rng = np.random.default_rng(0)
    for x in _starts(g):
        shape, after = _dims_of(g, x), _after(g, x)
        if not shape or not isinstance(shape[-1], int) or after is None or g.types.get(x) != onnx.TensorProto.FLOAT \
                or not any(u.op_type in ("ReduceMean", "ReduceSum", "Cast") for u in users.get(x, [])):
            continue
        # A symbolic dim (a dynamic translation's) gets a size of its own in the probe.
        probe = (rng.standard_normal([d if isinstance(d, int) else 3 for d in shape]) * 3.0 + 1.0).astype(np.float32)
        found = None
        for taken in _subgraphs(g, x, after, NORMALIZING, users, lambda c: True):
            if not any(n.op_type in ("ReduceMean", "ReduceSum") for n in taken) or len(taken) < 5:
                continue
            f = _evaluate(g, taken, x, probe, scalars=False)
            if f is None:
                continue
            p64 = probe.astype(np.float64)
            centred = p64 - p64.mean(-1, keepdims=True)
            for eps in {float(g.consts[i].reshape(-1)[0]) for n in taken for i in n.input
                        if i in g.consts and g.consts[i].size == 1 and g.consts[i].dtype.kind == "f"}:
                want = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + eps)
                if np.allclose(f, want, rtol=1e-5, atol=1e-5):
                    found = (taken, eps)
                    break
            if found:
                break
        if found is None:
            continue
        taken, eps = found
        width = shape[-1]
        scale, bias = np.ones(width, np.float32), np.zeros(width, np.float32)
        for op_type in ("Mul", "Add"):  # the affine part, when per-feature constants follow
            after = users.get(taken[-1].output[0], [])
            if len(after) != 1 or after[0].op_type != op_type or taken[-1].output[0] in g.outputs:
                break
            other = next((i for i in after[0].input if i != taken[-1].output[0]), None)
            c = g.consts.get(other)
            if c is None or c.size != width or _dims_of(g, after[0].output[0]) != shape:
                break
            if op_type == "Mul":
                scale = c.reshape(-1).astype(np.float32)
            else:
                bias = c.reshape(-1).astype(np.float32)
            taken = taken + after
        out = taken[-1].output[0]
        _replace(g, taken, [helper.make_node("LayerNormalization", [x, g.fresh_const(scale, "ln_scale"),
                                                                     g.fresh_const(bias, "ln_bias")],
                                             [out], name=out, axis=-1, epsilon=eps)])
        users = _users_index(g)
        changed = True
    return changed


def _prune(g: _Graph) -> bool:
    """Drops nodes and initializers nothing needed reads; True when it dropped a node."""
    live = set(g.outputs)
    keep = []
    for n in reversed(g.nodes):
        if any(o in live for o in n.output):
            keep.append(n)
            live.update(_reads(n))
    changed = len(keep) != len(g.nodes)
    g.nodes[:] = reversed(keep)
    for name in [k for k in g.consts if k not in live]:
        del g.consts[name]
    return changed


#: The rewrites, in the order they are tried. Pruning first: dead readers would break the single-user
#: checks of the fusions.
RULES = (_prune, _fold_constants, _drop_broadcasts, _hoist_casts, _sink_transposes, _drop_identities,
         _fold_into_conv, _through_expand, _global_pool, _conv_bias,
         _scale_and_unscale, _activations, _batched_matmul, _unbatched_rhs, _gemm, _mean, _softmax, _gelu, _layer_norm)
