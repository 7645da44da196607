"""`openvino`: regions run by OpenVINO's CPU plugin, which reads the same ONNX export as `ort`.

Build writes ``regions/<region>.openvino.onnx``; the runtime executor
``collage_runtime.executors.openvino_model`` compiles it for the CPU in f32 (stated explicitly:
this CPU has AVX512_BF16 and OpenVINO would otherwise pick bf16) and runs it with input tensors
sharing memory with the IREE buffers and output tensors set to the mapped result buffers.
"""

from __future__ import annotations

from .base import Tolerance
from .onnx_export import OnnxGraphBackend


class OpenVinoBackend(OnnxGraphBackend):
    name = "openvino"
    requires = ("onnx", "openvino")
    suffix = ".openvino.onnx"
    executor = "collage_runtime.executors.openvino_model"
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
