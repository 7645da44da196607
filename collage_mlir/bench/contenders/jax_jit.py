"""``jax.jit`` on XLA:CPU, as a JAX user runs a model: the function compiled once, its inputs already on
the device, each call waited on (``block_until_ready``). The reference of the JAX zoo models."""

from __future__ import annotations

from ...zoo import Framework
from . import Contender, Prepared, SetupContext


def setup(ctx: SetupContext) -> Prepared:
    import jax
    import numpy as np

    from ... import zoo

    fn, inputs = zoo.build(ctx.model, ctx.small)
    compiled = jax.jit(fn)
    args = jax.device_put(inputs)
    last = []

    def run():
        last[:] = [jax.block_until_ready(compiled(*args))]

    return Prepared(run, lambda: [np.asarray(x) for x in jax.tree_util.tree_leaves(last[0])])


CONTENDER = Contender("jax", "jax.jit (XLA:CPU)", setup, frameworks=frozenset({Framework.JAX}))
