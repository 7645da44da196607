"""Compile driver for a model with dynamic dims: one artifact per shape bucket, under one ``shapes.json``.

    for each bucket (a value of every declared dim):
        the model specialised to it → its plan (given, or tuned for that shape) → artifact.compile_module
    + the fallback model (an engine that takes dynamic dims) + shapes.json (collage_runtime.shapes)
    + weights.bin: every distinct weight of the buckets' ONNX regions and the fallback, written once
      (collage_runtime.weights)

Every bucket goes through the static pipeline unchanged, so a bucket runs exactly as a static compile of
that shape would. Tuning the buckets shares the cost DB: a region whose shape does not depend on the dims
(the weights' side of a network, a static head) is measured once for all of them.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from collage_runtime.engines import Engines, engine_message, usable_cores
from collage_runtime.manifest import ArtifactError, sha256_file, write_manifest
from collage_runtime.rt_module import RegionFailure
from collage_runtime.shaped import ShapedProgram, dynamic_runner
from collage_runtime.shapes import (Axes, Bucket, Fallback, ShapeTable, cut_to, dims_label, pad_to,
                                    write_shape_table)
from collage_runtime.types import byte_dtype
from collage_runtime.weights import WEIGHTS, WeightWriter

from .artifact import CompileResult, compile_module, staged
from .backends import get_backend, registry
from .backends.iree_codegen import iree_compile
from .backends.onnx_engine import OnnxGraphBackend
from .dialects import collage
from .errors import CollageError
from .frontends import refine
from .frontends.dims import (PYTHON, DimPlan, check_declared, input_values, read_onnx_axes, specialise_onnx,
                              workdir)
from .frontends.onnx_calibrate import openvino_ready
from .graph import Graph, main_func, main_type, number_ops
from .ir import ir, load_module, new_context
from .measure.import_check import FLOAT_TOLERANCE, compare, load_checked, quantizes
from .measure.reference import generated_array
from .measure.validate import QUANT_RTOL
from .onnx import translate
from .plan import Plan
from .search import resolve_plan

BUCKETS = "buckets"


@dataclass(frozen=True)
class BucketModel:
    """One bucket's model, ready to compile: the specialised module and the plan chosen for it."""

    module: ir.Module
    plan: Plan
    provenance: Mapping | None = None


@dataclass(frozen=True)
class ShapedResult:
    out_dir: Path
    table: ShapeTable
    buckets: tuple[CompileResult, ...]


def compile_shaped(dim_plan: DimPlan, inputs: Axes, bucket_model: Callable[[dict[str, int]], BucketModel],
                   out_dir: str | Path, *, fallback_model: Path | None = None, fallback: Fallback = Fallback.NONE,
                   source: str = "<module>", on_bucket: Callable[[dict[str, int], CompileResult], None] | None = None,
                   check: Callable[[Path], None] | None = None, translated: bool | None = None,
                   **compile_kwargs) -> ShapedResult:
    """Compiles every bucket of ``dim_plan`` (``bucket_model(values)`` gives its module and plan) into
    ``out_dir`` (a directory, or one ``.collage`` file), with ``fallback_model`` (the model file with its
    dynamic dims, ONNX or StableHLO) run by the ``fallback`` engine for shapes no bucket or padding serves.
    ``inputs``: which input axes carry which dim. Refused before anything is built: a range some shape of
    which nothing serves. A StableHLO module's fallback (IREE's dynamic program, or the module translated
    to ONNX), and any ``translated`` one (an ONNX model some exporter wrote from the model's source), is
    checked against the OPT bucket's program at that shape (``check_fallback``). ``check``, where
    given, runs on the staged artifact last (an int8 model's program check); what it raises leaves nothing
    written."""
    if (fallback is Fallback.NONE) != (fallback_model is None):
        raise ValueError("a fallback engine goes with a fallback model")
    dim_plan.require_served(fallback is not Fallback.NONE)
    out = Path(out_dir)
    with staged(out) as stage:
        results, buckets, shapes = [], [], []
        weights = WeightWriter(stage / WEIGHTS)
        fallback_sha = None
        if fallback_model is not None:  # first: a model the engine cannot take fails before any bucket compiles
            target = stage / fallback.file
            target.parent.mkdir(parents=True)
            if fallback is Fallback.IREE:
                target.write_bytes(_iree_dynamic(fallback_model))
            else:
                with workdir() as tmp:
                    _write_sharing(_runnable(fallback_model, fallback, Path(tmp)), target, weights)
            fallback_sha = sha256_file(target)
        for values in dim_plan.grid():
            model = bucket_model(values)
            shapes.append(_result_shapes(model.module))
            path = f"{BUCKETS}/{_digest(values)}"
            result = compile_module(model.module, model.plan, stage / path, source=source,
                                    provenance=dict(model.provenance or {}) | {"bucket": values}, **compile_kwargs)
            result = share_weights(result, stage / path, weights)
            results.append(result)
            buckets.append(Bucket(values, path))
            if on_bucket is not None:
                on_bucket(values, result)
        outputs = output_axes(dim_plan, [b.values for b in buckets], shapes)
        store = weights.close()
        if not weights.size:  # nothing large enough to share
            (stage / WEIGHTS).unlink()
            store = None
        table = ShapeTable(dim_plan.dims, inputs, outputs, tuple(buckets), dim_plan.pad, fallback, fallback_sha,
                           weights_sha256=store)
        write_shape_table(stage, table)
        if translated is None:
            translated = fallback_model is not None and fallback_model.suffix != ".onnx"
        if fallback_model is not None or dim_plan.pad:  # on the staged artifact, loaded once; not written if it fails
            with _staged_program(stage, source) as program:
                if fallback_model is not None:
                    opt = {d.name: d.opt for d in dim_plan.dims}
                    check_fallback(program, next((b for b in buckets if dict(b.values) == opt), buckets[0]), source,
                                   compare=translated)
                if dim_plan.pad:
                    check_padding(program, source)
        if check is not None:
            check(stage)
    return ShapedResult(out, table, tuple(results))


