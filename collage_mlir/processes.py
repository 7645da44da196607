"""Child Python processes: the one way the project starts them (any stage may: the ONNX frontend imports in
a child, the harness measures in workers, ``collage run`` runs a program in one)."""

from __future__ import annotations

import sys


def python_command(module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m module args...`` in a child that imports only installed code.

    ``-P`` keeps the current directory off ``sys.path``: without it a user's ``timeit.py`` (or any file
    sharing a module's name) in the folder ``collage`` runs from is imported, and run, by the child.
    ``PYTHONPATH`` still counts (the user set it on purpose). Every Python child the project starts is
    built here (``test_subprocesses.py`` holds it)."""
    return [sys.executable, "-P", "-m", module, *args]
