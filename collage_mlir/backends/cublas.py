"""`cublas`: matmuls and batch matmuls on cuBLAS / cuBLASLt through torch, in CUDA programs.

Build translates the region into a step program (the same ``collage_runtime.steps.StepProgram`` as
``onednn``) that the device executor ``collage_runtime.executors.torch_device`` runs on the program's own
CUDA buffers (DLPack, no copy). A 2-D matmul with a bias and relu or (tanh-approximate) GELU is one
``torch._addmm_activation`` call: cuBLASLt's ``RELU_BIAS`` / ``GELU_BIAS`` epilogue; any other bias is the
GEMM's C operand (``addmm``, ``baddbmm``), and a residual add or another activation follows in place in the
same region. Building needs no GPU (programs for a GPU are compiled on CPU machines).
"""

from __future__ import annotations

from .base import Tolerance
from .library_patterns import (BIAS, RESIDUAL, SCALE, STATIC_F32_F16, TORCH_ACTIVATION, CudaLibraryBackend,
                               plain_matmul)
from .patterns import OpPattern


class CublasBackend(CudaLibraryBackend):
    name = "cublas"
    # f16 sets the bound: cuBLAS reduces f16 in f32 (the executor turns off reduced-precision reductions) and
    # rounds once to f16 (2^-11 relative), plus the bias add and activation in f16. f32 runs in full f32
    # (TF32 off, ``torch_device.exact_float``): on CPU torch ~1e-6 relative. Not yet measured on a GPU
    # (test/python/backends/test_gpu_libraries.py).
    tolerance = Tolerance(rtol=2e-3, atol=2e-3)
    patterns = (
        OpPattern("matmul", "stablehlo.dot_general", (STATIC_F32_F16, plain_matmul),
                  (SCALE, BIAS, RESIDUAL, TORCH_ACTIVATION)),
    )