def share_weights(result: CompileResult, bucket_dir: Path, weights: WeightWriter) -> CompileResult:
    """Moves the weights of the bucket's ONNX regions (those the graph-engine backends built) into the
    artifact's weight store, each distinct tensor once across buckets; rewrites the bucket's manifest with
    the regions' new SHA-256."""
    import onnx

    regions = []
    for region in result.manifest.regions:
        if isinstance(get_backend(region.backend), OnnxGraphBackend):
            path = bucket_dir / region.artifact
            model = onnx.load_from_string(path.read_bytes())
            if weights.externalize(model):
                path.write_bytes(model.SerializeToString())
                region = replace(region, sha256=sha256_file(path))
        regions.append(region)
    manifest = replace(result.manifest, regions=tuple(regions))
    write_manifest(bucket_dir, manifest)
    return replace(result, manifest=manifest)


def _write_sharing(model: Path, target: Path, weights: WeightWriter) -> None:
    """The ONNX model at ``model`` written to ``target`` as one file whose weights are in the artifact's
    store (torch's dynamo exporter writes its own external data, ``model.onnx.data``, beside the model:
    it is read and moved into the store too)."""
    import onnx

    proto = onnx.load(str(model))  # reads the external data from beside the model
    weights.externalize(proto)
    onnx.save(proto, str(target))


def model_file_axes(path: str | Path) -> tuple[Axes, Path]:
    """Which input axes of a model file carry which dynamic dims (an ONNX model's ``dim_param``s, a StableHLO
    module's ``?`` axes: ``frontends.refine``), and the model an engine that takes dynamic dims runs between
    buckets: the file itself (``fallback_kinds`` says which engines take it)."""
    if Path(path).suffix == ".onnx":
        return read_onnx_axes(path)[0], Path(path)
    return refine.module_axes(load_module(path, new_context())), Path(path)


def fallback_kinds(model: Path, bf16: bool = False) -> tuple[Fallback, ...]:
    """The engines that may run ``model`` with its dynamic dims: ONNX Runtime and OpenVINO an ONNX model; a
    StableHLO module IREE (``frontends.refine.for_iree``), and ONNX Runtime and OpenVINO where its ops
    translate to ONNX with dynamic dims (``dynamic_onnx``); with ``bf16`` (the user allows it) OpenVINO in
    bf16 too, where its backend is usable here (``openvino-bf16``)."""
    kinds = (Fallback.ORT, Fallback.OPENVINO) if model.suffix == ".onnx" else \
        (Fallback.IREE, Fallback.ORT, Fallback.OPENVINO)
    if bf16 and not registry()[Fallback.OPENVINO_BF16.value].problem:
        kinds += (Fallback.OPENVINO_BF16,)
    return kinds


def dynamic_onnx(module: ir.Module, where: str):
    """The StableHLO ``module``'s ``@main`` as an ONNX model with its dynamic dims kept (``refine.prepared``,
    then ``onnx.translate(dynamic=True)``): ONNX Runtime and OpenVINO run it between buckets. One
    CollageError naming the first op the translation does not take."""
    ready = refine.prepared(module, where=where)
    main = main_func(ready)
    if main is None:
        raise CollageError("the module has no @main function", where=where)
    return translate(main, dynamic=True)


def _iree_dynamic(model: Path, values: Mapping[str, int] | None = None) -> bytes:
    """IREE's CPU program of the StableHLO module at ``model``: with its dynamic dims (``dynamic_program``),
    or specialised to ``values``."""
    if values is not None:
        return iree_compile(refine.load(model, new_context(), values), quiet=True)
    return dynamic_program(load_module(model, new_context()), str(model))


def dynamic_program(module: ir.Module, where: str) -> bytes:
    """IREE's CPU program of the StableHLO ``module`` with its dynamic dims kept (``refine.for_iree``); one
    CollageError where IREE cannot compile it."""
    try:
        return iree_compile(refine.for_iree(module, where=where), quiet=True)
    except CollageError as exc:
        raise CollageError(f"IREE cannot compile the module with its dynamic dims ({exc}); list every value "
                           "among the buckets (--bucket, buckets=), or declare the dim paddable (--pad, pad=)",
                           where=where) from None


