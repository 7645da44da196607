"""`ort`: regions run as ONNX models by ONNX Runtime (CPU execution provider, all graph optimizations).

Build exports the region function to ONNX (``onnx_export``) and writes ``regions/<region>.onnx``;
the runtime executor ``collage_runtime.executors.onnxruntime_session`` binds the zero-copy IREE
buffers as the session's inputs and outputs (I/O binding).
"""

from __future__ import annotations

from pathlib import Path

from ..ir import ir
from .base import BackendKind, RegionArtifact, Tolerance
from .onnx_export import OnnxGraphBackend, translate


class OrtBackend(OnnxGraphBackend):
    name = "ort"
    kind = BackendKind.GRAPH
    install_hint = "pip install 'collage-mlir[ort]'"
    # Measured vs IREE llvm-cpu (test/python/test_onnx_backends.py shapes: ResNet-50 3x3 conv
    # 1x64x56x56, strided 1x1, MobileNetV2 depthwise, BERT 128x768x768 matmul, softmax, layer norm,
    # reductions): max abs error 1.2e-5 (on values up to ~30), max rel error on |ref| > 1e-3 of 2e-5.
    # MLAS reorders the convolution and GEMM reductions, hence more than fp32 round-off.
    tolerance = Tolerance(rtol=1e-4, atol=1e-4)

    def available(self) -> str | None:
        try:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            return f"{exc.name or 'onnxruntime'} is not installed"
        except Exception as exc:  # a broken install must not take the registry down
            return f"onnxruntime fails to import: {exc}"
        return None

    def version(self) -> str:
        import onnxruntime

        return f"onnxruntime-{onnxruntime.__version__}"

    def build(self, func: ir.Operation, out_dir: Path, region: str) -> RegionArtifact:
        model = translate(func)
        path = Path(out_dir) / "regions" / f"{region}.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(model.SerializeToString())
        return RegionArtifact(str(path.relative_to(out_dir)), "collage_runtime.executors.onnxruntime_session")
