"""`collage-number-ops`: gives every top-level op of every public function a stable ``collage.id``.

Numbering is deterministic: functions in module order, ops in block order, from 0. The same module
text always gets the same ids, so plans written against it stay valid.

Every collage pipeline starts here, so this is also where complex constants are split into real and
imaginary parts (``stablehlo.split_complex_constants``): the Python bindings cannot read them, and every
later step reads constants. Ids are given after the split.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dialects import collage
from ..dialects.stablehlo import split_complex_constants
from ..graph import body_ops, public_funcs
from ..ir import ir
from . import ModulePass


@dataclass
class NumberOpsPass(ModulePass):
    name = "collage-number-ops"
    summary = "Number the ops of public functions with collage.id"

    def run(self, module: ir.Module | ir.Operation) -> None:
        with module.operation.context:
            split_complex_constants(module)
            next_id = 0
            for func in public_funcs(module):
                for op in body_ops(func):
                    collage.set_op_id(op, next_id)
                    next_id += 1
