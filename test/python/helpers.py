"""Paths the tests in every sub-folder share. test/python is on ``sys.path`` (pyproject's pytest
``pythonpath``), so every test imports this module and ``models`` the same way, from any folder:
``from helpers import LIT_INPUTS``, ``from models import mlp``. Test files never import each other."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]                     # the repository (README.md, collage_mlir/, studies/)
LIT = ROOT / "test" / "lit"
LIT_INPUTS = LIT / "Inputs"                # small .mlir models and plans the lit tests use too
CONFORMANCE = ROOT / "test" / "conformance"  # the corpora's runners: onnx_nodes.py, framework_models.py, ...
STRESS = ROOT / "test" / "stress"
#: IREE's e2e StableHLO files (the conformance inputs), beside the repository in shared/; as
#: test/conformance/baseline.py finds them.
IREE_E2E = Path(os.environ.get("COLLAGE_CONFORMANCE_DIR", ROOT.parent / "shared" / "conformance" / "iree-e2e"))
FAULTY = HERE / "faulty"                   # backends and executors that fail on purpose (their entry points)


def interruptible() -> None:
    """``preexec_fn`` of a child a test sends SIGINT: SIGINT back to its default, so that Python installs its
    KeyboardInterrupt handler there (a suite started as a background job, bash ``&``, hands its children
    SIGINT ignored, and the child would never see the Ctrl-C)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
