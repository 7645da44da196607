"""What an ONNX node kept as ONNX costs (issue: "the opaque path costs no more than ORT running that
subgraph alone, plus one boundary"; "a model with one unimportable node runs at the speed of its best plan
for the rest, not at ORT-whole speed").

Two studies, each timed interleaved in one process (``studies.common.timing``, median ms per call of
rounds of at least 0.2 s):

- ``alone``: ``CumProd`` (torch-mlir cannot lower it) over x[B, 256], B = 4, 64, 1024 (4 KB ... 1 MB). The
  collage program holds nothing but the kept node. ``ort``: ONNX Runtime on the one-node model as its users
  run it (``InferenceSession(path)`` and ``run``); ``ort (collage's options)``: the session options collage's
  executor gives a program's only region. ``collage - ort``: what the opaque path adds, against the
  boundary's figure (studies/boundary: 4-17 µs for ``ort``, 1 KB to 256 KB).
- ``model``: an MLP block x[64, 512] → MatMul+bias → Tanh → CumProd (kept) → MatMul+bias → Relu, and the
  same block with ``Identity`` in CumProd's place (the rest alone). Each compiled under ``default`` (IREE,
  the kept node on ONNX Runtime), ``prefer:ort``, ``prefer:openvino`` and, with ``--tune S``, the plan ``collage tune`` finds in S
  seconds; ONNX Runtime on the whole model. The claim holds when the best collage plan with the kept node
  is the rest's best plan plus about the kept node's cost. ``--model cnn``: two 3x3 convolutions x[1, 32,
  28, 28] around CumProd over the width instead (a block whose best engine is not ONNX Runtime).

    python -m studies.kept_nodes.kept [--rounds 7] [--tune 60] [--model mlp|cnn] [--no-alone] [--name kept]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from studies.common.report import header, write_report
from studies.common.timing import interleaved_ms

OPSET = 26  # CumProd's first opset
ENGINE = "ort (collage's options)"


def _save(path: Path, nodes, x_shape, y_shape, initializers=()) -> Path:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                              initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def cumprod_alone(path: Path, rows: int, op: str = "CumProd") -> Path:
    """CumProd over x[rows, 256] along its rows, or (``op="Identity"``) the program that only hands x on."""
    from onnx import helper, numpy_helper

    if op == "Identity":
        return _save(path, [helper.make_node("Identity", ["x"], ["y"])], [rows, 256], [rows, 256])
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    return _save(path, [helper.make_node("CumProd", ["x", "axis"], ["y"])], [rows, 256], [rows, 256], [axis])


def mlp_block(path: Path, kept: bool, n: int = 64, d: int = 512) -> Path:
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(d).astype(np.float32) * 0.1, "b1"),
             numpy_helper.from_array((rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(d).astype(np.float32) * 0.1, "b2"),
             numpy_helper.from_array(np.array(1, np.int64), "axis")]
    middle = helper.make_node("CumProd", ["t", "axis"], ["c"]) if kept else helper.make_node("Identity", ["t"], ["c"])
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Tanh", ["hb"], ["t"]), middle,
             helper.make_node("MatMul", ["c", "w2"], ["o"]), helper.make_node("Add", ["o", "b2"], ["ob"]),
             helper.make_node("Relu", ["ob"], ["y"])]
    return _save(path, nodes, [n, d], [n, d], inits)


def cnn_block(path: Path, kept: bool, c: int = 32, hw: int = 28) -> Path:
    """x[1, c, hw, hw] → Conv 3x3 + bias → Relu → CumProd over the width (kept) → Conv 3x3 + bias → Relu:
    convolutions, where ONNX Runtime is not the fastest engine on this CPU, around the kept node."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32) * 0.1, "b1"),
             numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32) * 0.1, "b2"),
             numpy_helper.from_array(np.array(3, np.int64), "axis")]
    # Values near 1 keep the running product finite: 1 + relu/16.
    middle = helper.make_node("CumProd", ["g", "axis"], ["c"]) if kept else helper.make_node("Identity", ["g"], ["c"])
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Mul", ["r", "sixteenth"], ["s"]), helper.make_node("Add", ["s", "one"], ["g"]),
             middle,
             helper.make_node("Conv", ["c", "w2", "b2"], ["o"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["o"], ["y"])]
    inits += [numpy_helper.from_array(np.array(1 / 16, np.float32), "sixteenth"),
              numpy_helper.from_array(np.array(1, np.float32), "one")]
    return _save(path, nodes, [1, c, hw, hw], [1, c, hw, hw], inits)


