"""Per-boundary overhead of each library and graph-level backend, in µs, vs tensor size.

The region is one matmul (M x 8) x (8 x 8) with M = N / 8, so input and output both hold N floats; the
compiled function is that region alone, so a call is: Python → IREE VM → ``collage_rt`` import (map the
inputs, allocate and map the result) → executor → back. Three times per backend and size, each the
minimum over interleaved rounds (the overhead is a difference of noisy times; the minimum is stable):

- ``e2e``: the compiled function called with device arrays (``Program.device_function``);
- ``alone``: the executor's own ``run`` on numpy arrays in-process (the engine call with its binding);
- ``floor``: the same function with the executor replaced by a no-op: Python → VM → import glue → back.

``overhead = e2e - alone`` is what crossing the boundary costs; ``floor`` is its engine-independent part.
Times are the process's CPU time (``time.process_time``, all threads: an engine's helper threads and any
spinning count) unless ``--wall``: on a shared 2-core machine wall time mostly measures the neighbours.

    python bench/boundary.py [--backends ...] [--sizes 256,4096,...] [--rounds 5] [--wall] [--out PATH]
    python bench/boundary.py --steps     # each step of a boundary, timed alone
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


def _module(m: int) -> str:
    return (f"func.func @mm(%a: tensor<{m}x8xf32>, %b: tensor<8x8xf32>) -> tensor<{m}x8xf32> {{\n"
            f"  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<{m}x8xf32>, "
            f"tensor<8x8xf32>) -> tensor<{m}x8xf32>\n  return %0 : tensor<{m}x8xf32>\n}}\n")


def compile_region(backend: str, n: int, out_dir: Path) -> dict:
    """Compiles the N-float matmul as one ``backend`` region into ``out_dir``; returns its manifest entry."""
    from collage_mlir.iree import compile_module
    from collage_mlir.ir import new_context, parse_module

    art = compile_module(parse_module(_module(n // 8), new_context()), f"prefer:{backend}", out_dir)
    (region,) = art.manifest["regions"]
    return region


def _per_call(fn, calls: int, clock) -> float:
    fn()
    t0 = clock()
    for _ in range(calls):
        fn()
    return (clock() - t0) / calls


def measure(backend: str, n: int, rounds: int = 5, wall: bool = False, threads: int | None = None) -> dict:
    """Times e2e, alone and floor (see the module docstring) for an N-float region of ``backend``; µs."""
    clock = time.perf_counter if wall else time.process_time
    m = n // 8
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
    out = np.empty((m, 8), np.float32)
    calls = max(3, min(300, int(2e6 // max(n, 1))))
    with tempfile.TemporaryDirectory() as tmp:
        region = compile_region(backend, n, Path(tmp) / "art")
        prog = collage_runtime.load(Path(tmp) / "art", threads=threads)
        run = executor(region["executor"])(Path(tmp) / "art" / region["artifact"], Engines(prog.engines.threads))
        real = rt_module.load_executor
        rt_module.load_executor = lambda *args: (lambda inputs, outputs: None)
        try:
            floor_prog = collage_runtime.load(Path(tmp) / "art", threads=threads)
        finally:
            rt_module.load_executor = real
        with prog, floor_prog:
            f, g = prog.device_function("mm"), floor_prog.device_function("mm")
            da, db = prog.to_device(a), prog.to_device(b)
            times: dict[str, list[float]] = {"e2e": [], "alone": [], "floor": []}
            for _ in range(rounds):  # interleaved
                times["e2e"].append(_per_call(lambda: f(da, db), calls, clock))
                times["alone"].append(_per_call(lambda: run([a, b], [out]), calls, clock))
                times["floor"].append(_per_call(lambda: g(da, db), calls, clock))
    row = {k: min(v) * 1e6 for k, v in times.items()}
    return {"backend": backend, "elements": n, "bytes": n * 4, "clock": "wall" if wall else "process_cpu",
            "e2e_us": row["e2e"], "alone_us": row["alone"], "floor_us": row["floor"],
            "overhead_us": row["e2e"] - row["alone"]}


def steps(reps: int = 20000) -> list[tuple[str, float]]:
    """The boundary's steps one by one (µs, minimum of 5 x ``reps`` calls, process CPU): what a call of a
    1-input, 1-output region costs apart from the engine, and ONNX Runtime's per-tensor binding."""
    import timeit

    import iree.runtime as rt
    import onnxruntime as ort
    from onnxruntime.capi import _pybind_state as C

    device = rt.get_device("local-task")
    mem, usage = rt.MemoryType.DEVICE_LOCAL | rt.MemoryType.HOST_VISIBLE, rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING
    f32, shape, hal = np.dtype(np.float32), (32, 8), rt.HalElementType.FLOAT_32
    buf = device.allocator.allocate_buffer(memory_type=mem, allowed_usage=usage, allocation_size=1024)
    bv = rt.HalBufferView(buf, shape, hal)
    ref, mapped, arr = bv.ref, bv.map(), np.zeros(shape, f32)
    cpu = ort.OrtDevice.make("cpu", 0)._get_c_device()
    value = C.OrtValue.ortvalue_from_numpy(arr, cpu)
    binding = ort.InferenceSession(_onnx_identity(), providers=["CPUExecutionProvider"]).io_binding()._iobinding
    rows = [
        ("input: VmRef.deref(HalBufferView)", lambda: ref.deref(rt.HalBufferView)),
        ("input: HalBufferView.map()", lambda: bv.map()),
        ("input: np.ndarray over the mapping", lambda: np.ndarray(shape, f32, mapped)),
        ("(was) MappedMemory.asarray", lambda: mapped.asarray(shape, f32)),
        ("output: allocate_buffer", lambda: device.allocator.allocate_buffer(
            memory_type=mem, allowed_usage=usage, allocation_size=1024)),
        ("output: HalBufferView(...).ref", lambda: rt.HalBufferView(buf, shape, hal).ref),
        ("ort: OrtValue over the array", lambda: C.OrtValue.ortvalue_from_numpy(arr, cpu)),
        ("ort: bind_ortvalue_input", lambda: binding.bind_ortvalue_input("x", value)),
        ("(was) IOBinding.bind_input(ptr)", lambda: binding.bind_input("x", cpu, f32, list(shape), arr.ctypes.data)),
    ]
    return [(name, min(timeit.repeat(fn, number=reps, repeat=5, timer=time.process_time)) / reps * 1e6)
            for name, fn in rows]


def _onnx_identity() -> bytes:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 8])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", [x], [y])
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
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "boundary"))
    p.add_argument("--steps", action="store_true", help="time the boundary's steps one by one instead")
    a = p.parse_args()
    if a.steps:
        print("| step | µs |\n|---|---:|\n" + "\n".join(f"| {n} | {us:.2f} |" for n, us in steps()))
        return
    rows = [measure(b, int(n), a.rounds, a.wall, a.threads) for b in a.backends.split(",") for n in a.sizes.split(",")]
    clock = "wall" if a.wall else "process CPU"
    text = (f"Per-boundary overhead, µs ({clock} time; minimum over {a.rounds} interleaved rounds of e2e minus the "
            f"executor alone on the same arrays):\n\n{table(rows, 'overhead_us')}\n\n"
            f"Floor (the same call with a no-op executor: Python → VM → collage_rt glue → back), µs:\n\n"
            f"{table(rows, 'floor_us')}\n\nExecutor alone, µs:\n\n{table(rows, 'alone_us')}\n")
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
