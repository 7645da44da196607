"""Contenders: one engine set up the way its users would, on a zoo model, in the worker process that
times it. ``setup`` returns a ``Prepared``: ``run()`` does one inference to completion (what is timed)
and ``outputs()`` returns the last run's outputs as numpy arrays (not timed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ...zoo import Framework


@dataclass(frozen=True)
class SetupContext:
    """What every contender gets: the zoo model (by name), its size, the thread count, a scratch
    directory, and the plan of the collage contender."""

    model: str
    small: bool
    threads: int
    work_dir: Path
    plan: str = "default"


@dataclass
class Prepared:
    """``artifact``, ``inputs`` and ``op_count`` (the model's ops): for a contender that is a collage
    artifact, what a breakdown of its time (``collage_runtime.profile``) loads and runs."""

    run: Callable[[], object]
    outputs: Callable[[], list[np.ndarray]]
    artifact: Path | None = None
    inputs: Sequence[np.ndarray] = ()
    op_count: int | None = None


@dataclass(frozen=True)
class Contender:
    """A contender: its CLI name, what it is (for the table), its setup function, and the frameworks
    whose zoo models it runs."""

    name: str
    description: str
    setup: Callable[[SetupContext], Prepared]
    is_collage: bool = False
    compiles_stablehlo: bool = False  # starts from the model's StableHLO import (cached)
    frameworks: frozenset[Framework] = frozenset({Framework.TORCH})


def _registry() -> dict[str, Contender]:
    from . import iree, jax_jit, onnxruntime, openvino, torch_compile, torch_eager

    found = [torch_eager.CONTENDER, torch_compile.CONTENDER, onnxruntime.CONTENDER, onnxruntime.RUNTIME_POLICY,
             openvino.CONTENDER, openvino.RUNTIME_POLICY, jax_jit.CONTENDER,
             *iree.CONTENDERS]
    return {c.name: c for c in found}


CONTENDERS: dict[str, Contender] = _registry()
#: The peers (everything but collage itself), in table order.
PEERS: tuple[str, ...] = tuple(n for n, c in CONTENDERS.items() if not c.is_collage)
COLLAGE = next(n for n, c in CONTENDERS.items() if c.is_collage)
#: The contender whose outputs every other one is checked against, per framework.
REFERENCES: dict[Framework, str] = {Framework.TORCH: "torch", Framework.JAX: "jax"}
