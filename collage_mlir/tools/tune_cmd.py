"""`collage tune MODEL --backends B1,B2,... [--budget 10m] [--seed N] [--db PATH] -o PLAN.json`: finds the
placement with the lowest measured end-to-end time and writes it as a plan, with progress (stage,
measured/total, cache hits, best plan so far). Every finished measurement is in the cost DB at once, so
an interrupted tune loses nothing: run it again and it goes on from the DB. With ``--dim`` (a model with
dynamic dims), each shape bucket is tuned in turn within a share of the budget, its plan written to
``OUTPUT/<bucket>.json`` and recorded, where ``collage compile --dim ... --plan tuned`` finds it."""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from collage_runtime.shapes import DimRange, dims_label
from collage_runtime.types import NumberFormat, Platform

from ..errors import CollageError
from ..frontends.dims import argument_axes, dynamic_dims, inputs_values, read_onnx_axes, resized
from ..frontends.onnx_calibrate import (Calibration, CalibrationMethod, HeldOut, held_out_fits, named_samples,
                                        program_on_held_out, quantize_onnx)
from ..graph import main_inputs
from . import backend_names, load_input_arrays, positive_int
from .dims_args import dim_plan_of

DEFAULT_BUDGET = "10m"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")


def parse_budget(text: str) -> float:
    """Seconds from ``600``, ``90s``, ``10m`` or ``1h``; anything else (or <= 0) is a CollageError (exit 2)."""
    m = _DURATION.match(text)
    seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)] if m else 0.0
    if seconds <= 0:
        raise CollageError(f"budget must be a positive duration such as 600, 90s or 10m, got '{text}'",
                           where="--budget", exit_code=2)
    return seconds


def parse_backends(text: str | None, platform: Platform = Platform.CPU) -> list:
    """The named backends (usable here), or every available one for a ``platform`` program when ``text`` is
    None."""
    from ..backends import expand_names, registry
    from ..search import available_backends

    if text is None:
        return available_backends(platform)
    found = []
    for name in expand_names(backend_names(text)):
        info = registry().get(name)
        if info is None or info.backend is None:
            raise CollageError(f"unknown backend '{name}' (known: {', '.join(sorted(registry()))})",
                               where="--backends", exit_code=2)
        if info.problem:
            raise CollageError(f"backend '{name}' is not usable here: {info.problem}", where="--backends",
                               exit_code=2)
        found.append(info.backend)
    return found


def add_precision_arguments(parser: argparse.ArgumentParser) -> None:
    """``--precision int8 --calibrate DATA [--calibration-method M] [--max-drop X]``, or
    ``--precision bf16`` (a tune may place regions on backends computing in bf16)."""
    parser.add_argument("--precision", choices=["f32", "bf16", "int8"], default=None,
                        help="int8: quantize an f32 model first (ONNX Runtime's quantizer, QDQ, per-channel "
                             "weights; a StableHLO file or torch factory through its ONNX translation) from "
                             "--calibrate samples; bf16: the tune also tries each backend computing "
                             "in bf16 where this CPU has it (openvino-bf16), within that backend's tolerance; "
                             "f32: only backends computing in f32; default: the model's own (bf16 where its "
                             "matmuls and convolutions take bf16, else f32)")
    parser.add_argument("--calibrate", metavar="DATA", help="calibration samples: .npy (one input) or .npz (one "
                        "array per input name; for a model that is not ONNX, the inputs in order), a whole number of "
                        "the model's batches; the last quarter is held out")
    parser.add_argument("--calibration-method", choices=[m.value for m in CalibrationMethod], default="minmax")
    parser.add_argument("--held-out", metavar="DATA", help="samples (as --calibrate takes them) the compiled "
                        "program is checked on against the f32 ONNX model, reported beside speed (with --precision "
                        "int8: the last quarter of --calibrate)")
    parser.add_argument("--max-drop", type=float, default=None, metavar="SHARE",
                        help="refuse an int8 model, and any compiled program, whose top class differs from the f32 "
                             "model's on more than this share of the held-out samples (e.g. 0.01)")


