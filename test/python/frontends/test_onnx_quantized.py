"""Quantized ONNX models in, as ONNX Runtime's quantizer writes them: a CNN trained here on scikit-learn's
digits, quantized by ``onnxruntime.quantization.quantize_static`` in QDQ form (per tensor, per channel,
uint8 activations) and in QOperator form (``QLinearConv``, ``QLinearGlobalAveragePool``, ``QGemm``).

Each runs through collage on IREE alone, ONNX Runtime and OpenVINO. ONNX Runtime's program equals ONNX
Runtime on the source file exactly; IREE and OpenVINO agree with it within the peers' mutual agreement
(OpenVINO on the source file against ONNX Runtime). ONNX Runtime fuses the translated graph into its int8 kernels as it fuses its
own model (``QLinearConv``, ``QGemm``: read from its optimized graph). Accuracy on held-out digits is the
quantized model's."""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("sklearn")
torch = pytest.importorskip("torch")

import collage_runtime  # noqa: E402
from collage_mlir.dialects import collage  # noqa: E402
from collage_mlir.frontends import load_model  # noqa: E402
from collage_mlir.graph import Graph, number_ops  # noqa: E402
from collage_mlir.ir import new_context  # noqa: E402
from collage_mlir.iree import compile_module  # noqa: E402
from collage_mlir.search import resolve_plan  # noqa: E402

from models import digits_cnn  # noqa: E402

FORMS = {
    "qdq": dict(quant_format="QDQ"),
    "qdq-per-channel": dict(quant_format="QDQ", per_channel=True),
    "qdq-uint8": dict(quant_format="QDQ", activation_type="QUInt8", weight_type="QUInt8"),
    "qoperator-per-channel": dict(quant_format="QOperator", per_channel=True),
}


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """(directory with ``f32.onnx`` and ``dynamic.onnx`` (its batch a dim), held-out images, labels,
    calibration images): ``models.digits_cnn``."""
    model, x, y = digits_cnn()
    root = tmp_path_factory.mktemp("digits")
    held_x, held_y = x[1400:1784], y[1400:1784]  # 384 images, batch 64
    torch.onnx.export(model, torch.tensor(x[:64]), str(root / "f32.onnx"), dynamo=False, input_names=["x"],
                      opset_version=17)
    torch.onnx.export(model, torch.tensor(x[:8]), str(root / "dynamic.onnx"), dynamo=False, input_names=["x"],
                      opset_version=17, dynamic_axes={"x": {0: "batch"}})
    return root, held_x, held_y, x[:256]


def _quantized(digits, form: str):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    root, _, _, calibration = digits
    path = root / f"{form}.onnx"
    if not path.exists():
        class Reader(CalibrationDataReader):
            def __init__(self):
                self.batches = iter([{"x": calibration[i:i + 64]} for i in range(0, len(calibration), 64)])

            def get_next(self):
                return next(self.batches, None)

        options = dict(FORMS[form])
        options["quant_format"] = QuantFormat[options["quant_format"]]
        for key in ("activation_type", "weight_type"):
            if key in options:
                options[key] = QuantType[options[key]]
        quantize_static(str(root / "f32.onnx"), str(path), Reader(), **options)
    return path


def _compile(path, plan: str, out):
    module = load_model(path, new_context())
    number_ops(module)
    return compile_module(module, resolve_plan(plan, Graph(module)), out)


def _run(directory, x: np.ndarray) -> np.ndarray:
    with collage_runtime.load(directory) as program:
        return np.concatenate([program.invoke("main", x[i:i + 64])[0] for i in range(0, len(x), 64)])


def _output_step(path) -> float:
    """The scale of the model's last DequantizeLinear: one step of its output."""
    model = onnx.load(path)
    last = [n for n in model.graph.node if n.op_type == "DequantizeLinear"][-1]
    return float(onnx.numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == last.input[1])))


def _batched(run, x: np.ndarray) -> np.ndarray:
    return np.concatenate([run(x[i:i + 64]) for i in range(0, len(x), 64)])