def bert_block(path: Path, kept: bool, layers: int = 4, seq: int = 128) -> Path:
    """Hugging Face ``BertModel`` (hidden 768, 12 heads, ``layers`` layers, seeded weights) over token ids
    x[1, seq], exported as its users export it (``torch.onnx.export``, opset 17) and converted to opset 26;
    with ``kept``, CumProd over the batch axis (length 1: the identity) after the middle layer's output
    LayerNorm. ONNX Runtime is not this model's fastest engine here (BERT-base: OpenVINO 53 ms, ORT 67,
    docs/benchmarks.md), so the rest's best plan is not ONNX Runtime whole."""
    import onnx
    import torch
    from onnx import helper, numpy_helper, version_converter

    from collage_mlir.zoo.transformer import bert

    torch.manual_seed(0)
    exported = path.with_suffix(".torch.onnx")
    torch.onnx.export(bert(layers=layers).eval(), (torch.zeros((1, seq), dtype=torch.int64),), str(exported),
                      dynamo=False, input_names=["x"], output_names=["y"], opset_version=17)
    model = version_converter.convert_version(onnx.load(str(exported)), OPSET)
    model.ir_version = 10
    if kept:
        cut = f"/model/encoder/layer.{layers // 2 - 1}/output/LayerNorm/LayerNormalization"
        (node,) = [n for n in model.graph.node if n.name == cut]
        hidden = node.output[0]
        for other in model.graph.node:
            other.input[:] = [f"{hidden}_kept" if i == hidden else i for i in other.input]
        model.graph.initializer.append(numpy_helper.from_array(np.array(0, np.int64), "kept_axis"))
        at = list(model.graph.node).index(node) + 1
        model.graph.node.insert(at, helper.make_node("CumProd", [hidden, "kept_axis"], [f"{hidden}_kept"],
                                                     name="kept/CumProd"))
    onnx.save(model, str(path))
    return path


def _floats(shape):
    return lambda: np.random.default_rng(2).standard_normal(shape).astype(np.float32)


#: The blocks ``--model`` names: the builder and its input's maker.
BLOCKS = {"mlp": (mlp_block, _floats((64, 512))), "cnn": (cnn_block, _floats((1, 32, 28, 28))),
          "bert": (bert_block, lambda: np.random.default_rng(2).integers(0, 30522, (1, 128), dtype=np.int64))}


def _ort(path: Path, collage_options: bool):
    import onnxruntime as ort
    from collage_runtime.engines import Engines

    options = Engines(threads=2, sole="ort").ort_session_options() if collage_options else None
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _collage(path: Path, plan: str, out: Path, x: np.ndarray, stack) -> tuple:
    import collage_runtime
    from collage_mlir.iree import compile_file

    manifest = compile_file(path, output_dir=out, plan=plan)
    program = stack.enter_context(collage_runtime.load(out))
    regions = [(r.name, r.backend) for r in manifest.regions]
    return (lambda: program.invoke("main", x)), regions


def study_alone(tmp: Path, rounds: int, stack) -> list[dict]:
    rows = []
    for b in (4, 64, 1024):
        path = cumprod_alone(tmp / f"cumprod{b}.onnx", b)
        x = (1 + np.random.default_rng(1).standard_normal((b, 256)).astype(np.float32) * 1e-3)
        run, regions = _collage(path, "default", tmp / f"alone{b}", x, stack)
        floor, _ = _collage(cumprod_alone(tmp / f"identity{b}.onnx", b, "Identity"), "default", tmp / f"id{b}", x, stack)
        user, engine = _ort(path, False), _ort(path, True)
        np.testing.assert_allclose(run()[0], user.run(None, {"x": x})[0], rtol=1e-6)
        ms = interleaved_ms({"ort": lambda: user.run(None, {"x": x}),
                             ENGINE: lambda: engine.run(None, {"x": x}),
                             "collage": run, "collage, Identity": floor}, rounds)
        rows.append({"rows": b, "kb": b * 256 * 4 // 1024, "regions": regions, **ms})
    return rows


def _tuned(path: Path, x: np.ndarray, budget: int, tmp: Path) -> str:
    """``collage tune`` of the model at ``path`` (its own cost DB): the plan file."""
    import subprocess
    import sys

    np.save(tmp / "x.npy", x)
    plan = path.with_suffix(".plan.json")
    subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", "tune", str(path), "--input", str(tmp / "x.npy"),
                    "--backends", TUNED_BACKENDS, "--budget", f"{budget}s", "--db", str(tmp / "costs.sqlite"),
                    "-o", str(plan)], check=True, capture_output=True)
    return str(plan)


