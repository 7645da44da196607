"""OpenVINO's per-node counters on ONNX files of the JAX BERT-base (inputs: ids and mask), summed by node type
and kernel: where an engine's time goes in each ONNX form of the same model.

    python studies/jax_zoo/onnx_forms/profile_openvino.py jax2onnx.onnx collage_region.onnx

jax2onnx's file: ``collage_mlir.bench.contenders.onnxruntime.export_onnx`` writes it for the `ort` peer;
collage's: ``collage compile`` of the model with its whole-model OpenVINO plan, ``regions/region_0.openvino.onnx``.
"""
from __future__ import annotations

import collections
import sys
import time

import numpy as np
import openvino as ov

from collage_mlir import zoo

CONFIG = {"PERF_COUNT": "YES", "INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}


def profile(path: str, feeds: list, runs: int = 5) -> None:
    compiled = ov.Core().compile_model(ov.Core().read_model(path), "CPU", CONFIG)
    request = compiled.create_infer_request()
    inputs = dict(zip(compiled.inputs, feeds))
    for _ in range(2):
        request.infer(inputs)
    times, by_kind = [], collections.Counter()
    for _ in range(runs):
        t0 = time.perf_counter()
        request.infer(inputs)
        times.append(time.perf_counter() - t0)
        for node in request.profiling_info:
            by_kind[(node.node_type, node.exec_type)] += node.real_time.total_seconds() * 1e3 / runs
    print(f"{path}: median {1e3 * np.median(times):.1f} ms, nodes {sum(by_kind.values()):.1f} ms")
    for kind, ms in by_kind.most_common(14):
        print(f"  {kind}: {ms:.1f}")


if __name__ == "__main__":
    for path in sys.argv[1:]:
        profile(path, zoo.numpy_inputs("jax_bert_base"))
