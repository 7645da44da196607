"""Runs a bundle on the GPU machine: the gpu-marked tests, then per model each compiled plan's numerics
against torch eager on the same device and interleaved timings of every plan, torch eager and
``torch.compile``. Writes ``OUT/results.json`` and ``OUT/results.md`` after every model, so a run stopped
by its budget (or a signal) leaves what it measured.

    python -m studies.gpu.run build/gpu_bundle out/gpu --seconds 15
    python -m studies.gpu.run /tmp/b /tmp/out --device cpu --seconds 2      # the CPU check CI runs

Imports ``collage_runtime``, torch, numpy and ``collage_mlir.zoo`` (torch only), never ``iree.compiler``:
the GPU machine has IREE's runtime wheel alone. Installs nothing.
"""

from __future__ import annotations

import argparse
import math
import os
import platform as py_platform
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from collage_mlir.measure.validate import HALF_RTOL

from .bundle import SITE, Bundle, ModelEntry, build_model
from .results import Environment, ModelResult, PlanCheck, Results, TestRun, Timing

ROOT = Path(__file__).resolve().parents[2]
#: max |program - torch eager| / max |torch eager| a program may reach (f32, TF32 off).
TOLERANCE = 1e-3
#: Seconds the whole run may take (the GPU machine allows 10 minutes per command).
BUDGET_S = 540.0
#: What a model needs at least (load, check, a few timing rounds) to be started.
MODEL_MIN_S = 20.0
WARMUP_CALLS = 5


class Stop(Exception):
    """The run must stop now (SIGTERM, SIGINT): write what there is."""


class CompileCap(Exception):
    """torch.compile's first call ran past its cap."""


@dataclass(frozen=True)
class Contender:
    name: str
    kind: str                 # "collage" or "peer"
    call: Callable[[], object]
    sync: Callable[[], None]
    compile_s: float | None = None
    note: str = ""


class Deadline:
    def __init__(self, seconds: float):
        self.start, self.end = time.monotonic(), time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def use_bundle_paths(bundle_dir: Path) -> list[str]:
    """Puts the repository's runtime and the bundle's executor registration first on ``sys.path``
    (collage is not installed on the GPU machine); the entries, for a child's PYTHONPATH."""
    entries = [str(ROOT / "runtime"), str((bundle_dir / SITE).resolve()), str(ROOT)]
    for e in reversed(entries):
        if e not in sys.path:
            sys.path.insert(0, e)
    return entries


def iree_runtime_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("iree-base-runtime")
    except PackageNotFoundError:
        import iree.runtime.version as v

        return str(getattr(v, "VERSION", "?"))


def nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return py_platform.processor() or "cpu"


def environment(device: str, bundle: Bundle) -> Environment:
    import torch

    cuda = device == "cuda"
    cap = torch.cuda.get_device_capability(0) if cuda else None
    return Environment(device, torch.cuda.get_device_name(0) if cuda else cpu_name(),
                       f"sm_{cap[0]}{cap[1]}" if cap else None, nvidia_driver() if cuda else None,
                       py_platform.python_version(), torch.__version__, torch.version.cuda if cuda else None,
                       str(torch.backends.cudnn.version()) if cuda else None, iree_runtime_version(),
                       bundle.arch, bundle.created)


def gpu_test_files() -> list[Path]:
    """The test files holding gpu-marked tests."""
    return sorted(p for p in (ROOT / "test" / "python").rglob("test_*.py") if "pytest.mark.gpu" in p.read_text())


def run_gpu_tests(out: Path, pythonpath: list[str], timeout: float) -> TestRun:
    """``pytest -m gpu`` on the gpu-marked files, in a child process; a file that cannot be collected
    because ``iree.compiler`` is not installed is skipped (``studies.gpu.pytest_skip``)."""
    files = gpu_test_files()
    rel = tuple(str(f.relative_to(ROOT)) for f in files)
    xml = out / "pytest.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-m", "gpu", "-p", "studies.gpu.pytest_skip", "-p", "no:cacheprovider",
           f"--junitxml={xml}", *rel]
    shown = "python -m pytest -q -m gpu " + " ".join(rel)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*pythonpath, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    start = time.monotonic()
    try:
        import pytest  # noqa: F401
    except ImportError:
        return TestRun(shown, rel, 0, 0, 0, 0, None, "pytest is not installed (install the bundle's wheels)", 0.0)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return TestRun(shown, rel, 0, 0, 0, 0, None, f"timed out after {timeout:.0f} s", time.monotonic() - start)
    (out / "pytest.log").write_text(proc.stdout + proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    summary = lines[-1].strip("= ") if lines else (proc.stderr.strip().splitlines() or ["no output"])[-1]
    counts = {k: 0 for k in ("passed", "failed", "skipped", "errors")}
    for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary):
        key = "errors" if word.startswith("error") else word
        if key in counts:
            counts[key] = int(n)
    return TestRun(shown, rel, counts["passed"], counts["failed"], counts["skipped"], counts["errors"], proc.returncode,
                   summary, round(time.monotonic() - start, 1))


