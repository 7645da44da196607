"""Quantization: ``stablehlo.uniform_quantize`` (f32 → ``!quant.uniform``) as ONNX ``QuantizeLinear`` and
``stablehlo.uniform_dequantize`` as ``DequantizeLinear``, per tensor or per axis, 8-bit storage over f32
(both round half to even and saturate to the storage type's range); 32-bit storage (a QDQ model's
biases) where ONNX takes it: a quantized constant, and a dequantize. ONNX Runtime and OpenVINO fuse the
QuantizeLinear/DequantizeLinear pairs around a convolution or matmul into their int8 kernels. Quantized
values stay inside a region: a boundary never carries them (``backends.base.crossing_type_problem``)."""

from __future__ import annotations

import numpy as np

from ..dialects import stablehlo as sh
from ..ir import ir
from .builder import _Builder
from .registry import register
from .values import _constant_of

#: Storage types QuantizeLinear/DequantizeLinear take (their numpy dtypes: ``QuantType.NUMPY``); int32
#: only as DequantizeLinear's input (ONNX's QuantizeLinear has no int32 output).
STORAGE = frozenset({"i8", "u8", "i32"})


def _quantized(op: ir.Operation) -> sh.QuantType | None:
    """The quantized side of a quantize (its result) or dequantize (its operand)."""
    value = op.results[0] if op.name == "stablehlo.uniform_quantize" else op.operands[0]
    tt = sh.tensor_type(value)
    return None if tt is None else sh.quant_type(tt[1])


def integer_over_f32(op: ir.Operation) -> str | None:
    """static shapes; f32 values in 8-bit storage (full range), per tensor or per axis; 32-bit storage for a
    dequantize or a quantized constant"""
    types = [sh.tensor_type(v) for v in (*op.operands, *op.results)]
    if any(t is None for t in types):
        return "needs static-shaped tensors"
    q = _quantized(op)
    if q is None:
        return "needs one f32 side and one !quant.uniform side (no requantize)"
    if q.storage not in STORAGE or q.expressed != "f32" or q.storage_range is not None:
        return f"needs i8/u8/i32 storage (full range) of f32 values, got {q.storage} of {q.expressed}"
    if q.storage == "i32" and op.name == "stablehlo.uniform_quantize" and _constant_of(op.operands[0]) is None:
        return "needs i8/u8 storage to quantize a computed value (ONNX's QuantizeLinear has no int32 output)"
    plain = op.operands[0] if op.name == "stablehlo.uniform_quantize" else op.results[0]
    if sh.tensor_type(plain)[1] != "f32":
        return "needs one f32 side and one !quant.uniform side (no requantize)"
    return None


def _scale_zero_point(b: _Builder, q: sh.QuantType) -> tuple[list[str], dict]:
    """The scale and zero-point inputs (scalars per tensor, vectors per axis) and the ``axis`` attribute."""
    shape = () if q.axis is None else (len(q.scales),)
    scale = b.const(np.array(q.scales, np.float32).reshape(shape), "scale")
    zero_point = b.const(np.array(q.zero_points, sh.QuantType.NUMPY[q.storage]).reshape(shape), "zero_point")
    return [scale, zero_point], ({} if q.axis is None else {"axis": q.axis})


@register("stablehlo.uniform_quantize", when=(integer_over_f32,))
def _quantize(b: _Builder, op, ins):
    q = _quantized(op)
    value = _constant_of(op.operands[0])
    if value is not None:
        # A quantized weight is an 8-bit initializer: the engines fuse DequantizeLinear(initializer) into
        # their int8 kernels, where a QuantizeLinear of an f32 constant would be folded back to f32.
        return [b.const(q.quantize(np.asarray(value)), "quantized")]
    params, attrs = _scale_zero_point(b, q)
    return [b.node("QuantizeLinear", [ins[0], *params], **attrs)]


@register("stablehlo.uniform_dequantize", when=(integer_over_f32,))
def _dequantize(b: _Builder, op, ins):
    params, attrs = _scale_zero_point(b, _quantized(op))
    return [b.node("DequantizeLinear", [ins[0], *params], **attrs)]
