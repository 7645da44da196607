"""ONNX Runtime's thread count in collage's sessions: the budget given (``intra_op_num_threads = 2``, as
``collage_runtime.engines`` does) against ``0`` (ORT picks one thread per physical core and pins its
workers), and the budget with its workers pinned one per processor (``session.intra_op_thread_affinities``),
each with collage's spinning settings, and ORT's own defaults (``0``, spinning on) as the user
runs a model. The kept-node study found collage's session 10 % slower than the defaults on a 1 MB CumProd.

Models: CumProd over x[B, 256] (B = 64, 1024: 64 KB and 1 MB), and MobileNetV2 (the zoo's, seeded, f32,
x[1, 3, 224, 224]) as a whole model. Each session runs alone (the program's sole engine: spinning in a
run, stopped after it) and beside a one-op OpenVINO model called after each run (spinning off, as beside
other regions: OpenVINO's TBB workers linger 1 ms). Interleaved rounds in one process, median ms per call.

    python -m studies.kept_nodes.ort_threads --rounds 9    # writes studies/kept_nodes/ort_threads.{json,md}
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from studies.common.report import header, write_report
from studies.common.timing import interleaved_ms
from studies.kept_nodes.kept import cumprod_alone

THREADS = 2


def _options(threads: int, spin: bool, pinned: bool = False):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    opts.add_session_config_entry("session.force_spinning_stop", "1" if spin else "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if pinned:  # worker k on the (k+1)-th usable processor (ORT numbers processors from 1)
        cpus = sorted(os.sched_getaffinity(0))
        opts.add_session_config_entry("session.intra_op_thread_affinities",
                                      ";".join(str(c + 1) for c in cpus[1:threads]))
    return opts


def mobilenet_onnx(path: Path) -> Path:
    import torch

    from collage_mlir import zoo

    model, inputs = zoo.build("mobilenet_v2")
    torch.onnx.export(model, inputs, str(path), dynamo=False, input_names=["x"], output_names=["y"],
                      opset_version=17)
    return path


def _openvino_neighbour():
    """A one-op OpenVINO model (tanh over 4 KB) called after each run: another engine's workers."""
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter([4, 256], np.float32, name="x")
    compiled = ov.Core().compile_model(ov.Model([ops.tanh(x)], [x]), "CPU", {"INFERENCE_NUM_THREADS": THREADS})
    request = compiled.create_infer_request()
    z = np.ones((4, 256), np.float32)
    return lambda: request.infer({0: z})


def study(tmp: Path, rounds: int) -> dict:
    import onnxruntime as ort

    models = {f"CumProd {b}x256": (cumprod_alone(tmp / f"c{b}.onnx", b),
                                   (1 + np.random.default_rng(1).standard_normal((b, 256)) * 1e-3).astype(np.float32))
              for b in (64, 1024)}
    models["MobileNetV2"] = (mobilenet_onnx(tmp / "mobilenet.onnx"),
                             np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32))
    neighbour = _openvino_neighbour()
    configs = {"ORT defaults": None}
    for threads, pinned in ((THREADS, False), (0, False), (THREADS, True)):
        name = f"threads={threads}{', workers pinned' if pinned else ''}"
        configs[f"{name}, sole (spin, stop)"] = _options(threads, True, pinned)
        configs[f"{name}, beside OpenVINO (no spin)"] = _options(threads, False, pinned)
    result = {}
    for model, (path, x) in models.items():
        # Each configuration gets two sessions, created in two passes over the list: the session created
        # second in a process ran 10 % slower than the others whatever its options (1 MB CumProd, MobileNetV2;
        # placement, not options), so one session per configuration ranks them by creation order.
        runners = {}
        for copy in (0, 1):
            for label, opts in configs.items():
                session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
                run = (lambda s: lambda: s.run(None, {"x": x}))(session)
                if "beside" in label:
                    run = (lambda r: lambda: (r(), neighbour()))(run)
                runners[f"{label}#{copy}"] = run
        runners["OpenVINO neighbour alone"] = neighbour
        ms = interleaved_ms(runners, rounds)
        result[model] = {label: {"copies": [ms[f"{label}#0"], ms[f"{label}#1"]],
                                 "ms": min(ms[f"{label}#0"], ms[f"{label}#1"])} for label in configs}
        result[model]["OpenVINO neighbour alone"] = {"copies": [], "ms": ms["OpenVINO neighbour alone"]}
    return result


def markdown(result: dict) -> str:
    models = list(result["ms"])
    configs = list(result["ms"][models[0]])
    lines = [f"# ONNX Runtime's thread count in collage's sessions ({result['device']})", "",
             f"`{result['command']}`", "", "| session | " + " | ".join(models) + " |",
             "|---|" + "---:|" * len(models)]
    for c in configs:
        lines.append(f"| {c} | " + " | ".join(f"{result['ms'][m][c]['ms']:.4f}" for m in models) + " |")
    lines += ["", "Each configuration's faster of two sessions (created in two passes); both copies: see the JSON."]
    return "\n".join(lines + [""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", default=str(Path(__file__).parent))
    parser.add_argument("--name", default="ort_threads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="collage-ort-threads-") as tmp:
        result = {**header("ort_threads"), "ms": study(Path(tmp), args.rounds)}
    write_report(args.out, args.name, result, markdown(result))


if __name__ == "__main__":
    main()
