"""The base of the collage passes, as xDSL's ``xdsl/passes.py`` writes it: each pass is a frozen
dataclass with a kebab-case ``name`` and its options as typed fields, built from MLIR-style option text
by ``from_options`` (each value parsed by its field's annotation), and runs from Python
(``SomePass(...).run(module)``), inside an MLIR PassManager (``PassPipeline``) and from
``collage-opt --<name>``.

A CollageError a pass raises inside a PassManager becomes an MLIR error diagnostic and is kept by the
pipeline run it happened in, which re-raises it: a run never reports another run's failure.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable, ClassVar, TypeVar, Union

from ..errors import CollageError
from ..ir import diagnostics_text, ir, passmanager

T = TypeVar("T")

#: What ``add_to`` hands a pass's CollageError to (the pipeline run in progress).
Report = Callable[[CollageError], None]


@dataclasses.dataclass(frozen=True)
class ModulePass(ABC):
    """Base of the collage passes: frozen dataclasses whose fields are their options, implementing
    ``run(module)``."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""

    @abstractmethod
    def run(self, module: ir.Module | ir.Operation) -> None:
        """Transforms ``module`` (an ir.Module or the builtin.module operation) in place."""

    def add_to(self, pm: passmanager.PassManager, report: Report | None = None) -> None:
        """Adds this pass to ``pm``. A CollageError raised inside becomes an MLIR error diagnostic on the
        op it names (else on the module), so diagnostic handlers and ``--verify-diagnostics`` see it, and
        goes to ``report`` (``PassPipeline`` re-raises it as the one-line error drivers print)."""

        def run(op: ir.Operation, pass_) -> None:
            try:
                self.run(op)
            except CollageError as exc:
                if report is not None:
                    report(exc)
                loc = exc.location if isinstance(exc.location, ir.Location) else op.location
                loc.emit_error(str(exc))
                pass_.signal_pass_failure()

        pm.add(run, name=type(self).__name__, argument=self.name, description=self.summary)

    @classmethod
    def from_options(cls: type[T], text: str, *, where: str = "collage-opt") -> T:
        """Builds the pass from MLIR-style options ``key=value key2=value2`` (dashes or underscores)."""
        return parse_options(cls, text, name=cls.name, where=where)


class PassPipeline:
    """A module PassManager of collage passes (and upstream ones, by pipeline text), run by ``run``.
    Each run collects the failures of its own collage passes, so a clean run after a failing one
    reports nothing."""

    def __init__(self, context: ir.Context | None = None) -> None:
        """``context``: the modules' context (default: the current one)."""
        self.pm = passmanager.PassManager("builtin.module", context=context)
        self._failures: list[CollageError] | None = None  # those of the run in progress

    def add(self, item: ModulePass | str) -> None:
        """Appends a collage pass, or an upstream pipeline element (``canonicalize``, ``func.func(cse)``);
        a bad element raises ValueError, as ``PassManager.add`` does."""
        if isinstance(item, ModulePass):
            item.add_to(self.pm, self._report)
        else:
            self.pm.add(item)

    def _report(self, exc: CollageError) -> None:
        if self._failures is not None:
            self._failures.append(exc)

    def run(self, module: ir.Module) -> None:
        """Runs the pipeline on ``module``, turning a failure into one CollageError with its cause: the
        first a collage pass raised, else the MLIR diagnostics."""
        failures: list[CollageError] = []
        outer, self._failures = self._failures, failures
        try:
            self.pm.run(module.operation)
        except ir.MLIRError as exc:
            if failures:
                raise failures[0] from None
            raise CollageError(f"pass pipeline failed: {diagnostics_text(exc)}") from None
        finally:
            self._failures = outer
        if failures:
            raise failures[0]


# --- options ------------------------------------------------------------------------------------


def option_fields(cls: type) -> dict[str, tuple[dataclasses.Field, object]]:
    """Field name → (field, resolved type annotation) of the options of dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls) if f.init}


def parse_options(cls: type[T], text: str, *, name: str, where: str = "collage-opt") -> T:
    """An instance of dataclass ``cls`` from ``key=value`` options separated by spaces, each value parsed
    by its field's type (str, int, float, bool, Path, ``tuple[X, ...]`` from a comma-separated list,
    unions such as ``X | None``, where an empty value is None). A bool option alone means true.
    ``name`` is what errors call the pass (``--name``)."""
    fields = option_fields(cls)
    kwargs = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        attr = key.replace("-", "_")
        if attr in fields and not sep and fields[attr][1] is bool:
            sep, value = "=", "true"
        if not sep or attr not in fields:
            known = ", ".join(f.replace("_", "-") for f in fields) or "none"
            raise CollageError(f"unknown option '{item}' for --{name} (options: {known})", where=where)
        hint = fields[attr][1]
        try:
            kwargs[attr] = _convert(value, hint)
        except ValueError:
            raise CollageError(f"option '{key}' of --{name}: expected {describe(hint)}, got '{value}'",
                               where=where) from None
    return cls(**kwargs)


_BOOLS = {"true": True, "1": True, "on": True, "false": False, "0": False, "off": False}


def _convert(value: str, hint: object) -> object:
    """``value`` as type ``hint``; ValueError when it is not one."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if type(None) in args and value in ("", "none"):
            return None
        for arm in args:
            if arm is not type(None) and _parsable(arm):
                try:
                    return _convert(value, arm)
                except ValueError:
                    continue
        raise ValueError(value)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return tuple(_convert(v, args[0]) for v in value.split(",") if v)
    if hint is bool:
        if value.lower() not in _BOOLS:
            raise ValueError(value)
        return _BOOLS[value.lower()]
    if hint in (str, int, float, Path):
        return hint(value)
    raise TypeError(f"options of type {hint} cannot be given as text")


def _parsable(hint: object) -> bool:
    origin = typing.get_origin(hint)
    return hint in (str, int, float, bool, Path) or origin in (tuple, Union, types.UnionType)


def describe(hint: object) -> str:
    """What an option of type ``hint`` takes (for errors and help): ``int``, ``path or none``,
    ``comma-separated str``..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        arms = [describe(a) for a in args if a is not type(None) and _parsable(a)]
        return " or ".join(arms + (["none"] if type(None) in args else []))
    if origin is tuple:
        return f"comma-separated {describe(args[0])}"
    return {bool: "true or false", Path: "path"}.get(hint, getattr(hint, "__name__", str(hint)))


def option_text(value: object) -> str:
    """An option value as ``from_options`` reads it back (``a,b`` for a tuple, empty for None)."""
    if value is None:
        return ""
    if isinstance(value, tuple):
        return ",".join(option_text(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
