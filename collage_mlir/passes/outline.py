"""`collage-outline`: moves each tagged region into a private ``func.func`` carrying
``collage.backend`` and ``collage.region``, called by ``func.call`` where the region was.

Region inputs become arguments, except small or splat constants (also under converts, reshapes
and broadcasts, as torch-mlir writes scalars), which are cloned into the function so a backend sees
their values (a relu's zero, a GELU's coefficients), and, for a backend that embeds constants (a
graph engine: it folds and prepacks them), every constant expression only the region reads (its
weights); values used after the region become results. Ops that sat between the region's ops but
consume its results move after the call, which convexity makes legal.
"""

from __future__ import annotations

from dataclasses import dataclass

from iree.compiler.dialects import func as func_d

from ..backends import Backend, get_backend, registry
from ..dialects import collage
from ..dialects import stablehlo as sh
from ..errors import CollageError
from ..graph import body_ops, external_operands, module_block, nested_ops, public_funcs, remap_operands
from ..ir import ir, location_text
from .base import ModulePass


def region_functions(block: ir.Block) -> list[tuple[ir.Operation, Backend]]:
    """The outlined region functions of a module body (``func.func`` with a body and a
    ``collage.backend``), each with its backend."""
    found = []
    for op in block.operations:
        fn = op.operation
        name = collage.str_attr(fn, collage.BACKEND) if fn.name == "func.func" else None
        if name is not None and len(fn.regions[0].blocks):
            try:
                found.append((fn, get_backend(name, where=location_text(fn.location))))
            except CollageError as exc:
                exc.location = fn.location
                raise
    return found


def _sinkable(value: ir.Value, inside: set[ir.Operation] | None = None) -> list[ir.Operation] | None:
    """``sh.sunk_chain``, unless another region owns the constant expression."""
    ops = sh.sunk_chain(value, inside)
    if ops is not None and any(collage.REGION in op.attributes for op in ops):
        # Another region owns it and will move it: OutlinePass gives readers their own copies first
        # (_own_constants); this keeps a direct caller of outline_region from cloning it anyway.
        return None
    return ops


def outline_region(func: ir.Operation, ops: list[ir.Operation], region: str, backend: str,
                   embeds_constants: bool = False) -> ir.Operation | None:
    """Outlines ``ops`` (one region, in block order) of ``func``; returns the new private function, or
    None when no result of the region is used (it is left in place, untagged). With
    ``embeds_constants``, the constant expressions only the region reads are cloned in, not passed."""
    module_body = func.parent.regions[0].blocks[0]
    inside = {o for op in ops for o in nested_ops(op)}
    inputs = external_operands(ops)
    sunk = [(v, chain) for v in inputs if (chain := _sinkable(v, inside if embeds_constants else None)) is not None]
    args = [v for v in inputs if not any(v == s for s, _ in sunk)]
    outputs = [r for op in ops for r in op.results if any(u.owner.operation not in inside for u in r.uses)]
    if not outputs:
        # Dead code: nothing uses the region. It stays in place, untagged, for IREE to drop; a backend
        # call without results would be work for nothing (ONNX Runtime refuses such graphs outright).
        for op in ops:
            for attr in (collage.REGION, collage.BACKEND):
                if attr in op.attributes:
                    del op.attributes[attr]
        return None
    loc = ops[0].location

    with loc, ir.InsertionPoint(ops[-1]):
        call = func_d.CallOp([v.type for v in outputs], ir.FlatSymbolRefAttr.get(region), args).operation
    ops[-1].move_before(call)
    for k, v in enumerate(outputs):
        for use in list(v.uses):
            owner = use.owner.operation
            if owner not in inside:
                owner.operands[use.operand_number] = call.results[k]

    # Ops between the region's ops that consume its results must now follow the call.
    block_ops = [o.operation for o in func.regions[0].blocks[0].operations]
    first, last = block_ops.index(ops[0]), block_ops.index(call)
    tainted = list(call.results)
    prev = call
    for o in block_ops[first:last]:
        if o in inside:
            continue
        if any(any(x == t for t in tainted) for x in external_operands([o])):
            o.move_after(prev)
            prev = o
            tainted.extend(o.results)

    with loc, ir.InsertionPoint(module_body):
        fn = func_d.FuncOp(region, ir.FunctionType.get([v.type for v in args], [v.type for v in outputs]),
                           visibility="private")
        entry = fn.add_entry_block()
    fn = fn.operation
    collage.set_str_attr(fn, collage.BACKEND, backend)
    collage.set_str_attr(fn, collage.REGION, region)

    mapping: list[tuple[ir.Value, ir.Value]] = list(zip(args, entry.arguments))
    for v, chain in sunk:
        mapping.append((v, sh.clone_const_expr(chain, ir.InsertionPoint(entry))[-1].results[0]))
    for op in ops:
        entry.append(op)
    for op in ops:
        remap_operands(op, mapping)
    with loc, ir.InsertionPoint(entry):
        func_d.ReturnOp(outputs)
    _erase_unused([p for _, chain in sunk for p in chain])
    return fn


