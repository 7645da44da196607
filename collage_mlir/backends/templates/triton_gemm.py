"""A batched GEMM with a fused epilogue in Triton, specialised at compile time (every shape and option a
``tl.constexpr``): ``out[b] = act(a[b] @ op(w[b]) + bias + residual[b])``, accumulated in f32.

Parameters are the pointers alone, in binding order (a, w, [bias], [residual], out); Triton appends two
scratch pointers, which the dispatch binds to a placeholder. Grid: (m tiles x n tiles, batch, 1).
"""

import triton
import triton.language as tl


@triton.jit
def _act(x, ACT: tl.constexpr):
    if ACT == "relu":
        x = tl.maximum(x, 0.0)
    elif ACT == "gelu":
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACT == "gelu_tanh":
        t = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = 0.5 * x * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * t)) - 1.0))
    elif ACT == "sigmoid":
        x = 1.0 / (1.0 + tl.exp(-x))
    elif ACT == "swish":
        x = x / (1.0 + tl.exp(-x))
    elif ACT == "tanh":
        x = 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0
    return x


@triton.jit
def gemm(a_ptr, w_ptr, bias_ptr, res_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
         TRANS_B: tl.constexpr, BIAS: tl.constexpr, RESIDUAL: tl.constexpr, ACT: tl.constexpr,
         PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    batch = tl.program_id(1)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    # Grouped order: GROUP row tiles share their column tiles of w while those are in L2.
    group = pid // (GROUP * tiles_n)
    first = group * GROUP
    rows = tl.minimum(tiles_m - first, GROUP)
    pid_m = first + (pid % (GROUP * tiles_n)) % rows
    pid_n = (pid % (GROUP * tiles_n)) // rows
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = a_ptr + batch * M * K + rm[:, None] * K + rk[None, :]
    if TRANS_B:
        w = w_ptr + batch * N * K + rk[:, None] + rn[None, :] * K
    else:
        w = w_ptr + batch * K * N + rk[:, None] * N + rn[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        kk = k * BK + rk
        x = tl.load(a, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        y = tl.load(w, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(x, y, acc, input_precision=PRECISION)
        a += BK
        w += BK if TRANS_B else BK * N
    if BIAS == 1:
        acc += tl.load(bias_ptr).to(tl.float32)
    elif BIAS > 1:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    offs = batch * M * N + rm[:, None] * N + rn[None, :]
    if RESIDUAL:
        acc += tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    acc = _act(acc, ACT)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
