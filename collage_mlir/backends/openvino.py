"""`openvino`: regions run by OpenVINO's CPU plugin, which reads the same ONNX export as `ort`.

Build writes ``regions/<region>.openvino.onnx``; the runtime executor
``collage_runtime.executors.openvino_model`` compiles it for the CPU in f32 (stated explicitly:
this CPU has AVX512_BF16 and OpenVINO would otherwise pick bf16) and runs it with input tensors
sharing memory with the IREE buffers and output tensors set to the mapped result buffers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..dialects.stablehlo import const_expr_value, tensor_type
from ..errors import CollageError
from ..graph import producer
from ..ir import ir
from .base import RegionArtifact, Tolerance
from .onnx_export import OnnxGraphBackend, engine_patterns

#: How far back ``exact_types`` looks for a value's non-constant inputs.
_MAX_ANCESTORS = 64


def _from_constants(value: ir.Value) -> bool:
    """Whether ``value`` is computed from constants alone (within ``_MAX_ANCESTORS`` ops)."""
    seen: set = set()
    stack = [value]
    while stack:
        op = producer(stack.pop())
        if op is None or len(seen) >= _MAX_ANCESTORS:
            return False  # a function argument, or too far to tell
        if op in seen:
            continue
        seen.add(op)
        stack.extend(op.operands)
    return True


def exact_types(op: ir.Operation) -> str | None:
    """i64 only from constants (OpenVINO computes i64 in 32 bits); constant pad values"""
    # Probed (test_graph_translation.py::test_engine_type_coverage): 2**40 + 3 comes back as 3, and a pad
    # value given at run time is ignored (zeros). f64 runs in f32 — as IREE runs it (it demotes f64).
    for v in list(op.operands) + list(op.results):
        tt = tensor_type(v)
        if tt is not None and tt[1] == "i64" and not _from_constants(v):
            return "OpenVINO computes i64 in 32 bits: only i64 values computed from constants"
    if op.name == "stablehlo.pad" and const_expr_value(op.operands[1]) is None:
        return "OpenVINO ignores a padding value given at run time: it must be a constant"
    return None


class OpenVinoBackend(OnnxGraphBackend):
    name = "openvino"
    requires = ("onnx", "openvino")
    suffix = ".openvino.onnx"
    executor = "collage_runtime.executors.openvino_model"
    patterns = engine_patterns(exact_types)
    install_hint = "pip install 'collage-mlir[openvino]'"
    # Measured vs IREE llvm-cpu on test/python/test_onnx_backends.py's unit-normal inputs: max abs error
    # 1.3e-4 (ResNet-50 3x3 conv 1x64x56x56, outputs up to 123), 2.3e-5 (sum over 16k elements),
    # 4e-6 (layer norm), 0 for the BERT 128x768x768 matmul, strided 1x1, depthwise and NHWC convs
    # (same accumulation order as IREE), < 1e-7 (softmax, data movement). Winograd-style or blocked
    # 3x3 kernels round sums of hundreds of terms differently: near-zero outputs need the absolute term.
    tolerance = Tolerance(rtol=1e-4, atol=5e-4)

    def version(self) -> str:
        import openvino

        return f"openvino-{openvino.get_version().split('-')[0]}"

    def build(self, func: ir.Operation, out_dir: Path, region: str) -> RegionArtifact:
        art = super().build(func, out_dir, region)
        import onnx
        from onnx import numpy_helper

        # i64 constants reach OpenVINO folded; they must survive its 32-bit arithmetic unchanged.
        for t in onnx.load(Path(out_dir) / art.file).graph.initializer:
            v = numpy_helper.to_array(t)
            if v.dtype == np.int64 and v.size and (v.min() < np.iinfo(np.int32).min or v.max() > np.iinfo(np.int32).max):
                raise CollageError(f"{func.location}: an i64 constant of this region does not fit the 32 bits "
                                   "OpenVINO computes i64 in; leave the region to another backend")
        return art
