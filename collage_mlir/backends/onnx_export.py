"""Translate a region function of StableHLO into an ONNX model: one translator, two consumers
(`ort` runs the model with ONNX Runtime, `openvino` reads the same model with OpenVINO).

Every supported op maps to a few ONNX nodes (opset 18, ``ir_version`` 10 — ONNX Runtime 1.31 reads
no newer). Constants become initializers; ``dense_resource`` blobs (how torch-mlir stores weights)
are read back by printing a scratch module holding just the constants, whose resource section carries
the blobs as hex. ``OPS`` is the data table of supported ops and their constraints; the backends use
it as their single-op patterns, so an op that cannot be translated is simply not proposed.

Graph inputs are named ``in0..``, outputs ``out0..`` (in function argument / result order). Each node's
``doc_string`` names the StableHLO ops it computes (``collage.id 14 17``: their ``collage.id``, after the
simplification too, ``op_ids``), so an engine's per-node profile can be charged to the model's ops
(``collage_mlir.measure.profile``); engines ignore it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np

from ..dialects import collage
from ..dialects import stablehlo as sh
from ..errors import CollageError
from ..graph import nested_ops, producer
from ..ir import ir
from .base import BackendKind, OpSetBackend, RegionArtifact
from .patterns import Constraint, OpPattern

OPSET = 18
IR_VERSION = 10

#: MLIR element type → (numpy dtype, ONNX TensorProto data type number).
DTYPES = {
    "f32": (np.float32, 1), "f64": (np.float64, 11), "i32": (np.int32, 6), "i64": (np.int64, 7),
    "i1": (np.bool_, 9),
}
FLOATS = ("f32", "f64")


# --------------------------------------------------------------------------------------------------
# Constraints: each returns None when satisfied, else a short reason. The first docstring line is
# what `collage backends` shows.


def _types(op: ir.Operation) -> list[tuple[tuple[int, ...], str] | None]:
    return [sh.tensor_type(v) for v in list(op.operands) + list(op.results)]


def static_known_types(op: ir.Operation) -> str | None:
    """static shapes of f32, f64, i32, i64 or i1"""
    for tt in _types(op):
        if tt is None:
            return "needs static-shaped tensors"
        if tt[1] not in DTYPES:
            return f"element type {tt[1]} has no ONNX mapping here"
    return None


def float_operands(op: ir.Operation) -> str | None:
    """floating-point operands"""
    return None if all(sh.tensor_type(v)[1] in FLOATS for v in op.operands) else "needs f32/f64 operands"


def numeric_operands(op: ir.Operation) -> str | None:
    """numeric (not i1) operands"""
    return "i1 operands are not arithmetic" if any(sh.tensor_type(v)[1] == "i1" for v in op.operands) else None


def bool_operands(op: ir.Operation) -> str | None:
    """i1 operands"""
    return None if all(sh.tensor_type(v)[1] == "i1" for v in op.operands) else "logical ops on i1 only"


def readable_constant(op: ir.Operation) -> str | None:
    """dense or dense_resource value"""
    attr = op.attributes["value"] if "value" in op.attributes else None
    if attr is None:
        return "constant without value"
    if isinstance(attr, ir.DenseElementsAttr) or _is_resource(attr):
        return None
    return "constant value is neither dense nor dense_resource"


def _kernel_extent(op: ir.Operation, info: sh.ConvInfo) -> list[int]:
    """The dilated kernel size per spatial dim, ``(k - 1) * rhs_dilation + 1``."""
    ks = _shape(op.operands[1])
    return [(ks[info.rhs_layout.index(str(i))] - 1) * r + 1 for i, r in enumerate(info.rhs_dilation)]


def plain_convolution(op: ir.Operation) -> str | None:
    """1-3 spatial dims, any layout and groups; no batch groups or negative padding; lhs dilation as ConvTranspose
    (then stride 1 and padding below the dilated kernel size)"""
    try:
        info = sh.conv_info(op)
    except (ValueError, KeyError):
        return "unrecognised convolution attributes"
    if not 1 <= info.spatial_rank <= 3:
        return "needs 1 to 3 spatial dims"
    if info.batch_groups != 1:
        return "no batch groups"
    if any(lo < 0 or hi < 0 for lo, hi in info.padding):
        return "no negative padding"
    if any(d != 1 for d in info.lhs_dilation):
        if any(s != 1 for s in info.strides):
            return "input (lhs) dilation only with stride 1"
        if any(max(lo, hi) > k - 1 for (lo, hi), k in zip(info.padding, _kernel_extent(op, info))):
            return "input (lhs) dilation only with padding below the dilated kernel size"
    if "window_reversal" in op.attributes and "true" in str(op.attributes["window_reversal"]):
        return "no window reversal"
    return None


def reduce_body(op: ir.Operation) -> str | None:
    """one input; body is a single add, multiply, maximum or minimum (and/or on i1)"""
    if len(op.operands) != 2 or len(op.results) != 1:
        return "needs exactly one input and one init value"
    kind = _reduce_kind(op)
    if kind is None:
        return "body must be one add, multiply, maximum or minimum (and/or on i1)"
    if (kind in ("and", "or")) != (_dtype(op.operands[0]) == "i1"):
        return "and/or reduce i1 only; i1 reduces only with and/or"
    return None


def static_result(op: ir.Operation) -> str | None:
    """static result shape (its shape operand is then a known constant)"""
    return None if sh.tensor_type(op.results[0]) is not None else "needs a static result shape"


@dataclass(frozen=True)
class GatherInfo:
    """``stablehlo.gather`` dimension numbers."""

    offset_dims: list[int]
    collapsed_slice_dims: list[int]
    start_index_map: list[int]
    index_vector_dim: int
    batching_dims: list[int]
    slice_sizes: list[int]


def gather_info(op: ir.Operation) -> GatherInfo:
    text = str(op.attributes["dimension_numbers"])

    def dims(key: str) -> list[int]:
        m = re.search(r"\b" + key + r"\s*=\s*\[([^\]]*)\]", text)
        return sh._int_list(m.group(1)) if m else []

    m = re.search(r"index_vector_dim\s*=\s*(\d+)", text)
    return GatherInfo(dims("offset_dims"), dims("collapsed_slice_dims"), dims("start_index_map"),
                      int(m.group(1)) if m else 0, dims("operand_batching_dims"),
                      sh._array_attr(op, "slice_sizes", []))


def row_gather(op: ir.Operation) -> str | None:
    """gathers whole rows: indexed dims collapsed, other dims taken whole (anywhere in the result)"""
    try:
        g = gather_info(op)
    except (KeyError, ValueError):
        return "unrecognised gather attributes"
    operand, indices, result = _shape(op.operands[0]), _shape(op.operands[1]), _shape(op.results[0])
    if g.batching_dims:
        return "no batching dims"
    if sorted(g.collapsed_slice_dims) != sorted(g.start_index_map):
        return "every indexed dim must be collapsed (slice size 1)"
    rest = [d for d in range(len(operand)) if d not in g.start_index_map]
    if any(g.slice_sizes[d] != operand[d] for d in rest):
        return "dims not indexed must be taken whole"
    if g.index_vector_dim not in (len(indices), len(indices) - 1):
        return "the index vector must be the last indices dim (or implicit)"
    if len(g.offset_dims) != len(rest) or len(result) - len(rest) < 0:
        return "one offset dim per dim not indexed"
    return None


def plain_pad(op: ir.Operation) -> str | None:
    """non-negative edge padding, no interior padding"""
    lo = sh._array_attr(op, "edge_padding_low", [])
    hi = sh._array_attr(op, "edge_padding_high", [])
    if any(p < 0 for p in lo + hi):
        return "no negative padding"
    if any(p != 0 for p in sh._array_attr(op, "interior_padding", [])):
        return "no interior padding"
    return None


def supported_compare(op: ir.Operation) -> str | None:
    """EQ/NE/LT/LE/GT/GE (i1: EQ/NE only), not unsigned"""
    if "compare_type" in op.attributes and "UNSIGNED" in str(op.attributes["compare_type"]):
        return "no unsigned compare"
    if sh.tensor_type(op.operands[0])[1] == "i1" and _direction(op) not in ("EQ", "NE"):
        return "i1 compares only EQ/NE"
    return None if _direction(op) in COMPARE else "unknown comparison direction"


def supported_window(op: ir.Operation) -> str | None:
    """max or sum pooling (float; a sum: average pooling's form in JAX, zero init), or a running sum along
    one dim (cumulative sum, zero init)"""
    if _cumsum_axis(op) is not None and numeric_operands(op) is None:
        return None
    return float_operands(op) or pool_window(op)


def _cumsum_axis(op: ir.Operation) -> tuple[int, bool] | None:
    """``(axis, reverse)`` when the window sums everything up to (or from) each position along one
    dim: window n (the dim's size) there and 1 elsewhere, stride 1, padding (n-1, 0) or (0, n-1) of a
    zero init value. Torch's ``cumsum`` lowers to this form (GPT-2's position ids)."""
    if len(op.operands) != 2 or _reduce_kind(op) != "add":
        return None
    shape = _shape(op.operands[0])
    dims = sh._array_attr(op, "window_dimensions", [])
    strides = sh._array_attr(op, "window_strides", [1] * len(dims))
    if any(d != 1 for name in ("base_dilations", "window_dilations") for d in sh._array_attr(op, name, [])):
        return None
    axes = [a for a, d in enumerate(dims) if d != 1]
    if len(axes) != 1 or any(s != 1 for s in strides) or dims[axes[0]] != shape[axes[0]]:
        return None
    a, n = axes[0], shape[axes[0]]
    pads = _window_padding(op, len(dims))
    if any(p != (0, 0) for k, p in enumerate(pads) if k != a) or pads[a] not in ((n - 1, 0), (0, n - 1)):
        return None
    init = _constant_of(op.operands[1])
    if init is None or np.any(init != 0):
        return None
    return a, pads[a] == (0, n - 1)


def _pooled_dims(op: ir.Operation) -> list[int]:
    """The dims a window op pools over: window > 1, a stride or padding; the others (window 1, stride
    1, no padding: batch and channel, wherever the layout puts them) are independent rows."""
    dims = sh._array_attr(op, "window_dimensions", [])
    strides = sh._array_attr(op, "window_strides", [1] * len(dims))
    pads = _window_padding(op, len(dims))
    return [a for a, (d, st, p) in enumerate(zip(dims, strides, pads)) if d != 1 or st != 1 or p != (0, 0)]


def pool_window(op: ir.Operation) -> str | None:
    """max or sum over 1-3 dims of any layout (NCHW, JAX's NHWC...), no dilation"""
    kind = _reduce_kind(op)
    if len(op.operands) != 2 or kind not in ("max", "add"):
        return "only one-input max or sum windows (max pooling, average pooling's sum)"
    for name in ("base_dilations", "window_dilations"):
        if any(d != 1 for d in sh._array_attr(op, name, [])):
            return "no dilation"
    pooled = _pooled_dims(op)
    if not 1 <= len(pooled) <= 3:
        return f"the window must pool 1-3 dims (it pools {len(pooled)})"
    pads = _window_padding(op, len(sh._array_attr(op, "window_dimensions", [])))
    if any(lo < 0 or hi < 0 for lo, hi in pads):
        return "padding must be non-negative"
    init = _constant_of(op.operands[1])
    if kind == "add" and (init is None or np.any(init != 0)):
        return "sum pooling needs a zero init value"
    if kind == "max" and any(p != (0, 0) for p in pads):
        if init is None or not (np.isneginf(init).all() or (init == np.finfo(init.dtype).min).all()):
            return "padded max pooling needs a -inf init value"
    return None


# --------------------------------------------------------------------------------------------------
# The ONNX graph under construction.


class _Builder:
    def __init__(self, ties_by_index: bool = True):
        from onnx import helper

        self.helper = helper
        self.nodes: list = []
        self.initializers: list = []
        self.count = 0
        self.constants: dict = {}
        #: The ONNX name of each StableHLO value translated so far (in scope: a loop body sees its graph's).
        self.names: dict[ir.Value, str] = {}
        #: Whether the engine's ``TopK`` keeps the lower index first among equal values, as ONNX specifies
        #: (ONNX Runtime does; OpenVINO does not, and gets a second, tie-breaking ``TopK``: ``_ordered_top_k``).
        self.ties_by_index = ties_by_index
        #: The ``collage.id`` of the op being translated (a nested op's: its numbered ancestor's).
        self.op_id: int | None = None

    def fresh(self, hint: str = "t") -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def node(self, op_type: str, inputs: list[str], **attrs) -> str:
        """Adds a node; its (only) output's name."""
        (out,) = self.multi_node(op_type, inputs, 1, **attrs)
        return out

    def multi_node(self, op_type: str, inputs: list[str], n_out: int, also: tuple[int, ...] = (), **attrs) -> list[str]:
        """Adds a node with ``n_out`` outputs; their names. ``also``: the ids of other ops the node computes
        (beside the op being translated), for the profiles that charge a node's time to ops."""
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(self.helper.make_node(op_type, inputs, outs, name=outs[0], doc_string=_ids_doc(
            (*(() if self.op_id is None else (self.op_id,)), *also)), **attrs))
        return outs

    def const(self, value: np.ndarray, hint: str = "c") -> str:
        from onnx import numpy_helper

        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.require(value, requirements="C"), name))  # keeps rank 0
        return name

    def ints(self, values, hint: str = "shape") -> str:
        return self.const(np.asarray(list(values), dtype=np.int64), hint)

    def transpose(self, x: str, perm: list[int]) -> str:
        return x if perm == sorted(perm) else self.node("Transpose", [x], perm=list(perm))

    def reshape(self, x: str, shape, current=None) -> str:
        if current is not None and tuple(current) == tuple(shape):
            return x
        return self.node("Reshape", [x, self.ints(shape)])

    def graph(self, name: str, inputs: list[tuple[str, str, list[int]]],
              build: Callable[[], list[tuple[str, str, list[int]]]]):
        """An ONNX subgraph (a ``Loop`` body) that ``build`` fills in a scope of its own: its nodes and
        constants are its own, it reads this graph's values by name (outer-scope references), and the
        names it gives StableHLO values are forgotten after it. ``inputs`` and what ``build`` returns are
        (name, element type, shape) of its inputs and outputs (each output written by an ``Identity``)."""
        helper = self.helper
        saved = self.nodes, self.initializers, dict(self.names)
        self.nodes, self.initializers = [], []
        try:
            outputs = []
            for value, dtype, shape in build():
                out = self.node("Identity", [value])
                outputs.append(helper.make_tensor_value_info(out, DTYPES[dtype][1], shape))
            return helper.make_graph(self.nodes, name, [helper.make_tensor_value_info(n, DTYPES[d][1], s)
                                                        for n, d, s in inputs], outputs, initializer=self.initializers)
        finally:
            self.nodes, self.initializers, self.names = saved


