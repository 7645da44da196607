"""IREE compile integration: ``compile_file`` / ``compile_str`` mirroring ``iree.compiler``'s, with a plan.

    from collage_mlir.iree import compile_file
    compile_file("model.mlir", plan="random:3", output_dir="out", extra_args=["--iree-opt-level=O3"])

Unlike IREE's, the result is an artifact directory (IREE module + region artifacts + manifest),
since library regions live beside the module; the function returns its manifest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from collage_runtime.manifest import Manifest
from collage_runtime.shapes import ShapeTable
from collage_runtime.types import Platform

from . import artifact
from .graph import Graph, number_ops
from .frontends import stablehlo
from .frontends.dims import DimPlan
from .ir import ir, new_context
from .measure.import_check import load_checked
from .plan import Plan
from .search import resolve_plan


def compile_module(module: ir.Module, plan: "str | Plan", output_dir: str | Path, *,
                   platform: Platform | None = None, **kwargs) -> artifact.CompileResult:
    """``artifact.compile_module`` with the plan given as ``default``, ``random:SEED``, ``prefer:B1,B2``, a
    plan file or a ``Plan``: the one place a plan string is resolved before the compile driver. ``platform``:
    the program's (CPU, CUDA, Vulkan); None takes a given plan's own, a plan string's CPU."""
    number_ops(module)
    return artifact.compile_module(module, resolve_plan(plan, Graph(module), platform), output_dir, **kwargs)


def compile_file(input_file: str | Path, *, output_dir: str | Path, plan: "str | Plan" = "default",
                 check_import: bool = True, dims: Mapping[str, "int | tuple[int, int, int]"] | None = None,
                 buckets: Mapping[str, Sequence[int]] | None = None, pad: Sequence[str] = (),
                 **iree_kwargs) -> "Manifest | ShapeTable":
    """Compiles a StableHLO (or ONNX) file with ``plan``; ``iree_kwargs`` go to
    ``iree.compiler.tools.compile_str`` (``extra_args``, ``target_backends``, ...). Returns the artifact
    manifest. ``check_import``: an ONNX model must match ONNX Runtime on generated inputs first.

    ``dims``: the model's dynamic dims (an ONNX model's ``dim_param``s, a StableHLO module's ``?`` axes named
    as ``frontends.refine`` names them), each ``(MIN, OPT, MAX)`` or one value, as ``collage compile --dim``;
    ``buckets`` and ``pad`` as ``--bucket`` and ``--pad``. The artifact then holds a program per shape
    bucket (``collage_mlir.shaped``), ``collage_runtime.load`` takes any shape in range, and the result is
    its ``ShapeTable``."""
    if dims is not None:
        # Imported when used: at module load, its imports changed the interpreter's teardown order so that
        # nanobind reported the cached device as leaked at exit (test_exit_is_quiet_with_programs_...).
        from .shaped import compile_file_shaped

        dim_plan = DimPlan.declared(dims, dict(buckets or {}), pad)
        return compile_file_shaped(input_file, dim_plan, plan, output_dir, check_import=check_import,
                                   **iree_kwargs).table
    module = load_checked(input_file, new_context(), check=check_import)
    return compile_module(module, plan, output_dir, source=str(input_file), **iree_kwargs).manifest


def compile_str(input_str: str | bytes, *, output_dir: str | Path, plan: "str | Plan" = "default",
                **iree_kwargs) -> Manifest:
    """Like ``compile_file`` for MLIR text or bytecode held in memory."""
    module = stablehlo.parse(input_str, new_context())
    return compile_module(module, plan, output_dir, **iree_kwargs).manifest
