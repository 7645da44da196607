"""Worker processes: run one task at a time in a child process, so that a backend that crashes the
process or hangs costs one task (reported as a crash or timeout with its message), not the caller.

A task is a function named by ``"module:function"`` called with keyword arguments; it returns a
picklable value or raises (``error`` outcome with the exception's message).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CollageError

#: How much of a dead worker's stderr a crash message quotes.
_LOG_TAIL = 400


@dataclass
class Outcome:
    """What a task came to: ``ok`` (``value`` holds its result), ``error`` (it raised), ``crash`` (the
    worker died) or ``timeout`` (it did not answer in time and was killed); ``message`` says why."""

    status: str
    value: Any = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _serve(conn, log_path: str) -> None:
    # Backends print to the C-level stderr; keep it for crash messages rather than the caller's terminal.
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.dup2(fd, 1)
    while True:
        try:
            target, kwargs = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        try:
            module, _, name = target.partition(":")
            value = getattr(importlib.import_module(module), name)(**kwargs)
            reply = ("ok", value, "")
        except CollageError as exc:
            reply = ("error", None, str(exc))
        except Exception as exc:  # a backend's failure is a result to record, not the worker's end
            reply = ("error", None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:600]}")
        conn.send(reply)


class Worker:
    """One child process (spawned, so no inherited locks or threads) serving tasks one at a time;
    restarted after a crash or timeout."""

    def __init__(self, name: str = "worker", log_dir: str | Path | None = None):
        self.name = name
        self._log_dir = Path(log_dir or tempfile.gettempdir())
        self._proc = None
        self._conn = None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.log_path = self._log_dir / f"{self.name}-{os.getpid()}.log"
        self._proc = ctx.Process(target=_serve, args=(child, str(self.log_path)), name=self.name, daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent

    def call(self, target: str, timeout: float, **kwargs) -> Outcome:
        """Runs ``target(**kwargs)`` in the worker; waits at most ``timeout`` seconds."""
        if self._proc is None or not self._proc.is_alive():
            self._start()
        try:
            self._conn.send((target, kwargs))
            if not self._conn.poll(timeout):
                self.stop()
                return Outcome("timeout", message=f"no result after {timeout:g} s; the worker was killed")
            status, value, message = self._conn.recv()
            return Outcome(status, value, message)
        except (EOFError, OSError, BrokenPipeError):
            return Outcome("crash", message=self._death())

    def _death(self) -> str:
        self._proc.join(5)
        code = self._proc.exitcode
        why = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        tail = ""
        try:
            text = self.log_path.read_text(errors="replace").strip()
            tail = " ".join(text[-_LOG_TAIL:].split())
        except OSError:
            pass
        self._proc = None
        return f"worker died ({why})" + (f": {tail}" if tail else "")

    def stop(self) -> None:
        """Kills the worker (a later call starts a fresh one)."""
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(5)
            self._proc = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
