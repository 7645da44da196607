"""Runs a StableHLO region module (``@main``, MLIR bytecode or text) with XLA through jaxlib's PJRT CPU
client.

The module is compiled once at load. Per call, each input (a zero-copy view of a mapped IREE
buffer) becomes a PJRT buffer with ``HostBufferSemantics.ZERO_COPY``, which aliases the host memory
when it is 64-byte aligned (IREE's mapped buffers are) instead of copying it; XLA's results are then
copied into the pre-allocated, mapped output arrays (one copy per result, from a zero-copy view).
An input at one of the last two addresses it had (a program's constant inputs; the blocks IREE's caching
allocator hands back) reuses its PJRT buffer (~3 µs saved per input): the buffer
aliases the address through a view that does not hold the IREE buffer, and is kept only where PJRT
aliased instead of copying.

Called by the program (``run.hands_over``: the ``collage_rt`` module passes ``hand_over=True``), a result of
``HAND_OVER_BYTES`` or more is not copied: ``run`` returns XLA's array for it and IREE imports that memory
through DLPack as the region's result (zero copy: XLA's CPU buffers are 64-byte aligned; IREE holds the
DLPack tensor, so XLA's buffer lives as long as the result). Called with two arguments, ``run`` writes
every output as any executor does.

One private PJRT client per process (``Engines.xla_client``), fast math off. i64 inputs keep 64 bits
(``enable_x64`` per transfer, without touching jax's global ``jax_enable_x64``). Threads: jaxlib 0.10.2
exposes no thread-count option on the CPU client; XLA sizes its intra-op pool to the CPUs this process
may be scheduled on (``sched_getaffinity``), so bound it with ``taskset``/cgroups if needed.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from ..engines import Engines
from . import Run, data_address

#: From this size up, a result is handed over (DLPack export + IREE import, ~10 µs) instead of copied
#: (256 KB: ~8 µs, 4 MB: ~320 µs, 16 MB: ~1.3 ms). A handed-over block stays with IREE until its consumer
#: is done, so XLA's next result takes another block (cold pages, and the next XLA region's input buffer
#: is made anew): measured in a 5-region chain, 512 KB was slower handed over, 1 MB mixed, 2 MB faster.
HAND_OVER_BYTES = 2 << 20


def compile_module(module: bytes | str, engines: Engines):
    """Compiles a StableHLO module, text or MLIR bytecode (entry ``@main``), for the CPU client; returns
    (executable, device)."""
    from jax._src.lib import xla_client as xc

    client = engines.xla_client()
    device = client.local_devices()[0]
    options = xc.CompileOptions()
    options.executable_build_options.debug_options.xla_cpu_enable_fast_math = False
    return client.compile_and_load(module, xc.DeviceList((device,)), options), device


def load(path: Path, engines: Engines) -> Run:
    """The callable that runs the XLA region module stored at ``path``."""
    from jax._src import core
    from jax._src.lib import _jax
    from jax._src.lib import xla_client as xc
    from jax.sharding import SingleDeviceSharding

    # bytes either way: XLA's parser tells bytecode from text (a str would be copied once more)
    executable, device = compile_module(Path(path).read_bytes(), engines)
    sharding = SingleDeviceSharding(device)
    devices = [device]
    put = xc.batched_device_put
    zero_copy = _jax.HostBufferSemantics.ZERO_COPY
    avals: dict[tuple, object] = {}

    def aval(arr: np.ndarray):
        key = (arr.shape, arr.dtype)
        if key not in avals:
            avals[key] = core.ShapedArray(arr.shape, arr.dtype)
        return avals[key]

    # Per input: PJRT buffers aliasing its last two addresses (a chain's intermediate results alternate
    # between two blocks, call after call).
    cached: dict[int, dict[int, object]] = {}

    def device_buffer(i: int, arr: np.ndarray):
        at = data_address(arr)
        made = cached.setdefault(i, {})
        hit = made.get(at)
        if hit is not None:
            return hit
        if arr.nbytes == 0 or at % 64:  # PJRT copies unaligned memory: nothing to reuse
            return put(aval(arr), sharding, [arr], devices, True, False, zero_copy, True)
        view = np.frombuffer((ctypes.c_char * arr.nbytes).from_address(at), arr.dtype).reshape(arr.shape)
        buf = put(aval(arr), sharding, [view], devices, True, False, zero_copy, True)
        if buf.unsafe_buffer_pointer() == at:  # aliased: valid for as long as the address holds this input
            if len(made) == 2:
                del made[next(iter(made))]  # the older of the two
            made[at] = buf
        return buf  # else copied after all: the copy must not outlive this call's data

    def run(inputs: list[np.ndarray], outputs: list[np.ndarray], hand_over: bool = False) -> list | None:
        results = executable.execute([device_buffer(i, a) for i, a in enumerate(inputs)])
        given = None
        for k, (out, res) in enumerate(zip(outputs, results)):
            if hand_over and out.nbytes >= HAND_OVER_BYTES:
                if given is None:
                    given = [None] * len(outputs)
                given[k] = res  # XLA's buffer, taken over through DLPack by the caller
            else:
                np.copyto(out, np.asarray(res), casting="no")
        return given

    run.hands_over = True  # type: ignore[attr-defined]
    return run
