"""Runs an ONNX model with OpenVINO's CPU plugin: f32 inference precision (stated explicitly, as
the CPU may support bf16), 2 threads, one stream, latency hint.

Input tensors share memory with the mapped IREE input buffers; output tensors are set to the mapped
result buffers so results land in place. Where OpenVINO's output element type differs from the
buffer's (it runs f64 parts in f32), the result is copied in once, converted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import openvino as ov
import openvino.properties as props
import openvino.properties.hint as hints

THREADS = 2


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
    out_types = [o.get_element_type() for o in compiled.outputs]
    n_in = len(compiled.inputs)

    def run(inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        for i, arr in enumerate(inputs[:n_in]):
            request.set_input_tensor(i, ov.Tensor(np.ascontiguousarray(arr), shared_memory=True))
        direct = []
        for i, (out, t) in enumerate(zip(outputs, out_types)):
            ok = out.size > 0 and t == ov.Type(out.dtype)
            if ok:
                request.set_output_tensor(i, ov.Tensor(out, shared_memory=True))
            direct.append(ok)
        request.infer()
        for i, (out, ok) in enumerate(zip(outputs, direct)):
            if not ok:
                np.copyto(out, request.get_output_tensor(i).data.reshape(out.shape), casting="unsafe")

    return run
