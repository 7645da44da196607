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


def _signature(graph: Graph, oid: int) -> tuple:
    op = graph.nodes[oid].op
    results = tuple((str(t.element_type), t.rank) if isinstance(t, ir.RankedTensorType) else (str(t), -1)
                    for t in (r.type for r in op.results))
    return op.name, len(op.operands), results


def match_ops(source: Graph, target: Graph) -> dict[int, int]:
    """Source op id → target op id, for the ops the two modules' aligned op sequences share."""
    a, b = sorted(source.nodes), sorted(target.nodes)
    matcher = difflib.SequenceMatcher(None, [_signature(source, i) for i in a], [_signature(target, i) for i in b],
                                      autojunk=False)
    return {a[blk.a + k]: b[blk.b + k] for blk in matcher.get_matching_blocks() for k in range(blk.size)}


def transfer(plan: Plan, source: Graph, target: Graph) -> Plan:
    """``plan`` of ``source``'s module as a plan of ``target``'s (see the module docstring)."""
    ids = match_ops(source, target)
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
