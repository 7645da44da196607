"""`onednn`: convolutions and matmuls on the oneDNN and MKL that PyTorch 2.13 bundles.

Build translates the region function into a small step program (JSON) that the runtime executor
``collage_runtime.executors.torch_steps`` runs with torch on zero-copy views of IREE buffers.
A convolution followed by a bias add and relu becomes one ``mkldnn._convolution_pointwise`` call
(oneDNN post-ops); matmuls go to ``torch.matmul`` (MKL GEMM).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..dialects import stablehlo as sh
from ..ir import ir
from .base import Backend, BackendKind, RegionArtifact, Tolerance
from .patterns import Follower, OpPattern
from .steps import translate_region

# Constraints are data-facing predicates: each returns None when satisfied, else the reason.


def _all_f32(op: ir.Operation) -> str | None:
    for v in list(op.operands) + list(op.results):
        tt = sh.tensor_type(v)
        if tt is None or tt[1] != "f32":
            return "needs static-shaped f32 tensors"
    return None


def _conv2d_nchw(op: ir.Operation) -> str | None:
    info = sh.conv_info(op)
    if (info.lhs_layout, info.rhs_layout, info.out_layout) != ("bf01", "oi01", "bf01"):
        return "needs NCHW/OIHW layout"
    if info.spatial_rank != 2:
        return "needs 2 spatial dims"
    if info.batch_groups != 1 or any(d != 1 for d in info.lhs_dilation):
        return "no batch groups or input dilation"
    if any(lo != hi for lo, hi in info.padding):
        return "needs symmetric padding"
    return None


def _plain_matmul(op: ir.Operation) -> str | None:
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


def _bias_add(user: ir.Operation, chain: ir.Value) -> str | None:
    other = [v for v in user.operands if v != chain]
    if len(other) != 1:
        return "bias add needs one other operand"
    p = other[0].owner
    if isinstance(p, ir.Block) or p.operation.name != "stablehlo.broadcast_in_dim":
        return "bias must be broadcast along the channel dim"
    dims = sh.broadcast_dims(p)
    src = sh.tensor_type(p.operation.operands[0])[0]
    kept = [d for d, n in zip(dims, src) if n != 1]
    return None if kept in ([1], []) else "bias must be broadcast along the channel dim"


def _relu(user: ir.Operation, chain: ir.Value) -> str | None:
    other = [v for v in user.operands if v != chain]
    if len(other) != 1 or isinstance(other[0].owner, ir.Block):
        return "relu needs a constant zero"
    value = sh.constant_value(other[0].owner)
    return None if value is not None and not value.any() else "relu needs a constant zero"


BIAS = Follower("bias", "stablehlo.add", _bias_add, absorb=("stablehlo.broadcast_in_dim",))
RELU = Follower("relu", "stablehlo.maximum", _relu)


class OneDnnBackend(Backend):
    name = "onednn"
    kind = BackendKind.LIBRARY
    install_hint = "pip install torch==2.13.0"
    # oneDNN/MKL reorder the reduction; measured max relative error stays under 1e-5 with atol for
    # values near zero (see test/python/test_onednn.py).
    tolerance = Tolerance(rtol=1e-4, atol=1e-5)
    patterns = (
        OpPattern("conv2d", "stablehlo.convolution", (_all_f32, _conv2d_nchw), (BIAS, RELU)),
        OpPattern("matmul", "stablehlo.dot_general", (_all_f32, _plain_matmul), (BIAS, RELU)),
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
        program = translate_region(func)
        path = Path(out_dir) / "regions" / f"{region}.onednn.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(program, indent=1))
        return RegionArtifact(str(path.relative_to(out_dir)), "collage_runtime.executors.torch_steps")
