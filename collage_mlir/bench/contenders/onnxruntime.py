"""ONNX Runtime on the model exported by ``torch.onnx.export`` (torch 2.13's default exporter), CPU
execution provider, all graph optimizations, ``threads`` intra-op threads."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import Contender, Prepared, SetupContext


def export_onnx(ctx: SetupContext) -> tuple[Path, list[np.ndarray]]:
    """The zoo model exported to ONNX in the work directory, and its inputs as numpy arrays."""
    import torch

    from ... import zoo

    torch.set_num_threads(ctx.threads)
    model, inputs = zoo.build(ctx.model, ctx.small)
    path = ctx.work_dir / f"{ctx.model}.onnx"
    with torch.no_grad():
        torch.onnx.export(model, inputs, str(path), verbose=False)
    return path, [x.numpy() for x in inputs]


def setup(ctx: SetupContext) -> Prepared:
    import onnxruntime as ort

    path, inputs = export_onnx(ctx)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = ctx.threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: x for i, x in zip(session.get_inputs(), inputs)}
    last = []

    def run():
        last[:] = session.run(None, feeds)

    return Prepared(run, lambda: list(last))


CONTENDER = Contender("ort", "ONNX Runtime (torch.onnx.export, all graph optimizations)", setup)
