"""Constants: ``stablehlo.constant`` and ``iota`` become initializers. Dense attributes are read directly;
``dense_resource`` blobs (how torch-mlir stores weights) are read back by printing a scratch module holding
just the constants, whose resource section carries the blobs as hex."""

from __future__ import annotations

import re

import numpy as np

from ..dialects import stablehlo as sh
from ..errors import CollageError
from ..ir import ir
from .builder import _Builder
from .registry import known_types, register, static_known_types, static_moved_types
from .values import DTYPES, MOVED_DTYPES, _dims, _dtype, _int_attr, _shape


def readable_constant(op: ir.Operation) -> str | None:
    """dense or dense_resource value"""
    attr = op.attributes["value"] if "value" in op.attributes else None
    if attr is None:
        return "constant without value"
    if isinstance(attr, ir.DenseElementsAttr) or _is_resource(attr):
        return None
    return "constant value is neither dense nor dense_resource"


def _is_resource(attr: ir.Attribute) -> bool:
    try:
        ir.DenseResourceElementsAttr(attr)
        return True
    except (ValueError, TypeError):
        return False


CONSTANT_OPS = ("stablehlo.constant", "arith.constant")


@register(*CONSTANT_OPS, when=(static_moved_types, readable_constant))
def _constant(b: _Builder, op, ins):
    value = b.constants.get(op.results[0])
    if value is None:
        raise CollageError(f"{op.location}: cannot read the value of this constant")
    return [b.const(value.astype(MOVED_DTYPES[_dtype(op.results[0])][0]).reshape(_shape(op.results[0])), "const")]


@register("stablehlo.dynamic_iota", when=(known_types,), dynamic=True, broadcasts=True)
def _dynamic_iota(b: _Builder, op, ins):
    """A static result is the constant ``iota`` gives; with dynamic dims, ``Range`` up to the shape operand's
    size along the iota's dim, unit axes around it, ``Expand`` to the shape waiting for a consumer that needs
    it (as ``dynamic_broadcast_in_dim``'s: jax.nn.dot_product_attention's causal mask over a symbolic length)."""
    if sh.tensor_type(op.results[0]) is not None:
        return _iota(b, op, ins)
    dim, rank = _int_attr(op, "iota_dimension"), len(_dims(op.results[0]))
    shape = b.node("Cast", [ins[0]], to=DTYPES["i64"][1])
    size = b.reshape(b.node("Slice", [shape, b.ints([dim]), b.ints([dim + 1])]), [])
    dtype = DTYPES[_dtype(op.results[0])][1]
    line = b.node("Cast", [b.node("Range", [b.const(np.int64(0)), size, b.const(np.int64(1))])], to=dtype)
    x = b.node("Unsqueeze", [line, b.ints([a for a in range(rank) if a != dim])]) if rank > 1 else b.node("Identity", [line])
    b.lazy[x] = ins[0]  # cast to i64 where expanded
    return [x]


@register("stablehlo.iota", when=(static_known_types,))
def _iota(b: _Builder, op, ins):
    shape = _shape(op.results[0])
    dim = _int_attr(op, "iota_dimension")
    view = [1] * len(shape)
    view[dim] = shape[dim]
    value = np.broadcast_to(np.arange(shape[dim]).reshape(view), shape)
    return [b.const(value.astype(DTYPES[_dtype(op.results[0])][0]), "iota")]


def _read_constants(ops: list[ir.Operation]) -> dict[ir.Value, np.ndarray]:
    """The values of the constants ``ops`` (keyed by result; unreadable ones left out)."""
    values: dict[ir.Value, np.ndarray] = {}
    ops = [op for op in ops if (tt := sh.tensor_type(op.results[0])) is not None and tt[1] in MOVED_DTYPES]
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
    v = sh.dense_values(attr, shape, dtype)
    return None if v is None else np.asarray(v).reshape(shape)
