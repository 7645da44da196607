"""A plan carried from one shape bucket's module to another's, as a seed of that bucket's tune.

The same model specialised to two shapes numbers its ops alike, except where a fold drops an op at one
shape only (a reshape that is the identity at batch 1). Ops are matched by aligning the two modules' op
sequences (name, operand count, result element types and ranks: what does not change with a dim's value),
each region keeps its matched ops, and a region that is then not a valid region of the target (its backend
refuses it, it is no longer convex) is dropped: its ops run on the default backend.
"""

from __future__ import annotations

import difflib

from ..errors import CollageError
from ..graph import Graph
from ..ir import ir
from ..plan import Plan, Region


#: A module's ops in id order, each with what does not change with a dim's value (``op_sequence``): kept
#: apart from the module, which compiling it changes.
OpSequence = tuple[tuple[int, tuple], ...]


def op_sequence(graph: Graph) -> OpSequence:
    """Each op id of ``graph`` with its signature: name, operand count, result element types and ranks."""
    def signature(op: ir.Operation) -> tuple:
        results = tuple((str(t.element_type), t.rank) if isinstance(t, ir.RankedTensorType) else (str(t), -1)
                        for t in (r.type for r in op.results))
        return op.name, len(op.operands), results

    return tuple((i, signature(graph.nodes[i].op)) for i in sorted(graph.nodes))


def match_ops(source: OpSequence, target: OpSequence) -> dict[int, int]:
    """Source op id → target op id, for the ops the two modules' aligned op sequences share."""
    matcher = difflib.SequenceMatcher(None, [s for _, s in source], [s for _, s in target], autojunk=False)
    return {source[blk.a + k][0]: target[blk.b + k][0]
            for blk in matcher.get_matching_blocks() for k in range(blk.size)}


def transfer(plan: Plan, source: OpSequence, target: Graph) -> Plan:
    """``plan`` of the module ``source`` was read from, as a plan of ``target``'s (see the module docstring)."""
    ids = match_ops(source, op_sequence(target))
    regions: list[Region] = []
    for region in plan.regions:
        ops = frozenset(ids[i] for i in region.ops if i in ids)
        if not ops:
            continue
        moved = Region(region.name, region.backend, ops, region.precision)
        try:
            Plan([*regions, moved], plan.default_backend, "carried").validate(target)
        except CollageError:
            continue
        regions.append(moved)
    return Plan(regions, plan.default_backend, f"carried from {plan.source}")


class TunedBuckets:
    """The plans tuned for the shape buckets so far, each with its module's ``op_sequence``, read when it is
    added: a bucket's module is compiled afterwards, which erases the ops a ``Graph`` of it holds."""

    def __init__(self) -> None:
        self._tuned: list[tuple[OpSequence, Plan]] = []

    def add(self, graph: Graph, plan: Plan) -> None:
        self._tuned.append((op_sequence(graph), plan))

    def carried(self, target: Graph) -> list[Plan]:
        """The plans so far moved to ``target``: the distinct ones that keep a region (an empty plan is the
        default seed, which every tune has)."""
        moved = (transfer(plan, source, target) for source, plan in self._tuned)
        return list({p.key: p for p in moved if p.regions}.values())
