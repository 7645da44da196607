"""A 2-D convolution with a fused epilogue in Triton, as an implicit GEMM per feature group, specialised at
compile time (every shape, stride and option a ``tl.constexpr``): ``y = act(conv2d(x, w) + bias + residual)``,
accumulated in f32. Rows of the GEMM are output pixels (batch x rows x columns), columns the group's output
channels, the reduction its input channels x kernel rows x kernel columns; every tensor is addressed through
its element strides, so NCHW, NHWC and any other layout are read in place. ``depthwise_conv2d`` (one
channel a group) is direct instead: a tile of pixels x channels, one multiply-add a kernel tap, no dot.

Parameters are the pointers alone, in binding order (x, w, [bias], [residual], y); Triton appends two
scratch pointers, which the dispatch binds to a placeholder. Grid: (pixel tiles x channel tiles, groups, 1).
"""

import triton
import triton.language as tl

from .triton_gemm import _act


@triton.jit
def conv2d(x_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, N: tl.constexpr, C: tl.constexpr, H: tl.constexpr,
           W: tl.constexpr, K: tl.constexpr, R: tl.constexpr, S: tl.constexpr, OH: tl.constexpr,
           OW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
           DH: tl.constexpr, DW: tl.constexpr, GROUPS: tl.constexpr,
           XN: tl.constexpr, XC: tl.constexpr, XH: tl.constexpr, XW: tl.constexpr,
           WO: tl.constexpr, WI: tl.constexpr, WR: tl.constexpr, WS: tl.constexpr,
           YN: tl.constexpr, YC: tl.constexpr, YH: tl.constexpr, YW: tl.constexpr,
           BIAS: tl.constexpr, RESIDUAL: tl.constexpr, ACT: tl.constexpr, PRECISION: tl.constexpr,
           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    CG: tl.constexpr = C // GROUPS          # input channels a group
    KG: tl.constexpr = K // GROUPS          # output channels a group
    M: tl.constexpr = N * OH * OW           # output pixels
    RED: tl.constexpr = CG * R * S          # the reduction
    pid = tl.program_id(0)
    g = tl.program_id(1)
    tiles_n = tl.cdiv(KG, BN)
    pid_m = pid // tiles_n
    pid_n = pid % tiles_n
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    nb = rm // (OH * OW)
    oy = (rm // OW) % OH
    ox = rm % OW
    ko = g * KG + rn                         # output channels
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(RED, BK)):
        rk = k0 * BK + tl.arange(0, BK)
        ci = rk // (R * S)
        ry = (rk // S) % R
        rx = rk % S
        iy = oy[:, None] * SH - PH + ry[None, :] * DH
        ix = ox[:, None] * SW - PW + rx[None, :] * DW
        inside = (rm[:, None] < M) & (rk[None, :] < RED) & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
        a = tl.load(x_ptr + nb[:, None] * XN + (g * CG + ci[None, :]) * XC + iy * XH + ix * XW, mask=inside,
                    other=0.0)
        b = tl.load(w_ptr + ko[None, :] * WO + ci[:, None] * WI + ry[:, None] * WR + rx[:, None] * WS,
                    mask=(rk[:, None] < RED) & (rn[None, :] < KG), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    if BIAS == 1:
        acc += tl.load(bias_ptr).to(tl.float32)
    elif BIAS > 1:
        acc += tl.load(bias_ptr + ko, mask=rn < KG, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < KG)
    offs = nb[:, None] * YN + ko[None, :] * YC + oy[:, None] * YH + ox[:, None] * YW
    if RESIDUAL:
        acc += tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    acc = _act(acc, ACT)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def depthwise_conv2d(x_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, N: tl.constexpr, C: tl.constexpr, H: tl.constexpr,
                     W: tl.constexpr, K: tl.constexpr, R: tl.constexpr, S: tl.constexpr, OH: tl.constexpr,
                     OW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
                     DH: tl.constexpr, DW: tl.constexpr, GROUPS: tl.constexpr,
                     XN: tl.constexpr, XC: tl.constexpr, XH: tl.constexpr, XW: tl.constexpr,
                     WO: tl.constexpr, WI: tl.constexpr, WR: tl.constexpr, WS: tl.constexpr,
                     YN: tl.constexpr, YC: tl.constexpr, YH: tl.constexpr, YW: tl.constexpr,
                     BIAS: tl.constexpr, RESIDUAL: tl.constexpr, ACT: tl.constexpr, PRECISION: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr):
    # The same constants as ``conv2d`` (K = GROUPS = C here; WI and PRECISION unused: no dot).
    M: tl.constexpr = N * OH * OW
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(C, BN)
    rm = (pid // tiles_n) * BM + tl.arange(0, BM)
    rc = (pid % tiles_n) * BN + tl.arange(0, BN)
    nb = rm // (OH * OW)
    oy = (rm // OW) % OH
    ox = rm % OW
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for tap in range(R * S):
        iy = oy * SH - PH + (tap // S) * DH
        ix = ox * SW - PW + (tap % S) * DW
        inside = (rm < M) & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
        a = tl.load(x_ptr + (nb * XN + iy * XH + ix * XW)[:, None] + rc[None, :] * XC,
                    mask=inside[:, None] & (rc[None, :] < C), other=0.0)
        b = tl.load(w_ptr + rc * WO + (tap // S) * WR + (tap % S) * WS, mask=rc < C, other=0.0)
        acc += a.to(tl.float32) * b.to(tl.float32)[None, :]
    if BIAS == 1:
        acc += tl.load(bias_ptr).to(tl.float32)
    elif BIAS > 1:
        acc += tl.load(bias_ptr + rc, mask=rc < C, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & (rc[None, :] < C)
    offs = (nb * YN + oy * YH + ox * YW)[:, None] + rc[None, :] * YC
    if RESIDUAL:
        acc += tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    acc = _act(acc, ACT)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)
