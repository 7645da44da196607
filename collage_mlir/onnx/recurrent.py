"""LSTM and GRU layers: a ``stablehlo.while`` that is ``lax.scan`` over a recurrent cell is recognised
(``recurrent_form``: the cell's gates read back to the ONNX op's weights) and becomes one ONNX ``LSTM`` or
``GRU`` (``_recurrent``) instead of a ``Loop``."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable

import numpy as np

from ..dialects import collage
from ..dialects import stablehlo as sh
from ..graph import producer
from ..ir import ir
from .builder import _Builder
from .loop_form import LoopForm, loop_form
from .values import DTYPES, _constant_of, _dtype, _int_attr, _shape


class Cell(Enum):
    """The recurrent cells ONNX has an op for (``RecurrentForm``)."""

    LSTM = "LSTM"
    GRU = "GRU"


@dataclass(frozen=True)
class RecurrentForm:
    """A ``stablehlo.while`` that is one LSTM or GRU layer over a whole sequence, as ``lax.scan`` over the
    cell writes it, ``h`` written to row ``t`` of the outputs:

    - LSTM: ``c = σ(f)·c + σ(i)·tanh(g)``, ``h = σ(o)·tanh(c)`` (the zoo's ``jax_lstm``, flax's
      ``OptimizedLSTMCell`` and ``LSTMCell``);
    - GRU: ``h = (1 - z)·n + z·h``, ``n = tanh(x[t] @ wn + bn + r·(h @ rn + rbn))`` (flax's ``GRUCell``; ONNX's
      ``linear_before_reset``);

    each gate's pre-activation a sum of linear terms: ``h @ r`` and ``x[t] @ w`` (or column blocks of one
    product, in any order), constant biases, or ``x[t]`` itself where the input projection ``x @ w + b`` of
    every step was computed before the loop. ``w``, ``r``, ``b``: the ONNX op's weights in its gate order
    (LSTM i, o, f, c; GRU z, r, h); ``x`` the sequence it reads: a carried operand of the loop (``seq``), else
    the projection's input outside it (``projection``: the ops the ONNX op computes then). ``c``: the cell
    state's carried position (None for a GRU)."""

    cell: Cell
    counter: int
    c: int | None
    h: int
    out: int
    steps: int
    w: np.ndarray
    r: np.ndarray
    b: np.ndarray
    seq: int
    x: ir.Value | None
    projection: tuple[ir.Operation, ...]

    @property
    def reads(self) -> tuple[ir.Value, ...]:
        """The values outside the loop the ONNX op reads besides the loop's own operands."""
        return () if self.x is None else (self.x,)


def _defined_by(v: ir.Value, *names: str) -> ir.Operation | None:
    """The op defining ``v`` where it is one of ``names``, else None (a block argument too)."""
    op = producer(v)
    return op if op is not None and op.name in names else None


def _is_splat(v: ir.Value, x: float) -> bool:
    c = _constant_of(v)
    return c is not None and c.size > 0 and bool(np.all(c == x))


def _sigmoid_of(v: ir.Value) -> ir.Value | None:
    """``x`` where ``v`` is ``logistic(x)`` or ``1 / (1 + exp(-x))`` (how ``jax.nn.sigmoid`` lowers), else None."""
    if (op := _defined_by(v, "stablehlo.logistic")) is not None:
        return op.operands[0]
    div = _defined_by(v, "stablehlo.divide")
    if div is None or not _is_splat(div.operands[0], 1.0) or (add := _defined_by(div.operands[1], "stablehlo.add")) is None:
        return None
    for one, e in (tuple(add.operands), tuple(add.operands)[::-1]):
        if _is_splat(one, 1.0) and (exp := _defined_by(e, "stablehlo.exponential")) is not None \
                and (neg := _defined_by(exp.operands[0], "stablehlo.negate")) is not None:
            return neg.operands[0]
    return None


def _tanh_of(v: ir.Value) -> ir.Value | None:
    op = _defined_by(v, "stablehlo.tanh")
    return None if op is None else op.operands[0]


def _factors(v: ir.Value) -> list[tuple[ir.Value, ir.Value]]:
    """(a, b) and (b, a) where ``v`` is ``a * b``, else []."""
    op = _defined_by(v, "stablehlo.multiply")
    return [] if op is None else [tuple(op.operands), tuple(op.operands)[::-1]]


