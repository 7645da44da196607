"""What a measurement came to: one enum for the worker's outcomes, the tasks' results and the cost DB's rows
(stored as its string value)."""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    OK = "ok"  # validated and timed: the only status a search may choose
    WRONG = "wrong"  # ran, but its results differ from the reference beyond the backend's tolerance
    ERROR = "error"  # the task raised (a build the backend refused, an engine error)
    CRASH = "crash"  # the worker process died
    TIMEOUT = "timeout"  # no answer in time; the worker was killed

    def __str__(self) -> str:
        return self.value