def fastest_dynamic(module: ir.Module, where: str, arrays: Sequence[np.ndarray], want: Sequence[np.ndarray],
                    bucket: str, directory: Path, repeats: int = 5, slack: float = 0.0) -> Callable:
    """Of the engines that run the StableHLO ``module`` with its dynamic dims (IREE's program of it, its ONNX
    translation on ONNX Runtime and OpenVINO: ``fallback_kinds``), the fastest on ``arrays`` (median of
    ``repeats`` calls) among those that give ``want`` there (bucket ``bucket``'s results, within ``slack`` of
    each output's scale beyond f32's tolerance: ``plan_slack``); their files are
    written into ``directory``. An engine that cannot take the module, or disagrees, is left out with a
    warning saying why; one CollageError where none is left."""
    import warnings

    runners, problems = {}, []
    for kind in (Fallback.IREE, Fallback.ORT, Fallback.OPENVINO):
        try:
            run = dynamic_runner(kind, _dynamic_file(lambda: module, kind, directory, where),
                                 Engines(usable_cores(), sole=kind.value))
            check_agrees(f"{kind.value} on the dynamic module disagrees with bucket {bucket} at its shape",
                         run(arrays), want, where, slack)
            runners[kind] = run
        except Exception as exc:  # noqa: BLE001  an engine that cannot take the module is routed around
            problems.append(f"{kind.value}: {' '.join(str(exc).split())[:160]}")
    if problems and runners:
        warnings.warn(f"between buckets, left out: {'; '.join(problems)}", RuntimeWarning, stacklevel=3)
    if not runners:
        raise CollageError(f"no engine runs the module with its dynamic dims ({'; '.join(problems)}); list every "
                           "value among the buckets, or declare the dim paddable", where=where)
    times = _median_times(runners, arrays, repeats)
    return runners[min(times, key=times.get)]


def _median_times(runners: Mapping, arrays: Sequence[np.ndarray], repeats: int) -> dict:
    """Median seconds per call of each of ``runners`` (key → ``run(arrays)``), after one call each to warm it
    (an engine with dynamic dims compiles for a new shape on its first call), in ``repeats`` interleaved
    rounds: a machine that slows for a while slows every engine alike."""
    samples: dict = {key: [] for key in runners}
    for run in runners.values():
        run(arrays)
    for _ in range(repeats):
        for key, run in runners.items():
            start = time.perf_counter()
            run(arrays)
            samples[key].append(time.perf_counter() - start)
    return {key: float(np.median(s)) for key, s in samples.items()}


def check_agrees(what: str, got: Sequence[np.ndarray], want: Sequence[np.ndarray], where: str,
                 plan_rtol: float = 0.0) -> None:
    """A fallback's results ``got`` against a bucket's ``want`` on the same inputs (``measure.import_check
    .compare``'s tolerance, plus ``plan_rtol`` of each output's scale: what the bucket's plan may differ from
    f32 by); one CollageError, saying ``what`` disagrees, where an output differs."""
    for k, (g, w) in enumerate(zip(got, want)):
        check = compare(k, f"result {k}", g, w, scale_slack=plan_rtol)
        if not check.ok:
            raise CollageError(f"{what}: result {k}: {check.detail}", where=where)


def _runnable(model: Path, kind: Fallback, directory: Path) -> Path:
    """The file ``kind``'s engine runs for ``model``: an ONNX model itself (for OpenVINO, its quantizer's pairs on
    scalar constants folded: ``onnx_calibrate.openvino_ready``); for a StableHLO module, IREE's dynamic program
    of it or its ONNX translation (``dynamic_onnx``), made in ``directory`` once."""
    if model.suffix == ".onnx":
        return openvino_ready(model, directory) if kind in (Fallback.OPENVINO, Fallback.OPENVINO_BF16) else model
    return _dynamic_file(lambda: load_module(model, new_context()), kind, directory, str(model))


def _dynamic_file(module: Callable[[], ir.Module], kind: Fallback, directory: Path, where: str) -> Path:
    """What ``kind``'s engine runs for a StableHLO module with its dynamic dims (``module()`` reads it):
    IREE's program of it (``dynamic_program``) or its ONNX translation (``dynamic_onnx``), made in
    ``directory`` once."""
    target = directory / ("dynamic.vmfb" if kind is Fallback.IREE else "dynamic.onnx")
    if not target.exists():
        target.write_bytes(dynamic_program(module(), where) if kind is Fallback.IREE
                           else dynamic_onnx(module(), where).SerializeToString())
    return target


def _staged_program(root: Path, where: str) -> ShapedProgram:
    """The staged shaped artifact at ``root``, loaded; one CollageError naming ``where`` (the model) where the
    fallback's engine cannot load its model (an ONNX IR version newer than the engine's, say)."""
    try:
        return ShapedProgram(root)
    except ArtifactError as exc:
        raise CollageError(f"the fallback engine cannot load the model: {str(exc).replace(f'{root}/', '')}",
                           where=where) from None


