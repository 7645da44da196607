"""Collage passes: one per file, each a small dataclass with a kebab-case ``name`` and its options as
fields. Each runs from Python (``SomePass(...).run(module)``), inside an MLIR PassManager
(``add_to(pm)``), and from ``collage-opt --<name>``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

from ..errors import CollageError
from ..ir import ir, passmanager

if TYPE_CHECKING:
    from ..backends import Backend


def region_functions(block: ir.Block) -> list[tuple[ir.Operation, "Backend"]]:
    """The outlined region functions of a module body (``func.func`` with a body and a
    ``collage.backend``), each with its backend."""
    from ..backends import get_backend
    from ..dialects import collage
    from ..ir import location_text

    found = []
    for op in block.operations:
        fn = op.operation
        name = collage.str_attr(fn, collage.BACKEND) if fn.name == "func.func" else None
        if name is not None and len(fn.regions[0].blocks):
            try:
                found.append((fn, get_backend(name, where=location_text(fn.location))))
            except CollageError as exc:
                exc.location = fn.location
                raise
    return found


class ModulePass:
    """Base of the collage passes: subclasses are dataclasses that implement ``run(module)``."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""

    def run(self, module: ir.Module | ir.Operation) -> None:
        """Transforms ``module`` (an ir.Module or the builtin.module operation) in place."""
        raise TypeError(f"{type(self).__name__} does not define run()")

    def add_to(self, pm: passmanager.PassManager) -> None:
        """Adds this pass to ``pm``. A CollageError raised inside becomes an MLIR error diagnostic on the
        op it names (else on the module), so diagnostic handlers and ``--verify-diagnostics`` see it, and
        is re-raised by ``run_pipeline`` as the one-line error drivers print."""

        def run(op: ir.Operation, pass_) -> None:
            try:
                self.run(op)
            except CollageError as exc:
                _FAILURES.append(exc)
                loc = exc.location if isinstance(exc.location, ir.Location) else op.location
                loc.emit_error(str(exc))
                pass_.signal_pass_failure()

        pm.add(run, name=type(self).__name__, argument=self.name, description=self.summary)

    @classmethod
    def from_options(cls, text: str, *, where: str = "collage-opt") -> "ModulePass":
        """Builds the pass from MLIR-style options ``key=value key2=value2`` (dashes or underscores)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for item in text.split():
            key, sep, value = item.partition("=")
            attr = key.replace("-", "_")
            if not sep or attr not in fields:
                known = ", ".join(f.replace("_", "-") for f in fields) or "none"
                raise CollageError(f"unknown option '{item}' for --{cls.name} (options: {known})", where=where)
            kwargs[attr] = value
        return cls(**kwargs)


_FAILURES: list[CollageError] = []


def run_pipeline(pm: passmanager.PassManager, module: ir.Module) -> None:
    """Runs ``pm`` on ``module``, turning a failure into one CollageError with its cause."""
    _FAILURES.clear()
    try:
        pm.run(module.operation)
    except ir.MLIRError as exc:
        if _FAILURES:
            raise _FAILURES[0] from None
        from ..ir import diagnostics_text

        raise CollageError(f"pass pipeline failed: {diagnostics_text(exc)}") from None
    if _FAILURES:
        raise _FAILURES[0]


def registry() -> dict[str, type[ModulePass]]:
    """Pass name → class, for every collage pass."""
    from .assign import AssignPass
    from .lower import LowerPass
    from .number_ops import NumberOpsPass
    from .outline import OutlinePass
    from .place_devices import PlaceDevicesPass

    return {p.name: p for p in (NumberOpsPass, AssignPass, OutlinePass, LowerPass, PlaceDevicesPass)}


#: The pipeline ``collage compile`` runs (and ``collage-opt --collage-partition``), in order.
PARTITION = "collage-partition"


def partition_pipeline(plan: "str | object" = "", artifact_dir: str = "",
                       default_flags: str = "--iree-llvmcpu-target-cpu=host") -> list[ModulePass]:
    """The collage passes that partition a module by ``plan`` (a Plan or a plan file): number ops, assign,
    outline, lower (building region artifacts into ``artifact_dir`` when given), place devices."""
    from .assign import AssignPass
    from .lower import LowerPass
    from .number_ops import NumberOpsPass
    from .outline import OutlinePass
    from .place_devices import PlaceDevicesPass

    return [NumberOpsPass(), AssignPass(plan), OutlinePass(), LowerPass(artifact_dir),
            PlaceDevicesPass(default_flags=default_flags)]
