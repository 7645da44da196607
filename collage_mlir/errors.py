"""The one exception type for mistakes a user can make (bad file, bad plan, unknown backend)."""

from __future__ import annotations


class CollageError(Exception):
    """A user-facing error: the CLI prints ``str(err)`` as one line and exits with ``exit_code``."""

    def __init__(self, message: str, *, where: str | None = None, exit_code: int = 1):
        self.where = where
        self.exit_code = exit_code
        super().__init__(f"{where}: {message}" if where else message)
