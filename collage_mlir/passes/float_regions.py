"""`collage-float-regions`: a plan region whose precision is ``float`` computes in float. In its ops (tagged
``collage.precision = "float"`` by ``collage-assign``), each ``uniform_dequantize(uniform_quantize(x))``
becomes ``x`` (``dialects.stablehlo.dequantize_pairs``): the quantized weights' values in float, the
activations unrounded, clamped only where the quantized range starts at 0 (a quantizer's folded ReLU; the
clamp joins the region). A pair whose result another region or op reads keeps serving it.

Runs after ``collage-assign`` and before ``collage-outline``; a module without float regions is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..backends import Precision
from ..dialects import collage
from ..dialects import stablehlo as sh
from ..graph import body_ops, public_funcs
from ..ir import ir
from .base import ModulePass


@dataclass(frozen=True)
class FloatRegionsPass(ModulePass):
    name = "collage-float-regions"
    summary = "Remove the quantize/dequantize pairs of plan regions whose precision is float"

    def run(self, module: ir.Module | ir.Operation) -> None:
        for func in public_funcs(module):
            regions: dict[str, list[ir.Operation]] = {}
            for op in body_ops(func):
                if collage.str_attr(op, collage.PRECISION) == Precision.FLOAT.value:
                    regions.setdefault(collage.str_attr(op, collage.REGION), []).append(op)
                    del op.attributes[collage.PRECISION]
            for ops in regions.values():
                for op in sh.dequantize_pairs(ops):
                    op.erase()
            if regions:  # @main no longer computes the quantized file it was imported from
                collage.OnnxSource.detach(module)