def _gated(v: ir.Value, other: Callable[[ir.Value], bool]) -> ir.Value | None:
    """``x`` where ``v`` is ``σ(x) * y`` (either order) with ``other(y)``, else None."""
    return next((g for a, y in _factors(v) if (g := _sigmoid_of(a)) is not None and other(y)), None)


def _summands(v: ir.Value) -> list[ir.Value]:
    """The leaves of the tree of ``stablehlo.add``s ending at ``v``."""
    add = _defined_by(v, "stablehlo.add")
    return [v] if add is None else [t for x in add.operands for t in _summands(x)]


def _plain_dot(op: ir.Operation, rank: int) -> bool:
    """A dot_general of a rank-``rank`` lhs contracting its last dimension with a 2-D rhs's first, no batch."""
    d = sh.dot_info(op)
    return (not d.lhs_batch and not d.rhs_batch and d.lhs_contract == [rank - 1] and d.rhs_contract == [0]
            and len(_shape(op.operands[0])) == rank and len(_shape(op.operands[1])) == 2)


def recurrent_form(op: ir.Operation, form: LoopForm | None = None) -> RecurrentForm | None:
    """The loop ``op`` as an LSTM or GRU layer (``RecurrentForm``), else None (it stays a ``Loop``)."""
    form = form or loop_form(op)
    back = sh.returned(op.regions[1].blocks[0])
    if form.counter is None or len(form.changed) not in (3, 4) \
            or any(_dtype(v) != "f32" for k, v in enumerate(op.operands) if k != form.counter):
        return None
    start, limit = _constant_of(op.operands[form.counter]), _constant_of(form.limit)
    if start is None or limit is None or int(start.reshape(-1)[0]) != 0:
        return None
    steps = int(limit.reshape(-1)[0])
    rest = [k for k in form.changed if k != form.counter]
    out = next((k for k in rest if _defined_by(back[k], "stablehlo.dynamic_update_slice") is not None), None)
    if out is None:
        return None
    state = [k for k in rest if k != out]
    if len(state) == 1:
        return _gru_cell(op, form, state[0], out, steps)
    c, h = state
    return _lstm_cell(op, form, c, h, out, steps) or _lstm_cell(op, form, h, c, out, steps)


def _written(op: ir.Operation, form: LoopForm, h: int, out: int, steps: int) -> bool:
    """Whether the body writes its new ``h`` to row ``t`` of the carried outputs ``out`` (``steps`` rows)."""
    body = op.regions[1].blocks[0]
    args, back = list(body.arguments), sh.returned(body)
    upd = _defined_by(back[out], "stablehlo.dynamic_update_slice")
    written = _defined_by(upd.operands[1], "stablehlo.reshape", "stablehlo.broadcast_in_dim")
    return not (upd.operands[0] != args[out] or written is None or written.operands[0] != back[h]
                or upd.operands[2] != args[form.counter] or not all(_is_splat(v, 0) for v in upd.operands[3:])
                or _shape(op.operands[out])[0] != steps)


