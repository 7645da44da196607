"""Elementwise ops, each a node or two: arithmetic, logic, math functions (``exp``, ``tanh``, ``erf``...),
``compare``, ``select``, ``convert`` and ``clamp``."""

from __future__ import annotations

import numpy as np

from ..dialects import stablehlo as sh
from ..ir import ir
from .builder import _Builder
from .registry import bool_operands, float_operands, numeric_operands, register, static_known_types
from .values import DTYPES, WIDENED, _dtype


BINARY = {"stablehlo.add": "Add", "stablehlo.subtract": "Sub", "stablehlo.multiply": "Mul",
          "stablehlo.divide": "Div", "stablehlo.maximum": "Max", "stablehlo.minimum": "Min",
          "stablehlo.power": "Pow"}
LOGICAL = {"stablehlo.and": "And", "stablehlo.or": "Or", "stablehlo.xor": "Xor"}
UNARY = {"stablehlo.negate": "Neg", "stablehlo.abs": "Abs", "stablehlo.exponential": "Exp",
         "stablehlo.log": "Log", "stablehlo.sqrt": "Sqrt", "stablehlo.tanh": "Tanh",
         "stablehlo.logistic": "Sigmoid", "stablehlo.floor": "Floor", "stablehlo.ceil": "Ceil",
         "stablehlo.sine": "Sin", "stablehlo.cosine": "Cos"}
COMPARE = {"EQ": "Equal", "LT": "Less", "LE": "LessOrEqual", "GT": "Greater", "GE": "GreaterOrEqual", "NE": None}
#: What arithmetic asks: static shapes of known types, no i1.
_NUM = (static_known_types, numeric_operands)


def _direction(op: ir.Operation) -> str:
    return sh.comparison(op)[0]


def supported_compare(op: ir.Operation) -> str | None:
    """EQ/NE/LT/LE/GT/GE (i1: EQ/NE only), not unsigned"""
    if "compare_type" in op.attributes and "UNSIGNED" in str(op.attributes["compare_type"]):
        return "no unsigned compare"
    if _dtype(op.operands[0]) == "i1" and _direction(op) not in ("EQ", "NE"):
        return "i1 compares only EQ/NE"
    return None if _direction(op) in COMPARE else "unknown comparison direction"


@register("stablehlo.power", when=(static_known_types, float_operands), dynamic=True, broadcasts=True)
@register(*(name for name in BINARY if name != "stablehlo.power"), when=_NUM, dynamic=True, broadcasts=True)
def _binary(b: _Builder, op, ins):
    return [b.node(BINARY[op.name], ins)]


@register("stablehlo.remainder", when=_NUM, dynamic=True, broadcasts=True)
def _remainder(b: _Builder, op, ins):
    """``stablehlo.remainder`` truncates (the result takes the dividend's sign, C's fmod): ONNX ``Mod`` with
    ``fmod=1``, for integers and floats alike."""
    return [b.node("Mod", ins, fmod=1)]


@register(*LOGICAL, when=(static_known_types, bool_operands), dynamic=True, broadcasts=True)
def _logical(b: _Builder, op, ins):
    return [b.node(LOGICAL[op.name], ins)]


@register("stablehlo.not", when=(static_known_types, bool_operands), dynamic=True, broadcasts=True)
def _not(b: _Builder, op, ins):
    return [b.node("Not", ins)]


@register("stablehlo.negate", "stablehlo.abs", when=_NUM, dynamic=True, broadcasts=True)
@register(*(name for name in UNARY if name not in ("stablehlo.negate", "stablehlo.abs")),
          when=(static_known_types, float_operands), dynamic=True, broadcasts=True)
def _unary(b: _Builder, op, ins):
    return [b.node(UNARY[op.name], ins)]


@register("stablehlo.rsqrt", when=(static_known_types, float_operands), dynamic=True, broadcasts=True)
def _rsqrt(b: _Builder, op, ins):
    return [b.node("Reciprocal", [b.node("Sqrt", ins)])]


@register("chlo.square", when=_NUM, dynamic=True, broadcasts=True)
def _square(b: _Builder, op, ins):
    return [b.node("Mul", [ins[0], ins[0]])]


@register("chlo.erf", when=(static_known_types, float_operands), dynamic=True, broadcasts=True)
def _erf(b: _Builder, op, ins):
    return [b.node("Erf", ins)]


@register("chlo.erfc", when=(static_known_types, float_operands), dynamic=True, broadcasts=True)
def _erfc(b: _Builder, op, ins):
    """1 - erf(x): exact to f32's absolute precision (JAX's exact GELU is x * erfc(-x / sqrt 2) / 2)."""
    one = b.const(np.ones((), DTYPES[_dtype(op.results[0])][0]), "one")
    return [b.node("Sub", [one, b.node("Erf", ins)])]


@register("stablehlo.compare", when=(static_known_types, supported_compare), dynamic=True, broadcasts=True)
def _compare(b: _Builder, op, ins):
    d = _direction(op)
    if d == "NE":
        return [b.node("Not", [b.node("Equal", ins)])]
    return [b.node(COMPARE[d], ins)]


@register("stablehlo.select", when=(static_known_types,), dynamic=True, broadcasts=True)
def _select(b: _Builder, op, ins):
    """``Where``; between i1 values (jnp.tril of a mask), which ONNX Runtime's ``Where`` does not take, its
    logic: (c and x) or (not c and y)."""
    if _dtype(op.results[0]) == "i1":
        c, x, y = ins
        return [b.node("Or", [b.node("And", [c, x]), b.node("And", [b.node("Not", [c]), y])])]
    return [b.node("Where", ins)]


@register("stablehlo.convert", when=(static_known_types,), dynamic=True, broadcasts=True)
def _convert(b: _Builder, op, ins):
    """A Cast. A widened type (bf16, f32 in the graph) is rounded to itself where a value enters it and where
    one leaves it (the graph's other ops on it do not round: the engines compute it at least as precisely)."""
    def rounded(x: str, t: str) -> str:
        return b.node("Cast", [b.node("Cast", [x], to=WIDENED[t])], to=DTYPES[t][1])

    (x,), source, to = ins, _dtype(op.operands[0]), _dtype(op.results[0])
    if source in WIDENED and to != source:
        x = rounded(x, source)  # the model's own value of the operand
        if DTYPES[to][1] == DTYPES[source][1]:
            return [x]
    x = b.node("Cast", [x], to=DTYPES[to][1])
    return [rounded(x, to) if to in WIDENED and source != to else x]


@register("stablehlo.clamp", when=_NUM, dynamic=True)
def _clamp(b: _Builder, op, ins):
    lo, x, hi = ins
    if all(ir.RankedTensorType(v.type).rank == 0 for v in (op.operands[0], op.operands[2])):
        return [b.node("Clip", [x, lo, hi])]  # scalar bounds: the form the engines fuse into a Conv or Gemm
    return [b.node("Min", [b.node("Max", [x, lo]), hi])]
