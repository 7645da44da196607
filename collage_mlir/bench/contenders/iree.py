"""Contenders compiled by ``collage compile`` from the cached StableHLO import: collage itself (the
plan given to ``collage bench``), IREE llvm-cpu alone (the default plan, without and with data tiling)
and XLA:CPU (the whole model as one ``xla-cpu`` region). The program's thread budget (IREE's task pool and
any engine serving a region) is ``threads``.

The artifact is compiled in a short-lived child process, then loaded here: the import and the compile
(BERT-base with its weights inlined for XLA: ~3.5 GB at peak) leave this worker, which stays alive while
the other contenders are timed, holding only the loaded program."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ...errors import CollageError
from ...zoo import Framework
from . import Contender, Prepared, SetupContext

#: IREE alone, as its users would build it for this CPU: without data tiling, and with it plus ukernels.
IREE_FLAGS = ("--iree-opt-data-tiling=false",)
IREE_DT_FLAGS = ("--iree-opt-data-tiling=true", "--iree-llvmcpu-enable-ukernels=all")
XLA_BACKEND = "xla-cpu"
def compile_artifact(model: str, small: bool, plan: str, flags: list[str], out: str) -> int:
    """Worker task: compiles the zoo model with ``plan`` (a plan string: ``whole:BACKEND`` is that backend's
    maximal regions) into ``out``; returns the number of ops of the model."""
    from ... import zoo
    from ...graph import Graph, number_ops
    from ...ir import new_context
    from ...iree import compile_module

    module = zoo.import_stablehlo(model, new_context(), small)
    number_ops(module)
    ops = len(Graph(module).nodes)
    compile_module(module, plan, out, source=f"zoo:{model}", iree_args=list(flags))
    return ops


def _setup(ctx: SetupContext, plan: str | None = None, flags: tuple[str, ...] = ()) -> Prepared:
    import collage_runtime
    import numpy as np

    from ... import zoo
    from ...measure.worker import Worker

    out = ctx.work_dir / "artifact"
    with Worker("compile", ctx.work_dir) as child:
        done = child.call(f"{__name__}:compile_artifact", 3600.0, model=ctx.model, small=ctx.small,
                          plan=plan or ctx.plan, flags=list(flags), out=str(out))
    if not done.ok:
        raise CollageError(f"compile {done.status}: {done.message}")
    program = collage_runtime.load(out, threads=ctx.threads)
    fn = program.device_function("main")
    host = [np.require(x, requirements="C") for x in zoo.numpy_inputs(ctx.model, ctx.small)]
    args = [program.to_device(x) for x in host]
    last = []

    def run():
        result = fn(*args)
        last[:] = result if isinstance(result, (tuple, list)) else [result]

    return Prepared(run, lambda: [np.asarray(r.to_host()) for r in last], artifact=Path(out), inputs=host,
                    op_count=done.value)


#: Compiled from the StableHLO import, so they run PyTorch and JAX models alike.
_ANY = {"compiles_stablehlo": True, "frameworks": frozenset(Framework)}
CONTENDERS = (
    Contender("collage", "collage (the plan given)", _setup, is_collage=True, **_ANY),
    Contender("iree", "IREE llvm-cpu alone (no data tiling)", partial(_setup, plan="default", flags=IREE_FLAGS),
              **_ANY),
    Contender("iree-dt", "IREE llvm-cpu alone (data tiling + ukernels)",
              partial(_setup, plan="default", flags=IREE_DT_FLAGS), **_ANY),
    Contender("xla", "XLA:CPU (the whole model on xla-cpu)", partial(_setup, plan=f"whole:{XLA_BACKEND}"), **_ANY),
)
