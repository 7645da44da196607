"""The backend interface: what a backend declares (patterns, constraints, kind, tolerance) and does
(build a region into an artifact the runtime can serve)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from enum import Enum
from functools import cached_property, total_ordering
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar

from collage_runtime.types import NumberFormat, Platform, Tolerance  # noqa: F401  (re-exported: backends state theirs)

from ..dialects.collage import OnnxSource
from ..dialects.stablehlo import const_expr_ops
from ..graph import Graph, Precision
from ..ir import ir
from .patterns import OpPattern, grow_regions, match, supported_by

if TYPE_CHECKING:
    from .iree_device import IreeDevice


class BackendKind(str, Enum):
    CODEGEN = "codegen"  # compiled into the IREE program itself
    LIBRARY = "library"  # per-op library calls (oneDNN, cuBLAS) served by the collage_rt module
    GRAPH = "graph"  # whole-subgraph engines (ONNX Runtime, TensorRT, XLA) served by collage_rt
    KERNEL = "kernel"  # a kernel compiled outside IREE, dispatched in the IREE program's own stream


@total_ordering
@dataclass(frozen=True)
class RegionKey:
    """A region on a backend at a precision, as a value: what costs, measurements and plans are keyed by
    (the cost DB keys rows by the structure of what is built instead). Ordered by backend, then sorted op
    ids, then precision."""

    backend: str
    ops: frozenset[int]
    precision: Precision = Precision.MODEL

    def __lt__(self, other: "RegionKey") -> bool:
        return ((self.backend, sorted(self.ops), self.precision.value)
                < (other.backend, sorted(other.ops), other.precision.value))


@dataclass(frozen=True)
class Candidate:
    """A region a backend could take: its op ids (convex), the backend's name and the pattern (or rule)
    that found it, as TVM Collage's ``CandidatePartition``."""

    backend: str
    pattern: str
    ops: frozenset[int]
    precision: Precision = Precision.MODEL

    @cached_property
    def key(self) -> RegionKey:
        return RegionKey(self.backend, self.ops, self.precision)


@dataclass(frozen=True)
class WholeModel:
    """A region that is the whole model imported from an ONNX file (``passes.lower.whole_model``):
    argument k of the region is the model's input ``inputs[k]``, result k its output ``outputs[k]``."""

    source: OnnxSource
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass(frozen=True)
class RegionArtifact:
    """What ``Backend.build`` wrote: a file (relative to the artifact dir) and the runtime executor
    that serves it (its name in the ``collage_runtime.executors`` entry-point group)."""

    file: str
    executor: str


class Backend:
    """Base class of every backend. Subclasses set the class attributes and implement ``build``.

    A backend is registered under the ``collage_mlir.backends`` entry-point group; nothing in the
    compiler names concrete backends.
    """

    name: ClassVar[str]
    #: Platforms of the programs this backend may run regions in. A host engine serves regions in any
    #: program (in a device program through copies to and from host memory); a codegen backend or a device
    #: library (cuBLAS, cuDNN) runs only where its code or memory lives.
    platforms: ClassVar[frozenset[Platform]] = frozenset(Platform)
    #: Python modules the backend needs; ``available`` reports the first one missing.
    requires: ClassVar[tuple[str, ...]] = ()
    kind: ClassVar[BackendKind]
    patterns: ClassVar[tuple[OpPattern, ...]] = ()
    tolerance: ClassVar[Tolerance] = Tolerance()
    install_hint: ClassVar[str] = ""
    #: Regions get the constant expressions only they read (weights, folded batch-norm statistics) as
    #: constants, not arguments: a graph engine folds and prepacks constants, and IREE then neither holds
    #: nor hands them over. GPT-2 with its feed-forward matmuls on ORT and the rest on OpenVINO (49
    #: regions): 219 ms a call with the weights passed in, 84 ms embedded (studies/mixed_linear).
    embeds_constants: ClassVar[bool] = False
    #: Left out of a tune's default backend set, used only where named: a backend that computes at a lower
    #: precision than the model states (TF32 for f32), or a configuration variant (a kernel tactic).
    opt_in: ClassVar[bool] = False
    #: The number format a lower-precision backend computes f32 math in (bf16, TF32): ``collage tune
    #: --precision bf16`` adds the usable backends of that format to the tune; None: the model's own.
    computes_in: ClassVar[NumberFormat | None] = None
    #: Codegen backends only: the logical IREE device (its own executable target and flags) that its
    #: regions run on inside the IREE program; None runs them on the program's default device.
    iree_device: ClassVar["IreeDevice | None"] = None

    def available(self) -> str | None:
        """None when usable here, else why not (missing library, ...). Looks modules up without
        importing them, so listing the registry stays fast."""
        for module in self.requires:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                return f"{module} is not installed"
        return None

    def version(self) -> str:
        return "unknown"

    def variants(self) -> tuple["Backend", ...]:
        """Configurations of this backend registered beside it under their own names (a kernel backend's
        tactics: ``triton@128x64w4s3``), each a backend the search measures and places like any other."""
        return ()

    def candidates(self, graph: Graph) -> list[Candidate]:
        """Every region this backend could take in ``graph``, one per op set (named by the first pattern
        that matches it), in op order."""
        found: dict[frozenset[int], str] = {}
        for oid in graph.topological_order():
            for pattern in self.patterns:
                for region in match(pattern, graph, oid):
                    found.setdefault(region, pattern.name)
        return [Candidate(self.name, name, region) for region, name in found.items()]

    def accepts(self, graph: Graph, ids: frozenset[int]) -> str | None:
        """None if this backend can run exactly the ops ``ids`` as one region, else the reason."""
        # Only a match anchored inside the region can equal it; no need to scan the whole graph.
        if any(ids == found for a in ids for p in self.patterns for found in match(p, graph, a)):
            return None
        names = ", ".join(sorted({graph.nodes[i].name for i in ids}))
        return f"no {self.name} pattern covers exactly these ops ({names}); patterns: " + ", ".join(
            p.name for p in self.patterns
        )

    def build(self, func: ir.Operation, out_dir: Path, region: str) -> RegionArtifact:
        """Builds the outlined region function ``func`` into a file under ``out_dir``."""
        raise TypeError(f"backend {self.name} runs inside the IREE program and builds no artifact")

    def build_source(self, whole: WholeModel, func: ir.Operation, out_dir: Path, region: str) -> RegionArtifact | None:
        """Builds the region ``func``, which is the whole model of an ONNX file, from that file rather than
        from ``func``; None where this backend does not (then ``build``)."""
        return None


