"""Translate a region function of StableHLO into a *step program*: JSON a runtime executor runs with
a tensor library (torch here). One step per op, then a peephole that folds conv → bias → relu
into one fused convolution step (oneDNN post-ops).

Program: ``{"version": 1, "inputs": [{"shape", "dtype"}], "outputs": [...], "steps": [...],
"results": [value ids]}``; a step is ``{"op", "in": [value ids], "out": value id, ...attrs}``.
Value ids: function arguments first, then each step's result.
"""

from __future__ import annotations

from collections import Counter

from ..dialects import stablehlo as sh
from ..errors import CollageError
from ..ir import ir

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
                    dilation=info.rhs_dilation, groups=info.feature_groups, act="none")
    elif name == "stablehlo.dot_general":
        d = sh.dot_info(op)
        nb = len(d.lhs_batch)
        step.update(op="matmul", transpose_rhs=d.rhs_contract == [nb + 1])
    elif name == "stablehlo.broadcast_in_dim":
        step.update(op="broadcast", dims=sh.broadcast_dims(op), shape=_spec(op.results[0])["shape"])
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


def translate_region(func: ir.Operation) -> dict:
    """The step program equal to the region function ``func`` (a ``func.func`` with a body)."""
    block = func.regions[0].blocks[0]
    ids: list[tuple[ir.Value, int]] = [(arg, i) for i, arg in enumerate(block.arguments)]

    def vid(v: ir.Value) -> int:
        for known, i in ids:
            if known == v:
                return i
        raise CollageError(f"{func.location}: region value used before definition")

    steps: list[dict] = []
    results: list[int] = []
    for op in block.operations:
        op = op.operation
        if op.name == "func.return":
            results = [vid(v) for v in op.operands]
            break
        out = len(ids)
        steps.append(_translate_op(op, [vid(v) for v in op.operands], out))
        ids.append((op.results[0], out))
    ret = block.operations[len(block.operations) - 1].operation
    program = {
        "version": 1,
        "inputs": [_spec(a) for a in block.arguments],
        "outputs": [_spec(v) for v in ret.operands],
        "steps": steps,
        "results": results,
    }
    fuse_conv_epilogue(program)
    program["steps"] = _in_dependency_order(program["steps"], len(program["inputs"]))
    return program


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


def fuse_conv_epilogue(program: dict) -> None:
    """conv2d → add(broadcast(bias along C)) → max(const 0)  ⇒  one conv2d step with bias and relu."""
    steps = program["steps"]
    by_out = {s["out"]: s for s in steps}

    def uses() -> Counter:
        c = Counter(i for s in steps for i in s["in"])
        c.update(program["results"])
        return c

    for conv in [s for s in steps if s["op"] == "conv2d"]:
        u = uses()
        users = [s for s in steps if conv["out"] in s["in"]]
        if u[conv["out"]] == 1 and len(users) == 1 and users[0]["op"] == "add" and len(conv["in"]) == 2:
            add = users[0]
            other = [i for i in add["in"] if i != conv["out"]]
            bcast = by_out.get(other[0]) if len(other) == 1 else None
            if bcast and bcast["op"] == "broadcast" and u[bcast["out"]] == 1:
                conv["in"].append(bcast["in"][0])
                conv["bias_size"] = bcast["shape"][1]
                conv["out"] = add["out"]
                steps.remove(add)
                steps.remove(bcast)
                by_out = {s["out"]: s for s in steps}
        u = uses()
        users = [s for s in steps if conv["out"] in s["in"]]
        if u[conv["out"]] == 1 and len(users) == 1 and users[0]["op"] == "max":
            mx = users[0]
            other = [i for i in mx["in"] if i != conv["out"]]
            zero = by_out.get(other[0]) if len(other) == 1 else None
            if zero and zero["op"] == "const" and u[zero["out"]] == 1 and not _any_nonzero(zero["value"]):
                conv["act"] = "relu"
                conv["out"] = mx["out"]
                steps.remove(mx)
                steps.remove(zero)
                by_out = {s["out"]: s for s in steps}


def _any_nonzero(value) -> bool:
    if isinstance(value, list):
        return any(_any_nonzero(v) for v in value)
    return value != 0
