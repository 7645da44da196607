"""PyTorch eager under ``torch.inference_mode`` with ``torch.set_num_threads`` (the reference too)."""

from __future__ import annotations

from typing import Callable, Sequence

from . import Contender, Prepared, SetupContext


def torch_outputs(result) -> list:
    """A model's result (a tensor or a tuple of them) as numpy arrays."""
    from ...frontends.torch import to_numpy

    results = result if isinstance(result, (tuple, list)) else (result,)
    return [to_numpy(r).copy() for r in results]


def torch_prepared(call: Callable, inputs: Sequence) -> Prepared:
    """``call(*inputs)`` under ``torch.inference_mode`` as a contender's run; its outputs, the last run's
    result as numpy arrays."""
    import torch

    last = []

    def run():
        with torch.inference_mode():
            last[:] = [call(*inputs)]

    return Prepared(run, lambda: torch_outputs(last[0]))


def setup(ctx: SetupContext) -> Prepared:
    import torch

    from ... import zoo

    torch.set_num_threads(ctx.threads)
    model, inputs = zoo.build(ctx.model, ctx.small)
    return torch_prepared(model, inputs)


CONTENDER = Contender("torch", "PyTorch eager (inference_mode)", setup)