def translated_for_int8(args: argparse.Namespace) -> None:
    """``--precision int8`` of a StableHLO file or a torch factory: its ``@main`` translated to ONNX
    (``entry.f32_onnx``), which the int8 path then takes as any f32 ONNX model (quantized, imported, and its
    programs checked against it on the held-out samples); the ``--calibrate`` data, the inputs by position,
    rewritten under that model's input names (``onnx_calibrate.named_samples``). ``args`` is updated."""
    if args.precision != "int8" or not args.calibrate or Path(args.model).suffix == ".onnx":
        return
    from rich.console import Console

    from ..entry import f32_onnx
    from ..ir import new_context

    if getattr(args, "dim", None):
        raise CollageError("--precision int8 with --dim takes an ONNX model", where=args.model, exit_code=2)
    module, _ = load_model(args.model, new_context(), load_input_arrays(args.input),
                           check_import=not args.no_import_check)
    f32 = f32_onnx(module)
    args.calibrate = str(named_samples(f32, Path(args.calibrate)))
    Console(stderr=True).print(f"{args.model} as ONNX, to quantize: {f32}", highlight=False)
    args.model = str(f32)


def calibration_of(args: argparse.Namespace):
    """The ``Calibration`` the arguments ask for, or None (no quantization)."""
    if args.max_drop is not None and not 0 <= args.max_drop <= 1:
        raise CollageError(f"--max-drop is a share of samples in [0, 1], got {args.max_drop}", exit_code=2)
    if args.precision != "int8":
        if args.calibrate:
            raise CollageError("--calibrate goes with --precision int8 (check another precision on --held-out DATA)",
                               exit_code=2)
        if args.max_drop is not None and not args.held_out:
            raise CollageError("--max-drop needs samples to check on: --held-out DATA (or --precision int8 "
                               "--calibrate DATA)", exit_code=2)
        return None
    if not args.calibrate:
        raise CollageError("--precision int8 needs calibration samples: --calibrate DATA", exit_code=2)
    if args.held_out:
        raise CollageError("--precision int8 holds out the last quarter of --calibrate; --held-out goes with f32 "
                           "and bf16", exit_code=2)
    return Calibration(Path(args.calibrate), CalibrationMethod(args.calibration_method), args.max_drop)


def held_out_of(args: argparse.Namespace) -> HeldOut | None:
    """The samples a compiled program is checked on (``--held-out``, or int8's calibration data), or None."""
    calibration = calibration_of(args)
    if calibration is not None:
        return calibration.held_out
    return HeldOut(Path(args.held_out), args.max_drop) if args.held_out else None


def backends_for(args: argparse.Namespace, module, platform: Platform = Platform.CPU) -> list:
    """The backends a tune of ``module`` measures: ``--backends`` (default: every available one) and those
    computing in ``--precision`` (default: the model's own; ``search.tune_backends``)."""
    from ..search import tune_backends

    backends = parse_backends(getattr(args, "backends", None), platform)  # `collage compile --tune`: every one
    precision = None if args.precision in (None, "int8") else NumberFormat(args.precision)
    return tune_backends(module, backends, precision, platform)


