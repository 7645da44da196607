"""`collage-assign`: applies a plan, tagging each op of a plan region with ``collage.backend`` and
``collage.region``.

A Python pattern-rewrite pass: one pattern per op name the plan mentions, driven by MLIR's
``walk_and_apply_patterns``. The plan is validated against the module's graph first, so a bad plan
fails with one line before the IR changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dialects import collage
from ..errors import CollageError
from ..graph import Graph
from ..ir import ir, rewrite
from ..plan import Plan
from . import ModulePass


@dataclass
class AssignPass(ModulePass):
    name = "collage-assign"
    summary = "Tag the ops of each plan region with collage.backend and collage.region"
    plan: str | Plan = ""

    def run(self, module: ir.Module | ir.Operation) -> None:
        plan = self.plan if isinstance(self.plan, Plan) else self._load(self.plan)
        graph = Graph(module)
        if not graph.nodes:
            raise CollageError("no op has a collage.id; run --collage-number-ops before --collage-assign")
        plan.validate(graph)
        placement = plan.backend_of()
        if not placement:
            return

        def tag(op: ir.Operation, rewriter: rewrite.PatternRewriter) -> bool:
            oid = collage.op_id(op)
            if oid not in placement or collage.BACKEND in op.attributes:
                return True  # no match
            region, backend = placement[oid]
            collage.set_str_attr(op, collage.BACKEND, backend)
            collage.set_str_attr(op, collage.REGION, region)
            return False

        with module.operation.context:
            patterns = rewrite.RewritePatternSet()
            for name in sorted({graph.nodes[i].name for i in placement}):
                patterns.add(name, tag)
            # Freeze exactly once: freezing a pattern set twice crashes.
            rewrite.walk_and_apply_patterns(module.operation, patterns.freeze())

    @staticmethod
    def _load(path: str) -> Plan:
        if not path:
            raise CollageError("--collage-assign needs a plan: --collage-assign=\"plan=PLAN.json\"")
        return Plan.load(path)
