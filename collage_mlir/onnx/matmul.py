"""``stablehlo.dot_general`` as one ``MatMul``: batch dims leading, then the free and the contracted dims
of each operand merged (transposes and reshapes the simplification folds away where they do nothing)."""

from __future__ import annotations

import numpy as np

from ..dialects import stablehlo as sh
from .builder import _Builder
from .registry import float_operands, register, static_known_types
from ..errors import CollageError
from .values import _dims, _shape


def _free(op) -> tuple[list[int], list[int]]:
    """The free dims of each operand of a dot_general, in order."""
    d = sh.dot_info(op)
    return ([i for i in range(len(_dims(op.operands[0]))) if i not in d.lhs_batch + d.lhs_contract],
            [i for i in range(len(_dims(op.operands[1]))) if i not in d.rhs_batch + d.rhs_contract])


def _row(dims: list[int | None], free: list[int]) -> int:
    """The free dim ``MatMul`` takes as its rows (columns): a dynamic one, else the largest; the operand's
    other free dims go beside the batch dims, broadcast against size-1 dims of the other operand."""
    return max(free, key=lambda i: (dims[i] is None, dims[i] or 0))


def matmul_form(op) -> str | None:
    """with dynamic dims: one contracted dim and a free dim on each side (ONNX ``MatMul`` takes the other
    free dims as batch dims it broadcasts)"""
    lfree, rfree = _free(op)
    if len(sh.dot_info(op).lhs_contract) != 1 or not lfree or not rfree:
        return "with dynamic dims: one contracted dim and a free dim on each side"
    return None


@register("stablehlo.dot_general", when=(static_known_types, float_operands), dynamic=True)
def _dot_general(b: _Builder, op, ins):
    d = sh.dot_info(op)
    ld, rd = _dims(op.operands[0]), _dims(op.operands[1])
    if b.dynamic and None in ld + rd:
        why = matmul_form(op)
        if why:
            raise CollageError(f"{op.location}: cannot export to ONNX: {why}")
        # No reshape (the dims it would merge are unknown): [batch, lhs extra, 1.., m, k] @ [batch, 1.., rhs extra,
        # k, n], each operand's free dims but one broadcast against size-1 dims of the other, then the result
        # transposed to dot_general's order [batch, lhs free, rhs free].
        lfree, rfree = _free(op)
        m, n = _row(ld, lfree), _row(rd, rfree)
        lx, rx = [i for i in lfree if i != m], [i for i in rfree if i != n]
        nb = len(d.lhs_batch)
        a = b.transpose(ins[0], d.lhs_batch + lx + [m] + d.lhs_contract)
        c = b.transpose(ins[1], d.rhs_batch + rx + d.rhs_contract + [n])
        if rx:
            a = b.node("Unsqueeze", [a, b.ints(range(nb + len(lx), nb + len(lx) + len(rx)))])
        if lx and nb:  # with no batch dims MatMul broadcasts c's missing leading dims itself: a weight stays
            # 2-D, as ONNX Runtime's int8 MatMul takes a per-channel weight only
            c = b.node("Unsqueeze", [c, b.ints(range(nb, nb + len(lx)))])
        y = b.node("MatMul", [a, c])
        # y: [batch, lx, rx, m, n]; dot_general's: [batch, lfree, rfree]
        at = {("l", i): nb + k for k, i in enumerate(lx)} | {("r", i): nb + len(lx) + k for k, i in enumerate(rx)}
        at |= {("l", m): nb + len(lx) + len(rx), ("r", n): nb + len(lx) + len(rx) + 1}
        return [b.transpose(y, list(range(nb)) + [at["l", i] for i in lfree] + [at["r", i] for i in rfree])]
    ls, rs = _shape(op.operands[0]), _shape(op.operands[1])
    lfree, rfree = _free(op)
    batch = [ls[i] for i in d.lhs_batch]
    m = int(np.prod([ls[i] for i in lfree], dtype=np.int64))
    k = int(np.prod([ls[i] for i in d.lhs_contract], dtype=np.int64))
    n = int(np.prod([rs[i] for i in rfree], dtype=np.int64))
    lperm = d.lhs_batch + lfree + d.lhs_contract
    rperm = d.rhs_batch + d.rhs_contract + rfree
    a = b.transpose(ins[0], lperm)
    a = b.reshape(a, batch + [m, k], [ls[i] for i in lperm])
    c = b.transpose(ins[1], rperm)
    c = b.reshape(c, batch + [k, n], [rs[i] for i in rperm])
    y = b.node("MatMul", [a, c])
    return [b.reshape(y, _shape(op.results[0]), batch + [m, n])]