def check_fallback(program: ShapedProgram, bucket: Bucket, where: str, compare: bool = True) -> None:
    """The fallback of the loaded shaped artifact ``program`` run at ``bucket``'s shape on generated inputs: one
    CollageError naming ``where`` (the model) where its engine cannot load or run the model (an ONNX IR
    version newer than the engine's, say) or, with ``compare`` (a fallback translated from the model), where
    an output differs from the bucket's program (``measure.import_check.compare``'s tolerance; where the
    bucket's plan has regions on a backend looser than that, a bf16 one, the plan's own: 10x its loosest
    region's, as a tune validates plans)."""
    kind = program.table.fallback
    bucket_program = program.program(bucket)
    tolerances = [r.tolerance.rtol for r in bucket_program.manifest.regions]
    if kind is Fallback.OPENVINO_BF16:
        tolerances.append(get_backend(kind.value).tolerance.rtol)
    arrays = [generated_array(s.shape, s.dtype, np.random.default_rng(k))
              for k, s in enumerate(bucket_program.signature("main").inputs)]
    try:
        got = [np.array(g) for g in program.invoke_fallback(*arrays)]
    except (ArtifactError, RegionFailure) as exc:
        raise CollageError(f"the {kind.value} fallback cannot run the model: {exc}", where=where) from None
    if not compare:
        return
    want = [np.array(w) for w in bucket_program.invoke("main", *arrays)]
    check_agrees(f"the {kind.value} fallback disagrees with bucket {dims_label(bucket.values)} at its shape", got,
                 want, where, plan_slack(tolerances))


def check_padding(program: ShapedProgram, where: str) -> None:
    """Each padded dim of the loaded shaped artifact ``program`` checked to pad exactly
    (``check_padding_exact``) on generated inputs: from the smallest to the largest of two buckets that differ
    in that dim alone (else from the dim's MIN within the largest bucket). A dim that leads every input
    carrying it is a batch: its rows must be independent; another (a sequence) may instead be padded
    neutrally (``batch_like``)."""
    table = program.table
    for dim in (d for d in table.dims if d.name in table.pad):
        pairs = [(a, b) for a, b in itertools.permutations(table.buckets, 2) if a.values[dim.name] <
                 b.values[dim.name] and all(a.values[n] == b.values[n] for n in a.values if n != dim.name)]
        small, big = min(pairs, key=lambda p: (p[0].values[dim.name], -p[1].values[dim.name]), default=(
            None, max(table.buckets, key=lambda b: b.values[dim.name])))
        programs = [program.program(b) for b in (small, big) if b is not None]
        tolerances = [r.tolerance.rtol for p in programs for r in p.manifest.regions]
        specs = programs[-1].signature("main").inputs
        arrays = [generated_array(s.shape, s.dtype, np.random.default_rng(k)) for k, s in enumerate(specs)]
        check_padding_exact(lambda xs: programs[-1].invoke("main", *xs),
                            None if small is None or batch_like(table.inputs, dim.name)
                            else lambda xs: programs[0].invoke("main", *xs),
                            arrays, table.inputs, table.outputs, big.values,
                            {**big.values, dim.name: dim.min if small is None else small.values[dim.name]},
                            dim.name, where, plan_slack(tolerances))


def batch_like(inputs: Axes, name: str) -> bool:
    """Whether dim ``name`` is the leading axis of every input that carries it (a batch: padding it is exact
    only where its rows are independent; a sequence, padded under an attention mask, need not be)."""
    return all(axes and axes[0] == name for axes in inputs if name in axes)


def check_padding_exact(run: Callable[[list], Sequence], run_small: Callable[[list], Sequence] | None, arrays: list,
                        inputs: Axes, outputs: Axes, values: Mapping[str, int], small: Mapping[str, int], name: str,
                        where: str, slack: float = 0.0) -> None:
    """That padding along dim ``name`` is exact, as ``--pad`` claims, in one of two ways: ``run`` (a program at
    the shape ``values``) gives the first rows (up to ``small``'s value of the dim) the same results when the
    rows after them are replaced by others (rows independent: a batch; the same program at the same shape, so
    ``compare``'s f32 tolerance); or, where that fails and ``run_small`` runs the shape ``small``, ``run`` on
    those first rows zero-padded gives what ``run_small`` gives on them (padding neutral: a sequence whose
    padded positions an attention mask of 0 hides; two programs, so ``slack`` of each output's scale beyond
    f32's as well; not asked of a batch, ``batch_like``: on generated inputs a statistic's zero-padded rows may
    stay within the real rows' range and pass, where real data would not). One CollageError naming the dim where neither holds: a statistic over it (dynamic
    quantization's int8 scale of a whole tensor, a mean over the batch) makes a padded call differ."""
    first = small[name]
    if first >= values[name]:
        return
    others = [generated_array(np.shape(a), np.asarray(a).dtype, np.random.default_rng(len(arrays) + k))
              for k, a in enumerate(arrays)]
    mixed = [np.where(_rows_past(np.shape(a), axes, name, first), o, a) for a, o, axes in zip(arrays, others, inputs)]

    def cut(results):
        return [np.array(cut_to(np.asarray(r), axes, small)) for r, axes in zip(results, outputs)]

    what = f"--pad {name}: padding changes the results (at {dims_label(values)} the first {first} rows along " \
           f"'{name}' change with the rows after them"
    why = f": a statistic over the dim, such as dynamic quantization's scale; drop --pad {name})"
    try:
        check_agrees(what + (why if run_small is None else ")"), cut(run(mixed)), cut(run(arrays)), where)
    except CollageError:
        if run_small is None:
            raise
        rows = [np.array(cut_to(a, axes, small)) for a, axes in zip(arrays, inputs)]
        check_agrees(f"{what}, and zero-padded from {dims_label(small)} they differ from that shape's own{why}",
                     cut(run([pad_to(a, axes, values) for a, axes in zip(rows, inputs)])),
                     [np.asarray(r) for r in run_small(rows)], where, slack)


