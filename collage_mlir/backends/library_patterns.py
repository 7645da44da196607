"""What the library backends that run step programs share (``onednn`` on the CPU, ``cublas`` and ``cudnn`` on
CUDA): the conv2d and plain-matmul anchor constraints, the epilogue followers a step program fuses (a ×1
scale, a bias, a residual add), and the build (``StepProgramBackend``: the region translated into a
``collage_runtime.steps.StepProgram`` JSON file). Each backend adds its own element types and the
activations its library runs (an ``ActivationFollower`` with its ``allowed`` names).

Constraints are data-facing predicates: each returns None when satisfied, else the reason; the first line
of a docstring is what ``collage backends`` prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import numpy as np

from ..dialects import stablehlo as sh
from ..ir import ir
from .base import Backend, BackendKind, Platform, RegionArtifact
from .patterns import ActivationFollower, Constraint, Follower
from .steps import translate_region


def static_of(*elements: str) -> Constraint:
    """The constraint: static-shaped tensors, all of one element type among ``elements``."""

    def check(op: ir.Operation) -> str | None:
        types = {None if (tt := sh.tensor_type(v)) is None else tt[1] for v in list(op.operands) + list(op.results)}
        if len(types) != 1 or next(iter(types)) not in elements:
            return f"needs static-shaped tensors of one element type: {' or '.join(elements)}"
        return None

    check.__doc__ = f"static-shaped {'/'.join(elements)} tensors (one element type)"
    return check


def conv2d_any(op: ir.Operation) -> str | None:
    """2-D, any layout, padding, stride, dilation and feature groups; no input dilation or batch groups"""
    info = sh.conv_info(op)
    if info.spatial_rank != 2:
        return "needs 2 spatial dims"
    if info.batch_groups != 1 or any(d != 1 for d in info.lhs_dilation):
        return "no batch groups or input dilation"
    return None


def conv2d(op: ir.Operation) -> str | None:
    """2-D, any layout (transposed to NCHW inside the region), symmetric padding, no batch groups"""
    why = conv2d_any(op)
    if why is None and any(lo != hi for lo, hi in sh.conv_info(op).padding):
        return "needs symmetric padding"
    return why


def plain_matmul(op: ir.Operation) -> str | None:
    """[batch..] x M x K times [batch..] x K x N (or N x K)"""
    d = sh.dot_info(op)
    lhs_rank = len(sh.tensor_type(op.operands[0])[0])
    rhs_rank = len(sh.tensor_type(op.operands[1])[0])
    nb = len(d.lhs_batch)
    if d.lhs_batch != list(range(nb)) or d.rhs_batch != list(range(nb)):
        return "batch dims must lead"
    if lhs_rank != nb + 2 or rhs_rank != nb + 2 or len(d.lhs_contract) != 1:
        return "needs [batch..] x M x K times [batch..] x K x N (or N x K)"
    if d.lhs_contract != [nb + 1] or d.rhs_contract[0] not in (nb, nb + 1):
        return "contracting dims must be K"
    return None


def _others(user: ir.Operation, chain: ir.Value) -> list[ir.Value]:
    return [v for v in user.operands if v != chain]


def _times_one(user: ir.Operation, chain: ir.Value) -> str | None:
    """multiply by a constant 1 (torch-mlir's Linear scale)"""
    other = _others(user, chain)
    value = sh.const_expr_value(other[0]) if len(other) == 1 else None
    return None if value is not None and bool(np.all(value == 1)) else "not a multiply by ones"


def _bias_add(user: ir.Operation, chain: ir.Value) -> str | None:
    """add of a vector broadcast along one dim"""
    other = _others(user, chain)
    if len(other) != 1:
        return "bias add needs one other operand"
    p = other[0].owner
    if isinstance(p, ir.Block) or p.operation.name != "stablehlo.broadcast_in_dim":
        return "bias must be a broadcast vector"
    src = sh.tensor_type(p.operation.operands[0])[0]
    kept = [d for d, n in zip(sh.broadcast_dims(p), src) if n != 1]
    return None if len(kept) <= 1 else "bias must be a broadcast vector"


def _residual_add(user: ir.Operation, chain: ir.Value) -> str | None:
    """add of a same-shaped tensor (a residual connection)"""
    other = _others(user, chain)
    if len(other) != 1 or sh.tensor_type(other[0]) != sh.tensor_type(chain):
        return "needs a same-shaped operand"
    if sh.const_expr_ops(other[0]) is not None:
        return "a constant is a bias, not a residual"
    return None


SCALE = Follower("scale", "stablehlo.multiply", _times_one)
BIAS = Follower("bias", "stablehlo.add", _bias_add, absorb=("stablehlo.broadcast_in_dim",))
RESIDUAL = Follower("residual", "stablehlo.add", _residual_add)

#: The activations the torch step executors apply after a fused conv2d or matmul (``collage_runtime.steps``
#: names them; ``executors.torch_steps`` runs each in place).
TORCH_ACTIVATIONS = ("relu", "gelu", "sigmoid", "swish", "tanh", "hardtanh", "hardswish", "hardsigmoid",
                     "leaky_relu")

# The CUDA libraries (cublas, cudnn): f32 and f16 (bf16 has no host dtype a step program can carry, see
# ``collage_runtime.types``), any activation the torch executor applies.
STATIC_F32_F16 = static_of("f32", "f16")
TORCH_ACTIVATION = ActivationFollower("activation", allowed=TORCH_ACTIVATIONS)


def _torch_cuda_version() -> str:
    """``torch-<version>`` and the CUDA (cuBLAS) and cuDNN versions of that torch build where it has them."""
    import torch

    parts = [f"torch-{torch.__version__}"]
    if torch.version.cuda:
        parts.append(f"cuda-{torch.version.cuda}")
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if cudnn:
        parts.append(f"cudnn-{cudnn}")
    return " ".join(parts)


class StepProgramBackend(Backend):
    """A library backend whose regions are step programs: ``build`` translates the region function, its
    patterns' anchors fused with their epilogues, and writes ``regions/<region>.<backend>.json`` for the
    runtime executor ``executor``."""

    executor: ClassVar[str]

    def build(self, func: ir.Operation, out_dir: Path, region: str) -> RegionArtifact:
        program = translate_region(func, self.patterns)
        path = Path(out_dir) / "regions" / f"{region}.{self.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(program.to_json(), indent=1))
        return RegionArtifact(str(path.relative_to(out_dir)), self.executor)


class CudaLibraryBackend(StepProgramBackend):
    """A CUDA library (cuBLAS, cuDNN) reached through torch: regions only in CUDA programs, run by the device
    executor ``torch_device`` on the program's buffers. Building needs torch only (any build: GPU programs
    are compiled on CPU machines); running needs a CUDA build."""

    kind = BackendKind.LIBRARY
    platforms: ClassVar[frozenset[Platform]] = frozenset({Platform.CUDA})
    requires = ("torch",)
    install_hint = "pip install torch==2.13.0 (a CUDA build to run; any build compiles)"
    executor = "collage_runtime.executors.torch_device"

    def version(self) -> str:
        return _torch_cuda_version()
