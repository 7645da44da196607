"""Recognise the elementwise epilogue after a convolution or matmul as one library activation.

torch-mlir spells activations as chains of StableHLO ops (GELU is a 30-op rational approximation of
erf, SiLU is ``x * logistic(x)``, ReLU6 is max/min against broadcast scalars). Rather than one matcher
per spelling, take the largest single-input elementwise subgraph hanging off a value, evaluate it on
probe points and compare with the activations a library offers. A spelling nobody anticipated still
fuses if it computes the same function; one that computes something else never does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..activations import PROBE, Activation, classify
from ..dialects import stablehlo as sh
from ..ir import ir

_UNARY = {
    "stablehlo.logistic": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "stablehlo.tanh": np.tanh,
    "stablehlo.exponential": np.exp,
    "stablehlo.exponential_minus_one": np.expm1,
    "stablehlo.log": np.log,
    "stablehlo.log_plus_one": np.log1p,
    "stablehlo.rsqrt": lambda x: 1.0 / np.sqrt(x),
    "stablehlo.sqrt": np.sqrt,
    "stablehlo.negate": np.negative,
    "stablehlo.abs": np.abs,
    "chlo.erf": np.vectorize(math.erf, otypes=[np.float64]),
}
_BINARY = {
    "stablehlo.add": np.add,
    "stablehlo.subtract": np.subtract,
    "stablehlo.multiply": np.multiply,
    "stablehlo.divide": np.divide,
    "stablehlo.maximum": np.maximum,
    "stablehlo.minimum": np.minimum,
    "stablehlo.power": np.power,
}
_COMPARE = {"GT": np.greater, "GE": np.greater_equal, "LT": np.less, "LE": np.less_equal, "EQ": np.equal,
            "NE": np.not_equal}
ELEMENTWISE = set(_UNARY) | set(_BINARY) | {"stablehlo.clamp", "stablehlo.select", "stablehlo.compare"}

#: How many ops past the chain value the search looks (GELU's erf expansion is ~30).
WINDOW = 64


@dataclass
class Epilogue:
    ops: list[ir.Operation]
    out: ir.Value
    activation: Activation
    consts: list[ir.Operation] = field(default_factory=list)


def _evaluate(ops: list[ir.Operation], start: ir.Value, x: np.ndarray) -> dict | None:
    """Values of ``ops`` with ``start`` = x; scalar constants broadcast. None if a constant is not a splat."""
    env: list[tuple[ir.Value, np.ndarray]] = [(start, x)]

    def get(v: ir.Value):
        for known, val in env:
            if known == v:
                return val
        data = sh.const_expr_value(v)
        if data is None or data.size == 0 or not np.all(data == data.flat[0]):
            raise LookupError
        return np.float64(data.flat[0]) if data.dtype.kind == "f" else data.flat[0]

    try:
        with np.errstate(all="ignore"):
            for op in ops:
                args = [get(v) for v in op.operands]
                if op.name in _UNARY:
                    out = _UNARY[op.name](args[0])
                elif op.name in _BINARY:
                    out = _BINARY[op.name](args[0], args[1])
                elif op.name == "stablehlo.clamp":
                    out = np.minimum(np.maximum(args[1], args[0]), args[2])
                elif op.name == "stablehlo.select":
                    out = np.where(args[0], args[1], args[2])
                else:
                    direction = str(op.attributes["comparison_direction"]).split()[-1].rstrip(">")
                    out = _COMPARE[direction](args[0], args[1])
                env.append((op.results[0], np.broadcast_to(out, x.shape)))
    except (LookupError, KeyError):
        return None
    return env if ops and env[-1][0] == ops[-1].results[0] else None


def _depends(op: ir.Operation, live: list[ir.Value]) -> bool:
    return any(any(v == d for d in live) for v in op.operands)


def activation_after(value: ir.Value) -> Epilogue | None:
    """The largest elementwise subgraph fed only by ``value`` (and scalar constants) that has one
    result and computes a known activation of ``value``; None when there is none."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    anchor = owner.operation
    block_ops = [o.operation for o in anchor.block.operations]
    start = block_ops.index(anchor) + 1
    shape = sh.tensor_type(value)
    position = {op: k for k, op in enumerate(block_ops)}
    live = [value]
    taken: list[ir.Operation] = []
    # Elementwise ops on constants only (GELU's rsqrt(2)) join once a chain op uses them.
    pending: list[ir.Operation] = []
    best: Epilogue | None = None

    def is_const(v: ir.Value) -> bool:
        return sh.const_expr_value(v) is not None or any(v == q.results[0] for q in pending)

    for op in block_ops[start:start + WINDOW]:
        if op.name not in ELEMENTWISE or len(op.results) != 1:
            continue
        if not all(any(v == d for d in live) or is_const(v) for v in op.operands):
            continue
        if not _depends(op, live):
            pending.append(op)
            continue
        used = [q for q in pending if any(v == q.results[0] for v in op.operands)]
        while used:  # pull in the constant ops this one needs, and theirs
            q = used.pop()
            pending.remove(q)
            taken.append(q)
            live.append(q.results[0])
            used += [r for r in pending if any(v == r.results[0] for v in q.operands) and r not in used]
        taken.append(op)
        live.append(op.results[0])
        taken.sort(key=position.__getitem__)
        inside = set(taken)
        escaping = [v for v in live if any(u.owner.operation not in inside for u in v.uses)]
        if len(escaping) == 1 and escaping[0] == op.results[0] and sh.tensor_type(op.results[0]) == shape:
            env = _evaluate(taken, value, PROBE)
            act = classify(env[-1][1]) if env else None
            if act is not None:
                best = Epilogue(list(taken), op.results[0], act)
    return best
