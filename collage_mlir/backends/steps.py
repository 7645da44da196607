"""Translate a region function of StableHLO into a *step program*: JSON a runtime executor runs with
a tensor library (torch here). Where a backend pattern matches (replayed on the region function, the
same followers that chose the region), the anchor and its epilogue become one fused step: a
convolution with bias, residual add and activation as oneDNN post-ops, a GEMM with bias and
activation. Every other op is one step.

Program: ``{"version": 2, "inputs": [{"shape", "dtype"}], "outputs": [...], "steps": [...],
"results": [value ids]}``; a step is ``{"op", "in": [value ids], "out": value id, ...attrs}``.
Value ids: function arguments first, then each step's result.
"""

from __future__ import annotations

from ..dialects import stablehlo as sh
from ..errors import CollageError
from ..ir import ir
from .patterns import OpPattern, follow

ELEMENTWISE = {
    "stablehlo.add": "add",
    "stablehlo.subtract": "sub",
    "stablehlo.multiply": "mul",
    "stablehlo.divide": "div",
    "stablehlo.maximum": "max",
    "stablehlo.minimum": "min",
}


def _spec(value: ir.Value) -> dict:
    shape, dtype = sh.tensor_type(value)
    return {"shape": list(shape), "dtype": dtype}


def _translate_op(op: ir.Operation, ins: list[int], out: int) -> dict:
    name = op.name
    step: dict = {"in": ins, "out": out}
    if name in ELEMENTWISE:
        step["op"] = ELEMENTWISE[name]
    elif name == "stablehlo.convolution":
        info = sh.conv_info(op)
        step.update(op="conv2d", stride=info.strides, padding=[lo for lo, _ in info.padding],
                    dilation=info.rhs_dilation, groups=info.feature_groups,
                    layouts=[info.lhs_layout, info.rhs_layout, info.out_layout], bias=False, binary=None,
                    act="none", scalars=[], algorithm="")
    elif name == "stablehlo.dot_general":
        d = sh.dot_info(op)
        nb = len(d.lhs_batch)
        step.update(op="matmul", transpose_rhs=d.rhs_contract == [nb + 1], bias=False, binary=None, act="none",
                    scalars=[], algorithm="")
    elif name == "stablehlo.broadcast_in_dim":
        step.update(op="broadcast", dims=sh.broadcast_dims(op), shape=_spec(op.results[0])["shape"])
    elif name == "stablehlo.convert":
        step.update(op="convert", dtype=_spec(op.results[0])["dtype"])
    elif name == "stablehlo.reshape":
        step.update(op="reshape", shape=_spec(op.results[0])["shape"])
    elif name == "stablehlo.transpose":
        step.update(op="transpose", perm=sh.permutation(op))
    elif name in ("stablehlo.constant", "arith.constant"):
        value = sh.constant_value(op)
        if value is None:
            raise CollageError(f"{op.location}: constant without dense value cannot be embedded")
        step.update(op="const", value=value.tolist(), **_spec(op.results[0]))
    else:
        raise CollageError(f"{op.location}: {name} has no step translation")
    return step


def _fused_step(anchor: ir.Operation, pattern: OpPattern, vid, consumed: set) -> tuple[dict, ir.Value] | None:
    """The fused step for ``anchor`` and the followers of ``pattern`` after it, with the value it defines."""
    step = _translate_op(anchor, [vid(v) for v in anchor.operands], -1)
    if step["op"] not in ("conv2d", "matmul"):
        return None
    out_shape = sh.tensor_type(anchor.results[0])[0]
    channel = step["layouts"][2].index("f") if step["op"] == "conv2d" else len(out_shape) - 1
    step.update(bias=False, binary=None, act="none", scalars=[], algorithm="")
    value = anchor.results[0]
    for follower, taken in follow(pattern, anchor):
        if follower.name == "scale" and step["act"] == "none" and not step["bias"]:
            pass  # multiply by ones
        elif follower.name == "bias" and step["act"] == "none" and step["binary"] is None:
            bcast = taken.ops[0]
            kept = [d for d, n in zip(sh.broadcast_dims(bcast), sh.tensor_type(bcast.operands[0])[0]) if n != 1]
            if kept not in ([channel], []):
                break
            step["in"].append(vid(bcast.operands[0]))
            step.update(bias=True, bias_size=out_shape[channel])
        elif follower.name == "residual" and step["act"] == "none":
            user = taken.ops[-1]
            other = [v for v in user.operands if v != value]
            step["in"].append(vid(other[0]))
            step["binary"] = "add"
        elif follower.name == "activation":
            step.update(taken.params)
        else:
            break
        consumed.update(taken.ops)
        value = taken.out
    return step, value


def translate_region(func: ir.Operation, patterns: tuple[OpPattern, ...] = ()) -> dict:
    """The step program equal to the region function ``func`` (a ``func.func`` with a body); anchors of
    ``patterns`` are fused with their epilogues."""
    block = func.regions[0].blocks[0]
    ids: list[tuple[ir.Value, int]] = [(arg, i) for i, arg in enumerate(block.arguments)]

    def vid(v: ir.Value) -> int:
        for known, i in ids:
            if known == v:
                return i
        raise CollageError(f"{func.location}: region value used before definition")

    steps: list[dict] = []
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
            step["out"] = out
            steps.append(step)
            ids.append((value, out))
            continue
        steps.append(_translate_op(op, [vid(v) for v in op.operands], out))
        ids.append((op.results[0], out))
    ret = block.operations[len(block.operations) - 1].operation
    program = {
        "version": 2,
        "inputs": [_spec(a) for a in block.arguments],
        "outputs": [_spec(v) for v in ret.operands],
        "steps": steps,
        "results": results,
    }
    program["steps"] = _in_dependency_order(_live_steps(steps, results), len(program["inputs"]))
    return program


def _live_steps(steps: list[dict], results: list[int]) -> list[dict]:
    """Drops steps whose value nothing uses (constants that only fed a fused epilogue)."""
    used = set(results)
    live = []
    for step in reversed(steps):
        if step["out"] in used:
            live.append(step)
            used.update(step["in"])
    return live[::-1]


def _in_dependency_order(steps: list[dict], num_args: int) -> list[dict]:
    """Stable reorder so every step comes after the steps producing its inputs (fusion moves outputs)."""
    ready = set(range(num_args))
    pending, ordered = list(steps), []
    while pending:
        step = next(s for s in pending if all(i in ready for i in s["in"]))
        pending.remove(step)
        ordered.append(step)
        ready.add(step["out"])
    return ordered
