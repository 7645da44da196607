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
