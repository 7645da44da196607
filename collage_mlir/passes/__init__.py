"""Collage passes, one per file, each a frozen dataclass on ``base.ModulePass`` with a kebab-case
``name`` and its options as typed fields; this package holds their registry and the partition pipeline
(``collage compile``'s, and ``collage-opt --collage-partition``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..backends import DEFAULT_BACKEND
from ..plan import Plan
from .assign import AssignPass
from .base import ModulePass, PassPipeline, parse_options
from .float_regions import FloatRegionsPass
from .lower import LowerPass
from .number_ops import NumberOpsPass
from .outline import OutlinePass
from .place_devices import DEFAULT_FLAGS, PlaceDevicesPass

__all__ = ["ModulePass", "PassPipeline", "PARTITION", "PartitionPipeline", "partition_pipeline", "registry"]

#: Every collage pass, in the order the partition pipeline runs them.
PASSES: tuple[type[ModulePass], ...] = (NumberOpsPass, AssignPass, FloatRegionsPass, OutlinePass, LowerPass,
                                        PlaceDevicesPass)


def registry() -> dict[str, type[ModulePass]]:
    """Pass name → class, for every collage pass."""
    return {p.name: p for p in PASSES}


@dataclass(frozen=True)
class PartitionPipeline:
    """The pipeline ``collage compile`` runs (and ``collage-opt --collage-partition``), with its passes'
    options: number ops, assign ``plan`` (a Plan, a plan file, or None for the module's ``collage.plan``),
    float regions, outline, lower (building region artifacts into ``artifact_dir`` when given), place devices (the
    default device's llvm-cpu flags: ``default_flags``)."""

    name: ClassVar[str] = "collage-partition"
    plan: Plan | Path | None = None
    artifact_dir: Path | None = None
    default_flags: tuple[str, ...] = DEFAULT_FLAGS
    kernel_arch: str = ""

    @classmethod
    def from_options(cls, text: str, *, where: str = "collage-opt") -> "PartitionPipeline":
        return parse_options(cls, text, name=cls.name, where=where)

    def passes(self) -> list[ModulePass]:
        default = self.plan.default_backend if isinstance(self.plan, Plan) else DEFAULT_BACKEND
        return [NumberOpsPass(), AssignPass(self.plan), FloatRegionsPass(), OutlinePass(),
                LowerPass(self.artifact_dir, self.kernel_arch),
                PlaceDevicesPass(self.default_flags, default)]


#: The partition pipeline's name.
PARTITION = PartitionPipeline.name


def partition_pipeline(plan: Plan | Path | None = None, artifact_dir: Path | None = None,
                       default_flags: tuple[str, ...] = DEFAULT_FLAGS, kernel_arch: str = "") -> list[ModulePass]:
    """The collage passes that partition a module by ``plan`` (see ``PartitionPipeline``)."""
    return PartitionPipeline(plan, artifact_dir, default_flags, kernel_arch).passes()
