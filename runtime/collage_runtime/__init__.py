"""The deployable runtime: loads an artifact directory written by ``collage compile`` and runs it.

Needs only iree-base-runtime and the backends' own libraries (never the compiler or torch-mlir).
One IREE VM context holds the compiled module and a ``collage_rt`` module serving library regions.

    prog = collage_runtime.load("out/")
    (y,) = prog.invoke("main", x)
"""

from __future__ import annotations

from .telemetry import disable_engine_telemetry

disable_engine_telemetry()

from .program import Program  # noqa: E402  (after telemetry is off)
from .shaped import ShapedProgram  # noqa: E402
from .loader import load  # noqa: E402

__all__ = ["Program", "ShapedProgram", "load"]
