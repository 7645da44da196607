"""ONNX Runtime on the model exported as its framework's users export it (``torch.onnx.export``, torch
2.13's default exporter; ``jax2onnx.to_onnx`` for JAX models), CPU execution provider, all graph optimizations, ``threads`` intra-op threads: ``ort`` as ORT's users get it
(idle workers spin), ``ort-rt`` with the session options collage's runtime gives an ORT region (spinning
off), so that a ratio to the best peer does not credit a thread policy to placement."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from ...zoo import Framework
from . import Contender, Prepared, SetupContext

#: The ONNX opset both exporters are asked for (ORT 1.31 and OpenVINO 2026.4 read it whole).
OPSET = 18


def export_onnx(ctx: SetupContext) -> tuple[Path, list[np.ndarray]]:
    """The zoo model exported to ONNX in the work directory, and its inputs as numpy arrays."""
    from ... import zoo

    path = ctx.work_dir / f"{ctx.model}.onnx"
    if zoo.get(ctx.model).framework is Framework.JAX:
        import jax
        from jax2onnx import to_onnx

        fn, inputs = zoo.build(ctx.model, ctx.small)
        to_onnx(fn, [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs], opset=OPSET, return_mode="file",
                output_path=str(path))
        return path, [np.asarray(x) for x in inputs]
    import torch

    from ...frontends.torch import to_numpy

    torch.set_num_threads(ctx.threads)
    model, inputs = zoo.build(ctx.model, ctx.small)
    with torch.no_grad():
        torch.onnx.export(model, inputs, str(path), verbose=False)
    return path, [to_numpy(x) for x in inputs]


def setup(ctx: SetupContext, runtime_policy: bool = False) -> Prepared:
    import onnxruntime as ort
    from collage_runtime.engines import Engines

    path, inputs = export_onnx(ctx)
    if runtime_policy:
        opts = Engines(ctx.threads).ort_session_options()
    else:
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


CONTENDER = Contender("ort", "ONNX Runtime (torch.onnx.export or jax2onnx, all graph optimizations)", setup,
                      frameworks=frozenset(Framework))
RUNTIME_POLICY = Contender("ort-rt", "ONNX Runtime as `ort`, with collage's runtime's session options (no spinning)",
                           partial(setup, runtime_policy=True), frameworks=frozenset(Framework))
