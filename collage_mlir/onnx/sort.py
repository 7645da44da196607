"""Orderings as ONNX ``TopK``: ``chlo.top_k``, and ``stablehlo.sort`` whose comparator (recognised by
evaluating it, ``sort_order``) orders one key ascending or descending; equal values in index order on
every engine (``_ordered_top_k``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dialects import stablehlo as sh
from ..ir import ir
from .builder import _Builder
from .registry import numeric_operands, register, static_known_types
from .values import DTYPES, FLOATS, _dtype, _int_attr, _shape


@register("chlo.top_k", when=(static_known_types, numeric_operands))
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


@register("stablehlo.sort", when=(static_known_types, recognised_sort))
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