class _Terms:
    """Per gate, the sum of its pre-activation's linear terms: ``h @ r``, ``x[t] @ w``, a bias."""

    def __init__(self, op: ir.Operation, counter: ir.Value, h: ir.Value, steps: int):
        self.op, self.body, self.counter, self.h, self.steps = op, op.regions[1].blocks[0], counter, h, steps
        self.r: list[np.ndarray] = []
        self.w: list[np.ndarray] = []
        self.b: list[np.ndarray] = []
        self.sources: set = set()  # (kind, carried position) of the sequences read: one allowed
        #: A projection computed before the loop: its input and ops (the ``LSTM`` computes them).
        self.x: ir.Value | None = None
        self.projection: tuple = ()

    def gate(self, pre: ir.Value, hidden: int) -> bool:
        """Adds the gate whose pre-activation ``pre`` is ``h @ r + x[t] @ w (+ b)``; False where it is not."""
        got = self.linear(_summands(pre), hidden)
        if got is None or got[0] is None or got[1] is None:
            return False
        self.r.append(got[0])
        self.w.append(got[1])
        self.b.append(got[2])
        return True

    def linear(self, leaves: list[ir.Value], hidden: int):
        """(r, w, b): the sums of ``leaves``' recurrent, input and bias terms (None where a kind is absent; b
        zeros), else None where some leaf is none of them."""
        sums: dict[str, np.ndarray] = {}
        for leaf in leaves:
            cut = _defined_by(leaf, "stablehlo.slice")
            cols = self._block(cut, hidden) if cut is not None else slice(0, hidden)
            if cols is None:
                return None
            for term in (_summands(cut.operands[0]) if cut is not None else [leaf]):
                got = self._term(term, cols)
                if got is None:
                    return None
                for kind, m in got:
                    sums[kind] = m if kind not in sums else sums[kind] + m
        return sums.get("r"), sums.get("w"), sums.get("b", np.zeros(hidden, np.float32))

    @staticmethod
    def _block(cut: ir.Operation, hidden: int) -> slice | None:
        """The columns a slice takes: a block of ``hidden`` columns over every row, else None."""
        starts, limits = sh._array_attr(cut, "start_indices", []), sh._array_attr(cut, "limit_indices", [])
        strides = sh._array_attr(cut, "strides", [1] * len(starts))
        whole = _shape(cut.operands[0])
        if len(whole) != 2 or any(s != 1 for s in strides) or starts[0] != 0 or limits[0] != whole[0] \
                or limits[1] - starts[1] != hidden:
            return None
        return slice(starts[1], limits[1])

    def _term(self, v: ir.Value, cols: slice) -> list[tuple[str, np.ndarray]] | None:
        """[("r", r[:, cols])] for ``h @ r``; [("w", w[:, cols])] for ``x[t] @ w``; [("w", wi[:, cols]), ("b",
        b[cols])] for row ``t`` of a projection ``x @ wi + b`` computed before the loop; [("b", b[cols])] for a
        constant the same in every row; else None."""
        dot = _defined_by(v, "stablehlo.dot_general")
        if dot is not None and _plain_dot(dot, 2):
            m = self._static(dot.operands[1])
            if m is None:
                return None
            if dot.operands[0] == self.h:
                return [("r", m[:, cols])]
            seq = self._row(dot.operands[0])
            if seq is None:
                return None
            self.sources.add(("raw", seq))
            return [("w", m[:, cols])]
        seq = self._row(v)
        if seq is not None:
            projection = _projection(self.op.operands[seq])
            if projection is None:
                return None
            self.x, wi, bias, self.projection = projection
            self.sources.add(("projected", seq))
            return [("w", wi[:, cols]), ("b", bias[cols])]
        m = self._static(v)
        if m is None:
            return None
        m = np.asarray(m, np.float32)
        m = m.reshape(-1, m.shape[-1]) if m.ndim else m.reshape(1, 1)
        if not np.all(m == m[:1]):
            return None
        row = m[0]
        if row.size == 1:
            return [("b", np.full(cols.stop - cols.start, row[0], np.float32))]
        return [("b", row[cols])] if row.size >= cols.stop else None

    def form(self, cell: Cell, counter: int, c: int | None, h: int, out: int, w: np.ndarray, r: np.ndarray,
             bias: np.ndarray) -> RecurrentForm | None:
        """The layer with these weights ((features, G·H), (H, G·H), the ONNX op's bias: G gates in its order),
        where every gate read one sequence and the shapes hold, else None."""
        hidden = r.shape[0]
        gates = 4 if cell is Cell.LSTM else 3
        if len(self.sources) != 1 or r.shape != (hidden, gates * hidden) or w.shape[1] != gates * hidden:
            return None
        ((kind, seq),) = self.sources
        projected = kind == "projected"
        return RecurrentForm(cell, counter, c, h, out, self.steps, w.T[None].astype(np.float32),
                             r.T[None].astype(np.float32), bias[None].astype(np.float32), seq,
                             self.x if projected else None, self.projection if projected else ())

    def _row(self, v: ir.Value) -> int | None:
        """The carried position ``p`` where ``v`` is row ``t`` (the counter) of carried sequence ``p``, a value
        the body does not change with ``steps`` rows."""
        row = _defined_by(v, "stablehlo.reshape")
        cut = None if row is None else _defined_by(row.operands[0], "stablehlo.dynamic_slice")
        seq = None if cut is None else sh.block_argument(cut.operands[0], self.body)
        if seq is None or sh.returned(self.body)[seq] != cut.operands[0] or cut.operands[1] != self.counter \
                or not all(_is_splat(x, 0) for x in cut.operands[2:]) or _shape(self.op.operands[seq])[0] != self.steps:
            return None
        return seq

    def _static(self, v: ir.Value) -> np.ndarray | None:
        """The value of ``v`` known when the loop starts: a constant, a carried value the body does not change
        whose initial value is one, or a concatenation or reshape of such."""
        k = sh.block_argument(v, self.body)
        if k is not None:
            return None if sh.returned(self.body)[k] != v else _constant_of(self.op.operands[k])
        if (cat := _defined_by(v, "stablehlo.concatenate")) is not None:
            parts = [self._static(x) for x in cat.operands]
            return None if any(p is None for p in parts) else np.concatenate(parts, axis=_int_attr(cat, "dimension"))
        if (re := _defined_by(v, "stablehlo.reshape")) is not None:
            inner = self._static(re.operands[0])
            return None if inner is None else inner.reshape(_shape(v))
        if (bc := _defined_by(v, "stablehlo.broadcast_in_dim")) is not None:
            inner, out = self._static(bc.operands[0]), _shape(v)
            if inner is None:
                return None
            shape = [1] * len(out)
            for i, d in enumerate(sh.broadcast_dims(bc)):
                shape[d] = inner.shape[i]
            return np.broadcast_to(inner.reshape(shape), out)
        return _constant_of(v)


