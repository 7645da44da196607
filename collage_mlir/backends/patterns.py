"""Op patterns as data: an anchor op with constraints, then optional fused followers (epilogue).

``conv2d`` + ``bias`` + ``relu`` reads: a convolution meeting the anchor constraints, optionally
followed by its only user being a bias add, optionally followed by a relu. Every prefix of the chain
is a candidate region. Producers a follower needs (a bias's ``broadcast_in_dim``) join the region
when they have no other user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..dialects.collage import op_id
from ..graph import Graph, producer
from ..ir import ir

#: A constraint on one op, returning None when satisfied, else a short reason.
Constraint = Callable[[ir.Operation], "str | None"]
#: A constraint on a follower: (follower op, the chain value it consumes) -> reason or None.
FollowerConstraint = Callable[[ir.Operation, ir.Value], "str | None"]


def static_f32(op: ir.Operation) -> str | None:
    """static-shaped f32 tensors"""
    from ..dialects.stablehlo import tensor_type

    for v in list(op.operands) + list(op.results):
        tt = tensor_type(v)
        if tt is None or tt[1] != "f32":
            return "needs static-shaped f32 tensors"
    return None


def describe_constraint(check: Callable) -> str:
    """A constraint's one-line description: the first line of its docstring, else its name."""
    doc = (check.__doc__ or "").strip().splitlines()
    return doc[0].rstrip(".") if doc else check.__name__.strip("_").replace("_", " ")


@dataclass(frozen=True)
class Taken:
    """What a follower absorbed: its ops, the value the chain continues from, and its parameters."""

    ops: list[ir.Operation]
    out: ir.Value
    params: dict


@dataclass(frozen=True)
class Follower:
    """An optional op fused after the chain: ``op``, the only user of the chain's value, meeting ``when``.
    ``absorb`` names producer ops of its other operands that join the region when used only by it."""

    name: str
    op: str
    when: FollowerConstraint
    absorb: tuple[str, ...] = ()

    def take(self, value: ir.Value) -> Taken | None:
        user = _single_user(value)
        if user is None or user.name != self.op or self.when(user, value):
            return None
        extra = []
        for operand in user.operands:
            p = producer(operand)
            if p is not None and p.name in self.absorb and _single_user(p.results[0]) is not None:
                extra.append(p)
        return Taken(extra + [user], user.results[0], {})


@dataclass(frozen=True)
class ActivationFollower(Follower):
    """The elementwise subgraph after the chain when it computes an activation the library has
    (recognised by evaluation, see ``epilogue.activation_after``)."""

    op: str = "elementwise subgraph"
    when: FollowerConstraint = lambda user, value: None
    allowed: tuple[str, ...] = ()

    def take(self, value: ir.Value) -> Taken | None:
        from .epilogue import activation_after

        found = activation_after(value)
        if found is None or found.activation.name not in self.allowed:
            return None
        act = found.activation
        return Taken(found.ops, found.out, {"act": act.name, "scalars": list(act.scalars),
                                             "algorithm": act.algorithm})


@dataclass(frozen=True)
class OpPattern:
    name: str
    anchor: str | None  # op name, or None for "any op"
    when: tuple[Constraint, ...] = ()
    followers: tuple[Follower, ...] = ()

    def describe(self) -> str:
        """``anchor (constraints) → [follower] → ...`` for the backends table."""
        anchor = self.anchor or "*"
        if self.when:
            anchor += " (" + "; ".join(describe_constraint(c) for c in self.when) + ")"
        return " → ".join([anchor] + [f"[{f.name}]" for f in self.followers])

    def rejects(self, op: ir.Operation) -> str | None:
        """None when ``op`` can anchor this pattern, else why not."""
        if self.anchor is not None and op.name != self.anchor:
            return f"not {self.anchor}"
        for check in self.when:
            why = check(op)
            if why:
                return why
        return None


def _single_user(value: ir.Value) -> ir.Operation | None:
    users = {id(u.owner.operation): u.owner.operation for u in value.uses}
    return next(iter(users.values())) if len(users) == 1 and len(list(value.uses)) == 1 else None


def follow(pattern: OpPattern, anchor: ir.Operation) -> list[tuple[Follower, Taken]]:
    """The followers of ``pattern`` that match after ``anchor``, in order (the longest chain)."""
    chain: list[tuple[Follower, Taken]] = []
    if len(anchor.results) != 1:
        return chain
    value = anchor.results[0]
    for follower in pattern.followers:
        taken = follower.take(value)
        if taken is not None:
            chain.append((follower, taken))
            value = taken.out
    return chain


def match(pattern: OpPattern, graph: Graph, anchor: int) -> list[frozenset[int]]:
    """All chain prefixes of ``pattern`` anchored at op ``anchor`` (empty when the anchor fails)."""
    node = graph.nodes[anchor]
    if pattern.rejects(node.op):
        return []
    ids = {anchor}
    found = [frozenset(ids)]
    for _, taken in follow(pattern, node.op):
        new = [op_id(op) for op in taken.ops]
        if any(i is None or i not in graph.nodes for i in new):
            break
        ids |= set(new)
        found.append(frozenset(ids))
    return [f for f in found if graph.is_convex(f)]


def supported_by(patterns: tuple[OpPattern, ...], op: ir.Operation) -> str | None:
    """None when some single-op pattern in ``patterns`` takes ``op``, else the closest reason."""
    reasons = []
    for p in patterns:
        why = p.rejects(op)
        if why is None:
            return None
        if p.anchor in (None, op.name):
            reasons.append(f"{p.name}: {why}")
    return "; ".join(reasons) or f"{op.name} is not among its ops"


def grow_regions(graph: Graph, ok: set[int], max_ops: int) -> list[frozenset[int]]:
    """Convex, connected regions of ops in ``ok``: each op alone, then grown one user at a time
    (the first user in topological order that keeps the region convex) up to ``max_ops`` ops."""
    order = {oid: k for k, oid in enumerate(graph.topological_order())}
    found: dict[frozenset[int], None] = {}
    for anchor in graph.topological_order():
        if anchor not in ok:
            continue
        region = {anchor}
        found[frozenset(region)] = None
        while len(region) < max_ops:
            frontier = sorted({u for i in region for u in graph.users(i) if u in ok} - region, key=order.get)
            nxt = next((u for u in frontier if graph.is_convex(region | {u})), None)
            if nxt is None:
                break
            region.add(nxt)
            found[frozenset(region)] = None
    return list(found)
