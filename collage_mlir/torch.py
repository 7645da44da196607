"""PyTorch entry points: ``torch.compile(model, backend="collage")`` and ``collage_mlir.torch.compile``.

    compiled = collage_mlir.torch.compile(model, [x])            # the default plan: no tuning surprise
    compiled = collage_mlir.torch.compile(model, [x], plan="tune", budget_s=120)
    y = compiled(x)
    y = torch.compile(model, backend="collage")(x)              # registered through torch's entry points

The model goes through the torch frontend (torch-mlir's fx importer to StableHLO, cached on disk), is
placed by the plan (``default``, ``random:N``, ``prefer:B1,B2``, a plan file, or ``tune`` within
``budget_s``), compiled into an artifact under the cache directory, and returned as a callable on torch
tensors. A graph collage cannot take falls back to eager PyTorch with one warning naming the reason.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from .errors import CollageError
from .frontends import cache_dir
from .frontends.torch import import_torch
from .graph import Graph
from .ir import new_context
from .iree import compile_module
from .passes.number_ops import NumberOpsPass
from .search import resolve_plan


class CompiledModule:
    """A model compiled by collage: call it with tensors like the model; results come back as tensors."""

    def __init__(self, program, out_spec, plan):
        self.program = program
        self.plan = plan
        self._out_spec = out_spec

    def __call__(self, *args):
        import torch
        from torch.utils import _pytree as pytree

        arrays = [a.detach().cpu().contiguous().numpy() if isinstance(a, torch.Tensor) else a for a in args]
        outs = self.program.invoke("main", *arrays)
        tensors = [torch.from_numpy(o) for o in outs]  # shares the host arrays' memory
        return pytree.tree_unflatten(tensors, self._out_spec)


def compile(model, example_inputs: Sequence, *, plan: str = "default", budget_s: float = 60.0,  # noqa: A001
            backends: Sequence[str] | None = None, seed: int = 0, db: str | Path | None = None,
            threads: int | None = None) -> CompiledModule:
    """Compiles ``model`` for ``example_inputs``' shapes and dtypes; raises CollageError when it cannot."""
    import torch
    from torch.utils import _pytree as pytree

    import collage_runtime

    with torch.no_grad():
        _, out_spec = pytree.tree_flatten(model(*example_inputs))
    context = new_context()
    module = import_torch(model, list(example_inputs), context)
    source = hashlib.sha256(module.operation.get_asm(binary=True)).hexdigest()[:16]
    if plan == "tune":
        resolved = _tune(import_torch(model, list(example_inputs), new_context()), example_inputs, backends,
                         budget_s, seed, db)
    else:  # numbering is idempotent: the compile driver numbers the same module again, to the same ids
        NumberOpsPass().run(module)
        resolved = resolve_plan(plan, Graph(module))
    key = hashlib.sha256(f"{source}:{resolved.to_json()}".encode()).hexdigest()[:16]
    out = cache_dir() / "compiled" / f"{key}.collage"
    if not out.exists():
        compile_module(module, resolved, out, source=f"torch:{type(model).__name__}")
    return CompiledModule(collage_runtime.load(out, threads=threads), out_spec, resolved)


def _tune(module, example_inputs: Sequence, backends: Sequence[str] | None, budget_s: float, seed: int,
          db: str | Path | None):
    """The plan ``collage tune`` finds for ``module`` on the example inputs (measurements go to the DB)."""
    import tempfile

    from .backends import get_backend
    from .measure.db import CostDB, default_db_path
    from .search import available_backends
    from .search.tune import tune

    chosen = [get_backend(b) for b in backends] if backends else available_backends()
    arrays = [a.detach().cpu().numpy() for a in example_inputs]
    with CostDB(db or default_db_path()) as cost_db, tempfile.TemporaryDirectory(prefix="collage-tune-") as work:
        return tune(module, chosen, cost_db, work, budget_s=budget_s, seed=seed, examples={"main": arrays}).plan


def dynamo_backend(gm, example_inputs: Sequence) -> Callable[..., Any]:
    """torch.compile backend ``collage``: the default plan; eager with one warning where collage cannot."""
    try:
        compiled = compile(gm, example_inputs)
    except (CollageError, Exception) as exc:  # noqa: BLE001  any failure falls back, as torch backends do
        why = " ".join(str(exc).split())[:200] or type(exc).__name__
        warnings.warn(f"collage: running this graph eagerly: {why}", RuntimeWarning, stacklevel=2)
        return gm.forward
    return compiled
