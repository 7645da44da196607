"""The import check: an imported model computes what its source computes, before anything is built on it.

An importer's lowering can be wrong without a word (torch-mlir's ONNX lowering of ``Mod`` with mixed
signs, ``SpaceToDepth`` in CRD mode, ``ReduceMax`` over booleans, 3-D ``LpPool``, dilated 3-D
``MaxPool``): every plan then compiles the wrong numbers faithfully. So right after a frontend imports a
model, the imported StableHLO runs with IREE alone (``reference.invoke_alone``, the harness's reference
run) and the source runs on the same inputs:

    ONNX file      ONNX Runtime on the original file (no graph optimizations); ONNX's reference evaluator
                   where ONNX Runtime cannot load it (an IR version or opset newer than it supports)
    PyTorch        the eager model, ``model(*example_inputs)``
    JAX            the user's function under ``jax.jit``

Each output is compared (``compare``); a mismatch is one CollageError naming the output (index and name),
its largest error and, for ONNX, the first node whose output differs (found only on a mismatch). A
``.mlir`` file has no source to compare with and is not checked.

Inputs: the example inputs where given, else generated ones from the signature (``reference.model_inputs``:
unit-normal floats with a fixed seed, small non-negative integers so index inputs stay in range, random
booleans), except that a generated integer 0 becomes 1: an integer division by zero is undefined (ONNX
Runtime's integer ``Div`` dies of SIGFPE) and an import need not agree with its source on it. A signed
integer input that only ever meets elementwise arithmetic (``data_arguments``: never an index, a shape or
a slice bound) gets both signs, so that a lowering wrong on negative values (``Mod`` of mixed signs) fails
the check instead of passing on non-negative data.

A verdict that passed is cached on disk (``cache_dir()/import-check``) under a hash of the source, the
imported module, the inputs and the engines' versions, so compiling the same model again does not pay
for the check (one more whole-model IREE compile and a source run) again.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from collage_runtime.types import byte_dtype, is_float

from ..dialects import collage
from ..errors import CollageError
from ..frontends import cache_dir, load_model
from ..frontends.onnx import import_onnx
from ..frontends.onnx_kept import first_failing_prefix, graph_facts, write_prefix
from ..frontends.torch import pt2e_quantized
from ..graph import public_funcs
from ..ir import ir, new_context
from .reference import ReferenceBuildError, build_reference, invoke_alone, model_inputs

#: Bumped when the comparison rule changes, so cached verdicts of the old rule are not reused.
CHECK_VERSION = 2


@dataclass(frozen=True)
class Tolerance:
    """When a float output of the import matches its source: elementwise

        |import - source| <= rtol * |source| + atol_scale * max|source| + atol_floor

    Different engines accumulate in different orders, so a long reduction differs by a few ulps of the
    *output's* magnitude, not of each element's: the absolute term scales with the largest source value.
    f32/f64: rtol 1e-3, atol 1e-4 of the magnitude (IREE vs ONNX Runtime/torch on the zoo models differ
    by ~1e-6 relative; the wrong lowerings this catches are off by whole units: 3 vs -1, a permuted
    tensor, a pool over the wrong window). f16/bf16 carry 3 decimal digits: rtol 1e-2, 1e-2 of the
    magnitude. A quantized ONNX model's float outputs get twice its *spread* on top: the largest difference
    between ONNX Runtime's two arithmetics of the same model (unfused, each ``DequantizeLinear`` then f32
    ops, against fused int8 kernels, and against the unfused model with its quantize scales nudged:
    ``_nudged_scales``), at least one step of the output's own quantizer (``_output_steps``), because a value
    that lands near a rounding boundary of a
    ``QuantizeLinear`` moves by one step under any other accumulation order, and steps compound through the
    layers (ResNet-50 int8: spread 0.17 of outputs up to 2.2; OpenVINO differs from ONNX Runtime by 0.36,
    IREE by 0.19). Integers and booleans compare exactly; NaN and infinities must sit at the same places; the
    dtype and shape must be the source's."""

    rtol: float
    atol_scale: float
    atol_floor: float = 1e-6


