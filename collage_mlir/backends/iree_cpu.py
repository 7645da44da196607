"""`iree-cpu`: IREE llvm-cpu codegen for the host CPU. Takes every tensor op; the default backend."""

from __future__ import annotations

from typing import Sequence

from ..errors import CollageError
from ..ir import ir
from .base import BackendKind, OpSetBackend, Platform
from .patterns import OpPattern

# Ops of these dialects compute on tensors and can be outlined into a region function. Others
# (check.*, util.* globals, hal.*) keep their place in the program and stay on the default backend.
COMPUTE_DIALECTS = ("stablehlo", "chlo", "arith", "math", "tensor", "linalg", "tosa")

#: Every IREE compile of a program or region for this machine.
DEFAULT_IREE_ARGS = ("--iree-llvmcpu-target-cpu=host",)


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
    platforms = frozenset({Platform.CPU})
    patterns = (OpPattern("any-compute-op", None, (is_compute_op,)),)
    # The default backend: regions of it are what is left, so it proposes single ops only.
    max_region_ops = 1

    def version(self) -> str:
        from iree.compiler import version

        return version.VERSION


def iree_compile(module: ir.Module, iree_args: Sequence[str] = (), **iree_kwargs) -> bytes:
    """Compiles a module (a partitioned program, or a model for IREE alone) for the host CPU with IREE;
    errors become one CollageError."""
    from iree.compiler import tools

    data = module.operation.get_asm(binary=True)
    kwargs = {"target_backends": ["llvm-cpu"], "input_type": "auto"} | iree_kwargs
    if "hal.device.targets" in module.operation.attributes:
        # The module declares its devices (collage-place-devices); a target-backends flag besides
        # makes IREE 3.13 crash.
        kwargs["target_backends"] = []
    extra = list(DEFAULT_IREE_ARGS) + list(kwargs.pop("extra_args", [])) + list(iree_args)
    try:
        return tools.compile_str(data, extra_args=extra, **kwargs)
    except tools.CompilerToolError as exc:
        lines = [ln for ln in str(exc).splitlines() if "error:" in ln]
        raise CollageError("IREE compilation failed: " + (lines[0].strip() if lines else " ".join(str(exc).split())[:400]))