# --------------------------------------------------------------------------------------------------
# Op translations: (builder, op, operand names) -> result names.


def _shape(v: ir.Value) -> list[int]:
    return list(sh.tensor_type(v)[0])


def _dtype(v: ir.Value) -> str:
    return sh.tensor_type(v)[1]


def _int_attr(op: ir.Operation, name: str) -> int:
    return ir.IntegerAttr(op.attributes[name]).value


def _is_resource(attr: ir.Attribute) -> bool:
    try:
        ir.DenseResourceElementsAttr(attr)
        return True
    except (ValueError, TypeError):
        return False


def _constant_of(v: ir.Value) -> np.ndarray | None:
    """The value of ``v`` where it is a constant expression (JAX broadcasts its scalar inits), else None."""
    return sh.const_expr_value(v)


def _reduce_kind(op: ir.Operation) -> str | None:
    body = op.regions[0].blocks[0] if op.regions and len(op.regions[0].blocks) else None
    if body is None:
        return None
    ops = [o.operation for o in body.operations]
    if len(ops) != 2 or ops[1].name != "stablehlo.return":
        return None
    args = list(body.arguments)
    if not all(any(x == a for a in args) for x in ops[0].operands) or len(ops[0].operands) != 2:
        return None
    return {"stablehlo.add": "add", "stablehlo.multiply": "mul", "stablehlo.maximum": "max",
            "stablehlo.minimum": "min", "stablehlo.and": "and", "stablehlo.or": "or"}.get(ops[0].name)


def _window_padding(op: ir.Operation, rank: int) -> list[tuple[int, int]]:
    if "padding" not in op.attributes:
        return [(0, 0)] * rank
    flat = sh._int_list(str(op.attributes["padding"]).split(":")[0])
    if len(flat) == 1:
        flat = flat * (2 * rank)
    return [(flat[2 * i], flat[2 * i + 1]) for i in range(rank)]


def _direction(op: ir.Operation) -> str:
    return sh.comparison(op)[0]


BINARY = {"stablehlo.add": "Add", "stablehlo.subtract": "Sub", "stablehlo.multiply": "Mul",
          "stablehlo.divide": "Div", "stablehlo.maximum": "Max", "stablehlo.minimum": "Min",
          "stablehlo.power": "Pow"}
LOGICAL = {"stablehlo.and": "And", "stablehlo.or": "Or", "stablehlo.xor": "Xor"}
UNARY = {"stablehlo.negate": "Neg", "stablehlo.abs": "Abs", "stablehlo.exponential": "Exp",
         "stablehlo.log": "Log", "stablehlo.sqrt": "Sqrt", "stablehlo.tanh": "Tanh",
         "stablehlo.logistic": "Sigmoid", "stablehlo.floor": "Floor", "stablehlo.ceil": "Ceil",
         "stablehlo.sine": "Sin", "stablehlo.cosine": "Cos"}
COMPARE = {"EQ": "Equal", "LT": "Less", "LE": "LessOrEqual", "GT": "Greater", "GE": "GreaterOrEqual", "NE": None}
# and/or over i1 reduce as min/max over 0/1 (ONNX has no boolean reductions).
REDUCE = {"add": "ReduceSum", "mul": "ReduceProd", "max": "ReduceMax", "min": "ReduceMin",
          "and": "ReduceMin", "or": "ReduceMax"}
COMBINE = {"add": "Add", "mul": "Mul", "max": "Max", "min": "Min", "and": "And", "or": "Or"}
IDENTITY = {"add": 0, "mul": 1, "max": -np.inf, "min": np.inf, "and": True, "or": False}


def _binary(b: _Builder, op, ins):
    return [b.node(BINARY[op.name], ins)]


def _remainder(b: _Builder, op, ins):
    """``stablehlo.remainder`` truncates (the result takes the dividend's sign, C's fmod): ONNX ``Mod`` with
    ``fmod=1``, for integers and floats alike."""
    return [b.node("Mod", ins, fmod=1)]


def _logical(b: _Builder, op, ins):
    return [b.node(LOGICAL[op.name], ins)]


def _not(b: _Builder, op, ins):
    return [b.node("Not", ins)]


def _unary(b: _Builder, op, ins):
    return [b.node(UNARY[op.name], ins)]


def _square(b: _Builder, op, ins):
    return [b.node("Mul", [ins[0], ins[0]])]


def _erf(b: _Builder, op, ins):
    return [b.node("Erf", ins)]


def _erfc(b: _Builder, op, ins):
    """1 - erf(x): exact to f32's absolute precision (JAX's exact GELU is x * erfc(-x / sqrt 2) / 2)."""
    one = b.const(np.ones((), DTYPES[_dtype(op.results[0])][0]), "one")
    return [b.node("Sub", [one, b.node("Erf", ins)])]


def _top_k(b: _Builder, op, ins):
    """ONNX ``TopK`` on the last axis, largest first; ties keep the lower index first, as
    ``chlo.top_k`` (``_ordered_top_k``)."""
    shape = _shape(op.operands[0])
    values, indices = _ordered_top_k(b, ins[0], shape, len(shape) - 1, _int_attr(op, "k"), largest=True)
    return [values, b.node("Cast", [indices], to=DTYPES[_dtype(op.results[1])][1])]


#: The longest dim ``_ordered_top_k`` breaks ties along on an engine whose TopK does not: its second key
#: (run * n + index < n * (n + 1)) must fit the 32 bits OpenVINO computes i64 in.
TIE_BREAK_MAX = 46340


