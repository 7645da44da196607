"""`iree-cpu-dt`: IREE llvm-cpu with data tiling and microkernels, for matmuls, batch matmuls and
convolutions with their elementwise epilogues.

Its regions stay in the IREE program (a codegen backend) but run on a logical device of their own,
whose executable target resolves data-tiling encodings to packed layouts and enables ukernels
(``collage-place-devices`` declares it and pins region boundaries to it); the rest of the program
keeps IREE's plain llvm-cpu codegen. Measured here: a 128x768x3072 f32 matmul runs ~2x faster than
on plain llvm-cpu; convolutions are not data-tiled by IREE 3.13 (experimental there), so they gain little.

Patterns, not any op set: data tiling pays a layout change (pack/unpack) at each region boundary, so
the only regions worth a device switch are a contraction plus the elementwise epilogue IREE fuses
with it — an elementwise-only region there would only add boundaries.
"""

from __future__ import annotations

from ..dialects import stablehlo as sh
from ..ir import ir
from .base import BackendKind, Backend, Platform, Tolerance
from .iree_device import IreeDevice
from .patterns import ActivationFollower, Follower, OpPattern, static_f32


def _elementwise_f32(user: ir.Operation, chain: ir.Value) -> str | None:
    """f32 elementwise op on the chain's value (other operands join as inputs or absorbed broadcasts)"""
    tt = sh.tensor_type(user.results[0]) if len(user.results) == 1 else None
    if tt is None or tt[1] != "f32" or user.results[0].type != chain.type:
        return "needs a same-shaped f32 elementwise result"
    return static_f32(user)


def _follower(name: str, op: str) -> Follower:
    return Follower(name, op, _elementwise_f32, absorb=("stablehlo.broadcast_in_dim",))


#: Optional epilogue, in the order it may follow the contraction (each part may be absent): a scale
#: (torch-mlir's linear multiplies by alpha), a bias or residual add, then any activation the
#: elementwise tail computes (recognised by evaluation: relu, GELU as torch-mlir spells it, ...).
EPILOGUE = (
    _follower("scale", "stablehlo.multiply"),
    _follower("bias", "stablehlo.add"),
    ActivationFollower("activation", allowed=("relu", "hardtanh", "leaky_relu", "gelu", "sigmoid", "swish",
                                              "tanh", "hardswish", "hardsigmoid")),
)


class IreeCpuDataTilingBackend(Backend):
    name = "iree-cpu-dt"
    kind = BackendKind.CODEGEN
    platforms = frozenset({Platform.CPU})
    # Packed layouts and ukernels change the reduction order (measured max relative error ~1e-6).
    tolerance = Tolerance(rtol=1e-4, atol=1e-5)
    patterns = (
        OpPattern("matmul", "stablehlo.dot_general", (static_f32,), EPILOGUE),
        OpPattern("conv", "stablehlo.convolution", (static_f32,), EPILOGUE),
    )
    iree_device = IreeDevice(
        name="dev_iree_cpu_dt",
        target_flags=("--iree-llvmcpu-target-cpu=host", "--iree-llvmcpu-enable-ukernels=all"),
        data_tiling=True,
        # Data tiling is a program-wide switch: encodings resolve to packed layouts only on devices
        # with a data-tiling resolver (this one) and to plain layouts on the others.
        program_flags=("--iree-opt-data-tiling=true",),
    )

    def version(self) -> str:
        from iree.compiler import version

        return version.VERSION
