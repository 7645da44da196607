"""`triton`, `triton-tf32`: GEMMs and convolutions with fused epilogues as Triton kernels in a CUDA program's
own stream.

Each region is one (batched) matmul or one 2-D convolution (any layout, grouped and depthwise included) with
its bias, residual add and activation (``kernel.GemmSpec``, ``kernel.ConvSpec``; templates
``templates/triton_gemm.py`` and ``templates/triton_conv.py``, an implicit GEMM),
compiled ahead of time by Triton's compiler for the program's architecture (``--iree-cuda-target``; no GPU
needed) into a cubin that ``hal.dispatch.extern`` runs among IREE's own dispatches: no host round trip.
A cubin, not PTX: Triton writes the PTX ISA of its own CUDA (9.x), which an older driver cannot JIT, while
a cubin for the exact architecture loads on any driver of the same major CUDA version.

Precision as the backend states it: ``triton`` multiplies f32 in full f32 (``ieee``: TF32 off, as the
reference; FMA, no tensor cores) and f16/bf16 on tensor cores with f32 accumulation; ``triton-tf32x3``
multiplies f32 as three TF32 tensor-core products (a split of each input into high and low parts: about f32's
accuracy); ``triton-tf32`` multiplies f32 inputs as TF32 (10-bit mantissa), which its ``tolerance`` allows.

Tactics (output tile, warps, pipeline stages) are backends of their own: ``triton`` takes the rule of thumb
``tactic`` for each spec, and each of ``TACTICS`` is registered as ``triton@<tile>w<warps>s<stages>`` (and
``triton-tf32@...``), so that the search measures every configuration of a region and chooses between them
and IREE's codegen like between any backends (``collage tune --backends iree-cuda,triton,triton@*``).
"""

from __future__ import annotations

import importlib.resources
import math
from dataclasses import dataclass
from pathlib import Path

from ..dialects.hal import Launch
from ..errors import CollageError
from .base import NumberFormat, Platform, Tolerance
from .kernel import ConvSpec, GemmSpec, KernelBackend, KernelBinary, KernelSpec, conv_pattern, gemm_pattern

_TRITON_TYPES = {"f32": "*fp32", "f16": "*fp16", "bf16": "*bf16"}
#: Triton's hidden scratch pointers (global and profile scratch), after the declared parameters.
SCRATCH_POINTERS = 2
#: The dynamic shared memory a block may opt in to, by compute capability (CUDA's programming guide): a
#: kernel that asks for more fails when the program loads, so it is refused when it is compiled.
SHARED_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024}


@dataclass(frozen=True)
class Tactic:
    """A kernel configuration: the output tile (``bm`` x ``bn``), warps a tile, software-pipeline stages;
    the k step follows the element type (32 for f32, 64 for 16-bit: tensor cores take k in steps of 16)."""

    bm: int
    bn: int
    warps: int
    stages: int
    group: int = 8

    @property
    def label(self) -> str:
        return f"{self.bm}x{self.bn}w{self.warps}s{self.stages}"

    def bk(self, spec: KernelSpec) -> int:
        return 32 if spec.element == "f32" else 64


#: The configurations registered as backends of their own, small output tiles (few rows: batch-1 tokens)
#: to large (many: batched GEMMs and large batches).
TACTICS = (Tactic(32, 64, 4, 4), Tactic(64, 64, 4, 3), Tactic(64, 128, 4, 3), Tactic(128, 64, 4, 3),
           Tactic(128, 128, 8, 3), Tactic(128, 256, 8, 3))


def tactic(spec: KernelSpec) -> Tactic:
    """The rule of thumb: 128 x 128 tiles where the output is large enough to fill the GPU with them, else
    smaller ones (down to 16 rows for a few tokens). A convolution is a GEMM of its output pixels by a
    group's output channels, a group a batch."""
    half = spec.element != "f32"
    if isinstance(spec, ConvSpec) and spec.groups == spec.c == spec.k:  # depthwise: pixels x channels
        batch, m, n = 1, spec.n * spec.oh * spec.ow, spec.c
    elif isinstance(spec, ConvSpec):
        batch, m, n = spec.groups, spec.n * spec.oh * spec.ow, spec.k // spec.groups
    else:
        batch, m, n = spec.batch, spec.m, spec.n
    tiles_large = batch * math.ceil(m / 128) * math.ceil(n / 128)
    bm = 128 if m >= 128 and tiles_large >= 64 else 64 if m >= 64 else max(16, 1 << (m - 1).bit_length())
    bn = 128 if n >= 128 and tiles_large >= 64 else 64
    return Tactic(bm, bn, 8 if bm * bn >= 128 * 128 else 4, 4 if half else 3)


