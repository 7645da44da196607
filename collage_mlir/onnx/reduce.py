"""``stablehlo.reduce`` whose body is one add, multiply, maximum or minimum (and/or on i1) as an ONNX
``Reduce*`` node, the init value folded in; ``sh.reduce_kind`` reads such a body (the window ops of ``conv``
read theirs with it too)."""

from __future__ import annotations

import numpy as np

from ..dialects import stablehlo as sh
from ..ir import ir
from .builder import _Builder
from .registry import register, static_known_types
from .values import DTYPES, _constant_of, _dtype


def reduce_body(op: ir.Operation) -> str | None:
    """one input; body is a single add, multiply, maximum or minimum (and/or on i1)"""
    if len(op.operands) != 2 or len(op.results) != 1:
        return "needs exactly one input and one init value"
    kind = sh.reduce_kind(op)
    if kind is None:
        return "body must be one add, multiply, maximum or minimum (and/or on i1)"
    if (kind in ("and", "or")) != (_dtype(op.operands[0]) == "i1"):
        return "and/or reduce i1 only; i1 reduces only with and/or"
    return None


# and/or over i1 reduce as min/max over 0/1 (ONNX has no boolean reductions).
REDUCE = {"add": "ReduceSum", "mul": "ReduceProd", "max": "ReduceMax", "min": "ReduceMin",
          "and": "ReduceMin", "or": "ReduceMax"}
COMBINE = {"add": "Add", "mul": "Mul", "max": "Max", "min": "Min", "and": "And", "or": "Or"}
IDENTITY = {"add": 0, "mul": 1, "max": -np.inf, "min": np.inf, "and": True, "or": False}


@register("stablehlo.reduce", when=(static_known_types, reduce_body), dynamic=True)
def _reduce(b: _Builder, op, ins):
    kind = sh.reduce_kind(op)
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
