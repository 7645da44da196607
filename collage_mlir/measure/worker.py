"""Worker processes: run one task at a time in a child process, so that a backend that crashes the
process or hangs costs one task (reported as a crash or timeout with its message), not the caller.

A task is a function named by ``"module:function"`` called with keyword arguments; it returns a
picklable value or raises (``error`` outcome with the exception's message).
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import CollageError
from ..processes import python_command
from .status import Status

#: How much of a dead worker's stderr a crash message quotes.
_LOG_TAIL = 400


@dataclass(frozen=True)
class Outcome:
    """What a task came to: ``OK`` (``value`` holds its result), ``ERROR`` (it raised), ``CRASH`` (the
    worker died) or ``TIMEOUT`` (it did not answer in time and was killed); ``message`` says why."""

    status: Status
    value: Any = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == Status.OK


def _short(text: str, limit: int = 800) -> str:
    """``text`` on one line; a long one keeps its start and its end (where a chained error says why)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit // 4] + " ... " + text[-(limit - limit // 4):]


def _serve(conn) -> None:
    while True:
        try:
            target, kwargs = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        try:
            module, _, name = target.partition(":")
            value = getattr(importlib.import_module(module), name)(**kwargs)
            reply = (Status.OK, value, "")
        except CollageError as exc:
            reply = (Status.ERROR, None, str(exc))
        except Exception as exc:  # a backend's failure is a result to record, not the worker's end
            reply = (Status.ERROR, None, _short(f"{type(exc).__name__}: {exc}"))
        conn.send(reply)


def _descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (Linux's ``/proc/PID/task/TID/children``; none elsewhere)."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
        for child in children:
            found += [child, *_descendants(child)]
    return found


class Worker:
    """One child interpreter (``python -P -m collage_mlir.measure.worker``: nothing inherited, the caller's
    main module is never re-imported, and the current directory is not on its path) serving tasks one at a time; restarted after a crash
    or timeout. Its stdout and stderr go to a log file, quoted when it dies. Its environment is this
    process's, or ``env``."""

    def __init__(self, name: str = "worker", log_dir: str | Path | None = None, env: Mapping[str, str] | None = None):
        self.name = name
        self._env = dict(env) if env is not None else None
        self._log_dir = Path(log_dir or tempfile.gettempdir())
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self.log_path = self._log_dir / f"{self.name}-{os.getpid()}.log"

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(python_command(__name__, str(theirs.fileno())),
                                          pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, env=self._env)
        theirs.close()
        self._conn = Connection(ours.detach())

    def call(self, target: str, timeout: float, **kwargs) -> Outcome:
        """Runs ``target(**kwargs)`` in the worker; waits at most ``timeout`` seconds."""
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        try:
            self._conn.send((target, kwargs))
            if not self._conn.poll(timeout):
                self.stop()
                return Outcome(Status.TIMEOUT, message=f"no result after {timeout:g} s; the worker was killed")
            status, value, message = self._conn.recv()
            return Outcome(Status(status), value, message)
        except (EOFError, OSError, BrokenPipeError):
            return Outcome(Status.CRASH, message=self._death())

    def _death(self) -> str:
        try:
            code = self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            code = self._proc.wait()
        why = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        tail = ""
        try:
            text = self.log_path.read_text(errors="replace").strip()
            tail = " ".join(text[-_LOG_TAIL:].split())
        except OSError:
            pass
        self._proc = None
        self._conn.close()
        self._conn = None
        return f"worker died ({why})" + (f": {tail}" if tail else "")

    def stop(self) -> None:
        """Kills the worker and what it started (a later call starts a fresh one): a build stopped at a tune's
        deadline left its ``iree-compile`` running on, and the seeds timed after it ran 2x slow."""
        if self._proc is not None:
            if self._proc.poll() is None:
                for pid in [*_descendants(self._proc.pid), self._proc.pid]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            self._proc.wait()
            self._proc = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
