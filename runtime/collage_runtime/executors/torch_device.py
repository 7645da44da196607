"""Runs a step program (``collage_runtime.steps.StepProgram``) with torch on the device its inputs live on: the
device executor (``takes_dlpack``, see ``executors``) of the ``cublas`` and ``cudnn`` backends.

On CUDA, convolutions go to cuDNN (``torch.cudnn_convolution_relu`` / ``cudnn_convolution_add_relu`` where
the epilogue is exactly bias [+ residual] + relu: one fused cuDNN call; ``F.conv2d`` otherwise, channels-last
where the region's layout is NHWC) and matmuls to cuBLAS (``torch._addmm_activation``: cuBLASLt's bias + relu
or bias + GELU epilogue for 2-D; ``addmm`` / ``baddbmm`` with the bias as C otherwise), the rest of the
epilogue in place after. On a CPU program (and in the tests) the same steps run on CPU tensors. Every other
step runs as ``executors.torch_steps`` runs it (``run_step``).

f32 is computed in f32 (no TF32) and f16 GEMMs reduce in f32: ``exact_float`` sets both, process-wide, at
load; the backends' tolerances assume it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from ..engines import Engines
from ..steps import Conv2d, Matmul, PostOps, Step
from . import Run
from .torch_steps import NCHW, OIHW, Kernels, as_layout, finish_epilogue, read_program, run_step, split_constants

#: The GELU that ``torch._addmm_activation(..., use_gelu=True)`` computes on each device type, as a
#: ``PostOps.algorithm``: cuBLASLt's epilogue is the tanh approximation, the CPU kernel erf (torch's own
#: decomposition of ``aten._addmm_activation`` says the same).
_ADDMM_GELU = {"cuda": "tanh", "cpu": "none"}
_NHWC = "b01f"
#: Whether this torch build has cuDNN (its fused convolution ops exist only there).
_CUDNN = torch.backends.cudnn.is_available()


def exact_float() -> None:
    """No TF32 for f32 convolutions and matmuls (cuDNN's default allows it on Ampere and later), and f16 GEMM
    reductions in f32. Process-wide torch settings, set through the legacy flags, which cover convolutions
    and matmuls alike (mixing them with the per-op ``fp32_precision`` API makes torch refuse to read them)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False


def _conv2d(conv: Conv2d, post: PostOps, args: list[torch.Tensor]) -> torch.Tensor:
    lhs, rhs, out = conv.layouts
    x = as_layout(args[0], lhs, NCHW)  # an NHWC input is a channels-last NCHW view: no copy
    fmt = torch.channels_last if lhs == _NHWC else torch.contiguous_format
    w = as_layout(args[1], rhs, OIHW).contiguous(memory_format=fmt)
    rest = args[2:]
    bias = rest.pop(0).reshape(post.bias_size) if post.bias else None
    residual = as_layout(rest.pop(0), out, NCHW) if post.binary else None
    geometry = (list(conv.stride), list(conv.padding), list(conv.dilation), conv.groups)
    if x.is_cuda and _CUDNN and torch.backends.cudnn.enabled and post.act == "relu":
        y = (torch.cudnn_convolution_relu(x, w, bias, *geometry) if residual is None
             else torch.cudnn_convolution_add_relu(x, w, residual, 1.0, bias, *geometry))
    else:
        y = finish_epilogue(F.conv2d(x, w, bias, *geometry), post, residual)
    return as_layout(y, NCHW, out)


def _lt_epilogue(post: PostOps, a: torch.Tensor) -> bool:
    """Whether ``post`` is exactly what ``torch._addmm_activation`` computes: bias, then relu or its GELU."""
    return (post.bias and post.binary is None and a.dim() == 2
            and (post.act == "relu" or (post.act == "gelu" and post.algorithm == _ADDMM_GELU.get(a.device.type))))


def _matmul(mm: Matmul, post: PostOps, args: list[torch.Tensor]) -> torch.Tensor:
    a, b = args[0], args[1]
    b = b.transpose(-1, -2) if mm.transpose_rhs else b
    rest = args[2:]
    bias = rest.pop(0).reshape(-1) if post.bias else None
    residual = rest.pop(0) if post.binary else None
    if bias is not None and _lt_epilogue(post, a):
        return torch._addmm_activation(bias, a, b, use_gelu=post.act == "gelu")
    if bias is None:
        y = torch.matmul(a, b)
    elif a.dim() == 2:
        y = torch.addmm(bias, a, b)
    else:  # batch dims flattened into one: a strided-batched GEMM with the bias as C
        y = torch.baddbmm(bias, a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]))
        y = y.reshape(a.shape[:-1] + b.shape[-1:])
    return finish_epilogue(y, post, residual)


#: cuDNN convolutions and cuBLAS(Lt) GEMMs on CUDA tensors; torch's CPU kernels on CPU tensors.
DEVICE = Kernels(_conv2d, _matmul)


def _synchronize(device: torch.device) -> None:
    """Waits for the work queued on ``device`` (IREE's streams do not order against torch's)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def load(path: Path, engines: Engines) -> Run:
    """The device run of the step program stored at ``path``: ``run(inputs) -> results`` takes DLPack
    producers over the program's buffers and returns one contiguous torch tensor per output, on the inputs'
    device, its work finished. Constants are materialised on that device at the first call. ArtifactError
    where the file is not a step program this runtime reads."""
    engines.torch()
    exact_float()
    program = read_program(path)
    results = program.results
    consts: dict[int, torch.Tensor] = {}
    compute: list[Step] = []
    on: list[torch.device] = []  # the device the constants live on, set by the first call

    def run(inputs: Sequence) -> list[torch.Tensor]:
        values: dict[int, torch.Tensor] = {i: torch.from_dlpack(x) for i, x in enumerate(inputs)}
        device = values[0].device
        if not on:
            made, steps = split_constants(program, DEVICE, device)
            consts.update(made)
            compute.extend(steps)
            on.append(device)
        elif on[0] != device:
            raise ValueError(f"step program {path}: inputs on {device}, its constants on {on[0]}")
        values.update(consts)
        for s in compute:
            values[s.out] = run_step(s, [values[i] for i in s.ins], DEVICE, device)
        out = [values[v].clone() if v in consts else values[v].contiguous() for v in results]
        _synchronize(device)
        return out

    run.takes_dlpack = True  # type: ignore[attr-defined]
    return run
