"""Placement search: candidates and their index by op, the cost seam, the operator-level DP, the
graph-level evolutionary search, `tune`, and the plans that need no measurement (random, preference)."""

from __future__ import annotations

from ..backends import get_backend, registry
from ..errors import CollageError
from ..graph import Graph
from ..plan import Plan
from .simple_plans import preferred_plan, random_plan, whole_plan


def available_backends() -> list:
    """Every registered backend that is usable here, in name order."""
    return [i.backend for i in registry().values() if i.backend is not None and not i.problem]


def resolve_plan(spec: "str | Plan", graph: Graph) -> Plan:
    """A plan from ``default``, ``random:SEED``, ``prefer:B1,B2``, ``whole:B`` (B alone, taking all it
    can: a tune's seed plan) or a plan JSON file path."""
    if isinstance(spec, Plan):
        return spec
    if spec == "default":
        return Plan(source="default")
    kind, _, arg = spec.partition(":")
    if kind == "random" and arg:
        try:
            seed = int(arg)
        except ValueError:
            raise CollageError(f"random plan seed must be an integer, got '{arg}'", where="--plan") from None
        return random_plan(graph, available_backends(), seed)
    if kind == "prefer" and arg:
        return preferred_plan(graph, [get_backend(n.strip(), where="--plan") for n in arg.split(",")])
    if kind == "whole" and arg:
        return whole_plan(graph, get_backend(arg.strip(), where="--plan"))
    return Plan.load(spec)
