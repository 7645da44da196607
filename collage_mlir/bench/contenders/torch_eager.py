"""PyTorch eager under ``torch.inference_mode`` with ``torch.set_num_threads`` (the reference too)."""

from __future__ import annotations

from . import Contender, Prepared, SetupContext


def torch_outputs(result) -> list:
    """A model's result (a tensor or a tuple of them) as numpy arrays."""
    results = result if isinstance(result, (tuple, list)) else (result,)
    return [r.detach().numpy().copy() for r in results]


def setup(ctx: SetupContext) -> Prepared:
    import torch

    from ... import zoo

    torch.set_num_threads(ctx.threads)
    model, inputs = zoo.build(ctx.model, ctx.small)

    last = []

    def run():
        with torch.inference_mode():
            last[:] = [model(*inputs)]

    return Prepared(run, lambda: torch_outputs(last[0]))


CONTENDER = Contender("torch", "PyTorch eager (inference_mode)", setup)
