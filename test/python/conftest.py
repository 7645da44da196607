"""Shared fixtures: torch imported once per session, a private cache dir for imports, one small compiled
artifact several folders' tests read; the long-lived objects frozen out of the garbage collector's full
passes. (Shared models: models.py; shared paths: helpers.py.)"""

from __future__ import annotations

import gc
import os
import sys
import tempfile

import pytest

os.environ.setdefault("COLLAGE_CACHE_DIR", os.path.join(tempfile.gettempdir(), "collage-test-cache"))


def pytest_configure(config):
    """One cache per xdist worker (run-tests.sh runs two): two processes importing the same model at once
    would write the same temporary file. xdist's controller hands out files in the order the workers
    collected them (``pytest_collection_modifyitems`` below), not reordered by their number of tests."""
    if getattr(config.option, "loadscopereorder", None) is not None:
        config.option.loadscopereorder = False
    if not hasattr(config, "workerinput"):
        _write_bytecode()
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker and os.environ["COLLAGE_CACHE_DIR"] == os.path.join(tempfile.gettempdir(), "collage-test-cache"):
        os.environ["COLLAGE_CACHE_DIR"] += f"-{worker}"
    if worker and os.environ.get("COLLAGE_TEST_PIN", "1") == "1":
        _pin(int(config.workerinput["workerid"].removeprefix("gw")), int(config.workerinput["workercount"]))


def _pin(index: int, count: int) -> None:
    """Each xdist worker on its own share of the CPUs (its processes inherit it): every engine sizes its threads
    by the affinity mask (``engines.usable_cores``), so two workers on two cores each ran two spinning threads
    per engine, four on two cores, and a test took 3-4x its time alone."""
    cores = sorted(os.sched_getaffinity(0))
    if count < 2 or len(cores) < 2:
        return
    share = [c for k, c in enumerate(cores) if k % count == index % len(cores)] or cores
    os.sched_setaffinity(0, share)


def _write_bytecode() -> None:
    """Where Python may not write bytecode (``PYTHONDONTWRITEBYTECODE``, as on the CI machine), every process
    the tests start (CLI runs, measurement and bench workers, import children: hundreds) compiled the
    package's sources again (~0.5 s each); compiled once here, into the ``__pycache__`` folders Python
    reads them from (git ignores them), before any worker starts. A source changed later is compiled
    again as usual (the timestamp check)."""
    if not sys.dont_write_bytecode:
        return
    import compileall

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for sub in ("collage_mlir", "runtime", "studies", "test"):
        if os.path.isdir(os.path.join(root, sub)):
            compileall.compile_dir(os.path.join(root, sub), quiet=2)


@pytest.fixture(scope="session")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="session")
def ort_region_artifact(tmp_path_factory):
    """An artifact whose function ``mm`` (an 8x8 matmul) is one ort region, compiled once per session.
    Read it, or copy it before changing it."""
    pytest.importorskip("onnxruntime")
    from helpers import ROOT

    sys.path.insert(0, str(ROOT))  # the repository root: studies/ is not an installed package
    from studies.boundary import boundary

    out = tmp_path_factory.mktemp("ort") / "art"
    boundary.compile_region("ort", 64, out)
    return out


#: A marker expression that selects one marker's tests: the files without that marker are not imported.
_ONE_MARKER = {"fast": "fast", "serial and not bench": "serial"}


def pytest_ignore_collect(collection_path, config):
    """``pytest -m fast`` (and run-tests.sh's ``-m "serial and not bench"``) does not import the test files
    that hold no test so marked: importing them (torch, jax, ONNX Runtime, OpenVINO) would take longer
    than the fast tier itself."""
    marker = _ONE_MARKER.get((config.getoption("markexpr", "") or "").strip())
    if marker and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return f"pytest.mark.{marker}" not in collection_path.read_text() or None
    return None


# -- the garbage collector ------------------------------------------------------------------------------
# A test process holds torch, JAX, ONNX Runtime, OpenVINO and IREE (~400k tracked objects): one full
# collection took ~0.4 s under the suite's load, and collage_runtime's Program.close collects once per
# program (a tenth of some test files' time). The objects alive between test files (the imports, session
# fixtures) are moved to the permanent generation: a collection then walks only what the tests made since.
# Each freeze follows a full collection (no garbage is frozen) and comes before a file's own fixtures, so
# what is frozen is what outlives the files (modules, caches, session fixtures); it is unfrozen at the end.


def pytest_collection_finish(session):
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="module", autouse=True)
def _freeze_what_earlier_files_imported():
    """Freezes, before a test file's fixtures, what the files before it left alive (lazy imports)."""
    gc.collect()
    gc.freeze()
    yield


def pytest_unconfigure(config):
    gc.unfreeze()


# -- the order test files are handed to run-tests.sh's two workers ---------------------------------------
# xdist's ``--dist loadfile`` hands out whole files, by default the files with the most tests first: the
# slow files of one or two tests (a `collage bench`, the ONNX node sample) came last, and one worker ran
# such a file alone for a minute after the other had finished. Here the slowest files go first (longest
# first: the two workers then end within a short file of each other). Seconds per file in the default
# suite on 2 cores, from one run's ``--durations``: only their order matters, and a file not listed goes
# after these (in collection order).
SLOW_FILES = {
    "measure/test_measure.py": 300, "frontends/test_import_check.py": 180, "passes/test_mixed_devices.py": 170,
    "search/test_tune.py": 160, "runtime/test_artifact_checks.py": 155, "frontends/test_jax_modules.py": 150,
    "tools/test_cli.py": 120, "passes/test_numerics.py": 110, "tools/test_bench.py": 105,
    "backends/test_onednn.py": 100, "backends/test_xla_cpu.py": 100, "conformance/test_onnx_nodes.py": 90,
    "backends/test_onnx_backends.py": 85, "backends/test_iree_cpu_dt.py": 75, "tools/test_readme_examples.py": 70,
    "runtime/test_device_buffers.py": 70, "backends/test_onnx_zoo_whole.py": 60, "frontends/test_onnx_frontend.py": 60,
    "backends/test_graph_translation.py": 60, "tools/test_gpu_study.py": 55, "backends/test_onnx_control.py": 50,
    "search/test_in_context.py": 50, "entry/test_entry_points.py": 50, "search/test_tune_platforms.py": 45,
    "backends/test_onnx_ops.py": 40, "backends/test_gpu_programs.py": 35, "search/test_milp.py": 35,
    "conformance/test_framework_models.py": 30,
}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Under xdist (run-tests.sh's ``-n 2 --dist loadfile``): the slowest files first (SLOW_FILES)."""
    if not hasattr(config, "workerinput"):
        return
    here = os.path.dirname(__file__)
    cost = {}
    for item in items:
        path = os.path.relpath(str(item.path), here).replace(os.sep, "/")
        cost[item.nodeid] = SLOW_FILES.get(path, 0)
    items[:] = sorted(items, key=lambda item: -cost[item.nodeid])  # stable: files keep their own order
