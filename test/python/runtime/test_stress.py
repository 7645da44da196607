"""Programs mixing engines (ORT, OpenVINO, XLA, oneDNN) under load: called from several threads at once,
called many times, loaded and unloaded many times in one process (test/stress/mixed_engines.py).

The default suite calls one small program (one region per engine) from 4 threads at once and a few
hundred times in a row; ``-m bench`` runs the long stress and soak runs in a child process under Python's
fault handler (``COLLAGE_STRESS_CALLS``, default 10000; ``COLLAGE_SOAK_CALLS``, default 100000). Figures:
docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import STRESS

sys.path.insert(0, str(STRESS))
import mixed_engines  # noqa: E402

pytest.importorskip("onnxruntime")
pytest.importorskip("openvino")
pytest.importorskip("jaxlib")
pytest.importorskip("torch")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """The small program, one region on each engine, and IREE alone's results."""
    work = tmp_path_factory.mktemp("mixed")
    model = mixed_engines.mixed_model()
    ref = mixed_engines.compile_case(model, "default", work / "default")
    case = mixed_engines.compile_case(model, mixed_engines.mixed_plan(), work / "mixed", ref.expected)
    assert case.regions == {"onednn": 1, "ort": 1, "openvino": 1, "xla-cpu": 1}
    return case


def test_threads_calling_one_program_at_once_get_exact_results(mixed):
    """Calls run one at a time per program: without the lock, 4 threads x 200 calls returned results
    off by up to 2.8 (an ORT binding or OpenVINO request rebound by another thread mid-call)."""
    report = mixed_engines.threaded(mixed, threads=4, calls=100, log=lambda _: None)
    assert report["problems"] == []


def test_threads_calling_two_programs_at_once_get_exact_results(mixed):
    """Two loaded programs of one artifact, two threads on each: separate programs run concurrently."""
    report = mixed_engines.threaded(mixed, threads=4, calls=50, programs=2, log=lambda _: None)
    assert report["problems"] == []


def test_close_while_other_threads_call_waits_for_their_call(mixed):
    """close() takes the program's lock: a running call finishes with its results; every later call,
    through invoke or a device function, raises ProgramClosed (not an AttributeError, not a crash)."""
    import threading

    import collage_runtime
    from collage_runtime.program import ProgramClosed

    check = mixed_engines.Checker()
    prog = collage_runtime.load(mixed.path)
    fn = prog.device_function(mixed.function)
    outcomes: list[str] = []
    called = [threading.Event(), threading.Event()]

    def work(t: int) -> None:
        while True:
            try:
                check(mixed, t, mixed_engines.call(prog, mixed, t, t == 1))
            except ProgramClosed:
                outcomes.append("closed")
                return
            except Exception as exc:  # noqa: BLE001 - anything else fails the test below
                outcomes.append(repr(exc))
                return
            called[t].set()

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for event in called:
        event.wait()
    prog.close()
    for t in threads:
        t.join()
    assert outcomes == ["closed", "closed"] and check.problems == []
    with pytest.raises(ProgramClosed, match="the program is closed"):
        fn(*(prog.to_device(a) for a in mixed.inputs[0]))
    assert mixed.function in prog.functions  # what it had, still listed
    with pytest.raises(ProgramClosed):
        prog.vm_module


def test_repeated_calls_stay_bit_identical(mixed):
    report = mixed_engines.soak(mixed, calls=400, every=100, log=lambda _: None)
    assert report["problems"] == [] and [n for n, _ in report["rss_kib"]] == [0, 100, 200, 300, 400]


def _run(*args: str, timeout: float) -> dict:
    proc = subprocess.run([sys.executable, "-X", "faulthandler", str(STRESS / "mixed_engines.py"), *args, "--json"],
                          capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"stress runner crashed (rc={proc.returncode}): {proc.stderr[-4000:]}"
    report = json.loads(lines[-1])
    assert proc.returncode == 0 and report["problems"] == [], report["problems"] or proc.stderr[-2000:]
    return report


@pytest.mark.bench
def test_stress_loads_unloads_and_calls_mixed_programs():
    calls = int(os.environ.get("COLLAGE_STRESS_CALLS", "10000"))
    report = _run("stress", "--calls", str(calls), timeout=7200)
    unloads = sum(n for k, n in report["counts"].items() if k.startswith("unloads"))
    # programs loaded and unloaded on the way, 1 to 3 (--live) still loaded at the end
    assert report["calls"] == calls and unloads >= 1 and 1 <= report["counts"]["loads"] - unloads <= 3, report["counts"]


@pytest.mark.bench
def test_soak_memory_stays_flat():
    """After the first tenth of the calls (engines' caches and pools warm), the resident set grows by
    less than 8 MiB over the rest: a leak of even 100 bytes a call would show at 100,000 calls."""
    calls = int(os.environ.get("COLLAGE_SOAK_CALLS", "100000"))
    report = _run("soak", "--calls", str(calls), "--every", str(max(calls // 20, 1)), timeout=7200)
    samples = dict(report["rss_kib"])
    warm = min(n for n in samples if n >= calls // 10)
    assert samples[calls] - samples[warm] < 8 * 1024, report["rss_kib"]