FLOAT_TOLERANCE = Tolerance(rtol=1e-3, atol_scale=1e-4)
HALF_TOLERANCE = Tolerance(rtol=1e-2, atol_scale=1e-2, atol_floor=1e-3)


def tolerance_for(dtype: np.dtype) -> Tolerance:
    """The tolerance of a float output of ``dtype`` (``Tolerance``)."""
    return HALF_TOLERANCE if np.dtype(dtype).itemsize <= 2 else FLOAT_TOLERANCE


@dataclass(frozen=True)
class OutputCheck:
    """One output compared: the largest error (``inf`` where shapes or NaN/infinity places differ) and the
    tolerance at that element; ``detail`` says where and what (empty when the output matches)."""

    index: int
    name: str
    max_error: float
    allowed: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        return not self.detail


@dataclass(frozen=True)
class ImportCheck:
    """The verdict: every output compared with the source; ``node`` names the first ONNX node whose output
    differs (None where none was looked for or found); ``cached`` when a passed verdict was reused."""

    source: str
    outputs: tuple[OutputCheck, ...]
    node: str | None = None
    cached: bool = False

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def message(self) -> str:
        """One line: the first output that differs, its error and the node (where found)."""
        bad = next(o for o in self.outputs if not o.ok)
        label = f"output {bad.index}" + (f" '{bad.name}'" if bad.name else "")
        at = f"; first differing node: {self.node}" if self.node else ""
        others = sum(1 for o in self.outputs if not o.ok) - 1
        more = f" (and {others} more output{'s' if others > 1 else ''})" if others else ""
        return (f"the imported model computes other numbers than its source ({self.source}): {label}{more}: "
                f"{bad.detail}{at}; nothing was built (--no-import-check compiles it anyway)")


@dataclass(frozen=True)
class DifferingNode:
    """The first source node whose output the import computes otherwise: its label and output names."""

    label: str
    outputs: tuple[str, ...] = ()


class ImportMismatch(CollageError):
    """The import check's verdict on an import that computes other numbers than its source (one line),
    with the first differing node where one was found."""

    def __init__(self, message: str, node: DifferingNode | None, where: str | None = None):
        super().__init__(message, where=where)
        self.node = node


@dataclass(frozen=True)
class SourceRun:
    """The source run on the check's inputs: which engine ran it, and its outputs."""

    engine: str
    outputs: list[np.ndarray]
    #: Per output, how far the engine's own runs of the source differ (a quantized model: ``Tolerance``),
    #: else None.
    spread: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Source:
    """What an import is checked against: ``run(inputs)`` gives the engine that ran and the source's
    outputs (flat, in the module's result order), ``names`` their names, ``digest`` identifies the source
    for the verdict cache, and ``locate(inputs)``, where given, names the first op whose output differs."""

    name: str
    run: Callable[[Sequence[np.ndarray]], "SourceRun"]
    names: tuple[str, ...]
    digest: str
    locate: Callable[[Sequence[np.ndarray]], DifferingNode | None] | None = None
    #: The source's inputs, (name, dtype) in order, where it declares them (an ONNX graph does): an
    #: import that changed an input's type (torch-mlir makes float64 inputs float32) fails the check.
    inputs: tuple[tuple[str, np.dtype], ...] | None = None


