"""Int8 zoo: each model exported to ONNX, quantized by ONNX Runtime's ``quantize_static`` (QDQ, per-channel
weights, int8 activations, calibrated on 8 seeded batches), then timed side by side, interleaved:

- peers on the source files: ONNX Runtime f32 and int8, OpenVINO f32 and int8 (each engine alone, 2 threads);
- collage programs of the int8 model: ``whole:ort``, ``whole:openvino``, IREE alone (``default``), and a
  tuned plan where ``--plan`` names one;
- collage programs of the f32 model (``--f32-plans``): by default ``whole:openvino-bf16`` where the CPU has
  bf16 (collage's bf16 against OpenVINO's own default).

Writes ``int8_zoo.json`` and ``int8_zoo.md`` beside this file (or ``--out``). Run from the repository root:

    python -m studies.int8.int8_zoo --models resnet50,mobilenet_v2 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from studies.common.timing import interleaved_ms

HERE = Path(__file__).parent


def isa() -> str:
    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    found = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8") if f in flags]
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")  # oneDNN's kernels (OpenVINO's, torch's) held to an older ISA
    return ("+".join(found) or platform.machine()) + (f" (oneDNN capped at {cap})" if cap else "")


def export(name: str, root: Path, exporter: str = "torchscript", exclude: tuple[str, ...] = (),
           suffix: str = "int8") -> tuple[Path, Path, np.ndarray]:
    """The zoo model ``name`` as f32 ONNX and quantized (QDQ, per-channel int8; ``exclude``: ONNX node names
    left in f32), with its example input."""
    import torch
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from collage_mlir import zoo

    model, inputs = zoo.build(name)
    f32, int8 = root / f"{name}.onnx", root / f"{name}.{suffix}.onnx"
    # TorchScript's export of BERT-base leaves its position ids' Expand dynamic; torch.export's is static.
    if not f32.exists():
        torch.onnx.export(model, inputs, str(f32), dynamo=exporter == "dynamo", input_names=["x"], opset_version=17)
    x = inputs[0].numpy()
    rng = np.random.default_rng(0)

    def sample() -> np.ndarray:  # token ids: a shuffle of the example's; floats: the example plus noise
        if x.dtype.kind in "iu":
            return rng.permutation(x.reshape(-1)).reshape(x.shape)
        return (x + 0.1 * rng.standard_normal(x.shape)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": sample()} for _ in range(8)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(str(f32), str(int8), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, nodes_to_exclude=list(exclude))
    return f32, int8, x


def runners(f32: Path, int8: Path, x: np.ndarray, root: Path, plans: list[str], f32_plans: list[str]) -> dict:
    import onnxruntime as ort
    import openvino as ov

    import collage_runtime
    from collage_mlir.frontends import load_model
    from collage_mlir.graph import Graph, number_ops
    from collage_mlir.ir import new_context
    from collage_mlir.iree import compile_module
    from collage_mlir.search import resolve_plan

    found = {}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    for label, path in (("ort f32", f32), ("ort int8", int8)):
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        found[label] = (lambda s: lambda: s.run(None, {"x": x}))(session)
    core = ov.Core()
    # OpenVINO runs an f32 model in bf16 by default where the CPU has bf16 (AVX-512 BF16, AMX): its f32 is
    # asked for; its default is a column of its own there.
    default = core.get_property("CPU", "INFERENCE_PRECISION_HINT")
    variants = [("openvino f32", f32, {"INFERENCE_PRECISION_HINT": "f32"})]
    if default != ov.Type.f32:
        variants.append((f"openvino {default.get_type_name()} (its default)", f32, {}))
    variants.append(("openvino int8", int8, {}))
    for label, path, precision in variants:
        try:
            compiled = core.compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "LATENCY",
                                                             **precision})
        except RuntimeError as exc:  # OpenVINO 2026.4 refuses QDQ BERT-base (its MultiplyPartialTransformation)
            print(f"{label}: {' '.join(str(exc).split())[:300]}", file=sys.stderr)
            continue
        request = compiled.create_infer_request()
        found[label] = (lambda r: lambda: r.infer([x]))(request)
    for source, plan in [(int8, p) for p in plans] + [(f32, p) for p in f32_plans]:
        module = load_model(source, new_context())
        number_ops(module)
        label = plan if source == int8 else f"{plan} (f32 file)"
        out = root / label.replace(":", "_").replace("/", "_").replace(" ", "_")
        try:
            compile_module(module, resolve_plan(plan, Graph(module)), out)
        except Exception as exc:  # noqa: BLE001  a plan that cannot build is reported, not fatal
            print(f"collage {label}: {' '.join(str(exc).split())[:200]}", file=sys.stderr)
            continue
        program = collage_runtime.load(out)
        found[f"collage {label}"] = (lambda p: lambda: p.invoke("main", x))(program)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,mobilenet_v2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--plans", default="whole:ort,whole:openvino,default",
                        help="collage plans of the int8 model (plan specs or plan JSON files)")
    parser.add_argument("--f32-plans", default=None,
                        help="collage plans of the f32 model (default: whole:openvino-bf16 where usable, else none)")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript",
                        help="torch.onnx.export's exporter (dynamo for BERT-base: static shapes)")
    parser.add_argument("--name", default="int8_zoo", help="result file name (NAME.json, NAME.md)")
    args = parser.parse_args(argv)
    if args.f32_plans is None:
        from collage_mlir.backends import registry

        args.f32_plans = "" if registry()["openvino-bf16"].problem else "whole:openvino-bf16"
    rows = []
    with tempfile.TemporaryDirectory(prefix="collage-int8-") as tmp:
        for name in args.models.split(","):
            root = Path(tmp) / name
            root.mkdir()
            f32, int8, x = export(name, root, args.exporter)
            found = runners(f32, int8, x, root, args.plans.split(","), [p for p in args.f32_plans.split(",") if p])
            times = interleaved_ms(found, args.rounds, min_time=0.3, warmup=2)
            rows.append({"model": name, "ms": times})
            print(name, {k: round(v, 2) for k, v in times.items()}, flush=True)
    record = {"command": "python -m studies.int8.int8_zoo " + " ".join(argv or sys.argv[1:]), "isa": isa(),
              "cpu": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d"), "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=1))
    labels = list(rows[0]["ms"]) if rows else []
    lines = [f"ISA {record['isa']}, {record['date']}, `{record['command']}`; median ms per call, 2 threads", "",
             "| model | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for row in rows:
        lines.append(f"| {row['model']} | " + " | ".join(f"{row['ms'].get(k, float('nan')):.2f}" for k in labels) + " |")
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
