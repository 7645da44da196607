"""`onednn`: convolutions and matmuls on the oneDNN and MKL that PyTorch 2.13 bundles.

Build translates the region function into a step program (``collage_runtime.steps.StepProgram``, written
as JSON) that the runtime executor ``collage_runtime.executors.torch_steps`` runs with torch on zero-copy
views of IREE buffers.

- conv2d: any 2-D layout. oneDNN prefers NCHW or channels-last; other layouts are permuted views
  inside the region (channels-last costs no copy: a permuted NHWC tensor *is* channels-last NCHW).
  Bias, a residual add and an activation (relu, gelu, sigmoid, silu, tanh, hardtanh/relu6,
  hardswish, hardsigmoid, leaky relu) become oneDNN post-ops of one
  ``mkldnn._convolution_pointwise`` call.
- matmul / batch matmul / linear: MKL GEMM written straight into the result buffer (``addmm`` folds
  the bias in as beta=1), then residual add and activation in place on that buffer.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..dialects import stablehlo as sh
from ..ir import ir
from .base import Backend, BackendKind, RegionArtifact, Tolerance
from .patterns import ActivationFollower, Follower, OpPattern, static_f32
from .steps import translate_region

# Constraints are data-facing predicates: each returns None when satisfied, else the reason.


def _conv2d(op: ir.Operation) -> str | None:
    """2-D, any layout (transposed to NCHW inside the region), symmetric padding, no batch groups"""
    info = sh.conv_info(op)
    if info.spatial_rank != 2:
        return "needs 2 spatial dims"
    if info.batch_groups != 1 or any(d != 1 for d in info.lhs_dilation):
        return "no batch groups or input dilation"
    if any(lo != hi for lo, hi in info.padding):
        return "needs symmetric padding"
    return None


def _plain_matmul(op: ir.Operation) -> str | None:
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
#: oneDNN eltwise post-ops reachable through torch's mkldnn pointwise ops.
ACTIVATION = ActivationFollower("activation", allowed=("relu", "gelu", "sigmoid", "swish", "tanh", "hardtanh",
                                                       "hardswish", "hardsigmoid", "leaky_relu"))


class OneDnnBackend(Backend):
    name = "onednn"
    kind = BackendKind.LIBRARY
    install_hint = "pip install torch==2.13.0"
    # oneDNN/MKL reorder the reduction; measured max relative error stays under 1e-5 with atol for
    # values near zero (see test/python/backends/test_onednn.py).
    tolerance = Tolerance(rtol=1e-4, atol=1e-5)
    patterns = (
        OpPattern("conv2d", "stablehlo.convolution", (static_f32, _conv2d), (BIAS, RESIDUAL, ACTIVATION)),
        OpPattern("matmul", "stablehlo.dot_general", (static_f32, _plain_matmul),
                  (SCALE, BIAS, RESIDUAL, ACTIVATION)),
    )

    def available(self) -> str | None:
        try:
            import torch
        except ImportError:
            return "torch is not installed"
        if not torch.backends.mkldnn.is_available():
            return "this torch build has no oneDNN"
        return None

    def version(self) -> str:
        import torch

        return f"torch-{torch.__version__}"

    def build(self, func: ir.Operation, out_dir: Path, region: str) -> RegionArtifact:
        program = translate_region(func, self.patterns)
        path = Path(out_dir) / "regions" / f"{region}.onednn.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(program.to_json(), indent=1))
        return RegionArtifact(str(path.relative_to(out_dir)), "collage_runtime.executors.torch_steps")
