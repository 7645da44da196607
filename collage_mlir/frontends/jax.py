"""JAX frontend: a function and example arguments to StableHLO, through ``jax.jit(fn).lower(*args)``, with
its function calls inlined (``frontends.stablehlo``). The public signature is JAX's: one argument per
leaf of the arguments' pytree, ``jax.result_info`` on the results.

A cached import (``cache=True``: the zoo's functions close over large weights, and a JAX ResNet-50 is
~100 MB of MLIR text whose parse and inlining take longer than its lowering) is stored as bytecode under
the cache directory, keyed by the digest of the lowered text.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Callable, Sequence

from ..errors import CollageError
from ..ir import ir, new_context, parse_module
from . import cache_dir, refine, stablehlo, write_cache


def lower_text(fn: Callable, args: Sequence) -> str:
    """The StableHLO text of ``jax.jit(fn)`` lowered for ``args``' shapes and dtypes, its shapes all static
    (``frontends.refine``); one CollageError line where JAX cannot trace it."""
    try:
        import jax
    except ImportError as exc:
        raise CollageError(f"the JAX frontend needs jax ({exc}); run `pip install 'collage-mlir[xla]'`") from None
    try:
        text = jax.jit(fn).lower(*args).as_text()
    except Exception as exc:  # noqa: BLE001  jax's tracing errors have many types
        raise CollageError(f"jax could not lower the function: {' '.join(str(exc).split())[:300]}") from None
    if refine.DYNAMIC_TYPE.search(text):  # it calls a jax.export module: refined for ``args``' shapes
        where = f"jax:{getattr(fn, '__name__', 'fn')}"
        with new_context() as context:
            text = str(parse_module(refine.refined(text.encode(), where), context, where=where))
    return text


def import_jax(fn: Callable, args: Sequence, context: ir.Context, *, cache: Path | bool = False) -> ir.Module:
    """``fn`` lowered for ``args`` as a normalized StableHLO module in ``context``; with ``cache`` (True:
    the user's cache directory), read from or written to the cache."""
    where = f"jax:{getattr(fn, '__name__', 'fn')}"
    text = lower_text(fn, args)
    path = None
    if cache is not False:
        root = Path(cache) if isinstance(cache, (str, Path)) else cache_dir() / "jax"
        path = root / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.mlirbc"
        if path.exists():
            return parse_module(path.read_bytes(), context, where=where)
    module = stablehlo.parse(text, context, where=where)
    if path is not None:
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
        write_cache(path, buf.getvalue())
    return module