def compare(index: int, name: str, got: np.ndarray, want: np.ndarray, spread: float = 0.0,
            scale_slack: float = 0.0) -> OutputCheck:
    """The import's output ``got`` against the source's ``want`` (the ``Tolerance`` rule; ``spread``: the
    source's own spread on this output; ``scale_slack``: a further share of the output's scale allowed, what
    a lower-precision program may differ by)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        why = " (the import made float64 float32)" if (got.dtype, want.dtype) == (np.float32, np.float64) else ""
        return OutputCheck(index, name, float("inf"), 0.0,
                           f"{got.dtype}{list(got.shape)}, the source gives {want.dtype}{list(want.shape)}{why}")
    if not (is_float(want.dtype) or want.dtype.kind == "c"):  # integers and booleans: exactly
        same = np.asarray(got == want)
        if same.all():
            return OutputCheck(index, name, 0.0, 0.0)
        k = int(np.argmin(same.reshape(-1)))
        error = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())
        return OutputCheck(index, name, error, 0.0,
                           f"{int((~same).sum())} of {same.size} elements differ (exact comparison), e.g. at "
                           f"{_at(k, got.shape)}: import {got.reshape(-1)[k]}, source {want.reshape(-1)[k]}")
    tol = tolerance_for(want.dtype)
    wide = np.complex128 if "c" in got.dtype.kind + want.dtype.kind else np.float64
    g, w = got.astype(wide), want.astype(wide)
    finite = np.isfinite(w)
    scale = float(np.abs(w[finite]).max()) if finite.any() else 0.0
    allowed = np.where(finite, tol.rtol * np.abs(w) + (tol.atol_scale + scale_slack) * scale + tol.atol_floor
                       + 2 * spread, 0.0)
    # NaN where the source has NaN, the same infinity where it has one: no error; any other NaN: infinite.
    same_special = (np.isnan(g) & np.isnan(w)) | (~finite & ~np.isnan(w) & (g == w))
    with np.errstate(invalid="ignore"):
        error = np.where(same_special, 0.0, np.abs(g - w))
    error = np.where(np.isnan(error), np.inf, error)
    excess = error - allowed
    if error.size == 0 or not (excess > 0).any():
        return OutputCheck(index, name, float(error.max()) if error.size else 0.0,
                           float(allowed.max()) if allowed.size else 0.0)
    k = int(np.argmax(excess.reshape(-1)))
    worst = float(error.max())
    return OutputCheck(index, name, worst, float(allowed.reshape(-1)[k]),
                       f"max error {worst:.3g}; at {_at(k, got.shape)}: import {got.reshape(-1)[k]:.6g}, source "
                       f"{want.reshape(-1)[k]:.6g}, allowed {allowed.reshape(-1)[k]:.2g} ({int((excess > 0).sum())} "
                       f"of {error.size} elements beyond tolerance)")


def _at(flat: int, shape: tuple[int, ...]) -> list[int]:
    return [int(i) for i in np.unravel_index(flat, shape)] if shape else []


def check_inputs(module: ir.Module, examples: Sequence[np.ndarray] | None, seed: int = 0) -> list[np.ndarray]:
    """``examples`` (checked against @main's signature) or generated inputs (module docstring)."""
    given = list(examples or ())
    arrays = model_inputs(module, {"main": given} if given else {}, seed)["main"]
    if given:
        return arrays
    data = data_arguments(module)
    rng = np.random.default_rng(seed + 1)
    out = []
    for k, a in enumerate(arrays):
        if a.dtype.kind in "iu":
            a = np.where(a == 0, np.ones((), a.dtype), a)
            if a.dtype.kind == "i" and k in data:  # both signs, never zero
                a = (a * rng.choice(np.array([-1, 1], a.dtype), size=a.shape)).astype(a.dtype)
        out.append(a)
    return out


#: Ops through which an integer input stays plain data: elementwise arithmetic, comparisons, selects,
#: conversions and layout changes. Any other use (a gather's indices, a slice bound, a shape, an iota
#: compared against it) may need non-negative values.
_DATA_OPS = frozenset(f"stablehlo.{n}" for n in (
    "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "negate", "abs", "sign",
    "compare", "select", "convert", "and", "or", "xor", "not", "shift_left", "shift_right_arithmetic",
    "shift_right_logical", "power", "clamp", "broadcast_in_dim", "reshape", "transpose"))


def data_arguments(module: ir.Module) -> set[int]:
    """The positions of @main's arguments whose every use, followed through ``_DATA_OPS``, is one of those
    ops or the function's return."""
    func = next(f for f in public_funcs(module) if collage.symbol_name(f) == "main")
    out = set()
    for k, arg in enumerate(func.regions[0].blocks[0].arguments):
        todo, seen, data = [arg], set(), True
        while todo and data:
            for use in todo.pop().uses:
                op = use.owner
                if op.name == "func.return":
                    continue
                if op.name not in _DATA_OPS:
                    data = False
                    break
                for result in op.results:
                    if result not in seen:
                        seen.add(result)
                        todo.append(result)
        if data:
            out.add(k)
    return out


def check_import(module: ir.Module, source: Source, examples: Sequence[np.ndarray] | None = None, *,
                 where: str | None = None, cache: bool = True) -> ImportCheck:
    """Runs ``module``'s @main with IREE alone and ``source`` on the same inputs and compares each output;
    raises CollageError (one line, ``ImportCheck.message``) on a mismatch, returns the verdict otherwise."""
    _check_input_types(module, source, examples, where)
    inputs = check_inputs(module, examples)
    key = _verdict_key(module, source, inputs)
    path = cache_dir() / "import-check" / f"{key}.json"
    if cache and path.is_file():
        try:
            return _from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged entry: check again
    try:
        ran = source.run(inputs)
    except CollageError as exc:
        raise CollageError(f"cannot check the import against its source: {exc} (--no-import-check / "
                           "check_import=False compiles without the check)", where=where) from None
    want = [np.asarray(a) for a in ran.outputs]
    # A module whose signature has no float64 (the import made the source's float64 float32) takes float32
    # there; an output the source gives as float64 then fails the dtype rule.
    if not collage.computes_float64(module):
        inputs = [a.astype(np.float32) if a.dtype == np.float64 else a for a in inputs]
    try:
        (got,) = invoke_alone(module, {"main": inputs}).values()
    except (RuntimeError, ValueError) as exc:  # IREE's run-time errors
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise CollageError(f"the imported model does not run with IREE alone: {first[:300]}", where=where) from None
    if len(got) != len(want):
        raise CollageError(f"the imported model has {len(got)} outputs, its source ({ran.engine}) {len(want)}",
                           where=where)
    names = source.names if len(source.names) == len(want) else ("",) * len(want)
    spread = ran.spread or (0.0,) * len(want)
    verdict = ImportCheck(ran.engine, tuple(compare(k, n, g, w, d) for k, (n, g, w, d) in
                                            enumerate(zip(names, got, want, spread))))
    if not verdict.ok:
        node = source.locate(inputs) if source.locate else None
        raise ImportMismatch(ImportCheck(verdict.source, verdict.outputs, node and node.label).message(), node,
                             where=where)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{id(verdict)}.tmp")
        tmp.write_text(json.dumps(asdict(verdict)))
        tmp.replace(path)  # atomic: a concurrent reader never sees half a file
    return verdict


def _check_input_types(module: ir.Module, source: Source, examples: Sequence[np.ndarray] | None,
                       where: str | None) -> None:
    """The import takes each input in the source's dtype (the example's, or the one the source declares)."""
    func = next(f for f in public_funcs(module) if collage.symbol_name(f) == "main")
    types = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value).inputs
    declared = source.inputs or tuple((f"{k}", np.asarray(a).dtype) for k, a in enumerate(examples or ()))
    for k, ((name, dtype), t) in enumerate(zip(declared, types)):
        element = str(ir.RankedTensorType(t).element_type) if isinstance(t, ir.RankedTensorType) else str(t)
        if byte_dtype(element) != np.dtype(dtype):
            label = f"input {k}" + (f" '{name}'" if name != f"{k}" else "")
            raise CollageError(f"the imported model takes {label} as {t}, its source as {np.dtype(dtype)}: the "
                               "importer changed the input's type (--no-import-check compiles it anyway)", where=where)