class TritonBackend(KernelBackend):
    name = "triton"
    platform = Platform.CUDA
    requires = ("triton",)
    install_hint = "pip install triton (compiles kernels here; running needs a CUDA GPU)"
    patterns = (gemm_pattern(("f32", "f16", "bf16")), conv_pattern(("f32", "f16", "bf16")))
    suffix = "cubin"
    #: f16 bounds it: one rounding of the f32 accumulator to f16 (2^-11 relative) after the epilogue.
    tolerance = Tolerance(rtol=2e-3, atol=2e-3)
    #: How f32 inputs are multiplied (``tl.dot``'s input_precision).
    f32_precision = "ieee"

    def __init__(self, fixed: Tactic | None = None):
        #: The one tactic of a variant (``triton@...``); None: the rule of thumb per spec.
        self.fixed = fixed
        if fixed is not None:
            self.name = f"{type(self).name}@{fixed.label}"
            self.opt_in = True

    def variants(self) -> tuple["TritonBackend", ...]:
        return () if self.fixed else tuple(type(self)(t) for t in TACTICS)

    def template_for(self, spec: KernelSpec) -> str:
        files = ("triton_gemm.py",) if isinstance(spec, GemmSpec) else ("triton_conv.py", "triton_gemm.py")
        root = importlib.resources.files("collage_mlir.backends.templates")
        return "".join(root.joinpath(f).read_text() for f in files)

    def version(self) -> str:
        from importlib.metadata import version

        return f"triton-{version('triton')}"

    def compile(self, spec: KernelSpec, kernel_arch: str) -> tuple[bytes, KernelBinary]:
        # The templates import triton: loaded when a kernel is compiled, not when the registry lists backends.
        t = self.fixed or tactic(spec)
        precision = self.f32_precision if spec.element == "f32" else "tf32"
        epilogue = {"BIAS": spec.bias, "RESIDUAL": spec.residual, "ACT": spec.act, "PRECISION": precision}
        if isinstance(spec, GemmSpec):
            from .templates.triton_gemm import gemm as fn

            names = ("a_ptr", "w_ptr", "bias_ptr", "res_ptr", "out_ptr")
            consts = {"M": spec.m, "N": spec.n, "K": spec.k, "TRANS_B": spec.trans_b, **epilogue,
                      "BM": t.bm, "BN": t.bn, "BK": t.bk(spec), "GROUP": t.group}
            grid = (math.ceil(spec.m / t.bm) * math.ceil(spec.n / t.bn), spec.batch, 1)
        elif spec.groups == spec.c == spec.k:
            from .templates.triton_conv import depthwise_conv2d as fn

            # Direct: a tile of pixels x channels (the tactic's), one multiply-add a tap.
            names = ("x_ptr", "w_ptr", "bias_ptr", "res_ptr", "y_ptr")
            consts = {**spec.template_constants(), **epilogue, "BM": t.bm, "BN": t.bn}
            grid = (math.ceil(spec.n * spec.oh * spec.ow / t.bm) * math.ceil(spec.c / t.bn), 1, 1)
        else:
            from .templates.triton_conv import conv2d as fn

            names = ("x_ptr", "w_ptr", "bias_ptr", "res_ptr", "y_ptr")
            # A group's output channels are the tile's columns: a few still take a 16-wide tile, the least
            # tl.dot multiplies.
            per_group = spec.k // spec.groups
            bn = max(16, min(t.bn, 1 << (per_group - 1).bit_length()))
            consts = {**spec.template_constants(), **epilogue, "BM": t.bm, "BN": bn, "BK": t.bk(spec)}
            grid = (math.ceil(spec.n * spec.oh * spec.ow / t.bm) * math.ceil(per_group / bn), spec.groups, 1)
        return self._compile(fn, names, consts, spec, t, kernel_arch, grid)

    def _compile(self, fn, names, consts, spec: KernelSpec, t: Tactic, kernel_arch: str,
                 grid: tuple[int, int, int]) -> tuple[bytes, KernelBinary]:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        ptr = _TRITON_TYPES[spec.element]
        if not spec.bias:
            consts["bias_ptr"] = None
        if not spec.residual:
            consts["res_ptr"] = None
        signature = {n: ptr for n in names} | {name: "constexpr" for name in consts}
        aligned = {(list(signature).index(n),): [["tt.divisibility", 16]] for n in names if n not in consts}
        capability = int(kernel_arch.removeprefix("sm_").rstrip("a"))
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=aligned),
                                  target=GPUTarget("cuda", capability, 32),
                                  options={"num_warps": t.warps, "num_stages": t.stages,
                                           "enable_fp_fusion": True})
        md = compiled.metadata
        limit = SHARED_LIMIT.get(capability)
        if limit is not None and md.shared > limit:
            raise CollageError(f"{self.name} tiles need {md.shared} bytes of shared memory, more than sm_{capability}'s "
                               f"{limit}: choose a smaller tactic")
        return compiled.asm["cubin"], KernelBinary(
            path=Path(), export=md.name, launch=Launch(grid, (32 * md.num_warps, 1, 1), md.shared),
            trailing_pointers=SCRATCH_POINTERS)


class TritonTf32x3Backend(TritonBackend):
    name = "triton-tf32x3"
    #: Each f32 input split into a TF32 high part and a TF32 remainder, three tensor-core products summed
    #: (Triton's ``tf32x3``): about f32's accuracy (products to ~2^-21) at tensor-core speed.
    f32_precision = "tf32x3"


class TritonTf32Backend(TritonBackend):
    name = "triton-tf32"
    f32_precision = "tf32"
    opt_in = True  # lower precision than an f32 model states: only where named
    computes_in = NumberFormat.TF32
    #: TF32 keeps 10 mantissa bits of each f32 input: ~2^-11 relative per product, growing with k.
    tolerance = Tolerance(rtol=1e-2, atol=1e-2)
