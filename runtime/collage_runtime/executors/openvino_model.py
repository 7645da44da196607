"""Runs an ONNX model with OpenVINO's CPU plugin: f32 inference precision (stated explicitly, as
the CPU may support bf16), 2 threads, one stream, latency hint.

Input tensors share memory with the mapped IREE input buffers; output tensors are set to the mapped
result buffers so results land in place. Where OpenVINO's output element type differs from the
buffer's (it runs f64 parts in f32), the result is copied in once, converted.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Callable

import numpy as np
import openvino as ov
import openvino.properties as props
import openvino.properties.hint as hints

THREADS = 2


def _shareable(arr: np.ndarray) -> np.ndarray:
    """``arr`` as a C-contiguous array OpenVINO can share. ``ov.Tensor(shared_memory=True)`` refuses
    read-only arrays (mapped inputs may be); OpenVINO only reads inputs, so alias the same memory
    through a writeable view instead of copying. The caller keeps ``arr`` alive during inference."""
    arr = np.ascontiguousarray(arr)
    if arr.flags.writeable or arr.nbytes == 0:
        return arr
    raw = (ctypes.c_char * arr.nbytes).from_address(arr.ctypes.data)
    return np.frombuffer(raw, dtype=arr.dtype).reshape(arr.shape)


def load(path: Path) -> Callable[[list[np.ndarray], list[np.ndarray]], None]:
    """The callable that runs the ONNX model stored at ``path``."""
    core = ov.Core()
    config = {
        props.inference_num_threads: THREADS,
        props.num_streams: 1,
        hints.performance_mode: hints.PerformanceMode.LATENCY,
        hints.inference_precision: ov.Type.f32,
    }
    compiled = core.compile_model(str(path), "CPU", config)
    request = compiled.create_infer_request()
    # Views with the model's own static shapes, which the region was built for.
    in_shapes = [tuple(i.get_shape()) for i in compiled.inputs]
    out_specs = [(tuple(o.get_shape()), o.get_element_type()) for o in compiled.outputs]

    def run(inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        for i, (arr, shape) in enumerate(zip(inputs, in_shapes)):
            request.set_input_tensor(i, ov.Tensor(_shareable(arr).reshape(shape), shared_memory=True))
        direct = []
        for i, (out, (shape, t)) in enumerate(zip(outputs, out_specs)):
            ok = out.size > 0 and t == ov.Type(out.dtype) and out.flags.c_contiguous and out.flags.writeable
            if ok:
                request.set_output_tensor(i, ov.Tensor(out.reshape(shape), shared_memory=True))
            direct.append(ok)
        request.infer()
        for i, (out, ok) in enumerate(zip(outputs, direct)):
            if not ok:
                np.copyto(out, request.get_output_tensor(i).data.reshape(out.shape), casting="unsafe")

    return run
