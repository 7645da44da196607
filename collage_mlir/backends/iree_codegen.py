"""IREE codegen backends and program targets: how iree-compile builds a program for a platform.

A program has one default backend, an IREE codegen backend (``iree-cpu``, ``iree-cuda``, ``iree-vulkan``):
ops outside every region run on it, and it decides the program's platform (``collage_runtime.types.Platform``)
and the flags iree-compile builds the module with (its ``ProgramTarget``). A program runs on one platform:
IREE cannot mix a discrete-memory device with the CPU in one program today (IREE issue 19483), so host
engines' regions in a GPU program are served through ``collage_rt`` with copies.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass
from typing import ClassVar, Sequence

from collage_runtime.types import Platform

from ..errors import CollageError
from ..dialects import collage
from ..dialects import stablehlo as sh
from ..ir import ir
from .base import BackendKind, OpSetBackend
from .patterns import OpPattern

log = logging.getLogger(__name__)

# Ops of these dialects compute on tensors and can be outlined into a region function. Others
# (check.*, util.* globals, hal.*) keep their place in the program and stay on the default backend.
COMPUTE_DIALECTS = ("stablehlo", "chlo", "arith", "math", "tensor", "linalg", "tosa")


def is_compute_op(op: ir.Operation) -> str | None:
    """a tensor compute op (stablehlo, chlo, arith, math, tensor, linalg, tosa) with results"""
    if op.name.split(".", 1)[0] not in COMPUTE_DIALECTS:
        return f"{op.name} is not a tensor compute op"
    if not op.results:
        return f"{op.name} has no results"
    if collage.is_onnx_node(op):
        return "an ONNX node kept as ONNX runs on an ONNX engine"
    return None


@dataclass(frozen=True)
class ProgramTarget:
    """How iree-compile builds a program for one platform: the flags, and where IREE's own target options
    cannot say it (a CUDA architecture IREE does not list), the module's ``hal.device.targets`` value."""

    platform: Platform
    flags: tuple[str, ...]
    #: ``hal.device.targets`` to declare on the module before compiling (None: the flags choose the device).
    device_targets: str | None = None
    #: What kernel backends compile their kernels for (``sm_90`` on CUDA, ``spirv`` on Vulkan; ""
    #: where no kernel backend runs).
    kernel_arch: str = ""


#: The host CPU: every CPU program and every region compiled alone for it (``iree-cpu``'s target).
CPU_TARGET = ProgramTarget(Platform.CPU, ("--iree-llvmcpu-target-cpu=host",))

#: A module that computes in float64 (``collage.computes_float64``) keeps it: IREE demotes f64 by default.
KEEP_F64 = ("--iree-input-demote-f64-to-f32=false",)


class IreeCodegenBackend(OpSetBackend):
    """An IREE codegen backend that can be a program's default: takes every tensor compute op; regions of
    it are what is left, so it proposes single ops only."""

    kind = BackendKind.CODEGEN
    patterns = (OpPattern("any-compute-op", None, (is_compute_op,)),)
    max_region_ops = 1
    #: The one platform its code runs on.
    platform: ClassVar[Platform]
    #: iree-compile flags that target it (``program_target`` may add to them from the user's flags).
    target_flags: ClassVar[tuple[str, ...]]
    #: What kernel backends build for in its programs (``ProgramTarget.kernel_arch``).
    kernel_arch: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "platform" in cls.__dict__:
            cls.platforms = frozenset({cls.platform})

    def program_target(self, iree_args: Sequence[str] = ()) -> ProgramTarget:
        """The target a program with this default backend compiles for, given the user's IREE flags."""
        return ProgramTarget(self.platform, self.target_flags, kernel_arch=self.kernel_arch)

    def version(self) -> str:
        from iree.compiler import version

        return version.VERSION


