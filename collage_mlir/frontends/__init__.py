"""Frontends: bring a model into IREE's MLIR context as StableHLO (or Linalg, passed through)."""

from __future__ import annotations

import os
from pathlib import Path

from ..ir import ir
from . import stablehlo


def load_model(path: str | Path, context: ir.Context, *, isolated: bool = True) -> ir.Module:
    """A model file as StableHLO: ``.onnx`` through the ONNX frontend (in a child process unless not
    ``isolated``: see ``frontends.onnx``), ``.mlir``/``.mlirbc`` with their function calls inlined
    (``frontends.stablehlo``)."""
    if Path(path).suffix == ".onnx":
        from .onnx import import_onnx

        return stablehlo.normalize(import_onnx(path, context, isolated=isolated), where=str(path))
    return stablehlo.load(path, context)


def cache_dir() -> Path:
    """The user's collage cache directory (``$COLLAGE_CACHE_DIR`` or ``$XDG_CACHE_HOME/collage-mlir``)."""
    if os.environ.get("COLLAGE_CACHE_DIR"):
        return Path(os.environ["COLLAGE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "collage-mlir"


def write_cache(path: Path, data: bytes) -> None:
    """Writes an import cache file atomically: a concurrent reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
