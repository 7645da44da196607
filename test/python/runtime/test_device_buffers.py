"""Served regions on device-only buffers, tested on IREE's Vulkan driver over Mesa's software Vulkan
(llvmpipe): a Vulkan program's buffers cannot be mapped, so a host engine's region reads its inputs from
a staging copy and its outputs are copied into device buffers, and the program's results come back to
the host through a staging copy. Plus a device executor (``takes_dlpack``) served on a CPU program, with
its tensors taken over without copies. CUDA needs a GPU and is not tested here."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import iree.runtime as rt
import numpy as np
import pytest

import collage_runtime
from collage_runtime import rt_module
from collage_runtime.manifest import ArtifactError
from collage_runtime.rt_module import RegionFailure
from collage_runtime.types import Platform
from collage_mlir.iree import compile_module
from collage_mlir.ir import new_context, parse_module
from collage_mlir.plan import Plan, Region

_MODULES = {"ort": "onnxruntime", "onednn": "torch"}
T, W = "tensor<16x8xf32>", "tensor<8x8xf32>"

#: adds (IREE) -> matmul (the served region op 2, reading two IREE dispatches' results, which IREE may
#: place in one allocation) -> tanh, mul (IREE)
CHAIN = (f"func.func @f(%a: {T}, %b: {W}, %c: {T}) -> {T} {{\n"
         f"  %0 = stablehlo.add %a, %c : {T}\n"
         f"  %1 = stablehlo.add %b, %b : {W}\n"
         f"  %2 = stablehlo.dot_general %0, %1, contracting_dims = [1] x [0] : ({T}, {W}) -> {T}\n"
         f"  %3 = stablehlo.tanh %2 : {T}\n"
         f"  %4 = stablehlo.multiply %3, %c : {T}\n"
         f"  return %4 : {T}\n}}\n")

#: every result of the function comes from the served region {0, 1}, which has two
TWO = (f"func.func @two(%a: {T}, %b: {W}) -> ({T}, {T}) {{\n"
       f"  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : ({T}, {W}) -> {T}\n"
       f"  %1 = stablehlo.tanh %0 : {T}\n"
       f"  return %0, %1 : {T}, {T}\n}}\n")


def _chain_inputs(rng) -> tuple[np.ndarray, ...]:
    return (rng.standard_normal((16, 8), np.float32), rng.standard_normal((8, 8), np.float32) / 4,
            rng.standard_normal((16, 8), np.float32))


def _chain_reference(a, b, c) -> np.ndarray:
    return np.tanh((a + c) @ (b + b)) * c


def _need_vulkan() -> None:
    try:
        devices = rt.get_driver("vulkan").query_available_devices() if "vulkan" in rt.query_available_drivers() else []
    except (RuntimeError, ValueError):
        devices = []
    if not devices:
        pytest.skip("no Vulkan device: apt-get install mesa-vulkan-drivers libvulkan1")


def _compile(text: str, regions: list[Region], out: Path, default_backend: str = "iree-cpu") -> Path:
    art = compile_module(parse_module(text, new_context()), Plan(regions, default_backend=default_backend), out)
    assert art.manifest.platform is (Platform.VULKAN if default_backend == "iree-vulkan" else Platform.CPU)
    return out


def _serve_with(monkeypatch, load) -> None:
    """Every region of the programs loaded next is served by the executor ``load(path, engines)`` makes
    (the registry itself is untouched: entry points are read once, lru_cached)."""
    monkeypatch.setattr(rt_module, "executor", lambda name: load)


@pytest.mark.parametrize("backend", list(_MODULES))
def test_vulkan_program_with_a_served_region_matches_the_cpu_program(backend, tmp_path):
    _need_vulkan()
    pytest.importorskip(_MODULES[backend])
    plan = [Region("r", backend, frozenset({2}))]
    cpu = _compile(CHAIN, plan, tmp_path / "cpu")
    vk = _compile(CHAIN, plan, tmp_path / "vk", "iree-vulkan")
    calls: list[str] = []
    rng = np.random.default_rng(3)
    with collage_runtime.load(cpu) as on_cpu, \
            collage_runtime.load(vk, region_timer=lambda region, *_: calls.append(region)) as on_vk:
        assert on_vk.platform is Platform.VULKAN and on_vk.config.device.__class__ is rt.HalDevice
        tol = on_vk.manifest.regions[0].tolerance
        f = on_vk.device_function("f")
        for k in range(3):  # new data every call, through invoke and through device arrays
            x = _chain_inputs(rng)
            (got,) = on_vk.invoke("f", *x)
            (want,) = on_cpu.invoke("f", *x)
            assert isinstance(got, np.ndarray) and got.shape == (16, 8) and got.dtype == np.float32
            np.testing.assert_allclose(got, want, rtol=tol.rtol, atol=tol.atol, err_msg=f"call {k}")
            np.testing.assert_allclose(got, _chain_reference(*x), rtol=1e-4, atol=1e-4)
            (again,) = on_vk.to_host(f(*(on_vk.to_device(v) for v in x)))
            np.testing.assert_array_equal(again, got)
    assert calls == ["r"] * 6  # the timed path serves the region too


def test_vulkan_results_all_from_a_served_region_with_two_results(tmp_path):
    _need_vulkan()
    pytest.importorskip("onnxruntime")
    vk = _compile(TWO, [Region("r", "ort", frozenset({0, 1}))], tmp_path / "vk", "iree-vulkan")
    rng = np.random.default_rng(4)
    with collage_runtime.load(vk) as prog:
        assert len(prog.manifest.regions[0].outputs) == 2
        for _ in range(2):
            a, b = rng.standard_normal((16, 8), np.float32), rng.standard_normal((8, 8), np.float32)
            mm, th = prog.invoke("two", a, b)
            np.testing.assert_allclose(mm, a @ b, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(th, np.tanh(a @ b), rtol=1e-4, atol=1e-4)
            # Vulkan buffers cannot be exported through DLPack: invoke_dlpack gives host arrays
            mm2, th2 = prog.invoke_dlpack("two", a, b)
            assert isinstance(mm2, np.ndarray) and isinstance(th2, np.ndarray)
            np.testing.assert_array_equal(mm2, mm)
            np.testing.assert_array_equal(th2, th)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_the_last_vulkan_program_closed_releases_the_device(tmp_path):
    """An idle IREE Vulkan device on Mesa's lavapipe keeps two of IREE's threads polling the driver (half a
    core). Kept for the process, one Vulkan program loaded and closed left every later engine in it on half
    its cores (a pytest worker's later tests ran 3x slower). The device lives while a program holds it and
    goes with the last: its threads with it, and the process idle."""
    _need_vulkan()
    vk = _compile(TWO, [], tmp_path / "vk", "iree-vulkan")
    a, b = np.eye(16, 8, dtype=np.float32), np.eye(8, dtype=np.float32)
    gc.collect()  # what earlier tests left to collect goes now, not while this one counts threads
    before = _threads()
    first, second = collage_runtime.load(vk), collage_runtime.load(vk)
    assert first.config.device is second.config.device and _threads() > before
    first.close()
    np.testing.assert_array_equal(second.invoke("two", a, b)[0], a)  # the device stays for the second
    second.close()
    assert _threads() <= before
    cpu = time.process_time()
    time.sleep(0.5)
    assert time.process_time() - cpu < 0.05  # was ~0.25 s in 0.5 s
    with collage_runtime.load(vk) as again:  # a new device for the next program
        np.testing.assert_array_equal(again.invoke("two", a, b)[0], a)


def test_vulkan_region_failure_is_one_line(tmp_path, monkeypatch):
    _need_vulkan()
    pytest.importorskip("onnxruntime")
    vk = _compile(CHAIN, [Region("r", "ort", frozenset({2}))], tmp_path / "vk", "iree-vulkan")

    def load(path, engines):
        def run(inputs, outputs):
            assert inputs[0].shape == (16, 8) and outputs[0].shape == (16, 8)
            raise ValueError("the engine refused this input")
        return run

    _serve_with(monkeypatch, load)
    with collage_runtime.load(vk) as prog:
        with pytest.raises(RegionFailure) as info:
            prog.invoke("f", *_chain_inputs(np.random.default_rng(5)))
    assert str(info.value) == "region 'r' (ort) failed: ValueError: the engine refused this input"


def test_vulkan_refuses_a_device_executor_at_load(tmp_path, monkeypatch):
    """IREE cannot export a Vulkan buffer through DLPack: a region whose executor takes device tensors is
    refused when the program loads, in one line, not at its first call."""
    _need_vulkan()
    pytest.importorskip("onnxruntime")
    vk = _compile(CHAIN, [Region("r", "ort", frozenset({2}))], tmp_path / "vk", "iree-vulkan")

    def load(path, engines):
        def run(inputs):
            return inputs
        run.takes_dlpack = True
        return run

    _serve_with(monkeypatch, load)
    with pytest.raises(ArtifactError, match="^region 'r' \\(ort\\): its executor takes device tensors through "
                                            "DLPack, which IREE's vulkan driver cannot export"):
        collage_runtime.load(vk)


def _torch_executor(torch, result):
    """A device executor computing the TWO region (matmul, tanh) with torch on the tensors it is given;
    ``result(tensor)`` shapes what it hands back. Records what it got in ``run.seen``."""
    def load(path, engines):
        def run(inputs):
            assert all(x.__dlpack_device__() == (1, 0) for x in inputs)  # the CPU program's own buffers
            a, b = (torch.from_dlpack(x) for x in inputs)
            mm = a @ b
            outs = [result(mm), result(torch.tanh(mm))]
            run.seen.append([t.data_ptr() for t in outs])
            return outs
        run.takes_dlpack = True
        run.seen = []
        load.run = run
        return run
    return load


@pytest.mark.parametrize("kind", ["as_is", "float64", "transposed"])
def test_device_executor_on_a_cpu_program(kind, tmp_path, monkeypatch):
    """A ``takes_dlpack`` executor on a CPU program gets CPU DLPack producers over the program's buffers;
    its contiguous results of the region's element type are taken over without a copy (the caller's
    torch tensor is the executor's memory), others (float64, a transposed view) are copied, and all
    compute what numpy computes."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    cpu = _compile(TWO, [Region("r", "ort", frozenset({0, 1}))], tmp_path / "cpu")
    result = {"as_is": lambda t: t, "float64": lambda t: t.double(),
              "transposed": lambda t: t.t().contiguous().t()}[kind]
    load = _torch_executor(torch, result)
    _serve_with(monkeypatch, load)
    rng = np.random.default_rng(6)
    with collage_runtime.load(cpu) as prog:
        for _ in range(2):
            a, b = rng.standard_normal((16, 8), np.float32), rng.standard_normal((8, 8), np.float32)
            mm, th = prog.invoke("two", a, b)
            np.testing.assert_allclose(mm, a @ b, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(th, np.tanh(a @ b), rtol=1e-5, atol=1e-5)
            outs = [torch.from_dlpack(r) for r in prog.invoke_dlpack("two", torch.from_numpy(a), torch.from_numpy(b))]
            np.testing.assert_allclose(outs[0].numpy(), a @ b, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(outs[1].numpy(), np.tanh(a @ b), rtol=1e-5, atol=1e-5)
            taken_over = [t.data_ptr() for t in outs] == load.run.seen[-1]
            assert taken_over == (kind == "as_is"), kind


def test_torch_device_executor_serves_a_real_region_on_a_cpu_program(tmp_path, monkeypatch):
    """The cublas/cudnn backends' device executor (``torch_device``, CUDA programs only at compile time)
    runs the step program of a oneDNN region of a CPU program on the CPU tensors it is handed: the
    region reads an IREE dispatch's results and its result feeds IREE's next ops, call after call."""
    pytest.importorskip("torch")
    from collage_runtime.executors import torch_device

    cpu = _compile(CHAIN, [Region("r", "onednn", frozenset({2}))], tmp_path / "cpu")
    _serve_with(monkeypatch, torch_device.load)
    rng = np.random.default_rng(7)
    with collage_runtime.load(cpu) as prog:
        for _ in range(3):
            x = _chain_inputs(rng)
            np.testing.assert_allclose(prog.invoke("f", *x)[0], _chain_reference(*x), rtol=1e-4, atol=1e-4)


def test_staging_layout_aligns_every_tensor():
    offsets, total = rt_module.staging_layout([4, 0, 100, 64])
    assert offsets == (0, 64, 64, 192) and total == 256
    assert rt_module.staging_layout([]) == ((), 1) and rt_module.staging_layout([0]) == ((0,), 1)