def iree_compile(module: ir.Module, iree_args: Sequence[str] = (), target: ProgramTarget | None = None, *,
                 quiet: bool = False, **iree_kwargs) -> bytes:
    """Compiles a module (a partitioned program, a region alone, or a model for IREE alone) for ``target``
    (default: the host CPU); errors become one CollageError. What iree-compile says besides on success
    (warnings, remarks) goes to this module's logger: in full at DEBUG, and its first line at WARNING
    unless ``quiet`` (a module of collage's own making, as the reference capture's, whose diagnostics
    are not the user's business)."""
    from iree.compiler import tools

    target = target or CPU_TARGET
    attrs = module.operation.attributes
    if target.device_targets is not None and "hal.device.targets" not in attrs:
        with module.context:
            attrs["hal.device.targets"] = ir.Attribute.parse(target.device_targets)
    kwargs = {"target_backends": ["llvm-cpu"] if target.platform is Platform.CPU else [], "input_type": "auto"}
    kwargs |= iree_kwargs
    if "hal.device.targets" in attrs:
        # The module declares its devices (collage-place-devices, or the target above); a target-backends
        # flag besides makes IREE 3.13 crash.
        kwargs["target_backends"] = []
    data = _iree_input(module, target.platform)
    extra = [*target.flags, *(KEEP_F64 if collage.computes_float64(module) else ()), *kwargs.pop("extra_args", []),
             *iree_args]
    try:
        vmfb, diagnostics = _compile_str(data, extra_args=extra, **kwargs)
    except tools.CompilerToolError as exc:
        lines = [ln for ln in str(exc).splitlines() if "error:" in ln]
        raise CollageError("IREE compilation failed: " + (lines[0].strip() if lines else " ".join(str(exc).split())[:400]))
    _log_diagnostics(diagnostics, quiet)
    return vmfb


def _iree_input(module: ir.Module, platform: Platform = Platform.CPU) -> bytes:
    """The module as iree-compile's input. Where IREE 3.13 gets ops wrong they are worked around:
    - on the CPU, f16/bf16 convolutions and dot products accumulate in f32 (``sh.widen_half_contractions``;
      IREE's llvm-cpu accumulates them in the narrow type);
    - a dequantized constant is folded to f32 (a per-axis quantize of a constant is left as an illegal
      ``chlo.broadcast_divide``; IREE computes the pair in f32 anyway);
    - unsigned quantized storage becomes signed (``u8`` → ``i8``, zero points 128 lower: the same values):
      IREE lowers ``!quant.uniform<u8...>`` with ``i8``'s range, so ``uniform_quantize`` clamps stored
      values to [-128, 127] and a u8 model's numbers come out wrong."""
    copy = None
    if platform is Platform.CPU and sh.half_contractions(module):
        copy = module.operation.clone()
        sh.widen_half_contractions(copy)
    if not sh.quantizes(module):
        return (copy or module.operation).get_asm(binary=True)
    copy = copy or module.operation.clone()
    sh.fold_constant_quantization(copy)
    text = copy.get_asm(binary=False, large_elements_limit=None)
    return sh.QUANT_TYPE_TEXT.sub(lambda m: sh.quant_type(m.group(0)).signed().spelled(), text).encode()



def _compile_str(data: bytes, **options) -> tuple[bytes, str]:
    """iree-compile on ``data`` as ``iree.compiler.tools.compile_str`` runs it (its command line; the input
    and command line kept under ``IREE_SAVE_TEMPS``), with what it writes to stderr returned, not printed:
    (output, diagnostics). A failure raises ``CompilerToolError`` as ``compile_str`` does."""
    from iree.compiler.tools import CompilerToolError
    from iree.compiler.tools.core import CompilerOptions, TempFileSaver, build_compile_command_line

    with TempFileSaver.implicit() as tfs:
        saved_input = tfs.alloc_optional("core-input.mlir")
        if saved_input:
            with open(saved_input, "wb") as f:
                f.write(data)
        cl = build_compile_command_line("-", tfs, CompilerOptions(**options))
        saved_cl = tfs.alloc_optional("core-command-line.txt")
        if saved_cl:
            with open(saved_cl, "w") as f:
                f.write(" ".join(cl))
        log.debug("iree-compile: %s", " ".join(cl))
        process = subprocess.run(cl, input=data, capture_output=True)
    if process.returncode != 0:
        raise CompilerToolError(process)
    return process.stdout, process.stderr.decode(errors="replace")


def _log_diagnostics(text: str, quiet: bool) -> None:
    """A successful compile's diagnostics: the whole text at DEBUG; unless ``quiet``, one line at WARNING
    (the first that says something, and how many more the log has)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return
    log.debug("iree-compile diagnostics:\n%s", text.strip("\n"))
    if not quiet:
        more = f" ({len(lines) - 1} more lines in the log: {log.name} at DEBUG)" if len(lines) > 1 else ""
        log.warning("iree-compile: %s%s", lines[0][:300], more)
