"""Contenders compiled by ``collage compile`` from the cached StableHLO import: collage itself (the
plan given to ``collage bench``), IREE llvm-cpu alone (the default plan, without and with data tiling)
and XLA:CPU (the whole model as one ``xla-cpu`` region). The program's thread budget (IREE's task pool and
any engine serving a region) is ``threads``."""

from __future__ import annotations

from functools import partial

from ...errors import CollageError
from . import Contender, Prepared, SetupContext

#: IREE alone, as its users would build it for this CPU: without data tiling, and with it plus ukernels.
IREE_FLAGS = ("--iree-opt-data-tiling=false",)
IREE_DT_FLAGS = ("--iree-opt-data-tiling=true", "--iree-llvmcpu-enable-ukernels=all")
XLA_BACKEND = "xla-cpu"


def whole_plan(module, backend_name: str):
    """A plan putting every op of ``module`` in one region on ``backend_name``; a CollageError naming
    the first op it cannot take otherwise."""
    from ...backends import get_backend
    from ...graph import Graph
    from ...passes.number_ops import NumberOpsPass
    from ...plan import Plan, Region

    NumberOpsPass().run(module)
    graph = Graph(module)
    backend = get_backend(backend_name)
    why = backend.accepts(graph, frozenset(graph.nodes))
    if why:
        raise CollageError(f"{backend_name} cannot take the whole model: {why}")
    return Plan([Region("whole", backend_name, frozenset(graph.nodes))], source=f"whole:{backend_name}")


def _setup(ctx: SetupContext, plan: str | None = None, flags: tuple[str, ...] = (), whole: str | None = None) -> Prepared:
    import numpy as np

    import collage_runtime

    from ... import zoo
    from ...iree import compile_module
    from ...ir import new_context

    context = new_context()
    module = zoo.import_stablehlo(ctx.model, context, ctx.small)
    plan_spec = whole_plan(module, whole) if whole else plan or ctx.plan
    out = ctx.work_dir / "artifact"
    compile_module(module, plan_spec, out, source=f"zoo:{ctx.model}", iree_args=list(flags))
    program = collage_runtime.load(out, threads=ctx.threads)
    _, inputs = zoo.build(ctx.model, ctx.small)
    fn = program.device_function("main")
    args = [program.to_device(np.require(x.numpy(), requirements="C")) for x in inputs]
    last = []

    def run():
        result = fn(*args)
        last[:] = result if isinstance(result, (tuple, list)) else [result]

    return Prepared(run, lambda: [np.asarray(r.to_host()) for r in last])


CONTENDERS = (
    Contender("collage", "collage (the plan given)", _setup, is_collage=True, compiles_stablehlo=True),
    Contender("iree", "IREE llvm-cpu alone (no data tiling)", partial(_setup, plan="default", flags=IREE_FLAGS),
              compiles_stablehlo=True),
    Contender("iree-dt", "IREE llvm-cpu alone (data tiling + ukernels)",
              partial(_setup, plan="default", flags=IREE_DT_FLAGS), compiles_stablehlo=True),
    Contender("xla", "XLA:CPU (whole model as one xla-cpu region)", partial(_setup, plan=None, whole=XLA_BACKEND),
              compiles_stablehlo=True),
)
