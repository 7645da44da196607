"""torch.compile with inductor on CPU, with freezing (weights folded as constants), as PyTorch
recommends for CPU inference; compile time is the first call's."""

from __future__ import annotations

from . import Contender, Prepared, SetupContext
from .torch_eager import torch_prepared


def setup(ctx: SetupContext) -> Prepared:
    import torch
    import torch._inductor.config as inductor_config

    from ... import zoo

    torch.set_num_threads(ctx.threads)
    inductor_config.freezing = True
    model, inputs = zoo.build(ctx.model, ctx.small)
    return torch_prepared(torch.compile(model, backend="inductor"), inputs)


CONTENDER = Contender("torch-compile", "torch.compile (inductor, CPU, freezing)", setup)
