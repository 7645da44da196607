"""IREE's e2e StableHLO tests pass through collage with the default plan and random plans, on every
function IREE alone passes. Each file runs in its own process (a crash costs one file, not the run).

The inputs live in ../shared/conformance/iree-e2e (COLLAGE_CONFORMANCE_DIR overrides); see
test/conformance/BASELINE.md for what IREE alone passes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import CONFORMANCE as CONFORMANCE_DIR

sys.path.insert(0, str(CONFORMANCE_DIR))
from baseline import _JSON_MARK, CONFORMANCE  # noqa: E402

FILES = sorted(CONFORMANCE.rglob("*.mlir")) if CONFORMANCE.is_dir() else []
#: The default suite's plans per file (the whole run was 9-13 minutes on 2 cores with a third plan);
#: ``-m bench`` adds two more random plans per file (``test_conformance_file_more_random_plans``).
PLANS = "default,random:0"
MORE_PLANS = "random:1,random:2"


def test_conformance_inputs_present():
    assert len(FILES) >= 80, f"conformance inputs missing at {CONFORMANCE} (set COLLAGE_CONFORMANCE_DIR)"


def _check(path, plans: str) -> None:
    # Python's fault handler in the runner: a crash (one SIGSEGV was seen in ~6 suite runs, never again
    # in 116 runs of the same file) then leaves the stacks of every thread in the message below.
    proc = subprocess.run([sys.executable, "-X", "faulthandler", str(CONFORMANCE_DIR / "collage_run.py"), str(path),
                           "--plans", plans, "--json"], capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_JSON_MARK)]
    assert lines, f"runner crashed (rc={proc.returncode}): {proc.stderr[-2000:]}"
    res = json.loads(lines[-1][len(_JSON_MARK):])
    assert not res["mismatches"], "\n".join(res["mismatches"])
    if res["baseline"]["compiled"]:
        assert all(p["compiled"] for p in res["plans"].values()), {k: p["error"] for k, p in res["plans"].items()}


IDS = [str(p.relative_to(CONFORMANCE)) for p in FILES]


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_conformance_file(path):
    _check(path, PLANS)


@pytest.mark.bench
@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_conformance_file_more_random_plans(path):
    _check(path, MORE_PLANS)
