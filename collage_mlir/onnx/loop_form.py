"""How a ``stablehlo.while`` loops (``LoopForm``): which carried values its body changes, and the counter
that gives its trip count; read by the ``Loop`` translation (``loops``) and the LSTM/GRU recogniser
(``recurrent``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..dialects import stablehlo as sh
from ..graph import nested_ops
from ..ir import ir
from .values import _constant_of, _dtype


@dataclass(frozen=True)
class LoopForm:
    """A ``stablehlo.while`` as an ONNX ``Loop``: which carried values the body changes (ONNX loop-carried
    values; the others, JAX's weights, are read from outside the body) and, when the loop counts, its
    counter: a carried integer the body adds 1 to while ``cond`` is ``counter < limit`` (JAX's ``scan`` and
    ``fori_loop``), which gives the trip count. Without one, the cond region is translated as the
    ``Loop``'s condition (once before the loop, once at the end of the body)."""

    changed: tuple[int, ...]
    counter: int | None
    limit: ir.Value | None


def loop_form(op: ir.Operation) -> LoopForm:
    cond, body = op.regions[0].blocks[0], op.regions[1].blocks[0]
    back = sh.returned(body)
    changed = tuple(k for k, v in enumerate(back) if sh.block_argument(v, body) != k)
    test = sh.returned(cond)[0].owner
    if isinstance(test, ir.Block) or test.operation.name != "stablehlo.compare":
        return LoopForm(changed, None, None)
    test = test.operation
    direction, kind = sh.comparison(test)
    lhs, rhs = test.operands
    if direction == "GT":
        lhs, rhs = rhs, lhs
    counter, bound = sh.block_argument(lhs, cond), sh.block_argument(rhs, cond)
    if direction not in ("LT", "GT") or kind not in ("SIGNED", "") or counter is None or \
            _dtype(lhs) not in ("i32", "i64") or not _adds_one(back[counter], body.arguments[counter]):
        return LoopForm(changed, None, None)
    if bound is not None:  # a carried value the body does not change (a fori_loop's bound from outside)
        return LoopForm(changed, counter, op.operands[bound]) if bound not in changed else LoopForm(changed, None, None)
    maker = rhs.owner
    if _constant_of(rhs) is None and not isinstance(maker, ir.Block) and \
            any(maker.operation == o for o in nested_ops(op)):
        return LoopForm(changed, None, None)  # computed in cond
    return LoopForm(changed, counter, rhs)


def _adds_one(value: ir.Value, arg: ir.Value) -> bool:
    """Whether ``value`` is ``arg + 1``."""
    add = value.owner
    if isinstance(add, ir.Block) or add.operation.name != "stablehlo.add":
        return False
    x, y = add.operation.operands
    other = y if x == arg else x if y == arg else None
    one = None if other is None else _constant_of(other)
    return one is not None and one.size == 1 and int(one.reshape(-1)[0]) == 1
