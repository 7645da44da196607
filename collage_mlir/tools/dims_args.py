"""``--dim``, ``--bucket`` and ``--pad`` of ``collage compile``: a model with dynamic dims compiled into one
artifact of shape buckets (``collage_mlir.shaped``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from collage_runtime.shapes import Axes, Fallback, dims_label
from collage_runtime.types import NumberFormat

from ..backends import registry
from ..errors import CollageError
from ..frontends.dims import (DimPlan, ShapeTrace, argument_axes, check_declared, choose_buckets, parse_bucket,
                              parse_dim)
from ..shaped import choose_fallback, dynamic_ratio, fallback_kinds, model_file_axes
from . import positive_int


def add_dim_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=MIN:OPT:MAX",
                        help="a dynamic dim's range (an ONNX dim_param such as batch; a jax.export module's symbol; "
                             "else ARG.AXIS of a StableHLO module's ? axes or a torch factory's inputs); the "
                             "artifact takes any shape in range. Once per dim")
    parser.add_argument("--bucket", action="append", default=[], metavar="NAME=V1,V2,...",
                        help="the values of a dim compiled for (default: its MIN, OPT and MAX)")
    parser.add_argument("--pad", action="append", default=[], metavar="NAME",
                        help="a dim along which rows are independent (a batch): a shape between buckets is "
                             "zero-padded to the next bucket and its outputs cut back")
    parser.add_argument("--shapes", metavar="TRACE.json",
                        help="choose the buckets for these request shapes (a JSON list of {dim: value}) by a cost "
                             "model measured on the model, instead of --bucket's grid")
    parser.add_argument("--max-buckets", type=positive_int, default=8, help="with --shapes: at most this many buckets")
    parser.add_argument("--fallback", choices=["auto", *(f.value for f in Fallback)], default="auto",
                        help="the engine that runs the model's shapes between buckets with its dynamic dims (ort or "
                             "openvino an ONNX model, iree a StableHLO module, openvino-bf16 either where the CPU "
                             "has bf16; default auto: of those, the fastest, timed here, openvino-bf16 only with "
                             "--precision bf16; none: refuse such shapes)")


def fallback_of(args: argparse.Namespace, model: Path | None, dim_plan: DimPlan, axes: Axes,
                f32: Path | None = None) -> tuple[Fallback, Path | None]:
    """The engine that serves shapes between buckets, and the model it runs: none where buckets and padding
    serve every shape or the model is not a file (a torch factory); else the one named, or (auto) the faster of
    those that take the model (``fallback_kinds``), timed on it, and on ``f32`` too (the f32 model an int8 one
    was quantized from now) where given: that model where it runs faster."""
    from rich.console import Console

    if model is None or args.fallback == Fallback.NONE.value or dim_plan.unserved(fallback=False) is None:
        return Fallback.NONE, None
    kinds = fallback_kinds(model, bf16=args.precision == NumberFormat.BF16.value
                           or args.fallback == Fallback.OPENVINO_BF16.value)
    if args.fallback != "auto":
        if args.fallback == Fallback.OPENVINO_BF16.value and Fallback.OPENVINO_BF16 not in kinds:
            raise CollageError(f"openvino-bf16 is not usable here: {registry()[args.fallback].problem}",
                               where="--fallback", exit_code=2)
        if Fallback(args.fallback) not in kinds:
            raise CollageError(f"{args.fallback} does not run this model with its dynamic dims; "
                               + " or ".join(k.value for k in kinds) + " does", where="--fallback", exit_code=2)
        return Fallback(args.fallback), model
    with Console(stderr=True).status("timing the fallback engines on the model with dynamic dims"):
        choice = choose_fallback(model, dim_plan, axes, kinds, f32=f32)
    if choice.times:
        Console(stderr=True).print(choice.line(), highlight=False)
    return choice.chosen, f32 if choice.f32 else model


def dim_plan_of(args: argparse.Namespace) -> DimPlan | None:
    """The declared dims and their buckets, or None when no ``--dim`` is given."""
    pad, shapes = getattr(args, "pad", []), getattr(args, "shapes", None)  # `collage tune` has neither
    if not args.dim:
        if args.bucket or pad or shapes:
            raise CollageError("--bucket, --pad and --shapes go with --dim", exit_code=2)
        return None
    if shapes and args.bucket:
        raise CollageError("--shapes chooses the buckets; drop --bucket", exit_code=2)
    return DimPlan.of([parse_dim(t) for t in args.dim], dict(parse_bucket(t) for t in args.bucket), pad)


def traced_plan(args: argparse.Namespace, model: Path | None, dim_plan: DimPlan, axes: Axes,
                fallback: Fallback) -> DimPlan:
    """With ``--shapes``: the buckets chosen for the trace (``frontends.dims.choose_buckets``) with the
    fallback's slowdown measured on the model; else ``dim_plan`` as it is."""
    from rich.console import Console

    if not args.shapes:
        return dim_plan
    trace = ShapeTrace.load(args.shapes, dim_plan.dims)
    if model is not None and fallback is not Fallback.NONE:
        with Console(stderr=True).status("timing the model static and dynamic at its OPT shape"):
            ratio = dynamic_ratio(model, dim_plan, axes, fallback)
    else:
        ratio = float("inf")
    chosen = dim_plan.with_buckets(choose_buckets(dim_plan, trace, ratio, args.max_buckets))
    Console(stderr=True).print(f"{len(trace.requests)} requests; {fallback.value} on the dynamic model "
                               f"{ratio:.2f}x a static program; buckets: "
                               + "; ".join(dims_label(b) for b in chosen.grid()),
                               highlight=False)
    return chosen


def model_axes(spec: str, dim_plan: DimPlan) -> tuple[Axes, Path | None]:
    """Which input axes carry the declared dims, and the model an engine that takes dynamic dims runs
    between buckets (the model file itself; None for a torch factory). Every dynamic
    dim of a model file must be declared, and every declared dim must be one of them."""
    if Path(spec).suffix in (".onnx", ".mlir", ".mlirbc"):
        axes, dynamic_model = model_file_axes(spec)
        check_declared(axes, dim_plan.dims)
        return axes, dynamic_model
    if ":" not in spec:
        raise CollageError("--dim takes ONNX models (.onnx), StableHLO modules (.mlir, .mlirbc) and torch "
                           "factories (package.module:factory)", where=spec, exit_code=2)
    import importlib

    mod_name, _, attr = spec.partition(":")
    try:
        _, example = getattr(importlib.import_module(mod_name), attr)()
    except (ImportError, AttributeError) as exc:
        raise CollageError(f"cannot load the model factory: {exc}", where=spec, exit_code=2) from None
    return argument_axes(list(example), dim_plan.dims), None
