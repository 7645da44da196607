"""studies/gpu on the CPU: ``prepare --device cpu`` bundles a tiny model (two plans), ``run`` checks both
programs against torch eager and times them with ``iree.compiler`` and ``torch_mlir`` unimportable (as on
the GPU machine, where the gpu-marked test file must then be skipped, not an error), and a wrong artifact
and a wrong reference each fail the numerics check."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT

pytest.importorskip("torch")

HIDE = """import sys
for name in ("iree.compiler", "torch_mlir"):
    sys.modules[name] = None  # import raises ImportError, as where they are not installed
"""

# The same signature as tiny.mlp on its 4x32 input, another function.
WRONG = """func.func @main(%x: tensor<4x32xf32>) -> tensor<4x5xf32> {
  %0 = stablehlo.slice %x [0:4, 0:5] : (tensor<4x32xf32>) -> tensor<4x5xf32>
  return %0 : tensor<4x5xf32>
}
"""


def _run(bundle, out, *extra, hide=None):
    env = dict(os.environ)
    if hide is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(hide), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, "-m", "studies.gpu.run", str(bundle), str(out), "--seconds", "1", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return proc, json.loads((out / "results.json").read_text())


def test_prepare_and_run_on_cpu(tmp_path):
    sys.path.insert(0, str(ROOT))
    from studies.gpu import prepare
    from studies.gpu.bundle import Bundle, PlanArtifact

    bundle_dir = tmp_path / "bundle"
    assert prepare.main([str(bundle_dir), "--device", "cpu", "--models", "tiny.mlp", "--no-wheel"]) == 0
    bundle = Bundle.load(bundle_dir)
    assert bundle.device == "cpu" and bundle.wheels == () and [m.spec.label for m in bundle.models] == ["tiny.mlp"]
    assert [p.plan for p in bundle.models[0].plans] == ["default", "prefer:onednn"]
    assert Bundle.from_json(json.loads(json.dumps(bundle.to_json()))) == bundle

    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE)
    proc, res = _run(bundle_dir, tmp_path / "out", hide=hide)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert res["numerics_ok"] and res["stopped_early"] is None
    tests = res["tests"]  # the gpu-marked file imports iree.compiler: skipped, not an error
    assert tests["skipped"] >= 1 and tests["failed"] == 0 and tests["errors"] == 0, tests
    (model,) = res["models"]
    assert model["reference_ok"] and model["complete"]
    assert [(c["plan"], c["passed"]) for c in model["checks"]] == [("default", True), ("prefer:onednn", True)]
    timed = {t["contender"]: t for t in model["timings"]}
    assert set(timed) == {"collage default", "collage prefer:onednn", "torch eager"}
    assert all(t["median_ms"] > 0 and t["samples"] >= 3 for t in timed.values())
    assert model["best_peer"] == "torch eager" and model["speedup"] > 0
    assert "| torch eager |" in (tmp_path / "out" / "results.md").read_text()

    # A wrong program with the right signature in place of prefer:onednn, and a wrong CPU reference.
    from collage_mlir.iree import compile_str

    entry = bundle.models[0]
    compile_str(WRONG, output_dir=bundle_dir / "wrong", plan="default")
    plans = (entry.plans[0], PlanArtifact(**{**entry.plans[1].__dict__, "artifact": "wrong"}))
    bad = Bundle(**{**bundle.__dict__, "models": (type(entry)(**{**entry.__dict__, "plans": plans}),)})
    bad.save(bundle_dir)
    import numpy as np

    expected = bundle_dir / entry.expected[0]
    np.save(expected, np.load(expected) + 1.0)
    proc, res = _run(bundle_dir, tmp_path / "bad", "--no-tests")
    assert proc.returncode == 1 and "NUMERICS FAILED" in proc.stdout
    (model,) = res["models"]
    assert not res["numerics_ok"] and not model["reference_ok"]
    assert [c["passed"] for c in model["checks"]] == [True, False]
    assert model["checks"][1]["max_error"] > 1e-3


@pytest.mark.fast
def test_packable_weights_are_three_valued_and_rebuilt_alike():
    """The tune kit's full-size models travel as three-valued weights (xz packs them ~15x); the GPU machine
    rebuilds the same model from the seed to time torch against (same outputs)."""
    import torch

    sys.path.insert(0, str(ROOT))
    from studies.gpu.bundle import ModelSpec, build_model
    from studies.gpu.tune_kit import packable_weights

    outputs = []
    for _ in range(2):
        model, inputs = build_model(ModelSpec.parse("tiny.small_cnn"))
        packable_weights(model, inputs)
        weights = [p for p in model.parameters() if p.dim() >= 2]
        assert weights and all(len(torch.unique(p)) == 3 for p in weights)
        with torch.no_grad():
            outputs.append(model(*inputs))
    assert torch.equal(outputs[0], outputs[1]) and outputs[0].abs().max() > 0