def _erase_unused(chain_ops: list[ir.Operation]) -> None:
    """Erases the constant-expression ops of ``chain_ops`` whose every use moved into regions, users
    before producers. Chains share ops (a broadcast another sunk value converts): each op is visited
    once, and never after it is erased (touching an erased op kills the process)."""
    pending: list[ir.Operation] = []
    for op in chain_ops:
        if not any(op == p for p in pending):
            pending.append(op)
    pending = [op for op in pending if collage.REGION not in op.attributes]
    progress = True
    while progress:
        progress = False
        for op in list(pending):
            if not list(op.results[0].uses):
                pending.remove(op)
                op.erase()
                progress = True


def _own_constants(region: str, ops: list[ir.Operation]) -> None:
    """Gives ``ops`` their own untagged copy of every constant expression they read that another
    region owns, so outlining sinks it as ``sh.sunk_chain`` says, whatever region the plan gives the
    constant (a random plan may put a scalar's convert in one region and its user in another: passed
    across, an f64 scalar would reach a ``collage_rt`` signature, which IREE refuses; a weight, or BERT's
    i64 position ids, in an IREE region of its own would reach an OpenVINO region as a run-time input)."""
    for v in external_operands(ops):
        chain = sh.const_expr_ops(v, readable=False)
        if chain is None or all(collage.str_attr(op, collage.REGION) in (None, region) for op in chain):
            continue
        clones = sh.clone_const_expr(chain, ir.InsertionPoint(ops[0]))
        for clone in clones:
            for attr in (collage.ID, collage.REGION, collage.BACKEND):
                if attr in clone.attributes:
                    del clone.attributes[attr]
        for op in ops:
            remap_operands(op, [(v, clones[-1].results[0])])


@dataclass(frozen=True)
class OutlinePass(ModulePass):
    name = "collage-outline"
    summary = "Outline each collage.region into a private function called by func.call"

    def run(self, module: ir.Module | ir.Operation) -> None:
        embedding = {name for name, info in registry().items()
                     if info.backend is not None and info.backend.embeds_constants}
        with module.operation.context:
            taken = {collage.symbol_name(op) for op in module_block(module).operations
                     if "sym_name" in op.operation.attributes}
            for func in list(public_funcs(module)):
                regions: dict[str, list[ir.Operation]] = {}
                for op in body_ops(func):
                    name = collage.str_attr(op, collage.REGION)
                    if name is not None:
                        regions.setdefault(name, []).append(op)
                for name, ops in regions.items():
                    _own_constants(name, ops)
                for name, ops in regions.items():
                    if name in taken:
                        raise CollageError(f"region name '{name}' clashes with an existing symbol; rename the "
                                           "region in the plan", where=location_text(ops[0].location),
                                           location=ops[0].location)
                    backend = collage.str_attr(ops[0], collage.BACKEND) or ""
                    outline_region(func, ops, name, backend, backend in embedding)
                    taken.add(name)
