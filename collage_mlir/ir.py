"""The one place that picks the MLIR bindings: IREE's, whose context registers stablehlo, chlo,
linalg, flow, hal, util and check. Every other module imports ``ir`` from here."""

from __future__ import annotations

import re
from pathlib import Path

from iree.compiler import ir, passmanager  # noqa: F401  (re-exported)
from iree.compiler import rewrite  # noqa: F401  (re-exported)

from .errors import CollageError

# IREE's bindings have no Python module for stablehlo, so every OpView of a stablehlo op (``value.owner``)
# retried a failing ``import iree.compiler.dialects.stablehlo`` (uncached on failure): 70 % of the
# candidate enumeration's time. ``collage_mlir.dialects.stablehlo`` stands in as the dialect's module.
ir._globals.append_dialect_search_prefix("collage_mlir.dialects")

__all__ = ["ir", "passmanager", "rewrite", "new_context", "parse_module", "load_module", "diagnostics_text",
           "location_text"]

# Source names of modules parsed from strings, by context, so their "-" locations name the input.
_SOURCES: dict[int, str] = {}
_FILE_LOC = re.compile(r'loc\("([^"]*)":(\d+):(\d+)(?: to [^)]*)?\)')


def new_context() -> ir.Context:
    """A fresh context with every dialect IREE's compiler knows."""
    return ir.Context()


def location_text(loc: object, source: str | None = None) -> str:
    """``loc("f.mlir":3:7)`` → ``f.mlir:3:7`` (``source`` replaces the name ``-`` of parsed strings)."""
    if source is None and isinstance(loc, ir.Location):
        source = _SOURCES.get(id(loc.context))

    def fmt(m: re.Match) -> str:
        name = source if (m.group(1) in ("-", "") and source) else m.group(1)
        return f"{name}:{m.group(2)}:{m.group(3)}"

    return _FILE_LOC.sub(fmt, str(loc))


def diagnostics_text(exc: Exception, source: str | None = None) -> str:
    """Flattens an MLIRError (with its diagnostics and locations) into one line."""
    diags = getattr(exc, "error_diagnostics", None)
    if diags:
        return "; ".join(f"{location_text(d.location, source)}: {d.message}" for d in diags)
    return location_text(" ".join(str(exc).split()), source)


def parse_module(source: str | bytes, context: ir.Context, *, where: str = "<input>") -> ir.Module:
    """Parses MLIR text or bytecode; a syntax error becomes one CollageError line with its location."""
    _SOURCES[id(context)] = where
    try:
        with context:
            return ir.Module.parse(source)
    except ir.MLIRError as exc:
        raise CollageError(f"cannot parse MLIR: {diagnostics_text(exc, where)}") from None


def load_module(path: str | Path, context: ir.Context) -> ir.Module:
    """Reads a ``.mlir`` (text) or ``.mlirbc`` (bytecode) file into ``context``."""
    path = Path(path)
    if not path.is_file():
        raise CollageError("no such file; give a .mlir (text) or .mlirbc (bytecode) StableHLO module", where=str(path))
    try:
        with context:  # parseFile keeps the file name in every location
            return ir.Module.parseFile(str(path))
    except ir.MLIRError as exc:
        raise CollageError(f"cannot parse MLIR: {diagnostics_text(exc, str(path))}") from None
