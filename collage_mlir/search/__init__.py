"""Placement search: candidates and their index by op, the cost seam, the operator-level DP, the
graph-level evolutionary search, `tune`, and the plans that need no measurement (random, preference)."""

from __future__ import annotations

from collage_runtime.types import NumberFormat

from ..backends import PLATFORM_DEFAULTS, Platform, get_backend, registry
from ..dialects import stablehlo as sh
from ..errors import CollageError
from ..graph import Graph
from ..plan import Plan
from .simple_plans import preferred_plan, random_plan, whole_plan


def available_backends(platform: Platform = Platform.CPU) -> list:
    """Every registered backend that is usable here and can run regions in a ``platform`` program, in name
    order; opt-in backends (lower precision: ``triton-tf32``; variants: ``triton@128x64w4s3``) only when named
    (``--backends triton-tf32,triton@*``)."""
    return [i.backend for i in registry().values()
            if i.backend is not None and not i.problem and platform in i.backend.platforms and not i.backend.opt_in]


def reduced_precision_backends(number_format: NumberFormat, platform: Platform = Platform.CPU) -> list:
    """Every registered backend that computes f32 math in ``number_format`` (its ``computes_in``) and is
    usable here in a ``platform`` program, in name order; one CollageError naming why each is not where none
    is (``collage tune --precision bf16``)."""
    found = [i for i in registry().values() if i.backend is not None and i.backend.computes_in is number_format]
    usable = [i.backend for i in found if not i.problem and platform in i.backend.platforms]
    if not usable:
        why = "; ".join(f"{i.backend.name}: {i.problem or f'runs no {platform.value} regions'}" for i in found)
        raise CollageError(f"no backend computes in {number_format.value} here ({why or 'none is registered'})",
                           where="--precision", exit_code=2)
    return usable


def tune_backends(module, chosen: list, precision: NumberFormat | None, platform: Platform = Platform.CPU) -> list:
    """The backends a tune of ``module`` measures: ``chosen``, and those computing in ``precision`` where it is
    lower than f32 (``reduced_precision_backends``: one CollageError where none is usable). ``precision`` None
    is the model's own (``stablehlo.stated_format``): a bf16 model gets the usable bf16 backends, as its own
    products are bf16 (none where none is usable)."""
    if precision is None:
        if sh.stated_format(module) is NumberFormat.F32:
            return chosen
        try:
            lower = reduced_precision_backends(NumberFormat.BF16, platform)
        except CollageError:
            return chosen
    elif precision is NumberFormat.F32:
        return chosen
    else:
        lower = reduced_precision_backends(precision, platform)
    return chosen + [b for b in lower if b not in chosen]


def resolve_plan(spec: "str | Plan", graph: Graph, platform: Platform | None = None) -> Plan:
    """A plan from ``default``, ``random:SEED``, ``prefer:B1,B2``, ``whole:B`` (B alone, taking all it
    can: a tune's seed plan) or a plan JSON file path, for a program on ``platform`` (None: a plan given as
    a value or file keeps its own, a plan string is for the CPU)."""
    if isinstance(spec, Plan):
        return _on(spec, platform)
    target = platform or Platform.CPU
    if spec == "default":
        return Plan([], PLATFORM_DEFAULTS[target], "default")
    kind, _, arg = spec.partition(":")
    if kind == "random" and arg:
        try:
            seed = int(arg)
        except ValueError:
            raise CollageError(f"random plan seed must be an integer, got '{arg}'", where="--plan") from None
        return random_plan(graph, available_backends(), seed, target)
    if kind == "prefer" and arg:
        return preferred_plan(graph, [get_backend(n.strip(), where="--plan") for n in arg.split(",")],
                              platform=target)
    if kind == "whole" and arg:
        return whole_plan(graph, get_backend(arg.strip(), where="--plan"), platform=target)
    return _on(Plan.load(spec), platform)


def _on(plan: Plan, platform: Platform | None) -> Plan:
    """``plan`` when it is for ``platform`` (or no platform is asked for), else a CollageError."""
    if platform is None or plan.default_backend == PLATFORM_DEFAULTS[platform]:
        return plan
    raise CollageError(f"the plan's default backend is {plan.default_backend}, not {PLATFORM_DEFAULTS[platform]}: "
                       f"it is not a plan for a {platform.value} program", where=plan.source)