def load_arrays(bundle_dir: Path, files: tuple[str, ...]) -> list[np.ndarray]:
    return [np.load(bundle_dir / f) for f in files]


def as_list(result) -> list:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def max_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """max |got - want| / max |want| over all outputs (inf where counts, shapes or finiteness differ)."""
    if len(got) != len(want):
        return math.inf
    err, scale = 0.0, 0.0
    for g, w in zip(got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.shape != w.shape or not np.isfinite(g).all():
            return math.inf
        err = max(err, float(np.abs(g - w).max(initial=0.0)))
        scale = max(scale, float(np.abs(w).max(initial=0.0)))
    return err / max(scale, 1e-30)


def torch_setup(device: str) -> None:
    """f32 everywhere: TF32 off for cuBLAS and cuDNN (the reference and the peers); cuDNN picks its
    fastest algorithm per shape (benchmark mode), as a tuned PyTorch deployment does."""
    import torch

    torch.set_float32_matmul_precision("highest")
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True


def plan_tolerance(entry: ModelEntry, plan, tolerance: float) -> float:
    """The error a plan (None: the rebuilt torch model) may show against its reference: ``tolerance`` in
    f32; an f16 output at its own precision (``HALF_RTOL``, as collage's own checks), and a ``triton-tf32``
    plan's 10-bit mantissas likewise."""
    half = HALF_RTOL["float16"]
    return max(tolerance, half) if entry.spec.dtype != "f32" or (plan and "tf32" in plan.plan) else tolerance


def check_plan(program, plan, entry: ModelEntry, inputs, want, tolerance: float, load_s: float) -> PlanCheck:
    """The program's outputs on ``inputs`` against ``want`` (torch eager on the same device)."""
    try:
        got = as_list(program.invoke(entry.function, *inputs))
    except Exception as exc:  # noqa: BLE001  (a failing program is a result)
        return PlanCheck(plan.plan, plan.regions, plan.backends, load_s, None, False,
                         f"run failed: {' '.join(str(exc).split())[:200]}")
    err = max_error(got, want)
    ok = err <= tolerance
    return PlanCheck(plan.plan, plan.regions, plan.backends, load_s, err, ok,
                     "" if ok else f"error {err:.3g} over {tolerance:g}")


def collage_contender(program, plan, entry: ModelEntry, inputs) -> Contender:
    """The program's function on device arrays made once (no copies in or out per call). A compiled
    function returns when its work is done (IREE's synchronous wrapper awaits its fence)."""
    fn = program.device_function(entry.function)
    args = [program.to_device(a) for a in inputs]
    return Contender(f"collage {plan.plan}", "collage", lambda: fn(*args), lambda: None)


def abandon_compile() -> None:
    """After an interrupted or failed torch.compile: dynamo's caches dropped and inductor's compile workers
    shut down, so they take no CPU from the timings that follow."""
    import torch

    torch._dynamo.reset()
    try:
        from torch._inductor.async_compile import shutdown_compile_workers

        shutdown_compile_workers()
    except ImportError:
        pass


def _alarm(signum, frame):
    raise CompileCap()


def torch_contenders(model, inputs, device: str, compile_mode: str | None, cap: float, want) -> list[Contender]:
    """torch eager and, when ``compile_mode`` is given, ``torch.compile`` (inductor) with its first call
    (the compile) capped at ``cap`` seconds; a compile that fails or runs over is a contender with a note
    and no call."""
    import torch

    xs = [torch.from_numpy(a).to(device) for a in inputs]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def eager():
        with torch.inference_mode():
            return model(*xs)

    found = [Contender("torch eager", "peer", eager, sync)]
    if compile_mode is None:
        return found
    compiled = torch.compile(model, backend="inductor", mode=compile_mode)

    def fast():
        with torch.inference_mode():
            return compiled(*xs)

    start = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, max(cap, 1.0))
    try:
        first = as_list(fast())
        sync()
        got = [t.detach().float().cpu().numpy() for t in first]
    except CompileCap:
        abandon_compile()
        return [*found, Contender("torch.compile", "peer", None, sync, round(time.perf_counter() - start, 1),
                                  f"skipped: compile ran past the {cap:.0f} s cap")]
    except Exception as exc:  # noqa: BLE001  (dynamo may wrap the cap's exception in its own)
        signal.setitimer(signal.ITIMER_REAL, 0)
        took = round(time.perf_counter() - start, 1)
        abandon_compile()
        why = (f"skipped: compile ran past the {cap:.0f} s cap" if took >= cap - 0.5 else
               f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
        return [*found, Contender("torch.compile", "peer", None, sync, took, why)]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    compile_s = round(time.perf_counter() - start, 1)
    late = f"; past the {cap:.0f} s cap: the alarm did not interrupt it" if compile_s > cap + 1 else ""
    return [*found, Contender("torch.compile", "peer", fast, sync, compile_s,
                              f"max error vs eager {max_error(got, want):.2e}, mode {compile_mode}{late}")]


def time_interleaved(contenders: list[Contender], seconds: float) -> list[Timing]:
    """Warm-up, then rounds of one sample per contender (the order rotating each round) for ``seconds``;
    each sample is the mean of ``inner`` calls, each call synchronised (batch-1 latency)."""
    live = [c for c in contenders if c.call is not None]

    def one(c: Contender) -> float:
        t = time.perf_counter()
        c.call()
        c.sync()
        return time.perf_counter() - t

    inner = {}
    for c in live:
        for _ in range(WARMUP_CALLS):
            one(c)
        est = min(one(c) for _ in range(3))
        inner[c.name] = max(1, min(20, int(1e-3 / max(est, 1e-7))))
    samples: dict[str, list[float]] = {c.name: [] for c in live}
    end, r = time.monotonic() + seconds, 0
    while live and (time.monotonic() < end or r < 3):
        for c in live[r % len(live):] + live[:r % len(live)]:
            n = inner[c.name]
            samples[c.name].append(sum(one(c) for _ in range(n)) / n)
        r += 1
    out = []
    for c in contenders:
        s = samples.get(c.name, [])
        status = "ok" + (f" ({c.note})" if c.note else "") if s else c.note or "not timed"
        out.append(Timing(c.name, c.kind, statistics.median(s) * 1e3 if s else None, min(s) * 1e3 if s else None,
                          len(s), inner.get(c.name, 0), c.compile_s, status))
    return out


def summarise(timings: list[Timing]) -> tuple[str | None, str | None, float | None, float | None]:
    """(best collage plan, best peer, peer / collage, default / best library mix) from median times."""
    timed = [t for t in timings if t.median_ms is not None]
    col = [t for t in timed if t.kind == "collage"]
    peers = [t for t in timed if t.kind == "peer"]
    best_c = min(col, key=lambda t: t.median_ms, default=None)
    best_p = min(peers, key=lambda t: t.median_ms, default=None)
    speedup = best_p.median_ms / best_c.median_ms if best_c and best_p else None
    default = next((t for t in col if t.contender == "collage default"), None)
    mixes = [t for t in col if t.contender != "collage default"]
    best_mix = min(mixes, key=lambda t: t.median_ms, default=None)
    mix = default.median_ms / best_mix.median_ms if default and best_mix else None
    return (best_c.contender if best_c else None, best_p.contender if best_p else None,
            round(speedup, 3) if speedup else None, round(mix, 3) if mix else None)


def measure_model(entry: ModelEntry, bundle_dir: Path, device: str, args, deadline: Deadline) -> ModelResult:
    """Numerics then timings of one model; stops at the deadline with what it has (``complete`` False)."""
    import torch
    from collage_runtime import Program

    notes: list[str] = []
    inputs = load_arrays(bundle_dir, entry.inputs)
    expected = load_arrays(bundle_dir, entry.expected)
    model, _ = build_model(entry.spec)
    model = model.to(device)
    xs = [torch.from_numpy(a).to(device) for a in inputs]
    with torch.inference_mode():
        want = [t.detach().float().cpu().numpy() for t in as_list(model(*xs))]
    ref_err = max_error(want, expected)
    ref_ok = ref_err <= plan_tolerance(entry, None, args.tolerance)
    if not ref_ok:
        notes.append(f"torch eager on {device} differs from the bundle's CPU reference by {ref_err:.3g}: "
                     "the rebuilt model is not the one compiled (or the device's torch is wrong)")
    checks, contenders, programs = [], [], []
    try:
        for plan in entry.plans:
            if deadline.left() < MODEL_MIN_S / 2:
                notes.append(f"stopped before plan {plan.plan}: time budget")
                break
            start = time.perf_counter()
            try:
                program = Program(bundle_dir / plan.artifact)
            except Exception as exc:  # noqa: BLE001
                checks.append(PlanCheck(plan.plan, plan.regions, plan.backends, None, None, False,
                                        f"load failed: {' '.join(str(exc).split())[:200]}"))
                continue
            programs.append(program)
            load_s = round(time.perf_counter() - start, 2)
            check = check_plan(program, plan, entry, inputs, want, plan_tolerance(entry, plan, args.tolerance), load_s)
            checks.append(check)
            if check.max_error is not None:  # it runs: time it even when wrong, the table says FAIL
                contenders.append(collage_contender(program, plan, entry, inputs))
        compile_mode = args.compile_mode if (device == "cuda" and not args.no_compile) or args.torch_compile else None
        room = deadline.left() - args.seconds - 10
        cap = min(args.compile_cap, room)
        if compile_mode is not None and room < 10:
            notes.append("torch.compile skipped: time budget")
            compile_mode = None
        contenders = [*contenders, *torch_contenders(model, inputs, device, compile_mode, cap, want)]
        seconds = max(0.5, min(args.seconds, deadline.left() - 5))
        timings = time_interleaved(contenders, seconds)
    finally:
        for p in programs:
            p.close()
    complete = len(checks) == len(entry.plans) and not any(n.startswith("stopped") for n in notes)
    best_c, best_p, speedup, mix = summarise(timings)
    return ModelResult(entry.spec.label, ref_err, ref_ok, tuple(checks), tuple(timings), best_c, best_p, speedup,
                       mix, complete, tuple(notes))


def _stop(signum, frame):
    raise Stop(f"signal {signal.Signals(signum).name}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.gpu.run", description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: the bundle's")
    p.add_argument("--seconds", type=float, default=15.0, help="interleaved timing per model (default 15)")
    p.add_argument("--budget", type=float, default=BUDGET_S, help=f"seconds for the whole run (default {BUDGET_S:.0f})")
    p.add_argument("--tolerance", type=float, default=TOLERANCE)
    p.add_argument("--models", help="comma-separated labels: only these of the bundle's models")
    p.add_argument("--no-tests", action="store_true", help="skip pytest -m gpu")
    p.add_argument("--tests-timeout", type=float, default=120.0)
    p.add_argument("--no-compile", action="store_true", help="no torch.compile peer on CUDA")
    p.add_argument("--torch-compile", action="store_true", help="a torch.compile peer on the CPU too")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (CUDA: max-autotune, CPU: default)")
    p.add_argument("--compile-cap", type=float, default=120.0, help="seconds torch.compile may take per model")
    args = p.parse_args(argv)

    deadline = Deadline(args.budget)
    pythonpath = use_bundle_paths(args.bundle)
    bundle = Bundle.load(args.bundle)
    device = args.device or bundle.device
    if device != bundle.device:
        print(f"run: the bundle's programs are for {bundle.device}, not {device}", file=sys.stderr)
        return 2
    if args.compile_mode is None:
        args.compile_mode = "max-autotune" if device == "cuda" else "default"
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        print("run: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    torch_setup(device)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    env = environment(device, bundle)
    args.out.mkdir(parents=True, exist_ok=True)
    tests, models, stopped = None, [], None
    wanted = set(args.models.split(",")) if args.models else None

    def write() -> Results:
        r = Results(env, args.tolerance, args.seconds, tests, tuple(models), stopped, round(deadline.elapsed(), 1))
        r.write(args.out)
        return r

    try:
        if not args.no_tests:
            tests = run_gpu_tests(args.out, pythonpath, min(args.tests_timeout, max(deadline.left() - 60, 10)))
            print(f"tests: {tests.summary}", flush=True)
            write()
        for entry in bundle.models:
            if wanted is not None and entry.spec.label not in wanted:
                continue
            if deadline.left() < MODEL_MIN_S:
                stopped = f"time budget: {deadline.left():.0f} s left before {entry.spec.label}"
                break
            result = measure_model(entry, args.bundle, device, args, deadline)
            models.append(result)
            best = f"{result.best_collage} vs {result.best_peer}: {result.speedup}x" if result.speedup else "no timing"
            print(f"{entry.spec.label}: numerics {'ok' if result.numerics_ok else 'FAILED'}, {best}", flush=True)
            write()
    except Stop as exc:
        stopped = str(exc)
    r = write()
    print(f"wrote {args.out / 'results.md'} ({'numerics ok' if r.numerics_ok else 'NUMERICS FAILED'}"
          f"{', stopped early: ' + stopped if stopped else ''})")
    return 0 if r.numerics_ok and not stopped else 1


if __name__ == "__main__":
    sys.exit(main())
