"""`cudnn`: 2-D convolutions on cuDNN through torch, in CUDA programs.

Build translates the region into a step program that the device executor
``collage_runtime.executors.torch_device`` runs on the program's own CUDA buffers (DLPack, no copy). Any 2-D
layout: an NHWC input (JAX's) runs channels-last without a copy, the kernel is laid out to match. A bias
[+ residual add] + relu epilogue is one fused cuDNN call (``torch.cudnn_convolution_relu`` /
``cudnn_convolution_add_relu``); other activations follow ``F.conv2d`` in place in the same region. Building
needs no GPU.
"""

from __future__ import annotations

from .base import Tolerance
from .library_patterns import (BIAS, RESIDUAL, STATIC_F32_F16, TORCH_ACTIVATION, CudaLibraryBackend, conv2d)
from .patterns import OpPattern


class CudnnBackend(CudaLibraryBackend):
    name = "cudnn"
    # As cublas: f16 sets the bound (one rounding of an f32-accumulated result, then the epilogue in f16);
    # f32 without TF32 (``torch_device.exact_float``), whichever algorithm cuDNN's heuristics pick (Winograd
    # and FFT ones reorder more than a GEMM). Not yet measured on a GPU.
    tolerance = Tolerance(rtol=2e-3, atol=2e-3)
    patterns = (
        OpPattern("conv2d", "stablehlo.convolution", (STATIC_F32_F16, conv2d), (BIAS, RESIDUAL, TORCH_ACTIVATION)),
    )
