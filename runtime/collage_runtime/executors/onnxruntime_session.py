"""Runs an ONNX model with ONNX Runtime (CPU, all graph optimizations, 2 intra-op threads).

Inputs and outputs are bound zero-copy with I/O binding: the session reads the mapped IREE input
buffers in place and writes its results straight into the pre-allocated mapped output buffers.
Graph inputs are ``in0..`` and outputs ``out0..`` in argument / result order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import onnxruntime as ort

INTRA_OP_THREADS = 2


def load(path: Path) -> Callable[[list[np.ndarray], list[np.ndarray]], None]:
    """The callable that runs the ONNX model stored at ``path``."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = INTRA_OP_THREADS
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    # Bind with the model's own static shapes, which the region was built for.
    ins = [(i.name, list(i.shape)) for i in session.get_inputs()]
    outs = [(o.name, list(o.shape)) for o in session.get_outputs()]
    binding = session.io_binding()

    def run(inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        keep = []
        for (name, shape), arr in zip(ins, inputs):
            if not arr.flags.c_contiguous:
                arr = np.ascontiguousarray(arr)
                keep.append(arr)
            binding.bind_input(name, "cpu", 0, arr.dtype, shape, arr.ctypes.data)
        for (name, shape), out in zip(outs, outputs):
            binding.bind_output(name, "cpu", 0, out.dtype, shape, out.ctypes.data)
        session.run_with_iobinding(binding)
        del keep

    return run