def _rows_past(shape: tuple[int, ...], axes: tuple[str | None, ...], name: str, first: int) -> np.ndarray:
    """A boolean mask of ``shape``: True where an index along an axis carrying ``name`` is ``first`` or more."""
    mask = np.zeros(shape, dtype=bool)
    for k, n in enumerate(axes):
        if n == name:
            index = [slice(None)] * len(shape)
            index[k] = slice(first, None)
            mask[tuple(index)] = True
    return mask


def plan_slack(tolerances: Sequence[float]) -> float:
    """What a bucket's plan may differ from f32 by, as a share of each output's scale, given its regions'
    relative tolerances: none where each is within f32's; else 10x the loosest (a bf16 region's), as a tune
    validates a plan."""
    loosest = max(tolerances, default=0.0)
    return 10 * loosest if loosest > FLOAT_TOLERANCE.rtol else 0.0


def load_bucket(path: str | Path, values: Mapping[str, int], context, *, check_import: bool = True,
                inputs: Sequence[np.ndarray] = ()) -> ir.Module:
    """The model file at ``path`` specialised to ``values`` (``frontends.dims`` for ONNX, ``frontends.refine``
    for StableHLO), imported and numbered; ``check_import``: an ONNX model checked against ONNX Runtime on
    ``inputs`` (default: generated) at that shape."""
    where = f"{path} at {dims_label(values)}"
    if Path(path).suffix != ".onnx":
        module = refine.load(path, context, values)
    else:
        with workdir() as tmp:
            static = specialise_onnx(path, values, tmp)
            try:
                module = load_checked(static, context, list(inputs) or None, check=check_import, where=where)
            except CollageError as exc:  # named by the user's model, not the temporary copy
                raise CollageError(str(exc).replace(f"{static}: ", "").replace(f"{where}: ", ""),
                                   where=where) from None
            if collage.OnnxSource.of(module) is not None:  # the user's file, which outlives the copy
                collage.OnnxSource.of_file(path, tuple(values.items())).attach(module)
    number_ops(module)
    return module


def file_fallback(dynamic_model: Path, dim_plan: DimPlan, axes: Axes, agree_on: Sequence[np.ndarray] | None = None,
                  f32: Path | None = None) -> tuple[Fallback, Path | None]:
    """What serves the shapes between ``dim_plan``'s buckets of a model file, and the model it runs: none where
    buckets and padding serve every shape, else the fastest engine on ``dynamic_model``, or on ``f32`` (the f32
    model an int8 one was quantized from) where that is faster (``choose_fallback``)."""
    if dim_plan.unserved(fallback=False) is None:
        return Fallback.NONE, None
    choice = choose_fallback(dynamic_model, dim_plan, axes, agree_on=agree_on, f32=f32)
    return choice.chosen, f32 if choice.f32 else dynamic_model


def compile_file_shaped(path: str | Path, dim_plan: DimPlan, plan: "str | Plan", out_dir: str | Path, *,
                        fallback: Fallback | None = None, check_import: bool = True, **compile_kwargs) -> ShapedResult:
    """A model file with dynamic dims (ONNX or StableHLO) compiled into one artifact of shape buckets, every
    bucket placed by ``plan`` (a plan spec such as ``whole:openvino``, or a ``Plan``); ``fallback``: the
    engine for shapes between buckets (None, where buckets and padding leave a gap: of ``fallback_kinds``,
    the fastest, timed where there are several)."""
    axes, dynamic_model = model_file_axes(path)
    check_declared(axes, dim_plan.dims, PYTHON)  # the Python API's
    if fallback is None:
        fallback = file_fallback(dynamic_model, dim_plan, axes)[0]

    def bucket(values: dict[str, int]) -> BucketModel:
        module = load_bucket(path, values, new_context(), check_import=check_import)
        return BucketModel(module, resolve_plan(plan, Graph(module)), {"plan": getattr(plan, "source", plan)})

    return compile_shaped(dim_plan, axes, bucket, out_dir, fallback=fallback, source=str(path),
                          fallback_model=None if fallback is Fallback.NONE else dynamic_model, **compile_kwargs)


def output_axes(dim_plan: DimPlan, buckets: list[Mapping[str, int]], shapes: list[list[tuple[int, ...]]]) -> Axes:
    """Which output axes carry which dim, read from the buckets' static result shapes: an axis is dim ``d``
    where its size changes between buckets and equals ``d``'s value in every one (and no other dim's). A
    padded dim must be read from at least two of its values, and between two buckets that differ in it
    alone, only the axes that carry it may change (an axis of size 2*batch could not be sliced back):
    else one CollageError."""
    names = [d.name for d in dim_plan.dims]
    out = []
    for k, first in enumerate(shapes[0]):
        axes = []
        for axis in range(len(first)):
            sizes = [s[k][axis] for s in shapes]
            match = [n for n in names if all(b[n] == size for b, size in zip(buckets, sizes))]
            axes.append(match[0] if len(match) == 1 and len(set(sizes)) > 1 else None)
        out.append(tuple(axes))
    for name in dim_plan.pad:
        if len(dim_plan.values[name]) < 2:
            raise CollageError(f"--pad {name} needs at least two bucket values of '{name}' (to read which output "
                               "axes carry it)", where="--pad")
        for i, j in itertools.combinations(range(len(buckets)), 2):
            if [n for n in names if buckets[i][n] != buckets[j][n]] != [name]:
                continue
            for k, axes in enumerate(out):
                for axis, carried in enumerate(axes):
                    if carried != name and shapes[i][k][axis] != shapes[j][k][axis]:
                        raise CollageError(f"output {k} axis {axis} changes with '{name}' but is not '{name}' "
                                           f"(sizes {shapes[i][k][axis]}, {shapes[j][k][axis]}): padding cannot be "
                                           "undone there; drop --pad", where="--pad")
    return tuple(out)


