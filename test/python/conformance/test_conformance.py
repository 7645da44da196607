"""IREE's e2e StableHLO tests pass through collage with the default plan and random plans, on every
function IREE alone passes. Each file runs in its own process (a crash costs one file, not the run): a
child forked by test/conformance/fork_server.py, which has imported collage, IREE and JAX once (~3 s a
file, as much as a small file's compiles).

The inputs live in ../shared/conformance/iree-e2e (COLLAGE_CONFORMANCE_DIR overrides); see
test/conformance/BASELINE.md for what IREE alone passes.
"""

from __future__ import annotations

import json
import os
import select
import signal
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


class _ForkServer:
    """One fork server per test process (started on the first file, again after it died or hung)."""

    def __init__(self, work):
        self.work, self.proc, self.count = work, None, 0

    def run(self, path, plans: str, timeout: float = 600) -> tuple[int, str, str]:
        """``collage_run.py PATH --plans PLANS --json`` in a child of the server: (exit status, stdout, stderr)."""
        if self.proc is None or self.proc.poll() is not None:
            self.log = self.work / f"server{self.count}.err"
            self.proc = subprocess.Popen([sys.executable, "-X", "faulthandler", str(CONFORMANCE_DIR / "fork_server.py")],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log.open("w"),
                                         text=True, start_new_session=True)
        self.count += 1
        out, err = self.work / f"{self.count}.out", self.work / f"{self.count}.err"
        request = {"file": str(path), "plans": plans, "stdout": str(out), "stderr": str(err)}
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.stop()  # hung (the child too: one process group) or dead: the next file starts another
            text = lambda p: p.read_text() if p.exists() else ""  # noqa: E731
            if not ready:
                raise TimeoutError(f"{path} took over {timeout:.0f} s: {text(err)[-2000:]}")
            return -1, text(out), f"fork server died: {text(self.log)[-2000:]} {text(err)[-2000:]}"
        return json.loads(line)["rc"], out.read_text(), err.read_text()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
            self.proc.stdin.close()
            self.proc.stdout.close()
        self.proc = None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = _ForkServer(tmp_path_factory.mktemp("conformance"))
    yield s
    s.stop()


def _check(server, path, plans: str) -> None:
    # Python's fault handler in the runner: a crash (one SIGSEGV was seen in ~6 suite runs, never again
    # in 116 runs of the same file) then leaves the stacks of every thread in the message below.
    rc, stdout, stderr = server.run(path, plans)
    lines = [ln for ln in stdout.splitlines() if ln.startswith(_JSON_MARK)]
    assert lines, f"runner crashed (rc={rc}): {stderr[-2000:]}"
    res = json.loads(lines[-1][len(_JSON_MARK):])
    assert not res["mismatches"], "\n".join(res["mismatches"])
    if res["baseline"]["compiled"]:
        assert all(p["compiled"] for p in res["plans"].values()), {k: p["error"] for k, p in res["plans"].items()}


IDS = [str(p.relative_to(CONFORMANCE)) for p in FILES]


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_conformance_file(server, path):
    _check(server, path, PLANS)


@pytest.mark.bench
@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_conformance_file_more_random_plans(server, path):
    _check(server, path, MORE_PLANS)
