"""What `collage bench`'s worker processes run (``Worker.call("collage_mlir.bench.tasks:<name>", ...)``):
one contender per process, set up once by ``prepare`` and kept in this module, then timed slice by slice
by ``sample`` while the other contenders' processes wait."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

#: The contender this worker process serves (one per process).
_prepared = None


def _pin(threads: int) -> None:
    """Restricts this process to ``threads`` CPUs, so engines that size their pools by the CPUs they
    may use (XLA, OpenMP) agree with the thread count the others are told."""
    if hasattr(os, "sched_getaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpus[:max(1, threads)])


def _save(path: str, arrays) -> None:
    np.savez(path, **{f"out{k}": np.asarray(a) for k, a in enumerate(arrays)})


def _memory_mb() -> tuple[float, float]:
    """(resident now, peak resident) of this process in MB."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    try:
        now = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return peak, peak
    return now, max(now, peak)  # the kernel's high-water mark can trail the current count by a few pages


def prepare(contender: str, model: str, small: bool, threads: int, work_dir: str, plan: str, outputs_file: str) -> dict:
    """Sets ``contender`` up on ``model`` and runs it once; writes that run's outputs to ``outputs_file``.
    Returns the seconds from nothing to the first result (export/compile/load + first call) and this
    process's resident and peak memory (MB) after it: the contender holds that while the others run."""
    global _prepared
    from .contenders import CONTENDERS, SetupContext

    _pin(threads)
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    prepared = CONTENDERS[contender].setup(SetupContext(model, small, threads, work, plan))
    prepared.run()
    compile_s = time.perf_counter() - t0
    _save(outputs_file, prepared.outputs())
    _prepared = prepared
    rss, peak = _memory_mb()
    return {"compile_s": compile_s, "rss_mb": rss, "peak_rss_mb": peak}


def sample(seconds: float, min_calls: int = 1) -> list[float]:
    """Runs the prepared contender for about ``seconds`` (at least ``min_calls`` calls); seconds per call."""
    run = _prepared.run
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return times


def breakdown(threads: int, repeats: int, max_seconds: float) -> dict | None:
    """Where the prepared contender's time goes (``collage_runtime.profile``), when it is a collage
    artifact; the JSON form of the ``Breakdown``."""
    from collage_runtime.profile import profile

    p = _prepared
    if p is None or p.artifact is None:
        return None
    return profile(p.artifact, p.inputs, threads=threads, op_count=p.op_count, repeats=repeats,
                   max_seconds=max_seconds).to_json()


def model_info(model: str, small: bool, stablehlo: bool, exact_file: str | None = None) -> dict:
    """The zoo model's floating-point operations per inference (see ``zoo.flops``) and, with ``stablehlo``,
    the seconds its torch-mlir import took (~0 when cached): done once here so that no contender's
    compile time includes it. With ``exact_file``, for a model computing in bf16, its exact arithmetic on the
    zoo inputs (IREE with every bf16 value computed in f32, ``reference.invoke_alone(exact=True)``) is written
    there (``out<k>``): every engine rounds a deep bf16 model at other places, and each is checked against the
    reference framework's run or within ``validate.BF16_SLACK`` of that run's own distance from the exact
    result (torch.compile and XLA on torch's bf16 ResNet-50 were `wrong` against eager bf16 alone)."""
    from .. import zoo
    from ..ir import new_context
    from ..measure.reference import holds_bf16, invoke_alone

    info = {"flop": zoo.flops(model, small), "import_s": None}
    module = None
    if stablehlo:
        t0 = time.perf_counter()
        module = zoo.import_stablehlo(model, new_context(), small)
        info["import_s"] = time.perf_counter() - t0
    if exact_file is not None:
        if module is None:
            module = zoo.import_stablehlo(model, new_context(), small)
        if holds_bf16(module):
            _save(exact_file, invoke_alone(module, {"main": zoo.numpy_inputs(model, small)}, exact=True)["main"])
    return info
