"""OpenVINO's CPU plugin on the same ONNX export as ONNX Runtime: f32 inference precision stated (the
CPU may support bf16, which OpenVINO would otherwise pick), latency hint, one stream, ``threads`` threads:
``openvino`` with OpenVINO's defaults otherwise (threads pinned to cores), ``openvino-rt`` with the
properties collage's runtime gives an OpenVINO region (no pinning or reservation)."""

from __future__ import annotations

from functools import partial

from ...zoo import Framework
from . import Contender, Prepared, SetupContext
from .onnxruntime import export_onnx


def setup(ctx: SetupContext, runtime_policy: bool = False) -> Prepared:
    from collage_runtime.engines import Engines
    from collage_runtime.telemetry import disable_engine_telemetry

    disable_engine_telemetry()  # before openvino's first import, as the runtime does
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints

    path, inputs = export_onnx(ctx)
    core = ov.Core()
    config = Engines(ctx.threads).openvino_config() if runtime_policy else {
        props.inference_num_threads: ctx.threads, props.num_streams: 1,
        hints.performance_mode: hints.PerformanceMode.LATENCY, hints.inference_precision: ov.Type.f32}
    compiled = core.compile_model(str(path), "CPU", config)
    request = compiled.create_infer_request()

    return Prepared(lambda: request.infer(inputs),
                    lambda: [request.get_output_tensor(k).data.copy() for k in range(len(compiled.outputs))])


CONTENDER = Contender("openvino", "OpenVINO (same ONNX, f32 precision hint)", setup, frameworks=frozenset(Framework))
RUNTIME_POLICY = Contender("openvino-rt", "OpenVINO as `openvino`, with collage's runtime's properties (no pinning)",
                           partial(setup, runtime_policy=True), frameworks=frozenset(Framework))
