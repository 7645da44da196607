"""``stablehlo.while`` as an ONNX ``Loop`` whose body is the translated do-region (a subgraph; its trip
count from the loop's counter, ``loop_form``), or as one ``LSTM``/``GRU`` where the loop is such a layer
(``recurrent``)."""

from __future__ import annotations

import numpy as np

from .builder import _block_results, _Builder
from .loop_form import LoopForm, loop_form
from .recurrent import _recurrent, recurrent_form
from .registry import register, static_known_types
from .values import DTYPES, _constant_of, _dtype, _shape


@register("stablehlo.while", when=(static_known_types,), nested=True)
def _while(b: _Builder, op, ins):
    """An ONNX ``Loop`` whose body is the translated do-region: its loop-carried values are those the body
    changes, the others are read from outside by name (no copy a step), as values the body captures are.
    The trip count ``M`` comes from a counter (``loop_form``); else ``cond`` is the condition. A loop that
    is an LSTM or GRU layer becomes one ONNX ``LSTM`` or ``GRU`` (``recurrent_form``)."""
    form = loop_form(op)
    cell = recurrent_form(op, form)
    if cell is not None and all(v in b.names for v in cell.reads):
        return _recurrent(b, op, ins, cell)
    cond, body = op.regions[0].blocks[0], op.regions[1].blocks[0]
    if not form.changed:  # nothing changes: the loop computes its inputs (or never ends)
        return list(ins)
    types = [(_dtype(v), _shape(v)) for v in op.operands]
    if form.counter is not None:
        trips, keep_going = _trip_count(b, op, form, ins), ""
    else:
        trips, keep_going = "", _block_results(b, cond, ins)[0]
    it, go = b.fresh("iteration"), b.fresh("cond")
    carried = {k: b.fresh("carried") for k in form.changed}

    def build():
        after = _block_results(b, body, [carried.get(k, x) for k, x in enumerate(ins)])
        after = [after[k] if k in carried else x for k, x in enumerate(ins)]
        again = go if form.counter is not None else _block_results(b, cond, after)[0]
        return [(again, "i1", [])] + [(after[k], *types[k]) for k in form.changed]

    graph = b.graph(b.fresh("loop_body"), [(it, "i64", []), (go, "i1", [])] +
                    [(carried[k], *types[k]) for k in form.changed], build)
    outs = b.multi_node("Loop", [trips, keep_going] + [ins[k] for k in form.changed], len(form.changed), body=graph)
    return [outs[form.changed.index(k)] if k in carried else x for k, x in enumerate(ins)]


def _trip_count(b: _Builder, op, form: LoopForm, ins: list[str]) -> str:
    """``max(limit - start, 0)`` as the rank-0 i64 ``M`` of the ``Loop`` (a constant when both are)."""
    start, limit = _constant_of(op.operands[form.counter]), _constant_of(form.limit)
    if start is not None and limit is not None:
        return b.const(np.int64(max(int(limit.reshape(-1)[0]) - int(start.reshape(-1)[0]), 0)), "trips")
    i64 = DTYPES["i64"][1]
    hi = b.const(limit.reshape(()).astype(np.int64), "limit") if limit is not None else \
        b.node("Cast", [b.names[form.limit]], to=i64)
    lo = b.node("Cast", [ins[form.counter]], to=i64)
    return b.node("Max", [b.node("Sub", [hi, lo]), b.const(np.int64(0), "zero")])
