"""The ``collage_rt`` VM module: one exported function per library region, on the zero-copy path.

Inputs are mapped IREE buffer views (a numpy view of the mapping, no copy); each result is allocated as
DEVICE_LOCAL|HOST_VISIBLE with MAPPING usage and the executor computes into its mapped array. Everything
that does not depend on the call's buffers (dtypes, shapes, byte sizes, the executor with its session and
bindings) is prepared at load. A result buffer cannot be reused across calls: the program may still hold
the previous one (it may be a program result, or live across a loop), so each call allocates it.

Regions are served only by executors that installed packages register (``executors.executor``), from
files inside the artifact directory.
"""

from __future__ import annotations

from pathlib import Path

import iree.runtime as rt
import numpy as np

from .engines import Engines
from .executors import Run, executor, registered
from .manifest import MANIFEST, ArtifactError, confined
from .types import numpy_dtype

_HAL_TYPES = {
    "f32": rt.HalElementType.FLOAT_32, "f64": rt.HalElementType.FLOAT_64, "f16": rt.HalElementType.FLOAT_16,
    "i8": rt.HalElementType.SINT_8, "i16": rt.HalElementType.SINT_16, "i32": rt.HalElementType.SINT_32,
    "i64": rt.HalElementType.SINT_64, "i1": rt.HalElementType.BOOL_8, "ui8": rt.HalElementType.UINT_8,
}


def _region_function(device: rt.HalDevice, run: Run, inputs: list[dict], outputs: list[dict]):
    in_specs = [(tuple(s["shape"]), numpy_dtype(s["dtype"])) for s in inputs]
    out_specs = []
    for s in outputs:
        shape, dtype = tuple(s["shape"]), numpy_dtype(s["dtype"])
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)  # IREE refuses 0-byte buffers
        out_specs.append((shape, dtype, _HAL_TYPES[s["dtype"]], nbytes))
    allocate = device.allocator.allocate_buffer
    mem = rt.MemoryType.DEVICE_LOCAL | rt.MemoryType.HOST_VISIBLE
    usage = rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING
    view_type, ndarray = rt.HalBufferView, np.ndarray

    def call(_state, *refs):
        # ndarray over the mapping's buffer protocol: ~1 µs, where MappedMemory.asarray takes ~3-8 µs.
        arrays = [ndarray(shape, dtype, ref.deref(view_type).map()) for ref, (shape, dtype) in zip(refs, in_specs)]
        views, outs = [], []
        for shape, dtype, hal_type, nbytes in out_specs:
            buf = allocate(memory_type=mem, allowed_usage=usage, allocation_size=nbytes)
            views.append(view_type(buf, shape, hal_type).ref)
            outs.append(ndarray(shape, dtype, buf.map()))
        run(arrays, outs)
        return views[0] if len(views) == 1 else tuple(views)

    signature = "0" + ("r" * len(inputs) or "v") + "_" + ("r" * len(outputs) or "v")
    return call, signature


def load_executor(root: Path, region: dict, engines: Engines) -> Run:
    """The region's registered executor, loaded on its artifact file (confined to ``root``)."""
    name = region.get("name")
    loader = executor(region.get("executor"))
    if loader is None:
        raise ArtifactError(f"{root / MANIFEST}: region '{name}': executor {region.get('executor')!r} is not "
                            f"registered by any installed package (registered: {', '.join(sorted(registered()))})")
    return loader(confined(root, region.get("artifact"), f"region '{name}' artifact"), engines)


def create_rt_module(device: rt.HalDevice, root: Path, regions: list[dict], engines: Engines) -> rt.VmModule:
    """Builds the ``collage_rt`` module serving ``regions`` (manifest entries of library regions)."""

    class State:
        def __init__(self, iface):
            self.iface = iface

    iface = rt.PyModuleInterface("collage_rt", State)
    for region in regions:
        fn, signature = _region_function(device, load_executor(root, region, engines), region["inputs"],
                                         region["outputs"])
        iface.export(region["name"], signature, fn)
    return iface.create()
