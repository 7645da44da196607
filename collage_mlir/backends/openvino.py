"""`openvino`: regions run by OpenVINO's CPU plugin, which reads the same ONNX export as `ort`.

Build writes ``regions/<region>.openvino.onnx``; the runtime executor
``collage_runtime.executors.openvino_model`` compiles it for the CPU in f32 (stated explicitly:
this CPU has AVX512_BF16 and OpenVINO would otherwise pick bf16) and runs it with input tensors
sharing memory with the IREE buffers and output tensors set to the mapped result buffers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..dialects.stablehlo import const_expr_value, tensor_type
from ..errors import CollageError
from ..graph import Graph, nested_ops, producer
from ..ir import ir
from .base import RegionArtifact, Tolerance
from .onnx_export import DTYPES, F32_EXACT, FLOATS, OnnxGraphBackend, engine_patterns, gather_info

#: How far back ``exact_types`` looks for a value's non-constant inputs.
_MAX_ANCESTORS = 64


def _from_constants(value: ir.Value) -> bool:
    """Whether ``value`` is computed from constants alone (within ``_MAX_ANCESTORS`` ops)."""
    seen: set = set()
    stack = [value]
    while stack:
        op = producer(stack.pop())
        if op is None or len(seen) >= _MAX_ANCESTORS:
            return False  # a function argument, or too far to tell
        if op in seen:
            continue
        seen.add(op)
        stack.extend(op.operands)
    return True


def _index_read(op: ir.Operation, v: ir.Value) -> bool:
    """Whether ``op`` reads the i64 value ``v`` only where the export reads it exactly on OpenVINO: as
    the start indices of a row gather (clamped in f32 straight from the input, ``onnx_export._gather``),
    or as the input of a reshape (the export converts before it, ``onnx_optimize._hoist_casts``)."""
    if op.name == "stablehlo.reshape":  # only if what it makes is itself read as indices, never returned
        r = op.results[0]
        return all(_index_read(u.owner.operation, r) for u in r.uses)
    if op.name != "stablehlo.gather" or op.operands[0] == v or op.operands[1] != v:
        return False
    g = gather_info(op)
    table = tensor_type(op.operands[0])[0]
    return len(g.start_index_map) == 1 and table[g.start_index_map[0]] <= F32_EXACT


def exact_types(op: ir.Operation) -> str | None:
    """i64 from constants or as row-gather indices (OpenVINO computes i64 in 32 bits); constant pad values"""
    # Probed (test_graph_translation.py::test_engine_type_coverage): 2**40 + 3 comes back as 3, and a pad
    # value given at run time is ignored (zeros). f64 runs in f32 — as IREE runs it (it demotes f64).
    # An i64 graph input converted to f32 by the node reading it arrives whole (probed; test_onnx_ops.py):
    # token ids reach the embedding gathers that way.
    for v in list(op.operands) + list(op.results):
        tt = tensor_type(v)
        if tt is not None and tt[1] == "i64" and not _from_constants(v) and not _index_read(op, v):
            return "OpenVINO computes i64 in 32 bits: only i64 values computed from constants or read as gather indices"
    if op.name == "stablehlo.pad" and const_expr_value(op.operands[1]) is None:
        return "OpenVINO ignores a padding value given at run time: it must be a constant"
    return None


def runtime_i64_output(graph: Graph, ids: frozenset[int]) -> str | None:
    """Why the region ``ids`` cannot run on OpenVINO as a whole, else None: an i64 value not computed
    from constants (a reshaped index) must not leave it, as OpenVINO would return it cut to 32 bits."""
    ops = [graph.nodes[i].op for i in ids]
    inside = {o for op in ops for o in nested_ops(op)}
    for op in ops:
        for r in op.results:
            tt = tensor_type(r)
            if tt is not None and tt[1] == "i64" and not _from_constants(r) and \
                    any(u.owner.operation not in inside for u in r.uses):
                return "an i64 value computed at run time would leave the OpenVINO region (cut to 32 bits)"
    return None


class OpenVinoBackend(OnnxGraphBackend):
    name = "openvino"
    requires = ("onnx", "openvino")
    suffix = ".openvino.onnx"
    executor = "collage_runtime.executors.openvino_model"
    patterns = engine_patterns(exact_types)
    install_hint = "pip install 'collage-mlir[openvino]'"
    # Measured vs IREE llvm-cpu on test/python/test_onnx_backends.py's unit-normal inputs: max abs error
    # 1.3e-4 (ResNet-50 3x3 conv 1x64x56x56, outputs up to 123), 2.3e-5 (sum over 16k elements),
    # 4e-6 (layer norm), 0 for the BERT 128x768x768 matmul, strided 1x1, depthwise and NHWC convs
    # (same accumulation order as IREE), < 1e-7 (softmax, data movement). Winograd-style or blocked
    # 3x3 kernels round sums of hundreds of terms differently: near-zero outputs need the absolute term.
    tolerance = Tolerance(rtol=1e-4, atol=5e-4)

    def version(self) -> str:
        import openvino

        return f"openvino-{openvino.get_version().split('-')[0]}"

    def candidates(self, graph: Graph) -> list[tuple[str, frozenset[int]]]:
        return [(name, ids) for name, ids in super().candidates(graph) if runtime_i64_output(graph, ids) is None]

    def accepts(self, graph: Graph, ids: frozenset[int]) -> str | None:
        return super().accepts(graph, ids) or runtime_i64_output(graph, ids)

    def build(self, func: ir.Operation, out_dir: Path, region: str) -> RegionArtifact:
        art = super().build(func, out_dir, region)
        import onnx
        from onnx import numpy_helper

        model = onnx.load(Path(out_dir) / art.file)
        if (why := inexact_i64_input(model)) is not None:
            raise CollageError(f"{func.location}: {why}; leave the region to another backend")

        # i64 constants reach OpenVINO folded; they must survive its 32-bit arithmetic unchanged.
        for t in model.graph.initializer:
            v = numpy_helper.to_array(t)
            if v.dtype == np.int64 and v.size and (v.min() < np.iinfo(np.int32).min or v.max() > np.iinfo(np.int32).max):
                raise CollageError(f"{func.location}: an i64 constant of this region does not fit the 32 bits "
                                   "OpenVINO computes i64 in; leave the region to another backend")
        return art


def inexact_i64_input(model) -> str | None:
    """Why OpenVINO would read an i64 input of the ONNX ``model`` cut to 32 bits where it matters, else
    None: every path from an i64 input to gather indices must start with a conversion to a float (the
    only node OpenVINO runs on the whole 64 bits; any other cuts the value first)."""
    floats = {DTYPES[t][1] for t in FLOATS}
    nodes = list(model.graph.node)
    for inp in model.graph.input:
        if inp.type.tensor_type.elem_type != DTYPES["i64"][1]:
            continue
        reached, frontier = set(), [inp.name]
        while frontier:
            name = frontier.pop()
            for k, n in enumerate(nodes):
                if name not in n.input or k in reached:
                    continue
                reached.add(k)
                if name == inp.name and n.op_type == "Cast" and any(a.name == "to" and a.i in floats
                                                                    for a in n.attribute):
                    continue  # converted where it enters: read whole, what follows is exact
                if n.op_type in ("Gather", "GatherND") and list(n.input).index(name) == 1:
                    return f"i64 input {inp.name} reaches gather indices without an exact conversion"
                frontier.extend(n.output)
    return None
