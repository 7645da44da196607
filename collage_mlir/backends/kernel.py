"""Kernel backends: a region runs as one kernel compiled outside IREE (Triton → cubin/PTX on CUDA, GLSL →
SPIR-V on Vulkan) and dispatched with ``hal.dispatch.extern`` in the IREE program's own stream. Unlike a
library region (cuBLAS, cuDNN through ``collage_rt``: a host wait on IREE's fence, a copy, torch's launch and
sync, ~0.34 ms a region on an H200), a kernel region costs what its kernel costs: IREE schedules it like its
own dispatches, in its command buffer or CUDA graph.

A region is one GEMM anchor (``stablehlo.dot_general``, batch dims leading) with its epilogue (bias, residual
add, activation): ``gemm_region`` reads it off the region function as a ``GemmSpec`` (shapes, layout, element
type, epilogue: what a kernel is specialised for) and the IR values the kernel reads. A backend compiles the
spec (``KernelBackend.compile``, cached by template, spec, tactic, architecture and compiler version) and
``collage-lower`` replaces the region's body by the dispatch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import ClassVar

from ..dialects import stablehlo as sh
from ..dialects.hal import Launch
from ..errors import CollageError
from ..frontends import cache_dir, write_cache
from ..ir import ir
from .base import Backend, BackendKind, Platform
from .library_patterns import BIAS, RESIDUAL, SCALE, plain_matmul, static_of
from .patterns import ActivationFollower, OpPattern, follow

#: Activations the kernel templates apply (``epilogue`` names; ``gelu_tanh`` is GELU's tanh approximation).
KERNEL_ACTIVATIONS = ("relu", "gelu", "sigmoid", "swish", "tanh")


@dataclass(frozen=True)
class GemmSpec:
    """What a GEMM kernel is specialised for: ``out[b] = act(a[b] @ op(w[b]) + bias + residual[b])`` with
    ``a`` batch x m x k, ``w`` batch x k x n (``trans_b``: batch x n x k), all row-major; ``bias`` is 0 (none),
    1 (a scalar) or n elements; accumulation in f32, the result rounded once to ``element``."""

    batch: int
    m: int
    n: int
    k: int
    trans_b: bool
    element: str
    bias: int = 0
    residual: bool = False
    act: str = "none"

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class GemmRegion:
    """A region function's GEMM: its spec and the values the kernel reads (``bias`` and ``residual`` when
    the spec has them) and replaces (``out``)."""

    spec: GemmSpec
    a: ir.Value
    w: ir.Value
    bias: ir.Value | None
    residual: ir.Value | None
    out: ir.Value

    @property
    def inputs(self) -> list[ir.Value]:
        return [v for v in (self.a, self.w, self.bias, self.residual) if v is not None]


@dataclass(frozen=True)
class KernelBinary:
    """A compiled kernel: the object file, its entry point, its launch, and how many pointer parameters it
    takes after its output (Triton's hidden scratch pointers), which are bound to a placeholder buffer."""

    path: Path
    export: str
    launch: Launch
    trailing_pointers: int = 0

    def to_json(self) -> dict:
        """Beside the object (``<object>.json``): what launching it takes, for tools that run it alone."""
        return {"object": self.path.name, "export": self.export, "grid": list(self.launch.grid),
                "block": list(self.launch.block), "shared_bytes": self.launch.shared_bytes,
                "trailing_pointers": self.trailing_pointers}

    @staticmethod
    def from_json(d: dict, folder: Path) -> "KernelBinary":
        return KernelBinary(folder / d["object"], d["export"],
                            Launch(tuple(d["grid"]), tuple(d["block"]), d["shared_bytes"]), d["trailing_pointers"])


def gemm_pattern(elements: tuple[str, ...]) -> OpPattern:
    """The kernel backends' one pattern: a plain (batched) matmul of ``elements`` and its epilogue."""
    return OpPattern("gemm", "stablehlo.dot_general", (static_of(*elements), plain_matmul),
                     (SCALE, BIAS, RESIDUAL, ActivationFollower("activation", allowed=KERNEL_ACTIVATIONS)))


def gemm_region(func: ir.Operation, pattern: OpPattern) -> GemmRegion:
    """The GEMM of the region function ``func``: one ``pattern`` anchor whose epilogue is the rest of the
    region and whose value the region returns; else a CollageError."""
    block = func.regions[0].blocks[0]
    anchors = [op.operation for op in block.operations if pattern.rejects(op.operation) is None]
    if len(anchors) != 1:
        raise CollageError(f"{func.location}: a kernel region holds one matmul, found {len(anchors)}")
    anchor = anchors[0]
    d = sh.dot_info(anchor)
    nb = len(d.lhs_batch)
    (a_shape, element), (w_shape, _) = sh.tensor_type(anchor.operands[0]), sh.tensor_type(anchor.operands[1])
    trans_b = d.rhs_contract == [nb + 1]
    batch = 1
    for n in a_shape[:nb]:
        batch *= n
    m, k = a_shape[nb], a_shape[nb + 1]
    n = w_shape[nb] if trans_b else w_shape[nb + 1]
    spec = GemmSpec(batch, m, n, k, trans_b, element)
    value, bias, residual = anchor.results[0], None, None
    for follower, taken in follow(pattern, anchor):
        if follower.name == "scale" and spec.bias == 0 and spec.act == "none":
            pass
        elif follower.name == "bias" and not spec.residual and spec.act == "none":
            bcast = taken.ops[0]
            src = sh.tensor_type(bcast.operands[0])[0]
            kept = [dim for dim, size in zip(sh.broadcast_dims(bcast), src) if size != 1]
            if kept not in ([len(sh.tensor_type(value)[0]) - 1], []):
                break
            bias = bcast.operands[0]
            spec = GemmSpec(**{**asdict(spec), "bias": n if kept else 1})
        elif follower.name == "residual" and spec.act == "none":
            residual = next(v for v in taken.ops[-1].operands if v != value)
            spec = GemmSpec(**{**asdict(spec), "residual": True})
        elif follower.name == "activation":
            p = taken.params
            act = "gelu_tanh" if p["act"] == "gelu" and p["algorithm"] == "tanh" else p["act"]
            spec = GemmSpec(**{**asdict(spec), "act": act})
        else:
            break
        value = taken.out
    ret = block.operations[len(block.operations) - 1].operation
    if list(ret.operands) != [value]:
        raise CollageError(f"{func.location}: a kernel region returns its matmul's epilogue alone")
    return GemmRegion(spec, anchor.operands[0], anchor.operands[1], bias, residual, value)


class KernelBackend(Backend):
    """A backend whose regions are kernels dispatched in the IREE program (``hal.dispatch.extern``).
    Subclasses name their template and compile a spec for an architecture."""

    kind = BackendKind.KERNEL
    #: The region shapes it takes (one GEMM and its epilogue).
    pattern: ClassVar[OpPattern]
    #: Where its kernels run and what it compiles them for (``ProgramTarget.kernel_arch``).
    platform: ClassVar[Platform]
    #: The kernel template's source text: part of every compiled kernel's cache key.
    template: ClassVar[str]
    #: The object file's suffix (``cubin``, ``spv``).
    suffix: ClassVar[str]

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "pattern" in cls.__dict__:
            cls.patterns = (cls.pattern,)
        if "platform" in cls.__dict__:
            cls.platforms = frozenset({cls.platform})

    def compile(self, spec: GemmSpec, kernel_arch: str) -> tuple[bytes, KernelBinary]:
        """The object for ``spec`` on ``kernel_arch`` and its launch (``path`` is filled in by ``kernel``)."""
        raise NotImplementedError

    def kernel(self, func: ir.Operation, kernel_arch: str, out_dir: Path | None,
               region: str) -> tuple[GemmRegion, KernelBinary]:
        """Reads the region function's GEMM, compiles its kernel (or takes it from the kernel cache) and
        writes the object under ``out_dir/kernels``; with no ``out_dir``, nothing is compiled and the path
        is where it would be."""
        gemm = gemm_region(func, self.pattern)
        name = f"kernels/{region}.{self.name}.{self.suffix}"
        if out_dir is None:
            return gemm, KernelBinary(Path(name), "kernel", Launch((1, 1, 1), (1, 1, 1)))
        # Keyed by what the kernel is (template, spec, tactic: the backend's name, architecture), not by the
        # compiler that built it, which the object's metadata records: a kernel built on one machine serves
        # another with another Triton (the GPU machine's, in studies/gpu).
        key = hashlib.sha256(json.dumps([self.name, self.template, gemm.spec.to_json(), kernel_arch],
                                        sort_keys=True).encode()).hexdigest()[:32]
        cached = cache_dir() / "kernels" / f"{key}.{self.suffix}"
        meta = cached.with_name(f"{cached.name}.json")
        if cached.is_file() and meta.is_file():
            data, binary = cached.read_bytes(), KernelBinary.from_json(json.loads(meta.read_text()), cached.parent)
        else:
            data, binary = self.compile(gemm.spec, kernel_arch)
            binary = replace(binary, path=cached)
            write_cache(cached, data)
            write_cache(meta, json.dumps({**binary.to_json(), "compiler": self.version()}).encode())
        path = Path(out_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        binary = replace(binary, path=path)
        compiler = json.loads(meta.read_text()).get("compiler", "unknown")
        path.with_name(f"{path.name}.json").write_text(json.dumps({**binary.to_json(), "spec": gemm.spec.to_json(),
                                                                  "compiler": compiler}))
        return gemm, binary
