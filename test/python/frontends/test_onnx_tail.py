"""Nodes whose output shapes depend on their data (NonMaxSuppression) and every node after them run on ONNX
Runtime after the program (the ONNX tail): a detection head compiles, the program equals ONNX Runtime on the
file, and the tail is a checked artifact file."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from helpers import CONFORMANCE

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

sys.path.insert(0, str(CONFORMANCE))
from framework_models import detection_head  # noqa: E402


def collage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", *args], capture_output=True, text=True)


def test_a_detection_head_runs_nms_in_its_tail(tmp_path):
    (x,) = detection_head(tmp_path / "det.onnx")
    np.save(tmp_path / "x.npy", x)
    r = collage("compile", str(tmp_path / "det.onnx"), "--input", str(tmp_path / "x.npy"), "-o", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    tail = json.loads((tmp_path / "a" / "manifest.json").read_text())["tail"]
    assert tail["outputs"] == [["tail", 0], ["result", 0]]  # detections from the tail, scores from the program
    nodes = [n.op_type for n in onnx.load(str(tmp_path / "a" / tail["artifact"])).graph.node]
    assert nodes[0] == "NonMaxSuppression" and "Conv" not in nodes
    r = collage("run", str(tmp_path / "a"), "--input", str(tmp_path / "x.npy"), "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    want = ort.InferenceSession(str(tmp_path / "det.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert 0 < len(want[0]) <= 5
    for k, w in enumerate(want):
        np.testing.assert_allclose(np.load(tmp_path / "o" / f"out_{k}.npy"), w, rtol=1e-5, atol=1e-6)

    (tmp_path / "a" / tail["artifact"]).write_bytes(b"tampered")
    r = collage("run", str(tmp_path / "a"), "--input", str(tmp_path / "x.npy"), "--output-dir", str(tmp_path / "o2"))
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "ONNX tail does not match its SHA-256" in r.stderr, r.stderr


def test_branches_of_data_dependent_shapes_and_what_reads_them_from_its_body_join_the_tail(tmp_path):
    """``If`` whose branches give different shapes (which one, the data decides) is tail; so is a later
    ``If`` of a static scalar whose branches read the first one's result from around them (AffineGrid's
    expansion: its grid ``If`` reads the 3-D grid from the graph). Each branch reads ``r``, computed by the
    program, from around it: the tail takes it as an input."""
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT

    def branch(name, nodes, out, shape):
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, f, shape)])

    first = helper.make_node(
        "If", ["pos"], ["d"],
        then_branch=branch("twice", [helper.make_node("Concat", ["r", "r"], ["rr"], axis=0)], "rr", [8]),
        else_branch=branch("once", [helper.make_node("Neg", ["r"], ["nr"])], "nr", [4]))
    second = helper.make_node(
        "If", ["pos"], ["s"],
        then_branch=branch("sum", [helper.make_node("ReduceSum", ["d"], ["sd"], keepdims=0)], "sd", []),
        else_branch=branch("max", [helper.make_node("ReduceMax", ["d"], ["md"], keepdims=0)], "md", []))
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["pos"]),
             first, second,
             helper.make_node("Mul", ["s", "total"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [4])],
                              [helper.make_tensor_value_info("y", f, []), helper.make_tensor_value_info("r", f, [4])],
                              initializer=[onnx.numpy_helper.from_array(np.array(0, np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "if.onnx"))
    r = collage("compile", str(tmp_path / "if.onnx"), "-o", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    tail = json.loads((tmp_path / "a" / "manifest.json").read_text())["tail"]
    nodes = [n.op_type for n in onnx.load(str(tmp_path / "a" / tail["artifact"])).graph.node]
    assert nodes == ["If", "If", "Mul"] and tail["outputs"] == [["tail", 0], ["result", 0]]
    session = ort.InferenceSession(str(tmp_path / "if.onnx"), providers=["CPUExecutionProvider"])
    for k, x in enumerate([np.array([1, -2, 3, 0.5], np.float32), np.array([-1, -2, 3, -4], np.float32)]):
        np.save(tmp_path / f"x{k}.npy", x)
        r = collage("run", str(tmp_path / "a"), "--input", str(tmp_path / f"x{k}.npy"),
                    "--output-dir", str(tmp_path / f"o{k}"))
        assert r.returncode == 0, r.stderr
        for j, w in enumerate(session.run(None, {"x": x})):
            np.testing.assert_allclose(np.load(tmp_path / f"o{k}" / f"out_{j}.npy"), w, rtol=1e-6)
