"""Runs an ONNX model with OpenVINO's CPU plugin, compiled on the program's one ``ov.Core`` with its
thread budget (see ``collage_runtime.engines``): f32 inference precision (stated explicitly, as the CPU
may support bf16), one stream, latency hint.

Input tensors share memory with the mapped IREE input buffers; output tensors are set to the mapped
result buffers so results land in place. Where OpenVINO's output element type differs from the
buffer's (it runs f64 parts in f32), the result is copied in once, converted. Which outputs can be
written in place, and which inputs need a shape other than the buffer's, is decided at load.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import openvino as ov

from ..engines import Engines
from . import Run


def _shareable(arr: np.ndarray) -> np.ndarray:
    """``arr`` as an array OpenVINO can share. ``ov.Tensor(shared_memory=True)`` refuses read-only arrays
    (constants mapped from the module are); OpenVINO only reads inputs, so alias the same memory through a
    writeable view instead of copying. The caller keeps ``arr`` alive during inference."""
    if arr.flags.writeable or arr.nbytes == 0:
        return arr
    raw = (ctypes.c_char * arr.nbytes).from_address(arr.ctypes.data)
    return np.frombuffer(raw, dtype=arr.dtype).reshape(arr.shape)


def load(path: Path, engines: Engines) -> Run:
    """The callable that runs the ONNX model stored at ``path``."""
    compiled = engines.openvino_core().compile_model(str(path), "CPU", engines.openvino_config())
    request = compiled.create_infer_request()
    in_shapes = [tuple(i.get_shape()) for i in compiled.inputs]
    out_specs = [(tuple(o.get_shape()), o.get_element_type()) for o in compiled.outputs]
    set_input, set_output, infer, tensor = request.set_input_tensor, request.set_output_tensor, request.infer, ov.Tensor
    direct: list[bool] = []  # per output: OpenVINO writes into the mapped buffer (decided on the first call)

    def run(inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        if not direct:
            direct.extend(out.size > 0 and t == ov.Type(out.dtype) for out, (_, t) in zip(outputs, out_specs))
        for i, (arr, shape) in enumerate(zip(inputs, in_shapes)):
            if arr.shape != shape:
                arr = arr.reshape(shape)
            set_input(i, tensor(_shareable(arr), shared_memory=True))
        for i, (out, (shape, _), ok) in enumerate(zip(outputs, out_specs, direct)):
            if ok:
                set_output(i, tensor(out if out.shape == shape else out.reshape(shape), shared_memory=True))
        infer()
        for i, (out, ok) in enumerate(zip(outputs, direct)):
            if not ok:
                np.copyto(out, request.get_output_tensor(i).data.reshape(out.shape), casting="unsafe")

    return run
