"""The tasks workers run (``worker.Worker.call("collage_mlir.measure.tasks:<name>", ...)``): build a
module by a plan, and time a built artifact (validating its outputs first). Arguments and results are plain
data: paths, numbers, strings in, frozen values (``Built``, ``Timed``) out.

A candidate is built exactly as ``collage compile`` builds a program, so its time is what it costs in a
deployed artifact. The compile driver is a later stage than measurement, so measurement does not import
it: the driver registers itself in the entry-point group ``collage_mlir.plan_builders`` (as backends
register in ``collage_mlir.backends``) and ``plan_builder`` finds it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from importlib.metadata import entry_points
from pathlib import Path
from typing import Protocol

import numpy as np

from collage_runtime.types import restored

from ..errors import CollageError
from ..ir import ir, new_context, parse_module
from ..plan import Plan
from .db import Measurement
from .status import Status
from .timing import TimingOptions, gives_up, time_repeated
from .validate import compare

#: How workers name these tasks: ``f"{TASKS}:build_plan"``.
TASKS = __name__

#: Inside a region's data file: ``in<k>`` are the arguments of ``@main``, ``ref<k>`` its reference results and,
#: for a model computing in bf16, ``exact<k>`` those of its exact arithmetic (``validate.compare``).
INPUT, REFERENCE, EXACT = "in", "ref", "exact"


#: Entry-point group of the compile driver (``collage_mlir.artifact:compile_module``).
PLAN_BUILDERS = "collage_mlir.plan_builders"


class PlanBuilder(Protocol):
    """What measurement needs of the compile driver: write the artifact of ``module`` under ``plan``."""

    def __call__(self, module: ir.Module, plan: Plan, out_dir: str | Path, *, source: str) -> object: ...


def plan_builder() -> PlanBuilder:
    """The installed compile driver (one entry in ``PLAN_BUILDERS``)."""
    found = list(entry_points(group=PLAN_BUILDERS))
    if len(found) != 1:
        names = ", ".join(ep.value for ep in found) or "none"
        raise CollageError(f"expected one plan builder in the entry-point group {PLAN_BUILDERS}, found {names}: "
                           "reinstall collage-mlir (pip install -e .)")
    return found[0].load()


@dataclass(frozen=True)
class Built:
    """What ``build_plan`` did: the artifact is written; ``build_s`` it took."""

    build_s: float


@dataclass(frozen=True)
class Timed:
    """What ``time_artifact`` found: ``status`` ``OK`` with the timing (median, fastest, relative spread of
    the samples, how many), or ``WRONG`` with why (no timing); the load time, the threads the process
    may run on and, when checked, the largest errors against the reference."""

    status: Status
    load_s: float
    threads: int
    median_s: float | None = None
    min_s: float | None = None
    spread: float | None = None
    repeats: int | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    message: str = ""

    def measurement(self, **key) -> Measurement:
        """The cost-DB row of this result under ``key`` (the row's key fields and region summary)."""
        return Measurement(status=self.status, median_s=self.median_s, min_s=self.min_s, spread=self.spread,
                           repeats=self.repeats, threads=self.threads, max_abs_err=self.max_abs_err,
                           max_rel_err=self.max_rel_err, message=self.message, **key)


def build_plan(module_file: str, plan: dict, out_dir: str) -> Built:
    """Compiles the module in ``module_file`` by ``plan`` (its JSON form) into the artifact directory
    ``out_dir``, exactly as ``collage compile`` would."""
    t0 = time.perf_counter()
    module = parse_module(Path(module_file).read_bytes(), new_context(), where=module_file)
    plan_builder()(module, Plan.from_json(plan, source=module_file), out_dir, source=module_file)
    return Built(time.perf_counter() - t0)


def load_arrays(path, prefix: str) -> list[np.ndarray]:
    """Arrays ``<prefix>0, <prefix>1, ...`` of an ``.npz`` file (a path or a file object), in order; bf16
    arrays as bf16 (``collage_runtime.types.restored``)."""
    with np.load(path, allow_pickle=False) as data:
        count = sum(1 for k in data.files if k.startswith(prefix) and k[len(prefix):].isdigit())
        return [restored(data[f"{prefix}{k}"]) for k in range(count)]


def time_artifact(artifact_dir: str, data_file: str, timing: dict | None, rtol: float | None = None,
                  atol: float | None = None, outputs_file: str | None = None) -> Timed:
    """Loads the artifact, runs ``main`` once on the data file's inputs and, when a tolerance is given,
    checks the results against its references and exact results if any (``wrong`` and no timing when they
    differ); then times it
    (not with ``timing`` None: a run for its results alone). With ``outputs_file`` the first run's results
    are saved there (``ref<k>``): a plan that is the reference (IREE alone) needs no second build to provide
    it."""
    import collage_runtime

    inputs = load_arrays(data_file, INPUT)
    t0 = time.perf_counter()
    program = collage_runtime.load(artifact_dir)
    try:
        load_s = time.perf_counter() - t0
        result = Timed(Status.OK, load_s, _threads())
        if outputs_file is not None:
            outputs = program.invoke("main", *inputs)
            np.savez(outputs_file, **{f"{REFERENCE}{k}": np.asarray(a) for k, a in enumerate(outputs)})
        if rtol is not None:
            t0 = time.perf_counter()
            outputs = program.invoke("main", *inputs)
            first_s = time.perf_counter() - t0
            check = compare(outputs, load_arrays(data_file, REFERENCE), rtol, atol or 0.0,
                            load_arrays(data_file, EXACT) or None)
            result = replace(result, max_abs_err=check.max_abs, max_rel_err=check.max_rel)
            if not check.ok:
                return replace(result, status=Status.WRONG, message=check.message)
            if timing is not None and gives_up(first_s, TimingOptions(**timing), cold=True):
                # The check call is the timing (``TimingOptions.give_up_s``): far slower than needed to win.
                return replace(result, median_s=first_s, min_s=first_s, spread=0.0, repeats=1)
        if timing is None:
            return result
        fn = program.device_function("main")
        args = [program.to_device(a) for a in inputs]
        warm = rtol is not None or outputs_file is not None  # a check or reference run came first
        t = time_repeated(lambda: fn(*args), TimingOptions(**timing), warm=warm)
        return replace(result, median_s=t.median_s, min_s=t.min_s, spread=t.spread, repeats=t.repeats)
    finally:
        program.close()


def _threads() -> int:
    """CPU threads this process may run on (what the backends' thread pools share)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
