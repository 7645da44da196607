"""Per-boundary overhead of each library and graph-level backend, in µs, vs tensor size.

The region is one matmul (M x 8) x (8 x 8) with M = N / 8, so input and output both hold N floats. Two
compiled functions: that region alone, and a chain of ``LINKS`` such regions (each its own executor, the
weight shared, each region's result the next one's input). Times, each the minimum over interleaved
rounds (the overhead is a difference of noisy times; the minimum is stable):

- ``e2e``: the one-region function called with device arrays (``Program.device_function``): Python →
  IREE VM → ``collage_rt`` import (map the inputs, allocate and map the result) → executor → back;
- ``chain``: the ``LINKS``-region function, the same way;
- ``alone``: the executor's own ``run`` on 64-byte aligned numpy arrays in-process (the engine call with
  its binding, as inside a program, where IREE's buffers are aligned);
- ``floor`` / ``floor_chain``: the same functions with the executor replaced by a no-op.

``boundary = (chain - e2e) / (LINKS - 1) - alone`` is what one more region costs inside a program beyond
its engine call: call in, results out (the VM's import call, the glue, the engine binding's share that
differs from the executor alone). ``overhead = e2e - alone`` also counts the outer call from Python into
the program (``Program.device_function``), paid once per program call, not per boundary.
``floor_per_region = (floor_chain - floor) / (LINKS - 1)`` is the boundary's engine-independent part.
Times are the process's CPU time (``time.process_time``, all threads: an engine's helper threads and any
spinning count) unless ``--wall``: on a shared 2-core machine wall time mostly measures the neighbours.

    python -m studies.boundary.boundary [--backends ...] [--sizes 256,4096,...] [--rounds 5] [--wall] [--out PATH]
    python -m studies.boundary.boundary --steps     # each step of a boundary, timed alone
    python -m studies.boundary.boundary --mix openvino,ort --sizes 256,65536   # a 2-region chain: CPU, and what the
                                         # engines' threads burn after a call (spinning: issue 10 item 1)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

import collage_runtime
from collage_runtime import rt_module
from collage_runtime.engines import Engines
from collage_runtime.executors import executor

SIZES = (256, 4096, 65536, 1048576, 4194304)  # floats: 1 KB ... 16 MB


LINKS = 5  # regions in the chain: the per-region cost is the slope over LINKS - 1 extra regions


def _module(m: int, links: int = 1) -> str:
    """``@mm(a, b)``: ``links`` chained (M x 8) x (8 x 8) matmuls, ``a @ b @ b ...``."""
    t = f"tensor<{m}x8xf32>"
    body, value = [], "%a"
    for k in range(links):
        body.append(f"  %{k} = stablehlo.dot_general {value}, %b, contracting_dims = [1] x [0] : ({t}, "
                    f"tensor<8x8xf32>) -> {t}")
        value = f"%{k}"
    return (f"func.func @mm(%a: {t}, %b: tensor<8x8xf32>) -> {t} {{\n" + "\n".join(body)
            + f"\n  return {value} : {t}\n}}\n")


def compile_region(backend: str, n: int, out_dir: Path, links: int = 1) -> dict:
    """Compiles the N-float matmul as one ``backend`` region (``links`` > 1: a chain of that many regions,
    one matmul each) into ``out_dir``; returns the first region's manifest entry."""
    from collage_mlir.iree import compile_module
    from collage_mlir.ir import new_context, parse_module

    module = parse_module(_module(n // 8, links), new_context())
    if links == 1:
        art = compile_module(module, f"prefer:{backend}", out_dir)
    else:
        from collage_mlir.plan import Plan, Region

        plan = Plan([Region(f"link{k}", backend, frozenset({k})) for k in range(links)], source="boundary chain")
        art = compile_module(module, plan, out_dir)
    regions = art.manifest.regions
    assert len(regions) == links, f"{backend}: expected {links} region(s), got {len(regions)}"
    return regions[0]


def _aligned(shape: tuple, dtype=np.float32) -> np.ndarray:
    """An uninitialised array whose data is 64-byte aligned, as IREE's buffers are (XLA copies unaligned
    inputs, which inside a program it does not have to)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    skip = -raw.ctypes.data % 64
    return raw[skip:skip + nbytes].view(dtype).reshape(shape)


def _per_call(fn, calls: int, clock) -> float:
    fn()
    t0 = clock()
    for _ in range(calls):
        fn()
    return (clock() - t0) / calls


def _load(root: Path, threads: int | None, noop: bool):
    """The program at ``root``; with ``noop``, every region's executor replaced by one that does nothing."""
    if not noop:
        return collage_runtime.load(root, threads=threads)
    real = rt_module.load_executor
    rt_module.load_executor = lambda *args: (lambda inputs, outputs: None)
    try:
        return collage_runtime.load(root, threads=threads)
    finally:
        rt_module.load_executor = real


def measure(backend: str, n: int, rounds: int = 5, wall: bool = False, threads: int | None = None,
            links: int = LINKS) -> dict:
    """Times e2e, chain, alone and the floors (see the module docstring) for an N-float region of
    ``backend``; µs."""
    clock = time.perf_counter if wall else time.process_time
    m = n // 8
    rng = np.random.default_rng(0)
    a, b, out = _aligned((m, 8)), _aligned((8, 8)), _aligned((m, 8))
    a[:] = rng.standard_normal((m, 8))
    b[:] = rng.standard_normal((8, 8)) / 3  # the chain's values stay O(1)
    calls = max(3, min(2000, int(2e7 // max(n, 1))))  # ~0.1 s or more per timing: small sizes are noisy
    with tempfile.TemporaryDirectory() as tmp:
        one, chain = Path(tmp) / "one", Path(tmp) / "chain"
        region = compile_region(backend, n, one)
        compile_region(backend, n, chain, links)
        progs = {"e2e": _load(one, threads, False), "chain": _load(chain, threads, False),
                 "floor": _load(one, threads, True), "floor_chain": _load(chain, threads, True)}
        run = executor(region.executor)(one / region.artifact, Engines(progs["e2e"].engines.threads))
        try:
            fns = {k: (p.device_function("mm"), p.to_device(a), p.to_device(b)) for k, p in progs.items()}
            times: dict[str, list[float]] = {k: [] for k in ("e2e", "chain", "alone", "floor", "floor_chain")}
            for _ in range(rounds):  # interleaved
                for k in times:
                    if k == "alone":
                        times[k].append(_per_call(lambda: run([a, b], [out]), calls, clock))
                    else:
                        f, da, db = fns[k]
                        times[k].append(_per_call(lambda: f(da, db), calls, clock))
        finally:
            fns = {}
            for p in progs.values():
                p.close()
    row = {k: min(v) * 1e6 for k, v in times.items()}
    per_region = (row["chain"] - row["e2e"]) / (links - 1)
    return {"backend": backend, "elements": n, "bytes": n * 4, "clock": "wall" if wall else "process_cpu",
            "links": links, "e2e_us": row["e2e"], "chain_us": row["chain"], "alone_us": row["alone"],
            "floor_us": row["floor"], "floor_chain_us": row["floor_chain"],
            "boundary_us": per_region - row["alone"], "overhead_us": row["e2e"] - row["alone"],
            "floor_per_region_us": (row["floor_chain"] - row["floor"]) / (links - 1)}


def _thread_cpu_ns() -> dict[str, int]:
    """CPU time of each of this process's threads, ns (``/proc/self/task/*/schedstat``)."""
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                out[t] = int(f.read().split()[0])
        except OSError:
            pass
    return out


def mixed_chain(backends: list[str], n: int, rounds: int = 7, threads: int | None = None) -> dict:
    """A chain of one N-float matmul region per backend in ``backends`` (e.g. openvino then ort), called
    with device-resident inputs: wall and process CPU per call (median and minimum over rounds), and the
    CPU every thread but the caller burns in the 50 ms after a call (5 calls per round; median and maximum
    over rounds): an engine whose workers spin after its region shows here."""
    import statistics
    import threading

    from collage_mlir.iree import compile_module
    from collage_mlir.ir import new_context, parse_module
    from collage_mlir.plan import Plan, Region

    m = n // 8
    wall, cpu, idle = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        plan = Plan([Region(f"r{k}", b, frozenset({k})) for k, b in enumerate(backends)], source="boundary mix")
        compile_module(parse_module(_module(m, len(backends)), new_context()), plan, Path(tmp))
        with collage_runtime.load(Path(tmp), threads=threads) as prog:
            f = prog.device_function("mm")
            rng = np.random.default_rng(0)
            a = prog.to_device(rng.standard_normal((m, 8)).astype(np.float32))
            b = prog.to_device((rng.standard_normal((8, 8)) / 3).astype(np.float32))
            calls = max(5, min(2000, int(2e7 // n)))
            me = str(threading.get_native_id())
            for _ in range(rounds):
                w0, c0 = time.perf_counter(), time.process_time()
                for _ in range(calls):
                    f(a, b)
                wall.append((time.perf_counter() - w0) / calls * 1e6)
                cpu.append((time.process_time() - c0) / calls * 1e6)
                burnt = 0
                for _ in range(5):
                    f(a, b)
                    s0 = _thread_cpu_ns()
                    time.sleep(0.05)
                    burnt += sum(v - s0.get(t, 0) for t, v in _thread_cpu_ns().items() if t != me)
                idle.append(burnt / 5 / 1e6)
    return {"backends": backends, "elements": n, "bytes": n * 4, "rounds": rounds,
            "wall_us_median": statistics.median(wall), "wall_us_min": min(wall),
            "cpu_us_median": statistics.median(cpu), "cpu_us_min": min(cpu),
            "idle_other_threads_ms_per_50ms_median": statistics.median(idle),
            "idle_other_threads_ms_per_50ms_max": max(idle)}


def steps(reps: int = 20000) -> list[tuple[str, float]]:
    """The boundary's steps one by one (µs, minimum of 5 x ``reps`` calls, process CPU): what a call of a
    1-input, 1-output region costs apart from the engine, and each engine's per-call Python work on a
    32 x 8 f32 identity / negation (binding, the engine call itself, XLA's copy out)."""
    import ctypes
    import timeit
    from functools import partial

    import iree.runtime as rt
    import onnxruntime as ort
    from onnxruntime.capi import _pybind_state as C

    device = rt.get_device("local-task")
    mem, usage = rt.MemoryType.DEVICE_LOCAL | rt.MemoryType.HOST_VISIBLE, rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING
    f32, shape, hal = np.dtype(np.float32), (32, 8), rt.HalElementType.FLOAT_32
    buf = device.allocator.allocate_buffer(memory_type=mem, allowed_usage=usage, allocation_size=1024)
    bv = rt.HalBufferView(buf, shape, hal)
    ref, mapped, arr, out = bv.ref, bv.map(), _aligned(shape), _aligned(shape)
    arr[:] = 1
    allocate = partial(device.allocator.allocate_buffer, int(mem), int(usage), 1024)
    cpu = ort.OrtDevice.make("cpu", 0)._get_c_device()
    value = C.OrtValue.ortvalue_from_numpy(arr, cpu)
    session = ort.InferenceSession(_onnx_identity(), providers=["CPUExecutionProvider"])
    binding = session.io_binding()._iobinding
    binding.bind_ortvalue_input("x", value)
    binding.bind_ortvalue_output("y", C.OrtValue.ortvalue_from_numpy(out, cpu))
    rows = [
        ("input: VmRef.deref(HalBufferView)", lambda: ref.deref(rt.HalBufferView)),
        ("input: HalBufferView.map()", lambda: bv.map()),
        ("input: np.ndarray over the mapping", lambda: np.ndarray(shape, f32, mapped)),
        ("(was) MappedMemory.asarray", lambda: mapped.asarray(shape, f32)),
        ("output: allocate_buffer (positional, bound at load)", allocate),
        ("(was) allocate_buffer with keywords", lambda: device.allocator.allocate_buffer(
            memory_type=mem, allowed_usage=usage, allocation_size=1024)),
        ("output: HalBufferView(...).ref", lambda: rt.HalBufferView(buf, shape, hal).ref),
        ("address: ctypes.addressof(c_char.from_buffer(a))", lambda: ctypes.addressof(ctypes.c_char.from_buffer(arr))),
        ("(was) address: a.ctypes.data", lambda: arr.ctypes.data),
        ("ort: OrtValue over the array", lambda: C.OrtValue.ortvalue_from_numpy(arr, cpu)),
        ("ort: bind_ortvalue_input", lambda: binding.bind_ortvalue_input("x", value)),
        ("(was) IOBinding.bind_input(ptr)", lambda: binding.bind_input("x", cpu, f32, list(shape), arr.ctypes.data)),
        ("ort: run_with_iobinding (identity, bound)", lambda: session._sess.run_with_iobinding(binding, None)),
    ]
    rows += _openvino_steps(arr, out) + _xla_steps(arr, out)
    return [(name, min(timeit.repeat(fn, number=reps, repeat=5, timer=time.process_time)) / reps * 1e6)
            for name, fn in rows]


def _openvino_steps(arr: np.ndarray, out: np.ndarray) -> list:
    try:
        import openvino as ov
        from openvino import _pyopenvino
    except ImportError:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "m.onnx").write_bytes(_onnx_identity("Neg"))
        compiled = ov.Core().compile_model(str(Path(tmp) / "m.onnx"), "CPU", {"INFERENCE_NUM_THREADS": 1})
    request = compiled.create_infer_request()
    tensor = ov.Tensor(arr, shared_memory=True)
    request.set_input_tensor(0, tensor)
    request.set_output_tensor(0, ov.Tensor(out, shared_memory=True))
    infer = _pyopenvino.InferRequest.infer
    return [("openvino: ov.Tensor(shared_memory=True)", lambda: ov.Tensor(arr, shared_memory=True)),
            ("openvino: set_input_tensor", lambda: request.set_input_tensor(0, tensor)),
            ("openvino: InferRequest.infer (negation, bound)", lambda: infer(request, {}, True, False))]


def _xla_steps(arr: np.ndarray, out: np.ndarray) -> list:
    try:
        from jax._src import core
        from jax._src.lib import _jax
        from jax._src.lib import xla_client as xc
        from jax.sharding import SingleDeviceSharding
    except ImportError:
        return []
    from collage_runtime.executors.xla_pjrt import compile_module

    t = "tensor<32x8xf32>"
    executable, device = compile_module(f"func.func @main(%x: {t}) -> {t} {{\n  %0 = stablehlo.negate %x : {t}\n"
                                        f"  return %0 : {t}\n}}\n", Engines(1))
    aval, sharding = core.ShapedArray(arr.shape, arr.dtype), SingleDeviceSharding(device)
    zero_copy = _jax.HostBufferSemantics.ZERO_COPY

    def put():
        return xc.batched_device_put(aval, sharding, [arr], [device], True, False, zero_copy, True)

    x = put()
    (result,) = executable.execute([x])
    return [("xla: batched_device_put (zero copy)", put),
            ("xla: execute (negation, input buffer reused)", lambda: executable.execute([x])),
            ("xla: result np.asarray + copyto", lambda: np.copyto(out, np.asarray(result), casting="no"))]


def _onnx_identity(op: str = "Identity") -> bytes:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 8])
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "identity", [x], [y])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB"


def table(rows: list[dict], key: str) -> str:
    sizes = sorted({r["bytes"] for r in rows})
    lines = ["| backend | " + " | ".join(_size(n) for n in sizes) + " |", "|---|" + "---:|" * len(sizes)]
    for b in dict.fromkeys(r["backend"] for r in rows):
        cells = {r["bytes"]: r for r in rows if r["backend"] == b}
        lines.append(f"| {b} | " + " | ".join(f"{cells[n][key]:.1f}" if n in cells else "" for n in sizes) + " |")
    return "\n".join(lines)


def main() -> None:
    from collage_mlir.backends import BackendKind
    from collage_mlir.search import available_backends

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default=",".join(b.name for b in available_backends()
                                                  if b.kind != BackendKind.CODEGEN))
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="tensor sizes in floats")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--wall", action="store_true", help="wall-clock instead of process CPU time")
    p.add_argument("--out", default=str(Path(__file__).parent / "boundary"))
    p.add_argument("--steps", action="store_true", help="time the boundary's steps one by one instead")
    p.add_argument("--mix", help="backends of a chain, one region each (e.g. openvino,ort): time it and the "
                                 "CPU its threads burn after a call, instead")
    a = p.parse_args()
    if a.steps:
        print("| step | µs |\n|---|---:|\n" + "\n".join(f"| {n} | {us:.2f} |" for n, us in steps()))
        return
    if a.mix:
        print("| chain | size | wall µs median (min) | CPU µs median (min) | other threads' CPU in 50 ms after a "
              "call, ms median (max) |\n|---|---|---:|---:|---:|")
        for n in a.sizes.split(","):
            r = mixed_chain(a.mix.split(","), int(n), a.rounds, a.threads)
            print(f"| {' -> '.join(r['backends'])} | {_size(r['bytes'])} | {r['wall_us_median']:.1f} "
                  f"({r['wall_us_min']:.1f}) | {r['cpu_us_median']:.1f} ({r['cpu_us_min']:.1f}) | "
                  f"{r['idle_other_threads_ms_per_50ms_median']:.2f} ({r['idle_other_threads_ms_per_50ms_max']:.2f}) |",
                  flush=True)
        return
    rows = [measure(b, int(n), a.rounds, a.wall, a.threads) for b in a.backends.split(",") for n in a.sizes.split(",")]
    clock = "wall" if a.wall else "process CPU"
    how = f"{clock} time, minimum over {a.rounds} interleaved rounds"
    text = (f"Per boundary inside a program, µs ({how}; (chain of {LINKS} regions - one region) / {LINKS - 1} "
            f"minus the executor alone on aligned arrays):\n\n{table(rows, 'boundary_us')}\n\n"
            f"One-region call minus the executor alone (also counts the outer Python → program call), µs:\n\n"
            f"{table(rows, 'overhead_us')}\n\n"
            f"Floor per region (no-op executors: (chain - one) / {LINKS - 1}; VM import call + collage_rt glue), µs:"
            f"\n\n{table(rows, 'floor_per_region_us')}\n\n"
            f"Floor of a one-region call (no-op executor: Python → VM → collage_rt glue → back), µs:\n\n"
            f"{table(rows, 'floor_us')}\n\nExecutor alone, µs:\n\n{table(rows, 'alone_us')}\n\n"
            f"One-region call end to end, µs:\n\n{table(rows, 'e2e_us')}\n")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    # What the runtime sets when it is first to import torch (executors/torch_steps.py); here the compiler
    # imports torch before it, and spinning OpenMP workers made onednn's CPU times vary 40-330 µs.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    main()
