"""Command-line tools: ``collage-opt`` and the ``collage`` CLI."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
from typing import Callable

from collage_runtime.types import restored

from ..errors import CollageError


def load_input_arrays(paths: list[str]) -> list:
    """The ``--input`` .npy files as arrays; an unreadable one is one CollageError naming it."""
    import numpy as np

    arrays = []
    for path in paths:
        try:
            arrays.append(np.load(path, allow_pickle=False))
        except Exception as exc:  # noqa: BLE001  untrusted bytes: numpy's header parser raises many types
            why = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise CollageError(f"cannot read input array ({why}); inputs are .npy files", where=path) from None
        if not isinstance(arrays[-1], np.ndarray):
            raise CollageError("not a single array (an .npz archive?); inputs are .npy files", where=path)
        arrays[-1] = restored(arrays[-1])  # a bf16 array as bf16
    return arrays


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage mistake as one ``prog: error: ...`` line (exit 2), without the usage
    block; ``--help`` still shows it."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def nonnegative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text}")
    return value


def backend_names(text: str) -> list[str]:
    """A comma-separated backend list; refuses an empty one (unknown names are checked by the registry)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise CollageError("no backend named; give a comma-separated list (see `collage backends`)",
                           where="--backends", exit_code=2)
    return names


#: How soon a Ctrl-C that arrived during an import is delivered again.
INTERRUPT_RETRY_S = 0.05


def importing(frame) -> bool:
    """Whether ``frame`` runs inside an import. An exception raised there can land in a native extension's
    module initialisation: jaxlib's crashed the process (SIGSEGV) when Ctrl-C hit it mid-import."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def run_tool(prog: str, body: Callable[[], int]) -> int:
    """Runs a tool's body; user errors become one ``prog: error: ...`` line and a non-zero exit, Ctrl-C
    one ``prog: interrupted`` line and exit 130. A Ctrl-C during an import is delivered once it is done
    (sent again every ``INTERRUPT_RETRY_S``)."""
    interrupted = False

    def on_sigint(signum, frame):
        nonlocal interrupted
        interrupted = True
        if importing(frame):
            threading.Timer(INTERRUPT_RETRY_S, os.kill, (os.getpid(), signal.SIGINT)).start()
            return
        raise KeyboardInterrupt

    # Remembered here because a KeyboardInterrupt raised inside an MLIR callback (an op walk) comes back
    # out of the bindings as a RuntimeError; the flag tells such an error from a real one.
    installed = (threading.current_thread() is threading.main_thread()
                 and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if installed:
        signal.signal(signal.SIGINT, on_sigint)
    try:
        return body()
    except (KeyboardInterrupt, Exception) as exc:
        if interrupted or isinstance(exc, KeyboardInterrupt):
            print(f"{prog}: interrupted", file=sys.stderr)
            return 130
        if not isinstance(exc, CollageError):
            raise
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        if installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def exit_quietly(code: int) -> None:
    """Console-script exit: flush and leave without interpreter teardown, where IREE's and torch-mlir's
    nanobind objects would print leak warnings (and two-device contexts can crash)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
