"""The base of the backends that run the ONNX model ``collage_mlir.onnx`` translates a region into (`ort`,
`openvino`): their single-op patterns, read off the translator's op table, and their build."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from ..ir import ir
from ..onnx import OPS, NestedOps, translate
from .base import BackendKind, OpSetBackend, RegionArtifact
from .patterns import Constraint, OpPattern


def engine_patterns(*engine: Constraint) -> tuple[OpPattern, ...]:
    """Single-op patterns for OpSetBackend, one per translatable op (named by the op), each also
    meeting the ``engine`` constraints: what the engine running the ONNX model really implements (a
    loop's ops too, ``NestedOps``)."""
    return tuple(OpPattern(name.split(".", 1)[1] if name.startswith("stablehlo.") else name, name,
                           spec.when + engine + ((NestedOps(engine),) if spec.nested else ()))
                 for name, spec in OPS.items())


class OnnxGraphBackend(OpSetBackend):
    """Shared by the backends that run the exported ONNX model: the build (export, write
    ``regions/<region><suffix>``) and the executor that serves it. Each subclass states its patterns
    with ``engine_patterns`` and the element-type limits its engine has."""

    max_region_ops: ClassVar[int] = 8
    kind = BackendKind.GRAPH
    embeds_constants = True
    suffix: ClassVar[str] = ".onnx"
    executor: ClassVar[str]
    #: Whether the engine's ``TopK`` keeps equal values in index order, as ONNX specifies (probed:
    #: test_onnx_control.py); where not, the export breaks ties itself (``_ordered_top_k``).
    topk_ties_by_index: ClassVar[bool] = True

    def build(self, func: ir.Operation, out_dir: Path, region: str) -> RegionArtifact:
        path = Path(out_dir) / "regions" / f"{region}{self.suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(translate(func, ties_by_index=self.topk_ties_by_index).SerializeToString())
        return RegionArtifact(str(path.relative_to(out_dir)), self.executor)
