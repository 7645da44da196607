"""Runs an ONNX model with ONNX Runtime (CPU, all graph optimizations, the program's thread budget with
spinning off: see ``collage_runtime.engines``).

Inputs and outputs are bound zero-copy with I/O binding: the session reads the mapped IREE input
buffers in place and writes its results straight into the pre-allocated mapped output buffers.
Graph inputs (``in0..``, or a whole model's own names) and outputs are bound in argument / result order, with the model's
own static shapes, which the region was built for. The binding and the CPU device
are prepared at load; binding goes through the pybind layer under ``IOBinding``/``InferenceSession``: their
Python wrappers build a device object and check graph-capture state on every bind and run (~2 µs more per
tensor).

Per call, a tensor is bound only where its buffer's address changed since the last call (a program's
constant inputs never move; IREE's caching allocator hands a region's result the block it freed after the
previous call), and wrapped in a new OrtValue (zero-copy on the CPU, ~0.7 µs) only for an address not among
the slot's last two (a chain's intermediate results alternate between two blocks); a bind costs ~0.3 µs,
reading the address ~0.4. The OrtValues made by the pybind layer alias the memory without holding the
array (or the IREE buffer under it), so the allocator can reuse the block; they are only used while the
call's own array holds it. Shapes and dtypes are fixed per region, so an address names the same tensor.

``PROFILED``: None, except while ``collage_mlir.measure.profile`` loads a program to read ONNX Runtime's
profiler; then each session profiles (its trace under ``PROFILE_DIR``) and (path, session) is appended to it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import _pybind_state as C

from ..engines import Engines
from ..types import NUMPY_DTYPES
from . import Run, TensorSlots

#: numpy has no bf16: ONNX Runtime takes a bf16 array's bits (a uint16 view) with ONNX's type for them.
_BF16, _ONNX_BF16 = NUMPY_DTYPES["bf16"], 16  # onnx.TensorProto.BFLOAT16

#: A list while a profiler loads programs (see the module's docstring); None otherwise.
PROFILED: list | None = None
#: Where profiled sessions write their traces.
PROFILE_DIR: str = "."


def model_source(path: Path, engines: Engines, options: ort.SessionOptions) -> tuple[str | bytes, list]:
    """What ``InferenceSession`` opens for the ONNX model at ``path``, and what must live as long as the
    session: the path; or, where the model's initializers refer to the artifact's weight store, the model's
    bytes with those initializers given to ``options`` as OrtValues over the store's mapped pages (no copy;
    ONNX Runtime reads them for the session's life)."""
    if engines.weights is None:
        return str(path), []
    import onnx

    data = path.read_bytes()
    external = engines.weights.external(onnx.load_from_string(data), str(path))
    if not external:
        return data, []  # read once
    names = [name for name, _ in external]
    values = [ort.OrtValue.ortvalue_from_numpy(array) for _, array in external]
    options.add_external_initializers(names, values)
    return data, [values, external]  # the OrtValues alias the arrays, which keep the mapping


def load(path: Path, engines: Engines) -> Run:
    """The callable that runs the ONNX model stored at ``path``."""
    options = engines.ort_session_options()
    if PROFILED is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(PROFILE_DIR) / f"{path.stem}-{len(PROFILED)}")
    source, keep = model_source(path, engines, options)
    session = ort.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])
    if PROFILED is not None:
        PROFILED.append((path, session))
    binding = session.io_binding()._iobinding
    cpu = ort.OrtDevice.make("cpu", 0)._get_c_device()
    wrap = C.OrtValue.ortvalue_from_numpy  # zero-copy on the CPU device
    wrap_bits = C.OrtValue.ortvalue_from_numpy_with_onnx_type  # zero-copy too (on the CPU)
    bind_input, bind_output = binding.bind_ortvalue_input, binding.bind_ortvalue_output
    execute = session._sess.run_with_iobinding
    # The model's own static shapes: a scalar may be [] in the program and [1] in the ONNX graph. Where
    # ONNX Runtime's shape inference disagrees with the declared shape it reports a dim as None (an
    # AveragePool whose last ceil-mode window starts on the padding): the buffer's own shape is bound.
    def static(shape) -> tuple | None:
        return tuple(shape) if all(isinstance(d, int) for d in shape) else None

    ins = [(i.name, static(i.shape)) for i in session.get_inputs()]
    outs = [(o.name, static(o.shape)) for o in session.get_outputs()]

    def slots(specs: list[tuple[str, tuple | None]], bind) -> TensorSlots:
        """OrtValues over our buffers (in the model's shapes), rebound only where an address moved."""
        def value(i: int, arr: np.ndarray):
            shape = specs[i][1]
            arr = arr if shape is None or arr.shape == shape else arr.reshape(shape)
            return wrap_bits(arr.view(np.uint16), _ONNX_BF16) if arr.dtype == _BF16 else wrap(arr, cpu)

        return TensorSlots(len(specs), value, lambda i, value: bind(specs[i][0], value))

    bind_in, bind_out = slots(ins, bind_input), slots(outs, bind_output)

    def run(inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        for i, arr in enumerate(inputs):
            bind_in(i, arr)
        for i, out in enumerate(outputs):
            bind_out(i, out)
        execute(binding, None)

    run.weights = keep  # type: ignore[attr-defined]  (the session reads them as long as it runs)
    return run
