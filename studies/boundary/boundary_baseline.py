"""``studies/boundary/boundary.py`` against the runtime as it was before the thread budget and the prepared boundary
(commit f4102a2^: executors imported by module name, ``load(path)``, ``MappedMemory.asarray`` views,
per-call ``IOBinding.bind_input``), same method and clock, for before/after tables:

    git worktree add --detach /tmp/collage-before f4102a2^
    PYTHONPATH=/tmp/collage-before/runtime python -m studies.boundary.boundary_baseline --out studies/boundary/boundary_before
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import SimpleNamespace

import collage_runtime  # noqa: E402
import collage_runtime.executors  # noqa: E402
from collage_runtime import rt_module  # noqa: E402

if hasattr(rt_module, "load_executor"):
    sys.exit("put the old runtime first on PYTHONPATH (see the docstring)")
# What boundary.py imports from the new runtime, in the old one's terms.
collage_runtime.executors.executor = lambda name: (lambda path, engines: importlib.import_module(name).load(path))
sys.modules["collage_runtime.engines"] = SimpleNamespace(Engines=lambda threads: None)
from studies.boundary import boundary  # noqa: E402

_load = collage_runtime.load


def _program(root, threads=None):
    prog = _load(root)
    prog.engines = SimpleNamespace(threads=threads)
    return prog


class _Importer:
    """Stands in for ``importlib`` inside the old rt_module: real executors, or no-ops for the floor."""

    noop = False

    def import_module(self, name):
        if self.noop:
            return SimpleNamespace(load=lambda path: (lambda inputs, outputs: None))
        return importlib.import_module(name)


_importer = _Importer()
rt_module.importlib = _importer


class _FloorSwitch:
    """``boundary.measure`` swaps ``rt_module.load_executor`` for a no-op around the floor program's load."""

    @property
    def load_executor(self):
        return None

    @load_executor.setter
    def load_executor(self, value):
        _importer.noop = value is not None


boundary.collage_runtime = SimpleNamespace(load=_program)
boundary.rt_module = _FloorSwitch()

if __name__ == "__main__":
    boundary.main()