#: Element types that cannot cross into a ``collage_rt`` function: IREE demotes f64 to f32 and refuses
#: external functions whose signature it would have to demote.
BOUNDARY_EXCLUDED = ("f64",)


def boundary_problem(graph: Graph, ids: frozenset[int]) -> str | None:
    """Why the region ``ids`` cannot be served through ``collage_rt``, else None (remembered per graph and
    region: every served backend asks the same)."""
    return graph.region_fact(_boundary_problem, ids)


def _boundary_problem(graph: Graph, ids: frozenset[int]) -> str | None:
    """It must take some input that is not a constant (a region of constants alone is folded by IREE at
    compile time, and outlining sinks constants into it anyway), no value crossing it may be f64, and none
    may be empty (no work to serve; ONNX Runtime's and OpenVINO's regions failed on a 0x3x4 reshape)."""
    edge = graph.boundary(ids)
    crossing = [v for v in edge.inputs if const_expr_ops(v) is None]
    if not crossing:
        return "only constants flow in: nothing to run (IREE folds it at compile time)"
    crossing += edge.outputs
    for v in crossing:
        t = v.type
        et = str(ir.RankedTensorType(t).element_type) if isinstance(t, ir.RankedTensorType) else ""
        if et in BOUNDARY_EXCLUDED:
            return f"a {et} tensor would cross the region boundary (IREE demotes {et} and cannot pass it)"
        if isinstance(t, ir.RankedTensorType) and 0 in t.shape:
            return f"an empty tensor ({t}) would cross the region boundary: nothing to serve"
    return None


def crossing_type_problem(graph: Graph, ids: frozenset[int]) -> str | None:
    """Why a call boundary around the region ``ids`` cannot exist, whatever backend runs it, else None
    (remembered per graph and region)."""
    return graph.region_fact(_crossing_type_problem, ids)


def _crossing_type_problem(graph: Graph, ids: frozenset[int]) -> str | None:
    """IREE cannot legalize a ``func.call`` carrying quantized (``!quant.uniform``) tensors, so such values
    must stay inside one region (its neighbours join it, or the boundary moves)."""
    edge = graph.boundary(ids)
    for v in (*edge.inputs, *edge.outputs):
        if "!quant." in str(v.type):
            return f"a quantized tensor ({v.type}) would cross the region boundary, which IREE cannot compile"
    return None


class OpSetBackend(Backend):
    """A backend that takes any convex set of ops it supports, not only fixed fusion shapes: graph-level
    engines (ONNX Runtime, OpenVINO, XLA) and codegen. ``patterns`` are single-op patterns (op name +
    constraints); a region is acceptable when each of its ops is taken by one of them.

    Candidates are every supported op alone plus regions grown along dataflow up to ``max_region_ops``.
    """

    max_region_ops: ClassVar[int] = 8

    def supports(self, op: ir.Operation) -> str | None:
        """None when this backend can run ``op`` (inside some region), else why not."""
        return supported_by(self.patterns, op)

    def candidates(self, graph: Graph) -> list[Candidate]:
        ok = {i for i, n in graph.nodes.items() if self.supports(n.op) is None}
        out = []
        for region in grow_regions(graph, ok, self.max_region_ops):
            if self.kind != BackendKind.CODEGEN and boundary_problem(graph, region):
                continue
            if crossing_type_problem(graph, region):
                continue
            out.append(Candidate(self.name, graph.nodes[min(region)].name if len(region) == 1 else "subgraph", region))
        return out

    def accepts(self, graph: Graph, ids: frozenset[int]) -> str | None:
        for i in sorted(ids):
            why = self.supports(graph.nodes[i].op)
            if why:
                return why
        return boundary_problem(graph, ids) if self.kind != BackendKind.CODEGEN else None


BackendFactory = Callable[[], Backend]


@dataclass
class BackendInfo:
    """A registry row: the backend if it could be loaded, else why not."""

    name: str
    backend: Backend | None
    problem: str | None = None
