"""JAX entry points: ``collage_mlir.jax.compile(fn, *example_args)`` and ``collage_mlir.jax.jit(fn)``.

    compiled = collage_mlir.jax.compile(f, x, w, plan="prefer:xla-cpu")
    y = compiled(x, w)                      # numpy arrays in, numpy arrays out (the function's pytree)
    g = collage_mlir.jax.jit(f)             # compiles on first call per input signature

The function is lowered by ``jax.jit(fn).lower(*args)`` to StableHLO, placed by the plan and compiled into
an artifact under the cache directory.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

import numpy as np

from .errors import CollageError
from .frontends import cache_dir
from .graph import Graph
from .ir import new_context, parse_module
from .iree import compile_module
from .passes.number_ops import NumberOpsPass
from .search import resolve_plan


class CompiledFunction:
    """A JAX function compiled by collage for one input signature."""

    def __init__(self, program, out_tree, plan):
        self.program = program
        self.plan = plan
        self._out_tree = out_tree

    def __call__(self, *args):
        import jax

        leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
        return jax.tree_util.tree_unflatten(self._out_tree, list(self.program.invoke("main", *leaves)))


def compile(fn: Callable, *example_args, plan: str = "default", threads: int | None = None  # noqa: A001
            ) -> CompiledFunction:
    """Lowers ``fn`` for ``example_args``' shapes and dtypes and compiles it by ``plan``."""
    import jax

    import collage_runtime

    try:
        lowered = jax.jit(fn).lower(*example_args)
    except Exception as exc:  # noqa: BLE001  jax's tracing errors have many types
        raise CollageError(f"jax could not lower the function: {' '.join(str(exc).split())[:300]}") from None
    text = lowered.as_text()
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *example_args))
    module = parse_module(text, new_context(), where="<jax>")
    NumberOpsPass().run(module)  # idempotent: the compile driver numbers it again, to the same ids
    resolved = resolve_plan(plan, Graph(module))
    key = hashlib.sha256(f"{text}:{resolved.to_json()}".encode()).hexdigest()[:16]
    out = cache_dir() / "compiled" / f"jax-{key}.collage"
    if not out.exists():
        compile_module(module, resolved, out, source=f"jax:{getattr(fn, '__name__', 'fn')}")
    return CompiledFunction(collage_runtime.load(out, threads=threads), out_tree, resolved)


def jit(fn: Callable, *, plan: str = "default") -> Callable[..., Any]:
    """Like ``jax.jit``: compiles ``fn`` with collage on the first call for each input signature."""
    import jax

    compiled: dict[tuple, CompiledFunction] = {}

    def call(*args):
        leaves, tree = jax.tree_util.tree_flatten(args)
        key = (tree, tuple((np.shape(a), np.asarray(a).dtype.str) for a in leaves))
        if key not in compiled:
            compiled[key] = compile(fn, *args, plan=plan)
        return compiled[key](*args)

    return call
