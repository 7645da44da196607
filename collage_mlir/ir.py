"""The one place that picks the MLIR bindings: IREE's, whose context registers stablehlo, chlo,
linalg, flow, hal, util and check. Every other module imports ``ir`` from here."""

from __future__ import annotations

from pathlib import Path

from iree.compiler import ir, passmanager  # noqa: F401  (re-exported)
from iree.compiler import rewrite  # noqa: F401  (re-exported)

from .errors import CollageError

__all__ = ["ir", "passmanager", "rewrite", "new_context", "parse_module", "load_module", "diagnostics_text"]


def new_context() -> ir.Context:
    """A fresh context with every dialect IREE's compiler knows."""
    return ir.Context()


def diagnostics_text(exc: Exception) -> str:
    """Flattens an MLIRError (with its diagnostics and locations) into one line."""
    diags = getattr(exc, "error_diagnostics", None)
    if diags:
        return "; ".join(f"{d.location}: {d.message}" for d in diags)
    return " ".join(str(exc).split())


def parse_module(source: str | bytes, context: ir.Context, *, where: str = "<input>") -> ir.Module:
    """Parses MLIR text or bytecode; a syntax error becomes one CollageError line with its location."""
    try:
        with context:
            return ir.Module.parse(source)
    except ir.MLIRError as exc:
        raise CollageError(f"cannot parse MLIR: {diagnostics_text(exc)}", where=where) from None


def load_module(path: str | Path, context: ir.Context) -> ir.Module:
    """Reads a ``.mlir`` (text) or ``.mlirbc`` (bytecode) file into ``context``."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CollageError(f"cannot read file: {exc.strerror}", where=str(path)) from None
    # MLIR bytecode starts with the magic "ML\xefR"; everything else is text.
    source: str | bytes = data if data.startswith(b"ML\xefR") else data.decode("utf-8", "replace")
    return parse_module(source, context, where=str(path))