def check_model_file(module: ir.Module, path: str | Path, examples: Sequence[np.ndarray] | None = None, *,
                     cache: bool = True) -> ImportCheck | None:
    """The check for a model file ``load_model`` imported: ONNX against its source; None for StableHLO
    files (``.mlir``/``.mlirbc``), which have no source to compare with."""
    if Path(path).suffix != ".onnx":
        return None
    return check_import(module, onnx_source(path), examples, where=str(path), cache=cache)


#: How many nodes the import computes wrong ``load_checked`` keeps as ONNX before it gives up.
MAX_KEPT_FOR_CHECK = 4


def load_checked(path: str | Path, context: ir.Context, examples: Sequence[np.ndarray] | None = None, *,
                 check: bool = True, cache: bool = True, where: str | None = None) -> ir.Module:
    """``load_model``, then (where ``check``) ``checked``."""
    module = load_model(path, context)
    return checked(module, path, examples, cache=cache, where=where) if check else module


def checked(module: ir.Module, path: str | Path, examples: Sequence[np.ndarray] | None = None, *,
            cache: bool = True, where: str | None = None) -> ir.Module:
    """The import check of ``module``, imported from the ONNX file at ``path`` (a StableHLO file has no
    source: ``module`` as it is). Where the import computes a node otherwise than its source (a wrong
    lowering: ``Mod`` of mixed signs, ``SpaceToDepth`` CRD), that node is kept as ONNX, run by ONNX Runtime
    inside the program, and the model imported and checked again, up to ``MAX_KEPT_FOR_CHECK`` nodes: the
    module that passes, else the first check's one line (``ImportMismatch``). ``where`` names the model in
    errors (default: ``path``)."""
    path = Path(path)
    if path.suffix != ".onnx":
        return module
    keep: frozenset[str] = frozenset()
    mismatch: CollageError | None = None
    for _ in range(MAX_KEPT_FOR_CHECK + 1):
        try:
            check_import(module, onnx_source(path, keep), examples, where=where or str(path), cache=cache)
            return module
        except ImportMismatch as exc:
            mismatch = mismatch or exc
            node = exc.node
        except ReferenceBuildError as exc:  # IREE rejects an op as imported: the node that gave it is kept
            mismatch = mismatch or exc
            node = first_unbuildable_node(path, keep)
        except CollageError:  # the kept node does not build or run here: the first verdict stands
            if mismatch is None:
                raise
            break
        if node is None or not node.outputs or set(node.outputs) <= keep:
            break
        keep |= frozenset(node.outputs)
        try:
            module = load_model(path, module.context, keep=keep)
        except CollageError:
            break
    raise mismatch