@pytest.mark.parametrize("form", list(FORMS))
def test_quantized_onnx_runs_as_its_source(digits, form, tmp_path):
    """ONNX Runtime's program equals ONNX Runtime on the source; IREE alone (f32 convolutions between the
    quantize/dequantize pairs, not int32 accumulation) and OpenVINO agree with it as closely as OpenVINO on
    the source does (plus one output step: OpenVINO's uint8 kernels round differently under collage's
    thread settings), or within two output steps; the held-out accuracy is the quantized model's."""
    path = _quantized(digits, form)
    _, x, labels, _ = digits
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = _batched(lambda b: session.run(None, {"x": b})[0], x)
    assert (want.argmax(1) == labels).mean() > 0.9
    bound = 2 * _output_step(path)
    ov = pytest.importorskip("openvino")
    try:
        compiled = ov.Core().compile_model(str(path), "CPU")
        bound = max(bound, float(np.abs(_batched(lambda b: compiled(b)[0], x) - want).max()) + _output_step(path))
    except RuntimeError:  # OpenVINO 2026.4 cannot read a per-channel QLinearConv ("scale_dim.compatible")
        pass
    for plan in ("whole:ort", "default", "whole:openvino"):
        _compile(path, plan, tmp_path / plan)
        got = _run(tmp_path / plan, x)
        if plan == "whole:ort":
            np.testing.assert_array_equal(got, want)
        assert np.abs(got - want).max() <= bound + 1e-6, plan
        assert (got.argmax(1) == want.argmax(1)).mean() >= 0.99, plan


def test_onnx_runtime_fuses_the_translated_graph_into_int8_kernels(digits, tmp_path):
    path = _quantized(digits, "qdq-per-channel")
    result = _compile(path, "whole:ort", tmp_path / "ort")
    (entry,) = result.manifest.regions

    def fused(model_path) -> collections.Counter:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
        options.log_severity_level = 3
        ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        return collections.Counter(n.op_type for n in onnx.load(tmp_path / "optimized.onnx").graph.node)

    ours, theirs = fused(tmp_path / "ort" / entry.artifact), fused(path)
    assert ours["QLinearConv"] == theirs["QLinearConv"] == 2
    assert ours["QGemm"] == theirs["QGemm"] == 1
    assert "Conv" not in ours and "Gemm" not in ours


