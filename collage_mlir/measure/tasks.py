"""The tasks workers run (``worker.Worker.call("collage_mlir.measure.tasks:<name>", ...)``): build a
module by a plan, and time a built artifact (validating its outputs first). Arguments and results are plain
data: paths, numbers, strings."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from .timing import TimingOptions, time_repeated
from .validate import compare

#: How workers name these tasks: ``f"{TASKS}:build_plan"``.
TASKS = __name__

#: Inside a region's data file: ``in<k>`` are the arguments of ``@main``, ``ref<k>`` its reference results.
INPUT, REFERENCE = "in", "ref"


def build_plan(module_file: str, plan: dict, out_dir: str) -> dict:
    """Compiles the module in ``module_file`` by ``plan`` (its JSON form) into the artifact directory
    ``out_dir``, exactly as ``collage compile`` would."""
    from ..artifact import compile_module
    from ..ir import new_context, parse_module
    from ..plan import Plan

    t0 = time.perf_counter()
    module = parse_module(Path(module_file).read_bytes(), new_context(), where=module_file)
    compile_module(module, Plan.from_json(plan, source=module_file), out_dir, source=module_file)
    return {"build_s": time.perf_counter() - t0}


def load_arrays(path: str, prefix: str) -> list[np.ndarray]:
    """Arrays ``<prefix>0, <prefix>1, ...`` of an ``.npz`` file, in order."""
    with np.load(path, allow_pickle=False) as data:
        count = sum(1 for k in data.files if k.startswith(prefix) and k[len(prefix):].isdigit())
        return [data[f"{prefix}{k}"] for k in range(count)]


def time_artifact(artifact_dir: str, data_file: str, timing: dict, rtol: float | None = None,
                  atol: float | None = None) -> dict:
    """Loads the artifact, runs ``main`` once on the data file's inputs and, when a tolerance is given,
    checks the results against its references (``wrong`` and no timing when they differ); then times it."""
    import collage_runtime

    inputs = load_arrays(data_file, INPUT)
    t0 = time.perf_counter()
    program = collage_runtime.load(artifact_dir)
    try:
        load_s = time.perf_counter() - t0
        result: dict = {"status": "ok", "load_s": load_s, "threads": _threads()}
        if rtol is not None:
            check = compare(program.invoke("main", *inputs), load_arrays(data_file, REFERENCE), rtol, atol or 0.0)
            result |= {"max_abs_err": check.max_abs, "max_rel_err": check.max_rel}
            if not check.ok:
                return result | {"status": "wrong", "message": check.message}
        fn = program.device_function("main")
        args = [program.to_device(a) for a in inputs]
        t = time_repeated(lambda: fn(*args), TimingOptions(**timing))
        return result | {"median_s": t.median_s, "min_s": t.min_s, "spread": t.spread, "repeats": t.repeats}
    finally:
        program.close()


def _threads() -> int:
    """CPU threads this process may run on (what the backends' thread pools share)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