@dataclass(frozen=True)
class EngineChoice:
    """The engine timed fastest on a model (``choose_fallback`` between buckets, ``int8_plan`` for an int8 model's
    program): ``chosen`` (None: none ran) on the model itself or, with ``f32``, on the f32 model an int8 one was
    quantized from; the seconds per call of each engine that ran on the model (``times``) and on the f32 model
    (``f32_times``: empty where it was not timed), and why each other one did not run."""

    chosen: Fallback | None
    times: Mapping[Fallback, float] = field(default_factory=dict)
    failed: tuple[str, ...] = ()
    f32_times: Mapping[Fallback, float] = field(default_factory=dict)
    f32: bool = False

    @property
    def plan(self) -> str:
        """The plan of an int8 model's program: whole on the engine chosen, else IREE's default."""
        return "default" if self.chosen is None else f"whole:{self.chosen.value}"

    @property
    def precision(self) -> str:
        """What an int8 model's program computes in, as its manifest's provenance records it."""
        return "f32" if self.f32 else "int8"

    def line(self, where: str = "between buckets") -> str:
        """The choice as the CLI prints it."""
        ran = ", ".join([f"{k.value} {v * 1e3:.2f} ms" for k, v in self.times.items()]
                        + [f"{p} (failed)" for p in self.failed])
        if self.f32_times:
            ran += "; on the f32 model: " + ", ".join(f"{k.value} {v * 1e3:.2f} ms" for k, v in self.f32_times.items())
        chosen = "none" if self.chosen is None else self.chosen.value + (" on the f32 model" if self.f32 else "")
        return f"{where}: {ran} → {chosen}"

    def int8_line(self, where: str = "int8 engines") -> str:
        """The choice of an int8 model's program as the CLI prints it (``int8_plan``)."""
        if self.chosen is None:
            return f"no int8 engine runs the model ({'; '.join(self.failed)}): IREE computes it in f32"
        if self.f32:
            return (f"{self.line(where)}: the program computes in f32, faster here than every int8 engine (and "
                    "within any accuracy bound)")
        return f"{self.line(where)}: --plan {self.plan} (IREE computes int8 models in f32; --plan default keeps it there)"


def choose_fallback(model: Path, dim_plan: DimPlan, inputs: Axes, kinds: Sequence[Fallback] | None = None,
                    repeats: int = 5, agree_on: Sequence[np.ndarray] | None = None, f32: Path | None = None
                    ) -> EngineChoice:
    """The engine of ``kinds`` (default ``fallback_kinds(model)``, f32 ones) that runs ``model`` (dynamic dims kept)
    fastest, timed at a shape between buckets (each dim at the middle of its widest gap, or its OPT value
    where there is none); of an int8 model, on ``f32`` too, the f32 model it was quantized from, where given
    (``_fastest``). An engine that fails to load or run, or on a quantized model disagrees with ONNX
    Runtime (on ``agree_on``, the user's inputs, where given: ``_runners``), is left out (and said why); a
    CollageError when none runs."""
    kinds = tuple(kinds or fallback_kinds(model))
    if len(kinds) == 1 and f32 is None:  # nothing to choose; compile_shaped builds it first and checks it
        return EngineChoice(kinds[0])
    values = {d.name: _between(d, dim_plan.values[d.name]) for d in dim_plan.dims}
    choice = _fastest(model, inputs, values, kinds, repeats, agree_on, f32)
    if choice.chosen is None:
        raise CollageError(f"no fallback engine runs the model with dynamic dims ({'; '.join(choice.failed)}); "
                           "list every value with --bucket, or declare --pad", where=str(model))
    return choice


def _fastest(model: Path, inputs: Axes, values: Mapping[str, int], kinds: Sequence[Fallback], repeats: int,
             agree_on: Sequence[np.ndarray] | None = None, f32: Path | None = None) -> EngineChoice:
    """The engine of ``kinds`` that runs ``model`` fastest at the dims ``values`` (``_runners``, ``_median_times``);
    with ``f32`` (the f32 model the int8 ``model`` was quantized from: the same inputs), the engines on it too,
    timed in the same rounds: f32 is within any accuracy bound, so where an engine runs it faster than every
    int8 engine runs the int8 model (ONNX Runtime's int8 on a transformer: 2x its f32), it is chosen."""
    with workdir() as name:
        tmp = Path(name)
        runners, arrays, problems = _runners(model, inputs, values, kinds, tmp, agree_on=agree_on)
        runs = {(k, False): r for k, r in runners.items()}
        if f32 is not None:
            (tmp / "f32").mkdir()
            more, _, failed = _runners(f32, inputs, values, kinds, tmp / "f32")
            runs |= {(k, True): r for k, r in more.items()}
            problems += [f"{p} on the f32 model" for p in failed]
        times = _median_times(runs, arrays, repeats)
    if not times:
        return EngineChoice(None, failed=tuple(problems))
    kind, in_f32 = min(times, key=times.get)
    return EngineChoice(kind, {k: v for (k, f), v in times.items() if not f}, tuple(problems),
                        {k: v for (k, f), v in times.items() if f}, in_f32)


