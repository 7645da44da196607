"""Runs an ONNX model with OpenVINO's CPU plugin, compiled on the program's one ``ov.Core`` with its
thread budget (see ``collage_runtime.engines``): f32 inference precision (stated explicitly, as the CPU
may support bf16), one stream, latency hint. ``load_bf16`` (executor ``openvino_bf16_model``) compiles it
with bf16 inference precision instead: OpenVINO's CPU plugin then runs its matmuls and convolutions on bf16
inputs with f32 accumulation, as it does by default on a CPU with bf16.

Input tensors share memory with the mapped IREE input buffers; output tensors are set to the mapped
result buffers so results land in place. Where OpenVINO's output element type differs from the
buffer's (it runs f64 parts in f32), the result is copied in once, converted. Which outputs can be
written in place, and which inputs need a shape other than the buffer's, is decided at load.

Per call, a tensor is set only where its buffer's address changed since the last call (a program's
constant inputs never move, and IREE's caching allocator hands a region's result the block it freed
after the previous call), and made only for an address not among the slot's last two (a chain's
intermediate results alternate between two blocks): OpenVINO's Python API cannot repoint a tensor, a
new tensor costs ~3.5 µs and ``set_*_tensor`` ~2 µs. The tensors alias the address without holding the
IREE buffer, so the allocator can reuse the block; they are only used while the call's own array holds it.

A region's thread count follows its work (``work``, ``Engines.region_threads``): a small region runs on one
thread, so no TBB worker is left spinning after it (see ``collage_runtime.engines``).

``PROFILED``: None, except while ``collage_mlir.measure.profile`` loads a program to read OpenVINO's per-node
performance counters; then each model is compiled with profiling on and (path, compiled model, infer
request) appended to it.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import openvino as ov
from openvino import _pyopenvino
from openvino import opset13 as ops

from ..engines import Engines
from ..types import NUMPY_DTYPES, NumberFormat
from . import Run, TensorSlots

_BF16 = NUMPY_DTYPES["bf16"]

#: A list while a profiler loads programs (see the module's docstring); None otherwise.
PROFILED: list | None = None


def _alias(arr: np.ndarray, shape: tuple) -> np.ndarray:
    """A writeable array of ``shape`` over ``arr``'s memory that does not keep ``arr`` (and the IREE
    buffer under it) alive; also what OpenVINO needs for read-only arrays (constants mapped from the
    module), which ``ov.Tensor(shared_memory=True)`` refuses. OpenVINO only reads inputs."""
    if arr.nbytes == 0:
        return arr.reshape(shape)
    raw = (ctypes.c_char * arr.nbytes).from_address(arr.ctypes.data)
    return np.frombuffer(raw, dtype=arr.dtype).reshape(shape)


def _tensor(arr: np.ndarray, shape: tuple) -> ov.Tensor:
    """A tensor of ``shape`` sharing ``arr``'s memory (``_alias``); numpy has no bf16, so a bf16 array's
    bits (a uint16 view) are given with OpenVINO's type for them."""
    if arr.dtype == _BF16:
        return ov.Tensor(_alias(arr, shape).view(np.uint16), list(shape), ov.Type.bf16)
    return ov.Tensor(_alias(arr, shape), shared_memory=True)


def _element_type(dtype: np.dtype) -> ov.Type:
    return ov.Type.bf16 if dtype == _BF16 else ov.Type(dtype)


_MAC_OPS = {"MatMul", "Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData",
            "DeformableConvolution"}
_FREE_OPS = {"Parameter", "Constant", "Result", "Reshape", "Squeeze", "Unsqueeze", "Convert"}


def work(model) -> float | None:
    """A rough size of ``model``'s work (an ``ov.Model`` as read): the multiply-adds of its matmuls and
    convolutions (output elements x reduction length) plus one per element every other op produces;
    None where a shape is not static."""
    total = 0
    for op in model.get_ordered_ops():
        kind = op.get_type_name()
        if kind in _FREE_OPS or op.get_output_size() == 0:
            continue
        out = op.get_output_partial_shape(0)
        if not out.is_static:
            return None
        n = int(np.prod(list(out.to_shape()), dtype=np.int64))
        if kind in _MAC_OPS:
            a, w = op.get_input_partial_shape(0), op.get_input_partial_shape(1)
            if not (a.is_static and w.is_static):
                return None
            a, w = list(a.to_shape()), list(w.to_shape())
            if kind == "MatMul":
                k = (a[-2] if len(a) > 1 and op.get_attributes().get("transpose_a") else a[-1]) if a else 1
            elif kind == "GroupConvolution":  # weights (G, Cout/G, Cin/G, k...)
                k = int(np.prod(w[2:], dtype=np.int64))
            elif kind == "GroupConvolutionBackpropData":  # weights (G, Cin/G, Cout/G, k...)
                k = w[1] * int(np.prod(w[3:], dtype=np.int64))
            elif kind == "ConvolutionBackpropData":  # weights (Cin, Cout, k...): per output, Cin x k...
                k = w[0] * int(np.prod(w[2:], dtype=np.int64))
            else:  # weights (Cout, Cin, k...)
                k = int(np.prod(w[1:], dtype=np.int64))
            total += n * max(int(k), 1)
        else:
            total += n
    return float(total)


