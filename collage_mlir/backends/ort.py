"""`ort`: regions run as ONNX models by ONNX Runtime (CPU execution provider, all graph optimizations).

Build exports the region function to ONNX (``onnx_export``) and writes ``regions/<region>.onnx``;
the runtime executor ``collage_runtime.executors.onnxruntime_session`` binds the zero-copy IREE
buffers as the session's inputs and outputs (I/O binding).
"""

from __future__ import annotations

from .base import Tolerance
from .onnx_export import OnnxGraphBackend


class OrtBackend(OnnxGraphBackend):
    name = "ort"
    requires = ("onnx", "onnxruntime")
    executor = "collage_runtime.executors.onnxruntime_session"
    install_hint = "pip install 'collage-mlir[ort]'"
    # Measured vs IREE llvm-cpu on test/python/test_onnx_backends.py's unit-normal inputs: max abs error
    # 1.8e-4 (BERT 128x768x768 matmul, outputs up to 118), 1.1e-4 (ResNet-50 3x3 conv 1x64x56x56,
    # outputs up to 123), 6e-5 (dilated NHWC conv), 4.6e-5 (strided 1x1), 2.3e-5 (sum over 16k
    # elements), 4e-6 (layer norm), < 1e-7 (softmax, data movement); i.e. about 1.5e-6 of the output
    # range. MLAS blocks the K loop of GEMM/conv differently from IREE, so sums of hundreds of terms
    # round differently: near-zero outputs of large sums need the absolute term.
    tolerance = Tolerance(rtol=1e-4, atol=5e-4)

    def version(self) -> str:
        import onnxruntime

        return f"onnxruntime-{onnxruntime.__version__}"
