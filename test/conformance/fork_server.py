"""A fork server for the conformance runner: imports once what ``collage_run.py`` needs (collage, IREE's
compiler and runtime, JAX, the engines' Python packages: ~3 s a process on 2 cores, as long as the
compiles of a small file), then runs each requested file in a forked child, so every file still runs in
its own process (a crash costs that file, and no file sees another's state) without paying the imports.

    python -X faulthandler test/conformance/fork_server.py

Reads one JSON request a line on stdin, ``{"file", "plans", "stdout", "stderr"}``; the child runs
``collage_run.py FILE --plans PLANS --json`` with its stdout and stderr in those files; the server answers
one JSON line on stdout, ``{"rc"}``: the child's exit status as ``subprocess`` gives it (``-11``: SIGSEGV).

Nothing that starts a thread or opens a device runs before the fork: only imports (checked below).
"""

from __future__ import annotations

import faulthandler
import gc
import importlib
import json
import os
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: Imported before any fork: what a file's run imports (the XLA backend lazily imports JAX), so no child
#: imports it again. A module that cannot be imported here is imported (or fails) in the child, as in a
#: process of its own. Not ONNX Runtime or OpenVINO: their imports start native threads (a fork copies
#: only the forking thread), and a child that needs them imports them itself.
PRELOAD = ("numpy", "ml_dtypes", "iree.compiler", "iree.compiler.tools", "iree.compiler.ir", "iree.runtime",
           "jax", "jaxlib", "networkx",
           "collage_runtime", "collage_mlir.iree", "collage_mlir.errors", "collage_mlir.ir", "collage_mlir.graph",
           "collage_mlir.passes.number_ops", "collage_mlir.search", "collage_mlir.backends",
           "baseline", "check_module", "collage_run")


def preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the child meets the same error where it needs the module
            pass
    from collage_mlir.backends import registry

    registry()  # the backends' entry points, found once
    # What was imported outlives every child: kept out of the collector's passes (a child's full
    # collections, one per program closed, then walk only what it made).
    gc.collect()
    gc.freeze()


def child(request: dict) -> None:
    """Runs one file as ``collage_run.py FILE --plans PLANS --json`` would; never returns."""
    rc = 1
    try:
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        sys.stdin.close()
        faulthandler.enable(sys.stderr, all_threads=True)
        import collage_run

        sys.argv = [str(HERE / "collage_run.py"), request["file"], "--plans", request["plans"], "--json"]
        collage_run.main()
        rc = 0
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the test reports the traceback
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def main() -> None:
    preload()
    # A fork copies only the forking thread: a thread started by an import would be missing in the child.
    assert threading.active_count() == 1, [t.name for t in threading.enumerate()]
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(request)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        print(json.dumps({"rc": rc}), flush=True)


if __name__ == "__main__":
    main()
