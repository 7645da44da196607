"""Runs a step program (see collage_mlir.backends.steps) with torch: oneDNN convolutions with fused
post-ops, MKL matmuls. Inputs are zero-copy torch views of mapped IREE buffers; each result is written
into its mapped output buffer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import torch

_DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "i32": torch.int32,
           "i64": torch.int64, "i1": torch.bool}


def _broadcast(x: torch.Tensor, dims: list[int], shape: list[int]) -> torch.Tensor:
    view = [1] * len(shape)
    for src_axis, dst_axis in enumerate(dims):
        view[dst_axis] = x.shape[src_axis]
    return x.reshape(view).expand(shape)


def _step(step: dict, args: list[torch.Tensor]) -> torch.Tensor:
    op = step["op"]
    if op == "conv2d":
        x, w = args[0], args[1]
        bias = args[2].reshape(step["bias_size"]) if len(args) > 2 else None
        return torch.ops.mkldnn._convolution_pointwise(
            x, w, bias, step["padding"], step["stride"], step["dilation"], step["groups"], step["act"], [], ""
        )
    if op == "matmul":
        a, b = args
        return torch.matmul(a, b.transpose(-1, -2) if step["transpose_rhs"] else b)
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
    if op == "const":
        return torch.tensor(step["value"], dtype=_DTYPES[step["dtype"]]).reshape(step["shape"])
    raise ValueError(f"unknown step op {op!r}")


def load(path: Path) -> Callable[[list[np.ndarray], list[np.ndarray]], None]:
    """The callable that runs the step program stored at ``path``."""
    program = json.loads(Path(path).read_text())
    steps = program["steps"]
    # Constants are materialised once, not per call.
    consts = {s["out"]: _step(s, []) for s in steps if s["op"] == "const"}
    compute = [s for s in steps if s["op"] != "const"]
    results = program["results"]

    def run(inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        values: dict[int, torch.Tensor] = dict(consts)
        for i, arr in enumerate(inputs):
            values[i] = torch.from_numpy(arr)
        for s in compute:
            values[s["out"]] = _step(s, [values[i] for i in s["in"]])
        for out, vid in zip(outputs, results):
            torch.from_numpy(out).copy_(values[vid])

    return run
