"""Region executors and their registry.

An executor is a function ``load(path: Path, engines: Engines) -> Run`` registered by an installed package
under the entry-point group ``collage_runtime.executors``; a manifest names it by its entry-point name.
``Run(inputs, outputs)`` reads the (zero-copy, mapped, C-contiguous) input arrays and writes each result
into the matching pre-allocated output array. A loader that sets ``concurrent_load = True`` may load
several regions at once on other threads. Only registered executors serve regions: a manifest is data
and never chooses which Python code is imported.

Two kinds of ``Run``, by where the engine computes:

- **host** (the default): ``run(inputs, outputs)`` on numpy arrays in host memory. On a CPU program they are
  the IREE buffers themselves (mapped); on a device program (CUDA, Vulkan: device-only memory) the runtime
  copies inputs to host arrays and the outputs back to device buffers around the call.
- **device** (``run.takes_dlpack = True``): ``run(inputs) -> results``, where ``inputs`` are DLPack producers
  (``__dlpack__``/``__dlpack_device__``) over the program's own buffers, on the program's device, and
  ``results`` one DLPack producer per output (a torch tensor), which the runtime imports as the region's
  result without a copy. The engine computes on the device where the buffers live (cuDNN and cuBLAS through
  torch on CUDA; on a CPU program the same code runs on CPU tensors). Before the call IREE's work on the
  inputs is complete (the program waits on the host before each ``collage_rt`` call); the executor must
  finish its own work before returning (``torch.cuda.synchronize``-equivalent: IREE's streams do not order
  against torch's).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

if TYPE_CHECKING:
    from ..engines import Engines

GROUP = "collage_runtime.executors"

#: A host executor's call (a device executor's is ``Callable[[Sequence[DLPack producer]], Sequence[...]]``,
#: marked ``takes_dlpack = True``).
Run = Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], None]
Loader = Callable[[Path, "Engines"], Run]


_addressof, _char = ctypes.addressof, ctypes.c_char


def data_address(arr: np.ndarray) -> int:
    """The address of ``arr``'s data, what the executors key their bound tensors by: ``ctypes.addressof``
    over its buffer costs ~0.4 µs where ``arr.ctypes.data`` costs ~1.2 µs; read-only (constants mapped
    from the module) and empty arrays, which ctypes refuses, take the slow way."""
    try:
        return _addressof(_char.from_buffer(arr))
    except (TypeError, ValueError):
        return arr.ctypes.data


class TensorSlots:
    """Engine tensors bound to an executor's inputs or outputs, rebound only where an array's address
    moved: per slot the address bound now and the tensors made (``make(slot, array)``) for its last two
    addresses, since a chain's intermediate results alternate between two blocks call after call.
    ``bind(slot, tensor)`` sets one on the engine; empty arrays are wrapped and bound every call."""

    def __init__(self, count: int, make: Callable[[int, np.ndarray], object], bind: Callable[[int, object], None]):
        self.now = [-1] * count
        self.made: list[dict[int, object]] = [{} for _ in range(count)]
        self.make, self.bind = make, bind

    def __call__(self, i: int, arr: np.ndarray) -> None:
        at = data_address(arr)
        if at == self.now[i] and arr.nbytes:
            return
        made = self.made[i]
        value = made.get(at) if arr.nbytes else None
        if value is None:
            value = self.make(i, arr)
            if arr.nbytes:
                if len(made) == 2:
                    del made[next(iter(made))]  # the older of the two
                made[at] = value
        self.bind(i, value)
        self.now[i] = at


@lru_cache(maxsize=1)
def registered() -> dict:
    """Entry-point name → entry point, for every executor installed packages register."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def executor(name: object) -> Loader | None:
    """The loader registered as ``name``, or None when no installed package registers it."""
    ep = registered().get(name) if isinstance(name, str) else None
    return ep.load() if ep is not None else None


def loads_concurrently(name: object) -> bool:
    """Whether the executor registered as ``name`` may load several regions at once on other threads: its
    loader says so with a true ``concurrent_load`` attribute (it releases the GIL and its engine is
    thread-safe)."""
    loader = executor(name)
    return getattr(loader, "concurrent_load", False) is True
