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
    # Measured vs IREE llvm-cpu on test/python/test_onnx_backends.py's unit-normal inputs: max abs error
    # 1.8e-4 (BERT 128x768x768 matmul, outputs up to 118), 1.1e-4 (ResNet-50 3x3 conv 1x64x56x56,
    # outputs up to 123), 6e-5 (dilated NHWC conv), 4.6e-5 (strided 1x1), 2.3e-5 (sum over 16k
    # elements), 4e-6 (layer norm), < 1e-7 (softmax, data movement); i.e. about 1.5e-6 of the output
    # range. MLAS blocks the K loop of GEMM/conv differently from IREE, so sums of hundreds of terms
    # round differently: near-zero outputs of large sums need the absolute term.
    tolerance = Tolerance(rtol=1e-4, atol=5e-4)

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