def _ordered_top_k(b: _Builder, x: str, shape: list[int], axis: int, k: int, largest: bool) -> tuple[str, str]:
    """The ``k`` largest (or smallest) values of ``x`` along ``axis`` in order and their i64 indices, equal
    values in index order (StableHLO's stable sort, ``chlo.top_k``'s tie rule). ONNX specifies this of
    ``TopK``; where the engine does not keep it (``_Builder.ties_by_index``), the whole dim is sorted, then
    sorted again by (run of equal values, index), a key without ties, and the first ``k`` taken."""
    n = shape[axis]
    if b.ties_by_index or n == 1:
        v, i = b.multi_node("TopK", [x, b.ints([k], "k")], 2, axis=axis, largest=int(largest), sorted=1)
        return v, i
    v, i = b.multi_node("TopK", [x, b.ints([n], "k")], 2, axis=axis, largest=int(largest), sorted=1)
    later, earlier = ([b.node("Slice", [v, b.ints([lo]), b.ints([hi]), b.ints([axis])])
                       for lo, hi in ((1, n), (0, n - 1))])
    starts = b.node("Cast", [b.node("Not", [b.node("Equal", [later, earlier])])], to=DTYPES["i64"][1])
    first = [1 if d == axis else s for d, s in enumerate(shape)]
    run = b.node("CumSum", [b.node("Concat", [b.const(np.zeros(first, np.int64), "run0"), starts], axis=axis),
                            b.const(np.int64(axis), "axis")])
    key = b.node("Add", [b.node("Mul", [run, b.const(np.int64(n), "n")]), i])
    _, j = b.multi_node("TopK", [key, b.ints([k], "k")], 2, axis=axis, largest=0, sorted=1)
    return b.node("GatherElements", [v, j], axis=axis), b.node("GatherElements", [i, j], axis=axis)


def _rsqrt(b: _Builder, op, ins):
    return [b.node("Reciprocal", [b.node("Sqrt", ins)])]


def _compare(b: _Builder, op, ins):
    d = _direction(op)
    if d == "NE":
        return [b.node("Not", [b.node("Equal", ins)])]
    return [b.node(COMPARE[d], ins)]


def _select(b: _Builder, op, ins):
    return [b.node("Where", ins)]


def _convert(b: _Builder, op, ins):
    return [b.node("Cast", ins, to=DTYPES[_dtype(op.results[0])][1])]


def _clamp(b: _Builder, op, ins):
    lo, x, hi = ins
    return [b.node("Min", [b.node("Max", [x, lo]), hi])]


def _constant(b: _Builder, op, ins):
    value = b.constants.get(op.results[0])
    if value is None:
        raise CollageError(f"{op.location}: cannot read the value of this constant")
    return [b.const(value.astype(DTYPES[_dtype(op.results[0])][0]).reshape(_shape(op.results[0])), "const")]


def _iota(b: _Builder, op, ins):
    shape = _shape(op.results[0])
    dim = _int_attr(op, "iota_dimension")
    view = [1] * len(shape)
    view[dim] = shape[dim]
    value = np.broadcast_to(np.arange(shape[dim]).reshape(view), shape)
    return [b.const(value.astype(DTYPES[_dtype(op.results[0])][0]), "iota")]


#: Indices below this are exact in f32: i64 indices are clamped in f32 when every indexed dim is this short.
F32_EXACT = 2 ** 24


def _gather(b: _Builder, op, ins):
    g = gather_info(op)
    operand, indices = _shape(op.operands[0]), _shape(op.operands[1])
    k = len(g.start_index_map)
    # StableHLO clamps start indices into range; ONNX would read out of bounds (or wrap negatives).
    hi = [operand[d] - 1 for d in g.start_index_map]
    idx = ins[1]
    if _dtype(op.operands[1]) == "i64" and k == 1 and max(hi) < F32_EXACT:
        # Clamped in f32 straight from the i64 value: OpenVINO computes i64 in 32 bits (an id of 2**32 + 5
        # would wrap to 5) but converts an i64 input to float exactly; rounding is monotonic and every
        # bound is exact in f32, so the clamp is StableHLO's. The clamped index fits i32.
        idx = b.node("Cast", [idx], to=DTYPES["f32"][1])
        idx = b.node("Min", [b.node("Max", [idx, b.const(np.float32(0), "lo")]), b.const(np.float32(hi[0]), "hi")])
        idx = b.node("Cast", [idx], to=DTYPES["i32"][1])
    else:
        idx = b.node("Cast", [idx], to=DTYPES["i64"][1]) if _dtype(op.operands[1]) != "i64" else idx
        idx = b.node("Min", [b.node("Max", [idx, b.ints([0])]), b.const(np.asarray(hi, np.int64), "hi")])
    if g.index_vector_dim == len(indices):
        indices = indices + [1]
        idx = b.reshape(idx, indices)
    rest = [d for d in range(len(operand)) if d not in g.start_index_map]
    x = b.transpose(ins[0], g.start_index_map + rest)
    if k == 1:  # a row lookup (embeddings): Gather, which every engine has a fast kernel for
        y = b.node("Gather", [x, b.reshape(idx, indices[:-1], indices)], axis=0)
    else:
        y = b.node("GatherND", [x, idx])
    # y is (index batch dims..., rest...); the result puts rest at offset_dims, batch dims in the others
    # (JAX's take_along_axis keeps a leading dim of size 1 as an offset dim).
    rank = len(_shape(op.results[0]))
    batch_pos = [p for p in range(rank) if p not in g.offset_dims]
    perm = [rank - len(rest) + g.offset_dims.index(p) if p in g.offset_dims else batch_pos.index(p)
            for p in range(rank)]
    return [b.transpose(y, perm)]


def _reshape(b: _Builder, op, ins):
    return [b.reshape(ins[0], _shape(op.results[0]))]


def _transpose(b: _Builder, op, ins):
    return [b.node("Transpose", ins, perm=sh.permutation(op))]


def _broadcast(b: _Builder, op, ins):
    dims = sh.broadcast_dims(op)
    src = _shape(op.operands[0])
    out = _shape(op.results[0])
    x = ins[0]
    order = sorted(range(len(dims)), key=lambda k: dims[k])
    x = b.transpose(x, order)
    view = [1] * len(out)
    for k in order:
        view[dims[k]] = src[k]
    x = b.reshape(x, view, [src[k] for k in order])
    if view != out:
        x = b.node("Expand", [x, b.ints(out)])
    elif x == ins[0]:
        x = b.node("Identity", [x])
    return [x]


def _concatenate(b: _Builder, op, ins):
    return [b.node("Concat", ins, axis=_int_attr(op, "dimension"))]


def _slice(b: _Builder, op, ins):
    starts = sh._array_attr(op, "start_indices", [])
    ends = sh._array_attr(op, "limit_indices", [])
    steps = sh._array_attr(op, "strides", [1] * len(starts))
    return [b.node("Slice", [ins[0], b.ints(starts), b.ints(ends), b.ints(range(len(starts))), b.ints(steps)])]


def _clamped_starts(b: _Builder, starts: list[str], dtype: str, hi: list[int]) -> str:
    """The rank-0 start indices ``starts`` as one i64 vector, each clamped into ``[0, hi]`` as StableHLO
    clamps dynamic slice starts."""
    parts = [b.reshape(s if dtype == "i64" else b.node("Cast", [s], to=DTYPES["i64"][1]), [1]) for s in starts]
    v = b.node("Concat", parts, axis=0) if len(parts) > 1 else parts[0]
    return b.node("Min", [b.node("Max", [v, b.ints([0] * len(hi), "lo")]), b.ints(hi, "hi")])


def _dynamic_slice(b: _Builder, op, ins):
    """``Slice`` from the clamped run-time starts (JAX's ``lax.scan`` reads step ``i`` of its inputs so)."""
    shape, sizes = _shape(op.operands[0]), sh._array_attr(op, "slice_sizes", [])
    start = _clamped_starts(b, ins[1:], _dtype(op.operands[1]), [d - z for d, z in zip(shape, sizes)])
    end = b.node("Add", [start, b.ints(sizes, "sizes")])
    return [b.node("Slice", [ins[0], start, end, b.ints(range(len(shape)), "axes")])]


def _dynamic_update_slice(b: _Builder, op, ins):
    """``ScatterND`` of the update at the clamped run-time starts (``lax.scan`` writes step ``i`` of its
    outputs so). Dims from the last one the update does not cover whole onward are written as slices, so
    the index grid only spans the leading dims (one index for a scan's step)."""
    shape, update = _shape(op.operands[0]), _shape(op.operands[1])
    p = max((d + 1 for d in range(len(shape)) if update[d] != shape[d]), default=0)
    if p == 0:  # the update is the whole operand
        return [b.node("Identity", [ins[1]])]
    start = _clamped_starts(b, ins[2:2 + p], _dtype(op.operands[2]), [d - u for d, u in zip(shape[:p], update[:p])])
    grid = np.moveaxis(np.indices(update[:p], dtype=np.int64), 0, -1)
    return [b.node("ScatterND", [ins[0], b.node("Add", [b.const(grid, "grid"), start]), ins[1]])]


def _pad(b: _Builder, op, ins):
    lo = sh._array_attr(op, "edge_padding_low", [])
    hi = sh._array_attr(op, "edge_padding_high", [])
    value = b.reshape(ins[1], [], _shape(op.operands[1]))
    return [b.node("Pad", [ins[0], b.ints(lo + hi), value], mode="constant")]


def _reduce(b: _Builder, op, ins):
    kind = _reduce_kind(op)
    dims = sh._array_attr(op, "dimensions", [])
    x = ins[0]
    if dims and kind in ("and", "or"):
        x = b.node(REDUCE[kind], [b.node("Cast", [x], to=DTYPES["i32"][1]), b.ints(dims)], keepdims=0)
        x = b.node("Cast", [x], to=DTYPES["i1"][1])
    elif dims:
        x = b.node(REDUCE[kind], [x, b.ints(dims)], keepdims=0)
    # Fold the init value in (exact for the usual identities 0, 1, ±inf; right for any other).
    init = _constant_of(op.operands[1])
    if init is None or not dims or not np.all(init == IDENTITY[kind]):
        x = b.node(COMBINE[kind], [x, ins[1]])
    return [x]


