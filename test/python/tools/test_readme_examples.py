"""The README's entry-point examples are tests: every code block after a ``<!-- example: NAME -->`` line
runs as written (python blocks in this process, sh blocks in bash) in a directory holding the files they
name, and each is at most five lines."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from helpers import LIT, ROOT
from models import onnx_cnn

_BLOCK = re.compile(r"<!-- example: (\w+) -->\n```(\w+)\n(.*?)```", re.DOTALL)
EXAMPLES = {name: (lang, code) for name, lang, code in _BLOCK.findall((ROOT / "README.md").read_text())}

# The model the python and cli examples name, carrying its own plan (collage-assign reads it).
MODEL_MLIR = """module attributes {collage.plan = {version = 1, regions = [{name = "act", backend = "iree-cpu", ops = [1]}]}} {
  func.func @main(%x: tensor<2x3x8x8xf32>) -> tensor<2x3x8x8xf32> {
    %0 = stablehlo.negate %x : tensor<2x3x8x8xf32>
    %1 = stablehlo.tanh %0 : tensor<2x3x8x8xf32>
    %2 = stablehlo.add %1, %x : tensor<2x3x8x8xf32>
    return %2 : tensor<2x3x8x8xf32>
  }
}
"""


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "model.mlir").write_text(MODEL_MLIR)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32))
    shutil.copy(LIT / "collage-assign-diagnostics.mlir", tmp_path / "cases.mlir")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.fast
def test_every_entry_point_has_a_five_line_example():
    assert set(EXAMPLES) == {"python", "torch", "jax", "cli"}
    for name, (_, code) in EXAMPLES.items():
        assert len(code.strip().splitlines()) <= 5, name


@pytest.mark.parametrize("name", ["python", "torch", "jax"])
def test_python_example(name, workdir):
    if name == "torch":
        pytest.importorskip("torch")
    if name == "jax":
        pytest.importorskip("jax")
    lang, code = EXAMPLES[name]
    assert lang == "python"
    scope: dict = {}
    exec(compile(code, f"README.md:{name}", "exec"), scope)  # noqa: S102  the README's own example
    if name == "python":
        x = np.load("x.npy")
        np.testing.assert_allclose(scope["y"], np.tanh(-x) + x, rtol=1e-5, atol=1e-6)
    if name == "torch":  # torch.compile's result too
        scope["torch"].testing.assert_close(scope["y"], scope["model"](scope["x"]), rtol=1e-4, atol=1e-5)


def test_cli_example(workdir):
    pytest.importorskip("onnx")
    onnx_cnn(workdir / "model.onnx")  # input x: 2x3x8x8, as x.npy
    lang, code = EXAMPLES["cli"]
    assert lang == "sh"
    r = subprocess.run(["bash", "-e", "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(workdir / "model.onnx"), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"x": np.load(workdir / "x.npy")})  # prefer:ort equals ORT on the same file
    np.testing.assert_allclose(np.load(workdir / "results" / "out_0.npy"), want, rtol=1e-4, atol=1e-5)
    assert "End-to-end breakdown" in (workdir / "report.html").read_text()
    assert 'collage.region = "act"' in r.stdout and "call @act" in r.stdout  # the module's own plan, outlined
