"""`onednn`: convolutions and matmuls on the oneDNN and MKL that PyTorch 2.13 bundles.

Build translates the region function into a step program (``collage_runtime.steps.StepProgram``, written
as JSON) that the runtime executor ``collage_runtime.executors.torch_steps`` runs with torch on zero-copy
views of IREE buffers.

- conv2d: any 2-D layout. oneDNN prefers NCHW or channels-last; other layouts are permuted views
  inside the region (channels-last costs no copy: a permuted NHWC tensor *is* channels-last NCHW).
  Bias, a residual add and an activation (relu, gelu, sigmoid, silu, tanh, hardtanh/relu6,
  hardswish, hardsigmoid, leaky relu) become oneDNN post-ops of one
  ``mkldnn._convolution_pointwise`` call.
- matmul / batch matmul / linear: MKL GEMM written straight into the result buffer (``addmm`` folds
  the bias in as beta=1), then residual add and activation in place on that buffer.
"""

from __future__ import annotations

from .base import BackendKind, Tolerance
from .library_patterns import BIAS, RESIDUAL, SCALE, StepProgramBackend, conv2d, plain_matmul
from .patterns import ActivationFollower, OpPattern, static_f32

#: oneDNN eltwise post-ops reachable through torch's mkldnn pointwise ops.
ACTIVATION = ActivationFollower("activation", allowed=("relu", "gelu", "sigmoid", "swish", "tanh", "hardtanh",
                                                       "hardswish", "hardsigmoid", "leaky_relu"))


class OneDnnBackend(StepProgramBackend):
    name = "onednn"
    kind = BackendKind.LIBRARY
    install_hint = "pip install torch==2.13.0"
    executor = "collage_runtime.executors.torch_steps"
    # oneDNN/MKL reorder the reduction; measured max relative error stays under 1e-5 with atol for
    # values near zero (see test/python/backends/test_onednn.py).
    tolerance = Tolerance(rtol=1e-4, atol=1e-5)
    patterns = (
        OpPattern("conv2d", "stablehlo.convolution", (static_f32, conv2d), (BIAS, RESIDUAL, ACTIVATION)),
        OpPattern("matmul", "stablehlo.dot_general", (static_f32, plain_matmul),
                  (SCALE, BIAS, RESIDUAL, ACTIVATION)),
    )

    #: Looked up, not imported (importing torch costs every collage process 2 s); the CPU wheels of torch
    #: all bundle oneDNN, and a build without it fails the region's first run, which is recorded.
    requires = ("torch",)

    def version(self) -> str:
        from importlib.metadata import version

        return f"torch-{version('torch')}"  # = torch.__version__, without importing torch
