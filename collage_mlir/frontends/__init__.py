"""Frontends: bring a model into IREE's MLIR context as StableHLO (or Linalg, passed through)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..errors import CollageError
from ..ir import ir
from ..dialects.collage import OnnxSource, OnnxTail
from . import onnx_kept, onnx_tail, stablehlo
from .onnx import fold_shapes, import_onnx


def load_model(path: str | Path, context: ir.Context, *, isolated: bool = True,
               keep: frozenset[str] = frozenset()) -> ir.Module:
    """A model file as StableHLO: ``.onnx`` through the ONNX frontend (in a child process unless not
    ``isolated``: see ``frontends.onnx``), ``.mlir``/``.mlirbc`` with their function calls inlined
    (``frontends.stablehlo``). ``keep``: outputs of ONNX nodes to keep as ONNX even where torch-mlir
    lowers them (the import check found them computed wrong); integer kernels are kept too
    (``onnx_kept.INTEGER_KERNELS``). An ONNX model's module names its file (``collage.OnnxSource``)."""
    if Path(path).suffix == ".onnx":
        keep = keep | onnx_kept.integer_kernel_outputs(Path(path))
        module = stablehlo.normalize(_import_onnx_folding(Path(path), context, isolated, keep), where=str(path))
        if OnnxTail.of(module) is None:  # else @main computes only the model's head
            OnnxSource.of_file(path).attach(module)
        return module
    return stablehlo.load(path, context)


def _import_onnx_folding(path: Path, context: ir.Context, isolated: bool, keep: frozenset[str]) -> ir.Module:
    """The first of these imports that succeeds, else the first one's error:
    - the ONNX model as it is;
    - with its constant subgraphs folded (``fold_shapes``: a TorchScript export's shape arithmetic, such as
      BERT's position ids, is a run-time assert torch-mlir leaves for IREE; function ops expanded);
    - the folded model with the nodes torch-mlir refuses alone kept as ONNX (``onnx_kept``);
    - the same on the model as it is (ONNX Runtime's folding inlines function ops such as
      ``SoftmaxCrossEntropyLoss`` into nodes that import alone but not together: the op is kept whole);
    - the folded model without its tail (``onnx_tail``: nodes whose output shapes depend on their data, and
      all after them), which then runs on ONNX Runtime after the program;
    - the folded model with the nodes refused only among their neighbours kept too
      (``onnx_kept.refused_in_context``: the last resort, a bisection of imports).
    Nodes giving a ``keep`` output are kept as ONNX in every attempt."""
    first: CollageError | None = None
    with tempfile.TemporaryDirectory(prefix="collage-fold-") as tmp:
        cut = Path(tmp) / "cut.onnx"

        def attempts():
            yield lambda: _import_kept(path, [], keep, cut, context, isolated) if keep \
                else import_onnx(path, context, isolated=isolated)
            folded = fold_shapes(path, Path(tmp))
            if folded != path and not keep:
                yield lambda: import_onnx(folded, context, isolated=isolated)
            refused = onnx_kept.refused_nodes(folded)
            if refused or keep:
                yield lambda: _import_kept(folded, refused, keep, cut, context, isolated)
            if folded != path:
                original = onnx_kept.refused_nodes(path)
                if original:
                    yield lambda: _import_kept(path, original, keep, cut, context, isolated)
            tail = onnx_tail.split(folded, Path(tmp) / "head.onnx")
            if tail is not None:
                yield lambda: _with_tail(_import_onnx_folding(Path(tmp) / "head.onnx", context, isolated, keep), tail)
            yield lambda: _import_kept(folded, onnx_kept.refused_in_context(folded, refused, Path(tmp), keep), keep,
                                       cut, context, isolated)

        for attempt in attempts():
            try:
                return attempt()
            except CollageError as exc:
                first = first or exc
        raise first from None


def _with_tail(module: ir.Module, tail: OnnxTail) -> ir.Module:
    tail.attach(module)
    return module


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
