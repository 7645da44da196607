"""`collage-lower`: regions of codegen backends stay in the IREE program (IREE inlines them); each
region of a library or graph-level backend is built into a region artifact and its function becomes
the import ``func.func private @collage_rt.<region>``, served at run time by the ``collage_rt`` module.

With ``artifact-dir`` empty the IR is rewritten and no artifact is built (for inspecting the IR).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from iree.compiler.dialects import func as func_d

from ..backends import BackendKind
from ..dialects import collage
from ..graph import module_block
from ..ir import ir
from . import ModulePass, region_functions


def _spec(t: ir.Type) -> dict:
    t = ir.RankedTensorType(t)
    return {"shape": list(t.shape), "dtype": str(t.element_type)}


@dataclass
class LowerPass(ModulePass):
    name = "collage-lower"
    summary = "Turn library-backend regions into collage_rt imports and build their artifacts"
    artifact_dir: str = ""
    #: Manifest entries of the regions built by the last run.
    built: list[dict] = field(default_factory=list)

    def run(self, module: ir.Module | ir.Operation) -> None:
        self.built = []
        block = module_block(module)
        with module.operation.context:
            for fn, backend in region_functions(block):
                if backend.kind == BackendKind.CODEGEN:
                    continue
                region = collage.str_attr(fn, collage.REGION)
                ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
                entry = {
                    "name": region,
                    "backend": backend.name,
                    "backend_version": backend.version(),
                    "inputs": [_spec(t) for t in ftype.inputs],
                    "outputs": [_spec(t) for t in ftype.results],
                    "tolerance": {"rtol": backend.tolerance.rtol, "atol": backend.tolerance.atol},
                }
                if self.artifact_dir:
                    art = backend.build(fn, Path(self.artifact_dir), region)
                    entry.update(artifact=art.file, executor=art.executor)
                symbol = collage.region_symbol(region)
                with fn.location, ir.InsertionPoint(fn):
                    decl = func_d.FuncOp(symbol, ftype, visibility="private").operation
                for attr in (collage.BACKEND, collage.REGION):
                    decl.attributes[attr] = fn.attributes[attr]
                if "artifact" in entry:
                    collage.set_str_attr(decl, collage.ARTIFACT, entry["artifact"])
                _retarget_calls(block, region, symbol)
                fn.erase()
                self.built.append(entry)


def _retarget_calls(block: ir.Block, old: str, new: str) -> None:
    target = ir.FlatSymbolRefAttr.get(new)

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "func.call" and ir.FlatSymbolRefAttr(op.attributes["callee"]).value == old:
            op.attributes["callee"] = target
        return ir.WalkResult.ADVANCE

    for op in block.operations:
        op.operation.walk(visit)
