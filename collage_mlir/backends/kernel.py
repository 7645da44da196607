"""Kernel backends: a region runs as one kernel compiled outside IREE (Triton → cubin/PTX on CUDA, GLSL →
SPIR-V on Vulkan) and dispatched with ``hal.dispatch.extern`` in the IREE program's own stream. Unlike a
library region (cuBLAS, cuDNN through ``collage_rt``: a host wait on IREE's fence, a copy, torch's launch and
sync, ~0.34 ms a region on an H200), a kernel region costs what its kernel costs: IREE schedules it like its
own dispatches, in its command buffer or CUDA graph.

A region is one anchor with its epilogue (bias, residual add, activation): a GEMM (``stablehlo.dot_general``,
batch dims leading: ``GemmSpec``) or a 2-D convolution (any layout, padding, stride, dilation and groups,
depthwise included: ``ConvSpec``). ``kernel_region`` reads it off the region function as its spec (shapes,
layouts, element type, epilogue: what a kernel is specialised for) and the IR values the kernel reads. A
backend compiles the spec (``KernelBackend.compile``, cached by template, spec, tactic and architecture) and
``collage-lower`` replaces the region's body by the dispatch.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import ClassVar

from ..dialects import stablehlo as sh
from ..dialects.hal import Launch
from ..errors import CollageError
from ..frontends import cache_dir, write_cache
from ..ir import ir, location_text
from .base import Backend, BackendKind, Platform
from .library_patterns import BIAS, RESIDUAL, SCALE, conv2d_any, plain_matmul, static_of
from .patterns import ActivationFollower, OpPattern, follow

#: Activations the kernel templates apply (``epilogue`` names; a GELU is ``gelu`` or, tanh-approximated,
#: ``gelu_tanh`` in the spec).
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
        return {"kind": "gemm", **asdict(self)}


def _strides(shape: tuple[int, ...], layout: str, order: str) -> tuple[int, ...]:
    """Element strides of a row-major tensor of ``shape`` whose dims are named by ``layout`` (``b01f``), in the
    order of the dim names ``order`` (``bf01``)."""
    step, row = 1, {}
    for name, size in zip(reversed(layout), reversed(shape)):
        row[name] = step
        step *= size
    return tuple(row[c] for c in order)


@dataclass(frozen=True)
class ConvSpec:
    """What a convolution kernel is specialised for: ``y = act(conv2d(x, w) + bias + residual)`` accumulated in
    f32, with every tensor addressed through its element strides, so that any layout is read in place:
    ``x_strides`` (batch, channel, row, column), ``w_strides`` (out channel, in channel, row, column),
    ``y_strides`` (batch, channel, row, column; the residual's too). ``pad`` is the padding before each spatial
    dim (the output size says the rest); ``groups`` = ``c`` = ``k``: depthwise."""

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    oh: int
    ow: int
    stride: tuple[int, int]
    pad: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    x_strides: tuple[int, int, int, int]
    w_strides: tuple[int, int, int, int]
    y_strides: tuple[int, int, int, int]
    element: str
    bias: int = 0
    residual: bool = False
    act: str = "none"

    def to_json(self) -> dict:
        return {"kind": "conv2d", **asdict(self)}

    def template_constants(self) -> dict[str, int]:
        """The shape, window and stride constants every convolution template takes, by the names they use
        (``N C H W K R S OH OW``, ``SH SW PH PW DH DW GROUPS``, ``XN XC XH XW``, ``WO WI WR WS``, ``YN YC YH YW``)."""
        return {"N": self.n, "C": self.c, "H": self.h, "W": self.w, "K": self.k, "R": self.r, "S": self.s,
                "OH": self.oh, "OW": self.ow, "SH": self.stride[0], "SW": self.stride[1], "PH": self.pad[0],
                "PW": self.pad[1], "DH": self.dilation[0], "DW": self.dilation[1], "GROUPS": self.groups,
                **dict(zip(("XN", "XC", "XH", "XW"), self.x_strides)),
                **dict(zip(("WO", "WI", "WR", "WS"), self.w_strides)),
                **dict(zip(("YN", "YC", "YH", "YW"), self.y_strides))}


KernelSpec = GemmSpec | ConvSpec


@dataclass(frozen=True)
class KernelRegion:
    """A region function's kernel: its spec, the values the kernel reads in binding order (the anchor's two
    operands, then the bias and the residual where the spec has them) and the value it replaces."""

    spec: KernelSpec
    inputs: tuple[ir.Value, ...]
    out: ir.Value


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


def _epilogue() -> tuple:
    return (SCALE, BIAS, RESIDUAL, ActivationFollower("activation", allowed=KERNEL_ACTIVATIONS))


def gemm_pattern(elements: tuple[str, ...]) -> OpPattern:
    """A plain (batched) matmul of ``elements`` and its epilogue."""
    return OpPattern("gemm", "stablehlo.dot_general", (static_of(*elements), plain_matmul), _epilogue())


def conv_pattern(elements: tuple[str, ...]) -> OpPattern:
    """A 2-D convolution of ``elements`` and its epilogue."""
    return OpPattern("conv2d", "stablehlo.convolution", (static_of(*elements), conv2d_any), _epilogue())


def _gemm_spec(anchor: ir.Operation) -> GemmSpec:
    d = sh.dot_info(anchor)
    nb = len(d.lhs_batch)
    (a_shape, element), (w_shape, _) = sh.tensor_type(anchor.operands[0]), sh.tensor_type(anchor.operands[1])
    trans_b = d.rhs_contract == [nb + 1]
    batch = 1
    for n in a_shape[:nb]:
        batch *= n
    m, k = a_shape[nb], a_shape[nb + 1]
    return GemmSpec(batch, m, w_shape[nb] if trans_b else w_shape[nb + 1], k, trans_b, element)


def _conv_spec(anchor: ir.Operation) -> ConvSpec:
    info = sh.conv_info(anchor)
    (x, element), (w, _), (y, _) = (sh.tensor_type(v) for v in (anchor.operands[0], anchor.operands[1],
                                                                    anchor.results[0]))
    dim = lambda shape, layout, c: shape[layout.index(c)]  # noqa: E731
    return ConvSpec(
        n=dim(x, info.lhs_layout, "b"), c=dim(x, info.lhs_layout, "f"), h=dim(x, info.lhs_layout, "0"),
        w=dim(x, info.lhs_layout, "1"), k=dim(w, info.rhs_layout, "o"), r=dim(w, info.rhs_layout, "0"),
        s=dim(w, info.rhs_layout, "1"), oh=dim(y, info.out_layout, "0"), ow=dim(y, info.out_layout, "1"),
        stride=tuple(info.strides), pad=tuple(lo for lo, _ in info.padding), dilation=tuple(info.rhs_dilation),
        groups=info.feature_groups, x_strides=_strides(x, info.lhs_layout, "bf01"),
        w_strides=_strides(w, info.rhs_layout, "oi01"), y_strides=_strides(y, info.out_layout, "bf01"),
        element=element)


def _channel_dim(anchor: ir.Operation) -> int:
    """The output dim a bias runs along: the last of a GEMM, the feature dim of a convolution."""
    if anchor.name == "stablehlo.convolution":
        return sh.conv_info(anchor).out_layout.index("f")
    return len(sh.tensor_type(anchor.results[0])[0]) - 1


def kernel_region(func: ir.Operation, patterns: tuple[OpPattern, ...]) -> KernelRegion:
    """The kernel of the region function ``func``: one anchor of ``patterns`` whose epilogue is the rest of
    the region and whose value the region returns; else a CollageError."""
    block = func.regions[0].blocks[0]
    found = [(op.operation, p) for op in block.operations for p in patterns if p.rejects(op.operation) is None]
    if len(found) != 1:
        raise CollageError(f"{func.location}: a kernel region holds one matmul or convolution, found {len(found)}")
    anchor, pattern = found[0]
    spec = _conv_spec(anchor) if anchor.name == "stablehlo.convolution" else _gemm_spec(anchor)
    channels = spec.k if isinstance(spec, ConvSpec) else spec.n
    value, bias, residual = anchor.results[0], None, None
    for follower, taken in follow(pattern, anchor):
        if follower.name == "scale" and spec.bias == 0 and spec.act == "none":
            pass
        elif follower.name == "bias" and not spec.residual and spec.act == "none":
            bcast = taken.ops[0]
            src = sh.tensor_type(bcast.operands[0])[0]
            kept = [dim for dim, size in zip(sh.broadcast_dims(bcast), src) if size != 1]
            if kept not in ([_channel_dim(anchor)], []):
                break
            bias = bcast.operands[0]
            spec = replace(spec, bias=channels if kept else 1)
        elif follower.name == "residual" and spec.act == "none":
            residual = next(v for v in taken.ops[-1].operands if v != value)
            spec = replace(spec, residual=True)
        elif follower.name == "activation":
            p = taken.params
            spec = replace(spec, act="gelu_tanh" if p["act"] == "gelu" and p["algorithm"] == "tanh" else p["act"])
        else:
            break
        value = taken.out
    ret = block.operations[len(block.operations) - 1].operation
    if list(ret.operands) != [value]:
        raise CollageError(f"{func.location}: a kernel region returns its anchor's epilogue alone")
    inputs = (anchor.operands[0], anchor.operands[1], *(v for v in (bias, residual) if v is not None))
    return KernelRegion(spec, inputs, value)


class KernelBackend(Backend, ABC):
    """A backend whose regions are kernels dispatched in the IREE program (``hal.dispatch.extern``).
    Subclasses name their template and compile a spec for an architecture."""

    kind = BackendKind.KERNEL
    #: Where its kernels run and what it compiles them for (``ProgramTarget.kernel_arch``).
    platform: ClassVar[Platform]
    #: The object file's suffix (``cubin``, ``spv``).
    suffix: ClassVar[str]

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "platform" in cls.__dict__:
            cls.platforms = frozenset({cls.platform})

    @abstractmethod
    def template_for(self, spec: KernelSpec) -> str:
        """The source text of the template(s) ``spec`` compiles from: part of its kernel's cache key, so that
        editing a template recompiles its kernels."""

    @abstractmethod
    def compile(self, spec: KernelSpec, kernel_arch: str) -> tuple[bytes, KernelBinary]:
        """The object for ``spec`` on ``kernel_arch`` and its launch (``path`` is filled in by ``kernel``)."""

    def kernel(self, func: ir.Operation, kernel_arch: str, out_dir: Path | None,
               region: str) -> tuple[KernelRegion, KernelBinary]:
        """Reads the region function's kernel spec, compiles its kernel (or takes it from the kernel cache) and
        writes the object under ``out_dir/kernels``; with no ``out_dir``, nothing is compiled and the path
        is where it would be."""
        found = kernel_region(func, self.patterns)
        name = f"kernels/{region}.{self.name}.{self.suffix}"
        if out_dir is None:
            return found, KernelBinary(Path(name), "kernel", Launch((1, 1, 1), (1, 1, 1)))
        # Keyed by what the kernel is (template, spec, tactic: the backend's name, architecture), not by the
        # compiler that built it, which the object's metadata records: a kernel built on one machine serves
        # another with another Triton (the GPU machine's, in studies/gpu).
        key = hashlib.sha256(json.dumps([self.name, self.template_for(found.spec), found.spec.to_json(), kernel_arch],
                                        sort_keys=True).encode()).hexdigest()[:32]
        cached = cache_dir() / "kernels" / f"{key}.{self.suffix}"
        meta = cached.with_name(f"{cached.name}.json")
        if cached.is_file() and meta.is_file():
            record = json.loads(meta.read_text())
            data, binary = cached.read_bytes(), KernelBinary.from_json(record, cached.parent)
        else:
            try:
                data, binary = self.compile(found.spec, kernel_arch)
            except CollageError as exc:
                raise CollageError(f"{location_text(func.location)}: {exc}") from None
            except Exception as exc:  # the kernel compiler's own failure: one line, the region routed around
                first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
                raise CollageError(f"{location_text(func.location)}: {self.name} could not compile its "
                                   f"{type(found.spec).__name__} kernel for {kernel_arch}: {first[:300]}") from None
            binary = replace(binary, path=cached)
            record = {**binary.to_json(), "compiler": self.version()}
            write_cache(cached, data)
            write_cache(meta, json.dumps(record).encode())
        path = Path(out_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        binary = replace(binary, path=path)
        path.with_name(f"{path.name}.json").write_text(json.dumps({**binary.to_json(), "spec": found.spec.to_json(),
                                                                  "compiler": record.get("compiler", "unknown")}))
        return found, binary
