"""`glsl`: GEMMs with fused epilogues as GLSL compute shaders in a Vulkan program's own queue.

The Vulkan half of the kernel backends (``kernel.KernelBackend``): each region (a matmul with its bias,
residual add and activation, ``kernel.GemmSpec``) becomes the shader ``templates/glsl_gemm.comp`` specialised by
``#define``s, compiled to SPIR-V by ``glslc`` (Debian/Ubuntu package ``glslc``, or the Vulkan SDK) and
dispatched with ``hal.dispatch.extern``. A plain shared-memory tiled kernel in f32 (one output element a
thread): it is how CI runs the extern-dispatch path end to end without a GPU (Mesa's llvmpipe), and a
baseline for Vulkan GPUs, not a tuned kernel.
"""

from __future__ import annotations

import importlib.resources
import math
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..dialects.hal import Launch
from ..errors import CollageError
from .base import Platform, Tolerance
from .kernel import GemmSpec, KernelBackend, KernelBinary, KernelSpec, gemm_pattern

#: Threads along each side of a workgroup's output tile (8 x 8 = 64: within every Vulkan 1.1 device's minimum
#: of 128 invocations a workgroup).
TILE = 8


class GlslBackend(KernelBackend):
    name = "glsl"
    platform = Platform.VULKAN
    install_hint = "apt-get install glslc (the shader compiler; running needs a Vulkan driver)"
    patterns = (gemm_pattern(("f32",)),)
    suffix = "spv"
    #: f32 accumulated in another order than the reference; GELU's erf to 1.5e-7.
    tolerance = Tolerance(rtol=1e-4, atol=1e-5)

    def template_for(self, spec: KernelSpec) -> str:
        return importlib.resources.files("collage_mlir.backends.templates").joinpath("glsl_gemm.comp").read_text()

    def available(self) -> str | None:
        return None if shutil.which("glslc") else "glslc is not installed"

    def version(self) -> str:
        if not shutil.which("glslc"):
            return "unknown"
        out = subprocess.run(["glslc", "--version"], capture_output=True, text=True).stdout
        return "glslc-" + (out.split()[1] if len(out.split()) > 1 else "unknown")

    def compile(self, spec: KernelSpec, kernel_arch: str) -> tuple[bytes, KernelBinary]:
        assert isinstance(spec, GemmSpec), "the glsl backend's one pattern is a GEMM"
        defines = {"M": spec.m, "N": spec.n, "K": spec.k, "TRANS_B": int(spec.trans_b),
                   "HAS_BIAS": int(spec.bias > 0), "BIAS_SCALAR": int(spec.bias == 1),
                   "RESIDUAL": int(spec.residual), "TILE": TILE}
        if spec.act != "none":
            defines[f"ACT_{spec.act.upper()}"] = 1
        text = self.template_for(spec).replace("#version 450\n", "#version 450\n" + "".join(
            f"#define {k} {v}{'u' if k in ('M', 'N', 'K') else ''}\n" for k, v in defines.items()), 1)
        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / "gemm.comp", Path(tmp) / "gemm.spv"
            src.write_text(text)
            done = subprocess.run(["glslc", "-fshader-stage=compute", "-O", "-o", str(out), str(src)],
                                  capture_output=True, text=True)
            if done.returncode:
                raise CollageError(f"glslc failed on the gemm shader: {' '.join(done.stderr.split())[:300]}")
            data = out.read_bytes()
        grid = (math.ceil(spec.n / TILE), math.ceil(spec.m / TILE), spec.batch)
        return data, KernelBinary(Path(), "main", Launch(grid, (TILE, TILE, 1)))
