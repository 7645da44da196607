"""`iree-cpu`: IREE llvm-cpu codegen for the host CPU. Takes every tensor op; the default backend of a CPU
program."""

from __future__ import annotations

from typing import Sequence

from .iree_codegen import CPU_TARGET, IreeCodegenBackend, Platform, ProgramTarget



class IreeCpuBackend(IreeCodegenBackend):
    name = "iree-cpu"
    platform = Platform.CPU

    def program_target(self, iree_args: Sequence[str] = ()) -> ProgramTarget:
        return CPU_TARGET