def read_model(core, path: Path, engines: Engines) -> tuple[object, list]:
    """The ``ov.Model`` of the ONNX file at ``path``, and what must live as long as it is compiled. Where
    its initializers refer to the artifact's weight store they are read as model inputs and replaced by
    constants sharing the store's memory (OpenVINO's ONNX reader refuses external data outside the model's
    directory); the arrays they view are kept."""
    if engines.weights is None:
        return core.read_model(str(path)), []
    import onnx
    from onnx import helper

    data = path.read_bytes()
    proto = onnx.load_from_string(data)
    external = dict(engines.weights.external(proto, str(path)))
    if not external:
        return core.read_model(model=data), []  # read once
    graph = proto.graph
    moved = [t for t in graph.initializer if t.name in external]
    kept = [t for t in graph.initializer if t.name not in external]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    listed = {i.name for i in graph.input}  # an older exporter lists initializers as inputs too
    graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in moved
                       if t.name not in listed)
    model = core.read_model(model=proto.SerializeToString())
    for param in list(model.get_parameters()):
        name = next((n for n in param.output(0).get_names() if n in external), None)
        if name is not None:
            param.output(0).replace(ops.constant(external[name], shared_memory=True).output(0))
            model.remove_parameter(param)
    model.validate_nodes_and_infer_types()
    return model, list(external.values())


def _f32_outputs(model):
    """``model`` with each bf16 output given as f32 (``run`` converts it into the bf16 buffer). With bf16
    inference precision OpenVINO 2026.4 computed a torch bf16 BERT's bf16 output 72 % of scale off, the same
    graph's output as f32 within 2 % (the region file run through OpenVINO's own API)."""
    from openvino.preprocess import PrePostProcessor

    bf16 = [k for k, o in enumerate(model.outputs) if o.get_element_type() == ov.Type.bf16]
    if not bf16:
        return model
    ppp = PrePostProcessor(model)
    for k in bf16:
        ppp.output(k).tensor().set_element_type(ov.Type.f32)
    return ppp.build()


def load(path: Path, engines: Engines, precision: NumberFormat = NumberFormat.F32) -> Run:
    """The callable that runs the ONNX model stored at ``path`` (float math in ``precision``)."""
    core = engines.openvino_core()
    model, keep = read_model(core, path, engines)
    if precision is NumberFormat.BF16:
        model = _f32_outputs(model)
    config = engines.openvino_config(work(model), precision)
    if PROFILED is not None:
        import openvino.properties as props

        config = config | {props.enable_profiling: True}
    compiled = core.compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    if PROFILED is not None:
        PROFILED.append((path, compiled, request))
    in_shapes = [tuple(i.get_shape()) for i in compiled.inputs]
    out_specs = [(tuple(o.get_shape()), o.get_element_type()) for o in compiled.outputs]
    set_input, set_output = request.set_input_tensor, request.set_output_tensor
    # The binding's infer: the Python wrapper's request.infer() copies every output into a new array
    # (4 MB: ~400 µs); with share_outputs the result dict only views them (our buffers).
    infer = _pyopenvino.InferRequest.infer
    direct: list[bool] = []  # per output: OpenVINO writes into the mapped buffer (decided on the first call)
    # Tensors over our buffers, remade only where a buffer's address moved (``TensorSlots``).
    bind_in = TensorSlots(len(in_shapes), lambda i, arr: _tensor(arr, in_shapes[i]), set_input)
    bind_out = TensorSlots(len(out_specs), lambda i, arr: _tensor(arr, out_specs[i][0]), set_output)

    def run(inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        if not direct:
            direct.extend(out.size > 0 and t == _element_type(out.dtype) for out, (_, t) in zip(outputs, out_specs))
        for i, arr in enumerate(inputs):
            bind_in(i, arr)
        for i, (out, ok) in enumerate(zip(outputs, direct)):
            if ok:
                bind_out(i, out)
        infer(request, {}, True, False)
        for i, (out, ok) in enumerate(zip(outputs, direct)):
            if not ok:
                np.copyto(out, request.get_output_tensor(i).data.reshape(out.shape), casting="unsafe")

    run.weights = keep  # type: ignore[attr-defined]  (the compiled model may read the store's memory)
    return run


def load_bf16(path: Path, engines: Engines) -> Run:
    """``load`` with bf16 inference precision."""
    return load(path, engines, NumberFormat.BF16)


# ov.Core is thread-safe and compile_model releases the GIL: a program's regions compile on its threads at once.
load.concurrent_load = True  # type: ignore[attr-defined]
load_bf16.concurrent_load = True  # type: ignore[attr-defined]
