"""Dynamic zoo: models exported to ONNX with dynamic axes, served over a range of shapes.

For each model, one collage artifact of shape buckets (``collage compile --dim ... --plan PLAN``, the
fallback engine chosen by timing) against the peers that take the dynamic model as it is:

- per shape (every bucket, and shapes between buckets): collage; the static best (a collage artifact
  compiled for exactly that shape with the same plan); ONNX Runtime and OpenVINO on the dynamic model;
  OpenVINO compiled for that shape (``reshape``); the PyTorch model under ``torch.compile(dynamic=True)``;
- a seeded request trace: total time of collage (nothing compiles), ORT and OpenVINO dynamic, OpenVINO
  reshaped per new shape with its compile time counted, and ``torch.compile(dynamic=True)`` (its compile
  counted in the first pass);
- collage's compile time and artifact size.

Times are medians of interleaved rounds, 2 threads each. Writes ``dynamic_zoo.json``/``.md`` beside this
file (or ``--out``). Run from the repository root:

    python -m studies.dynamic.dynamic_zoo --models resnet50,bert,bert-trace --rounds 3
    python -m studies.dynamic.dynamic_zoo --models gpt2 --rounds 3 --name dynamic_zoo_gpt2

``bert-trace`` serves a skewed trace (most requests at four shapes) with buckets chosen for it
(``--shapes``); the other cases have fixed buckets and a uniform trace.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from studies.common.report import header, write_report
from collage_mlir.bench import round_order
from studies.common.timing import interleaved_ms

HERE = Path(__file__).parent
THREADS = 2
#: Passes over the trace after the first (each runner meets each shape for the first time in the first), the
#: median reported.
STEADY_PASSES = 2
#: Compiled shapes the "OpenVINO reshaped per shape" peer keeps (least recently used dropped).
OV_KEPT = 8


@dataclass(frozen=True)
class Case:
    """A model, its dynamic axes, the collage flags that declare them, and the shapes measured."""

    name: str
    dims: tuple[str, ...]     # --dim
    buckets: tuple[str, ...]  # --bucket
    pad: tuple[str, ...]      # --pad
    shapes: tuple[dict, ...]  # the dims' values measured one by one
    trace: tuple[dict, ...]   # the request trace's dims values

    def flags(self) -> list[str]:
        return [*(a for d in self.dims for a in ("--dim", d)), *(a for b in self.buckets for a in ("--bucket", b)),
                *(a for p in self.pad for a in ("--pad", p))]


def _trace(rng: np.random.Generator, n: int, **choices) -> tuple[dict, ...]:
    return tuple({k: int(rng.choice(v)) for k, v in choices.items()} for _ in range(n))


def _skewed(rng: np.random.Generator, n: int) -> tuple[dict, ...]:
    common = [{"batch": 1, "seq": 32}, {"batch": 1, "seq": 64}, {"batch": 1, "seq": 128}, {"batch": 4, "seq": 128}]
    out = []
    for _ in range(n):
        if rng.random() < 0.7:
            out.append(dict(common[int(rng.choice(4, p=[0.3, 0.3, 0.25, 0.15]))]))
        else:
            out.append({"batch": int(rng.choice((1, 2, 4))), "seq": int(rng.integers(8, 129))})
    return tuple(out)


def cases(n_trace: int) -> dict[str, Case]:
    rng = np.random.default_rng(0)
    return {
        "resnet50": Case("resnet50", ("batch=1:4:8",), ("batch=1,2,4,8",), (),
                         tuple({"batch": b} for b in (1, 3, 4, 6, 8)), _trace(rng, n_trace, batch=range(1, 9))),
        "bert": Case("bert", ("batch=1:1:4", "seq=8:64:128"), ("batch=1,4", "seq=16,64,128"), (),
                     tuple({"batch": b, "seq": s} for b, s in ((1, 16), (1, 64), (1, 40), (4, 128), (2, 100))),
                     _trace(rng, n_trace, batch=(1, 1, 1, 2, 4), seq=range(8, 129))),
        # A serving trace: most requests at a few lengths (a fixed prompt template, clients padding to a
        # multiple of 32), the rest anywhere; collage's buckets chosen for it (--shapes).
        "bert-trace": Case("bert", ("batch=1:1:4", "seq=8:64:128"), (), (),
                           tuple({"batch": b, "seq": s} for b, s in ((1, 32), (1, 64), (1, 40), (4, 128))),
                           _skewed(rng, n_trace)),
        # GPT-2 prefill: one prompt of 8-256 tokens.
        "gpt2": Case("gpt2", ("seq=8:64:256",), ("seq=8,32,64,128,256",), (),
                     tuple({"seq": s} for s in (8, 64, 40, 200, 256)), _trace(rng, n_trace, seq=range(8, 257))),
    }


#: The zoo model of each case's model.
ZOO = {"resnet50": "resnet50", "bert": "bert_base", "gpt2": "gpt2_small"}


def export(name: str, root: Path) -> Path:
    """The zoo model as ONNX with its first axis (and a token model's second) dynamic; GPT-2 (one prompt)
    with its sequence axis dynamic, through torch.export's exporter (TorchScript's fails on transformers'
    GPT-2)."""
    import torch

    from collage_mlir import zoo

    model, inputs = zoo.build(ZOO[name])
    path = root / f"{name}.onnx"
    if name == "gpt2":
        torch.onnx.export(model, inputs, str(path), dynamo=True, input_names=["x"], output_names=["y"],
                          dynamic_shapes=({1: torch.export.Dim("seq", min=8, max=256)},))
        return path
    axes = {0: "batch"} if inputs[0].dtype.is_floating_point else {0: "batch", 1: "seq"}
    torch.onnx.export(model, inputs, str(path), dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": axes, "y": {0: "batch"}}, opset_version=17)
    return path


def example(name: str, values: dict, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if name == "bert":
        return rng.integers(0, 30000, (values["batch"], values["seq"]), dtype=np.int64)
    if name == "gpt2":
        return rng.integers(0, 50257, (1, values["seq"]), dtype=np.int64)
    return rng.standard_normal((values["batch"], 3, 224, 224)).astype(np.float32)


def torch_dynamic(name: str, fresh: bool = False):
    """The zoo model under ``torch.compile(dynamic=True)`` (Inductor): a call on a numpy array; Inductor's
    compile happens on the first call (and on any recompile); ``fresh``: dynamo's caches cleared first."""
    import torch

    from collage_mlir import zoo

    torch.set_num_threads(THREADS)
    if fresh:
        torch._dynamo.reset()
    compiled = torch.compile(zoo.build(ZOO[name])[0].eval(), dynamic=True)

    def call(x: np.ndarray):
        with torch.no_grad():
            return compiled(torch.from_numpy(x))

    return call