#: The engines that run an int8 model's integer kernels (IREE computes its quantize/dequantize pairs in f32).
INT8_ENGINES = (Fallback.ORT, Fallback.OPENVINO)


def int8_plan(model: Path, values: Mapping[str, int] | None, repeats: int = 5,
              agree_on: Sequence[np.ndarray] | None = None, f32: Path | None = None) -> EngineChoice:
    """Where the program of the int8 ONNX ``model`` runs when the user gives no plan (``.plan``, said by
    ``.int8_line()``): the whole model on the engine of ``INT8_ENGINES`` that runs it fastest at the dims
    ``values`` (``module_values``; generated inputs; collage runs the engine's own int8 speed, ``studies/int8``)
    of those agreeing with ONNX Runtime (``_runners``; on ``agree_on``, the user's inputs, where given); with
    ``f32``, the f32 model it was quantized from, on an engine of those where that is faster still (``_fastest``:
    precision placed as engines are); else IREE's ``default`` where none runs it or ``values`` is None (IREE
    computes the quantize/dequantize pairs in f32: ResNet-50 27x slower than OpenVINO's int8)."""
    if values is None:
        return EngineChoice(None, failed=("the int8 model's inputs are not the program's",))
    return _fastest(model, read_onnx_axes(model)[0], values, INT8_ENGINES, repeats, agree_on, f32)


def int8_bucket_plan(model: Path, values: Mapping[str, int], agree_on: Sequence[np.ndarray] | None = None,
                     f32: Path | None = None) -> EngineChoice:
    """``int8_plan`` of the int8 ``model`` with dynamic dims (and of ``f32``, the model it was quantized from) at
    one bucket's ``values`` (``agree_on``: the user's inputs at that shape): each specialised to it first, so
    static, as the bucket runs: OpenVINO's int8 kernels computed a JAX transformer's masked mean right with the
    dims kept and 84 % of the output's scale off at a static length."""
    with workdir() as name:
        tmp = Path(name)
        (tmp / "f32").mkdir()
        return int8_plan(specialise_onnx(model, values, tmp), values, agree_on=agree_on,
                         f32=None if f32 is None else specialise_onnx(f32, values, tmp / "f32"))


def module_values(model: Path, module: ir.Module) -> dict[str, int] | None:
    """The values ``module`` (the ONNX ``model`` imported at one shape) gives the model's dynamic dims; None
    where its inputs are not the model's."""
    axes, shapes = read_onnx_axes(model)[0], _argument_shapes(module)
    if len(axes) != len(shapes) or any(len(a) != len(s) for a, s in zip(axes, shapes)):
        return None
    values = input_values(axes, shapes)
    return values if all(n in values for names in axes for n in names if n is not None) else None


def dynamic_ratio(model: Path, dim_plan: DimPlan, inputs: Axes, fallback: Fallback, repeats: int = 5) -> float:
    """How much slower the ``fallback`` engine runs the dynamic ``model`` than a static program would: its
    time over the static model's (an ONNX model specialised to the shape on the faster of ONNX Runtime and
    OpenVINO, the engines a bucket's plan places; a StableHLO module refined to it, on IREE), the mean at
    the OPT shape and at the MIN shape (small shapes lose the most to dynamism: BERT-base 1x16 1.17x, 1x64
    1.04-1.10x); infinite without a fallback."""
    if fallback is Fallback.NONE:
        return float("inf")
    ratios = []
    opt = {d.name: d.opt for d in dim_plan.dims}
    with workdir() as name:
        tmp = Path(name)
        for values in (opt, {d.name: d.min for d in dim_plan.dims}):
            if ratios and values == opt:
                continue
            dynamic, problems = _engine_times(model, inputs, values, [fallback], repeats, tmp)
            if model.suffix == ".onnx":
                engines = [Fallback.ORT, Fallback.OPENVINO]
                if fallback is Fallback.OPENVINO_BF16:  # bf16 buckets, then: static in bf16 too
                    engines.append(fallback)
                static, more = _engine_times(specialise_onnx(model, values, tmp), inputs, values, engines, repeats,
                                             tmp)
            else:
                program = tmp / f"static-{_digest(values)}.vmfb"
                program.write_bytes(_iree_dynamic(model, values))
                static, more = _engine_times(model, inputs, values, [Fallback.IREE], repeats, tmp, runnable=program)
            if not dynamic or not static:
                raise CollageError("cannot time the model at its OPT shape to choose buckets "
                                   f"({'; '.join(problems + more)})", where=str(model))
            ratios.append(dynamic[fallback] / min(static.values()))
    return float(np.mean(ratios))


