"""`collage-assign`: applies a plan, tagging each op of a plan region with ``collage.backend`` and
``collage.region`` (and ``collage.precision`` where the region's is not the model's).

A Python pattern-rewrite pass: one pattern per op name the plan mentions, driven by MLIR's
``walk_and_apply_patterns``. The plan is validated against the module's graph first, so a bad plan
fails with one line before the IR changes.

Without a ``plan`` option (None) the plan is the module's ``collage.plan`` attribute, a dictionary shaped
like the plan JSON (``{version = 1, regions = [{name = "r", backend = "onednn", ops = [1, 2]}]}``),
so a module can carry its own placement (and a lit test its own bad plan).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..backends import Precision, pinned_backend
from ..dialects import collage
from ..errors import CollageError
from ..graph import Graph, body_ops, public_funcs
from ..ir import ir, location_text, rewrite
from ..plan import FORMAT, Plan
from .base import ModulePass


@dataclass(frozen=True)
class AssignPass(ModulePass):
    name = "collage-assign"
    summary = "Tag the ops of each plan region with collage.backend and collage.region"
    #: The plan, or its file; None: the module's ``collage.plan`` attribute.
    plan: Plan | Path | None = None

    def run(self, module: ir.Module | ir.Operation) -> None:
        plan = self.plan if isinstance(self.plan, Plan) else self._load(self.plan, module.operation)
        graph = Graph(module)
        if not graph.nodes and any(True for f in public_funcs(module) for _ in body_ops(f)):
            # (A module whose functions hold no op, returning their arguments, has nothing to number.)
            raise CollageError("no op has a collage.id; run --collage-number-ops before --collage-assign")
        plan.validate(graph)
        placement = _pinned(plan.backend_of(), graph, plan)
        if not placement:
            return
        precision = {r.name: r.precision for r in plan.regions if r.precision is not Precision.MODEL}

        def tag(op: ir.Operation, rewriter: rewrite.PatternRewriter) -> bool:
            oid = collage.op_id(op)
            if oid not in placement or collage.BACKEND in op.attributes:
                return True  # no match
            region, backend = placement[oid]
            collage.set_str_attr(op, collage.BACKEND, backend)
            collage.set_str_attr(op, collage.REGION, region)
            if region in precision:
                collage.set_str_attr(op, collage.PRECISION, precision[region].value)
            return False

        with module.operation.context:
            patterns = rewrite.RewritePatternSet()
            for name in sorted({graph.nodes[i].name for i in placement}):
                patterns.add(name, tag)
            # Freeze exactly once: freezing a pattern set twice crashes.
            rewrite.walk_and_apply_patterns(module.operation, patterns.freeze())

    @staticmethod
    def _load(path: Path | str | None, module: ir.Operation) -> Plan:
        if path:
            return Plan.load(path)
        if PLAN_ATTR not in module.attributes:
            raise CollageError("--collage-assign needs a plan: --collage-assign=\"plan=PLAN.json\" or a "
                               f"{PLAN_ATTR} attribute on the module")
        data = attribute_value(module.attributes[PLAN_ATTR])
        if isinstance(data, dict):  # the attribute is the plan itself: its format is implied
            data.setdefault("format", FORMAT)
        return Plan.from_json(data, source=f"{location_text(module.location)}: {PLAN_ATTR}")


def _pinned(placement: dict[int, tuple[str, str]], graph: Graph, plan: Plan) -> dict[int, tuple[str, str]]:
    """``placement`` with each op that only one backend runs (``backends.pinned_backend``: an ONNX node kept
    as ONNX) in a region of its own on that backend where the plan leaves it to the default backend (a plan
    region on a backend that cannot run it failed ``Plan.validate`` already)."""
    names = {r.name for r in plan.regions}
    for oid, node in graph.nodes.items():
        backend = pinned_backend(node.op)
        if backend is not None and oid not in placement:
            name = f"onnx_node_{oid}"
            while name in names:
                name += "_"
            placement[oid] = (name, backend)
    return placement


#: Module attribute holding a plan, read when --collage-assign has no plan option.
PLAN_ATTR = "collage.plan"


def attribute_value(attr: ir.Attribute) -> object:
    """A dictionary/array/string/integer/float/bool attribute as the JSON-like Python value."""
    if isinstance(attr, ir.DictAttr):
        return {n.name: attribute_value(n.attr) for n in attr}
    if isinstance(attr, ir.ArrayAttr):
        return [attribute_value(a) for a in attr]
    if isinstance(attr, (ir.StringAttr, ir.BoolAttr, ir.IntegerAttr, ir.FloatAttr)):
        return attr.value
    return str(attr)  # kept as text: the plan's shape check names it
