"""`iree-cuda`: IREE CUDA codegen, the default backend of a CUDA program.

The module holds PTX, which the CUDA driver JIT-compiles when the program loads (only ``libcuda.so`` is
needed at run time), so a program for a GPU compiles on a machine without one. The SM architecture comes
from ``--iree-cuda-target=sm_XX`` among the IREE flags, else the GPU torch sees here, else ``sm_80``.
IREE 3.13 lists no Hopper target (``sm_90``/``sm_90a``: "missing GPU target"): for an architecture it does
not list, the program declares the executable target IREE resolves for the nearest one it does (``sm_80``,
the same instructions) with the architecture and PTX version changed, which compiles and records the real
architecture in the PTX (``.target sm_90``). Whether Hopper-specific code would be faster is measured on a
GPU, not assumed.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Sequence

from ..errors import CollageError
from .iree_codegen import IreeCodegenBackend, Platform, ProgramTarget

#: The architecture of a program for a GPU not at hand.
DEFAULT_ARCH = "sm_80"
#: Architectures IREE 3.13 resolves a target for itself.
IREE_ARCHS = ("sm_60", "sm_61", "sm_70", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89")
#: PTX ISA version for an architecture IREE does not list (PTX 8.0 is the first with sm_90/sm_90a).
PTX_FOR = {"sm_90": "+ptx80", "sm_90a": "+ptx80", "sm_100": "+ptx86", "sm_120": "+ptx87"}
_FLAG = "--iree-cuda-target="
#: IREE 3.13's reduction vector-distribution pipeline races on CUDA: ResNet-50's global average pool + linear
#: head gave different, wrong results on each call (max error 1.1-1.26 of the output's scale, sm_80 and sm_90
#: alike, any runtime scheduling flag) on an H200, and every op up to the last convolution was right; with the
#: pipeline off the results are right and repeatable (2.7e-6). Found by ``python -m studies.gpu.diagnose``.
CODEGEN_FLAGS = ("--iree-codegen-llvmgpu-use-reduction-vector-distribution=false",)
_ARCH = re.compile(r"sm_\d+a?")


def detected_arch() -> str | None:
    """The SM architecture of the first GPU torch sees here (``sm_90`` on an H100), else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return f"sm_{major}{minor}"


def requested_arch(iree_args: Sequence[str]) -> str:
    """The architecture the flags ask for (the last ``--iree-cuda-target=``), else the GPU here, else
    ``DEFAULT_ARCH``; a CollageError for a value that is not ``sm_<digits>``."""
    given = [a[len(_FLAG):] for a in iree_args if a.startswith(_FLAG)]
    arch = given[-1] if given else detected_arch() or DEFAULT_ARCH
    if not _ARCH.fullmatch(arch):
        raise CollageError(f"--iree-cuda-target={arch}: expected an SM architecture such as sm_80 or sm_90")
    return arch


@lru_cache(maxsize=4)
def _resolved_device(arch: str) -> str:
    """The ``#hal.device.target<"cuda", ...>`` IREE resolves for ``arch`` (one it lists)."""
    from iree.compiler import tools

    probe = "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a : tensor<4xf32>\n}\n"
    try:
        out = tools.compile_str(probe, target_backends=[], extra_args=[
            "--iree-hal-target-device=cuda", f"{_FLAG}{arch}", "--compile-to=preprocessing"]).decode()
    except tools.CompilerToolError as exc:
        raise CollageError(f"IREE cannot target CUDA {arch}: {' '.join(str(exc).split())[:200]}") from None
    start = out.find('#hal.device.target<"cuda"')
    end = out.find(" : !hal.device", start)
    if start < 0 or end < 0:
        raise CollageError(f"IREE gave no CUDA device target for {arch}")
    return out[start:end]


def device_targets(arch: str) -> str:
    """``hal.device.targets`` declaring one CUDA device for ``arch``, for an architecture IREE does not
    list: its sm_80 target with the architecture and PTX version replaced."""
    if arch not in PTX_FOR:
        raise CollageError(f"CUDA architecture {arch} is not supported: IREE resolves "
                           f"{', '.join(IREE_ARCHS)}, and collage also {', '.join(PTX_FOR)}")
    base = _resolved_device(DEFAULT_ARCH)
    text = base.replace(f'arch = "{DEFAULT_ARCH}"', f'arch = "{arch}"')
    text = re.sub(r"\+ptx\d+", PTX_FOR[arch], text, count=1)
    return f"[{text} : !hal.device]"


class IreeCudaBackend(IreeCodegenBackend):
    name = "iree-cuda"
    platform = Platform.CUDA
    install_hint = "pip install iree-base-compiler (compiles here) and iree-base-runtime (runs on the GPU)"
    target_flags = ("--iree-hal-target-device=cuda", *CODEGEN_FLAGS)

    def program_target(self, iree_args: Sequence[str] = ()) -> ProgramTarget:
        arch = requested_arch(iree_args)
        if arch in IREE_ARCHS:
            return ProgramTarget(Platform.CUDA, (*self.target_flags, f"{_FLAG}{arch}"), kernel_arch=arch)
        # IREE would refuse the flag: the module declares the device instead.
        return ProgramTarget(Platform.CUDA, CODEGEN_FLAGS, device_targets(arch), kernel_arch=arch)
