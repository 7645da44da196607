"""Runs a step program (see collage_mlir.backends.steps) with torch: oneDNN convolutions with fused
post-ops, MKL matmuls. Inputs are zero-copy torch views of mapped IREE buffers; results are written
into the mapped output buffers (the last step of a result writes there directly where it can)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import numpy as np

# OpenMP workers sleep between regions instead of spinning for ~300k iterations (GNU OpenMP's default),
# which would take cores from the engine that runs next. Read once, when torch loads libgomp.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ..engines import Engines  # noqa: E402
from . import Run  # noqa: E402

_DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "i32": torch.int32,
           "i64": torch.int64, "i1": torch.bool}
_NCHW = "bf01"
_OIHW = "oi01"

_INPLACE_ACT: dict[str, Callable] = {
    "relu": lambda t, s, a: t.relu_(),
    "sigmoid": lambda t, s, a: t.sigmoid_(),
    "tanh": lambda t, s, a: t.tanh_(),
    "swish": lambda t, s, a: F.silu(t, inplace=True),
    "gelu": lambda t, s, a: t.copy_(F.gelu(t, approximate=a or "none")),
    "hardtanh": lambda t, s, a: t.clamp_(s[0], s[1]),
    "hardswish": lambda t, s, a: F.hardswish(t, inplace=True),
    "hardsigmoid": lambda t, s, a: F.hardsigmoid(t, inplace=True),
    "leaky_relu": lambda t, s, a: F.leaky_relu(t, s[0], inplace=True),
}


def _broadcast(x: torch.Tensor, dims: list[int], shape: list[int]) -> torch.Tensor:
    view = [1] * len(shape)
    for src_axis, dst_axis in enumerate(dims):
        view[dst_axis] = x.shape[src_axis]
    return x.reshape(view).expand(shape)


def _to(layout: str, canonical: str) -> list[int]:
    """The permutation that views a tensor in ``layout`` as ``canonical`` (e.g. b01f -> bf01)."""
    return [layout.index(c) for c in canonical]


def _conv2d(step: dict, args: list[torch.Tensor]) -> torch.Tensor:
    lhs, rhs, out = step["layouts"]
    x = args[0].permute(_to(lhs, _NCHW)) if lhs != _NCHW else args[0]
    w = args[1].permute(_to(rhs, _OIHW)).contiguous() if rhs != _OIHW else args[1]
    rest = args[2:]
    bias = rest.pop(0).reshape(step["bias_size"]) if step["bias"] else None
    attr, scalars, algorithm = step["act"], step["scalars"], step["algorithm"] or ""
    geometry = (step["padding"], step["stride"], step["dilation"], step["groups"])
    if step["binary"]:
        other = rest.pop(0)
        other = other.permute(_to(out, _NCHW)) if out != _NCHW else other
        y = torch.ops.mkldnn._convolution_pointwise.binary(
            x, other, w, bias, *geometry, step["binary"], 1.0, None if attr == "none" else attr, scalars,
            algorithm or None)
    else:
        y = torch.ops.mkldnn._convolution_pointwise(x, w, bias, *geometry, attr, scalars, algorithm)
    return y.permute(_to(_NCHW, out)) if out != _NCHW else y


def _matmul(step: dict, args: list[torch.Tensor], out: torch.Tensor | None) -> torch.Tensor:
    a, b = args[0], args[1]
    b = b.transpose(-1, -2) if step["transpose_rhs"] else b
    rest = args[2:]
    bias = rest.pop(0).reshape(-1) if step["bias"] else None
    if out is None:
        out = torch.empty(a.shape[:-1] + b.shape[-1:], dtype=a.dtype)
    if bias is not None and a.dim() == 2:
        torch.addmm(bias, a, b, out=out)
    else:
        torch.matmul(a, b, out=out)
        if bias is not None:
            out.add_(bias)
    if step["binary"]:
        out.add_(rest.pop(0))
    if step["act"] != "none":
        _INPLACE_ACT[step["act"]](out, step["scalars"], step["algorithm"])
    return out


def _step(step: dict, args: list[torch.Tensor]) -> torch.Tensor:
    op = step["op"]
    if op == "conv2d":
        return _conv2d(step, args)
    if op == "matmul":
        return _matmul(step, args, None)
    if op == "add":
        return torch.add(*args)
    if op == "sub":
        return torch.sub(*args)
    if op == "mul":
        return torch.mul(*args)
    if op == "div":
        return torch.div(*args)
    if op == "max":
        return torch.maximum(*args)
    if op == "min":
        return torch.minimum(*args)
    if op == "broadcast":
        return _broadcast(args[0], step["dims"], step["shape"])
    if op == "reshape":
        return args[0].reshape(step["shape"])
    if op == "transpose":
        return args[0].permute(step["perm"])
    if op == "convert":
        return args[0].to(_DTYPES[step["dtype"]])
    if op == "const":
        return torch.tensor(step["value"], dtype=_DTYPES[step["dtype"]]).reshape(step["shape"])
    raise ValueError(f"unknown step op {op!r}")


def _work(step: dict, args: list[torch.Tensor], y: torch.Tensor) -> int:
    """Multiply-adds of a convolution or matmul step, else one per element it produces."""
    if step["op"] == "conv2d":
        w = args[1]
        return y.numel() * (w.numel() // w.shape[step["layouts"][1].index("o")])
    if step["op"] == "matmul":
        return args[0].numel() * args[1].shape[-2 if step["transpose_rhs"] else -1]
    return y.numel()


def load(path: Path, engines: Engines) -> Run:
    """The callable that runs the step program stored at ``path`` with the program's thread budget, or
    with one thread where its work is small (``engines.SMALL_REGION_MACS``: counted on the first call)."""
    engines.torch()
    program = json.loads(Path(path).read_text())
    if program.get("version") != 2:
        raise ValueError(f"{path}: step program version {program.get('version')} (this runtime reads 2)")
    steps = program["steps"]
    results = program["results"]
    # Constants (and what is computed from them alone) are materialised once, not per call.
    consts: dict[int, torch.Tensor] = {}
    compute = []
    for s in steps:
        if all(i in consts for i in s["in"]) and (s["op"] == "const" or s["in"]):
            consts[s["out"]] = _step(s, [consts[i] for i in s["in"]])
        else:
            compute.append(s)
    # A matmul whose value is exactly one result (used by nothing else) writes into that buffer.
    uses: dict[int, int] = {}
    for s in compute:
        for i in s["in"]:
            uses[i] = uses.get(i, 0) + 1
    direct = {s["out"]: results.index(s["out"]) for s in compute
              if s["op"] == "matmul" and results.count(s["out"]) == 1 and s["out"] not in uses}

    def body(inputs: list[np.ndarray], outputs: list[np.ndarray], work: list[int] | None = None) -> None:
        values: dict[int, torch.Tensor] = dict(consts)
        for i, arr in enumerate(inputs):
            values[i] = torch.from_numpy(arr)
        written = set()
        for s in compute:
            args = [values[i] for i in s["in"]]
            if s["out"] in direct:
                k = direct[s["out"]]
                values[s["out"]] = _matmul(s, args, torch.from_numpy(outputs[k]))
                written.add(k)
            else:
                values[s["out"]] = _step(s, args)
            if work is not None:
                work.append(_work(s, args, values[s["out"]]))
        for k, (out, vid) in enumerate(zip(outputs, results)):
            if k not in written:
                torch.from_numpy(out).copy_(values[vid])

    threads = engines.threads
    if threads == 1:
        return body
    small: list[bool] = []  # decided on the first call, from the shapes it ran

    def run(inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        if not small:
            work: list[int] = []
            body(inputs, outputs, work)
            small.append(engines.region_threads(sum(work)) == 1)
        elif small[0]:
            # torch's thread count is process-wide: set around the call (~1 µs), back to the budget after.
            torch.set_num_threads(1)
            try:
                body(inputs, outputs)
            finally:
                torch.set_num_threads(threads)
        else:
            body(inputs, outputs)

    return run