def _verdict_key(module: ir.Module, source: Source, inputs: Sequence[np.ndarray]) -> str:
    h = hashlib.sha256(f"import-check {CHECK_VERSION}\n{source.name}\n{source.digest}\n".encode())
    h.update(hashlib.sha256(module.operation.get_asm(binary=True)).digest())
    for a in inputs:
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(" ".join(_version(p) for p in ("iree-base-compiler", "iree-base-runtime")).encode())
    return h.hexdigest()[:32]


def _from_json(data: dict) -> ImportCheck:
    return ImportCheck(data["source"], tuple(OutputCheck(**o) for o in data["outputs"]), data["node"], cached=True)


def _version(package: str) -> str:
    try:
        return f"{package}={version(package)}"
    except PackageNotFoundError:
        return f"{package}=none"


# --- sources ------------------------------------------------------------------------------------------------


def onnx_source(path: str | Path, keep: frozenset[str] = frozenset()) -> Source:
    """The ONNX model at ``path`` run by ONNX Runtime (its reference evaluator where ONNX Runtime cannot
    load the model); ``locate`` finds the first node whose output differs from the import's (the import
    with the nodes giving a ``keep`` output kept as ONNX)."""
    import onnx

    path = Path(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    engines = " ".join(_version(p) for p in ("onnx", "onnxruntime", "torch-mlir"))
    model = onnx.load(str(path), load_external_data=False)
    names = tuple(o.name for o in model.graph.output)
    constants = {t.name for t in model.graph.initializer}
    inputs = tuple((i.name, onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
                   for i in model.graph.input if i.name not in constants)
    quantized = quantizes(model)
    spread = f" spread nudge {SCALE_NUDGE} steps" if quantized else ""  # a cached verdict is the spread's too
    return Source("onnxruntime", lambda arrays: run_onnx(str(path), arrays, quantized), names,
                  f"{digest} {engines}{spread}",
                  lambda arrays: first_differing_node(path, arrays, keep), inputs)


def run_onnx(model: "str | bytes", inputs: Sequence[np.ndarray], quantized: bool | None = None) -> SourceRun:
    """The outputs of the ONNX model (a path or serialized bytes) on ``inputs`` (its graph inputs that are
    not initializers, in order): ONNX Runtime with graph optimizations off, so no fused kernel stands in
    for the model's ops; where it cannot load the model, ONNX's reference evaluator. A ``quantized`` model
    (None: read off the model) is run fused too, for its spread (``Tolerance``)."""
    import onnx
    import onnxruntime as ort

    try:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001  ORT raises its own Fail/InvalidGraph/NotImplemented types
        ort_why = " ".join(str(exc).split())[-200:]
        from onnx.reference import ReferenceEvaluator

        try:
            proto = onnx.load(model) if isinstance(model, str) else onnx.load_from_string(model)
            evaluator = ReferenceEvaluator(proto)
            constants = {t.name for t in proto.graph.initializer}
            feeds = dict(zip([i.name for i in proto.graph.input if i.name not in constants], inputs))
            return SourceRun("ONNX reference evaluator", [np.asarray(o) for o in evaluator.run(None, feeds)])
        except Exception as ref_exc:  # noqa: BLE001  the reference evaluator raises any type
            raise CollageError(f"onnxruntime cannot load the model ({ort_why}) and ONNX's reference evaluator "
                               f"cannot run it ({' '.join(str(ref_exc).split())[:200]})") from None
    feeds = {i.name: a for i, a in zip(session.get_inputs(), inputs)}
    try:
        outputs = [np.asarray(o) for o in session.run(None, feeds)]
        spread = None
        proto = _proto(model) if quantized is not False else None
        if quantized if quantized is not None else quantizes(proto):
            nudged = _nudged_scales(proto)
            others = [] if nudged is None else [ort.InferenceSession(nudged, options, providers=["CPUExecutionProvider"])]
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            others.append(ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]))
            runs = [other.run(None, feeds) for other in others]
            steps = _output_steps(proto)
            spread = tuple(max([step, *(float(np.abs(np.asarray(run[k], np.float64) - o).max()) for run in runs)])
                           if o.dtype.kind == "f" and o.size else 0.0 for k, (o, step) in enumerate(zip(outputs, steps)))
        return SourceRun("onnxruntime", outputs, spread)
    except Exception as exc:  # noqa: BLE001
        raise CollageError(f"onnxruntime cannot run the model: {' '.join(str(exc).split())[:300]}") from None


