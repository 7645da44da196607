"""The op table: each translatable op's rule and the constraints the op must meet (``OPS``), filled by the
rule modules through ``register``, one rule per op (as JAX's ``mlir.register_lowering``); and the
constraints many rules share. A rule is ``(builder, op, operand names) -> result names``. The backends use
the table as their single-op patterns (``backends.onnx_engine.engine_patterns``), so an op that cannot be
translated is simply not proposed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..dialects import stablehlo as sh
from ..ir import ir
from .values import DTYPES, FLOATS, MOVED_DTYPES


@dataclass(frozen=True)
class OnnxOp:
    """One row of the table: how to translate an op and what it must satisfy. ``nested``: the op's
    regions are translated as graphs (a loop body), so their ops must meet the engine's constraints too."""

    translate: Callable
    when: tuple = ()
    nested: bool = False
    #: The rule also takes values with dynamic dims (a model's dynamic translation: ``translate(dynamic=
    #: True)``), where ``known_types`` stands in for ``static_known_types`` and ``static_moved_types``.
    dynamic: bool = False
    #: The rule takes a dynamic translation's unexpanded broadcasts (``_Builder.lazy``): its ONNX node
    #: broadcasts its inputs (numpy rules), so computes the same unexpanded (a broadcast of one is a
    #: broadcast itself).
    broadcasts: bool = False


#: The op table, by op name, in the order the rules registered (the package imports its rule modules in
#: a fixed order: what `collage backends` lists).
OPS: dict[str, OnnxOp] = {}


def register(*names: str, when: tuple = (), nested: bool = False, dynamic: bool = False, broadcasts: bool = False
             ) -> Callable[[Callable], Callable]:
    """Registers the decorated rule as the translation of the ops ``names``, each meeting the constraints
    ``when`` (``nested``, ``dynamic``, ``broadcasts``: see ``OnnxOp``). An op has one rule: a second
    registration is an error."""

    def add(rule: Callable) -> Callable:
        for name in names:
            if name in OPS:
                raise ValueError(f"{name} already has an ONNX rule ({OPS[name].translate.__qualname__})")
            OPS[name] = OnnxOp(rule, tuple(when), nested, dynamic, broadcasts)
        return rule

    return add


# --------------------------------------------------------------------------------------------------
# Constraints: each returns None when satisfied, else a short reason. The first docstring line is
# what `collage backends` shows.


def _types(op: ir.Operation) -> list[tuple[tuple[int, ...], str] | None]:
    return [sh.tensor_type(v) for v in list(op.operands) + list(op.results)]


def _static_of(op: ir.Operation, table: dict) -> str | None:
    for tt in _types(op):
        if tt is None:
            return "needs static-shaped tensors"
        if tt[1] not in table:
            return f"element type {tt[1]} has no ONNX mapping here"
    return None


def static_known_types(op: ir.Operation) -> str | None:
    """static shapes of f32, f64, bf16, i32, i64 or i1"""
    return _static_of(op, DTYPES)


def static_moved_types(op: ir.Operation) -> str | None:
    """static shapes of f32, f64, bf16, i32, i64, i1, or 8-, 16- and unsigned integers (data movement)"""
    return _static_of(op, MOVED_DTYPES)


def known_types(op: ir.Operation) -> str | None:
    """ranked tensors (dynamic dims too) of f32, f64, bf16, i32, i64 or i1"""
    for v in list(op.operands) + list(op.results):
        tt = sh.ranked_type(v)
        if tt is None:
            return "needs ranked tensors"
        if tt[1] not in DTYPES:
            return f"element type {tt[1]} has no ONNX mapping here"
    return None


def dynamic(op: ir.Operation) -> bool:
    """Whether a value of ``op`` has a dynamic dim."""
    return any((tt := sh.ranked_type(v)) is not None and None in tt[0] for v in (*op.operands, *op.results))


def float_operands(op: ir.Operation) -> str | None:
    """floating-point operands"""
    return None if all(sh.ranked_type(v)[1] in FLOATS for v in op.operands) else "needs float operands"


def numeric_operands(op: ir.Operation) -> str | None:
    """numeric (not i1) operands"""
    return "i1 operands are not arithmetic" if any(sh.ranked_type(v)[1] == "i1" for v in op.operands) else None


def bool_operands(op: ir.Operation) -> str | None:
    """i1 operands"""
    return None if all(sh.ranked_type(v)[1] == "i1" for v in op.operands) else "logical ops on i1 only"


def static_result(op: ir.Operation) -> str | None:
    """static result shape (its shape operand is then a known constant)"""
    return None if sh.tensor_type(op.results[0]) is not None else "needs a static result shape"


@dataclass(frozen=True)
class NestedOps:
    """every op of a loop's cond and body (a case's branches) translatable, meeting the engine's constraints"""

    engine: tuple = ()

    def __call__(self, op: ir.Operation) -> str | None:
        holder = "loop" if op.name == "stablehlo.while" else "case"
        for region in op.regions:
            for inner in sh.block_ops(region.blocks[0]):
                spec = OPS.get(inner.name)
                if spec is None:
                    return f"the {holder} holds {inner.name}, which has no ONNX translation"
                checks = spec.when + self.engine + ((self,) if spec.nested else ())
                why = next((r for r in (c(inner) for c in checks) if r), None)
                if why:
                    return f"the {holder}'s {inner.name}: {why}"
        return None
