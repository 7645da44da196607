"""`ort`: regions run as ONNX models by ONNX Runtime (CPU execution provider, all graph optimizations).

Build exports the region function to ONNX (``collage_mlir.onnx``) and writes ``regions/<region>.onnx``;
the runtime executor ``collage_runtime.executors.onnxruntime_session`` binds the zero-copy IREE
buffers as the session's inputs and outputs (I/O binding).
"""

from __future__ import annotations

from ..dialects.stablehlo import tensor_type
from ..ir import ir
from .base import Tolerance
from .onnx_engine import OnnxGraphBackend, engine_patterns


def ort_kernels(op: ir.Operation) -> str | None:
    """no f64 Conv, no Where on i1, no integer divide (ONNX Runtime's CPU kernels)"""
    # Found by probing every op on every element type (test_graph_translation.py::test_engine_type_coverage);
    # the ONNX op list promises more than the CPU execution provider has kernels for.
    et = tensor_type(op.results[0])[1] if op.results and tensor_type(op.results[0]) else ""
    if op.name == "stablehlo.convolution" and et == "f64":
        return "ONNX Runtime has no f64 Conv kernel (NOT_IMPLEMENTED)"
    if op.name == "stablehlo.select" and et == "i1":
        return "ONNX Runtime has no Where kernel for bool (NOT_IMPLEMENTED)"
    if op.name == "stablehlo.divide" and et.startswith("i"):
        return "ONNX Runtime aborts the run on an integer division by zero, where StableHLO gives a result"
    return None


class OrtBackend(OnnxGraphBackend):
    name = "ort"
    requires = ("onnx", "onnxruntime")
    executor = "collage_runtime.executors.onnxruntime_session"
    patterns = engine_patterns(ort_kernels)
    install_hint = "pip install 'collage-mlir[ort]'"
    # Measured vs IREE llvm-cpu on test/python/backends/test_onnx_backends.py's unit-normal inputs: max abs error
    # 1.8e-4 (BERT 128x768x768 matmul, outputs up to 118), 1.1e-4 (ResNet-50 3x3 conv 1x64x56x56,
    # outputs up to 123), 6e-5 (dilated NHWC conv), 4.6e-5 (strided 1x1), 2.3e-5 (sum over 16k
    # elements), 4e-6 (layer norm), < 1e-7 (softmax, data movement); i.e. about 1.5e-6 of the output
    # range. MLAS blocks the K loop of GEMM/conv differently from IREE, so sums of hundreds of terms
    # round differently: near-zero outputs of large sums need the absolute term. Integer, i1 and f64
    # ops are exact or f64-accurate (probed per op and type), so the f32 figures bound every type.
    tolerance = Tolerance(rtol=1e-4, atol=5e-4)

    def version(self) -> str:
        import onnxruntime

        return f"onnxruntime-{onnxruntime.__version__}"

    def loads(self, model) -> bool:
        """Where ONNX Runtime has a kernel for every node of the user's model (a session is made, unoptimized:
        a bf16 model has few CPU kernels, where the translation computes bf16 in f32), a whole-model region
        runs the user's file: ONNX Runtime fuses its own exporter's patterns (attention, SkipLayerNorm, int8
        MatMulIntegerToFloat) and not all of the translation's: BERT-base at 1x64 runs 1.08x faster in f32
        than from its translation, and gives ONNX Runtime's outputs bit for bit
        (``studies/whole_model/onnx_source.py``)."""
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 4
        try:
            onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001  (any refusal: the translation serves)
            return False
        return True