#: Node types of a quantized ONNX model: QDQ, QOperator, and dynamic quantization (``quantize_dynamic``:
#: activations quantized at run time, integer kernels; ONNX Runtime's fused forms of them).
QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "QGemm",
                           "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul",
                           "MatMulIntegerToFloat"})


def _proto(model: "str | bytes"):
    import onnx

    return onnx.load(model, load_external_data=False) if isinstance(model, str) else onnx.load_from_string(model)


#: How much of itself each ``QuantizeLinear`` scale is nudged by in the spread's second run (``_nudged_scales``).
SCALE_NUDGE = 1e-5


def _nudged_scales(proto) -> bytes | None:
    """The quantized model with each ``QuantizeLinear`` scale (an initializer in the file) ``1 + SCALE_NUDGE``
    of itself, its ``DequantizeLinear`` unchanged, serialized: the values within ~1e-3 of a step of a rounding
    boundary move one step, as they do where an engine computes ``x * (1/scale)`` for ``x / scale`` or sums in
    another order, and the steps compound through the layers as they do there (an int8 transformer imported by
    IREE: one output step off on 4 of 6 inputs that ONNX Runtime's fused and unfused runs agree on). None for a
    model with external data (not copied)."""
    import onnx
    from onnx import numpy_helper

    inits = {t.name: t for t in proto.graph.initializer}
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
        return None
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    nudged: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and len(node.input) > 1 and node.input[1] in inits:
            scale = node.input[1]
            if scale not in nudged:
                nudged[scale] = f"{scale}_nudged"
                value = numpy_helper.to_array(inits[scale])
                model.graph.initializer.append(numpy_helper.from_array(
                    (value * (1 + SCALE_NUDGE)).astype(value.dtype), nudged[scale]))
            node.input[1] = nudged[scale]
    return model.SerializeToString() if nudged else None


