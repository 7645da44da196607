"""The base of the backends that run the ONNX model ``collage_mlir.onnx`` translates a region into (`ort`,
`openvino`): their single-op patterns, read off the translator's op table, and their build."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import ClassVar

from ..dialects import stablehlo as sh
from ..frontends.dims import specialise_onnx
from ..ir import ir
from ..onnx import OPS, NestedOps, translate
from ..onnx.values import BOUNDARY_DTYPES
from .base import BackendKind, OpSetBackend, RegionArtifact, WholeModel
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
        return self._write(translate(func, ties_by_index=self.topk_ties_by_index), out_dir, region)

    def build_source(self, whole: WholeModel, func: ir.Operation, out_dir: Path, region: str) -> RegionArtifact | None:
        model = source_model(whole, func)
        return self._write(model, out_dir, region) if model is not None and self.loads(model) else None

    def loads(self, model) -> bool:
        """Whether the engine runs the user's ONNX ``model`` as it is, for a region that is the whole model
        (``build_source``); by default not: the translation is what the backend's patterns vouch for."""
        return False

    def _write(self, model, out_dir: Path, region: str) -> RegionArtifact:
        path = Path(out_dir) / "regions" / f"{region}{self.suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(model.SerializeToString())
        return RegionArtifact(str(path.relative_to(out_dir)), self.executor)


def source_model(whole: WholeModel, func: ir.Operation):
    """The whole model's ONNX file (specialised to its source's dims) as an ONNX model, its inputs and
    outputs in the region's order, where the file is as it was imported and its inputs and outputs are
    ``func``'s (element types and shapes); else None. Weights inline: None for a model of 2 GB or more,
    which one protobuf cannot hold."""
    import onnx

    source = whole.source
    if not source.unchanged():
        return None
    with tempfile.TemporaryDirectory(prefix="collage-source-") as tmp:
        path = specialise_onnx(source.path, dict(source.dims), tmp) if source.dims else source.path
        model = onnx.load(str(path))
    if model.ByteSize() >= 2 ** 31:
        return None
    graph = model.graph
    initialized = {t.name for t in graph.initializer}
    inputs = [v for v in graph.input if v.name not in initialized]
    if len(inputs) != len(whole.inputs) or len(graph.output) != len(whole.outputs):
        return None
    inputs = [inputs[k] for k in whole.inputs] + [v for v in graph.input if v.name in initialized]
    outputs = [graph.output[k] for k in whole.outputs]
    block = func.regions[0].blocks[0]
    returned = list(list(block.operations)[-1].operands)
    for values, ours in ((inputs, list(block.arguments)), (outputs, returned)):
        for v, value in zip(values, ours):
            tt = sh.tensor_type(value)
            tensor = v.type.tensor_type
            if tt is None or tt[1] not in BOUNDARY_DTYPES or tensor.elem_type != BOUNDARY_DTYPES[tt[1]][1]:
                return None
            if [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim] != list(tt[0]):
                return None
    for field, values in ((graph.input, inputs), (graph.output, outputs)):
        kept = [type(v)() for v in values]
        for new, old in zip(kept, values):
            new.CopyFrom(old)
        del field[:]
        field.extend(kept)
    return model