def _lstm_cell(op, form: LoopForm, c: int, h: int, out: int, steps: int) -> RecurrentForm | None:
    """``recurrent_form`` of an LSTM with ``c``, ``h`` and ``out`` the carried positions of the cell state, hidden state and
    outputs, else None."""
    body = op.regions[1].blocks[0]
    args, back = list(body.arguments), sh.returned(body)
    new_c = back[c]
    o_gate = _gated(back[h], lambda y: (t := _tanh_of(y)) is not None and t == new_c)
    add = _defined_by(new_c, "stablehlo.add")
    if o_gate is None or add is None:
        return None
    f_gate = i_gate = g_gate = None
    for keep, write in (tuple(add.operands), tuple(add.operands)[::-1]):
        f_gate = _gated(keep, lambda y: y == args[c])
        ig = [(g, t) for a, y in _factors(write) if (g := _sigmoid_of(a)) is not None and (t := _tanh_of(y)) is not None]
        if f_gate is not None and ig:
            i_gate, g_gate = ig[0]
            break
    if f_gate is None or i_gate is None:
        return None
    if not _written(op, form, h, out, steps):
        return None
    hidden = _shape(args[h])[-1]
    terms = _Terms(op, args[form.counter], args[h], steps)
    if not all(terms.gate(g, hidden) for g in (i_gate, o_gate, f_gate, g_gate)):
        return None
    return terms.form(Cell.LSTM, form.counter, c, h, out, np.concatenate(terms.w, axis=1),
                      np.concatenate(terms.r, axis=1), np.concatenate([*terms.b, np.zeros(4 * hidden)]))


