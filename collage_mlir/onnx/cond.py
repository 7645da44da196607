"""``stablehlo.case`` (``lax.cond``, ``lax.switch``) as nested ONNX ``If``s, each branch a subgraph."""

from __future__ import annotations

import numpy as np

from .builder import _block_results, _Builder
from .registry import register, static_known_types
from .values import DTYPES, _dtype, _shape


@register("stablehlo.case", when=(static_known_types,), nested=True)
def _case(b: _Builder, op, ins):
    """``stablehlo.case`` (``lax.cond``, ``lax.switch``) as nested ONNX ``If``s: branch ``k`` where the index
    is ``k``, the last branch for any other index (StableHLO's rule); each branch a graph of no inputs that
    reads the enclosing graph's values by name (JAX's branches capture theirs)."""
    branches = [r.blocks[0] for r in op.regions]
    types = [(_dtype(v), _shape(v)) for v in op.results]
    index_type = DTYPES[_dtype(op.operands[0])][0]

    def chain(k: int) -> list[str]:
        if k == len(branches) - 1:
            return _block_results(b, branches[k], [])
        taken = b.node("Equal", [ins[0], b.const(np.asarray(k, index_type), "branch")])
        then = b.graph(b.fresh("then"), [], lambda: list(zip(_block_results(b, branches[k], []), *zip(*types))))
        rest = b.graph(b.fresh("else"), [], lambda: list(zip(chain(k + 1), *zip(*types))))
        return b.multi_node("If", [taken], len(types), then_branch=then, else_branch=rest)

    return chain(0)
