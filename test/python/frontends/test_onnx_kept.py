"""ONNX nodes torch-mlir cannot lower are kept as ONNX: the rest imports, each such node runs on ONNX Runtime
inside the program, and every plan's program equals ONNX Runtime on the file (rtol 1e-4, atol 1e-5)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def collage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", *args], capture_output=True, text=True)


def _model(path, nodes, inputs, outputs, initializers=(), opset=22) -> None:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.save(model, str(path))


def equals_onnxruntime(tmp_path, model: str, x: np.ndarray, plan: str = "default", *, check_inputs: bool = False,
                       rtol: float = 1e-5, atol: float = 1e-6) -> list[dict]:
    """Compiles ``tmp_path/model`` under ``plan`` (with ``x`` as the import check's input where
    ``check_inputs``), runs it on ``x`` and checks every output against ONNX Runtime on the file; the
    artifact's regions."""
    np.save(tmp_path / "x.npy", x)
    given = ["--input", str(tmp_path / "x.npy")] if check_inputs else []
    r = collage("compile", str(tmp_path / model), *given, "--plan", plan, "-o", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    r = collage("run", str(tmp_path / "a"), "--input", str(tmp_path / "x.npy"), "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    want = ort.InferenceSession(str(tmp_path / model), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for k, w in enumerate(want):
        np.testing.assert_allclose(np.load(tmp_path / "o" / f"out_{k}.npy"), w, rtol=rtol, atol=atol)
    return json.loads((tmp_path / "a" / "manifest.json").read_text())["regions"]


def two_kept(path) -> None:
    """MatMul → CumProd (kept) → Relu → Det (kept, its output a model output) and a second output reading
    the model input: two kept nodes, one of them fed by another's neighbour, one at the end."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 4)) * 0.5).astype(np.float32), "w")
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("CumProd", ["h", "axis"], ["c"], reverse=1),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Det", ["r"], ["d"]),
             helper.make_node("Tanh", ["x"], ["t"])]
    _model(path, nodes, [("x", [3, 4, 4])], [("d", [3]), ("t", [3, 4, 4])], [w, axis], opset=26)


def test_kept_nodes_are_custom_calls_between_their_neighbours(tmp_path):
    from collage_mlir.dialects import collage as vocab
    from collage_mlir.frontends import load_model
    from collage_mlir.graph import body_ops, public_funcs
    from collage_mlir.ir import new_context

    two_kept(tmp_path / "m.onnx")
    module = load_model(tmp_path / "m.onnx", new_context())
    (main,) = public_funcs(module)
    ops = list(body_ops(main))
    kept = [op for op in ops if vocab.is_onnx_node(op)]
    assert [onnx.ModelProto.FromString(vocab.onnx_node_model(op)).graph.node[0].op_type for op in kept] == \
        ["CumProd", "Det"]
    assert len(main.regions[0].blocks[0].arguments) == 1  # the cut's extra arguments are gone
    assert module.operation.verify()
    det = onnx.ModelProto.FromString(vocab.onnx_node_model(kept[1]))
    assert [i.name for i in det.graph.input] == ["in0"] and [o.name for o in det.graph.output] == ["out0"]
    assert base64.b64decode(vocab.str_attr(kept[0], "backend_config"))  # the model is stored as base64 text


@pytest.mark.parametrize("plan", ["default", "prefer:openvino"])
def test_kept_nodes_run_on_onnxruntime_under_every_plan(plan, tmp_path):
    two_kept(tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal((3, 4, 4)).astype(np.float32)
    regions = equals_onnxruntime(tmp_path, "m.onnx", x, plan, rtol=1e-4, atol=1e-5)
    assert sum(r["backend"] == "ort" for r in regions) >= 1


def test_a_node_with_a_data_dependent_shape_runs_after_the_program(tmp_path):
    """NonZero's output shape depends on its input's values: no static program holds it; it and the Cast
    after it are the model's ONNX tail (``frontends.onnx_tail``), Relu the program."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["nz"]),
             helper.make_node("Cast", ["nz"], ["y"], to=TensorProto.FLOAT)]
    _model(tmp_path / "nz.onnx", nodes, [("x", [2, 3])], [("y", [2, None])])
    x = np.array([[1, -1, 2], [0, 3, -4]], np.float32)
    np.save(tmp_path / "x.npy", x)
    r = collage("compile", str(tmp_path / "nz.onnx"), "-o", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "a" / "manifest.json").read_text())["tail"]["outputs"] == [["tail", 0]]
    r = collage("run", str(tmp_path / "a"), "--input", str(tmp_path / "x.npy"), "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "out_0.npy"), [[0, 0, 1], [0, 2, 1]])


def test_a_node_newer_than_onnxruntime_reads_runs_at_an_older_opset(tmp_path):
    """ReverseSequence at opset 28 and IR 14 (as ONNX 1.23 writes its node tests): ONNX Runtime 1.31 refuses
    the file, torch-mlir cannot lower the op; the kept node is converted to an opset ONNX Runtime reads, and
    the program equals ONNX's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node("ReverseSequence", ["x", "lens"], ["y"], batch_axis=1, time_axis=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
                              initializer=[numpy_helper.from_array(np.array([4, 2, 1], np.int64), "lens")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 28)])
    model.ir_version = 14
    onnx.save(model, str(tmp_path / "rs.onnx"))
    with pytest.raises(Exception, match="IR version"):
        ort.InferenceSession(str(tmp_path / "rs.onnx"), providers=["CPUExecutionProvider"])
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.save(tmp_path / "x.npy", x)
    r = collage("compile", str(tmp_path / "rs.onnx"), "--input", str(tmp_path / "x.npy"), "-o", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    r = collage("run", str(tmp_path / "a"), "--input", str(tmp_path / "x.npy"), "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "out_0.npy"), want)


def _compiled_equals_onnxruntime(model, feeds: dict, tmp_path, rtol: float) -> list[np.ndarray]:
    """`collage compile` + `collage run` of ``model`` on ``feeds`` (its inputs, in order): each output has
    ONNX Runtime's dtype and shape and equals it within ``rtol``; the outputs."""
    onnx.save(model, str(tmp_path / "m.onnx"))
    args = []
    for name, value in feeds.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["--input", str(tmp_path / f"{name}.npy")]
    r = collage("compile", str(tmp_path / "m.onnx"), *args, "-o", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    r = collage("run", str(tmp_path / "a"), *args, "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    want = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = [np.load(tmp_path / "o" / f"out_{k}.npy") for k in range(len(want))]
    for g, w in zip(got, want):
        assert (g.dtype, g.shape) == (w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=0)
    return got


def test_uint16_and_uint64_values_pass_between_the_signature_and_kept_nodes(tmp_path):
    """torch-mlir aborts on uint16/uint64 tensors: every node computing on them is kept, the cut declares
    the values signed for the importer and the program takes and gives them unsigned (values past the
    signed range included)."""
    u16, u64 = TensorProto.UINT16, TensorProto.UINT64
    nodes = [helper.make_node("Add", ["x", "x"], ["s"]),                      # uint16, kept
             helper.make_node("Cast", ["s"], ["f"], to=TensorProto.FLOAT),     # reads uint16: kept
             helper.make_node("Mul", ["f", "y"], ["m"]),                       # float: imported
             helper.make_node("Cast", ["m"], ["big"], to=u64)]                 # gives uint64: kept
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", u16, [3]),
                                           helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("s", u16, [3]), helper.make_tensor_value_info("big", u64, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    feeds = {"x": np.array([1, 20000, 30000], np.uint16), "y": np.array([2.0, 3.0, 1e5], np.float32)}
    s, big = _compiled_equals_onnxruntime(model, feeds, tmp_path, rtol=0)
    assert s[1] == 40000 and big[2] == 6_000_000_000  # past int16's and int32's ranges


def test_a_float64_model_computes_in_float64(tmp_path):
    """A model declaring float64 is compiled without IREE's f64 demotion: a float64 kept node (CumSum) and
    float64 arithmetic keep digits float32 has not (1 + 1e-10)."""
    f64 = TensorProto.DOUBLE
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["c"]), helper.make_node("Add", ["c", "x"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f64, [4])],
                              [helper.make_tensor_value_info("y", f64, [4])],
                              initializer=[numpy_helper.from_array(np.array(0, np.int64), "axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    (y,) = _compiled_equals_onnxruntime(model, {"x": np.array([1 + 1e-10, 1, 1, 1])}, tmp_path, rtol=1e-15)
    assert y[0] - 2 == pytest.approx(2e-10, rel=1e-5)


def test_a_kept_node_openvino_agrees_on_joins_an_openvino_region(tmp_path):
    """ReverseSequence (kept: torch-mlir cannot lower it) compiles on OpenVINO and gives ONNX Runtime's
    outputs on generated inputs: under prefer:openvino it runs there with its neighbours, in one region.
    (Det and CumProd, which OpenVINO's reader lacks, stay on ONNX Runtime: the test above.)"""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("ReverseSequence", ["r", "lens"], ["s"], batch_axis=1, time_axis=0),
             helper.make_node("Tanh", ["s"], ["y"])]
    lens = numpy_helper.from_array(np.array([4, 2, 1], np.int64), "lens")
    _model(tmp_path / "rs.onnx", nodes, [("x", [4, 3])], [("y", [4, 3])], [lens], opset=18)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = collage("compile", str(tmp_path / "rs.onnx"), "--plan", "prefer:openvino", "-o", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    regions = json.loads((tmp_path / "a" / "manifest.json").read_text())["regions"]
    assert [r["backend"] for r in regions] == ["openvino"], regions
    r = collage("run", str(tmp_path / "a"), "--input", str(tmp_path / "x.npy"), "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    (want,) = ort.InferenceSession(str(tmp_path / "rs.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(np.load(tmp_path / "o" / "out_0.npy"), want, rtol=1e-5, atol=1e-6)


def scan_reading_outer(path) -> None:
    """Relu → Scan (a running sum over the rows of ``r``; its body reads ``b``, a value computed before it,
    and ``scale``, an initializer, from the graph around it) → Tanh: torch-mlir cannot lower Scan."""
    body = helper.make_graph(
        [helper.make_node("Add", ["sum_in", "row"], ["acc"]),
         helper.make_node("Mul", ["acc", "scale"], ["scaled"]),
         helper.make_node("Add", ["scaled", "b"], ["sum_out"]),
         helper.make_node("Identity", ["sum_out"], ["row_out"])],
        "body", [helper.make_tensor_value_info("sum_in", TensorProto.FLOAT, [3]),
                 helper.make_tensor_value_info("row", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("sum_out", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("row_out", TensorProto.FLOAT, [3])])
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("ReduceMean", ["x"], ["b"], axes=[0], keepdims=0),
             helper.make_node("Scan", ["init", "r"], ["last", "rows"], num_scan_inputs=1, body=body),
             helper.make_node("Tanh", ["rows"], ["y"])]
    consts = [numpy_helper.from_array(np.zeros(3, np.float32), "init"),
              numpy_helper.from_array(np.array(0.5, np.float32), "scale")]
    _model(path, nodes, [("x", [5, 3])], [("last", [3]), ("y", [5, 3])], consts, opset=17)


@pytest.mark.parametrize("plan", ["default", "prefer:openvino"])
def test_a_scan_whose_body_reads_values_around_it_is_kept(plan, tmp_path):
    """The Scan is kept with its body: the values the body reads from around it (``b`` computed by the
    program, ``scale`` a constant) are inputs of its one-node model, and the program equals ONNX Runtime on
    the file under each plan."""
    from collage_mlir.dialects import collage as vocab
    from collage_mlir.frontends import load_model
    from collage_mlir.graph import body_ops, public_funcs
    from collage_mlir.ir import new_context

    scan_reading_outer(tmp_path / "s.onnx")
    module = load_model(tmp_path / "s.onnx", new_context())
    (main,) = public_funcs(module)
    (kept,) = [op for op in body_ops(main) if vocab.is_onnx_node(op)]
    one = onnx.ModelProto.FromString(vocab.onnx_node_model(kept))
    assert [i.name for i in one.graph.input] == ["in0", "in1"]  # r, then b (read by the body)
    assert {t.name for t in one.graph.initializer} == {"c0", "c1"}  # init, then scale
    equals_onnxruntime(tmp_path, "s.onnx", np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32), plan)


def test_a_node_iree_cannot_compile_as_imported_is_kept(tmp_path):
    """AveragePool with ``ceil_mode`` whose last window starts on the padding imports, but IREE rejects its
    lowering: the import check's reference does not build, the node after which the graph's prefix stops
    building is found by bisection and kept as ONNX, and the model (Relu → pool → Tanh) equals ONNX Runtime."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("AveragePool", ["r"], ["p"], ceil_mode=1, count_include_pad=1, kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1], strides=[3, 3]),
             helper.make_node("Tanh", ["p"], ["y"])]
    # The pool's output declared too: ONNX's shape inference says 2x2 (it keeps the window ORT drops).
    _model(tmp_path / "pool.onnx", nodes, [("x", [1, 3, 2, 2])], [("y", [1, 3, 1, 1]), ("p", [1, 3, 1, 1])],
           opset=19)
    x = np.random.default_rng(3).standard_normal((1, 3, 2, 2)).astype(np.float32)
    regions = equals_onnxruntime(tmp_path, "pool.onnx", x, check_inputs=True)
    assert [r["backend"] for r in regions] == ["ort"], regions  # the pool alone, kept


def test_a_model_with_its_weights_in_an_external_file_keeps_nodes(tmp_path):
    """torch.onnx.export writes weights beside the model (``model.onnx.data``); the folded copy the import
    probes lives elsewhere and must carry its own weights (it kept the source's references, which did not
    resolve from there: "cannot probe the ONNX model's nodes")."""
    two_kept(tmp_path / "inline.onnx")
    model = onnx.load(str(tmp_path / "inline.onnx"))
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.onnx.data", size_threshold=0)
    assert (tmp_path / "m.onnx.data").is_file()
    x = np.random.default_rng(1).standard_normal((3, 4, 4)).astype(np.float32)
    regions = equals_onnxruntime(tmp_path, "m.onnx", x, check_inputs=True, rtol=1e-4, atol=1e-5)
    assert sum(r["backend"] == "ort" for r in regions) >= 1
