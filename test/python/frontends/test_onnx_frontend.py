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


def compiles_to_onnxruntime(model, x: np.ndarray, tmp_path, plan: str = "default") -> None:
    """`collage compile` the file ``model`` under ``plan``, `collage run` it on ``x`` (its one input, "x"):
    its one output equals ONNX Runtime's on the file (rtol 1e-4, atol 1e-5)."""
    np.save(tmp_path / "x.npy", x)
    r = collage("compile", str(model), "--plan", plan, "-o", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    r = collage("run", str(tmp_path / "a"), "--input", str(tmp_path / "x.npy"), "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    (want,) = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(np.load(tmp_path / "o" / "out_0.npy"), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("plan", ["default"])  # prefer:ort: the README's cli example (test_readme_examples.py)
def test_onnx_model_compiles_and_equals_onnxruntime(plan, tmp_path):
    onnx_cnn(tmp_path / "cnn.onnx")
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    compiles_to_onnxruntime(tmp_path / "cnn.onnx", x, tmp_path, plan)


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


def test_a_node_that_crashes_the_importer_is_one_line_and_then_kept_as_onnx(tmp_path):
    """torch-mlir's ONNX import dies of SIGSEGV on a dilated 3-D average pool (ONNX's node test
    test_averagepool_3d_dilations_small): the import runs in a child, so the frontend says so in one line
    instead of dying without a word; `collage compile` then probes the nodes alone (in children too) and
    keeps the pool as ONNX, on ONNX Runtime inside the program."""
    from collage_mlir.errors import CollageError
    from collage_mlir.frontends.onnx import import_onnx
    from collage_mlir.ir import new_context

    pool = helper.make_node("AveragePool", ["x"], ["y"], ceil_mode=1, dilations=[2, 2, 2], kernel_shape=[2, 2, 2],
                            strides=[1, 1, 1])
    graph = helper.make_graph([pool], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "pool.onnx"))
    with pytest.raises(CollageError, match="cannot import the ONNX model: torch-mlir's importer died of SIGSEGV"):
        import_onnx(tmp_path / "pool.onnx", new_context())
    compiles_to_onnxruntime(tmp_path / "pool.onnx",
                            np.random.default_rng(0).standard_normal((1, 1, 4, 4, 4)).astype(np.float32), tmp_path)


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


def _opset23_block(path) -> None:
    """A modern transformer block as an opset-23 export writes it: RMSNormalization, then the one-node
    Attention (4 heads, causal), then ReduceSumSquare over the last axis: function ops torch-mlir's importer
    has no lowering for."""
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    scale = numpy_helper.from_array(rng.uniform(0.5, 1.5, 32).astype(np.float32), "scale")
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    nodes = [helper.make_node("RMSNormalization", ["x", "scale"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("Attention", ["n", "n", "n"], ["a"], q_num_heads=4, kv_num_heads=4, is_causal=1),
             helper.make_node("ReduceSumSquare", ["a", "axes"], ["y"], keepdims=1)]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, 1])],
                              initializer=[scale, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    onnx.save(model, str(path))


@pytest.mark.parametrize("plan", ["default", "prefer:ort"])
def test_function_ops_the_importer_lacks_are_expanded(plan, tmp_path):
    """RMSNormalization, Attention and ReduceSumSquare are refused by torch-mlir; each is replaced by the
    body its ONNX schema defines it by, and the program equals ONNX's reference evaluator on the file."""
    from onnx.reference import ReferenceEvaluator

    _opset23_block(tmp_path / "block.onnx")
    x = np.random.default_rng(1).standard_normal((2, 6, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = collage("compile", str(tmp_path / "block.onnx"), "--plan", plan, "-o", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    r = collage("run", str(tmp_path / "a"), "--input", str(tmp_path / "x.npy"), "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    (want,) = ReferenceEvaluator(str(tmp_path / "block.onnx")).run(None, {"x": x})
    np.testing.assert_allclose(np.load(tmp_path / "o" / "out_0.npy"), want, rtol=1e-4, atol=1e-5)


def test_expand_functions_keeps_what_the_importer_lowers():
    """Only the ops of EXPANDED are expanded (LayerNormalization, which torch-mlir lowers whole, stays);
    a model without them is left as it is."""
    from collage_mlir.frontends.onnx_functions import expand_functions

    nodes = [helper.make_node("LayerNormalization", ["x", "s"], ["n"]),
             helper.make_node("Mish", ["n"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                                           helper.make_tensor_value_info("s", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    assert expand_functions(model) == 1
    ops = [n.op_type for n in model.graph.node]
    assert ops[0] == "LayerNormalization" and "Mish" not in ops and {"Softplus", "Tanh", "Mul"} <= set(ops), ops
    assert {o.domain for o in model.opset_import} == {""}
    onnx.checker.check_model(model, full_check=True)
    assert expand_functions(model) == 0