def run_case(title: str, case: Case, root: Path, plan: str, rounds: int, precision: str = "f32") -> dict:
    import onnxruntime as ort
    import openvino as ov

    import collage_runtime
    from collage_mlir.frontends.dims import ShapeTrace
    from collage_mlir.tools.cli import main as collage

    f32_model = model = export(case.name, root)
    art = root / "art"
    flags = case.flags()
    precision_flags: list[str] = []
    ov_precision = precision
    if precision == "int8":
        # Calibrated on 16 samples at the OPT shape; the peers run the int8 model collage compiles (the same scales:
        # ORT's quantizer, its pairs on scalar constants folded, without which OpenVINO cannot compile BERT's).
        from collage_mlir.frontends.dims import parse_dim
        from collage_mlir.frontends.onnx_calibrate import Calibration, quantize_onnx

        opt = {r.name: r.opt for r in map(parse_dim, case.dims)}
        np.save(root / "calib.npy", np.concatenate([example(case.name, opt | ({"batch": 1} if "batch" in opt else {}),
                                                            seed=100 + k) for k in range(16)]))
        precision_flags = ["--precision", "int8", "--calibrate", str(root / "calib.npy")]
        model = quantize_onnx(f32_model, Calibration(root / "calib.npy"))[0]
        ov_precision = "f32"  # its int8 ops in int8, the rest in f32
    elif precision == "bf16":  # bf16 allowed: the fallback may be OpenVINO in bf16
        precision_flags = ["--precision", "bf16"]
    if not case.buckets:  # chosen for the trace
        (root / "trace.json").write_text(json.dumps(ShapeTrace(case.trace).to_json()))
        flags += ["--shapes", str(root / "trace.json"), "--max-buckets", "6"]
    start = time.perf_counter()
    if collage(["compile", str(f32_model), *flags, *precision_flags, "--plan", plan, "-o", str(art)]) != 0:
        raise SystemExit(f"{case.name}: collage compile failed")
    compile_s = time.perf_counter() - start
    size = sum(p.stat().st_size for p in art.rglob("*") if p.is_file())
    program = collage_runtime.load(art, threads=THREADS)
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    core = ov.Core()
    # OpenVINO in the precision compared: f32 stated, or bf16 (its own default where the CPU has it).
    config = {"INFERENCE_NUM_THREADS": THREADS, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": ov_precision}
    ov_dynamic = core.compile_model(str(model), "CPU", config).create_infer_request()
    ov_static: OrderedDict[tuple, object] = OrderedDict()
    inductor = torch_dynamic(case.name)

    def ov_for(x: np.ndarray):
        """OpenVINO compiled for x's shape (reshaped), compiled on first use and kept in an LRU of
        ``OV_KEPT`` (each compiled BERT-base holds its own 420 MB of weights: 40 shapes do not fit in
        24 GiB); (request, compile seconds)."""
        if x.shape not in ov_static:
            t = time.perf_counter()
            m = core.read_model(str(model))
            m.reshape({"x": list(x.shape)})
            ov_static[x.shape] = (core.compile_model(m, "CPU", config).create_infer_request(), time.perf_counter() - t)
            while len(ov_static) > OV_KEPT:
                ov_static.popitem(last=False)
        ov_static.move_to_end(x.shape)
        return ov_static[x.shape]

    rows = []
    for values in case.shapes:
        x = example(case.name, values)
        static = root / f"static-{'-'.join(map(str, values.values()))}"
        np.save(root / "x.npy", x)
        # In int8, the int8 model itself (the buckets' scales) compiled for the shape.
        if collage(["compile", str(model), "--input", str(root / "x.npy"), "--plan", plan, "-o", str(static)]) != 0:
            raise SystemExit(f"{case.name} at {values}: static compile failed")
        static_program = collage_runtime.load(static, threads=THREADS)
        request, _ = ov_for(x)
        runners = {"collage": lambda: program.invoke("main", x), "static best": lambda: static_program.invoke("main", x),
                   "ort dynamic": lambda: session.run(None, {"x": x}), "openvino dynamic": lambda: ov_dynamic.infer([x]),
                   "openvino static": lambda r=request: r.infer([x]),
                   "torch.compile dynamic": lambda: inductor(x)}
        ms = interleaved_ms(runners, rounds)
        rows.append({"dims": values, "served": program.served(x), "ms": ms})
        print(case.name, values, program.served(x), {k: round(v, 2) for k, v in ms.items()}, flush=True)
        static_program.close()
    # The trace, in order, 1 + STEADY_PASSES times: the first pass meets each shape for the first time (OpenVINO
    # reshaped compiles each new shape then, counted; the dynamic engines plan their memory for it), the others
    # are the steady state. Passes alternate between the runners.
    requests = [example(case.name, v, seed=k) for k, v in enumerate(case.trace)]
    ov_static.clear()
    inductor = torch_dynamic(case.name, fresh=True)  # its compile in the first pass, as OpenVINO's reshapes
    runners = {"collage": lambda x: program.invoke("main", x), "ort dynamic": lambda x: session.run(None, {"x": x}),
               "openvino dynamic": lambda x: ov_dynamic.infer([x]),
               f"openvino reshaped per shape (LRU {OV_KEPT})": lambda x: ov_for(x)[0].infer([x]),
               "torch.compile dynamic": inductor}
    totals: dict[str, list[float]] = {k: [] for k in runners}
    for p in range(1 + STEADY_PASSES):
        for label in round_order(runners, p):  # no runner always right after Inductor's threads
            call, t = runners[label], time.perf_counter()
            for x in requests:
                call(x)
            totals[label].append(time.perf_counter() - t)
    print(case.name, "trace s (first pass, steady passes)", {k: [round(v, 2) for v in t] for k, t in totals.items()},
          flush=True)
    program.close()
    shown = [f if f != str(root / "trace.json") else "trace.json" for f in flags]
    return {"model": title, "plan": plan, "flags": shown, "buckets": [dict(b.values) for b in program.table.buckets], "compile_s": compile_s, "artifact_bytes": size,
            "fallback": program.table.fallback.value, "shapes": rows, "trace_first_s": {k: t[0] for k, t in totals.items()},
            "trace_s": {k: statistics.median(t[1:]) for k, t in totals.items()}, "trace": list(case.trace)}


def markdown(result: dict) -> str:
    lines = [f"{result['device']}, {result['date']}, `{result['command']}`; median ms per call, {THREADS} threads", ""]
    for r in result["rows"]:
        buckets = "; ".join(",".join(f"{k}={v}" for k, v in b.items()) for b in r["buckets"])
        lines += [f"### {r['model']} (`{' '.join(r['flags'])} --plan {r['plan']}`; buckets {buckets}; fallback "
                  f"{r['fallback']}; compile {r['compile_s']:.0f} s, artifact {r['artifact_bytes'] / 2**20:.1f} MiB)", ""]
        labels = list(r["shapes"][0]["ms"])
        lines += ["| dims | served | " + " | ".join(labels) + " | collage / static |", "|---|---|" + "---|" * (len(labels) + 1)]
        for s in r["shapes"]:
            dims = ", ".join(f"{k}={v}" for k, v in s["dims"].items())
            lines.append(f"| {dims} | {s['served']} | " + " | ".join(f"{s['ms'][k]:.2f}" for k in labels)
                         + f" | {s['ms']['collage'] / s['ms']['static best']:.2f} |")
        best_peer = min(v for k, v in r["trace_s"].items() if k != "collage")
        first = r["trace_first_s"]
        lines += ["", f"Trace of {len(r['trace'])} requests, total s (steady: median of {STEADY_PASSES} passes; first pass): "
                  + ", ".join(f"{k} {v:.2f} ({first[k]:.2f})" for k, v in r["trace_s"].items())
                  + f"; collage's steady throughput {best_peer / r['trace_s']['collage']:.2f}x the best peer's", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--plan", default="whole:openvino", help="the plan of every bucket and static artifact")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trace", type=int, default=40, help="requests in the trace")
    parser.add_argument("--precision", choices=("f32", "bf16", "int8"), default="f32",
                        help="bf16: OpenVINO's peers in bf16 (its default on a CPU with bf16), collage compiled with "
                             "--precision bf16 (give --plan whole:openvino-bf16); int8: collage compiled with "
                             "--precision int8 --calibrate (16 samples at the OPT shape), ORT and OpenVINO on the same "
                             "int8 model; ORT and Inductor stay f32 in bf16, Inductor in int8")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--name", default="dynamic_zoo", help="the result files' name")
    args = parser.parse_args(argv)
    all_cases = cases(args.trace)
    result = header(args.name) | {"date": time.strftime("%Y-%m-%d"), "rows": []}
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix=f"collage-dyn-{name}-") as tmp:
            result["rows"].append(run_case(name, all_cases[name], Path(tmp), args.plan, args.rounds, args.precision))
        write_report(args.out, args.name, result, markdown(result))  # after each model: nothing lost
    return 0


if __name__ == "__main__":
    sys.exit(main())