def load_model(spec: str, context, inputs: list, check_import: bool = False, calibration=None,
               dims: Mapping[str, int] | None = None):
    """(numbered module, example inputs for @main) from a StableHLO file, or from ``package.module:factory``
    where ``factory()`` returns ``(torch model, example inputs)``; ``check_import``: an ONNX file or a torch
    model is checked against its source first (``measure.import_check``); ``calibration``: an ONNX model is
    quantized to int8 first (``frontends.onnx_calibrate``); ``dims``: the value of each dynamic dim
    (one shape bucket: ``frontends.dims`` for ONNX, ``frontends.refine`` for StableHLO; else a model file's
    dynamic dims take the ``inputs``' shape, or are one CollageError naming them)."""
    from ..measure.import_check import check_import as check, load_checked, torch_source
    from ..frontends import refine
    from ..shaped import load_bucket

    path = Path(spec)
    spec = quantized_spec(spec, calibration)
    if path.suffix == ".onnx":
        axes, names = read_onnx_axes(spec)
        if dims is None and dynamic_dims(axes):
            dims = inputs_values(axes, names, inputs, str(path))
        if dims:
            return load_bucket(spec, dims, context, check_import=check_import, inputs=inputs), inputs
    elif path.suffix in (".mlir", ".mlirbc"):  # `?` dims: specialised to dims, else to the inputs' shapes
        return refine.load(spec, context, dims, inputs), inputs
    if path.exists() or ":" not in spec:
        if dims:
            raise CollageError("--dim takes ONNX models, StableHLO modules and torch factories", where=spec,
                               exit_code=2)
        return load_checked(spec, context, inputs, check=check_import), inputs
    import importlib

    from torch import no_grad as torch_no_grad

    from ..frontends.torch import import_torch, to_numpy

    mod_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as exc:
        raise CollageError(f"cannot load the model factory: {exc}", where=spec, exit_code=2) from None
    model, example = factory()
    example = list(example)
    if dims:
        example = resized(example, argument_axes(example, [DimRange(n, v, v, v) for n, v in dims.items()]), dims)
        inputs = []
        try:
            with torch_no_grad():
                model(*example)
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:  # the model's own shape checks
            first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
            raise CollageError(f"the model does not run at {dims_label(dims)}: {first[:200]}", where=spec,
                               exit_code=2) from None
    module = import_torch(model, example, context)
    if check_import:
        check(module, torch_source(model, example), [to_numpy(t) for t in example], where=spec)
    return module, inputs or [to_numpy(t) for t in example]


def quantized_spec(spec: str, calibration) -> str:
    """The model to import: ``spec``, or with a ``calibration``, the int8 ONNX model quantized from it (its
    agreement with f32 on held-out samples printed)."""
    if calibration is None:
        return spec
    if Path(spec).suffix != ".onnx":
        raise CollageError("--precision int8 quantizes ONNX models (.onnx) here; a torch or JAX model from Python: "
                           "collage_mlir.torch/jax.compile(..., precision='int8', calibrate=batches)", where=spec,
                           exit_code=2)
    from rich.console import Console

    quantized, agreement, kept = quantize_onnx(Path(spec), calibration)
    line = agreement.line() + (f" ({len(kept)} nodes kept in f32 for --max-drop: {', '.join(kept)})" if kept else "")
    Console(stderr=True).print(line, highlight=False)
    return str(quantized)


def program_check(spec: str, held: HeldOut | None):
    """With ``held``-out samples, what ``compile_module(check=...)`` runs on a compiled artifact of the ONNX
    model ``spec`` (or of its int8 quantization): the program against the f32 model on those samples, printed
    and recorded in the manifest's provenance (``held_out``: ``collage report`` shows it); above
    ``--max-drop`` one CollageError, and the artifact is not written. None without them."""
    if held is None:
        return None
    if Path(spec).suffix != ".onnx":
        raise CollageError("--held-out checks a program against an ONNX model (.onnx)", where=spec, exit_code=2)
    from rich.console import Console

    def check(artifact: Path) -> dict:
        agreement = held_out_agreement(spec, held, artifact)
        if agreement.exceeds(held.max_drop):
            why = " (the int8 model met it: the engines' int8 kernels round differently)" if held.last_quarter else ""
            raise CollageError(f"{agreement.line()}: above --max-drop {held.max_drop:g}; nothing was written{why}",
                               where=spec)
        Console(stderr=True).print(agreement.line(), highlight=False)
        return {"held_out": agreement.to_json() | {"max_drop": held.max_drop}}

    return check


