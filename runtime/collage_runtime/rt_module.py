"""The ``collage_rt`` VM module: one exported function per library region, on the zero-copy path.

Inputs are mapped IREE buffer views (a numpy view of the mapping, no copy); each result is allocated as
DEVICE_LOCAL|HOST_VISIBLE with MAPPING usage and the executor computes into its mapped array. Everything
that does not depend on the call's buffers (dtypes, shapes, byte sizes, the executor with its session and
bindings) is prepared at load. A result buffer cannot be reused across calls: the program may still hold
the previous one (it may be a program result, or live across a loop), so each call allocates it, from
the device's caching allocator (``engines.iree_device``): a freed buffer is reused, not faulted in again.
An executor that cannot write into a given buffer (XLA) may instead hand its own result over, which IREE
imports through DLPack rather than the executor copying it (``hands_over`` below).

Regions are served only by executors that installed packages register (``executors.executor``), from
files inside the artifact directory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from time import perf_counter

import iree.runtime as rt
import numpy as np

from .engines import Engines
from .executors import Run, executor, loads_concurrently, registered
from .manifest import MANIFEST, ArtifactError, RegionEntry, confined
from .types import TensorSpec, numpy_dtype

_HAL_TYPES = {
    "f32": rt.HalElementType.FLOAT_32, "f64": rt.HalElementType.FLOAT_64, "f16": rt.HalElementType.FLOAT_16,
    "i8": rt.HalElementType.SINT_8, "i16": rt.HalElementType.SINT_16, "i32": rt.HalElementType.SINT_32,
    "i64": rt.HalElementType.SINT_64, "i1": rt.HalElementType.BOOL_8, "ui8": rt.HalElementType.UINT_8,
}
_DTYPE_NAMES = {numpy_dtype(name): name for name in _HAL_TYPES}

#: Optional per-call timing hook: (region, seconds inside its collage_rt call, seconds in its executor).
RegionTimer = Callable[[str, float, float], None]


def _family(hal_type: int) -> tuple[int, int]:
    """(numerical type, bits) of a HAL element type (``numerical_type << 24 | bits``), integers of any
    signedness and booleans counted as one numerical type."""
    numerical = (hal_type >> 24) & 0xFF
    return (0x10 if numerical in (0x10, 0x11, 0x12, 0x13) else numerical), hal_type & 0xFF


class RegionFailure(Exception):
    """A region's engine raised while serving a call: which region, which backend, what it said."""

    def __init__(self, region: str, backend: str, cause: BaseException):
        why = " ".join(str(cause).split())[:300]
        super().__init__(f"region '{region}' ({backend}) failed: {type(cause).__name__}: {why}")


def _check_views(region: str, refs, in_specs, view_type) -> None:
    """Raises unless the program hands the region buffers of the element types and shapes its manifest
    entry states: the executor reads them with those dtypes, so a mismatch (an edited manifest) would be
    silently reinterpreted memory."""
    for k, (ref, (shape, dtype)) in enumerate(zip(refs, in_specs)):
        bv = ref.deref(view_type)
        if tuple(bv.shape) != shape or _family(int(bv.element_type)) != _family(int(_HAL_TYPES[_DTYPE_NAMES[dtype]])):
            raise ArtifactError(f"region '{region}': input {k} is {list(bv.shape)} of HAL type {bv.element_type}, "
                                f"but the manifest states {list(shape)} {dtype}; recompile the artifact")


