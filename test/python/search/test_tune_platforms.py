"""`collage tune` for a GPU program, with IREE Vulkan over Mesa's software driver standing in for the GPU
(CI has none): seeds, regions and plans are built as Vulkan programs and timed there, the cost rows are
keyed by the Vulkan device's fingerprint, and the tuned plan compiles and matches the CPU program."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from collage_mlir.measure.device import device_fingerprint, platform_problem
from collage_runtime.types import Platform

from models import negate_matmul_tanh_add

MODEL = negate_matmul_tanh_add(32)


def _collage(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env=env)


@pytest.mark.skipif(platform_problem(Platform.VULKAN) is not None,
                    reason="no Vulkan device: apt-get install mesa-vulkan-drivers libvulkan1")
def test_tune_a_vulkan_program_and_run_its_plan(tmp_path):
    import collage_runtime

    (tmp_path / "m.mlir").write_text(MODEL)
    db = tmp_path / "costs.sqlite"
    tuned = _collage("tune", "m.mlir", "--device", "vulkan", "--backends", "ort", "--budget", "15", "--db", str(db),
                     "-o", "plan.json", cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["default_backend"] == "iree-vulkan"
    assert set(plan["tuning"]["backends"]) == {"iree-vulkan", "ort"}
    vulkan, _ = device_fingerprint(Platform.VULKAN)
    with sqlite3.connect(db) as c:
        devices = {d for (d,) in c.execute("SELECT DISTINCT device FROM measurements")}
        (stored,) = c.execute("SELECT document FROM derived WHERE kind = 'tune-result'").fetchone()
    assert devices == {vulkan}, "rows of a Vulkan tune are keyed by the Vulkan device"
    # The DP searched Vulkan placements too (its index once defaulted to iree-cpu: on an H100 a CUDA tune's
    # DP plan was an IREE CPU program, timed beside the CUDA ones and within their spread).
    result = json.loads(stored)
    assert {p["default_backend"] for p in (result["dp_plan"], *result["single"].values())} == {"iree-vulkan"}
    built = _collage("compile", "m.mlir", "--plan", "plan.json", "-o", "out", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((32, 32)).astype(np.float32) for _ in range(2))
    with collage_runtime.load(tmp_path / "out") as program:
        assert program.manifest.platform is Platform.VULKAN
        (got,) = program.invoke("main", a, b)
    np.testing.assert_allclose(got, np.tanh(-a @ b) + a, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(platform_problem(Platform.VULKAN) is not None,
                    reason="no Vulkan device: apt-get install mesa-vulkan-drivers libvulkan1")
def test_a_device_programs_numbers_are_checked_against_iree_cpu(tmp_path):
    """On a device platform the reference is IREE CPU's, not the platform's own program: a device program
    that computes wrong numbers (IREE CUDA raced on ResNet-50's head on an H200) is an invalid plan, not
    the yardstick every correct plan is failed against."""
    from collage_mlir.backends import get_backend
    from collage_mlir.frontends import stablehlo
    from collage_mlir.graph import number_ops
    from collage_mlir.ir import new_context
    from collage_mlir.measure.db import CostDB
    from collage_mlir.measure.harness import MeasureOptions
    from collage_mlir.plan import Plan
    from collage_mlir.search.measured import MeasuredEstimator

    module = stablehlo.parse(MODEL, new_context())
    number_ops(module)
    a, b = (np.random.default_rng(k).standard_normal((32, 32)).astype(np.float32) for k in (1, 2))
    est = MeasuredEstimator(module, [get_backend("iree-vulkan")], CostDB(tmp_path / "costs.sqlite"), tmp_path,
                            examples={"main": [a, b]}, options=MeasureOptions(platform=Platform.VULKAN))
    timed = []
    timer = est._plan_timer()
    time_plan = timer.time
    timer.time = lambda module, plan, inputs, references=None, *rest, **kw: (
        timed.append((plan.default_backend, references is not None)) or time_plan(module, plan, inputs, references,
                                                                                   *rest, **kw))
    assert est.plan_time(Plan([], "iree-vulkan", "default"), "seed").usable
    assert timed == [("iree-cpu", False), ("iree-vulkan", True)], "the Vulkan program is checked against IREE CPU"
    (ref,) = est.reference()
    np.testing.assert_allclose(ref, np.tanh(-a @ b) + a, rtol=1e-4, atol=1e-5)
    est._reference = [ref + 0.5]  # what a wrong device program looks like from the reference's side
    wrong = est.plan_time(Plan([], "iree-vulkan", "default"), "again")
    assert not wrong.usable and "wrong" in wrong.reason, wrong
    est.close()


def test_a_gpu_tune_without_the_device_is_one_line(tmp_path):
    if platform_problem(Platform.CUDA) is None:
        pytest.skip("this machine has a CUDA device")
    (tmp_path / "m.mlir").write_text(MODEL)
    r = _collage("tune", "m.mlir", "--device", "cuda", "--budget", "5", "-o", "plan.json", cwd=tmp_path)
    assert r.returncode == 1 and "no cuda device here" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "plan.json").exists()
