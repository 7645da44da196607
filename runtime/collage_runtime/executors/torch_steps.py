"""Runs a step program (``collage_runtime.steps.StepProgram``, which the compiler's
``collage_mlir.backends.steps`` writes) with torch: oneDNN convolutions with fused post-ops, MKL matmuls.
Inputs are zero-copy torch views of mapped IREE buffers; results are written into the mapped output
buffers (the last step of a result writes there directly where it can).

The step semantics every torch executor shares live here too: ``run_step`` runs any step, given the
``Kernels`` that run the two fused ones (conv2d and matmul with their epilogue), and ``split_constants``
materialises a program's constants once. ``executors.torch_device`` runs the same programs on the
device its inputs live on (cuDNN and cuBLAS on CUDA) with its own kernels."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

# OpenMP workers sleep between regions instead of spinning for ~300k iterations (GNU OpenMP's default),
# which would take cores from the engine that runs next. Read once, when torch loads libgomp.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ..engines import Engines  # noqa: E402
from ..manifest import ArtifactError  # noqa: E402
from ..steps import (Broadcast, Const, Conv2d, Convert, Matmul, PostOps, Reshape, Step, StepOp,  # noqa: E402
                     StepProgram, Transpose)
from . import Run  # noqa: E402

DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "i32": torch.int32,
          "i64": torch.int64, "i1": torch.bool}
NCHW = "bf01"
OIHW = "oi01"

#: Each activation of ``steps.ACTIVATIONS``, applied in place: ``(tensor, scalars, algorithm)``.
INPLACE_ACT: dict[str, Callable] = {
    "relu": lambda t, s, a: t.relu_(),
    "sigmoid": lambda t, s, a: t.sigmoid_(),
    "tanh": lambda t, s, a: t.tanh_(),
    "swish": lambda t, s, a: F.silu(t, inplace=True),
    "gelu": lambda t, s, a: t.copy_(F.gelu(t, approximate=a or "none")),
    "hardtanh": lambda t, s, a: t.clamp_(s[0], s[1]),
    "hardswish": lambda t, s, a: F.hardswish(t, inplace=True),
    "hardsigmoid": lambda t, s, a: F.hardsigmoid(t, inplace=True),
    "leaky_relu": lambda t, s, a: F.leaky_relu(t, s[0], inplace=True),
}


def _broadcast(x: torch.Tensor, dims: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
    view = [1] * len(shape)
    for src_axis, dst_axis in enumerate(dims):
        view[dst_axis] = x.shape[src_axis]
    return x.reshape(view).expand(shape)


def permutation(layout: str, canonical: str) -> list[int]:
    """The permutation that views a tensor in ``layout`` as ``canonical`` (e.g. b01f -> bf01)."""
    return [layout.index(c) for c in canonical]


def as_layout(x: torch.Tensor, layout: str, canonical: str) -> torch.Tensor:
    """``x``, laid out as ``layout``, viewed as ``canonical`` (no copy: a permuted view)."""
    return x.permute(permutation(layout, canonical)) if layout != canonical else x


def finish_epilogue(out: torch.Tensor, post: PostOps, residual: torch.Tensor | None) -> torch.Tensor:
    """The rest of ``post`` after its bias, in place on ``out``: the residual add, then the activation."""
    if post.binary:
        out.add_(residual)
    if post.act != "none":
        INPLACE_ACT[post.act](out, list(post.scalars), post.algorithm)
    return out


@dataclass(frozen=True)
class Kernels:
    """How an executor runs the two fused steps, each ``(attrs, post, args) -> result``: the anchor's two
    inputs come first in ``args``, then the bias (where ``post.bias``) and the residual (where
    ``post.binary``). Every other step runs the same in every torch executor (``run_step``)."""

    conv2d: Callable[[Conv2d, PostOps, list[torch.Tensor]], torch.Tensor]
    matmul: Callable[[Matmul, PostOps, list[torch.Tensor]], torch.Tensor]


def _conv2d(conv: Conv2d, post: PostOps, args: list[torch.Tensor]) -> torch.Tensor:
    lhs, rhs, out = conv.layouts
    x = as_layout(args[0], lhs, NCHW)
    w = args[1].permute(permutation(rhs, OIHW)).contiguous() if rhs != OIHW else args[1]
    rest = args[2:]
    bias = rest.pop(0).reshape(post.bias_size) if post.bias else None
    attr, scalars, algorithm = post.act, list(post.scalars), post.algorithm
    geometry = (list(conv.padding), list(conv.stride), list(conv.dilation), conv.groups)
    if post.binary:
        other = as_layout(rest.pop(0), out, NCHW)
        y = torch.ops.mkldnn._convolution_pointwise.binary(
            x, other, w, bias, *geometry, post.binary, 1.0, None if attr == "none" else attr, scalars,
            algorithm or None)
    else:
        y = torch.ops.mkldnn._convolution_pointwise(x, w, bias, *geometry, attr, scalars, algorithm)
    return as_layout(y, NCHW, out)


def _matmul(mm: Matmul, post: PostOps, args: list[torch.Tensor], out: torch.Tensor | None) -> torch.Tensor:
    a, b = args[0], args[1]
    b = b.transpose(-1, -2) if mm.transpose_rhs else b
    rest = args[2:]
    bias = rest.pop(0).reshape(-1) if post.bias else None
    if out is None:
        out = torch.empty(a.shape[:-1] + b.shape[-1:], dtype=a.dtype)
    if bias is not None and a.dim() == 2:
        torch.addmm(bias, a, b, out=out)
    else:
        torch.matmul(a, b, out=out)
        if bias is not None:
            out.add_(bias)
    return finish_epilogue(out, post, rest.pop(0) if post.binary else None)


#: oneDNN convolutions (post-ops fused) and MKL GEMM into a fresh tensor.
ONEDNN = Kernels(_conv2d, lambda mm, post, args: _matmul(mm, post, args, None))

_ELEMENTWISE: dict[StepOp, Callable] = {StepOp.ADD: torch.add, StepOp.SUB: torch.sub, StepOp.MUL: torch.mul,
                                        StepOp.DIV: torch.div, StepOp.MAX: torch.maximum,
                                        StepOp.MIN: torch.minimum}


def run_step(step: Step, args: list[torch.Tensor], kernels: Kernels,
             device: torch.device | None = None) -> torch.Tensor:
    """The value ``step`` defines from its ``args``; a constant is made on ``device`` (default: the CPU)."""
    a = step.attrs
    if isinstance(a, Conv2d):
        return kernels.conv2d(a, step.post, args)  # type: ignore[arg-type]
    if isinstance(a, Matmul):
        return kernels.matmul(a, step.post, args)  # type: ignore[arg-type]
    if a is None:
        return _ELEMENTWISE[step.op](*args)
    if isinstance(a, Broadcast):
        return _broadcast(args[0], a.dims, a.shape)
    if isinstance(a, Reshape):
        return args[0].reshape(a.shape)
    if isinstance(a, Transpose):
        return args[0].permute(a.perm)
    if isinstance(a, Convert):
        return args[0].to(DTYPES[a.dtype])
    if isinstance(a, Const):
        return torch.tensor(a.value, dtype=DTYPES[a.dtype], device=device).reshape(a.shape)
    raise ValueError(f"unknown step op {step.op!r}")


def split_constants(program: StepProgram, kernels: Kernels,
                    device: torch.device | None = None) -> tuple[dict[int, torch.Tensor], list[Step]]:
    """The program's constants and what is computed from them alone, materialised on ``device`` (once: a
    run reads them every call), and the steps left to run per call."""
    consts: dict[int, torch.Tensor] = {}
    compute: list[Step] = []
    for s in program.steps:
        if all(i in consts for i in s.ins) and (s.op is StepOp.CONST or s.ins):
            consts[s.out] = run_step(s, [consts[i] for i in s.ins], kernels, device)
        else:
            compute.append(s)
    return consts, compute


def read_program(path: Path) -> StepProgram:
    """The step program stored at ``path``; ArtifactError where it is not one this runtime reads."""
    try:
        return StepProgram.from_json(json.loads(Path(path).read_text()))
    except ValueError as exc:  # json.JSONDecodeError is one
        raise ArtifactError(f"{path}: {str(exc).splitlines()[0]}; recompile the artifact") from None


def _work(step: Step, args: list[torch.Tensor], y: torch.Tensor) -> int:
    """Multiply-adds of a convolution or matmul step, else one per element it produces."""
    a = step.attrs
    if isinstance(a, Conv2d):
        w = args[1]
        return y.numel() * (w.numel() // w.shape[a.layouts[1].index("o")])
    if isinstance(a, Matmul):
        return args[0].numel() * args[1].shape[-2 if a.transpose_rhs else -1]
    return y.numel()


def load(path: Path, engines: Engines) -> Run:
    """The callable that runs the step program stored at ``path`` with the program's thread budget, or
    with one thread where its work is small (``engines.SMALL_REGION_MACS``: counted on the first call).
    ArtifactError where the file is not a step program this runtime reads."""
    engines.torch()
    program = read_program(path)
    results = list(program.results)
    # Constants (and what is computed from them alone) are materialised once, not per call.
    consts, compute = split_constants(program, ONEDNN)
    # A matmul whose value is exactly one result (used by nothing else) writes into that buffer.
    uses: dict[int, int] = {}
    for s in compute:
        for i in s.ins:
            uses[i] = uses.get(i, 0) + 1
    direct = {s.out: results.index(s.out) for s in compute
              if s.op is StepOp.MATMUL and results.count(s.out) == 1 and s.out not in uses}

    def body(inputs: list[np.ndarray], outputs: list[np.ndarray], work: list[int] | None = None) -> None:
        values: dict[int, torch.Tensor] = dict(consts)
        for i, arr in enumerate(inputs):
            values[i] = torch.from_numpy(arr)
        written = set()
        for s in compute:
            args = [values[i] for i in s.ins]
            if s.out in direct:
                k = direct[s.out]
                values[s.out] = _matmul(s.attrs, s.post, args, torch.from_numpy(outputs[k]))  # type: ignore[arg-type]
                written.add(k)
            else:
                values[s.out] = run_step(s, args, ONEDNN)
            if work is not None:
                work.append(_work(s, args, values[s.out]))
        for k, (out, vid) in enumerate(zip(outputs, results)):
            if k not in written:
                torch.from_numpy(out).copy_(values[vid])

    threads = engines.threads
    if threads == 1:
        return body
    small: list[bool] = []  # decided on the first call, from the shapes it ran

    def run(inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        if not small:
            work: list[int] = []
            body(inputs, outputs, work)
            small.append(engines.region_threads(sum(work)) == 1)
        elif small[0]:
            # torch's thread count is process-wide: set around the call (~1 µs), back to the budget after.
            torch.set_num_threads(1)
            try:
                body(inputs, outputs)
            finally:
                torch.set_num_threads(threads)
        else:
            body(inputs, outputs)

    return run
