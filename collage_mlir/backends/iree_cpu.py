"""`iree-cpu`: IREE llvm-cpu codegen for the host CPU. Takes every tensor op; the default backend of a CPU
program."""

from __future__ import annotations

from .iree_codegen import CPU_TARGET, IreeCodegenBackend, Platform



class IreeCpuBackend(IreeCodegenBackend):
    name = "iree-cpu"
    platform = Platform.CPU
    target_flags = CPU_TARGET.flags