def _region_function(device: rt.HalDevice, run: Run, region: str, backend: str, inputs: tuple[TensorSpec, ...],
                     outputs: tuple[TensorSpec, ...], failures: list[Exception], timer: RegionTimer | None = None):
    in_specs = [(s.shape, s.dtype) for s in inputs]
    mem = int(rt.MemoryType.DEVICE_LOCAL | rt.MemoryType.HOST_VISIBLE)
    usage = int(rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING)
    out_specs = []  # (allocate this result's buffer, shape, dtype, HAL element type)
    for s in outputs:
        shape, dtype = s.shape, s.dtype
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)  # IREE refuses 0-byte buffers
        # positional arguments bound at load: keywords cost nanobind ~0.2 µs per call
        out_specs.append((partial(device.allocator.allocate_buffer, mem, usage, nbytes), shape, dtype,
                          int(_HAL_TYPES[s.element])))
    view_type, ndarray = rt.HalBufferView, np.ndarray
    spent = [0.0]  # the executor's share of the current call, for `timer`
    if timer is not None:
        execute = run

        def run(arrays, outs, *flag):  # the executor, timed alone
            t0 = perf_counter()
            given = execute(arrays, outs, *flag)
            spent[0] = perf_counter() - t0
            return given

    unchecked = [True]
    # An executor that sets ``hands_over`` is called with a third argument, True, and may then return, per
    # result, a DLPack producer of its own (None: written into the output array as usual); IREE takes
    # that memory over as the result instead of a copy (XLA's large results, see executors/xla_pjrt.py).
    flag = (True,) if getattr(run, "hands_over", False) is True else ()

    def adopt(given, k: int, buf, out: np.ndarray):
        """The result ``k`` that ``given`` holds, or ``buf`` (into which it is copied where IREE cannot
        import it: unaligned, another element type or shape)."""
        _, shape, _, hal = out_specs[k]
        try:
            view = device.from_dlpack_capsule(given.__dlpack__())
            if tuple(view.shape) == shape and int(view.element_type) == hal:
                return view.ref
        except (IndexError, ValueError, RuntimeError, BufferError, TypeError):
            pass
        np.copyto(out, np.asarray(given).reshape(out.shape), casting="unsafe")
        return view_type(buf, shape, hal).ref

    def failed(exc: Exception) -> None:
        # IREE turns the exception into a RuntimeError with the Python traceback folded into its
        # text; the program reports this one line instead (Program.invoke).
        failures.append(exc if isinstance(exc, ArtifactError) else RegionFailure(region, backend, exc))

    # Per call, ~0.7 µs per input (deref, map, ndarray over the mapping's buffer protocol, where
    # MappedMemory.asarray took ~3-8 µs) and ~1 µs per result (allocate, map, ndarray, view); a region
    # with one result (the common case) skips the lists and loops over results (~0.5 µs).
    if len(out_specs) == 1:
        ((allocate, out_shape, out_dtype, out_type),) = out_specs

        def call(_state, *refs):
            try:
                if unchecked:  # the compiled program's buffer types never change: checking the first call is enough
                    _check_views(region, refs, in_specs, view_type)
                    unchecked.clear()
                arrays = [ndarray(shape, dtype, ref.deref(view_type).map()) for ref, (shape, dtype) in zip(refs, in_specs)]
                buf = allocate()
                out = ndarray(out_shape, out_dtype, buf.map())
                given = run(arrays, [out], *flag)
                if flag and given is not None and given[0] is not None:
                    return adopt(given[0], 0, buf, out)
            except Exception as exc:
                failed(exc)
                raise
            return view_type(buf, out_shape, out_type).ref
    else:
        def call(_state, *refs):
            try:
                if unchecked:
                    _check_views(region, refs, in_specs, view_type)
                    unchecked.clear()
                arrays = [ndarray(shape, dtype, ref.deref(view_type).map()) for ref, (shape, dtype) in zip(refs, in_specs)]
                bufs = [allocate() for allocate, *_ in out_specs]
                outs = [ndarray(shape, dtype, buf.map()) for buf, (_, shape, dtype, _) in zip(bufs, out_specs)]
                given = run(arrays, outs, *flag)
                if flag and given is not None:
                    return tuple(view_type(buf, shape, hal).ref if g is None else adopt(g, k, buf, out)
                                 for k, (g, buf, out, (_, shape, _, hal)) in enumerate(zip(given, bufs, outs, out_specs)))
            except Exception as exc:
                failed(exc)
                raise
            return tuple(view_type(buf, shape, hal).ref for buf, (_, shape, _, hal) in zip(bufs, out_specs))

    signature = "0" + ("r" * len(inputs) or "v") + "_" + ("r" * len(outputs) or "v")
    if timer is None:  # the untimed path stays as it is
        return call, signature

    def timed(state, *refs):
        t0 = perf_counter()
        result = call(state, *refs)
        timer(region, perf_counter() - t0, spent[0])
        return result

    return timed, signature


def load_executor(root: Path, region: RegionEntry, engines: Engines) -> Run:
    """The region's registered executor, loaded on its artifact file (confined to ``root``)."""
    loader = executor(region.executor)
    if loader is None:
        raise ArtifactError(f"{root / MANIFEST}: region '{region.name}': executor {region.executor!r} is not "
                            f"registered by any installed package (registered: {', '.join(sorted(registered()))})")
    return loader(confined(root, region.artifact, f"region '{region.name}' artifact"), engines)


def load_executors(root: Path, regions: Sequence[RegionEntry], engines: Engines) -> list[Run]:
    """Each region's executor, in region order. Regions whose executor loads concurrently (OpenVINO: a
    model compiled per region, ~20 ms of CPU each, with the GIL released) load on the budget's threads
    while the others load on this thread (torch's thread count is per OS thread under OpenMP)."""
    pooled = [k for k, r in enumerate(regions) if loads_concurrently(r.executor)]
    if engines.threads < 2 or len(pooled) < 2:
        return [load_executor(root, r, engines) for r in regions]
    with ThreadPoolExecutor(engines.threads, thread_name_prefix="collage-load") as pool:
        futures = {k: pool.submit(load_executor, root, regions[k], engines) for k in pooled}
        runs = {k: load_executor(root, r, engines) for k, r in enumerate(regions) if k not in futures}
        runs.update((k, future.result()) for k, future in futures.items())
    return [runs[k] for k in range(len(regions))]


def create_rt_module(device: rt.HalDevice, root: Path, regions: Sequence[RegionEntry], engines: Engines,
                     failures: list[Exception], timer: RegionTimer | None = None) -> rt.VmModule:
    """Builds the ``collage_rt`` module serving ``regions`` (manifest entries of library regions); what a
    region raises while serving a call is appended to ``failures`` before IREE sees it. ``timer``, when
    given, is told each call's time (``collage report --run`` uses it)."""

    class State:
        def __init__(self, iface):
            self.iface = iface

    iface = rt.PyModuleInterface("collage_rt", State)
    for region, run in zip(regions, load_executors(root, regions, engines)):
        fn, signature = _region_function(device, run, region.name, region.backend, region.inputs, region.outputs,
                                         failures, timer)
        iface.export(region.name, signature, fn)
    return iface.create()
