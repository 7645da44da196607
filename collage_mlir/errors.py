"""The one exception type for mistakes a user can make (bad file, bad plan, unknown backend)."""

from __future__ import annotations


class CollageError(Exception):
    """A user-facing error: the CLI prints ``str(err)`` as one line and exits with ``exit_code``.
    ``location`` (an ``ir.Location``, when the error is about an op) is where a pass that raises it
    emits the MLIR diagnostic."""

    def __init__(self, message: str, *, where: str | None = None, exit_code: int = 1, location: object = None):
        self.where = where
        self.exit_code = exit_code
        self.location = location
        super().__init__(f"{where}: {message}" if where else message)