def _reduce_window(b: _Builder, op, ins):
    cumsum = _cumsum_axis(op)
    if cumsum is not None:
        return [b.node("CumSum", [ins[0], b.const(np.int64(cumsum[0]), "axis")], reverse=int(cumsum[1]))]
    return _pool(b, op, ins)


def _pool(b: _Builder, op, ins):
    """ONNX ``MaxPool``, or for a sum ``AveragePool`` counting the (zero) padding times the window's size,
    over the pooled dims (``_pooled_dims``) moved last; the other dims are moved first and, unless they are
    exactly two (batch, channel), merged into ``[1, rows]``."""
    dims = sh._array_attr(op, "window_dimensions", [])
    rank = len(dims)
    strides = sh._array_attr(op, "window_strides", [1] * rank)
    pads = _window_padding(op, rank)
    shape, out_shape = _shape(op.operands[0]), _shape(op.results[0])
    pooled = _pooled_dims(op)
    free = [a for a in range(rank) if a not in pooled]
    perm = free + pooled
    x = b.transpose(ins[0], perm)
    rows = [shape[a] for a in free]
    if len(free) != 2:
        x = b.reshape(x, [1, int(np.prod(rows, dtype=np.int64))] + [shape[a] for a in pooled])
    window = dict(kernel_shape=[dims[a] for a in pooled], strides=[strides[a] for a in pooled],
                  pads=[pads[a][0] for a in pooled] + [pads[a][1] for a in pooled])
    if _reduce_kind(op) == "add":
        y = b.node("AveragePool", [x], count_include_pad=1, **window)
        size = np.asarray(np.prod([dims[a] for a in pooled]), dtype=DTYPES[_dtype(op.operands[0])][0])
        y = b.node("Mul", [y, b.const(size, "window")])
    else:
        y = b.node("MaxPool", [x], **window)
    if len(free) != 2:
        y = b.reshape(y, rows + [out_shape[a] for a in pooled])
    y = b.transpose(y, [perm.index(a) for a in range(rank)])
    init = _constant_of(op.operands[1])
    if _reduce_kind(op) == "max" and (
            init is None or not (np.isneginf(init).all() or (init == np.finfo(init.dtype).min).all())):
        y = b.node("Max", [y, ins[1]])
    return [y]


def _reverse(b: _Builder, op, ins):
    dims = sh._array_attr(op, "dimensions", [])
    return [_flip(b, ins[0], dims, _shape(op.operands[0]))]


def _flip(b: _Builder, x: str, axes: list[int], shape: list[int]) -> str:
    """``x`` (of ``shape``) reversed along ``axes``: a Slice with step -1 (ONNX has no reverse op), ending
    one before the first element (not at INT64_MIN: OpenVINO's i64 constants must fit 32 bits)."""
    n = len(axes)
    return b.node("Slice", [x, b.ints([-1] * n), b.ints([-shape[a] - 1 for a in axes]), b.ints(axes), b.ints([-1] * n)])


def _convolution(b: _Builder, op, ins):
    info = sh.conv_info(op)
    n = info.spatial_rank
    spatial = "".join(str(i) for i in range(n))
    x = b.transpose(ins[0], [info.lhs_layout.index(c) for c in "bf" + spatial])
    w = b.transpose(ins[1], [info.rhs_layout.index(c) for c in "oi" + spatial])
    kernel = [_shape(op.operands[1])[info.rhs_layout.index(c)] for c in spatial]
    if any(d != 1 for d in info.lhs_dilation):
        y = _transposed_convolution(b, op, info, x, w, kernel)
    else:
        y = b.node("Conv", [x, w], group=info.feature_groups, strides=info.strides, dilations=info.rhs_dilation,
                   pads=[lo for lo, _ in info.padding] + [hi for _, hi in info.padding], kernel_shape=kernel)
    return [b.transpose(y, [("bf" + spatial).index(c) for c in info.out_layout])]


