"""torch.compile with inductor on CPU, with freezing (weights folded as constants), as PyTorch
recommends for CPU inference; compile time is the first call's."""

from __future__ import annotations

from . import Contender, Prepared, SetupContext
from .torch_eager import torch_outputs


def setup(ctx: SetupContext) -> Prepared:
    import torch
    import torch._inductor.config as inductor_config

    from ... import zoo

    torch.set_num_threads(ctx.threads)
    inductor_config.freezing = True
    model, inputs = zoo.build(ctx.model, ctx.small)
    compiled = torch.compile(model, backend="inductor")

    last = []

    def run():
        with torch.inference_mode():
            last[:] = [compiled(*inputs)]

    return Prepared(run, lambda: torch_outputs(last[0]))


CONTENDER = Contender("torch-compile", "torch.compile (inductor, CPU, freezing)", setup)
