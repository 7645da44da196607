"""Ops that move elements: ``reshape``, ``transpose``, ``broadcast_in_dim``, ``concatenate``, slices
(static, and dynamic as ``lax.scan`` reads and writes its steps), ``pad`` and ``reverse``."""

from __future__ import annotations

import numpy as np

from ..dialects import stablehlo as sh
from ..ir import ir
from .builder import _Builder
from .registry import known_types, register, static_known_types, static_moved_types
from .values import DTYPES, _dims, _dtype, _int_attr, _shape


@register("stablehlo.reshape", when=(static_moved_types,))
def _reshape(b: _Builder, op, ins):
    return [b.reshape(ins[0], _shape(op.results[0]))]


@register("stablehlo.transpose", when=(static_moved_types,), dynamic=True)
def _transpose(b: _Builder, op, ins):
    return [b.node("Transpose", ins, perm=sh.permutation(op))]


@register("stablehlo.broadcast_in_dim", when=(static_moved_types,))
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


@register("stablehlo.concatenate", when=(static_moved_types,), dynamic=True)
def _concatenate(b: _Builder, op, ins):
    return [b.node("Concat", ins, axis=_int_attr(op, "dimension"))]


@register("stablehlo.slice", when=(static_moved_types,))
def _slice(b: _Builder, op, ins):
    starts = sh._array_attr(op, "start_indices", [])
    ends = sh._array_attr(op, "limit_indices", [])
    steps = sh._array_attr(op, "strides", [1] * len(starts))
    return [b.node("Slice", [ins[0], b.ints(starts), b.ints(ends), b.ints(range(len(starts))), b.ints(steps)])]


@register("stablehlo.real_dynamic_slice", when=(known_types,), dynamic=True)
def _real_dynamic_slice(b: _Builder, op, ins):
    """Starts, limits and strides computed from the dims (jax slices a dynamic tensor so along a static axis,
    as ``jnp.split`` does): ONNX ``Slice`` takes them as tensors. In range, as StableHLO requires."""
    bounds = [v if _dtype(o) == "i64" else b.node("Cast", [v], to=DTYPES["i64"][1])
              for v, o in zip(ins[1:], list(op.operands)[1:])]
    rank = len(_dims(op.results[0]))
    return [b.node("Slice", [ins[0], bounds[0], bounds[1], b.ints(range(rank)), bounds[2]])]


def _clamped_starts(b: _Builder, starts: list[str], dtype: str, hi: list[int]) -> str:
    """The rank-0 start indices ``starts`` as one i64 vector, each clamped into ``[0, hi]`` as StableHLO
    clamps dynamic slice starts."""
    parts = [b.reshape(s if dtype == "i64" else b.node("Cast", [s], to=DTYPES["i64"][1]), [1]) for s in starts]
    v = b.node("Concat", parts, axis=0) if len(parts) > 1 else parts[0]
    return b.node("Min", [b.node("Max", [v, b.ints([0] * len(hi), "lo")]), b.ints(hi, "hi")])


@register("stablehlo.dynamic_slice", when=(static_known_types,))
def _dynamic_slice(b: _Builder, op, ins):
    """``Slice`` from the clamped run-time starts (JAX's ``lax.scan`` reads step ``i`` of its inputs so)."""
    shape, sizes = _shape(op.operands[0]), sh._array_attr(op, "slice_sizes", [])
    start = _clamped_starts(b, ins[1:], _dtype(op.operands[1]), [d - z for d, z in zip(shape, sizes)])
    end = b.node("Add", [start, b.ints(sizes, "sizes")])
    return [b.node("Slice", [ins[0], start, end, b.ints(range(len(shape)), "axes")])]


@register("stablehlo.dynamic_update_slice", when=(static_known_types,))
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


def plain_pad(op: ir.Operation) -> str | None:
    """non-negative edge padding, no interior padding"""
    lo = sh._array_attr(op, "edge_padding_low", [])
    hi = sh._array_attr(op, "edge_padding_high", [])
    if any(p < 0 for p in lo + hi):
        return "no negative padding"
    if any(p != 0 for p in sh._array_attr(op, "interior_padding", [])):
        return "no interior padding"
    return None


@register("stablehlo.pad", when=(static_known_types, plain_pad))
def _pad(b: _Builder, op, ins):
    lo = sh._array_attr(op, "edge_padding_low", [])
    hi = sh._array_attr(op, "edge_padding_high", [])
    value = b.reshape(ins[1], [], _shape(op.operands[1]))
    return [b.node("Pad", [ins[0], b.ints(lo + hi), value], mode="constant")]


@register("stablehlo.reverse", when=(static_known_types,))
def _reverse(b: _Builder, op, ins):
    dims = sh._array_attr(op, "dimensions", [])
    return [_flip(b, ins[0], dims, _shape(op.operands[0]))]


def _flip(b: _Builder, x: str, axes: list[int], shape: list[int]) -> str:
    """``x`` (of ``shape``) reversed along ``axes``: a Slice with step -1 (ONNX has no reverse op), ending
    one before the first element (not at INT64_MIN: OpenVINO's i64 constants must fit 32 bits)."""
    n = len(axes)
    return b.node("Slice", [x, b.ints([-1] * n), b.ints([-shape[a] - 1 for a in axes]), b.ints(axes), b.ints([-1] * n)])


# --- Shape arithmetic with dynamic dims (a model's dynamic translation: ``translate(dynamic=True)``) -----


@register("stablehlo.get_dimension_size", when=(known_types,), dynamic=True)
def _dimension_size(b: _Builder, op, ins):
    d = _int_attr(op, "dimension")
    size = b.node("Shape", ins, start=d, end=d + 1)
    return [b.node("Cast", [b.reshape(size, [])], to=DTYPES[_dtype(op.results[0])][1])]


@register("stablehlo.dynamic_reshape", when=(known_types,), dynamic=True)
def _dynamic_reshape(b: _Builder, op, ins):
    return [b.node("Reshape", [ins[0], b.node("Cast", [ins[1]], to=DTYPES["i64"][1])])]


@register("stablehlo.dynamic_broadcast_in_dim", when=(known_types,), dynamic=True, broadcasts=True)
def _dynamic_broadcast(b: _Builder, op, ins):
    """The operand's dims put in the result's order, unit axes inserted where the result has dims of its
    own, then ``Expand`` to the shape operand: numpy broadcasting, so an operand dim expands where it is 1
    and must equal the result's elsewhere (as ``dynamic_broadcast_in_dim`` asks). The ``Expand`` waits for a
    consumer that needs it (``_Builder.lazy``): an elementwise op with an operand at the result's shape
    broadcasts the unexpanded tensor itself. An unexpanded operand stays so: its dims are 1 or the
    result's."""
    dims = sh.broadcast_dims(op)
    rank = len(_dims(op.results[0]))
    order = sorted(range(len(dims)), key=lambda k: dims[k])
    x = b.transpose(ins[0], order)
    missing = [a for a in range(rank) if a not in dims]
    if missing:
        x = b.node("Unsqueeze", [x, b.ints(missing)])
    elif x == ins[0]:
        x = b.node("Identity", [x])  # a name of its own, to be left unexpanded
    b.lazy[x] = ins[1]  # expanded where a consumer needs the result's shape (``_Builder.expanded``)
    return [x]