def test_a_qoperator_op_without_a_qdq_form_is_kept_as_onnx(tmp_path):
    """``QLinearConcat`` (ONNX Runtime's com.microsoft domain) has no QDQ form here and torch-mlir cannot
    lower it: it is kept as ONNX, on ONNX Runtime inside the program, which equals ONNX Runtime exactly."""
    import collage_runtime
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from collage_mlir.iree import compile_file

    graph = helper.make_graph(
        [helper.make_node("QLinearConcat", ["y_s", "y_z", "x", "s", "z", "x", "s", "z"], ["y"], domain="com.microsoft",
                          axis=0)], "g", [helper.make_tensor_value_info("x", TensorProto.INT8, [2])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [4])],
        [helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]), helper.make_tensor("z", TensorProto.INT8, [], [0]),
         helper.make_tensor("y_s", TensorProto.FLOAT, [], [0.2]), helper.make_tensor("y_z", TensorProto.INT8, [], [0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    onnx.save(model, tmp_path / "m.onnx")
    x = np.array([-7, 9], np.int8)
    manifest = compile_file(tmp_path / "m.onnx", output_dir=tmp_path / "a", plan="default")
    assert [r.backend for r in manifest.regions] == ["ort"]
    with collage_runtime.load(tmp_path / "a") as program:
        (got,) = program.invoke("main", x)
    (want,) = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(got, want)


def test_a_dynamically_quantized_model_keeps_its_int8_matmuls(tmp_path):
    """``onnxruntime.quantization.quantize_dynamic`` (BERT's quantization in ONNX Runtime's tutorials): the
    activations quantized at run time (``DynamicQuantizeLinear``), ``MatMulInteger`` and a uint8 embedding
    table. The integer matmuls are kept as ONNX (torch-mlir widens them to 32-bit matmuls no engine runs in
    int8, between which ONNX Runtime got 18 regions of a small BERT) and the table's gather is translated:
    ``whole:ort`` is one region, whose translation ONNX Runtime fuses into its dynamic int8 matmul kernels,
    and the program equals ONNX Runtime on the source within float rounding."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 32), torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 16)).eval()
    ids = torch.randint(0, 50, (2, 8))
    torch.onnx.export(model, (ids,), str(tmp_path / "f32.onnx"), dynamo=False, input_names=["ids"], opset_version=17)
    quantize_dynamic(str(tmp_path / "f32.onnx"), str(tmp_path / "dq.onnx"), weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul", "Gather"])
    ops = collections.Counter(n.op_type for n in onnx.load(tmp_path / "dq.onnx").graph.node)
    assert ops["MatMulInteger"] == 2 and ops["DynamicQuantizeLinear"] >= 1 and ops["Gather"] == 1, ops
    module = load_model(tmp_path / "dq.onnx", new_context())
    collage.OnnxSource.detach(module)  # the translation (a whole model on ORT runs the file itself)
    number_ops(module)
    (entry,) = compile_module(module, resolve_plan("whole:ort", Graph(module)), tmp_path / "ort").manifest.regions

    def fused(path) -> collections.Counter:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return collections.Counter(n.op_type for n in onnx.load(tmp_path / "optimized.onnx").graph.node)

    # Fused as ONNX Runtime fuses the file (the scale product straight into the Mul after the Cast): one
    # DynamicQuantizeMatMul; the first matmul, reading the dequantized table, stays MatMulInteger in both.
    ours, theirs = fused(tmp_path / "ort" / entry.artifact), fused(tmp_path / "dq.onnx")
    for op in ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger"):
        assert ours[op] == theirs[op], (op, ours, theirs)
    assert ours["DynamicQuantizeMatMul"] + ours["MatMulIntegerToFloat"] >= 1 and "MatMul" not in ours, ours
    x = np.random.default_rng(0).integers(0, 50, (2, 8)).astype(np.int64)
    (want,) = ort.InferenceSession(str(tmp_path / "dq.onnx"), providers=["CPUExecutionProvider"]).run(None, {"ids": x})
    for plan in ("whole:ort", "default"):
        if plan != "whole:ort":
            _compile(tmp_path / "dq.onnx", plan, tmp_path / plan)
        with collage_runtime.load(tmp_path / ("ort" if plan == "whole:ort" else plan)) as program:
            (got,) = program.invoke("main", x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=plan)


#: How much the calibration images are dimmed in the --max-drop test: enough to change held-out classes.
DIM = 0.85


def _cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", *args], capture_output=True, text=True)


def test_precision_int8_quantizes_an_f32_model_from_calibration_samples(digits, tmp_path):
    """`collage compile model.onnx --precision int8 --calibrate DATA`: the program is the int8 model (ONNX
    Runtime's own quantizer, from the samples' first three quarters), its agreement with f32 on the last
    quarter is reported; a --max-drop it exceeds (calibrated on blank images, held out on digits) is one line.
    Without --plan the whole model goes to the int8 engine that ran it fastest when compiling (IREE computes
    int8 in f32: the default plan would be the slowest program)."""
    root, x, labels, calibration = digits
    np.save(tmp_path / "calib.npy", calibration)
    r = _cli("compile", str(root / "f32.onnx"), "--precision", "int8", "--calibrate", str(tmp_path / "calib.npy"),
             "-o", str(tmp_path / "int8"))
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stderr.split())
    # The int8 engines on the int8 model, and the same engines on the f32 one: the fastest of the four runs it.
    timed = re.search(r"int8 engines: ort ([0-9.]+) ms, openvino ([0-9.]+) ms; on the f32 model: ort ([0-9.]+) ms, "
                      r"openvino ([0-9.]+) ms → (\w+)( on the f32 model)?", said)
    assert timed, said
    times = dict(zip(["ort", "openvino", "ort f32", "openvino f32"], map(float, timed.groups()[:4])))
    assert min(times, key=times.get) == timed[5] + (" f32" if timed[6] else "")
    from collage_runtime.manifest import load_manifest

    manifest = load_manifest(tmp_path / "int8")
    assert {r["backend"] for r in manifest.plan["regions"]} == {timed[5]}
    assert manifest.provenance["precision"] == ("f32" if timed[6] else "int8")
    assert "int8 against f32 on 64 held-out samples: top class changed on" in said
    # And the compiled program itself (ORT's int8 kernels), on the same held-out samples.
    assert "the program against f32 on 64 held-out samples: top class changed on" in " ".join(r.stderr.split())
    got = _run(tmp_path / "int8", x)
    assert (got.argmax(1) == labels).mean() > 0.9
    # The check's result is kept in the manifest, and the report shows it.
    from collage_mlir.tools.report_cmd import render

    manifest = load_manifest(tmp_path / "int8")
    held = manifest.provenance["held_out"]
    assert held["samples"] == 64 and 0 <= held["top1_changed"] <= 0.05 and held["max_drop"] is None
    assert "<h2>Accuracy</h2><p>the program against f32 on 64 held-out samples" in \
        render(manifest.plan, manifest, None, None)
    blank = calibration.copy()
    blank[:192] = 0.0
    np.save(tmp_path / "blank.npy", blank)
    r = _cli("compile", str(root / "f32.onnx"), "--precision", "int8", "--calibrate", str(tmp_path / "blank.npy"),
             "--max-drop", "0.05", "-o", str(tmp_path / "refused"))
    assert r.returncode == 1 and not (tmp_path / "refused").exists()
    assert r.stderr.strip().count("\n") == 0 and "above --max-drop 0.05; nothing was built" in r.stderr
    assert "of its nodes in f32" in r.stderr  # the fallback tried, up to half the quantized nodes


def test_a_dynamic_batch_int8_model_compiled_for_an_example_goes_to_an_int8_engine(digits, tmp_path):
    """A dynamically quantized CNN (``ConvInteger``) exported with a dynamic batch, compiled for an example's
    shape without a plan: the int8 engines are timed at that shape (the timing read an undeclared dim: a
    KeyError traceback) and the program agrees with ONNX Runtime on the file."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root, x, _, _ = digits
    quantize_dynamic(str(root / "dynamic.onnx"), str(tmp_path / "dq.onnx"), weight_type=QuantType.QUInt8,
                     op_types_to_quantize=["Conv", "MatMul", "Gemm"])
    np.save(tmp_path / "x.npy", x[:4])
    run = _cli("compile", str(tmp_path / "dq.onnx"), "--input", str(tmp_path / "x.npy"), "-o", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    assert "int8 engines: " in run.stderr and "Traceback" not in run.stderr
    (want,) = ort.InferenceSession(str(tmp_path / "dq.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x[:4]})
    got = _run(tmp_path / "out", x[:4])
    np.testing.assert_allclose(got, want, atol=0.02 * np.abs(want).max())
    # Its batch is not paddable: each DynamicQuantizeLinear takes its scale from the whole tensor, padded rows
    # included, so a padded call would differ from the unpadded one. --pad is refused in one line, nothing written.
    run = _cli("compile", str(tmp_path / "dq.onnx"), "--dim", "batch=1:1:2", "--pad", "batch", "--plan", "whole:ort",
               "-o", str(tmp_path / "padded"))
    assert run.returncode == 1 and run.stderr.strip().splitlines()[-1].startswith("collage: error: "), run.stderr
    assert "--pad batch: padding changes the results" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "padded").exists()


def test_held_out_samples_of_one_image_check_a_program_compiled_for_a_batch(digits, tmp_path):
    """A model with a dynamic batch compiled for the --input's batch of 3, calibrated on samples of one image:
    the program check stacks the held-out samples into batches of 3 (it refused them, after a whole tune in
    `collage tune`). A batch larger than all held-out samples together cannot be checked: one line (it was a
    traceback), and nothing is written."""
    root, x, _, calibration = digits
    np.save(tmp_path / "calib.npy", calibration)
    np.save(tmp_path / "x.npy", x[:3])
    r = _cli("compile", str(root / "dynamic.onnx"), "--precision", "int8", "--calibrate", str(tmp_path / "calib.npy"),
             "--input", str(tmp_path / "x.npy"), "--plan", "whole:ort", "-o", str(tmp_path / "art"))
    assert r.returncode == 0, r.stderr
    assert "the program against f32 on 63 held-out samples: top class changed on" in " ".join(r.stderr.split())
    np.save(tmp_path / "x.npy", x[:100])  # 64 samples held out
    r = _cli("compile", str(root / "dynamic.onnx"), "--precision", "int8", "--calibrate", str(tmp_path / "calib.npy"),
             "--input", str(tmp_path / "x.npy"), "--plan", "whole:ort", "-o", str(tmp_path / "big"))
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("collage: error: ")
    assert "Traceback" not in r.stderr and "the held-out samples do not fit the compiled program" in r.stderr
    assert not (tmp_path / "big").exists()
    # A tune finds out before its search (it found out after spending its budget)
    r = _cli("tune", str(root / "dynamic.onnx"), "--precision", "int8", "--calibrate", str(tmp_path / "calib.npy"),
             "--input", str(tmp_path / "x.npy"), "--budget", "600", "--db", str(tmp_path / "db.sqlite"),
             "-o", str(tmp_path / "plan.json"))
    assert r.returncode == 2 and "the held-out samples do not fit the compiled program (input 0: expected " \
        "tensor<100x1x8x8xf32>" in " ".join(r.stderr.split()), r.stderr
    assert "finalists" not in r.stderr and not (tmp_path / "plan.json").exists()


def test_a_missing_model_with_precision_int8_is_one_line(tmp_path):
    np.save(tmp_path / "calib.npy", np.zeros((4, 1, 8, 8), np.float32))
    r = _cli("compile", str(tmp_path / "missing.onnx"), "--precision", "int8", "--calibrate",
             str(tmp_path / "calib.npy"), "-o", str(tmp_path / "out"))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "missing.onnx: cannot read the ONNX model" in r.stderr


def test_a_program_above_max_drop_is_not_written(digits, tmp_path):
    """The bound holds for the program, not only for the int8 model: an int8 model (calibrated on dimmed
    images: it changes some held-out classes) compiled with a check at --max-drop 0 is refused with one
    line, and the artifact already at the output stays as it was."""
    from collage_mlir.errors import CollageError
    from collage_mlir.frontends.onnx_calibrate import Calibration, quantize_onnx
    from collage_mlir.tools.tune_cmd import program_check

    root, x, _, calibration = digits
    dim = calibration.copy()
    dim[:192] *= DIM
    np.save(tmp_path / "dim.npy", dim)
    int8, agreement, _ = quantize_onnx(root / "f32.onnx", Calibration(tmp_path / "dim.npy"))
    assert agreement.top1_changed > 0
    out = tmp_path / "out"
    _compile(int8, "whole:ort", out)
    before = (out / "manifest.json").read_bytes()
    module = load_model(int8, new_context())
    number_ops(module)
    with pytest.raises(CollageError, match="the program against f32 on 64 held-out samples: top class changed on "
                                           r"[1-9].*above --max-drop 0; nothing was written"):
        compile_module(module, resolve_plan("whole:openvino", Graph(module)), out,
                       check=program_check(str(root / "f32.onnx"),
                                           Calibration(tmp_path / "dim.npy", max_drop=0.0).held_out))
    assert (out / "manifest.json").read_bytes() == before and not list(tmp_path.glob(".out.*"))


def test_int8_with_dims_checks_the_program_each_way_it_serves_a_batch(digits, tmp_path):
    """`collage compile dynamic.onnx --precision int8 --calibrate DATA --dim batch=...`: the program check runs
    the held-out samples through the shape-bucket artifact in batches of each bucket and of a size between
    (padded), and reports it; the artifact classifies held-out digits. Without a plan, the buckets go whole to
    the fastest int8 engine."""
    from collage_runtime.shapes import Bucket, DimRange, ShapeTable
    from collage_mlir.frontends.onnx_calibrate import across_batches

    table = ShapeTable((DimRange("batch", 1, 4, 8),), (("batch", None),), (("batch", None),),
                       (Bucket({"batch": 4}, "a"), Bucket({"batch": 8}, "b")), ("batch",))
    feeds = across_batches([{"x": np.full((1, 3), k, np.float32)} for k in range(21)], table)
    assert [len(f["x"]) for f in feeds] == [4, 8, 6, 3] and np.concatenate([f["x"] for f in feeds])[:, 0].tolist() \
        == list(range(21))
    root, x, labels, calibration = digits
    np.save(tmp_path / "calib.npy", calibration)
    r = _cli("compile", str(root / "dynamic.onnx"), "--precision", "int8", "--calibrate", str(tmp_path / "calib.npy"),
             "--dim", "batch=1:4:8", "--bucket", "batch=4,8", "--pad", "batch", "-o", str(tmp_path / "int8"))
    assert r.returncode == 0, r.stderr
    # No fallback engine to follow and no plan: each bucket whole on the engine timed fastest at its shape.
    said = " ".join(r.stderr.split())
    assert all(re.search(f"bucket batch={b}: ort [0-9.]+ ms, openvino [0-9.]+ ms; on the f32 model: ort [0-9.]+ ms, "
                         "openvino [0-9.]+ ms → ", said) for b in (4, 8)), said
    assert r.stderr.count(": 1 plan regions") == 2, r.stderr
    assert "the program against f32 on 64 held-out samples: top class changed on" in " ".join(r.stderr.split())
    with collage_runtime.load(tmp_path / "int8") as program:
        assert program.served(x[:6]) == "padded to batch=8"
        got = np.concatenate([program.invoke("main", x[i:i + 6])[0] for i in range(0, 384, 6)])
    assert (got.argmax(1) == labels).mean() > 0.9


def test_max_drop_keeps_the_most_sensitive_nodes_in_f32(digits, tmp_path):
    """Calibrated on dimmed images, the int8 model changes some held-out classes; with --max-drop 0 the
    node whose fallback to f32 helps most is kept in f32 until no class changes."""
    from collage_mlir.frontends.onnx_calibrate import Calibration, quantize_onnx

    root, x, labels, calibration = digits
    dim = calibration.copy()
    dim[:192] *= DIM
    np.save(tmp_path / "dim.npy", dim)
    path, agreement, kept = quantize_onnx(root / "f32.onnx", Calibration(tmp_path / "dim.npy"))
    assert agreement.top1_changed > 0 and not kept
    path, agreement, kept = quantize_onnx(root / "f32.onnx", Calibration(tmp_path / "dim.npy", max_drop=0.0))
    assert agreement.top1_changed == 0 and len(kept) >= 1
    model = onnx.load(path)
    float_nodes = {n.name for n in model.graph.node if n.name in kept}
    assert float_nodes == set(kept)


def _attention_onnx(tmp_path):
    """``tmp_path/f32.onnx``: attention scores of a sequence (two Linear layers, a ``Mul`` by 0.125, softmax) as a
    TorchScript export writes them, batch and sequence dynamic."""
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.k, self.v = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x):
            return torch.softmax(torch.matmul(self.k(x), self.v(x).transpose(-1, -2)) * 0.125, -1)

    torch.manual_seed(0)
    torch.onnx.export(Attention().eval(), (torch.randn(1, 8, 16),), str(tmp_path / "f32.onnx"), dynamo=False,
                      input_names=["x"], dynamic_axes={"x": {0: "batch", 1: "seq"}}, opset_version=17)
    return tmp_path / "f32.onnx"


def test_an_attention_scale_quantized_by_ort_runs_on_openvino(tmp_path):
    """ORT's quantizer wraps attention's constant scale (a TorchScript export's ``Mul`` by 0.125) in a
    QuantizeLinear/DequantizeLinear pair, on which OpenVINO failed to compile the int8 model, with dynamic dims or
    static. ``quantize_onnx`` folds the pair into the constant it computes: OpenVINO compiles the int8 model with
    its dims dynamic (as a fallback between buckets runs it), and agrees with ONNX Runtime on it."""
    ov = pytest.importorskip("openvino")
    from collage_mlir.frontends.onnx_calibrate import Calibration, _scalar_pairs_folded, quantize_onnx
    from collage_mlir.measure.validate import QUANT_RTOL

    _attention_onnx(tmp_path)
    rng = np.random.default_rng(0)
    np.save(tmp_path / "calib.npy", rng.standard_normal((8, 8, 16)).astype(np.float32))
    path, _, _ = quantize_onnx(tmp_path / "f32.onnx", Calibration(tmp_path / "calib.npy"))
    model = onnx.load(str(path))
    assert "QuantizeLinear" in {n.op_type for n in model.graph.node}  # still int8
    assert _scalar_pairs_folded(model.graph) == 0  # no pair on a scalar constant left
    request = ov.Core().compile_model(str(path), "CPU").create_infer_request()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in ((1, 8, 16), (2, 5, 16)):
        x = rng.standard_normal(shape).astype(np.float32)
        got, want = request.infer([x])[0], session.run(None, {"x": x})[0]
        assert got.shape == want.shape and np.abs(got - want).max() <= QUANT_RTOL * np.abs(want).max()


def test_a_users_own_int8_attention_gets_openvino_between_buckets(tmp_path, capsys):
    """A user's own int8 file from ``quantize_static`` (the pair on attention's scale left in it), compiled with
    --dim: OpenVINO runs it between buckets from a copy with the pair folded (it failed on the file, so ONNX
    Runtime's int8 served those shapes), and agrees with ONNX Runtime on the file."""
    pytest.importorskip("openvino")
    from onnxruntime import quantization as q

    from collage_mlir.measure.validate import QUANT_RTOL
    from collage_mlir.tools.cli import main as collage

    f32 = _attention_onnx(tmp_path)
    rng = np.random.default_rng(0)

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"x": rng.standard_normal((1, 8, 16)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.items, None)

    q.quantize_static(str(f32), str(tmp_path / "int8.onnx"), Reader(), quant_format=q.QuantFormat.QDQ,
                      activation_type=q.QuantType.QInt8, weight_type=q.QuantType.QInt8)
    assert collage(["compile", str(tmp_path / "int8.onnx"), "--dim", "batch=1:1:2", "--dim", "seq=4:8:16",
                    "--bucket", "batch=1", "--bucket", "seq=8", "--fallback", "openvino", "--plan", "whole:ort",
                    "-o", str(tmp_path / "art")]) == 0
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    with collage_runtime.load(tmp_path / "art") as program:
        assert program.served(x) == "openvino fallback"
        got = np.asarray(program.invoke("main", x)[0])
    want = ort.InferenceSession(str(tmp_path / "int8.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(got - want).max() <= QUANT_RTOL * np.abs(want).max()


def test_a_masked_attention_in_int8_is_unchanged_by_padding(tmp_path):
    """Attention with a padding mask (the scores of masked keys filled with the dtype's minimum, as Hugging Face
    models do), quantized from batches without padding: the softmax and what it reads stay f32, so a padded key
    gets no share of it and padding the int8 model leaves its results as they were (a DistilBERT's logits moved
    1 % of their scale when the filled scores were quantized, clamped to their calibrated minimum)."""
    from collage_mlir.frontends.onnx_calibrate import Calibration, quantize_onnx

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(16, 16) for _ in range(3))

        def forward(self, x, mask):
            scores = torch.matmul(self.q(x), self.k(x).transpose(-1, -2)) * 0.25
            scores = scores.masked_fill(mask[:, None, :] == 0, torch.finfo(torch.float32).min)
            return torch.matmul(torch.softmax(scores, -1), self.v(x))[:, 0]

    torch.manual_seed(0)
    torch.onnx.export(Masked().eval(), (torch.randn(1, 8, 16), torch.ones(1, 8, dtype=torch.int64)),
                      str(tmp_path / "f32.onnx"), dynamo=False, input_names=["x", "mask"],
                      dynamic_axes={"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}}, opset_version=17)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((16, 8, 16)).astype(np.float32),
             mask=np.ones((16, 8), np.int64))
    path, _, _ = quantize_onnx(tmp_path / "f32.onnx", Calibration(tmp_path / "calib.npz"))
    graph = onnx.load(str(path)).graph
    made = {o: n.op_type for n in graph.node for o in n.output}
    softmax = [n for n in graph.node if n.op_type == "Softmax"]
    assert softmax and all(made[n.input[0]] != "DequantizeLinear" for n in softmax)
    assert "QuantizeLinear" in made.values()  # the matmuls are int8
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x, mask = rng.standard_normal((2, 5, 16)).astype(np.float32), np.ones((2, 5), np.int64)
    padded = np.concatenate([x, rng.standard_normal((2, 11, 16)).astype(np.float32)], 1)
    want = session.run(None, {"x": x, "mask": mask})[0]
    got = session.run(None, {"x": padded, "mask": np.concatenate([mask, np.zeros((2, 11), np.int64)], 1)})[0]
    np.testing.assert_array_equal(got, want)


def test_folding_a_scalar_pair_keeps_its_value():
    """A constant through QuantizeLinear and DequantizeLinear (round half to even, saturated) folds to the value
    the pair computes: ONNX Runtime runs both graphs to the same bits."""
    from onnx import TensorProto, helper, numpy_helper

    from collage_mlir.frontends.onnx_calibrate import _scalar_pairs_folded

    def graph():
        c = [numpy_helper.from_array(np.array(v, dtype), name) for v, dtype, name in
             ((0.3125, np.float32, "c"), (0.025, np.float32, "s"), (np.int8(3), np.int8, "z"))]
        nodes = [helper.make_node("QuantizeLinear", ["c", "s", "z"], ["q"]),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
                 helper.make_node("Mul", ["x", "d"], ["y"])]
        return helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], c)

    folded = graph()
    assert _scalar_pairs_folded(folded) == 2 and [n.op_type for n in folded.node] == ["Mul"]
    x = np.linspace(-2, 2, 4).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    runs = [ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
                                 .SerializeToString(),
                                 options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
            for g in (graph(), folded)]
    assert np.array_equal(runs[0], runs[1]) and not np.array_equal(runs[0], x * np.float32(0.3125))


@pytest.mark.fast
@pytest.mark.parametrize("args, message", [
    (["--precision", "int8"], "--precision int8 needs calibration samples"),
    (["--calibrate", "x.npy"], "--calibrate goes with --precision int8"),
    (["--max-drop", "0.01"], "--max-drop needs samples to check on: --held-out DATA"),
    (["--precision", "int8", "--calibrate", "x.npy", "--held-out", "x.npy"], "holds out the last quarter"),
    (["--precision", "int8", "--calibrate", "x.npy", "--max-drop", "2"], "--max-drop is a share of samples"),
])
def test_precision_arguments_are_one_line(args, message, tmp_path):
    r = _cli("compile", "model.onnx", "-o", str(tmp_path / "out"), *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
