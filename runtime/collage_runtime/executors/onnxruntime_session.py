"""Runs an ONNX model with ONNX Runtime (CPU, all graph optimizations, the program's thread budget with
spinning off: see ``collage_runtime.engines``).

Inputs and outputs are bound zero-copy with I/O binding: the session reads the mapped IREE input
buffers in place and writes its results straight into the pre-allocated mapped output buffers.
Graph inputs are ``in0..`` and outputs ``out0..`` in argument / result order, bound with the model's
own static shapes, which the region was built for. The binding and the CPU device
are prepared at load; a call wraps each array in an OrtValue (zero-copy on the CPU) and binds it, through
the pybind layer under ``IOBinding``/``InferenceSession``: their Python wrappers build a device object and
check graph-capture state on every bind and run (~2 µs more per tensor).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import _pybind_state as C

from ..engines import Engines
from . import Run


def load(path: Path, engines: Engines) -> Run:
    """The callable that runs the ONNX model stored at ``path``."""
    session = ort.InferenceSession(str(path), sess_options=engines.ort_session_options(),
                                   providers=["CPUExecutionProvider"])
    binding = session.io_binding()._iobinding
    cpu = ort.OrtDevice.make("cpu", 0)._get_c_device()
    wrap = C.OrtValue.ortvalue_from_numpy  # zero-copy on the CPU device
    bind_input, bind_output = binding.bind_ortvalue_input, binding.bind_ortvalue_output
    execute = session._sess.run_with_iobinding
    # The model's own static shapes: a scalar may be [] in the program and [1] in the ONNX graph.
    ins = [(i.name, tuple(i.shape)) for i in session.get_inputs()]
    outs = [(o.name, tuple(o.shape)) for o in session.get_outputs()]

    def run(inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        for (name, shape), arr in zip(ins, inputs):
            bind_input(name, wrap(arr if arr.shape == shape else arr.reshape(shape), cpu))
        for (name, shape), out in zip(outs, outputs):
            bind_output(name, wrap(out if out.shape == shape else out.reshape(shape), cpu))
        execute(binding, None)

    return run
