"""End-to-end timing of a whole plan of a module: built as ``collage compile`` builds it and timed
like a candidate, by a task pool (worker processes here, or a cluster: ``harness.open_pool``), as
transition costs, additivity checks and a graph-level search need."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import time
from collections import OrderedDict
from dataclasses import replace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np

from ..ir import ir
from ..plan import Plan
from .harness import MeasureOptions, open_pool
from .pool import Artifact, build_by, time_by
from .tasks import EXACT, INPUT, REFERENCE
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
        self._pool = open_pool(self.options, self.work, "plan-", builders=max(1, self.options.jobs))
        self._count = itertools.count()
        self._built: OrderedDict[str, Artifact] = OrderedDict()  # (module, plan) digest -> artifact
        self._failed: dict[str, Outcome] = {}  # (module, plan) digest -> a prebuild that failed

    @staticmethod
    def _bytecode(module: ir.Module | bytes) -> bytes:
        if isinstance(module, ir.Module):
            buf = io.BytesIO()
            module.operation.write_bytecode(buf)
            return buf.getvalue()
        return module

    @staticmethod
    def _digest(module: bytes, plan: Plan) -> str:
        """The digest of (module, placement): the plan's source (a name) changes nothing built."""
        placement = {k: v for k, v in plan.to_json().items() if k != "source"}
        return hashlib.sha256(module + json.dumps(placement, sort_keys=True).encode()).hexdigest()

    def prebuild(self, module: ir.Module | bytes, plans: Sequence[Plan], deadline: float | None = None,
                 required: Sequence[Plan] = ()) -> list[float | None]:
        """Builds ``plans`` of ``module`` side by side, as many at once as the pool has build slots, and
        keeps them for ``time`` (a tune's seeds: an engine's compile beside IREE's whole-model one). No
        build starts past ``deadline`` (``time.monotonic()``), and one still running then is stopped (its
        worker killed) and left unbuilt, not failed: a budget's end says nothing of the plan. The
        ``required`` plans (a tune's reference) ignore the deadline. A failed build is what ``time``
        answers for its plan. Returns each plan's build seconds, built or failed (None: not built now).
        Nothing is timed meanwhile: builds never overlap timings."""
        module = self._bytecode(module)
        digests = [self._digest(module, plan) for plan in plans]
        todo = {d: p for d, p in zip(digests, plans) if d not in self._built and d not in self._failed}
        always = {self._digest(module, plan) for plan in required}

        def build(digest: str, plan: Plan) -> tuple[str, tuple[Outcome, float] | None]:
            module_file = self.work / f"plan{next(self._count)}.mlirbc"
            module_file.write_bytes(module)
            t0 = time.monotonic()
            try:  # None: not built (``time`` builds it if it is ever timed)
                outcome = self._build_by(module_file, plan, None if digest in always else deadline)
            finally:
                module_file.unlink(missing_ok=True)
            return digest, None if outcome is None else (outcome, time.monotonic() - t0)

        seconds: dict[str, float] = {}
        with ThreadPoolExecutor(max(1, self._pool.build_slots), thread_name_prefix="collage-prebuild") as ex:
            for digest, done in ex.map(lambda item: build(*item), todo.items()):
                if done is None:
                    continue
                outcome, seconds[digest] = done
                if outcome.ok:
                    self._built[digest] = outcome.value
                    seconds[digest] = outcome.value.build_s
                else:
                    self._failed[digest] = outcome
        return [seconds.get(d) for d in digests]

    def _build_by(self, module_file: Path, plan: Plan, by: float | None) -> Outcome | None:
        """The pool's build of ``plan``, stopped at ``by`` (``time.monotonic()``; None: the build timeout
        only): None where it did not end by then (not built, which says nothing of the plan)."""
        return build_by(self._pool, module_file, plan.to_json(), self.options.build_timeout_s, by)

    def holds(self, module: ir.Module | bytes, plan: Plan) -> bool:
        """Whether ``plan`` of ``module`` is built and kept here (``time`` would only time it)."""
        return self._digest(self._bytecode(module), plan) in self._built

    def time(self, module: ir.Module | bytes, plan: Plan, inputs: Sequence[np.ndarray],
             references: Sequence[np.ndarray] | None = None, rtol: float = 0.0, atol: float = 0.0,
             outputs_to: Path | None = None, build_by: float | None = None, timed: bool = True,
             give_up_s: float | None = None, run_by: float | None = None,
             exact: Sequence[np.ndarray] | None = None) -> Outcome | None:
        """Builds ``module`` by ``plan`` and times ``@main`` on ``inputs``; with ``references`` the results
        are checked first (``wrong`` when beyond ``rtol``/``atol``, and beyond what ``exact``, the model's exact
        arithmetic, allows: ``validate.compare``); with ``outputs_to`` they are saved
        there (``ref<k>`` arrays). The outcome's value is the timing task's result (``status``,
        ``median_s``, ...); a failed build or run is its status. A build not done by ``build_by``
        (``time.monotonic()``) is stopped and None returned: not built, which says nothing of the plan.
        Not ``timed``: one run, for its results (``outputs_to``) or its check. ``give_up_s``: a first timed
        call slower than this is the timing (``TimingOptions.give_up_s``). A run not done by ``run_by`` is
        stopped (the timing worker killed) and None returned, as for a build."""
        k = next(self._count)
        module = self._bytecode(module)
        digest = self._digest(module, plan)
        if digest in self._failed:
            failed = self._failed.pop(digest)
            return Outcome(failed.status, message=f"build: {failed.message}")
        module_file, data_file = self.work / f"plan{k}.mlirbc", self.work / f"plan{k}.npz"
        artifact = self._built.pop(digest, None)
        arrays = {f"{INPUT}{i}": a for i, a in enumerate(inputs)}
        arrays |= {f"{REFERENCE}{i}": a for i, a in enumerate(references or ())}
        arrays |= {f"{EXACT}{i}": a for i, a in enumerate(exact or ())}
        np.savez(data_file, **arrays)
        ok = False
        try:
            if artifact is None:
                module_file.write_bytes(module)
                built = self._build_by(module_file, plan, build_by)
                if built is None:
                    return None
                if not built.ok:
                    return Outcome(built.status, message=f"build: {built.message}")
                artifact = built.value
            outcome = time_by(self._pool, artifact, data_file, self.options.run_timeout_s, run_by,
                              timing=replace(self.options.timing, give_up_s=give_up_s) if timed else None,
                              rtol=rtol if references is not None else None, atol=atol, outputs_file=outputs_to)
            ok = outcome is None or outcome.ok  # not done by ``run_by``: kept, it was built, only not timed
            if outcome is None or outcome.ok:
                return outcome
            return Outcome(outcome.status, message=f"run: {outcome.message}")
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
