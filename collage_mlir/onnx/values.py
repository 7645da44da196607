"""The element types the translator maps (StableHLO name → numpy dtype, ONNX data type) and the small
readers of StableHLO values and attributes that the rules and their constraints share."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..dialects import stablehlo as sh
from ..ir import ir


#: MLIR element type → (numpy dtype, ONNX TensorProto data type number) of its values inside the graph.
#: A bf16 value is an f32 one there (``WIDENED``): ONNX Runtime has no bf16 kernels on the CPU, OpenVINO's
#: bf16 inference precision runs f32 math in bf16 where that pays, and f32 holds every bf16 value exactly.
DTYPES = {
    "f32": (np.float32, 1), "f64": (np.float64, 11), "i32": (np.int32, 6), "i64": (np.int64, 7),
    "i1": (np.bool_, 9), "bf16": (np.float32, 1),
}
FLOATS = ("f32", "f64", "bf16")
#: Element types computed in a wider one inside the graph → ONNX data type at the graph's edge: an input is
#: ``Cast`` to the wider type where it enters, an output back where it leaves, and a conversion to it
#: rounds (``Cast`` there and back), so the graph's values are the element type's.
WIDENED = {"bf16": 16}
#: Element types a region's inputs and outputs may have: ``DTYPES`` (a widened one as itself), and those
#: only an ONNX node kept as ONNX computes on (the translated ops are held to ``DTYPES`` by their constraints).
#: ``DTYPES`` and the narrow and unsigned integers that only data movement and constants take (reshape,
#: transpose, gather, ...: the uint8 embedding table of an ``onnxruntime.quantization.quantize_dynamic``
#: model, read by a ``DequantizeLinear`` kept as ONNX); arithmetic stays on ``DTYPES``.
MOVED_DTYPES = {**DTYPES, "i8": (np.int8, 3), "i16": (np.int16, 5), "ui8": (np.uint8, 2), "ui16": (np.uint16, 4),
                "ui32": (np.uint32, 12), "ui64": (np.uint64, 13)}
BOUNDARY_DTYPES = {**MOVED_DTYPES, "bf16": (ml_dtypes.bfloat16, WIDENED["bf16"]), "f16": (np.float16, 10)}


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
