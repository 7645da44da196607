"""``stablehlo.dot_general`` as one ``MatMul``: batch dims leading, then the free and the contracted dims
of each operand merged (transposes and reshapes the simplification folds away where they do nothing)."""

from __future__ import annotations

import numpy as np

from ..dialects import stablehlo as sh
from .builder import _Builder
from .registry import float_operands, register, static_known_types
from ..errors import CollageError
from .values import _dims, _shape


def matmul_form(op) -> str | None:
    """with dynamic dims: one contracted dim, one free dim of the right operand, and more than one free
    dim of the left only without batch dims (ONNX ``MatMul`` broadcasts leading dims right-aligned)"""
    d = sh.dot_info(op)
    ls, rs = _dims(op.operands[0]), _dims(op.operands[1])
    lfree = [i for i in range(len(ls)) if i not in d.lhs_batch + d.lhs_contract]
    rfree = [i for i in range(len(rs)) if i not in d.rhs_batch + d.rhs_contract]
    if len(d.lhs_contract) != 1 or len(rfree) != 1 or not lfree or (d.lhs_batch and len(lfree) != 1):
        return "with dynamic dims: one contracted and one right free dim, one left free dim beside batch dims"
    return None


@register("stablehlo.dot_general", when=(static_known_types, float_operands), dynamic=True)
def _dot_general(b: _Builder, op, ins):
    d = sh.dot_info(op)
    if b.dynamic and None in _dims(op.operands[0]) + _dims(op.operands[1]):
        why = matmul_form(op)
        if why:
            raise CollageError(f"{op.location}: cannot export to ONNX: {why}")
        # [batch, free..., k] @ [batch, k, n]: MatMul as it is, no reshape (the dims it would merge are unknown)
        lfree = [i for i in range(len(_dims(op.operands[0]))) if i not in d.lhs_batch + d.lhs_contract]
        rfree = [i for i in range(len(_dims(op.operands[1]))) if i not in d.rhs_batch + d.rhs_contract]
        a = b.transpose(ins[0], d.lhs_batch + lfree + d.lhs_contract)
        c = b.transpose(ins[1], d.rhs_batch + d.rhs_contract + rfree)
        return [b.node("MatMul", [a, c])]
    ls, rs = _shape(op.operands[0]), _shape(op.operands[1])
    lfree = [i for i in range(len(ls)) if i not in d.lhs_batch + d.lhs_contract]
    rfree = [i for i in range(len(rs)) if i not in d.rhs_batch + d.rhs_contract]
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
