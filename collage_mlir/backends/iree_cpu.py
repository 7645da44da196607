"""`iree-cpu`: IREE llvm-cpu codegen for the host CPU. Takes every tensor op; the default backend."""

from __future__ import annotations

from ..ir import ir
from .base import BackendKind, OpSetBackend
from .patterns import OpPattern

# Ops of these dialects compute on tensors and can be outlined into a region function. Others
# (check.*, util.* globals, hal.*) keep their place in the program and stay on the default backend.
COMPUTE_DIALECTS = ("stablehlo", "chlo", "arith", "math", "tensor", "linalg", "tosa")


def is_compute_op(op: ir.Operation) -> str | None:
    """a tensor compute op (stablehlo, chlo, arith, math, tensor, linalg, tosa) with results"""
    if op.name.split(".", 1)[0] not in COMPUTE_DIALECTS:
        return f"{op.name} is not a tensor compute op"
    if not op.results:
        return f"{op.name} has no results"
    return None


class IreeCpuBackend(OpSetBackend):
    name = "iree-cpu"
    kind = BackendKind.CODEGEN
    patterns = (OpPattern("any-compute-op", None, (is_compute_op,)),)
    # The default backend: regions of it are what is left, so it proposes single ops only.
    max_region_ops = 1

    def version(self) -> str:
        from iree.compiler import version

        return version.VERSION
