"""ONNX in: `collage compile model.onnx` through torch-mlir's ONNX importer and StableHLO lowering; the
program equals ONNX Runtime running the same file (rtol 1e-4, atol 1e-5); unreadable or unsupported
models are one error line."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from models import onnx_cnn  # noqa: E402


def collage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize("plan", ["default"])  # prefer:ort: the README's cli example (test_readme_examples.py)
def test_onnx_model_compiles_and_equals_onnxruntime(plan, tmp_path):
    onnx_cnn(tmp_path / "cnn.onnx")
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = collage("compile", str(tmp_path / "cnn.onnx"), "--plan", plan, "-o", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    r = collage("run", str(tmp_path / "a"), "--input", str(tmp_path / "x.npy"), "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    (want,) = ort.InferenceSession(str(tmp_path / "cnn.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(np.load(tmp_path / "o" / "out_0.npy"), want, rtol=1e-4, atol=1e-5)


def test_bad_onnx_is_one_line(tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"\x08\x07not a protobuf at all")
    graph = helper.make_graph([helper.make_node("FancyOp", ["x"], ["y"], domain="com.example")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "custom.onnx"))
    for name, message in [("junk", "cannot read the ONNX model"), ("custom", "cannot import the ONNX model")]:
        r = collage("compile", str(tmp_path / f"{name}.onnx"), "-o", str(tmp_path / name))
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_a_model_that_crashes_the_importer_is_one_line(tmp_path):
    """torch-mlir's ONNX import dies of SIGSEGV on a dilated 3-D average pool (ONNX's node test
    test_averagepool_3d_dilations_small): the import runs in a child, so `collage compile` says so in one
    line instead of dying without a word."""
    pool = helper.make_node("AveragePool", ["x"], ["y"], ceil_mode=1, dilations=[2, 2, 2], kernel_shape=[2, 2, 2],
                            strides=[1, 1, 1])
    graph = helper.make_graph([pool], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "pool.onnx"))
    r = collage("compile", str(tmp_path / "pool.onnx"), "--no-import-check", "-o", str(tmp_path / "out"))
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "cannot import the ONNX model: torch-mlir's importer died of SIGSEGV" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_constant_shape_arithmetic_is_folded_when_the_import_refuses_it(tmp_path):
    """TorchScript's export of a BERT computes its position ids' Expand shape from Shape ops; torch-mlir
    leaves a run-time assert IREE refuses. The import then tries the model with its constant subgraphs
    folded (ONNX Runtime's basic optimizations) and checks it against the original file."""
    import torch

    from collage_mlir import zoo
    from collage_mlir.frontends import load_model
    from collage_mlir.ir import new_context
    from collage_mlir.measure.import_check import check_model_file

    model, inputs = zoo.build("bert_base", small=True)
    path = tmp_path / "bert.onnx"
    torch.onnx.export(model, inputs, str(path), dynamo=False, input_names=["x"], opset_version=17)
    assert "Expand" in {n.op_type for n in onnx.load(str(path)).graph.node}
    module = load_model(path, new_context())
    assert check_model_file(module, path, cache=False).ok
    assert not list(tmp_path.glob("*.folded.onnx"))  # folded in a temporary directory, not beside the model
