"""The ``collage_rt`` VM module: one exported function per library region.

Each region is served on one of three paths, chosen once at load from the program's platform and the
region's executor kind (``executors``: host or device):

- **mapped** (host executor, host memory: the CPU platform), the zero-copy path below;
- **staged** (host executor, device-only memory: CUDA, Vulkan): the inputs are copied into one host
  staging buffer per call (one command buffer, the host waits), the executor reads them there and writes
  its outputs into the same staging buffer, which is then copied into new DEVICE_LOCAL result buffers;
- **DLPack** (device executor, ``run.takes_dlpack``): the executor gets DLPack producers over the
  program's own buffers (``DLPackView``) and returns one tensor per result, imported without a copy.

On the mapped path inputs are mapped IREE buffer views (a numpy view of the mapping, no copy); each
result is allocated as DEVICE_LOCAL|HOST_VISIBLE with MAPPING usage and the executor computes into its mapped array. Everything
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

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from time import perf_counter

import iree.runtime as rt
import numpy as np

from .engines import Engines
from .executors import Run, executor, loads_concurrently, registered
from .manifest import MANIFEST, ArtifactError, RegionEntry, confined
from .types import Platform, TensorSpec, numpy_dtype

_HAL_TYPES = {
    "f32": rt.HalElementType.FLOAT_32, "f64": rt.HalElementType.FLOAT_64, "f16": rt.HalElementType.FLOAT_16,
    "bf16": rt.HalElementType.BFLOAT_16,
    "i8": rt.HalElementType.SINT_8, "i16": rt.HalElementType.SINT_16, "i32": rt.HalElementType.SINT_32,
    "i64": rt.HalElementType.SINT_64, "i1": rt.HalElementType.BOOL_8, "ui8": rt.HalElementType.UINT_8,
    "ui16": rt.HalElementType.UINT_16, "ui32": rt.HalElementType.UINT_32, "ui64": rt.HalElementType.UINT_64,
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


def _taken_over(device: rt.HalDevice, given, shape: tuple[int, ...], hal: int):
    """A reference to ``given`` (a DLPack producer) imported as a buffer view of ``shape`` and HAL element
    type ``hal`` without a copy, or None where IREE cannot import it or it is not that tensor."""
    try:
        view = device.from_dlpack_capsule(given.__dlpack__())
    except (IndexError, ValueError, RuntimeError, BufferError, TypeError):
        return None
    return view.ref if tuple(view.shape) == shape and int(view.element_type) == hal else None


def _check_views(region: str, refs, in_specs, view_type) -> None:
    """Raises unless the program hands the region buffers of the element types and shapes its manifest
    entry states: the executor reads them with those dtypes, so a mismatch (an edited manifest) would be
    silently reinterpreted memory."""
    for k, (ref, (shape, dtype)) in enumerate(zip(refs, in_specs)):
        bv = ref.deref(view_type)
        if tuple(bv.shape) != shape or _family(int(bv.element_type)) != _family(int(_HAL_TYPES[_DTYPE_NAMES[dtype]])):
            raise ArtifactError(f"region '{region}': input {k} is {list(bv.shape)} of HAL type {bv.element_type}, "
                                f"but the manifest states {list(shape)} {dtype}; recompile the artifact")


#: DLPack's device type of host memory (kDLCPU).
DL_CPU = 1

#: Platforms whose buffers IREE exports and imports through DLPack. IREE's Vulkan driver cannot export a
#: buffer ("Vulkan external buffer export requires the slab/sparse allocator", IREE 3.13, Mesa llvmpipe).
DLPACK_PLATFORMS = frozenset({Platform.CPU, Platform.CUDA})

#: Offsets of the tensors inside one staging buffer are multiples of this (numpy and the engines read
#: 64-byte aligned arrays fastest; Vulkan copies need 4).
STAGING_ALIGN = 64

_DEVICE_ONLY = int(rt.MemoryType.DEVICE_LOCAL)
_STAGING = int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE)  # HOST_LOCAL: visible and coherent
_STAGING_USAGE = int(rt.BufferUsage.TRANSFER | rt.BufferUsage.MAPPING)
_DEVICE_USAGE = int(rt.BufferUsage.DEFAULT)
_EXPORT_ERRORS = (RuntimeError, NotImplementedError, ValueError)

#: One buffer-to-buffer copy: (source, source offset, target, target offset, bytes).
Copy = tuple[rt.HalBuffer, int, rt.HalBuffer, int, int]


def staging_layout(sizes: Sequence[int]) -> tuple[tuple[int, ...], int]:
    """Offsets of tensors of ``sizes`` bytes packed into one staging buffer (each at a multiple of
    ``STAGING_ALIGN``) and the buffer's size (at least 1 byte: IREE refuses empty buffers)."""
    offsets, at = [], 0
    for n in sizes:
        offsets.append(at)
        at += -(-n // STAGING_ALIGN) * STAGING_ALIGN
    return tuple(offsets), max(at, 1)


class Transfers:
    """Copies between a device-only program's buffers and host memory, on the device's queue: a batch of
    copies is one command buffer, and the host waits for it (the program waits on the host before each
    ``collage_rt`` call too, so nothing else is in flight on these buffers). One per program: its calls
    run one at a time (the program's lock)."""

    def __init__(self, device: rt.HalDevice):
        self.device = device
        self._semaphore = device.create_semaphore(0)
        self._value = 0

    def staging(self, size: int) -> rt.HalBuffer:
        """A host buffer of ``size`` bytes the device copies to and from, mapped with ``.map()``."""
        return self.device.allocator.allocate_buffer(_STAGING, _STAGING_USAGE, size)

    def copy(self, copies: Iterable[Copy]) -> None:
        """Runs ``copies`` (empty ones skipped) as one command buffer and waits for it."""
        commands = rt.HalCommandBuffer(self.device)
        for source, source_at, target, target_at, length in copies:
            if length:
                commands.copy(source, target, source_at, target_at, length)
        commands.end()
        reached, next_value = self._value, self._value + 1
        done = rt.HalFence.create_at(self._semaphore, next_value)
        self.device.queue_execute(commands, rt.HalFence.create_at(self._semaphore, reached), done)
        done.wait()
        self._value = next_value  # only once signalled: a failed submission leaves the next one waiting on none

    def to_host(self, views: Sequence[rt.HalBufferView]) -> list[np.ndarray]:
        """The bytes of each buffer view as a host array (uint8), all in one staging buffer (no copy
        beyond the device-to-host one; the arrays keep the staging buffer alive)."""
        sizes = [v.byte_length for v in views]
        offsets, total = staging_layout(sizes)
        staging = self.staging(total)
        self.copy((v.get_buffer(), 0, staging, at, n) for v, at, n in zip(views, offsets, sizes))
        whole = np.ndarray((total,), np.uint8, staging.map())
        return [whole[at:at + n] for at, n in zip(offsets, sizes)]

    def exportable(self, view: rt.HalBufferView, dl_device: tuple[int, int]) -> rt.HalBufferView:
        """``view``, or a device copy of it where IREE cannot export its buffer through DLPack (on CUDA,
        IREE 3.13 exports buffers it allocated synchronously or imported, not those of the program's
        stream-ordered pools). Untested: no CUDA device here."""
        try:
            self.device.create_dlpack_capsule(view, *dl_device)  # dropped unconsumed: releases the buffer
            return view
        except _EXPORT_ERRORS:
            size = view.byte_length
            buf = self.device.allocator.allocate_buffer(_DEVICE_ONLY, _DEVICE_USAGE, max(size, 1))
            self.copy([(view.get_buffer(), 0, buf, 0, size)])
            return rt.HalBufferView(buf, view.shape, view.element_type)


class DLPackView:
    """A DLPack producer over an IREE buffer view, without a copy: a program's result handed to torch or
    numpy (``Program.invoke_dlpack``), or a region's input handed to a device executor. The consumer's
    tensor shares the memory and keeps the buffer alive. The protocol's ``stream`` is not needed: the
    program's work on the buffer is complete before it is handed over."""

    __slots__ = ("_device", "_view", "_dl_device", "shape")

    def __init__(self, device: rt.HalDevice, view: rt.HalBufferView, dl_device: tuple[int, int] = (DL_CPU, 0)):
        self._device, self._view, self._dl_device = device, view, dl_device
        self.shape = tuple(view.shape)

    def __dlpack__(self, **protocol):  # stream, max_version, dl_device, copy
        # IREE makes DLPack 0.x capsules, which every consumer of the 1.x protocol still takes.
        return self._device.create_dlpack_capsule(self._view, *self._dl_device)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._dl_device


def host_array(producer) -> np.ndarray:
    """A DLPack producer's tensor as a host array: in place for host memory, else copied to the host
    (DLPack 1.x ``dl_device``; torch implements it for CUDA tensors)."""
    if producer.__dlpack_device__()[0] == DL_CPU:
        return np.from_dlpack(producer)
    return np.from_dlpack(producer, device="cpu", copy=True)


def _nbytes(spec: TensorSpec) -> int:
    return int(np.prod(spec.shape, dtype=np.int64)) * spec.dtype.itemsize


def _region_function(device: rt.HalDevice, run: Run, region: str, backend: str, inputs: tuple[TensorSpec, ...],
                     outputs: tuple[TensorSpec, ...], failures: list[Exception], timer: RegionTimer | None = None,
                     *, platform: Platform = Platform.CPU, transfers: Transfers | None = None):
    """The exported function serving one region, and its VM signature. The path (mapped, staged or
    DLPack: see the module docstring) is chosen here, once."""
    takes_dlpack = getattr(run, "takes_dlpack", False) is True
    # An executor that sets ``hands_over`` is called with a third argument, True, and may then return, per
    # result, a DLPack producer of its own (None: written into the output array as usual); IREE takes
    # that memory over as the result instead of a copy (XLA's large results, see executors/xla_pjrt.py).
    # Host memory only: on a device platform its results are host memory to copy to the device anyway.
    flag = (True,) if getattr(run, "hands_over", False) is True and platform.host_memory else ()
    if takes_dlpack and platform not in DLPACK_PLATFORMS:
        raise ArtifactError(f"region '{region}' ({backend}): its executor takes device tensors through DLPack, "
                            f"which IREE's {platform.driver} driver cannot export; recompile the artifact with "
                            f"another backend for this region")
    if not platform.host_memory and transfers is None:
        raise ValueError(f"region '{region}': a {platform.value} program's regions need its Transfers")
    spent = [0.0]  # the executor's share of the current call, for `timer`
    if timer is not None:
        execute = run

        def run(*args):  # the executor, timed alone
            t0 = perf_counter()
            given = execute(*args)
            spent[0] = perf_counter() - t0
            return given

    def failed(exc: Exception) -> None:
        # IREE turns the exception into a RuntimeError with the Python traceback folded into its
        # text; the program reports this one line instead (Program.invoke).
        failures.append(exc if isinstance(exc, ArtifactError) else RegionFailure(region, backend, exc))

    if takes_dlpack:
        call = _dlpack_call(device, platform, transfers, run, region, inputs, outputs, failed)
    elif platform.host_memory:
        call = _mapped_call(device, run, flag, region, inputs, outputs, failed)
    else:
        call = _staged_call(device, transfers, run, region, inputs, outputs, failed)
    signature = "0" + ("r" * len(inputs) or "v") + "_" + ("r" * len(outputs) or "v")
    if timer is None:  # the untimed path stays as it is
        return call, signature

    def timed(state, *refs):
        t0 = perf_counter()
        result = call(state, *refs)
        timer(region, perf_counter() - t0, spent[0])
        return result

    return timed, signature


def _mapped_call(device: rt.HalDevice, run: Run, flag: tuple, region: str, inputs: tuple[TensorSpec, ...],
                 outputs: tuple[TensorSpec, ...], failed: Callable[[Exception], None]):
    """A host executor on host memory: inputs mapped in place, results allocated mapped and written."""
    in_specs = [(s.shape, s.dtype) for s in inputs]
    mem = int(rt.MemoryType.DEVICE_LOCAL | rt.MemoryType.HOST_VISIBLE)
    usage = int(rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING)
    out_specs = []  # (allocate this result's buffer, shape, dtype, HAL element type)
    for s in outputs:
        # positional arguments bound at load: keywords cost nanobind ~0.2 µs per call
        out_specs.append((partial(device.allocator.allocate_buffer, mem, usage, max(_nbytes(s), 1)), s.shape,
                          s.dtype, int(_HAL_TYPES[s.element])))  # IREE refuses 0-byte buffers
    view_type, ndarray = rt.HalBufferView, np.ndarray
    unchecked = [True]

    def adopt(given, k: int, buf, out: np.ndarray):
        """The result ``k`` that ``given`` holds, or ``buf`` (into which it is copied where IREE cannot
        import it: unaligned, another element type or shape)."""
        _, shape, _, hal = out_specs[k]
        taken = _taken_over(device, given, shape, hal)
        if taken is not None:
            return taken
        np.copyto(out, np.asarray(given).reshape(out.shape), casting="unsafe")
        return view_type(buf, shape, hal).ref

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
    return call


def _staged_call(device: rt.HalDevice, transfers: Transfers, run: Run, region: str, inputs: tuple[TensorSpec, ...],
                 outputs: tuple[TensorSpec, ...], failed: Callable[[Exception], None]):
    """A host executor on device-only memory. Per call: one staging buffer holding every input and
    output (laid out at load), one command buffer copying the inputs into it, the executor reading and
    writing there, new DEVICE_LOCAL results, one command buffer copying the outputs into them."""
    in_specs = [(s.shape, s.dtype) for s in inputs]
    sizes = [_nbytes(s) for s in (*inputs, *outputs)]
    offsets, total = staging_layout(sizes)
    staged_in = [(shape, dtype, at, n) for (shape, dtype), at, n in zip(in_specs, offsets, sizes)]
    staged_out = [(s.shape, s.dtype, at, n, int(_HAL_TYPES[s.element]),
                   partial(device.allocator.allocate_buffer, _DEVICE_ONLY, _DEVICE_USAGE, max(n, 1)))
                  for s, at, n in zip(outputs, offsets[len(inputs):], sizes[len(inputs):])]
    view_type, ndarray = rt.HalBufferView, np.ndarray
    unchecked = [True]

    def call(_state, *refs):
        try:
            if unchecked:
                _check_views(region, refs, in_specs, view_type)
                unchecked.clear()
            staging = transfers.staging(total)
            transfers.copy((ref.deref(view_type).get_buffer(), 0, staging, at, n)
                           for ref, (_, _, at, n) in zip(refs, staged_in))
            mapped = staging.map()
            arrays = [ndarray(shape, dtype, mapped, at) for shape, dtype, at, _ in staged_in]
            outs = [ndarray(shape, dtype, mapped, at) for shape, dtype, at, *_ in staged_out]
            run(arrays, outs)
            bufs = [allocate() for *_, allocate in staged_out]
            transfers.copy((staging, at, buf, 0, n) for buf, (_, _, at, n, _, _) in zip(bufs, staged_out))
            views = tuple(view_type(buf, shape, hal).ref for buf, (shape, _, _, _, hal, _) in zip(bufs, staged_out))
        except Exception as exc:
            failed(exc)
            raise
        return views[0] if len(views) == 1 else views
    return call


def _dlpack_call(device: rt.HalDevice, platform: Platform, transfers: Transfers | None, run, region: str,
                 inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...], failed: Callable[[Exception], None]):
    """A device executor: DLPack producers over the program's buffers in, its tensors imported as the
    region's results (copied where IREE cannot import one: another element type, strided, unaligned)."""
    in_specs = [(s.shape, s.dtype) for s in inputs]
    dl_device = (platform.dlpack_device, 0)  # IREE's default device is the platform's device 0
    out_specs = [(s.shape, s.dtype, int(_HAL_TYPES[s.element])) for s in outputs]
    view_type = rt.HalBufferView
    unchecked = [True]
    if platform.host_memory:
        def producer(ref):
            return DLPackView(device, ref.deref(view_type), dl_device)
    else:
        def producer(ref):
            return DLPackView(device, transfers.exportable(ref.deref(view_type), dl_device), dl_device)

    def imported(given, k: int):
        shape, dtype, hal = out_specs[k]
        taken = _taken_over(device, given, shape, hal)
        if taken is not None:
            return taken
        array = np.ascontiguousarray(host_array(given).reshape(shape), dtype)
        memory = int(rt.MemoryType.DEVICE_LOCAL | rt.MemoryType.HOST_VISIBLE) if platform.host_memory else _DEVICE_ONLY
        return device.allocator.allocate_buffer_copy(memory, _DEVICE_USAGE, device, array, hal).ref

    def call(_state, *refs):
        try:
            if unchecked:
                _check_views(region, refs, in_specs, view_type)
                unchecked.clear()
            given = run([producer(ref) for ref in refs])
            if len(given) != len(out_specs):
                raise ValueError(f"the executor returned {len(given)} results; the region has {len(out_specs)}")
            views = tuple(imported(g, k) for k, g in enumerate(given))
        except Exception as exc:
            failed(exc)
            raise
        return views[0] if len(views) == 1 else views
    return call


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
                     failures: list[Exception], timer: RegionTimer | None = None, *,
                     platform: Platform = Platform.CPU, transfers: Transfers | None = None) -> rt.VmModule:
    """Builds the ``collage_rt`` module serving ``regions`` (manifest entries of library regions); what a
    region raises while serving a call is appended to ``failures`` before IREE sees it. ``timer``, when
    given, is told each call's time (``collage report --run`` uses it). On a device-only ``platform`` the
    regions copy through the program's ``transfers``."""

    class State:
        def __init__(self, iface):
            self.iface = iface

    iface = rt.PyModuleInterface("collage_rt", State)
    for region, run in zip(regions, load_executors(root, regions, engines)):
        fn, signature = _region_function(device, run, region.name, region.backend, region.inputs, region.outputs,
                                         failures, timer, platform=platform, transfers=transfers)
        iface.export(region.name, signature, fn)
    return iface.create()