def held_out_agreement(spec: str, held: HeldOut, artifact: Path):
    """The compiled ``artifact`` against the f32 ONNX model ``spec`` on ``held``'s samples (``Agreement``;
    ``onnx_calibrate.program_on_held_out``)."""
    import collage_runtime

    with collage_runtime.load(artifact) as program:
        return program_on_held_out(spec, held, program)


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..measure.db import default_db_path

    t = sub.add_parser("tune", help="find the placement with the lowest measured end-to-end time")
    t.add_argument("model", help="StableHLO module (.mlir/.mlirbc) or a PyTorch factory package.module:function "
                                 "returning (model, example inputs)")
    t.add_argument("--backends", default=None, help="comma-separated backends (default: every available one)")
    t.add_argument("--budget", default=DEFAULT_BUDGET,
                   help=f"search time: seconds or a duration such as 90s, 10m (default {DEFAULT_BUDGET}); the "
                        "finalists' re-measurement runs after it")
    t.add_argument("--device", choices=[p.value for p in Platform], default=Platform.CPU.value,
                   help="the platform of the program tuned (default: cpu); cuda/vulkan measure on this machine's GPU")
    t.add_argument("--seed", type=int, default=0, help="search seed (same DB + same seed → same plan)")
    t.add_argument("--db", default=None, help=f"cost database (default: $COLLAGE_DB or {default_db_path()})")
    t.add_argument("--input", action="append", default=[], help="example input .npy for @main, once per argument")
    t.add_argument("--search-again", action="store_true",
                   help="search even where a finished tune with the same model, inputs, backends, seed and budget is "
                        "in the DB (by default its plan is returned at once); the DB's rows are still used")
    t.add_argument("--jobs", type=positive_int, default=None, help="parallel candidate builds (default: CPU count)")
    t.add_argument("-o", "--output", required=True, help="plan JSON to write (with --dim: a directory, a plan per "
                                                          "bucket)")
    t.add_argument("--dim", action="append", default=[], metavar="NAME=MIN:OPT:MAX",
                   help="a dynamic dim's range, as `collage compile --dim` takes it: each bucket is tuned")
    t.add_argument("--bucket", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="the values of a dim tuned for (default: its MIN, OPT and MAX)")
    t.add_argument("--no-import-check", action="store_true",
                   help="do not check an imported model (.onnx, torch factory) against its source")
    add_precision_arguments(t)
    t.add_argument("--keep-quantized", action="store_true",
                   help="keep every region of a quantized model at its precision (by default a region that "
                        "dequantizes is also tried in float, its quantize/dequantize pairs removed)")
    t.add_argument("--cluster", metavar="ADDRESS", default=None,
                   help="build and time on the Ray cluster at ADDRESS (host:port, ray://host:port, auto): its nodes "
                        "of this machine's kind (see docs/measurement.md); the cost DB and the search stay here")


