"""Where measurement tasks run. The harness and ``PlanTimer`` ask a ``TaskPool`` to build a module by a plan
and to time what was built, and do not care where either happens: ``LocalPool`` runs them in worker
processes on this machine (the default, the files where they lie), ``cluster.RayPool`` on the nodes of a
Ray cluster (inputs shipped as bytes, the artifact carried from the building node to a timing node).

Every outcome is a ``worker.Outcome``: a build's value is an ``Artifact``, a timing's a ``tasks.Timed``; a
task that fails, crashes or hangs is that outcome, as in one worker.
"""

from __future__ import annotations

import itertools
import queue
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .status import Status
from .tasks import TASKS
from .timing import TimingOptions
from .worker import Outcome, Worker


@dataclass(frozen=True)
class Artifact:
    """A built artifact where its pool keeps it: ``handle`` is what that pool times (``LocalPool``: the
    artifact directory; ``RayPool``: the packed artifact in the cluster's object store); ``build_s`` is what
    the build took."""

    handle: Any
    build_s: float


class TaskPool(Protocol):
    """Builds and times candidates. ``build`` and ``time`` may be called from several threads: at most
    ``build_slots`` builds and ``time_slots`` timings at once (a pool keeps timings apart from each other)."""

    @property
    def build_slots(self) -> int: ...

    @property
    def time_slots(self) -> int: ...

    def build(self, module_file: Path, plan: dict, timeout_s: float) -> Outcome:
        """Compiles the module in ``module_file`` (bytecode) by ``plan`` (its JSON form), as ``collage
        compile`` would; an ``OK`` outcome's value is the ``Artifact``."""
        ...

    def time(self, artifact: Artifact, data_file: Path, timeout_s: float, *, timing: TimingOptions | None,
             rtol: float | None = None, atol: float | None = None, outputs_file: Path | None = None) -> Outcome:
        """``tasks.time_artifact`` of ``artifact`` on the ``.npz`` ``data_file`` (checked against its
        references when ``rtol`` is given; with ``outputs_file`` the results are saved there; no timing
        with ``timing`` None)."""
        ...

    def discard(self, artifact: Artifact) -> None:
        """Frees what ``artifact`` holds (it is not timed again)."""
        ...

    def close(self) -> None: ...


def time_left(limit_s: float, by: float | None) -> float:
    """Seconds a unit of work started now may take: ``limit_s``, or less where ``by`` (``time.monotonic()``)
    comes first (0 past it)."""
    return limit_s if by is None else max(0.0, min(limit_s, by - time.monotonic()))


def _by(task, limit_s: float, by: float | None) -> Outcome | None:
    """``task(timeout)`` given what is left until ``by`` (``time.monotonic()``; None: ``limit_s`` only): None
    where it did not end by then (not done, which says nothing of the plan: no row is recorded for it)."""
    timeout = time_left(limit_s, by)
    if timeout <= 0:
        return None
    outcome = task(timeout)
    return None if outcome.status == Status.TIMEOUT and timeout < limit_s else outcome


def build_by(pool: TaskPool, module_file: Path, plan: dict, limit_s: float, by: float | None) -> Outcome | None:
    """``pool``'s build of ``plan``, stopped at ``by``: None where it did not end by then (``_by``)."""
    return _by(lambda timeout: pool.build(module_file, plan, timeout), limit_s, by)


def time_by(pool: TaskPool, artifact: Artifact, data_file: Path, limit_s: float, by: float | None,
            **task: Any) -> Outcome | None:
    """``pool``'s timing of ``artifact`` (``TaskPool.time``'s ``task`` arguments), stopped at ``by`` (the
    timing worker killed): None where it did not end by then (``_by``)."""
    return _by(lambda timeout: pool.time(artifact, data_file, timeout, **task), limit_s, by)


class LocalPool:
    """``builders`` build workers and one timing worker on this machine; artifacts are directories under
    ``work/artifacts`` (the worker processes read and write the files in place)."""

    def __init__(self, work: Path, builders: int, prefix: str = ""):
        self.work = Path(work)
        self._workers = [Worker(f"{prefix}build{k}", self.work) for k in range(max(1, builders))]
        self._idle: queue.Queue[Worker] = queue.Queue()
        for w in self._workers:
            self._idle.put(w)
        self._timer = Worker(f"{prefix}time", self.work)
        self._timing = threading.Lock()
        self._count = itertools.count()

    @property
    def build_slots(self) -> int:
        return len(self._workers)

    @property
    def time_slots(self) -> int:
        return 1

    def build(self, module_file: Path, plan: dict, timeout_s: float) -> Outcome:
        out = self.work / "artifacts" / str(next(self._count))
        worker = self._idle.get()
        try:
            outcome = worker.call(f"{TASKS}:build_plan", timeout_s, module_file=str(module_file), plan=plan,
                                  out_dir=str(out))
        finally:
            self._idle.put(worker)
        if not outcome.ok:
            shutil.rmtree(out, ignore_errors=True)
            return outcome
        return Outcome(Status.OK, Artifact(out, outcome.value.build_s))

    def time(self, artifact: Artifact, data_file: Path, timeout_s: float, *, timing: TimingOptions | None,
             rtol: float | None = None, atol: float | None = None, outputs_file: Path | None = None) -> Outcome:
        with self._timing:
            return self._timer.call(f"{TASKS}:time_artifact", timeout_s, artifact_dir=str(artifact.handle),
                                    data_file=str(data_file), timing=timing.to_json() if timing else None, rtol=rtol, atol=atol,
                                    outputs_file=str(outputs_file) if outputs_file is not None else None)

    def discard(self, artifact: Artifact) -> None:
        shutil.rmtree(artifact.handle, ignore_errors=True)

    def close(self) -> None:
        for w in (*self._workers, self._timer):
            w.stop()
