"""`openvino`: regions run by OpenVINO's CPU plugin, which reads the same ONNX export as `ort`.

Build writes ``regions/<region>.openvino.onnx``; the runtime executor
``collage_runtime.executors.openvino_model`` compiles it for the CPU in f32 (stated explicitly:
on a CPU with bf16 (AVX-512 BF16, AMX) OpenVINO would otherwise pick bf16) and runs it with input tensors
sharing memory with the IREE buffers and output tensors set to the mapped result buffers.

`openvino-bf16` (opt-in: a lower precision than an f32 model states) is the same engine with bf16 inference
precision, OpenVINO's own default where the CPU has bf16: matmuls and convolutions on bf16 inputs with f32
accumulation, about 2x f32's speed (ResNet-50: 10.1 against 18.6 ms on AMD Zen 5, 2 cores). Usable only on
such a CPU (elsewhere OpenVINO would emulate it, slower than f32).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from ..dialects import collage
from ..dialects.stablehlo import const_expr_value, sunk_chain, tensor_type
from ..errors import CollageError
from ..graph import Graph, body_ops, nested_ops, producer
from ..ir import ir
from ..onnx import DTYPES, FLOATS
from ..onnx.gather import F32_EXACT, gather_info
from ..onnx.sort import TIE_BREAK_MAX
from .base import Candidate, NumberFormat, RegionArtifact, Tolerance
from .host import host_cpu
from .onnx_engine import OnnxGraphBackend, engine_patterns

#: How far back ``_static`` looks for a value's inputs.
_MAX_ANCESTORS = 64
_I64_MESSAGE = ("OpenVINO computes i64 in 32 bits: only i64 values computed from constants that fit 32 bits, or read "
                "as gather indices")


def _static(value: ir.Value, inside: set[ir.Operation] | None, passed: frozenset) -> bool:
    """Whether OpenVINO gets ``value`` from constants alone (within ``_MAX_ANCESTORS`` ops), so it folds it
    whole. ``inside``: the region's ops (a producer outside it hands a constant expression the region gets
    its own copy of, unless the value is among ``passed``, the region's run-time inputs); None asks it of
    the op alone, as if every producer could join its region."""
    seen: set = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if v in passed:
            return False
        op = producer(v)
        if op is None or len(seen) >= _MAX_ANCESTORS:
            return False  # a function argument, or too far to tell
        if (inside is not None and op not in inside) or op in seen:
            continue
        seen.add(op)
        stack.extend(op.operands)
    return True


def _index_read(op: ir.Operation, v: ir.Value, inside: set[ir.Operation] | None) -> bool:
    """Whether ``op`` reads the i64 value ``v`` only where the export reads it exactly on OpenVINO: as
    the start indices of a row gather (clamped in f32 straight from the input, ``onnx.gather._gather``),
    or as the input of a reshape whose one use is such a read inside the region (the export then converts
    before the reshape, ``onnx.optimize._hoist_casts``)."""
    if op.name == "stablehlo.reshape":
        uses = [u.owner.operation for u in op.results[0].uses]
        return len(uses) == 1 and (inside is None or uses[0] in inside) and \
            _index_read(uses[0], op.results[0], inside)
    if op.name != "stablehlo.gather" or op.operands[0] == v or op.operands[1] != v:
        return False
    g = gather_info(op)
    table = tensor_type(op.operands[0])[0]
    return len(g.start_index_map) == 1 and table[g.start_index_map[0]] <= F32_EXACT


def _fits_i32(v: np.ndarray) -> bool:
    return np.iinfo(np.int32).min <= v.min() and v.max() <= np.iinfo(np.int32).max


def _inexact_i64(op: ir.Operation, inside: set[ir.Operation] | None, passed: frozenset) -> bool:
    """Whether OpenVINO would cut an i64 value ``op`` reads or makes to 32 bits: one not computed from
    constants and not read as gather indices, or a constant (as written) beyond 32 bits."""
    for v in list(op.operands) + list(op.results):
        if (tt := tensor_type(v)) is None or tt[1] != "i64":
            continue
        if not _static(v, inside, passed):
            if not _index_read(op, v, inside):
                return True
        elif (c := const_expr_value(v)) is not None and c.size and not _fits_i32(c):
            return True
    return False


def exact_types(op: ir.Operation) -> str | None:
    """i64 from constants or as row-gather indices (OpenVINO computes i64 in 32 bits); constant pad values"""
    # Probed (test_graph_translation.py::test_engine_type_coverage): 2**40 + 3 comes back as 3, and a pad
    # value given at run time is ignored (zeros). f64 runs in f32 — as IREE runs it (it demotes f64).
    # An i64 graph input converted to f32 by the node reading it arrives whole (probed; test_onnx_ops.py):
    # token ids reach the embedding gathers that way. Op by op this can only ask whether some region could
    # hold the op; ``i64_problem`` asks it of the region a plan makes, with the same two predicates.
    if _inexact_i64(op, None, frozenset()):
        return _I64_MESSAGE
    if op.name == "stablehlo.pad" and const_expr_value(op.operands[1]) is None:
        return "OpenVINO ignores a padding value given at run time: it must be a constant"
    return None


def no_scalar_dot(op: ir.Operation) -> str | None:
    """not a dot product of vectors (rank-0 result): OpenVINO 2026.4 dies of SIGSEGV compiling it"""
    # Probed: 1-D x 1-D dot_general, exported as MatMul of [1, k] x [k, 1] reshaped to [], crashes in
    # compile_model (ONNX's test_matmul_1d_1d under prefer:openvino); rank-0 adds and reductions run.
    if op.name == "stablehlo.dot_general" and (tt := tensor_type(op.results[0])) is not None and not tt[0]:
        return "OpenVINO crashes compiling a dot product with a rank-0 result"
    return None


def kept_node_agrees(op: ir.Operation) -> str | None:
    """an ONNX node kept as ONNX only where OpenVINO compiles it and gives ONNX Runtime's outputs on
    generated inputs (its ONNX reader lacks ops such as Det and CumProd), and not one computing integers from
    floats (a quantization: OpenVINO rounds ties its own way)"""
    model = collage.onnx_node_model(op)
    return None if model is None else _kept_node_problem(model)


#: Kept ops OpenVINO does not stand in for, whatever the probe finds (see ``_kept_node_problem``).
SPECTRAL = ("DFT", "STFT")


@lru_cache(maxsize=256)
def _kept_node_problem(model: bytes) -> str | None:
    """Why OpenVINO cannot stand in for ONNX Runtime on the one-node ``model``, else None: it cannot compile
    it, or its outputs on generated inputs (floats standard normal, integers 0 or 1, as ONNX Runtime takes
    them) differ from ONNX Runtime's beyond the backend's tolerance."""
    import onnx
    import onnxruntime as ort
    import openvino as ov
    import openvino.properties.hint as hints

    graph = onnx.load_from_string(model).graph
    given = {t.name for t in graph.initializer}
    kinds = {v.name: onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).kind
             for v in [*graph.input, *graph.output]}
    if any(kinds[v.name] == "f" for v in graph.input) and any(kinds[v.name] in "iub" for v in graph.output):
        # Probed (ONNX's test_dynamicquantizelinear_expanded): its kept QuantizeLinear gave 1 off at a tie
        # (x / scale = k + 0.5) on OpenVINO; generated inputs hit no tie, so such nodes are not compared.
        return "a float-to-integer node: OpenVINO rounds ties its own way"
    if graph.node[0].op_type in SPECTRAL:
        # Probed (ONNX's test_dft_axis_opset19): OpenVINO's DFT is off by 8.8e-5 at bins that cancel, where
        # ONNX Runtime meets the case's atol of 1e-7; on generated inputs the two agree to 7e-7 of the scale.
        return "a DFT: OpenVINO's sums differ from ONNX Runtime's at bins that cancel"
    rng = np.random.default_rng(0)
    feeds = {}
    for v in graph.input:
        if v.name in given:
            continue
        tt = v.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        shape = [d.dim_value for d in tt.shape.dim]
        feeds[v.name] = (rng.standard_normal(shape) if dtype.kind == "f" else rng.integers(0, 2, shape)).astype(dtype)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        want = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception:  # noqa: BLE001  (no reference on these inputs: not taken)
        return "ONNX Runtime does not run the node on generated inputs to compare OpenVINO with"
    try:
        core = ov.Core()
        read = core.read_model(model=model, weights=b"")
        if not all(o.get_partial_shape().is_static for o in read.outputs):
            # Compress of a constant mask, a window of a constant size: static to ONNX's shape inference,
            # dynamic in OpenVINO's reading, and a region's outputs are bound at their static shapes.
            return "OpenVINO reads the node's output shape as dynamic"
        compiled = core.compile_model(read, "CPU", {hints.inference_precision: ov.Type.f32})
        got = list(compiled(feeds).values())
    except Exception:  # noqa: BLE001  (OpenVINO raises its own exception types)
        return "OpenVINO's ONNX reader does not take the node"
    tol = OpenVinoBackend.tolerance
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"OpenVINO gives {g.dtype}{list(g.shape)} where ONNX Runtime gives {w.dtype}{list(w.shape)}"
        scale = float(np.abs(w).max()) if w.size and w.dtype.kind in "fc" else 0.0
        if not np.allclose(g, w, rtol=tol.rtol, atol=tol.atol * max(scale, 1.0), equal_nan=True):
            return "OpenVINO's outputs differ from ONNX Runtime's on the node"
    return None


def short_tie_breaks(op: ir.Operation) -> str | None:
    """top_k and sort along at most 46340 elements (the tie-breaking key must fit OpenVINO's 32-bit i64)"""
    # Probed (test_onnx_control.py::test_topk_tie_order_per_engine): OpenVINO 2026.4's TopK puts equal values
    # in no fixed order, ONNX Runtime's in index order as ONNX specifies; the export sorts OpenVINO's again.
    if op.name == "chlo.top_k":
        n = tensor_type(op.operands[0])[0][-1]
    elif op.name == "stablehlo.sort":
        shape = tensor_type(op.operands[0])[0]
        n = shape[ir.IntegerAttr(op.attributes["dimension"]).value % len(shape)]
    else:
        return None
    return None if n <= TIE_BREAK_MAX else f"sorting {n} > {TIE_BREAK_MAX} elements: the tie order's key would overflow"


def i64_problem(ops: list[ir.Operation], inside: set[ir.Operation], passed: frozenset,
                outputs: list[ir.Value]) -> str | None:
    """Why OpenVINO would compute an i64 value of the region ``ops`` in 32 bits, else None. ``passed``: the
    region's run-time inputs (what is not cloned into it, ``sh.sunk_chain``); ``outputs``: the values it
    hands on. Decides both which regions the backend takes and whether its build accepts one (the outlined
    function: its arguments passed, its returned values handed on), so a plan never holds a region the
    build refuses: a value computed from constants outside the region but passed in (an iota IREE keeps)
    is a run-time input to OpenVINO. ``inside``: ``ops`` and the ops nested in them."""
    for op in ops:
        if _inexact_i64(op, inside, passed):
            return _I64_MESSAGE
    if any(tensor_type(v)[1] == "i64" and not _static(v, inside, passed) for v in outputs):
        return "an i64 value computed at run time would leave the OpenVINO region (cut to 32 bits)"
    return None


def region_i64_problem(graph: Graph, ids: frozenset[int]) -> str | None:
    """``i64_problem`` of the region ``ids`` as outlining will make it."""
    edge = graph.boundary(ids)
    passed = frozenset(v for v in edge.inputs if sunk_chain(v, edge.inside) is None)
    return i64_problem(list(edge.ops), edge.inside, passed, list(edge.outputs))


class OpenVinoBackend(OnnxGraphBackend):
    name = "openvino"
    requires = ("onnx", "openvino")
    suffix = ".openvino.onnx"
    executor = "collage_runtime.executors.openvino_model"
    patterns = engine_patterns(exact_types, no_scalar_dot, kept_node_agrees, short_tie_breaks)
    install_hint = "pip install 'collage-mlir[openvino]'"
    topk_ties_by_index = False
    # Measured vs IREE llvm-cpu on test/python/backends/test_onnx_backends.py's unit-normal inputs: max abs error
    # 1.3e-4 (ResNet-50 3x3 conv 1x64x56x56, outputs up to 123), 2.3e-5 (sum over 16k elements),
    # 4e-6 (layer norm), 0 for the BERT 128x768x768 matmul, strided 1x1, depthwise and NHWC convs
    # (same accumulation order as IREE), < 1e-7 (softmax, data movement). Winograd-style or blocked
    # 3x3 kernels round sums of hundreds of terms differently: near-zero outputs need the absolute term.
    tolerance = Tolerance(rtol=1e-4, atol=5e-4)

    def version(self) -> str:
        import openvino

        return f"openvino-{openvino.get_version().split('-')[0]}"

    def candidates(self, graph: Graph) -> list[Candidate]:
        return [c for c in super().candidates(graph) if region_i64_problem(graph, c.ops) is None]

    def accepts(self, graph: Graph, ids: frozenset[int]) -> str | None:
        return super().accepts(graph, ids) or region_i64_problem(graph, ids)

    def build(self, func: ir.Operation, out_dir: Path, region: str) -> RegionArtifact:
        block = func.regions[0].blocks[0]
        returned = list(list(block.operations)[-1].operands)
        ops = list(body_ops(func))
        inside = {o for op in ops for o in nested_ops(op)}
        if (why := i64_problem(ops, inside, frozenset(block.arguments), returned)) is not None:
            raise CollageError(f"{func.location}: {why}; leave the region to another backend")
        art = super().build(func, out_dir, region)
        import onnx
        from onnx import numpy_helper

        model = onnx.load(Path(out_dir) / art.file)
        if (why := inexact_i64_input(model)) is not None:  # the export broke what i64_problem relies on
            raise CollageError(f"{func.location}: {why} (a defect of collage's ONNX export); leave the region "
                               "to another backend")

        if infinite_extremes(model):
            onnx.save(model, str(Path(out_dir) / art.file))
        # i64 constants reach OpenVINO folded; they must survive its 32-bit arithmetic unchanged.
        for t in model.graph.initializer:
            v = numpy_helper.to_array(t)
            if v.dtype == np.int64 and v.size and not _fits_i32(v):
                raise CollageError(f"{func.location}: an i64 constant of this region does not fit the 32 bits "
                                   "OpenVINO computes i64 in; leave the region to another backend")
        return art


class OpenVinoBf16Backend(OpenVinoBackend):
    name = "openvino-bf16"
    suffix = ".openvino-bf16.onnx"
    executor = "collage_runtime.executors.openvino_bf16_model"
    opt_in = True  # lower precision than an f32 model states: only where named (``--precision bf16``)
    computes_in = NumberFormat.BF16
    # bf16 keeps 8 bits of each input's mantissa (2^-9 relative per product), sums stay f32: one region of a
    # matmul or convolution on unit-normal inputs is ~0.3 % of its output's scale off (a 3x3 64->64 conv
    # at 56x56: 0.4 %); a whole model's roundings add up (ResNet-50 with seeded weights: 10 % of the
    # output's scale, top class the same), which the plan's check allows (10x the loosest tolerance).
    tolerance = Tolerance(rtol=2e-2, atol=2e-2)

    def available(self) -> str | None:
        return super().available() or _no_bf16()

    def version(self) -> str:
        return super().version() + "-bf16"


def _no_bf16() -> str | None:
    """Why this CPU cannot run bf16 natively, else None: OpenVINO's CPU plugin computes in bf16 where the CPU
    has AVX-512 BF16 or AMX (and emulates it, slower than f32, elsewhere)."""
    if {"avx512_bf16", "amx_bf16"} & host_cpu()[1]:
        return None
    return "this CPU has no bf16 arithmetic (AVX-512 BF16 or AMX)"


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


def infinite_extremes(model) -> int:
    """Makes each float ``ReduceMax`` (``ReduceMin``) of ``model`` give -inf (+inf) where every element it
    reduces is -inf (+inf), as ONNX and StableHLO say; OpenVINO 2026.4 gives the lowest (highest) finite
    float there. Returns how many it guarded. A softmax's max is inside its fused ``Softmax`` by then."""
    # Probed (ONNX's test_attention_23_fullymasked_* node tests): ReduceMax of [-inf, -inf] is -3.4e38, so
    # the expanded Attention body's "row fully masked" test (max == -inf) failed and its rows came out NaN.
    import onnx
    from onnx import helper, numpy_helper

    floats = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
              onnx.TensorProto.DOUBLE: np.float64}
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type
             for v in [*onnx.shape_inference.infer_shapes(model).graph.value_info, *graph.input]}
    nodes, guarded = [], 0
    for node in graph.node:
        nodes.append(node)
        if node.op_type not in ("ReduceMax", "ReduceMin") or types.get(node.input[0]) not in floats:
            continue
        guarded += 1
        top = node.op_type == "ReduceMax"
        x, out, tag = node.input[0], node.output[0], f"collage_extreme{guarded}"
        node.output[0] = f"{tag}_raw"
        finite = helper.make_node("Not", [f"{tag}_inf"], [f"{tag}_finite"], name=f"{tag}_finite")
        any_finite = helper.make_node(node.op_type if top else "ReduceMax",
                                      [f"{tag}_finite_f", *node.input[1:]], [f"{tag}_any_f"], name=f"{tag}_any")
        any_finite.attribute.extend(node.attribute)
        extreme = numpy_helper.from_array(np.array(-np.inf if top else np.inf, floats[types[x]]), f"{tag}_extreme")
        graph.initializer.append(extreme)
        nodes += [helper.make_node("IsInf", [x], [f"{tag}_inf"], name=f"{tag}_inf",
                                   detect_positive=0 if top else 1, detect_negative=1 if top else 0),
                  finite,
                  helper.make_node("Cast", [f"{tag}_finite"], [f"{tag}_finite_f"], name=f"{tag}_cast",
                                   to=onnx.TensorProto.FLOAT),
                  any_finite,
                  helper.make_node("Cast", [f"{tag}_any_f"], [f"{tag}_any"], name=f"{tag}_any_b",
                                   to=onnx.TensorProto.BOOL),
                  helper.make_node("Where", [f"{tag}_any", f"{tag}_raw", extreme.name], [out], name=f"{tag}_where")]
    if guarded:
        del graph.node[:]
        graph.node.extend(nodes)
    return guarded
