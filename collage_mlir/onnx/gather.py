"""``stablehlo.gather`` of whole rows (embedding lookups, ``take_along_axis``) as ONNX ``Gather`` or
``GatherND``, its start indices clamped into range as StableHLO clamps them."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..dialects import stablehlo as sh
from ..errors import CollageError
from ..ir import ir
from .builder import _Builder
from .registry import register, static_moved_types
from .values import DTYPES, _dims, _dtype


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
    operand, indices, result = _dims(op.operands[0]), _dims(op.operands[1]), _dims(op.results[0])
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


#: Indices below this are exact in f32: i64 indices are clamped in f32 when every indexed dim is this short.
F32_EXACT = 2 ** 24


@register("stablehlo.gather", when=(static_moved_types, row_gather), dynamic=True)
def _gather(b: _Builder, op, ins):
    g = gather_info(op)
    operand, indices = _dims(op.operands[0]), _dims(op.operands[1])
    k = len(g.start_index_map)
    if None in [operand[d] for d in g.start_index_map]:  # the clamp's bound is the indexed dims' size
        raise CollageError(f"{op.location}: cannot export to ONNX: a gather along a dynamic dim")
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
    implicit = g.index_vector_dim == len(indices)  # each index a scalar, not a vector of one
    rest = [d for d in range(len(operand)) if d not in g.start_index_map]
    x = b.transpose(ins[0], g.start_index_map + rest)
    if k == 1:  # a row lookup (embeddings): Gather, which every engine has a fast kernel for
        y = b.node("Gather", [x, idx if implicit else b.node("Squeeze", [idx, b.ints([len(indices) - 1])])], axis=0)
    else:
        y = b.node("GatherND", [x, b.node("Unsqueeze", [idx, b.ints([len(indices)])]) if implicit else idx])
    # y is (index batch dims..., rest...); the result puts rest at offset_dims, batch dims in the others
    # (JAX's take_along_axis keeps a leading dim of size 1 as an offset dim).
    rank = len(_dims(op.results[0]))
    batch_pos = [p for p in range(rank) if p not in g.offset_dims]
    perm = [rank - len(rest) + g.offset_dims.index(p) if p in g.offset_dims else batch_pos.index(p)
            for p in range(rank)]
    return [b.transpose(y, perm)]


def slice_gather(op: ir.Operation) -> str | None:
    """a ``dynamic_gather`` that is a slice (``table[:n]`` of a length ``n``): one start index vector, nothing
    collapsed, every operand dim a result dim in order, the operand static"""
    try:
        g = gather_info(op)
    except (KeyError, ValueError):
        return "unrecognised gather attributes"
    operand, indices = _dims(op.operands[0]), _dims(op.operands[1])
    if g.batching_dims or g.collapsed_slice_dims:
        return "no batching or collapsed dims"
    if len(indices) != 1 or g.index_vector_dim != 0:
        return "one start index vector"
    if g.offset_dims != list(range(len(operand))) or None in operand:
        return "a slice of a static operand, its dims in order"
    return None


@register("stablehlo.dynamic_gather", when=(static_moved_types, slice_gather), dynamic=True)
def _dynamic_gather(b: _Builder, op, ins):
    """``Slice`` from the start indices (0 on dims they do not name) for ``slice_sizes`` (an operand), the
    starts clamped into ``[0, dim - size]`` as StableHLO clamps them."""
    g = gather_info(op)
    operand = _dims(op.operands[0])
    sizes = b.node("Cast", [ins[2]], to=DTYPES["i64"][1])
    index = b.node("Cast", [ins[1]], to=DTYPES["i64"][1])
    pieces = [b.node("Slice", [index, b.ints([g.start_index_map.index(d)]), b.ints([g.start_index_map.index(d) + 1])])
              if d in g.start_index_map else b.ints([0]) for d in range(len(operand))]
    starts = b.node("Concat", pieces, axis=0) if len(pieces) > 1 else pieces[0]
    starts = b.node("Min", [b.node("Max", [starts, b.ints([0])]), b.node("Sub", [b.ints(operand), sizes])])
    ends = b.node("Add", [starts, sizes])
    return [b.node("Slice", [ins[0], starts, ends, b.ints(range(len(operand)))])]
