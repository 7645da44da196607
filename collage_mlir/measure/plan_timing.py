"""End-to-end timing of a whole plan of a module: built as ``collage compile`` builds it and timed
like a candidate, by a task pool (worker processes here, or a cluster: ``harness.open_pool``), as
transition costs, additivity checks and a graph-level search need."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import numpy as np

from ..ir import ir
from ..plan import Plan
from .harness import MeasureOptions, open_pool
from .pool import Artifact
from .tasks import INPUT, REFERENCE
from .worker import Outcome


class PlanTimer:
    """Builds and times plans of modules, one at a time, by a task pool (here: a build worker and a timing
    worker). The last ``keep`` built artifacts are kept, so timing a plan again (interleaved re-measurement
    rounds) only times it: a whole-model build takes a minute where a timing takes seconds."""

    def __init__(self, work_dir: str | Path, options: MeasureOptions | None = None, keep: int = 0):
        self.work = Path(work_dir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.options = options or MeasureOptions()
        self.keep = keep
        self._pool = open_pool(self.options, self.work, "plan-", builders=1)
        self._count = itertools.count()
        self._built: OrderedDict[str, Artifact] = OrderedDict()  # (module, plan) digest -> artifact

    def time(self, module: ir.Module | bytes, plan: Plan, inputs: Sequence[np.ndarray],
             references: Sequence[np.ndarray] | None = None, rtol: float = 0.0, atol: float = 0.0,
             outputs_to: Path | None = None) -> Outcome:
        """Builds ``module`` by ``plan`` and times ``@main`` on ``inputs``; with ``references`` the results
        are checked first (``wrong`` when beyond ``rtol``/``atol``); with ``outputs_to`` they are saved
        there (``ref<k>`` arrays). The outcome's value is the timing task's result (``status``,
        ``median_s``, ...); a failed build or run is its status."""
        k = next(self._count)
        if isinstance(module, ir.Module):
            buf = io.BytesIO()
            module.operation.write_bytecode(buf)
            module = buf.getvalue()
        # The plan's source (a name) changes nothing built.
        placement = {k: v for k, v in plan.to_json().items() if k != "source"}
        digest = hashlib.sha256(module + json.dumps(placement, sort_keys=True).encode()).hexdigest()
        module_file, data_file = self.work / f"plan{k}.mlirbc", self.work / f"plan{k}.npz"
        artifact = self._built.pop(digest, None)
        arrays = {f"{INPUT}{i}": a for i, a in enumerate(inputs)}
        arrays |= {f"{REFERENCE}{i}": a for i, a in enumerate(references or ())}
        np.savez(data_file, **arrays)
        ok = False
        try:
            if artifact is None:
                module_file.write_bytes(module)
                built = self._pool.build(module_file, plan.to_json(), self.options.build_timeout_s)
                if not built.ok:
                    return Outcome(built.status, message=f"build: {built.message}")
                artifact = built.value
            outcome = self._pool.time(artifact, data_file, self.options.run_timeout_s, timing=self.options.timing,
                                      rtol=rtol if references is not None else None, atol=atol, outputs_file=outputs_to)
            ok = outcome.ok
            return outcome if outcome.ok else Outcome(outcome.status, message=f"run: {outcome.message}")
        finally:
            if ok and self.keep:
                self._built[digest] = artifact
                while len(self._built) > self.keep:
                    self._pool.discard(self._built.popitem(last=False)[1])
            elif artifact is not None:
                self._pool.discard(artifact)
            module_file.unlink(missing_ok=True)
            data_file.unlink(missing_ok=True)

    def close(self) -> None:
        for artifact in self._built.values():
            self._pool.discard(artifact)
        self._built.clear()
        self._pool.close()

    def __enter__(self) -> "PlanTimer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
