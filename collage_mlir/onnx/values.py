"""The element types the translator maps (StableHLO name → numpy dtype, ONNX data type) and the small
readers of StableHLO values and attributes that the rules and their constraints share."""

from __future__ import annotations

import numpy as np

from ..dialects import stablehlo as sh
from ..ir import ir


#: MLIR element type → (numpy dtype, ONNX TensorProto data type number).
DTYPES = {
    "f32": (np.float32, 1), "f64": (np.float64, 11), "i32": (np.int32, 6), "i64": (np.int64, 7),
    "i1": (np.bool_, 9),
}
FLOATS = ("f32", "f64")
#: Element types a region's inputs and outputs may have: ``DTYPES``, and those only an ONNX node kept as
#: ONNX computes on (the translated ops are held to ``DTYPES`` by their constraints).
BOUNDARY_DTYPES = {**DTYPES, "f16": (np.float16, 10), "i8": (np.int8, 3), "i16": (np.int16, 5),
                   "ui8": (np.uint8, 2), "ui16": (np.uint16, 4), "ui32": (np.uint32, 12), "ui64": (np.uint64, 13)}


def _shape(v: ir.Value) -> list[int]:
    return list(sh.tensor_type(v)[0])


def _dtype(v: ir.Value) -> str:
    """The element type of a ranked tensor value (static or with dynamic dims)."""
    return sh.ranked_type(v)[1]


def _dims(v: ir.Value) -> list[int | None]:
    """The shape of a ranked tensor value, None for each dynamic dim."""
    return list(sh.ranked_type(v)[0])


def _int_attr(op: ir.Operation, name: str) -> int:
    return ir.IntegerAttr(op.attributes[name]).value


def _constant_of(v: ir.Value) -> np.ndarray | None:
    """The value of ``v`` where it is a constant expression (JAX broadcasts its scalar inits), else None."""
    return sh.const_expr_value(v)