def _gru_cell(op, form: LoopForm, h: int, out: int, steps: int) -> RecurrentForm | None:
    """``recurrent_form`` of a GRU: ``h = (1 - σ(z))·tanh(n) + σ(z)·h`` (either order), ``n``'s pre-activation
    ``x[t] @ wn + bn + σ(r)·(h @ rn + rbn)``, else None."""
    body = op.regions[1].blocks[0]
    args, back = list(body.arguments), sh.returned(body)
    add = _defined_by(back[h], "stablehlo.add")
    if add is None or not _written(op, form, h, out, steps):
        return None
    z_pre = n_pre = None
    for keep, write in (tuple(add.operands), tuple(add.operands)[::-1]):
        z_pre = _gated(keep, lambda y: y == args[h])
        for a, y in _factors(write):
            less = _defined_by(a, "stablehlo.subtract")
            if z_pre is not None and less is not None and _is_splat(less.operands[0], 1.0) \
                    and (s := _sigmoid_of(less.operands[1])) is not None and s == z_pre \
                    and (n_pre := _tanh_of(y)) is not None:
                break
        if n_pre is not None:
            break
    if z_pre is None or n_pre is None:
        return None
    reset = [(leaf, r_pre, inner) for leaf in _summands(n_pre) for a, inner in _factors(leaf)
             if (r_pre := _sigmoid_of(a)) is not None]
    if len(reset) != 1:
        return None
    leaf, r_pre, inner = reset[0]
    hidden = _shape(args[h])[-1]
    terms = _Terms(op, args[form.counter], args[h], steps)
    outer = terms.linear([v for v in _summands(n_pre) if v != leaf], hidden)
    within = terms.linear(_summands(inner), hidden)
    if not (terms.gate(z_pre, hidden) and terms.gate(r_pre, hidden)) or outer is None or within is None \
            or outer[0] is not None or outer[1] is None or within[0] is None or within[1] is not None:
        return None
    return terms.form(Cell.GRU, form.counter, None, h, out, np.concatenate([*terms.w, outer[1]], axis=1),  # z, r, h
                      np.concatenate([*terms.r, within[0]], axis=1),
                      np.concatenate([*terms.b, outer[2], np.zeros(2 * hidden), within[2]]))  # Wb z r h, Rb z r h


def _projection(v: ir.Value) -> tuple[ir.Value, np.ndarray, np.ndarray, tuple[ir.Operation, ...]] | None:
    """(x, wi, b, ops) where ``v`` is ``x @ wi (+ b)`` over a (steps, batch, features) ``x`` with constant
    ``wi`` and a constant bias the same for every step and batch row (``ops``: the dot and the add), else None."""
    bias = None
    add = _defined_by(v, "stablehlo.add")
    if add is not None:
        for d, c in (tuple(add.operands), tuple(add.operands)[::-1]):
            if _defined_by(d, "stablehlo.dot_general") is not None and (bias := _constant_of(c)) is not None:
                v = d
                break
        else:
            return None
    dot = _defined_by(v, "stablehlo.dot_general")
    if dot is None or not _plain_dot(dot, 3) or (wi := _constant_of(dot.operands[1])) is None:
        return None
    width = wi.shape[1]
    if bias is None:
        bias = np.zeros(width, np.float32)
    else:
        bias = np.broadcast_to(bias, _shape(v))
        if not np.all(bias == bias[:1, :1, :]):
            return None
        bias = bias[0, 0]
    return dot.operands[0], wi, np.asarray(bias, np.float32), (dot,) if add is None else (dot, add)


def _recurrent(b: _Builder, op, ins, cell: RecurrentForm):
    """One ONNX ``LSTM`` or ``GRU`` for the loop ``op`` (``RecurrentForm``), the initial state the loop's; its
    results in the loop's carried positions."""
    hidden = cell.r.shape[-1]
    batch = _shape(op.operands[cell.h])[0]
    w, r, bias = (b.const(m, f"{cell.cell.value.lower()}_{k}") for m, k in ((cell.w, "w"), (cell.r, "r"), (cell.b, "b")))
    state = [b.reshape(ins[k], [1, batch, hidden]) for k in (cell.h, cell.c) if k is not None]
    x = ins[cell.seq] if cell.x is None else b.names[cell.x]
    computes = tuple(i for o in cell.projection if (i := collage.op_id(o)) is not None)
    attrs = {"linear_before_reset": 1} if cell.cell is Cell.GRU else {}
    outs = b.multi_node(cell.cell.value, [x, w, r, bias, "", *state], 1 + len(state), also=computes,
                        hidden_size=hidden, **attrs)
    results = list(ins)
    results[cell.counter] = b.const(np.asarray(cell.steps, DTYPES[_dtype(op.operands[cell.counter])][0]), "steps")
    results[cell.out] = b.reshape(outs[0], [cell.steps, batch, hidden])
    results[cell.h] = b.reshape(outs[1], [batch, hidden])
    if cell.c is not None:
        results[cell.c] = b.reshape(outs[2], [batch, hidden])
    return results
