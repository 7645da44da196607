"""End-to-end timing of a whole plan of a module: built as ``collage compile`` builds it and timed
like a candidate, in worker processes (what transition costs, additivity checks and a graph-level
search need)."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import shutil
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import numpy as np

from ..ir import ir
from ..plan import Plan
from .harness import MeasureOptions
from .tasks import INPUT, REFERENCE, TASKS
from .worker import Outcome, Worker


class PlanTimer:
    """Builds and times plans of modules, one at a time, in a build worker and a timing worker. The last
    ``keep`` built artifacts are kept, so timing a plan again (interleaved re-measurement rounds) only
    times it: a whole-model build takes a minute where a timing takes seconds."""

    def __init__(self, work_dir: str | Path, options: MeasureOptions | None = None, keep: int = 0):
        self.work = Path(work_dir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.options = options or MeasureOptions()
        self.keep = keep
        self._builder = Worker("plan-build", self.work)
        self._timer = Worker("plan-time", self.work)
        self._count = itertools.count()
        self._built: OrderedDict[str, Path] = OrderedDict()  # (module, plan) digest -> artifact directory

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
        out = self._built.pop(digest, None)
        arrays = {f"{INPUT}{i}": a for i, a in enumerate(inputs)}
        arrays |= {f"{REFERENCE}{i}": a for i, a in enumerate(references or ())}
        np.savez(data_file, **arrays)
        ok = False
        try:
            if out is None:
                out = self.work / f"plan{k}"
                module_file.write_bytes(module)
                built = self._builder.call(f"{TASKS}:build_plan", self.options.build_timeout_s,
                                           module_file=str(module_file), plan=plan.to_json(), out_dir=str(out))
                if not built.ok:
                    return Outcome(built.status, message=f"build: {built.message}")
            outcome = self._timer.call(f"{TASKS}:time_artifact", self.options.run_timeout_s, artifact_dir=str(out),
                                       data_file=str(data_file), timing=self.options.timing.to_json(),
                                       rtol=rtol if references is not None else None, atol=atol,
                                       outputs_file=str(outputs_to) if outputs_to is not None else None)
            ok = outcome.ok
            return outcome if outcome.ok else Outcome(outcome.status, message=f"run: {outcome.message}")
        finally:
            if ok and self.keep:
                self._built[digest] = out
                while len(self._built) > self.keep:
                    shutil.rmtree(self._built.popitem(last=False)[1], ignore_errors=True)
            else:
                shutil.rmtree(out, ignore_errors=True)
            module_file.unlink(missing_ok=True)
            data_file.unlink(missing_ok=True)

    def close(self) -> None:
        self._builder.stop()
        self._timer.stop()
        for out in self._built.values():
            shutil.rmtree(out, ignore_errors=True)
        self._built.clear()

    def __enter__(self) -> "PlanTimer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
