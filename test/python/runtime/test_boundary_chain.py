"""Region calls through ``collage_rt`` as ``studies/boundary/boundary.py`` measures them: a chain of regions (each
region's result the next one's input, so IREE's caching allocator alternates their blocks) and a region
with two results compute what numpy computes, call after call with new data; one more region in a
program costs little beyond its engine (a loose bound: CI machines are shared)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import collage_runtime
from collage_mlir.iree import compile_module
from collage_mlir.ir import new_context, parse_module
from collage_mlir.plan import Plan, Region

from helpers import ROOT

sys.path.insert(0, str(ROOT))  # the repository root: studies/ is not an installed package
from studies.boundary import boundary  # noqa: E402

_MODULES = {"ort": "onnxruntime", "openvino": "openvino", "xla-cpu": "jax", "onednn": "torch"}


@pytest.mark.parametrize("backend", list(_MODULES))
def test_chain_of_regions_reads_each_calls_data(backend, tmp_path):
    pytest.importorskip(_MODULES[backend])
    boundary.compile_region(backend, 256, tmp_path / "art", links=3)
    rng = np.random.default_rng(1)
    with collage_runtime.load(tmp_path / "art") as prog:
        f = prog.device_function("mm")
        for _ in range(3):  # new data at the addresses the executors remember
            a, b = rng.standard_normal((32, 8), np.float32), rng.standard_normal((8, 8), np.float32)
            want = a @ b @ b @ b
            np.testing.assert_allclose(prog.invoke("mm", a, b)[0], want, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(f(prog.to_device(a), prog.to_device(b)).to_host(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_region_with_two_results(backend, tmp_path):
    pytest.importorskip(_MODULES[backend])
    t = "tensor<16x8xf32>"
    text = (f"func.func @two(%a: {t}, %b: tensor<8x8xf32>) -> ({t}, {t}) {{\n"
            f"  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : ({t}, tensor<8x8xf32>) -> {t}\n"
            f"  %1 = stablehlo.tanh %0 : {t}\n  return %0, %1 : {t}, {t}\n}}\n")
    art = compile_module(parse_module(text, new_context()), Plan([Region("r", backend, frozenset({0, 1}))]),
                         tmp_path / "art")
    assert len(art.manifest.regions) == 1 and len(art.manifest.regions[0].outputs) == 2
    rng = np.random.default_rng(2)
    with collage_runtime.load(tmp_path / "art") as prog:
        for _ in range(2):
            a, b = rng.standard_normal((16, 8), np.float32), rng.standard_normal((8, 8), np.float32)
            mm, th = prog.invoke("two", a, b)
            np.testing.assert_allclose(mm, a @ b, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(th, np.tanh(a @ b), rtol=1e-4, atol=1e-4)


@pytest.mark.serial
def test_boundary_bench_per_region_small():
    pytest.importorskip("onnxruntime")
    row = boundary.measure("ort", 256, rounds=2)
    assert row["floor_per_region_us"] > 0
    # loose: measured ~5 µs per region (floor ~4 µs) on 2 shared cores
    assert row["boundary_us"] < 500 and row["floor_per_region_us"] < 200, row


def test_xla_hands_large_results_over_without_a_copy(tmp_path):
    """XLA's results of ``HAND_OVER_BYTES`` or more become the program's buffers through DLPack: they are
    read by the next XLA region, by IREE's own code (the last link is iree-cpu) and by the caller, and
    freeing them does not leak (resident memory stays put over many 4 MB calls)."""
    pytest.importorskip("jax")
    import resource

    from collage_runtime.executors.xla_pjrt import HAND_OVER_BYTES

    m = 2 * HAND_OVER_BYTES // 32  # (m x 8) f32: twice the threshold
    text = boundary._module(m, 3)
    plan = Plan([Region("x0", "xla-cpu", frozenset({0})), Region("x1", "xla-cpu", frozenset({1}))],
                default_backend="iree-cpu", source="xla then iree")
    compile_module(parse_module(text, new_context()), plan, tmp_path / "art")
    rng = np.random.default_rng(3)
    with collage_runtime.load(tmp_path / "art") as prog:
        f = prog.device_function("mm")
        for _ in range(3):
            a, b = rng.standard_normal((m, 8), np.float32), rng.standard_normal((8, 8), np.float32) / 3
            want = a @ b @ b @ b
            np.testing.assert_allclose(prog.invoke("mm", a, b)[0], want, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(f(prog.to_device(a), prog.to_device(b)).to_host(), want, rtol=1e-4, atol=1e-4)
        da, db = prog.to_device(a), prog.to_device(b)
        for _ in range(20):
            f(da, db)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for _ in range(200):  # 2 x 1 MB handed over per call: a leak would grow by ~400 MB
            f(da, db)
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KB
