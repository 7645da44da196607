"""Window ops in any layout (NCHW, JAX's NHWC...): ``stablehlo.reduce_window`` as pooling (``MaxPool``;
a sum as ``AveragePool``) or as a cumulative sum (``CumSum``), and ``stablehlo.convolution`` as ``Conv``
(input dilation as ``ConvTranspose``)."""

from __future__ import annotations

import numpy as np

from ..dialects import stablehlo as sh
from ..ir import ir
from .builder import _Builder
from .movement import _flip
from .registry import float_operands, numeric_operands, register, static_known_types
from .values import DTYPES, _constant_of, _dims, _dtype, _shape


def _window_padding(op: ir.Operation, rank: int) -> list[tuple[int, int]]:
    if "padding" not in op.attributes:
        return [(0, 0)] * rank
    flat = sh._int_list(str(op.attributes["padding"]).split(":")[0])
    if len(flat) == 1:
        flat = flat * (2 * rank)
    return [(flat[2 * i], flat[2 * i + 1]) for i in range(rank)]


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
    if len(op.operands) != 2 or sh.reduce_kind(op) != "add":
        return None
    shape = _dims(op.operands[0])
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
    kind = sh.reduce_kind(op)
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
    shape = _dims(op.operands[0])
    free = [a for a in range(len(shape)) if a not in pooled]
    if any(shape[a] is None for a in pooled) or (len(free) != 2 and any(shape[a] is None for a in free)):
        return "a dynamic dim only among the window's two independent dims (batch and channel)"
    return None


@register("stablehlo.reduce_window", when=(static_known_types, supported_window), dynamic=True)
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
    shape, out_shape = _dims(op.operands[0]), _dims(op.results[0])
    pooled = _pooled_dims(op)
    free = [a for a in range(rank) if a not in pooled]
    perm = free + pooled
    x = b.transpose(ins[0], perm)
    rows = [shape[a] for a in free]
    if len(free) != 2:
        x = b.reshape(x, [1, int(np.prod(rows, dtype=np.int64))] + [shape[a] for a in pooled])
    window = dict(kernel_shape=[dims[a] for a in pooled], strides=[strides[a] for a in pooled],
                  pads=[pads[a][0] for a in pooled] + [pads[a][1] for a in pooled])
    if sh.reduce_kind(op) == "add":
        y = b.node("AveragePool", [x], count_include_pad=1, **window)
        size = np.asarray(np.prod([dims[a] for a in pooled]), dtype=DTYPES[_dtype(op.operands[0])][0])
        y = b.node("Mul", [y, b.const(size, "window")])
    else:
        y = b.node("MaxPool", [x], **window)
    if len(free) != 2:
        y = b.reshape(y, rows + [out_shape[a] for a in pooled])
    y = b.transpose(y, [perm.index(a) for a in range(rank)])
    init = _constant_of(op.operands[1])
    if sh.reduce_kind(op) == "max" and (
            init is None or not (np.isneginf(init).all() or (init == np.finfo(init.dtype).min).all())):
        y = b.node("Max", [y, ins[1]])
    return [y]


def _kernel_extent(op: ir.Operation, info: sh.ConvInfo) -> list[int]:
    """The dilated kernel size per spatial dim, ``(k - 1) * rhs_dilation + 1``."""
    ks = _shape(op.operands[1])
    return [(ks[info.rhs_layout.index(str(i))] - 1) * r + 1 for i, r in enumerate(info.rhs_dilation)]


def plain_convolution(op: ir.Operation) -> str | None:
    """1-3 spatial dims, any layout and groups; no batch groups or negative padding; lhs dilation as ConvTranspose
    (then stride 1 and padding below the dilated kernel size); a static kernel (the input's dims may be dynamic)"""
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
    if sh.tensor_type(op.operands[1]) is None:
        return "needs a static kernel shape"
    return None


@register("stablehlo.convolution", when=(static_known_types, float_operands, plain_convolution), dynamic=True)
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
