"""Command-line tools: ``collage-opt`` and the ``collage`` CLI."""

from __future__ import annotations

import os
import sys
from typing import Callable

from ..errors import CollageError


def load_input_arrays(paths: list[str]) -> list:
    """The ``--input`` .npy files as arrays; an unreadable one is one CollageError naming it."""
    import numpy as np

    arrays = []
    for path in paths:
        try:
            arrays.append(np.load(path, allow_pickle=False))
        except (OSError, ValueError) as exc:
            raise CollageError(f"cannot read input array: {exc}; inputs are .npy files", where=path) from None
    return arrays


def run_tool(prog: str, body: Callable[[], int]) -> int:
    """Runs a tool's body; user errors become one ``prog: error: ...`` line and a non-zero exit."""
    try:
        return body()
    except CollageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def exit_quietly(code: int) -> None:
    """Console-script exit: flush and leave without interpreter teardown, where IREE's and torch-mlir's
    nanobind objects would print leak warnings (and two-device contexts can crash)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
