"""The ``collage_rt`` VM module: one exported function per library region, on the zero-copy path.

Inputs are mapped IREE buffer views (``bv.map().asarray``, no copy); each result is allocated as
DEVICE_LOCAL|HOST_VISIBLE with MAPPING usage and the executor computes into its mapped array.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

import iree.runtime as rt
import numpy as np

_NP_DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i8": np.int8, "i16": np.int16,
              "i32": np.int32, "i64": np.int64, "i1": np.bool_, "ui8": np.uint8}
_HAL_TYPES = {
    "f32": rt.HalElementType.FLOAT_32, "f64": rt.HalElementType.FLOAT_64, "f16": rt.HalElementType.FLOAT_16,
    "i8": rt.HalElementType.SINT_8, "i16": rt.HalElementType.SINT_16, "i32": rt.HalElementType.SINT_32,
    "i64": rt.HalElementType.SINT_64, "i1": rt.HalElementType.BOOL_8, "ui8": rt.HalElementType.UINT_8,
}


def _region_function(device: rt.HalDevice, run: Callable, inputs: list[dict], outputs: list[dict]):
    in_dtypes = [np.dtype(_NP_DTYPES[s["dtype"]]) for s in inputs]
    out_specs = [(list(s["shape"]), np.dtype(_NP_DTYPES[s["dtype"]]), _HAL_TYPES[s["dtype"]]) for s in outputs]
    allocator = device.allocator
    mem = rt.MemoryType.DEVICE_LOCAL | rt.MemoryType.HOST_VISIBLE
    usage = rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING

    def call(_state, *refs):
        arrays = []
        for ref, dtype in zip(refs, in_dtypes):
            bv = ref.deref(rt.HalBufferView)
            arrays.append(bv.map().asarray(bv.shape, dtype))
        views, outs = [], []
        for shape, dtype, hal_type in out_specs:
            nbytes = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)
            buf = allocator.allocate_buffer(memory_type=mem, allowed_usage=usage, allocation_size=nbytes)
            bv = rt.HalBufferView(buf, shape, hal_type)
            views.append(bv)
            outs.append(bv.map().asarray(shape, dtype))
        run(arrays, outs)
        refs_out = [v.ref for v in views]
        return refs_out[0] if len(refs_out) == 1 else tuple(refs_out)

    signature = "0" + ("r" * len(inputs) or "v") + "_" + ("r" * len(outputs) or "v")
    return call, signature


def create_rt_module(device: rt.HalDevice, root: Path, regions: list[dict]) -> rt.VmModule:
    """Builds the ``collage_rt`` module serving ``regions`` (manifest entries of library regions)."""

    class State:
        def __init__(self, iface):
            self.iface = iface

    iface = rt.PyModuleInterface("collage_rt", State)
    for region in regions:
        executor = importlib.import_module(region["executor"])
        run = executor.load(root / region["artifact"])
        fn, signature = _region_function(device, run, region["inputs"], region["outputs"])
        iface.export(region["name"], signature, fn)
    return iface.create()
