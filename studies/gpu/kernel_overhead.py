"""What a kernel region costs beyond its kernel, on the GPU machine (no IREE compiler needed).

For each bundle model ``tiny.chain2``/``tiny.chain8`` (2 and 8 linear layers, one region a layer) and each
plan, times the program's calls (inputs on the device, each call synchronised, interleaved rounds, median);
the difference of the two lengths over 6 layers is one layer's cost in that plan. For the kernel plans it
also launches every cubin of the artifact alone with CuPy (``kernels/*.json``: entry, grid, block, shared
memory): ``repeats`` launches captured in one CUDA graph, replayed and timed with CUDA events, so no host
launch cost is counted: the kernel's own time. A region's overhead is its layer cost minus its kernel's.

    python -m studies.gpu.kernel_overhead BUNDLE OUT [--seconds 3] [--iree-flag=--cuda_async_allocations=false]
    python -m studies.gpu.kernel_overhead --kernels-of ARTIFACT OUT   # one program's kernels, each alone

``--kernels-of`` times every kernel of one artifact (a tuned plan's) alone and sums them: the plan's time
less that sum is what IREE's own dispatches and the seams cost.

``--iree-flag`` sets an IREE runtime flag before the programs load (``--cuda_async_allocations=false``:
no stream-ordered pools, so a served cuBLAS region takes the program's buffers through DLPack without a
copy); ``--name`` names the result file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from .bundle import Bundle
from .run import use_bundle_paths

KERNEL_SUFFIXES = ("cubin",)


def binding_sizes(spec: dict) -> list[int]:
    """Elements of each tensor a kernel of ``spec`` (a ``GemmSpec``/``ConvSpec`` as JSON) reads and writes, in
    binding order: its two operands, the bias and the residual where it has them, the output."""
    if spec.get("kind", "gemm") == "gemm":
        b, m, n, k = spec["batch"], spec["m"], spec["n"], spec["k"]
        ins, out = [b * m * k, b * n * k], b * m * n
    else:
        x = spec["n"] * spec["c"] * spec["h"] * spec["w"]
        w = spec["k"] * (spec["c"] // spec["groups"]) * spec["r"] * spec["s"]
        ins, out = [x, w], spec["n"] * spec["k"] * spec["oh"] * spec["ow"]
    return [*ins, *([spec["bias"]] if spec["bias"] else []), *([out] if spec["residual"] else []), out]


def kernel_us(folder: Path, repeats: int = 200) -> list[dict]:
    """Each kernel of an artifact launched alone ``repeats`` times: its name and median-of-5 time in µs."""
    import cupy as cp

    found = []
    for meta_path in sorted((folder / "kernels").glob("*.json")):
        meta = json.loads(meta_path.read_text())
        spec = meta["spec"]
        mod = cp.RawModule(path=str(meta_path.parent / meta["object"]))
        fn = mod.get_function(meta["export"])
        if meta["shared_bytes"] > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = meta["shared_bytes"]
        dt = {"f32": cp.float32, "f16": cp.float16, "bf16": cp.float32}[spec["element"]]
        args = [cp.random.standard_normal(size).astype(dt) for size in binding_sizes(spec)]
        args += [cp.zeros(16, cp.int8)] * meta["trailing_pointers"]
        grid, block, shared = tuple(meta["grid"]), tuple(meta["block"]), meta["shared_bytes"]
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            for _ in range(10):
                fn(grid, block, tuple(args), shared_mem=shared)
            stream.synchronize()
            stream.begin_capture()
            for _ in range(repeats):
                fn(grid, block, tuple(args), shared_mem=shared)
            graph = stream.end_capture()
            graph.launch(stream)
            stream.synchronize()
            times = []
            for _ in range(5):
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                start.record(stream)
                graph.launch(stream)
                stop.record(stream)
                stop.synchronize()
                times.append(cp.cuda.get_elapsed_time(start, stop) * 1e3 / repeats)
        found.append({"kernel": meta_path.name.removesuffix(".json"), "kind": spec.get("kind", "gemm"),
                      "us": round(statistics.median(times), 2)})
    return found


def program_us(programs: dict[str, tuple], seconds: float) -> dict[str, float]:
    """Median µs of a synchronised call of each program (on device arrays made once), rounds interleaved
    for ``seconds``."""
    samples: dict[str, list[float]] = {k: [] for k in programs}
    calls = {}
    for name, (prog, fn, xs) in programs.items():
        f, args = prog.device_function(fn), [prog.to_device(a) for a in xs]
        calls[name] = (f, args)
        for _ in range(5):
            f(*args)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for name, (f, args) in calls.items():
            t = time.perf_counter()
            for _ in range(10):
                f(*args)  # returns when its work is done (IREE's synchronous wrapper awaits its fence)
            samples[name].append((time.perf_counter() - t) / 10 * 1e6)
    return {k: round(statistics.median(v), 1) for k, v in samples.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.gpu.kernel_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", type=Path, help="a study bundle (or, with --kernels-of, an artifact)")
    p.add_argument("out", type=Path)
    p.add_argument("--kernels-of", action="store_true", help="BUNDLE is one artifact: time its kernels")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--iree-flag", action="append", default=[], help="an IREE runtime flag, before any load")
    p.add_argument("--name", default="kernel_overhead")
    args = p.parse_args(argv)
    use_bundle_paths(args.bundle)
    import iree.runtime as rt
    import torch
    from collage_runtime import Program

    if args.iree_flag:
        rt.flags.parse_flags(*args.iree_flag)
    if args.kernels_of:
        kernels = kernel_us(args.bundle)
        total = round(sum(k["us"] for k in kernels), 1)
        by_kind = {kind: round(sum(k["us"] for k in kernels if k["kind"] == kind), 1) for kind in {k["kind"] for k in kernels}}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.json").write_text(json.dumps({"artifact": str(args.bundle), "kernels": kernels,
                                                                "total_us": total, "by_kind_us": by_kind}, indent=1))
        print(f"{len(kernels)} kernels, {total} µs alone in all ({by_kind})")
        return 0

    bundle = Bundle.load(args.bundle)
    entries = {e.spec.label: e for e in bundle.models if e.spec.name in ("chain2", "chain8")}
    programs, kernels = {}, {}
    for label, entry in entries.items():
        xs = [np.load(args.bundle / f) for f in entry.inputs]
        for plan in entry.plans:
            folder = args.bundle / plan.artifact
            programs[f"{label} {plan.plan}"] = (Program(folder), entry.function, xs)
            if (folder / "kernels").is_dir():
                kernels[f"{label} {plan.plan}"] = kernel_us(folder)
    times = program_us(programs, args.seconds)
    rows = []
    for plan in sorted({k.split(" ", 1)[1] for k in times}):
        for dtype in sorted({lbl.partition("+")[2] or "f32" for lbl in entries}):
            suffix = "" if dtype == "f32" else f"+{dtype}"
            short, long_ = f"tiny.chain2{suffix} {plan}", f"tiny.chain8{suffix} {plan}"
            if short not in times or long_ not in times:
                continue
            layer = (times[long_] - times[short]) / 6
            ks = kernels.get(long_)
            kernel = statistics.median(k["us"] for k in ks) if ks else None
            rows.append({"plan": plan, "dtype": dtype, "call_us_2": times[short], "call_us_8": times[long_],
                         "layer_us": round(layer, 2), "kernel_us": kernel,
                         "overhead_us": None if kernel is None else round(layer - kernel, 2)})
    result = {"device": torch.cuda.get_device_name(0), "iree_flags": args.iree_flag, "programs_us": times,
              "kernels": kernels, "layers": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1))
    for r in rows:
        print(json.dumps(r))
    for name, (prog, _, _) in programs.items():
        prog.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
