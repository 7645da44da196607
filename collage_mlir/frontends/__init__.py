"""Frontends: bring a model into IREE's MLIR context as StableHLO (or Linalg, passed through)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..errors import CollageError
from ..ir import ir
from . import onnx_kept, stablehlo
from .onnx import fold_shapes, import_onnx


def load_model(path: str | Path, context: ir.Context, *, isolated: bool = True,
               keep: frozenset[str] = frozenset()) -> ir.Module:
    """A model file as StableHLO: ``.onnx`` through the ONNX frontend (in a child process unless not
    ``isolated``: see ``frontends.onnx``), ``.mlir``/``.mlirbc`` with their function calls inlined
    (``frontends.stablehlo``). ``keep``: outputs of ONNX nodes to keep as ONNX even where torch-mlir
    lowers them (the import check found them computed wrong)."""
    if Path(path).suffix == ".onnx":
        return stablehlo.normalize(_import_onnx_folding(Path(path), context, isolated, keep), where=str(path))
    return stablehlo.load(path, context)


def _import_onnx_folding(path: Path, context: ir.Context, isolated: bool, keep: frozenset[str]) -> ir.Module:
    """The ONNX model imported as it is, else with its constant subgraphs folded first (``fold_shapes``:
    a TorchScript export's shape arithmetic, such as BERT's position ids, is a run-time assert torch-mlir
    leaves for IREE), else with the nodes torch-mlir cannot lower kept as ONNX (``onnx_kept``); the first
    attempt's error where nothing helps. Nodes giving a ``keep`` output are kept as ONNX in every attempt."""
    first: CollageError | None = None
    with tempfile.TemporaryDirectory(prefix="collage-fold-") as tmp:
        if keep:
            try:
                return _import_kept(path, [], keep, Path(tmp) / "cut.onnx", context, isolated)
            except CollageError as exc:
                first = exc
        else:
            try:
                return import_onnx(path, context, isolated=isolated)
            except CollageError as exc:
                first = exc
        folded = fold_shapes(path, Path(tmp))
        if folded != path and not keep:
            try:
                return import_onnx(folded, context, isolated=isolated)
            except CollageError:
                pass
        refused = onnx_kept.refused_nodes(folded)
        if not refused and not keep:
            raise first from None
        try:  # a node no engine here runs, or that cannot be kept: the importer's own word on it
            return _import_kept(folded, refused, keep, Path(tmp) / "cut.onnx", context, isolated)
        except CollageError:
            raise first from None


def _import_kept(path: Path, refused: list[int], keep: frozenset[str], cut: Path, context: ir.Context,
                 isolated: bool) -> ir.Module:
    """The model at ``path`` imported with its ``refused`` nodes and those giving a ``keep`` output kept
    as ONNX."""
    kept = onnx_kept.cut(path, refused, cut, keep)
    module = import_onnx(cut, context, isolated=isolated)
    onnx_kept.stitch(module, kept)
    return module


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
