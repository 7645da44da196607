"""The `collage` CLI: compile, run, demo, backends.

    collage compile model.mlir --plan default|random:SEED|prefer:B1,B2|PLAN.json -o out/ [--device cuda] [--iree-...]
    collage run out/ [--function main] --input x.npy ... [--output-dir DIR]
    collage demo
    collage backends
    collage measure model.mlir --backends B1,B2 [--db PATH]
    collage tune model.mlir [--backends B1,B2] [--budget 10m] [--seed N] [--db PATH] -o plan.json
    collage db stats|export FILE.json|import FILE.json|prune [--db PATH]
    collage bench MODEL... [--small] [--plan PLAN] [--vs torch,ort,...] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from collage_runtime.shapes import Fallback, dims_label
from collage_runtime.types import NumberFormat, Platform

from ..errors import CollageError
from ..processes import python_command
from . import (OneLineParser, bench_cmd, db_cmd, dims_args, exit_quietly, load_input_arrays, measure_cmd, positive_int,
               report_cmd, run_tool, tune_cmd)


def _cmd_compile(args: argparse.Namespace, passthrough: list[str]) -> int:
    from ..artifact import check_artifact_dir
    from ..entry import plan_provenance
    from ..ir import new_context
    from ..iree import compile_module
    from ..measure.db import default_db_path

    check_artifact_dir(args.output)
    if args.precision == NumberFormat.BF16.value and not (args.tune or args.plan == "tune" or args.dim):
        raise CollageError("--precision bf16 lets a tune place regions on bf16 backends (and a --dim fallback run in "
                           "bf16): add --tune, or name one in the plan (--plan whole:openvino-bf16)",
                           where="--precision", exit_code=2)
    tune_cmd.translated_for_int8(args)  # a StableHLO file or a torch factory: int8 through its ONNX form
    dim_plan = dims_args.dim_plan_of(args)
    if dim_plan is not None:
        return _compile_buckets(args, passthrough, dim_plan)
    # As `collage tune` reads it (a file, or a torch factory): an imported model computes what its source
    # computes, checked before anything is built.
    spec = tune_cmd.quantized_spec(args.model, tune_cmd.calibration_of(args))
    module, inputs = tune_cmd.load_model(spec, new_context(), load_input_arrays(args.input),
                                         check_import=not args.no_import_check)
    plan, precision = args.plan or ("tune" if args.tune else None), {}
    if plan is None:
        plan, module, precision = _default_plan(args, spec, module, inputs)
    provenance = plan_provenance(plan) | precision  # kept in the manifest: `collage report` shows it
    if plan == "tuned":  # the plan `collage tune` recorded for this module, else the default
        plan, provenance = _tuned_or_default(module)
    if (args.tune or plan == "tune") and args.device not in (None, Platform.CPU.value):
        raise CollageError(f"--tune measures on this machine's CPU; tune a {args.device} program on the machine "
                           "that has the device, or give a plan (--plan prefer:..., --plan whole:...)")
    if args.tune or plan == "tune":  # every available backend, the default budget and DB
        tuned = tune_cmd.tune_model(module, {"main": inputs} if inputs else {}, tune_cmd.backends_for(args, module),
                                    tune_cmd.parse_budget(tune_cmd.DEFAULT_BUDGET), 0, None)
        tune_cmd.print_summary(tuned, "(tuned)")
        plan = tuned.plan
        provenance = plan_provenance("tune", tuned.tuned.record, default_db_path())
    from rich.console import Console

    if args.cuda_target:
        passthrough = [*passthrough, f"--iree-cuda-target={args.cuda_target}"]
    with Console(stderr=True).status(f"compiling {args.model}"):  # a spinner while IREE and the engines build
        result = compile_module(module, plan, args.output, platform=args.device and Platform(args.device), source=str(args.model),
                                iree_args=passthrough, provenance=provenance,
                                check=tune_cmd.program_check(args.model, tune_cmd.held_out_of(args)))
    regions = result.manifest.regions
    _print_placement(result.plan)
    print(f"wrote {result.out_dir} ({len(result.plan.regions)} plan regions, {len(regions)} library regions)")
    return 0


def _default_plan(args: argparse.Namespace, spec: str, module, inputs: list):
    """The plan of a compile without ``--plan``, the module it places, and the precision it computes in (for the
    manifest's provenance): ``default`` (IREE), but for an int8 ONNX model ``spec`` (imported as ``module``) the
    whole model on the fastest int8 engine here of those agreeing with ONNX Runtime (on ``--input``, where
    given), timed now, or, where ``spec`` was quantized now from the f32 model (``--precision int8``) and an
    engine runs that faster, the f32 model on it (``shaped.int8_plan``)."""
    if Path(spec).suffix != ".onnx":
        return "default", module, {}
    from rich.console import Console

    from ..ir import new_context
    from ..shaped import int8_plan, module_values, quantizes_file

    if not quantizes_file(spec):
        return "default", module, {}
    f32 = Path(args.model) if spec != args.model else None
    choice = int8_plan(Path(spec), module_values(Path(spec), module), agree_on=inputs or None, f32=f32)
    Console(stderr=True).print(choice.int8_line(), highlight=False)
    if choice.f32:
        module, _ = tune_cmd.load_model(args.model, new_context(), inputs, check_import=not args.no_import_check)
    return choice.plan, module, {"precision": choice.precision}


def _compile_buckets(args: argparse.Namespace, passthrough: list[str], dim_plan) -> int:
    """``collage compile --dim ...``: one artifact of shape buckets, each compiled (and tuned, with --tune) for
    its shape (``collage_mlir.shaped``)."""
    from rich.console import Console

    from ..entry import plan_provenance
    from ..graph import Graph, number_ops
    from ..ir import new_context
    from ..measure.db import default_db_path
    from ..search import resolve_plan
    from ..search.transfer import TunedBuckets
    from ..shaped import BucketModel, compile_shaped, int8_bucket_plan, quantizes_file

    if args.input:
        raise CollageError("--input fixes one shape; with --dim the buckets' shapes are generated", where="--input",
                           exit_code=2)
    tuning = args.tune or args.plan == "tune"
    if tuning and args.device not in (None, Platform.CPU.value):
        raise CollageError(f"--tune measures on this machine's CPU; tune a {args.device} program on the machine "
                           "that has the device, or give a plan (--plan prefer:..., --plan whole:...)")
    calibration = tune_cmd.calibration_of(args)
    spec = tune_cmd.quantized_spec(args.model, calibration)
    axes, dynamic_model = dims_args.model_axes(spec, dim_plan)
    # An int8 model quantized now (--precision int8) may run in f32 where an engine runs that faster.
    f32 = Path(args.model) if spec != args.model else None
    fallback, fallback_model = dims_args.fallback_of(args, dynamic_model, dim_plan, axes, f32)
    dim_plan = dims_args.traced_plan(args, fallback_model, dim_plan, axes, fallback)
    platform = args.device and Platform(args.device)
    plan = args.plan or "default"
    int8 = args.plan is None and not tuning and quantizes_file(spec)  # IREE computes int8 in f32: an engine per bucket
    buckets = dim_plan.grid()
    console = Console(stderr=True)
    tuned_before = TunedBuckets()

    def bucket_model(values: dict[str, int]) -> BucketModel:
        label = dims_label(values)
        if int8:
            choice = int8_bucket_plan(dynamic_model, values, f32=f32)
            console.print(choice.int8_line(f"bucket {label}"), highlight=False)
            module, _ = tune_cmd.load_model(str(f32) if choice.f32 else spec, new_context(), [],
                                            check_import=not args.no_import_check, dims=values)
            return BucketModel(module, resolve_plan(choice.plan, Graph(module), platform),
                               plan_provenance(choice.plan) | {"precision": choice.precision})
        module, inputs = tune_cmd.load_model(spec, new_context(), [], check_import=not args.no_import_check,
                                             dims=values)
        if tuning:  # the default budget shared by the buckets, each seeded with the plans tuned before it
            number_ops(module)
            graph = Graph(module)
            budget = tune_cmd.parse_budget(tune_cmd.DEFAULT_BUDGET) / len(buckets)
            tuned = tune_cmd.tune_model(module, {"main": inputs} if inputs else {}, tune_cmd.backends_for(args, module),
                                        budget, 0, None, carried=tuned_before.carried(graph))
            tune_cmd.print_summary(tuned, f"(tuned for {label})")
            tuned_before.add(graph, tuned.plan)
            return BucketModel(module, tuned.plan, plan_provenance("tune", tuned.tuned.record, default_db_path()))
        number_ops(module)
        if plan == "tuned":
            return BucketModel(module, *_tuned_or_default(module))
        return BucketModel(module, resolve_plan(plan, Graph(module), platform), plan_provenance(plan))

    def compiled(values: dict[str, int], result) -> None:
        label = dims_label(values)
        console.print(f"bucket {label}: {len(result.plan.regions)} plan regions", highlight=False)

    if args.cuda_target:
        passthrough = [*passthrough, f"--iree-cuda-target={args.cuda_target}"]
    with console.status(f"compiling {args.model} for {len(buckets)} shape buckets"):
        result = compile_shaped(dim_plan, axes, bucket_model, args.output, fallback=fallback,
                                fallback_model=fallback_model,
                                source=str(args.model), on_bucket=compiled, iree_args=passthrough,
                                check=tune_cmd.program_check(args.model, tune_cmd.held_out_of(args)))
    rest = ("padding to the next bucket along " + ", ".join(dim_plan.pad)) if dim_plan.pad else ""
    if fallback is not Fallback.NONE:
        model = "the f32 model" if fallback_model == f32 else "the model"
        rest = (rest + "; else " if rest else "") + f"{fallback.value} on {model} with dynamic dims"
    ranges = ", ".join(f"{d.name} {d.min}..{d.max}" for d in dim_plan.dims)
    between = f"; between them: {rest}" if rest else ""
    print(f"wrote {result.out_dir} ({len(result.table.buckets)} buckets for {ranges}{between})")
    return 0


def _tuned_or_default(module):
    """(plan, provenance): the plan tuned before for ``module`` on this device (the cost DB, by structural
    hash, as the entry points find it), else the default, said in one line."""
    from rich.console import Console

    from ..entry import PlanHow, choose_plan

    choice = choose_plan(module)
    if choice.how is not PlanHow.TUNED_BEFORE:
        Console(stderr=True).print("no tuned plan for this model in the cost DB (`collage tune` first): the "
                                   "default plan", highlight=False)
    return choice.plan, choice.provenance


def _print_placement(plan) -> None:
    """The placement table: per backend, its regions and ops (ops in no region run on iree-cpu)."""
    from rich.console import Console
    from rich.table import Table

    if not plan.regions:
        return
    table = Table(title="placement", title_justify="left")
    for col in ("backend", "regions", "ops", "largest region"):
        table.add_column(col)
    by_backend: dict[str, list] = {}
    for r in plan.regions:
        by_backend.setdefault(r.backend, []).append(r)
    for backend, regions in sorted(by_backend.items()):
        largest = max(regions, key=lambda r: len(r.ops))
        table.add_row(backend, str(len(regions)), str(sum(len(r.ops) for r in regions)),
                      f"{largest.name} ({len(largest.ops)} ops)")
    Console().print(table)


def _load_program(out_dir: str, threads: int | None = None):
    import collage_runtime
    from collage_runtime.program import ArtifactError

    try:
        return collage_runtime.load(out_dir, threads=threads)
    except ArtifactError as exc:
        raise CollageError(str(exc)) from None


def _cmd_run(args: argparse.Namespace, _: list[str]) -> int:
    if not args.in_process:
        return _run_isolated(args)
    inputs = load_input_arrays(args.input)
    program = _load_program(args.artifact, args.threads)
    try:
        outputs = _invoke(program, args.function, inputs, args.input)
    finally:
        program.close()
    if args.output_dir:
        out = Path(args.output_dir)
        try:
            out.mkdir(parents=True, exist_ok=True)
            for k, arr in enumerate(outputs):
                np.save(out / f"out_{k}.npy", arr)
        except OSError as exc:
            raise CollageError(f"cannot write outputs: {exc.strerror}", where=str(exc.filename or out)) from None
        print(f"wrote {len(outputs)} outputs to {out}")
    else:
        for k, arr in enumerate(outputs):
            print(f"out_{k}: {arr.dtype}{list(arr.shape)} {np.array2string(arr.ravel()[:8], precision=5)}")
    return 0


def _run_isolated(args: argparse.Namespace) -> int:
    """Runs ``collage run`` again in a child process: engines run inside the program's process, and one
    that crashes (a signal) then costs one error line here instead of the whole CLI without a word."""
    import signal
    import subprocess

    argv = python_command("collage_mlir.tools.cli", "run", args.artifact, "--function", args.function,
                          "--in-process", *[a for path in args.input for a in ("--input", path)])
    if args.output_dir:
        argv += ["--output-dir", args.output_dir]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    code = subprocess.run(argv, stdin=subprocess.DEVNULL).returncode
    if code >= 0:
        return code
    if -code == signal.SIGINT:
        raise KeyboardInterrupt
    name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
    raise CollageError(f"the program died of {name} while running '{args.function}' (an engine crashed in a "
                       "region; `collage run --in-process` shows where)", where=args.artifact)


def _invoke(program, function: str, inputs: list[np.ndarray], paths: list[str]) -> tuple[np.ndarray, ...]:
    from collage_runtime.program import ArtifactError, InputError, RegionFailure

    try:
        return program.invoke(function, *inputs)
    except InputError as exc:
        where = paths[exc.index] if exc.index is not None and exc.index < len(paths) else "--input"
        raise CollageError(str(exc), where=where, exit_code=2) from None
    except (ArtifactError, RegionFailure) as exc:
        raise CollageError(str(exc), where=str(program.root)) from None
    except (RuntimeError, ValueError) as exc:  # IREE's own run-time errors
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise CollageError(f"running '{function}' failed: {first[:300]}", where=str(program.root)) from None


def _pattern_lines(patterns) -> list[str]:
    """Patterns grouped by identical constraints and followers: ``op, op, ... (constraints) → [follower]``."""
    from ..backends.patterns import describe_constraint

    groups: dict[tuple, list[str]] = {}
    for p in patterns:
        key = (tuple(describe_constraint(c) for c in p.when), tuple(f.name for f in p.followers))
        groups.setdefault(key, []).append((p.anchor or "*").removeprefix("stablehlo."))
    lines = []
    for (constraints, followers), anchors in groups.items():
        line = ", ".join(anchors)
        if constraints:
            line += " (" + "; ".join(constraints) + ")"
        lines.append(" → ".join([line] + [f"[{f}]" for f in followers]))
    return lines


def _cmd_backends(args: argparse.Namespace, _: list[str]) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ..backends import registry

    table = Table(title="collage backends", show_lines=True)
    for col in ("backend", "platforms", "kind", "version", "patterns and constraints", "status"):
        table.add_column(col, overflow="fold")
    for name, info in registry().items():
        b = info.backend
        if b is None:
            table.add_row(name, "?", "?", "", "", f"[red]{escape(str(info.problem))}")
            continue
        if "@" in name:  # a variant (tactic) is listed on its base's row
            continue
        patterns = "\n".join(escape(line) for line in _pattern_lines(b.patterns))
        variants = sorted(v.name.partition("@")[2] for v in b.variants())
        if variants:
            patterns += f"\n[dim]variants ({name}@*): {escape(', '.join(variants))}[/dim]"
        status = (f"[red]unavailable: {escape(str(info.problem))} ({escape(b.install_hint)})" if info.problem
                  else "[green]ok")
        table.add_row(name, ", ".join(sorted(p.value for p in b.platforms)), b.kind.value, "" if info.problem else escape(b.version()), patterns, status)
    Console(width=max(Console().width, 140)).print(table)
    return 0


def _cmd_demo(args: argparse.Namespace, _: list[str]) -> int:
    from .demo import run_demo

    return run_demo(Path(args.out), tune_cmd.parse_budget(args.tune) if args.tune else None)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="collage", description="Place model regions on the fastest backends.")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="partition a model by a plan and build an artifact directory",
                       epilog="Unknown --iree-* flags are passed through to iree-compile.")
    c.add_argument("model", help="StableHLO module (.mlir text or .mlirbc bytecode), ONNX model (.onnx) or a "
                   "PyTorch factory package.module:function returning (model, example inputs), as `collage tune` takes")
    c.add_argument("--plan", default=None,
                   help="default | random:SEED | prefer:BACKEND[,BACKEND] | whole:BACKEND | tune | tuned | PLAN.json "
                        "(default: default, i.e. IREE; for an int8 model the whole model on the fastest int8 engine, "
                        "timed when compiling)")
    c.add_argument("--tune", action="store_true", help="same as --plan tune: `collage tune` first, then compile")
    c.add_argument("-o", "--output", required=True, help="artifact directory to write")
    c.add_argument("--device", choices=[p.value for p in Platform], default=None,
                   help="where the program runs: its IREE codegen (iree-cpu, iree-cuda, iree-vulkan) and the "
                        "backends that may take regions there (default: a plan file's own, else cpu). A GPU "
                        "program compiles without a GPU")
    c.add_argument("--cuda-target", metavar="SM", help="CUDA architecture of a --device cuda program, e.g. sm_90 "
                                                        "(default: the GPU here, else sm_80)")
    c.add_argument("--input", action="append", default=[],
                   help="example input .npy for @main, once per argument, for the import check (default: generated)")
    tune_cmd.add_precision_arguments(c)
    dims_args.add_dim_arguments(c)
    c.add_argument("--no-import-check", action="store_true",
                   help="do not check an imported model (.onnx) against its source on example inputs")
    r = sub.add_parser("run", help="run a compiled artifact on .npy inputs")
    r.add_argument("artifact", help="artifact directory written by `collage compile`")
    r.add_argument("--function", default="main")
    r.add_argument("--input", action="append", default=[], help=".npy file, once per argument, in order")
    r.add_argument("--output-dir", help="write out_0.npy, out_1.npy, ... here")
    r.add_argument("--in-process", action="store_true",
                   help="run in this process (default: a child process, so an engine crash is one error line)")
    r.add_argument("--threads", type=positive_int, default=None,
                   help="cores the program's engines share (default: all this process may use)")
    d = sub.add_parser("demo", help="compile a small CNN with a plan mixing two backends and check it")
    d.add_argument("--out", default="collage-demo", help="artifact directory (default: ./collage-demo)")
    d.add_argument("--tune", metavar="BUDGET", help="place by `collage tune` (search budget such as 2m) instead "
                                                    "of prefer:onednn,iree-cpu")
    sub.add_parser("backends", help="list the registered backends")
    measure_cmd.add_parser(sub)
    tune_cmd.add_parser(sub)
    db_cmd.add_parser(sub)
    bench_cmd.add_parser(sub)
    report_cmd.add_parser(sub)
    return p


COMMANDS = {"compile": _cmd_compile, "run": _cmd_run, "backends": _cmd_backends, "demo": _cmd_demo,
            "measure": lambda args, _: measure_cmd.run(args),
            "tune": lambda args, _: tune_cmd.run(args), "db": lambda args, _: db_cmd.run(args),
            "bench": lambda args, _: bench_cmd.run(args), "report": lambda args, _: report_cmd.run(args)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    passthrough = [u for u in unknown if u.startswith("--iree-")]
    rest = [u for u in unknown if not u.startswith("--iree-")]
    if rest or (passthrough and args.cmd != "compile"):
        parser.error(f"unrecognized arguments: {' '.join(rest or passthrough)}")
    return run_tool("collage", lambda: COMMANDS[args.cmd](args, passthrough))


def entry() -> None:
    """Console-script entry point."""
    exit_quietly(main())


if __name__ == "__main__":
    entry()
