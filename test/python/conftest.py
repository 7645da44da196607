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
    would write the same temporary file."""
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker and os.environ["COLLAGE_CACHE_DIR"] == os.path.join(tempfile.gettempdir(), "collage-test-cache"):
        os.environ["COLLAGE_CACHE_DIR"] += f"-{worker}"


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
