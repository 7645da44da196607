"""The backend interface: what a backend declares (patterns, constraints, kind, tolerance) and does
(build a region into an artifact the runtime can serve)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar

from ..graph import Graph
from ..ir import ir
from .patterns import OpPattern, grow_regions, match, match_all, supported_by

if TYPE_CHECKING:
    from .iree_device import IreeDevice


class BackendKind(str, Enum):
    CODEGEN = "codegen"  # compiled into the IREE program itself
    LIBRARY = "library"  # per-op library calls (oneDNN, cuBLAS) served by the collage_rt module
    GRAPH = "graph"  # whole-subgraph engines (ONNX Runtime, TensorRT, XLA) served by collage_rt


@dataclass(frozen=True)
class RegionArtifact:
    """What ``Backend.build`` wrote: a file (relative to the artifact dir) and the runtime executor
    (an importable module path under ``collage_runtime``'s executor protocol) that serves it."""

    file: str
    executor: str


@dataclass(frozen=True)
class Tolerance:
    """How far a backend's results may differ from IREE llvm-cpu's (numpy ``allclose`` semantics)."""

    rtol: float = 1e-5
    atol: float = 1e-6


class Backend:
    """Base class of every backend. Subclasses set the class attributes and implement ``build``.

    A backend is registered under the ``collage_mlir.backends`` entry-point group; nothing in the
    compiler names concrete backends.
    """

    name: ClassVar[str]
    device: ClassVar[str] = "cpu"
    kind: ClassVar[BackendKind]
    patterns: ClassVar[tuple[OpPattern, ...]] = ()
    tolerance: ClassVar[Tolerance] = Tolerance()
    install_hint: ClassVar[str] = ""
    #: Codegen backends only: the logical IREE device (its own executable target and flags) that its
    #: regions run on inside the IREE program; None runs them on the program's default device.
    iree_device: ClassVar["IreeDevice | None"] = None

    def available(self) -> str | None:
        """None when usable here, else why not (missing library, ...)."""
        return None

    def version(self) -> str:
        return "unknown"

    def candidates(self, graph: Graph) -> list[tuple[str, frozenset[int]]]:
        """Every (pattern name, op ids) this backend could take in ``graph``."""
        return match_all(self.patterns, graph)

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

    def candidates(self, graph: Graph) -> list[tuple[str, frozenset[int]]]:
        ok = {i for i, n in graph.nodes.items() if self.supports(n.op) is None}
        out = []
        for region in grow_regions(graph, ok, self.max_region_ops):
            out.append((graph.nodes[min(region)].name if len(region) == 1 else "subgraph", region))
        return out

    def accepts(self, graph: Graph, ids: frozenset[int]) -> str | None:
        for i in sorted(ids):
            why = self.supports(graph.nodes[i].op)
            if why:
                return why
        return None


BackendFactory = Callable[[], Backend]


@dataclass
class BackendInfo:
    """A registry row: the backend if it could be loaded, else why not."""

    name: str
    backend: Backend | None
    problem: str | None = None