def _output_steps(proto) -> list[float]:
    """Per graph output, the step of the ``DequantizeLinear`` that writes it (through ``Identity``/``Cast``;
    its largest scale, an initializer), else 0: a value at a rounding boundary of the output's own quantizer
    moves one step under any other arithmetic."""
    from onnx import numpy_helper

    inits = {t.name: t for t in proto.graph.initializer}
    producer = {o: n for n in proto.graph.node for o in n.output}
    steps = []
    for output in proto.graph.output:
        node = producer.get(output.name)
        while node is not None and node.op_type in ("Identity", "Cast") and node.input:
            node = producer.get(node.input[0])
        scale = node.input[1] if node is not None and node.op_type == "DequantizeLinear" else None
        steps.append(float(np.abs(numpy_helper.to_array(inits[scale])).max()) if scale in inits else 0.0)
    return steps


def quantizes(proto) -> bool:
    """Whether the ``onnx.ModelProto`` quantizes (``QUANTIZED_OPS``)."""
    return any(n.op_type in QUANTIZED_OPS or n.op_type.startswith("QLinear") for n in proto.graph.node)


def first_differing_node(path: Path, inputs: Sequence[np.ndarray], keep: frozenset[str] = frozenset()
                         ) -> DifferingNode | None:
    """The first node, in the graph's (topological) order, whose output differs between the import (the
    nodes giving a ``keep`` output kept as ONNX) and ONNX Runtime: every node output becomes a graph output,
    the model is imported and run both ways once. None where that model cannot be built, imported or run."""
    import onnx

    model = onnx.load(str(path))
    nodes = list(model.graph.node)
    if len(nodes) == 1:
        return _differing(nodes[0])
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        typed = {v.name: v for v in inferred.graph.value_info}
        outputs = [o.name for o in model.graph.output]
        for node in nodes:
            for name in node.output:
                if name and name in typed and name not in outputs:
                    model.graph.output.append(typed[name])
                    outputs.append(name)
        with tempfile.TemporaryDirectory(prefix="collage-import-check-") as work:
            probe = Path(work) / "probe.onnx"
            onnx.save(model, str(probe))
            imported = load_model(probe, new_context(), keep=keep) if keep else import_onnx(probe, new_context())
            (got,) = invoke_alone(imported, {"main": list(inputs)}).values()
            want = run_onnx(str(probe), inputs, quantized=False).outputs  # the outputs only: no spread
    except (CollageError, ValueError, RuntimeError, onnx.checker.ValidationError):
        return None
    if len(got) != len(outputs) or len(want) != len(outputs):
        return None
    index = {name: k for k, name in enumerate(outputs)}
    for node in nodes:
        for name in node.output:
            k = index.get(name)
            if k is not None and not compare(k, name, got[k], want[k]).ok:
                return _differing(node)
    return None


def first_unbuildable_node(path: Path, keep: frozenset[str] = frozenset()) -> DifferingNode | None:
    """The first node, in the graph's order, after which IREE cannot compile the import's reference program
    (the nodes giving a ``keep`` output kept as ONNX): a bisection on prefixes of the graph, each imported
    with every value it gives an output and built as the reference is. None where the whole model builds or
    a prefix cannot be imported."""
    import onnx

    model = onnx.load(str(path))
    nodes = list(model.graph.node)
    if len(nodes) == 1:
        return _differing(nodes[0])
    types, _ = graph_facts(model)

    class Unimportable(Exception):
        pass

    def builds(k: int) -> bool:
        prefix = write_prefix(model, k, types, work / "prefix.onnx")
        try:
            imported = load_model(prefix, new_context(), keep=keep & {o for n in nodes[:k] for o in n.output})
        except CollageError:
            raise Unimportable from None
        try:
            build_reference(imported, work / "built")
        except ReferenceBuildError:
            return False
        return True

    with tempfile.TemporaryDirectory(prefix="collage-import-check-") as tmp:
        work = Path(tmp)
        try:
            return _differing(nodes[first_failing_prefix(len(nodes), builds) - 1])
        except Unimportable:
            return None


