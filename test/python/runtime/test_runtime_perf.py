"""The runtime's thread budget, boundaries and executor registry.

- A chain of regions, each its own ORT / OpenVINO session, run with 2 threads, costs about the sum of its
  regions run single-threaded (CPU time, which spinning thread pools inflate and neighbours on a shared
  machine do not): no oversubscription, no busy-waiting.
- The boundary bench runs on a small size; its overhead stays under a loose bound.
- The thread budget reaches IREE's task pool and torch; ``collage run --threads`` takes it.

What a manifest may not make the runtime do: test_runtime_security.py.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

import collage_runtime
from collage_mlir.iree import compile_module
from collage_mlir.ir import new_context, parse_module
from collage_mlir.plan import Plan, Region
from collage_mlir.zoo.chain import matmul_tanh_chain
from collage_runtime.engines import Engines
from collage_runtime.executors import executor

from helpers import ROOT

sys.path.insert(0, str(ROOT))  # the repository root: studies/ is not an installed package
from studies.boundary import boundary  # noqa: E402

N, LINKS = 192, 8


def _cpu_per_call(fn, clock=time.process_time, calls: int = 5) -> float:
    fn()
    t0 = clock()
    for _ in range(calls):
        fn()
    return (clock() - t0) / calls


@pytest.mark.serial
@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_many_regions_cost_the_sum_of_their_regions(backend, tmp_path):
    pytest.importorskip({"ort": "onnxruntime", "openvino": "openvino"}[backend])
    plan = Plan([Region(f"link{k}", backend, frozenset({2 * k, 2 * k + 1})) for k in range(LINKS)], source="chain")
    art = compile_module(parse_module(matmul_tanh_chain(N, LINKS), new_context()), plan, tmp_path / "art")
    regions = art.manifest.regions
    assert len(regions) == LINKS
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((N, N), np.float32), rng.standard_normal((N, N), np.float32) / N
    engines = Engines(1)  # one thread: no pool that could spin, so this is the regions' own CPU cost
    alone = []
    for r in regions:  # each region's executor on its own, outside the program
        run = executor(r.executor)(tmp_path / "art" / r.artifact, engines)
        ins = [rng.standard_normal(s.shape).astype(s.dtype) for s in r.inputs]
        outs = [np.empty(s.shape, s.dtype) for s in r.outputs]
        alone.append(lambda run=run, ins=ins, outs=outs: run(ins, outs))
    with collage_runtime.load(tmp_path / "art", threads=2) as prog:
        (y,) = prog.invoke("main", x, w)
        ref = x
        for _ in range(LINKS):
            ref = np.tanh(ref @ w)
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
        f, dx, dw = prog.device_function("main"), prog.to_device(x), prog.to_device(w)
        program, parts = [], []
        for _ in range(3):  # interleaved rounds, medians
            program.append(_cpu_per_call(lambda: f(dx, dw)))
            # This thread's CPU time: a spinning pool of the program would otherwise bill the parts too.
            parts.append(sum(_cpu_per_call(a, time.thread_time) for a in alone))
    # With ORT's default spinning pools the program took ~15x the regions' CPU time (21 vs 1.3 ms), without
    # ~1.2x; boundaries add tens of µs per region.
    assert np.median(program) < 3 * np.median(parts) + LINKS * 200e-6, (program, parts)



@pytest.mark.parametrize("backend", ["openvino", "xla-cpu"])
def test_regions_load_in_order_and_reused_tensors_see_new_data(backend, tmp_path):
    """Regions of different lengths (1, 2, 3, 2 links): OpenVINO's load on the budget's threads at once
    and each must still serve its own region; tensors (OpenVINO) and PJRT buffers (XLA) reused while a
    buffer's address is unchanged must read each call's new data."""
    pytest.importorskip({"openvino": "openvino", "xla-cpu": "jaxlib"}[backend])
    from collage_runtime.executors import loads_concurrently

    assert loads_concurrently("collage_runtime.executors.openvino_model")
    assert not loads_concurrently("collage_runtime.executors.onnxruntime_session")
    if backend == "openvino":  # regions loading at once still share the program's one ov.Core
        from concurrent.futures import ThreadPoolExecutor

        engines = Engines(2)
        with ThreadPoolExecutor(4) as pool:
            assert len({id(c) for c in pool.map(lambda _: engines.openvino_core(), range(8))}) == 1
    bounds = [0, 1, 3, 6, 8]
    plan = Plan([Region(f"r{k}", backend, frozenset(range(2 * lo, 2 * hi)))
                 for k, (lo, hi) in enumerate(zip(bounds, bounds[1:]))], source="uneven chain")
    n = 32
    art = compile_module(parse_module(matmul_tanh_chain(n, bounds[-1]), new_context()), plan, tmp_path / "art")
    rng = np.random.default_rng(0)
    with collage_runtime.load(tmp_path / "art", threads=2) as prog:
        f = prog.device_function("main")
        for call in range(3):  # new data each call, in buffers IREE may place at the same addresses
            x, w = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32) / n
            ref = x
            for _ in range(bounds[-1]):
                ref = np.tanh(ref @ w)
            np.testing.assert_allclose(prog.invoke("main", x, w)[0], ref, rtol=1e-4, atol=1e-4, err_msg=f"call {call}")
            dx, dw = prog.to_device(x), prog.to_device(w)
            for _ in range(2):  # device-resident inputs: the same addresses call after call
                np.testing.assert_allclose(np.asarray(f(dx, dw)), ref, rtol=1e-4, atol=1e-4)


def test_openvino_compiled_model_cache_is_opt_in(tmp_path, monkeypatch):
    """COLLAGE_OPENVINO_CACHE_DIR: the first load fills the cache, a second load imports from it and
    computes what a load without the cache computes."""
    pytest.importorskip("openvino")
    boundary.compile_region("openvino", 64, tmp_path / "art")
    a, b = np.ones((8, 8), np.float32), np.eye(8, dtype=np.float32) * 2
    with collage_runtime.load(tmp_path / "art") as prog:
        want = prog.invoke("mm", a, b)[0]
    cache = tmp_path / "ov-cache"
    monkeypatch.setenv("COLLAGE_OPENVINO_CACHE_DIR", str(cache))
    for _ in range(2):
        with collage_runtime.load(tmp_path / "art") as prog:
            np.testing.assert_array_equal(prog.invoke("mm", a, b)[0], want)
        assert any(cache.iterdir())

@pytest.mark.serial
@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_boundary_bench_small(backend):
    pytest.importorskip({"ort": "onnxruntime", "openvino": "openvino"}[backend])
    row = boundary.measure(backend, 256, rounds=3)
    assert row["floor_us"] > 0 and row["e2e_us"] > 0
    assert row["overhead_us"] < 1000, row  # loose: measured ~10-20 µs on 2 shared cores


def test_thread_budget_reaches_iree_and_torch():
    torch = pytest.importorskip("torch")
    # IREE sizes its pool once per process, at the first device: count the workers in a fresh one.
    code = ("import os; from collage_runtime.engines import iree_device; n = len(os.listdir('/proc/self/task')); "
            "iree_device('local-task', {}); print(len(os.listdir('/proc/self/task')) - n)")
    added = [int(subprocess.run([sys.executable, "-c", code.format(k)], capture_output=True, text=True,
                                check=True).stdout) for k in (1, 3)]
    assert added[1] - added[0] == 2, added  # one IREE worker per thread of the budget
    Engines(1).torch()
    assert torch.get_num_threads() == 1
    with pytest.raises(ValueError, match="positive integer"):
        Engines(0)


def test_cli_run_threads(ort_region_artifact, tmp_path):
    from collage_mlir.tools.cli import main

    np.save(tmp_path / "a.npy", np.ones((8, 8), np.float32))
    np.save(tmp_path / "b.npy", np.eye(8, dtype=np.float32))
    args = ["run", str(ort_region_artifact), "--function", "mm", "--input", str(tmp_path / "a.npy"),
            "--input", str(tmp_path / "b.npy"), "--output-dir", str(tmp_path / "out")]
    assert main([*args, "--threads", "1"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "out_0.npy"), np.ones((8, 8), np.float32))
    with pytest.raises(SystemExit):
        main([*args, "--threads", "0"])
