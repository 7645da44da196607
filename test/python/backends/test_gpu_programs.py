"""GPU programs without a GPU: a CUDA program compiles here (PTX for the architecture asked for, Hopper
through the declared target), the host waits for IREE's work before every served call, and plans are
checked against the program's platform. Running them is the GPU machine's job (studies/gpu)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from collage_mlir import artifact
from collage_mlir.backends.iree_codegen import iree_compile
from collage_mlir.errors import CollageError
from collage_mlir.frontends import stablehlo
from collage_mlir.graph import Graph, number_ops
from collage_mlir.ir import new_context
from collage_mlir.iree import compile_module
from collage_mlir.plan import Plan, Region
from collage_mlir.search import resolve_plan
from collage_runtime.types import Platform

from models import negate_matmul_tanh_add

# negate (0) -> matmul (1) -> tanh (2) -> add (3): IREE computes before and after the middle two.
MODEL = negate_matmul_tanh_add(64)


def _module():
    module = stablehlo.parse(MODEL, new_context())
    number_ops(module)
    return module


@pytest.mark.parametrize("arch, ptx", [("sm_80", None), ("sm_90", "8.0")])
def test_cuda_program_holds_ptx_for_the_architecture(tmp_path, arch, ptx):
    """IREE lists sm_80 itself; sm_90 goes through the declared target (IREE 3.13 refuses the flag)."""
    plan = Plan([Region("r", "ort", frozenset({1, 2}))], "iree-cuda")
    result = compile_module(_module(), plan, tmp_path / "out", platform=Platform.CUDA,
                            iree_args=[f"--iree-cuda-target={arch}"])
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["platform"] == "cuda" and result.plan.default_backend == "iree-cuda"
    assert [r["backend"] for r in manifest["regions"]] == ["ort"]
    vmfb = (tmp_path / "out" / "main.vmfb").read_bytes()
    assert set(re.findall(rb"\.target\s+(sm_\d+)", vmfb)) == {arch.encode()}
    if ptx:
        assert set(re.findall(rb"\.version (\d+\.\d+)", vmfb)) == {ptx.encode()}


def test_host_waits_for_iree_before_each_served_call():
    """A served region reads buffers IREE wrote on its own stream: the compiled program awaits the fence of
    the work before every collage_rt call (no event is shared with torch's stream)."""
    module = _module()
    plan = Plan([Region("r", "ort", frozenset({1, 2}))], "iree-cuda")
    parts = artifact.partition(module, plan, None)
    vm = iree_compile(module, ["--compile-to=vm"], parts.target).decode().splitlines()
    calls = [k for k, line in enumerate(vm) if "vm.call @collage_rt.r(" in line]
    assert calls
    for k in calls:
        before = vm[:k]
        submitted = max(j for j, line in enumerate(before) if "queue.execute" in line)
        assert any("@hal.fence.await" in line for line in before[submitted:]), "no host wait before the call"


@pytest.mark.fast
def test_plans_are_checked_against_the_program_platform():
    module = _module()
    graph = Graph(module)
    assert resolve_plan("default", graph, Platform.CUDA).default_backend == "iree-cuda"
    assert resolve_plan("default", graph).default_backend == "iree-cpu"
    cases = [
        (Plan([Region("r", "cublas", frozenset({1}))]), "backend 'cublas' cannot run regions in a cpu program"),
        (Plan([Region("r", "iree-cpu-dt", frozenset({1}))], "iree-cuda"),
         "backend 'iree-cpu-dt' cannot run regions in a cuda program"),
        (Plan([], "onednn"), "backend 'onednn' cannot be a program's default backend"),
    ]
    for plan, message in cases:
        with pytest.raises(CollageError, match=re.escape(message)):
            plan.validate(graph)
    # A host engine serves regions in a CUDA program (through copies); cuBLAS does too.
    Plan([Region("a", "ort", frozenset({2})), Region("b", "cublas", frozenset({1}))], "iree-cuda").validate(graph)
    with pytest.raises(CollageError, match="not a plan for a cuda program"):
        resolve_plan(Plan([]), graph, Platform.CUDA)


def _collage(*args, cwd):
    return subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_cli_compiles_for_a_gpu_and_refuses_bad_targets(tmp_path):
    (tmp_path / "m.mlir").write_text(MODEL)
    ok = _collage("compile", "m.mlir", "--device", "cuda", "--cuda-target", "sm_90", "--plan", "prefer:cublas",
                  "-o", "out", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["platform"] == "cuda" and [r["backend"] for r in manifest["regions"]] == ["cublas"]
    for args, message in [(("--cuda-target", "hopper"), "expected an SM architecture such as sm_80"),
                          (("--cuda-target", "sm_95"), "CUDA architecture sm_95 is not supported"),
                          (("--tune",), "tune a cuda program on the machine that has the device")]:
        bad = _collage("compile", "m.mlir", "--device", "cuda", *args, "-o", "bad", cwd=tmp_path)
        assert bad.returncode != 0 and message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


# A row sum long enough for IREE's reduction vector-distribution pipeline, which races on CUDA (iree_cuda.py).
ROW_SUM = """
func.func @main(%x: tensor<4x4096xf32>) -> tensor<4xf32> {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %r = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [1] : (tensor<4x4096xf32>, tensor<f32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}
"""


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_reductions_avoid_the_racing_pipeline(arch):
    """Measured on an H200: ResNet-50's head gave wrong results that changed from call to call under IREE's
    reduction vector distribution; iree-cuda compiles reductions with another pipeline, for every arch."""
    from collage_mlir.backends.iree_cuda import IreeCudaBackend

    target = IreeCudaBackend().program_target([f"--iree-cuda-target={arch}"])
    module = stablehlo.parse(ROW_SUM, new_context())
    configured = iree_compile(module, ["--compile-to=executable-configurations"], target).decode()
    pipelines = set(re.findall(r"pipeline = #iree_gpu\.pipeline<(\w+)>", configured))
    assert pipelines and "VectorDistribute" not in pipelines, pipelines