def _transposed_convolution(b: _Builder, op, info: sh.ConvInfo, x: str, w: str, kernel: list[int]) -> str:
    """A stride-1 convolution of the input dilated by ``lhs_dilation`` (how torch lowers ConvTranspose,
    after flipping its kernel) as ONNX ``ConvTranspose``: stride = the input dilation, the kernel flipped
    back and laid out (in, out / groups, spatial...), each pad ``extent - 1 - pad`` (the constraint keeps
    it non-negative). A flip of a constant kernel, and torch's own flip before it, fold at build time."""
    o, i_g = (_shape(op.operands[1])[info.rhs_layout.index(c)] for c in "oi")
    g, n = info.feature_groups, info.spatial_rank
    w = b.reshape(w, [g, o // g, i_g] + kernel, [o, i_g] + kernel)
    w = b.transpose(w, [0, 2, 1] + list(range(3, 3 + n)))
    w = b.reshape(w, [g * i_g, o // g] + kernel, [g, i_g, o // g] + kernel)
    w = _flip(b, w, list(range(2, 2 + n)), [g * i_g, o // g] + kernel)
    extent = _kernel_extent(op, info)
    pads = [k - 1 - lo for (lo, _), k in zip(info.padding, extent)] + \
        [k - 1 - hi for (_, hi), k in zip(info.padding, extent)]
    return b.node("ConvTranspose", [x, w], group=g, strides=info.lhs_dilation, dilations=info.rhs_dilation,
                  pads=pads, kernel_shape=kernel)


def _dot_general(b: _Builder, op, ins):
    d = sh.dot_info(op)
    ls, rs = _shape(op.operands[0]), _shape(op.operands[1])
    lfree = [i for i in range(len(ls)) if i not in d.lhs_batch + d.lhs_contract]
    rfree = [i for i in range(len(rs)) if i not in d.rhs_batch + d.rhs_contract]
    batch = [ls[i] for i in d.lhs_batch]
    m = int(np.prod([ls[i] for i in lfree], dtype=np.int64))
    k = int(np.prod([ls[i] for i in d.lhs_contract], dtype=np.int64))
    n = int(np.prod([rs[i] for i in rfree], dtype=np.int64))
    lperm = d.lhs_batch + lfree + d.lhs_contract
    rperm = d.rhs_batch + d.rhs_contract + rfree
    a = b.transpose(ins[0], lperm)
    a = b.reshape(a, batch + [m, k], [ls[i] for i in lperm])
    c = b.transpose(ins[1], rperm)
    c = b.reshape(c, batch + [k, n], [rs[i] for i in rperm])
    y = b.node("MatMul", [a, c])
    return [b.reshape(y, _shape(op.results[0]), batch + [m, n])]


# --------------------------------------------------------------------------------------------------
# Ops with regions: ``stablehlo.while`` → ``Loop`` (its body a subgraph), ``stablehlo.sort`` → ``TopK``.


def _translate_ops(b: _Builder, ops: list[ir.Operation]) -> None:
    """Translates ``ops`` in order into ``b``, naming their results in ``b.names``; an op without a
    translation, or failing its constraints, is one CollageError naming it."""
    for op in ops:
        spec = OPS.get(op.name)
        why = f"{op.name} has no ONNX translation" if spec is None else \
            next((r for r in (c(op) for c in spec.when) if r), None)
        if why:
            raise CollageError(f"{op.location}: cannot export to ONNX: {why}")
        outer, oid = b.op_id, collage.op_id(op)
        b.op_id = outer if oid is None else oid
        try:
            for r, name in zip(op.results, spec.translate(b, op, [b.names[v] for v in op.operands])):
                b.names[r] = name
        finally:
            b.op_id = outer


def _block_results(b: _Builder, block: ir.Block, args: list[str]) -> list[str]:
    """The names of what ``block`` returns, its arguments named ``args``, its ops translated into ``b``."""
    for arg, name in zip(block.arguments, args):
        b.names[arg] = name
    _translate_ops(b, sh.block_ops(block))
    return [b.names[v] for v in sh.returned(block)]


@dataclass(frozen=True)
class LoopForm:
    """A ``stablehlo.while`` as an ONNX ``Loop``: which carried values the body changes (ONNX loop-carried
    values; the others, JAX's weights, are read from outside the body) and, when the loop counts, its
    counter: a carried integer the body adds 1 to while ``cond`` is ``counter < limit`` (JAX's ``scan`` and
    ``fori_loop``), which gives the trip count. Without one, the cond region is translated as the
    ``Loop``'s condition (once before the loop, once at the end of the body)."""

    changed: tuple[int, ...]
    counter: int | None
    limit: ir.Value | None


def loop_form(op: ir.Operation) -> LoopForm:
    cond, body = op.regions[0].blocks[0], op.regions[1].blocks[0]
    back = sh.returned(body)
    changed = tuple(k for k, v in enumerate(back) if sh.block_argument(v, body) != k)
    test = sh.returned(cond)[0].owner
    if isinstance(test, ir.Block) or test.operation.name != "stablehlo.compare":
        return LoopForm(changed, None, None)
    test = test.operation
    direction, kind = sh.comparison(test)
    lhs, rhs = test.operands
    if direction == "GT":
        lhs, rhs = rhs, lhs
    counter, bound = sh.block_argument(lhs, cond), sh.block_argument(rhs, cond)
    if direction not in ("LT", "GT") or kind not in ("SIGNED", "") or counter is None or \
            _dtype(lhs) not in ("i32", "i64") or not _adds_one(back[counter], body.arguments[counter]):
        return LoopForm(changed, None, None)
    if bound is not None:  # a carried value the body does not change (a fori_loop's bound from outside)
        return LoopForm(changed, counter, op.operands[bound]) if bound not in changed else LoopForm(changed, None, None)
    maker = rhs.owner
    if _constant_of(rhs) is None and not isinstance(maker, ir.Block) and \
            any(maker.operation == o for o in nested_ops(op)):
        return LoopForm(changed, None, None)  # computed in cond
    return LoopForm(changed, counter, rhs)


def _adds_one(value: ir.Value, arg: ir.Value) -> bool:
    """Whether ``value`` is ``arg + 1``."""
    add = value.owner
    if isinstance(add, ir.Block) or add.operation.name != "stablehlo.add":
        return False
    x, y = add.operation.operands
    other = y if x == arg else x if y == arg else None
    one = None if other is None else _constant_of(other)
    return one is not None and one.size == 1 and int(one.reshape(-1)[0]) == 1


def _while(b: _Builder, op, ins):
    """An ONNX ``Loop`` whose body is the translated do-region: its loop-carried values are those the body
    changes, the others are read from outside by name (no copy a step), as values the body captures are.
    The trip count ``M`` comes from a counter (``loop_form``); else ``cond`` is the condition. A loop that
    is an LSTM or GRU layer becomes one ONNX ``LSTM`` or ``GRU`` (``recurrent_form``)."""
    form = loop_form(op)
    cell = recurrent_form(op, form)
    if cell is not None and all(v in b.names for v in cell.reads):
        return _recurrent(b, op, ins, cell)
    cond, body = op.regions[0].blocks[0], op.regions[1].blocks[0]
    if not form.changed:  # nothing changes: the loop computes its inputs (or never ends)
        return list(ins)
    types = [(_dtype(v), _shape(v)) for v in op.operands]
    if form.counter is not None:
        trips, keep_going = _trip_count(b, op, form, ins), ""
    else:
        trips, keep_going = "", _block_results(b, cond, ins)[0]
    it, go = b.fresh("iteration"), b.fresh("cond")
    carried = {k: b.fresh("carried") for k in form.changed}

    def build():
        after = _block_results(b, body, [carried.get(k, x) for k, x in enumerate(ins)])
        after = [after[k] if k in carried else x for k, x in enumerate(ins)]
        again = go if form.counter is not None else _block_results(b, cond, after)[0]
        return [(again, "i1", [])] + [(after[k], *types[k]) for k in form.changed]

    graph = b.graph(b.fresh("loop_body"), [(it, "i64", []), (go, "i1", [])] +
                    [(carried[k], *types[k]) for k in form.changed], build)
    outs = b.multi_node("Loop", [trips, keep_going] + [ins[k] for k in form.changed], len(form.changed), body=graph)
    return [outs[form.changed.index(k)] if k in carried else x for k, x in enumerate(ins)]


def _trip_count(b: _Builder, op, form: LoopForm, ins: list[str]) -> str:
    """``max(limit - start, 0)`` as the rank-0 i64 ``M`` of the ``Loop`` (a constant when both are)."""
    start, limit = _constant_of(op.operands[form.counter]), _constant_of(form.limit)
    if start is not None and limit is not None:
        return b.const(np.int64(max(int(limit.reshape(-1)[0]) - int(start.reshape(-1)[0]), 0)), "trips")
    i64 = DTYPES["i64"][1]
    hi = b.const(limit.reshape(()).astype(np.int64), "limit") if limit is not None else \
        b.node("Cast", [b.names[form.limit]], to=i64)
    lo = b.node("Cast", [ins[form.counter]], to=i64)
    return b.node("Max", [b.node("Sub", [hi, lo]), b.const(np.int64(0), "zero")])


def _case(b: _Builder, op, ins):
    """``stablehlo.case`` (``lax.cond``, ``lax.switch``) as nested ONNX ``If``s: branch ``k`` where the index
    is ``k``, the last branch for any other index (StableHLO's rule); each branch a graph of no inputs that
    reads the enclosing graph's values by name (JAX's branches capture theirs)."""
    branches = [r.blocks[0] for r in op.regions]
    types = [(_dtype(v), _shape(v)) for v in op.results]
    index_type = DTYPES[_dtype(op.operands[0])][0]

    def chain(k: int) -> list[str]:
        if k == len(branches) - 1:
            return _block_results(b, branches[k], [])
        taken = b.node("Equal", [ins[0], b.const(np.asarray(k, index_type), "branch")])
        then = b.graph(b.fresh("then"), [], lambda: list(zip(_block_results(b, branches[k], []), *zip(*types))))
        rest = b.graph(b.fresh("else"), [], lambda: list(zip(chain(k + 1), *zip(*types))))
        return b.multi_node("If", [taken], len(types), then_branch=then, else_branch=rest)

    return chain(0)


class Cell(Enum):
    """The recurrent cells ONNX has an op for (``RecurrentForm``)."""

    LSTM = "LSTM"
    GRU = "GRU"


@dataclass(frozen=True)
class RecurrentForm:
    """A ``stablehlo.while`` that is one LSTM or GRU layer over a whole sequence, as ``lax.scan`` over the
    cell writes it, ``h`` written to row ``t`` of the outputs:

    - LSTM: ``c = σ(f)·c + σ(i)·tanh(g)``, ``h = σ(o)·tanh(c)`` (the zoo's ``jax_lstm``, flax's
      ``OptimizedLSTMCell`` and ``LSTMCell``);
    - GRU: ``h = (1 - z)·n + z·h``, ``n = tanh(x[t] @ wn + bn + r·(h @ rn + rbn))`` (flax's ``GRUCell``; ONNX's
      ``linear_before_reset``);

    each gate's pre-activation a sum of linear terms: ``h @ r`` and ``x[t] @ w`` (or column blocks of one
    product, in any order), constant biases, or ``x[t]`` itself where the input projection ``x @ w + b`` of
    every step was computed before the loop. ``w``, ``r``, ``b``: the ONNX op's weights in its gate order
    (LSTM i, o, f, c; GRU z, r, h); ``x`` the sequence it reads: a carried operand of the loop (``seq``), else
    the projection's input outside it (``projection``: the ops the ONNX op computes then). ``c``: the cell
    state's carried position (None for a GRU)."""

    cell: Cell
    counter: int
    c: int | None
    h: int
    out: int
    steps: int
    w: np.ndarray
    r: np.ndarray
    b: np.ndarray
    seq: int
    x: ir.Value | None
    projection: tuple[ir.Operation, ...]

    @property
    def reads(self) -> tuple[ir.Value, ...]:
        """The values outside the loop the ONNX op reads besides the loop's own operands."""
        return () if self.x is None else (self.x,)


def _defined_by(v: ir.Value, *names: str) -> ir.Operation | None:
    """The op defining ``v`` where it is one of ``names``, else None (a block argument too)."""
    op = producer(v)
    return op if op is not None and op.name in names else None


def _is_splat(v: ir.Value, x: float) -> bool:
    c = _constant_of(v)
    return c is not None and c.size > 0 and bool(np.all(c == x))


def _sigmoid_of(v: ir.Value) -> ir.Value | None:
    """``x`` where ``v`` is ``logistic(x)`` or ``1 / (1 + exp(-x))`` (how ``jax.nn.sigmoid`` lowers), else None."""
    if (op := _defined_by(v, "stablehlo.logistic")) is not None:
        return op.operands[0]
    div = _defined_by(v, "stablehlo.divide")
    if div is None or not _is_splat(div.operands[0], 1.0) or (add := _defined_by(div.operands[1], "stablehlo.add")) is None:
        return None
    for one, e in (tuple(add.operands), tuple(add.operands)[::-1]):
        if _is_splat(one, 1.0) and (exp := _defined_by(e, "stablehlo.exponential")) is not None \
                and (neg := _defined_by(exp.operands[0], "stablehlo.negate")) is not None:
            return neg.operands[0]
    return None


def _tanh_of(v: ir.Value) -> ir.Value | None:
    op = _defined_by(v, "stablehlo.tanh")
    return None if op is None else op.operands[0]


def _factors(v: ir.Value) -> list[tuple[ir.Value, ir.Value]]:
    """(a, b) and (b, a) where ``v`` is ``a * b``, else []."""
    op = _defined_by(v, "stablehlo.multiply")
    return [] if op is None else [tuple(op.operands), tuple(op.operands)[::-1]]


def _gated(v: ir.Value, other: Callable[[ir.Value], bool]) -> ir.Value | None:
    """``x`` where ``v`` is ``σ(x) * y`` (either order) with ``other(y)``, else None."""
    return next((g for a, y in _factors(v) if (g := _sigmoid_of(a)) is not None and other(y)), None)


def _summands(v: ir.Value) -> list[ir.Value]:
    """The leaves of the tree of ``stablehlo.add``s ending at ``v``."""
    add = _defined_by(v, "stablehlo.add")
    return [v] if add is None else [t for x in add.operands for t in _summands(x)]


def _plain_dot(op: ir.Operation, rank: int) -> bool:
    """A dot_general of a rank-``rank`` lhs contracting its last dimension with a 2-D rhs's first, no batch."""
    d = sh.dot_info(op)
    return (not d.lhs_batch and not d.rhs_batch and d.lhs_contract == [rank - 1] and d.rhs_contract == [0]
            and len(_shape(op.operands[0])) == rank and len(_shape(op.operands[1])) == 2)


def recurrent_form(op: ir.Operation, form: LoopForm | None = None) -> RecurrentForm | None:
    """The loop ``op`` as an LSTM or GRU layer (``RecurrentForm``), else None (it stays a ``Loop``)."""
    form = form or loop_form(op)
    back = sh.returned(op.regions[1].blocks[0])
    if form.counter is None or len(form.changed) not in (3, 4) \
            or any(_dtype(v) != "f32" for k, v in enumerate(op.operands) if k != form.counter):
        return None
    start, limit = _constant_of(op.operands[form.counter]), _constant_of(form.limit)
    if start is None or limit is None or int(start.reshape(-1)[0]) != 0:
        return None
    steps = int(limit.reshape(-1)[0])
    rest = [k for k in form.changed if k != form.counter]
    out = next((k for k in rest if _defined_by(back[k], "stablehlo.dynamic_update_slice") is not None), None)
    if out is None:
        return None
    state = [k for k in rest if k != out]
    if len(state) == 1:
        return _gru_cell(op, form, state[0], out, steps)
    c, h = state
    return _lstm_cell(op, form, c, h, out, steps) or _lstm_cell(op, form, h, c, out, steps)


def _written(op: ir.Operation, form: LoopForm, h: int, out: int, steps: int) -> bool:
    """Whether the body writes its new ``h`` to row ``t`` of the carried outputs ``out`` (``steps`` rows)."""
    body = op.regions[1].blocks[0]
    args, back = list(body.arguments), sh.returned(body)
    upd = _defined_by(back[out], "stablehlo.dynamic_update_slice")
    written = _defined_by(upd.operands[1], "stablehlo.reshape", "stablehlo.broadcast_in_dim")
    return not (upd.operands[0] != args[out] or written is None or written.operands[0] != back[h]
                or upd.operands[2] != args[form.counter] or not all(_is_splat(v, 0) for v in upd.operands[3:])
                or _shape(op.operands[out])[0] != steps)


class _Terms:
    """Per gate, the sum of its pre-activation's linear terms: ``h @ r``, ``x[t] @ w``, a bias."""

    def __init__(self, op: ir.Operation, counter: ir.Value, h: ir.Value, steps: int):
        self.op, self.body, self.counter, self.h, self.steps = op, op.regions[1].blocks[0], counter, h, steps
        self.r: list[np.ndarray] = []
        self.w: list[np.ndarray] = []
        self.b: list[np.ndarray] = []
        self.sources: set = set()  # (kind, carried position) of the sequences read: one allowed
        #: A projection computed before the loop: its input and ops (the ``LSTM`` computes them).
        self.x: ir.Value | None = None
        self.projection: tuple = ()

    def gate(self, pre: ir.Value, hidden: int) -> bool:
        """Adds the gate whose pre-activation ``pre`` is ``h @ r + x[t] @ w (+ b)``; False where it is not."""
        got = self.linear(_summands(pre), hidden)
        if got is None or got[0] is None or got[1] is None:
            return False
        self.r.append(got[0])
        self.w.append(got[1])
        self.b.append(got[2])
        return True

    def linear(self, leaves: list[ir.Value], hidden: int):
        """(r, w, b): the sums of ``leaves``' recurrent, input and bias terms (None where a kind is absent; b
        zeros), else None where some leaf is none of them."""
        sums: dict[str, np.ndarray] = {}
        for leaf in leaves:
            cut = _defined_by(leaf, "stablehlo.slice")
            cols = self._block(cut, hidden) if cut is not None else slice(0, hidden)
            if cols is None:
                return None
            for term in (_summands(cut.operands[0]) if cut is not None else [leaf]):
                got = self._term(term, cols)
                if got is None:
                    return None
                for kind, m in got:
                    sums[kind] = m if kind not in sums else sums[kind] + m
        return sums.get("r"), sums.get("w"), sums.get("b", np.zeros(hidden, np.float32))

    @staticmethod
    def _block(cut: ir.Operation, hidden: int) -> slice | None:
        """The columns a slice takes: a block of ``hidden`` columns over every row, else None."""
        starts, limits = sh._array_attr(cut, "start_indices", []), sh._array_attr(cut, "limit_indices", [])
        strides = sh._array_attr(cut, "strides", [1] * len(starts))
        whole = _shape(cut.operands[0])
        if len(whole) != 2 or any(s != 1 for s in strides) or starts[0] != 0 or limits[0] != whole[0] \
                or limits[1] - starts[1] != hidden:
            return None
        return slice(starts[1], limits[1])

    def _term(self, v: ir.Value, cols: slice) -> list[tuple[str, np.ndarray]] | None:
        """[("r", r[:, cols])] for ``h @ r``; [("w", w[:, cols])] for ``x[t] @ w``; [("w", wi[:, cols]), ("b",
        b[cols])] for row ``t`` of a projection ``x @ wi + b`` computed before the loop; [("b", b[cols])] for a
        constant the same in every row; else None."""
        dot = _defined_by(v, "stablehlo.dot_general")
        if dot is not None and _plain_dot(dot, 2):
            m = self._static(dot.operands[1])
            if m is None:
                return None
            if dot.operands[0] == self.h:
                return [("r", m[:, cols])]
            seq = self._row(dot.operands[0])
            if seq is None:
                return None
            self.sources.add(("raw", seq))
            return [("w", m[:, cols])]
        seq = self._row(v)
        if seq is not None:
            projection = _projection(self.op.operands[seq])
            if projection is None:
                return None
            self.x, wi, bias, self.projection = projection
            self.sources.add(("projected", seq))
            return [("w", wi[:, cols]), ("b", bias[cols])]
        m = self._static(v)
        if m is None:
            return None
        m = np.asarray(m, np.float32)
        m = m.reshape(-1, m.shape[-1]) if m.ndim else m.reshape(1, 1)
        if not np.all(m == m[:1]):
            return None
        row = m[0]
        if row.size == 1:
            return [("b", np.full(cols.stop - cols.start, row[0], np.float32))]
        return [("b", row[cols])] if row.size >= cols.stop else None

    def form(self, cell: Cell, counter: int, c: int | None, h: int, out: int, w: np.ndarray, r: np.ndarray,
             bias: np.ndarray) -> RecurrentForm | None:
        """The layer with these weights ((features, G·H), (H, G·H), the ONNX op's bias: G gates in its order),
        where every gate read one sequence and the shapes hold, else None."""
        hidden = r.shape[0]
        gates = 4 if cell is Cell.LSTM else 3
        if len(self.sources) != 1 or r.shape != (hidden, gates * hidden) or w.shape[1] != gates * hidden:
            return None
        ((kind, seq),) = self.sources
        projected = kind == "projected"
        return RecurrentForm(cell, counter, c, h, out, self.steps, w.T[None].astype(np.float32),
                             r.T[None].astype(np.float32), bias[None].astype(np.float32), seq,
                             self.x if projected else None, self.projection if projected else ())

    def _row(self, v: ir.Value) -> int | None:
        """The carried position ``p`` where ``v`` is row ``t`` (the counter) of carried sequence ``p``, a value
        the body does not change with ``steps`` rows."""
        row = _defined_by(v, "stablehlo.reshape")
        cut = None if row is None else _defined_by(row.operands[0], "stablehlo.dynamic_slice")
        seq = None if cut is None else sh.block_argument(cut.operands[0], self.body)
        if seq is None or sh.returned(self.body)[seq] != cut.operands[0] or cut.operands[1] != self.counter \
                or not all(_is_splat(x, 0) for x in cut.operands[2:]) or _shape(self.op.operands[seq])[0] != self.steps:
            return None
        return seq

    def _static(self, v: ir.Value) -> np.ndarray | None:
        """The value of ``v`` known when the loop starts: a constant, a carried value the body does not change
        whose initial value is one, or a concatenation or reshape of such."""
        k = sh.block_argument(v, self.body)
        if k is not None:
            return None if sh.returned(self.body)[k] != v else _constant_of(self.op.operands[k])
        if (cat := _defined_by(v, "stablehlo.concatenate")) is not None:
            parts = [self._static(x) for x in cat.operands]
            return None if any(p is None for p in parts) else np.concatenate(parts, axis=_int_attr(cat, "dimension"))
        if (re := _defined_by(v, "stablehlo.reshape")) is not None:
            inner = self._static(re.operands[0])
            return None if inner is None else inner.reshape(_shape(v))
        if (bc := _defined_by(v, "stablehlo.broadcast_in_dim")) is not None:
            inner, out = self._static(bc.operands[0]), _shape(v)
            if inner is None:
                return None
            shape = [1] * len(out)
            for i, d in enumerate(sh.broadcast_dims(bc)):
                shape[d] = inner.shape[i]
            return np.broadcast_to(inner.reshape(shape), out)
        return _constant_of(v)


def _lstm_cell(op, form: LoopForm, c: int, h: int, out: int, steps: int) -> RecurrentForm | None:
    """``recurrent_form`` of an LSTM with ``c``, ``h`` and ``out`` the carried positions of the cell state, hidden state and
    outputs, else None."""
    body = op.regions[1].blocks[0]
    args, back = list(body.arguments), sh.returned(body)
    new_c = back[c]
    o_gate = _gated(back[h], lambda y: (t := _tanh_of(y)) is not None and t == new_c)
    add = _defined_by(new_c, "stablehlo.add")
    if o_gate is None or add is None:
        return None
    f_gate = i_gate = g_gate = None
    for keep, write in (tuple(add.operands), tuple(add.operands)[::-1]):
        f_gate = _gated(keep, lambda y: y == args[c])
        ig = [(g, t) for a, y in _factors(write) if (g := _sigmoid_of(a)) is not None and (t := _tanh_of(y)) is not None]
        if f_gate is not None and ig:
            i_gate, g_gate = ig[0]
            break
    if f_gate is None or i_gate is None:
        return None
    if not _written(op, form, h, out, steps):
        return None
    hidden = _shape(args[h])[-1]
    terms = _Terms(op, args[form.counter], args[h], steps)
    if not all(terms.gate(g, hidden) for g in (i_gate, o_gate, f_gate, g_gate)):
        return None
    return terms.form(Cell.LSTM, form.counter, c, h, out, np.concatenate(terms.w, axis=1),
                      np.concatenate(terms.r, axis=1), np.concatenate([*terms.b, np.zeros(4 * hidden)]))


def _gru_cell(op, form: LoopForm, h: int, out: int, steps: int) -> RecurrentForm | None:
    """``recurrent_form`` of a GRU: ``h = (1 - σ(z))·tanh(n) + σ(z)·h`` (either order), ``n``'s pre-activation
    ``x[t] @ wn + bn + σ(r)·(h @ rn + rbn)``, else None."""
    body = op.regions[1].blocks[0]
    args, back = list(body.arguments), sh.returned(body)
    add = _defined_by(back[h], "stablehlo.add")
    if add is None or not _written(op, form, h, out, steps):
        return None
    z_pre = n_pre = None
    for keep, write in (tuple(add.operands), tuple(add.operands)[::-1]):
        z_pre = _gated(keep, lambda y: y == args[h])
        for a, y in _factors(write):
            less = _defined_by(a, "stablehlo.subtract")
            if z_pre is not None and less is not None and _is_splat(less.operands[0], 1.0) \
                    and (s := _sigmoid_of(less.operands[1])) is not None and s == z_pre \
                    and (n_pre := _tanh_of(y)) is not None:
                break
        if n_pre is not None:
            break
    if z_pre is None or n_pre is None:
        return None
    reset = [(leaf, r_pre, inner) for leaf in _summands(n_pre) for a, inner in _factors(leaf)
             if (r_pre := _sigmoid_of(a)) is not None]
    if len(reset) != 1:
        return None
    leaf, r_pre, inner = reset[0]
    hidden = _shape(args[h])[-1]
    terms = _Terms(op, args[form.counter], args[h], steps)
    outer = terms.linear([v for v in _summands(n_pre) if v != leaf], hidden)
    within = terms.linear(_summands(inner), hidden)
    if not (terms.gate(z_pre, hidden) and terms.gate(r_pre, hidden)) or outer is None or within is None \
            or outer[0] is not None or outer[1] is None or within[0] is None or within[1] is not None:
        return None
    return terms.form(Cell.GRU, form.counter, None, h, out, np.concatenate([*terms.w, outer[1]], axis=1),  # z, r, h
                      np.concatenate([*terms.r, within[0]], axis=1),
                      np.concatenate([*terms.b, outer[2], np.zeros(2 * hidden), within[2]]))  # Wb z r h, Rb z r h


def _projection(v: ir.Value) -> tuple[ir.Value, np.ndarray, np.ndarray, tuple[ir.Operation, ...]] | None:
    """(x, wi, b, ops) where ``v`` is ``x @ wi (+ b)`` over a (steps, batch, features) ``x`` with constant
    ``wi`` and a constant bias the same for every step and batch row (``ops``: the dot and the add), else None."""
    bias = None
    add = _defined_by(v, "stablehlo.add")
    if add is not None:
        for d, c in (tuple(add.operands), tuple(add.operands)[::-1]):
            if _defined_by(d, "stablehlo.dot_general") is not None and (bias := _constant_of(c)) is not None:
                v = d
                break
        else:
            return None
    dot = _defined_by(v, "stablehlo.dot_general")
    if dot is None or not _plain_dot(dot, 3) or (wi := _constant_of(dot.operands[1])) is None:
        return None
    width = wi.shape[1]
    if bias is None:
        bias = np.zeros(width, np.float32)
    else:
        bias = np.broadcast_to(bias, _shape(v))
        if not np.all(bias == bias[:1, :1, :]):
            return None
        bias = bias[0, 0]
    return dot.operands[0], wi, np.asarray(bias, np.float32), (dot,) if add is None else (dot, add)


def _recurrent(b: _Builder, op, ins, cell: RecurrentForm):
    """One ONNX ``LSTM`` or ``GRU`` for the loop ``op`` (``RecurrentForm``), the initial state the loop's; its
    results in the loop's carried positions."""
    hidden = cell.r.shape[-1]
    batch = _shape(op.operands[cell.h])[0]
    w, r, bias = (b.const(m, f"{cell.cell.value.lower()}_{k}") for m, k in ((cell.w, "w"), (cell.r, "r"), (cell.b, "b")))
    state = [b.reshape(ins[k], [1, batch, hidden]) for k in (cell.h, cell.c) if k is not None]
    x = ins[cell.seq] if cell.x is None else b.names[cell.x]
    computes = tuple(i for o in cell.projection if (i := collage.op_id(o)) is not None)
    attrs = {"linear_before_reset": 1} if cell.cell is Cell.GRU else {}
    outs = b.multi_node(cell.cell.value, [x, w, r, bias, "", *state], 1 + len(state), also=computes,
                        hidden_size=hidden, **attrs)
    results = list(ins)
    results[cell.counter] = b.const(np.asarray(cell.steps, DTYPES[_dtype(op.operands[cell.counter])][0]), "steps")
    results[cell.out] = b.reshape(outs[0], [cell.steps, batch, hidden])
    results[cell.h] = b.reshape(outs[1], [batch, hidden])
    if cell.c is not None:
        results[cell.c] = b.reshape(outs[2], [batch, hidden])
    return results


@dataclass(frozen=True)
class NestedOps:
    """every op of a loop's cond and body (a case's branches) translatable, meeting the engine's constraints"""

    engine: tuple = ()

    def __call__(self, op: ir.Operation) -> str | None:
        holder = "loop" if op.name == "stablehlo.while" else "case"
        for region in op.regions:
            for inner in sh.block_ops(region.blocks[0]):
                spec = OPS.get(inner.name)
                if spec is None:
                    return f"the {holder} holds {inner.name}, which has no ONNX translation"
                checks = spec.when + self.engine + ((self,) if spec.nested else ())
                why = next((r for r in (c(inner) for c in checks) if r), None)
                if why:
                    return f"the {holder}'s {inner.name}: {why}"
        return None


@dataclass(frozen=True)
class SortOrder:
    """A ``stablehlo.sort`` as ``TopK``: the operand whose values order it (the others are payload) and
    the direction its comparator orders them in."""

    key: int
    descending: bool


#: Comparator probes: a key's values, signed zeros and infinities among them (NaN too, whose order the
#: check leaves free: TopK's is the engine's).
_PROBE_FLOATS = [-np.inf, -3.5, -1.0, -1e-30, -0.0, 0.0, 1e-30, 1.0, 2.5, np.inf, np.nan]
_PROBE_INTS = [-(2**31), -7, -1, 0, 1, 3, 2**31 - 1]


def sort_order(op: ir.Operation) -> SortOrder | str:
    """The ``SortOrder`` of a sort whose comparator orders one operand's values ascending or descending,
    else why not. The comparator is evaluated (``_comparator``) on every pair of probe values, so JAX's
    total-order comparator (-0.0 made 0.0, NaNs made one NaN, then ``LT`` TOTALORDER) and a plain ``LT``
    or ``GT`` are recognised alike; it must equal ``<`` (or ``>``) on every pair of non-NaN probes."""
    block = op.regions[0].blocks[0]
    reads = _reads_arguments(block)
    keys = sorted({k // 2 for k in reads})
    if len(keys) != 1 or reads != {2 * keys[0], 2 * keys[0] + 1}:
        return "the comparator must compare one operand's two values (a single-key sort)"
    key = keys[0]
    dtype = _dtype(op.operands[key])
    if dtype not in ("f32", "f64", "i32", "i64"):
        return f"the sort key must be f32, f64, i32 or i64, not {dtype}"
    probes = np.asarray(_PROBE_FLOATS if dtype in FLOATS else _PROBE_INTS, DTYPES[dtype][0])
    a, c = (x.reshape(-1) for x in np.meshgrid(probes, probes, indexing="ij"))
    args = [np.zeros(a.shape, DTYPES[_dtype(v)][0]) for v in op.operands for _ in (0, 1)]
    args[2 * key], args[2 * key + 1] = a, c
    try:
        less = _comparator(block, args)
    except LookupError as e:
        return f"unrecognised comparator: {e.args[0]}"
    real = ~(np.isnan(a) | np.isnan(c)) if dtype in FLOATS else np.ones(a.shape, bool)
    for descending, want in ((False, a < c), (True, a > c)):
        if np.array_equal(less[real], want[real]):
            return SortOrder(key, descending)
    return "the comparator orders neither ascending nor descending"


def _reads_arguments(block: ir.Block) -> set[int]:
    """The positions of ``block``'s arguments its returned value is computed from."""
    found, stack, seen = set(), list(sh.returned(block)), []
    while stack:
        v = stack.pop()
        if (k := sh.block_argument(v, block)) is not None:
            found.add(k)
            continue
        owner = v.owner
        if isinstance(owner, ir.Block) or any(owner.operation == s for s in seen):
            continue
        seen.append(owner.operation)
        stack.extend(owner.operation.operands)
    return found


_TOTAL_ORDER_INT = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}
_COMPARATOR_OPS = {"stablehlo.and": np.bitwise_and, "stablehlo.or": np.bitwise_or, "stablehlo.xor": np.bitwise_xor,
                   "stablehlo.not": np.invert, "stablehlo.negate": np.negative, "stablehlo.subtract": np.subtract,
                   "stablehlo.add": np.add}
_DIRECTIONS = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
               "GE": np.greater_equal}


def _comparator(block: ir.Block, args: list[np.ndarray]) -> np.ndarray:
    """The comparator ``block`` evaluated elementwise on ``args`` (one array per argument, all one shape);
    values from outside it must be constant expressions. LookupError names what it cannot evaluate."""
    env: list[tuple[ir.Value, np.ndarray]] = list(zip(block.arguments, args))

    def get(v: ir.Value) -> np.ndarray:
        for known, x in env:
            if known == v:
                return x
        c = sh.const_expr_value(v)
        if c is None or c.size != 1:
            raise LookupError("it reads a value that is not a scalar constant")
        return c.reshape(())

    with np.errstate(all="ignore"):
        for op in sh.block_ops(block):
            if op.name in ("stablehlo.constant", "arith.constant"):
                continue  # read by ``get``
            xs = [get(v) for v in op.operands]
            tt = sh.tensor_type(op.results[0])
            if tt is None or tt[0]:
                raise LookupError(f"{op.name} is not on scalars")
            if op.name == "stablehlo.compare":
                direction, kind = sh.comparison(op)
                if kind == "TOTALORDER" and xs[0].dtype in _TOTAL_ORDER_INT:
                    xs = [_total_order(x) for x in xs]
                elif kind == "UNSIGNED":
                    xs = [x.view(x.dtype.str.replace("i", "u")) for x in xs]
                out = _DIRECTIONS[direction](*xs)
            elif op.name == "stablehlo.select":
                out = np.where(*xs)
            elif op.name == "stablehlo.convert":
                out = xs[0].astype(DTYPES[tt[1]][0]) if tt[1] in DTYPES else None
            elif op.name == "stablehlo.bitcast_convert":
                out = xs[0].view(DTYPES[tt[1]][0]) if tt[1] in DTYPES else None
            elif op.name in _COMPARATOR_OPS:
                out = _COMPARATOR_OPS[op.name](*xs)
            else:
                raise LookupError(f"{op.name} is not a comparator op this recognises")
            if out is None:
                raise LookupError(f"{op.name} to {tt[1]}")
            env.append((op.results[0], np.asarray(out)))
    return np.broadcast_to(get(sh.returned(block)[0]), args[0].shape)


def _total_order(x: np.ndarray) -> np.ndarray:
    """Integers ordered as the floats ``x`` in IEEE total order (-NaN < -inf < ... < -0 < 0 < ... < NaN)."""
    bits = x.view(_TOTAL_ORDER_INT[x.dtype])
    return bits ^ ((bits >> (8 * bits.dtype.itemsize - 1)) & np.iinfo(bits.dtype).max)


def recognised_sort(op: ir.Operation) -> str | None:
    """one f32/f64/i32/i64 key, ascending or descending by a recognised comparator, others carried along"""
    # Equal keys keep their input order (TopK's lower-index rule, ``_ordered_top_k``), as JAX's stable sort
    # asks: exact, no tolerance needed for ties. NaN keys come in the engine's order, not JAX's (last).
    order = sort_order(op)
    return order if isinstance(order, str) else None


def _sort(b: _Builder, op, ins):
    """``TopK`` of the key over its whole dim (``_ordered_top_k``: ties in index order, as the stable sort
    JAX asks for), the other operands gathered by its indices; an operand that is an iota along the dim
    (``argsort``'s) is the indices themselves."""
    order = sort_order(op)
    shape = _shape(op.operands[order.key])
    axis = _int_attr(op, "dimension") % len(shape)
    values, indices = _ordered_top_k(b, ins[order.key], shape, axis, shape[axis], order.descending)
    outs = []
    for k, (v, x) in enumerate(zip(op.operands, ins)):
        maker = v.owner
        if k == order.key:
            outs.append(values)
        elif not isinstance(maker, ir.Block) and maker.operation.name == "stablehlo.iota" and \
                _int_attr(maker.operation, "iota_dimension") == axis:
            outs.append(b.node("Cast", [indices], to=DTYPES[_dtype(v)][1]))
        else:
            outs.append(b.node("GatherElements", [x, indices], axis=axis))
    return outs


@dataclass(frozen=True)
class OnnxOp:
    """One row of the table: how to translate an op and what it must satisfy. ``nested``: the op's
    regions are translated as graphs (a loop body), so their ops must meet the engine's constraints too."""

    translate: Callable
    when: tuple = ()
    nested: bool = False


_NUM = (static_known_types, numeric_operands)
OPS: dict[str, OnnxOp] = {
    **{name: OnnxOp(_binary, _NUM) for name in BINARY if name != "stablehlo.power"},
    "stablehlo.power": OnnxOp(_binary, (static_known_types, float_operands)),
    "stablehlo.remainder": OnnxOp(_remainder, _NUM),
    **{name: OnnxOp(_logical, (static_known_types, bool_operands)) for name in LOGICAL},
    "stablehlo.not": OnnxOp(_not, (static_known_types, bool_operands)),
    **{name: OnnxOp(_unary, (static_known_types, float_operands)) for name in UNARY
       if name not in ("stablehlo.negate", "stablehlo.abs")},
    "stablehlo.negate": OnnxOp(_unary, _NUM),
    "stablehlo.abs": OnnxOp(_unary, _NUM),
    "stablehlo.rsqrt": OnnxOp(_rsqrt, (static_known_types, float_operands)),
    "chlo.square": OnnxOp(_square, _NUM),
    "chlo.erf": OnnxOp(_erf, (static_known_types, float_operands)),
    "chlo.erfc": OnnxOp(_erfc, (static_known_types, float_operands)),
    "chlo.top_k": OnnxOp(_top_k, (static_known_types, numeric_operands)),
    "stablehlo.compare": OnnxOp(_compare, (static_known_types, supported_compare)),
    "stablehlo.select": OnnxOp(_select, (static_known_types,)),
    "stablehlo.convert": OnnxOp(_convert, (static_known_types,)),
    "stablehlo.clamp": OnnxOp(_clamp, _NUM),
    "stablehlo.constant": OnnxOp(_constant, (static_known_types, readable_constant)),
    "arith.constant": OnnxOp(_constant, (static_known_types, readable_constant)),
    "stablehlo.iota": OnnxOp(_iota, (static_known_types,)),
    "stablehlo.dynamic_iota": OnnxOp(_iota, (static_result, static_known_types)),
    "stablehlo.gather": OnnxOp(_gather, (static_known_types, row_gather)),
    "stablehlo.reshape": OnnxOp(_reshape, (static_known_types,)),
    "stablehlo.transpose": OnnxOp(_transpose, (static_known_types,)),
    "stablehlo.broadcast_in_dim": OnnxOp(_broadcast, (static_known_types,)),
    "stablehlo.concatenate": OnnxOp(_concatenate, (static_known_types,)),
    "stablehlo.slice": OnnxOp(_slice, (static_known_types,)),
    "stablehlo.dynamic_slice": OnnxOp(_dynamic_slice, (static_known_types,)),
    "stablehlo.dynamic_update_slice": OnnxOp(_dynamic_update_slice, (static_known_types,)),
    "stablehlo.while": OnnxOp(_while, (static_known_types,), nested=True),
    "stablehlo.case": OnnxOp(_case, (static_known_types,), nested=True),
    "stablehlo.sort": OnnxOp(_sort, (static_known_types, recognised_sort)),
    "stablehlo.pad": OnnxOp(_pad, (static_known_types, plain_pad)),
    "stablehlo.reduce": OnnxOp(_reduce, (static_known_types, reduce_body)),
    "stablehlo.reduce_window": OnnxOp(_reduce_window, (static_known_types, supported_window)),
    "stablehlo.reverse": OnnxOp(_reverse, (static_known_types,)),
    "stablehlo.convolution": OnnxOp(_convolution, (static_known_types, float_operands, plain_convolution)),
    "stablehlo.dot_general": OnnxOp(_dot_general, (static_known_types, float_operands)),
}


def engine_patterns(*engine: Constraint) -> tuple[OpPattern, ...]:
    """Single-op patterns for OpSetBackend, one per translatable op (named by the op), each also
    meeting the ``engine`` constraints: what the engine running the ONNX model really implements (a
    loop's ops too, ``NestedOps``)."""
    return tuple(OpPattern(name.split(".", 1)[1] if name.startswith("stablehlo.") else name, name,
                           spec.when + engine + ((NestedOps(engine),) if spec.nested else ()))
                 for name, spec in OPS.items())

CONSTANT_OPS = ("stablehlo.constant", "arith.constant")


# --------------------------------------------------------------------------------------------------
# Constants: dense attributes directly; dense_resource blobs through a scratch module's printout.

def _read_constants(ops: list[ir.Operation]) -> dict[ir.Value, np.ndarray]:
    """The values of the constants ``ops`` (keyed by result; unreadable ones left out)."""
    values: dict[ir.Value, np.ndarray] = {}
    ops = [op for op in ops if (tt := sh.tensor_type(op.results[0])) is not None and tt[1] in DTYPES]
    for op, blob in zip(ops, sh.resource_arrays(ops)):
        attr = op.attributes["value"]
        if isinstance(attr, ir.DenseElementsAttr):
            v = _dense(attr, sh.tensor_type(op.results[0]))
            if v is not None:
                values[op.results[0]] = v
        elif blob is not None:
            values[op.results[0]] = blob
    return values


def _dense(attr: ir.DenseElementsAttr, tt) -> np.ndarray | None:
    shape, dtype = tt
    if dtype == "i1":
        m = re.match(r"dense<(.*)>\s*:", str(attr), re.S)
        if m is None:
            return None
        body = m.group(1).replace("true", "1").replace("false", "0")
        flat = [int(x) for x in re.findall(r"\d+", body)]
        if len(flat) == 1:
            return np.full(shape, bool(flat[0]))
        return np.array(flat, dtype=np.bool_).reshape(shape)
    v = sh.dense_values(attr, shape)
    return None if v is None else np.asarray(v).reshape(shape)


# --------------------------------------------------------------------------------------------------


def translate(func: ir.Operation, *, simplify: bool = True, ties_by_index: bool = True):
    """The ``onnx.ModelProto`` equal to the region function ``func`` (a ``func.func`` with a body),
    simplified by ``onnx_optimize`` unless ``simplify`` is False (the op-by-op translation).
    ``ties_by_index``: whether the engine's ``TopK`` orders equal values by index (``_Builder``)."""
    import onnx
    from onnx import helper

    from .onnx_optimize import optimize

    func = func.operation
    block = func.regions[0].blocks[0]
    b = _Builder(ties_by_index)
    graph_inputs, graph_outputs = [], []
    for i, arg in enumerate(block.arguments):
        shape, dtype = _spec(arg, func)
        graph_inputs.append(helper.make_tensor_value_info(f"in{i}", DTYPES[dtype][1], shape))
    b.constants = _read_constants([o for o in nested_ops(func) if o.name in CONSTANT_OPS])
    results = _block_results(b, block, [f"in{i}" for i in range(len(block.arguments))])
    for k, (v, name) in enumerate(zip(sh.returned(block), results)):
        shape, dtype = _spec(v, func)
        b.nodes.append(helper.make_node("Identity", [name], [f"out{k}"], name=f"out{k}"))
        graph_outputs.append(helper.make_tensor_value_info(f"out{k}", DTYPES[dtype][1], shape))
    graph = helper.make_graph(b.nodes, str(func.attributes["sym_name"]).strip('"'), graph_inputs, graph_outputs,
                              initializer=b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="collage-mlir")
    model.ir_version = IR_VERSION
    if simplify:
        original = list(model.graph.node)
        model = optimize(model)
        _carry_op_ids(original, model.graph)
    onnx.checker.check_model(model)
    return model


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


def _is_f64(v: ir.Value) -> bool:
    tt = sh.tensor_type(v)
    return tt is not None and tt[1] == "f64"


def _spec(v: ir.Value, func: ir.Operation) -> tuple[list[int], str]:
    tt = sh.tensor_type(v)
    if tt is None or tt[1] not in DTYPES:
        raise CollageError(f"{func.location}: region value of type {v.type} cannot cross into ONNX")
    return list(tt[0]), tt[1]


class OnnxGraphBackend(OpSetBackend):
    """Shared by the backends that run the exported ONNX model: the build (export, write
    ``regions/<region><suffix>``) and the executor that serves it. Each subclass states its patterns
    with ``engine_patterns`` and the element-type limits its engine has."""

    max_region_ops: ClassVar[int] = 8
    kind = BackendKind.GRAPH
    embeds_constants = True
    suffix: ClassVar[str] = ".onnx"
    executor: ClassVar[str]
    #: Whether the engine's ``TopK`` keeps equal values in index order, as ONNX specifies (probed:
    #: test_onnx_control.py); where not, the export breaks ties itself (``_ordered_top_k``).
    topk_ties_by_index: ClassVar[bool] = True

    def build(self, func: ir.Operation, out_dir: Path, region: str) -> RegionArtifact:
        path = Path(out_dir) / "regions" / f"{region}{self.suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(translate(func, ties_by_index=self.topk_ties_by_index).SerializeToString())
        return RegionArtifact(str(path.relative_to(out_dir)), self.executor)

