"""Translate a region function of StableHLO into a step program (``collage_runtime.steps.StepProgram``,
written as JSON) that a runtime executor runs with a tensor library (torch here). Where a backend
pattern matches (replayed on the region function, the same followers that chose the region), the
anchor and its epilogue become one fused step: a convolution with bias, residual add and activation as
oneDNN post-ops, a GEMM with bias and activation. Every other op is one step. The program's schema is
its type (see ``collage_runtime.steps``).
"""

from __future__ import annotations

from dataclasses import replace

from collage_runtime.steps import (Broadcast, Const, Conv2d, Convert, Matmul, PostOps, Reshape, Step, StepOp,
                                   StepProgram, Transpose)
from collage_runtime.types import TensorSpec

from ..dialects import stablehlo as sh
from ..errors import CollageError
from ..ir import ir
from .patterns import OpPattern, follow

ELEMENTWISE = {
    "stablehlo.add": StepOp.ADD,
    "stablehlo.subtract": StepOp.SUB,
    "stablehlo.multiply": StepOp.MUL,
    "stablehlo.divide": StepOp.DIV,
    "stablehlo.maximum": StepOp.MAX,
    "stablehlo.minimum": StepOp.MIN,
}


def _spec(value: ir.Value) -> TensorSpec:
    shape, dtype = sh.tensor_type(value)
    return TensorSpec(tuple(shape), dtype)


def _translate_op(op: ir.Operation, ins: list[int], out: int) -> Step:
    name = op.name
    args = tuple(ins)
    if name in ELEMENTWISE:
        return Step(ELEMENTWISE[name], args, out)
    if name == "stablehlo.convolution":
        info = sh.conv_info(op)
        conv = Conv2d(tuple(info.strides), tuple(lo for lo, _ in info.padding), tuple(info.rhs_dilation),
                      info.feature_groups, (info.lhs_layout, info.rhs_layout, info.out_layout))
        return Step(StepOp.CONV2D, args, out, conv, PostOps())
    if name == "stablehlo.dot_general":
        d = sh.dot_info(op)
        nb = len(d.lhs_batch)
        return Step(StepOp.MATMUL, args, out, Matmul(d.rhs_contract == [nb + 1]), PostOps())
    if name == "stablehlo.broadcast_in_dim":
        return Step(StepOp.BROADCAST, args, out, Broadcast(tuple(sh.broadcast_dims(op)), _spec(op.results[0]).shape))
    if name == "stablehlo.convert":
        return Step(StepOp.CONVERT, args, out, Convert(_spec(op.results[0]).element))
    if name == "stablehlo.reshape":
        return Step(StepOp.RESHAPE, args, out, Reshape(_spec(op.results[0]).shape))
    if name == "stablehlo.transpose":
        return Step(StepOp.TRANSPOSE, args, out, Transpose(tuple(sh.permutation(op))))
    if name in ("stablehlo.constant", "arith.constant"):
        value = sh.constant_value(op)
        if value is None:
            raise CollageError(f"{op.location}: constant without dense value cannot be embedded")
        spec = _spec(op.results[0])
        return Step(StepOp.CONST, args, out, Const(value.tolist(), spec.shape, spec.element))
    raise CollageError(f"{op.location}: {name} has no step translation")


def _fused_step(anchor: ir.Operation, pattern: OpPattern, vid, consumed: set) -> tuple[Step, ir.Value] | None:
    """The fused step for ``anchor`` and the followers of ``pattern`` after it, with the value it defines."""
    step = _translate_op(anchor, [vid(v) for v in anchor.operands], -1)
    if step.op not in (StepOp.CONV2D, StepOp.MATMUL):
        return None
    out_shape = sh.tensor_type(anchor.results[0])[0]
    channel = step.attrs.layouts[2].index("f") if isinstance(step.attrs, Conv2d) else len(out_shape) - 1
    ins, post = list(step.ins), PostOps()
    value = anchor.results[0]
    for follower, taken in follow(pattern, anchor):
        if follower.name == "scale" and post.act == "none" and not post.bias:
            pass  # multiply by ones
        elif follower.name == "bias" and post.act == "none" and post.binary is None:
            bcast = taken.ops[0]
            kept = [d for d, n in zip(sh.broadcast_dims(bcast), sh.tensor_type(bcast.operands[0])[0]) if n != 1]
            if kept not in ([channel], []):
                break
            ins.append(vid(bcast.operands[0]))
            post = replace(post, bias=True, bias_size=out_shape[channel])
        elif follower.name == "residual" and post.act == "none":
            user = taken.ops[-1]
            other = [v for v in user.operands if v != value]
            ins.append(vid(other[0]))
            post = replace(post, binary="add")
        elif follower.name == "activation":
            params = taken.params
            post = replace(post, act=params["act"], scalars=tuple(params["scalars"]), algorithm=params["algorithm"])
        else:
            break
        consumed.update(taken.ops)
        value = taken.out
    return replace(step, ins=tuple(ins), post=post), value


def translate_region(func: ir.Operation, patterns: tuple[OpPattern, ...] = ()) -> StepProgram:
    """The step program equal to the region function ``func`` (a ``func.func`` with a body); anchors of
    ``patterns`` are fused with their epilogues."""
    block = func.regions[0].blocks[0]
    ids: list[tuple[ir.Value, int]] = [(arg, i) for i, arg in enumerate(block.arguments)]

    def vid(v: ir.Value) -> int:
        for known, i in ids:
            if known == v:
                return i
        raise CollageError(f"{func.location}: region value used before definition")

    steps: list[Step] = []
    results: list[int] = []
    consumed: set = set()
    for op in block.operations:
        op = op.operation
        if op in consumed:
            continue
        if op.name == "func.return":
            results = [vid(v) for v in op.operands]
            break
        out = len(ids)
        fused = next((f for p in patterns if p.rejects(op) is None
                      and (f := _fused_step(op, p, vid, consumed)) is not None), None)
        if fused is not None:
            step, value = fused
            steps.append(replace(step, out=out))
            ids.append((value, out))
            continue
        steps.append(_translate_op(op, [vid(v) for v in op.operands], out))
        ids.append((op.results[0], out))
    ret = block.operations[len(block.operations) - 1].operation
    try:
        return StepProgram(
            inputs=tuple(_spec(a) for a in block.arguments),
            outputs=tuple(_spec(v) for v in ret.operands),
            steps=tuple(_in_dependency_order(_live_steps(steps, results), len(block.arguments))),
            results=tuple(results),
        )
    except ValueError as exc:
        raise CollageError(f"{func.location}: invalid step program: {exc}") from None


def _live_steps(steps: list[Step], results: list[int]) -> list[Step]:
    """Drops steps whose value nothing uses (constants that only fed a fused epilogue)."""
    used = set(results)
    live = []
    for step in reversed(steps):
        if step.out in used:
            live.append(step)
            used.update(step.ins)
    return live[::-1]


def _in_dependency_order(steps: list[Step], num_args: int) -> list[Step]:
    """Stable reorder so every step comes after the steps producing its inputs (fusion moves outputs)."""
    ready = set(range(num_args))
    pending, ordered = list(steps), []
    while pending:
        k = next(k for k, s in enumerate(pending) if all(i in ready for i in s.ins))
        step = pending.pop(k)
        ordered.append(step)
        ready.add(step.out)
    return ordered
