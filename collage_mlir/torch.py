"""PyTorch entry points: ``torch.compile(model, backend="collage")`` and ``collage_mlir.torch.compile``.

    compiled = collage_mlir.torch.compile(model, [x])            # tuned before? that plan; else the default
    compiled = collage_mlir.torch.compile(model, [x], tune_budget=120)   # else tune for up to 120 s
    y = compiled(x)
    y = torch.compile(model, backend="collage", options={"tune_budget": 120})(x)

The model goes through the torch frontend (torch-mlir's fx importer to StableHLO, cached on disk), is
placed by a plan (``collage_mlir.entry.choose_plan``: the one tuned before for this structure, found in the
cost DB by structural hash; else a tune within ``tune_budget``; else the default plan; or the ``plan``
named: ``default``, ``random:N``, ``prefer:B1,B2``, a plan file, ``tune``), compiled into an artifact
under the cache directory, and returned as a callable on torch tensors. A graph collage cannot take
falls back to eager PyTorch with one warning naming the reason.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from .entry import PlanChoice, choose_plan, compile_cached
from .errors import CollageError
from .frontends.torch import import_torch
from .ir import new_context

#: ``torch.compile(..., options={...})`` keys the ``collage`` backend takes (``compile``'s keywords).
DYNAMO_OPTIONS = ("plan", "tune_budget", "backends", "seed", "db", "threads")


class CompiledModule:
    """A model compiled by collage: call it with tensors like the model; results come back as tensors.

    No copies on the way in or out (``Program.invoke_dlpack``): a contiguous CPU tensor whose data is
    64-byte aligned (any tensor torch allocates; not a view at an offset) is read in place, and each result
    is a tensor over the IREE result buffer (``torch.from_dlpack``; the tensor keeps the buffer alive). An
    unaligned or strided input, a tensor on another device, or a sub-byte/empty result is copied once. A
    result can share memory with an input, as in eager PyTorch, where the model returns that input."""

    def __init__(self, program, out_spec, choice: PlanChoice):
        self.program = program
        self.plan = choice.plan
        self.plan_how = choice.how  # "given", "tuned before", "tuned now" or "default"
        self._out_spec = out_spec

    def __call__(self, *args):
        import numpy as np
        import torch
        from torch.utils import _pytree as pytree

        # detach: DLPack refuses tensors that require grad; cpu(): a no-op for a CPU tensor.
        inputs = [a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in args]
        outs = self.program.invoke_dlpack("main", *inputs)
        # Host arrays (results IREE cannot export) may be read-only, which DLPack cannot say: from_numpy.
        tensors = [torch.from_numpy(o) if isinstance(o, np.ndarray) else torch.from_dlpack(o) for o in outs]
        return pytree.tree_unflatten(tensors, self._out_spec)


def compile(model, example_inputs: Sequence, *, plan: str | None = None,  # noqa: A001
            tune_budget: float | None = None, backends: Sequence[str] | None = None, seed: int = 0,
            db: str | Path | None = None, threads: int | None = None) -> CompiledModule:
    """Compiles ``model`` for ``example_inputs``' shapes and dtypes; raises CollageError when it cannot.
    The plan: ``plan`` when given, else the one tuned before for this model's structure (cost DB
    ``db``), else a tune over ``backends`` within ``tune_budget`` seconds when given, else the default."""
    import torch
    from torch.utils import _pytree as pytree

    import collage_runtime

    with torch.no_grad():
        _, out_spec = pytree.tree_flatten(model(*example_inputs))
    module = import_torch(model, list(example_inputs), new_context())
    tuning = plan == "tune" or bool(tune_budget)  # only a tune needs the inputs' values
    examples = {"main": [a.detach().cpu().numpy() for a in example_inputs]} if tuning else None
    choice = choose_plan(module, plan, tune_budget=tune_budget, backends=backends, seed=seed, db=db,
                         examples=examples)
    out = compile_cached(module, choice, source=f"torch:{type(model).__name__}")
    return CompiledModule(collage_runtime.load(out, threads=threads), out_spec, choice)


def dynamo_backend(gm, example_inputs: Sequence, options: dict | None = None) -> Callable[..., Any]:
    """torch.compile backend ``collage`` (``options``: ``compile``'s keywords, e.g. ``tune_budget``); eager
    with one warning where collage cannot."""
    try:
        unknown = sorted(set(options or {}) - set(DYNAMO_OPTIONS))
        if unknown:
            raise CollageError(f"unknown collage option(s) {', '.join(unknown)} (known: {', '.join(DYNAMO_OPTIONS)})")
        compiled = compile(gm, example_inputs, **(options or {}))
    except (CollageError, Exception) as exc:  # noqa: BLE001  any failure falls back, as torch backends do
        why = " ".join(str(exc).split())[:200] or type(exc).__name__
        warnings.warn(f"collage: running this graph eagerly: {why}", RuntimeWarning, stacklevel=2)
        return gm.forward
    return compiled
