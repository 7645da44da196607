"""`collage-lower`: regions of codegen backends stay in the IREE program (IREE inlines them); each
region of a library or graph-level backend is built into a region artifact and its function becomes
the import ``func.func private @collage_rt.<region>``, served at run time by the ``collage_rt`` module.

Without ``artifact-dir`` the IR is rewritten and no artifact is built (for inspecting the IR).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from collage_runtime.manifest import RegionEntry
from collage_runtime.types import TensorSpec
from iree.compiler.dialects import func as func_d

from ..backends import BackendKind, get_backend
from ..dialects import collage
from ..graph import module_block
from ..ir import ir
from .base import ModulePass
from .outline import region_functions


def _spec(t: ir.Type) -> TensorSpec:
    t = ir.RankedTensorType(t)
    return TensorSpec(tuple(t.shape), str(t.element_type))


@dataclass(frozen=True)
class LowerPass(ModulePass):
    name = "collage-lower"
    summary = "Turn library-backend regions into collage_rt imports and build their artifacts"
    #: Where region artifacts are built; None: rewrite the IR only.
    artifact_dir: Path | None = None

    def run(self, module: ir.Module | ir.Operation) -> None:
        block = module_block(module)
        with module.operation.context:
            for fn, backend in region_functions(block):
                if backend.kind == BackendKind.CODEGEN:
                    continue
                region = collage.str_attr(fn, collage.REGION)
                ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
                art = backend.build(fn, Path(self.artifact_dir), region) if self.artifact_dir is not None else None
                symbol = collage.region_symbol(region)
                with fn.location, ir.InsertionPoint(fn):
                    decl = func_d.FuncOp(symbol, ftype, visibility="private").operation
                for attr in (collage.BACKEND, collage.REGION):
                    decl.attributes[attr] = fn.attributes[attr]
                if art is not None:
                    collage.set_str_attr(decl, collage.ARTIFACT, art.file)
                    collage.set_str_attr(decl, collage.EXECUTOR, art.executor)
                _retarget_calls(block, region, symbol)
                fn.erase()


def library_regions(module: ir.Module | ir.Operation) -> list[RegionEntry]:
    """The manifest entries of the library regions ``collage-lower`` left in ``module`` (its
    ``collage_rt`` imports): name, backend and version, tensor signature, tolerance, artifact, executor
    (the artifact's SHA-256 is the compile driver's to add once the file is final)."""
    entries = []
    for op in module_block(module).operations:
        decl = op.operation
        region = collage.str_attr(decl, collage.REGION) if decl.name == "func.func" else None
        if region is None or len(decl.regions[0].blocks) or collage.ARTIFACT not in decl.attributes:
            continue
        backend = get_backend(collage.str_attr(decl, collage.BACKEND))
        ftype = ir.FunctionType(ir.TypeAttr(decl.attributes["function_type"]).value)
        entries.append(RegionEntry(region, backend.name, backend.version(), tuple(_spec(t) for t in ftype.inputs),
                                   tuple(_spec(t) for t in ftype.results), backend.tolerance,
                                   collage.str_attr(decl, collage.ARTIFACT), collage.str_attr(decl, collage.EXECUTOR)))
    return entries


def _retarget_calls(block: ir.Block, old: str, new: str) -> None:
    target = ir.FlatSymbolRefAttr.get(new)

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "func.call" and ir.FlatSymbolRefAttr(op.attributes["callee"]).value == old:
            op.attributes["callee"] = target
        return ir.WalkResult.ADVANCE

    for op in block.operations:
        op.operation.walk(visit)