def _differing(node) -> DifferingNode:
    label = f"'{node.name}' ({node.op_type})" if node.name else f"{node.op_type} -> {', '.join(node.output)}"
    return DifferingNode(label, tuple(o for o in node.output if o))


def torch_source(model, example_inputs: Sequence, result=None) -> Source:
    """The eager PyTorch ``model``; ``result``: its output on ``example_inputs`` where the caller has it
    already (the entry point runs the model once for the output's structure), else it is run here."""
    import torch
    from torch.utils import _pytree as pytree

    from ..frontends.torch import model_key, to_numpy

    if result is None:
        try:
            with torch.no_grad():
                result = model(*example_inputs)
        except Exception as exc:  # noqa: BLE001  the user's model: whatever it raises is one line
            why = " ".join(str(exc).split())[:200]
            raise CollageError(f"the model itself fails on inputs of shapes "
                               f"{[list(getattr(x, 'shape', ())) for x in example_inputs]}: "
                               f"{type(exc).__name__}: {why}") from None
    leaves = [(pytree.keystr(p), t) for p, t in pytree.tree_flatten_with_path(result)[0] if isinstance(t, torch.Tensor)]

    spread = _quantized_spread(model, example_inputs, [t for _, t in leaves]) if pt2e_quantized(model) else None

    def run(inputs: Sequence[np.ndarray]) -> SourceRun:
        # The check runs on the example inputs (given inputs are used as they are): ``result`` is on them.
        return SourceRun("torch eager", [to_numpy(t) for _, t in leaves], spread)

    return Source("torch eager", run, tuple(name for name, _ in leaves), model_key(model, example_inputs))


#: The relative nudges of a PT2E model's float inputs whose effect on its outputs is its spread.
NUDGES = (1e-4, -1e-4)


def _quantized_spread(model, example_inputs: Sequence, outputs: list) -> tuple[float, ...]:
    """A PT2E-quantized model's spread (``Tolerance``): how far its outputs move when its float inputs are
    nudged by 1e-4 of themselves. Values inside near a quantization boundary then move one step, as they
    do under another engine's accumulation order or its ``x * (1/scale)`` for ``x / scale``; the nudge is
    larger than those changes (1e-7), so that a small model's few boundary values are found too."""
    import torch
    from torch.utils import _pytree as pytree

    spread = [0.0] * len(outputs)
    with torch.no_grad():
        for nudge in NUDGES:
            moved = [x * (1 + nudge) if torch.is_floating_point(x) else x for x in example_inputs]
            leaves = [t for t in pytree.tree_leaves(model(*moved)) if isinstance(t, torch.Tensor)]
            for k, (a, b) in enumerate(zip(leaves, outputs)):
                if torch.is_floating_point(b) and b.numel():
                    spread[k] = max(spread[k], float((a.double() - b.double()).abs().max()))
    return tuple(spread)


def jax_source(fn: Callable, example_args: Sequence) -> Source:
    """The user's JAX function under ``jax.jit`` (its module is the lowering of that same jit)."""
    import jax

    def run(inputs: Sequence[np.ndarray]) -> SourceRun:
        _, tree = jax.tree_util.tree_flatten(example_args)
        args = jax.tree_util.tree_unflatten(tree, list(inputs))
        return SourceRun("jax.jit", [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(jax.jit(fn)(*args))])

    shapes = jax.eval_shape(fn, *example_args)
    names = tuple(jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(shapes)[0])
    return Source("jax.jit", run, names, f"jax={jax.__version__}")