def tune_model(module, examples: dict, backends: list, budget_s: float, seed: int, db_path: str | None,
               jobs: int | None = None, reuse: bool = True, platform: Platform = Platform.CPU,
               cluster: str | None = None, started: float | None = None, float_regions: bool = True,
               carried: Sequence = ()):
    """Tunes ``module`` with a rich progress display (building and timing on the Ray cluster at ``cluster``
    when given), the budget counted from ``started`` (``time.monotonic()``; default now), ``carried`` plans
    seeding the search beside the single-backend ones; returns the TuneResult."""
    import tempfile

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ..measure.db import CostDB, default_db_path
    from ..measure.harness import MeasureOptions
    from ..search.tune import tune

    options = MeasureOptions(platform=platform, cluster=cluster)
    if jobs:
        options.jobs = jobs
    console = Console(stderr=True)
    with CostDB(db_path or default_db_path()) as db, tempfile.TemporaryDirectory(prefix="collage-tune-") as work, \
            Progress(SpinnerColumn(), TextColumn("[bold]{task.fields[stage]:<11}"), BarColumn(), MofNCompleteColumn(),
                     TextColumn("{task.description}"), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("", total=None, stage="tune")

        def show(stage: str, done: int, total: int | None, note: str) -> None:
            bar.update(task, stage=stage, completed=done, total=total, description=note)

        return tune(module, backends, db, work, budget_s=budget_s, seed=seed, examples=examples, measure=options,
                    on_progress=show, reuse=reuse, started=started, float_regions=float_regions, carried=carried)


def run(args: argparse.Namespace) -> int:
    from ..graph import Graph, number_ops
    from ..ir import new_context
    from ..measure.cluster import connect
    from ..search.transfer import TunedBuckets

    started = time.monotonic()  # the budget is the command's: loading and checking the model count
    budget = parse_budget(args.budget)
    platform = Platform(args.device)
    if args.cluster:  # before any work: a missing Ray or an unreachable cluster is one line at once
        connect(args.cluster, platform)
    parse_backends(args.backends, platform)  # a backend not usable here: one line before any work
    translated_for_int8(args)  # a StableHLO file or a torch factory: int8 through its ONNX form
    dim_plan = dim_plan_of(args)
    if dim_plan is None:
        module, inputs = load_model(args.model, new_context(), load_input_arrays(args.input),
                                    calibration=calibration_of(args), check_import=not args.no_import_check)
        return _tune_one(args, module, inputs, backends_for(args, module, platform), budget, started,
                         Path(args.output))[0]
    # Each bucket tuned for its shape, the budget shared, the OPT shape first; each later bucket's search
    # seeded with the plans tuned before it (``search.transfer``); each plan recorded in the cost DB under
    # its module, where `collage compile --dim ... --plan tuned` finds it, and written to OUTPUT/<bucket>.json.
    if args.input:
        raise CollageError("--input fixes one shape; with --dim the buckets' shapes are generated", where="--input",
                           exit_code=2)
    if args.held_out:
        raise CollageError("with --dim, held-out samples check the artifact: give --held-out to `collage compile "
                           "--dim ... --plan tuned`", where="--held-out", exit_code=2)
    spec = quantized_spec(args.model, calibration_of(args))
    out = Path(args.output)
    if out.suffix == ".json":
        raise CollageError("with --dim, -o names a directory: one plan per bucket", where="-o", exit_code=2)
    out.mkdir(parents=True, exist_ok=True)
    opt = {d.name: d.opt for d in dim_plan.dims}
    buckets = sorted(dim_plan.grid(), key=lambda values: values != opt)
    tuned = TunedBuckets()
    for k, values in enumerate(buckets):
        left = budget - (time.monotonic() - started)
        # The OPT shape is tuned hardest (half the budget where there are other buckets); the later buckets
        # share the rest, each with the plans tuned before it built and timed whatever its share.
        share = left / 2 if k == 0 and len(buckets) > 1 and values == opt else left / (len(buckets) - k)
        module, inputs = load_model(spec, new_context(), [], check_import=not args.no_import_check, dims=values)
        number_ops(module)
        graph = Graph(module)
        code, result = _tune_one(args, module, inputs, backends_for(args, module, platform), max(share, 1.0),
                                 time.monotonic(), out / f"{dims_label(values)}.json", tuned.carried(graph))
        if code:
            return code
        tuned.add(graph, result.plan)
    return 0


def _tune_one(args: argparse.Namespace, module, inputs: list, backends: list, budget: float, started: float,
              output: Path, carried: Sequence = ()):
    """Tunes one module (``carried`` plans seeding the search), writes its plan (and the report beside it)
    and records it in the cost DB; (exit code, TuneResult)."""
    from ..entry import module_key, record_tuned_plan
    from ..graph import Graph

    platform = Platform(args.device)
    key = module_key(module)  # before the search touches it: collage_mlir.torch/jax look plans up by it
    held = held_out_of(args)
    pristine = module.operation.get_asm(binary=True) if held is not None else None  # what the check compiles

    def search(chosen: list):
        return tune_model(module, {"main": inputs} if inputs else {}, chosen, budget, args.seed, args.db, args.jobs,
                          reuse=not args.search_again, platform=platform, cluster=args.cluster, started=started,
                          float_regions=not args.keep_quantized, carried=carried)

    if held is not None and Path(args.model).suffix == ".onnx":  # samples that cannot be checked: before the search
        held_out_fits(args.model, held, main_inputs(module))
    result, checked = search(backends), None
    if held is not None and not result.interrupted:
        result, agreement = _within_max_drop(args, result, pristine, held, backends, search)
        checked = agreement.to_json() | {"max_drop": held.max_drop}  # the report shows it beside the timings
    if result.reused:
        print("a finished tune with these settings is in the cost DB: its plan, not searched again "
              "(--search-again to search on the DB's rows)")
    output.write_text(json.dumps(result.tuned.to_json(), indent=1) + "\n")
    if result.interrupted:  # not a finished tune: not the plan entry points take as tuned
        print(f"interrupted: wrote {output}, {result.tuned.record.why}; run the same command again to go on "
              "(every measurement so far is in the cost DB)")
        return 130, result
    record_tuned_plan(args.db, key, result.tuned)
    print_summary(result, str(output))
    # The placement to look at, beside the plan (plan.json -> plan.html), on the module as tuned (numbered).
    from . import report_cmd

    report = output.with_suffix(".html")
    report.write_text(report_cmd.render(result.tuned, None, Graph(module), args.db, held_out=checked))
    print(f"wrote {report}")
    return 0, result


def _within_max_drop(args: argparse.Namespace, result, module_bytes: bytes, held: HeldOut, backends: list, search):
    """The tuned plan's program against the f32 model on the held-out samples (``held_out_agreement``,
    printed). Where it exceeds ``--max-drop`` and has regions on reduced-precision backends (bf16), those
    revert to the model's precision: the tune again over the other backends (the rows measured so far are in
    the DB), checked the same way; one CollageError where the bound is still not met (no plan written).
    (the result, its plan's agreement)"""
    import tempfile

    from rich.console import Console

    from ..ir import new_context, parse_module
    from ..iree import compile_module

    if Path(args.model).suffix != ".onnx":
        raise CollageError("--held-out checks a program against an ONNX model (.onnx)", where=args.model,
                           exit_code=2)
    console = Console(stderr=True)

    def agreement_of(plan):
        with tempfile.TemporaryDirectory(prefix="collage-held-out-") as tmp:
            art = compile_module(parse_module(module_bytes, new_context()), plan, Path(tmp) / "art",
                                 source=args.model).out_dir
            agreement = held_out_agreement(args.model, held, art)
        console.print(f"tuned plan: {agreement.line()}", highlight=False)
        return agreement

    agreement = agreement_of(result.plan)
    if not agreement.exceeds(held.max_drop):
        return result, agreement
    reduced = {b.name for b in backends if b.computes_in}
    if reduced & {r.backend for r in result.plan.regions}:
        console.print(f"above --max-drop {held.max_drop:g}: the plan's regions on {', '.join(sorted(reduced))} "
                      "revert to the model's precision", highlight=False)
        result = search([b for b in backends if b.name not in reduced])
        agreement = agreement_of(result.plan)
        if not agreement.exceeds(held.max_drop):
            return result, agreement
    raise CollageError(f"{agreement.line()}: above --max-drop {held.max_drop:g}; no plan was written (every "
                       "measurement is in the cost DB)", where=args.model)


def print_summary(result, output: str) -> None:
    from rich.console import Console
    from rich.table import Table

    rec = result.tuned.record

    def ms(v) -> str:
        return f"{v * 1e3:.3f}" if v is not None else "-"

    table = Table(title=f"plan {output}: {len(result.plan.regions)} regions ({rec.why})")
    for col in ("plan", "regions", "predicted ms", "measured ms"):
        table.add_column(col, justify="right" if col != "plan" else "left")
    table.add_row("[bold]tuned", str(len(result.plan.regions)), ms(rec.plan.predicted_s), ms(rec.plan.measured_s))
    table.add_row("dp", str(rec.dp.regions), ms(rec.dp.predicted_s), ms(rec.dp.measured_s))
    for name, row in rec.single_backend.items():
        table.add_row(f"{name} alone", str(row.regions), ms(row.predicted_s), ms(row.measured_s))
    console = Console()
    console.print(table)
    if rec.untimed:
        est = result.estimator
        took = f"; a whole-model build took {est.build_s:.0f} s here" if est is not None and est.build_s > 1 else ""
        console.print(f"[yellow]not timed within the {rec.budget_s:g} s budget: {', '.join(rec.untimed)} alone "
                      f"(their whole-model builds did not end in time{took}); the plan was chosen without "
                      f"them: a longer --budget times them[/]", highlight=False)