#: The backends ``--tune`` searches over.
TUNED_BACKENDS = "iree-cpu,iree-cpu-dt,ort,openvino"


def study_model(tmp: Path, rounds: int, stack, tune: int = 0, model: str = "mlp") -> dict:
    block, make_input = BLOCKS[model]
    x = make_input()
    runners, regions = {}, {}
    for kept in (True, False):
        path = block(tmp / f"{model}_{'kept' if kept else 'rest'}.onnx", kept)
        label = "with CumProd" if kept else "rest (Identity)"
        session = _ort(path, False)
        runners[f"ort whole, {label}"] = (lambda s: lambda: s.run(None, {"x": x}))(session)
        plans = {"default": "default", "prefer:ort": "prefer:ort", "prefer:openvino": "prefer:openvino"}
        if tune:
            plans["tuned"] = _tuned(path, x, tune, tmp)
        for name, plan in plans.items():
            run, regions[f"{name}, {label}"] = _collage(path, plan, tmp / f"{name.replace(':', '_')}_{kept}", x, stack)
            if kept:
                np.testing.assert_allclose(run()[0], session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
            runners[f"collage {name}, {label}"] = run
    return {"ms": interleaved_ms(runners, rounds), "regions": regions}


def markdown(result: dict) -> str:
    lines = [f"# Kept ONNX nodes: cost ({result['device']})", "", f"`{result['command']}`", ""]
    if result["alone"]:
        lines += ["## CumProd alone (ms per call)", "",
                  "| x | ort | ort (collage's options) | collage | collage, Identity | collage - ort (µs) | "
                  "collage - Identity - ort (µs) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["alone"]:
        ort_ms = min(r["ort"], r[ENGINE])
        lines.append(f"| {r['rows']}x256 ({r['kb']} KB) | {r['ort']:.4f} | {r[ENGINE]:.4f} | {r['collage']:.4f} | "
                     f"{r['collage, Identity']:.4f} | {(r['collage'] - ort_ms) * 1e3:.1f} | "
                     f"{(r['collage'] - r['collage, Identity'] - ort_ms) * 1e3:.1f} |")
    model = result.get("block", "mlp")
    lines += ["", f"## {model.upper()} block x{list(BLOCKS[model][1]().shape)} with one kept node (ms per call)", "",
              "| runner | ms |", "|---|---:|"]
    for k, v in result["model"]["ms"].items():
        lines.append(f"| {k} | {v:.4f} |")
    lines += ["", "Regions: " + "; ".join(f"{k}: {v}" for k, v in result["model"]["regions"].items()), ""]
    return "\n".join(lines)


def main() -> None:
    from contextlib import ExitStack

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=str(Path(__file__).parent))
    parser.add_argument("--tune", type=int, default=0, metavar="SECONDS",
                        help=f"also time plans `collage tune --budget SECONDS` found (over {TUNED_BACKENDS})")
    parser.add_argument("--model", choices=sorted(BLOCKS), default="mlp", help="the block around the kept node")
    parser.add_argument("--no-alone", action="store_true", help="skip the CumProd-alone study")
    parser.add_argument("--name", default="kept", help="report file name (NAME.json, NAME.md)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="collage-kept-") as tmp, ExitStack() as stack:
        result = {**header("kept_nodes"), "block": args.model,
                  "alone": [] if args.no_alone else study_alone(Path(tmp), args.rounds, stack),
                  "model": study_model(Path(tmp), args.rounds, stack, args.tune, args.model)}
    write_report(args.out, args.name, result, markdown(result))


if __name__ == "__main__":
    main()
