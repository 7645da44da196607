"""`collage-number-ops`: gives every top-level op of every public function a stable ``collage.id``
(``graph.number_ops``: deterministic, so plans written against a module stay valid; complex constants are
split first, since the Python bindings cannot read them; float math on splat constants is folded and ops
returning their operand unchanged dropped).

Every collage pipeline starts here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph import number_ops
from ..ir import ir
from .base import ModulePass


@dataclass(frozen=True)
class NumberOpsPass(ModulePass):
    name = "collage-number-ops"
    summary = "Number the ops of public functions with collage.id"

    def run(self, module: ir.Module | ir.Operation) -> None:
        number_ops(module)
