"""`collage-lower`: regions of codegen backends stay in the IREE program (IREE inlines them); a region of a
kernel backend stays too, its body replaced by ``hal.dispatch.extern`` of its compiled kernel (written under
``kernels/``; iree-compile embeds it in the module); each region of a library or graph-level backend is built
into a region artifact (a graph engine's region that is the whole model of an ONNX file: that file,
``Backend.build_source``) and its function becomes the import ``func.func private @collage_rt.<region>``, served
at run time by the ``collage_rt`` module.

Without ``artifact-dir`` the IR is rewritten and nothing is built (for inspecting the IR): a kernel
dispatch then names the object it would use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from collage_runtime.manifest import RegionEntry
from collage_runtime.types import TensorSpec
from iree.compiler.dialects import func as func_d

from ..backends import BackendKind, get_backend
from ..backends.base import WholeModel
from ..backends.kernel import KernelBackend
from ..dialects import collage
from ..dialects.hal import dispatch_extern
from ..graph import module_block
from ..errors import CollageError
from ..ir import ir, location_text
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
    #: What kernel backends compile for (the program target's ``kernel_arch``: ``sm_90``, ``spirv``).
    kernel_arch: str = ""

    def run(self, module: ir.Module | ir.Operation) -> None:
        block = module_block(module)
        with module.operation.context:
            for fn, backend in region_functions(block):
                if backend.kind == BackendKind.CODEGEN:
                    continue
                if isinstance(backend, KernelBackend):
                    self._lower_kernel(fn, backend)
                    continue
                region = collage.str_attr(fn, collage.REGION)
                ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
                art = None
                if self.artifact_dir is not None:
                    whole = whole_model(module, region)
                    art = (whole is not None and backend.build_source(whole, fn, Path(self.artifact_dir), region)) \
                        or backend.build(fn, Path(self.artifact_dir), region)
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

    def _lower_kernel(self, fn: ir.Operation, backend: KernelBackend) -> None:
        """Replaces the region function's body by the dispatch of its kernel (the function stays, for IREE
        to inline), its output a fresh tensor the kernel writes."""
        where = location_text(fn.location)
        if not self.kernel_arch:
            raise CollageError(f"backend '{backend.name}' runs kernels in {backend.platform.value} programs only; "
                               "this one has no kernel architecture (collage-lower's kernel-arch option)", where=where)
        region = collage.str_attr(fn, collage.REGION)
        out_dir = Path(self.artifact_dir) if self.artifact_dir is not None else None
        found, binary = backend.kernel(fn, self.kernel_arch, out_dir, region)
        block = fn.regions[0].blocks[0]
        ret = block.operations[len(block.operations) - 1].operation
        inputs = list(found.inputs)
        with fn.location, ir.InsertionPoint(ret):
            out = ir.Operation.create("tensor.empty", results=[found.out.type]).results[0]
            scratch = []
            if binary.trailing_pointers:
                i8 = ir.RankedTensorType.get([16], ir.IntegerType.get_signless(8))
                scratch = [ir.Operation.create("arith.constant", results=[i8], attributes={
                    "value": ir.DenseElementsAttr.get_splat(i8, ir.IntegerAttr.get(i8.element_type, 0))}).results[0]]
            args = [*inputs, out, *scratch * binary.trailing_pointers]
            read_only = [True] * len(inputs) + [False] + [True] * binary.trailing_pointers
            dispatch = dispatch_extern(binary.export, args, len(inputs), str(binary.path), self.kernel_arch,
                                       binary.launch, read_only)
        ret.operands[0] = dispatch.results[0]
        _erase_dead(block)


def _erase_dead(block: ir.Block) -> None:
    """Erases the block's ops whose results nothing uses (what the kernel replaced), last first."""
    changed = True
    while changed:
        changed = False
        for op in reversed(list(block.operations)):
            op = op.operation
            if op.results and all(not list(r.uses) for r in op.results):
                op.erase()
                changed = True


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


def whole_model(module: ir.Module | ir.Operation, region: str) -> WholeModel | None:
    """The region as the whole model of the ONNX file ``module`` was imported from (``collage.OnnxSource``):
    where a public function is nothing but a call of the region on all its arguments, returning all the
    call's results (in any order: outlining orders a region's inputs by first use)."""
    source = collage.OnnxSource.of(module)
    if source is None:
        return None
    for op in module_block(module).operations:
        caller = op.operation
        if not collage.is_public_func(caller):
            continue
        body = caller.regions[0].blocks[0]
        ops = [o.operation for o in body.operations]
        if len(ops) != 2 or ops[0].name != "func.call" or ops[1].name != "func.return":
            continue
        call, ret = ops
        if ir.FlatSymbolRefAttr(call.attributes["callee"]).value != region:
            continue
        inputs = _permutation(list(call.operands), list(body.arguments))
        outputs = _permutation(list(call.results), list(ret.operands))
        if inputs is not None and outputs is not None:
            return WholeModel(source, inputs, outputs)
    return None


def _permutation(values: list[ir.Value], of: list[ir.Value]) -> tuple[int, ...] | None:
    """Where each of ``values`` is in ``of``, if they are all of ``of`` once each; else None."""
    found = tuple(next((k for k, w in enumerate(of) if w == v), -1) for v in values)
    return found if sorted(found) == list(range(len(of))) else None


def _retarget_calls(block: ir.Block, old: str, new: str) -> None:
    target = ir.FlatSymbolRefAttr.get(new)

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "func.call" and ir.FlatSymbolRefAttr(op.attributes["callee"]).value == old:
            op.attributes["callee"] = target
        return ir.WalkResult.ADVANCE

    for op in block.operations:
        op.operation.walk(visit)