def _engine_times(model: Path, inputs: Axes, values: Mapping[str, int], kinds: Sequence[Fallback], repeats: int,
                  directory: Path, runnable: Path | None = None, agree_on: Sequence[np.ndarray] | None = None
                  ) -> tuple[dict[Fallback, float], list[str]]:
    """Median seconds per call of each engine of ``kinds`` on ``model`` at the dims ``values`` (inputs
    generated; ``_runners`` loads them, ``_median_times`` times them), and what went wrong with those that did
    not run."""
    runners, arrays, problems = _runners(model, inputs, values, kinds, directory, runnable, agree_on)
    return _median_times(runners, arrays, repeats), problems


def _runners(model: Path, inputs: Axes, values: Mapping[str, int], kinds: Sequence[Fallback], directory: Path,
             runnable: Path | None = None, agree_on: Sequence[np.ndarray] | None = None
             ) -> tuple[dict[Fallback, Callable], list[np.ndarray], list[str]]:
    """Each engine of ``kinds`` loaded on ``model`` and run once; the generated inputs at the dims ``values``
    (``_example_inputs``) and what went wrong with the engines that did not load or run. ``directory``: where
    IREE's program of a StableHLO module is compiled (``_runnable``); ``runnable``: a file to run instead (a
    static program). A quantized ONNX model's results on each engine must agree with ONNX Runtime's, its
    quantizer's own engine, within ``QUANT_RTOL`` of the output's scale beyond f32's tolerance
    (``import_check.compare``), on ``agree_on`` (the user's inputs: a mask of ones where generated data is
    random integers) where given, else on the generated inputs; one that does not is left out (OpenVINO's int8
    kernels on a masked mean of a transformer's output: 46-97 % of the scale off)."""
    arrays = _example_inputs(model, inputs, values)
    threads = usable_cores()
    runners, problems, results = {}, [], {}
    for kind in kinds:
        try:
            run = dynamic_runner(kind, runnable or _runnable(model, kind, directory), Engines(threads, sole=kind.value))
            results[kind] = run(arrays if agree_on is None else agree_on)
            runners[kind] = run
        except Exception as exc:  # noqa: BLE001  an engine that cannot run the model is left out
            problems.append(f"{kind.value}: {engine_message(exc, 160)}")
    if Fallback.ORT in results and quantizes_file(model):
        for kind in [k for k in runners if k is not Fallback.ORT]:
            off = next((c for c in (compare(k, f"result {k}", g, w, scale_slack=QUANT_RTOL) for k, (g, w)
                                    in enumerate(zip(results[kind], results[Fallback.ORT]))) if not c.ok), None)
            if off is not None:
                del runners[kind]
                problems.append(f"{kind.value}: disagrees with ort on the int8 model ({off.name}: {off.detail})")
    return runners, arrays, problems


def quantizes_file(model: str | Path) -> bool:
    """Whether ``model`` is an ONNX file that quantizes (``import_check.quantizes``)."""
    if Path(model).suffix != ".onnx":
        return False
    import onnx

    return quantizes(onnx.load(str(model), load_external_data=False))


def _example_inputs(model: Path, inputs: Axes, values: Mapping[str, int]) -> list[np.ndarray]:
    """Generated inputs of ``model`` (ONNX graph inputs, or ``@main``'s arguments) at the dims ``values``."""
    if model.suffix == ".onnx":
        import onnx

        proto = onnx.load(str(model), load_external_data=False)
        constants = {t.name for t in proto.graph.initializer}
        specs = [(onnx.helper.tensor_dtype_to_np_dtype(t.type.tensor_type.elem_type),
                  [d.dim_value for d in t.type.tensor_type.shape.dim])
                 for t in proto.graph.input if t.name not in constants]
    else:
        types = map(ir.RankedTensorType, main_type(load_module(model, new_context())).inputs)
        specs = [(byte_dtype(str(t.element_type)), [None if t.is_dynamic_dim(a) else t.get_dim_size(a)
                                                    for a in range(t.rank)]) for t in types]
    return [generated_array([values[n] if n is not None else size for n, size in zip(axes, shape)], dtype,
                            np.random.default_rng(k))
            for k, ((dtype, shape), axes) in enumerate(zip(specs, inputs))]


def _between(dim, buckets: Sequence[int]) -> int:
    """A value of ``dim`` between buckets: the middle of the widest gap, else its OPT value."""
    edges = sorted({dim.min - 1, *buckets, dim.max + 1})
    width, lo = max((b - a, a) for a, b in zip(edges, edges[1:]))
    return lo + width // 2 if width > 1 else dim.opt


def _shapes(types) -> list[tuple[int, ...]]:
    return [tuple(ir.RankedTensorType(t).shape) if isinstance(t, ir.RankedTensorType) else () for t in types]


def _result_shapes(module: ir.Module) -> list[tuple[int, ...]]:
    return _shapes(main_type(module).results)


def _argument_shapes(module: ir.Module) -> list[tuple[int, ...]]:
    return _shapes(main_type(module).inputs)


def _digest(values: Mapping[str, int]) -> str:
    """A bucket's directory name: its values (a dim name may hold any character, so hashed past a few)."""
    plain = "_".join(str(v) for v in values.values())
    return f"{plain}-{hashlib.sha256(repr(sorted(values.items())).encode()).hexdigest()[:8]}"
