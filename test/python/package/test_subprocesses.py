"""Every Python child process the project starts imports only installed code: a user's file in the folder
``collage`` runs from (a ``timeit.py``) is never imported by a worker or by ``collage run``'s child."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import numpy as np

import pytest

from collage_mlir.measure.db import CostDB

from helpers import ROOT

MODEL = """func.func @main(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
  %0 = stablehlo.tanh %x : tensor<4x16xf32>
  %1 = stablehlo.add %0, %x : tensor<4x16xf32>
  return %1 : tensor<4x16xf32>
}
"""
#: A user's file that shares a standard module's name; the timing harness and IREE's runtime import it.
SHADOW = 'open("imported", "w").close()\nraise SystemExit("the user\'s timeit.py was imported")\n'


def _collage(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # The installed console script, as a user runs it (``python -m`` would itself put cwd on the path).
    return subprocess.run([shutil.which("collage"), *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_workers_and_run_children_ignore_the_users_folder(tmp_path):
    (tmp_path / "timeit.py").write_text(SHADOW)
    (tmp_path / "model.mlir").write_text(MODEL)
    # A short timing budget per candidate and no transition probes (their builds were most of this test's
    # minute): what matters is where the workers import from, not the times.
    measured = _collage("measure", "model.mlir", "--backends", "iree-cpu", "--db", str(tmp_path / "db.sqlite"),
                        "--budget", "0.05", "--no-transitions", cwd=tmp_path)
    assert measured.returncode == 0, measured.stderr
    with CostDB(tmp_path / "db.sqlite") as db:  # the harness ran in its worker: costs, not errors
        rows = db.measurements()
    assert rows and all(m.status == "ok" for m in rows), [(m.status, m.message) for m in rows]
    np.save(tmp_path / "x.npy", np.ones((4, 16), np.float32))
    compiled = _collage("compile", "model.mlir", "--plan", "default", "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    ran = _collage("run", "out", "--input", "x.npy", "--output-dir", "res", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    x = np.ones((4, 16), np.float32)
    np.testing.assert_allclose(np.load(tmp_path / "res" / "out_0.npy"), np.tanh(x) + x, rtol=1e-6)
    assert not (tmp_path / "imported").exists()


@pytest.mark.fast
def test_every_python_child_is_started_through_python_command():
    """``sys.executable`` appears in the package only inside ``processes.python_command``."""
    found = []
    for top in (ROOT / "collage_mlir", ROOT / "runtime" / "collage_runtime"):
        for path in sorted(top.rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr == "executable" and \
                        isinstance(node.value, ast.Name) and node.value.id == "sys":
                    owner = [f.name for f in funcs if f.lineno <= node.lineno <= f.end_lineno]
                    found.append((path.relative_to(ROOT).as_posix(), owner[-1] if owner else None))
    assert found == [("collage_mlir/processes.py", "python_command")]
