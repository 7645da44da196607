"""JAX entry points: ``collage_mlir.jax.compile(fn, *example_args)`` and ``collage_mlir.jax.jit(fn)``.

    compiled = collage_mlir.jax.compile(f, x, w, plan="prefer:xla-cpu")
    y = compiled(x, w)                      # numpy arrays in, numpy arrays out (the function's pytree)
    g = collage_mlir.jax.jit(f)             # compiles on first call per input signature

The function is lowered by ``jax.jit(fn).lower(*args)`` to StableHLO, placed by a plan (as in
``collage_mlir.torch``: the one named, else the one tuned before for this structure from the cost DB,
else a tune within ``tune_budget``, else the default) and compiled into an artifact under the cache
directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from .entry import PlanChoice, choose_plan, compile_cached
from .frontends.jax import import_jax
from .ir import new_context
from .measure.import_check import check_import as check, jax_source


class CompiledFunction:
    """A JAX function compiled by collage for one input signature."""

    def __init__(self, program, out_tree, choice: PlanChoice):
        self.program = program
        self.plan = choice.plan
        self.plan_how = choice.how  # "given", "tuned before", "tuned now" or "default"
        self._out_tree = out_tree

    def __call__(self, *args):
        import jax

        leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
        return jax.tree_util.tree_unflatten(self._out_tree, list(self.program.invoke("main", *leaves)))


def compile(fn: Callable, *example_args, plan: str | None = None, tune_budget: float | None = None,  # noqa: A001
            db: str | Path | None = None, threads: int | None = None, check_import: bool = True) -> CompiledFunction:
    """Lowers ``fn`` for ``example_args``' shapes and dtypes and compiles it by ``plan`` (None: tuned
    before, else tuned within ``tune_budget`` seconds when given, else the default). ``check_import``:
    the lowered module runs with IREE alone on the example arguments and must match ``jax.jit(fn)``
    (``measure.import_check``; the verdict is cached)."""
    import jax

    import collage_runtime

    module = import_jax(fn, example_args, new_context())
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *example_args))
    leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(example_args)]
    if check_import:  # device_put: the dtypes jax canonicalizes to (no x64: int64 becomes int32), as lowered
        check(module, jax_source(fn, example_args),
              [np.asarray(a) for a in jax.tree_util.tree_leaves(jax.device_put(example_args))],
              where=f"jax:{getattr(fn, '__name__', 'fn')}")
    choice = choose_plan(module, plan, tune_budget=tune_budget, db=db, examples={"main": leaves})
    out = compile_cached(module, choice, source=f"jax:{getattr(fn, '__name__', 'fn')}")
    return CompiledFunction(collage_runtime.load(out, threads=threads), out_tree, choice)


def jit(fn: Callable, *, plan: str | None = None, check_import: bool = True) -> Callable[..., Any]:
    """Like ``jax.jit``: compiles ``fn`` with collage on the first call for each input signature."""
    import jax

    compiled: dict[tuple, CompiledFunction] = {}

    def call(*args):
        leaves, tree = jax.tree_util.tree_flatten(args)
        key = (tree, tuple((np.shape(a), np.asarray(a).dtype.str) for a in leaves))
        if key not in compiled:
            compiled[key] = compile(fn, *args, plan=plan, check_import=check_import)
        return compiled[key](*args)

    return call
