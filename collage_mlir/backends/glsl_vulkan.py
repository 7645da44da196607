"""`glsl`: GEMMs and convolutions with fused epilogues as GLSL compute shaders in a Vulkan program's own queue.

The Vulkan half of the kernel backends (``kernel.KernelBackend``): each region (a matmul or a 2-D convolution
with its bias, residual add and activation, ``kernel.GemmSpec``/``ConvSpec``) becomes the shader
``templates/glsl_gemm.comp`` or ``glsl_conv.comp`` (after ``glsl_act.glsl``) specialised by ``#define``s,
compiled to SPIR-V by ``glslc`` (Debian/Ubuntu package ``glslc``, or the Vulkan SDK) and dispatched with
``hal.dispatch.extern``. Plain f32 kernels (a shared-memory tiled GEMM; a direct convolution, one output
element a thread): how CI runs the extern-dispatch path end to end without a GPU (Mesa's llvmpipe), and a
baseline for Vulkan GPUs, not tuned kernels.
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
from .kernel import ConvSpec, GemmSpec, KernelBackend, KernelBinary, KernelSpec, conv_pattern, gemm_pattern

#: Threads along each side of a workgroup's output tile (8 x 8 = 64: within every Vulkan 1.1 device's minimum
#: of 128 invocations a workgroup).
TILE = 8
#: Workgroups every Vulkan device takes along one grid dimension.
MAX_WORKGROUPS = 65535


class GlslBackend(KernelBackend):
    name = "glsl"
    platform = Platform.VULKAN
    install_hint = "apt-get install glslc (the shader compiler; running needs a Vulkan driver)"
    patterns = (gemm_pattern(("f32",)), conv_pattern(("f32",)))
    suffix = "spv"
    #: f32 accumulated in another order than the reference; GELU's erf to 1.5e-7.
    tolerance = Tolerance(rtol=1e-4, atol=1e-5)

    def template_for(self, spec: KernelSpec) -> str:
        root = importlib.resources.files("collage_mlir.backends.templates")
        body = "glsl_gemm.comp" if isinstance(spec, GemmSpec) else "glsl_conv.comp"
        return root.joinpath("glsl_act.glsl").read_text() + root.joinpath(body).read_text()

    def available(self) -> str | None:
        return None if shutil.which("glslc") else "glslc is not installed"

    def version(self) -> str:
        if not shutil.which("glslc"):
            return "unknown"
        out = subprocess.run(["glslc", "--version"], capture_output=True, text=True).stdout
        return "glslc-" + (out.split()[1] if len(out.split()) > 1 else "unknown")

    def compile(self, spec: KernelSpec, kernel_arch: str) -> tuple[bytes, KernelBinary]:
        epilogue = {"HAS_BIAS": int(spec.bias > 0), "BIAS_SCALAR": int(spec.bias == 1), "RESIDUAL": int(spec.residual)}
        if isinstance(spec, GemmSpec):
            defines = {"M": spec.m, "N": spec.n, "K": spec.k, "TRANS_B": int(spec.trans_b), **epilogue, "TILE": TILE}
            launch = Launch((math.ceil(spec.n / TILE), math.ceil(spec.m / TILE), spec.batch), (TILE, TILE, 1))
        else:
            defines = {**spec.template_constants(), **epilogue}
            groups = math.ceil(spec.n * spec.k * spec.oh * spec.ow / 64)
            if groups > MAX_WORKGROUPS:
                raise CollageError(f"glsl: a convolution of {groups} workgroups, more than Vulkan's guaranteed "
                                   f"{MAX_WORKGROUPS} along x")
            launch = Launch((groups, 1, 1), (64, 1, 1))
        if spec.act != "none":
            defines[f"ACT_{spec.act.upper()}"] = 1
        # Sizes, strides and the tile are unsigned (the shaders index with uint); the 0/1 switches are not.
        switches = ("HAS_", "BIAS_", "RESIDUAL", "TRANS_", "ACT_")
        text = "#version 450\n" + "".join(f"#define {k} {v}{'' if k.startswith(switches) else 'u'}\n"
                                          for k, v in defines.items())
        text += self.template_for(spec)
        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / "kernel.comp", Path(tmp) / "kernel.spv"
            src.write_text(text)
            done = subprocess.run(["glslc", "-fshader-stage=compute", "-O", "-o", str(out), str(src)],
                                  capture_output=True, text=True)
            if done.returncode:
                raise CollageError(f"glslc failed on the {type(spec).__name__} shader: {' '.join(done.stderr.split())[:300]}")
            data = out.read_bytes()
        return data, KernelBinary(Path(), "main", launch)
