"""What the framework entry points (``collage_mlir.torch``, ``collage_mlir.jax``) share: choosing the plan
of an imported module and compiling it into the cache.

The plan, unless the caller names one: the plan tuned before for a module of this structure on this
device (``collage tune`` and tuning entry points record it in the cost DB under the module's structural
hash), else a tune within the caller's budget, else the default plan — no tuning surprise.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

import numpy as np

from collage_runtime.types import NumberFormat

from .backends import get_backend
from .errors import CollageError
from .dialects import collage
from .frontends import cache_dir, write_cache
from .frontends.dims import PYTHON, DimPlan, check_declared
from .frontends.onnx_calibrate import (Agreement, Calibration, CalibrationMethod, program_on_held_out,
                                       quantize_onnx, samples_file)
from .graph import Graph, number_ops, public_funcs
from .ir import ir, new_context, parse_module
from .iree import compile_module
from .measure.db import CostDB, default_db_path
from .measure.device import device_fingerprint
from .measure.extract import structural_hash
from .measure.import_check import load_checked
from .onnx.export import translate
from .plan import Plan
from .search import available_backends, resolve_plan, tune_backends
from .search.record import TunedPlan, TuneRecord
from .search.tune import tune

#: Search budget of ``plan="tune"`` when no ``tune_budget`` is given.
DEFAULT_TUNE_BUDGET_S = 60.0


@dataclass(frozen=True)
class BuildOptions:
    """How an entry point places and builds a module, or each bucket of a declared range (``compile``'s
    keywords): the plan (None: tuned before, else a tune within ``tune_budget``, else the default), the
    backends and precision a tune takes, its seed and cost DB, the cores the program's engines share, and
    whether each import is checked against the framework."""

    plan: str | None = None
    tune_budget: float | None = None
    backends: Sequence[str] | None = None
    precision: str | None = None
    seed: int = 0
    db: str | Path | None = None
    threads: int | None = None
    check_import: bool = True


class PlanHow(str, Enum):
    """Where the plan an entry point compiles came from."""

    GIVEN = "given"
    TUNED_BEFORE = "tuned before"
    TUNED_NOW = "tuned now"
    INT8_ENGINE = "fastest int8 engine"  # precision="int8", no plan: whole on the fastest int8 engine
    F32_FASTER = "faster in f32"  # precision="int8", no plan: an engine runs the f32 model faster still
    DEFAULT = "default"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class PlanChoice:
    """The plan an entry point compiles, and where it came from (the artifact's provenance)."""

    plan: Plan
    how: PlanHow
    provenance: dict


def module_key(module: ir.Module) -> str:
    """The key tuned plans are stored under: the structural hash of the numbered module."""
    number_ops(module)
    return structural_hash(module)


def record_tuned_plan(db_path: str | Path | None, key: str, tuned: TunedPlan) -> None:
    """Stores a tuned plan (``TuneResult.tuned``) under ``key`` (``module_key`` of the module before
    tuning) for this device, where ``choose_plan`` finds it."""
    with CostDB(db_path or default_db_path()) as db:
        db.put_plan(key, device_fingerprint()[0], tuned.to_json())


def choose_plan(module: ir.Module, plan: str | Plan | None = None, *, tune_budget: float | None = None,
                backends: Sequence[str] | None = None, seed: int = 0, db: str | Path | None = None,
                examples: Mapping[str, Sequence[np.ndarray]] | None = None,
                precision: str | NumberFormat | None = None) -> PlanChoice:
    """The plan for ``module`` (numbered in place): ``plan`` when given (``"tune"`` tunes now); else the
    plan tuned before (same structure, this device) from the cost DB; else a tune within ``tune_budget``
    seconds when given, over ``backends`` (default: every available one) and, with ``precision="bf16"``,
    every usable backend computing in bf16 (``collage tune --precision bf16``; None: the model's own,
    ``search.tune_backends``); else the default plan (an int8 module: ``compile_int8``)."""
    try:
        precision = None if precision is None else NumberFormat(precision)
    except ValueError:
        raise CollageError(f"precision must be 'f32' or 'bf16' here (int8: the entry points' precision='int8' with "
                           f"calibrate=, or a quantized model), got {precision!r}") from None
    key = module_key(module)
    graph = Graph(module)
    if plan is not None and plan != "tune":
        resolved = resolve_plan(plan, graph)
        return PlanChoice(resolved, PlanHow.GIVEN, {"plan": resolved.source})
    db_path = Path(db or default_db_path())
    if plan is None and (stored := tuned_before(module, db_path)) is not None:
        return stored
    if plan is None and not tune_budget:
        return PlanChoice(Plan(source="default"), PlanHow.DEFAULT, {"plan": "default"})
    chosen = tune_backends(module, [get_backend(b) for b in backends] if backends else available_backends(),
                           precision)
    budget = tune_budget or DEFAULT_TUNE_BUDGET_S
    device = device_fingerprint()[0]
    # Tuned on a copy: the search may annotate the module it measures.
    copy = parse_module(module.operation.get_asm(binary=True), new_context())
    with CostDB(db_path) as cost_db, tempfile.TemporaryDirectory(prefix="collage-tune-") as work:
        result = tune(copy, chosen, cost_db, work, budget_s=budget, seed=seed, examples=examples)
        cost_db.put_plan(key, device, result.tuned.to_json())
    return PlanChoice(result.plan, PlanHow.TUNED_NOW, _provenance(result.tuned, db_path, key))


def tuned_before(module: ir.Module, db: str | Path | None = None) -> PlanChoice | None:
    """The plan tuned before for ``module`` (numbered in place: ``module_key``) on this device, from the cost DB
    (``db``, default the user's), where one is stored and still valid for it (else a warning says why not)."""
    db_path = Path(db or default_db_path())
    if not db_path.is_file():  # looking up never creates a DB
        return None
    key = module_key(module)
    with CostDB(db_path) as cost_db:
        document = cost_db.get_plan(key, device_fingerprint()[0])
    if document is None:
        return None
    tuned = TunedPlan.from_json(document, source=f"{db_path}: tuned plan {key[:12]}")
    try:
        tuned.plan.validate(Graph(module))
    except CollageError as exc:  # e.g. a backend it used is not installed any more
        warnings.warn(f"collage: not reusing the tuned plan: {exc}", RuntimeWarning, stacklevel=4)
        return None
    return PlanChoice(tuned.plan, PlanHow.TUNED_BEFORE, _provenance(tuned, db_path, key))


#: The ``precision`` that quantizes an f32 model (``Int8``, ``quantize``); the others are ``NumberFormat``s.
INT8 = "int8"


@dataclass(frozen=True)
class Int8:
    """``precision="int8"`` from Python: the batches of the model's inputs to calibrate on (each a sequence of
    arrays with the example inputs' shapes; the last quarter held out to check on), the range method, and the
    largest share of held-out samples whose top class may change (None: reported, not bounded)."""

    samples: tuple
    method: CalibrationMethod = CalibrationMethod.MINMAX
    max_drop: float | None = None

    @staticmethod
    def requested(precision: str | None, calibrate, method: str, max_drop: float | None, to_arrays) -> "Int8 | None":
        """What an entry point's keywords ask: ``Int8.of`` them for ``precision="int8"``, else None (where
        ``calibrate`` and ``max_drop`` are one CollageError: they quantize)."""
        if precision == INT8:
            return Int8.of(calibrate, method, max_drop, to_arrays)
        if calibrate is not None or max_drop is not None:
            raise CollageError("calibrate and max_drop go with precision='int8'")
        return None

    @staticmethod
    def of(calibrate, method: str, max_drop: float | None, to_arrays) -> "Int8":
        """From an entry point's keywords: ``calibrate`` (batches; a batch of a one-input model may be the
        array itself), each batch made arrays by ``to_arrays``."""
        if calibrate is None:
            raise CollageError("precision='int8' needs calibrate= (batches of the model's inputs; the last quarter "
                               "is held out to check the int8 program on)")
        try:
            method = CalibrationMethod(method)
        except ValueError:
            raise CollageError(f"calibration_method must be one of {', '.join(m.value for m in CalibrationMethod)}, "
                               f"got {method!r}") from None
        if max_drop is not None and not 0 <= max_drop <= 1:
            raise CollageError(f"max_drop is a share of samples in [0, 1], got {max_drop}")
        return Int8(tuple(tuple(to_arrays(b)) for b in calibrate), method, max_drop)


@dataclass(frozen=True)
class Quantized:
    """A module made int8 by ``quantize``: its f32 form as ONNX (what its programs are checked against), the
    calibration, and the int8 model's agreement with f32 on the held-out samples (``agreement.line()``),
    with the nodes kept in f32 to meet ``max_drop``; the int8 ONNX model itself."""

    f32: Path
    calibration: Calibration
    agreement: Agreement
    kept: tuple[str, ...]
    int8: Path

    def check(self, program) -> Agreement:
        """``program`` (``collage_runtime``'s, ``main`` taking the model's inputs) against the f32 model on the
        held-out samples: its agreement, or one CollageError where it exceeds ``max_drop`` (the engines' int8
        kernels round otherwise than the quantized model)."""
        agreement = program_on_held_out(self.f32, self.calibration.held_out, program)
        if agreement.exceeds(self.calibration.max_drop):
            raise CollageError(f"{agreement.line()}: above max_drop {self.calibration.max_drop:g} (the int8 model "
                               f"met it: {self.agreement.line()})")
        return agreement


def cached_f32(key: bytes, model: Callable[[], bytes]) -> Path:
    """The f32 ONNX model that int8 is quantized from and checked against, cached under ``key``'s digest
    (``model()`` gives its bytes the first time)."""
    path = cache_dir() / "int8" / f"f32-{hashlib.sha256(key).hexdigest()[:32]}.onnx"
    if not path.is_file():
        write_cache(path, model())
    return path


def f32_onnx(module: ir.Module) -> Path:
    """``module``'s ``@main`` as an ONNX file in the cache (inputs ``in0``, ``in1``, ...), by the translator ONNX
    Runtime's regions use (``cached_f32``)."""

    def translated() -> bytes:
        funcs = [f for f in public_funcs(module) if collage.symbol_name(f) == "main"]
        if not funcs:
            raise CollageError("int8 quantizes a model's @main; the module has none")
        try:
            return translate(funcs[0]).SerializeToString()
        except CollageError as exc:
            raise CollageError(f"cannot quantize the model: its f32 form does not translate to ONNX ({exc})") \
                from None

    return cached_f32(module.operation.get_asm(binary=True), translated)


def quantize(module: ir.Module, request: Int8, examples: Sequence[np.ndarray], *,
             check_import: bool = True) -> tuple[ir.Module, Quantized]:
    """``module`` (f32) made int8 as ``collage compile --precision int8`` makes an ONNX model: its ``main``
    translated to ONNX (the translation ONNX Runtime's regions run), quantized by ONNX Runtime's quantizer
    on ``request``'s samples (``onnx_calibrate.quantize_onnx``: nodes fall back to f32 to meet ``max_drop``),
    and imported back (checked against ONNX Runtime on ``examples`` where ``check_import``). So any
    frontend's model, torch or JAX, gets the int8 path of quantized ONNX models."""
    quantized = quantize_file(f32_onnx(module), request)
    return load_checked(quantized.int8, new_context(), list(examples), check=check_import, where="the int8 model"), quantized


def quantize_file(f32: Path, request: Int8) -> Quantized:
    """The f32 ONNX model at ``f32`` quantized on ``request``'s samples (``onnx_calibrate.quantize_onnx``): the
    int8 model (its path in the cache: ``.int8``) and what its programs are checked with. A dynamic dim
    (``dim_param``) takes the samples' size."""
    calibration = Calibration(samples_file(f32, request.samples), request.method, request.max_drop)
    int8, agreement, kept = quantize_onnx(f32, calibration)
    return Quantized(f32, calibration, agreement, kept, int8)


def plan_provenance(spec: str, tuning: TuneRecord | None = None, db: str | Path | None = None) -> dict:
    """Where a plan came from, for the artifact's manifest: its spec (or file) and, for a tuned plan, the
    tuning record's seed, budget and backends (read from the plan file when not given) and the DB."""
    if tuning is None and spec.endswith(".json") and Path(spec).is_file():
        try:
            tuning = TunedPlan.from_json(json.loads(Path(spec).read_text()), source=spec).record
        except (OSError, ValueError, CollageError):  # the plan's own loading reports it
            tuning = None
    record: dict = {"plan": spec}
    if tuning is not None:
        fields = {"seed": tuning.seed, "budget_s": tuning.budget_s,
                  "backends": list(tuning.backends) if tuning.backends is not None else None}
        record |= {k: v for k, v in fields.items() if v is not None}
    if db is not None:
        record["db"] = str(db)
    return record


def _provenance(tuned: TunedPlan, db_path: Path, key: str) -> dict:
    return plan_provenance("tuned", tuned.record or TuneRecord(), db_path) | {"module_hash": key}


def artifact_key(module: ir.Module, choice: PlanChoice) -> str:
    """What a compiled artifact of ``module`` with the chosen plan is cached under: module and plan, and the
    provenance (the artifact's manifest records it)."""
    digest = hashlib.sha256(module.operation.get_asm(binary=True)).hexdigest()[:16]
    record = json.dumps([choice.plan.to_json(), choice.provenance], sort_keys=True)
    return hashlib.sha256(f"{digest}:{record}".encode()).hexdigest()[:16]


def cached_artifact(key: str) -> Path:
    """Where the compile cache keeps the artifact of ``key``."""
    return cache_dir() / "compiled" / f"{key}.collage"


def compile_cached(module: ir.Module, choice: PlanChoice, source: str) -> Path:
    """Compiles ``module`` with the chosen plan into the cache (``artifact_key``); the artifact."""
    out = cached_artifact(artifact_key(module, choice))
    if not out.exists():
        compile_module(module, choice.plan, out, source=source, provenance=choice.provenance)
    return out


def planned_buckets(dim_plan: DimPlan, arrays_at: Callable[[dict[str, int]], list[np.ndarray]], options: BuildOptions,
                    imported: Callable, seed: bytes, placed: Callable | None = None):
    """Every bucket of ``dim_plan``: the module ``imported(values, arrays)`` gives for it (``arrays``:
    ``arrays_at(values)``, the example inputs at the bucket's shape), numbered and given its plan as ``compile``
    gives it (``tune_budget`` shared between the buckets), or, where given, the module and ``PlanChoice`` that
    ``placed(values, arrays)`` gives. (the grid, the ``BucketModel``s, the artifact key: ``seed``, the declared
    dims and each bucket's ``artifact_key``)."""
    from .shaped import BucketModel  # when used: see compile_int8

    grid = dim_plan.grid()
    budget = options.tune_budget and options.tune_budget / len(grid)
    declared = [[d.name, d.min, d.opt, d.max] for d in dim_plan.dims] + [list(dim_plan.pad)]
    models, key = [], hashlib.sha256(seed + json.dumps(declared).encode())
    for values in grid:
        arrays = arrays_at(values)
        if placed is not None:
            module, choice = placed(values, arrays)
        else:
            module = imported(values, arrays)
            number_ops(module)
            tuning = options.plan == "tune" or bool(budget)
            choice = choose_plan(module, options.plan, tune_budget=budget, backends=options.backends,
                                 seed=options.seed, db=options.db, examples={"main": arrays} if tuning else None,
                                 precision=options.precision)
        models.append(BucketModel(module, choice.plan, choice.provenance))
        key.update(artifact_key(module, choice).encode())
    return grid, models, key


def int8_choice(module: ir.Module, choice) -> PlanChoice:
    """The plan of an int8 program where the user gave none: whole on the engine ``choice`` (``shaped``'s
    ``EngineChoice`` of ``int8_plan``) timed fastest, for ``module``: the int8 module, or where ``choice.f32``
    the module it was quantized from (faster there: f32 is within any accuracy bound)."""
    number_ops(module)
    how = PlanHow.DEFAULT if choice.chosen is None else PlanHow.F32_FASTER if choice.f32 else PlanHow.INT8_ENGINE
    provenance = {"plan": choice.plan, "precision": choice.precision}
    return PlanChoice(resolve_plan(choice.plan, Graph(module)), how, provenance)


def compile_int8(module: ir.Module, request: Int8, examples: Sequence[np.ndarray], options: BuildOptions,
                 source: str) -> tuple[Path, PlanChoice, Quantized]:
    """``module`` (f32, at one shape) in int8: quantized from ``request``'s batches (``quantize``), then placed as
    ``choose_plan`` places a module, but where no plan is given (and none was tuned before) whole on the fastest
    int8 engine of those agreeing with ONNX Runtime on ``examples``, or on an engine running the f32 module where
    that is faster still (``shaped.int8_plan``, ``int8_choice``: IREE computes int8 in f32). The artifact, in the
    compile cache, the plan chosen, and the ``Quantized`` model its program is checked with."""
    # Imported here, as torch.py imports .shaped: loaded with this module, the runtime's shaped-program machinery
    # changes the order nanobind finds IREE's objects at exit, and a process exiting with a program alive prints a
    # leak report (test_exit_is_quiet_with_programs_and_results_alive).
    from .shaped import int8_plan, module_values

    int8, quantized = quantize(module, request, examples, check_import=options.check_import)
    target, choice = int8, None
    if options.plan is None and not options.tune_budget:
        choice = tuned_before(int8, options.db)
        if choice is None:
            picked = int8_plan(quantized.int8, module_values(quantized.int8, int8), agree_on=examples,
                               f32=quantized.f32)
            target = module if picked.f32 else int8
            choice = int8_choice(target, picked)
    if choice is None:
        choice = choose_plan(int8, options.plan, tune_budget=options.tune_budget, backends=options.backends,
                             seed=options.seed, db=options.db, examples={"main": list(examples)})
    return compile_cached(target, choice, source=source), choice, quantized


def compile_int8_range(f32: bytes, dim_plan: DimPlan, arrays_at: Callable[[dict[str, int]], list[np.ndarray]],
                       options: BuildOptions, request: Int8, source: str) -> tuple[Path, Quantized]:
    """A model with dynamic dims in int8, from ``f32`` (its f32 ONNX form, each ``dim_param`` named as the
    declared dims name it): quantized once from ``request``'s batches (``quantize_file``: one set of scales
    for every shape), then compiled as ``collage compile --dim`` compiles a quantized ONNX model: each bucket
    (``arrays_at(values)``: the example inputs at its shape, for the import check, a tune, and the int8
    engines' agreement with ONNX Runtime) given its plan as ``compile`` gives it (none given: whole on the
    fastest int8 engine at its shape, or on an engine running the f32 model where faster,
    ``shaped.int8_bucket_plan``), and between buckets (where buckets and padding leave a gap) the fastest of
    ONNX Runtime and OpenVINO on the int8 model with its dims, or on the f32 one. The artifact, in the compile
    cache, and the ``Quantized`` model its program is checked with."""
    from .shaped import compile_shaped, file_fallback, int8_bucket_plan, load_bucket, model_file_axes  # see compile_int8

    quantized = quantize_file(cached_f32(f32, lambda: f32), request)
    file_axes, dynamic_model = model_file_axes(quantized.int8)
    check_declared(file_axes, dim_plan.dims, PYTHON)

    def imported(values: dict[str, int], arrays: list[np.ndarray], path: Path = quantized.int8):
        return load_bucket(path, values, new_context(), check_import=options.check_import, inputs=arrays)

    def placed(values: dict[str, int], arrays: list[np.ndarray]) -> tuple[ir.Module, PlanChoice]:
        choice = int8_bucket_plan(dynamic_model, values, agree_on=arrays, f32=quantized.f32)
        module = imported(values, arrays, quantized.f32 if choice.f32 else quantized.int8)
        return module, int8_choice(module, choice)

    chooses = options.plan is None and not options.tune_budget  # IREE computes int8 in f32: an engine per bucket
    grid, models, key = planned_buckets(dim_plan, arrays_at, replace(options, precision=None), imported,
                                        seed=quantized.int8.name.encode(), placed=placed if chooses else None)
    out = cached_artifact(key.hexdigest()[:16])
    if not out.exists():  # between buckets, the int8 engines must agree with ONNX Runtime on a held-out batch
        fallback, model = file_fallback(dynamic_model, dim_plan, file_axes, agree_on=list(request.samples[-1]),
                                        f32=quantized.f32)
        compile_shaped(dim_plan, file_axes, lambda values: models[grid.index(values)], out, fallback=fallback,
                       source=f"{source} int8", fallback_model=model)
    return out, quantized
